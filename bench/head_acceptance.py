"""A head's greedy acceptance on the bench's prompts, teacher-forced, in seconds instead of a bench run.

    .venv/bin/python bench/head_acceptance.py --method eagle3 [--head DIR] [--heldout] [-k 2] [--dtype bfloat16]

The target answers each prompt greedily (batched), then the head is scored along those answers
with the trainer's own teacher-forced steps (`specsure.train.eagle3.unrolled`,
`specsure.train.mtp.chain_losses`). Two figures per group:

- uniform: every answer position as an anchor, as training's held-out curve counts it;
- walk: the anchors the engine itself would draft from, each after the last one's accepted run
  and its bonus or recovered token. A head is right in runs, so the engine skips easy positions
  after each success and its acceptance is lower than the uniform figure. On the held-out split
  the shipped EAGLE-3 head scores 1.566 uniform and 1.491 walking at k = 2, where the engine
  measured 1.49 (docs/training.md).

It measures no speed. Default head: the shipped one for the method.
"""

from __future__ import annotations

import argparse
import collections

import torch

from specsure.bench.workload import encode, load_builtin
from specsure.config import resolve
from specsure.config.shipped import shipped_head
from specsure.models.loading import LoadedModel, load_model
from specsure.proposers import eagle3, mtp
from specsure.train.data import Sample, self_distill
from specsure.train.eagle3 import default_aux_layers, unrolled
from specsure.train.mtp import answer_start, chain_losses


@torch.no_grad()
def hits(method: str, modules: list, target: LoadedModel, sample: Sample, k: int) -> list[list[bool]]:
    """Per anchor a (row a of the sequence), whether each of the k draft steps from it is right."""
    n = sample.token_ids.shape[0]
    next_ids = target.lm.lm_head_logits(sample.hidden[1:n]).argmax(-1)  # entry t's target token is t + 2's
    if method == "mtp":
        right = [agree.tolist() for _, agree in chain_losses(modules, target.lm, sample, 0, n - 1, k)]
        return [[right[s][a] for s in range(k) if a < len(right[s])] for a in range(n - 1)]
    module = modules[0]
    ids = module.draft_to_target  # None: the draft vocabulary is the target's
    steps = unrolled(module, sample, 0, n - 1, k)
    right = [(logits.argmax(-1) if ids is None else ids[logits.argmax(-1)]) == next_ids for logits in steps]
    return [[bool(right[s][a + s]) for s in range(k) if a + s < n - 1] for a in range(n - 1)]


def runs(table: list[list[bool]]) -> list[int]:
    """Accepted drafts from each anchor: its run of right steps."""
    out = []
    for steps in table:
        r = 0
        while r < len(steps) and steps[r]:
            r += 1
        out.append(r)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", choices=("eagle3", "mtp"), required=True)
    parser.add_argument("--head", default=None, help="head folder (default: the shipped head)")
    parser.add_argument("--heldout", action="store_true", help="the held-out split (default: the main split)")
    parser.add_argument("-k", type=int, default=2, help="draft steps scored (default 2)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                        help="the target's dtype, so its features (default: auto, as the engine's)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = load_model(None, args.dtype)
    head = args.head or shipped_head(args.method)
    res = resolve({"method": args.method, "model": head, "num_speculative_tokens": args.k}, model=target.path)
    builder = eagle3.build if args.method == "eagle3" else mtp.build
    proposer = builder(res, target, str(target.lm.dtype).removeprefix("torch."))
    rows = load_builtin(heldout=args.heldout)
    prompts = [list(encode(row, target.tokenizer)) for row in rows]
    # One sequence at a time, as the bench decodes: batching moves bf16 near-ties, and a different
    # answer is different text to score (3 points of first-position acceptance on this split).
    samples = self_distill(target, prompts, 128, aux_layers=default_aux_layers(target.lm.num_layers), batch_size=1)
    groups: dict[str, list[tuple[list[int], list[int]]]] = collections.defaultdict(list)
    for row, sample in zip(rows, samples):
        accepted = runs(hits(args.method, proposer.modules, target, sample, args.k))
        first = answer_start(sample)
        walk, a = [], first + 1  # the engine's first draft follows the target's first answer token
        while a < len(accepted):
            walk.append(accepted[a])
            a += accepted[a] + 1
        for name in ("all", row.category):
            groups[name].append((accepted[first:], walk))
    print(f"{head}: {'held-out' if args.heldout else 'main'} split, {len(samples)} prompts, k = {args.k}")
    for name, pairs in groups.items():
        figures = []
        for label, index in (("uniform", 0), ("walk", 1)):
            r = [x for pair in pairs for x in pair[index]]
            per = " ".join(f"{sum(x > s for x in r) / max(len(r), 1):.3f}" for s in range(args.k))
            figures.append(f"{label} {1 + sum(r) / max(len(r), 1):.3f} ({per})")
        print(f"{name:14s} acceptance length: " + "; ".join(figures))


if __name__ == "__main__":
    main()
