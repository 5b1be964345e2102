"""A draft step of the shipped heads, as a fraction of the target's one-row decode step.

For each head, read as Q8_0 blocks and as float32 (proposers/head_blocks.py): the median over
``--repeats`` of the target's one-row forward at ~200 cached tokens and of the head's proposal
after it. A head's "k = 1" is one proposal after one new observed position (what a step with
nothing accepted costs it), "k = 3" a chain of three. Not a test: a measurement for BENCHMARKS.md.

    .venv/bin/python bench/head_step_times.py --repeats 20
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from specsure.decode.engine import make_engine
from specsure.proposers.head_blocks import ENV
from specsure.sampling import SamplingParams


def proposal_times(method: str, blocks: bool, repeats: int) -> tuple[float, dict[int, float]]:
    """(the target's one-row forward, {k: one proposal of k tokens}) in seconds."""
    os.environ[ENV] = "1" if blocks else "0"
    engine = make_engine(None, {"method": method, "num_speculative_tokens": 3})
    os.environ.pop(ENV)
    lm, proposer = engine.target.lm, engine.proposer
    proposer.use_tree(None)
    context = list(range(100, 301))
    extra = {"hidden": proposer.needs_hidden, "aux_layers": tuple(proposer.aux_layers)}
    greedy = SamplingParams(temperature=0.0)
    target: list[float] = []
    heads: dict[int, list[float]] = {1: [], 3: []}
    for _ in range(repeats):
        for k, samples in heads.items():
            proposer.reset()
            lm.crop(0)
            out = lm.forward(context[:199], **extra)
            proposer.observe(context[:199], 0, out)
            proposer.propose(context[:200], 1, greedy, None)
            started = time.perf_counter()
            out = lm.forward(context[199:200], **extra)
            target.append(time.perf_counter() - started)
            proposer.observe(context[199:200], 199, out)
            started = time.perf_counter()
            proposer.propose(context, k, greedy, None)
            samples.append(time.perf_counter() - started)
    return statistics.median(target), {k: statistics.median(v) for k, v in heads.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(2)
    print("| head | weights | target step | k = 1 | k = 3 |")
    print("|---|---|---|---|---|")
    for method in ("mtp", "eagle3"):
        for blocks in (True, False):
            step, heads = proposal_times(method, blocks, args.repeats)
            cells = " | ".join(f"{heads[k] * 1e3:.2f} ms ({heads[k] / step:.2f})" for k in (1, 3))
            print(f"| {method} | {'Q8_0' if blocks else 'float32'} | {step * 1e3:.2f} ms | {cells} |")


if __name__ == "__main__":
    main()
