"""One forward of 1 and 4 new rows after a long prefill (default 1,900 tokens) of the default model:
the cost of attention over a long KV cache. To compare two checkouts, run it alternately with each
one's sources first on the path:

    .venv/bin/python bench/long_context.py [--cached 1900] [--repeats 11]
    PYTHONPATH=/path/to/other/checkout/src .venv/bin/python bench/long_context.py

Figures are medians over the repeats on 2 threads. Not a test: the measurement behind
BENCHMARKS.md's "Long contexts".
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import specsure
from specsure.models.loading import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cached", type=int, default=1900)
    parser.add_argument("--repeats", type=int, default=11)
    args = parser.parse_args()
    torch.set_num_threads(2)
    lm = load_model(None, dtype="float32").lm
    print(f"specsure from {specsure.__file__}; forward: {lm.path}")
    lm.forward([(i * 37) % 30000 + 100 for i in range(args.cached)], last_logits=1)
    cached = lm.cache_len
    for rows in (1, 4):
        samples = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            lm.forward([5] * rows)
            samples.append(time.perf_counter() - started)
            lm.crop(cached)
        print(f"{rows} rows at {cached} cached tokens: {statistics.median(samples) * 1000:.2f} ms")


if __name__ == "__main__":
    main()
