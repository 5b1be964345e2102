"""The float32 C kernel (float_kernel.c): AVX2 + FMA forwards and products, built and loaded like kernel.py's.

On a CPU without fast bf16, dtype='auto' runs float32 (and for a GGUF target of blocks on any CPU where
this kernel builds), and torch's products over one to eight rows
read the weights at a third to a half of the memory bandwidth. This kernel streams each weight
once per forward whatever the row count, runs a run of decoder layers in one call, and keeps
every row's bits independent of the rows beside it (a verify row equals the decode step). It
needs AVX2, FMA and a C compiler; without them `load` says why and torch runs instead.
`SPECSURE_KERNEL=0` turns it off too.
"""

from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from specsure.config.cpu import cpu_flags
from specsure.config.dtype_choice import KERNEL_FLAGS, build_blocker
from specsure.models.decoder_family import head_dim
from specsure.models.gguf_blocks import (
    A4, A8, NARROW, PACKED, Q4_0, Q4_1, Q8_0, R5_0, R5_M, R6_H, STREAMED, BlockMatrix, block_bytes,
)
from specsure.models.kernel import Kernel, RowOps, SegmentStruct, ShapeStruct, open_library

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("float_kernel.c")
FLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC")
_CPU_FLAGS = KERNEL_FLAGS
WIDE_FLAGS = ("-mavx512f",)
"""Added on a CPU with avx512f: the products on 16 lanes. The one-row step is bound by the
instructions that dequantise and multiply, not by memory, so half as many made it faster
(BENCHMARKS.md, "AVX-512 products")."""
LANES_ENV = "SPECSURE_FLOAT_LANES"
"""Set to 8 to build and load the AVX2 products on an AVX-512 CPU (for comparing the two)."""
AMX_FLAGS = ("-mavx512bw", "-mavx512bf16", "-mamx-tile", "-mamx-bf16")
"""Added to the AVX-512 build on a CPU with AMX: Q4_0, Q4_1 and Q8_0 matrices on AMX tiles (float_kernel.c's
A4 and A8), where a product over 2 to 5 rows costs little more than one row does."""
AMX_CPU_FLAGS = frozenset({"avx512bw", "avx512_bf16", "amx_tile", "amx_bf16"})
AMX_ENV = "SPECSURE_AMX"
"""Set to 0 to keep every product off the AMX tiles (the AVX-512 build; for comparing the two)."""
MATRICES = ("qkv", "o", "gate_up", "down")
"""A layer's weight matrices, each float32 rows or GGUF blocks (float_kernel.c's Layer)."""
MAX_HEAD_DIM = 512
"""float_kernel.c's MAX_DIM: the head size its attention's output buffer holds."""

__all__ = ["AnyKernel", "FloatKernel", "FloatLayerStruct", "MAX_HEAD_DIM", "load"]


class FloatLayerStruct(ctypes.Structure):
    """float_kernel.c's Layer: one decoder layer's float32 weights (the caches travel in segments)."""

    _fields_ = ([(name, ctypes.c_void_p) for name in
                 ("input_norm", "qkv", "qkv_bias", "o", "o_bias", "post_norm", "gate_up", "down")]
                + [(f"{name}_format", ctypes.c_int64) for name in MATRICES]
                + [(name, ctypes.c_void_p) for name in ("q_norm", "k_norm", "attn_out_norm", "mlp_out_norm", "cos", "sin")]
                + [(name, ctypes.c_int64) for name in ("window", "gelu")])
    """A matrix's ``*_format`` is 0 (float32 rows, what ctypes zero-fills) or a `gguf_blocks` format,
    its pointer then at the repacked blocks; ``q_norm`` and ``k_norm`` are Qwen3's and Gemma 3's per-head
    norms (NULL without); ``attn_out_norm`` and ``mlp_out_norm`` Gemma 3's norms of the attention's and
    the MLP's outputs; ``cos`` and ``sin`` this layer's RoPE rows where they are not the call's (Gemma 3's
    sliding layers), set before each call; ``window`` a sliding window (0: none); ``gelu`` 1 for GELU's
    tanh form in the MLP (0: SiLU)."""


def _pointer(tensor: torch.Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()


@dataclass(frozen=True)
class FloatKernel(RowOps):
    """The loaded library's entry points, named and called as `kernel.Kernel`'s are, so the draft
    heads' C paths run on either (the tensors are float32 here)."""

    library: ctypes.CDLL
    amx: bool = False
    """Whether Q4_0, Q4_1 and Q8_0 matrices may be packed for AMX tiles (`amx_pack`): the AMX build, and
    Linux granted the tiles."""
    dtype = torch.float32
    layer_struct = FloatLayerStruct

    def amx_pack(self, matrix: BlockMatrix) -> BlockMatrix | None:
        """``matrix`` packed for the AMX tiles (the same weights, float32-accurate products whose
        rows do not depend on each other), or None where it cannot be: no AMX, a format other than
        Q4_0, Q4_1 or Q8_0, or a row count that is not a multiple of 16."""
        if not self.amx or matrix.format not in (Q4_0, Q4_1, Q8_0) or matrix.rows % 16:
            return None
        # A4, the bytes of Q4_1 blocks: 16 rows' 32 weights in 256 bytes of nibbles, 16 d, 16 m; A8, those
        # of Q8_0 blocks: 512 bytes of int8 and 16 d
        eight = matrix.format == Q8_0
        data = torch.empty(matrix.rows, matrix.cols // 32 * (36 if eight else 24), dtype=torch.uint8)
        self.library.amx_pack(matrix.data.data_ptr(), matrix.format, matrix.rows, matrix.cols, data.data_ptr())
        return BlockMatrix(data, A8 if eight else A4, matrix.rows, matrix.cols, matrix.kind)

    def int8_pack(self, matrix: BlockMatrix) -> BlockMatrix | None:
        """A block ``matrix`` packed for the integer products 8 rows side by side (`gguf_blocks.PACKED`,
        or `gguf_blocks.NARROW` where its quants fit 5 or 6 bits, as a Q5 or Q6_K file's do; the same
        weights, each output its own lane, a last group of fewer rows padded with zero rows), or None
        for float32 rows or a matrix already packed."""
        packed = PACKED.get(matrix.format)
        if packed is None:
            return None
        groups = -(-matrix.rows // 8)
        narrow = NARROW.get(matrix.format)
        if narrow is not None and _fits(matrix, narrow[1], narrow[2]):  # 24 to 32 bytes a block instead of 36 or 40
            row_bytes = matrix.cols // 32 * {R5_0: 24, R5_M: 28, R6_H: 32}[narrow[0]]
            data = torch.empty(groups * 8, row_bytes, dtype=torch.uint8)
            self.library.int8_pack_narrow(matrix.data.data_ptr(), matrix.format, matrix.rows, matrix.cols,
                                          data.data_ptr())
            return BlockMatrix(data, narrow[0], matrix.rows, matrix.cols, matrix.kind)
        # per 8 rows and block: their quants, then each of the block's scales for the 8 rows: as many
        # bytes as the blocks
        data = torch.empty(groups * 8, matrix.cols // 32 * block_bytes(matrix.format), dtype=torch.uint8)
        self.library.int8_pack(matrix.data.data_ptr(), matrix.format, matrix.rows, matrix.cols, data.data_ptr())
        return BlockMatrix(data, packed, matrix.rows, matrix.cols, matrix.kind)

    def prepared(self, matrix: BlockMatrix, int8_activations: bool) -> BlockMatrix:
        """How this kernel reads a checked block ``matrix``: packed for the integer products where int8
        activations are wanted, else on AMX tiles where it can be packed, else as it is."""
        if int8_activations and (packed := self.int8_pack(matrix)):
            return packed
        return self.amx_pack(matrix) or matrix

    def linear_rows(self, weight: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ weight.T + bias`` for float32 rows ``x`` ([m, in], row-major) -> [m, out]; each row's
        bits do not depend on m. ``weight`` and ``bias`` must be contiguous float32."""
        out = torch.empty(x.shape[0], weight.shape[0], dtype=torch.float32)
        self.library.linear_rows(weight.data_ptr(), _pointer(bias), x.data_ptr(), out.data_ptr(), weight.shape[0],
                                 weight.shape[1], x.shape[0])
        return out

    def linear_blocks(self, weight: "BlockMatrix", x: torch.Tensor, bias: torch.Tensor | None = None, *,
                      streamed: bool = False) -> torch.Tensor:
        """`linear_rows` over a `BlockMatrix`: the same bits as over the float32 rows it dequantises to.
        ``streamed``: a decoder's matrix, read once a step, whose prefetches keep out of the cache (`STREAMED`)."""
        out = torch.empty(x.shape[0], weight.rows, dtype=torch.float32)
        self.library.linear_blocks(weight.data.data_ptr(), weight.format | (STREAMED if streamed else 0),
                                   _pointer(bias), x.data_ptr(),
                                   out.data_ptr(), weight.rows, weight.cols, x.shape[0])
        return out

    def dequantized_rows(self, weight: "BlockMatrix", ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` (integers, any shape, each in range: not checked here) of a `BlockMatrix` as float32
        [..., cols]: the bits of `BlockMatrix.dequantized`'s rows."""
        flat = ids.reshape(-1).to(torch.int64).contiguous()  # the C side reads int64 ids
        out = torch.empty(*ids.shape, weight.cols, dtype=torch.float32)
        self.library.dequant_rows(weight.data.data_ptr(), weight.format, flat.data_ptr(), flat.shape[0], weight.cols,
                                  out.data_ptr())
        return out

    def decode_rows(self, shape: ShapeStruct, layers: ctypes.Array, first: int, count: int, segments: ctypes.Array,
                    per_layer: int, cos: torch.Tensor, sin: torch.Tensor, x: torch.Tensor,
                    scratch: torch.Tensor) -> None:
        """Run layers ``first .. first + count`` on the rows ``x`` ([rows, hidden] float32, in place);
        ``segments`` holds ``per_layer`` segments for each layer, layer 0's first."""
        self.library.decode_rows(ctypes.byref(shape), ctypes.byref(layers, first * ctypes.sizeof(FloatLayerStruct)),
                                 count, ctypes.byref(segments, first * per_layer * ctypes.sizeof(SegmentStruct)),
                                 per_layer, x.shape[0], cos.data_ptr(), sin.data_ptr(), x.data_ptr(),
                                 scratch.data_ptr())

    @staticmethod
    def rows_scratch(shape: ShapeStruct, rows: int) -> torch.Tensor:
        """The float32 scratch buffer `decode_rows` needs for ``rows`` rows of a decoder of ``shape``."""
        per_row = 2 * shape.hidden + (2 * shape.heads + 2 * shape.kv_heads) * shape.head_dim + 3 * shape.intermediate
        return torch.empty(rows * per_row, dtype=torch.float32)


AnyKernel = Kernel | FloatKernel
"""The C kernel a model's draft heads share: the bf16 one or the float32 one, whichever the target runs."""


def _fits(matrix: BlockMatrix, low: int, high: int) -> bool:
    """Whether every quant of an int8 block ``matrix`` (Q8_0, Q8_M, Q8_H) lies in ``low`` .. ``high``."""
    header = 4 if matrix.format == Q8_0 else 8
    quants = matrix.data.view(matrix.rows, matrix.cols // 32, header + 32)[..., header:].view(torch.int8)
    if quants.numel() == 0:
        return False
    least, most = torch.aminmax(quants)
    return int(least) >= low and int(most) <= high


def _bind(library: ctypes.CDLL) -> FloatKernel:
    pointer, size = ctypes.c_void_p, ctypes.c_int64
    signatures = {
        "linear_rows": [pointer, pointer, pointer, pointer, size, size, size],
        "linear_blocks": [pointer, size, pointer, pointer, pointer, size, size, size],
        "dequant_rows": [pointer, size, pointer, size, size, pointer],
        "decode_rows": [pointer, pointer, size, pointer, size, size, pointer, pointer, pointer, pointer],
        "attend_rows": [pointer, pointer, size, pointer, pointer, pointer, pointer],
        "add_norm": [pointer, pointer, pointer, pointer, size, size, ctypes.c_float],
        "silu_mul": [pointer, pointer, size, size],
        "amx_pack": [pointer, size, size, size, pointer],
        "int8_pack": [pointer, size, size, size, pointer],
        "int8_pack_narrow": [pointer, size, size, size, pointer],
    }
    for name, arguments in signatures.items():
        function = getattr(library, name)
        function.argtypes, function.restype = arguments, None
    library.float_amx_init.argtypes, library.float_amx_init.restype = [ctypes.c_int], ctypes.c_int
    library.float_streaming.argtypes, library.float_streaming.restype = [ctypes.c_int], None
    return FloatKernel(library)


def amx_wanted() -> bool:
    """Whether to build the AMX products: the AVX-512 build on a CPU with AMX, unless `AMX_ENV` is 0."""
    return wide() and AMX_CPU_FLAGS <= cpu_flags() and os.environ.get(AMX_ENV, "1") != "0"


_loaded: tuple[FloatKernel | None, str] | None = None


def load() -> tuple[FloatKernel | None, str]:
    """(kernel, why): the kernel, or None and the reason the torch ops run instead. Built once per process."""
    global _loaded
    if _loaded is None:
        _loaded = _load()
        if _loaded[0] is None:
            logger.info("float32 few-row forwards run on torch ops: %s", _loaded[1])
    return _loaded


def load_for(config: object) -> tuple[FloatKernel | None, str]:
    """(kernel, why): `load`'s kernel for a float32 decoder of ``config``, or None and why not (its heads
    wider than the kernel takes)."""
    kernel, why = load()
    if kernel is not None and head_dim(config) > MAX_HEAD_DIM:
        return None, f"head_dim {head_dim(config)} exceeds the kernel's {MAX_HEAD_DIM}"
    return kernel, why


def wide() -> bool:
    """Whether the products run on AVX-512's 16 lanes (a CPU with avx512f, unless `LANES_ENV` is 8)."""
    return "avx512f" in cpu_flags() and os.environ.get(LANES_ENV, "16") != "8"


def builds() -> list[tuple[str, tuple[str, ...]]]:
    """The builds this CPU and environment allow, the widest first: (name, compiler flags)."""
    wanted = [("AMX", FLAGS + WIDE_FLAGS + AMX_FLAGS)] if amx_wanted() else []
    wanted += [("AVX-512", FLAGS + WIDE_FLAGS)] if wide() else []
    return [*wanted, ("AVX2", FLAGS)]


def started(name: str, kernel: FloatKernel) -> FloatKernel:
    """``kernel`` of build ``name`` ready to run: the AMX build asks Linux for the tiles."""
    return FloatKernel(kernel.library, bool(kernel.library.float_amx_init(1))) if name == "AMX" else kernel


def _load() -> tuple[FloatKernel | None, str]:
    blocker = build_blocker(_CPU_FLAGS, SOURCE.name)
    if blocker:  # turned off, a CPU flag missing, no compiler: no build would load
        return None, blocker
    # the widest build first; each that fails falls back to the next
    wanted = builds()
    for (name, flags), fallback in zip(wanted, [*wanted[1:], None]):
        kernel, why = open_library(SOURCE, flags, "float", _CPU_FLAGS, _bind)
        if kernel is None and fallback is not None:
            logger.warning("the float32 kernel's %s build did not load (%s); trying its %s one", name, why, fallback[0])
            continue
        if kernel is None:
            return None, why
        if name != "AMX":
            return kernel, f"{name} products, {why}"
        kernel = started(name, kernel)
        tiles = "Q4 and Q8_0 blocks on AMX tiles" if kernel.amx else "AMX refused by Linux"
        return kernel, f"AVX-512 products ({tiles}), {why}"
    raise AssertionError("unreachable: the AVX2 build is always tried last")
