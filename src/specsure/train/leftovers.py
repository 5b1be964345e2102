"""Temporary files a killed trainer left behind, and which of them are safe to remove.

A head and a resume point are written under temporary names and renamed into place, so Ctrl-C
and crashes clean up after themselves; SIGKILL (the OOM killer, a closed laptop lid on a remote
shell) cannot. Each temporary name carries its writer's tag, a digest of the host name and of the
process-id namespace (containers on one host may share its name but not their process ids) and
the process id, so a later run can tell a dead writer's leftovers from a live run's files in the
same folder, even on a folder that several hosts or containers share.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any

from safetensors.torch import save_file


def tag() -> str:
    """This process's tag for its temporary names: ``{host and namespace digest}-{pid}``."""
    return f"{_host()}-{os.getpid()}"


def stale(path: Path, prefix: str) -> bool:
    """True when ``path`` is named ``{prefix}{tag}-...`` by a process of this host that no longer runs.

    A name without a tag, or from another host or process-id namespace, is never stale: there is
    no telling whether its writer still runs.
    """
    match = re.fullmatch(re.escape(prefix) + r"([0-9a-f]{8})-(\d+)-.*", path.name)
    if match is None or match.group(1) != _host():
        return False
    pid = int(match.group(2))
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # it runs, as another user
        return False
    return False


def sweep(folder: Path, prefix: str) -> None:
    """Remove the entries of ``folder`` named ``{prefix}{tag}-...`` whose writer is gone (files or folders)."""
    for path in folder.glob(f"{glob.escape(prefix)}*"):
        if stale(path, prefix):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)


def save_tensors(tensors: dict[str, Any], dest: Path, prefix: str, metadata: dict[str, str] | None = None) -> None:
    """Write a safetensors file to ``dest`` atomically, its temporaries in a folder ``{prefix}{tag}-...``
    beside it, so that `sweep` can find what a killed write left.

    safetensors writes through a temporary file of its own (``.tmpXXXXXX``, as large as the file)
    in the destination's folder; written straight beside ``dest``, a SIGKILL would leave that file
    untagged, with no telling whose it is. In a tagged folder of this process's it goes with the folder.
    """
    sweep(dest.parent, prefix)
    work = Path(tempfile.mkdtemp(prefix=f"{prefix}{tag()}-", dir=dest.parent))
    try:
        save_file(tensors, str(work / dest.name), metadata=metadata)
        os.replace(work / dest.name, dest)  # atomic: a reader sees the previous file or the whole new one
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _host() -> str:
    try:  # the process-id namespace: which pids this process can see, and so test
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:  # no /proc (macOS): the host name alone
        namespace = ""
    return hashlib.sha256(f"{socket.gethostname()}|{namespace}".encode()).hexdigest()[:8]
