"""Speculative-decoding counters and the figures derived from them.

The counters and definitions match vLLM's (``SpecDecodingStats`` / ``SpecDecodingLogging``), so
numbers from specsure and vLLM can be compared directly:

- drafts: verification steps that had at least one draft token (vLLM's ``num_drafts``).
- draft_tokens / accepted_tokens: summed over those steps (``num_draft_tokens``,
  ``num_accepted_tokens``).
- accepted_per_position[i]: steps whose draft token at position i was accepted
  (``num_accepted_tokens_per_pos``). With a token tree, position i is depth i + 1: a step accepts
  at most one node per depth, and draft_tokens counts every node it verified.
- mean acceptance length = 1 + accepted_tokens / drafts; the 1 counts the bonus (or recovered)
  token each step yields.
- per-position acceptance rate = accepted_per_position[i] / drafts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SpecStats:
    """Cumulative speculative-decoding statistics for one request or a whole engine."""

    drafts: int = 0
    """Verification steps that had at least one draft token."""
    draft_tokens: int = 0
    """Draft tokens proposed over those steps."""
    accepted_tokens: int = 0
    """Draft tokens that passed verification (bonus and recovered tokens excluded)."""
    accepted_per_position: list[int] = field(default_factory=list)
    """Entry i: steps whose draft token at position i was accepted. Grows to the longest draft
    seen; a shorter draft still counts in every position's denominator, as in vLLM."""
    generated_tokens: int = 0
    """Output tokens committed, speculative or not (for throughput)."""
    elapsed_s: float = 0.0
    """Wall time spent generating, in seconds (for throughput)."""

    def observe(self, num_draft_tokens: int, num_accepted: int, positions: int | None = None) -> None:
        """Record one verification step. A step with no draft tokens is not a draft (vLLM).
        ``positions``: a token tree's depth (a chain's is its length, the default)."""
        positions = num_draft_tokens if positions is None else positions
        if not 0 <= num_accepted <= positions <= num_draft_tokens:
            raise ValueError(f"SpecStats.observe: need 0 <= num_accepted = {num_accepted} <= positions = "
                             f"{positions} <= num_draft_tokens = {num_draft_tokens}")
        if num_draft_tokens == 0:
            return
        self.drafts += 1
        self.draft_tokens += num_draft_tokens
        self.accepted_tokens += num_accepted
        self._grow(positions)
        for i in range(num_accepted):
            self.accepted_per_position[i] += 1

    def add_generated(self, num_tokens: int) -> None:
        """Count output tokens committed to the sequence."""
        if num_tokens < 0:
            raise ValueError(f"SpecStats.add_generated: num_tokens = {num_tokens} must be >= 0")
        self.generated_tokens += num_tokens

    def add_time(self, seconds: float) -> None:
        """Add wall time spent generating."""
        if seconds < 0:
            raise ValueError(f"SpecStats.add_time: seconds = {seconds} must be >= 0")
        self.elapsed_s += seconds

    def merge(self, other: SpecStats) -> None:
        """Fold ``other``'s counts and time into this one (e.g. a request into the engine's)."""
        self.drafts += other.drafts
        self.draft_tokens += other.draft_tokens
        self.accepted_tokens += other.accepted_tokens
        self._grow(len(other.accepted_per_position))
        for i, n in enumerate(other.accepted_per_position):
            self.accepted_per_position[i] += n
        self.generated_tokens += other.generated_tokens
        self.elapsed_s += other.elapsed_s

    def since(self, earlier: SpecStats) -> SpecStats:
        """What was counted after ``earlier``, a copy of these statistics taken before (one engine step's)."""
        before = earlier.accepted_per_position
        positions = [n - (before[i] if i < len(before) else 0) for i, n in enumerate(self.accepted_per_position)]
        return SpecStats(self.drafts - earlier.drafts, self.draft_tokens - earlier.draft_tokens,
                         self.accepted_tokens - earlier.accepted_tokens, positions,
                         self.generated_tokens - earlier.generated_tokens, self.elapsed_s - earlier.elapsed_s)

    def __iadd__(self, other: SpecStats) -> SpecStats:
        self.merge(other)
        return self

    def _grow(self, positions: int) -> None:
        missing = positions - len(self.accepted_per_position)
        if missing > 0:
            self.accepted_per_position.extend([0] * missing)

    @property
    def mean_acceptance_length(self) -> float:
        """1 + accepted_tokens / drafts (vLLM's definition). 1.0 when nothing was drafted: each
        step then yields exactly one token, as plain decoding does."""
        return 1.0 + self.accepted_tokens / self.drafts if self.drafts else 1.0

    @property
    def acceptance_rate(self) -> float:
        """accepted_tokens / draft_tokens; 0.0 when nothing was drafted (vLLM logs NaN, which
        is not valid JSON)."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def per_position_acceptance_rate(self) -> list[float]:
        """accepted_per_position[i] / drafts for each position; empty when nothing was drafted."""
        if not self.drafts:
            return []
        return [n / self.drafts for n in self.accepted_per_position]

    @property
    def tokens_per_s(self) -> float:
        """generated_tokens / elapsed_s; 0.0 before any time is recorded."""
        return self.generated_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """Counters and derived figures as a JSON-serialisable dict."""
        return {
            "drafts": self.drafts,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "accepted_per_position": list(self.accepted_per_position),
            "generated_tokens": self.generated_tokens,
            "elapsed_s": self.elapsed_s,
            "mean_acceptance_length": self.mean_acceptance_length,
            "acceptance_rate": self.acceptance_rate,
            "per_position_acceptance_rate": self.per_position_acceptance_rate,
            "tokens_per_s": self.tokens_per_s,
        }

    def log_line(self) -> str:
        """One line in vLLM's ``SpecDecoding metrics`` format, so existing log parsers work.

        Throughputs are over ``elapsed_s`` (vLLM uses its logging interval).
        """
        def per_s(n: int) -> float:
            return n / self.elapsed_s if self.elapsed_s > 0 else 0.0

        rates = ", ".join(f"{r:.3f}" for r in self.per_position_acceptance_rate)
        return (
            "SpecDecoding metrics: "
            f"Mean acceptance length: {self.mean_acceptance_length:.2f}, "
            f"Accepted throughput: {per_s(self.accepted_tokens):.2f} tokens/s, "
            f"Drafted throughput: {per_s(self.draft_tokens):.2f} tokens/s, "
            f"Accepted: {self.accepted_tokens} tokens, "
            f"Drafted: {self.draft_tokens} tokens, "
            f"Per-position acceptance rate: {rates}, "
            f"Avg Draft acceptance rate: {self.acceptance_rate * 100:.1f}%"
        )
