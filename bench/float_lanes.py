"""The float32 kernel's AVX-512 products against its AVX2 ones on an AVX-512 CPU, interleaved in one
process: forwards of the default model over 1 to 16 rows, then greedy decoding with each method
(every output checked against plain decoding on the same build; the two builds sum in another
order, so their outputs are compared with each other for information only).

    .venv/bin/python bench/float_lanes.py --out bench/amx-float-lanes/quick.md [--per-category 2] [--repeats 2]

Not a test: the measurement behind BENCHMARKS.md's "AVX-512 products in the float32 kernel".
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

from interleave import time_interleaved
from specsure.bench.workload import encode, load_builtin, select
from specsure.config.cpu import cpu_model
from specsure.decode.engine import Engine, make_engine
from specsure.models import float_kernel as float_kernels
from specsure.sampling import SamplingParams

METHODS = ("plain", "ngram", "suffix", "mtp", "eagle3")
BUILDS = ("AVX-512", "AVX2")


def engines(methods: list[str]) -> dict[tuple[str, str], Engine]:
    """Each method on each build; a build is chosen by what `float_kernels.load` hands the model."""
    if not float_kernels.wide():
        raise SystemExit("this CPU has no avx512f (or SPECSURE_FLOAT_LANES=8): nothing to compare")
    runs = {}
    for build in BUILDS:
        if build == "AVX2":
            os.environ[float_kernels.LANES_ENV] = "8"
            float_kernels._loaded = float_kernels._load()
        for method in methods:
            runs[(method, build)] = make_engine(None, None if method == "plain" else {"method": method}, dtype="float32")
        assert float_kernels.load()[1].startswith(f"{build} products"), float_kernels.load()[1]
    os.environ.pop(float_kernels.LANES_ENV)
    return runs


def forward_times(runs: dict[tuple[str, str], Engine], repeats: int) -> list[str]:
    """Median one-forward times at ~200 cached tokens, builds interleaved."""
    lines = ["| new rows | " + " | ".join(f"{b} (ms)" for b in BUILDS) + " | AVX2 / AVX-512 |", "|---|---|---|---|"]
    context = list(range(100, 300))
    for rows in (1, 2, 3, 4, 8, 16):
        samples: dict[str, list[float]] = {b: [] for b in BUILDS}
        for _ in range(repeats):
            for build in BUILDS:
                lm = runs[("plain", build)].target.lm
                lm.crop(0)
                lm.forward(context, last_logits=1)
                started = time.perf_counter()
                lm.forward(list(range(7, 7 + rows)))
                samples[build].append(time.perf_counter() - started)
        wide, narrow = (statistics.median(samples[b]) * 1e3 for b in BUILDS)
        lines.append(f"| {rows} | {wide:.2f} | {narrow:.2f} | {narrow / wide:.2f}x |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--per-category", type=int, default=None)
    parser.add_argument("--heldout", action="store_true")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(2)
    methods = args.methods.split(",")
    runs = engines(methods)
    tokenizer = runs[(methods[0], BUILDS[0])].tokenizer
    prompts = [list(encode(p, tokenizer)) for p in select(load_builtin(heldout=args.heldout), None, args.per_category)]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    forwards = forward_times(runs, 15)
    timed = time_interleaved(runs, prompts, params, args.repeats, group=lambda key: key[1])
    rate = timed.rate
    same = sum(outputs[BUILDS[0]] == outputs[BUILDS[1]] for outputs in timed.outputs)
    plain = rate[(methods[0], "AVX2")]
    lines = [f"`bench/float_lanes.py{' --heldout' * args.heldout}"
             f"{f' --per-category {args.per_category}' if args.per_category else ''} --repeats {args.repeats}`: "
             f"{cpu_model()}, 2 threads, float32 on the default model's GGUF blocks.", "",
             "One forward at 200 cached tokens, median of 15:", "", *forwards, "",
             f"Greedy decoding, {len(prompts)} prompts, {args.max_tokens} new tokens, each method's default; every "
             f"output equals plain decoding on its own build; the two builds' outputs are equal on {same} of "
             f"{len(prompts)} prompts.", "",
             "| method | AVX-512 tok/s | AVX2 tok/s | AVX-512 / AVX2 | vs plain AVX2 |", "|---|---|---|---|---|"]
    for method in methods:
        wide, narrow = rate[(method, "AVX-512")], rate[(method, "AVX2")]
        lines.append(f"| {method} | {wide:.1f} | {narrow:.1f} | {wide / narrow:.2f}x | {wide / plain:.2f}x, "
                     f"{narrow / plain:.2f}x |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
