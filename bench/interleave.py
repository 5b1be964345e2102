"""Greedy decoding with several engines, interleaved prompt by prompt in one process, and single
forwards of several builds interleaved: what the bench scripts here (auto_dtype.py, float_lanes.py,
head_blocks.py, amx_tiles.py) time; and the named configurations and prompts of the step-level ones
(code_ab.py, lm_head_tiles.py, step_budget.py). Not a test."""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Hashable, Sequence
from unittest import mock

import torch

try:
    from specsure.bench.harness import balanced_order
except ImportError:  # an older commit, which code_ab.py measures: it runs in a plain rotation
    def balanced_order(n: int, t: int) -> list[int]:
        return [(i + t) % n for i in range(n)]
from specsure.bench.workload import encode, load_builtin, select
from specsure.config.cpu import cpu_model
from specsure.decode.engine import Engine, make_engine
from specsure.sampling import SamplingParams


@dataclass
class Timed:
    """Per engine: tokens/s over the prompts (new tokens over the sum of per-prompt medians), and the
    first repeat's tokens, accepted draft tokens and drafts; per prompt, each group's output."""

    rate: dict[Hashable, float] = field(default_factory=dict)
    tokens: dict[Hashable, int] = field(default_factory=dict)
    accepted: dict[Hashable, int] = field(default_factory=dict)
    drafts: dict[Hashable, int] = field(default_factory=dict)
    outputs: list[dict[str, list[int]]] = field(default_factory=list)
    """Per prompt, each reference group's output."""


def time_interleaved(runs: dict[Hashable, Engine], prompts: Sequence[list[int]], params: SamplingParams,
                     repeats: int, group: Callable[[Hashable], str]) -> Timed:
    """Run every engine on every prompt ``repeats`` times, engines interleaved; every output must equal
    that of its ``group``'s first engine in ``runs`` (plain decoding in the same dtype or build), else
    SystemExit.
    Suffix's tree of earlier outputs is cleared before every pass, as `specsure bench` does, so no
    pass drafts from another."""
    for engine in runs.values():  # warm-up: kernels built, buffers sized
        engine.generate([prompts[0]], SamplingParams(max_tokens=16, temperature=0.0))
    seconds: dict[Hashable, list[list[float]]] = {key: [[] for _ in prompts] for key in runs}
    timed = Timed(tokens={key: 0 for key in runs}, accepted={key: 0 for key in runs}, drafts={key: 0 for key in runs})
    for i, ids in enumerate(prompts):
        reference: dict[str, list[int]] = {}
        for repeat in range(repeats):
            keys = list(runs)
            outputs: dict[Hashable, list[int]] = {}
            for key in (keys[j] for j in balanced_order(len(keys), i + repeat)):
                engine = runs[key]
                if engine.proposer is not None:
                    engine.proposer.clear_history()
                start = time.perf_counter()
                out = engine.generate([ids], params)[0]
                seconds[key][i].append(time.perf_counter() - start)
                outputs[key] = list(out.token_ids)
                if repeat == 0:
                    timed.tokens[key] += len(out.token_ids)
                    timed.accepted[key] += out.stats.accepted_tokens
                    timed.drafts[key] += out.stats.drafts
            # Compared once all have run, in ``runs``' order: the order they ran in varies, and the
            # one named on a difference must not be the group's own plain decoding.
            for key in keys:
                if outputs[key] != reference.setdefault(group(key), outputs[key]):
                    raise SystemExit(f"{key} differs from plain decoding ({group(key)}) on prompt {i}")
        timed.outputs.append(reference)
    timed.rate = {key: timed.tokens[key] / sum(statistics.median(s) for s in seconds[key]) for key in runs}
    return timed


def forward_times(models: dict[str, Any], rows: Sequence[int], repeats: int) -> dict[int, dict[str, float]]:
    """Per row count, each model's median time (ms) of one forward of that many new rows at 200
    cached tokens, models interleaved (``models``: name -> CausalLM)."""
    context = list(range(100, 300))
    times: dict[int, dict[str, float]] = {}
    for count in rows:
        samples: dict[str, list[float]] = {name: [] for name in models}
        for _ in range(repeats):
            for name, lm in models.items():
                lm.crop(0)
                lm.forward(context, last_logits=1)
                started = time.perf_counter()
                lm.forward(list(range(7, 7 + count)))
                samples[name].append(time.perf_counter() - started)
        times[count] = {name: statistics.median(s) * 1e3 for name, s in samples.items()}
    return times


NAMED: dict[str, dict[str, Any] | None] = {
    "plain": None, "chain": {"method": "mtp"}, "tree": {"method": "mtp", "speculative_token_tree": "[(0,), (1,)]"},
    "suffix": {"method": "suffix", "suffix_decoding_max_cached_requests": 0}, "eagle3": {"method": "eagle3"}}
"""chain: the shipped MTP head's chain of one; tree: its first two choices; suffix: suffix decoding
without its cache of earlier requests (which would see a prompt again after a warm-up or a pass)."""


def quick_prompts(tokenizer: Any) -> list[list[int]]:
    """Two prompts of each category of the main split, as token ids: 14 prompts."""
    return [list(encode(p, tokenizer)) for p in select(load_builtin(), None, 2)]


def method_config(method: str) -> dict | None:
    """``method`` or ``method:tree`` as a speculative config (None for plain decoding)."""
    if method == "plain":
        return None
    name, _, tree = method.partition(":")
    return {"method": name, "speculative_token_tree": tree} if tree else {"method": name}


def engines_per_build(methods: Sequence[str], builds: dict[str, dict[str, str]]) -> dict[tuple[str, str], Engine]:
    """Each method (`method_config`) on each build of the float32 kernel, in float32: a build is the
    kernel `float_kernel.load` hands the models after its environment switches (``builds``: name ->
    variables) are set; the variables are put back afterwards."""
    from specsure.models import float_kernel as float_kernels

    runs = {}
    for build, switches in builds.items():
        with mock.patch.dict(os.environ, switches):
            float_kernels._loaded = float_kernels._load()
            for method in methods:
                runs[(method, build)] = make_engine(None, method_config(method), dtype="float32")
    # products outside the models' forwards (`products.project`) go to the process's kernel: the
    # default build again, for every engine alike
    float_kernels._loaded = float_kernels._load()
    return runs


def build_arguments(description: str, methods: Sequence[str], separator: str) -> argparse.Namespace:
    """The arguments the build-against-build scripts share (float_lanes.py, amx_tiles.py)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--methods", default=separator.join(methods), help=f"{separator!r}-separated")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--per-category", type=int, default=None)
    parser.add_argument("--heldout", action="store_true")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.methods = args.methods.split(separator)
    return args


def compare_builds(script: str, runs: dict[tuple[str, str], Engine], builds: tuple[str, str],
                   args: argparse.Namespace, rows: Sequence[int]) -> tuple[Timed, list[str]]:
    """Two builds of a kernel side by side (``runs``: (method, build) -> engine, with a "plain" method):
    one-forward times over ``rows`` new rows, then greedy decoding of the prompts ``args`` select,
    every output checked against plain decoding on its own build. Returns the timings and the
    report's lines up to its table of methods."""
    torch.set_num_threads(2)
    tokenizer = runs[(args.methods[0], builds[0])].tokenizer
    prompts = [list(encode(p, tokenizer)) for p in select(load_builtin(heldout=args.heldout), None, args.per_category)]
    models = {build: runs[("plain", build)].target.lm for build in builds}
    first, second = builds
    table = [f"| new rows | {first} (ms) | {second} (ms) | {second} / {first} |", "|---|---|---|---|"]
    for count, times in forward_times(models, rows, 15).items():
        table.append(f"| {count} | {times[first]:.2f} | {times[second]:.2f} | {times[second] / times[first]:.2f}x |")
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    timed = time_interleaved(runs, prompts, params, args.repeats, group=lambda key: key[1])
    same = sum(outputs[first] == outputs[second] for outputs in timed.outputs)
    lines = [f"`bench/{script}{' --heldout' * args.heldout}"
             f"{f' --per-category {args.per_category}' if args.per_category else ''} --repeats {args.repeats}`: "
             f"{cpu_model()}, 2 threads, float32 on the default model's GGUF blocks.", "",
             "One forward at 200 cached tokens, median of 15:", "", *table, "",
             f"Greedy decoding, {len(prompts)} prompts, {args.max_tokens} new tokens; every output equals plain "
             f"decoding on its own build; the two builds' outputs are equal on {same} of {len(prompts)} prompts.", ""]
    return timed, lines


def write_report(args: argparse.Namespace, lines: list[str]) -> None:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
