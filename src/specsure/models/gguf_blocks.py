"""A GGUF file's quantised weights, kept as blocks for the float32 C kernel to read.

A GGUF target loads as float32 weights that gguf-py dequantised from its blocks (gguf_cache.py),
and a decode step streams all of them: 540 MB for the default model, whose Q4_1 file holds the
same numbers in 98 MB. A step is bound by that stream, so the float32 kernel can read the blocks
instead and dequantise each 8 weights in registers (float_kernel.c, `dequant`). Dequantising there
gives each weight the very float32 value gguf-py gave it (the scale times a small integer is exact
in float32), and the products run the same FMA chains, so a model computes the same bits from its
blocks as from its float32 weights: nothing about its outputs changes, only the bytes a step reads.
(On a CPU with AMX the Q4 matrices then run on tiles, `FloatKernel.amx_pack`: float32 sums in
another order, so close to those bits, not equal; `SPECSURE_AMX=0` keeps them.)

Here the file's Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K tensors are repacked into the
kernel's block formats (float32 scales; a K-quant's scale times its 6-bit sub-scale folded into
one, an exact product), q and k rows un-permuted as transformers un-permutes them for Llama, q|k|v and
gate|up fused as the native decoder fuses them (parts of different formats widened to Q8_X), and each matrix checked
equal, weight for weight, to the float32 tensor the model loaded; a matrix that differs, or has
another type (F16, Q2_K, Q3_K, the IQ types), stays float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from specsure.config.dtype_choice import KERNEL_BLOCK_TYPES
from specsure.config.gguf_header import read_gguf_tensors

if TYPE_CHECKING:
    from specsure.models.float_kernel import FloatKernel

Q4_0, Q4_1, Q8_0, Q8_M, Q8_H, Q8_X = 1, 2, 3, 4, 5, 6
"""float_kernel.c's block formats (0 is float32 rows), each a block of 32 weights: Q4_0 {d; 4-bit q}
w = d (q - 8); Q4_1 {d, m; 4-bit q} w = d q + m; Q8_0 {d; int8 q} w = d q; Q8_M {d, m; int8 q}
w = d q + m; Q8_H {d0, d1; int8 q} w = d0 q on the first 16 weights, d1 q on the rest; Q8_X {d0, d1,
m; int8 q} w = d q + m with d as Q8_H's, any of the others widened for a fused matrix whose parts
differ (float32 scales, Q4 weight i in the low nibble of byte i and weight 16 + i in its high one)."""
A4, A8 = 7, 8
"""float_kernel.c's A4 and A8: a Q4_0 or Q4_1 matrix (A4) or a Q8_0 one (A8) packed for AMX tiles
(`FloatKernel.amx_pack`), 16 rows' blocks together; made after `matches` has checked the blocks it
packs, and never dequantised."""

R4_0, R4_1, R8_0, R8_M, R8_H, R8_X = 12, 13, 14, 15, 16, 17
"""float_kernel.c's R4_0, R4_1, R8_0, R8_M, R8_H and R8_X: a Q4_0, Q4_1, Q8_0, Q8_M, Q8_H or Q8_X
matrix packed for the integer products (each row of x rounded to int8 blocks, as llama.cpp does), 8
rows side by side (`FloatKernel.int8_pack`), as llama.cpp repacks Q4_0; made after `matches` has
checked the blocks it packs, for a model loaded with ``int8_activations``, and never dequantised."""
PACKED = {Q4_0: R4_0, Q4_1: R4_1, Q8_0: R8_0, Q8_M: R8_M, Q8_H: R8_H, Q8_X: R8_X}
"""Each block format's packing for the integer products."""
R5_0, R5_M, R6_H = 18, 19, 20
"""float_kernel.c's R5_0, R5_M and R6_H: a Q8_0, Q8_M or Q8_H matrix whose quants all fit 5 or 6 bits
(a Q5_0, a Q5_1 or Q5_K, a Q6_K file's, as held) packed as R8_0, R8_M or R8_H in those bits; their
products are the 8-bit packing's to the bit."""
NARROW = {Q8_0: (R5_0, -16, 15), Q8_M: (R5_M, 0, 31), Q8_H: (R6_H, -32, 31)}
"""Each held format's narrower packing, and the range its quants must lie in for it."""
STREAMED = 256
"""A flag on a format (float_kernel.c's STREAMED) for a decoder's matrices: read once a step, more of them
than the last-level cache holds, so the kernel prefetches them non-temporally and leaves that cache to
what is read again soon (a draft head's weights, the KV cache)."""
INT8_FORMATS = frozenset({*PACKED.values(), *(packed for packed, _, _ in NARROW.values())})
"""The formats multiplied with int8 activations."""
PACKING_NAMES = {R4_0: "R4_0", R4_1: "R4_1", R8_0: "R8_0", R8_M: "R8_M", R8_H: "R8_H", R8_X: "R8_X", R5_0: "R5_0",
                 R5_M: "R5_M", R6_H: "R6_H"}
"""How the load log names each packing for the integer products."""

_HEADER = {Q4_0: 1, Q4_1: 2, Q8_0: 1, Q8_M: 2, Q8_H: 2, Q8_X: 3}
"""float32 scales at the start of a block."""

GGML_NAMES = KERNEL_BLOCK_TYPES
"""The GGML types (gguf.GGMLQuantizationType ids) whose weights the kernel reads, each exactly."""

_FILE_BLOCKS = {"Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24), "Q8_0": (32, 34),
                "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210)}
"""Weights and bytes of one block of each type in the file."""


@dataclass(frozen=True)
class BlockMatrix:
    """A weight matrix [rows, cols] as float_kernel.c reads it: for each row, cols / 32 blocks of one
    format."""

    data: torch.Tensor  # uint8 [rows, cols / 32 * block bytes]; packed (INT8_FORMATS): rows rounded up to 8
    format: int
    rows: int
    cols: int
    kind: str
    """The GGUF type(s) it came from, "+"-joined for a fused matrix of several."""

    def dequantized(self) -> torch.Tensor:
        """The float32 weights [rows, cols], with gguf-py's arithmetic (a product that is exact, then
        at most one rounding)."""
        if self.format in INT8_FORMATS or self.format in (A4, A8):
            raise ValueError("a matrix packed for AMX tiles (A4, A8) or for the integer products (R4_0 to R8_X) is not "
                             "dequantised; dequantise the blocks it was packed from")
        header = _HEADER[self.format]
        blocks = self.data.view(self.rows, self.cols // 32, -1)
        d = blocks[..., :4].contiguous().view(torch.float32)  # [rows, blocks, 1]
        second = blocks[..., 4:8].contiguous().view(torch.float32) if header >= 2 else None
        quants = blocks[..., 4 * header:]
        if self.format in (Q4_0, Q4_1):
            weights = torch.empty(self.rows, self.cols // 32, 32)
            torch.bitwise_and(quants, 15, out=weights[..., :16])
            torch.bitwise_right_shift(quants, 4, out=weights[..., 16:])
            if self.format == Q4_0:
                weights.sub_(8)
        else:
            weights = quants.contiguous().view(torch.int8).float()
        if self.format in (Q8_H, Q8_X):
            weights[..., :16].mul_(d)
            weights[..., 16:].mul_(second)
        else:
            weights.mul_(d)
        if self.format in (Q4_1, Q8_M):
            weights.add_(second)
        elif self.format == Q8_X:
            weights.add_(blocks[..., 8:12].contiguous().view(torch.float32))
        return weights.view(self.rows, self.cols)


def matches(matrix: BlockMatrix, weight: torch.Tensor, kernel: "FloatKernel") -> bool:
    """Whether ``matrix`` holds ``weight`` ([rows, cols] float32) bit for bit, and the kernel's
    product over it gives the bits of its product over ``weight``: the check before the kernel reads
    a matrix as blocks. Compared a few thousand rows at a time, so a large LM head needs no second
    float32 copy at once."""
    if (matrix.rows, matrix.cols) != tuple(weight.shape) or weight.dtype != torch.float32:
        return False
    step = max(1, (1 << 22) // matrix.cols)
    for start in range(0, matrix.rows, step):
        part = BlockMatrix(matrix.data[start:start + step], matrix.format, min(step, matrix.rows - start), matrix.cols,
                           matrix.kind)
        if not torch.equal(part.dequantized().view(torch.int32), weight[start:start + step].view(torch.int32)):
            return False  # bit patterns: -0.0 and +0.0, or two NaNs, count as different
    probe = torch.linspace(-1.0, 1.0, matrix.cols).unsqueeze(0).contiguous()
    return torch.equal(kernel.linear_blocks(matrix, probe).view(torch.int32),
                       kernel.linear_rows(weight.contiguous(), probe).view(torch.int32))


def q8_blocks(weight: torch.Tensor) -> BlockMatrix | None:
    """``weight`` ([rows, cols], cols a multiple of 32) quantised with Q8_0's scheme: per block of 32,
    d = max |w| / 127 (kept in float32, as the kernel's blocks keep it) and q = round(w / d). For a
    draft head's products, whose numbers decide only which tokens are proposed (the target's
    verification decides every output token). None when cols is not a multiple of 32 or a weight is
    not finite (the head keeps its float32 rows then)."""
    rows, cols = weight.shape
    if cols % 32 or not bool(torch.isfinite(weight).all()):
        return None
    w = weight.detach().float().reshape(rows, cols // 32, 32)
    d = w.abs().amax(dim=-1, keepdim=True) / 127.0  # [rows, blocks, 1]
    q = torch.where(d > 0, w / torch.where(d > 0, d, 1.0), 0.0).round().clamp(-127, 127).to(torch.int8)
    packed = torch.cat([d.contiguous().view(torch.uint8), q.view(torch.uint8)], dim=-1)
    return BlockMatrix(packed.reshape(rows, -1).contiguous(), Q8_0, rows, cols, "Q8_0")


def _half(raw: np.ndarray, at: int) -> np.ndarray:
    """The float16 at byte ``at`` of each block, as float32 [blocks]."""
    return raw[:, at:at + 2].copy().view(np.float16).astype(np.float32)[:, 0]


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """GGUF's 4-bit quants of 32-weight blocks ([blocks, 16] bytes) -> [blocks, 32]: low nibbles first."""
    return np.concatenate([qs & 15, qs >> 4], axis=-1)


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1's fifth bits ([blocks, 4] bytes, a little-endian uint32) -> [blocks, 32] of 0 or 16."""
    bits = qh.copy().view(np.uint32) >> np.arange(32, dtype=np.uint32)
    return ((bits & 1) << 4).astype(np.uint8)


def _k_scales(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K: each super-block's 8 sub-block scales d * sc and minimums -(dmin * m), float32 [S, 8]
    (each an exact product), from the 12 bytes of 6-bit sc and m at byte 4."""
    scales = raw[:, 4:16].reshape(-1, 3, 4)
    d, m, high = scales[:, 0], scales[:, 1], scales[:, 2]
    sc = np.concatenate([d & 63, (high & 15) | ((d >> 2) & 48)], axis=-1).astype(np.float32)
    mn = np.concatenate([m & 63, (high >> 4) | ((m >> 2) & 48)], axis=-1).astype(np.float32)
    return _half(raw, 0)[:, None] * sc, -(_half(raw, 2)[:, None] * mn)


def _unpack(kind: str, raw: np.ndarray) -> tuple[int, np.ndarray, np.ndarray | None, np.ndarray]:
    """A tensor's file blocks ([blocks, bytes]) -> (format, d, second scale or None, quants [n, 32]),
    n = its 32-weight blocks in order, in the terms gguf-py's dequantisation uses."""
    if kind == "Q4_0":
        return Q4_0, _half(raw, 0), None, _nibbles(raw[:, 2:18])
    if kind == "Q4_1":
        return Q4_1, _half(raw, 0), _half(raw, 2), _nibbles(raw[:, 4:20])
    if kind == "Q8_0":
        return Q8_0, _half(raw, 0), None, raw[:, 2:34].view(np.int8)
    if kind == "Q5_0":
        return Q8_0, _half(raw, 0), None, (_nibbles(raw[:, 6:22]) | _fifth_bits(raw[:, 2:6])).astype(np.int8) - 16
    if kind == "Q5_1":
        return Q8_M, _half(raw, 0), _half(raw, 2), (_nibbles(raw[:, 8:24]) | _fifth_bits(raw[:, 4:8])).astype(np.int8)
    if kind in ("Q4_K", "Q5_K"):
        d, m = _k_scales(raw)
        first = 16 if kind == "Q4_K" else 48  # Q5_K: 32 bytes of fifth bits, then the nibbles
        q = (raw[:, first:first + 128].reshape(-1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1))
        q = (q & 15).reshape(-1, 8, 32)
        if kind == "Q5_K":
            high = raw[:, 16:48].reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
            q = q | ((high & 1) << 4)
            return Q8_M, d.reshape(-1), m.reshape(-1), q.reshape(-1, 32).astype(np.int8)
        return Q4_1, d.reshape(-1), m.reshape(-1), q.reshape(-1, 32)
    # Q6_K: 128 bytes of low nibbles, 64 of 2-bit high parts, 16 int8 scales (one per 16 weights), d
    low = raw[:, :128].reshape(-1, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    high = raw[:, 128:192].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    q = ((low & 15).reshape(-1, 8, 32) | ((high & 3).reshape(-1, 8, 32) << 4)).astype(np.int8) - 32
    d = _half(raw, 208)[:, None] * raw[:, 192:208].view(np.int8).astype(np.float32)  # [S, 16], exact
    return Q8_H, d[:, 0::2].reshape(-1), d[:, 1::2].reshape(-1), q.reshape(-1, 32)


def repack(raw: np.ndarray, ggml_type: int, cols: int) -> BlockMatrix | None:
    """A GGUF tensor's bytes ([rows, row bytes], as gguf's reader maps them) as a `BlockMatrix`, or
    None when its type is not one the kernel reads."""
    kind = GGML_NAMES.get(ggml_type)
    if kind is None or cols % _FILE_BLOCKS[kind][0]:
        return None
    rows = raw.shape[0]
    fmt, d, second, q = _unpack(kind, np.ascontiguousarray(raw).reshape(-1, _FILE_BLOCKS[kind][1]))
    scales = [d] if second is None else [d, second]
    header = np.stack(scales, axis=-1).astype(np.float32).view(np.uint8)  # [n, 4 or 8]
    if fmt in (Q4_0, Q4_1):
        quants = (q[:, :16] | (q[:, 16:] << 4)).astype(np.uint8)
    else:
        quants = q.astype(np.int8).view(np.uint8)
    packed = np.concatenate([header, quants], axis=-1).reshape(rows, -1)
    return BlockMatrix(torch.from_numpy(np.ascontiguousarray(packed)), fmt, rows, cols, kind)


def _widened(matrix: BlockMatrix) -> BlockMatrix:
    """``matrix`` in the Q8_X format: the same weights, each still d q (+ m) with the same exact d q.
    A part without a minimum gets m = -0.0, which leaves d q as it is, zeros' signs included."""
    header = _HEADER[matrix.format]
    blocks = matrix.data.view(-1, block_bytes(matrix.format))
    scales = blocks[:, :4 * header].contiguous().view(torch.float32)  # [n, header]
    quants = blocks[:, 4 * header:]
    if matrix.format in (Q4_0, Q4_1):
        q = torch.cat([quants & 15, quants >> 4], dim=-1).to(torch.int8)
        q = q - 8 if matrix.format == Q4_0 else q
    else:
        q = quants.contiguous().view(torch.int8)
    d0 = scales[:, :1]
    d1 = scales[:, 1:2] if matrix.format == Q8_H else d0
    m = scales[:, 1:2] if matrix.format in (Q4_1, Q8_M) else torch.full_like(d0, -0.0)
    packed = torch.cat([torch.cat([d0, d1, m], dim=-1).view(torch.uint8), q.view(torch.uint8)], dim=-1)
    return BlockMatrix(packed.reshape(matrix.rows, -1).contiguous(), Q8_X, matrix.rows, matrix.cols, matrix.kind)


def block_bytes(fmt: int) -> int:
    """Bytes of one block of 32 weights in a kernel format."""
    return 4 * _HEADER[fmt] + (16 if fmt in (Q4_0, Q4_1) else 32)


def stack(parts: list[BlockMatrix | None]) -> BlockMatrix | None:
    """Matrices of one width, their rows concatenated (a fused q|k|v), in their common format, or all
    widened to Q8_X where their formats differ (Q4_K_M's Q4_K q and k with a Q6_K v); None if any is None.
    Packed matrices (AMX tiles, the integer products) do not stack: pack the stacked blocks instead."""
    if not parts or any(p is None for p in parts):
        return None
    if any(p.format in INT8_FORMATS or p.format in (A4, A8) for p in parts):
        raise ValueError("stack: packed matrices hold groups of rows, not rows; stack the blocks, then pack")
    first = parts[0]
    if any(p.cols != first.cols for p in parts):
        return None
    if any(p.format != first.format for p in parts):
        parts = [_widened(p) for p in parts]
        first = parts[0]
    data = torch.cat([p.data for p in parts]).contiguous()
    kinds = "+".join(dict.fromkeys(p.kind for p in parts))
    return BlockMatrix(data, first.format, sum(p.rows for p in parts), first.cols, kinds)


def _unpermute(matrix: BlockMatrix, heads: int) -> BlockMatrix:
    """The rows of a Llama q or k matrix in transformers' order: the GGUF converter interleaves each
    head's two RoPE halves, and transformers' loader undoes that (`_reverse_permute_weights`)."""
    half = matrix.rows // heads // 2
    order = torch.arange(matrix.rows).view(heads, half, 2).transpose(1, 2).reshape(-1)
    return BlockMatrix(matrix.data[order].contiguous(), matrix.format, matrix.rows, matrix.cols, matrix.kind)


@dataclass(frozen=True)
class FileBlocks:
    """The block matrices of one GGUF file, by the native decoder's names."""

    layers: list[dict[str, BlockMatrix | None]]
    """Per decoder layer: "qkv", "o", "gate_up", "down" (None where the file's tensors are not all
    of one readable format)."""
    lm_head: BlockMatrix | None
    """The output matrix (the token embedding when the model ties them)."""


def read_blocks(gguf: Path, layers: int, heads: int, kv_heads: int, tied: bool, interleaved: bool = True) -> FileBlocks:
    """The block matrices of a GGUF file with llama.cpp's decoder tensor names (`blk.N.attn_q.weight`
    ...), its q and k rows put back in transformers' order where ``interleaved``. Reads the tensor
    table only (gguf's own reader parses the whole vocabulary first, seconds on a 49k-token model)."""
    _, entries = read_gguf_tensors(str(gguf))
    tensors = {entry.name: entry for entry in entries}
    data = np.memmap(gguf, dtype=np.uint8, mode="r")

    def matrix(name: str) -> BlockMatrix | None:
        entry = tensors.get(name)
        kind = None if entry is None else GGML_NAMES.get(entry.kind)
        if kind is None or len(entry.shape) != 2 or entry.shape[0] % _FILE_BLOCKS[kind][0]:
            return None
        cols, rows = entry.shape
        row_bytes = cols // _FILE_BLOCKS[kind][0] * _FILE_BLOCKS[kind][1]
        raw = data[entry.start:entry.start + rows * row_bytes]
        return repack(raw.reshape(rows, row_bytes), entry.kind, cols) if raw.size == rows * row_bytes else None

    def unpermuted(name: str, count: int) -> BlockMatrix | None:
        found = matrix(name)
        return found if found is None or not interleaved else _unpermute(found, count)

    found = []
    for i in range(layers):
        prefix = f"blk.{i}."
        # Phi-3's converter keeps q|k|v as one tensor and gate|up as ffn_up (llama.cpp's newer one may split them)
        fused_qkv, fused_up = prefix + "attn_qkv.weight" in tensors, prefix + "ffn_gate.weight" not in tensors
        found.append({
            "qkv": matrix(prefix + "attn_qkv.weight") if fused_qkv else
            stack([unpermuted(prefix + "attn_q.weight", heads), unpermuted(prefix + "attn_k.weight", kv_heads),
                   matrix(prefix + "attn_v.weight")]),
            "o": matrix(prefix + "attn_output.weight"),
            "gate_up": matrix(prefix + "ffn_up.weight") if fused_up else
            stack([matrix(prefix + "ffn_gate.weight"), matrix(prefix + "ffn_up.weight")]),
            "down": matrix(prefix + "ffn_down.weight"),
        })
    head = matrix("output.weight") if "output.weight" in tensors or not tied else matrix("token_embd.weight")
    return FileBlocks(found, head)


def source_gguf(folder: Path) -> tuple[Path | None, str]:
    """(file, why): the GGUF file a converted folder was made from (gguf_cache writes its path in the
    marker), or None and why not ("" for a folder that is not a conversion)."""
    from specsure.models.gguf_cache import COMPLETE_MARKER

    marker = folder / COMPLETE_MARKER
    if not marker.is_file():
        return None, ""
    lines = marker.read_text(encoding="utf-8").splitlines()
    path = Path(lines[0]) if lines else None
    if path is None or path.suffix.lower() != ".gguf":
        return None, f"{marker} does not name the GGUF file it was converted from"
    if not path.is_absolute():  # written before markers held absolute paths: relative to who knows where
        return None, f"{marker} names {path} relatively; load the .gguf file itself to read its blocks"
    if not path.is_file():
        return None, f"{path}, which it was converted from, is gone"
    return path, ""
