"""A GGUF file's quantised weights, kept as blocks for the float32 C kernel to read.

A GGUF target loads as float32 weights that gguf-py dequantised from its blocks (gguf_cache.py),
and a decode step streams all of them: 540 MB for the default model, whose Q4_1 file holds the
same numbers in 98 MB. A step is bound by that stream, so the float32 kernel can read the blocks
instead and dequantise each 8 weights in registers (float_kernel.c, `dequant`). Dequantising there
gives each weight the very float32 value gguf-py gave it (the scale times a small integer is exact
in float32), and the products run the same FMA chains, so a model computes the same bits from its
blocks as from its float32 weights: nothing about its outputs changes, only the bytes a step reads.

Here the file's Q4_0, Q4_1 and Q8_0 tensors are repacked with float32 scales, q and k rows
un-permuted as transformers un-permutes them for Llama, q|k|v and gate|up fused as the native
decoder fuses them, and each matrix checked equal, weight for weight, to the float32 tensor the
model loaded; a matrix that differs, or has another type (K-quants, F16), stays float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from specsure.config.gguf_header import read_gguf_tensors

Q4_0, Q4_1, Q8_0 = 1, 2, 3
"""float_kernel.c's block formats (0 is float32 rows)."""

_GGML_TYPES = {2: Q4_0, 3: Q4_1, 8: Q8_0}
"""GGML's type ids (gguf.GGMLQuantizationType) of the formats the kernel reads."""

_GGUF_BYTES = {Q4_0: 18, Q4_1: 20, Q8_0: 34}
"""Bytes of one block of 32 weights in the file: float16 scale(s), then the quants."""

_SCALES = {Q4_0: 1, Q4_1: 2, Q8_0: 1}
"""Float16 scales at the start of a file block (Q4_1: d, then the minimum m)."""

NAME = {Q4_0: "Q4_0", Q4_1: "Q4_1", Q8_0: "Q8_0"}


@dataclass(frozen=True)
class BlockMatrix:
    """A weight matrix [rows, cols] as float_kernel.c reads it: for each row, cols / 32 blocks of
    float32 scale(s) and the file's quants (Q4: weight i in the low nibble of byte i, weight 16 + i
    in its high one)."""

    data: torch.Tensor  # uint8 [rows, cols / 32 * block bytes]
    format: int
    rows: int
    cols: int

    def dequantized(self) -> torch.Tensor:
        """The float32 weights [rows, cols], computed as gguf-py computes them."""
        scales = _SCALES[self.format]
        blocks = self.data.view(self.rows, self.cols // 32, -1)
        d = blocks[..., :4].contiguous().view(torch.float32)  # [rows, blocks, 1]
        quants = blocks[..., 4 * scales:]
        if self.format == Q8_0:
            weights = quants.contiguous().view(torch.int8).float().mul_(d)
        else:
            weights = torch.empty(self.rows, self.cols // 32, 32)
            torch.bitwise_and(quants, 15, out=weights[..., :16])
            torch.bitwise_right_shift(quants, 4, out=weights[..., 16:])
            if self.format == Q4_0:
                weights.sub_(8).mul_(d)
            else:  # (d * q) + m, two roundings as gguf-py's, though the first is exact
                weights.mul_(d).add_(blocks[..., 4:8].contiguous().view(torch.float32))
        return weights.view(self.rows, self.cols)


def repack(raw: np.ndarray, ggml_type: int, cols: int) -> BlockMatrix | None:
    """A GGUF tensor's bytes ([rows, row bytes], as gguf's reader maps them) as a `BlockMatrix`, or
    None when its type is not one the kernel reads."""
    fmt = _GGML_TYPES.get(ggml_type)
    if fmt is None or cols % 32:
        return None
    rows = raw.shape[0]
    blocks = np.ascontiguousarray(raw).reshape(rows, cols // 32, _GGUF_BYTES[fmt])
    scales = _SCALES[fmt]
    as_float = blocks[..., :2 * scales].copy().view(np.float16).astype(np.float32)  # [rows, blocks, scales]
    packed = np.concatenate([as_float.view(np.uint8), blocks[..., 2 * scales:]], axis=-1)
    return BlockMatrix(torch.from_numpy(np.ascontiguousarray(packed).reshape(rows, -1)), fmt, rows, cols)


def stack(parts: list[BlockMatrix | None]) -> BlockMatrix | None:
    """Matrices of one format and width, their rows concatenated (a fused q|k|v); None if any is None or they differ."""
    if not parts or any(p is None for p in parts):
        return None
    first = parts[0]
    if any(p.format != first.format or p.cols != first.cols for p in parts):
        return None
    data = torch.cat([p.data for p in parts]).contiguous()
    return BlockMatrix(data, first.format, sum(p.rows for p in parts), first.cols)


def _unpermute(matrix: BlockMatrix, heads: int) -> BlockMatrix:
    """The rows of a Llama q or k matrix in transformers' order: the GGUF converter interleaves each
    head's two RoPE halves, and transformers' loader undoes that (`_reverse_permute_weights`)."""
    half = matrix.rows // heads // 2
    order = torch.arange(matrix.rows).view(heads, half, 2).transpose(1, 2).reshape(-1)
    return BlockMatrix(matrix.data[order].contiguous(), matrix.format, matrix.rows, matrix.cols)


@dataclass(frozen=True)
class FileBlocks:
    """The block matrices of one GGUF file, by the native decoder's names."""

    layers: list[dict[str, BlockMatrix | None]]
    """Per decoder layer: "qkv", "o", "gate_up", "down" (None where the file's tensors are not all
    of one readable format)."""
    lm_head: BlockMatrix | None
    """The output matrix (the token embedding when the model ties them)."""


def read_blocks(gguf: Path, layers: int, heads: int, kv_heads: int, tied: bool) -> FileBlocks:
    """The block matrices of a Llama-layout GGUF file (`llama` tensor names). Reads the tensor table
    only (gguf's own reader parses the whole vocabulary first, seconds on a 49k-token model)."""
    _, entries = read_gguf_tensors(str(gguf))
    tensors = {entry.name: entry for entry in entries}
    data = np.memmap(gguf, dtype=np.uint8, mode="r")

    def matrix(name: str) -> BlockMatrix | None:
        entry = tensors.get(name)
        fmt = None if entry is None else _GGML_TYPES.get(entry.kind)
        if fmt is None or len(entry.shape) != 2:
            return None
        cols, rows = entry.shape
        row_bytes = cols // 32 * _GGUF_BYTES[fmt]
        raw = data[entry.start:entry.start + rows * row_bytes]
        return repack(raw.reshape(rows, row_bytes), entry.kind, cols) if raw.size == rows * row_bytes else None

    def unpermuted(name: str, count: int) -> BlockMatrix | None:
        found = matrix(name)
        return None if found is None else _unpermute(found, count)

    found = []
    for i in range(layers):
        prefix = f"blk.{i}."
        found.append({
            "qkv": stack([unpermuted(prefix + "attn_q.weight", heads), unpermuted(prefix + "attn_k.weight", kv_heads),
                          matrix(prefix + "attn_v.weight")]),
            "o": matrix(prefix + "attn_output.weight"),
            "gate_up": stack([matrix(prefix + "ffn_gate.weight"), matrix(prefix + "ffn_up.weight")]),
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
    if not path.is_file():
        return None, f"{path}, which it was converted from, is gone"
    return path, ""
