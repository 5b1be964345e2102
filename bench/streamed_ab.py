"""Decoders' matrices prefetched non-temporally (float_kernel.c's STREAMED) or as before, interleaved.

    .venv/bin/python bench/streamed_ab.py [--methods plain,chain,suffix,ngram,eagle3] [--repeats 2]

Per method one engine on the default model; every prompt of the quick set (14 prompts, 96 new
tokens, greedy) runs with the flag honoured and ignored (`float_streaming`), in alternating order,
so both halves see the same machine. Prints tokens per second of each and their ratio, and the
learned heads' draft step (`HeadChainProposer._depth_step`) in ms. Outputs are the same bits either
way (a prefetch hint changes no result). Not a test: a measurement for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import collections
import time
from typing import Any

import torch

from interleave import NAMED, quick_prompts
from specsure.decode.engine import make_engine
from specsure.models import float_kernel
from specsure.proposers import head_chain
from specsure.sampling import SamplingParams

head_time: collections.Counter[str] = collections.Counter()


def _timed_step(inner: Any) -> Any:
    def step(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        out = inner(*args, **kwargs)
        head_time["s"] += time.perf_counter() - started
        head_time["n"] += 1
        return out
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="plain,chain,suffix,ngram")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(2)
    kernel, why = float_kernel.load()
    if kernel is None:
        raise SystemExit(f"no float32 kernel here: {why}")
    head_chain.HeadChainProposer._depth_step = _timed_step(head_chain.HeadChainProposer._depth_step)
    named = {**NAMED, "ngram": {"method": "ngram", "num_speculative_tokens": 8}}
    params = SamplingParams(temperature=0.0, max_tokens=96, ignore_eos=True)
    engines = {m: make_engine(None, named[m]) for m in args.methods.split(",")}
    prompts = quick_prompts(next(iter(engines.values())).tokenizer)
    seconds: collections.Counter[tuple[str, int]] = collections.Counter()
    tokens: collections.Counter[tuple[str, int]] = collections.Counter()
    heads: collections.Counter[tuple[str, int, str]] = collections.Counter()
    for engine in engines.values():
        engine.generate([prompts[0]], params)  # warm-up
    for repeat in range(args.repeats):
        for method, engine in engines.items():
            for prompt in prompts:
                for on in (1, 0) if repeat % 2 == 0 else (0, 1):
                    kernel.library.float_streaming(on)
                    head_time.clear()
                    started = time.perf_counter()
                    tokens[method, on] += len(engine.generate([prompt], params)[0].token_ids)
                    seconds[method, on] += time.perf_counter() - started
                    heads[method, on, "s"] += head_time["s"]
                    heads[method, on, "n"] += head_time["n"]
    kernel.library.float_streaming(1)
    print("| method | tok/s, streamed | tok/s, as before | ratio | draft step ms, streamed | as before |")
    print("|---|---|---|---|---|---|")
    for method in engines:
        rate = {on: tokens[method, on] / seconds[method, on] for on in (0, 1)}
        step = {on: heads[method, on, "s"] / heads[method, on, "n"] * 1e3 if heads[method, on, "n"] else 0.0
                for on in (0, 1)}
        print(f"| {method} | {rate[1]:.1f} | {rate[0]:.1f} | {rate[1] / rate[0]:.3f} | "
              f"{step[1]:.3f} | {step[0]:.3f} |")


if __name__ == "__main__":
    main()
