"""Soft labels over a draft vocabulary without the target's whole LM head at every step.

An EAGLE-3 head is trained against the target's softmax restricted to the draft vocabulary, and
that softmax's normaliser runs over the whole vocabulary. Recomputing it for every window was
about a third of a training step on the default model (a 49,152-row head against an 8,192-row
one). The normaliser of a position never changes, so it is computed once per sequence, the
first time a window of it is drawn; each step then needs only the draft vocabulary's rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from specsure.models.causal_lm import CausalLM
from specsure.train.data import Sample

_CHUNK = 256
"""Positions per LM-head call when a sequence's normalisers are computed (bounds the logits' memory)."""


def draft_vocabulary(samples: Sequence[Sample], vocab_size: int, size: int) -> torch.Tensor:
    """The ``size`` most frequent target ids in the training text (ties: the lower id), ascending."""
    size = min(size, vocab_size)
    counts = torch.zeros(vocab_size, dtype=torch.float64)
    for sample in samples:
        counts += torch.bincount(sample.token_ids, minlength=vocab_size).double()
    # Order by count, then by id, so unseen tokens fill the rest deterministically.
    rank = counts * (vocab_size + 1) - torch.arange(vocab_size, dtype=torch.float64)
    return rank.topk(size).indices.sort().values


class DraftLabels:
    """The target's probabilities over ``draft_ids`` at any position of the training sequences."""

    def __init__(self, lm: CausalLM, draft_ids: torch.Tensor) -> None:
        self.lm = lm
        self.draft_ids = draft_ids
        self._normalisers: dict[int, torch.Tensor] = {}  # id(sample) -> [n] float32 log-sum-exp

    @torch.no_grad()
    def probs(self, sample: Sample, first: int, end: int) -> torch.Tensor:
        """[end - first, draft_vocab] float32: the target's softmax at positions first .. end-1, draft ids only."""
        logits = self.lm.lm_head_logits(sample.hidden[first:end], rows=self.draft_ids)
        return torch.exp(logits - self._normaliser(sample)[first:end, None])

    def _normaliser(self, sample: Sample) -> torch.Tensor:
        key = id(sample)  # the samples live as long as the trainer that holds this object
        if key not in self._normalisers:
            hidden = sample.hidden
            self._normalisers[key] = torch.cat([torch.logsumexp(self.lm.lm_head_logits(hidden[i: i + _CHUNK]), dim=-1)
                                                for i in range(0, hidden.shape[0], _CHUNK)])
        return self._normalisers[key]


@dataclass(frozen=True)
class DraftVocab:
    """Training a head that shares the target's LM head over a draft vocabulary (MTP): the target's
    labels there and the head's logits over it."""

    ids: torch.Tensor
    """[Vd] ascending target ids."""
    labels: DraftLabels
    logits: Callable[[torch.Tensor], torch.Tensor]
    """Post-norm rows [n, H] -> float32 [n, Vd], differentiable (the LM head's rows, gathered once)."""

    @classmethod
    def of(cls, lm: CausalLM, ids: torch.Tensor) -> "DraftVocab":
        project = lm.draft_head(ids)
        return cls(ids, DraftLabels(lm, ids), lambda normed: project(normed.to(lm.dtype)))
