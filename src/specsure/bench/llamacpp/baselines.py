"""The llama.cpp baselines a run compares, with a reason for each one that cannot run.

`llama.cpp` runs the target's weights dequantised exactly as specsure runs them (a BF16 GGUF
for a bfloat16 run, F16 for float16, F32 for float32; see `convert`), so its output is
comparable token for token. `llama.cpp-q4_1` runs the packaged Q4_1 file as it is, with
llama.cpp's quantised kernels (4-bit weight blocks times activations quantised to 8 bits):
not specsure's arithmetic, so its outputs are compared for information only. `llama.cpp-gguf` runs
the target's GGUF file as it is, whatever its types (a user's Q4_K_M, say), compared the same way. Each `-lookup` variant adds llama-cpp-python's
prompt-lookup drafter with k = the bench's -k and is also compared with its own plain.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specsure.bench.generation import Runner
from specsure.bench.llamacpp.convert import float_gguf, gguf_type_of
from specsure.bench.llamacpp.runner import N_BATCH, LlamaCppError, LlamaCppRunner, LlamaCppWorker, ModelSpec, not_installed
from specsure.bench.llamacpp.server import LLAMA_SERVER_BASELINES, LlamaServerRunner, build_llama_servers
from specsure.config.gguf_header import GGUFHeaderError, read_gguf_metadata

LLAMA_CPP_BASELINES: tuple[str, ...] = ("llama.cpp", "llama.cpp-lookup", "llama.cpp-q4_1", "llama.cpp-q4_1-lookup",
                                         "llama.cpp-gguf", "llama.cpp-gguf-lookup")
"""llama.cpp configurations (opt-in: not in the default --baselines)."""

_MOSTLY_Q4_1 = 3  # gguf.LlamaFileType.MOSTLY_Q4_1, read from the header without importing gguf
_AS_IS = ("llama.cpp-q4_1", "llama.cpp-gguf")
"""The baselines that run the target's file itself, on llama.cpp's own arithmetic."""


@dataclass
class LlamaCppSetup:
    """What `build_llamacpp` made: runners, skipped configurations, metadata, the worker."""

    runners: list[Runner] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    """Versions, paths and llama.cpp settings for results.json; empty when none ran."""
    worker: LlamaCppWorker | None = None

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
        for runner in self.runners:
            if isinstance(runner, LlamaServerRunner):  # each its own process
                runner.server.close()


def config_name(baseline: str, dtype: str) -> str:
    """The report name: 'llama.cpp-lookup' in a bfloat16 run is 'llama.cpp-bf16-lookup'."""
    if baseline.startswith(_AS_IS):
        return baseline
    return baseline.replace("llama.cpp", f"llama.cpp-{gguf_type_of(dtype).lower()}", 1)


def build_llamacpp(
    baselines: Sequence[str], *, python: str, model: str | None, dtype: str, num_speculative_tokens: int,
    n_threads: int, n_ctx: int, eos_ids: frozenset[int], max_ngram_size: int = 2,
) -> LlamaCppSetup:
    """Start one llama.cpp worker for `baselines` (names from LLAMA_CPP_BASELINES).

    Every baseline is skipped, with the reason, when llama-cpp-python is missing or does
    not start, or when the target is not a GGUF file (llama.cpp reads GGUF only).
    """
    setup = LlamaCppSetup()
    if not baselines:
        return setup

    def skip(names: Sequence[str], reason: str) -> LlamaCppSetup:
        setup.skipped += [(b, reason) for b in names]
        return setup

    if not Path(python).is_file():
        return skip(baselines, not_installed(python))  # before converting weights nobody would run
    try:
        source = _source_gguf(model)
    except ValueError as err:
        return skip(baselines, str(err))

    specs: list[ModelSpec] = []
    wanted: list[str] = []
    for baseline in baselines:
        name = config_name(baseline, dtype)
        k = num_speculative_tokens if baseline.endswith("-lookup") else 0
        try:
            path = _weights(baseline, source, dtype)
        except (ValueError, OSError, NotImplementedError) as err:
            setup.skipped.append((baseline, f"no GGUF for it: {err}"))
            continue
        specs.append(ModelSpec(name, str(path), k, max_ngram_size))
        wanted.append(baseline)
    if not specs:
        return setup
    try:
        worker = LlamaCppWorker(python, specs, n_ctx=n_ctx, n_threads=n_threads)
    except LlamaCppError as err:
        return skip(wanted, str(err))
    setup.worker = worker
    for spec in specs:
        setup.runners.append(LlamaCppRunner(
            spec.name, worker, eos_ids, speculative=spec.num_pred_tokens > 0,
            plain=spec.name.removesuffix("-lookup") if spec.num_pred_tokens else None,
            comparable=not spec.name.startswith(_AS_IS),
        ))
    setup.meta = {
        "llama_cpp_python": worker.info.get("llama_cpp_python"),
        "llama_cpp": {"python": python, "source_gguf": str(source), "weights": {s.name: s.path for s in specs},
                      "n_ctx": n_ctx, "n_threads": n_threads, "n_batch": N_BATCH,
                      "num_pred_tokens": num_speculative_tokens, "max_ngram_size": max_ngram_size,
                      "system_info": worker.info.get("system_info")},
    }
    return setup


def add_llama_servers(setup: LlamaCppSetup, baselines: Sequence[str], *, binary: str, model: str | None, k: int,
                      lookup_n: int, n_threads: int, n_ctx: int, eos_ids: frozenset[int]) -> None:
    """Start a llama-server for each of ``baselines`` (LLAMA_SERVER_BASELINES) into ``setup``, or
    skip them all with the reason (not built, the target not a GGUF file, a start that failed)."""
    if not baselines:
        return
    try:
        source = _source_gguf(model)
        runners = build_llama_servers(baselines, binary=binary, source=source, k=k, lookup_n=lookup_n,
                                      n_threads=n_threads, n_ctx=n_ctx, eos_ids=eos_ids)
    except (ValueError, LlamaCppError) as err:
        setup.skipped += [(b, str(err)) for b in baselines]
        return
    setup.runners += runners
    setup.meta["llama_server"] = {"binary": binary, "gguf": str(source),
                                  "commands": [" ".join(r.server.command) for r in runners]}


def _source_gguf(model: str | None) -> Path:
    if model is None:
        from specsure.models.gguf_cache import packaged_default_gguf

        return packaged_default_gguf()
    path = Path(model)
    if path.suffix.lower() != ".gguf" or not path.is_file():
        raise ValueError(f"llama.cpp reads GGUF files only; the target {model} is not one "
                         "(use the packaged default or --model FILE.gguf)")
    return path


def _weights(baseline: str, source: Path, dtype: str) -> Path:
    """The GGUF `baseline` runs; a ValueError says why there is none."""
    if baseline.startswith("llama.cpp-gguf"):
        return source
    if not baseline.startswith("llama.cpp-q4_1"):
        return float_gguf(source, dtype)
    try:
        file_type = read_gguf_metadata(str(source)).get("general.file_type")
    except (OSError, GGUFHeaderError) as err:
        raise ValueError(f"cannot read {source}: {err}") from None
    if file_type != _MOSTLY_Q4_1:
        raise ValueError(f"the target {source} is not a Q4_1 GGUF (general.file_type {file_type})")
    return source
