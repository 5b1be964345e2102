"""The default model's Q8_0 LM head on AMX tiles (A8) against the AVX-512 products, interleaved in one process.

    .venv/bin/python bench/lm_head_tiles.py [--repeats 40] [--decode plain,chain,tree,suffix --rounds 2]

First the LM head alone over 1 to 9 rows (median of ``--repeats``, each after streaming 1 MB of
other memory); then, with ``--decode``, whole greedy decoding of 14 prompts (96 new tokens each)
with the head on tiles and off in turn, per prompt, for each method named (chain: the shipped MTP
head's chain of one; tree: its first two choices; suffix: suffix decoding without its cache of
earlier requests, which would see each prompt twice). Needs the AMX build (Linux granting the
tiles). Not a test: a measurement for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from interleave import NAMED, quick_prompts
from specsure.decode.engine import make_engine
from specsure.sampling import SamplingParams


def products(repeats: int) -> None:
    lm = make_engine(None).target.lm
    tiles, blocks, kernel = lm.head.tiles, lm.head.blocks, lm._native.float_kernel
    if tiles is None:
        raise SystemExit("the LM head is not on AMX tiles here (no AMX build, or Linux refused the tiles)")
    other = torch.zeros(1 << 18)
    hidden = torch.randn(9, lm.hidden_size)
    print("| rows | AVX-512 products (ms) | AMX tiles (ms) |\n|---|---|---|")
    for rows in (1, 2, 3, 5, 9):
        x = hidden[:rows].contiguous()
        times: dict[str, list[float]] = {"products": [], "tiles": []}
        for _ in range(repeats):
            for name, matrix in (("products", blocks), ("tiles", tiles)):
                other.add_(1.0)
                started = time.perf_counter()
                kernel.linear_blocks(matrix, x)
                times[name].append(time.perf_counter() - started)
        products_ms, tiles_ms = (statistics.median(times[name]) * 1e3 for name in ("products", "tiles"))
        print(f"| {rows} | {products_ms:.3f} | {tiles_ms:.3f} |")


def decoding(methods: list[str], rounds: int) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=96, ignore_eos=True)
    for method in methods:
        engine = make_engine(None, NAMED[method])
        lm = engine.target.lm
        tiles = lm.head.tiles
        prompts = quick_prompts(engine.tokenizer)
        engine.generate([prompts[0]], params)
        spent = {"products": 0.0, "tiles": 0.0}
        outputs: dict[str, list[list[int]]] = {"products": [], "tiles": []}
        for round_ in range(rounds):
            for prompt in prompts:
                for name in (("products", "tiles") if round_ % 2 == 0 else ("tiles", "products")):
                    lm.head.tiles = tiles if name == "tiles" else None
                    started = time.perf_counter()
                    outputs[name].append(engine.generate([prompt], params)[0].token_ids)
                    spent[name] += time.perf_counter() - started
        lm.head.tiles = tiles
        print(f"{method}: tiles {spent['products'] / spent['tiles']:.3f}x the products' speed "
              f"({spent['products']:.2f} s against {spent['tiles']:.2f} s); "
              f"outputs {'equal' if outputs['products'] == outputs['tiles'] else 'DIFFERENT'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--decode", default="", help="methods to decode with, comma-separated (default: none)")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(2)
    with torch.inference_mode():
        products(args.repeats)
    if args.decode:
        decoding(args.decode.split(","), args.rounds)


if __name__ == "__main__":
    main()
