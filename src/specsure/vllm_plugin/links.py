"""Neutral symbolic links: the same checkpoint (a folder, or a GGUF file) under a path that vLLM's
substring test passes.

vLLM 0.33 switches methods when a draft (or, for mtp, the target) path merely contains
``eagle-``, ``eagle3``, ``dflash`` or ``dspark``. The plugin hands vLLM a link to the same folder,
named so that none of those substrings appear anywhere in its path. Links live in one cache
folder, one per real folder, named deterministically, so repeated calls (vLLM runs plugins in
every process) reuse the same link. Nothing is ever written through a link or outside the cache.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from specsure.config.checkpoint import cache_root
from specsure.config.errors import ConfigError
from specsure.config.vllm_overrides import neutral_name, vllm_path_trap


LINKS_ENV: str = "SPECSURE_VLLM_LINKS"


def link_cache() -> Path:
    """``$SPECSURE_VLLM_LINKS``, else ``$XDG_CACHE_HOME/specsure/vllm-links`` (``~/.cache`` by default)."""
    chosen = os.environ.get(LINKS_ENV)
    if chosen:
        return Path(chosen).expanduser().absolute()
    return cache_root() / "vllm-links"


def link_name(real: Path) -> str:
    """``<neutral folder name>_<12 hex digits of the real path's hash>``: stable for one folder; a file
    (a GGUF draft) keeps its extension after the digest, which vLLM reads its format from."""
    digest = hashlib.sha256(str(real).encode()).hexdigest()[:12]  # hex never spells a trap
    stem, suffix = (real.stem, real.suffix) if real.is_file() else (real.name, "")
    # An underscore, not a hyphen: 'qwen-eagle' + '-' would spell vLLM's 'eagle-'.
    name = f"{neutral_name(stem) or 'checkpoint'}_{digest}{neutral_name(suffix)}"
    assert vllm_path_trap(name) is None, name
    return name


def neutral_link(path: str) -> str:
    """A path to the same folder (or file: a GGUF draft) as ``path`` that vLLM's method detection does not
    catch.

    Raises:
        ConfigError: the folder does not exist, or the cache folder's own path holds a trap
            substring (set SPECSURE_VLLM_LINKS to a neutral folder).
    """
    real = Path(path).expanduser().resolve()
    if not (real.is_dir() or real.is_file()):
        raise ConfigError(f"cannot make a neutral link for {path!r}: {real} is neither a folder nor a file.")
    cache = link_cache()
    if (hit := vllm_path_trap(str(cache))) is not None:
        raise ConfigError(f"the link cache {str(cache)!r} contains {hit[0]!r}, which vLLM's method detection "
                          "catches too; set SPECSURE_VLLM_LINKS to a folder whose path does not.")
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a read-only home in a container, a cache path through a file, ...
        raise ConfigError(f"cannot create the link cache {str(cache)!r} for the neutral link to {path!r}: "
                          f"{exc.strerror or exc}. Set SPECSURE_VLLM_LINKS to a writable folder.") from None
    if cache.is_symlink() or not cache.is_dir():
        raise ConfigError(f"the link cache {str(cache)!r} is not a plain folder; remove it or set "
                          "SPECSURE_VLLM_LINKS.")
    link = cache / link_name(real)
    if os.path.islink(link) and os.readlink(link) == str(real):
        return str(link)
    if os.path.lexists(link) and not os.path.islink(link):
        raise ConfigError(f"{str(link)!r} in the link cache is not a link; remove it, and specsure makes the link.")
    # Written beside the final name and renamed over it, so another process sees either no link
    # or a complete one, and a stale entry (a link elsewhere, a file) is replaced, never followed.
    temp = cache / f".{link.name}.{os.getpid()}.tmp"
    try:
        if os.path.lexists(temp):
            os.unlink(temp)
        os.symlink(real, temp, target_is_directory=real.is_dir())
        os.replace(temp, link)
    except OSError as exc:
        raise ConfigError(f"cannot write the neutral link to {path!r} in the link cache {str(cache)!r}: "
                          f"{exc.strerror or exc}. Set SPECSURE_VLLM_LINKS to a writable folder.") from None
    return str(link)
