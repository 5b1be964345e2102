"""Which decoder families the native forward runs (models/native.py), and what a text config says of
its decoder: per-layer windows, the dims RoPE turns, the longest sequence it runs.

A family is a transformers text-config model_type whose decoder layer the native forward
reproduces op for op; `unsupported` names, in one sentence, what keeps a config on transformers'
own modules.
"""

from __future__ import annotations

from typing import Any

from transformers.configuration_utils import ALLOWED_LAYER_TYPES

FAMILIES = ("llama", "mistral", "phi3", "qwen2", "qwen3", "gemma2", "gemma3_text")
"""Text-config model_types whose decoder layers the native forward runs."""
GEMMA_TYPES = ("gemma2", "gemma3_text")
"""Of them, Gemma's: four norms a layer, each multiplying by 1 + w, and a GELU-gated MLP."""


def unsupported(config: object) -> str | None:
    """Why the native forward cannot run a model with this text config, or None when it can."""
    model_type = getattr(config, "model_type", None)
    if model_type not in FAMILIES:
        return f"model_type {model_type!r} is not one of {', '.join(FAMILIES)}"
    if model_type in GEMMA_TYPES:
        if getattr(config, "hidden_activation", None) != "gelu_pytorch_tanh":
            return f"hidden_activation {getattr(config, 'hidden_activation', None)!r} is not gelu_pytorch_tanh"
        if getattr(config, "use_bidirectional_attention", False):
            return "the attention is bidirectional"
    elif getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act {config.hidden_act!r} is not silu"
    if getattr(config, "mlp_bias", False):
        return "the MLP has biases"
    if getattr(config, "pretraining_tp", 1) not in (None, 1):
        return "pretraining_tp splits the projections"
    layer_types = getattr(config, "layer_types", None) or ()
    if any(t not in ("full_attention", "sliding_attention") for t in layer_types):
        return f"layer types {sorted(set(layer_types))} are not full and sliding attention"
    return None


def layer_windows(config: object, layers: int) -> list[int]:
    """Each layer's sliding window (0: none), as transformers applies it: the layers whose layer type is
    sliding_attention, or every Mistral and Phi-3 layer where the config sets a window."""
    window = int(getattr(config, "sliding_window", None) or 0)
    types = getattr(config, "layer_types", None) or ["full_attention"] * layers
    if getattr(config, "model_type", None) in ("mistral", "phi3"):
        return [window] * layers
    return [window if t == "sliding_attention" else 0 for t in types]


def head_dim(config: object) -> int:
    """The width of one attention head: the config's own, else hidden size over heads."""
    return int(getattr(config, "head_dim", None) or config.hidden_size // int(config.num_attention_heads))


def rotary_dim(config: object, head_dim: int) -> int:
    """The dims of each head that RoPE turns, its first ones: all but where the rope parameters (or the
    config) give a partial_rotary_factor, as Phi-4-mini's 0.75; as transformers' rotary modules count."""
    rope = getattr(config, "rope_parameters", None)
    factor = rope.get("partial_rotary_factor") if isinstance(rope, dict) else None
    if factor is None:
        factor = getattr(config, "partial_rotary_factor", None)
    return int(head_dim * float(factor)) if factor else head_dim


LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
               "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")
"""The config keys vLLM 0.33.0 reads a model's length from, taking the smallest it finds."""
UNSCALED_CONTEXT_ROPES = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")
"""RoPE types whose max_position_embeddings already counts the stretched context (vLLM 0.33.0's list)."""


def context_length(config: object) -> int:
    """The longest sequence the model runs, the largest max_model_len vLLM 0.33.0 accepts for it: the
    smallest of the config's length keys (max_position_embeddings and the others vLLM reads; a
    model_max_length replaces them), times the RoPE's factor where the RoPE stretches the trained
    context past it (linear, dynamic NTK); YaRN, llama3 and longrope configs count the stretched
    context already, and so does Gemma 3's, whatever its RoPE. 0: no length key (no limit)."""
    lengths = [getattr(config, key, None) for key in LENGTH_KEYS]
    length = min((int(v) for v in lengths if _positive(v)), default=0)
    if _positive(override := getattr(config, "model_max_length", None)):
        length = int(override)
    rope = getattr(config, "rope_parameters", None)
    if not isinstance(rope, dict) or not rope or "gemma3" in str(getattr(config, "model_type", "")):
        return length
    # Per layer type (Gemma 3's {"full_attention": {...}, "sliding_attention": {...}}, known by its keys),
    # or one for all; like vLLM, the last factor found counts.
    nested = set(rope) <= {*ALLOWED_LAYER_TYPES, "main", "compress"}
    factor: object = 1.0
    for params in ([p for p in rope.values() if isinstance(p, dict) and p] if nested else [rope]):
        rope_type = str(params.get("rope_type") or params.get("type") or "default")
        if rope_type not in UNSCALED_CONTEXT_ROPES:
            factor = params.get("factor", factor)
    return int(length * factor) if _positive(factor) else length


def _positive(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def decoder_base(hf: Any) -> tuple[Any, str]:
    """(base, why): the base model of ``hf`` the native decoder runs, or None and the reason it cannot."""
    config = hf.config.get_text_config(decoder=True)
    why = unsupported(config)
    # A vision-language checkpoint (Gemma 3 4B and up: Gemma3ForConditionalGeneration) keeps its text
    # decoder as language_model; text-only requests run just that.
    base = getattr(hf.base_model, "language_model", None) or hf.base_model
    if why is None and not all(hasattr(base, a) for a in ("embed_tokens", "rotary_emb", "norm", "layers")):
        why = f"{type(base).__name__} does not have the Llama base-model layout"
    return (None, why) if why is not None else (base, "")
