"""draft_model: a smaller causal LM with the target's vocabulary drafts autoregressively."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch

from specsure.sampling import draw
from specsure.proposers.base import Draft, Proposer

if TYPE_CHECKING:
    from specsure.sampling import SamplingParams
    from specsure.models.causal_lm import CausalLM


class DraftModelProposer(Proposer):
    """Drafts k tokens with its own KV cache, kept in step with the target's committed tokens.

    The draft cache holds a prefix of the context. Before each proposal it is cropped to the
    longest prefix it shares with the context (rejected draft tokens leave no trace), and the
    missing committed tokens are fed in one forward.
    """

    method = "draft_model"

    def __init__(self, draft: "CausalLM") -> None:
        self.draft = draft
        self._fed: list[int] = []
        self._stable = 0
        """Length of the context at the previous proposal; that prefix is committed and shared."""

    def fork(self) -> "DraftModelProposer":
        """The same draft model (weights shared), with a KV cache of its own."""
        return DraftModelProposer(self.draft.fork())

    def reset(self) -> None:
        self.draft.reset()
        self._fed = []
        self._stable = 0

    def propose(
        self, context: Sequence[int], k: int, params: "SamplingParams", generator: torch.Generator | None
    ) -> Draft:
        if self.draft.max_context:
            # The draft's cache ends up holding the context and k - 1 draft tokens; a draft with a
            # shorter context than the target's stops drafting instead of failing the request.
            k = min(k, self.draft.max_context - len(context) + 1)
        if k <= 0:
            return Draft([])
        keep = self._shared_prefix(context)
        # Always feed at least the pending token, whose logits give the first draft token.
        keep = min(keep, len(context) - 1)
        self.draft.crop(keep)
        logits = self.draft.forward(context[keep:], last_logits=1).logits[-1]  # [vocab]
        self._fed = list(context)
        self._stable = len(context)
        token_ids: list[int] = []
        rows: list[torch.Tensor] = []
        for step in range(k):
            token, q = draw(logits, params, generator)
            if q is not None:
                rows.append(q)
            token_ids.append(token)
            if step + 1 < k:  # the last draft token's logits are never needed
                logits = self.draft.forward([token]).logits[-1]
                self._fed.append(token)
        return Draft(token_ids, torch.stack(rows) if rows else None)

    def _shared_prefix(self, context: Sequence[int]) -> int:
        fed = self._fed
        limit = min(len(fed), len(context))
        i = min(self._stable, limit)
        while i < limit and fed[i] == context[i]:
            i += 1
        return i
