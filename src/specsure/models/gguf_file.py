"""What a GGUF file must be before transformers converts it: every tensor of a type that can be
de-quantised, every tensor's data inside the file, no decoder block past ``block_count``.

transformers reports none of these in words: an unsupported type is a bare NotImplementedError
from the gguf package, a truncated file a numpy reshape error, and blocks past ``block_count``
are dropped without a word (the model then runs fluent and wrong). Reading the tensor table
first (`config.gguf_header`, no numpy) names the file, the tensor and the fix instead.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from specsure.config.gguf_header import GGUFHeaderError, TensorEntry, read_gguf_tensors
from specsure.models.errors import ModelLoadError

_BLOCK = re.compile(r"^blk\.(\d+)\.")


def check_gguf(path: Path) -> None:
    """Raise ModelLoadError naming ``path`` and the tensor at fault; return quietly for a sound file."""
    import gguf

    try:
        metadata, tensors = read_gguf_tensors(str(path))
    except (OSError, GGUFHeaderError) as exc:
        raise ModelLoadError(f"{path} is not a readable GGUF file ({exc}); re-download or re-convert it.") from None
    parts, part = metadata.get("split.count"), metadata.get("split.no")
    if isinstance(parts, int) and parts > 1:
        which = f"part {part + 1}" if isinstance(part, int) else "a part"
        raise ModelLoadError(f"{path} is {which} of a GGUF split into {parts} files "
                             "(split.count); merge them first: llama-gguf-split --merge FIRST-PART MERGED.gguf, and "
                             "load the merged file.")
    arch = metadata.get("general.architecture")
    if metadata.get(f"{arch}.context_length") == 0:  # transformers would read it as a model without a limit
        raise ModelLoadError(f"{path}: {arch}.context_length = 0, a context of no tokens; the model's context "
                             "length is missing from the conversion. Re-convert it with llama.cpp's "
                             "convert_hf_to_gguf.py, or load its Hugging Face folder.")
    readable = dequantisable()
    size = path.stat().st_size
    for entry in tensors:
        kind = type_name(entry.kind)
        if entry.kind not in readable:
            names = ", ".join(type_name(t) for t in sorted(readable))
            raise ModelLoadError(f"{path}: tensor {entry.name!r} is of type {kind}, which the installed gguf package "
                                 f"cannot de-quantise (it reads {names}); convert the model to one of those types, "
                                 "for example Q8_0 or F16 with llama.cpp's convert_hf_to_gguf.py.")
        block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(entry.kind)]
        end = entry.start + math.prod(entry.shape) // block * type_size
        if end > size:
            raise ModelLoadError(f"{path} is truncated: tensor {entry.name!r} ({kind}, shape {list(entry.shape)}) "
                                 f"ends at byte {end}, but the file has {size} bytes; re-download it.")
    _check_blocks(path, metadata, tensors)
    _check_heads(path, metadata)
    _check_tokenizer(path, metadata)


READ_SPECIAL_IDS = tuple(f"tokenizer.ggml.{name}_token_id" for name in ("bos", "eos", "unknown", "padding"))
"""The special token ids transformers' GGUF reader maps (integrations/ggml.py)."""


def _check_tokenizer(path: Path, metadata: dict[str, object]) -> None:
    """A byte-level BPE ('gpt2') vocabulary is unusable without its merges; transformers then looks
    for SentencePiece scores instead and fails with a bare KeyError('scores')."""
    if metadata.get("tokenizer.ggml.model") == "gpt2" and "tokenizer.ggml.merges" not in metadata:
        raise ModelLoadError(f"{path}: its tokenizer is byte-level BPE (tokenizer.ggml.model = 'gpt2') but the "
                             "metadata has no tokenizer.ggml.merges, so text cannot be tokenized; re-convert the "
                             "model with its merges (llama.cpp's convert_hf_to_gguf.py writes them).")
    # read_gguf_tensors gives an array's length: one of the special token ids transformers reads
    # (the others it ignores) past it makes transformers fail with a bare IndexError.
    tokens = metadata.get("tokenizer.ggml.tokens")
    for key in READ_SPECIAL_IDS:
        value = metadata.get(key)
        if isinstance(tokens, int) and isinstance(value, int) and not 0 <= value < tokens:
            raise ModelLoadError(f"{path}: {key} = {value} is not a token of its vocabulary of {tokens} tokens "
                                 "(tokenizer.ggml.tokens). llama.cpp ignores such an id with a warning, but "
                                 "transformers, which converts the file here, cannot read the tokenizer with it. Fix "
                                 "the key with gguf-py's gguf_set_metadata.py, or re-convert the model.")


def dequantisable() -> frozenset[int]:
    """GGML type ids the installed gguf package de-quantises (transformers converts through it)."""
    import gguf
    from gguf import quants

    traits = getattr(quants, "_type_traits", None)
    if not isinstance(traits, dict):  # a gguf without that table: every type it names, and the conversion decides
        return frozenset(int(t) for t in gguf.GGMLQuantizationType)
    return frozenset({int(gguf.GGMLQuantizationType.F32), int(gguf.GGMLQuantizationType.F16),
                      *(int(t) for t in traits)})


def _check_blocks(path: Path, metadata: dict[str, object], tensors: list[TensorEntry]) -> None:
    arch = metadata.get("general.architecture")
    count = metadata.get(f"{arch}.block_count")
    if not isinstance(count, int):
        return
    nextn = metadata.get(f"{arch}.nextn_predict_layers")
    declared = count + (nextn if isinstance(nextn, int) else 0)
    beyond = sorted({int(m.group(1)) for e in tensors if (m := _BLOCK.match(e.name))} - set(range(declared)))
    if beyond:
        held = str(beyond[0]) if len(beyond) == 1 else f"{beyond[0]} to {beyond[-1]}"
        raise ModelLoadError(f"{path}: {arch}.block_count = {count}, but the file also holds block {held} "
                             "(blk.N tensors), which the model would run without; the file's metadata and "
                             "tensors do not match, so re-convert it.")


SCALAR_HEAD_ARCHITECTURES: frozenset[str] = frozenset({
    "llama", "mistral", "qwen2", "qwen2moe", "qwen3", "qwen3moe", "phi3", "stablelm", "starcoder2"})
"""GGUF architectures whose head counts are one number for every layer (llama.cpp's converters)."""


def _check_heads(path: Path, metadata: dict[str, object]) -> None:
    """Attention head counts the model can be built with: transformers raises its dataclass validator's
    error for heads that do not divide the width (through no except clause of ours), and numpy's
    reshape error for kv heads that do not divide the heads."""
    arch = metadata.get("general.architecture")
    if arch not in SCALAR_HEAD_ARCHITECTURES:
        return  # the header reader gives an array's length, and some layouts count heads per layer
    width, heads, kv = (metadata.get(f"{arch}.{key}") for key in
                        ("embedding_length", "attention.head_count", "attention.head_count_kv"))
    if not (isinstance(width, int) and isinstance(heads, int)):
        return
    fix = "the file's metadata does not fit its tensors; re-convert the model."
    if heads <= 0 or (f"{arch}.attention.key_length" not in metadata and width % heads):
        raise ModelLoadError(f"{path}: {arch}.attention.head_count = {heads} does not divide "
                             f"{arch}.embedding_length = {width} into whole attention heads; {fix}")
    if isinstance(kv, int) and (kv <= 0 or heads % kv):
        raise ModelLoadError(f"{path}: {arch}.attention.head_count_kv = {kv} does not divide "
                             f"{arch}.attention.head_count = {heads} (each kv head serves a whole group of query "
                             f"heads); {fix}")


def type_name(kind: int) -> str:
    """gguf-py's name of a GGML type id (F16, Q4_K, ...), or the id where it has none."""
    import gguf

    try:
        return gguf.GGMLQuantizationType(kind).name
    except ValueError:
        return f"type id {kind}"
