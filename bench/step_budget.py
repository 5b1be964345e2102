"""Where a speculative step's time goes: the target's forwards by row count, the draft, the commit.

    .venv/bin/python bench/step_budget.py [--methods plain,chain,tree,suffix,eagle3]

Decodes 14 prompts of the main split (96 new tokens each, greedy) per method and times, by
wrapping them: each target forward (by how many rows it feeds; 'prompt' for a prefill over
KERNEL_ROWS), each proposal (and for the heads the module call inside it), and each verification
(`Request.commit`). chain: the shipped MTP head's chain of one; tree: its first two choices;
suffix: suffix decoding without its cache of earlier requests. Wrapping costs a few microseconds
a call. Not a test: a measurement for docs/training.md.
"""

from __future__ import annotations

import argparse
import collections
import time
from typing import Any, Callable

import torch

from interleave import NAMED, quick_prompts
from specsure.decode import request, scheduler
from specsure.decode.engine import make_engine
from specsure.models import causal_lm
from specsure.models.products import KERNEL_ROWS
from specsure.proposers import head_chain
from specsure.sampling import SamplingParams

spent: collections.Counter[str] = collections.Counter()
calls: collections.Counter[str] = collections.Counter()


def timed(owner: Any, name: str, label: Callable[..., str]) -> None:
    """Replace ``owner.name`` (a class's method or a module's function) by a wrapper that adds its
    wall time to ``spent[label(*args)]``."""
    inner = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        out = inner(*args, **kwargs)
        key = label(*args)
        spent[key] += time.perf_counter() - started
        calls[key] += 1
        return out

    setattr(owner, name, wrapper)


def _rows(_lm: object, forwards: list, *_: object) -> str:
    rows = sum(len(call.token_ids) for call in forwards)
    return "target forward, prompt" if rows > KERNEL_ROWS else f"target forward, {rows} row{'s' * (rows > 1)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="plain,chain,tree,suffix")
    args = parser.parse_args()
    torch.set_num_threads(2)
    timed(causal_lm.CausalLM, "forward_batch", _rows)
    timed(request.Request, "commit", lambda *_: "commit (verify, roll back)")
    timed(scheduler, "propose_all", lambda *_: "draft (propose)")
    timed(head_chain.HeadChainProposer, "_depth_step", lambda *_: "  of which the head module's call")
    params = SamplingParams(temperature=0.0, max_tokens=96, ignore_eos=True)
    for method in args.methods.split(","):
        engine = make_engine(None, NAMED[method])
        prompts = quick_prompts(engine.tokenizer)
        engine.generate([prompts[0]], params)
        spent.clear()
        calls.clear()
        started = time.perf_counter()
        made = sum(len(engine.generate([p], params)[0].token_ids) for p in prompts)
        elapsed = time.perf_counter() - started
        steps = calls["commit (verify, roll back)"]
        print(f"\n{method}: {made / elapsed:.1f} tok/s, {steps} steps, {made / max(steps, 1):.2f} tokens a step")
        print("| part | calls | ms a call | ms a step |\n|---|---|---|---|")
        for key in sorted(spent, key=lambda k: (not k.startswith("target"), k)):
            per_call, per_step = spent[key] / calls[key] * 1e3, spent[key] / max(steps, 1) * 1e3
            print(f"| {key} | {calls[key]} | {per_call:.3f} | {per_step:.3f} |")


if __name__ == "__main__":
    main()
