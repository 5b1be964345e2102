"""The engine thread: a bounded admission count, continuous batching, cancellation at step granularity.

Each admitted request is a ``Job``. One engine thread owns the engine's scheduler: it takes new
jobs from an inbox, adds them as scheduler requests, runs one batched step, and hands each
job's update back to its request's event loop, so the loop never blocks on the engine. Up to
``--max-num-seqs`` jobs generate at once; up to ``--max-queue`` more wait; one more is a 503. A
job whose client disconnects, or whose --request-timeout passes, is cancelled: it leaves the
scheduler before the next step, and its slot goes to the next waiting job.

The engine thread sets torch's thread count itself (``threads``). OpenMP (libgomp, which torch and
the C kernels share) gives every thread that starts parallel work a worker pool of its own, and
once its pools hold more threads than the machine has CPUs, idle workers stop spinning and every
parallel region waits for them to be woken: a decode step of the default model took 17.5 ms on
this thread against 7.4 ms on the main thread that loaded the model (2 cores). So `specsure
serve` loads the model with one thread, which starts no pool, and runs every forward here.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, replace
from queue import Empty, SimpleQueue

import torch

from specsure.decode.engine import Engine, StepUpdate
from specsure.decode.metrics import SpecStats
from specsure.decode.request import Request
from specsure.decode.scheduler import Scheduler
from specsure.grammar.automaton import AutomatonTooLarge
from specsure.grammar.pattern import PatternError
from specsure.sampling import SamplingParams
from specsure.serve.metrics import Phases, ServeMetrics
from specsure.serve.stats_log import Batch, StatsLog
from specsure.serve.errors import APIError, RequestError

RETRY_AFTER_S = 1
"""The Retry-After of a 503: generation is never far from its next step, so a queue slot opens soon."""
RELEASE_WAIT_S = 5.0
"""The longest a stopped request's answer waits for the engine thread to drop it (one step, normally)."""


class ClientGone(Exception):
    """The client disconnected before its answer was complete."""


class Job:
    """One request's generation, from admission to its last update."""

    def __init__(self, prompt: list[int], params: SamplingParams, stream: bool, timeout_s: float | None) -> None:
        self.prompt, self.params, self.stream = prompt, params, stream
        self.arrived = self.last = time.perf_counter()
        self.first_token: float | None = None
        self.deadline = self.arrived + timeout_s if timeout_s is not None else None
        self.request: Request | None = None  # set by the engine thread when it takes the job in
        self.leader: Job | None = None  # the first choice of the same HTTP request, when it has n > 1
        self.choices = 1  # on a leader: its request's n; the engine thread counts them as they end
        self.ended = self.most_generated = 0
        self.done = False
        self.cancelled = threading.Event()
        self.updates: asyncio.Queue[StepUpdate | Exception] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()

    @property
    def started(self) -> bool:
        """True once the scheduler has given the job's request a slot (its prefill is under way or done)."""
        request = self.request
        return request is not None and request.lm is not None

    def send(self, item: StepUpdate | Exception) -> None:
        """Hand an update (or the engine's exception) to the request's event loop, from the engine thread."""
        try:
            self._loop.call_soon_threadsafe(self.updates.put_nowait, item)
        except RuntimeError:  # the request's event loop has closed: nobody is waiting any more
            self.cancelled.set()


class EngineRunner:
    """Admits requests up to ``max_num_seqs`` running plus ``max_queue`` waiting; runs them batched."""

    def __init__(self, engine: Engine, metrics: ServeMetrics, max_queue: int, timeout_s: float | None,
                 threads: int | None = None, log_stats: bool = True) -> None:
        self.engine, self.metrics = engine, metrics
        self.stats_log = StatsLog(self.batch, engine.enable_prefix_caching) if log_stats else None
        """vLLM's periodic log lines (--disable-log-stats turns them off)."""
        self.max_queue, self.timeout_s = max_queue, timeout_s
        self.threads = threads
        """torch threads for the engine thread's forwards; None keeps what that thread inherits."""
        self._inbox: SimpleQueue[Job] = SimpleQueue()
        self._lock = threading.Lock()  # guards the count and the thread
        self._admitted = 0  # waiting + running
        self._running = 0  # the scheduler's running batch at the engine thread's last look
        self._kv_cache = 0.0  # and the share of the KV cache it fills
        self._thread: threading.Thread | None = None
        self._closing: str | None = None
        """Why the server is shutting down, once it is: new requests get a 503."""
        self._stop: asyncio.Future[None] | None = None
        """Resolved when the requests still generating must stop (the shutdown's grace has passed)."""
        self._stopped = False

    def batch(self) -> Batch:
        """The running batch and the queue, as the engine thread last published them."""
        with self._lock:
            # A job done since the last step has left the admitted count but not yet the running one.
            return Batch(self._running, max(0, self._admitted - self._running), self._kv_cache)

    @property
    def max_num_seqs(self) -> int:
        return self.engine.scheduler.max_num_seqs

    def submit(self, prompts: list[tuple[list[int], list[SamplingParams]]], stream: bool) -> list[Job]:
        """Queue one generation per choice of each prompt (all or none), prompt after prompt, or raise
        a 503 APIError when the queue is full."""
        room = self.max_num_seqs + self.max_queue
        wanted = sum(len(choices) for _, choices in prompts)
        if wanted > room:  # not busy: this request could never be admitted, so retrying cannot help
            asked = (f"n = {wanted}" if len(prompts) == 1 else
                     f"{len(prompts)} prompts with n = {len(prompts[0][1])} ({wanted} sequences)")
            raise RequestError(f"{asked} asks for more sequences than this server ever holds at once: {room} "
                               f"(--max-num-seqs {self.max_num_seqs} running plus --max-queue {self.max_queue} "
                               f"waiting). Ask for {'n' if len(prompts) == 1 else 'prompts times n'} <= {room}, or "
                               "start the server with larger limits.",
                               "n" if len(prompts) == 1 else "prompt")
        if self._closing is not None:
            raise APIError(f"the server is shutting down ({self._closing}); send the request to another server.",
                           503, code="shutting_down", kind="server_error")
        jobs = []
        for prompt, choices in prompts:
            group = [Job(prompt, params, stream, self.timeout_s) for params in choices]
            group[0].choices = len(group)
            for job in group[1:]:
                job.leader = group[0]
            jobs += group
        with self._lock:
            if self._admitted + len(jobs) > self.max_num_seqs + self.max_queue:
                self.metrics.rejected.inc()
                raise APIError(f"the server is busy: the running batch is full (--max-num-seqs {self.max_num_seqs}) "
                               f"and the queue too (--max-queue {self.max_queue}); retry in about {RETRY_AFTER_S} s.",
                               503, code="queue_full", kind="server_error", headers={"Retry-After": str(RETRY_AFTER_S)})
            self._admitted += len(jobs)
            self._publish()  # at once: the engine thread may be busy with a step for a while
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="specsure-engine", daemon=True)
                self._thread.start()
        for job in jobs:
            self._inbox.put(job)
        return jobs

    def cancel(self, job: Job) -> None:
        """Stop ``job``: the engine thread drops it before its next step (a no-op once it is done)."""
        job.cancelled.set()

    def shut_down(self, why: str, grace_s: float) -> None:
        """Refuse new requests from now on, and stop those still generating after ``grace_s`` seconds
        (at once for 0), each answered with a 503 (or a stream's error event): what vLLM's
        --shutdown-timeout does. Called on the event loop's thread (a signal handler)."""
        self._closing = why
        if grace_s <= 0:
            self.stop_now()
        else:
            asyncio.get_running_loop().call_later(grace_s, self.stop_now)

    def stop_now(self) -> None:
        """Stop every request still generating (the shutdown's grace is over, or a second signal came)."""
        self._stopped = True
        stop = self._stop_future()
        if not stop.done():
            stop.set_result(None)

    def _stop_future(self) -> asyncio.Future[None]:
        """The stop signal on the running loop (uvicorn runs one; a test client may start several)."""
        loop = asyncio.get_running_loop()
        if self._stop is None or self._stop.get_loop() is not loop:
            self._stop = loop.create_future()
            if self._stopped:
                self._stop.set_result(None)
        return self._stop

    async def next_update(self, job: Job, gone: asyncio.Future[None]) -> StepUpdate:
        """The job's next update; raises ClientGone when ``gone`` resolves first, the timeout's
        APIError when the deadline passes first or the server stops it while shutting down, and
        the engine's exception if it failed."""
        wait = None if job.deadline is None else max(0.0, job.deadline - time.perf_counter())
        update = asyncio.ensure_future(job.updates.get())
        stop = self._stop_future()
        done, _ = await asyncio.wait({update, gone, stop}, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
        if update in done:
            item = update.result()
            if isinstance(item, Exception):
                raise item
            return item
        update.cancel()
        if gone in done:
            failure: Exception = ClientGone()
        elif stop in done:
            failure = APIError(f"the server is shutting down ({self._closing}) and stopped this request before it "
                               "finished; send it to another server.", 503, code="shutting_down", kind="server_error")
        else:
            failure = self._timed_out(job)
        self.cancel(job)
        await self._released(job)
        raise failure

    @staticmethod
    async def _released(job: Job) -> None:
        """Wait (up to RELEASE_WAIT_S) until the engine thread has dropped a cancelled job, so that its
        place is free before its answer goes out: a client that retries at once is not told the server is full."""
        deadline = time.perf_counter() + RELEASE_WAIT_S
        while not job.done and time.perf_counter() < deadline:
            await asyncio.sleep(0.002)

    def _timed_out(self, job: Job) -> APIError:
        waited, prefilling = not job.started, job.first_token is None
        self.cancel(job)
        if waited:
            return APIError(f"the request waited {self.timeout_s:g} s in the queue without starting, the server's "
                            "--request-timeout; the server is busy, retry later.", 503, code="request_timeout",
                            kind="server_error", headers={"Retry-After": str(RETRY_AFTER_S)})
        # Retrying would run the same long generation into the same limit, so clients are told not to.
        where, fix = (("before its first token, while its prompt of {} tokens was read".format(len(job.prompt)),
                       "send a shorter prompt") if prefilling else
                      ("and its generation was stopped", "ask for fewer tokens (max_tokens)"))
        return APIError(f"the request ran past the server's --request-timeout of {self.timeout_s:g} s (counted from "
                        f"arrival, queueing included) {where}; {fix}, or start the server with a longer "
                        "--request-timeout.", 504, code="request_timeout", kind="server_error",
                        headers={"x-should-retry": "false"})

    def _work(self) -> None:
        """The engine thread (a daemon, started by the first request): admit, drop the cancelled, step."""
        if self.threads is not None:
            torch.set_num_threads(self.threads)  # this thread's own OpenMP pool (see the module's doc)
        scheduler = self.engine.scheduler
        jobs: dict[int, tuple[Job, Request]] = {}  # id(request) -> (job, request)
        while True:
            try:
                while True:  # block only when there is nothing to step
                    job = self._inbox.get(block=not jobs)
                    request = job.request = self.engine.request(job.prompt, job.params)
                    if job.leader is not None:
                        request.prefill_from = job.leader.request  # one prefill for all the choices
                    jobs[id(request)] = (job, request)
                    scheduler.add(request)
            except Empty:
                pass
            for key, (job, request) in list(jobs.items()):
                if job.cancelled.is_set():
                    scheduler.abort(request)
                    self.metrics.aborted(request)
                    self._done(jobs.pop(key)[0], len(request.output))
            self._gauges(scheduler)
            if not jobs:
                continue
            before = {key: _Progress.of(request) for key, (_, request) in jobs.items()}
            try:
                updates = scheduler.step()
            except Exception as exc:  # a bug (prompts are checked before queueing): every request answers a 500
                for job, request in jobs.values():
                    scheduler.abort(request)
                    self.metrics.errored()
                    self._done(job, len(request.output))
                    job.send(exc)
                jobs.clear()
                self._gauges(scheduler)
                continue
            self._count_step(jobs, before, updates)
            now = time.perf_counter()
            answers: list[tuple[Job, StepUpdate | Exception]] = []
            for request, update in updates:
                job = jobs[id(request)][0]
                if update.error is not None:  # this request alone failed: a 500 (a bug), or its constraint a 400
                    self.metrics.errored()
                    self._done(jobs.pop(id(request))[0], len(request.output))
                    answers.append((job, _as_answer(update.error)))
                    continue
                first = job.first_token is None
                (self.metrics.first_token if first else self.metrics.inter_token).observe(now - job.last)
                job.last = now
                if first:
                    job.first_token = now
                if update.completion is not None:
                    self.engine.finished(request)
                    self.metrics.observe(update.completion, Phases(job.arrived, request.started,
                                                                   job.first_token or now, now), job.params.max_tokens)
                    self._done(jobs.pop(id(request))[0], len(update.completion.token_ids))
                    answers.append((job, update))
                elif job.stream and not job.cancelled.is_set():
                    job.send(update)
            self._gauges(scheduler)  # before the answers: a client may read /metrics the moment it has one
            for job, update in answers:
                job.send(update)

    def _count_step(self, jobs: dict[int, tuple[Job, Request]], before: dict[int, "_Progress"],
                    updates: list[tuple[Request, StepUpdate]]) -> None:
        """What the step just run did, for vLLM's iteration_tokens histogram and the periodic log: prompt
        tokens computed (a choice that copies its leader's prefill computes none), output tokens,
        verification figures, prefix-cache lookups."""
        prompt = queries = hits = 0
        spec = SpecStats()
        for key, (_, request) in jobs.items():
            then, attached = before[key], request.lm is not None
            if attached and request.prefill_from is None:
                prompt += request.prefilled - (then.prefilled if then.attached else request.cached_tokens)
            if attached and not then.attached:
                queries, hits = queries + len(request.prompt), hits + request.cached_tokens
            spec.merge(request.stats.since(then.stats))
        generated = sum(len(update.token_ids) for _, update in updates if update.error is None)
        self.metrics.iteration_tokens.observe(prompt + generated)
        if self.stats_log is not None:
            self.stats_log.step(prompt, generated, spec, queries, hits)

    def _done(self, job: Job, generated: int) -> None:
        """``job`` has left the engine, having generated ``generated`` tokens (the engine thread only)."""
        leader = job.leader or job
        leader.ended += 1
        leader.most_generated = max(leader.most_generated, generated)
        if leader.ended == leader.choices:
            self.metrics.group_finished(leader.choices, leader.most_generated)
        with self._lock:
            job.done = True
            self._admitted -= 1  # the engine thread publishes the gauges (its callers' next step)

    def _gauges(self, scheduler: Scheduler) -> None:
        with self._lock:
            self._running = scheduler.active
            self._kv_cache = scheduler.kv_cache_usage
            self._publish()

    def _publish(self) -> None:
        """Set both gauges from the admission count (call with the lock held): every admitted job not
        done is running or waiting, in the inbox or the scheduler's queue."""
        self.metrics.running.set(self._running)
        self.metrics.waiting.set(self._admitted - self._running)
        self.metrics.kv_cache.set(self._kv_cache)


@dataclass(frozen=True)
class _Progress:
    """A request's counts before a step, to tell what the step did."""

    attached: bool
    prefilled: int
    stats: SpecStats

    @staticmethod
    def of(request: Request) -> "_Progress":
        copied = replace(request.stats, accepted_per_position=list(request.stats.accepted_per_position))
        return _Progress(request.lm is not None, request.prefilled, copied)


def _as_answer(error: Exception) -> Exception:
    """A request's own error as the client gets it: an output constraint whose automaton passed its
    bounds while generating is the request's fault, answered as a 400 that says so."""
    if isinstance(error, PatternError):
        later = " The server refuses the same constraint from now on." if isinstance(error, AutomatonTooLarge) else ""
        return RequestError(f"the output constraint failed this request while it generated: {error}.{later}")
    return error
