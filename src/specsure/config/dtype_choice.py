"""What dtype 'auto' runs a target in: by the CPU, and by whether the target is a GGUF of blocks.

Torch-free, so resolution (the shipped heads' default tree) and loading make the same choice.

A CPU with fast bf16 (AVX512-BF16, AMX) runs bf16 weights at memory speed, so 'auto' chose bf16
there. But a quantised GGUF target is faster still in float32: the float32 kernel reads its
matrices as the file's blocks (models/gguf_blocks.py), a fifth of the bytes of bf16 weights a
step, and computes with the file's own values rather than their bf16 roundings. On an AMX Xeon
that decoded the default model 1.42x to 1.48x faster than bf16 (BENCHMARKS.md, "Auto dtype follows the
weights"). So 'auto' picks float32 for such a target wherever the kernel can run.
"""

from __future__ import annotations

import math
import os
import re
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Final

from specsure.config.checkpoint import CheckpointInfo, default_gguf_path
from specsure.config.cpu import FAST_BF16_FLAGS, cpu_bf16_flags, cpu_flags
from specsure.config.gguf_header import read_gguf_tensors

KERNEL_BLOCK_TYPES: Final[dict[int, str]] = {2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 12: "Q4_K",
                                             13: "Q5_K", 14: "Q6_K"}
"""GGML type id -> name of the block formats the float32 kernel reads as they are."""
BLOCK_SIZES: Final[dict[int, tuple[int, int]]] = {2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
                                                  12: (256, 144), 13: (256, 176), 14: (256, 210)}
"""GGML type id -> (weights per block, bytes per block) of those formats, as ggml lays them out."""
KERNEL_FLAGS: Final[tuple[str, ...]] = ("avx2", "fma")
"""CPU flags the float32 kernel needs (float_kernel.py)."""
KERNEL_ENV: Final[str] = "SPECSURE_KERNEL"
"""0 turns the C kernels off (``dot`` keeps the bf16 one off AMX tiles: kernel.py)."""
_LAYER_MATRIX = re.compile(r"^blk\.\d+\.(attn_q|attn_k|attn_v|attn_qkv|attn_output|ffn_gate|ffn_up|ffn_down)\.weight$")
BLOCK_ARCHITECTURES: Final[dict[str, bool]] = {"llama": True, "phi3": False, "qwen2": False, "qwen3": False,
                                               "gemma2": False, "gemma3": False}
"""GGUF architectures whose blocks the loader maps onto the model's weights, and whether llama.cpp's
converter interleaved their q and k rows for its rotary (its Llama converter does; its Phi-3, Qwen2,
Qwen3 and Gemma ones keep transformers' order)."""
GGUF_ARCHITECTURES: Final[dict[str, str]] = {"gemma3_text": "gemma3"}
"""transformers' model_type -> the GGUF architecture, where the names differ."""


def c_compiler() -> str | None:
    """The C compiler the kernels build with: $CC, else cc or gcc on PATH; None when there is none."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


@dataclass(frozen=True)
class GGUFBlocks:
    """What the float32 kernel could read of a GGUF file as blocks, from its header alone."""

    formats: Counter[str]
    """Kernel-readable block formats of the layers' weight matrices -> how many."""
    matrices: int
    """The layers' weight matrices, in any format."""
    parameters: int
    """Every tensor's elements: the float32 weights the model holds beside the blocks."""
    blocked: int = 0
    """Of them, the elements of the layer matrices in those formats (an engine holds them as blocks only)."""
    block_bytes: int = 0
    """Those matrices' bytes in the file."""
    why_not: str = ""
    """Why none can be read ("" when the counts above say)."""


def gguf_blocks(gguf: Path | None) -> GGUFBlocks:
    """What of ``gguf`` the float32 kernel could read as blocks."""
    if gguf is None:
        return GGUFBlocks(Counter(), 0, 0, why_not="the target is not a GGUF file")
    try:
        metadata, tensors = read_gguf_tensors(str(gguf))
    except (OSError, ValueError) as err:
        return GGUFBlocks(Counter(), 0, 0, why_not=f"its header cannot be read ({err})")
    architecture = metadata.get("general.architecture")
    if architecture not in BLOCK_ARCHITECTURES:
        return GGUFBlocks(Counter(), 0, 0, why_not=f"the kernel reads blocks for {', '.join(BLOCK_ARCHITECTURES)} "
                                                   f"only, not {architecture}")
    matrices = [t for t in tensors if _LAYER_MATRIX.match(t.name)]
    readable = [t for t in matrices if t.kind in KERNEL_BLOCK_TYPES]
    formats = Counter(KERNEL_BLOCK_TYPES[t.kind] for t in readable)
    blocked = sum(math.prod(t.shape) for t in readable)
    block_bytes = sum(math.prod(t.shape) // BLOCK_SIZES[t.kind][0] * BLOCK_SIZES[t.kind][1] for t in readable)
    return GGUFBlocks(formats, len(matrices), sum(math.prod(t.shape) for t in tensors), blocked, block_bytes)


def target_gguf(path: str | None) -> Path | None:
    """The GGUF file a target path names (the packaged default's for None), resolved as loading
    resolves it; None for a folder or anything else."""
    if path is None:
        return default_gguf_path()
    p = Path(path).expanduser()
    return p.resolve() if p.suffix.lower() == ".gguf" and p.is_file() else None


def auto_dtype(gguf: Path | None, cpuinfo: Path = Path("/proc/cpuinfo"), *,
               kernel_missing: Callable[[], str] | None = None,
               meminfo: Path = Path("/proc/meminfo"), engine: bool = True) -> tuple[str, str]:
    """(dtype name, one sentence why) that dtype 'auto' runs a target in, whose GGUF file is ``gguf``
    (None for a folder of safetensors). Beyond what the config layer can tell without building the
    float32 kernel, ``kernel_missing`` says why it did not load ("" when it did). ``engine``: the model
    is an engine's, which holds the matrices the kernel reads as blocks only (`load_model`'s
    ``release_weights``); else every float32 weight stays beside them."""
    flags = cpu_bf16_flags(cpuinfo)
    if not flags:
        return "float32", ("dtype='auto' chose float32 because this CPU reports no fast bf16 "
                           f"({' or '.join(FAST_BF16_FLAGS)} absent from {cpuinfo}).")
    bf16 = f"dtype='auto' chose bfloat16 because this CPU has fast bf16 ({', '.join(flags)})"
    if gguf is None:
        return "bfloat16", bf16 + "."
    found = gguf_blocks(gguf)
    blocked, why_not = sum(found.formats.values()), found.why_not
    if not why_not and 2 * blocked < max(found.matrices, 1):
        why_not = f"only {blocked} of its {found.matrices} layer weight matrices are in block formats the kernel reads"
    if not why_not:
        why_not = _memory_short(found, meminfo, engine)
    if not why_not:
        why_not = _kernel_missing(cpuinfo) or (kernel_missing() if kernel_missing is not None else "")
    if why_not:
        return "bfloat16", f"{bf16}; the float32 kernel would not read {gguf.name} as blocks: {why_not}."
    shown = ", ".join(f"{count} {name}" for name, count in found.formats.most_common())
    return "float32", (f"dtype='auto' chose float32 although this CPU has fast bf16 ({', '.join(flags)}): "
                       f"{gguf.name} holds {blocked} of its {found.matrices} layer weight matrices as blocks ({shown}), "
                       "which the float32 kernel reads as they are, a fraction of bf16's bytes a step and the file's "
                       f"own values ({_held(engine)}); pass dtype='bfloat16' for bf16.")


def run_dtype(target: CheckpointInfo, dtype: str) -> tuple[str, str]:
    """(dtype name, why) an engine's run of ``target`` loads in when asked for ``dtype``, as `load_model`
    decides for `make_engine` (short of building the kernel)."""
    if dtype != "auto":
        return dtype, f"dtype={dtype!r} was given explicitly."
    return auto_dtype(target_gguf(None if target.kind == "default" else target.path))


def _held(engine: bool) -> str:
    """What a float32 model of blocks holds, said in the choice's reason."""
    return ("an engine holds those matrices as blocks only, and float32 weights where no block replaces them"
            if engine else "its float32 weights, twice bf16's memory, are kept too, for transformers' own modules")


def _memory_short(found: GGUFBlocks, meminfo: Path, engine: bool) -> str:
    """Why the float32 model of ``found``'s file would not fit ("" when it would, or when the available
    memory cannot be read): what it holds may take at most half of it. An engine holds the blocks
    and the float32 weights no block replaces; any other load every float32 weight beside the blocks."""
    try:
        lines = meminfo.read_text(encoding="utf-8").splitlines()
        available = next(int(line.split()[1]) * 1024 for line in lines if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return ""
    held = found.block_bytes + 4 * (found.parameters - found.blocked) if engine else 4 * found.parameters
    if held <= available // 2:
        return ""
    what = "its blocks and the float32 weights no block replaces" if engine else "its float32 weights"
    return (f"{what} ({held / 2**30:.1f} GiB{'' if engine else ', kept beside the blocks'}) would take more than "
            f"half the memory available ({available / 2**30:.1f} GiB)")


def build_blocker(cpu_needed: tuple[str, ...], source_name: str, cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """Why a C kernel needing ``cpu_needed`` cannot be built here ("" when nothing stands in the way):
    turned off, a CPU flag missing, or no compiler. The kernels' loader asks this before it builds."""
    if os.environ.get(KERNEL_ENV, "1") == "0":
        return f"{KERNEL_ENV}=0 turns the C kernel off"
    missing = [f for f in cpu_needed if f not in cpu_flags(cpuinfo)]
    if missing:
        return f"this CPU lacks {', '.join(missing)}"
    if c_compiler() is None:
        return f"no C compiler (cc or gcc) is on PATH; install gcc for the C kernel {source_name}"
    return ""


def _kernel_missing(cpuinfo: Path) -> str:
    """Why the float32 kernel cannot read blocks here ("" when it can), as far as the config layer knows."""
    kernel_on = os.environ.get(KERNEL_ENV, "1") != "0"  # the kernel's switch is named first, as before
    if kernel_on and os.environ.get("SPECSURE_GGUF_BLOCKS") == "0":
        return "SPECSURE_GGUF_BLOCKS=0 keeps float32 weights"
    return build_blocker(KERNEL_FLAGS, "float_kernel.c", cpuinfo)
