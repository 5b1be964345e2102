"""One float32 forward of the default model at 1 to 16 new rows, with the few-row products three
ways, interleaved: F.linear (before ea38d1e), weight @ x.T over the rows as they come (ea38d1e),
and as `native.project` does them now (row-major in and out, some row counts padded).

    .venv/bin/python bench/few_rows_fp32.py [--repeats 12]

Each figure is the median over the repeats of one forward at ~200 cached tokens, rolled back
after each, on 2 threads. Not a test: the measurement behind BENCHMARKS.md's "An AVX2 CPU in
float32" (it matters where float32 runs on torch ops, the default on CPUs without fast bf16).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import specsure.models.causal_lm as causal_lm
import specsure.models.native as native
from specsure.models.loading import load_model


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The product before: torch.mv for one row, F.linear for more."""
    if x.shape[0] != 1:
        return F.linear(x, weight, bias)
    out = torch.mv(weight, x[0]).unsqueeze(0)
    return out if bias is None else out + bias


def transposed(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The product of ea38d1e: torch.mv for one row, weight @ x.T on whatever layout x has."""
    if x.shape[0] == 1:
        out = torch.mv(weight, x[0]).unsqueeze(0)
    elif x.shape[0] <= native.KERNEL_ROWS:
        out = torch.mm(weight, x.t()).t()
    else:
        return F.linear(x, weight, bias)
    return out if bias is None else out + bias


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=12)
    args = parser.parse_args()
    torch.set_num_threads(2)
    lm = load_model(None, dtype="float32").lm
    print(lm.path)
    lm.forward(list(range(100, 300)), last_logits=1)
    cached = lm.cache_len
    ways = {"F.linear": linear, "weight @ x.T": transposed, "row-major": native.project}
    rows_tried = (1, 2, 3, 4, 5, 7, 8, 9, 13, 16)
    times: dict[tuple[str, int], list[float]] = {(w, r): [] for w in ways for r in rows_tried}
    try:
        for _ in range(args.repeats):
            for (way, rows), samples in times.items():
                native.project = causal_lm.project = ways[way]  # both modules call it by this name
                started = time.perf_counter()
                lm.forward([5] * rows)
                samples.append(time.perf_counter() - started)
                lm.crop(cached)
    finally:
        native.project = causal_lm.project = ways["row-major"]
    for (way, rows), samples in times.items():
        print(f"{way:>13}  {rows:2d} rows  {statistics.median(samples) * 1000:6.1f} ms")


if __name__ == "__main__":
    main()
