"""Generation's progress, kept so that a data phase stopped part-way goes on where it stopped.

Generating the target's continuations is the slow part of the data phase (about half an hour for
the shipped heads' data on 2 cores, hours for more). `greedy_continuations` generates in chunks of
prompts; this store keeps each chunk's continuations (token ids only) as it finishes, so the same
run started again after Ctrl-C or a crash reads those back and generates only what is left.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from specsure.train.leftovers import sweep, tag

FORMAT = "specsure-train-continuations-1"


class ContinuationStore:
    """The continuations of each chunk of prompts, one JSON file per chunk beside the samples file of
    ``key``, written as the chunk finishes; `clear` removes them once the samples are stored.

    A chunk's continuations depend only on its own prompts (each chunk is one `Engine.generate`
    call, and the key covers the target, dtype, batch and length), so a resumed run's data equals
    an uninterrupted run's.
    """

    def __init__(self, folder: Path, key: str) -> None:
        self.folder = folder
        self.key = key
        self.resumed = 0
        """Prompts whose continuations came from an earlier, interrupted run."""

    def get(self, prompts: Sequence[Sequence[int]]) -> list[list[int]] | None:
        """The stored continuations of exactly these prompts, or None (never stored, unreadable or foreign)."""
        try:
            record = json.loads(self._path(prompts).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(record, dict):
            return None
        conts = record.get("continuations")
        if (record.get("format") != FORMAT or record.get("prompts") != [list(p) for p in prompts]
                or not isinstance(conts, list) or len(conts) != len(prompts)
                or not all(isinstance(c, list) and all(isinstance(t, int) for t in c) for c in conts)):
            return None
        self.resumed += len(prompts)
        return conts

    def put(self, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        record = {"format": FORMAT, "prompts": [list(p) for p in prompts],
                  "continuations": [list(c) for c in continuations]}
        sweep(self.folder, ".part-")
        handle, tmp = tempfile.mkstemp(prefix=f".part-{tag()}-", suffix=".tmp", dir=self.folder)
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                json.dump(record, out)
            os.replace(tmp, self._path(prompts))  # atomic: a chunk is stored whole or not at all
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def clear(self) -> None:
        """Remove every chunk of ``key``: the samples file now holds the whole data."""
        for path in self.folder.glob(f"{self.key}.part-*.json"):
            path.unlink(missing_ok=True)

    def _path(self, prompts: Sequence[Sequence[int]]) -> Path:
        digest = hashlib.sha256(json.dumps([list(p) for p in prompts]).encode()).hexdigest()[:32]
        return self.folder / f"{self.key}.part-{digest}.json"
