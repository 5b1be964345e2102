"""speedup.png and acceptance.png, drawn from `BenchResults`; each plot returns the numbers it drew."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from specsure.bench.load import Level
from specsure.bench.results import ALL, BenchResults


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    return plt


def speedup_data(results: BenchResults) -> dict[str, Any]:
    """{"categories": [...], "series": {config: [speedup vs plain per category]}}."""
    categories = [*results.categories, ALL]
    series = {}
    for cfg in results.configs:
        values = []
        for category in categories:
            row = results.row(cfg["name"], category)
            values.append(None if row is None else row.speedup_vs_plain)
        series[cfg["name"]] = values
    return {"categories": categories, "series": series, "reference": results.reference}


def acceptance_data(results: BenchResults) -> dict[str, Any]:
    """{"series": {config: [acceptance rate per draft position, all prompts]}}."""
    series = {}
    for cfg in results.configs:
        row = results.row(cfg["name"], ALL)
        if row is not None and row.per_position_acceptance:
            series[cfg["name"]] = list(row.per_position_acceptance)
    return {"series": series}


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_speedup(results: BenchResults, path: Path) -> dict[str, Any]:
    """Grouped bars: speedup vs the reference per category, one bar per configuration."""
    plt = _pyplot()
    data = speedup_data(results)
    categories, series = data["categories"], data["series"]
    fig, ax = plt.subplots(figsize=(max(7.0, 1.4 * len(categories)), 4.2))
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        xs = [c + (i - (len(series) - 1) / 2) * width for c in range(len(categories))]
        ax.bar(xs, [v or 0.0 for v in values], width, label=name)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(categories)), categories)
    ax.set_ylabel(f"speedup vs {data['reference']} (tokens/s ratio)")
    ax.set_title(f"{results.meta.get('model', 'model')} · {results.meta.get('dtype', '')} · greedy, batch 1")
    ax.legend(fontsize=8, ncols=min(4, max(1, len(series))))
    _save(fig, path)
    plt.close(fig)
    return data


def plot_acceptance(results: BenchResults, path: Path) -> dict[str, Any]:
    """Per-position acceptance rate (accepted at position i / drafts), all prompts."""
    plt = _pyplot()
    data = acceptance_data(results)
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for name, rates in data["series"].items():
        ax.plot(range(1, len(rates) + 1), rates, marker="o", label=name)
    if data["series"]:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no speculative method ran", ha="center", va="center", transform=ax.transAxes)
    ax.set_ylim(0, 1.05)
    ax.xaxis.get_major_locator().set_params(integer=True)  # positions are whole numbers
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate (per draft)")
    ax.set_title("per-position acceptance, all prompts")
    _save(fig, path)
    plt.close(fig)
    return data



def plot_load(levels: Sequence[Level], path: Path) -> dict[str, Any]:
    """`specsure bench serve`: output tokens/s and p99 inter-token latency against concurrency, per server."""
    plt = _pyplot()
    series: dict[str, dict[str, list[float]]] = {}
    for level in levels:
        row = series.setdefault(level.label, {"concurrency": [], "tokens_per_s": [], "itl_p99_ms": []})
        row["concurrency"].append(level.concurrency)
        row["tokens_per_s"].append(level.tokens_per_s)
        row["itl_p99_ms"].append(1e3 * level.itl_p99_s)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for label, row in series.items():
        left.plot(row["concurrency"], row["tokens_per_s"], marker="o", label=label)
        right.plot(row["concurrency"], row["itl_p99_ms"], marker="o", label=label)
    for axis, title in ((left, "aggregate output tokens/s"), (right, "inter-token latency p99 (ms)")):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("concurrent requests")
        axis.set_title(title)
        axis.grid(alpha=0.3)
    left.legend()
    _save(fig, path)
    plt.close(fig)
    return {"series": series}
