"""vLLM's periodic log lines for a serving engine: throughput, the batch and, with speculation, acceptance.

vLLM's server logs every ``VLLM_LOG_STATS_INTERVAL`` seconds (10) unless ``--disable-log-stats``:

    Engine 000: Avg prompt throughput: 12.3 tokens/s, Avg generation throughput: 45.6 tokens/s, Running: 2 reqs, ...
    SpecDecoding metrics: Mean acceptance length: 2.31, Accepted throughput: 20.1 tokens/s, ...

Operators watch these lines and scripts parse them, so specsure writes them in vLLM's words and
with its definitions (``specsure.decode.metrics``). The counts come from each engine step (the
engine thread calls ``step``), so a long request shows in the intervals it ran in, not when it
ends. An interval in which nothing ran, after one in which nothing ran either, logs at DEBUG, as
vLLM keeps an idle server's log quiet.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from specsure.decode.metrics import SpecStats

logger = logging.getLogger(__name__)  # `specsure serve` shows it at INFO unless --disable-log-stats

INTERVAL_ENV = "VLLM_LOG_STATS_INTERVAL"
"""vLLM's setting of the interval, in seconds; specsure reads the same variable."""
DEFAULT_INTERVAL_S = 10.0


def interval_s() -> float:
    """The logging interval: $VLLM_LOG_STATS_INTERVAL where it is a number above 0, else vLLM's 10 s."""
    try:
        value = float(os.environ.get(INTERVAL_ENV, DEFAULT_INTERVAL_S))
    except ValueError:
        value = DEFAULT_INTERVAL_S
    return value if math.isfinite(value) and value > 0 else DEFAULT_INTERVAL_S


@dataclass
class Batch:
    """The batch as the engine thread last saw it."""

    running: int = 0
    waiting: int = 0
    kv_cache: float = 0.0
    """The share of the KV cache in use, 0 to 1."""


@dataclass
class _Interval:
    prompt_tokens: int = 0
    generated_tokens: int = 0
    cache_queries: int = 0
    cache_hits: int = 0
    spec: SpecStats = field(default_factory=SpecStats)


class StatsLog:
    """Counts what each engine step did, and logs it every ``interval`` seconds on a daemon thread
    that starts with the first step."""

    def __init__(self, batch: Callable[[], Batch], prefix_caching: bool, interval: float | None = None) -> None:
        self._batch = batch
        self._prefix_caching = prefix_caching
        self.interval = interval_s() if interval is None else interval
        self._lock = threading.Lock()
        self._now = _Interval()
        self._since = time.monotonic()
        self._was_idle = True
        self._thread: threading.Thread | None = None

    def step(self, prompt_tokens: int, generated_tokens: int, spec: SpecStats, cache_queries: int = 0,
             cache_hits: int = 0) -> None:
        """Count one engine step: the prompt tokens it computed, the output tokens it committed, its
        verification figures, and the prompt tokens looked up in the prefix cache and found there."""
        with self._lock:
            now = self._now
            now.prompt_tokens += prompt_tokens
            now.generated_tokens += generated_tokens
            now.cache_queries += cache_queries
            now.cache_hits += cache_hits
            now.spec.merge(spec)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="specsure-stats-log", daemon=True)
                self._thread.start()

    def log(self) -> None:
        """Log the interval since the last call, and start a new one."""
        with self._lock:
            done, self._now = self._now, _Interval()
            start, self._since = self._since, time.monotonic()
        elapsed = max(self._since - start, 1e-9)
        idle = not (done.prompt_tokens or done.generated_tokens)
        emit = logger.debug if idle and self._was_idle else logger.info
        self._was_idle = idle
        batch = self._batch()
        parts = [f"Avg prompt throughput: {done.prompt_tokens / elapsed:.1f} tokens/s",
                 f"Avg generation throughput: {done.generated_tokens / elapsed:.1f} tokens/s",
                 f"Running: {batch.running} reqs", f"Waiting: {batch.waiting} reqs",
                 f"CPU KV cache usage: {batch.kv_cache * 100:.1f}%"]
        if self._prefix_caching and done.cache_queries:
            parts.append(f"Prefix cache hit rate: {done.cache_hits / done.cache_queries * 100:.1f}%")
        emit("Engine 000: %s", ", ".join(parts))
        if done.spec.drafts:
            done.spec.elapsed_s = elapsed  # its throughputs are over the interval, as vLLM's
            emit("%s", done.spec.log_line())

    def _run(self) -> None:
        while True:
            time.sleep(self.interval)
            try:
                self.log()
            except Exception:  # a log line is not worth the server's: say so, keep logging
                logger.exception("specsure: the periodic stats line failed")
