"""``speculative_token_tree``: a static draft tree for the head methods (eagle, eagle3, mtp).

The key and its text are those of earlier vLLM releases (vLLM 0.33.0 no longer has it): each node
is a tuple of child ranks from the root, ``(0,)`` the head's most likely first token, ``(1,)`` its
second most likely, ``(0, 2)`` the third most likely token after ``(0,)``, written as a string
holding a Python list of tuples (``"[(0,), (1,), (0, 0)]"``), sorted breadth-first, every node a
speculative token. specsure reads the same string, or the same tree as a JSON list of lists.
"""

from __future__ import annotations

import ast
from typing import Any, Final

from specsure.config.errors import ConfigError

class DraftTree(tuple[tuple[int, ...], ...]):
    """Nodes as child-rank paths, breadth-first (by depth, then rank by rank). It prints as the
    text users write, ``[(0,), (1,), (0, 0)]``, wherever a value is shown (explain, logs, metrics),
    and equals the plain tuple of the same nodes."""

    def __repr__(self) -> str:
        return str(list(self))

    __str__ = __repr__

    @property
    def depth(self) -> int:
        """Levels below the root: the last node's, since nodes come breadth-first."""
        return len(self[-1])

TREE_METHODS: Final[tuple[str, ...]] = ("eagle", "eagle3", "mtp")
MAX_TREE_RANK: Final[int] = 16
"""A node's rank among its siblings is below this: candidates further down a head's list are
accepted too rarely to pay for their verify row."""
_MAX_TEXT: Final[int] = 20_000
_EXAMPLE: Final[str] = '"[(0,), (1,), (0, 0)]"'


def parse_token_tree(value: Any, max_nodes: int) -> DraftTree:
    """The tree in ``value`` (vLLM's string, or a list of lists), checked and sorted breadth-first."""
    field = "speculative_token_tree"
    if isinstance(value, str):
        if len(value) > _MAX_TEXT:
            raise ConfigError(f"{field} is {len(value)} characters long; a tree of at most {max_nodes} nodes "
                              f"needs far fewer. Write it as a list of child-rank tuples, e.g. {_EXAMPLE}.")
        try:
            parsed = ast.literal_eval(value.strip())  # literals only: nothing in the text is run
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            raise ConfigError(f"{field} = {value!r} is not a list of tuples; write the tree as vLLM does, "
                              f"e.g. {_EXAMPLE} (a node's tuple holds its child ranks from the root).") from None
    else:
        parsed = value
    if not isinstance(parsed, (list, tuple)) or not parsed:
        raise ConfigError(f"{field} = {value!r} must be a non-empty list of nodes, each a tuple of child ranks "
                          f"from the root, e.g. {_EXAMPLE}.")
    nodes: list[tuple[int, ...]] = []
    for item in parsed:
        if not isinstance(item, (list, tuple)) or not item:
            raise ConfigError(f"{field}: node {item!r} must be a non-empty tuple of child ranks, e.g. (0,) for "
                              f"the head's first choice or (0, 1) for the second choice after it; tree {_EXAMPLE}.")
        for rank in item:
            if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < MAX_TREE_RANK:
                raise ConfigError(f"{field}: node {tuple(item)!r} holds rank {rank!r}; a rank is an integer from "
                                  f"0 (the head's most likely token) to {MAX_TREE_RANK - 1}.")
        nodes.append(tuple(item))
    if len(nodes) > max_nodes:
        raise ConfigError(f"{field} has {len(nodes)} nodes; at most {max_nodes} (each node is a draft token "
                          "and a row of every verify forward).")
    seen: set[tuple[int, ...]] = set()
    for node in nodes:
        if node in seen:
            raise ConfigError(f"{field} lists node {node!r} twice; give each node once.")
        seen.add(node)
    for node in nodes:
        if len(node) > 1 and node[:-1] not in seen:
            raise ConfigError(f"{field}: node {node!r} has no parent {node[:-1]!r} in the tree; every prefix of "
                              f"a node must be a node too. Add {node[:-1]!r}, or drop {node!r}.")
    return DraftTree(sorted(nodes, key=lambda node: (len(node), node)))


def is_chain(tree: DraftTree) -> bool:
    """Whether the tree is one chain of the head's first choices (what no tree drafts)."""
    return all(node == (0,) * (i + 1) for i, node in enumerate(tree))


def tree_shape(tree: DraftTree) -> str:
    """A few words on the tree: nodes, depth, widest level."""
    depth, feeds = tree.depth, f"a verify forward feeds {len(tree) + 1} tokens"
    if is_chain(tree):
        return f"a chain of {len(tree)} token{'s' * (len(tree) > 1)}, the same draft as no tree; {feeds}"
    widths = [sum(len(node) == d for node in tree) for d in range(1, depth + 1)]
    nodes, levels = f"{len(tree)} node{'s' * (len(tree) > 1)}", f"{depth} level{'s' * (depth > 1)}"
    return f"{nodes} over {levels} ({', '.join(map(str, widths))} per level); {feeds}"
