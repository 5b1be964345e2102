"""Goodness-of-fit helpers for the losslessness tests, and the exact distributions they test against (no scipy)."""

from __future__ import annotations

import math

import torch


def chi2_critical(df: int, z: float = 3.719) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile; z = 3.719 is the 1e-4 tail."""
    c = 2 / (9 * df)
    return df * (1 - c + z * math.sqrt(c)) ** 3


def chi2(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's statistic of ``counts`` against ``probs``, over the support of ``probs``."""
    support = probs > 0
    expected = counts.sum() * probs[support]
    return float(((counts[support] - expected) ** 2 / expected).sum())


def pooled(counts: torch.Tensor, probs: torch.Tensor, least: float = 5.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``counts`` and ``probs`` with every cell expected fewer than ``least`` times pooled into one,
    so that Pearson's statistic follows its chi-square law."""
    small = counts.sum() * probs < least
    return (torch.cat([counts[~small], counts[small].sum().reshape(1)]),
            torch.cat([probs[~small], probs[small].sum().reshape(1)]))


def tv(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Total variation distance between the empirical distribution of ``counts`` and ``probs``."""
    return 0.5 * float((counts / counts.sum() - probs).abs().sum())


def exact_second_token_distribution(path: str, prompt: list[int], temperature: float) -> torch.Tensor:
    """P(second output token) = sum over t1 of p(t1 | prompt) p(t2 | prompt, t1), by enumeration, for
    the float32 model at ``path`` sampled at ``temperature``."""
    from specsure import SamplingParams, make_engine

    return second_token_marginal(make_engine(path, None, dtype="float32").target.lm, prompt,
                                 SamplingParams(temperature=temperature))


def second_token_marginal(lm, prompt: list[int], params) -> torch.Tensor:  # noqa: ANN001
    """The exact distribution of the second output token under ``params``' transform (temperature,
    top-k, ...): the sum over each possible first token of p(first) p(second | first)."""
    from specsure.sampling import probs_from_logits

    lm.reset()
    p1 = probs_from_logits(lm.forward(prompt).logits[-1], params)
    p2 = torch.zeros_like(p1)
    for t1 in torch.nonzero(p1).flatten().tolist():
        lm.reset()
        p2 += p1[t1] * probs_from_logits(lm.forward([*prompt, t1]).logits[-1], params)
    return p2


def second_token_counts(engine, prompt: list[int], params, runs: int, vocab: int) -> torch.Tensor:  # noqa: ANN001
    """How often each token is the second output of ``engine`` over ``runs`` seeded generations
    (seeds 0 .. runs - 1) of ``params``' sampling."""
    import dataclasses

    counts = torch.zeros(vocab)
    for seed in range(runs):
        out = engine.generate([prompt], dataclasses.replace(params, seed=seed))
        counts[out[0].token_ids[1]] += 1
    return counts
