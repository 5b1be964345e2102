"""vLLM's periodic log lines from a serving engine, counted step by step."""

from __future__ import annotations

import logging
import re

import pytest
from fastapi.testclient import TestClient

from serving import WORDS, metric, tiny_chat_engine
from specsure.cli.main import build_parser
from specsure.serve.app import create_app


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201 - a FastAPI app
    app = create_app(tiny_chat_engine(tmp_path_factory, "stats"), served_model_name="tiny")
    app.state.runner.stats_log.interval = 3600.0  # the test logs by hand, never the thread
    return app


def test_an_interval_logs_what_its_steps_did_in_vllms_words(app, caplog: pytest.LogCaptureFixture) -> None:  # noqa: ANN001
    client, log = TestClient(app), app.state.runner.stats_log
    log.log()  # start a fresh interval
    before = client.get("/metrics").text
    bodies = [client.post("/v1/completions", json={"prompt": WORDS, "max_tokens": 24, "ignore_eos": True}).json()
              for _ in range(2)]
    with caplog.at_level(logging.DEBUG, logger="specsure.serve.stats_log"):
        log.log()
        log.log()  # nothing ran since, after an interval that ran: INFO still, then quiet
        log.log()
    lines = [(r.levelno, r.getMessage()) for r in caplog.records]
    engine_lines = [(level, text) for level, text in lines if text.startswith("Engine 000: ")]
    assert [level for level, _ in engine_lines] == [logging.INFO, logging.INFO, logging.DEBUG]
    first = engine_lines[0][1]
    assert re.search(r"Avg prompt throughput: [1-9][\d.]* tokens/s, Avg generation throughput: [1-9][\d.]* tokens/s, "
                     r"Running: 0 reqs, Waiting: 0 reqs, CPU KV cache usage: 0\.0%", first), first
    spec = [text for _, text in lines if text.startswith("SpecDecoding metrics: ")]
    accepted = sum(b["speculative"]["accepted_tokens"] for b in bodies)
    drafted = sum(b["speculative"]["draft_tokens"] for b in bodies)
    drafts = sum(b["speculative"]["drafts"] for b in bodies)
    assert len(spec) == 1 and f"Accepted: {accepted} tokens, Drafted: {drafted} tokens" in spec[0]
    assert f"Mean acceptance length: {1 + accepted / drafts:.2f}" in spec[0]
    after = client.get("/metrics").text
    labels = {"model_name": "tiny", "engine": "0"}
    steps = metric(after, "vllm:iteration_tokens_total_count", **labels) - \
        metric(before, "vllm:iteration_tokens_total_count", **labels)
    tokens = metric(after, "vllm:iteration_tokens_total_sum", **labels) - \
        metric(before, "vllm:iteration_tokens_total_sum", **labels)
    prompts = sum(b["usage"]["prompt_tokens"] for b in bodies)
    assert steps >= 2 and tokens == prompts + 48  # every prompt token computed once, every output token once


def test_disable_log_stats_is_vllms_flag_and_without_it_the_lines_show_at_the_clis_level(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from specsure.cli.common import setup_logging
    from specsure.cli.serve import show_stats_lines

    args = build_parser(["serve"]).parse_args(["serve", "--disable-log-stats"])
    assert args.disable_log_stats is True
    assert build_parser(["serve"]).parse_args(["serve"]).disable_log_stats is False
    stats, root = logging.getLogger("specsure.serve.stats_log"), logging.getLogger()
    levels = stats.level, root.level
    try:
        stats.setLevel(logging.NOTSET)
        setup_logging(False)  # the CLI without -v: WARNING for everything else
        root.setLevel(logging.WARNING)  # as basicConfig sets it where no handler was there before
        show_stats_lines(False)
        assert not stats.isEnabledFor(logging.INFO)
        show_stats_lines(True)
        assert stats.isEnabledFor(logging.INFO)
    finally:  # setLevel, not the attribute: it also clears logging's cache of what is enabled
        stats.setLevel(levels[0])
        root.setLevel(levels[1])


def test_a_log_that_fails_does_not_end_the_lines_and_the_interval_is_finite(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from specsure.serve.stats_log import Batch, StatsLog, interval_s

    for value, expected in (("inf", 10.0), ("nan", 10.0), ("-1", 10.0), ("2.5", 2.5), ("x", 10.0)):
        monkeypatch.setenv("VLLM_LOG_STATS_INTERVAL", value)
        assert interval_s() == expected
    calls = []

    def batch() -> Batch:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return Batch()

    log = StatsLog(batch, prefix_caching=False, interval=0.01)
    from specsure.decode.metrics import SpecStats

    with caplog.at_level(logging.DEBUG, logger="specsure.serve.stats_log"):
        log.step(1, 1, SpecStats())  # starts the thread
        import time

        deadline = time.monotonic() + 5
        while len(calls) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert len(calls) >= 3 and "the periodic stats line failed" in caplog.text
