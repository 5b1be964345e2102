"""What this CPU reports: its feature flags and model name, read from /proc/cpuinfo.

Torch-free, so configuration can read it before anything loads: dtype 'auto' follows it (and the target's
weights, config/dtype_choice.py)
(models/dtypes.py), and so does the token tree a shipped head drafts by default (shipped.py).
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Final

DTYPE_NAMES: Final[tuple[str, ...]] = ("auto", "float32", "bfloat16", "float16")
"""The dtypes a run may ask for; 'auto' follows `cpu_bf16_flags` and the target (dtype_choice.py)."""
FAST_BF16_FLAGS: Final[tuple[str, ...]] = ("avx512_bf16", "amx_bf16")
"""CPU flags that make bf16 matmuls fast; without them bf16 is emulated and slower than float32."""


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The feature flags this CPU reports (empty when unreadable, or not on Linux)."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return set()
    flags: set[str] = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            flags.update(line.partition(":")[2].split())
    return flags


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name, as benchmark and training records name the machine."""
    try:
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_bf16_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> tuple[str, ...]:
    """Return the fast-bf16 flags this CPU reports (empty when none, or not on Linux)."""
    flags = cpu_flags(cpuinfo)
    return tuple(f for f in FAST_BF16_FLAGS if f in flags)
