"""A GGUF file's tensors written as float32 safetensors shards, one tensor at a time.

transformers' GGUF reader de-quantises every tensor into one dict and then copies it into the model it
builds, so converting a file held its float32 weights about one and a half times over (1.2 GB at
most for the default model's 540 MB). Here each tensor is de-quantised, put in transformers' order
and names by transformers' own per-architecture step (its q/k row order, Gemma's norms), checked and
written into a shard of at most `SHARD_BYTES`, so converting needs memory for one shard whatever
the model's size. The architectures it runs for are those whose result is checked bit for bit
against transformers' own conversion (tests/test_gguf_tensors.py); others keep transformers' path.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Iterator

import numpy
import torch

from specsure.config.gguf_header import TensorEntry, read_gguf_tensors

STREAMED_ARCHITECTURES: Final[frozenset[str]] = frozenset({"llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3"})
"""GGUF architectures (general.architecture) converted tensor by tensor: dense decoders whose tensors
map one to one onto the model's parameters. MoE files, whose experts transformers stacks across
tensors, go through transformers' reader."""
SHARD_BYTES: Final[int] = 1 << 30
"""The largest shard, and so about the most float32 weights a conversion holds at once."""


@dataclass
class WrittenTensors:
    """What `write_tensors` found: transformers' names of the parameters the file lacks, and those whose
    shape in the file is not the one the model's metadata gives (name, in the file, wanted)."""

    missing_keys: list[str] = field(default_factory=list)
    mismatched_keys: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)
    index: dict[str, Any] | None = None
    """The shards' index (`write_index`), or None for one file."""


def streams(architecture: object) -> bool:
    """Whether a file of this general.architecture converts tensor by tensor."""
    return architecture in STREAMED_ARCHITECTURES


def write_tensors(gguf: Path, skeleton: torch.nn.Module, out: Path, bad_values: Any) -> WrittenTensors:
    """De-quantise ``gguf``'s tensors into float32 safetensors shards in ``out``, named as ``skeleton``
    (the model on the meta device, built from the file's config) names its parameters; a tensor whose
    shape the model does not take is left out and reported. ``bad_values(name, tensor)`` is called
    with each tensor before it is kept (it raises for NaN or infinite weights)."""
    from gguf import dequantize
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    metadata, entries = read_gguf_tensors(str(gguf))
    architecture = metadata.get("general.architecture")
    heads = metadata.get(f"{architecture}.attention.head_count")
    # A file without a kv head count has as many as query heads, as llama.cpp reads it; transformers'
    # processor would leave its q and k rows in llama.cpp's order then (a model fluent in nothing).
    config = {"num_attention_heads": heads,
              "num_key_value_heads": metadata.get(f"{architecture}.attention.head_count_kv") or heads}
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=config)
    mapping = _names(skeleton, str(architecture))
    wanted = _wanted_shapes(skeleton)
    plan = _shard_plan([(t.name, math.prod(t.shape) * 4) for t in entries])
    found = WrittenTensors()
    weight_map: dict[str, str] = {}
    total = 0
    shard: dict[str, torch.Tensor] = {}
    for index, (tensor, data) in enumerate(zip(entries, _mapped_data(gguf, entries))):
        result = processor.process(weights=dequantize(data, tensor.kind), name=tensor.name,
                                   tensor_key_mapping=mapping, parsed_parameters={"config": config})
        name = mapping.get(result.name)
        if name is not None and name in wanted:  # else a tensor the model has no parameter for, as transformers skips
            # Copied only where it must be: an F32 tensor is a view of the read-only mapped file.
            values = torch.from_numpy(numpy.require(result.weights, numpy.float32, ["C_CONTIGUOUS", "WRITEABLE"]))
            if tuple(values.shape) != wanted[name]:
                found.mismatched_keys.append((name, tuple(values.shape), wanted[name]))
            else:
                bad_values(name, values)
                shard[name] = values
                weight_map[name] = plan.files[plan.shard_of[tensor.name]]
                total += values.numel() * 4
        result = values = None  # the next tensor is de-quantised without this one's arrays alive
        last = index + 1 == len(entries)
        if last or plan.shard_of[entries[index + 1].name] != plan.shard_of[tensor.name]:
            _save_shard(shard, out / plan.files[plan.shard_of[tensor.name]])
            shard = {}
    found.missing_keys = sorted(set(wanted) - set(weight_map))
    if len(plan.files) > 1:
        found.index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    return found


def write_index(found: WrittenTensors, out: Path) -> None:
    """The shards' index beside them, as save_pretrained writes it (none for one file). Apart from
    `write_tensors`, so a disk that fills here is said to be full, not the GGUF to be unreadable."""
    if found.index is not None:
        text = json.dumps(found.index, indent=2) + "\n"
        (out / "model.safetensors.index.json").write_text(text, encoding="utf-8")


def _names(skeleton: torch.nn.Module, architecture: str) -> dict[str, str]:
    """GGUF tensor name -> ``skeleton``'s parameter name, by gguf-py's table for ``architecture``, as
    transformers' reader maps them (its own walk builds the table again for every submodule: 6 s of a
    135M model's conversion)."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    arch = next(key for key, value in MODEL_ARCH_NAMES.items() if value == architecture)
    table = get_tensor_name_map(arch, int(skeleton.config.num_hidden_layers))
    mapping: dict[str, str] = {}
    for name in skeleton.state_dict():
        stem, dot, suffix = name.rpartition(".") if name.endswith((".weight", ".bias")) else (name, "", "")
        found = table.get_name(stem)
        if found is not None:
            mapping[found + dot + suffix] = name
    return mapping


def _mapped_data(gguf: Path, entries: list[TensorEntry]) -> Iterator[numpy.ndarray]:
    """Each tensor's data as gguf's reader gives it to `dequantize` (a view of the mapped file: the
    plain types as their numbers, the block types as bytes by row), from specsure's own reader of the
    table, which skips the metadata's values gguf's reader parses (a tokenizer's tens of thousands of
    tokens: 4 s a read)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quant_shape_to_byte_shape

    plain = {GGMLQuantizationType.F32: numpy.float32, GGMLQuantizationType.F16: numpy.float16,
             GGMLQuantizationType.F64: numpy.float64, GGMLQuantizationType.I8: numpy.int8,
             GGMLQuantizationType.I16: numpy.int16, GGMLQuantizationType.I32: numpy.int32,
             GGMLQuantizationType.I64: numpy.int64}
    mapped = numpy.memmap(gguf, dtype=numpy.uint8, mode="r")
    for entry in entries:
        kind = GGMLQuantizationType(entry.kind)
        rows = tuple(reversed(entry.shape))
        block, size = GGML_QUANT_SIZES[kind]
        raw = mapped[entry.start:entry.start + math.prod(entry.shape) * size // block]
        yield raw.view(plain[kind]).reshape(rows) if kind in plain else raw.reshape(quant_shape_to_byte_shape(rows, kind))


def _wanted_shapes(skeleton: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    """The tensors a checkpoint of ``skeleton`` holds, by name: its parameters, a tied one once (under
    its first name, as save_pretrained keeps it), and its persistent buffers."""
    kept = set(skeleton.state_dict())
    shapes = {name: tuple(p.shape) for name, p in skeleton.named_parameters()}
    shapes.update((name, tuple(b.shape)) for name, b in skeleton.named_buffers() if name in kept)
    return shapes


@dataclass
class _ShardPlan:
    files: list[str]
    shard_of: dict[str, int]


def _shard_plan(sizes: list[tuple[str, int]]) -> _ShardPlan:
    """Which shard each tensor goes to, in the file's order, each shard at most `SHARD_BYTES` (a larger
    tensor alone in one), named as save_pretrained names them."""
    shard_of: dict[str, int] = {}
    count, filled = 0, 0
    for name, size in sizes:
        if filled and filled + size > SHARD_BYTES:
            count, filled = count + 1, 0
        shard_of[name] = count
        filled += size
    shards = count + 1
    files = ["model.safetensors"] if shards == 1 else \
        [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    return _ShardPlan(files, shard_of)


def _save_shard(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """One shard, as save_pretrained writes it (its metadata says PyTorch); an empty one is still written,
    so every file the index could name exists."""
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata={"format": "pt"})
