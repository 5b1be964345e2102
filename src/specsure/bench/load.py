"""`specsure bench serve`: load a running OpenAI-compatible server at several concurrencies.

After vLLM's `vllm bench serve`: a fixed number of requests per level, at most ``concurrency``
in flight at once, each streamed (so the time to the first token and the gaps between chunks
are seen as a client sees them), greedy, ``ignore_eos`` so every request asks for the same
work. Several servers (speculation on and off, say) run level by level, interleaved, so a noisy
machine moves them alike. Torch-free: only httpx and asyncio.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import httpx


class LoadError(RuntimeError):
    """The server cannot be benchmarked (unreachable, or it refuses the requests); says which and how."""


class BadChunk(ValueError):
    """A streamed line is not an OpenAI chunk; it fails its request, not the run."""


@dataclass(frozen=True)
class Server:
    label: str
    url: str
    """The base URL, without /v1."""


@dataclass(frozen=True)
class Request:
    """One workload row as it is sent: its input, in the field of the endpoint it suits, and its length."""

    messages: tuple[tuple[str, str], ...] | None = None
    """The (role, content) turns of a /v1/chat/completions request, the whole conversation."""
    prompt: str | tuple[int, ...] | None = None
    """Text or token ids of a /v1/completions request."""
    max_tokens: int | None = None
    """This row's output length; None: the run's --max-tokens."""

    def __post_init__(self) -> None:
        assert (self.messages is None) != (self.prompt is None), "a request has exactly one input"


# Chunks cannot stand in for the count: a speculative step streams several tokens in one chunk.
NO_USAGE = ("server sent no usage (stream_options.include_usage), so the request's output tokens are unknown; "
            "use a server that honours include_usage, as specsure serve and vllm serve do")


@dataclass
class Outcome:
    """One request as the client saw it."""

    status: int
    tokens: int = 0
    ttft_s: float | None = None
    e2e_s: float = 0.0
    gaps_s: list[float] = field(default_factory=list)
    """Time between successive chunks with output (each chunk is one engine step's text)."""
    error: str | None = None


@dataclass(frozen=True)
class Level:
    """One (server, concurrency) cell of the benchmark."""

    label: str
    concurrency: int
    requests: int
    failed: int
    wall_s: float
    output_tokens: int
    tokens_per_s: float
    requests_per_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    itl_p50_s: float
    itl_p99_s: float
    tpot_p50_s: float
    """Per-request (e2e - ttft) / (tokens - 1), the median: time per output token after the first."""
    errors: dict[str, int] = field(default_factory=dict)
    """Each distinct failure text, with how many requests failed with it; most frequent first."""


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(label: str, concurrency: int, outcomes: Sequence[Outcome], wall_s: float) -> Level:
    ok = [o for o in outcomes if o.status == 200 and o.error is None]
    tokens = sum(o.tokens for o in ok)
    gaps = [g for o in ok for g in o.gaps_s]
    tpot = [(o.e2e_s - o.ttft_s) / (o.tokens - 1) for o in ok if o.ttft_s is not None and o.tokens > 1]
    ttft = [o.ttft_s for o in ok if o.ttft_s is not None]
    errors = dict(Counter(o.error or f"HTTP {o.status}" for o in outcomes if o not in ok).most_common())
    return Level(label=label, concurrency=concurrency, requests=len(outcomes), failed=len(outcomes) - len(ok),
                 wall_s=wall_s, output_tokens=tokens, tokens_per_s=tokens / wall_s if wall_s > 0 else 0.0,
                 requests_per_s=len(ok) / wall_s if wall_s > 0 else 0.0,
                 ttft_p50_s=percentile(ttft, 50), ttft_p99_s=percentile(ttft, 99),
                 itl_p50_s=percentile(gaps, 50), itl_p99_s=percentile(gaps, 99),
                 tpot_p50_s=percentile(tpot, 50), errors=errors)


async def _one(client: httpx.AsyncClient, endpoint: str, body: dict[str, Any]) -> Outcome:
    start = time.perf_counter()
    last: float | None = None
    tokens: int | None = None
    outcome = Outcome(status=0)
    try:
        async with client.stream("POST", f"/v1/{endpoint}", json=body) as response:
            outcome.status = response.status_code
            if response.status_code != 200:
                await response.aread()
                outcome.error = f"HTTP {response.status_code}: {_error_text(response)}"
                return outcome
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                error, usage, text = _read_chunk(line[6:])
                outcome.error = outcome.error or error
                tokens = usage if usage is not None else tokens
                if text:
                    now = time.perf_counter()
                    if last is None:
                        outcome.ttft_s = now - start
                    else:
                        outcome.gaps_s.append(now - last)
                    last = now
    except httpx.HTTPError as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"
    except BadChunk as exc:
        # One garbled chunk spoils this request's figures only; the others still measure the server.
        outcome.error = f"{client.base_url}/v1/{endpoint}: {exc}"
    outcome.e2e_s = time.perf_counter() - start
    outcome.tokens = tokens or 0
    if tokens is None and outcome.error is None:
        outcome.error = NO_USAGE
    return outcome


def _error_text(response: httpx.Response) -> str:
    """An error reply's message (OpenAI's error.message when the body has one), on one line, cut to 300
    characters: it is printed once per level and listed in serve.md."""
    try:
        error = response.json().get("error")
        text = str(error.get("message")) if isinstance(error, dict) and error.get("message") else response.text
    except (ValueError, AttributeError):  # not JSON, or JSON that is not an object
        text = response.text
    return " ".join(text.split())[:300]


def _read_chunk(data: str) -> tuple[str | None, int | None, str]:
    """(error event's message, usage's completion_tokens, streamed text) of one SSE data line.

    Raises BadChunk, saying what is wrong, for a chunk that is not an OpenAI stream chunk.
    """
    try:
        chunk = json.loads(data)
    except ValueError as exc:
        raise BadChunk(f"a stream chunk is not JSON ({exc}): {data[:100]!r}") from None
    choices = (chunk.get("choices") or []) if isinstance(chunk, dict) else None
    if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
        raise BadChunk(f"a stream chunk is not an OpenAI chunk object: {data[:100]!r}")
    if "error" in chunk:
        error = chunk["error"]
        return f"error event: {error.get('message', error) if isinstance(error, dict) else error}", None, ""
    usage = chunk.get("usage")
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return None, tokens if isinstance(tokens, int) else None, "".join(_text(c) for c in choices)


def _text(choice: dict[str, Any]) -> str:
    """What a choice's chunk generated: a completion's text, or a chat delta's content, thinking
    (``reasoning_content``, vLLM's ``reasoning``) and tool calls, each of them output the time to the
    first token and the gaps between tokens count (as vLLM's bench counts them); BadChunk if mistyped."""
    delta = choice.get("delta")
    if delta is not None and not isinstance(delta, dict):
        raise BadChunk(f"a stream chunk's choice has a delta that is not an object: {delta!r:.100}")
    delta = delta or {}
    parts = [choice.get("text"), delta.get("content"), delta.get("reasoning_content"), delta.get("reasoning")]
    for part in parts:
        if part is not None and not isinstance(part, str):
            raise BadChunk(f"a stream chunk's choice has text that is not a string: {part!r:.100}")
    calls = delta.get("tool_calls")
    if calls is not None and not isinstance(calls, list):
        raise BadChunk(f"a stream chunk's tool_calls is not a list: {calls!r:.100}")
    # A call's first delta may carry its name alone: output all the same.
    called = "".join(json.dumps(call, sort_keys=True) for call in calls or ())
    return "".join(part for part in parts if part) + called


def request_body(endpoint: str, model: str, request: Request, max_tokens: int) -> dict[str, Any]:
    """A greedy streamed request that asks for exactly the row's max_tokens (else ``max_tokens``) tokens."""
    length = max_tokens if request.max_tokens is None else request.max_tokens
    body: dict[str, Any] = {"model": model, "max_tokens": length, "temperature": 0.0, "stream": True,
                            "stream_options": {"include_usage": True}, "ignore_eos": True}
    if endpoint == "chat/completions":
        assert request.messages is not None, "the CLI sends only conversations to the chat endpoint"
        body["messages"] = [{"role": role, "content": content} for role, content in request.messages]
    else:
        assert request.prompt is not None, "the CLI sends only text or token ids to the completions endpoint"
        body["prompt"] = request.prompt if isinstance(request.prompt, str) else list(request.prompt)
    return body


async def run_level(server: Server, model: str, endpoint: str, prompts: Sequence[Request], concurrency: int,
                    requests: int, max_tokens: int, api_key: str | None = None) -> Level:
    """``requests`` requests (cycling over ``prompts``), at most ``concurrency`` in flight."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=server.url, headers=headers, limits=limits,
                                 timeout=httpx.Timeout(600.0, connect=10.0)) as client:
        gate = asyncio.Semaphore(concurrency)

        async def gated(i: int) -> Outcome:
            async with gate:
                return await _one(client, endpoint, request_body(endpoint, model, prompts[i % len(prompts)],
                                                                 max_tokens))

        start = time.perf_counter()
        outcomes = await asyncio.gather(*(gated(i) for i in range(requests)))
        wall = time.perf_counter() - start
    return summarize(server.label, concurrency, outcomes, wall)


def served_model(server: Server, api_key: str | None = None) -> str:
    """The model name the server answers to (its /v1/models), or a LoadError saying why not."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    where = f"the {server.label!r} server at {server.url}"
    try:
        r = httpx.get(f"{server.url}/v1/models", headers=headers, timeout=10)
    except httpx.HTTPError as exc:
        raise LoadError(f"cannot reach {where}: {exc}. Start it first, for example: "
                        "specsure serve --port 8000") from None
    if r.status_code != 200:
        hint = {401: "wrong or missing --api-key?", 403: "wrong --api-key?",
                404: "give the server's base URL, without /v1 or another path"}.get(r.status_code)
        raise LoadError(f"{where} answered /v1/models with HTTP {r.status_code}: {_error_text(r)}"
                        + (f" ({hint})" if hint else ""))
    try:
        data = r.json().get("data")
    except (ValueError, AttributeError):  # not JSON, or JSON that is not an object
        data = None
    if not isinstance(data, list) or (data and not isinstance(data[0], dict)):
        raise LoadError(f"{where} answered /v1/models with something that is not an OpenAI model list "
                        f'({{"data": [{{"id": ...}}]}}): {r.text[:200]!r}; is --url an OpenAI-compatible server '
                        "such as specsure serve?")
    if not data or not isinstance(data[0].get("id"), str):
        raise LoadError(f"{where} answered /v1/models with no model id ({r.text[:200]!r}); it must list the model "
                        "it serves, as specsure serve and vllm serve do.")
    return data[0]["id"]


def run(servers: Sequence[Server], endpoint: str, prompts: Sequence[Request], concurrencies: Sequence[int],
        requests_at: Sequence[int], max_tokens: int, api_key: str | None = None, warmup: int = 1,
        progress: Any = None, pause: float = 0.0) -> list[Level]:
    """Every level for every server, interleaved level by level, the servers' order reversed at every
    other level, ``pause`` seconds between two servers' runs; warm-up requests first, untimed.

    The pause and the order matter on a small machine: a server that has just finished keeps its
    idle threads spinning for a while, which slowed the server after it by up to a fifth (a first
    turn of bench/prefix_caching_serve.py measured 0.78x and 0.80x back to back, 1.02x with 2 s between).
    """
    models = {s.label: served_model(s, api_key) for s in servers}
    for server in servers:
        if warmup:
            asyncio.run(run_level(server, models[server.label], endpoint, prompts, 1, warmup, max_tokens, api_key))
    levels: list[Level] = []
    try:
        for n, (concurrency, requests) in enumerate(zip(concurrencies, requests_at)):
            ran = []
            for server in (servers if n % 2 == 0 else list(reversed(servers))):
                if pause and len(servers) > 1:
                    time.sleep(pause)
                level = asyncio.run(run_level(server, models[server.label], endpoint, prompts, concurrency,
                                              requests, max_tokens, api_key))
                ran.append(level)
                if progress is not None:
                    progress(level)
            order = [s.label for s in servers]
            levels += sorted(ran, key=lambda level: order.index(level.label))  # reported in the servers' order
    except KeyboardInterrupt:
        # The concurrencies every server finished are kept; one that only some finished compares nothing.
        raise LoadInterrupted(levels, len(levels) // len(servers), len(concurrencies)) from None
    return levels


class LoadInterrupted(KeyboardInterrupt):
    """Ctrl-C during the levels, carrying the concurrencies that every server finished."""

    def __init__(self, levels: list[Level], done: int, total: int) -> None:
        super().__init__()
        self.levels, self.done, self.total = levels, done, total


def to_json(levels: Sequence[Level], settings: dict[str, Any]) -> dict[str, Any]:
    """serve.json's content; a percentile of no values is null, since NaN is not JSON."""
    rows = [{k: None if isinstance(v, float) and math.isnan(v) else v for k, v in asdict(level).items()}
            for level in levels]
    return {"settings": settings, "levels": rows}


def ms(seconds: float, digits: int = 0) -> str:
    """Milliseconds for a table cell; '-' for a percentile of no values."""
    return "-" if math.isnan(seconds) else f"{1e3 * seconds:.{digits}f}"


def error_lines(level: Level) -> list[str]:
    """One line per distinct failure of a level: the count, then the text."""
    return [f"{count} x {text}" for text, count in level.errors.items()]


def render_markdown(levels: Sequence[Level]) -> str:
    """A table per level, then each server's throughput at each concurrency over its concurrency 1."""
    lines = ["| server | concurrency | requests (failed) | output tok/s | req/s | TTFT p50 / p99 (ms) | "
             "ITL p50 / p99 (ms) | TPOT p50 (ms) |", "|---|---|---|---|---|---|---|---|"]
    for v in levels:
        lines.append(f"| {v.label} | {v.concurrency} | {v.requests} ({v.failed}) | {v.tokens_per_s:.1f} | "
                     f"{v.requests_per_s:.2f} | {ms(v.ttft_p50_s)} / {ms(v.ttft_p99_s)} | "
                     f"{ms(v.itl_p50_s)} / {ms(v.itl_p99_s)} | {ms(v.tpot_p50_s, 1)} |")
    scaled = []
    for label in dict.fromkeys(v.label for v in levels):
        mine = [v for v in levels if v.label == label]
        base = next((v.tokens_per_s for v in mine if v.concurrency == 1), None)
        if base:
            scaled.append(f"- {label}: " + ", ".join(f"c={v.concurrency} {v.tokens_per_s / base:.2f}x" for v in mine))
    if scaled:  # no heading over nothing: a server without a measured concurrency 1 has no line
        lines += ["", "Aggregate throughput over the same server's concurrency 1:", "", *scaled]
    labels = list(dict.fromkeys(v.label for v in levels))
    if len(labels) > 1:
        lines += ["", f"Throughput over {labels[0]!r} at the same concurrency:", ""]
        first = {v.concurrency: v.tokens_per_s for v in levels if v.label == labels[0]}
        for label in labels[1:]:
            lines.append(f"- {label}: " + ", ".join(
                f"c={v.concurrency} {v.tokens_per_s / first[v.concurrency]:.2f}x"
                for v in levels if v.label == label and first.get(v.concurrency)))
    failed = [v for v in levels if v.errors]
    if failed:
        lines += ["", "Failed requests (each distinct error, with how many requests got it):", ""]
        lines += [f"- {v.label} c={v.concurrency}: {line}" for v in failed for line in error_lines(v)]
    return "\n".join(lines) + "\n"


