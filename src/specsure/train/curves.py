"""The training curves of written heads, drawn from their training.json: loss and held-out acceptance per step.

``python -m specsure.train.curves OUT.png HEAD_DIR ...`` (what `make heads` runs for
docs/training-curves.png). It imports no torch: a training.json is all it reads.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from specsure.config.training_record import RECORD_FILE

SMOOTH = 50
"""Steps in the running mean of the loss (one window per step is noisy)."""


def stages(training: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs that made a head, first to last: a run that continued a head (``--init-from``) keeps that
    head's training.json under ``continued_from``."""
    chain = [training]
    while isinstance(chain[-1].get("continued_from"), dict):
        chain.append(chain[-1]["continued_from"])
    return chain[::-1]


def curve_data(training: dict[str, Any], offset: int = 0) -> dict[str, Any]:
    """{"label", "steps", "loss" (running mean), "eval_steps", "acceptance"} of one run's training.json, its
    steps counted from ``offset`` (the steps of the runs it continued)."""
    losses = [float(v) for v in training.get("losses", [])]
    smoothed, total = [], 0.0
    for i, value in enumerate(losses):
        total += value - (losses[i - SMOOTH] if i >= SMOOTH else 0.0)
        smoothed.append(total / min(i + 1, SMOOTH))
    curve = training.get("curve", [])
    held = training.get("heldout", {})
    k = held.get("k") or len(held.get("top1_per_module", [])) or None  # the k its acceptance length is at
    label = str(training.get("method", "head")) + (" continued" if offset else "") + (f" (k = {k})" if k else "")
    return {"label": label, "steps": list(range(offset + 1, offset + len(losses) + 1)), "loss": smoothed,
            "eval_steps": [offset + int(c["step"]) for c in curve],
            "acceptance": [float(c["heldout_acceptance_length"]) for c in curve]}


def head_curves(training: dict[str, Any]) -> list[dict[str, Any]]:
    """`curve_data` of every run that made a head, each continuing the step count of the one before."""
    data, offset = [], 0
    for run in stages(training):
        data.append(curve_data(run, offset))
        offset += len(run.get("losses", []))
    return data


def plot_curves(folders: list[Path], out: Path) -> list[dict[str, Any]]:
    """One figure, loss on the left and held-out acceptance length on the right, a line per run; returns the data."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    data = [d for f in folders for d in head_curves(json.loads((Path(f) / RECORD_FILE).read_text()))]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for d in data:
        left.plot(d["steps"], d["loss"], label=d["label"])
        right.plot(d["eval_steps"], d["acceptance"], marker="o", label=d["label"])
    left.set(xlabel="step", ylabel=f"training loss (running mean of {SMOOTH})", title="loss")
    right.set(xlabel="step", ylabel="greedy acceptance length", title="held-out training text")
    for axis in (left, right):
        axis.grid(alpha=0.3)
        axis.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return data


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2:
        print("usage: python -m specsure.train.curves OUT.png HEAD_DIR [HEAD_DIR ...]", file=sys.stderr)
        return 2
    missing = [a for a in args[1:] if not (Path(a) / RECORD_FILE).is_file()]
    if missing:
        print(f"error: no training.json in {', '.join(missing)}; give folders written by specsure train.",
              file=sys.stderr)
        return 2
    plot_curves([Path(a) for a in args[1:]], Path(args[0]))
    print(f"wrote {args[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
