"""What a benchmark runner returns, and the interface every runner implements; no torch here.

Results, the report and the plots read only these records, so reading and rendering a
results.json never imports torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

Kind = Literal["specsure", "transformers", "llama.cpp"]


@dataclass(frozen=True)
class Generation:
    """One timed greedy generation."""

    token_ids: tuple[int, ...]
    """New tokens only (the prompt excluded); a final EOS is not counted."""
    seconds: float
    """Wall time of the generate call."""
    drafts: int = 0
    """Verification steps that had a non-empty draft (vLLM's num_drafts)."""
    draft_tokens: int = 0
    """Draft tokens proposed."""
    accepted_tokens: int = 0
    """Draft tokens accepted."""
    accepted_per_position: tuple[int, ...] = ()
    """Accepted draft tokens at each draft position 0..k-1."""


class Runner(Protocol):
    """One configuration under test."""

    name: str
    """Unique label in the report, e.g. 'ngram' or 'hf-prompt-lookup'."""
    kind: Kind
    """Which library runs it."""
    speculative: bool
    """True when it reports acceptance counters."""
    plain: str | None
    """The same library's plain decoding configuration this one should reproduce ('hf' for
    'hf-prompt-lookup'); None for plain decoding and for specsure (its plain is the reference)."""
    comparable: bool
    """False when its arithmetic differs from the reference's by design (llama.cpp's Q4_1 kernels,
    which quantise the activations to 8 bits): its outputs are compared for information only."""

    def generate(self, prompt_ids: Sequence[int], max_tokens: int) -> Generation:
        """Greedy-decode up to `max_tokens` new tokens after `prompt_ids`."""
        ...
