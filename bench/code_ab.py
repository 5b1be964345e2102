"""Decode 14 prompts with several methods in one process, for comparing two commits in alternating processes.

    git worktree add /tmp/first 6be7d53
    for round in 1 2 3; do
        PYTHONPATH=/tmp/first/src .venv/bin/python bench/code_ab.py plain,chain,tree,suffix
        .venv/bin/python bench/code_ab.py plain,chain,tree,suffix
    done

Prints, for the code on the path, each method's tok/s over 14 prompts of the main split (96 new
tokens each, greedy, after one warm-up on a prompt outside them), the methods interleaved prompt by
prompt, and a hash of its outputs; with plain among the methods, every other method's output must
equal plain's (else it exits with an error). chain: the shipped MTP head's chain of one; tree: its
first two choices. Two commits cannot share one process, so compare ratios to each process's own
plain decoding and round by round. Not a test: a measurement for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import hashlib
import time
from typing import Any

import torch

import specsure
from interleave import NAMED, balanced_order, quick_prompts
from specsure.bench.workload import encode, load_builtin, select
from specsure.decode.engine import make_engine
from specsure.sampling import SamplingParams

SPECS: dict[str, dict[str, Any] | None] = {**NAMED, "suffix": {"method": "suffix"}}
"""`interleave.NAMED`, but suffix keeps its cache of earlier requests, as a server does: each prompt
drafts from the answers to the prompts before it in the pass, never from its own."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("methods", help="comma-separated: " + ", ".join(SPECS))
    args = parser.parse_args()
    torch.set_num_threads(2)
    params = SamplingParams(temperature=0.0, max_tokens=96, ignore_eos=True)
    methods = args.methods.split(",")
    engines = {method: make_engine(None, SPECS[method]) for method in methods}
    tokenizer = next(iter(engines.values())).tokenizer
    prompts = quick_prompts(tokenizer)
    # Warm up on a prompt of the main split outside the 14, then forget it: suffix must not draft a
    # timed prompt from its own warm-up answer.
    warm = next(ids for p in select(load_builtin(), None, 3) if (ids := list(encode(p, tokenizer))) not in prompts)
    for engine in engines.values():
        engine.generate([warm], params)
        if engine.proposer is not None:
            engine.proposer.clear_history()
    seconds = dict.fromkeys(methods, 0.0)
    outputs: dict[str, list[list[int]]] = {method: [] for method in methods}
    for i, ids in enumerate(prompts):
        for method in (methods[j] for j in balanced_order(len(methods), i)):
            started = time.perf_counter()
            outputs[method].append(list(engines[method].generate([ids], params)[0].token_ids))
            seconds[method] += time.perf_counter() - started
    if "plain" in outputs and (differ := [m for m in methods if outputs[m] != outputs["plain"]]):
        raise SystemExit(f"output differs from plain decoding: {', '.join(differ)}")
    cells = [f"{m} {sum(map(len, outputs[m])) / seconds[m]:.1f} {hashlib.md5(str(outputs[m]).encode()).hexdigest()[:8]}"
             for m in methods]
    print(specsure.__file__.split("/src/")[0], " | ".join(cells))


if __name__ == "__main__":
    main()
