"""How long a running request waits while a long prompt joins the batch, with and without chunked prefill.

    .venv/bin/python bench/prefill_stall.py [--prompt-tokens 3000] [--rounds 3]

On the default model, plain decoding, the engine's own scheduler (no HTTP): one request decodes;
after 8 of its steps a prompt of ``--prompt-tokens`` tokens arrives. Reported per
max_num_batched_tokens (256, 512 and none: the prompt at once), interleaved over rounds: the
running request's longest wait between two of its updates (the median over rounds), and the
seconds from the long prompt's arrival to its first token. Then the same prompt alone, its first
token's time. Not a test: a measurement for BENCHMARKS.md and docs/serving.md.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specsure.decode.engine import make_engine
from specsure.sampling import SamplingParams

CHUNKS = (256, 512, None)


def stall(engine, long_prompt: list[int]) -> tuple[float, float]:
    """(longest gap between the running request's updates, the long prompt's time to first token)."""
    scheduler = engine.scheduler
    running = engine.request(list(range(300, 340)), SamplingParams(max_tokens=10_000, ignore_eos=True))
    scheduler.add(running)
    for _ in range(8):
        scheduler.step()
    joining = engine.request(long_prompt, SamplingParams(max_tokens=1, ignore_eos=True))
    scheduler.add(joining)
    arrived = last = time.perf_counter()
    gap, first_token = 0.0, None
    while first_token is None or gap == 0.0:
        updates = dict((id(r), u) for r, u in scheduler.step())
        now = time.perf_counter()
        if id(running) in updates:
            gap, last = max(gap, now - last), now
        if id(joining) in updates and first_token is None:
            first_token = now - arrived
    scheduler.abort(running)
    return gap, first_token


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-tokens", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(2)
    engine = make_engine(None, None)
    long_prompt = [(i * 37) % 20000 + 100 for i in range(args.prompt_tokens)]
    gaps: dict[int | None, list[float]] = {c: [] for c in CHUNKS}
    firsts: dict[int | None, list[float]] = {c: [] for c in CHUNKS}
    alone: dict[int | None, list[float]] = {c: [] for c in CHUNKS}
    for _ in range(args.rounds):
        for chunk in CHUNKS:
            engine.scheduler.max_num_batched_tokens = chunk
            gap, first = stall(engine, long_prompt)
            gaps[chunk].append(gap)
            firsts[chunk].append(first)
            started = time.perf_counter()
            engine.generate(long_prompt, SamplingParams(max_tokens=1))
            alone[chunk].append(time.perf_counter() - started)
    print(f"| max_num_batched_tokens | longest wait of the running request (s) | long prompt's first token, "
          f"running beside it (s) | alone (s) |\n|---|---|---|---|")
    for chunk in CHUNKS:
        print(f"| {chunk or 'none (at once)'} | {statistics.median(gaps[chunk]):.2f} | "
              f"{statistics.median(firsts[chunk]):.2f} | {statistics.median(alone[chunk]):.2f} |")


if __name__ == "__main__":
    main()
