"""A disk cache of self-distilled samples, so a second training run on the same data starts at once.

Generating the target's continuations and recording its features is most of a short run's time.
The samples are stored as one safetensors file (never pickle) under a key that covers everything
they depend on: the target's folder and dtype, the prompts' token ids, the continuation length
and the aux layers. A changed input is a new key; a corrupt or foreign file is ignored and rebuilt.

Generation itself can take hours when the data grows, so its progress is kept too, beside the
samples file (`specsure.train.continuations`).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from specsure.config.checkpoint import cache_root
from specsure.train.data import Sample
from specsure.train.leftovers import save_tensors

logger = logging.getLogger(__name__)

FORMAT = "specsure-train-samples-1"


def default_cache_dir() -> Path:
    """Where the sample cache lives unless --cache-dir says otherwise."""
    return cache_root() / "train"


def cache_key(target_path: str, dtype: str, prompts: Sequence[Sequence[int]], max_new_tokens: int,
              aux_layers: tuple[int, ...], extra: str = "") -> str:
    """``extra`` names anything else the samples depend on (a second round of derived prompts)."""
    fields = {"format": FORMAT, "target": str(target_path), "dtype": dtype, "prompts": [list(p) for p in prompts],
              "max_new_tokens": max_new_tokens, "aux_layers": list(aux_layers),
              "target_files": target_files(target_path)}
    if extra:  # absent otherwise, so the keys of earlier caches still match
        fields["extra"] = extra
    payload = json.dumps(fields)
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def target_files(target_path: str) -> list[list[object]]:
    """What identifies the target's weights without reading them: the resolved path of each weight and
    config file, its size and its modification time. The path as typed is not enough: another model
    copied over it, or reached through the same relative path, would reuse the old model's features."""
    path = Path(target_path).expanduser().resolve()
    if not path.exists():
        return []
    files = [path] if path.is_file() else sorted(
        p for p in path.iterdir() if p.suffix in (".safetensors", ".gguf", ".json") and p.is_file())
    return [[str(f), f.stat().st_size, f.stat().st_mtime_ns] for f in files]


def cached_samples(folder: Path | None, key: str, build: Callable[[], list[Sample]],
                   vocab_size: int | None = None) -> tuple[list[Sample], bool]:
    """(samples, whether they came from the cache); ``build`` runs on a miss and its result is stored.

    A file that does not read back as sound samples (token ids in [0, ``vocab_size``), features of
    one row per token and finite) is built again, with a warning: its key says what it should hold,
    so anything else is damage, and training on it would fail far from the cause.
    """
    if folder is None:
        return build(), False
    path = folder / f"{key}.safetensors"
    if path.is_file():
        loaded = _load(path)
        why = "it does not read as a samples file" if loaded is None else _unsound(loaded, vocab_size)
        if why is None:
            return loaded, True  # type: ignore[return-value]
        logger.warning("the cached samples %s are damaged (%s); building them again", path, why)
    samples = build()
    _store(folder, path, samples)
    return samples, False


def _load(path: Path) -> list[Sample] | None:
    try:
        tensors = load_file(str(path))
        with open(path, "rb") as handle:  # the header's metadata holds the prompt lengths
            size = int.from_bytes(handle.read(8), "little")
            meta = json.loads(handle.read(size)).get("__metadata__", {})
        lengths = json.loads(meta["prompt_lens"])
    except (OSError, SafetensorError, ValueError, KeyError):
        return None
    out = []
    for i, prompt_len in enumerate(lengths):
        if f"tokens.{i}" not in tensors or f"hidden.{i}" not in tensors:
            return None
        out.append(Sample(tensors[f"tokens.{i}"], tensors[f"hidden.{i}"], int(prompt_len), tensors.get(f"aux.{i}")))
    return out


def _unsound(samples: list[Sample], vocab_size: int | None) -> str | None:
    """What is wrong with samples read back from a cache file, or None."""
    for i, sample in enumerate(samples):
        tokens, n = sample.token_ids, sample.token_ids.shape[0]
        if tokens.dim() != 1 or tokens.is_floating_point() or not 0 <= sample.prompt_len <= n:
            return f"sample {i}'s tokens are not a list of ids with its prompt in it"
        if n and (int(tokens.min()) < 0 or (vocab_size is not None and int(tokens.max()) >= vocab_size)):
            return f"sample {i} holds a token id outside the target's vocabulary [0, {vocab_size})"
        for name, features in (("hidden", sample.hidden), ("aux", sample.aux)):
            if features is None:
                continue
            if features.dim() != 2 or features.shape[0] != n:
                return f"sample {i}'s {name} features are not one row per token"
            if not bool(torch.isfinite(features).all()):
                return f"sample {i}'s {name} features hold values that are not finite"
    return None


def _store(folder: Path, path: Path, samples: list[Sample]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for i, sample in enumerate(samples):
        tensors[f"tokens.{i}"] = sample.token_ids.contiguous()
        tensors[f"hidden.{i}"] = sample.hidden.contiguous()
        if sample.aux is not None:
            tensors[f"aux.{i}"] = sample.aux.contiguous()
    # shared by every run: its temporaries carry this process's tag, for a later run to sweep if it is killed
    save_tensors(tensors, path, ".samples-",
                 metadata={"format": FORMAT, "prompt_lens": json.dumps([s.prompt_len for s in samples])})

