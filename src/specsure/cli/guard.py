"""How a command runs: a user error as one line and exit 2, never a traceback; Ctrl-C as "interrupted"
(130), inside a library too; a full disk named; a reader of stdout that leaves (`| head`) costing
nothing it wanted, and a long command's files still written."""

from __future__ import annotations

import errno
import os
import stat
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, TextIO

from specsure.cli.common import EXIT_FAIL, EXIT_USAGE


def one_line(message: str) -> str:
    """``message`` with its line breaks escaped: a path holding a newline must not split an error in two."""
    return message.replace("\r", "\\r").replace("\n", "\\n")


def guarded(run: Callable[[], int]) -> int:
    """Run a command; a user error prints one paragraph (no traceback) and exits 2."""
    try:
        code = run()
        sys.stdout.flush()  # a full or closed stdout fails here, inside the handlers below
        return code
    except ValueError as exc:  # ConfigError and every other user-input error
        print(f"error: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        if not _stdout_is_pipe():  # a pipe of the command's own broke: that is a failure to show
            raise
        # The reader of stdout went away (`| head`): nothing is lost that it wanted.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's own flush stays quiet
        return EXIT_FAIL
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            if _interrupted(exc):
                print("interrupted", file=sys.stderr)
                return 130
            raise
        # A write to a file object names no file, so which one filled is told by trying stdout again.
        try:
            sys.stdout.flush()
            broken = False
        except OSError:
            broken = True
        where = exc.filename or ("standard output" if broken else "a file this command writes")
        print(f"error: no space left on the device while writing {where}; free some space, or point the output, "
              "XDG_CACHE_HOME (model conversions, caches) or --out at a disk with room.", file=sys.stderr)
        if broken:  # so the exit's own flush stays quiet
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAIL
    except Exception as exc:
        if _interrupted(exc):  # Ctrl-C inside a library that turned it into its own error
            print("interrupted", file=sys.stderr)
            return 130
        if "os error 28" in str(exc):  # safetensors' Rust writer reports a full disk as its own error type
            print(f"error: the disk ran out of space while a file was written ({exc}); free some space, or point "
                  "XDG_CACHE_HOME (model conversions, caches) or --out at a disk with room.", file=sys.stderr)
            return EXIT_FAIL
        raise


def _interrupted(exc: BaseException) -> bool:
    """Whether a KeyboardInterrupt caused ``exc``: transformers' lazy importer, interrupted while it
    imports, raises ModuleNotFoundError from it, which read as a broken install with a traceback."""
    seen = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


class _Unread:
    """Standard output that turns into /dev/null when its reader goes away, instead of failing."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.gone = False

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._leave()
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._leave()

    def _leave(self) -> None:
        self.gone = True
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, self._stream.fileno())  # its buffered rest flushes into nothing
        os.close(null)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextmanager
def results_run(out: str) -> Iterator[None]:
    """A long command whose files in ``out`` are its result (`specsure bench`, `bench serve`): it outlives
    a reader of stdout that leaves (``output_outlives_reader``), and a folder it made but stopped
    before filling (an error, Ctrl-C) is not left behind empty."""
    folder = Path(out).expanduser()
    made = not folder.exists()
    try:
        with output_outlives_reader():
            yield
    finally:
        if made and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()


@contextmanager
def output_outlives_reader() -> Iterator[None]:
    """For a long command whose files are its result (`specsure bench | head`): when stdout's reader
    leaves, the command goes on quietly and still writes its files, where it would otherwise stop
    at its next progress line with nothing saved."""
    if not _stdout_is_pipe():
        yield
        return
    stream = sys.stdout
    sys.stdout = _Unread(stream)  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout = stream


def _stdout_is_pipe() -> bool:
    try:
        return stat.S_ISFIFO(os.fstat(sys.stdout.fileno()).st_mode)
    except (OSError, ValueError):
        return False
