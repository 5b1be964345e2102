"""The integer products per packed format, at 1 and 3 rows of x: what a product waits on.

    .venv/bin/python bench/int8_formats.py [--repeats 15]

A 1536 x 1536 matrix of each GGUF type (random blocks), packed for the integer products, 30 copies
so that they do not stay in the caches (as a model's layers do not), `linear_blocks` timed over
all of them, the formats interleaved, median of the repeats, 2 threads. Q5_0, Q5_1 and Q6_K twice:
in 5 or 6 bits (R5_0, R5_M, R6_H: what a model gets) and in 8 (R8_0, R8_M, R8_H). Bytes per block of 32 weights beside
each, to read the times against. Not a test: a measurement for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from gguf_models import quantised  # noqa: E402  (the tests' writer of random GGUF blocks)

from specsure.models import float_kernel as float_kernels  # noqa: E402
from specsure.models import gguf_blocks  # noqa: E402

GGML = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q6_K": 14}
SIZE, COPIES = 1536, 30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(2)
    kernel, why = float_kernels.load()
    if kernel is None:
        sys.exit(f"no float32 kernel here: {why}")
    sets: dict[str, list[gguf_blocks.BlockMatrix]] = {}
    for name, ggml in GGML.items():
        matrix = gguf_blocks.repack(quantised(name, SIZE, SIZE), ggml, SIZE)
        assert matrix is not None
        copies = [gguf_blocks.BlockMatrix(matrix.data.clone(), matrix.format, SIZE, SIZE, name) for _ in range(COPIES)]
        sets[name] = [kernel.int8_pack(m) for m in copies]
        narrow = {packed for packed, _, _ in gguf_blocks.NARROW.values()}
        if sets[name][0].format in narrow:  # the same blocks in 8 bits, as before their narrow packing
            fits = float_kernels._fits
            float_kernels._fits = lambda matrix, low, high: False
            sets[f"{name} in 8 bits"] = [kernel.int8_pack(m) for m in copies]
            float_kernels._fits = fits
    medians: dict[tuple[str, int], float] = {}
    for rows in (1, 3):
        x = torch.randn(rows, SIZE)
        times: dict[str, list[float]] = {name: [] for name in sets}
        for _ in range(args.repeats):
            for name, matrices in sets.items():
                start = time.perf_counter()
                for m in matrices:
                    kernel.linear_blocks(m, x)
                times[name].append((time.perf_counter() - start) / COPIES * 1e6)
        medians.update({(name, rows): statistics.median(t) for name, t in times.items()})
    names = {value: key for key, value in vars(gguf_blocks).items() if key.startswith("R") and isinstance(value, int)}
    print(f"{'type':16} {'packed':7} {'bytes/32':>8} {'1 row (us)':>11} {'3 rows (us)':>12} {'GB/s at 1':>10}")
    for name, matrices in sets.items():
        data = matrices[0].data
        one, three = medians[name, 1], medians[name, 3]
        print(f"{name:16} {names[matrices[0].format]:7} {data.numel() / (SIZE * SIZE / 32):8.0f} {one:11.1f} "
              f"{three:12.1f} {data.numel() / one / 1e3:10.1f}")


if __name__ == "__main__":
    main()
