"""Goodness-of-fit helpers for the losslessness tests; written here because scipy is not a dependency."""

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


def tv(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Total variation distance between the empirical distribution of ``counts`` and ``probs``."""
    return 0.5 * float((counts / counts.sum() - probs).abs().sum())
