"""What dtype 'auto' runs a target in: by the CPU, and by whether the target is a GGUF of blocks.

Torch-free, so resolution (the shipped heads' default tree) and loading make the same choice.

A CPU with fast bf16 (AVX512-BF16, AMX) runs bf16 weights at memory speed, so 'auto' chose bf16
there. But a quantised GGUF target is faster still in float32: the float32 kernel reads its
matrices as the file's blocks (models/gguf_blocks.py), a fifth of the bytes of bf16 weights a
step, and computes with the file's own values rather than their bf16 roundings. On an AMX Xeon
that decoded the default model 1.43x faster than bf16 (BENCHMARKS.md, "Auto dtype follows the
weights"). So 'auto' picks float32 for such a target wherever the kernel can run.
"""

from __future__ import annotations

import os
import re
import shutil
from collections import Counter
from pathlib import Path
from typing import Final

from specsure.config.checkpoint import CheckpointInfo, default_gguf_path
from specsure.config.cpu import FAST_BF16_FLAGS, cpu_bf16_flags, cpu_flags
from specsure.config.gguf_header import read_gguf_tensors

KERNEL_BLOCK_TYPES: Final[dict[int, str]] = {2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 12: "Q4_K",
                                             13: "Q5_K", 14: "Q6_K"}
"""GGML type id -> name of the block formats the float32 kernel reads as they are."""
KERNEL_FLAGS: Final[tuple[str, ...]] = ("avx2", "fma")
"""CPU flags the float32 kernel needs (float_kernel.py)."""
_LAYER_MATRIX = re.compile(r"^blk\.\d+\.(attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down)\.weight$")
_BLOCK_ARCHITECTURES: Final[tuple[str, ...]] = ("llama",)
"""GGUF architectures whose blocks the loader maps onto the model's weights (Llama's q/k order)."""


def c_compiler() -> str | None:
    """The C compiler the kernels build with: $CC, else cc or gcc on PATH; None when there is none."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def gguf_blocks(gguf: Path | None) -> tuple[Counter[str], int, str]:
    """(kernel-readable block formats of the layers' weight matrices -> count, all of them, why not
    or ""): what the float32 kernel could read of ``gguf`` as blocks, from its header alone."""
    if gguf is None:
        return Counter(), 0, "the target is not a GGUF file"
    try:
        metadata, tensors = read_gguf_tensors(str(gguf))
    except (OSError, ValueError) as err:
        return Counter(), 0, f"its header cannot be read ({err})"
    architecture = metadata.get("general.architecture")
    if architecture not in _BLOCK_ARCHITECTURES:
        return Counter(), 0, f"the kernel reads blocks for {', '.join(_BLOCK_ARCHITECTURES)} only, not {architecture}"
    matrices = [t for t in tensors if _LAYER_MATRIX.match(t.name)]
    formats = Counter(KERNEL_BLOCK_TYPES[t.kind] for t in matrices if t.kind in KERNEL_BLOCK_TYPES)
    return formats, len(matrices), ""


def auto_dtype(gguf: Path | None, cpuinfo: Path = Path("/proc/cpuinfo")) -> tuple[str, str]:
    """(dtype name, one sentence why) that dtype 'auto' runs a target in, whose GGUF file is ``gguf``
    (None for a folder of safetensors)."""
    flags = cpu_bf16_flags(cpuinfo)
    if not flags:
        return "float32", ("dtype='auto' chose float32 because this CPU reports no fast bf16 "
                           f"({' or '.join(FAST_BF16_FLAGS)} absent from {cpuinfo}).")
    bf16 = f"dtype='auto' chose bfloat16 because this CPU has fast bf16 ({', '.join(flags)})"
    formats, total, why_not = gguf_blocks(gguf)
    if gguf is None:
        return "bfloat16", bf16 + "."
    blocked = sum(formats.values())
    if not why_not and 2 * blocked < max(total, 1):
        why_not = f"only {blocked} of its {total} layer weight matrices are in block formats the kernel reads"
    if not why_not:
        why_not = _kernel_missing(cpuinfo)
    if why_not:
        return "bfloat16", f"{bf16}; the float32 kernel would not read {gguf.name} as blocks: {why_not}."
    shown = ", ".join(f"{count} {name}" for name, count in formats.most_common())
    return "float32", (f"dtype='auto' chose float32 although this CPU has fast bf16 ({', '.join(flags)}): "
                       f"{gguf.name} holds {blocked} of its {total} layer weight matrices as blocks ({shown}), which "
                       "the float32 kernel reads as they are, a fraction of bf16's bytes a step and the file's own "
                       "values; pass dtype='bfloat16' for bf16.")


def run_dtype(target: CheckpointInfo, dtype: str) -> tuple[str, str]:
    """(dtype name, why) a run of ``target`` loads in when asked for ``dtype``, as `load_model` decides."""
    if dtype != "auto":
        return dtype, f"dtype={dtype!r} was given explicitly."
    gguf = default_gguf_path() if target.kind == "default" else Path(target.path) if target.kind == "gguf" else None
    return auto_dtype(gguf)


def _kernel_missing(cpuinfo: Path) -> str:
    """Why the float32 kernel cannot read blocks here ("" when it can), as far as the config layer knows."""
    if os.environ.get("SPECSURE_KERNEL", "1") == "0":
        return "SPECSURE_KERNEL=0 turns the C kernel off"
    if os.environ.get("SPECSURE_GGUF_BLOCKS") == "0":
        return "SPECSURE_GGUF_BLOCKS=0 keeps float32 weights"
    missing = [f for f in KERNEL_FLAGS if f not in cpu_flags(cpuinfo)]
    if missing:
        return f"this CPU lacks {', '.join(missing)}"
    if c_compiler() is None:
        return "no C compiler (cc or gcc) is on PATH to build it"
    return ""
