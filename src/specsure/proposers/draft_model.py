"""draft_model: a smaller causal LM with the target's vocabulary drafts autoregressively."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch

from specsure.models.causal_lm import Call
from specsure.proposers.base import Draft, DraftJob, Proposer
from specsure.sampling import draw

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

    def __init__(self, draft: "CausalLM", target_vocab: int | None = None) -> None:
        """``target_vocab``: the target's embedding rows, when the draft's differ only by padding
        (`specsure.config.vocabulary`): its logits are cut or padded to the target's rows."""
        self.draft = draft
        self.target_vocab = draft.vocab_size if target_vocab is None else target_vocab
        self._fed: list[int] = []
        self._stable = 0
        """Length of the context at the previous proposal; that prefix is committed and shared."""

    def fork(self) -> "DraftModelProposer":
        """The same draft model (weights shared), with a KV cache of its own."""
        return DraftModelProposer(self.draft.fork(), self.target_vocab)

    def reset(self) -> None:
        self.draft.reset()
        self._fed = []
        self._stable = 0

    def resume(self, shared: int) -> int:
        """The draft cache stays: the first proposal crops it to what the new context shares with it."""
        self._fed = list(self.draft.cached_ids)
        self._stable = 0
        return shared

    def propose(
        self, context: Sequence[int], k: int, params: "SamplingParams", generator: torch.Generator | None
    ) -> Draft:
        return DraftModelProposer.propose_batch([DraftJob(self, context, k, params, generator)])[0]

    @classmethod
    def propose_batch(cls, jobs: Sequence[DraftJob]) -> list[Draft]:
        """Draft for every job in lockstep: each of the k draft steps is one batched draft forward.

        Each job's draft is exactly what ``propose`` alone gives it: its own cache, its own draws.
        """
        drafts: list[Draft | None] = [None] * len(jobs)
        live: list[tuple[int, DraftJob, int]] = []  # (job index, job, its k)
        calls = []
        for i, job in enumerate(jobs):
            proposer, context = job.proposer, job.context
            assert isinstance(proposer, DraftModelProposer)
            k = job.k
            if proposer.draft.max_context:
                # The draft's cache ends up holding the context and k - 1 draft tokens; a draft with a
                # shorter context than the target's stops drafting instead of failing the request.
                k = min(k, proposer.draft.max_context - len(context) + 1)
            # Always feed at least the pending token, whose logits give the first draft token.
            keep = min(proposer._shared_prefix(context), len(context) - 1)
            if k > 0 and max(context[keep:]) >= proposer.draft.vocab_size:
                # The target chose one of its padding rows, which the draft has no embedding for:
                # the target goes on alone, exactly as without a draft.
                k = 0
            if k <= 0:
                drafts[i] = Draft([])
                continue
            proposer.draft.crop(keep)
            calls.append(Call(proposer.draft, context[keep:], last_logits=1))
            proposer._fed = list(context)
            proposer._stable = len(context)
            live.append((i, job, k))
        tokens: dict[int, list[int]] = {i: [] for i, _, _ in live}
        rows: dict[int, list[torch.Tensor]] = {i: [] for i, _, _ in live}
        step = 0
        while calls:
            outs = calls[0].lm.forward_batch(calls)
            calls, still = [], []
            for (i, job, k), out in zip(live, outs):
                token, q = draw(_fit(out.logits[-1], job.proposer.target_vocab), job.params, job.generator)
                if q is not None:
                    rows[i].append(q)
                tokens[i].append(token)
                if step + 1 < k:  # the last draft token's logits are never needed
                    calls.append(Call(job.proposer.draft, [token]))
                    job.proposer._fed.append(token)
                    still.append((i, job, k))
            live, step = still, step + 1
        for i in tokens:
            drafts[i] = Draft(tokens[i], torch.stack(rows[i]) if rows[i] else None)
        return drafts  # type: ignore[return-value]

    def _shared_prefix(self, context: Sequence[int]) -> int:
        fed = self._fed
        limit = min(len(fed), len(context))
        i = min(self._stable, limit)
        while i < limit and fed[i] == context[i]:
            i += 1
        return i


def _fit(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    """Draft logits ``[V_draft]`` over the target's ``vocab`` rows: padding rows the target lacks are
    cut, rows the draft lacks are -inf (never drafted, q = 0 there, as the verifier needs)."""
    size = logits.shape[-1]
    if size == vocab:
        return logits
    if size > vocab:
        return logits[:vocab]
    return torch.nn.functional.pad(logits, (0, vocab - size), value=float("-inf"))
