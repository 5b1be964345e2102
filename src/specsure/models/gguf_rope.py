"""A GGUF file's rotary scaling, as the ``rope_parameters`` transformers builds the model with.

transformers' GGUF reader maps no rope-scaling key for Llama-family files (only gpt-oss's), so a
converted Llama 3.1+ model would rotate as an unscaled one and its output would differ from the
first token on. llama.cpp keeps Llama 3's scaling as a tensor, ``rope_freqs.weight``: one factor per
frequency, each frequency divided by it. Those factors follow from four numbers (factor, low and
high frequency factors, the original context), which are recovered here by matching the tensor
exactly; linear scaling comes from ``{arch}.rope.scaling.*`` (for Gemma 3's per-layer-type
parameters, on its global layers only, as llama.cpp applies it). Phi-3's LongRoPE (its 128k models,
Phi-3.5-mini and Phi-4-mini) is two tensors of per-frequency factors, ``rope_factors_short.weight``
and ``rope_factors_long.weight``, with the pretraining context and the attention factor as
``{arch}.rope.scaling.*``; they become transformers' longrope parameters. Past the pretraining
context the three engines differ: specsure turns each position by its own (the long factors from
that position on, `RotaryTable`), transformers turns a whole call by its last position (and its
generate recomputes the cache when a sequence crosses), llama.cpp by the context it was started
with. Up to that length all three give the short factors. Scaling transformers reads itself
(gpt-oss) is kept. Anything else is refused: never a silently different model.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from specsure.config.gguf_header import read_gguf_tensors
from specsure.models.errors import ModelLoadError
from specsure.models.gguf_file import type_name

FREQS_TENSOR = "rope_freqs.weight"
LONGROPE_TENSORS = ("rope_factors_short.weight", "rope_factors_long.weight")
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
    longrope = {t.name: t for t in tensors if t.name in LONGROPE_TENSORS}
    if longrope and freqs is None and not nested:
        rotated = int(head_dim * float(base.get("partial_rotary_factor", 1.0)))
        return {**base, **_longrope(gguf, longrope, rotated, metadata, arch)}
    if freqs is not None and not nested and not longrope:
        return {**base, **_llama3(gguf, freqs, float(base.get("rope_theta", 10000.0)), head_dim, metadata, arch)}
    plain = freqs is None and not longrope  # the cases below read no factor tensor
    if plain and (kind in (None, "none") or (kind == "linear" and factor in (None, 1, 1.0))):
        return None
    linear = plain and kind == "linear" and isinstance(factor, (int, float)) and factor > 0
    if linear and not nested:
        return {**base, "rope_type": "linear", "factor": float(factor)}
    full = base.get("full_attention")
    if linear and isinstance(full, Mapping):
        # llama.cpp scales only the global layers; its sliding-window layers keep a scale of 1.
        return {**base, "full_attention": {**full, "rope_type": "linear", "factor": float(factor)}}
    what = (f"{FREQS_TENSOR}, on a model with per-layer-type rotary parameters" if freqs is not None and nested else
            f"{FREQS_TENSOR} beside {', '.join(sorted(longrope))}" if freqs is not None and longrope else
            f"{', '.join(sorted(longrope))}, on a model with per-layer-type rotary parameters" if longrope else
            f"{arch}.rope.scaling.type = {kind!r}, factor {factor!r}")
    raise ModelLoadError(f"{gguf}: its rotary embedding is scaled ({what}), which specsure cannot read from a GGUF "
                         "file yet; loading it unscaled would give other output. Load the model's Hugging Face "
                         "folder, whose config.json states its rope scaling.")


def _factors(gguf: Path, entry: Any, count: int, shape: str) -> np.ndarray:
    """The ``count`` float32 values of a 1-D factor tensor; ModelLoadError naming it and ``shape`` (what it
    should be) for any other type or size."""
    if entry.kind != _F32 or list(entry.shape) != [count]:
        raise ModelLoadError(f"{gguf}: {entry.name} is {list(entry.shape)} of GGML type {type_name(entry.kind)}; "
                             f"{shape}")
    with open(gguf, "rb") as fh:
        fh.seek(entry.start)
        return np.frombuffer(fh.read(4 * count), dtype="<f4")


def _llama3(gguf: Path, entry: Any, theta: float, head_dim: int, metadata: Mapping[str, Any],
            arch: Any) -> dict[str, Any]:
    stored = _factors(gguf, entry, head_dim // 2, f"a Llama 3 rope-scaling tensor is {head_dim // 2} float32 "
                      "factors. Convert the model again.").astype(np.float64)
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


def _longrope(gguf: Path, entries: Mapping[str, Any], rotated: int, metadata: Mapping[str, Any],
              arch: Any) -> dict[str, Any]:
    """transformers' longrope parameters from llama.cpp's two factor tensors and its scaling keys."""
    fix = "Convert the model again, or load its Hugging Face folder, whose config.json states its rope scaling."
    missing = [name for name in LONGROPE_TENSORS if name not in entries]
    if missing:
        raise ModelLoadError(f"{gguf}: it holds {', '.join(entries)} but not {missing[0]}; LongRoPE needs both the "
                             f"short and the long factors. {fix}")
    factors = {}
    for name in LONGROPE_TENSORS:
        stored = _factors(gguf, entries[name], rotated // 2, f"LongRoPE factors for heads that rotate {rotated} "
                          f"dimensions are {rotated // 2} float32 values. {fix}")
        if not (np.isfinite(stored).all() and (stored > 0).all()):
            raise ModelLoadError(f"{gguf}: {name} holds a factor that is not a positive number; each divides a "
                                 f"rotary frequency. {fix}")
        factors[name] = [float(v) for v in stored]
    original = _count(gguf, metadata, f"{arch}.rope.scaling.original_context_length",
                      "the context past which the long factors apply", fix)
    context = _count(gguf, metadata, f"{arch}.context_length", "the context the long factors stretch to", fix)
    if original > context:
        raise ModelLoadError(f"{gguf}: {arch}.rope.scaling.original_context_length = {original} exceeds "
                             f"{arch}.context_length = {context}; LongRoPE stretches the first to the second. {fix}")
    out: dict[str, Any] = {"rope_type": "longrope", "short_factor": factors[LONGROPE_TENSORS[0]],
                           "long_factor": factors[LONGROPE_TENSORS[1]], "original_max_position_embeddings": original,
                           "factor": context / original}
    key = f"{arch}.rope.scaling.attn_factor"
    attention = metadata.get(key)
    if attention is not None:
        if isinstance(attention, bool) or not isinstance(attention, (int, float)) or not math.isfinite(attention) \
                or attention <= 0:
            raise ModelLoadError(f"{gguf}: {key} = {attention!r}; it scales every rotary cos and sin, so it must be a "
                                 f"positive number. {fix}")
        out["attention_factor"] = float(attention)  # llama.cpp scales cos and sin by it, as transformers does
    return out


def _count(gguf: Path, metadata: Mapping[str, Any], key: str, what: str, fix: str) -> int:
    """A positive token count the file must give, or ModelLoadError naming the key and ``what`` it is."""
    value = metadata.get(key)
    if value is None:
        raise ModelLoadError(f"{gguf}: it holds LongRoPE factors but no {key}, {what}. {fix}")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ModelLoadError(f"{gguf}: {key} = {value!r}, {what}; it must be a positive token count. {fix}")
    return value


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
