"""What both trainers take: the optimiser's schedule, the windows, the held-out split and the arithmetic.

`Eagle3TrainSettings` and `MTPTrainSettings` add what is their own (the unrolled steps, the draft
vocabulary, the modules); the checks of the shared fields are written once, here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from specsure.train.loop import TRAIN_DTYPES


@dataclass(frozen=True, kw_only=True)
class TrainSettings:
    """How a head is distilled, the fields every trainer has."""

    steps: int = 300
    """Optimiser steps; each step is one window of one training sequence."""
    lr: float = 2e-3
    """Peak AdamW learning rate (linear warm-up, then cosine decay to a tenth)."""
    seq_len: int = 256
    """Longest window of entries per step; longer sequences give a random window."""
    seed: int = 0
    """Seeds the held-out split and the order of windows."""
    heldout_fraction: float = 0.1
    """Share of the sequences kept out of training to measure the head (at least one)."""
    answer_only: bool = False
    """Score only entries in the answer (`answer_start`); the prompt stays in the window as context."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """The forward's arithmetic: ``float32``, or ``bfloat16`` under autocast (the weights and the
    optimiser stay float32; `specsure.train.loop.autocast`), a cheaper step on CPUs with bfloat16
    matrix units."""

    def __post_init__(self) -> None:
        if self.dtype not in TRAIN_DTYPES:
            raise ValueError(f"dtype = {self.dtype!r}: must be one of {', '.join(TRAIN_DTYPES)}.")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps <= 0:
            raise ValueError(f"steps = {self.steps!r}: training needs a positive number of steps, e.g. 300.")
        if not (isinstance(self.lr, (int, float)) and not isinstance(self.lr, bool) and math.isfinite(self.lr)
                and self.lr > 0):
            raise ValueError(f"lr = {self.lr!r}: the learning rate must be a positive number, e.g. 1e-3.")
        if isinstance(self.seq_len, bool) or not isinstance(self.seq_len, int) or self.seq_len < 2:
            raise ValueError(f"seq_len = {self.seq_len!r}: a window needs at least 2 tokens, e.g. 256.")
        if isinstance(self.heldout_fraction, bool) or not isinstance(self.heldout_fraction, (int, float)) \
                or not 0 <= self.heldout_fraction < 1:
            raise ValueError(f"heldout_fraction = {self.heldout_fraction!r}: must lie in [0, 1), e.g. 0.1.")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**64:
            raise ValueError(f"seed = {self.seed!r}: must be an integer in [0, 2**64) (torch's generator), e.g. 0.")
        if not isinstance(self.answer_only, bool):
            raise ValueError(f"answer_only = {self.answer_only!r}: must be True or False.")


def check_int(name: str, value: object, low: int, high: int, hint: str = "") -> None:
    """A trainer's own integer setting in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} = {value!r}: must be an integer from {low} to {high}{hint}.")
