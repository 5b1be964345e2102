"""Where the shipped MTP head's draft step goes inside real decoding, part by part.

    .venv/bin/python bench/head_step_parts.py

Decodes 14 prompts of the main split (96 new tokens each, greedy) with the head's chain of one and
times, by wrapping them, the head's calls by how many rows they feed ('prompt' for its first call
over the prompt) and the parts of its C-kernel step. The kernel object is the target's too, so its
layer call counts the target's steps as well; the head's own layer is what the step leaves after its
other parts. Then, outside decoding, the median of 100 one-row head steps right after a one-row
target step, and of the same head step repeated at once (its weights still in the caches). Not a
test: a measurement for BENCHMARKS.md.
"""

from __future__ import annotations

import collections
import statistics
import time
from typing import Any, Callable

import torch

from interleave import NAMED, quick_prompts
from specsure.decode.engine import make_engine
from specsure.proposers import head_chain, head_layer, mtp
from specsure.sampling import SamplingParams

spent: collections.Counter[str] = collections.Counter()
calls: collections.Counter[str] = collections.Counter()


def timed(owner: Any, name: str, label: Callable[..., str]) -> None:
    """Replace ``owner.name`` by a wrapper that adds its wall time to ``spent[label(*args)]``
    (the label is taken before the call)."""
    inner = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        key = label(*args)
        started = time.perf_counter()
        out = inner(*args, **kwargs)
        spent[key] += time.perf_counter() - started
        calls[key] += 1
        return out

    if isinstance(owner, type) or not hasattr(owner, "__dataclass_fields__"):
        setattr(owner, name, wrapper)
    else:  # a frozen dataclass instance (the kernel)
        object.__setattr__(owner, name, wrapper)


def main() -> None:
    torch.set_num_threads(2)
    engine = make_engine(None, NAMED["chain"])
    module = engine.proposer.modules[0]
    kernel = module._kernel
    timed(head_chain.HeadChainProposer, "_depth_step",
          lambda self, i, *_: "head call, prompt" if self._observed - self._done[i] > 8
          else f"head call, {self._observed - self._done[i]} row(s)")
    timed(mtp.MTPModule, "_kernel_forward", lambda *_: "  its C-kernel step")
    timed(mtp.MTPModule, "_logits", lambda *_: "    LM head over the draft vocabulary")
    timed(mtp, "product", lambda *_: "    eh_proj")
    timed(type(module.rotary), "__call__", lambda *_: "    rotary (target's and head's)")
    timed(module.target, "embed", lambda *_: "    embedding")
    timed(head_layer.DraftRow, "argmax", lambda *_: "    argmax")
    timed(kernel, "decode_rows", lambda *_: "    layers (target's and head's)")
    prompts = quick_prompts(engine.tokenizer)
    params = SamplingParams(temperature=0.0, max_tokens=96, ignore_eos=True)
    engine.generate([prompts[0]], params)
    spent.clear()
    calls.clear()
    for prompt in prompts:
        engine.generate([prompt], params)
    steps = sum(n for k, n in calls.items() if k.startswith("head call") and "prompt" not in k)
    print(f"{steps} draft steps\n| part | calls | ms a call | ms a step |\n|---|---|---|---|")
    for key in sorted(spent, key=lambda k: -spent[k]):
        print(f"| {key.strip()} | {calls[key]} | {spent[key] / calls[key] * 1e3:.3f} | {spent[key] / steps * 1e3:.3f} |")
    after, again = warm_and_cold(engine, module)
    print(f"\none-row head step outside decoding: {after * 1e3:.3f} ms after a target step, "
          f"{again * 1e3:.3f} ms repeated at once")


@torch.inference_mode()
def warm_and_cold(engine: Any, module: Any) -> tuple[float, float]:
    """Median seconds of a one-row head step after a one-row target step, and repeated at once."""
    lm, proposer = engine.target.lm, engine.proposer
    context = list(range(100, 301))
    lm.crop(0)
    proposer.reset()
    out = lm.forward(context, hidden=True)
    proposer.observe(context, 0, out)
    cache = proposer._caches[0]
    proposer.propose(context + [5], 1, SamplingParams(temperature=0.0), None)
    feature, ids, start = out.hidden[-1:].contiguous(), torch.tensor([123]), cache.length
    after, again = [], []
    for _ in range(100):
        lm.forward([5], hidden=True)
        lm.crop(len(context))
        for times in (after, again):
            cache.crop(start)
            started = time.perf_counter()
            module(feature, ids, cache, last=True)
            times.append(time.perf_counter() - started)
    return statistics.median(after), statistics.median(again)


if __name__ == "__main__":
    main()
