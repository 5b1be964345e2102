"""Export a Resolution to vLLM or SGLang server arguments, every field explicit. No torch.

The export never re-resolves: it renders ``res.config``. Where the other engine has no way
to run the resolved method, the export raises ConfigError instead of approximating. Where
vLLM would silently run another method (a draft path that its substring test catches, or a
draft ``model_type`` it rewrites to an MTP type), the export warns and proposes the fix.
``specsure check-vllm`` asks the installed vLLM itself; the rules (config/vllm_overrides.py) are a prediction.
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final, Literal, Mapping

from specsure.config.checkpoint import MTP_LAYER_KEYS
from specsure.config.compat import LAYER_IDS_KEY, aux_layer_ids, declared_aux_layers
from specsure.config.detect import MTP_HEAD_ARCHITECTURES
from specsure.config.errors import ConfigError
from specsure.config.schema import VLLM_INSTEAD
from specsure.config.speculators import is_speculators
from specsure.config.token_tree import is_chain
from specsure.config.vllm_overrides import local_path, predict_vllm_overrides, speculators_refusal, target_path
from specsure.config.vllm_rules import VLLM_TESTED_VERSIONS, vllm_aux_layers, vllm_fc_layers, vllm_mtp_type

if TYPE_CHECKING:
    from specsure.config.checkpoint import CheckpointInfo
    from specsure.config.resolution import Resolution

Engine = Literal["vllm", "sglang"]
ENGINES: Final[tuple[str, ...]] = ("vllm", "sglang")
# Draft architectures that only specsure loads; no other engine has a model class for them.
SPECSURE_ONLY_ARCHITECTURES: Final[frozenset[str]] = MTP_HEAD_ARCHITECTURES

SGLANG_ALGORITHMS: Final[Mapping[str, str]] = {
    "ngram": "NGRAM", "draft_model": "STANDALONE", "eagle": "EAGLE", "eagle3": "EAGLE3", "mtp": "NEXTN",
}
"""specsure's methods that SGLang can run; SGLang has no suffix decoding."""


@dataclass(frozen=True)
class Export:
    """A ready-to-paste argument set for one engine, built from a Resolution."""

    engine: Engine
    args: tuple[str, ...]
    """The server arguments, one list item per shell word."""
    speculative_config: Mapping[str, Any] | None = None
    """vLLM only: the --speculative-config JSON object."""
    warnings: tuple[str, ...] = ()
    workarounds: tuple[str, ...] = ()
    """Shell commands that make the engine run the resolved method (symlinks)."""

    def command(self) -> str:
        """The arguments as one shell-quoted line."""
        return shlex.join(self.args)

    def to_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "args": list(self.args), "command": self.command(),
                "speculative_config": dict(self.speculative_config) if self.speculative_config else None,
                "warnings": list(self.warnings), "workarounds": list(self.workarounds)}


def export(res: "Resolution", engine: str, *, strict: bool | None = None) -> Export:
    """Render ``res`` for ``engine`` ('vllm' or 'sglang').

    ConfigError when the engine cannot express the resolved method or checkpoint. With
    ``strict`` (default: the Resolution's own), a predicted silent override, or a config vLLM is
    known to refuse, is an error too.
    """
    if engine not in ENGINES:
        raise ConfigError(f"unknown export target {engine!r}; choose one of: {', '.join(ENGINES)}.")
    if res.config is None:
        raise ConfigError("speculative decoding is off (no speculative config), so there is nothing to export. "
                          'Pass --speculative-config, for example \'{"method": "ngram", "num_speculative_tokens": 4}\'.')
    if res.target.note:
        raise ConfigError(f"target: {res.target.note}; pass --model with the checkpoint the engine will serve.")
    _check_loadable(res, engine)
    strict = res.strict if strict is None else strict
    out = _vllm(res) if engine == "vllm" else _sglang(res)
    if (note := _aux_layers_note(res, engine)) is not None:
        out = replace(out, warnings=(*out.warnings, note))
    try:
        res.check_runnable(weights=False)
    except ConfigError as exc:
        # Neither engine checks this (vLLM would load, say, an EAGLE-3 head as a draft model).
        if strict:
            raise ConfigError(f"specsure would refuse to run this config: {exc} (strict mode)") from None
        out = replace(out, warnings=(f"specsure would refuse to run this config: {exc}", *out.warnings))
    if strict and engine == "vllm" and (refusals := vllm_refusals(res)):
        raise ConfigError(" ".join(refusals) + " (strict mode: an export vLLM refuses is an error)")
    if strict and engine == "vllm" and (overrides := predict_vllm_overrides(res)):
        raise ConfigError(" ".join(f"vLLM would run {o.field} {o.vllm!r} instead of {o.asked!r}: {o.cause}. "
                                   f"Fix: {o.fix}." for o in overrides) + " (strict mode)")
    return out


def _aux_layers_note(res: "Resolution", engine: str) -> str | None:
    """Where the engine reads a head's target layers otherwise than specsure, which takes id j as the
    stream entering layer j, the top-level list before eagle_config's, and fuses them ascending."""
    draft = res.draft
    if res.config is None or res.config.method != "eagle3" or draft is None:
        return None
    declared = declared_aux_layers(draft.config)
    layers = res.target.num_hidden_layers
    if engine == "vllm":  # what vLLM fails at is in vllm_refusals, which the export's warnings hold too
        notes = _vllm_aux_notes(draft.path, draft.config, layers)[0] if layers is not None else []
        return "; ".join(notes) + "." if notes else None
    ids = declared[1] if declared else None
    if not isinstance(ids, list):
        return None
    if len(ids) != 3:
        return (f"the head {draft.path!r} fuses {len(ids)} target layer(s) ({LAYER_IDS_KEY} = {ids}); SGLang's "
                "EAGLE-3 model may build its fc for 3 and refuse the head's. specsure runs it as it is.")
    return (f"the head {draft.path!r} lists its target layers ({LAYER_IDS_KEY} = {ids}); specsure and vLLM "
            "fuse the residual stream entering each listed layer, while SGLang reads listed ids as layer "
            "outputs in some releases (it then captures the stream entering each id + 1; recent ones do so only "
            "when the first id is 1). The same head may draft from other features there: the output is the same, "
            "the acceptance may differ.")


def _vllm_aux_notes(path: str, config: Mapping[str, Any], layers: int) -> tuple[list[str], list[str]]:
    """vLLM 0.33.0's reading of the head's target layers (vllm_rules.py), where it differs from specsure's:
    (differences vLLM runs with, failures it stops at)."""
    try:
        ours = aux_layer_ids(config, path, layers)  # what specsure fuses, the default's repeats included
    except ConfigError:
        return [], []  # refused, and said so, by check_runnable
    v2, v1, fc = vllm_aux_layers(config, layers, "v2"), vllm_aux_layers(config, layers, "v1"), vllm_fc_layers(config)
    notes: list[str] = []
    failures: list[str] = []
    if v2 != tuple(sorted(set(ours))):
        fix = ("run vLLM with VLLM_USE_V2_MODEL_RUNNER=0 (its V1 runner reads them), or "
               if v1 == tuple(sorted(set(ours))) else "")
        notes.append(f"vLLM {VLLM_TESTED_VERSIONS[-1]}'s default model runner (V2) would fuse target layers "
                     f"{list(v2)}, not {list(ours)} as specsure does: it reads only a top-level {LAYER_IDS_KEY} "
                     f"(or eagle_config.layer_ids). The output stays the same and fewer drafts are accepted; {fix}"
                     f"copy the list to the top level of {path}/config.json")
    if len(set(ours)) != len(ours):
        failures.append(f"vLLM collects each target layer once, so the head's {len(ours)} fused layers "
                        f"{list(ours)} (the default on a target of {layers} layers repeats some) reach its fc as "
                        f"{len(set(ours))}: vLLM fails at the first forward. specsure runs it as it is")
    elif fc != len(ours):
        failures.append(f"vLLM builds the head's fc for {fc} target layers (from num_aux_hidden_states, or the id "
                        f"list its EAGLE-3 model class reads, else 3), but the head fuses {len(ours)}: vLLM refuses "
                        "its fc weight. specsure runs it as it is")
    return notes, failures


def _check_loadable(res: "Resolution", engine: str) -> None:
    draft = res.draft
    if draft is not None and (hit := set(draft.architectures) & SPECSURE_ONLY_ARCHITECTURES):
        raise ConfigError(
            f"the draft {draft.path!r} is a specsure-format head (architectures={sorted(hit)}), which {engine} "
            f"has no model class for; {engine} cannot run it as {res.config.method!r}. Serve it with specsure, "
            "or use a head in the engine's own format.")


def _target_warnings(res: "Resolution", engine: str) -> list[str]:
    return _relative_paths(res, engine) + _gguf_warnings(res, engine)


def _relative_paths(res: "Resolution", engine: str) -> list[str]:
    """A relative path is exported as typed (the user's value), with what it needs to mean the same there."""
    config = res.config
    paths = [("target", target_path(res))]
    if config is not None and config.model is not None:
        paths.append(("draft", local_path(config.model)))
    here = os.getcwd()
    return [f"the {what} path {path!r} is relative: {engine} finds it only when started in {here}; started "
            f"elsewhere, a name that is no folder there is read as a Hugging Face repository id, and another model "
            f"may be downloaded. Give the absolute path {os.path.abspath(path)!r}, or start {engine} in {here}."
            for what, path in paths if not os.path.isabs(path)]


def _gguf_warnings(res: "Resolution", engine: str) -> list[str]:
    if res.target.kind in ("gguf", "default"):
        return [f"the target {target_path(res)!r} is a GGUF file; {engine} loads GGUF experimentally and needs "
                "--tokenizer pointing at the original Hugging Face tokenizer (for the packaged default: "
                "HuggingFaceTB/SmolLM2-135M-Instruct)."]
    return []


def _vllm(res: "Resolution") -> Export:
    config = res.config
    assert config is not None
    spec = config.to_vllm()
    if "model" in spec:
        spec["model"] = local_path(spec["model"])
    args = ("--model", target_path(res), "--speculative-config", json.dumps(spec, separators=(", ", ": ")))
    warnings = _target_warnings(res, "vLLM")
    if (config.prompt_lookup_branches or 1) > 1:
        warnings.append(f"prompt_lookup_branches = {config.prompt_lookup_branches} is a specsure key that vLLM does "
                        "not have, so it is left out: vLLM drafts one chain (the first branch). Its output is the "
                        "same; fewer tokens are accepted per step.")
    if config.speculative_token_tree is not None and not is_chain(config.speculative_token_tree):
        # vLLM 0.33.0's SpeculativeConfig refuses the key (earlier releases had it, with tree attention).
        warnings.append(f"speculative_token_tree = {config.speculative_token_tree} is not a key of vLLM "
                        f"{', '.join(VLLM_TESTED_VERSIONS)} (earlier vLLM releases had it), so it is left out: vLLM "
                        f"drafts a chain of num_speculative_tokens = {config.num_speculative_tokens} tokens. Its output "
                        "is the same; a different number of tokens is accepted per step.")
    if config.disable_by_batch_size is not None and config.vllm_batch_schedule() is None:
        warnings.append(f"disable_by_batch_size = {config.disable_by_batch_size} is left out: vLLM "
                        f"{', '.join(VLLM_TESTED_VERSIONS)} drafts {VLLM_INSTEAD['disable_by_batch_size']}. Its "
                        "output is the same; under a full batch it verifies drafts that specsure would skip.")
    warnings += vllm_refusals(res)
    if config.method == "suffix":
        # vllm/config/speculative.py _validate_suffix_decoding raises ImportError without it.
        warnings.append("vLLM runs suffix decoding through the arctic-inference package and refuses the config "
                        "without it; install the release vLLM asks for in vLLM's environment: "
                        "pip install arctic-inference==0.1.1.")
    workarounds = []
    for o in predict_vllm_overrides(res):
        warnings.append(f"vLLM {', '.join(VLLM_TESTED_VERSIONS)} would run {o.field} {o.vllm!r}, not {o.asked!r}: "
                        f"{o.cause}. Fix: {o.fix}.")
        if o.workaround:
            workarounds.append(o.workaround)
    return Export("vllm", args, spec, tuple(warnings), tuple(workarounds))


def vllm_refusals(res: "Resolution") -> list[str]:
    """What vLLM 0.33.0 would refuse to start with, loudly, in the exported config."""
    config = res.config
    assert config is not None
    refusals = []
    if config.method == "mtp" and (modules := _mtp_modules(res)) is not None:
        k = config.num_speculative_tokens
        if k > modules and k % modules:
            # vllm/config/speculative.py __post_init__: above n_predict, k must reuse the modules whole rounds.
            refusals.append(f"vLLM {', '.join(VLLM_TESTED_VERSIONS)} refuses num_speculative_tokens = {k} with "
                            f"{modules} MTP modules (n_predict): above {modules} it must be a multiple of "
                            f"{modules}. specsure runs it, reusing the modules in turn; for vLLM set "
                            f"num_speculative_tokens to {k - k % modules} or {k - k % modules + modules}.")
    elif config.method != "mtp" and config.model is not None and res.draft is not None:
        key, n_predict = _vllm_n_predict(res.draft)
        refusals += _n_predict_refusal(n_predict, config.num_speculative_tokens, config.model, key)
    if (refused := speculators_refusal(res)) is not None:
        refusals.append(refused + ".")
    draft, layers = res.draft, res.target.num_hidden_layers
    if config.method == "eagle3" and draft is not None and layers is not None:
        refusals += [failure + "." for failure in _vllm_aux_notes(draft.path, draft.config, layers)[1]]
    return refusals


def _vllm_n_predict(draft: "CheckpointInfo") -> tuple[str, Any]:
    """(config.json key, value) that vLLM takes as the draft's n_predict: the MTP module count where its
    model_type rewrite turns the draft into an MTP model (vllm/config/speculative.py hf_config_override),
    else the draft's own n_predict."""
    if vllm_mtp_type(draft.model_type, draft.architectures, draft.config) is not None:
        text = draft.config.get("text_config")
        for key in MTP_LAYER_KEYS:
            for section, prefix in ((draft.config, ""), (text, "text_config.")):
                if isinstance(section, Mapping) and key in section:
                    return prefix + key, section[key]
    return "n_predict", draft.config.get("n_predict")


def _n_predict_refusal(n_predict: Any, k: int, draft: str, key: str = "n_predict") -> list[str]:
    """vLLM checks a draft's n_predict against k whatever the method: above n_predict, k must be a
    multiple of it (vllm/config/speculative.py, "must be divisible by n_predict"), and 0 divides by zero."""
    if not isinstance(n_predict, int) or isinstance(n_predict, bool) or n_predict < 0 or k <= n_predict:
        return []
    versions = ", ".join(VLLM_TESTED_VERSIONS)
    says = f"its config.json says {key} = {n_predict}"
    if key != "n_predict":
        says += ", which vLLM takes as n_predict once it has made the draft an MTP model"
    if n_predict == 0:
        fix = ("specsure does not read n_predict for this method; for vLLM remove the key from the draft's "
               "config.json, or set it to 1" if key == "n_predict" else
               "specsure runs this draft as asked; vLLM cannot run it, whatever the speculative config")
        return [f"vLLM {versions} fails on the draft {draft!r}: {says}, by which vLLM divides "
                f"num_speculative_tokens (ZeroDivisionError). {fix}."]
    if k % n_predict == 0:
        return []
    lower, upper = k - k % n_predict, k - k % n_predict + n_predict
    return [f"vLLM {versions} refuses num_speculative_tokens = {k} with the draft {draft!r}: {says}, and above "
            f"n_predict k must be a multiple of it (vLLM applies the rule of MTP modules to every draft with the "
            f"key). specsure runs it; for vLLM set num_speculative_tokens to {lower} or {upper}."]


def _mtp_modules(res: "Resolution") -> int | None:
    """The MTP modules vLLM counts as n_predict: the draft's, or the target's when mtp runs without one."""
    holder = res.draft if res.draft is not None else res.target
    layers = holder.mtp_layers if holder is not None else None
    return layers[1] if layers is not None else None


SGLANG_HEAD_CLASSES: Final[Mapping[str, str]] = {"eagle": "LlamaForCausalLMEagle", "eagle3": "LlamaForCausalLMEagle3"}
"""The head classes SGLang 0.5.23 registers (EntryClass in srt/models/llama_eagle*.py)."""


def _sglang_head_class(res: "Resolution") -> list[str]:
    """A head whose architectures name another engine's class (vLLM's Eagle3LlamaForCausalLM): SGLang
    looks the name up in its registry and refuses to load it."""
    config, draft = res.config, res.draft
    wanted = SGLANG_HEAD_CLASSES.get(config.method) if config is not None else None
    if wanted is None or draft is None or is_speculators(draft.config):
        return []
    named = [a for a in draft.config.get("architectures") or () if isinstance(a, str)]
    if not named or wanted in named:
        return []
    said = (f"the head {config.model!r} names its class {', '.join(map(repr, named))} in config.json; SGLang 0.5.23 "
            f"registers its {config.method} heads as {wanted!r} only and refuses a name it does not know at load.")
    if any("Llama" in name for name in named):  # vLLM's name for the same Llama layer and tensors
        return [f"{said} Give SGLang a copy of the head whose config.json says \"architectures\": [\"{wanted}\"]."]
    return [f"{said} SGLang has no class for this head's layer; serve it with specsure or vLLM."]


def _sglang(res: "Resolution") -> Export:
    config = res.config
    assert config is not None
    if config.method not in SGLANG_ALGORITHMS:
        choices = ", ".join(sorted({*SGLANG_ALGORITHMS.values(), "DFLASH", "DSPARK", "UNO"}))
        raise ConfigError(
            f"SGLang has no {config.method!r} method: its --speculative-algorithm choices ({choices}) "
            "include no suffix decoding, and specsure never exports an approximation (SGLang's NGRAM "
            "also caches earlier tokens, but it is another method). Serve suffix with specsure or vLLM "
            "(specsure export --to vllm), or choose a method SGLang runs, such as 'ngram'.")
    k = config.num_speculative_tokens
    args = ["--model-path", target_path(res), "--speculative-algorithm", SGLANG_ALGORITHMS[config.method]]
    warnings = _target_warnings(res, "SGLang")
    if config.method == "ngram":
        # SGLang counts the current token in num-draft-tokens; breadth 1 keeps one chain, no tree.
        args += ["--speculative-num-draft-tokens", str(k + 1),
                 "--speculative-ngram-min-bfs-breadth", "1", "--speculative-ngram-max-bfs-breadth", "1"]
        # SGLang 0.5.23's ngram flags (srt/arg_groups/fields/spec.py) have no match window; older
        # releases' --speculative-ngram-*-match-window-size stop today's SGLang at start.
        given = [f"{key} = {getattr(config, key)}" for key in ("prompt_lookup_min", "prompt_lookup_max")
                 if res.decisions[key].source == "user"]
        if given:
            warnings.append(f"{' and '.join(given)} {'has' if len(given) == 1 else 'have'} no SGLang flag, so "
                            f"{'it is' if len(given) == 1 else 'they are'} left out: SGLang's NGRAM matches the "
                            "context's last tokens against its cache up to --speculative-ngram-max-trie-depth (18 by "
                            "default) tokens deep. The output is the same; the drafts differ.")
        if (config.prompt_lookup_branches or 1) > 1:
            warnings.append(f"prompt_lookup_branches = {config.prompt_lookup_branches} is specsure's own token tree; "
                            "SGLang's NGRAM builds its trees differently, so the export keeps it to one chain "
                            "(breadth 1). The output is the same; fewer tokens are accepted per step.")
        warnings.append("SGLang's NGRAM drafts from a cache of earlier tokens (this and past requests), so "
                        "its drafts can differ from prompt lookup's earliest match; verification stays lossless.")
    else:
        draft = local_path(config.model) if config.model is not None else target_path(res)
        tree = config.speculative_token_tree
        steps, topk = (k, 1) if tree is None else (max(map(len, tree)), 1 + max(rank for node in tree for rank in node))
        # SGLang picks the verified nodes among topk + (steps - 1) * topk^2 candidates (organize_draft_results
        # in srt/speculative/eagle_utils.py); more fails its first draft step.
        nodes = min(k, topk + (steps - 1) * topk * topk)
        args += ["--speculative-draft-model-path", draft, "--speculative-num-steps", str(steps),
                 "--speculative-eagle-topk", str(topk), "--speculative-num-draft-tokens", str(nodes + 1)]
        if tree is not None and topk > 1:
            source = res.decisions["speculative_token_tree"].source
            whose = "your tree's" if source == "user" else f"the tree's ({source})"
            warnings.append(f"SGLang has no static speculative_token_tree: each of {steps} steps it extends its "
                            f"{topk} most likely branches by their top {topk} tokens, then verifies the {nodes} most "
                            "likely nodes (--speculative-num-steps, --speculative-eagle-topk, "
                            f"--speculative-num-draft-tokens); the export gives it {whose} depth, width and node "
                            "count. The output is the same; which nodes are drafted differs.")
            if nodes < k:
                warnings.append(f"the tree has {k} nodes, but SGLang's {steps} steps of top {topk} offer at most "
                                f"{nodes} to verify ({topk} + ({steps} - 1) x {topk}^2), and it fails at its first "
                                f"draft step when asked for more: the export asks for {nodes}.")
        warnings += _sglang_head_class(res)
        if config.method == "mtp":
            warnings.append("SGLang renames NEXTN to EAGLE internally; with a target that has MTP (NextN) layers "
                            "it still runs those layers, which is mtp.")
        if res.draft is not None and is_speculators(res.draft.config):
            warnings.append(f"the draft {config.model!r} is a speculators-format head (config.json "
                            "speculators_config, its sizes under transformer_layer_config). vLLM reads that format; "
                            "specsure has not verified that SGLang's EAGLE-3 loader does, which reads the sizes at "
                            "config.json's top level. If SGLang fails to load it, give SGLang the head in the EAGLE-3 "
                            "layout (LlamaForCausalLMEagle3: the layer's keys at the top level, midlayer.* tensors).")
    if config.disable_by_batch_size is not None:
        warnings.append(f"disable_by_batch_size = {config.disable_by_batch_size} has no SGLang flag, so it is left "
                        "out: SGLang drafts at every batch size. The output is the same; full batches verify drafts "
                        "that specsure and vLLM would skip.")
    return Export("sglang", tuple(args), None, tuple(warnings))
