"""Drafting a static token tree (vLLM's ``speculative_token_tree``) with a one-module head.

The root is the pending token; the head's step from it (the first draft step of a chain) gives
the logits whose top ranks are the depth-1 nodes. Each deeper level is one head call over the
nodes of the level above that have children: those entries share a position (their depth) and
see the committed entries and their own ancestors only, so the call computes for every node what
a chain through it would. All of it is speculative: the next proposal crops the head's cache back
to its committed entries, as it does after a chain.

Tree drafts are point masses (the head's ranked choices, not samples), which keeps verification
exact under sampling too (decode/tree.py).
"""

from __future__ import annotations

import torch

from typing import Sequence

from specsure.proposers.base import Draft
from specsure.proposers.head_layer import HeadCache, HeadModule, Logits, top_ids

Node = tuple[int, ...]


def draft_tree(module: HeadModule, cache: HeadCache, root_hidden: torch.Tensor, root_logits: Logits,
               tree: Sequence[Node]) -> Draft:
    """The draft for ``tree`` (breadth-first; any prefix of it is a tree).

    ``root_hidden`` ([1, H]) and ``root_logits`` ([V] or a `DraftRow`) are the head's output for the pending
    token's entry, the last one in ``cache``.
    """
    visible = cache.length  # committed entries and the pending token's: every node sees them
    widths: dict[Node, int] = {}
    for node in tree:
        widths[node[:-1]] = max(widths.get(node[:-1], 0), node[-1] + 1)
    hidden: dict[Node, torch.Tensor] = {(): root_hidden}
    logits: dict[Node, Logits] = {(): root_logits}
    ranked: dict[Node, list[int]] = {}
    index: dict[Node, int] = {(): 0}  # among [pending] + draft tokens
    entry: dict[Node, int] = {}  # the cache index of a node's own entry
    tokens: list[int] = []
    parents: list[int] = []
    depth = max(len(node) for node in tree)
    for level in range(1, depth + 1):
        nodes = [node for node in tree if len(node) == level]
        for node in nodes:
            parent = node[:-1]
            if parent not in ranked:
                ranked[parent] = top_ids(logits[parent], widths[parent])
            tokens.append(ranked[parent][node[-1]])
            parents.append(index[parent])
            index[node] = len(tokens)
        growing = [node for node in nodes if node in widths]
        if not growing:
            break
        past, n = cache.length, len(growing)
        allowed = torch.zeros(n, past + n, dtype=torch.bool)
        allowed[:, :visible] = True
        for row, node in enumerate(growing):
            for cut in range(1, level):
                allowed[row, entry[node[:cut]]] = True
            allowed[row, past + row] = True
            entry[node] = past + row
        # A chain puts its step-d entry at position visible - 1 + d; every node of depth d sits there.
        # A lone node that sees every entry before it is a chain step: no layout, so the C kernel may run it.
        if not (n == 1 and past == visible - 1 + level and bool(allowed.all())):
            cache.lay_out([visible - 1 + level] * n, allowed)
        features = torch.cat([hidden[node[:-1]] for node in growing])
        ids = torch.tensor([tokens[index[node] - 1] for node in growing], dtype=torch.long)
        out, rows = module(features, ids, cache)  # [n, H], [n, V]
        for row, node in enumerate(growing):
            hidden[node], logits[node] = out[row: row + 1], rows[row]
    return Draft(tokens, parents=parents)
