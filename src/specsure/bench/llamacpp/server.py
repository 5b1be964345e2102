"""llama.cpp's own server as a baseline: `llama-server`, plain and with its C++ n-gram drafter.

llama-cpp-python (the `llama.cpp*` baselines) drives llama.cpp from a Python loop, and its prompt
lookup is a Python drafter that makes llama.cpp compute logits for every prompt position. What a
llama.cpp user runs is `llama-server` (`make llama-server` builds it from the same release's
sources): decoding, sampling and speculation in C++. Each configuration is one server process on
the target's GGUF file as it is, one slot, prompt caching off; a generation is one `/completion`
request of token ids at temperature 0, and its time is the server's own `prompt_ms +
predicted_ms`, so HTTP is not charged to llama.cpp. Acceptance comes from the server's
`/metrics` counters, read before and after each request.
"""

from __future__ import annotations

import ctypes
import json
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from specsure.bench.generation import Generation, Kind
from specsure.bench.llamacpp.runner import STDERR_TAIL, LlamaCppError

LLAMA_SERVER_BASELINES: tuple[str, ...] = ("llama-server", "llama-server-lookup")
"""llama-server on the target's GGUF file: plain, and with `--spec-type ngram-simple` (opt-in)."""
DEFAULT_LLAMA_SERVER: Final[str] = ".venv-llamacpp/llama-server/build/bin/llama-server"
SERVER_HINT: Final[str] = ("run `make llama-server` (builds llama.cpp's llama-server from llama-cpp-python's "
                           "sources, about 20 minutes on 2 cores) or give --llama-server PATH")
PER_POSITION: Final[str] = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total{"
START_S: Final[float] = 120.0
"""The longest a server may take to load the model and answer /health."""


def _parent_death_signal() -> Any:
    """A function for Popen's ``preexec_fn`` that has Linux send the child SIGTERM when the bench
    dies, however it dies (a kill, `timeout`, the OOM killer): the server runs in a session of its
    own, so nothing else would stop it. None elsewhere. libc is opened here, in the parent, so the
    child between fork and exec makes one plain C call. (Linux signals when the starting thread
    ends: the bench starts its servers from its main thread.)"""
    if sys.platform != "linux":
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    pr_set_pdeathsig = 1
    return lambda: prctl(pr_set_pdeathsig, signal.SIGTERM)


def server_flags(baseline: str, k: int, lookup_n: int) -> list[str]:
    """The speculative flags of ``baseline``: none for plain; for lookup, llama.cpp's simplest n-gram
    drafter, which drafts the k tokens that followed the last earlier occurrence of the context's
    last ``lookup_n`` tokens (prompt lookup's rule with one n-gram size; the bench gives the longest
    that ngram tries)."""
    if baseline.endswith("-lookup"):
        return ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(lookup_n),
                "--spec-ngram-simple-size-m", str(k)]
    return []


class LlamaServer:
    """One llama-server process on 127.0.0.1 and a free port; stopped by ``close``."""

    def __init__(self, binary: str, model: Path, flags: Sequence[str], n_threads: int, n_ctx: int) -> None:
        if not Path(binary).is_file():
            raise LlamaCppError(f"llama-server is not built: no {binary}; {SERVER_HINT}")
        self.binary = binary
        with socket.socket() as probe:  # a port free now; the server binds it a moment later
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.command = [binary, "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-t", str(n_threads),
                        "-tb", str(n_threads), "-c", str(n_ctx), "-np", "1", "--no-webui", "--metrics", *flags]
        self._log = tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")
        try:
            # Its own session: a Ctrl-C in the terminal reaches the bench alone, which keeps what every
            # configuration finished and then stops the servers itself.
            self._process = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=self._log,
                                             stderr=subprocess.STDOUT, start_new_session=True,
                                             preexec_fn=_parent_death_signal())
        except OSError as exc:
            self._log.close()
            raise LlamaCppError(f"cannot run {binary!r}: {exc.strerror or exc}; {SERVER_HINT}") from None
        try:
            self._wait_ready()
        except BaseException:  # a Ctrl-C while it loads too: no server outlives the bench
            self.close()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise LlamaCppError(self._death("starting"))
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as answer:
                    if answer.status == 200:
                        return
            except (OSError, urllib.error.URLError):
                pass  # loading the model, or not listening yet
            time.sleep(0.2)
        raise LlamaCppError(f"llama-server did not answer /health within {START_S:g} s: {' '.join(self.command)}")

    def complete(self, prompt_ids: Sequence[int], max_tokens: int) -> dict[str, Any]:
        body = {"prompt": [int(t) for t in prompt_ids], "n_predict": max_tokens, "temperature": 0.0,
                "cache_prompt": False, "return_tokens": True}
        request = urllib.request.Request(f"{self.url}/completion", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=600) as answer:
                return json.load(answer)
        except (OSError, urllib.error.URLError, ValueError) as exc:
            raise LlamaCppError(self._death("generating") if self._exited()
                                else f"llama-server failed a request: {exc}") from None

    def drafts(self) -> Counters:
        """The speculation counters so far, from /metrics."""
        try:
            with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as answer:
                text = answer.read().decode()
        except (OSError, urllib.error.URLError) as exc:
            raise LlamaCppError(self._death("reporting its counters") if self._exited()
                                else f"llama-server's /metrics failed: {exc}") from None
        counts: dict[str, int] = {}
        per_position: dict[int, int] = {}
        for line in text.splitlines():
            name, _, value = line.rpartition(" ")
            if name.startswith(PER_POSITION):  # ...{position="3"}
                per_position[int(name.split('"')[1])] = int(float(value))
            elif name.startswith("llamacpp:"):
                counts[name.removeprefix("llamacpp:")] = int(float(value))
        return Counters(*(counts.get(f"spec_decode_num_{what}_total", 0) for what in ("drafts", "draft_tokens",
                                                                                         "accepted_tokens")),
                        tuple(per_position.get(i, 0) for i in range(max(per_position, default=-1) + 1)))

    def close(self) -> None:
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._log.close()

    def _exited(self) -> bool:
        """After a failed request: whether the server has died. A dying server drops its connections
        a moment before the kernel reports it gone, so it gets a second to be seen exiting."""
        try:
            self._process.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            return False
        return True

    def _death(self, doing: str) -> str:
        code = self._process.wait()
        self._log.seek(0)
        tail = self._log.read()[-STDERR_TAIL:].strip()
        return (f"llama-server ({self.binary}) exited {doing} (exit {code})"
                + (f"; its last output:\n{tail}" if tail else ""))


@dataclass(frozen=True)
class Counters:
    """llama-server's speculation counters (cumulative): vLLM's num_drafts, draft and accepted tokens."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_position: tuple[int, ...] = ()

    def since(self, before: "Counters") -> "Counters":
        old = before.accepted_per_position
        return Counters(self.drafts - before.drafts, self.draft_tokens - before.draft_tokens,
                        self.accepted_tokens - before.accepted_tokens,
                        tuple(n - (old[i] if i < len(old) else 0) for i, n in enumerate(self.accepted_per_position)))


@dataclass
class LlamaServerRunner:
    """One llama-server configuration."""

    name: str
    server: LlamaServer
    eos_ids: frozenset[int] = frozenset()
    speculative: bool = False
    plain: str | None = None
    """'llama-server' for 'llama-server-lookup': speculation should reproduce the server's own greedy output."""
    comparable: bool = False
    """The file as it is runs on llama.cpp's quantised kernels, not the reference's arithmetic."""
    kind: Kind = "llama.cpp"

    def generate(self, prompt_ids: Sequence[int], max_tokens: int) -> Generation:
        before = self.server.drafts() if self.speculative else Counters()
        answer = self.server.complete(prompt_ids, max_tokens)
        counted = self.server.drafts().since(before) if self.speculative else Counters()
        tokens = [int(t) for t in answer.get("tokens", ())]
        while tokens and tokens[-1] in self.eos_ids:  # the final EOS is not counted, as on every side
            tokens.pop()
        timings = answer["timings"]
        return Generation(tuple(tokens), (timings["prompt_ms"] + timings["predicted_ms"]) / 1000,
                          drafts=counted.drafts, draft_tokens=counted.draft_tokens,
                          accepted_tokens=counted.accepted_tokens, accepted_per_position=counted.accepted_per_position)


def build_llama_servers(baselines: Sequence[str], *, binary: str, source: Path, k: int, lookup_n: int,
                        n_threads: int, n_ctx: int, eos_ids: frozenset[int]) -> list[LlamaServerRunner]:
    """One server per baseline in ``baselines`` (names from LLAMA_SERVER_BASELINES) on the GGUF ``source``;
    raises LlamaCppError, after stopping any it started, when one cannot start."""
    runners: list[LlamaServerRunner] = []
    try:
        for name in baselines:
            server = LlamaServer(binary, source, server_flags(name, k, lookup_n), n_threads, n_ctx)
            lookup = name.endswith("-lookup")
            runners.append(LlamaServerRunner(name, server, eos_ids, speculative=lookup,
                                             plain=name.removesuffix("-lookup") if lookup else None))
    except BaseException:
        for runner in runners:
            runner.server.close()
        raise
    return runners
