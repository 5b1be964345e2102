"""A long forward cut into forwards of a bounded row count, with the same bits.

Every float32 forward runs in the C kernel (native.py; with int8 activations too), a long prompt's
prefill included, and the kernel's attention lists each row's visible new tokens, rows x rows entries: a
prompt of 8,000 tokens would want half a gigabyte for them. Every row of the C kernel computes
alone, so a chain (a prompt, a verify chain) cut into consecutive pieces, each run after the one
before it has written its keys and values, gives every row the bits it gets in one forward. A token
tree is never cut: its rows see only their ancestors among the new tokens, and a tree has at most
65 rows anyway.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from specsure.models.segment import Segment

PIECE_ROWS = 512
"""The most rows one float32 C forward takes: 2 MB of attention lists, and a step that still
multiplies many rows per weight read."""

Forward = Callable[[torch.Tensor, list["Segment"]], tuple[torch.Tensor, list[torch.Tensor]]]


def pieces(segments: list["Segment"], limit: int = PIECE_ROWS) -> list[list["Segment"]]:
    """``segments``' rows, in order, as forwards of at most ``limit`` rows (a tree longer than
    ``limit`` stays whole): a segment's later piece always runs in a later forward than its earlier
    ones, because every piece but a segment's last has ``limit`` rows."""
    forwards: list[list[Segment]] = [[]]
    size = 0
    for segment in segments:
        cut = [segment] if segment.tree is not None else \
            [replace(segment, start=segment.start + at, length=min(limit, segment.length - at))
             for at in range(0, segment.length, limit)]
        for piece in cut:
            if size and size + piece.length > limit:
                forwards.append([])
                size = 0
            forwards[-1].append(piece)
            size += piece.length
    return forwards


def run_in_pieces(forward: Forward, ids: torch.Tensor, segments: list["Segment"],
                  limit: int = PIECE_ROWS) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``forward(ids, segments)`` run as `pieces`: the rows' outputs and each aux layer's inputs, in
    the rows' order, as one forward returns them."""
    lasts: list[torch.Tensor] = []
    entering: list[list[torch.Tensor]] = []
    at = 0
    for part in pieces(segments, limit):
        rows = sum(s.length for s in part)
        last, aux = forward(ids[at:at + rows], part)
        lasts.append(last)
        entering.append(aux)
        at += rows
    return torch.cat(lasts), [torch.cat(layer) for layer in zip(*entering)]
