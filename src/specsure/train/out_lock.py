"""One `specsure train` at a time per --out: a lock file beside the head, held for the whole run.

Two runs writing one --out would replace each other's head and resume points, and one run's
Ctrl-C message could point at the other's state. The lock is an advisory ``flock`` on
``.{out}.lock``: the kernel drops it when its holder exits, even by SIGKILL, so a dead run never
blocks the next. The file holds its holder's pid and host, for the message a second run gets.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path


def lock_path(out: Path) -> Path:
    return out.parent / f".{out.name}.lock"


@contextlib.contextmanager
def hold(out: Path) -> Iterator[None]:
    """Hold --out's lock while the body runs.

    Raises:
        ValueError: another run holds it, naming its pid and host and what to do.
    """
    path = lock_path(out)
    handle = _acquire(path, out)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            path.unlink()  # before unlocking: a run waiting on this inode then sees it is gone and retries
        os.close(handle)


def _acquire(path: Path, out: Path) -> int:
    for _ in range(100):  # only another run's unlink between our open and our lock makes us go round
        try:
            # Never through a link: in a folder others can write, a planted .NAME.lock link would have this run
            # truncate and overwrite whatever file it names.
            handle = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except PermissionError:  # another user's run left it (SIGKILL): say whose file blocks this --out
            raise ValueError(f"--out {str(out)!r}: the lock file {str(path)!r} belongs to another user and cannot be "
                             "taken; if no run of theirs is writing this head, delete that file.") from None
        except OSError:
            if not path.is_symlink():
                raise
            raise ValueError(f"--out {str(out)!r}: the lock file {str(path)!r} is a link (to {os.readlink(path)!r}), "
                             "which this run will not write through; delete the link.") from None
        if not stat.S_ISREG(os.fstat(handle).st_mode):  # a fifo or a device planted in its place
            os.close(handle)
            raise ValueError(f"--out {str(out)!r}: the lock file {str(path)!r} is not a regular file; delete it.")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(handle, 200).decode(errors="replace").strip() or "a process"
            os.close(handle)
            raise ValueError(f"--out {str(out)!r}: another specsure train ({holder}) is writing this head now; wait "
                             "for it to finish or stop it, or give another --out.") from None
        except OSError as exc:  # a file system without locks: say so rather than run unguarded unsaid
            os.close(handle)
            raise ValueError(f"--out {str(out)!r}: cannot lock {str(path)!r} ({exc.strerror}), which keeps two runs "
                             "from writing one head; give an --out on a local file system.") from None
        try:
            same = os.fstat(handle).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            os.ftruncate(handle, 0)
            os.write(handle, f"pid {os.getpid()} on {socket.gethostname()}".encode())
            return handle
        os.close(handle)  # the holder finished and removed the file after we opened it: take the new one
    raise ValueError(f"--out {str(out)!r}: could not take the lock {str(path)!r}; try again.")
