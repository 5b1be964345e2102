"""A token tree as a verify forward feeds it: node order, depths and who may attend to whom."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch


@dataclass(frozen=True)
class TokenTree:
    """n fed tokens arranged as a tree: node 0 is the root, every other node's parent comes before it."""

    parents: tuple[int, ...]
    """parents[i]: the index of node i's parent among the fed tokens; -1 for the root."""
    depths: torch.Tensor = torch.empty(0, dtype=torch.long)
    """[n] each node's depth (its position offset from the first fed token)."""
    ancestors: torch.Tensor = torch.empty(0, 0, dtype=torch.bool)
    """[n, n] True where node j is node i or one of its ancestors."""
    mask_bytes: torch.Tensor = torch.empty(0, 0, dtype=torch.uint8)
    """``ancestors`` as contiguous uint8, the C kernels' tree mask (made from ``ancestors`` if not given)."""

    def __post_init__(self) -> None:
        if self.mask_bytes.shape != self.ancestors.shape:  # the kernels read n x n bytes from it
            object.__setattr__(self, "mask_bytes", self.ancestors.to(torch.uint8).contiguous())

    @classmethod
    def from_parents(cls, parents: tuple[int, ...] | list[int]) -> "TokenTree":
        """The tree of ``parents``. A verify step feeds the same few shapes again and again, so trees
        are shared: the result is read-only, its tensors included."""
        return _tree(tuple(parents))


@lru_cache(maxsize=256)
def _tree(parents: tuple[int, ...]) -> TokenTree:
    """`TokenTree.from_parents`, made once per shape (about a tenth of a millisecond each time otherwise)."""
    n = len(parents)
    if n == 0 or parents[0] != -1 or any(not 0 <= p < i for i, p in enumerate(parents) if i):
        raise ValueError(f"parents {list(parents)} is not a tree in order: node 0 must be the root (-1) "
                         "and every other node's parent must come before it.")
    depths = [0] * n
    ancestors = torch.eye(n, dtype=torch.bool)
    for i in range(1, n):
        depths[i] = depths[parents[i]] + 1
        ancestors[i] |= ancestors[parents[i]]
    return TokenTree(parents, torch.tensor(depths, dtype=torch.long), ancestors)


def node_depths(parents: Sequence[int]) -> list[int]:
    """Each node's depth in a tree given by ``parents`` (node 0 the root at 0, its parent -1)."""
    depths = [0] * len(parents)
    for node in range(1, len(parents)):
        depths[node] = depths[parents[node]] + 1
    return depths


def tree_paths(tokens: Sequence[int], parents: Sequence[int]) -> list[list[int]]:
    """Per node, the tokens from the root's child down to the node itself (the root's path is empty):
    what a node's verify row has behind it beyond the committed output."""
    paths: list[list[int]] = [[] for _ in parents]
    for node in range(1, len(parents)):
        paths[node] = [*paths[parents[node]], tokens[node]]
    return paths


def depth(parents: Sequence[int]) -> int:
    """The longest root-to-leaf path of a tree given by ``parents`` (node 0 the root, -1), in draft
    tokens (what SpecStats counts as positions drafted)."""
    return max(node_depths(parents))


def attention_mask(start: int, n: int, tree: TokenTree | None, window: int | None = None) -> torch.Tensor:
    """[n, start + n] bool: True where a new token may attend (every cached position, then causal or tree).

    ``window``: a sliding-window layer's, as transformers applies it: a query at position q sees keys at
    positions above q - window. A tree node's position is the root's plus its depth, not its index.
    """
    if tree is None:
        mask = torch.arange(start + n)[None, :] <= (start + torch.arange(n))[:, None]
        positions = torch.arange(start + n)
    else:
        mask = torch.cat([torch.ones(n, start, dtype=torch.bool), tree.ancestors], dim=1)
        positions = torch.cat([torch.arange(start), start + tree.depths])
    if window is not None:
        query = positions[start:]
        mask &= positions[None, :] > query[:, None] - window
    return mask


def layer_masks(config: Any, dtype: torch.dtype, start: int, n: int,
                tree: TokenTree) -> torch.Tensor | dict[str, torch.Tensor]:
    """A token tree's [1, 1, n, start + n] mask for transformers' modules of a model with ``config``: one
    mask, or one per layer type where layers differ (transformers' mask mapping, keyed by layer type).
    transformers takes a 4D mask as given and applies no sliding window of its own to it."""
    text = config.get_text_config(decoder=True)
    window = getattr(text, "sliding_window", None)
    types = set(getattr(text, "layer_types", None) or ())

    def shaped(mask: torch.Tensor) -> torch.Tensor:
        mask = mask[None, None]
        if getattr(config, "_attn_implementation", "sdpa") != "eager":
            return mask
        # Eager attention adds the mask to its scores (transformers' own eager masks are additive),
        # so a boolean one would only add 1 where it should forbid.
        return torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, torch.finfo(dtype).min)

    if not window or types == {"full_attention"}:
        return shaped(attention_mask(start, n, tree))
    if not types:  # Mistral's and Phi-3's way: every layer slides
        return shaped(attention_mask(start, n, tree, window))
    if types <= {"full_attention", "sliding_attention"}:
        return {"full_attention": shaped(attention_mask(start, n, tree)),
                "sliding_attention": shaped(attention_mask(start, n, tree, window))}
    raise ValueError(f"a token tree cannot be verified on this model: its layers attend as {sorted(types)}, "
                     "and specsure builds tree masks for full and sliding-window attention only; draft a chain "
                     "(no speculative_token_tree, prompt_lookup_branches 1).")
