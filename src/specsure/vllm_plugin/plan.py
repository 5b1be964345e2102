"""What the plugin hands vLLM: the user's speculative config resolved by specsure, every field explicit.

Pure logic on plain values (no vLLM here), so it is tested without vLLM. The user's keys that
specsure does not model (vLLM-only options such as ``draft_tensor_parallel_size``) pass through
unchanged; specsure's own keys are resolved with its rules and written back explicitly, and a
path that vLLM's substring test would catch is replaced by a neutral link to the same folder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from specsure.config.errors import ConfigError
from specsure.config.resolution import Resolution, resolve
from specsure.config.schema import FIELDS, KEY_ALIASES, SPECSURE_ONLY_FIELDS, VLLM_INSTEAD, VLLM_SCHEDULE_KEY
from specsure.config.token_tree import is_chain
from specsure.config.vllm_overrides import model_type_override, vllm_draft_path, vllm_path_trap
from specsure.config.vllm_rules import DETECTION_SKIPPED
from specsure.vllm_plugin.links import neutral_link

SPEC_FLAGS: tuple[tuple[str, str, str], ...] = (
    ("--spec-method", "spec_method", "method"), ("--spec-model", "spec_model", "model"),
    ("--spec-tokens", "spec_tokens", "num_speculative_tokens"))
"""vLLM 0.33's shorthand flags: (flag, EngineArgs attribute, speculative_config key)."""
SPECSURE_KEYS: frozenset[str] = frozenset(FIELDS) | frozenset(KEY_ALIASES)


def user_config(speculative_config: Mapping[str, Any] | None, flags: Mapping[str, Any]) -> dict[str, Any] | None:
    """The user's speculative config as vLLM merges it: the dict, plus the shorthand flags.

    ``flags`` maps EngineArgs attribute names (``spec_method`` ...) to their values. A key given
    both ways is a ValueError with vLLM's own words, as vLLM raises it.
    """
    merged = None if speculative_config is None else dict(speculative_config)
    for flag, attribute, key in SPEC_FLAGS:
        value = flags.get(attribute)
        if value is None:
            continue
        merged = {} if merged is None else merged
        if key in merged:
            raise ValueError(f"{flag} and --speculative-config['{key}'] are mutually exclusive")
        merged[key] = value
    return None if merged is None else {str(k).replace("-", "_"): v for k, v in merged.items()}


@dataclass(frozen=True)
class Plan:
    """The outcome of planning one create_speculative_config call."""

    user: Mapping[str, Any] | None
    """The user's config as written (dict plus shorthand flags)."""
    resolution: Resolution | None = None
    """specsure's resolution of the user's keys; None in guard mode."""
    handed: dict[str, Any] | None = None
    """What vLLM receives as speculative_config; None means the user's config unchanged."""
    links: tuple[tuple[str, str], ...] = ()
    """(path, neutral link) for each path replaced."""
    guard_only: str = ""
    """Why the config is handed to vLLM unchanged and only checked afterwards ('' when rewritten)."""
    dropped: tuple[str, ...] = field(default=())
    """One sentence per explicit specsure-only key vLLM cannot take (vLLM 0.33.0 refuses them): enforce
    mode refuses to start, warn mode hands vLLM the config without them."""
    warnings: tuple[str, ...] = field(default=())
    """What the plugin itself has to say; the resolution's own warnings (evidence that disagrees
    with an explicit value) are logged by specsure.config as resolve() runs."""
    notes: tuple[str, ...] = field(default=())
    """specsure-only keys left out because vLLM drafts the same without them (a chain), logged at INFO."""


def make_plan(user: Mapping[str, Any] | None, target: str, *, rewrite: bool = True,
              target_quantization: str | None = None, strict: bool = False) -> Plan:
    """Resolve the user's keys against ``target`` and build the explicit config for vLLM.

    ``rewrite=False`` (an untested vLLM version) resolves only, for the guard's comparison.
    ``target_quantization``: the target's quantization in vLLM (``--quantization``), which vLLM gives
    an MTP draft it fills from the target itself, and the plan gives it where it names that draft.
    A config specsure cannot resolve (a method it does not model, a target that is not a local
    folder, a value outside specsure's own bounds) is handed over unchanged, and the guard still
    compares vLLM's method and draft with the user's explicit ones; with ``strict`` (specsure's
    --strict) evidence that disagrees with an explicit value, or a config specsure cannot resolve,
    is a ConfigError instead.
    """
    if user is None:
        return Plan(user=None)
    ours = {k: v for k, v in user.items() if k in SPECSURE_KEYS}  # resolve reads vLLM's older ngram spellings
    theirs = {k: v for k, v in user.items() if k not in SPECSURE_KEYS}
    try:
        res = resolve(ours, model=target, dtype=None, strict=strict)  # vLLM runs it, not this CPU
    except ConfigError as exc:
        if strict:
            raise
        return Plan(user=user, guard_only=f"specsure cannot resolve this config ({exc})")
    if res.config is None:
        return Plan(user=user, resolution=res, guard_only="speculation is off")
    if not rewrite:
        return Plan(user=user, resolution=res, guard_only="untested vLLM version")
    warnings = []
    try:
        res.check_runnable(weights=False)
    except ConfigError as exc:
        # vLLM runs an explicit method whatever the checkpoint is; the plugin keeps the method and says so.
        warnings.append(f"specsure's engine would refuse this config: {exc}")
    handed = {**theirs, **res.config.to_vllm()}
    # disable_by_batch_size reaches vLLM as its batch-size schedule, where it runs one.
    carried = {"disable_by_batch_size"} if res.config.vllm_batch_schedule() is not None else set()
    left_out = [key for key in sorted(SPECSURE_ONLY_FIELDS & set(ours) - carried) if ours[key] is not None]
    k = res.config.num_speculative_tokens
    same = [key for key in left_out if _chain_in_vllm(key, getattr(res.config, key))]
    notes = [f"{key} = {json.dumps(ours[key])} drafts a chain of {k} tokens, as vLLM does without the key, "
             "which it does not have: left out." for key in same]
    dropped = [f"{key} = {json.dumps(ours[key])} is a specsure key that vLLM does not have; without it "
               f"vLLM drafts {VLLM_INSTEAD[key].format(k=k)}. Remove it "
               "from the config for vLLM, or serve this config with specsure."
               for key in left_out if key not in same]
    if carried and VLLM_SCHEDULE_KEY in theirs:
        handed[VLLM_SCHEDULE_KEY] = theirs[VLLM_SCHEDULE_KEY]  # the user's own vLLM key is kept as given
        dropped.append(f"disable_by_batch_size = {json.dumps(ours['disable_by_batch_size'])} and vLLM's "
                       f"{VLLM_SCHEDULE_KEY} = {json.dumps(theirs[VLLM_SCHEDULE_KEY])} both say when to draft; "
                       "vLLM gets its own key. Remove one of them.")
    links: list[tuple[str, str]] = []
    where = vllm_draft_path(res)
    if where is not None and res.config.method not in DETECTION_SKIPPED and vllm_path_trap(where[0]):
        link = neutral_link(where[0])
        handed["model"] = link  # for mtp without a draft this names the target's own folder explicitly
        links.append((where[0], link))
        if res.config.model is None and target_quantization and not handed.get("quantization"):
            # vLLM aligns the draft's quantization with the target's only when it fills model itself
            handed["quantization"] = target_quantization
    if where is not None and res.config.method not in DETECTION_SKIPPED and (
            behind := model_type_override(res, where[0], where[1])) is not None:
        # No key stops this one; the guard sees it once vLLM has resolved, and refuses or warns.
        warnings.append(f"vLLM will switch method {res.config.method!r} to {behind.vllm!r} whatever it is handed: "
                        f"{behind.cause}; {behind.fix}.")
    return Plan(user=user, resolution=res, handed=handed, links=tuple(links), dropped=tuple(dropped),
                warnings=tuple(warnings), notes=tuple(notes))


def _chain_in_vllm(key: str, value: Any) -> bool:
    """Whether a specsure-only key's resolved value drafts what vLLM drafts without it: one branch, a chain tree."""
    if key == "prompt_lookup_branches":
        return value in (None, 1)
    return key == "speculative_token_tree" and (value is None or is_chain(value))


def provenance(plan: Plan) -> str:
    """The one log line: the effective config with each field's source, and any link used."""
    if plan.resolution is None or plan.resolution.config is None:
        return f"speculative config handed to vLLM unchanged ({plan.guard_only}); checked after vLLM resolves it"
    if plan.handed is None:
        # Handed unchanged: vLLM fills the unset fields with its own defaults, which may not be
        # specsure's (ngram's 5..5 against 2..5), so specsure's values for them are no forecast.
        decisions = plan.resolution.decisions
        mine = ", ".join(f"{n}={d.value!r}" for n, d in decisions.items() if n != "target" and d.source == "user")
        return (f"speculative config handed to vLLM unchanged ({plan.guard_only}): you set {mine or 'nothing'}; "
                "the fields you left unset take vLLM's own defaults, logged once vLLM resolves it")
    line = f"effective speculative config: {plan.resolution.summary()}"
    if plan.handed is not None:
        line += f"; handed to vLLM as {plan.handed}"
    for path, link in plan.links:
        line += f"; {path!r} is passed as the neutral link {link!r}, which vLLM's path detection does not catch"
    return line


def vllm_summary(vllm: Mapping[str, Any]) -> str:
    """vLLM's resolved speculative config (`guard.resolved`), its fields that are set, in one line."""
    method = vllm.get("method")

    def read(key: str) -> bool:  # vLLM fills every method's keys; show those its method reads
        return not ((key.startswith("prompt_lookup_") and method != "ngram")
                    or (key.startswith("suffix_decoding_") and method != "suffix"))

    shown = {k: v for k, v in vllm.items()
             if v is not None and read(k) and k not in ("draft_architectures", "target_model_type")}
    return ", ".join(f"{k}={v!r}" for k, v in shown.items())
