"""What transformers' GGUF reader leaves at a config class's defaults, taken from the file as llama.cpp
reads it, before the model is built.

The reader maps a fixed table of metadata keys per architecture (transformers' GGUF_CONFIG_MAPPING);
a key missing there keeps the class's default, and the model then either does not fit the file's
tensors (a refusal that blames the file) or, worse, runs fluent and different from llama.cpp: a
StarCoder2 with rope base 1e5 rotated at 1e4. Each key llama.cpp reads that the reader drops is
read here; an architecture the reader cannot read right is refused by name.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Final

from specsure.config.gguf_header import read_gguf_metadata
from specsure.models.errors import ModelLoadError

logger = logging.getLogger(__name__)

SIZES: Final[dict[str, dict[str, str]]] = {
    "gpt2": {"context_length": "n_positions"},
    "qwen2moe": {"expert_feed_forward_length": "moe_intermediate_size",
                 "expert_shared_feed_forward_length": "shared_expert_intermediate_size"},
    "qwen3moe": {"expert_feed_forward_length": "moe_intermediate_size"},
    "gemma2": {"attn_logit_softcapping": "attn_logit_softcapping",
               "final_logit_softcapping": "final_logit_softcapping"},
}
"""Per GGUF architecture: ``{arch}.KEY`` -> the config field transformers' reader leaves at its default."""


def fit_to_file(gguf: Path, config: Any) -> Any:
    """``config`` (transformers' reading of ``gguf``) with the file's own values where the reader kept a
    default: the head width (attention.key_length; Qwen3's 128 otherwise), the rope base and the share
    of a head that rotates (rope.freq_base, rope.dimension_count: StarCoder2, StableLM, Phi-3), the
    sizes in SIZES, and no padding token where the file names none (Phi-3's 32000 otherwise, past a
    smaller vocabulary). ModelLoadError for a layout the reader misreads (Falcon-40B's)."""
    metadata = read_gguf_metadata(str(gguf))
    arch = metadata.get("general.architecture")
    if arch == "falcon" and isinstance(kv := metadata.get("falcon.attention.head_count_kv"), int) and kv > 1:
        raise ModelLoadError(f"{gguf}: falcon.attention.head_count_kv = {kv}, Falcon-40B's and -180B's grouped "
                             "layout, which transformers' GGUF reader builds as Falcon-7B's (one kv head) and whose "
                             "fused query_key_value rows it does not regroup; load the model's Hugging Face folder "
                             "instead.")

    def put(field: str, value: Any, key: str) -> None:
        logger.info("%s: %s %r from %s (transformers' reader left %r)", gguf.name, field, value, key,
                    getattr(config, field, None))
        setattr(config, field, value)

    width = metadata.get(f"{arch}.attention.key_length")
    value = metadata.get(f"{arch}.attention.value_length", width)
    head_dim = getattr(config, "head_dim", None)
    if isinstance(width, int) and width == value and isinstance(head_dim, int) and head_dim != width:
        put("head_dim", width, f"{arch}.attention.key_length")
    for key, field in SIZES.get(str(arch), {}).items():
        found = metadata.get(f"{arch}.{key}")
        if isinstance(found, (int, float)) and not isinstance(found, bool) and hasattr(config, field) \
                and getattr(config, field) != found:
            put(field, found, f"{arch}.{key}")
    _fit_rope(metadata, str(arch), config, put)
    window = metadata.get("phi3.attention.sliding_window") if arch == "phi3" else None
    if isinstance(window, int) and window > 0:
        logger.warning("%s: phi3.attention.sliding_window = %d is not applied: llama.cpp runs Phi-3 files without "
                       "their window, and so does specsure, while the model's Hugging Face folder applies it, so the "
                       "two differ once a sequence is longer than the window.", gguf.name, window)
    pad, vocab = getattr(config, "pad_token_id", None), getattr(config, "vocab_size", None)
    if isinstance(pad, int) and isinstance(vocab, int) and pad >= vocab \
            and "tokenizer.ggml.padding_token_id" not in metadata:
        config.pad_token_id = None
    return config


def _fit_rope(metadata: dict[str, Any], arch: str, config: Any, put: Any) -> None:
    """rope.freq_base and rope.dimension_count into a flat rope_parameters (per-layer-type ones, Gemma 3's,
    the reader fills itself); the rotating share only where the class has one to set."""
    rope = getattr(config, "rope_parameters", None)
    if not isinstance(rope, dict) or "rope_theta" not in rope:
        return
    fitted = dict(rope)
    base = metadata.get(f"{arch}.rope.freq_base")
    if isinstance(base, (int, float)) and not isinstance(base, bool) and base > 0 and fitted["rope_theta"] != base:
        fitted["rope_theta"] = float(base)
    dims = metadata.get(f"{arch}.rope.dimension_count")
    heads = getattr(config, "num_attention_heads", None)
    head_dim = getattr(config, "head_dim", None) or (config.hidden_size // heads if heads else None)
    if "partial_rotary_factor" in fitted and isinstance(dims, int) and head_dim and 0 < dims <= head_dim \
            and abs(fitted["partial_rotary_factor"] - dims / head_dim) > 1e-9:
        fitted["partial_rotary_factor"] = dims / head_dim
    if fitted != rope:
        put("rope_parameters", fitted, f"{arch}.rope.freq_base and rope.dimension_count")


def unsupported_architecture(gguf: Path) -> str:
    """The error for a file whose architecture transformers' GGUF reader cannot build a model of."""
    from transformers import CONFIG_MAPPING
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    arch = read_gguf_metadata(str(gguf)).get("general.architecture")
    # its table lists a few sections that are no model (general, tokenizer) and names with no model class (deci)
    loaded = sorted(a for a in GGUF_SUPPORTED_ARCHITECTURES if a in CONFIG_MAPPING)
    return (f"{gguf}: general.architecture = {arch!r}, which the installed transformers' GGUF reader does not load "
            f"(it loads {', '.join(loaded)}); specsure builds its models with transformers. Load the model's "
            "Hugging Face folder (config.json + *.safetensors) instead.")
