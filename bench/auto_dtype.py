"""Each method in bfloat16 against float32 on the GGUF's blocks, interleaved prompt by prompt in one
process: the measurement behind dtype 'auto' choosing float32 for a GGUF target of blocks on a CPU
with fast bf16 (config/dtype_choice.py). Every output is checked against plain decoding in its own
dtype (the two dtypes' outputs differ: float32 computes with the file's values, bf16 with their
bf16 roundings).

    .venv/bin/python bench/auto_dtype.py --out bench/amx-auto-dtype/main.md [--heldout] [--per-category 2]

Not a test: a measurement for BENCHMARKS.md, "Auto dtype follows the weights".
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from interleave import time_interleaved
from specsure.bench.workload import encode, load_builtin, select
from specsure.config.cpu import cpu_model
from specsure.decode.engine import make_engine
from specsure.sampling import SamplingParams

METHODS = ("plain", "ngram", "suffix", "mtp", "eagle3")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--per-category", type=int, default=None, help="the first N prompts of each category")
    parser.add_argument("--heldout", action="store_true")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(2)
    methods = args.methods.split(",")
    runs = {(m, d): make_engine(None, None if m == "plain" else {"method": m}, dtype=d)
            for d in ("bfloat16", "float32") for m in methods}
    tokenizer = runs[(methods[0], "float32")].tokenizer
    prompts = [list(encode(p, tokenizer)) for p in select(load_builtin(heldout=args.heldout), None, args.per_category)]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    rate = time_interleaved(runs, prompts, params, args.repeats, group=lambda key: key[1]).rate
    plain = rate[(methods[0], "bfloat16")]
    lines = [f"`bench/auto_dtype.py{' --heldout' * args.heldout}"
             f"{f' --per-category {args.per_category}' if args.per_category else ''} --repeats {args.repeats}`: "
             f"{len(prompts)} prompts, {args.max_tokens} new tokens, greedy, 2 threads, {cpu_model()}; each method's "
             "default tree or k; every output equals plain decoding in its dtype.", "",
             f"| method | bfloat16 tok/s | float32 on blocks tok/s | float32 / bfloat16 | vs {methods[0]} bfloat16 |",
             "|---|---|---|---|---|"]
    for method in methods:
        bf16, f32 = rate[(method, "bfloat16")], rate[(method, "float32")]
        lines.append(f"| {method} | {bf16:.1f} | {f32:.1f} | {f32 / bf16:.2f}x | {bf16 / plain:.2f}x, {f32 / plain:.2f}x |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
