"""One generation at a time: a bounded FIFO queue, one engine thread, cancellation at step granularity.

The engine runs at batch size 1, so requests take turns. Each admitted request is a ``Job``; one
engine thread takes jobs in arrival order and runs ``Engine.generate_stream``, checking the job's
cancel flag after every step. A request whose client disconnects, or whose --request-timeout
passes, is cancelled: a waiting job leaves the queue at once, a running one stops after the step
in progress, and the thread takes the next job. Updates go back to the request's event loop, so
the loop never blocks on the engine.
"""

from __future__ import annotations

import asyncio
import threading
import time
from queue import SimpleQueue
from typing import Literal

from specsure.decode.engine import Engine, StepUpdate
from specsure.sampling import SamplingParams
from specsure.serve.metrics import ServeMetrics
from specsure.serve.protocol import APIError

RETRY_AFTER_S = 1
"""The Retry-After of a 503: generation is never far from its next step, so a queue slot opens soon."""


class ClientGone(Exception):
    """The client disconnected before its answer was complete."""


class Job:
    """One request's generation, from admission to its last update."""

    def __init__(self, prompt: list[int], params: SamplingParams, stream: bool, timeout_s: float | None) -> None:
        self.prompt, self.params, self.stream = prompt, params, stream
        self.arrived = time.perf_counter()
        self.deadline = self.arrived + timeout_s if timeout_s is not None else None
        self.state: Literal["waiting", "running", "done", "cancelled"] = "waiting"
        self.cancelled = threading.Event()
        self.updates: asyncio.Queue[StepUpdate | Exception] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()

    def send(self, item: StepUpdate | Exception) -> None:
        """Hand an update (or the engine's exception) to the request's event loop, from the engine thread."""
        try:
            self._loop.call_soon_threadsafe(self.updates.put_nowait, item)
        except RuntimeError:  # the request's event loop has closed: nobody is waiting any more
            self.cancelled.set()


class EngineRunner:
    """Admits requests up to ``max_queue`` waiting behind the running one; runs them one at a time."""

    def __init__(self, engine: Engine, metrics: ServeMetrics, max_queue: int, timeout_s: float | None) -> None:
        self.engine, self.metrics = engine, metrics
        self.max_queue, self.timeout_s = max_queue, timeout_s
        self._jobs: SimpleQueue[Job] = SimpleQueue()
        self._lock = threading.Lock()  # guards job states, the count and the thread
        self._admitted = 0  # waiting + running
        self._thread: threading.Thread | None = None

    def submit(self, prompt: list[int], params: SamplingParams, stream: bool) -> Job:
        """Queue a generation, or raise a 503 APIError when max_queue requests already wait."""
        job = Job(prompt, params, stream, self.timeout_s)
        with self._lock:
            if self._admitted > self.max_queue:
                self.metrics.rejected.inc()
                raise APIError(f"the server is busy: one request is generating and {self.max_queue} are waiting "
                               f"(--max-queue {self.max_queue}); retry in about {RETRY_AFTER_S} s.", 503,
                               code="queue_full", kind="server_error",
                               headers={"Retry-After": str(RETRY_AFTER_S)})
            self._admitted += 1
            self.metrics.waiting.inc()
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="specsure-engine", daemon=True)
                self._thread.start()
        self._jobs.put(job)
        return job

    def cancel(self, job: Job) -> None:
        """Stop ``job``: out of the queue now if it waits, after the current step if it runs."""
        job.cancelled.set()
        with self._lock:
            if job.state == "waiting":
                job.state = "cancelled"
                self._admitted -= 1
                self.metrics.waiting.dec()

    async def next_update(self, job: Job, gone: asyncio.Future[None]) -> StepUpdate:
        """The job's next update; raises ClientGone when ``gone`` resolves first, the timeout's
        APIError when the deadline passes first, and the engine's exception if it failed."""
        wait = None if job.deadline is None else max(0.0, job.deadline - time.perf_counter())
        update = asyncio.ensure_future(job.updates.get())
        done, _ = await asyncio.wait({update, gone}, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
        if update in done:
            item = update.result()
            if isinstance(item, Exception):
                raise item
            return item
        update.cancel()
        if gone in done:
            raise ClientGone
        raise self._timed_out(job)

    def _timed_out(self, job: Job) -> APIError:
        waited = job.state == "waiting"
        self.cancel(job)
        if waited:
            return APIError(f"the request waited {self.timeout_s:g} s in the queue without starting, the server's "
                            "--request-timeout; the server is busy, retry later.", 503, code="request_timeout",
                            kind="server_error", headers={"Retry-After": str(RETRY_AFTER_S)})
        # Retrying would run the same long generation into the same limit, so clients are told not to.
        return APIError(f"the request ran past the server's --request-timeout of {self.timeout_s:g} s (counted from "
                        "arrival, queueing included) and its generation was stopped; ask for fewer tokens "
                        "(max_tokens), or start the server with a longer --request-timeout.", 504,
                        code="request_timeout", kind="server_error", headers={"x-should-retry": "false"})

    def _work(self) -> None:
        """The engine thread (a daemon, started by the first request): runs jobs in arrival order."""
        while True:
            job = self._jobs.get()
            with self._lock:
                if job.state != "waiting":
                    continue
                job.state = "running"
            self.metrics.waiting.dec()
            self.metrics.running.inc()
            try:
                self._run(job)
            finally:
                self.metrics.running.dec()
                with self._lock:
                    job.state = "done"
                    self._admitted -= 1

    def _run(self, job: Job) -> None:
        last, latency = job.arrived, self.metrics.first_token
        try:
            steps = self.engine.generate_stream(job.prompt, job.params)
            for update in steps:
                now = time.perf_counter()
                latency.observe(now - last)
                last, latency = now, self.metrics.inter_token
                if update.completion is not None:
                    self.metrics.observe(update.completion, now - job.arrived)
                    job.send(update)
                    return
                if job.cancelled.is_set():
                    steps.close()
                    self.metrics.aborted()
                    return
                if job.stream:
                    job.send(update)
        except Exception as exc:  # a bug (prompts are checked before queueing): the request answers a 500
            job.send(exc)
