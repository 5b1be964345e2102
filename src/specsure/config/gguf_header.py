"""A minimal GGUF key/value header reader: metadata in milliseconds, no numpy, no tensors.

The `gguf` package's reader parses every array (49k vocabulary strings and the merges) into
numpy objects, which takes seconds. Explaining a config needs a handful of scalars and the
vocabulary's length, so arrays are skipped and only their element count is kept.
Layout (GGUF v2/v3, little-endian): magic "GGUF", u32 version, u64 tensor count, u64 kv count,
then per kv: u64-length-prefixed UTF-8 key, u32 value type, value.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Any, BinaryIO, Final

# value type -> struct format for fixed-size scalars
_SCALARS: Final[dict[int, str]] = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                                   10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_MAX_KEYS: Final[int] = 1 << 20
_MAX_ARRAY_DEPTH: Final[int] = 8
_MAX_DIMS: Final[int] = 8
TOKENS_KEY: Final[str] = "tokenizer.ggml.tokens"


class GGUFHeaderError(ValueError):
    """The file is not a GGUF file this reader understands."""


@dataclass(frozen=True)
class TensorEntry:
    """One row of a GGUF file's tensor table."""

    name: str
    shape: tuple[int, ...]
    """As the file lists it: the fastest-varying dimension first (llama.cpp's order)."""
    kind: int
    """The GGML type id (0 F32, 1 F16, 8 Q8_0, ...)."""
    start: int
    """Where its data begins in the file, in bytes."""


def read_gguf_metadata(path: str) -> dict[str, Any]:
    """Scalar and string values by key; an array's value is its element count."""
    with open(path, "rb") as fh:
        return _metadata(fh)[0]


def read_gguf_tokens(path: str) -> list[str] | None:
    """The vocabulary, ``tokenizer.ggml.tokens`` (token i at index i), or None when the file has none."""
    with open(path, "rb") as fh:
        tokens = _metadata(fh, keep=TOKENS_KEY)[0].get(TOKENS_KEY)
    return tokens if isinstance(tokens, list) else None


def read_gguf_tensors(path: str) -> tuple[dict[str, Any], list[TensorEntry]]:
    """The metadata (as `read_gguf_metadata`) and the tensor table, whose data offsets are made
    absolute (the data section starts at the next ``general.alignment`` boundary, default 32)."""
    with open(path, "rb") as fh:
        metadata, tensors = _metadata(fh)
        rows = []
        for _ in range(tensors):
            name = _string(fh)
            (dims,) = _unpack(fh, "<I")
            if dims > _MAX_DIMS:
                raise GGUFHeaderError(f"tensor {name!r} has an implausible {dims} dimensions")
            shape = _unpack(fh, f"<{dims}Q") if dims else ()
            kind, offset = _unpack(fh, "<IQ")
            rows.append((name, tuple(shape), kind, offset))
        align = metadata.get("general.alignment", 32)
        align = align if isinstance(align, int) and align > 0 else 32
        data = -(-fh.tell() // align) * align
    return metadata, [TensorEntry(name, shape, kind, data + offset) for name, shape, kind, offset in rows]


def _metadata(fh: BinaryIO, keep: str | None = None) -> tuple[dict[str, Any], int]:
    """(key/value metadata, tensor count), leaving ``fh`` at the tensor table; the string array under
    the key ``keep`` is read whole, every other array only counted."""
    if fh.read(4) != b"GGUF":
        raise GGUFHeaderError("missing the GGUF magic bytes")
    (version,) = _unpack(fh, "<I")
    if version not in (2, 3):
        raise GGUFHeaderError(f"GGUF version {version} is not supported (2 or 3 are)")
    (tensors,) = _unpack(fh, "<Q")
    (count,) = _unpack(fh, "<Q")
    if count > _MAX_KEYS or tensors > _MAX_KEYS:
        raise GGUFHeaderError(f"implausible key or tensor count ({count}, {tensors})")
    out: dict[str, Any] = {}
    for _ in range(count):
        key = _string(fh)
        (kind,) = _unpack(fh, "<I")
        out[key] = _strings(fh) if key == keep and kind == _ARRAY else _value(fh, kind)
    return out, tensors


def _strings(fh: BinaryIO) -> list[str] | int:
    """A string array whole; any other array is skipped and counted, as `_value` does."""
    (item_kind,) = _unpack(fh, "<I")
    if item_kind != _STRING:
        fh.seek(-4, 1)
        return _value(fh, _ARRAY)
    (length,) = _unpack(fh, "<Q")
    return [_string(fh) for _ in range(length)]


def _unpack(fh: BinaryIO, fmt: str) -> tuple[Any, ...]:
    size = struct.calcsize(fmt)
    raw = fh.read(size)
    if len(raw) != size:
        raise GGUFHeaderError("file ends inside its header")
    return struct.unpack(fmt, raw)


def _skip(fh: BinaryIO, size: int, what: str) -> None:
    """Seek past ``size`` bytes; a damaged length is named rather than overflowing the seek."""
    if size > os.fstat(fh.fileno()).st_size - fh.tell():
        raise GGUFHeaderError(f"file ends inside {what} (a damaged length of {size} bytes)")
    fh.seek(size, 1)


def _string(fh: BinaryIO) -> str:
    (length,) = _unpack(fh, "<Q")
    if length > os.fstat(fh.fileno()).st_size - fh.tell():  # a damaged length must not allocate exabytes
        raise GGUFHeaderError("file ends inside a string")
    raw = fh.read(length)
    if len(raw) != length:
        raise GGUFHeaderError("file ends inside a string")
    return raw.decode("utf-8", errors="replace")


def _value(fh: BinaryIO, kind: int, depth: int = 0) -> Any:
    if kind in _SCALARS:
        return _unpack(fh, _SCALARS[kind])[0]
    if kind == _STRING:
        return _string(fh)
    if kind == _ARRAY:
        if depth >= _MAX_ARRAY_DEPTH:
            raise GGUFHeaderError(f"arrays nested more than {_MAX_ARRAY_DEPTH} deep")
        (item_kind,) = _unpack(fh, "<I")
        (length,) = _unpack(fh, "<Q")
        if item_kind in _SCALARS:
            _skip(fh, struct.calcsize(_SCALARS[item_kind]) * length, "an array")
        elif item_kind == _STRING:
            for _ in range(length):
                (size,) = _unpack(fh, "<Q")
                _skip(fh, size, "a string")
        else:
            for _ in range(length):
                _value(fh, item_kind, depth + 1)
        return length
    raise GGUFHeaderError(f"unknown GGUF value type {kind}")
