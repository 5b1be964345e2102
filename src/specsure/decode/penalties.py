"""vLLM's presence, frequency and repetition penalties on the target's logits, for every row a
verification step scores.

A verify forward scores k + 1 rows (a tree, one per node), and row i chooses the token after the
draft tokens on its path, so its penalties count those tokens as if already generated: the row
is then exactly the logits plain decoding would penalise at that point, and acceptance stays
lossless against the penalised target. The draft's own q stays unpenalised; a q that differs
from p only costs acceptance, never exactness.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specsure.sampling import SamplingParams


def penalised(params: SamplingParams) -> bool:
    """Whether ``params`` asks for any penalty."""
    return params.presence_penalty != 0 or params.frequency_penalty != 0 or params.repetition_penalty != 1


class Penalties:
    """One request's token counts, and the penalties they give its target's rows."""

    def __init__(self, params: SamplingParams, prompt: Sequence[int], vocab: int) -> None:
        self.params = params
        self.vocab = vocab
        self.in_prompt = torch.zeros(vocab, dtype=torch.bool)  # [vocab]
        self.in_prompt[torch.tensor([t for t in prompt if t < vocab], dtype=torch.long)] = True
        self.counts = torch.zeros(vocab)  # [vocab] float32: output tokens so far

    def add(self, tokens: Sequence[int]) -> None:
        """Count newly committed output tokens."""
        for token in tokens:
            if token < self.vocab:
                self.counts[token] += 1

    def apply(self, logits: torch.Tensor, paths: Sequence[Sequence[int]]) -> torch.Tensor:
        """``logits`` [n, vocab] penalised row by row; row i has the output plus ``paths[i]`` behind it.

        vLLM's order and formulas: repetition (logits over 0 divided by it, the rest multiplied,
        for tokens in the prompt or the output), then frequency (times the count) and presence
        (once per token present) subtracted.
        """
        params = self.params
        counts = self.counts.expand(len(paths), -1).clone()  # [n, vocab]
        for row, path in enumerate(paths):
            for token in path:
                if token < self.vocab:
                    counts[row, token] += 1
        logits = logits.float().clone()
        if params.repetition_penalty != 1:
            seen = self.in_prompt | (counts > 0)  # [n, vocab]
            scaled = torch.where(logits > 0, logits / params.repetition_penalty, logits * params.repetition_penalty)
            logits = torch.where(seen, scaled, logits)
        logits -= params.frequency_penalty * counts
        logits -= params.presence_penalty * (counts > 0).float()
        return logits
