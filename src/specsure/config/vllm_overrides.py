"""What vLLM 0.33.0 would silently change in an exported config, predicted from its known rules.

vLLM's SpeculativeConfig detects the method from the draft's path (a substring test) and its
model_type or architecture (rewritten to an MTP type), and replaces an explicit method without a
log line. `predict_vllm_overrides` names each switch and its fix (a neutral symlink where one
helps); export warns with them, check-vllm explains a mismatch with them, and the vLLM plugin
hands vLLM the neutral paths. ``specsure check-vllm`` asks the installed vLLM itself.
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, Mapping

from specsure.config.schema import MTP_METHOD_ALIASES, NO_DRAFT_METHODS

if TYPE_CHECKING:
    from specsure.config.resolution import Resolution

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
