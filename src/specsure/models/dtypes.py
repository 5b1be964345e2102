"""Choosing the torch dtype a model runs in."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from specsure.config.dtype_choice import auto_dtype

logger = logging.getLogger(__name__)

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
"""The explicit dtype names `load_model` accepts, besides "auto"."""

def resolve_dtype(dtype: str, *, gguf: Path | None = None, cpuinfo: Path = Path("/proc/cpuinfo"),
                  engine: bool = True) -> tuple[torch.dtype, str]:
    """Map a user dtype name to a torch dtype and a one-sentence reason for the choice. 'auto'
    follows the CPU and, for a target read from the GGUF file ``gguf``, its blocks and what the
    model will hold (``engine``: an engine's, as `auto_dtype` takes it; config/dtype_choice.py).

    Raises:
        ValueError: `dtype` is neither "auto" nor one of `DTYPES`.
    """
    if dtype == "auto":
        name, reason = auto_dtype(gguf, cpuinfo, kernel_missing=_float_kernel_missing, engine=engine)
        chosen = DTYPES[name]
    elif dtype in DTYPES:
        chosen = DTYPES[dtype]
        reason = f"dtype={dtype!r} was given explicitly."
    else:
        valid = ", ".join(repr(n) for n in ("auto", *DTYPES))
        raise ValueError(f"dtype={dtype!r} is not valid; use one of {valid}.")
    logger.info("model dtype: %s (%s)", chosen, reason)
    return chosen, reason


def _float_kernel_missing() -> str:
    """Why the float32 kernel did not load ("" when it did): built here, so 'auto' never picks float32
    for a kernel that then fails to build."""
    from specsure.models import float_kernel  # lazily: only a GGUF of blocks on a fast-bf16 CPU asks

    kernel, why = float_kernel.load()
    return "" if kernel is not None else why
