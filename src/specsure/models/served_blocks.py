"""The GGUF block matrices the float32 kernel reads in place of a decoder's layer weights.

`NativeDecoder.use_blocks` hands them over: each layer's struct then points at the blocks instead of
the fused float32 weight, where the blocks hold that weight bit for bit (`gguf_blocks.matches`) or
the weight was dropped before fusing once they did (`early_blocks.py`). This object keeps the
prepared matrices alive (the structs hold their addresses) and knows which it serves, for dropping
the float32 copies afterwards and for the load's report.
"""

from __future__ import annotations

import ctypes
from collections import Counter

from torch import nn

from specsure.models.errors import ModelLoadError
from specsure.models.float_kernel import FloatKernel
from specsure.models.fused_layer import FusedLayer, release
from specsure.models.gguf_blocks import (
    A4, A8, INT8_FORMATS, PACKING_NAMES, STREAMED, BlockMatrix, FileBlocks, matches,
)

MATRICES = ("qkv", "o", "gate_up", "down")
"""A fused layer's weight matrices, by the names `FileBlocks` and the kernel's structs use."""


class ServedBlocks:
    """Which of a decoder's layer matrices the float32 kernel reads as a GGUF's blocks."""

    def __init__(self, layers: int) -> None:
        self.matrices: list[BlockMatrix] = []
        """The prepared matrices the structs point at, kept alive."""
        self.served: list[list[str]] = [[] for _ in range(layers)]
        """Per layer, the names of the matrices read as blocks."""

    def serve(self, structs: ctypes.Array, layers: list[FusedLayer], blocks: FileBlocks, kernel: FloatKernel,
              int8_activations: bool) -> dict[str, int]:
        """Point each layer's struct at ``blocks``' matrix where it holds the layer's weight, prepared for
        ``kernel`` (with int8 activations where asked and possible), else at the float32 weight; returns
        how many matrices of each GGUF type it serves."""
        used: Counter[str] = Counter()
        for struct, layer, found, served in zip(structs, layers, blocks.layers, self.served):
            for name, matrix in found.items():
                weight = getattr(layer, name)
                setattr(struct, name, weight.data_ptr())  # the float32 rows unless the blocks match
                setattr(struct, f"{name}_format", 0)
                # A meta weight was dropped before fusing, once it matched these blocks (early_blocks.py).
                if matrix is None or not (weight.is_meta or matches(matrix, weight, kernel)):
                    continue
                matrix = kernel.prepared(matrix, int8_activations)
                setattr(struct, name, matrix.data.data_ptr())
                setattr(struct, f"{name}_format", matrix.format | STREAMED)
                self.matrices.append(matrix)
                served.append(name)
                used[matrix.kind] += 1
        return dict(used)

    def check(self, layers: list[FusedLayer]) -> None:
        """Every layer matrix dropped before fusing must be read as blocks: the kernel would read nothing
        where a meta weight's pointer is."""
        for index, (layer, served) in enumerate(zip(layers, self.served)):
            if lost := [n for n in MATRICES if getattr(layer, n).is_meta and n not in served]:
                raise ModelLoadError(f"layer {index}'s {', '.join(lost)} weights were dropped for the GGUF's blocks, "
                                     "which the kernel then did not take; load with SPECSURE_GGUF_BLOCKS=0 and report "
                                     "this as a specsure bug.")

    def release(self, layers: list[FusedLayer], modules: list[nn.Module]) -> int:
        """Drop the float32 copies of the served matrices (`fused_layer.release`); returns the bytes dropped."""
        return sum(release(fused, module, name)
                   for fused, module, names in zip(layers, modules, self.served) for name in names)

    @property
    def tiled(self) -> int:
        """How many of the served matrices are packed for AMX tiles (`FloatKernel.amx_pack`)."""
        return sum(matrix.format in (A4, A8) for matrix in self.matrices)

    @property
    def int8_packings(self) -> Counter[str]:
        """Of the served matrices, those the integer products read, by packing."""
        return Counter(PACKING_NAMES[m.format] for m in self.matrices if m.format in INT8_FORMATS)
