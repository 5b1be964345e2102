"""Verifying a token tree: several candidate continuations checked in one target forward.

The fed tokens are node 0, the *pending* token (the root), then the draft nodes, each after its
parent. Row i of the target's output is p for the token after the path from the root to node i.
Verification walks down from the root: at each node it picks the target's token (the argmax, or
a sample from p at that node), moves to the child holding that token when there is one (an
*accepted* draft token), and stops otherwise; the token picked where it stops is the step's
*bonus* token (at a leaf) or *recovered* token (where no child matched). Drafts are point masses
(q = 1), so drawing every output token from p is the exact rule: the output follows the target's
distribution whatever the tree holds. A chain is the tree whose every node has one child.

Pure functions: randomness comes only from the ``generator`` passed in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from specsure.sampling import argmax_ids, sample


@dataclass(frozen=True)
class TreeVerdict:
    """The result of verifying one step's token tree."""

    path: list[int]
    """Node indices from the root (0) down to the last accepted node, ascending."""
    output_ids: list[int]
    """The accepted draft tokens along the path, then the bonus or recovered token;
    ``len(output_ids) == len(path)``."""

    @property
    def accepted(self) -> int:
        return len(self.path) - 1


def _child_index(tokens: Sequence[int], parents: Sequence[int]) -> list[dict[int, int]]:
    """Per node: {child's token id: child's node index}. The first child with a token wins."""
    kids: list[dict[int, int]] = [{} for _ in tokens]
    for node in range(1, len(tokens)):
        kids[parents[node]].setdefault(tokens[node], node)
    return kids


def verify_tree(p: torch.Tensor | None, logits: torch.Tensor | None, tokens: Sequence[int], parents: Sequence[int],
                generator: torch.Generator | None) -> TreeVerdict:
    """Walk the tree along the target's own choices.

    ``tokens`` and ``parents`` describe the fed nodes (node 0 is the pending root, parent -1).
    Greedy: pass ``logits`` ``[n, V]`` (only the argmax matters) and ``p = None``. Sampled: pass
    the target's ``p`` ``[n, V]`` from ``probs_from_logits``; one token is drawn per visited node.
    """
    if len(tokens) != len(parents) or not tokens or parents[0] != -1:
        raise ValueError(f"a tree needs one parent per token and node 0 as the root; got {len(tokens)} tokens "
                         f"and parents {list(parents)[:4]}...")
    rows = p if p is not None else logits
    if rows is None or rows.shape[0] != len(tokens):
        raise ValueError(f"a tree of {len(tokens)} nodes needs one target row per node; got "
                         f"{'none' if rows is None else rows.shape[0]} (pass logits for greedy, p for sampled).")
    kids = _child_index(tokens, parents)
    argmax = argmax_ids(rows) if p is None else None  # greedy: every node's at once
    node, path, output = 0, [0], []
    while True:
        token = argmax[node] if argmax is not None else int(sample(p[node], generator))
        output.append(token)
        child = kids[node].get(token)
        if child is None:
            return TreeVerdict(path, output)
        node = child
        path.append(child)
