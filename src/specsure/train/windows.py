"""Which self-distilled sequences train and which are held out, and the windows a training step draws.

Both head trainers (MTP and EAGLE-3) share them, so a head of either kind sees the same split of
the same data and its windows start at the same places.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from specsure.train.data import Sample


def split(samples: Sequence[Sample], fraction: float, seed: int) -> tuple[list[Sample], list[Sample]]:
    """(train, held out): a seeded shuffle, then the last ceil(fraction * n) held out (none when n < 2)."""
    order = torch.randperm(len(samples), generator=torch.Generator().manual_seed(seed)).tolist()
    held = 0 if len(samples) < 2 or fraction == 0 else min(max(1, math.ceil(fraction * len(samples))), len(samples) - 1)
    shuffled = [samples[i] for i in order]
    return shuffled[: len(samples) - held], shuffled[len(samples) - held:]


def answer_start(sample: Sample) -> int:
    """The first anchor whose draft is an answer token: entry t predicts token t + 2, and the
    target itself gives token ``prompt_len``, so anchors from ``prompt_len - 2`` on are the ones
    the engine drafts from (the anchors evaluation counts)."""
    return max(sample.prompt_len - 2, 0)


def draw_window(train: Sequence[Sample], seq_len: int, gen: torch.Generator,
                answer_only: bool = False) -> tuple[Sample, int, int, int]:
    """A random training sequence and a random window of at most ``seq_len`` of its entries:
    (sample, start, width, scored_from), the window's first ``scored_from`` entries context only.

    With ``answer_only`` the window holds at least one answer anchor (`answer_start`), so no step
    is spent on a window with nothing to score, and the prompt's anchors are context; otherwise
    every entry is scored.
    """
    sample = train[int(torch.randint(len(train), (1,), generator=gen))]
    entries = sample.token_ids.shape[0] - 1
    width = min(seq_len, entries)
    low = min(max(answer_start(sample) + 1 - width, 0), entries - width) if answer_only else 0
    start = low + int(torch.randint(entries - width - low + 1, (1,), generator=gen))
    return sample, start, width, max(answer_start(sample) - start, 0) if answer_only else 0
