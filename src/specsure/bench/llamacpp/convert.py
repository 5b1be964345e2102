"""Float copies of a GGUF checkpoint, so llama.cpp runs the very weights specsure runs.

specsure loads a quantised GGUF (the packaged default is Q4_1, its embedding Q8_0) by
dequantising every tensor to float32 and casting it to the run's dtype. `float_gguf` writes
the same file with every quantised tensor dequantised the same way (`gguf.quants.dequantize`)
and stored as F32, F16 or BF16, rounded to nearest even as torch casts; tensors stored as
floats or integers (the F32 norms) are copied byte for byte. Every metadata field is copied,
the tokenizer included, except `general.file_type`, which names the new type. Tensor layout
is unchanged: llama's q/k rows stay in GGUF's permuted order, which llama.cpp expects (and
transformers undoes on load).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

FLOAT_TYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
"""specsure dtype name -> the GGUF tensor type that holds its weights exactly."""
_FILE_TYPES = {"F32": "ALL_F32", "F16": "MOSTLY_F16", "BF16": "MOSTLY_BF16"}
_FILE_TYPE_KEY = "general.file_type"


def gguf_type_of(dtype: str) -> str:
    """'BF16' for 'bfloat16', ...; a ValueError names the valid dtypes."""
    try:
        return FLOAT_TYPES[dtype]
    except KeyError:
        raise ValueError(f"no float GGUF type for dtype {dtype!r}; valid: {', '.join(FLOAT_TYPES)}") from None


def float_gguf(source: Path, dtype: str) -> Path:
    """The float copy of `source` for `dtype`, written once into specsure's cache.

    The file name carries the source's cache key (resolved path, size, mtime), so a replaced
    source is converted again instead of reusing stale weights.
    """
    from specsure.config.checkpoint import cache_root
    from specsure.models.gguf_cache import gguf_cache_folder

    qtype = gguf_type_of(dtype)
    dest = cache_root() / "llamacpp" / f"{gguf_cache_folder(source).name}.{qtype}.gguf"
    if not dest.is_file():
        write_float_gguf(source, dest, qtype)
    return dest


def write_float_gguf(source: Path, dest: Path, qtype: str) -> None:
    """Write `source` with its quantised tensors dequantised to `qtype` ('F32', 'F16', 'BF16').

    Written to a temp file next to `dest` and renamed into place, so an interrupted
    conversion never leaves a truncated `dest`.
    """
    import gguf

    target = gguf.GGMLQuantizationType[qtype]
    reader = gguf.GGUFReader(source)
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE)
    if arch is None:
        raise ValueError(f"{source} has no {gguf.Keys.General.ARCHITECTURE}; is it a model GGUF?")
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f"{dest.name}.tmp-", dir=dest.parent)
    os.close(fd)
    try:
        writer = gguf.GGUFWriter(tmp, arch.contents())
        _copy_metadata(reader, writer, gguf.LlamaFileType[_FILE_TYPES[qtype]])
        plan = [(t, _output_type(t.tensor_type, target)) for t in reader.tensors]
        for tensor, out_type in plan:
            shape = tuple(reversed([int(n) for n in tensor.shape]))  # numpy order: rows last in GGUF
            nbytes = int(np.prod(shape)) * gguf.GGML_QUANT_SIZES[out_type][1] if out_type != tensor.tensor_type \
                else int(tensor.n_bytes)
            writer.add_tensor_info(tensor.name, shape, np.dtype(np.float32), nbytes, raw_dtype=out_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for tensor, out_type in plan:
            writer.write_tensor_data(_tensor_bytes(tensor, out_type))
        writer.close()
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _copy_metadata(reader, writer, file_type: int) -> None:
    import gguf

    for field in reader.fields.values():
        # GGUF.* are the header counts and the architecture is written by GGUFWriter itself.
        if field.name.startswith("GGUF.") or field.name == gguf.Keys.General.ARCHITECTURE:
            continue
        if field.name == _FILE_TYPE_KEY:
            writer.add_uint32(_FILE_TYPE_KEY, int(file_type))
            continue
        if field.name == gguf.Keys.General.ALIGNMENT:
            writer.data_alignment = int(field.contents())
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub_type)


def _output_type(tensor_type, target):
    """Quantised tensors become `target`; float and integer tensors keep their type."""
    import gguf

    block, _ = gguf.GGML_QUANT_SIZES[tensor_type]
    return target if block > 1 else tensor_type


def _tensor_bytes(tensor, out_type) -> np.ndarray:
    import gguf

    if out_type == tensor.tensor_type:
        return np.ascontiguousarray(tensor.data)
    values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)  # float32, numpy shape
    if out_type == gguf.GGMLQuantizationType.F32:
        return values.astype(np.float32, copy=False)
    if out_type == gguf.GGMLQuantizationType.F16:
        return values.astype(np.float16)
    return gguf.quants.quantize(values, out_type)  # BF16: round to nearest even, like torch
