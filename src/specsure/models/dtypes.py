"""Choosing the torch dtype a model runs in."""

from __future__ import annotations

import logging
import platform
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
"""The explicit dtype names `load_model` accepts, besides "auto"."""

# CPU flags that make bf16 matmuls fast; without them bf16 is emulated and slower than fp32.
_FAST_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


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
    return tuple(f for f in _FAST_BF16_FLAGS if f in flags)


def resolve_dtype(dtype: str, *, cpuinfo: Path = Path("/proc/cpuinfo")) -> tuple[torch.dtype, str]:
    """Map a user dtype name to a torch dtype and a one-sentence reason for the choice.

    Raises:
        ValueError: `dtype` is neither "auto" nor one of `DTYPES`.
    """
    if dtype == "auto":
        flags = cpu_bf16_flags(cpuinfo)
        if flags:
            chosen = torch.bfloat16
            reason = f"dtype='auto' chose bfloat16 because this CPU has fast bf16 ({', '.join(flags)})."
        else:
            chosen = torch.float32
            reason = (
                "dtype='auto' chose float32 because this CPU reports no fast bf16 "
                f"({' or '.join(_FAST_BF16_FLAGS)} absent from {cpuinfo})."
            )
    elif dtype in DTYPES:
        chosen = DTYPES[dtype]
        reason = f"dtype={dtype!r} was given explicitly."
    else:
        valid = ", ".join(repr(n) for n in ("auto", *DTYPES))
        raise ValueError(f"dtype={dtype!r} is not valid; use one of {valid}.")
    logger.info("model dtype: %s (%s)", chosen, reason)
    return chosen, reason
