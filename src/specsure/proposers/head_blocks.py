"""Draft heads read Q8_0 blocks where their target reads a GGUF file's blocks.

A GGUF target's decode step streams its 4- to 8-bit blocks (models/gguf_blocks.py), but a draft
head from safetensors streamed float32 weights: the shipped MTP head's step read 17 MB for its
block and eh_proj, the EAGLE-3 head's 39 MB, next to about 80 MB for the whole target, a large part
of why both heads lost to plain decoding on AVX2. Quantised to Q8_0 (llama.cpp's 8-bit format: an
int8 per weight and a scale per 32) they read about a quarter of that.

This changes only which tokens a head proposes: the target verifies every draft with its own
weights, so greedy output still equals plain decoding bit for bit and sampled output keeps the
target's distribution (with a fixed seed the sampled text may differ, as other drafts draw other
random numbers). It applies only where the target itself reads blocks; ``SPECSURE_HEAD_BLOCKS=0``
keeps the float32 head (for comparing the two).

The head's Q8_0 blocks are multiplied with int8 activations (packed 8 rows side by side, as a
target with ``--int8-activations`` has its own), whether the target's products are int8 or float32:
for the same reason, a draft's arithmetic is free, and on AVX2 a one-row float32 product over
blocks is bound by dequantising while the integer one waits only on memory. A draft model's GGUF
blocks take them too (proposers/factory.py). Beside a float32 target this is left out on CPUs with
AMX tiles (not measured there, and a draft model would leave its tiles), and
``SPECSURE_DRAFT_INT8=0`` keeps the drafts' products float32 (for comparing the two).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch

from specsure.models.gguf_blocks import BlockMatrix, q8_blocks
from specsure.proposers.head_layer import RowLinear

if TYPE_CHECKING:
    from specsure.models.causal_lm import CausalLM
    from specsure.models.float_kernel import AnyKernel, FloatKernel

ENV = "SPECSURE_HEAD_BLOCKS"
INT8_ENV = "SPECSURE_DRAFT_INT8"


def _reads_blocks(lm: "CausalLM") -> bool:
    """Whether ``lm`` reads a GGUF's blocks on the float32 kernel."""
    kernel = lm.row_kernel
    return (bool(lm.blocks_used) and lm.dtype == torch.float32 and kernel is not None
            and hasattr(kernel, "linear_blocks"))


def blocks_wanted(lm: "CausalLM") -> bool:
    """Whether a head of ``lm`` should read Q8_0 blocks: the target reads a GGUF's blocks on the
    float32 kernel, and ``SPECSURE_HEAD_BLOCKS`` is not 0."""
    return os.environ.get(ENV) != "0" and _reads_blocks(lm)


def int8_wanted(lm: "CausalLM") -> bool:
    """Whether the drafts for target ``lm`` (a head's Q8_0 blocks, a draft model's GGUF blocks) should be
    multiplied with int8 activations: where ``lm`` has them, and where it reads a GGUF's blocks in
    float32 on a CPU without AMX tiles (measured on AVX2 only; a draft model there would leave its
    tiles) unless ``SPECSURE_DRAFT_INT8`` is 0."""
    return lm.int8_matrices > 0 or (os.environ.get(INT8_ENV) != "0" and _reads_blocks(lm)
                                    and not getattr(lm.row_kernel, "amx", False))


def blocks_note(quantised: int, lm: "CausalLM") -> str:
    """What a head's load log line ends with: how many of its matrices read Q8_0 blocks, and with
    int8 activations where they take the target's; empty for none."""
    if not quantised:
        return ""
    int8 = " with int8 activations" if int8_wanted(lm) else ""
    return f"; {quantised} head matrices read as Q8_0 blocks{int8}"


def with_int8(module: torch.nn.Module, kernel: "FloatKernel", fused: list[BlockMatrix | None]) -> list[BlockMatrix | None]:
    """Every `RowLinear` of ``module`` with Q8_0 blocks, and the ``fused`` matrices stacked from them,
    made the kernel's int8-activation kind (`FloatKernel.prepared`); returns the fused ones. After the
    stacking: packed matrices do not stack."""
    packed: dict[int, BlockMatrix] = {}  # by the id of the Q8_0 blocks, which ``fused`` keeps alive
    for sub in module.modules():
        if isinstance(sub, RowLinear) and sub.blocks is not None:
            original, sub.blocks = sub.blocks, kernel.prepared(sub.blocks, True)
            packed[id(original)] = sub.blocks
    # a part that is itself a RowLinear's blocks (an MTP block's o and down) is packed once, not twice
    return [None if matrix is None else packed.get(id(matrix)) or kernel.prepared(matrix, True) for matrix in fused]


def use_linear_blocks(module: torch.nn.Module, skip: tuple[torch.nn.Module, ...] = ()) -> int:
    """Give every float32 `RowLinear` of ``module`` but ``skip`` Q8_0 blocks of its weight (a snapshot:
    `clear_linear_blocks` before the weights change); returns how many."""
    count = 0
    for sub in module.modules():
        if (isinstance(sub, RowLinear) and sub.weight.dtype == torch.float32 and hasattr(sub.kernel, "linear_blocks")
                and not any(sub is s for s in skip)):
            sub.blocks = q8_blocks(sub.weight)
            count += sub.blocks is not None
    return count


def clear_linear_blocks(module: torch.nn.Module) -> None:
    """Have every `RowLinear` of ``module`` read its float32 weight again."""
    for sub in module.modules():
        if isinstance(sub, RowLinear):
            sub.blocks = None


def product(kernel: "AnyKernel", weight: torch.Tensor, blocks: BlockMatrix | None, x: torch.Tensor) -> torch.Tensor:
    """x [n, k] . weight [m, k]^T on ``kernel``: over ``blocks`` (the same matrix as Q8_0) when given."""
    if blocks is not None:
        return kernel.linear_blocks(blocks, x)  # type: ignore[union-attr]
    return kernel.linear_rows(weight, x)
