"""The draft depth a head was trained for, read from the training.json that `specsure train` writes.

A head trained with ``--unroll N`` (MTP: or N modules) learned draft steps 1 .. N. A deeper step
feeds on the head's own output at a place it never learned to continue from, and accepts less.
Resolution says so in the reason of ``num_speculative_tokens``: a note for `explain`, not a
warning, since the config runs exactly as given.
"""

from __future__ import annotations

import json
from pathlib import Path

RECORD_FILE = "training.json"
"""How `specsure train` made a head (settings, data, figures); written beside its weights, read here for
the depth note and by train/starting_head.py for a continued head's history. The engine never reads it."""


def trained_depth(folder: str) -> int | None:
    """Draft steps the head in ``folder`` was trained for, or None when it has no readable record.

    The record is documentation, not part of the checkpoint's format (vLLM and SGLang ignore it), so
    a missing or unreadable one only means there is nothing to say.
    """
    try:
        record = json.loads((Path(folder) / RECORD_FILE).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    settings = record.get("settings") if isinstance(record, dict) else None
    if not isinstance(settings, dict):
        return None
    unroll, modules = settings.get("unroll"), settings.get("modules", 1)
    if not (_count(unroll, 0) and _count(modules, 1)):
        return None
    return max(unroll, modules)  # unroll 0 (older MTP records): one step per module


def _count(value: object, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def depth_note(folder: str, depth: int) -> str:
    """A sentence for a draft ``depth`` steps deep from the head in ``folder``; empty when it was trained that deep."""
    trained = trained_depth(folder)
    if trained is None or depth <= trained:
        return ""
    steps = "step" if trained == 1 else "steps"
    return (f" The head was trained for {trained} draft {steps} ({RECORD_FILE}: settings.unroll), so drafts past "
            f"depth {trained} accept less; train one with --unroll {depth} for this depth (docs/training.md).")
