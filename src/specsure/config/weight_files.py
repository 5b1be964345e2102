"""A checkpoint folder's weight files, read without loading them: which are safetensors and which
pickle, a safetensors file's header, and a shard index checked against the shards it names."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, Final, Sequence

from specsure.config.errors import ConfigError

PICKLE_SUFFIXES: Final[tuple[str, ...]] = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
_SAFETENSORS_HEADER_LIMIT: Final[int] = 100 * 1024 * 1024
SAFETENSORS_INDEX: Final[str] = "model.safetensors.index.json"


def check_weight_files(path: str, weight_files: Sequence[str], pickle_files: Sequence[str], role: str) -> None:
    """A folder's weights must be safetensors, and its shard index name shards it holds; pickle files
    are refused because loading them runs code."""
    if weight_files:
        _check_shard_index(Path(path))
        return
    if pickle_files:
        raise ConfigError(
            f"{role} checkpoint {path!r} has only pickle weights ({', '.join(pickle_files)}). "
            "specsure loads safetensors or GGUF only, because pickle files can run code. Convert them: "
            "load with transformers and call save_pretrained(folder, safe_serialization=True).")
    raise ConfigError(f"{role} checkpoint {path!r} has config.json but no *.safetensors weights. "
                      "Add the weights, or point to the folder that has them.")


def _check_shard_index(folder: Path) -> None:
    index = folder / SAFETENSORS_INDEX
    if not index.is_file():
        return
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as err:
        raise ConfigError(f"{index} is malformed ({err}); regenerate it with save_pretrained.") from None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ConfigError(f"{index} is malformed (weight_map must map tensor names to shard file names, got "
                          f"{json.dumps(weight_map)[:80]}); regenerate it with save_pretrained.")
    missing = sorted({s for s in weight_map.values() if not (folder / s).is_file()})
    if missing:
        raise ConfigError(f"{index} lists shards missing from {folder}: {', '.join(missing)}.")


def weight_files(folder: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(safetensors files, pickle files) directly in ``folder``, sorted by name."""
    files = sorted(f.name for f in folder.iterdir() if f.is_file())
    return (tuple(f for f in files if f.endswith(".safetensors")),
            tuple(f for f in files if f.lower().endswith(PICKLE_SUFFIXES)))


def read_safetensors_names(path: Path) -> set[str]:
    """Tensor names from a safetensors header: an 8-byte little-endian length, then JSON."""
    return {name for name in read_safetensors_header(path) if name != "__metadata__"}


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """A safetensors file's JSON header: each tensor's ``dtype``, ``shape`` and offsets by name."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(8)
            if len(raw) != 8:
                raise ValueError("file shorter than its 8-byte header length")
            (length,) = struct.unpack("<Q", raw)
            if length > _SAFETENSORS_HEADER_LIMIT:
                raise ValueError(f"header length {length} is implausible")
            header = json.loads(fh.read(length))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} is not a readable safetensors file ({exc}). Re-save the weights "
                          "with safetensors.") from None
    except RecursionError:
        raise ConfigError(f"{path} is not a readable safetensors file (its JSON header nests too deeply). "
                          "Re-save the weights with safetensors.") from None
    if not isinstance(header, dict):
        raise ConfigError(f"{path}: safetensors header is not a JSON object.")
    return header
