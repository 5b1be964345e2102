"""Wrapping vLLM's config code: the two places where vLLM 0.33 decides the speculative config.

``EngineArgs.create_speculative_config`` builds vLLM's SpeculativeConfig, whose
``__post_init__`` (a pydantic dataclass, so it cannot be patched after the class is built)
detects the method from the draft path and model_type. The wrapper hands it specsure's fully
explicit config, then compares what vLLM resolved with what was asked. ``arg_utils`` also
imports ``maybe_override_with_speculators`` by value, which replaces the method and draft when
the target is a speculators-format checkpoint; that name is wrapped where arg_utils looks it up.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from typing import Any, Callable, Final, Iterator, Literal

from specsure.config.errors import ConfigError
from specsure.config.export import VLLM_TESTED_VERSIONS
from specsure.config.schema import MTP_METHOD_ALIASES
from specsure.vllm_plugin.guard import mismatches, resolved
from specsure.vllm_plugin.links import LINKS_ENV
from specsure.vllm_plugin.plan import SPEC_FLAGS, make_plan, provenance, user_config, vllm_summary

Mode = Literal["strict", "enforce", "warn", "off"]
MODES: Final[tuple[str, ...]] = ("strict", "enforce", "warn", "off")
ENV: Final[str] = "SPECSURE_VLLM_PLUGIN"
_MARK: Final[str] = "__specsure_wrapped__"

# A child of vLLM's own logger, so the lines appear in vLLM's log with its format.
logger = logging.getLogger("vllm.specsure")


class PluginRefusal(ValueError):
    """vLLM would run another speculative method or draft than the one configured."""


def mode() -> Mode:
    """SPECSURE_VLLM_PLUGIN: strict, enforce (default), warn or off. Anything else stops vLLM with the choices."""
    value = os.environ.get(ENV, "enforce").strip().lower() or "enforce"
    if value not in MODES:
        raise ValueError(f"{ENV}={os.environ.get(ENV)!r} is not a mode; use one of {', '.join(MODES)} "
                         "(strict refuses to start on a silent override and on evidence that disagrees with an "
                         "explicit value or a config specsure's engine would refuse, as specsure's --strict does; "
                         "enforce refuses on a silent override; warn logs it; off does nothing).")
    return value  # type: ignore[return-value]


class _Forward(logging.Handler):
    """specsure's own log records (specsure.config's disagreement warnings) into vLLM's logger, so they
    print in vLLM's format with the plugin's lines, not as bare lines from Python's last resort."""

    def emit(self, record: logging.LogRecord) -> None:
        record = logging.makeLogRecord({**record.__dict__, "name": logger.name, "args": None,
                                        "msg": f"specsure: {record.getMessage()}"})
        logger.handle(record)


@contextlib.contextmanager
def _forwarded() -> Iterator[None]:
    """specsure's records forwarded while the plugin resolves (a handler found: Python's last resort no
    longer prints them bare); only then, so specsure's logging elsewhere in the process is left alone."""
    source, handler = logging.getLogger("specsure"), _Forward()
    source.addHandler(handler)
    try:
        yield
    finally:
        source.removeHandler(handler)


def install(engine_args: type, arg_utils: Any, version: str) -> bool:
    """Wrap ``engine_args.create_speculative_config`` and ``arg_utils.maybe_override_with_speculators``.

    Idempotent: vLLM runs plugins in every process, possibly more than once. Returns True when
    this call installed the wrappers.
    """
    original = getattr(engine_args, "create_speculative_config", None)
    if original is None:  # another vLLM's layout: nothing to guard, and a plugin must not stop vLLM starting
        logger.warning("specsure: vLLM %s has no EngineArgs.create_speculative_config, where the plugin guards the "
                       "speculative config (tested: %s); the plugin does nothing in this vLLM.", version,
                       ", ".join(VLLM_TESTED_VERSIONS))
        return False
    if getattr(original, _MARK, False):
        return False
    tested = version in VLLM_TESTED_VERSIONS
    if not tested:
        logger.warning("specsure: vLLM %s is not a tested version (tested: %s); the plugin runs in guard mode "
                       "only: it checks the resolved speculative config and refuses a silent override, but does "
                       "not rewrite it.", version, ", ".join(VLLM_TESTED_VERSIONS))
    engine_args.create_speculative_config = _wrap_create(original, version, rewrite=tested)
    speculators = getattr(arg_utils, "maybe_override_with_speculators", None)
    if speculators is not None and not getattr(speculators, _MARK, False):
        arg_utils.maybe_override_with_speculators = _wrap_speculators(speculators, version)
    return True


def _refuse_or_warn(problems: list[str], what: str) -> None:
    if not problems:
        return
    text = f"specsure: {what}: " + " ".join(problems)
    if mode() == "warn":
        logger.warning("%s (%s=warn: vLLM's choice stands.)", text, ENV)
        return
    raise PluginRefusal(f"{text} vLLM does not start ({ENV}={mode()}); set {ENV}=warn to let vLLM's choice "
                        f"stand, or {ENV}=off to disable the plugin.")


def _wrap_create(original: Callable[..., Any], version: str, *, rewrite: bool) -> Callable[..., Any]:
    @functools.wraps(original)
    def create_speculative_config(self: Any, target_model_config: Any, target_parallel_config: Any,
                                  *args: Any, **kwargs: Any) -> Any:
        if mode() == "off":
            return original(self, target_model_config, target_parallel_config, *args, **kwargs)
        flags = {attribute: getattr(self, attribute, None) for _, attribute, _ in SPEC_FLAGS}
        user = user_config(self.speculative_config, flags)
        target = str(getattr(target_model_config, "model", None) or self.model)
        strict = mode() == "strict"
        try:
            with _forwarded():
                plan = make_plan(user, target, rewrite=rewrite, strict=strict,
                                 target_quantization=getattr(target_model_config, "quantization", None))
        except ConfigError as exc:  # strict's refusals, or no neutral link for a trapped path
            _refuse_or_warn([str(exc)], "the speculative config cannot be handed to vLLM as configured")
            return original(self, target_model_config, target_parallel_config, *args, **kwargs)  # warn
        if strict:
            _refuse_or_warn(list(plan.warnings), "specsure --strict would refuse this config")
        for warning in plan.warnings:
            logger.warning("specsure: %s", warning)
        for note in plan.notes:
            logger.info("specsure: %s", note)
        _refuse_or_warn(list(plan.dropped), "the speculative config sets keys vLLM cannot run, so it would "
                                            "start without them")
        if plan.links and _may_span_nodes(target_parallel_config) and not os.environ.get(LINKS_ENV):
            logger.warning("specsure: the neutral link%s %s exist%s on this host only, and this vLLM may run "
                           "workers on other nodes (nnodes > 1, or the Ray backend), which would look for the draft "
                           "there; set %s to a folder on storage every node shares, at the same path.",
                           "s" * (len(plan.links) > 1), ", ".join(link for _, link in plan.links),
                           "" if len(plan.links) > 1 else "s", LINKS_ENV)
        if plan.handed is not None:
            self.speculative_config = dict(plan.handed)
            for _, attribute, _ in SPEC_FLAGS:  # merged into the dict already; vLLM must not merge them again
                if hasattr(self, attribute):
                    setattr(self, attribute, None)
        if user is not None:
            logger.info("specsure: %s", provenance(plan))
        spec = original(self, target_model_config, target_parallel_config, *args, **kwargs)
        if spec is None or user is None:
            return spec
        target_type = getattr(getattr(target_model_config, "hf_config", None), "model_type", None)
        theirs = resolved(spec, target_type)
        if plan.handed is None:  # vLLM filled the unset fields: say with what
            logger.info("specsure: vLLM %s resolved the speculative config as: %s", version, vllm_summary(theirs))
        unchanged = f" (specsure handed your config to vLLM unchanged: {plan.guard_only})" if plan.guard_only else ""
        _refuse_or_warn(mismatches(plan, theirs, version),
                        f"vLLM resolved another speculative config than the one asked for{unchanged}")
        return spec

    setattr(create_speculative_config, _MARK, True)
    return create_speculative_config


def _may_span_nodes(parallel: Any) -> bool:
    """Whether vLLM's workers may run on other hosts: several nodes, or Ray or torchrun (external_launcher),
    whose processes may span hosts while nnodes stays 1."""
    nodes = getattr(parallel, "nnodes", 1)
    backend = getattr(parallel, "distributed_executor_backend", None)
    return (isinstance(nodes, int) and nodes > 1) or backend in ("ray", "external_launcher")


def _wrap_speculators(original: Callable[..., Any], version: str) -> Callable[..., Any]:
    @functools.wraps(original)
    def maybe_override_with_speculators(*args: Any, **kwargs: Any) -> Any:
        asked = kwargs.get("vllm_speculative_config")
        model, tokenizer, spec = original(*args, **kwargs)
        if mode() == "off" or not isinstance(asked, dict) or not isinstance(spec, dict):
            return model, tokenizer, spec
        problems = []
        for key in ("method", "model"):
            mine, theirs = asked.get(key), spec.get(key)
            if key == "method":  # an old MTP name is 'mtp' on both sides: vLLM renames it later, in the config
                mine, theirs = ("mtp" if m in MTP_METHOD_ALIASES else m for m in (mine, theirs))
            if mine is not None and mine != theirs:
                problems.append(f"{key}: you asked for {mine!r}, but vLLM {version} would run {theirs!r}. Signal: "
                                f"the target {kwargs.get('model', args[0] if args else '?')!r} is a speculators-"
                                f"format checkpoint (config.json speculators_config), whose method and draft vLLM "
                                f"locks. Fix: pass the verifier model as --model and your draft explicitly, or "
                                f"drop {key!r} from --speculative-config to use the checkpoint's own.")
        _refuse_or_warn(problems, "the target's speculators_config replaces your speculative config")
        return model, tokenizer, spec

    setattr(maybe_override_with_speculators, _MARK, True)
    return maybe_override_with_speculators
