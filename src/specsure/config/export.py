"""Export a Resolution to vLLM or SGLang server arguments, every field explicit. No torch.

The export never re-resolves: it renders ``res.config``. Where the other engine has no way
to run the resolved method, the export raises ConfigError instead of approximating. Where
vLLM would silently run another method (a draft path that its substring test catches, or a
draft ``model_type`` it rewrites to an MTP type), the export warns and proposes the fix.
``specsure check-vllm`` asks the installed vLLM itself; the rules below are a prediction.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, Mapping

from specsure.config.compat import LAYER_IDS_KEY, declared_aux_layers
from specsure.config.detect import MTP_HEAD_ARCHITECTURES
from specsure.config.errors import ConfigError
from specsure.config.schema import MTP_METHOD_ALIASES, NO_DRAFT_METHODS
from specsure.config.token_tree import is_chain

if TYPE_CHECKING:
    from specsure.config.resolution import Resolution

Engine = Literal["vllm", "sglang"]
ENGINES: Final[tuple[str, ...]] = ("vllm", "sglang")
VLLM_TESTED_VERSIONS: Final[tuple[str, ...]] = ("0.33.0",)

# vLLM 0.33.0, vllm/config/speculative.py SpeculativeConfig.__post_init__: unless the method
# is one of these, it searches the lower-cased draft path for substrings (in this order) and
# replaces the method without a log line.
VLLM_DETECTION_SKIPPED: Final[frozenset[str]] = frozenset({"eagle", "eagle3", "dflash", "dspark"})
VLLM_PATH_TRAPS: Final[tuple[tuple[str, str], ...]] = (
    ("eagle-", "eagle"), ("eagle3", "eagle3"), ("dflash", "dflash"), ("dspark", "dspark"))
# Draft model_types vLLM's hf_config_override rewrites to an MTP type before detection; a
# draft of such a type then runs as 'mtp' whatever the method says.
VLLM_MTP_REWRITES: Final[Mapping[str, str]] = {
    "deepseek_v3": "deepseek_mtp", "deepseek_v32": "deepseek_mtp", "glm_moe_dsa": "deepseek_mtp",
    "qwen3_next": "qwen3_next_mtp", "ernie4_5_moe": "ernie_mtp", "longcat_flash": "longcat_flash_mtp",
    "pangu_ultra_moe": "pangu_ultra_moe_mtp", "exaone_moe": "exaone_moe_mtp", "hy_v3": "hy_v3_mtp",
}
# The same function rewrites these by the draft's first architecture, whatever its model_type.
VLLM_MTP_ARCHITECTURE_REWRITES: Final[Mapping[str, str]] = {
    "MiMoForCausalLM": "mimo_mtp", "MiMoV2FlashForCausalLM": "mimo_v2_mtp",
    "Glm4MoeForCausalLM": "glm4_moe_mtp", "Glm4MoeLiteForCausalLM": "glm4_moe_lite_mtp",
}
# Draft model_types that vLLM's detection turns into their own method, after the path test, before MTP.
VLLM_MODEL_TYPE_METHODS: Final[frozenset[str]] = frozenset({"medusa", "mlp_speculator"})
# vLLM's MTPModelTypes: the model_types that make it run 'mtp', and the method names it takes as 'mtp'.
VLLM_MTP_MODEL_TYPES: Final[frozenset[str]] = MTP_METHOD_ALIASES | {"mtp"}
# Draft architectures that only specsure loads; no other engine has a model class for them.
SPECSURE_ONLY_ARCHITECTURES: Final[frozenset[str]] = MTP_HEAD_ARCHITECTURES

SGLANG_ALGORITHMS: Final[Mapping[str, str]] = {
    "ngram": "NGRAM", "draft_model": "STANDALONE", "eagle": "EAGLE", "eagle3": "EAGLE3", "mtp": "NEXTN",
}
"""specsure's methods that SGLang can run; SGLang has no suffix decoding."""


@dataclass(frozen=True)
class PathTrap:
    """A substring of a path that makes vLLM switch methods."""

    path: str
    """The path as vLLM reads it."""
    role: Literal["draft", "target"]
    """Which checkpoint the path names: the draft, or the target (mtp without a draft)."""
    substring: str
    method: str
    """The method vLLM switches to."""

    @property
    def flag(self) -> str:
        """Where the path goes on vLLM's command line."""
        return "--model" if self.role == "target" else 'the "model" key of --speculative-config'

    def fix_text(self, command: str | None, link: str) -> str:
        """The fix for a message: make the link (unless it exists) and pass it."""
        if command is None:
            return f"pass the neutral symlink {link!r}, which already links to the {self.role}, as {self.flag}"
        return f"serve the {self.role} through a neutral symlink: {command} and pass {link!r} as {self.flag}"

    def symlink_fix(self) -> tuple[str | None, str]:
        """(shell command, new path): a symlink whose path vLLM's substring test passes; the command is
        None when that link exists already."""
        real = Path(self.path).expanduser().absolute()
        parent = real.parent
        while vllm_path_trap(str(parent)) is not None and parent != parent.parent:
            parent = parent.parent
        if vllm_path_trap(str(parent)) is not None:
            parent = Path("/tmp")
        name = neutral_name(real.name) or f"{self.role}-checkpoint"
        # A name already taken (say /models/llama-1b beside /models/eagle-exp/llama-1b) would make
        # `ln -s` put the link inside that folder, and vLLM would load the other model as told.
        candidates = (parent / (name if n == 0 else f"{name}_link{n}") for n in itertools.count())
        link = next(c for c in candidates if not os.path.lexists(c) or _links_to(c, real))
        if _links_to(link, real):
            return None, str(link)
        return f"ln -s {shlex.quote(str(real))} {shlex.quote(str(link))}", str(link)


def _links_to(link: Path, real: Path) -> bool:
    """Whether ``link`` is a symbolic link that resolves to the folder ``real``."""
    return link.is_symlink() and link.resolve() == real.resolve()


def vllm_path_trap(path: str) -> tuple[str, str] | None:
    """(substring, method) when vLLM's detection catches ``path``; None for a neutral path."""
    lowered = path.lower()
    for substring, method in VLLM_PATH_TRAPS:
        if substring in lowered:
            return substring, method
    return None


def neutral_name(name: str) -> str:
    """``name`` with every trap substring broken by an underscore: 'my-eagle-draft' -> 'my-eagle_draft'."""
    out = re.sub("(eagle)-", r"\1_", name, flags=re.IGNORECASE)
    out = re.sub("(eagle)(3)", r"\1_\2", out, flags=re.IGNORECASE)
    out = re.sub("(d)(flash|spark)", r"\1_\2", out, flags=re.IGNORECASE)
    return out


def vllm_draft_path(res: "Resolution") -> tuple[str, Literal["draft", "target"]] | None:
    """The path vLLM loads as the draft: the draft, or the target for mtp without one."""
    config = res.config
    if config is None or config.method in NO_DRAFT_METHODS:
        return None
    if config.model is not None:
        return local_path(config.model), "draft"
    return target_path(res), "target"


def target_path(res: "Resolution") -> str:
    """The target as another engine's --model: the path given, or the packaged GGUF file."""
    return local_path(res.target_model) if res.target_model is not None else res.target.path


def local_path(path: str) -> str:
    """``path`` as the other engine must get it: a leading ``~`` expanded as specsure expanded it.
    Quoted in the exported command, ``~/model`` would reach vLLM or SGLang literally, and they would
    look it up as a Hugging Face repository id."""
    return os.path.expanduser(path) if path.startswith("~") else path


@dataclass(frozen=True)
class Override:
    """A predicted silent override by vLLM: what it would run instead, why, and the fix."""

    field: str
    asked: Any
    vllm: Any
    cause: str
    fix: str
    workaround: str | None = None
    """A shell command that applies the fix, when one exists."""


def predict_vllm_overrides(res: "Resolution") -> tuple[Override, ...]:
    """The silent rewrites vLLM 0.33.0 would apply to the exported config, from its known rules."""
    config = res.config
    where = vllm_draft_path(res)
    if config is None or where is None or config.method in VLLM_DETECTION_SKIPPED:
        return ()
    path, role = where
    hit = vllm_path_trap(path)
    if hit is None:
        behind = model_type_override(res, path, role)
        return () if behind is None else (behind,)
    trap = PathTrap(path=path, role=role, substring=hit[0], method=hit[1])
    fix, command = trap_fix(res, trap)
    return (Override(
        "method", config.method, trap.method,
        cause=(f"the {role} path {path!r} contains {trap.substring!r}; vLLM's method detection (skipped only "
               f"for methods {', '.join(sorted(VLLM_DETECTION_SKIPPED))}) tests for that substring and switches "
               f"{config.method!r} to {trap.method!r} without a log line"),
        fix=fix, workaround=command),)


def trap_fix(res: "Resolution", trap: PathTrap) -> tuple[str, str | None]:
    """(the fix, its shell command) for a path trap: a neutral symlink, unless vLLM would then switch
    the method from the checkpoint's model_type. Its substring test comes first and hides that rule,
    so a symlink would only trade one switch for the other; it is not offered then."""
    behind = model_type_override(res, trap.path, trap.role)
    if behind is None:
        command, link = trap.symlink_fix()
        return trap.fix_text(command, link), command
    return (f"a neutral symlink is not enough: behind it vLLM would still switch to {behind.vllm!r}, because "
            f"{behind.cause}; {behind.fix}"), None


def model_type_override(res: "Resolution", path: str, role: str) -> Override | None:
    """The switch vLLM 0.33.0 makes from the draft's model_type or architecture, its path aside."""
    config = res.config
    assert config is not None
    draft = res.draft if config.model is not None else res.target
    model_type = draft.model_type if draft is not None else None
    first = draft.architectures[0] if draft is not None and draft.architectures else None
    if model_type in VLLM_MODEL_TYPE_METHODS and config.method != model_type:
        return Override(
            "method", config.method, model_type,
            cause=(f"the {role} checkpoint {path!r} has model_type {model_type!r}; vLLM's method detection "
                   f"switches {config.method!r} to {model_type!r} for that model_type without a log line"),
            fix=f"give a draft made for {config.method!r}; specsure does not run {model_type!r} either")
    if config.method != "mtp" and first in VLLM_MTP_ARCHITECTURE_REWRITES:
        rewritten = VLLM_MTP_ARCHITECTURE_REWRITES[first]
        how = f"rewrites its model_type to {rewritten!r} for architecture {first!r}, then "
    elif config.method != "mtp" and model_type is not None and (
            model_type in VLLM_MTP_REWRITES or model_type in VLLM_MTP_MODEL_TYPES):
        rewritten = VLLM_MTP_REWRITES.get(model_type, model_type)
        how = f"rewrites model_type {model_type!r} to {rewritten!r}, then " if rewritten != model_type else ""
    else:
        return None
    return Override(
        "method", config.method, "mtp",
        cause=(f"the {role} checkpoint {path!r} has model_type {model_type!r}; vLLM {how}detects "
               "'mtp' from the MTP model_type and replaces the method without a log line"),
        fix=("no speculative-config key prevents this in vLLM 0.33.0; run this draft with specsure, or "
             "choose method 'mtp' if the MTP layers are what you want"))


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
    ``strict`` (default: the Resolution's own), a predicted silent override is an error too.
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
    if strict and engine == "vllm" and (overrides := predict_vllm_overrides(res)):
        raise ConfigError(" ".join(f"vLLM would run {o.field} {o.vllm!r} instead of {o.asked!r}: {o.cause}. "
                                   f"Fix: {o.fix}." for o in overrides) + " (strict mode)")
    return out


def _aux_layers_note(res: "Resolution", engine: str) -> str | None:
    """vLLM's and SGLang's EAGLE-3 models fuse exactly three target layers, collected in ascending
    order as the target runs; specsure fuses the listed layers in the listed order."""
    draft = res.draft
    if res.config is None or res.config.method != "eagle3" or draft is None:
        return None
    ids = (declared_aux_layers(draft.config) or ("", None))[1]
    if not isinstance(ids, list) or (len(ids) == 3 and ids == sorted(set(ids))):
        return None
    name = "vLLM" if engine == "vllm" else "SGLang"
    if len(ids) != 3:
        return (f"the head {draft.path!r} fuses {len(ids)} target layer(s) ({LAYER_IDS_KEY} = {ids}); {name}'s "
                "EAGLE-3 model fuses exactly 3 and will refuse its fc weight. specsure runs it as it is.")
    return (f"the head {draft.path!r} lists its target layers out of ascending order ({LAYER_IDS_KEY} = {ids}); "
            f"{name} collects them in ascending order, so the head would read its inputs permuted there and accept "
            "few drafts (the output stays the same). specsure fuses them in the listed order.")


def _check_loadable(res: "Resolution", engine: str) -> None:
    draft = res.draft
    if draft is not None and (hit := set(draft.architectures) & SPECSURE_ONLY_ARCHITECTURES):
        raise ConfigError(
            f"the draft {draft.path!r} is a specsure-format head (architectures={sorted(hit)}), which {engine} "
            f"has no model class for; {engine} cannot run it as {res.config.method!r}. Serve it with specsure, "
            "or use a head in the engine's own format.")


def _target_warnings(res: "Resolution", engine: str) -> list[str]:
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
    if config.method == "mtp" and (modules := _mtp_modules(res)) is not None:
        k = config.num_speculative_tokens
        if k > modules and k % modules:
            # vllm/config/speculative.py __post_init__: above n_predict, k must reuse the modules whole rounds.
            warnings.append(f"vLLM {', '.join(VLLM_TESTED_VERSIONS)} refuses num_speculative_tokens = {k} with "
                            f"{modules} MTP modules (n_predict): above {modules} it must be a multiple of "
                            f"{modules}. specsure runs it, reusing the modules in turn; for vLLM set "
                            f"num_speculative_tokens to {k - k % modules} or {k - k % modules + modules}.")
    if config.method == "suffix":
        # vllm/config/speculative.py _validate_suffix_decoding raises ImportError without it.
        warnings.append("vLLM runs suffix decoding through the arctic-inference package and refuses the config "
                        "without it; install it in vLLM's environment: pip install arctic-inference.")
    workarounds = []
    for o in predict_vllm_overrides(res):
        warnings.append(f"vLLM {', '.join(VLLM_TESTED_VERSIONS)} would run {o.field} {o.vllm!r}, not {o.asked!r}: "
                        f"{o.cause}. Fix: {o.fix}.")
        if o.workaround:
            workarounds.append(o.workaround)
    return Export("vllm", args, spec, tuple(warnings), tuple(workarounds))


def _mtp_modules(res: "Resolution") -> int | None:
    """The MTP modules vLLM counts as n_predict: the draft's, or the target's when mtp runs without one."""
    holder = res.draft if res.draft is not None else res.target
    layers = holder.mtp_layers if holder is not None else None
    return layers[1] if layers is not None else None


def _sglang(res: "Resolution") -> Export:
    config = res.config
    assert config is not None
    if config.method not in SGLANG_ALGORITHMS:
        choices = ", ".join(sorted({*SGLANG_ALGORITHMS.values(), "DFLASH"}))
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
                 "--speculative-ngram-min-match-window-size", str(config.prompt_lookup_min),
                 "--speculative-ngram-max-match-window-size", str(config.prompt_lookup_max),
                 "--speculative-ngram-min-bfs-breadth", "1", "--speculative-ngram-max-bfs-breadth", "1"]
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
        args += ["--speculative-draft-model-path", draft, "--speculative-num-steps", str(steps),
                 "--speculative-eagle-topk", str(topk), "--speculative-num-draft-tokens", str(k + 1)]
        if tree is not None and topk > 1:
            warnings.append(f"SGLang has no static speculative_token_tree: it grows a tree each step from the head's "
                            f"top {topk} at every node for {steps} steps and verifies the {k} most likely nodes "
                            "(--speculative-eagle-topk, --speculative-num-steps, --speculative-num-draft-tokens); "
                            "the export gives it your tree's width, depth and node count. The output is the same; "
                            "which nodes are drafted differs.")
        if config.method == "mtp":
            warnings.append("SGLang renames NEXTN to EAGLE internally; with a target that has MTP (NextN) layers "
                            "it still runs those layers, which is mtp.")
    if config.disable_by_batch_size is not None:
        warnings.append(f"disable_by_batch_size = {config.disable_by_batch_size} has no SGLang flag, so it is left "
                        "out: SGLang drafts at every batch size. The output is the same; full batches verify drafts "
                        "that specsure and vLLM would skip.")
    return Export("sglang", tuple(args), None, tuple(warnings))
