"""Decode 14 prompts with several methods in one process, for comparing two commits in alternating processes.

    git worktree add /tmp/first 6be7d53
    for round in 1 2 3; do
        PYTHONPATH=/tmp/first/src .venv/bin/python bench/code_ab.py plain,chain,tree,suffix
        .venv/bin/python bench/code_ab.py plain,chain,tree,suffix
    done

Prints, for the code on the path, each method's tok/s over 14 prompts of the main split (96 new
tokens each, greedy, after one warm-up) and a hash of its outputs (every method's must equal
plain's). chain: the shipped MTP head's chain of one; tree: its first two choices. Python code
cannot be interleaved within one process, so compare ratios to each process's own plain decoding
and round by round. Not a test: a measurement for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import hashlib
import time
from typing import Any

import torch

import specsure
from interleave import NAMED, quick_prompts
from specsure.decode.engine import make_engine
from specsure.sampling import SamplingParams

SPECS: dict[str, dict[str, Any] | None] = {**NAMED, "suffix": {"method": "suffix"}}
"""`interleave.NAMED`, but suffix keeps its cache of earlier requests, as when the figures in
BENCHMARKS.md were measured."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("methods", help="comma-separated: " + ", ".join(SPECS))
    args = parser.parse_args()
    torch.set_num_threads(2)
    params = SamplingParams(temperature=0.0, max_tokens=96, ignore_eos=True)
    cells = []
    for method in args.methods.split(","):
        engine = make_engine(None, SPECS[method])
        prompts = quick_prompts(engine.tokenizer)
        engine.generate([prompts[0]], params)
        started = time.perf_counter()
        outputs = [engine.generate([p], params)[0].token_ids for p in prompts]
        elapsed = time.perf_counter() - started
        digest = hashlib.md5(str(outputs).encode()).hexdigest()[:8]
        cells.append(f"{method} {sum(map(len, outputs)) / elapsed:.1f} {digest}")
    print(specsure.__file__.split("/src/")[0], " | ".join(cells))


if __name__ == "__main__":
    main()
