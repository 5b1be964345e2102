"""Temporary files a killed trainer left behind, and which of them are safe to remove.

A head and a resume point are written under temporary names and renamed into place, so Ctrl-C
and crashes clean up after themselves; SIGKILL (the OOM killer, a closed laptop lid on a remote
shell) cannot. Each temporary name carries its writer's tag, a digest of the host name and of the
process-id namespace (containers on one host may share its name but not their process ids) and
the process id, so a later run can tell a dead writer's leftovers from a live run's files in the
same folder, even on a folder that several hosts or containers share.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
from pathlib import Path


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


def _host() -> str:
    try:  # the process-id namespace: which pids this process can see, and so test
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:  # no /proc (macOS): the host name alone
        namespace = ""
    return hashlib.sha256(f"{socket.gethostname()}|{namespace}".encode()).hexdigest()[:8]
