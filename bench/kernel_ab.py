"""Two builds of a C kernel, A/B: forward times at 1 to 9 new rows, and whether their logits agree bit for bit.

    git show HEAD~1:src/specsure/models/decode_kernel.c > /tmp/old_kernel.c
    .venv/bin/python bench/kernel_ab.py /tmp/old_kernel.c [--cached 200,800] [--repeats 15]
    .venv/bin/python bench/kernel_ab.py /tmp/old_float_kernel.c --float   # float_kernel.c, the model in float32

A is the given source, B the checked-out one. For each cached length the default model's cache
is filled with that many tokens, then each forward runs on A and on B in turn (rolled back
after each), repeats times; the figures are medians in ms, bf16 (float32 with --float) on 2
threads. Not a test: a measurement for BENCHMARKS.md. A change that sums in another order (the
float32 attention of 2026-12-06) reads NO under "logits equal"; one meant to keep every bit must
read yes.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import time
from pathlib import Path

import torch

from specsure.config.dtype_choice import c_compiler
from specsure.models import float_kernel as float_kernels
from specsure.models import kernel as kernels
from specsure.models.loading import load_model

ROWS = (1, 3, 6, 9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path,
                        help="build A's source: a decode_kernel.c, or a float_kernel.c with --float")
    parser.add_argument("--cached", default="200,800", help="comma-separated cache lengths")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--float", action="store_true",
                        help="the float32 kernel (float_kernel.c), the model in float32")
    args = parser.parse_args()
    module = float_kernels if args.float else kernels
    torch.set_num_threads(2)
    cc = c_compiler()
    if cc is None:
        raise SystemExit("no C compiler on PATH")
    if args.float:  # both as the widest build this CPU allows (AMX tiles, AVX-512 lanes), the one the model packed for
        build, flags = float_kernels.builds()[0]
        open_build = lambda library: float_kernels.started(build, float_kernels._bind(library))  # noqa: E731
    else:
        flags, open_build = kernels.FLAGS, kernels._bind
    builds = {name: open_build(ctypes.CDLL(str(kernels.build_library(cc, source, flags, f"ab-{name}"))))
              for name, source in (("A", args.source), ("B", module.SOURCE))}
    lm = load_model(None, dtype="float32" if args.float else "auto").lm
    native = lm._native
    slot = "float_kernel" if args.float else "kernel"
    print("| cached | rows | A (ms) | B (ms) | B / A | logits equal |\n|---|---|---|---|---|---|")
    for cached in (int(n) for n in args.cached.split(",")):
        lm.crop(0)
        lm.forward(list(range(100, 100 + cached)), last_logits=1)
        times: dict[tuple[str, int], list[float]] = {(name, rows): [] for name in builds for rows in ROWS}
        equal = dict.fromkeys(ROWS, True)
        for _ in range(args.repeats):
            for rows in ROWS:
                logits = []
                for name, build in builds.items():
                    setattr(native, slot, build)
                    start = time.perf_counter()
                    logits.append(lm.forward([5 + i for i in range(rows)]).logits)
                    times[(name, rows)].append(time.perf_counter() - start)
                    lm.crop(cached)
                equal[rows] &= torch.equal(logits[0], logits[1])
        for rows in ROWS:
            a, b = (statistics.median(times[(name, rows)]) * 1e3 for name in builds)
            print(f"| {cached} | {rows} | {a:.2f} | {b:.2f} | {b / a:.3f} | {'yes' if equal[rows] else 'NO'} |")


if __name__ == "__main__":
    main()
