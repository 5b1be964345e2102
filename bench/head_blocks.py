"""The shipped heads two ways (proposers/head_blocks.py): reading Q8_0 blocks against float32 weights
(``--compare blocks``), or their Q8_0 blocks with int8 activations against float32 ones (``--compare int8``).

Plain decoding and each head both ways, interleaved prompt by prompt on the bench's built-in
prompts, greedy; each engine's tokens/s is its new tokens over the sum of its per-prompt median
times (``--repeats`` of each), every output checked against plain decoding. A measurement, not a
test:

    .venv/bin/python bench/head_blocks.py --k 1 --repeats 3 --out bench/avx2-head-blocks/k1.md
    .venv/bin/python bench/head_blocks.py --compare int8 --k 1 --repeats 3 --out bench/avx2-draft-int8/k1.md
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

from interleave import time_interleaved
from specsure.bench.workload import encode, load_builtin
from specsure.decode.engine import Engine, make_engine
from specsure.proposers.head_blocks import ENV, INT8_ENV
from specsure.sampling import SamplingParams


COMPARED = {"blocks": (ENV, ("Q8_0", "float32")), "int8": (INT8_ENV, ("Q8_0 int8", "Q8_0 float32"))}
"""Per --compare: the switch, and the names of its two sides ("1" and "0")."""


def engines(k: int | None, tree: str | None, compare: str) -> dict[str, Engine]:
    runs = {"plain": make_engine(None, None)}
    env, sides = COMPARED[compare]
    before = os.environ.get(env)
    for method in ("mtp", "eagle3"):
        spec: dict[str, object] = {"method": method}
        if k is not None:
            spec["num_speculative_tokens"] = k
        if tree is not None:
            spec["speculative_token_tree"] = tree
        for side, value in zip(sides, ("1", "0")):
            os.environ[env] = value
            runs[f"{method} {side}"] = make_engine(None, spec)
    os.environ.pop(env)
    if before is not None:
        os.environ[env] = before
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", choices=sorted(COMPARED), default="blocks",
                        help="blocks: Q8_0 blocks against float32 weights; int8: int8 activations against float32 ones")
    parser.add_argument("--k", type=int, default=None, help="num_speculative_tokens (default: the shipped heads' default)")
    parser.add_argument("--tree", default=None, help='speculative_token_tree, e.g. "[(0,), (1,)]"')
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--heldout", action="store_true")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(2)
    runs = engines(args.k, args.tree, args.compare)
    tokenizer = runs["plain"].tokenizer
    prompts = [list(encode(p, tokenizer)) for p in load_builtin(heldout=args.heldout)]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    timed = time_interleaved(runs, prompts, params, args.repeats, group=lambda key: "plain")
    rates = timed.rate
    flags = [f"--compare {args.compare}"] + [f"--k {args.k}"] * (args.k is not None)
    flags += [f"--tree '{args.tree}'"] * (args.tree is not None)
    lines = [f"`{' '.join(['bench/head_blocks.py'] + flags + ['--heldout'] * args.heldout)}"
             f" --repeats {args.repeats}`: {len(prompts)} prompts, {args.max_tokens} new tokens, greedy, "
             f"default dtype ({str(runs['plain'].target.lm.dtype).removeprefix('torch.')}), 2 threads; every output "
             "equals plain decoding's.", "", "| engine | tok/s | vs plain | mean acc. len |", "|---|---|---|---|"]
    for name in runs:
        drafted, kept = timed.drafts[name], timed.accepted[name]
        length = f"{1 + kept / drafted:.2f}" if drafted else "-"
        lines.append(f"| {name} | {rates[name]:.1f} | {rates[name] / rates['plain']:.3f}x | {length} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
