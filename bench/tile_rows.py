"""The default model's gate_up matrices (Q4_1 on AMX tiles, A4) over 1 to 6 rows of x: the tile passes alone.

    .venv/bin/python bench/tile_rows.py [--repeats 30]

Each figure is the median over the repeats of one product over each of the 30 layers' gate_up
matrices (3072 x 576), divided by 30, on 2 threads. Needs the AMX build. Not a test: a
measurement for the comments in float_kernel.c and BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specsure.models.gguf_blocks import A4
from specsure.models.loading import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(2)
    native = load_model(None).lm._native
    matrices = [m for m in native._blocks if m.format == A4 and (m.rows, m.cols) == (3072, 576)]
    if not matrices:
        raise SystemExit("no gate_up matrix on AMX tiles here (no AMX build, or Linux refused the tiles)")
    kernel = native.float_kernel
    x = torch.randn(6, 576)
    with torch.inference_mode():
        for rows in range(1, 7):
            part = x[:rows].contiguous()
            times = []
            for _ in range(args.repeats):
                started = time.perf_counter()
                for matrix in matrices:
                    kernel.linear_blocks(matrix, part)
                times.append((time.perf_counter() - started) / len(matrices))
            print(f"{rows} row{'s' * (rows > 1)}: {statistics.median(times) * 1e6:.1f} us")


if __name__ == "__main__":
    main()
