"""The old home of the sampling layer, kept so ``specsure.decode.sampling`` imports keep working.

Sampling sits below both the proposers and the decode loop, so it lives in ``specsure.sampling``;
every public name of it is here too.
"""

from specsure.sampling import (
    MAX_BIAS, MAX_LOGPROBS, MAX_STOP_CHARS, MAX_STOP_STRINGS, MIN_TEMPERATURE, SEED_FLOOR, SEED_LIMIT,
    VLLM_ONLY_FIELDS, SamplingError, SamplingParams, argmax_ids, draw, generator_seed, probs_from_logits, sample,
)

__all__ = ["MAX_BIAS", "MAX_LOGPROBS", "MAX_STOP_CHARS", "MAX_STOP_STRINGS", "MIN_TEMPERATURE", "SEED_FLOOR",
           "SEED_LIMIT", "VLLM_ONLY_FIELDS", "SamplingError", "SamplingParams", "argmax_ids", "draw", "generator_seed",
           "probs_from_logits", "sample"]
