"""The drafting loop shared by feature-level heads (EAGLE-1, EAGLE-3, MTP), with exact rollback.

Timeline (the token shift). The target's feature at position t is paired with token t+1: a
head's entry t is (feature_t, token_{t+1}) at position t, and its output predicts token t+2.
After observing L target positions, the context holds L+1 tokens: the last is the *pending*
token, which the target has not run yet. Entry L-1 pairs the last real feature with the pending
token and drafts token L+1. Further steps have no target feature: the head feeds back its own
output hidden state, at the next position.

Depth (MTP with M modules, DeepSeek-V3). Module i's entry t is (module i-1's output at t,
token_{t+i+1}); module 0 takes the target's features. Draft step i < M runs module i at
position L-1. Steps beyond M reuse the modules cyclically (module s % M), each appending one
entry fed with the previous step's output hidden state.

Rollback. An entry is *committed* when its feature and token are: module i's entries t <= L-1-i.
Every proposal first crops each module's cache back to its committed entries, so draft tokens
and the head's own outputs never outlive the round that made them, and the next proposal equals
what a fresh head fed the committed sequence would propose.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Callable, Sequence

import torch

from specsure.config.compat import check_tree_modules
from specsure.config.token_tree import DraftTree, is_chain
from specsure.sampling import draw
from specsure.proposers.base import Draft, Proposer
from specsure.proposers.head_layer import DraftRow, HeadCache, HeadModule, Logits, last_row, widened
from specsure.proposers.head_tree import draft_tree

if TYPE_CHECKING:
    from specsure.sampling import SamplingParams
    from specsure.models.causal_lm import ForwardOutput

FeatureOf = Callable[["ForwardOutput"], torch.Tensor]
"""The head's feature for each observed target row ([n, H]): e.g. the last hidden state."""


class HeadChainProposer(Proposer):
    """Drafts with one or more head modules that condition on the target's features."""

    def __init__(self, modules: Sequence[HeadModule], feature_of: FeatureOf) -> None:
        if not modules:
            raise ValueError("a head needs at least one module.")
        self.modules = list(modules)
        self._feature_of = feature_of
        self._caches = [HeadCache() for _ in self.modules]
        self.tree: DraftTree | None = None
        """The static draft tree (speculative_token_tree); None drafts a chain."""
        self.reset()

    def use_tree(self, tree: DraftTree | None) -> None:
        """Draft ``tree`` each step instead of a chain (a chain-shaped tree stays a chain, which
        keeps sampled drafts and their q under sampling)."""
        check_tree_modules(self.method, tree, len(self.modules))
        self.tree = None if tree is None or is_chain(tree) else tree

    def fork(self) -> "HeadChainProposer":
        """The same modules (weights shared), with KV caches of its own."""
        twin = copy.copy(self)
        twin._caches = [HeadCache() for _ in self.modules]
        twin.reset()
        return twin

    def reset(self) -> None:
        m = len(self.modules)
        for cache in self._caches:
            cache.crop(0)  # keeps the KV buffers for the next request
        self._done = [0] * m
        """Committed entries of each module (positions 0 .. done-1)."""
        self._inputs: list[torch.Tensor | None] = [None] * m
        """Committed inputs of module i not yet in its cache, for positions done[i] ..: the target's
        features for module 0, module i-1's committed outputs otherwise."""
        self._observed = 0

    def resume(self, shared: int) -> int:
        """Keep the committed entries that the shared tokens still make (entry t reads token t+1, so up
        to shared - 1 of them); the target computes its features again from there. With several
        modules nothing is kept: a later module's inputs are an earlier one's outputs, not kept."""
        if len(self.modules) > 1:
            self.reset()
            return 0
        keep = max(0, min(self._done[0], shared - 1))
        self._caches[0].crop(keep)
        self._done[0], self._inputs[0], self._observed = keep, None, keep
        return keep

    @torch.inference_mode()
    def observe(self, token_ids: Sequence[int], start: int, out: "ForwardOutput") -> None:
        assert start == self._observed, f"observed up to {self._observed}, but the engine reports {start}"
        self._inputs[0] = _cat(self._inputs[0], self._feature_of(out))
        self._observed = start + len(token_ids)

    @torch.inference_mode()
    def propose(
        self, context: Sequence[int], k: int, params: "SamplingParams", generator: torch.Generator | None
    ) -> Draft:
        n_obs = self._observed
        if k <= 0 or n_obs == 0:
            return Draft([])
        assert len(context) == n_obs + 1, f"context of {len(context)} tokens after observing {n_obs} positions"
        tokens = list(context)
        if self.tree is not None:  # the first k nodes, breadth-first: a tree again
            hidden, logits, _ = self._depth_step(0, tokens, None)
            return draft_tree(self.modules[0], self._caches[0], hidden[-1:], logits, self.tree[:k])
        draft: list[int] = []
        rows: list[torch.Tensor] = []
        spec: torch.Tensor | None = None  # the previous module's speculative outputs, positions done[i-1]..
        hidden = torch.empty(0)
        for i in range(min(k, len(self.modules))):
            hidden, logits, spec = self._depth_step(i, tokens, spec)
            self._pick(logits, params, generator, tokens, draft, rows)
        for s in range(len(self.modules), k):
            module, cache = self.modules[s % len(self.modules)], self._caches[s % len(self.modules)]
            ids = torch.tensor(tokens[-1:], dtype=torch.long)
            hidden, logits = module(hidden[-1:], ids, cache, last=True)  # [1, H], [1, V] or a DraftRow
            self._pick(last_row(logits), params, generator, tokens, draft, rows)
        return Draft(draft, torch.stack(rows) if rows else None)

    def _depth_step(self, i: int, tokens: list[int],
                    spec: torch.Tensor | None) -> tuple[torch.Tensor, Logits, torch.Tensor]:
        """Run module i over positions done[i] .. L-1; commit what is committed; return its last row."""
        n_obs, lo, cache = self._observed, self._done[i], self._caches[i]
        cache.crop(lo)
        committed = 0 if self._inputs[i] is None else self._inputs[i].shape[0]
        x = _cat(self._inputs[i], spec)  # [L - lo, H]: committed inputs, then this round's speculative ones
        assert x is not None and x.shape[0] == n_obs - lo, "head inputs out of step with the observed positions"
        ids = torch.tensor(tokens[lo + i + 1: n_obs + i + 1], dtype=torch.long)  # token_{t+i+1}
        hidden, logits = self.modules[i](x, ids, cache, last=True)  # [L - lo, H], [1, V] or a DraftRow
        done = max(n_obs - i, 0)
        self._done[i] = done
        self._inputs[i] = x[done - lo: committed]  # committed inputs whose entries wait for a token
        if i + 1 < len(self.modules):
            self._inputs[i + 1] = _cat(self._inputs[i + 1], hidden[: done - lo])
        return hidden, last_row(logits), hidden[done - lo:]

    @staticmethod
    def _pick(logits: Logits, params: "SamplingParams", generator: torch.Generator | None,
              tokens: list[int], draft: list[int], rows: list[torch.Tensor]) -> None:
        """Draw one draft token from a [V] row of target-vocabulary logits (or a `DraftRow`): argmax,
        or a sample from q."""
        if params.greedy and isinstance(logits, DraftRow):
            token, q = logits.argmax(), None
        else:
            token, q = draw(widened(logits), params, generator)
        if q is not None:
            rows.append(q)
        draft.append(token)
        tokens.append(token)


def _cat(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
    if a is None or a.shape[0] == 0:
        return b
    if b is None or b.shape[0] == 0:
        return a
    return torch.cat([a, b])
