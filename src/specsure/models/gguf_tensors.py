"""A GGUF file's tensors written as float32 safetensors shards, a few rows at a time.

transformers' GGUF reader de-quantises every tensor into one dict and then copies it into the model it
builds, so converting a file held its float32 weights about one and a half times over (1.2 GB at
most for the default model's 540 MB). Here each tensor is de-quantised a piece at a time
(`PIECE_BYTES`), put in transformers' order and names by transformers' own per-architecture step (its
q/k row order, Gemma's norms), checked, and written straight into its shard, whose header is known
from the file's tensor table before any value is; so converting needs memory for one piece whatever
the tensor's or the model's size. The architectures it runs for are those whose result is checked
bit for bit against transformers' own conversion (tests/test_gguf_tensors.py); others keep
transformers' path.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Final, Iterator

import numpy
import torch

from specsure.config.gguf_header import TensorEntry, read_gguf_tensors

STREAMED_ARCHITECTURES: Final[frozenset[str]] = frozenset({"llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3"})
"""GGUF architectures (general.architecture) converted tensor by tensor: dense decoders whose tensors
map one to one onto the model's parameters. MoE files, whose experts transformers stacks across
tensors, go through transformers' reader."""
SHARD_BYTES: Final[int] = 4 << 30
"""The largest shard (save_pretrained's default is 5 GB). Written as the values arrive, so its size
costs no memory."""
PIECE_BYTES: Final[int] = 16 << 20
"""About the most float32 values of a tensor de-quantised at once (a Llama file's q and k: a whole one)."""


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


def write_tensors(gguf: Path, skeleton: torch.nn.Module, out: Path,
                  bad_values: Callable[[str, int, int], None]) -> WrittenTensors:
    """De-quantise ``gguf``'s tensors into float32 safetensors shards in ``out``, named as ``skeleton``
    (the model on the meta device, built from the file's config) names its parameters; a file that
    lacks one, or holds one in a shape the model does not take, is reported and nothing is written.
    ``bad_values(name, count, total)`` is called for a tensor with ``count`` NaN or infinite values of
    ``total`` (it raises)."""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    metadata, entries = read_gguf_tensors(str(gguf))
    architecture = metadata.get("general.architecture")
    # The head counts the model is built with: a file without a kv head count has as many as query
    # heads, as llama.cpp reads it (transformers' own step, given the file's parsed values, left the q
    # and k rows in llama.cpp's order then), and one-layer arrays read as their one value.
    text = skeleton.config
    config = {"num_attention_heads": text.num_attention_heads,
              "num_key_value_heads": getattr(text, "num_key_value_heads", None) or text.num_attention_heads}
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=config)
    mapping = _names(skeleton, str(architecture))
    wanted = _wanted_shapes(skeleton)
    found = WrittenTensors()
    kept: list[tuple[TensorEntry, str, tuple[int, ...]]] = []  # the tensors written: entry, name, shape
    for entry in entries:
        name, shape = mapping.get(entry.name), tuple(reversed(entry.shape))
        if name is None or name not in wanted:  # a tensor the model has no parameter for, as transformers skips
            continue
        if shape != wanted[name]:
            found.mismatched_keys.append((name, shape, wanted[name]))
        else:
            kept.append((entry, name, shape))
    found.missing_keys = sorted(set(wanted) - {name for _, name, _ in kept})
    if found.missing_keys or found.mismatched_keys:
        return found  # refused by the caller, naming them; nothing worth de-quantising
    data = dict(zip((e.name for e in entries), _mapped_data(gguf, entries)))
    shards = _shards([(name, shape) for _, name, shape in kept])
    for path, names in shards.items():
        inside = set(names)
        with _ShardFile(out / path, [(name, wanted[name]) for name in names]) as shard:
            for entry, name, _shape in kept:
                if name not in inside:
                    continue
                bad = 0
                for piece in _pieces(processor, entry, data[entry.name], config, mapping):
                    bad += int(piece.size - numpy.isfinite(piece).sum())
                    shard.write(piece)
                if bad:
                    bad_values(name, bad, math.prod(entry.shape))
    if len(shards) > 1:
        weight_map = {name: path for path, names in shards.items() for name in names}
        total = 4 * sum(math.prod(shape) for _, _, shape in kept)
        found.index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    return found


def _pieces(processor: Any, entry: TensorEntry, data: numpy.ndarray, config: dict[str, Any],
            mapping: dict[str, str]) -> Iterator[numpy.ndarray]:
    """``entry``'s float32 values in transformers' order, a few MB of rows at a time, so a tensor larger
    than memory allows twice (a large vocabulary's embedding) is never held whole. A processor that
    moves rows (Llama's q and k: llama.cpp interleaves each head's rotary halves) gets the tensor
    whole; the others' steps are per value (Gemma's norms) or none."""
    from gguf import dequantize
    from transformers.modeling_gguf_pytorch_utils import Gemma2TensorProcessor, TensorProcessor

    per_value = type(processor) in (TensorProcessor, Gemma2TensorProcessor) or \
        (".attn_q." not in entry.name and ".attn_k." not in entry.name)
    rows = data.shape[0] if data.ndim > 1 else 1
    row_bytes = 4 * math.prod(entry.shape[:-1])  # a row of the first dimension, whatever the others
    step = max(1, rows if not per_value or data.ndim < 2 else PIECE_BYTES // max(1, row_bytes))
    for start in range(0, max(rows, 1), step):
        part = data[start:start + step] if data.ndim > 1 else data
        result = processor.process(weights=dequantize(part, entry.kind), name=entry.name, tensor_key_mapping=mapping,
                                   parsed_parameters={"config": config})
        # Copied only where it must be: an F32 tensor is a view of the read-only mapped file.
        yield numpy.require(result.weights, numpy.float32, ["C_CONTIGUOUS", "WRITEABLE"])


def write_index(found: WrittenTensors, out: Path) -> None:
    """The shards' index beside them, as save_pretrained writes it (none for one file)."""
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


def _shards(tensors: list[tuple[str, tuple[int, ...]]]) -> dict[str, list[str]]:
    """File name -> the tensors in it, in order, each file at most `SHARD_BYTES` of float32 (a larger
    tensor alone in one), named as save_pretrained names them."""
    groups: list[list[str]] = [[]]
    filled = 0
    for name, shape in tensors:
        size = 4 * math.prod(shape)
        if groups[-1] and filled + size > SHARD_BYTES:
            groups.append([])
            filled = 0
        groups[-1].append(name)
        filled += size
    if len(groups) == 1:
        return {"model.safetensors": groups[0]}
    return {f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors": names for i, names in enumerate(groups)}


class _ShardFile:
    """One safetensors file written as its tensors' values arrive: the header first (every tensor's
    name, shape and place, known before any is de-quantised), then the float32 bytes in the header's
    order. Its metadata says PyTorch, as save_pretrained's does."""

    def __init__(self, path: Path, tensors: list[tuple[str, tuple[int, ...]]]) -> None:
        header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
        offset = 0
        for name, shape in tensors:
            size = 4 * math.prod(shape)
            header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + size]}
            offset += size
        text = json.dumps(header, separators=(",", ":")).encode("utf-8")
        self._text = text + b" " * (-len(text) % 8)  # the data starts 8-byte aligned
        self._size = offset
        self._path = path

    def __enter__(self) -> "_ShardFile":
        self._file = open(self._path, "wb")
        self._file.write((len(self._text)).to_bytes(8, "little") + self._text)
        self._written = 0
        return self

    def write(self, values: numpy.ndarray) -> None:
        """The next float32 values, in the order of the header's tensors."""
        if values.size:  # an empty piece has no bytes (and memoryview cannot cast it)
            self._file.write(memoryview(values).cast("B"))
        self._written += values.nbytes

    def __exit__(self, kind: object, error: object, trace: object) -> None:
        self._file.close()
        if kind is None and self._written != self._size:  # a programming error: the header would lie
            raise AssertionError(f"{self._path}: wrote {self._written} bytes of tensors, the header names {self._size}")
