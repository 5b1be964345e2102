"""After vLLM resolves: does it run the method and draft that were asked? Fail closed if not.

vLLM rewrites some configs in ways no explicit key prevents (a DeepSeek-V3 draft's model_type
becomes ``deepseek_mtp``, which makes any method ``mtp``). The guard reads vLLM's resolved
SpeculativeConfig, compares it with specsure's resolution (or, when specsure could not resolve
the config, with the user's explicit method and draft), and names every difference.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from specsure.config.schema import MTP_METHOD_ALIASES, SUFFIX_FIELDS
from specsure.config.vllm_overrides import vllm_path_trap
from specsure.vllm_check.compare import NO_DRAFT, compare
from specsure.vllm_plugin.plan import Plan


def resolved(spec: Any, target_model_type: str | None = None) -> dict[str, Any]:
    """vLLM's SpeculativeConfig as the plain dict that ``vllm_check.compare`` reads."""
    draft = getattr(spec, "draft_model_config", None)
    hf = getattr(draft, "hf_config", None)
    inner = getattr(hf, "model", None)  # vLLM's EAGLEConfig wraps the checkpoint's own config
    return {"method": spec.method, "model": spec.model,
            "num_speculative_tokens": spec.num_speculative_tokens,
            "prompt_lookup_min": spec.prompt_lookup_min, "prompt_lookup_max": spec.prompt_lookup_max,
            **{key: getattr(spec, key, None) for key in SUFFIX_FIELDS},
            "draft_model_type": getattr(inner, "model_type", None) or getattr(hf, "model_type", None),
            "draft_architectures": list(getattr(hf, "architectures", None) or []),
            "target_model_type": target_model_type}


GUARDED: tuple[str, ...] = ("method", "model")
"""Fields checked whatever set them: running another method or draft is never vLLM's to decide silently."""


def mismatches(plan: Plan, vllm: Mapping[str, Any], version: str) -> list[str]:
    """One sentence per field where vLLM runs something else than was asked; empty when it agrees."""
    res = plan.resolution
    if res is not None and res.config is not None:
        check = compare(res, vllm, exported=plan.handed or plan.user or {}, vllm_version=version)
        out = []
        for m in check.mismatches:
            source = res.decisions[m.field].source
            if plan.handed is None and source != "user" and m.field not in GUARDED:
                continue  # handed unchanged: vLLM fills the unset fields with its own defaults, as asked
            asked = res.decisions[m.field].value if source == "user" else m.specsure
            out.append(_sentence(m.field, asked, source, m.vllm, m.cause, m.fix, version))
        return out
    return _explicit_mismatches(plan.user or {}, vllm, version)


def _explicit_mismatches(user: Mapping[str, Any], vllm: Mapping[str, Any], version: str) -> list[str]:
    """Guard mode without a resolution: the user's explicit method and draft must survive."""
    user = legacy_ngram(user)  # vLLM's older ngram spellings: ngram on both sides
    out = []
    method = user.get("method")
    model = user.get("model", user.get("draft_model"))
    if isinstance(method, str):
        asked = "mtp" if method in MTP_METHOD_ALIASES else method
        if vllm.get("method") != asked:
            trap = vllm_path_trap(model) if isinstance(model, str) else None
            cause = "vLLM's own detection replaced an explicit method" + (
                f" (the draft path {model!r} contains {trap[0]!r}, which vLLM's path test matches)" if trap else "")
            out.append(_sentence("method", method, "user", vllm.get("method"), cause,
                                 "check the checkpoint's folder name and model_type against what the method "
                                 "needs (specsure check-vllm shows the cause)", version))
    theirs = vllm.get("model")
    if isinstance(model, str) and theirs not in NO_DRAFT and not _same_path(model, theirs):
        out.append(_sentence("model", model, "user", theirs, "vLLM replaced an explicit draft",
                             "pass the draft explicitly and check the target for a speculators_config", version))
    return out


def _same_path(ours: str, theirs: Any) -> bool:
    return isinstance(theirs, str) and (ours == theirs or os.path.realpath(ours) == os.path.realpath(theirs))


def _sentence(name: str, asked: Any, source: str, vllm: Any, cause: str, fix: str, version: str) -> str:
    who = "you asked for" if source == "user" else f"specsure resolved ({source})"
    return f"{name}: {who} {asked!r}, but vLLM {version} would run {vllm!r}. Signal: {cause}. Fix: {fix}."


def legacy_ngram(ours: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM's older spellings of ngram, as vLLM 0.33 still reads them: ``"model": "ngram"`` (or
    ``"[ngram]"``) with no method or method ngram, and method ``"[ngram]"``, become method 'ngram'
    without a draft. For the guard, which compares the user's raw config with vLLM's when specsure
    could not resolve it; a resolution reads these spellings itself (``config.schema``)."""
    out = dict(ours)
    if out.get("method") == "[ngram]":
        out["method"] = "ngram"
    model = out.get("model", out.get("draft_model"))
    if model in ("ngram", "[ngram]") and out.get("method") in (None, "ngram"):
        out.pop("model", None)
        out.pop("draft_model", None)
        out["method"] = "ngram"
    return out
