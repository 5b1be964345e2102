"""The one interface every proposer implements.

The engine owns the target model and the verification; a proposer only drafts. Each step the
engine calls ``propose`` with the whole context (prompt, committed output, and the *pending*
token: the last output token, which the target has not yet run), then verifies the draft in one
target forward. After every target forward it calls ``observe`` with the tokens that forward
committed to the target's KV cache and the target's features for them, so feature-level heads
(EAGLE, MTP) can condition on real hidden states. Rejected positions are never observed.
"""

from __future__ import annotations

import copy
import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Sequence

import torch

if TYPE_CHECKING:
    from specsure.sampling import SamplingParams
    from specsure.models.causal_lm import ForwardOutput

logger = logging.getLogger(__name__)

@dataclass(frozen=True)
class Draft:
    """Draft tokens for the next verification step."""

    token_ids: list[int]
    """Proposed continuation of the context, at most k ids in the *target* vocabulary."""
    probs: torch.Tensor | None = None
    """q: the draft distribution each token was sampled from, ``[len(token_ids), target_vocab]``,
    after the same temperature/top-k/top-p transform as the target. None means a point mass on
    each draft token (q = 1), as for ngram and for greedy drafting."""
    parents: list[int] | None = None
    """A token tree instead of a chain: ``parents[i]`` indexes ``[pending] + token_ids`` (0 is the
    pending token) and precedes i. Trees carry point-mass drafts only (``probs`` None); their
    depth is at most k. None: a chain, each token after the one before."""


@dataclass(frozen=True)
class DraftJob:
    """One sequence's drafting for this step, as ``Proposer.propose_batch`` takes it."""

    proposer: "Proposer"
    context: Sequence[int]
    k: int
    params: "SamplingParams"
    generator: torch.Generator | None


def propose_all(jobs: Sequence[DraftJob | None]) -> list[Draft | Exception]:
    """Every sequence's draft for one step; a proposer class that can batch its drafting does (draft_model).

    A proposer that raises fails only the sequences it drafts for: their entry is the exception,
    which the scheduler turns into that request's error. Sequences drafted one by one fail alone;
    a batched draft forward fails every sequence in it.
    """
    drafts: list[Draft | Exception] = [Draft([])] * len(jobs)
    groups: dict[type, list[int]] = {}
    for i, job in enumerate(jobs):
        if job is not None:
            groups.setdefault(type(job.proposer), []).append(i)
    for kind, indices in groups.items():
        batched = kind.propose_batch.__func__ is not Proposer.propose_batch.__func__  # type: ignore[attr-defined]
        for part in ([indices] if batched else [[i] for i in indices]):
            try:
                made: list[Draft | Exception] = list(kind.propose_batch([jobs[i] for i in part]))  # type: ignore[misc]
            except Exception as exc:  # a bug in a drafter; the scheduler raises it for these requests
                logger.exception("drafting failed for %d sequence(s); the step's other sequences go on", len(part))
                made = [exc] * len(part)
            for i, draft in zip(part, made):
                drafts[i] = draft
    return drafts


class Proposer(ABC):
    """Drafts up to k tokens per step. One instance serves one sequence at a time; ``fork`` makes
    another instance for a sequence that runs at the same time."""

    method: ClassVar[str]
    """The speculative method this proposer implements; the engine checks it against the
    Resolution and refuses to start on a mismatch."""

    needs_hidden: ClassVar[bool] = False
    """True when ``observe`` needs the target's last hidden state (EAGLE-1, MTP)."""

    aux_layers: tuple[int, ...] = ()
    """Target layers whose residual-stream inputs ``observe`` needs (EAGLE-3)."""

    def reset(self) -> None:
        """Forget the previous sequence; called before each prompt."""

    @property
    def reads_features(self) -> bool:
        """``observe`` reads the target's features (EAGLE, EAGLE-3, MTP), not only token ids."""
        return self.needs_hidden or bool(self.aux_layers)

    def resume(self, shared: int) -> int:
        """Start a new sequence under prefix caching, whose first ``shared`` positions the target's
        cache holds (the slot's last sequence had them too); return how many of them this proposer
        keeps, at most ``shared``: the target computes again from there. A proposer that reads only
        token ids keeps them all (draft_model keeps its own cache's share too); the default resets."""
        self.reset()
        return shared

    def fork(self) -> "Proposer":
        """A proposer for another sequence decoded alongside this one's.

        It shares what is not per-sequence (weights, suffix's global tree) and has its own
        per-sequence state (caches, positions), empty. This default suits proposers whose
        per-sequence state ``reset`` rebuilds from scratch.
        """
        twin = copy.copy(self)
        twin.reset()
        return twin

    def retire(self) -> None:
        """The sequence ended: keep what it teaches later requests (suffix's global tree); a no-op for the rest."""

    def clear_history(self) -> None:
        """Forget what earlier requests taught this proposer (suffix's global tree); a no-op for the rest.

        The benchmark calls it before each timed pass, so a prompt never drafts from its own earlier run.
        """

    def observe(self, token_ids: Sequence[int], start: int, out: "ForwardOutput") -> None:
        """The target committed ``token_ids`` at positions ``start .. start+len-1``.

        ``out`` holds the target's logits and requested features for exactly those positions.
        """

    @classmethod
    def propose_batch(cls, jobs: Sequence[DraftJob]) -> list[Draft]:
        """Drafts for several sequences (each job names its own proposer of this class); one by one by default."""
        return [job.proposer.propose(job.context, job.k, job.params, job.generator) for job in jobs]

    @abstractmethod
    def propose(
        self, context: Sequence[int], k: int, params: "SamplingParams", generator: torch.Generator | None
    ) -> Draft:
        """Draft up to ``k`` tokens that continue ``context`` (its last id is the pending token)."""
