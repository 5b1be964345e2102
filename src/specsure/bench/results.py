"""The one data structure a benchmark produces; results.json, results.md and the plots read it.

Definitions (Spec-Bench and vLLM conventions):
- A prompt's time is the median over repeats of its generate wall time; its tokens are the
  new tokens of the first repeat (greedy decoding repeats itself; `deterministic` checks).
- tokens/s of a category = its new tokens / the sum of its prompts' median times.
- speedup vs X = tokens/s / tokens/s of X in the same category, measured in the same run.
- mean acceptance length = 1 + accepted_tokens / drafts (counts the bonus token);
  per-position acceptance[i] = accepted_per_position[i] / drafts.
- Output equality compares each configuration's token ids with the reference (specsure
  plain decoding); the first divergence is the index of the first differing new token.
  A configuration with its own library's plain decoding in the run (hf-prompt-lookup and hf,
  llama.cpp-bf16-lookup and llama.cpp-bf16) is also compared with that: its "own plain".
  A configuration whose arithmetic differs from the reference's by design (llama.cpp's
  quantised Q4_1 kernels) is compared for information only: never counted as a mismatch.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from specsure.bench.generation import Generation
from specsure.decode.metrics import SpecStats

ALL = "all"
"""The category name of the row that aggregates every prompt."""


@dataclass
class PromptResult:
    """One configuration on one prompt, over all repeats."""

    config: str
    prompt_id: str
    category: str
    prompt_tokens: int
    new_tokens: int
    seconds: list[float]
    """Wall time of every repeat, in run order."""
    median_seconds: float
    tokens_per_s: float
    deterministic: bool
    """All repeats produced the same token ids."""
    matches_reference: bool | None
    """Token ids equal the reference's; None for the reference itself."""
    first_divergence: int | None
    """Index of the first new token that differs from the reference; None when equal."""
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    matches_own_plain: bool | None = None
    """Token ids equal those of the same library's plain decoding; None when not compared."""
    own_plain_divergence: int | None = None
    """Index of the first new token that differs from the own plain; None when equal."""


@dataclass
class SummaryRow:
    """One configuration on one category (or on every prompt: category 'all')."""

    config: str
    kind: str
    category: str
    prompts: int
    new_tokens: int
    seconds: float
    tokens_per_s: float
    speedup_vs_plain: float | None
    """None when specsure plain was not measured."""
    speedup_vs_hf: float | None
    """Against transformers `generate` greedy; None when that baseline was not run."""
    mean_acceptance_length: float | None
    """None for configurations without acceptance counters (plain, transformers) and for rows that
    drafted nothing."""
    per_position_acceptance: list[float] | None
    exact_match_rate: float | None
    """Share of prompts whose output equals the reference's; None for the reference."""
    outputs_equal: bool | None
    """True when every prompt matches the reference; None for the reference."""
    mismatches: list[dict[str, Any]]
    """[{"prompt_id", "first_divergence"}] for every prompt that differs from the reference."""
    comparable: bool = True
    """False when its arithmetic differs from the reference's by design (quantised kernels): its
    outputs are compared with the reference for information, and a difference is not a mismatch."""
    own_plain: str | None = None
    """The same library's plain decoding configuration it is also compared with, if it ran."""
    own_plain_exact_match_rate: float | None = None
    """Share of prompts whose output equals `own_plain`'s; None when there is no own plain."""
    prompt_speedups: list[float] | None = None
    """The quartiles (25%, 50%, 75%) of its per-prompt tok/s over plain's on the same prompt: how far
    one prompt's figure strays from the row's ratio; None without plain, or for plain itself."""


@dataclass
class BenchResults:
    """Everything a benchmark run measured; serialised as-is to results.json."""

    meta: dict[str, Any]
    """Machine, versions, dtype, threads, model, command, settings."""
    reference: str
    """The configuration outputs are compared against."""
    configs: list[dict[str, str]]
    """[{"name", "kind"}] in report order."""
    skipped: list[dict[str, str]]
    """[{"name", "reason"}] for configurations that could not run."""
    categories: list[str]
    prompts: list[PromptResult]
    summary: list[SummaryRow]

    def row(self, config: str, category: str = ALL) -> SummaryRow | None:
        """The summary row of `config` on `category`, if measured."""
        for r in self.summary:
            if r.config == config and r.category == category:
                return r
        return None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def write_json(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "BenchResults":
        return cls(
            meta=dict(data["meta"]),
            reference=data["reference"],
            configs=list(data["configs"]),
            skipped=list(data["skipped"]),
            categories=list(data["categories"]),
            prompts=[PromptResult(**p) for p in data["prompts"]],
            summary=[SummaryRow(**r) for r in data["summary"]],
        )

    @property
    def mismatched(self) -> list[SummaryRow]:
        """Per-category rows (not 'all') whose outputs differ from the reference (comparable ones only)."""
        return [r for r in self.summary if r.category != ALL and r.outputs_equal is False and r.comparable]


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where `a` and `b` differ (a length difference counts)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def prompt_result(
    config: str, prompt_id: str, category: str, prompt_tokens: int, runs: Sequence[Generation], reference: Sequence[int] | None,
    own_plain: Sequence[int] | None = None,
) -> PromptResult:
    """Reduce the repeats of one configuration on one prompt.

    `reference`: the reference's token ids (None for the reference itself); `own_plain`: those
    of the same library's plain decoding (None when it has none in the run).
    """
    first = runs[0]
    seconds = [g.seconds for g in runs]
    median = statistics.median(seconds)
    divergence = None if reference is None else first_divergence(first.token_ids, reference)
    own_divergence = None if own_plain is None else first_divergence(first.token_ids, own_plain)
    return PromptResult(
        config=config,
        prompt_id=prompt_id,
        category=category,
        prompt_tokens=prompt_tokens,
        new_tokens=len(first.token_ids),
        seconds=seconds,
        median_seconds=median,
        tokens_per_s=len(first.token_ids) / median if median > 0 else 0.0,
        deterministic=all(g.token_ids == first.token_ids for g in runs),
        matches_reference=None if reference is None else divergence is None,
        first_divergence=divergence,
        drafts=first.drafts,
        draft_tokens=first.draft_tokens,
        accepted_tokens=first.accepted_tokens,
        accepted_per_position=list(first.accepted_per_position),
        matches_own_plain=None if own_plain is None else own_divergence is None,
        own_plain_divergence=own_divergence,
    )


def _row(config: str, kind: str, category: str, prompts: Sequence[PromptResult], speculative: bool,
         own_plain: str | None, comparable: bool) -> SummaryRow:
    tokens = sum(p.new_tokens for p in prompts)
    seconds = sum(p.median_seconds for p in prompts)
    stats = SpecStats()  # vLLM's acceptance definitions, written once in decode.metrics
    for p in prompts:
        stats.merge(SpecStats(drafts=p.drafts, draft_tokens=p.draft_tokens, accepted_tokens=p.accepted_tokens,
                              accepted_per_position=list(p.accepted_per_position)))
    compared = [p for p in prompts if p.matches_reference is not None]
    own = [p for p in prompts if p.matches_own_plain is not None]
    return SummaryRow(
        config=config,
        kind=kind,
        category=category,
        prompts=len(prompts),
        new_tokens=tokens,
        seconds=seconds,
        tokens_per_s=tokens / seconds if seconds > 0 else 0.0,
        speedup_vs_plain=None,
        speedup_vs_hf=None,
        # A row that drafted nothing has no acceptance to show; 1.00 would read as "drafted, none accepted".
        mean_acceptance_length=stats.mean_acceptance_length if speculative and stats.drafts else None,
        per_position_acceptance=stats.per_position_acceptance_rate if speculative else None,
        exact_match_rate=sum(bool(p.matches_reference) for p in compared) / len(compared) if compared else None,
        outputs_equal=all(p.matches_reference for p in compared) if compared else None,
        mismatches=[{"prompt_id": p.prompt_id, "first_divergence": p.first_divergence} for p in compared if not p.matches_reference],
        comparable=comparable,
        own_plain=own_plain if own else None,
        own_plain_exact_match_rate=sum(bool(p.matches_own_plain) for p in own) / len(own) if own else None,
    )


def _quartiles(values: Sequence[float]) -> list[float] | None:
    if not values:
        return None
    if len(values) == 1:
        return [values[0]] * 3
    return statistics.quantiles(values, n=4, method="inclusive")


def summarize(
    meta: Mapping[str, Any],
    configs: Sequence[tuple[str, str, bool]],
    skipped: Sequence[tuple[str, str]],
    prompts: Sequence[PromptResult],
    reference: str,
    hf_baseline: str = "hf",
    own_plain: Mapping[str, str] | None = None,
    incomparable: Collection[str] = (),
    speculative_configs: Mapping[str, Mapping[str, Any]] | None = None,
) -> BenchResults:
    """Build the results from per-prompt figures.

    Args:
        configs: (name, kind, speculative) of every configuration that ran, in report order.
        skipped: (name, reason) of every configuration that could not run.
        reference: the configuration speedup-vs-plain and output equality are relative to.
        hf_baseline: the configuration speedup-vs-transformers is relative to.
        own_plain: {config: the same library's plain configuration its prompts were compared with}.
        incomparable: configurations whose outputs are compared for information only.
        speculative_configs: {config: the speculative config it ran, in vLLM's keys}, recorded with it, so
            a row says which head and k made its figures (a shipped head drafts its own k).
    """
    own_plain = own_plain or {}
    categories = list(dict.fromkeys(p.category for p in prompts))
    summary = []
    for category in [*categories, ALL]:
        rows = [
            _row(name, kind, category, [p for p in prompts if p.config == name and category in (ALL, p.category)], speculative,
                 own_plain.get(name), name not in incomparable)
            for name, kind, speculative in configs
        ]
        base = {r.config: r.tokens_per_s for r in rows}
        plain = {p.prompt_id: p.tokens_per_s for p in prompts if p.config == reference}
        for r in rows:
            if base.get(reference):
                r.speedup_vs_plain = r.tokens_per_s / base[reference]
                if r.config != reference:
                    r.prompt_speedups = _quartiles([p.tokens_per_s / plain[p.prompt_id] for p in prompts
                                                    if p.config == r.config and category in (ALL, p.category)
                                                    and plain.get(p.prompt_id)])
            if base.get(hf_baseline):
                r.speedup_vs_hf = r.tokens_per_s / base[hf_baseline]
        summary.extend(rows)
    return BenchResults(
        meta=dict(meta),
        reference=reference,
        configs=[{"name": n, "kind": k, **({"speculative_config": dict(speculative_configs[n])}
                                            if speculative_configs and n in speculative_configs else {})}
                 for n, k, _ in configs],
        skipped=[{"name": n, "reason": why} for n, why in skipped],
        categories=categories,
        prompts=list(prompts),
        summary=summary,
    )
