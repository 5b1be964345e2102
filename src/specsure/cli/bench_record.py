"""What `specsure bench` records about a run and prints at its end: the machine, versions and commit
that made the figures, the files written, and the summary table."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from specsure.bench.plots import plot_acceptance, plot_speedup
from specsure.bench.report import render_markdown, share
from specsure.bench.results import ALL, BenchResults
from specsure.config.cpu import cpu_model


def run_meta(command: str, args: argparse.Namespace, target: Any, settings: Any, max_tokens: int, repeats: int,
             prompts: int, llama_meta: dict[str, Any]) -> dict[str, Any]:
    """results.json's ``meta``: how to run it again, and everything the figures depend on."""
    import torch
    import transformers

    return {
        "command": command,
        "specsure_commit": git_commit(),
        "model": args.model or "SmolLM2-135M-Instruct (packaged default)",
        "model_path": target.path,
        "dtype": settings.dtype,
        "dtype_reason": target.dtype_reason,
        "forward": target.lm.path,
        "threads": torch.get_num_threads(),
        "cores": os.cpu_count(),
        "cpu": cpu_model(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "max_tokens": max_tokens,
        "repeats": repeats,
        "warmup": args.warmup,
        "num_speculative_tokens": settings.num_speculative_tokens,
        "head_num_speculative_tokens": args.num_speculative_tokens,
        "prompts": prompts,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **llama_meta,
    }


def git_commit(folder: Path = Path(__file__).parent.parent) -> str:
    """The commit of the specsure checkout holding ``folder`` (the package), so a figure can be traced to the
    code that made it; marked when tracked files there differ from it (a head or module not yet committed),
    since then the commit alone names other code."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=folder, capture_output=True, text=True,
                              timeout=10)
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "."], cwd=folder,
                                 capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if head.returncode != 0:
        return "unknown"
    dirty = changed.returncode == 0 and changed.stdout.strip()
    return head.stdout.strip() + (" with uncommitted changes" if dirty else "")


def other_load(threads: int) -> str | None:
    """A note when other processes keep the cores busy: a thread pool as wide as the cores then waits on
    them at every step, and slows by far more than a library that uses fewer threads."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # not on this platform
        return None
    cores = os.cpu_count() or 1
    if load < 0.75 * cores:
        return None
    return (f"note: the load average is {load:.1f} on {cores} cores before this run: other processes share them, "
            f"and with {threads} threads a step waits for whichever is descheduled, so timings are noisy and can "
            "favour a configuration that uses fewer threads; run on an idle machine, or with fewer --threads")


def write_outputs(results: BenchResults, out_dir: Path) -> None:
    """results.json, results.md, speedup.png and acceptance.png, all from `results`."""
    results.write_json(out_dir / "results.json")
    (out_dir / "results.md").write_text(render_markdown(results), encoding="utf-8")
    plot_speedup(results, out_dir / "speedup.png")
    plot_acceptance(results, out_dir / "acceptance.png")


def print_summary(results: BenchResults, out_dir: Path) -> None:
    print()
    print(f"{'config':<24}{'tok/s':>8}{'vs plain':>10}{'vs HF':>8}{'acc.len':>9}{'match':>8}  own plain")
    for r in results.summary:
        if r.category != ALL:
            continue
        vs_plain = "-" if r.speedup_vs_plain is None else f"{r.speedup_vs_plain:.2f}x"
        vs_hf = "-" if r.speedup_vs_hf is None else f"{r.speedup_vs_hf:.2f}x"
        acc = "-" if r.mean_acceptance_length is None else f"{r.mean_acceptance_length:.2f}"
        match = "ref" if r.exact_match_rate is None else share(r.exact_match_rate)
        own = "" if r.own_plain is None else f"  {share(r.own_plain_exact_match_rate)} vs {r.own_plain}"
        print(f"{r.config:<24}{r.tokens_per_s:>8.2f}{vs_plain:>10}{vs_hf:>8}{acc:>9}{match:>8}{own}")
    if results.mismatched:
        bar = "!" * 72
        print(f"\n{bar}\nOUTPUT MISMATCH: these configurations differ from '{results.reference}' (greedy):")
        for r in results.mismatched:
            where = ", ".join(f"{m['prompt_id']}@{m['first_divergence']}" for m in r.mismatches)
            print(f"  {r.config} on {r.category}: {where}")
        print(f"(prompt@first divergent new token; bf16 kernels can flip near-tied argmaxes, see BENCHMARKS.md)\n{bar}")
    for p in results.prompts:
        if not p.deterministic:
            print(f"note: {p.config} on {p.prompt_id}: its greedy repeats differ (the first repeat is counted)")
    for name, b in results.meta.get("batched", {}).items():
        print(f"batched {name}: {b['tokens_per_s']:.1f} tok/s, {b['speedup_vs_batch1']:.2f}x its batch-1 run, "
              f"{share(b['exact_match_rate'])} equal to batch 1")
    print(f"\nwrote {out_dir}/results.json, results.md, speedup.png, acceptance.png")
