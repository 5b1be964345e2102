"""The layer matrices a GGUF's blocks replace, dropped before the model is aligned and fused.

transformers maps a converted folder's float32 weights from disk without reading them. Aligning and
fusing them copies each into memory, so a model read as blocks used to hold all its float32
matrices at once before `CausalLM.release_block_weights` dropped them, on top of the blocks: six
Phi-3-mini layers (2.6 GB in float32) loaded at a peak of 3.3 GiB, and load at 1.0 GiB now
(`bench/load_memory.py`). Here each layer matrix that a block
matrix holds bit for bit (`gguf_blocks.matches`, the same check `NativeDecoder.use_blocks` makes) is
checked against the mapped weights, one at a time, and becomes a meta tensor before anything copies
it. Only where the native float32 decoder will run, and only for an engine that never runs
transformers' own forward (`load_model`'s ``release_weights``).
"""

from __future__ import annotations

import torch
from torch import nn

from specsure.models import float_kernel as float_kernels
from specsure.models.decoder_family import decoder_base
from specsure.models.fused_layer import meta_weight, modules_of
from specsure.models.gguf_blocks import FileBlocks, matches


def native_float_kernel(hf: nn.Module) -> float_kernels.FloatKernel | None:
    """The kernel `NativeDecoder` will read blocks with for ``hf`` (a float32 model), or None where it
    would run no float32 kernel: then nothing may be dropped early, as nothing would read the blocks."""
    base, _why = decoder_base(hf)
    if base is None or base.embed_tokens.weight.dtype != torch.float32:
        return None
    return float_kernels.load_for(hf.config.get_text_config(decoder=True))[0]


def drop_matched(hf: nn.Module, blocks: FileBlocks, kernel: float_kernels.FloatKernel) -> int:
    """Make each layer matrix of ``hf`` that ``blocks`` hold bit for bit a meta tensor; returns the bytes
    of float32 weights dropped. `NativeDecoder.use_blocks` then serves exactly these from the blocks
    (and refuses a meta matrix it has none for)."""
    base, _why = decoder_base(hf)
    if base is None or len(blocks.layers) != len(base.layers):
        return 0
    dropped = 0
    for layer, found in zip(base.layers, blocks.layers):
        for name, matrix in found.items():
            if matrix is None:
                continue
            modules = modules_of(layer, name)
            if any(m.weight.is_meta for m in modules):
                continue
            # A copy of one matrix at a time, freed after the comparison: q|k|v and gate|up stacked as the
            # block matrix is, and the kernel's probe product reading it from memory it allocated, as it
            # reads the fused weights (the mapped file's tensors start wherever the file put them).
            weight = torch.cat([m.weight.detach() for m in modules]) if len(modules) > 1 else modules[0].weight.detach().clone()
            if not matches(matrix, weight, kernel):
                continue
            for module in modules:
                dropped += module.weight.numel() * module.weight.element_size()
                module.weight = meta_weight(module.weight)
    return dropped
