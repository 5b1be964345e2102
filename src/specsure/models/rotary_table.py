"""A model's rotary cos and sin, computed once for a block of positions and then looked up.

A decode step calls the rotary embedding for one or a few positions. Called for them, transformers'
module costs about 20 microseconds hot and 75 in a real step (after a forward has evicted the
interpreter's caches), twice a speculative step (the target's and a head's). Each position's row is
a product of one frequency with the position, then cos and sin, so the row computed for a block of
positions has the bits of the row computed alone (`tests/test_rotary_table.py`).
"""

from __future__ import annotations

import torch

STATIC_ROPE_TYPES = frozenset({"default", "linear", "llama3", "yarn"})
"""RoPE variants whose frequencies do not change with the sequence length; "dynamic" and "longrope"
rescale them past the trained context, so those keep calling the module."""
FIRST_BLOCK = 2048


class RotaryTable:
    """Callable as the rotary module is, ``(x, positions [1, T]) -> (cos, sin)`` [1, T, dim] in x's
    dtype, from tables that grow by doubling. Consecutive positions get views of the tables, which
    every caller only reads."""

    def __init__(self, rotary: torch.nn.Module, layer_type: str | None = None) -> None:
        """``layer_type``: for a module that keeps one RoPE per layer type (Gemma 3's sliding and full
        attention layers), the type whose cos and sin this table holds; left out, the full-attention
        layers' (the global base), which draft heads on such a target use."""
        self.module = rotary
        rope_type = getattr(rotary, "rope_type", None)
        if isinstance(rope_type, dict):
            layer_type = layer_type or ("full_attention" if "full_attention" in rope_type else next(iter(rope_type)))
            rope_type = rope_type.get(layer_type)
        self.layer_type = layer_type
        self._static = rope_type in STATIC_ROPE_TYPES
        self._tables: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}

    def _module(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.layer_type is None:
            return self.module(x, positions)
        return self.module(x, positions, self.layer_type)

    def __call__(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not self._static or positions.dim() != 2 or positions.shape[0] != 1 or positions.numel() == 0:
            return self._module(x, positions)
        rows: list[int] = positions.tolist()[0]
        cos, sin = self._tables.get(x.dtype, (None, None))
        if cos is None or sin is None or max(rows) >= cos.shape[0]:
            cos, sin = self._grow(x, max(rows))
        first = rows[0]
        if rows == list(range(first, first + len(rows))):  # a chain's positions: a view, no copy
            return cos[first:first + len(rows)][None], sin[first:first + len(rows)][None]
        index = positions[0]
        return cos[index][None], sin[index][None]

    def _grow(self, x: torch.Tensor, top: int) -> tuple[torch.Tensor, torch.Tensor]:
        size = FIRST_BLOCK
        while size <= top:
            size *= 2
        # Plain tensors, outside inference mode: training multiplies by them under autograd.
        with torch.inference_mode(False), torch.no_grad():
            cos, sin = self._module(torch.zeros(1, 1, 1, dtype=x.dtype), torch.arange(size)[None])  # x: its dtype only
        self._tables[x.dtype] = (cos[0], sin[0])
        return cos[0], sin[0]
