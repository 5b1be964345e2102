"""Tiny random checkpoints for the tests (engine, proposers, training); test-only code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def build_tiny_llama(
    folder: str | Path,
    *,
    vocab_size: int = 128,
    hidden_size: int = 32,
    num_layers: int = 2,
    seed: int = 0,
    tie: bool = True,
    extra_config: dict[str, Any] | None = None,
) -> Path:
    """Write a random LlamaForCausalLM as config.json + model.safetensors (no tokenizer).

    Args:
        folder: created if missing; returned as a Path.
        vocab_size, hidden_size, num_layers: model shape; hidden_size must be a multiple of 8
            (4 heads x head_dim, 2 KV heads so grouped-query attention is exercised).
        seed: same seed, same weights.
        tie: tie the LM head to the input embedding (as SmolLM2 does).
        extra_config: extra LlamaConfig fields, e.g. `{"num_nextn_predict_layers": 1}`;
            they override the defaults above.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    fields: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": hidden_size * 2,
        "num_hidden_layers": num_layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "tie_word_embeddings": tie,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "dtype": "float32",
    }
    fields.update(extra_config or {})
    config = LlamaConfig(**fields)
    config.architectures = ["LlamaForCausalLM"]
    random_model(LlamaForCausalLM, config, seed).save_pretrained(folder)
    return folder


def random_model(model_class: Any, config: Any, seed: int = 0) -> Any:
    """``model_class(config)`` with seeded weights of std 0.2: the default init (std 0.02) gives
    near-uniform logits, where argmax ties make greedy-equality tests meaningless."""
    # Fork the RNG so building a fixture never disturbs a test's own seeded randomness.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config)
        with torch.no_grad():
            for param in model.parameters():
                if param.dim() > 1:
                    param.normal_(0.0, 0.2)
    return model


def gemma_families(shape: dict[str, Any], head_dim: int) -> dict[str, tuple[Any, Any]]:
    """The Gemma 2 and Gemma 3 cases of a test's FAMILIES (model class, config) at ``shape``: Gemma 2's
    soft-capped scores and logits, alternating windows and four norms a layer without q and k norms;
    Gemma 3's sliding and full layers, each type with its own RoPE (so one-token steps take the rows
    call), GELU, q and k norms and a scaled embedding."""
    from transformers import Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig

    return {
        "gemma2": (Gemma2ForCausalLM, Gemma2Config(**shape, head_dim=head_dim, query_pre_attn_scalar=12,
                                                   sliding_window=6, attn_logit_softcapping=3.0,
                                                   final_logit_softcapping=5.0)),
        "gemma3": (Gemma3ForCausalLM, Gemma3TextConfig(
            **shape, head_dim=head_dim, query_pre_attn_scalar=12, sliding_window=6,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})),
    }
