"""A token tree shared by the forward tests, and each node's path from the root; test-only code."""

from __future__ import annotations

TREE = (-1, 0, 1, 0, 3, 3, 5)
"""Parents: the root; a chain 1-2; a branch 3 with children 4 and 5-6."""


def node_paths(parents: tuple[int, ...]) -> list[list[int]]:
    """For each node, the nodes from the root down to it (decoding them one at a time reaches it)."""
    paths = []
    for node in range(len(parents)):
        path, i = [], node
        while i != -1:
            path.insert(0, i)
            i = parents[i]
        paths.append(path)
    return paths
