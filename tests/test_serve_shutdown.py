"""SIGTERM and Ctrl-C: new requests refused, running ones stopped with an answer, no traceback."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from serving import PROMPT_IDS, Trace, build_tiny_chat_model, metric, tiny_chat_engine
from specsure.sampling import SamplingParams
from specsure.serve.errors import APIError
from specsure.serve.metrics import ServeMetrics
from specsure.serve.runner import EngineRunner

LONG = SamplingParams(max_tokens=400, ignore_eos=True, temperature=0.0)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return tiny_chat_engine(tmp_path_factory, "shutdown")


async def updates_until_error(runner: EngineRunner, job) -> tuple[int, APIError]:
    never = asyncio.get_running_loop().create_future()
    count = 0
    try:
        while (await runner.next_update(job, never)).completion is None:
            count += 1
    except APIError as exc:
        return count, exc
    raise AssertionError("the job finished although the server was shutting down")


def test_a_shutdown_stops_running_and_queued_requests_and_refuses_new_ones(engine, monkeypatch):
    Trace(engine, monkeypatch, step_s=0.02)  # 400 tokens take seconds

    async def scenario():
        runner = EngineRunner(engine, ServeMetrics(engine, "m"), max_queue=4, timeout_s=None)
        jobs = runner.submit([(PROMPT_IDS, [LONG, LONG])], stream=True)
        await runner.next_update(jobs[0], asyncio.get_running_loop().create_future())  # it runs
        runner.shut_down("SIGTERM", 0)
        for job in jobs:
            _, error = await updates_until_error(runner, job)
            assert error.status == 503 and error.code == "shutting_down" and "SIGTERM" in str(error)
        with pytest.raises(APIError, match="shutting down") as refused:
            runner.submit([(PROMPT_IDS, [LONG])], stream=False)
        assert refused.value.status == 503

    asyncio.run(scenario())


def test_a_grace_period_lets_requests_run_until_it_ends(engine, monkeypatch):
    Trace(engine, monkeypatch, step_s=0.02)

    async def scenario():
        runner = EngineRunner(engine, ServeMetrics(engine, "m"), max_queue=4, timeout_s=None)
        job = runner.submit([(PROMPT_IDS, [SamplingParams(max_tokens=3, ignore_eos=True)])], stream=True)[0]
        long = runner.submit([(PROMPT_IDS, [LONG])], stream=True)[0]
        runner.shut_down("SIGINT", 0.3)
        never = asyncio.get_running_loop().create_future()
        while (await runner.next_update(job, never)).completion is None:
            pass  # the short one finishes within the grace
        started = time.perf_counter()
        steps, error = await updates_until_error(runner, long)
        assert error.code == "shutting_down" and steps > 0 and time.perf_counter() - started < 5

    asyncio.run(scenario())


def _serve(folder: Path, *flags: str, banner: list[str] | None = None) -> tuple[subprocess.Popen, str]:
    """The server's process and URL; ``banner`` gets its start-up line."""
    proc = subprocess.Popen([sys.executable, "-m", "specsure", "serve", "--model", str(folder), "--port", "0",
                             "--dtype", "float32", "--max-num-seqs", "1", "--threads", "1", *flags],
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stderr is not None
    for line in proc.stderr:
        if "listening on " in line:
            if banner is not None:
                banner.append(line)
            return proc, line.rsplit("listening on ", 1)[1].strip()
    raise AssertionError(f"the server did not start (exit {proc.wait()})")


def test_the_start_up_line_names_the_settings_an_answer_depends_on(tmp_path):
    banner: list[str] = []
    proc, _ = _serve(build_tiny_chat_model(tmp_path / "model"), "--api-key", "k", "--request-timeout", "30",
                     "--allowed-origins", '["http://localhost:3000"]', banner=banner)
    proc.kill()
    proc.wait(30)
    assert ("; dtype float32, an API key required on /v1/*, CORS for http://localhost:3000, requests stopped "
            "after 30 s; listening on ") in banner[0]


def _stream(url: str, out: list[str], first: threading.Event) -> None:
    body = {"prompt": PROMPT_IDS, "max_tokens": 400, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
        out.append(str(response.status_code))
        for line in response.iter_lines():
            if line:
                out.append(line)
                first.set()


@pytest.mark.parametrize("flags, signals", [((), [signal.SIGINT]), ((), [signal.SIGTERM]),
                                            (("--shutdown-timeout", "600"), [signal.SIGINT, signal.SIGINT])])
def test_a_signal_ends_every_stream_with_an_answer_and_the_server_at_once(tmp_path, flags, signals):
    proc, url = _serve(build_tiny_chat_model(tmp_path / "model"), *flags)
    try:
        outputs: list[list[str]] = [[] for _ in range(3)]
        first = threading.Event()
        threads = [threading.Thread(target=_stream, args=(url, out, first)) for out in outputs]
        for thread in threads:
            thread.start()
        assert first.wait(30), "no stream started"
        deadline = time.monotonic() + 30  # every request admitted: one connecting now would meet a closed port
        while metric(httpx.get(f"{url}/metrics").text, "vllm:num_requests_waiting") < 2:
            assert time.monotonic() < deadline, "the other two requests never queued"
            time.sleep(0.01)
        for sig in signals:
            proc.send_signal(sig)
            time.sleep(0.1)
        for thread in threads:
            thread.join(30)
        proc.wait(30)
    finally:
        proc.kill()
        log = proc.stderr.read() if proc.stderr else ""
    assert "Traceback" not in log and "Internal Server Error" not in log, log
    assert f"{signals[0].name}: refusing new requests" in log  # what the next signal does, said
    assert ("SIGINT again: stopping the running requests now" in log) == (len(signals) == 2)
    for status, *lines in outputs:
        if status == "503":  # stopped before it started: an error answer, as for --request-timeout
            assert json.loads("".join(lines))["error"]["code"] == "shutting_down"
            continue
        assert status == "200" and lines[-1] == "data: [DONE]", lines[-3:]
        events = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
        finished = any(c.get("finish_reason") for e in events for c in e.get("choices", ()))
        assert finished or events[-1]["error"]["code"] == "shutting_down", events[-1]
    assert any("shutting_down" in line for out in outputs for line in out)  # the queued ones, at least


def test_a_runner_serves_requests_from_more_than_one_event_loop(engine, monkeypatch):
    """A test client may start an event loop per request; the stop signal must follow the loop."""
    Trace(engine, monkeypatch, step_s=0.02)
    runner = EngineRunner(engine, ServeMetrics(engine, "m"), max_queue=4, timeout_s=None)

    async def short() -> None:
        job = runner.submit([(PROMPT_IDS, [SamplingParams(max_tokens=2, ignore_eos=True)])], stream=False)[0]
        never = asyncio.get_running_loop().create_future()
        while (await runner.next_update(job, never)).completion is None:
            pass

    async def stopped() -> APIError:
        job = runner.submit([(PROMPT_IDS, [LONG])], stream=True)[0]
        await runner.next_update(job, asyncio.get_running_loop().create_future())
        runner.shut_down("SIGTERM", 0)
        return (await updates_until_error(runner, job))[1]

    asyncio.run(short())
    assert asyncio.run(stopped()).code == "shutting_down"  # the stop used to live on the first, closed loop
