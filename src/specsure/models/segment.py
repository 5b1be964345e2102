"""One sequence's share of a batched forward (a `Segment`), and what its new rows see: their positions
and their attention mask, in a layer with or without a sliding window."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specsure.models.kv_cache import RollbackCache
from specsure.models.token_tree import TokenTree, attention_mask


@dataclass(frozen=True)
class Segment:
    """One sequence's share of a batched forward: its new tokens' count, where they start, its cache."""

    start: int
    length: int
    cache: RollbackCache
    tree: TokenTree | None = None


def positions(segments: list[Segment]) -> torch.Tensor:
    """The new rows' positions [1, T]: a chain's in order, a tree node's at its depth."""
    return torch.cat([torch.arange(s.start, s.start + s.length) if s.tree is None else s.start + s.tree.depths
                      for s in segments]).unsqueeze(0)


def window_mask(segment: Segment, window: int) -> torch.Tensor | None:
    """The segment's [n, start + n] attention mask in a layer with this sliding ``window`` (0: none), or
    None where its one new token sees every cached position."""
    if segment.length == 1 and (not window or segment.start < window):
        return None
    return attention_mask(segment.start, segment.length, segment.tree, window or None)
