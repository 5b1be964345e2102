"""How often an MTP head's first and second choices are right, by how sure the head is, teacher-forced.

    .venv/bin/python bench/head_confidence.py [--head DIR] [--heldout] [--row-cost 0.1 --step-cost 0.19]

The target answers each bench prompt greedily (one at a time, as the bench decodes); the head's
first draft step is then scored at every answer position, as `bench/head_acceptance.py` scores
it. Per bucket of p1 (the head's probability of its first choice, softmax over its vocabulary):
how many positions, and how often its first and its second choice are the target's token. Then
what a step would gain under a simple cost model (a step of plain decoding costs 1, each verify row
past the first ``--row-cost``, the head's draft step ``--step-cost``): a chain of one, the two-node
tree, and the tree that drafts its second choice only where p2 >= t2 and drafts nothing where
p1 < t0, at the best t2 and t0. The model leaves out the engine's own costs and counts every
position (a walk skips the easy ones after a success), so it overstates every row alike; it ranks
shapes, it does not predict a bench. Not a test: a measurement for docs/training.md.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from specsure.bench.workload import encode, load_builtin
from specsure.config import resolve
from specsure.config.shipped import shipped_head
from specsure.models.loading import load_model
from specsure.proposers import mtp
from specsure.train.data import self_distill
from specsure.train.eagle3 import default_aux_layers
from specsure.train.mtp import answer_start, unrolled_logits


@torch.no_grad()
def scored(head: str | None, heldout: bool) -> np.ndarray:
    """[positions, 4]: p1, p2, whether the first choice is right, whether the second is."""
    target = load_model(None)
    folder = head or shipped_head("mtp")
    res = resolve({"method": "mtp", "model": folder, "num_speculative_tokens": 1}, model=target.path)
    proposer = mtp.build(res, target, str(target.lm.dtype).removeprefix("torch."))
    rows = load_builtin(heldout=heldout)
    prompts = [list(encode(row, target.tokenizer)) for row in rows]
    samples = self_distill(target, prompts, 128, aux_layers=default_aux_layers(target.lm.num_layers), batch_size=1)
    out = []
    for sample in samples:
        n = sample.token_ids.shape[0]
        logits = unrolled_logits(proposer.modules, sample, 0, n - 1, 1)[0]  # [n - 1, V]: row a predicts a + 2
        wanted = target.lm.lm_head_logits(sample.hidden[1:n]).argmax(-1)
        top = torch.softmax(logits.float(), -1).topk(2)
        first = answer_start(sample)
        right = top.indices == wanted[:, None]
        out.append(torch.cat([top.values, right.float()], dim=1)[first:n - 2].numpy())
    return np.concatenate(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head", default=None, help="MTP head folder (default: the shipped head)")
    parser.add_argument("--heldout", action="store_true", help="the held-out split (default: the main split)")
    parser.add_argument("--row-cost", type=float, default=0.1, help="a verify row past the first, in plain steps")
    parser.add_argument("--step-cost", type=float, default=0.19, help="the head's draft step, in plain steps")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    table = scored(args.head, args.heldout)
    p1, p2, h1, h2 = table.T
    print(f"{len(table)} positions: first choice right {h1.mean():.3f}, first or second {(h1 + h2).mean():.3f}\n")
    print("| p1 | positions | first right | second right |\n|---|---|---|---|")
    for low in np.arange(0.0, 1.0, 0.1):
        inside = (p1 >= low) & (p1 < low + 0.1 if low < 0.85 else p1 <= 1.0)
        print(f"| {low:.1f}-{low + 0.1:.1f} | {inside.sum()} | {h1[inside].mean():.3f} | {h2[inside].mean():.3f} |")
    r, h = args.row_cost, args.step_cost

    def speed(t2: float, t0: float) -> tuple[float, float]:
        drafts = p1 >= t0
        second = drafts & (p2 >= t2)
        tokens = 1 + (h1 * drafts + h2 * second).mean()
        return tokens / (1 + h + r * (drafts.mean() + second.mean())), tokens

    chain, tree = speed(2.0, 0.0), speed(0.0, 0.0)
    best = max(((speed(t2, t0), t2, t0) for t2 in np.arange(0.0, 0.31, 0.02) for t0 in np.arange(0.0, 0.31, 0.05)),
               key=lambda x: x[0][0])
    print(f"\nmodel (row {r}, head step {h}): chain of one {chain[0]:.3f}x at {chain[1]:.3f} tokens a step; "
          f"two-node tree {tree[0]:.3f}x at {tree[1]:.3f}; pruned tree {best[0][0]:.3f}x at {best[0][1]:.3f} "
          f"(second choice where p2 >= {best[1]:.2f}, no draft where p1 < {best[2]:.2f})")


if __name__ == "__main__":
    main()
