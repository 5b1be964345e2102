"""results.md: markdown tables rendered from `BenchResults` (never from raw timings)."""

from __future__ import annotations

from specsure.bench.results import ALL, BenchResults, SummaryRow

COLUMNS = ("config", "kind", "new tokens", "tok/s", "vs plain", "per prompt vs plain (quartiles)", "vs HF",
           "mean acc. len", "per-position acceptance", "exact match", "vs own plain")


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _cells(row: SummaryRow) -> list[str]:
    per_pos = "-" if row.per_position_acceptance is None else " ".join(f"{a:.2f}" for a in row.per_position_acceptance) or "-"
    if row.exact_match_rate is None:
        match = "reference"
    elif not row.comparable:
        match = f"{share(row.exact_match_rate)} (information only)"
    else:
        match = share(row.exact_match_rate) + ("" if row.outputs_equal else " **MISMATCH**")
    own = "-" if row.own_plain is None else f"{share(row.own_plain_exact_match_rate)} vs {row.own_plain}"
    return [
        row.config,
        row.kind,
        str(row.new_tokens),
        f"{row.tokens_per_s:.2f}",
        _ratio(row.speedup_vs_plain),
        "-" if row.prompt_speedups is None else " / ".join(f"{q:.2f}" for q in row.prompt_speedups),
        _ratio(row.speedup_vs_hf),
        "-" if row.mean_acceptance_length is None else f"{row.mean_acceptance_length:.2f}",
        per_pos,
        match,
        own,
    ]


def share(rate: float) -> str:
    """A rate as a whole percentage that never rounds to 100% or 0% unless it is exactly that: 199 of
    200 equal outputs read as "100% MISMATCH" when rounded."""
    shown = f"{rate:.0%}"
    if shown == "100%" and rate < 1:
        return f"{rate:.1%}" if f"{rate:.1%}" != "100.0%" else ">99.9%"
    if shown == "0%" and rate > 0:
        return f"{rate:.1%}" if f"{rate:.1%}" != "0.0%" else "<0.1%"
    return shown


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    # A workload's category or id may hold "|", which would end its cell early.
    lines += ["| " + " | ".join(str(cell).replace("|", "\\|") for cell in r) + " |" for r in rows]
    return lines


def render_markdown(results: BenchResults) -> str:
    """The full report: settings, the all-prompts table, the per-category table, warnings."""
    meta = results.meta
    out = ["# specsure bench results", ""]
    if meta.get("interrupted"):
        out += [f"**Partial results:** {meta['interrupted']}.", ""]
    for key in ("command", "specsure_commit", "model", "dtype", "forward", "threads", "cores", "cpu", "torch", "transformers", "llama_cpp_python", "max_tokens", "repeats", "num_speculative_tokens", "prompts"):
        if key in meta:
            value = f"`{meta[key]}`" if key == "command" else meta[key]
            out.append(f"- {key}: {value}")
    out += [
        "",
        f"Greedy, batch 1. tokens/s = new tokens / sum of per-prompt median wall times; speedups are "
        f"ratios in the same run; per prompt vs plain gives the quartiles of each prompt's own ratio, the "
        f"spread behind the row's single figure; exact match compares token ids with `{results.reference}`; vs own plain "
        f"compares them with the same library's plain decoding (hf, llama.cpp).",
        "",
        "## All prompts",
        "",
    ]
    out += _table(list(COLUMNS), [_cells(r) for r in results.summary if r.category == ALL])
    out += ["", "## By category", ""]
    out += _table(["category", *COLUMNS], [[r.category, *_cells(r)] for r in results.summary if r.category != ALL])
    if results.mismatched:
        out += ["", "## MISMATCHES: outputs differ from " + results.reference, ""]
        for r in results.mismatched:
            where = ", ".join(f"{m['prompt_id']} at token {m['first_divergence']}" for m in r.mismatches)
            out.append(f"- **{r.config}** on {r.category}: {where}")
    if unstable := [p for p in results.prompts if not p.deterministic]:
        # Greedy decoding repeats itself; the tokens and the equality checks above are the first repeat's.
        out += ["", "## Repeats that differed", "",
                "Greedy output that differs between repeats of one configuration (only the first repeat's tokens "
                "are counted and compared above):", ""]
        out += [f"- **{p.config}** on {p.prompt_id}" for p in unstable]
    if meta.get("batched"):
        first = next(iter(meta["batched"].values()))
        out += ["", f"## Batched: every prompt at once, {first['max_num_seqs']} sequences at a time", "",
                "Continuous batching over the same prompts; tokens/s is all new tokens over the run's wall time, "
                "against the sum of the batch-1 median times; exact match compares each prompt's output with the "
                "same configuration at batch 1.", ""]
        rows = [[name, f"{b['tokens_per_s']:.2f}", f"{b['speedup_vs_batch1']:.2f}x", share(b['exact_match_rate']),
                 ", ".join(f"{m['prompt_id']}@{m['first_divergence']}" for m in b["mismatches"]) or "-"]
                for name, b in meta["batched"].items()]
        out += _table(["config", "tok/s", "vs batch 1", "exact match", "first divergences"], rows)
    if results.skipped:
        out += ["", "## Skipped", ""]
        out += [f"- {s['name']}: {s['reason']}" for s in results.skipped]
    return "\n".join(out) + "\n"
