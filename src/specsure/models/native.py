"""A native forward for Llama-family decoders: the same weights, the same arithmetic, fewer modules.

A decode step of a 135M model spends most of its time outside the matrix products: ~30 layers
of small transformers modules, each with its own Python call, hooks and tensor reshuffles. Here
a layer is a dozen tensor ops on fused weights (one q|k|v product, one gate|up product), with
the KV cache written through the same RollbackCache the transformers path uses (the weights:
models/fused_layer.py).

In bfloat16, forwards over at most KERNEL_ROWS rows leave torch for the C kernel (kernel.py,
decode_kernel.c) once a sequence's cache exists: a one-token step is one call, a few-row forward
a handful of calls per layer, all on these same fused weights and cache buffers.

Covered: the Llama, Mistral, Phi-3, Qwen2, Qwen3, Gemma 2 and Gemma 3 (text) classes, SiLU-gated MLPs
(Gemma's GELU-gated ones), optional q/k/v/o biases, Phi-3's own fused q|k|v and gate|up, Qwen3's and
Gemma 3's RMSNorm of each q and k head before RoPE, sliding-window layers (masked; the cache keeps
every position), Gemma's norms of the attention's and the MLP's outputs, its scaled embedding and its
scores' factor, Gemma 2's soft-capped scores, Gemma 3's two RoPEs (one per layer type), any RoPE
variant (the model's own rotary module computes cos/sin), on whole heads or on their first dims
(Phi-4-mini's partial rotary). Both C kernels, float32 and bf16, run all of it. Anything else runs on
the transformers path;
`NativeDecoder.build` says why in one sentence.
"""

from __future__ import annotations

import ctypes
from collections import Counter

import torch
import torch.nn.functional as F
from torch import nn

from specsure.models import float_kernel as float_kernels
from specsure.models import kernel as kernels
from specsure.models.decoder_family import GEMMA_TYPES, decoder_base, head_dim, layer_windows, rotary_dim
from specsure.models.fused_layer import FusedLayer, fused_layer, gemma_norm
from specsure.models.gguf_blocks import FileBlocks
from specsure.models.kv_cache import GrowableLayer, RollbackCache
from specsure.models.products import KERNEL_ROWS, project
from specsure.models.rotary_table import RotaryTable
from specsure.models.row_pieces import PIECE_ROWS, run_in_pieces
from specsure.models.segment import Segment, positions, window_mask
from specsure.models.served_blocks import ServedBlocks
from specsure.models.token_tree import TokenTree


def _ready(cache: RollbackCache, layers: int) -> bool:
    """Whether every layer of ``cache`` has buffers a kernel can write into (after its first forward)."""
    return len(cache.layers) == layers and all(layer.is_initialized for layer in cache.layers)


class NativeDecoder:
    """The decoder layers of a Llama-family model, run as plain tensor ops on fused weights."""

    def __init__(self, base: nn.Module, config: object) -> None:
        """Fuse ``base``'s weights (a LlamaModel-like base model) in place. Call `build` instead."""
        self.heads: int = int(config.num_attention_heads)
        self.kv_heads: int = int(getattr(config, "num_key_value_heads", None) or self.heads)
        self.head_dim: int = head_dim(config)
        self.rotary_dim: int = rotary_dim(config, self.head_dim)
        self.intermediate: int = int(config.intermediate_size)
        self.eps: float = float(config.rms_norm_eps)
        self.embed = base.embed_tokens
        self.gemma = getattr(config, "model_type", None) in GEMMA_TYPES  # its embedding module scales itself
        self.score_scale: float | None = float(config.query_pre_attn_scalar) ** -0.5 if self.gemma else None
        # Gemma 2 caps each score at +-softcap smoothly (softcap tanh(score / softcap)) before the softmax.
        self.softcap: float | None = getattr(config, "attn_logit_softcapping", None) or None
        self.windows: list[int] = layer_windows(config, len(base.layers))
        # One RoPE table per layer type where the module keeps several (Gemma 3: local and global bases),
        # else one for every layer (Gemma 2 and windowed Qwen have layer types but one RoPE).
        types = getattr(config, "layer_types", None) or ["full_attention"] * len(base.layers)
        if isinstance(getattr(base.rotary_emb, "rope_type", None), dict):
            tables = {t: RotaryTable(base.rotary_emb, t) for t in sorted(set(types))}
        else:
            tables = dict.fromkeys(set(types), RotaryTable(base.rotary_emb, None))
        self.rotary = tables["full_attention"] if "full_attention" in tables else next(iter(tables.values()))
        self.layer_rotary: list[RotaryTable] = [tables[t] for t in types]
        # the bf16 one-token call takes one cos and sin for every layer
        self._one_rotary = len({id(t) for t in tables.values()}) == 1
        self.norm = gemma_norm(base.norm.weight) if self.gemma else base.norm.weight
        self.layers: list[FusedLayer] = [fused_layer(layer, self.gemma) for layer in base.layers]
        self._modules: list[nn.Module] = list(base.layers)  # whose weights `release_weights` drops
        self.kernel: kernels.Kernel | None = None
        """The C kernel that runs bf16 forwards of up to KERNEL_ROWS rows, or None (`kernel_why` says
        why). Its layer structs and scratch buffer belong to this decoder, so forwards on one model
        must not run concurrently (the scheduler runs one at a time)."""
        self.kernel_why = "the model is not bfloat16"
        if self.embed.weight.dtype == torch.bfloat16:
            self.kernel, self.kernel_why = kernels.load()
        if self.kernel is not None and self.head_dim > kernels.MAX_HEAD_DIM:
            self.kernel, self.kernel_why = None, f"head_dim {self.head_dim} exceeds the kernel's {kernels.MAX_HEAD_DIM}"
        if self.kernel is not None:
            self._bind_kernel(config)
        self.float_kernel: float_kernels.FloatKernel | None = None
        """The C kernel that runs every float32 forward, or None (`kernel_why`)."""
        self._served = ServedBlocks(len(self.layers))  # the blocks `use_blocks` gave the kernel
        if self.embed.weight.dtype == torch.float32:
            self.float_kernel, self.kernel_why = float_kernels.load_for(config)
        if self.float_kernel is not None:
            self._bind_float(config)

    def _bind_kernel(self, config: object) -> None:
        """The kernel's view of the weights: pointers into the tensors this decoder keeps alive."""
        self._shape = self._shape_struct(config)
        self._structs = self._weight_structs(kernels.LayerStruct)
        for struct, window in zip(self._structs, self.windows):
            struct.window, struct.gemma = window, int(self.gemma)
        self._scratch = kernels.Kernel.rows_scratch(self._shape, 1)

    def _bind_float(self, config: object) -> None:
        """The float32 kernel's view of the weights: pointers into the tensors this decoder keeps alive."""
        self._shape = self._shape_struct(config)
        self._float_structs = self._weight_structs(float_kernels.FloatLayerStruct)
        for struct, window in zip(self._float_structs, self.windows):
            struct.window, struct.gelu = window, int(self.gemma)

    def use_blocks(self, blocks: FileBlocks, int8_activations: bool = False) -> dict[str, int]:
        """Have the float32 kernel read ``blocks``' matrices instead of the float32 weights where they
        dequantise to exactly those weights (gguf_blocks.py), with int8 activations where asked and
        possible (`ServedBlocks.serve`); returns how many matrices of each format it reads. The float32
        weights stay (for transformers' own modules and training) unless `release_weights` drops them."""
        self._served = ServedBlocks(len(self.layers))
        used = {} if self.float_kernel is None or len(blocks.layers) != len(self.layers) else \
            self._served.serve(self._float_structs, self.layers, blocks, self.float_kernel, int8_activations)
        self._served.check(self.layers)
        return used

    def release_weights(self) -> int:
        """Drop the float32 copies of the matrices the kernel reads as blocks (`fused_layer.release`);
        returns the bytes dropped. After it, this model's transformers modules cannot run its layers."""
        return self._served.release(self.layers, self._modules)

    @property
    def tiled_matrices(self) -> int:
        """How many weight matrices `use_blocks` packed for AMX tiles (`FloatKernel.amx_pack`)."""
        return self._served.tiled

    @property
    def int8_packings(self) -> Counter[str]:
        """Of the matrices `use_blocks` gave the kernel, those the integer products read, by packing."""
        return self._served.int8_packings

    def _shape_struct(self, config: object) -> kernels.ShapeStruct:
        return kernels.ShapeStruct(int(config.hidden_size), self.heads, self.kv_heads, self.head_dim,
                                   self.intermediate, self.eps, self.score_scale or 0.0, self.softcap or 0.0,
                                   self.rotary_dim if self.rotary_dim != self.head_dim else 0)

    def _weight_structs(self, struct_type: type[ctypes.Structure]) -> ctypes.Array:
        """One ``struct_type`` per layer, its weight fields pointing at this decoder's tensors."""
        structs = (struct_type * len(self.layers))()
        fields = dict(struct_type._fields_)
        for struct, layer in zip(structs, self.layers):
            for name in ("input_norm", "qkv", "qkv_bias", "o", "o_bias", "post_norm", "gate_up", "down", "q_norm",
                         "k_norm", "attn_out_norm", "mlp_out_norm"):
                if name not in fields:
                    continue
                tensor = getattr(layer, name)
                if tensor is not None and not tensor.is_contiguous():
                    raise AssertionError(f"{name} must be contiguous for the C kernel")
                setattr(struct, name, None if tensor is None else tensor.data_ptr())
        return structs

    @classmethod
    def build(cls, hf: nn.Module) -> tuple["NativeDecoder | None", str]:
        """(decoder, why): the native decoder for ``hf``, or None and the reason it runs on transformers."""
        base, why = decoder_base(hf)
        if base is None:
            return None, why
        decoder = cls(base, hf.config.get_text_config(decoder=True))
        if decoder.kernel or decoder.float_kernel:
            rows = f"bf16 forwards of up to {KERNEL_ROWS} rows" if decoder.kernel else "float32 forwards"
            step = f"{rows} in C ({decoder.kernel_why})"
        else:
            step = f"few-row steps on torch ops: {decoder.kernel_why}"
        return decoder, f"fused q|k|v and gate|up projections; {step}"

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # The same order of operations as LlamaRMSNorm (Gemma's: the float32 product, then the
        # dtype), so both paths round alike.
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.gemma:
            return (x * weight).to(dtype)
        return weight * x.to(dtype)

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                mask: torch.Tensor | None) -> torch.Tensor:
        """Attention [1, heads, n, dim]: torch's fused kernel, or with soft-capped scores (which it does not
        take) the ops Gemma 2's eager attention runs."""
        if self.softcap is None:
            return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True,
                                                  scale=self.score_scale)
        group = self.heads // self.kv_heads
        keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
        scores = torch.matmul(q, keys.transpose(2, 3)) * (self.score_scale or self.head_dim ** -0.5)
        scores = torch.tanh(scores / self.softcap) * self.softcap
        if mask is not None:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(weights, values)

    def _rope_tables(self, x: torch.Tensor, positions: torch.Tensor
                     ) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """cos and sin [1, T, dim] for ``positions``, keyed by the id of each layer's RotaryTable."""
        return {id(table): table(x, positions) for table in {id(t): t for t in self.layer_rotary}.values()}

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        turned = cos.shape[-1]
        if turned < x.shape[-1]:  # a partial rotary (Phi-4-mini's): the head's last dims pass as they are
            return torch.cat((NativeDecoder._rotate(x[..., :turned], cos, sin), x[..., turned:]), dim=-1)
        half = turned // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    def forward(self, ids: torch.Tensor, start: int, cache: RollbackCache, aux_layers: tuple[int, ...] = (),
                tree: TokenTree | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Run ``ids`` ([n]) at positions ``start ..``, appending to ``cache``.

        With ``tree``, the n tokens are a token tree: each sits at ``start + depth`` and attends to
        the cache and its own ancestors only. Returns the post-norm last hidden state [n, hidden]
        and, for each of ``aux_layers``, the residual stream entering that layer [n, hidden]
        (transformers' ``hidden_states[i]``).
        """
        return self.forward_segments(ids, [Segment(start, ids.shape[0], cache, tree)], aux_layers)

    def forward_segments(self, ids: torch.Tensor, segments: list[Segment],
                         aux_layers: tuple[int, ...] = ()) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Run several sequences' new tokens in one pass: ``ids`` ([T]) is their concatenation.

        Every product over the weights runs once over all T rows (the weights are read once per
        step, whatever the batch); only attention runs per segment, against that segment's own
        cache, positions and mask. Returns what ``forward`` returns, for all T rows in order.
        """
        total = ids.shape[0]
        if sum(s.length for s in segments) != total:
            raise ValueError(f"segments cover {sum(s.length for s in segments)} tokens but {total} were given.")
        kernel = self.kernel or self.float_kernel  # at most one is loaded: the model's dtype picks it
        # In float32 every forward runs in C, however many rows (in pieces past PIECE_ROWS): torch's
        # products would give a long prefill, or a step that batches a prompt's chunk beside other
        # requests' rows, another rounding, so a request's output would depend on what shared its
        # steps; and on the AVX-512 EPYC the kernel's prefill is the faster one too (BENCHMARKS.md).
        # In bf16 a forward past KERNEL_ROWS stays on torch: kept so, since the shipped heads' data
        # was generated on that path and `make heads` reproduces it bit for bit.
        if kernel is not None and (total <= KERNEL_ROWS or kernel is self.float_kernel):
            for segment in segments:
                self._allocate(segment.cache, kernel.dtype)
            if total == 1 and kernel is self.kernel and self._one_rotary:
                return self._kernel_step(ids, segments[0], aux_layers)
            return self._c_rows(kernel, ids, segments, aux_layers) if total <= PIECE_ROWS else \
                run_in_pieces(lambda part_ids, part: self._c_rows(kernel, part_ids, part, aux_layers), ids, segments,
                              PIECE_ROWS)
        heads, kv_heads, dim = self.heads, self.kv_heads, self.head_dim
        x = self.embed(ids)  # [T, hidden]
        tables = self._rope_tables(x.unsqueeze(0), positions(segments))  # [1, T, dim] each
        # One new token attends to everything cached; several need the causal triangle (or the
        # tree's ancestor relation) offset by start; a sliding window cuts what lies before it.
        by_window = {window: [window_mask(s, window) for s in segments] for window in set(self.windows)}
        bounds, end = [], 0
        for s in segments:
            bounds.append((end, end + s.length))
            end += s.length
        entering: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.layers):
            if i in aux_layers:
                entering[i] = x
            cos, sin = (t.unsqueeze(1) for t in tables[id(self.layer_rotary[i])])  # [1, 1, T, dim]
            masks = by_window[self.windows[i]]
            h = self._rms(x, layer.input_norm)
            qkv = project(h, layer.qkv, layer.qkv_bias)  # [T, (heads + 2 * kv_heads) * dim]
            q, k, v = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
            q, k = q.view(total, heads, dim), k.view(total, kv_heads, dim)
            if layer.q_norm is not None:
                q, k = self._rms(q, layer.q_norm), self._rms(k, layer.k_norm)
            q = self._rotate(q.transpose(0, 1).unsqueeze(0), cos, sin)  # [1, heads, T, dim]
            k = self._rotate(k.transpose(0, 1).unsqueeze(0), cos, sin)
            v = v.view(total, kv_heads, dim).transpose(0, 1).unsqueeze(0)  # [1, kv_heads, T, dim]
            if len(segments) == 1:
                keys, values = segments[0].cache.update(k, v, i)  # [1, kv_heads, start + n, dim]
                att = self._attend(q, keys, values, masks[0])[0].transpose(0, 1)  # [T, heads, dim]
            else:
                parts = []
                for segment, (a, b), mask in zip(segments, bounds, masks):
                    keys, values = segment.cache.update(k[:, :, a:b], v[:, :, a:b], i)
                    out = self._attend(q[:, :, a:b], keys, values, mask)
                    parts.append(out[0].transpose(0, 1))  # [n, heads, dim]
                att = torch.cat(parts)
            out = project(att.reshape(total, heads * dim), layer.o, layer.o_bias)
            x = x + (out if layer.attn_out_norm is None else self._rms(out, layer.attn_out_norm))
            h = self._rms(x, layer.post_norm)
            gate, up = project(h, layer.gate_up).split([self.intermediate, self.intermediate], dim=-1)
            out = project((F.gelu(gate, approximate="tanh") if self.gemma else F.silu(gate)) * up, layer.down)
            x = x + (out if layer.mlp_out_norm is None else self._rms(out, layer.mlp_out_norm))
        entering[len(self.layers)] = x  # id N: the last layer's output, before the final norm
        return self._rms(x, self.norm), [entering[i] for i in aux_layers]

    def _kernel_step(self, ids: torch.Tensor, segment: Segment, aux_layers: tuple[int, ...]
                     ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """One token through every layer in C, pausing only where an aux layer's input is wanted."""
        assert self.kernel is not None
        x = self.embed(ids)[0].contiguous()  # [hidden]
        pos = segment.start
        cos, sin = self.rotary(x.view(1, 1, -1), torch.tensor([[pos]]))  # [1, 1, dim] each
        cos, sin = cos.reshape(-1).contiguous(), sin.reshape(-1).contiguous()
        layers = segment.cache.layers
        for struct, layer in zip(self._structs, layers):
            keys, values = layer.reserve(pos + 1)  # [1, kv_heads, capacity, dim]
            struct.keys, struct.values, struct.capacity = keys.data_ptr(), values.data_ptr(), keys.shape[-2]
        entering: dict[int, torch.Tensor] = {}
        for first, stop in self._runs(aux_layers):
            if first in aux_layers:
                entering[first] = x.clone().unsqueeze(0)
            self.kernel.decode_layers(self._shape, self._structs, first, stop - first, pos, cos, sin, x, self._scratch)
        for layer in layers:
            layer.set_length(pos + 1)
        entering[len(self.layers)] = x.unsqueeze(0)  # id N: the last layer's output, before the final norm
        return self._kernel_norm(x.unsqueeze(0), self.kernel), [entering[i] for i in aux_layers]

    def _runs(self, aux_layers: tuple[int, ...]) -> list[tuple[int, int]]:
        """Layer spans (first, stop), one C call each: the stack cut at every aux layer, whose input
        the caller copies before running the span that starts there."""
        cuts = sorted({0, *aux_layers, len(self.layers)})
        return list(zip(cuts, cuts[1:]))

    def _kernel_norm(self, x: torch.Tensor, kernel: kernels.RowOps) -> torch.Tensor:
        out = torch.empty_like(x)
        if self.gemma and isinstance(kernel, kernels.Kernel):  # bf16 rows, float32 factors 1 + w
            kernel.add_gemma_norm(x, self.norm, out, self.eps)
        else:
            kernel.add_norm(x, None, self.norm, out, self.eps)
        return out

    def _c_rows(self, kernel: "kernels.Kernel | float_kernels.FloatKernel", ids: torch.Tensor,
                segments: list[Segment], aux_layers: tuple[int, ...]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """A few rows (a verify step, a batch; in float32 a decode step too): every layer in C through
        ``kernel.decode_rows``, every product row-invariant, so a row's bits equal the decode step's
        at its position. The stack pauses only where an aux layer's input is wanted."""
        structs = self._structs if kernel is self.kernel else self._float_structs
        x = self.embed(ids).contiguous()  # [T, hidden]
        tables = {key: (cos[0].contiguous(), sin[0].contiguous())
                  for key, (cos, sin) in self._rope_tables(x.unsqueeze(0), positions(segments)).items()}
        cos, sin = tables[id(self.rotary)]
        if len(tables) > 1:  # layers of another RoPE read theirs (kept alive in `tables` until the calls end)
            for struct, table in zip(structs, self.layer_rotary):
                own = table is not self.rotary
                struct.cos = tables[id(table)][0].data_ptr() if own else None
                struct.sin = tables[id(table)][1].data_ptr() if own else None
        table = self._segment_table(segments)
        scratch = kernel.rows_scratch(self._shape, x.shape[0])
        entering: dict[int, torch.Tensor] = {}
        for first, stop in self._runs(aux_layers):
            if first in aux_layers:
                entering[first] = x.clone()
            kernel.decode_rows(self._shape, structs, first, stop - first, table, len(segments), cos, sin, x, scratch)
        for segment in segments:
            for layer in segment.cache.layers:
                layer.set_length(segment.start + segment.length)
        entering[len(self.layers)] = x  # id N: the last layer's output, before the final norm
        return self._kernel_norm(x, kernel), [entering[i] for i in aux_layers]

    def _allocate(self, cache: RollbackCache, dtype: torch.dtype) -> None:
        """Give every layer of ``cache`` its buffers, so a first short forward (a prompt of up to
        KERNEL_ROWS tokens) runs in C as later ones do: which code computes a prompt's cache must
        not depend on whether the buffers were kept from the last request."""
        if _ready(cache, len(self.layers)):
            return
        while len(cache.layers) < len(self.layers):
            cache.layers.append(GrowableLayer())
        empty = torch.empty(1, self.kv_heads, 0, self.head_dim, dtype=dtype)
        for layer in cache.layers:
            if not layer.is_initialized:
                layer.lazy_initialization(empty, empty)

    def _segment_table(self, segments: list[Segment]) -> ctypes.Array:
        """The kernels' Segment structs, one per layer and segment (layer 0's first); room is made in
        each cache for its new rows. The tree masks live in ``self._masks`` until the next call."""
        count = len(segments)
        self._masks = [None if s.tree is None else s.tree.mask_bytes for s in segments]
        table = (kernels.SegmentStruct * (len(self.layers) * count))()
        for i in range(len(self.layers)):
            for j, (segment, mask) in enumerate(zip(segments, self._masks)):
                keys, values = segment.cache.layers[i].reserve(segment.start + segment.length)
                table[i * count + j] = kernels.SegmentStruct(keys.data_ptr(), values.data_ptr(), keys.shape[-2],
                                                             segment.start, segment.length,
                                                             None if mask is None else mask.data_ptr())
        return table
