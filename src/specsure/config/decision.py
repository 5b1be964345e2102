"""One field's resolved value, where it came from, and why."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Source = Literal["user", "checkpoint", "path", "default", "derived"]


@dataclass(frozen=True)
class Decision:
    """One field's effective value and why."""

    field: str
    value: Any
    source: Source
    reason: str
    """One human sentence: why this value."""
