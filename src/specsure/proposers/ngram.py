"""Prompt-lookup (ngram) drafting: copy what followed an earlier occurrence of the context's tail.

Semantics match vLLM's ngram proposer: take the longest n in [prompt_lookup_min,
prompt_lookup_max] such that the last n tokens of the context also occur earlier; for that n,
use the earliest occurrence, and propose up to k tokens that followed it. The draft has no
probabilities (q = 1, a point mass), so it serves greedy and sampled decoding alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Sequence

import numpy as np
import torch

from specsure.models.token_tree import depth
from specsure.proposers.base import Draft, Proposer

if TYPE_CHECKING:
    from specsure.models.causal_lm import ForwardOutput
    from specsure.sampling import SamplingParams


# Most chains a sequence drafts between two token trees whose extra branches went unused.
MAX_TREE_BACKOFF = 16


class NgramProposer(Proposer):
    """Drafts by n-gram lookup in the context itself; no model. Per sequence it keeps only how long
    its drafts may be and, for trees, how long to back off (`propose`)."""

    method: ClassVar[str] = "ngram"

    def __init__(self, prompt_lookup_min: int, prompt_lookup_max: int, branches: int = 1) -> None:
        for name, value in (("prompt_lookup_min", prompt_lookup_min), ("prompt_lookup_max", prompt_lookup_max)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"NgramProposer: {name} = {value!r} is invalid: it must be an int >= 1; "
                                 "vLLM's default is 5")
        if prompt_lookup_min > prompt_lookup_max:
            raise ValueError(f"NgramProposer: prompt_lookup_min = {prompt_lookup_min} is greater than "
                             f"prompt_lookup_max = {prompt_lookup_max}; swap them or make them equal")
        if isinstance(branches, bool) or not isinstance(branches, int) or branches < 1:
            raise ValueError(f"NgramProposer: branches = {branches!r} is invalid: it must be an int >= 1 "
                             "(1 drafts a chain, as vLLM does)")
        self.prompt_lookup_min = prompt_lookup_min
        self.prompt_lookup_max = prompt_lookup_max
        self.branches = branches
        """How many matches a draft may merge into a token tree; 1 is a chain."""
        self.reset()

    def reset(self) -> None:
        self._length: int | None = None  # the draft length now allowed (None: k), see `propose`
        # The last draft: context length, depth, and for a tree its first branch (None for a chain).
        self._last: tuple[int, int, list[int] | None] | None = None
        self._taken: list[int] | None = None  # the last draft's accepted tokens, as the engine committed them
        self._backoff = 0  # chains to draft after the next fruitless tree (doubles, up to MAX_TREE_BACKOFF)
        self._wait = 0  # chains still to draft before the next tree

    def propose(
        self, context: Sequence[int], k: int, params: SamplingParams, generator: torch.Generator | None
    ) -> Draft:
        """Up to ``k`` tokens that followed the earliest occurrence of the longest matching tail,
        or, with ``branches`` > 1, a tree of several matches' continuations (depth <= k).

        Every drafted token costs a row in the verify forward, whether the target takes it or not.
        So the length follows what the sequence's drafts earn, as transformers' "heuristic"
        assistant schedule does: it starts at k, grows by 2 after a draft accepted whole and
        shrinks by 1 (to 1 at least) after one that was not. A chat answer that repeats little of
        its prompt then drafts a token or two per match; a rewrite of a given text drafts k.

        A tree costs a row per node, and its extra branches pay only when the target takes one of
        them. So after a tree whose accepted path was the first branch's (the chain's) prefix, the
        sequence drafts chains for a while: 1, 2, 4 .. 16 steps as such trees repeat, and none once
        an extra branch is accepted again.
        """
        self._learn(context, k)
        k = min(k, self._length or k)
        if self.branches == 1 or self._wait > 0:
            self._wait = max(0, self._wait - 1)
            draft = find_ngram_draft(context, k, self.prompt_lookup_min, self.prompt_lookup_max)
            self._last = (len(context), len(draft), None) if draft else None
            return Draft(draft)
        tokens, parents = find_ngram_tree(context, k, self.prompt_lookup_min, self.prompt_lookup_max, self.branches)
        chain = next((i for i, parent in enumerate(parents) if parent != i), len(parents))
        if chain == len(parents):  # one branch: a chain verifies without a tree mask
            self._last = (len(context), len(tokens), None) if tokens else None
            return Draft(tokens)
        self._last = (len(context), depth([-1, *parents]), tokens[:chain])
        return Draft(tokens, parents=parents)

    def observe(self, token_ids: Sequence[int], start: int, out: "ForwardOutput | None") -> None:
        """The verify step after a draft commits the pending token and the accepted draft tokens."""
        if self._last is not None and self._taken is None:
            self._taken = [int(t) for t in token_ids[1:]]

    def _learn(self, context: Sequence[int], k: int) -> None:
        """What the last draft earned: the tokens its verify step committed, as observed (steps that
        drafted nothing since, under disable_by_batch_size, grew the context too); without an
        observation, the context's growth: the accepted tokens plus one new pending token."""
        if self._last is None:
            return
        length, drafted, first = self._last
        taken, self._last, self._taken = self._taken, None, None
        if taken is None:
            accepted = len(context) - length - 1
            if accepted < 0:
                return
            taken = _as_tokens(context)[length:length + accepted].tolist()
        accepted = len(taken)
        allowed = self._length or k
        self._length = max(1, min(k, allowed + 2 if accepted >= drafted else allowed - 1))
        if first is None:
            return
        if accepted > 0 and taken != first[:accepted]:  # the target followed another branch
            self._backoff = 0
        else:
            self._backoff = min(MAX_TREE_BACKOFF, max(1, 2 * self._backoff))
            self._wait = self._backoff


def _as_tokens(context: Sequence[int]) -> np.ndarray:
    if isinstance(context, np.ndarray):
        return context.astype(np.int64, copy=False)
    if isinstance(context, torch.Tensor):
        return context.cpu().numpy().astype(np.int64, copy=False)
    return np.fromiter(context, dtype=np.int64, count=len(context))


def _match_levels(tokens: np.ndarray, max_n: int) -> list[np.ndarray]:
    """``levels[i]``: where earlier occurrences of the context's last ``i + 1`` tokens end, ascending.

    Runs every decode step on contexts of thousands of tokens, so instead of comparing every
    window for every n, it finds the earlier positions holding the last token, then extends all
    those candidate matches backwards together, one token per round (at most ``max_n`` rounds).
    """
    size = tokens.size
    ends = np.flatnonzero(tokens[:-1] == tokens[-1])  # positions j < size - 1
    levels: list[np.ndarray] = []
    length = 1
    while ends.size:
        levels.append(ends)
        if length >= min(max_n, size - 1):
            break
        alive = ends[ends >= length]
        ends = alive[tokens[alive - length] == tokens[-1 - length]]
        length += 1
    return levels


def find_ngram_draft(context: Sequence[int], k: int, min_n: int, max_n: int) -> list[int]:
    """The ngram draft for ``context`` as a list of at most ``k`` ids ([] when nothing matches)."""
    tokens = _as_tokens(context)
    if k <= 0 or tokens.size <= min_n:  # an earlier occurrence of n tokens needs n + 1 tokens at least
        return []
    levels = _match_levels(tokens, max_n)
    if len(levels) < min_n:
        return []
    start = int(levels[-1][0]) + 1  # the earliest occurrence of the longest match
    return tokens[start : start + k].tolist()


def find_ngram_tree(context: Sequence[int], k: int, min_n: int, max_n: int,
                    branches: int) -> tuple[list[int], list[int]]:
    """Up to ``branches`` ngram continuations merged into one token tree: (tokens, parents).

    Continuations come longest match first, then earliest occurrence first, so the first branch
    is exactly ``find_ngram_draft``'s chain; later ones are other earlier occurrences of the same
    tail, then occurrences of shorter tails. Shared prefixes are merged. ``parents[i]`` indexes
    ``[pending] + tokens`` (0 is the pending token, the root), and every parent precedes its
    child, so the nodes can be fed in this order. ([], []) when nothing matches.
    """
    tokens = _as_tokens(context)
    if k <= 0 or branches <= 0 or tokens.size <= min_n:
        return [], []
    levels = _match_levels(tokens, max_n)
    out: list[int] = []
    parents: list[int] = []
    child: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
    found = 0
    seen: set[int] = set()
    for n in range(len(levels), min_n - 1, -1):
        for end in levels[n - 1].tolist():
            if found == branches:
                return out, parents
            start = end + 1
            if start in seen:  # the same occurrence matched a longer tail already
                continue
            seen.add(start)
            found += 1
            node = 0
            for token in tokens[start:start + k].tolist():
                key = (node, token)
                if key not in child:
                    out.append(token)
                    parents.append(node)
                    child[key] = len(out)
                node = child[key]
    return out, parents
