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
from typing import Any, BinaryIO, Final

# value type -> struct format for fixed-size scalars
_SCALARS: Final[dict[int, str]] = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                                   10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_MAX_KEYS: Final[int] = 1 << 20
_MAX_ARRAY_DEPTH: Final[int] = 8


class GGUFHeaderError(ValueError):
    """The file is not a GGUF file this reader understands."""


def read_gguf_metadata(path: str) -> dict[str, Any]:
    """Scalar and string values by key; an array's value is its element count."""
    with open(path, "rb") as fh:
        if fh.read(4) != b"GGUF":
            raise GGUFHeaderError("missing the GGUF magic bytes")
        (version,) = _unpack(fh, "<I")
        if version not in (2, 3):
            raise GGUFHeaderError(f"GGUF version {version} is not supported (2 or 3 are)")
        _unpack(fh, "<Q")  # tensor count
        (count,) = _unpack(fh, "<Q")
        if count > _MAX_KEYS:
            raise GGUFHeaderError(f"implausible key count {count}")
        out: dict[str, Any] = {}
        for _ in range(count):
            key = _string(fh)
            (kind,) = _unpack(fh, "<I")
            out[key] = _value(fh, kind)
        return out


def _unpack(fh: BinaryIO, fmt: str) -> tuple[Any, ...]:
    size = struct.calcsize(fmt)
    raw = fh.read(size)
    if len(raw) != size:
        raise GGUFHeaderError("file ends inside its header")
    return struct.unpack(fmt, raw)


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
            fh.seek(struct.calcsize(_SCALARS[item_kind]) * length, 1)
        elif item_kind == _STRING:
            for _ in range(length):
                (size,) = _unpack(fh, "<Q")
                fh.seek(size, 1)
        else:
            for _ in range(length):
                _value(fh, item_kind, depth + 1)
        return length
    raise GGUFHeaderError(f"unknown GGUF value type {kind}")
