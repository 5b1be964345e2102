"""Would the shipped EAGLE-3 head pay as suffix decoding's fallback? A measurement, not a shipped method.

ArcticInference pairs suffix decoding with a learned drafter and picks one per step. This script
does the same with specsure's parts: each step suffix decoding drafts first; when its draft's
score (the sum of its estimated path probabilities, about the tokens it will get accepted) is at
least ``--min-score``, that draft is verified; otherwise the EAGLE-3 head drafts its default
tree. It runs plain, eagle3, suffix and the hybrid interleaved, prompt by prompt, greedy, on the
bench's built-in prompts, and checks every output against plain decoding.

    .venv/bin/python bench/hybrid_suffix.py --heldout --min-score 0.5,1,2 --out bench/hybrid-suffix/heldout.md
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch

from specsure.bench.workload import encode, load_builtin
from specsure.decode.engine import Engine, make_engine
from specsure.proposers.base import Draft, Proposer
from specsure.proposers.suffix import SuffixProposer
from specsure.sampling import SamplingParams


class SuffixFirst(Proposer):
    """Suffix decoding's draft when it scores at least ``min_score``, else the EAGLE-3 head's."""

    method: ClassVar[str] = "eagle3"  # the engine checks it against the method it was resolved for

    def __init__(self, head: Proposer, suffix: SuffixProposer, min_score: float, suffix_k: int) -> None:
        assert head.method == self.method
        self.head, self.suffix, self.min_score, self.suffix_k = head, suffix, min_score, suffix_k
        self.needs_hidden, self.aux_layers = head.needs_hidden, head.aux_layers
        self.steps = {"head": 0, "suffix": 0}

    def reset(self) -> None:
        self.head.reset()
        self.suffix.reset()

    def clear_history(self) -> None:
        self.suffix.clear_history()

    def retire(self) -> None:
        self.suffix.retire()

    def observe(self, token_ids: Sequence[int], start: int, out: Any) -> None:
        # The head keeps the target's features of steps it did not draft, so it can take over at any step.
        self.head.observe(token_ids, start, out)
        self.suffix.observe(token_ids, start, out)

    def propose(self, context: Sequence[int], k: int, params: SamplingParams,
                generator: torch.Generator | None) -> Draft:
        draft = self.suffix.propose(context, self.suffix_k, params, generator)
        if draft.token_ids and self.suffix.last_score >= self.min_score:
            self.steps["suffix"] += 1
            return draft
        self.steps["head"] += 1
        return self.head.propose(context, k, params, generator)


def engines(min_scores: Sequence[float], suffix_k: int) -> dict[str, Engine]:
    built = {"plain": make_engine(None, None), "eagle3": make_engine(None, {"method": "eagle3"}),
             "suffix": make_engine(None, {"method": "suffix", "num_speculative_tokens": suffix_k})}
    for score in min_scores:
        engine = make_engine(None, {"method": "eagle3"})
        assert engine.proposer is not None
        # vLLM's suffix defaults: depth 24, 1,000 cached requests, factor 1.0, min probability 0.1.
        engine.proposer = SuffixFirst(engine.proposer, SuffixProposer(24, 1000, 1.0, 0.1), score, suffix_k)
        built[f"suffix, else eagle3 (min score {score:g})"] = engine
    return built


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heldout", action="store_true", help="the held-out split (default: the main split)")
    parser.add_argument("--min-score", default="1", help="comma-separated thresholds, one hybrid each")
    parser.add_argument("--suffix-k", type=int, default=8, help="most tokens a suffix draft may have")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, help="also write the table here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    runs = engines([float(s) for s in args.min_score.split(",")], args.suffix_k)
    prompts = load_builtin(heldout=args.heldout)
    ids = [list(encode(p, runs["plain"].tokenizer)) for p in prompts]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    for engine in runs.values():  # warm-up, then forget what it taught suffix
        engine.generate([ids[0]], SamplingParams(max_tokens=16, temperature=0.0))
        if engine.proposer is not None:
            engine.proposer.clear_history()
    seconds: dict[str, dict[str, list[float]]] = {name: {} for name in runs}  # name -> category -> [seconds, tokens]
    counts = {name: [0, 0, 0] for name in runs}  # drafts, accepted tokens, outputs equal to plain
    for prompt, prompt_ids in zip(prompts, ids):
        reference: list[int] = []
        for name, engine in runs.items():
            start = time.perf_counter()
            out = engine.generate([prompt_ids], params)[0]
            cell = seconds[name].setdefault(prompt.category, [0.0, 0])
            cell[0] += time.perf_counter() - start
            cell[1] += len(out.token_ids)
            if out.stats is not None:
                counts[name][0] += int(out.stats.drafts)
                counts[name][1] += int(out.stats.accepted_tokens)
            reference = list(out.token_ids) if name == "plain" else reference
            counts[name][2] += list(out.token_ids) == reference
    table = report(runs, seconds, counts, len(prompts), args)
    print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(table, encoding="utf-8")


def report(runs: dict[str, Engine], seconds: dict[str, dict[str, list[float]]], counts: dict[str, list[int]],
           n_prompts: int, args: argparse.Namespace) -> str:
    def rate(name: str, category: str | None = None) -> float:
        cells = [c for cat, c in seconds[name].items() if category in (None, cat)]
        return sum(c[1] for c in cells) / sum(c[0] for c in cells)

    categories = list(seconds["plain"])
    lines = [f"`bench/hybrid_suffix.py {'--heldout ' if args.heldout else ''}--min-score {args.min_score} "
             f"--suffix-k {args.suffix_k}`: {n_prompts} prompts, greedy, {args.max_tokens} new tokens, "
             f"dtype auto, {args.threads} threads, interleaved prompt by prompt", "",
             "| config | tok/s | vs plain | acceptance length | equal to plain | "
             + " | ".join(categories) + " | steps: head, suffix |",
             "|---" * (6 + len(categories)) + "|"]
    for name, engine in runs.items():
        drafts, accepted, equal = counts[name]
        length = f"{1 + accepted / drafts:.2f}" if drafts else "-"
        per = " | ".join(f"{rate(name, c) / rate('plain', c):.2f}x" for c in categories)
        steps = engine.proposer.steps if isinstance(engine.proposer, SuffixFirst) else None
        split = f"{steps['head']}, {steps['suffix']}" if steps else "-"
        lines.append(f"| {name} | {rate(name):.2f} | {rate(name) / rate('plain'):.2f}x | {length} | "
                     f"{equal}/{n_prompts} | {per} | {split} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
