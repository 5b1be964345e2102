"""Stand-ins for the parts of vLLM 0.33.0 that the specsure plugin wraps, written from vLLM's code.

`EngineArgs.create_speculative_config` merges the --spec-* flags into the dict (refusing a key
given both ways) and builds a `SpeculativeConfig`, whose `__post_init__` fills the method and
detects it from the draft path and model_type. Only the rules that decide method and draft are
here, spelled out independently of specsure's own prediction tables.
"""

from __future__ import annotations

import json
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MTP_ALIASES = {"deepseek_mtp", "qwen3_next_mtp", "mimo_mtp", "glm4_moe_mtp", "ernie_mtp"}
MTP_REWRITES = {"deepseek_v3": "deepseek_mtp", "qwen3_next": "qwen3_next_mtp"}


@dataclass
class ModelConfig:
    model: str
    model_weights: str = ""
    quantization: str | None = None

    @property
    def hf_config(self) -> types.SimpleNamespace:
        path = Path(self.model) / "config.json"
        config = json.loads(path.read_text()) if path.is_file() else {}  # a hub id: nothing local
        return types.SimpleNamespace(model_type=config.get("model_type"), architectures=config.get("architectures"))


@dataclass
class SpeculativeConfig:
    method: str | None = None
    model: str | None = None
    num_speculative_tokens: int | None = None
    quantization: str | None = None
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    suffix_decoding_max_tree_depth: int = 24
    suffix_decoding_max_cached_requests: int = 10000
    suffix_decoding_max_spec_factor: float = 1.0
    suffix_decoding_min_token_prob: float = 0.1
    target_model_config: ModelConfig | None = None
    target_parallel_config: Any = None
    draft_model_config: Any = field(default=None)
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.method is None:
            self.method = "ngram" if self.model in ("ngram", "[ngram]") else "draft_model"
        if self.method == "[ngram]":
            self.method = "ngram"
        if self.method in MTP_ALIASES:
            self.method = "mtp"
        if self.model is None and self.num_speculative_tokens is not None:
            if self.method == "mtp":
                self.model = self.target_model_config.model_weights or self.target_model_config.model
                if not self.quantization:  # aligned with the target's only here
                    self.quantization = self.target_model_config.quantization
            elif self.method in ("ngram", "suffix"):
                self.model = self.method
        if self.method == "ngram":
            if self.prompt_lookup_min is None and self.prompt_lookup_max is None:
                self.prompt_lookup_min = self.prompt_lookup_max = 5
            self.prompt_lookup_min = self.prompt_lookup_min or self.prompt_lookup_max
            self.prompt_lookup_max = self.prompt_lookup_max or self.prompt_lookup_min
            self.draft_model_config = self.target_model_config
            return
        if self.method == "suffix":
            if self.num_speculative_tokens is None:  # _validate_suffix_decoding
                self.num_speculative_tokens = self.suffix_decoding_max_tree_depth
            return  # no draft checkpoint
        self.prompt_lookup_min = self.prompt_lookup_max = 0
        self.draft_model_config = ModelConfig(self.model)
        draft_type = self.draft_model_config.hf_config.model_type
        lowered = self.draft_model_config.model.lower()
        if self.method in ("eagle", "eagle3", "dflash", "dspark"):
            pass
        elif "eagle-" in lowered:
            self.method = "eagle"
        elif "eagle3" in lowered:
            self.method = "eagle3"
        elif MTP_REWRITES.get(draft_type, draft_type) in MTP_ALIASES:
            self.method = "mtp"


class EngineArgs:
    """Only the speculative-config part of vLLM's EngineArgs."""

    def __init__(self, model: str, speculative_config: dict[str, Any] | None = None, spec_method: str | None = None,
                 spec_model: str | None = None, spec_tokens: int | None = None) -> None:
        self.model = model
        self.speculative_config = speculative_config
        self.spec_method, self.spec_model, self.spec_tokens = spec_method, spec_model, spec_tokens

    def create_speculative_config(self, target_model_config: ModelConfig,
                                  target_parallel_config: Any) -> SpeculativeConfig | None:
        for flag, key, value in (("--spec-method", "method", self.spec_method),
                                 ("--spec-model", "model", self.spec_model),
                                 ("--spec-tokens", "num_speculative_tokens", self.spec_tokens)):
            if value is None:
                continue
            if self.speculative_config is None:
                self.speculative_config = {}
            if key in self.speculative_config:
                raise ValueError(f"{flag} and --speculative-config['{key}'] are mutually exclusive")
            self.speculative_config[key] = value
        if self.speculative_config is None:
            return None
        known = {"method", "model", "num_speculative_tokens", "quantization", "prompt_lookup_min", "prompt_lookup_max",
                 "suffix_decoding_max_tree_depth", "suffix_decoding_max_cached_requests",
                 "suffix_decoding_max_spec_factor", "suffix_decoding_min_token_prob"}
        spec = {k.replace("-", "_"): v for k, v in self.speculative_config.items()}
        return SpeculativeConfig(**{k: v for k, v in spec.items() if k in known},
                                 extra={k: v for k, v in spec.items() if k not in known},
                                 target_model_config=target_model_config,
                                 target_parallel_config=target_parallel_config)


def arg_utils(speculators: dict[str, Any] | None = None) -> types.SimpleNamespace:
    """A module-like namespace holding EngineArgs and `maybe_override_with_speculators`.

    ``speculators``: the speculative config a speculators-format target locks (None: not one).
    """
    def maybe_override_with_speculators(model: str, tokenizer: str | None, trust_remote_code: bool,
                                        revision: str | None = None, vllm_speculative_config: Any = None,
                                        **kwargs: Any) -> tuple[str, str | None, Any]:
        if speculators is None:
            return model, tokenizer, vllm_speculative_config
        spec = dict(speculators)
        if isinstance(vllm_speculative_config, dict):
            spec.update(vllm_speculative_config)
        spec["method"], spec["model"] = speculators["method"], model
        return "verifier", tokenizer, spec

    namespace = types.SimpleNamespace(maybe_override_with_speculators=maybe_override_with_speculators)
    # A fresh class per call, so each test's install wraps its own copy.
    namespace.EngineArgs = type("EngineArgs", (EngineArgs,), {})
    return namespace
