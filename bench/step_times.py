"""One target forward of the default model at 1 to 17 new rows, on torch ops and on the C kernel, interleaved.

    .venv/bin/python bench/step_times.py [--repeats 30]

torch: the native forward on torch ops (the C kernel detached); kernel: the default (the C
kernel, its products on AMX tiles where Linux grants them, else on AVX512-BF16 dot-product tiles).
Each figure is the median over the repeats of one forward at ~200 cached tokens, rolled back
after each, in bf16 on 2 threads. Not a test: a measurement for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specsure.models.loading import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(2)
    lm = load_model(None).lm
    native = lm._native
    print(lm.path)
    lm.forward(list(range(100, 300)), last_logits=1)
    cached = lm.cache_len
    kernel = native.kernel
    modes = {"torch": None, "kernel": kernel}
    counts = (1, 2, 3, 4, 6, 9, 17)
    times: dict[tuple[str, int], list[float]] = {(m, r): [] for m in modes for r in counts}
    for _ in range(args.repeats):
        for (mode, rows), samples in times.items():
            native.kernel = modes[mode]
            started = time.perf_counter()
            lm.forward([5] * rows)
            samples.append(time.perf_counter() - started)
            lm.crop(cached)
    native.kernel = kernel
    print("| forward | " + " | ".join(modes) + " |")
    print("|---|" + "---|" * len(modes))
    for rows in counts:
        cells = [f"{statistics.median(times[(m, rows)]) * 1e3:.1f} ms" for m in modes]
        print(f"| {rows} row{'s' if rows > 1 else ''} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
