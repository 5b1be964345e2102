"""A GGUF file's rotary scaling, as the ``rope_parameters`` transformers builds the model with.

transformers' GGUF reader maps no rope-scaling key for Llama-family files (only gpt-oss's), so a
converted Llama 3.1+ model would rotate as an unscaled one and its output would differ from the
first token on. llama.cpp keeps Llama 3's scaling as a tensor, ``rope_freqs.weight``: one factor per
frequency, each frequency divided by it. Those factors follow from four numbers (factor, low and
high frequency factors, the original context), which are recovered here by matching the tensor
exactly; linear scaling comes from ``{arch}.rope.scaling.*`` (for Gemma 3's per-layer-type
parameters, on its global layers only, as llama.cpp applies it). Scaling transformers reads itself
(gpt-oss) is kept. Anything else is refused: never a silently different model.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from specsure.config.gguf_header import read_gguf_tensors
from specsure.models.errors import ModelLoadError

FREQS_TENSOR = "rope_freqs.weight"
_F32 = 0
# (low_freq_factor, high_freq_factor, original context): Meta's values for Llama 3.1, 3.2 and 3.3.
_LLAMA3_SHAPES = ((1.0, 4.0, 8192),)


def gguf_rope_parameters(gguf: Path, base: Mapping[str, Any], head_dim: int) -> dict[str, Any] | None:
    """``base`` (the config's rope_parameters, rope_theta in it) with the file's scaling, or None
    when the file declares none. ModelLoadError for scaling specsure cannot express exactly."""
    if base.get("rope_type", "default") != "default":
        return None  # transformers read this architecture's scaling itself (gpt-oss's yarn)
    metadata, tensors = read_gguf_tensors(str(gguf))
    arch = metadata.get("general.architecture")
    kind = metadata.get(f"{arch}.rope.scaling.type")
    factor = metadata.get(f"{arch}.rope.scaling.factor")
    freqs = next((t for t in tensors if t.name == FREQS_TENSOR), None)
    # transformers keeps per-layer-type parameters (Gemma 3: sliding and full attention) nested.
    nested = any(isinstance(value, Mapping) for value in base.values())
    if freqs is not None and not nested:
        return {**base, **_llama3(gguf, freqs, float(base.get("rope_theta", 10000.0)), head_dim, metadata, arch)}
    if freqs is None and (kind in (None, "none") or (kind == "linear" and factor in (None, 1, 1.0))):
        return None
    linear = freqs is None and kind == "linear" and isinstance(factor, (int, float)) and factor > 0
    if linear and not nested:
        return {**base, "rope_type": "linear", "factor": float(factor)}
    full = base.get("full_attention")
    if linear and isinstance(full, Mapping):
        # llama.cpp scales only the global layers; its sliding-window layers keep a scale of 1.
        return {**base, "full_attention": {**full, "rope_type": "linear", "factor": float(factor)}}
    what = (f"{FREQS_TENSOR}, on a model with per-layer-type rotary parameters" if freqs is not None else
            f"{arch}.rope.scaling.type = {kind!r}, factor {factor!r}")
    raise ModelLoadError(f"{gguf}: its rotary embedding is scaled ({what}), which specsure cannot read from a GGUF "
                         "file yet; loading it unscaled would give other output. Load the model's Hugging Face "
                         "folder, whose config.json states its rope scaling.")


def _llama3(gguf: Path, entry: Any, theta: float, head_dim: int, metadata: Mapping[str, Any],
            arch: Any) -> dict[str, Any]:
    count = entry.shape[0] if len(entry.shape) == 1 else None
    if entry.kind != _F32 or count != head_dim // 2:
        raise ModelLoadError(f"{gguf}: {FREQS_TENSOR} is {list(entry.shape)} of GGML type {entry.kind}; a Llama 3 "
                             f"rope-scaling tensor is {head_dim // 2} float32 factors. Convert the model again.")
    with open(gguf, "rb") as fh:
        fh.seek(entry.start)
        stored = np.frombuffer(fh.read(4 * count), dtype="<f4").astype(np.float64)
    factor = round(float(stored.max()), 5)  # a float32 of the factor (8, 16, 32 in Meta's configs)
    given = metadata.get(f"{arch}.rope.scaling.original_context_length")
    shapes = [(low, high, given) for low, high, _ in _LLAMA3_SHAPES] if isinstance(given, int) else _LLAMA3_SHAPES
    for low, high, original in shapes:
        if np.allclose(stored, _llama3_factors(theta, head_dim, factor, low, high, original), rtol=1e-5, atol=0):
            return {"rope_type": "llama3", "factor": factor, "low_freq_factor": low, "high_freq_factor": high,
                    "original_max_position_embeddings": original}
    raise ModelLoadError(f"{gguf}: {FREQS_TENSOR} scales the rotary frequencies in a way that matches no Llama 3 "
                         f"scaling (factor {factor:g}, low/high frequency factors 1 and 4, original context 8192) "
                         "that specsure can express; loading it unscaled would give other output. Load the model's "
                         "Hugging Face folder, whose config.json states its rope scaling.")


def _llama3_factors(theta: float, head_dim: int, factor: float, low: float, high: float,
                    original: int) -> np.ndarray:
    """What llama.cpp's converter stores for these Llama 3 parameters: each frequency's divisor."""
    out = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * theta ** (i / head_dim)
        if wavelen < original / high:
            out.append(1.0)
        elif wavelen > original / low:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out)
