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
from typing import TYPE_CHECKING, Any, Literal

from specsure.config.schema import NO_DRAFT_METHODS
from specsure.config.vllm_rules import (
    DETECTION_SKIPPED, PATH_TRAPS, VLLM_TESTED_VERSIONS, foreign_method, remote_verifier, speculators_target,
    vllm_mtp_type,
)

if TYPE_CHECKING:
    from specsure.config.resolution import Resolution

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
    for substring, method in PATH_TRAPS:
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
    """``path`` as the other engine must get it: a leading ``~`` expanded as specsure expanded it, and
    ``./`` before a leading ``-``. Quoted in the exported command, ``~/model`` would reach vLLM or
    SGLang literally, and they would look it up as a Hugging Face repository id; ``--model -tgt``
    would be an option to their argument parsers, not a path."""
    if path.startswith("~"):
        return os.path.expanduser(path)
    return f"./{path}" if path.startswith("-") else path


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
    if (replaced := speculators_override(res)) is not None:
        return (replaced,)
    config = res.config
    where = vllm_draft_path(res)
    if config is None or where is None or config.method in DETECTION_SKIPPED:
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
               f"for methods {', '.join(sorted(DETECTION_SKIPPED))}) tests for that substring and switches "
               f"{config.method!r} to {trap.method!r} without a log line"),
        fix=fix, workaround=command),)


def speculators_override(res: "Resolution") -> Override | None:
    """A speculators-format target: vLLM serves its verifier and replaces the method and the draft
    with the checkpoint's own, whatever the config says (when it names a remote verifier)."""
    config, found = res.config, speculators_target(res.target.config)
    if config is None or found is None or not remote_verifier(found[1]):
        return None
    method, verifier = found
    target = target_path(res)
    field, asked, theirs = (("method", config.method, method) if method != config.method else
                            ("model", config.model, target))
    return Override(
        field, asked, theirs,
        cause=(f"the target {target!r} is a speculators-format checkpoint (config.json speculators_config), so "
               f"vLLM's create_engine_config serves its verifier {verifier!r} (from the Hugging Face Hub) as --model "
               f"and replaces the method with {method!r} and the draft with {target!r}, keeping your other keys, "
               "without a log line"),
        fix=(f"pass the verifier as --model and this folder as the draft: --model {verifier} --speculative-config "
             f"'{{\"method\": \"{method}\", \"model\": \"{target}\"}}', or a target that is not a speculators "
             "checkpoint"))


def speculators_refusal(res: "Resolution") -> str | None:
    """vLLM 0.33.0 refuses a speculators-format target whose verifier is not a remote repository."""
    found = speculators_target(res.target.config) if res.config is not None else None
    if found is None or remote_verifier(found[1]):
        return None
    return (f"vLLM {', '.join(VLLM_TESTED_VERSIONS)} refuses the target {target_path(res)!r}: it is a speculators-format "
            f"checkpoint (config.json speculators_config) whose verifier {found[1]!r} is not a remote repository "
            "(vLLM: \"Select local verifiers explicitly\"); pass the verifier as --model and this folder as the "
            "draft's \"model\"")


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
    """The switch vLLM 0.33.0 makes from the draft's architecture or model_type, its path aside."""
    config = res.config
    assert config is not None
    draft = res.draft if config.model is not None else res.target
    if draft is None:
        return None
    model_type = draft.model_type
    foreign = foreign_method(draft.architectures, model_type, draft.config)
    if foreign is not None and config.method != foreign:
        return Override(
            "method", config.method, foreign,
            cause=(f"the {role} checkpoint {path!r} has architectures {list(draft.architectures)}; vLLM's method "
                   f"detection switches {config.method!r} to {foreign!r} for them without a log line"),
            fix=f"give a draft made for {config.method!r}; specsure does not run {foreign!r} either")
    mtp = vllm_mtp_type(model_type, draft.architectures, draft.config)
    if config.method == "mtp" or mtp is None:
        return None
    rewritten, by_architecture = mtp
    if by_architecture is not None:
        how = f"rewrites its model_type to {rewritten!r} for architecture {by_architecture!r}, then "
    elif rewritten != model_type:
        how = f"rewrites model_type {model_type!r} to {rewritten!r}, then "
    else:
        how = ""
    return Override(
        "method", config.method, "mtp",
        cause=(f"the {role} checkpoint {path!r} has model_type {model_type!r}; vLLM {how}detects "
               "'mtp' from the MTP model_type and replaces the method without a log line"),
        fix=("no speculative-config key prevents this in vLLM 0.33.0; run this draft with specsure, or "
             "choose method 'mtp' if the MTP layers are what you want"))
