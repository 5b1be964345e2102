"""Suffix decoding (SuffixDecoding, arXiv 2411.04975; vLLM's method "suffix"): drafts from suffix trees.

Two trees (``suffix_tree.SuffixTree``) count the token strings of at most
``max_tree_depth`` tokens:

- the request's own tree: its prompt and its output so far;
- the global tree: the outputs of the ``max_cached_requests`` requests this proposer served
  last (first in, first out; 0 turns it off). The proposer lives as long as its engine, and
  so does this tree.

Each step, for every m such that the last m tokens of the context occurred earlier and a token
followed them, that tree drafts greedily after them (``suffix_tree.draft_from``): at most
min(k, floor(max_spec_factor * m), max_tree_depth - m) tokens, and none whose estimated path
probability is below ``min_token_prob``. The draft with the highest score (the sum of its
path probabilities) runs; a tie goes to the request's own tree, then to the longer match.
Drafts are point masses (q = 1), so verification stays exact when sampling too.

The hooks: ``propose`` sees the whole context each step and feeds only its new tokens to the
request's tree and to the request's cursor in the global tree, so a step costs O(depth)
updates plus the drafts it tries, however long the context. ``observe`` records what the target
committed. A request's output joins the global tree when its slot is released or the next
request starts (``reset``); ``clear_history`` forgets every earlier request.

Concurrent requests each draft with a ``fork``: its own request tree and cursor, the one shared
global tree. A request retiring into the global tree (or evicting from it) while others run
moves their cursors' positions, so each fork re-finds its cursor from its context's tail when
the tree's version has changed since it last looked.
"""

from __future__ import annotations

import copy
import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Sequence

import torch

from specsure.proposers.base import Draft, Proposer
from specsure.proposers.suffix_tree import Node, Position, SuffixTree, continues, draft_from

if TYPE_CHECKING:
    from specsure.config.resolution import Resolution
    from specsure.models.causal_lm import ForwardOutput
    from specsure.models.loading import LoadedModel
    from specsure.sampling import SamplingParams

_OWN = 0
"""The sequence id of a request in its own tree."""
_ROUNDING = 1e-9
"""floor(max_spec_factor * m) must not lose a whole token to a product such as 0.29 * 100."""


@dataclass
class _Request:
    """What the proposer knows about the request it is drafting for."""

    tree: SuffixTree
    seen: int = 0
    """Context tokens already in ``tree`` and in ``cursor``."""
    cursor: list[Position] = field(default_factory=list)
    """Where the context's last 1, 2, ... tokens are in the global tree (suffix_tree.SuffixTree.advance)."""
    committed: list[int] = field(default_factory=list)
    """The tokens observe() reported as committed by the target."""
    prompt_len: int | None = None
    """Set by the prompt's observe() (or, without one, at the first propose(): its context is the
    prompt plus the first output token)."""
    version: int = 0
    """The global tree's version that ``cursor`` was found in."""


@dataclass
class _History:
    """The global tree and its bookkeeping, shared by a proposer and all its forks."""

    depth: int
    enabled: bool
    tree: SuffixTree | None = None
    ids: "itertools.count[int]" = field(default_factory=itertools.count)
    cached: deque[int] = field(default_factory=deque)
    version: int = 0
    """Bumped on every change to the tree: cursors found before it may point at stale positions."""

    def clear(self) -> None:
        self.tree = SuffixTree(self.depth) if self.enabled else None
        self.cached.clear()
        self.version += 1


class SuffixProposer(Proposer):
    """Drafts from suffix trees of this request and of earlier requests' outputs; no model."""

    method: ClassVar[str] = "suffix"

    def __init__(self, max_tree_depth: int, max_cached_requests: int, max_spec_factor: float,
                 min_token_prob: float) -> None:
        for name, value, low in (("max_tree_depth", max_tree_depth, 1),
                                 ("max_cached_requests", max_cached_requests, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"SuffixProposer: {name} = {value!r} is invalid: it must be an int >= {low}.")
        if isinstance(max_spec_factor, bool) or not isinstance(max_spec_factor, (int, float)) or not (
                0 <= max_spec_factor < float("inf")):
            raise ValueError(f"SuffixProposer: max_spec_factor = {max_spec_factor!r} must be a finite number >= 0.")
        if isinstance(min_token_prob, bool) or not isinstance(min_token_prob, (int, float)) or not (
                0 <= min_token_prob <= 1):
            raise ValueError(f"SuffixProposer: min_token_prob = {min_token_prob!r} must be a number from 0 to 1.")
        self.max_tree_depth = max_tree_depth
        self.max_cached_requests = max_cached_requests
        self.max_spec_factor = float(max_spec_factor)
        self.min_token_prob = float(min_token_prob)
        self._history = _History(max_tree_depth, bool(max_cached_requests))
        self._request: _Request
        self.last_score = 0.0
        """The score of the last draft: the sum of its tokens' estimated path probabilities, so
        about the number of them the target will accept (0 for no draft)."""
        self.clear_history()

    def _fresh(self) -> _Request:
        return _Request(SuffixTree(self.max_tree_depth), version=self._history.version)

    @property
    def global_tree(self) -> SuffixTree | None:
        """Earlier requests' outputs, one sequence each (ids in ``cached_requests``); None when off."""
        return self._history.tree

    @property
    def cached_requests(self) -> tuple[int, ...]:
        """The ids of the requests whose outputs the global tree holds, oldest first."""
        return tuple(self._history.cached)

    def clear_history(self) -> None:
        """Forget every earlier request: an empty global tree, and no pending output to add to it."""
        self._history.clear()
        self._request = self._fresh()

    def fork(self) -> "SuffixProposer":
        """A proposer for a concurrent request: its own request tree, this one's global tree."""
        twin = copy.copy(self)
        twin._request = self._fresh()
        return twin

    def retire(self) -> None:
        """The request ended: its output joins the global tree now."""
        self._retire()

    def reset(self) -> None:
        """Start a new request; the finished one's output joins the global tree if it has not yet."""
        self._retire()
        self._request = self._fresh()

    def observe(self, token_ids: Sequence[int], start: int, out: "ForwardOutput | None") -> None:
        if start == 0:  # the prompt's forward: known here even if the request never drafts (disable_by_batch_size)
            self._request.prompt_len = len(token_ids)
        committed = self._request.committed
        del committed[start:]
        committed.extend(int(t) for t in token_ids)

    def propose(
        self, context: Sequence[int], k: int, params: "SamplingParams", generator: torch.Generator | None
    ) -> Draft:
        """Up to ``k`` tokens after the best-scoring match of the context's tail in either tree."""
        request = self._request
        size = len(context)
        own = request.tree.sequence(_OWN) if _OWN in request.tree else []
        if size < request.seen or (request.seen and int(context[request.seen - 1]) != own[request.seen - 1]):
            # Not a continuation of what this request saw (no reset() between requests): start it over.
            self._request = request = self._fresh()
        if request.prompt_len is None:
            request.prompt_len = size - 1
        new = [int(t) for t in context[request.seen :]]
        request.tree.extend(_OWN, new)
        history = self._history
        if history.tree is not None:
            cursor = request.cursor
            if request.version != history.version:  # the tree changed under the cursor: find it again
                cursor, new = [], [int(t) for t in context[max(0, size - self.max_tree_depth):]]
                request.version = history.version
            for token in new:
                cursor = history.tree.advance(cursor, token)
            request.cursor = cursor
        request.seen = size
        tokens, self.last_score = self._best_draft(request, k) if k > 0 else ([], 0.0)
        return Draft(tokens)

    def _best_draft(self, request: _Request, k: int) -> tuple[list[int], float]:
        depth, factor = self.max_tree_depth, self.max_spec_factor
        candidates: list[tuple[int, int, int, Position]] = []
        for m, position in enumerate(request.tree.frontier, 1):
            # A chain in the request's own tree is its newest string, which nothing has followed yet.
            if position.__class__ is Node and position.out:  # type: ignore[union-attr]
                limit = _limit(k, factor, m, depth)
                if limit > 0:
                    candidates.append((limit, 1, m, position))  # type: ignore[arg-type]
        for m, position in enumerate(request.cursor, 1):
            limit = _limit(k, factor, m, depth)
            if limit > 0 and continues(position):
                candidates.append((limit, 0, m, position))
        # The key (score, own tree, m) picks the winner; a draft scores at most its limit, so in
        # this order the first candidate whose (limit, own, m) cannot beat the best ends the search.
        candidates.sort(key=lambda c: c[:3], reverse=True)
        best_key: tuple[float, int, int] = (0.0, 0, 0)
        best: list[int] = []
        for limit, mine, m, position in candidates:
            if (limit, mine, m) <= best_key:
                break
            tokens, score = draft_from(position, limit, self.min_token_prob)
            if tokens and (score, mine, m) > best_key:
                best_key, best = (score, mine, m), tokens
        return best, best_key[0]

    def _retire(self) -> None:
        """Add the request's output to the global tree, and evict the oldest beyond the limit."""
        request, history = self._request, self._history
        tree = history.tree
        if tree is None or request.prompt_len is None:
            return
        seen = request.tree.sequence(_OWN) if _OWN in request.tree else []
        tokens = request.committed if len(request.committed) >= len(seen) else seen
        output = tokens[request.prompt_len :]
        if not output:
            return
        seq_id = next(history.ids)
        tree.extend(seq_id, output)
        history.cached.append(seq_id)
        while len(history.cached) > self.max_cached_requests:
            tree.remove(history.cached.popleft())
        history.version += 1
        self._request = self._fresh()  # retired once, never twice


def _limit(k: int, factor: float, m: int, depth: int) -> int:
    """The most tokens a match of m tokens may draft: min(k, floor(factor * m), depth - m)."""
    scaled = factor * m + _ROUNDING  # may overflow to inf for a huge factor; then k decides
    return min(k, depth - m, k if scaled >= k else int(scaled))


def build(res: "Resolution", target: "LoadedModel", dtype: str) -> SuffixProposer:
    config = res.config
    assert config is not None and config.method == "suffix"
    return SuffixProposer(config.suffix_decoding_max_tree_depth, config.suffix_decoding_max_cached_requests,
                          config.suffix_decoding_max_spec_factor, config.suffix_decoding_min_token_prob)
