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
"""RoPE variants whose frequencies do not change with the sequence length."""
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
        # "longrope" (Phi-3.5, Phi-4-mini) and "dynamic" change their frequencies past the trained context,
        # and transformers' module picks one set for a whole call, from its largest position: a row would
        # turn by which rows share its forward (a verify step, a prefill chunk, another sequence in the
        # batch). Here each position turns as the module turns it as the newest position of a sequence, so
        # a row depends on its position only: transformers' own rows up to the trained context, and its
        # one-token-at-a-time rows past it (which differ from its whole-prompt rows there).
        self._varying = isinstance(rope_type, str) and (rope_type == "longrope" or "dynamic" in rope_type)
        self._longrope = rope_type == "longrope"
        self._static = rope_type in STATIC_ROPE_TYPES or self._varying
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
            cos, sin = self._rows(torch.zeros(1, 1, 1, dtype=x.dtype), size)  # x: its dtype only
        self._tables[x.dtype] = (cos[0], sin[0])
        return cos[0], sin[0]

    def _rows(self, x: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [1, size, dim] for positions 0 .. size - 1, each as the module gives it for a
        sequence that ends there."""
        if not self._varying:
            return self._module(x, torch.arange(size)[None])
        original = min(self._original(), size)
        parts = [self._module(x, torch.arange(original)[None])]  # within the trained context: its frequencies
        if self._longrope and size > original:
            parts.append(self._module(x, torch.arange(original, size)[None]))  # past it the long factors, one set
        elif not self._longrope:
            for position in range(original, size):  # dynamic: the frequencies of a sequence this long, each
                self._module(x, torch.zeros(1, 1, dtype=torch.long))  # back to the trained frequencies first
                parts.append(self._module(x, torch.tensor([[position]])))
        return torch.cat([c for c, _ in parts], dim=1), torch.cat([n for _, n in parts], dim=1)

    def _original(self) -> int:
        """The trained context, past which a varying RoPE changes its frequencies."""
        rope = getattr(self.module.config, "rope_parameters", None) or {}
        if self.layer_type is not None and isinstance(rope.get(self.layer_type), dict):
            rope = rope[self.layer_type]
        found = rope.get("original_max_position_embeddings") or getattr(self.module, "original_max_seq_len", None)
        return int(found or getattr(self.module.config, "max_position_embeddings", 0) or FIRST_BLOCK)


class TabledRotary(torch.nn.Module):
    """A rotary module that answers from a `RotaryTable`: put in place of a varying RoPE's module on
    transformers' own layers, so their rows turn by position alone there too."""

    def __init__(self, table: RotaryTable) -> None:
        super().__init__()
        self.table = table
        self.inner = table.module  # a submodule: moves and casts with the model

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.table(x, position_ids)


def tabled_if_varying(base: torch.nn.Module) -> bool:
    """Put a `TabledRotary` in place of ``base.rotary_emb`` where its RoPE varies (one RoPE for every layer;
    per-layer-type modules are left as they are); returns whether it did."""
    rotary = getattr(base, "rotary_emb", None)
    if rotary is None or isinstance(rotary, TabledRotary) or not isinstance(getattr(rotary, "rope_type", None), str):
        return False
    table = RotaryTable(rotary)
    if not table._varying:
        return False
    base.rotary_emb = TabledRotary(table)
    return True
