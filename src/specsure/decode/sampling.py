"""The old home of the sampling layer, kept so ``specsure.decode.sampling`` imports keep working.

Sampling sits below both the proposers and the decode loop, so it lives in ``specsure.sampling``.
"""

from specsure.sampling import MIN_TEMPERATURE, SamplingParams, draw, probs_from_logits, sample

__all__ = ["MIN_TEMPERATURE", "SamplingParams", "draw", "probs_from_logits", "sample"]
