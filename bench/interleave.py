"""Greedy decoding with several engines, interleaved prompt by prompt in one process: what the bench
scripts here (auto_dtype.py, float_lanes.py, head_blocks.py) time. Not a test."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Hashable, Sequence

from specsure.decode.engine import Engine
from specsure.sampling import SamplingParams


@dataclass
class Timed:
    """Per engine: tokens/s over the prompts (new tokens over the sum of per-prompt medians), and the
    first repeat's tokens, accepted draft tokens and drafts; per prompt, each group's output."""

    rate: dict[Hashable, float] = field(default_factory=dict)
    tokens: dict[Hashable, int] = field(default_factory=dict)
    accepted: dict[Hashable, int] = field(default_factory=dict)
    drafts: dict[Hashable, int] = field(default_factory=dict)
    outputs: list[dict[str, list[int]]] = field(default_factory=list)
    """Per prompt, each reference group's output."""


def time_interleaved(runs: dict[Hashable, Engine], prompts: Sequence[list[int]], params: SamplingParams,
                     repeats: int, group: Callable[[Hashable], str]) -> Timed:
    """Run every engine on every prompt ``repeats`` times, engines interleaved; every output must equal
    the first output of its ``group`` (plain decoding in the same dtype or build), else SystemExit.
    Suffix's tree of earlier outputs is cleared before every pass, as `specsure bench` does, so no
    pass drafts from another."""
    for engine in runs.values():  # warm-up: kernels built, buffers sized
        engine.generate([prompts[0]], SamplingParams(max_tokens=16, temperature=0.0))
    seconds: dict[Hashable, list[list[float]]] = {key: [[] for _ in prompts] for key in runs}
    timed = Timed(tokens={key: 0 for key in runs}, accepted={key: 0 for key in runs}, drafts={key: 0 for key in runs})
    for i, ids in enumerate(prompts):
        reference: dict[str, list[int]] = {}
        for repeat in range(repeats):
            for key, engine in runs.items():
                if engine.proposer is not None:
                    engine.proposer.clear_history()
                start = time.perf_counter()
                out = engine.generate([ids], params)[0]
                seconds[key][i].append(time.perf_counter() - start)
                if list(out.token_ids) != reference.setdefault(group(key), list(out.token_ids)):
                    raise SystemExit(f"{key} differs from plain decoding ({group(key)}) on prompt {i}")
                if repeat == 0:
                    timed.tokens[key] += len(out.token_ids)
                    timed.accepted[key] += out.stats.accepted_tokens
                    timed.drafts[key] += out.stats.drafts
        timed.outputs.append(reference)
    timed.rate = {key: timed.tokens[key] / sum(statistics.median(s) for s in seconds[key]) for key in runs}
    return timed
