"""Choosing the torch dtype a model runs in."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from specsure.config.cpu import FAST_BF16_FLAGS, cpu_bf16_flags, cpu_flags, cpu_model  # noqa: F401 (older import path)

logger = logging.getLogger(__name__)

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
"""The explicit dtype names `load_model` accepts, besides "auto"."""

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
                f"({' or '.join(FAST_BF16_FLAGS)} absent from {cpuinfo})."
            )
    elif dtype in DTYPES:
        chosen = DTYPES[dtype]
        reason = f"dtype={dtype!r} was given explicitly."
    else:
        valid = ", ".join(repr(n) for n in ("auto", *DTYPES))
        raise ValueError(f"dtype={dtype!r} is not valid; use one of {valid}.")
    logger.info("model dtype: %s (%s)", chosen, reason)
    return chosen, reason
