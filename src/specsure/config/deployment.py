"""vLLM's deployment keys in a speculative config: what specsure's one-process engine does not use
(draft parallelism, quantization, revisions, batching switches), carried by the exports to the
engine that does, so a vLLM config file exports whole."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, Final, Mapping

from specsure.config.export import Export
from specsure.config.errors import ConfigError
from specsure.config.schema import KEY_ALIASES, VLLM_ONLY_KEYS

SGLANG_FLAGS: Final[Mapping[str, str]] = {
    "revision": "--speculative-draft-model-revision",
    "quantization": "--speculative-draft-model-quantization",
}
"""The deployment keys SGLang has a draft flag for (srt/arg_groups/fields/spec.py, SGLang 0.5.23)."""


def split_deployment(spec: Any) -> tuple[Any, dict[str, Any]]:
    """(the config without vLLM's deployment keys, those keys); a config that is no mapping is left whole."""
    if not isinstance(spec, Mapping):
        return spec, {}
    ours = {k: v for k, v in spec.items() if KEY_ALIASES.get(k, k) not in VLLM_ONLY_KEYS}
    return ours, {k: v for k, v in spec.items() if k not in ours}


def with_deployment(out: Export, keys: Mapping[str, Any]) -> Export:
    """``out`` with the deployment ``keys``: inside vLLM's --speculative-config as given (vLLM checks
    them), as SGLang's draft flags where it has them, else left out with a warning."""
    if not keys:
        return out
    if out.engine == "vllm":
        ours = out.speculative_config or {}
        for key, value in keys.items():  # the schedule disable_by_batch_size exports, given again by hand
            if key in ours and ours[key] != value:
                raise ConfigError(f"{key} = {json.dumps(value)} disagrees with the {json.dumps(ours[key])} that "
                                  f"specsure exports for the rest of your config; give only one of them.")
        spec = {**ours, **keys}
        args = list(out.args)
        args[args.index("--speculative-config") + 1] = json.dumps(spec, separators=(", ", ": "))
        return replace(out, args=tuple(args), speculative_config=spec)
    args, warnings = list(out.args), list(out.warnings)
    drafted = "--speculative-draft-model-path" in args  # ngram drafts from no model: its flags would mean nothing
    for key, value in keys.items():
        if key in SGLANG_FLAGS and value is not None and drafted:
            args += [SGLANG_FLAGS[key], str(value)]
        elif value is not None:
            why = "has no draft model to apply it to" if key in SGLANG_FLAGS else "has no flag for it"
            warnings.append(f"{key} = {json.dumps(value)} is a vLLM deployment key, and SGLang {why} here, so it "
                            "is left out.")
    return replace(out, args=tuple(args), warnings=tuple(warnings))
