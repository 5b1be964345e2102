"""Sampling: the parameters a request gives (`params`) and the one transform from logits to the
distribution a token is drawn from (`probs`), which the target's p and the draft's q share."""

from specsure.sampling.params import (
    MAX_BIAS, MAX_LOGPROBS, MAX_STOP_CHARS, MAX_STOP_STRINGS, MIN_TEMPERATURE, SEED_FLOOR, SEED_LIMIT,
    VLLM_ONLY_FIELDS, SamplingError, SamplingParams, generator_seed,
)
from specsure.sampling.probs import argmax_ids, draw, probs_from_logits, sample

__all__ = ["MAX_BIAS", "MAX_LOGPROBS", "MAX_STOP_CHARS", "MAX_STOP_STRINGS", "MIN_TEMPERATURE", "SEED_FLOOR",
           "SEED_LIMIT", "VLLM_ONLY_FIELDS", "SamplingError", "SamplingParams", "argmax_ids", "draw", "generator_seed",
           "probs_from_logits", "sample"]
