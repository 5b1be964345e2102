"""llama.cpp configurations, run by one worker process under llama-cpp-python's own Python.

llama-cpp-python lives in its own environment (`make llama-cpp` builds .venv-llamacpp), as
vLLM does for check-vllm: specsure never imports it. `worker.py` runs there and answers one
JSON line per generation, so the bench interleaves llama.cpp with every other configuration
as usual. The wall time is measured inside the worker around the generate loop (prefill
included), so the pipe between the two processes is not charged to llama.cpp.
"""

from __future__ import annotations

import json
import signal
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from specsure.bench.generation import Generation, Kind

WORKER: Final[Path] = Path(__file__).with_name("worker.py")
MARKER: Final[str] = "SPECSURE_LLAMACPP "
DEFAULT_LLAMA_CPP_PYTHON: Final[str] = ".venv-llamacpp/bin/python"
LLAMA_CPP_TESTED_VERSION: Final[str] = "0.3.36"
INSTALL_HINT: Final[str] = (f"run `make llama-cpp` (builds llama-cpp-python=={LLAMA_CPP_TESTED_VERSION} into "
                            f".venv-llamacpp, about 15 minutes on 2 cores) or give --llama-cpp-python PATH")
STDERR_TAIL: Final[int] = 2000
N_BATCH: Final[int] = 512
"""llama.cpp's default batch: a longer prompt is prefilled in batches of this many tokens."""


class LlamaCppError(RuntimeError):
    """llama-cpp-python is missing, did not import, or its worker failed or died."""


def not_installed(python: str) -> str:
    """The one line that says llama-cpp-python is missing and how to get it."""
    return f"llama-cpp-python is not installed: no Python at {python}; {INSTALL_HINT}"


@dataclass(frozen=True)
class ModelSpec:
    """One llama.cpp configuration: a GGUF file and, for prompt lookup, its k."""

    name: str
    path: str
    num_pred_tokens: int = 0
    """k of `LlamaPromptLookupDecoding`; 0 for plain decoding."""
    max_ngram_size: int = 2
    """The longest n-gram `LlamaPromptLookupDecoding` matches (its own default is 2)."""


class LlamaCppWorker:
    """The worker process; every llama.cpp configuration's model is loaded once, at start."""

    def __init__(self, python: str, models: Sequence[ModelSpec], n_ctx: int, n_threads: int, n_batch: int = N_BATCH):
        if not Path(python).is_file():
            raise LlamaCppError(not_installed(python))
        self.python = python
        self._stderr = tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")
        try:
            self._process = subprocess.Popen([python, str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                             stderr=self._stderr, text=True, bufsize=1)
        except OSError as exc:
            self._stderr.close()
            raise LlamaCppError(f"cannot run {python!r}: {exc.strerror or exc}; {INSTALL_HINT}") from None
        setup = {"models": [vars(m) for m in models], "n_ctx": n_ctx, "n_threads": n_threads, "n_batch": n_batch}
        try:
            answer = self._ask(setup, "starting")
        except LlamaCppError:
            self.close()
            raise
        if "import_error" in answer or "error" in answer:
            self.close()
            if "import_error" in answer:
                raise LlamaCppError(f"llama_cpp does not import under {python} ({answer['import_error']}); {INSTALL_HINT}")
            raise LlamaCppError(f"llama.cpp could not load the models: {answer['error']}")
        self.info: dict[str, Any] = answer
        """{"llama_cpp_python", "python", "system_info", "models"} as the worker reported them."""

    def generate(self, name: str, prompt_ids: Sequence[int], max_tokens: int, eos_ids: frozenset[int]) -> Generation:
        answer = self._ask({"name": name, "prompt_ids": [int(t) for t in prompt_ids], "max_tokens": max_tokens,
                            "eos_ids": sorted(eos_ids)}, f"generating with {name}")
        if "error" in answer:
            raise LlamaCppError(f"llama.cpp failed generating with {name}: {answer['error']}")
        return Generation(
            token_ids=tuple(int(t) for t in answer["token_ids"]),
            seconds=float(answer["seconds"]),
            drafts=int(answer["drafts"]),
            draft_tokens=int(answer["draft_tokens"]),
            accepted_tokens=int(answer["accepted_tokens"]),
            accepted_per_position=tuple(int(n) for n in answer["accepted_per_position"]),
        )

    def close(self) -> None:
        """End the worker (end of stdin), killing it if it does not exit within 10 s."""
        process = self._process
        if process.poll() is None:
            try:
                process.stdin.close()
                process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                process.kill()
                process.wait()
        self._stderr.close()

    def _ask(self, request: Mapping[str, Any], doing: str) -> dict[str, Any]:
        process = self._process
        try:
            process.stdin.write(json.dumps(request) + "\n")
            process.stdin.flush()
        except OSError:
            pass  # it died; the missing answer below says how
        while True:
            line = process.stdout.readline()
            if not line:
                raise LlamaCppError(self._death(doing))
            if line.startswith(MARKER):
                try:
                    answer = json.loads(line[len(MARKER):])
                except json.JSONDecodeError:
                    answer = None
                if not isinstance(answer, dict):
                    raise LlamaCppError(f"the llama.cpp worker under {self.python} answered {doing} with {line.strip()!r}; "
                                        f"is it running specsure's {WORKER.name}?")
                return answer

    def _death(self, doing: str) -> str:
        code = self._process.wait()
        self._stderr.seek(0)
        tail = self._stderr.read()[-STDERR_TAIL:].strip()
        how = f"exit {code}"
        if code < 0:
            how = f"killed by {signal.Signals(-code).name}"
        hint = ""
        if code == -signal.SIGILL:
            hint = (" An illegal instruction means the build uses CPU features this machine lacks (AMX with "
                    "-march=native); rebuild it: rm -rf .venv-llamacpp && make llama-cpp.")
        return (f"the llama.cpp worker ({self.python}) died {doing} ({how}) without an answer.{hint}"
                + (f" Its last output:\n{tail}" if tail else ""))


@dataclass
class LlamaCppRunner:
    """One llama.cpp configuration, served by a shared `LlamaCppWorker`."""

    name: str
    worker: LlamaCppWorker
    eos_ids: frozenset[int] = frozenset()
    speculative: bool = False
    plain: str | None = None
    """'llama.cpp-bf16' for 'llama.cpp-bf16-lookup': lookup should reproduce llama.cpp's own greedy output."""
    comparable: bool = True
    """False for Q4_1: llama.cpp's quantised kernels are not the reference's arithmetic."""
    kind: Kind = "llama.cpp"

    def generate(self, prompt_ids: Sequence[int], max_tokens: int) -> Generation:
        return self.worker.generate(self.name, prompt_ids, max_tokens, self.eos_ids)
