"""Compare specsure's Resolution with what vLLM's config code resolved, field by field.

Pure logic: the probe's answer comes in as plain dicts. A different method or draft is a
mismatch (the CLI exits 1), and each mismatch names its likely cause and the fix.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Mapping

from specsure.config.schema import FIELDS, SPECSURE_ONLY_FIELDS, SUFFIX_FIELDS, VLLM_INSTEAD, SpeculativeConfig
from specsure.config.token_tree import is_chain
from specsure.config.vllm_overrides import (
    PathTrap, speculators_override, target_path, trap_fix, vllm_draft_path, vllm_path_trap,
)
from specsure.config.vllm_rules import DETECTION_SKIPPED, MTP_MODEL_TYPES

if TYPE_CHECKING:
    from specsure.config.resolution import Resolution

def concise(error: str) -> str:
    """vLLM's error on one line, without pydantic's echo of every argument and its documentation link."""
    text = " ".join(error.split())
    text = re.sub(r"\s*\[type=.*?input_type=\w+\]", "", text)
    return re.sub(r"\s*For further information visit \S+", "", text)


# vLLM's placeholders for "no draft checkpoint" (ngram and friends).
NO_DRAFT: Final[frozenset[str]] = frozenset({"ngram", "ngram_gpu", "suffix", "extract_hidden_states"})


@dataclass(frozen=True)
class Row:
    """One field: what the user asked, what specsure runs, what vLLM would run."""

    field: str
    asked: Any
    """The user's value, or None when the field was left unset."""
    specsure: Any
    source: str
    vllm: Any
    """What vLLM resolved from the exported config."""
    vllm_as_written: Any
    """What vLLM resolved from the user's config as written (an 'error: ...' string on failure)."""
    agree: bool


@dataclass(frozen=True)
class Mismatch:
    """A field vLLM would run differently, with the likely cause and the fix."""

    field: str
    specsure: Any
    vllm: Any
    cause: str
    fix: str


@dataclass(frozen=True)
class Check:
    """The verdict of one check-vllm run."""

    rows: tuple[Row, ...]
    mismatches: tuple[Mismatch, ...]
    vllm_version: str
    exported: Mapping[str, Any]
    """The --speculative-config that was handed to vLLM."""
    notes: tuple[str, ...] = ()
    refused: str = ""
    """Why specsure itself would not run the config ('' when it would): then nothing is OK."""

    @property
    def ok(self) -> bool:
        return not self.mismatches and not self.refused

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "vllm_version": self.vllm_version, "exported": dict(self.exported),
                "fields": [{"field": r.field, "asked": r.asked, "specsure": r.specsure, "source": r.source,
                            "vllm": r.vllm, "vllm_as_written": r.vllm_as_written, "agree": r.agree}
                           for r in self.rows],
                "mismatches": [{"field": m.field, "specsure": m.specsure, "vllm": m.vllm, "cause": m.cause,
                                "fix": m.fix} for m in self.mismatches],
                "notes": list(self.notes), "specsure_refuses": self.refused or None}

    def table(self) -> str:
        """The side-by-side table, then each mismatch with its cause and fix."""
        head = ("field", "you asked", "specsure runs", f"vLLM {self.vllm_version} runs", "vLLM, as written")
        body = [(r.field, _show(r.asked), f"{_show(r.specsure)} ({r.source})", _show(r.vllm),
                 _show(r.vllm_as_written)) for r in self.rows]
        widths = [max(len(row[i]) for row in (head, *body)) for i in range(len(head))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(head, widths)).rstrip(),
                 "  ".join("-" * w for w in widths)]
        for row, r in zip(body, self.rows):
            mark = "" if r.agree else "   <-- differs"
            lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() + mark)
        lines.append("")
        lines.append(f"exported --speculative-config: {json.dumps(dict(self.exported))}")
        for note in self.notes:
            lines.append(f"note: {note}")
        if self.refused:
            lines.append(f"NOT RUNNABLE: specsure would refuse this config, so vLLM's answer above has nothing to "
                         f"agree with: {self.refused}")
        elif self.ok:
            lines.append(f"OK: vLLM {self.vllm_version} would run the same method and draft as specsure.")
        for m in self.mismatches:
            lines.append(f"MISMATCH {m.field}: specsure runs {_show(m.specsure)}, vLLM would run {_show(m.vllm)}.")
            lines.append(f"  cause: {m.cause}.")
            lines.append(f"  fix:   {m.fix}.")
        return "\n".join(lines)


def _show(value: Any) -> str:
    return "-" if value is None else (value if isinstance(value, str) else json.dumps(value))


def compare(res: "Resolution", vllm: Mapping[str, Any], *, exported: Mapping[str, Any],
            as_written: Mapping[str, Any] | None = None, vllm_version: str = "?") -> Check:
    """Field-by-field verdict. ``vllm`` is the probe's result for the exported config."""
    config = res.config
    assert config is not None, "check-vllm needs a speculative config"
    where = vllm_draft_path(res)
    ours = {"method": config.method, "model": where[0] if where else None,
            "num_speculative_tokens": config.num_speculative_tokens,
            "prompt_lookup_min": config.prompt_lookup_min, "prompt_lookup_max": config.prompt_lookup_max,
            **{key: getattr(config, key) for key in SUFFIX_FIELDS}}
    theirs = _normalise(vllm)
    written = _normalise(as_written) if as_written and "error" not in as_written else None
    rows, mismatches = [], []
    for name in FIELDS:
        if name in SPECSURE_ONLY_FIELDS:  # vLLM has no such key to compare
            continue
        decision = res.decisions[name]
        agree = _same(name, ours[name], theirs[name])
        shown = ours[name] if name != "model" else config.model
        if name == "model" and config.model is None and where is not None:
            shown = f"{where[0]} (target's MTP layers)"
        if as_written and "error" in as_written:
            alt = "error" if name == "method" else None
        else:
            alt = written[name] if written else None
        rows.append(Row(name, decision.value if decision.source == "user" else None, shown, decision.source,
                        theirs[name], alt, agree))
        if not agree:
            mismatches.append(_diagnose(res, name, ours[name], theirs[name], vllm))
    if vllm.get("replaced_by_speculators") and not mismatches:  # the same method and draft, another target
        mismatches.append(_speculators_mismatch(res, "target", target_path(res), vllm.get("target"), vllm))
    notes = [_left_out(name, getattr(config, name), config) for name in sorted(SPECSURE_ONLY_FIELDS)
             if getattr(config, name) not in (None, 1)]  # prompt_lookup_branches 1 is one chain, as vLLM's
    if as_written and "error" in as_written:
        notes.append(f"vLLM rejects your config as written: {concise(as_written['error'])}")
    elif written and written["method"] != theirs["method"]:
        notes.append(f"as written (without specsure's explicit fields), vLLM would run method "
                     f"{written['method']!r}; the exported config makes it {theirs['method']!r}.")
    return Check(tuple(rows), tuple(mismatches), vllm_version, dict(exported), tuple(notes))


def _left_out(name: str, value: Any, config: "SpeculativeConfig") -> str:
    """What vLLM does with one of specsure's own keys: no row compares it, so a note says it."""
    if name == "disable_by_batch_size" and config.vllm_batch_schedule() is not None:
        return (f"{name} = {value} went to vLLM as num_speculative_tokens_per_batch_size = "
                f"{json.dumps(config.vllm_batch_schedule())}: the same batch sizes draft nothing.")
    if name == "speculative_token_tree" and is_chain(value):
        return f"{name} = {json.dumps(value)} is a chain, which vLLM drafts as num_speculative_tokens."
    return (f"{name} = {json.dumps(value)} is specsure's own key, left out of the exported config: vLLM "
            f"drafts {VLLM_INSTEAD[name].format(k=config.num_speculative_tokens)}. The output is the same.")


def _normalise(result: Mapping[str, Any]) -> dict[str, Any]:
    method = result.get("method")
    model = result.get("model")
    is_ngram = method in NO_DRAFT
    return {"method": method, "model": None if is_ngram or model in NO_DRAFT else model,
            "num_speculative_tokens": result.get("num_speculative_tokens"),
            # vLLM stores 0 for "not used" where specsure stores None.
            "prompt_lookup_min": result.get("prompt_lookup_min") if is_ngram else None,
            "prompt_lookup_max": result.get("prompt_lookup_max") if is_ngram else None,
            # vLLM keeps its suffix defaults for every method; only suffix reads them.
            **{key: result.get(key) if method == "suffix" else None for key in SUFFIX_FIELDS}}


def _speculators_mismatch(res: "Resolution", name: str, ours: Any, theirs: Any, vllm: Mapping[str, Any]) -> Mismatch:
    predicted = speculators_override(res)
    if predicted is not None:
        return Mismatch(name, ours, theirs, cause=predicted.cause, fix=predicted.fix)
    return Mismatch(name, ours, theirs,
                    cause=(f"the target is a speculators-format checkpoint: vLLM serves {vllm.get('target')!r} as "
                           "--model and replaces the method and the draft with the checkpoint's own"),
                    fix="pass the verifier as --model and this folder as the draft's model")


def _same(name: str, ours: Any, theirs: Any) -> bool:
    if name == "model" and ours is not None and theirs is not None:
        return ours == theirs or os.path.realpath(ours) == os.path.realpath(theirs)
    return ours == theirs


def _diagnose(res: "Resolution", name: str, ours: Any, theirs: Any, vllm: Mapping[str, Any]) -> Mismatch:
    if vllm.get("replaced_by_speculators"):
        return _speculators_mismatch(res, name, ours, theirs, vllm)
    if name != "method":
        return Mismatch(name, ours, theirs,
                        cause=f"vLLM resolved {name} to {theirs!r} although the exported config sets it explicitly",
                        fix=f"set {name} explicitly in --speculative-config, and report this to specsure")
    where = vllm_draft_path(res)
    path = vllm.get("model") or (where[0] if where else "")
    role = where[1] if where else "draft"
    trap = vllm_path_trap(str(path))
    if trap is not None and trap[1] == theirs and ours not in DETECTION_SKIPPED:
        fix_trap = PathTrap(path=str(path), role=role, substring=trap[0], method=trap[1])
        return Mismatch(name, ours, theirs,
                        cause=(f"folder-name substring: the {role} path {path!r} contains {trap[0]!r}, and vLLM "
                               f"tests the path for it unless the method is one of "
                               f"{', '.join(sorted(DETECTION_SKIPPED))}; so your {ours!r} became {theirs!r}"),
                        fix=trap_fix(res, fix_trap)[0])
    draft_type = vllm.get("draft_model_type")
    if theirs == "mtp" and draft_type in MTP_MODEL_TYPES:
        holder = res.draft if res.draft is not None else res.target
        original = holder.model_type if holder is not None else None
        rewrite = (f"vLLM rewrites the checkpoint's model_type {original!r} to {draft_type!r}"
                   if original and original != draft_type else f"the checkpoint's model_type is {draft_type!r}")
        return Mismatch(name, ours, theirs,
                        cause=f"model_type rewrite: {rewrite}, and any MTP model_type makes vLLM run 'mtp'",
                        fix=("no speculative-config key stops this in vLLM; choose method 'mtp' if the MTP "
                             "layers are what you want, or serve this draft with specsure"))
    return Mismatch(name, ours, theirs,
                    cause=(f"a method-specific check vLLM skips or applies differently: it resolved {theirs!r} "
                           f"from the exported config (draft model_type {draft_type!r}, architectures "
                           f"{vllm.get('draft_architectures')})"),
                    fix=(f"make the checkpoint match the method: give a draft that is what {ours!r} needs, or "
                         f"set method {theirs!r} if that is what the checkpoint is"))
