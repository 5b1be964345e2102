"""One float32 forward of the default model at 1 to 16 new rows, on torch ops (the products as
`products.project` does them without the C kernel) and on the float32 C kernel (float_kernel.c),
interleaved.

    .venv/bin/python bench/few_rows_fp32.py [--repeats 12]

Each figure is the median over the repeats of one forward at ~200 cached tokens, rolled back
after each, on 2 threads. Not a test: the measurement behind BENCHMARKS.md's "An AVX2 CPU in
float32" (it matters where float32 runs, the default on CPUs without fast bf16).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specsure.models import float_kernel as float_kernels
from specsure.models.loading import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=12)
    args = parser.parse_args()
    torch.set_num_threads(2)
    lm = load_model(None, dtype="float32").lm
    print(lm.path)
    decoder = lm._native
    kernel, why = float_kernels.load()
    if decoder is None or kernel is None:
        raise SystemExit(f"no float32 C kernel here: {why}")
    lm.forward(list(range(100, 300)), last_logits=1)
    cached = lm.cache_len
    ways = {"torch ops": (None, "off for the comparison"), "C kernel": (kernel, why)}
    rows_tried = (1, 2, 3, 4, 5, 6, 8, 10, 13, 16)
    times: dict[tuple[str, int], list[float]] = {(w, r): [] for w in ways for r in rows_tried}
    try:
        for _ in range(args.repeats):
            for (way, rows), samples in times.items():
                float_kernels._loaded = ways[way]  # `products.project` asks for it on every product
                decoder.float_kernel = ways[way][0]
                started = time.perf_counter()
                lm.forward([5] * rows)
                samples.append(time.perf_counter() - started)
                lm.crop(cached)
    finally:
        float_kernels._loaded, decoder.float_kernel = (kernel, why), kernel
    for (way, rows), samples in times.items():
        print(f"{way:>9}  {rows:2d} rows  {statistics.median(samples) * 1000:6.1f} ms")


if __name__ == "__main__":
    main()
