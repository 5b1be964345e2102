"""What `CausalLM` reads from the transformers model it wraps, around its own forward: the final norm
and the residual stream entering it (aux features on transformers' path), and its float32 weights
aligned for torch's few-row products."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


def align_weights(hf: torch.nn.Module) -> None:
    """Move every parameter whose storage is not 64-byte aligned into an aligned copy, in place.

    Weights read from safetensors may start anywhere the file put them (8-byte alignment). The
    few-row float32 product (`products.project`, ``weight @ x.T``) rounds differently depending on the
    weight's alignment, so without this the same weights in two file layouts (one file, or shards)
    would give logits a few ulps apart. A parameter shared by two modules (tied embeddings) is one
    object, so both keep sharing the copy.
    """
    for param in hf.parameters():
        if param.data_ptr() % 64:
            param.data = param.data.clone()


FINAL_NORMS = ("norm", "ln_f", "final_layer_norm", "final_layernorm", "norm_f")
"""What transformers' base models call their final norm (Llama's family, GPT-2, OPT, Phi, Mamba's)."""


def final_norm(base: torch.nn.Module) -> torch.nn.Module | None:
    """``base``'s final norm, on itself or on its decoder (OPT keeps it there); None if it has none so named."""
    for holder in (base, getattr(base, "decoder", None)):
        for name in FINAL_NORMS:
            if isinstance(found := getattr(holder, name, None), torch.nn.Module):
                return found
    return None


@contextlib.contextmanager
def final_stream(base: torch.nn.Module, layers: int, wanted: bool) -> Iterator[dict[int, torch.Tensor]]:
    """While a transformers forward runs, the residual stream entering ``base``'s final norm (aux id
    ``layers``, the last layer's output), captured by a pre-hook on the norm; {} when not wanted."""
    found: dict[int, torch.Tensor] = {}
    if not wanted:  # every transformers forward comes here: look nothing up
        yield found
        return
    norm = final_norm(base)
    if norm is None:  # `reads_last_output` said so when the head was built
        raise ValueError(f"aux layer {layers} (the last layer's output) needs the model's final norm, and "
                         f"{type(base).__name__} has none that specsure knows; use ids below {layers}.")
    handle = norm.register_forward_pre_hook(lambda _module, args: found.__setitem__(layers, args[0]))
    try:
        yield found
    finally:
        handle.remove()
