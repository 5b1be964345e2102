"""One decoder layer's weights as the native forward reads them: fused where two products read the
same input (q|k|v, gate|up), so a step streams each once.

The fused tensors replace the original parameters' storage (the modules keep views into them), so
nothing is held twice and transformers' own forward stays usable on the same model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class FusedLayer:
    """One decoder layer's weights, fused where two products read the same input."""

    input_norm: torch.Tensor
    qkv: torch.Tensor  # [(heads + 2 * kv_heads) * head_dim, hidden]
    qkv_bias: torch.Tensor | None
    o: torch.Tensor  # [hidden, heads * head_dim]
    o_bias: torch.Tensor | None
    post_norm: torch.Tensor
    gate_up: torch.Tensor  # [2 * intermediate, hidden]
    down: torch.Tensor  # [hidden, intermediate]
    q_norm: torch.Tensor | None = None  # Qwen3, Gemma 3: each q head RMS-normed before RoPE [head_dim]
    k_norm: torch.Tensor | None = None
    attn_out_norm: torch.Tensor | None = None  # Gemma: the attention's output normed before the residual add
    mlp_out_norm: torch.Tensor | None = None  # Gemma: the MLP's output, likewise


def _fuse(modules: list[nn.Linear]) -> torch.Tensor:
    """Concatenate the modules' weights along the output dim and point each module at its slice."""
    fused = torch.cat([m.weight.detach() for m in modules]).contiguous()
    start = 0
    for module in modules:
        rows = module.weight.shape[0]
        module.weight = nn.Parameter(fused[start:start + rows], requires_grad=False)
        start += rows
    return fused


def _fuse_bias(modules: list[nn.Linear]) -> torch.Tensor | None:
    biases = [m.bias for m in modules]
    if all(b is None for b in biases):
        return None
    return torch.cat([b.detach() if b is not None else m.weight.new_zeros(m.weight.shape[0])
                      for m, b in zip(modules, biases)])


def _norm_weight(attn: nn.Module, name: str) -> torch.Tensor | None:
    """The weight of ``attn``'s per-head norm ``name`` (Qwen3's q_norm and k_norm), or None without one."""
    norm = getattr(attn, name, None)
    return None if norm is None else norm.weight


def gemma_norm(weight: torch.Tensor) -> torch.Tensor:
    """A Gemma RMSNorm's factor: it multiplies by 1 + weight, in float32 whatever the model's dtype, so
    the sum is taken once here (the same float32 additions Gemma's own forward makes)."""
    return (1.0 + weight.detach().float()).contiguous()


def fused_layer(layer: nn.Module, gemma: bool = False) -> FusedLayer:
    """``layer``'s weights (a Llama-family decoder layer, or with ``gemma`` a Gemma 2 or 3 one: four norms,
    each a `gemma_norm`), its q|k|v and gate|up fused in place (a Phi-3 layer's are fused already)."""
    attn, mlp = layer.self_attn, layer.mlp
    if hasattr(attn, "qkv_proj"):  # Phi-3 keeps both fused already, in the same orders
        qkv, qkv_bias, gate_up = attn.qkv_proj.weight, attn.qkv_proj.bias, mlp.gate_up_proj.weight
    else:
        projections = [attn.q_proj, attn.k_proj, attn.v_proj]
        qkv, qkv_bias = _fuse(projections), _fuse_bias(projections)
        gate_up = _fuse([mlp.gate_proj, mlp.up_proj])
    fused = FusedLayer(
        input_norm=layer.input_layernorm.weight, qkv=qkv, qkv_bias=qkv_bias,
        o=attn.o_proj.weight, o_bias=attn.o_proj.bias, post_norm=layer.post_attention_layernorm.weight,
        gate_up=gate_up, down=mlp.down_proj.weight,
        q_norm=_norm_weight(attn, "q_norm"), k_norm=_norm_weight(attn, "k_norm"))
    if gemma:
        # Gemma norms the attention's output (post_attention_layernorm), then the MLP's input
        # (pre_feedforward_layernorm, where Llama's post_attention_layernorm sits) and its output.
        fused.input_norm = gemma_norm(layer.input_layernorm.weight)
        fused.attn_out_norm = gemma_norm(layer.post_attention_layernorm.weight)
        fused.post_norm = gemma_norm(layer.pre_feedforward_layernorm.weight)
        fused.mlp_out_norm = gemma_norm(layer.post_feedforward_layernorm.weight)
        if getattr(attn, "q_norm", None) is not None:  # Gemma 3's; Gemma 2 has none
            fused.q_norm, fused.k_norm = gemma_norm(attn.q_norm.weight), gemma_norm(attn.k_norm.weight)
    return fused


def modules_of(layer: nn.Module, name: str) -> list[nn.Module]:
    """The transformers modules whose weights make up the fused matrix ``name`` of ``layer``."""
    attn, mlp = layer.self_attn, layer.mlp
    if name == "qkv":
        return [attn.qkv_proj] if hasattr(attn, "qkv_proj") else [attn.q_proj, attn.k_proj, attn.v_proj]
    if name == "gate_up":
        return [mlp.gate_up_proj] if hasattr(mlp, "gate_up_proj") else [mlp.gate_proj, mlp.up_proj]
    return [attn.o_proj] if name == "o" else [mlp.down_proj]


def release(fused: FusedLayer, layer: nn.Module, name: str) -> int:
    """Drop the float32 storage of the matrix ``name`` (qkv, o, gate_up or down) of ``fused`` and of the
    modules of ``layer`` that view it, once the float32 kernel reads it from elsewhere (a GGUF's blocks);
    returns the bytes dropped. What stays is a meta tensor of the same shape and dtype: sizes still read
    right, and anything that would compute with the weight fails at once instead of reading stale bytes."""
    weight: torch.Tensor = getattr(fused, name)
    if weight.is_meta:  # dropped already
        return 0
    setattr(fused, name, torch.empty(weight.shape, dtype=weight.dtype, device="meta"))
    for module in modules_of(layer, name):
        module.weight = meta_weight(module.weight)
    return weight.numel() * weight.element_size()


def meta_weight(weight: torch.Tensor) -> nn.Parameter:
    """A weight's stand-in once it is dropped: its shape and dtype, no storage."""
    return nn.Parameter(torch.empty(weight.shape, dtype=weight.dtype, device="meta"), requires_grad=False)
