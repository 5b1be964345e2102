"""How long an acceptance length the shipped heads reach with the widest token trees allowed.

    .venv/bin/python bench/tree_ceiling.py eagle3 2,8,24,63

Per node count, the tree of that many nodes with the largest summed path probability under fixed
per-rank acceptance priors (`PRIOR`, close to what the shipped heads measure at the root), then the
quick set (14 prompts, 96 new tokens, greedy) and the engine's mean acceptance length. Not a speed
measurement: a ceiling on acceptance for docs/training.md.
"""

from __future__ import annotations

import heapq
import sys

import torch
from interleave import quick_prompts
from specsure.decode.engine import make_engine
from specsure.sampling import SamplingParams

PRIOR = [0.42, 0.12, 0.06, 0.04, 0.03, 0.02, 0.015, 0.012, 0.01, 0.008]
"""Assumed chance that the head's rank-r choice is the target's token, each level alike."""


def tree(nodes: int, prior: list[float]) -> list[tuple[int, ...]]:
    """The ``nodes`` nodes of largest path probability, best first (every prefix comes before its node)."""
    heap = [(-prior[r], (r,)) for r in range(len(prior))]  # negated: heapq pops the smallest
    heapq.heapify(heap)
    out: list[tuple[int, ...]] = []
    while heap and len(out) < nodes:
        chance, node = heapq.heappop(heap)
        out.append(node)
        for rank, p in enumerate(prior):
            heapq.heappush(heap, (chance * p, node + (rank,)))
    return out


def main() -> None:
    torch.set_num_threads(2)
    params = SamplingParams(temperature=0.0, max_tokens=96, ignore_eos=True)
    for method in sys.argv[1].split(","):
        for count in [int(x) for x in sys.argv[2].split(",")]:
            nodes = tree(count, PRIOR)
            engine = make_engine(None, {"method": method, "speculative_token_tree": str(nodes)})
            for prompt in quick_prompts(engine.tokenizer):
                engine.generate([prompt], params)
            print(f"{method}: {count} nodes, depth {max(map(len, nodes))}, "
                  f"acceptance length {engine.stats.mean_acceptance_length:.3f}", flush=True)


if __name__ == "__main__":
    main()
