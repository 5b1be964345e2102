"""Suffix trees with counts, the data structure of suffix decoding (proposers/suffix.py).

A tree holds every token string of at most ``depth`` tokens that occurs in its sequences, and
how often it occurs. A string is a path from the root. A node's ``count`` is the number of
occurrences of its string, and its ``out`` is the number of those that a next token follows
(the sum of its children's counts). The estimated probability of token t after a string is
count(string + t) / out(string). An occurrence that ends a sequence has no next token, so it
does not dilute that estimate; the current context's own tail is such an occurrence.

Strings that occur once form chains without branches. Such a chain is stored as one ``Tail``, a
slice of the sequence it came from, instead of one node per token. A second occurrence turns the
chain's first token into a node, one token per appended token. So text that never repeats
costs O(1) objects per token, and text that does costs one node per repeated string.

Appending a token counts the strings that end at it: the one-token string, and each string that
ended at the previous token, extended by the new one. The tree keeps those positions (the open
sequence's frontier), so an append costs O(depth) dictionary operations, however long the
sequence is. Removing a sequence walks each of its suffixes (at most ``depth`` tokens) and
decrements, so the tree then holds exactly the counts of the sequences it still has.
"""

from __future__ import annotations

from typing import Iterable, Sequence, Union


class Tail:
    """Tokens ``seq[start : start + length]`` that occurred once, below the node that holds it."""

    __slots__ = ("seq", "start", "length")
    count = 1
    """Every string in the chain occurred once."""

    def __init__(self, seq: list[int], start: int, length: int) -> None:
        self.seq = seq
        self.start = start
        self.length = length


class Node:
    """A string that occurred at least twice (or did, before a removal)."""

    __slots__ = ("children", "count", "out", "best")

    def __init__(self, count: int = 0) -> None:
        self.children: dict[int, Node | Tail] = {}
        """Next token -> the node (or chain) of this string plus that token."""
        self.count = count
        """Occurrences of this node's string."""
        self.out = 0
        """Occurrences followed by a next token: the sum of the children's counts."""
        self.best: int | None = None
        """The most frequent child's token, or None when it must be recomputed."""

    def best_child(self) -> int:
        """The token of the most frequent child; a tie goes to the smaller token id."""
        if self.best is None:
            children = self.children
            self.best = min(children, key=lambda token: (-children[token].count, token))
        return self.best


Position = Union[Node, "tuple[Tail, int]"]
"""A string in a tree: its node, or (chain, offset) for the string ending at chain token ``offset``."""


class SuffixTree:
    """The strings of at most ``depth`` tokens of a set of sequences, with counts.

    Sequences are added token by token with ``extend``; only the sequence extended last can
    grow (extending another one closes it). ``remove`` takes a sequence's strings out again.
    """

    def __init__(self, depth: int) -> None:
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"SuffixTree: depth = {depth!r} must be an int >= 1.")
        self.depth = depth
        self.root = Node()
        self._seqs: dict[int, list[int]] = {}
        self._open: int | None = None
        self._frontier: list[Node | Tail] = []

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self._seqs

    @property
    def frontier(self) -> list[Node | Tail]:
        """Where the open sequence's strings of 1, 2, ... (up to depth - 1) tokens ending at its last
        token are: a node, or the sequence's own chain, which then ends at that token (the string
        occurred once: this time). Not a copy: do not change it."""
        return self._frontier

    def sequence(self, seq_id: int) -> list[int]:
        """The tokens of a sequence the tree holds (not a copy: do not change it)."""
        return self._seqs[seq_id]

    def extend(self, seq_id: int, tokens: Iterable[int]) -> None:
        """Append ``tokens`` to sequence ``seq_id`` (a new id starts a sequence) and count them."""
        if seq_id != self._open:
            if seq_id in self._seqs:
                raise ValueError(f"SuffixTree: sequence {seq_id} is closed (another sequence was extended "
                                 "after it); it can only be removed.")
            self._seqs[seq_id] = []
            self._open, self._frontier = seq_id, []
        seq = self._seqs[seq_id]
        frontier = self._frontier
        for token in tokens:
            seq.append(token)
            frontier = self._append(seq, frontier, token)
        self._frontier = frontier

    def _append(self, seq: list[int], frontier: list[Node | Tail], token: int) -> list[Node | Tail]:
        """Count the strings that end at ``token``, just appended to ``seq``; the new frontier."""
        index = len(seq) - 1
        keep = self.depth - 1
        top = min(len(frontier) + 1, self.depth)  # the longest string ending here that is counted
        new: list[Node | Tail] = [self.root] * min(top, keep)
        # Longest first: a shorter string's step may turn a chain's first token into a node, which
        # shortens the chain in place, so a position at the chain's end stays valid. A chain that
        # ends at a frontier position has grown by the new token before (longer strings go first),
        # so such a split never takes its last token.
        for length in range(top, 1, -1):
            position = self._count(frontier[length - 2], token, seq, index)
            if length <= keep:
                new[length - 1] = position
        first = self._count(self.root, token, seq, index)
        if keep:
            new[0] = first
        return new

    @staticmethod
    def _count(position: Node | Tail, token: int, seq: list[int], index: int) -> Node | Tail:
        """One more occurrence of (the string at ``position``) + ``token``; where that string is."""
        if position.__class__ is Tail:  # the open sequence's own chain grows by the new token
            position.length += 1  # type: ignore[union-attr]
            return position
        node: Node = position  # type: ignore[assignment]
        node.out += 1
        child = node.children.get(token)
        if child is None:
            child = node.children[token] = Tail(seq, index, 1)
        elif child.__class__ is Tail:  # a second occurrence: the chain's first token becomes a node
            chain: Tail = child  # type: ignore[assignment]
            child = Node(2)
            if chain.length > 1:
                chain.start += 1
                chain.length -= 1
                child.children[chain.seq[chain.start]] = chain
                child.out = 1
            node.children[token] = child
        else:
            child.count += 1  # type: ignore[misc]
        best = node.best
        if best is not None and best != token:
            rival = node.children[best].count
            if child.count > rival or (child.count == rival and token < best):
                node.best = token
        return child

    def remove(self, seq_id: int) -> None:
        """Take every string of sequence ``seq_id`` out of the counts; drop what nothing else holds."""
        seq = self._seqs.pop(seq_id)
        if seq_id == self._open:
            self._open, self._frontier = None, []
        depth = self.depth
        for start in range(len(seq)):
            node = self.root
            for token in seq[start : start + depth]:
                node.out -= 1
                child = node.children[token]
                if node.best == token:
                    node.best = None
                if child.__class__ is Tail or child.count == 1:
                    # Only this occurrence passes here, so everything below is its own.
                    assert child.__class__ is not Tail or child.seq is seq  # type: ignore[union-attr]
                    del node.children[token]
                    break
                child.count -= 1  # type: ignore[misc]
                node = child  # type: ignore[assignment]

    def advance(self, positions: Sequence[Position], token: int) -> list[Position]:
        """Match one more token, without changing the tree.

        ``positions[i]`` is where the string of the last i + 1 tokens of some pattern is, for
        every such string the tree holds (a string of i + 2 tokens holds one of i + 1, so they
        are consecutive). Returns the same for the pattern followed by ``token``.
        """
        first = _walk(self.root, token)
        if first is None:
            return []
        out = [first]
        for position in positions[: max(0, self.depth - 2)]:
            step = _walk(position, token)
            if step is None:
                break
            out.append(step)
        return out

    def size(self) -> tuple[int, int]:
        """(nodes, chains) the tree stores, the root excluded; O(size), for diagnostics and tests."""
        nodes = chains = 0
        stack = [self.root]
        while stack:
            for child in stack.pop().children.values():
                if child.__class__ is Tail:
                    chains += 1
                else:
                    nodes += 1
                    stack.append(child)  # type: ignore[arg-type]
        return nodes, chains


def _walk(position: Position, token: int) -> Position | None:
    if position.__class__ is tuple:
        chain, offset = position  # type: ignore[misc]
        offset += 1
        if offset < chain.length and chain.seq[chain.start + offset] == token:
            return chain, offset
        return None
    child = position.children.get(token)  # type: ignore[union-attr]
    if child is None:
        return None
    return child if child.__class__ is Node else (child, 0)


def continues(position: Position) -> bool:
    """Whether some occurrence of the string at ``position`` is followed by a next token."""
    if position.__class__ is tuple:
        chain, offset = position  # type: ignore[misc]
        return offset + 1 < chain.length
    return position.out > 0  # type: ignore[union-attr]


def draft_from(position: Position, limit: int, min_prob: float) -> tuple[list[int], float]:
    """The greedy draft after the string at ``position``, and its score.

    Walks to the most frequent next token while the path's estimated probability (the product
    of count(child) / out(node) along the way) stays >= ``min_prob``, for at most ``limit``
    tokens. The score is the sum of those path probabilities: the expected number of draft
    tokens a verifier that agrees with the counts accepts.
    """
    tokens: list[int] = []
    score, prob = 0.0, 1.0
    while len(tokens) < limit:
        if position.__class__ is tuple:  # a chain: each next token has probability 1
            chain, offset = position  # type: ignore[misc]
            begin = chain.start + offset + 1
            take = min(chain.start + chain.length - begin, limit - len(tokens))
            tokens.extend(chain.seq[begin : begin + take])
            for _ in range(take):  # summed token by token, exactly as the walk below would
                score += prob
            break
        node: Node = position  # type: ignore[assignment]
        if not node.out:
            break
        token = node.best_child()
        child = node.children[token]
        step = prob * (child.count / node.out)
        if step < min_prob:
            break
        tokens.append(token)
        score += step
        prob = step
        position = child if child.__class__ is Node else (child, 0)  # type: ignore[assignment]
    return tokens, score
