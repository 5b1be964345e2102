"""The configurations a benchmark compares: specsure methods and transformers baselines.

Every runner takes the same prompt token ids and a cap on new tokens, decodes greedily at
batch size 1 (specsure's can also run every prompt batched: ``generate_batched``), and returns the new token ids, the wall time of the whole call (prefill
included, tokenization excluded) and, for speculative methods, the acceptance counters.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from specsure.bench.generation import Generation, Kind, Runner

__all__ = ["Generation", "Kind", "Runner", "SpecsureRunner", "TransformersRunner"]


def _strip_eos(token_ids: Sequence[int], eos_ids: frozenset[int]) -> tuple[int, ...]:
    # transformers keeps the EOS it stopped on; counting it for one engine and not the other
    # would skew both tokens/s and the equality check, so neither side counts it.
    ids = tuple(int(t) for t in token_ids)
    return ids[:-1] if ids and ids[-1] in eos_ids else ids


@dataclass
class SpecsureRunner:
    """A specsure engine built once per method and reused for every prompt."""

    name: str
    engine: Any
    """The object `specsure.make_engine` returned."""
    eos_ids: frozenset[int] = frozenset()
    kind: Kind = "specsure"
    plain: str | None = None
    comparable: bool = True

    @property
    def speculative(self) -> bool:
        return self.engine.speculative_method is not None

    def clear_history(self) -> None:
        """Forget earlier requests (suffix's global tree), so a pass never drafts from an earlier pass."""
        if self.engine.proposer is not None:
            self.engine.proposer.clear_history()

    def generate(self, prompt_ids: Sequence[int], max_tokens: int) -> Generation:
        from specsure.sampling import SamplingParams

        params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
        start = time.perf_counter()
        out = self.engine.generate([list(prompt_ids)], params)[0]
        seconds = time.perf_counter() - start
        stats = out.stats
        return Generation(
            token_ids=_strip_eos(out.token_ids, self.eos_ids),
            seconds=seconds,
            drafts=int(stats.drafts),
            draft_tokens=int(stats.draft_tokens),
            accepted_tokens=int(stats.accepted_tokens),
            accepted_per_position=tuple(int(n) for n in stats.accepted_per_position),
        )

    def generate_batched(self, prompts: Sequence[tuple[Sequence[int], int]],
                         max_num_seqs: int) -> tuple[list[tuple[int, ...]], float]:
        """Every (prompt ids, max tokens) through the engine's scheduler, up to ``max_num_seqs`` at a
        time (continuous batching); the new token ids of each, and the wall time of the whole run."""
        from specsure.sampling import SamplingParams

        engine, scheduler = self.engine, self.engine.scheduler
        before, scheduler.max_num_seqs = scheduler.max_num_seqs, max_num_seqs
        try:
            requests = [engine.request(list(ids), SamplingParams(max_tokens=n, temperature=0.0)) for ids, n in prompts]
            start = time.perf_counter()
            for request in requests:
                scheduler.add(request)
            while not scheduler.idle:
                for _, update in scheduler.step():
                    if update.error is not None:
                        raise update.error
            seconds = time.perf_counter() - start
        finally:
            scheduler.max_num_seqs = before
        return [_strip_eos(r.completion.token_ids, self.eos_ids) for r in requests], seconds


@dataclass
class TransformersRunner:
    """`model.generate` greedy, optionally with prompt lookup or an assistant model."""

    name: str
    model: Any
    """The transformers `PreTrainedModel` of the target."""
    generate_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra `generate` arguments: `prompt_lookup_num_tokens=k` or `assistant_model=...`."""
    eos_ids: frozenset[int] = frozenset()
    kind: Kind = "transformers"
    speculative: bool = False
    plain: str | None = None
    """'hf' for prompt lookup and assisted generation: both should reproduce `generate` greedy."""
    comparable: bool = True

    @torch.inference_mode()
    def generate(self, prompt_ids: Sequence[int], max_tokens: int) -> Generation:
        input_ids = torch.tensor([list(prompt_ids)], dtype=torch.long)
        eos = sorted(self.eos_ids) or None
        start = time.perf_counter()
        out = self.model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=max_tokens,
            do_sample=False,
            # Neutralise sampling fields a checkpoint's generation_config may carry, so
            # greedy means plain argmax here exactly as in specsure.
            temperature=None,
            top_p=None,
            top_k=None,
            repetition_penalty=None,
            eos_token_id=eos,
            pad_token_id=eos[0] if eos else None,
            **self.generate_kwargs,
        )
        seconds = time.perf_counter() - start
        return Generation(token_ids=_strip_eos(out[0, input_ids.shape[1] :].tolist(), self.eos_ids), seconds=seconds)

