"""`specsure bench serve` against real uvicorn servers on the tiny chat model, and a fake that misbehaves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from serving import WORDS, serving, tiny_chat_engine
from specsure.bench.load import Outcome, percentile, summarize, to_json
from specsure.cli.main import main
from specsure.decode.engine import Engine
from specsure.serve import create_app


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    return tiny_chat_engine(tmp_path_factory, "tiny-chat-bench-serve")


@pytest.fixture(scope="module")
def url(engine: Engine) -> Iterator[str]:
    with serving(create_app(engine, served_model_name="tiny", api_key="k")) as base:
        yield base


BAD_CHUNKS = {"badchunk": "{not json", "baddelta": '{"choices": [{"delta": "oops"}]}',
              "badcontent": '{"choices": [{"delta": {"content": 5}}]}'}
"""Chunks the first request of those modes streams in place of its second."""


def fake_openai(mode: str, bodies: list[dict[str, Any]]) -> Starlette:
    """An OpenAI-style server that records each request body; ``mode`` picks a misbehaviour: html (a web page
    at /v1/models), nomodels (an empty model list), badchunk (the first request streams a chunk that is not
    JSON; baddelta and badcontent: other BAD_CHUNKS), nousage (no usage chunk), else none."""

    async def models(request: HttpRequest) -> Response:
        if mode == "html":
            return HTMLResponse("<html>hello</html>")
        return JSONResponse({"object": "list", "data": [] if mode == "nomodels" else [{"id": "fake"}]})

    async def generate(request: HttpRequest) -> Response:
        body = await request.json()
        bodies.append(body)
        key = "delta" if request.url.path.endswith("chat/completions") else "text"
        chunks = [json.dumps({"choices": [{key: {"content": f" t{i}"} if key == "delta" else f" t{i}"}]})
                  for i in range(body["max_tokens"])]
        if mode in BAD_CHUNKS and len(bodies) == 1:
            chunks[1] = BAD_CHUNKS[mode]
        if mode != "nousage":
            chunks.append(json.dumps({"choices": [], "usage": {"completion_tokens": body["max_tokens"]}}))
        return Response("".join(f"data: {c}\n\n" for c in [*chunks, "[DONE]"]), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/models", models),
                             Route("/v1/chat/completions", generate, methods=["POST"]),
                             Route("/v1/completions", generate, methods=["POST"])])


def strict_json(path: Path) -> dict[str, Any]:
    """The file parsed as strict JSON: NaN or Infinity, which jq and JavaScript reject, fail the test."""
    def refuse(constant: str) -> None:
        raise AssertionError(f"{path} holds {constant}, which is not JSON")

    return json.loads(path.read_text(), parse_constant=refuse)


def bench_serve(url: str, tmp_path: Path, rows: list[dict[str, Any]], *flags: str) -> int:
    """Runs `specsure bench serve` on ``rows`` (as a workload file), one request at a time, no warm-up."""
    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return main(["bench", "serve", "--url", f"odd={url}", "--concurrency", "1", "--warmup", "0",
                 "--workload", str(workload), "--out", str(tmp_path / "out"), *flags])


def test_percentiles_and_the_summary_of_a_level() -> None:
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0 and percentile([1.0, 2.0], 99) == pytest.approx(1.99)
    outcomes = [Outcome(200, tokens=5, ttft_s=0.1, e2e_s=0.5, gaps_s=[0.1] * 4),
                Outcome(200, tokens=5, ttft_s=0.3, e2e_s=0.7, gaps_s=[0.1, 0.3]), Outcome(503, error="HTTP 503"),
                Outcome(0, error="ReadError: gone"), Outcome(503, error="HTTP 503")]
    level = summarize("x", 2, outcomes, wall_s=1.0)
    assert (level.requests, level.failed, level.output_tokens, level.tokens_per_s) == (5, 3, 10, 10.0)
    assert level.ttft_p50_s == pytest.approx(0.2) and level.tpot_p50_s == pytest.approx(0.1)
    assert level.itl_p99_s == pytest.approx(0.3, abs=0.01)
    assert list(level.errors.items()) == [("HTTP 503", 2), ("ReadError: gone", 1)]


def test_a_level_with_no_success_has_null_percentiles_in_json() -> None:
    level = summarize("x", 1, [Outcome(400, error="HTTP 400: too long")], wall_s=1.0)
    row = json.loads(json.dumps(to_json([level], {}), allow_nan=False))["levels"][0]
    assert (row["ttft_p50_s"], row["itl_p99_s"], row["tpot_p50_s"]) == (None, None, None)
    assert row["errors"] == {"HTTP 400: too long": 1}
    from specsure.bench.load import render_markdown
    assert "over the same server's concurrency 1" not in render_markdown([level])  # no heading over nothing


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_bench_serve_measures_every_level(url: str, tmp_path: Path, endpoint: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    workload = tmp_path / "prompts.jsonl"
    workload.write_text("".join(json.dumps({"category": "chat", "prompt": f"{WORDS} w{i}"}) + "\n" for i in range(3)))
    out = tmp_path / "out"
    code = main(["bench", "serve", "--url", f"spec={url}", "--api-key", "k", "--endpoint", endpoint,
                 "--concurrency", "1,3", "--num-prompts", "6", "--max-tokens", "7", "--workload", str(workload),
                 "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    results = json.loads((out / "serve.json").read_text())
    levels = results["levels"]
    assert [(v["label"], v["concurrency"]) for v in levels] == [("spec", 1), ("spec", 3)]
    for level in levels:
        assert level["failed"] == 0 and level["requests"] == 6 and level["output_tokens"] == 42
        assert level["tokens_per_s"] > 0 and 0 < level["ttft_p50_s"] <= level["ttft_p99_s"]
        assert level["itl_p50_s"] <= level["itl_p99_s"]
    assert (out / "serve.png").stat().st_size > 0 and "c=3" in (out / "serve.md").read_text()


def test_bench_serve_errors_name_the_flag(url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPECSURE_API_KEY", raising=False)
    for flags, needle in ((["--url", "localhost:1"], "must start with http://"),
                          (["--concurrency", "1,x"], "--concurrency"),
                          (["--concurrency", "2,1,1"], "gives 1 twice"),
                          (["--url", "a=http://127.0.0.1:9", "--url", "a=http://127.0.0.1:8"], "labels"),
                          (["--url", "http://127.0.0.1:9"], "cannot reach"),
                          (["--url", "http://127.0.0.1:99999"], "Port out of range"),
                          (["--url", "http://"], "names no host and port"),
                          (["--url", "=http://127.0.0.1:9"], "the label before '=' is empty"),
                          (["--url", "a=http://127.0.0.1:9", "--url", "b=http://127.0.0.1:8", "--pause", "inf"],
                           "--pause must be a finite number"),
                          (["--url", url], "wrong or missing --api-key"),
                          (["--url", f"{url}/nope", "--api-key", "k"], "without /v1 or another path")):
        assert main(["bench", "serve", *flags, "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert needle in err and "Traceback" not in err, err
    assert main(["bench", "--methods", "ngram", "--repeats", "2", "serve", "--url", url]) == 2  # bench's, not serve's
    err = capsys.readouterr().err
    assert "--methods, --repeats: options of `specsure bench`, given before `serve`" in err, err
    (tmp_path / "a-file").write_text("mine")
    for flags, needle in ((["--url", url, "--api-key", "x", "--out", str(tmp_path / "a-file")], "cannot write results"),):
        assert main(["bench", "serve", *flags]) == 2
        err = capsys.readouterr().err
        assert needle in err and "Traceback" not in err, err


def test_the_api_key_comes_from_the_environment(url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECSURE_API_KEY", "k")  # as specsure serve reads it
    assert bench_serve(url, tmp_path, [{"category": "c", "prompt": WORDS}], "--num-prompts", "1",
                       "--max-tokens", "2") == 0, capsys.readouterr().err


def test_failed_requests_say_why(url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 600 new tokens do not fit the tiny model's 512-token context: the server answers 400 to each request.
    code = bench_serve(url, tmp_path, [{"category": "c", "prompt": WORDS}], "--api-key", "k", "--num-prompts", "2",
                       "--max-tokens", "600")
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert "odd c=1 failed: 2 x HTTP 400: This model's maximum context length is 512 tokens" in err, err
    assert "2 of 2 requests failed" in err.splitlines()[-1]
    assert "2 x HTTP 400: This model's maximum context length" in (tmp_path / "out" / "serve.md").read_text()
    level = strict_json(tmp_path / "out" / "serve.json")["levels"][0]
    assert level["ttft_p50_s"] is None and level["tpot_p50_s"] is None and list(level["errors"].values()) == [2]


def test_workload_rows_are_sent_as_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    conversation = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "I am Ann."},
                    {"role": "assistant", "content": "Hello Ann."}, {"role": "user", "content": "Who am I?"}]
    rows = [{"category": "c", "messages": conversation, "max_tokens": 3}, {"category": "c", "prompt": "hello"},
            {"category": "c", "prompt_ids": [1, 2, 3], "max_tokens": 2}]
    bodies: list[dict[str, Any]] = []
    with serving(fake_openai("ok", bodies)) as base:
        assert bench_serve(base, tmp_path, rows, "--num-prompts", "2", "--max-tokens", "5") == 0
        assert "skipping 1 row(s), the first at " + str(tmp_path / "w.jsonl:3") in capsys.readouterr().err
        assert [(b["messages"], b["max_tokens"]) for b in bodies] == [
            (conversation, 3), ([{"role": "user", "content": "hello"}], 5)]
        bodies.clear()
        assert bench_serve(base, tmp_path, rows, "--num-prompts", "2", "--max-tokens", "5",
                           "--endpoint", "completions") == 0
        assert "skipping 1 row(s), the first at " + str(tmp_path / "w.jsonl:1") in capsys.readouterr().err
        assert [(b["prompt"], b["max_tokens"]) for b in bodies] == [("hello", 5), ([1, 2, 3], 2)]


@pytest.mark.parametrize("mode", ["html", "nomodels"])
def test_a_server_that_lists_no_model_is_named(mode: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with serving(fake_openai(mode, [])) as base:
        assert bench_serve(base, tmp_path, [{"category": "c", "prompt": "hi"}]) == 2
    err = capsys.readouterr().err
    assert f"the 'odd' server at {base} answered /v1/models with" in err and "Traceback" not in err, err


@pytest.mark.parametrize(("mode", "says"), [("badchunk", "a stream chunk is not JSON"),
                                             ("baddelta", "has a delta that is not an object"),
                                             ("badcontent", "has text that is not a string")])
def test_a_malformed_chunk_fails_only_its_request(mode: str, says: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    with serving(fake_openai(mode, [])) as base:
        assert bench_serve(base, tmp_path, [{"category": "c", "prompt": "hi"}], "--num-prompts", "2",
                           "--max-tokens", "4") == 1
    err = capsys.readouterr().err
    assert f"1 x {base}/v1/chat/completions: a stream chunk" in err and says in err and "Traceback" not in err, err
    level = strict_json(tmp_path / "out" / "serve.json")["levels"][0]
    assert (level["failed"], level["output_tokens"]) == (1, 4)


def test_a_server_that_sends_no_usage_fails_its_requests(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with serving(fake_openai("nousage", [])) as base:
        assert bench_serve(base, tmp_path, [{"category": "c", "prompt": "hi"}], "--num-prompts", "2") == 1
    assert "2 x server sent no usage (stream_options.include_usage)" in capsys.readouterr().err
    level = strict_json(tmp_path / "out" / "serve.json")["levels"][0]
    assert (level["failed"], level["tokens_per_s"]) == (2, 0.0)


def test_a_category_no_workload_prompt_has_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"id": "a", "category": "chat", "prompt": "hello"}) + "\n", encoding="utf-8")
    code = main(["bench", "serve", "--workload", str(path), "--categories", "chta", "--out", str(tmp_path / "out")])
    assert code == 2 and "--categories chta: no prompt of the --workload files has category 'chta'" in \
        capsys.readouterr().err


def test_servers_take_turns_and_rest_between(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each level alternates which server goes first, with a pause before each run, so none always
    # follows another whose idle threads still spin; the report keeps the servers' order.
    from specsure.bench import load

    ran: list[str] = []
    real = load.run_level

    async def spy(server: load.Server, *args: Any, **kwargs: Any) -> load.Level:
        ran.append(server.label)
        return await real(server, *args, **kwargs)

    slept: list[float] = []
    monkeypatch.setattr(load, "run_level", spy)
    sleep = load.time.sleep  # the module's, shared with the test servers' polling: only the pause is recorded
    monkeypatch.setattr(load.time, "sleep", lambda s: slept.append(s) if s == 1.5 else sleep(s))
    with serving(fake_openai("ok", [])) as a, serving(fake_openai("ok", [])) as b:
        levels = load.run([load.Server("a", a), load.Server("b", b)], "completions", [load.Request(prompt="hi")],
                          [1, 2, 4], [2, 2, 2], 3, warmup=0, pause=1.5)
    assert ran == ["a", "b", "b", "a", "a", "b"] and slept == [1.5] * 6
    assert [(level.label, level.concurrency) for level in levels] == [("a", 1), ("b", 1), ("a", 2), ("b", 2),
                                                                     ("a", 4), ("b", 4)]


def test_thinking_and_tool_call_deltas_count_as_output() -> None:
    """A reasoning model's first tokens come as reasoning_content: the time to the first token is theirs."""
    from specsure.bench.load import _read_chunk

    def chunk(**delta: Any) -> str:
        return json.dumps({"choices": [{"index": 0, "delta": delta}]})

    assert _read_chunk(chunk(reasoning_content="Let me"))[2] == "Let me"
    assert _read_chunk(chunk(reasoning="so"))[2] == "so"
    assert _read_chunk(chunk(tool_calls=[{"index": 0, "id": "c", "function": {"name": "f"}}]))[2]
    assert _read_chunk(chunk(role="assistant"))[2] == "" and _read_chunk(chunk(content=""))[2] == ""
    assert _read_chunk(json.dumps({"choices": [{"index": 0, "text": "hi"}]}))[2] == "hi"


def test_the_api_key_and_url_passwords_stay_out_of_the_saved_command() -> None:
    """serve.json sits in the repository by default, and gets committed."""
    from specsure.cli.bench_serve import _shown_command

    shown = _shown_command(["bench", "serve", "--url", "a=http://me:pw@host:1/x?q=1", "--api-key", "sekrit",
                            "--api-key=other", "--url", "http://host:2"])
    assert "sekrit" not in shown and "other" not in shown and ":pw@" not in shown
    assert "a=http://me:***@host:1/x?q=1" in shown and "--api-key '***'" in shown and "http://host:2" in shown
    joined = _shown_command(["bench", "serve", "--url=a=http://me:pw@host:1"])
    assert ":pw@" not in joined and "--url=a=http://me:***@host:1" in joined
    # vLLM's --api_key reaches the command as main read it, --api-key: hidden too.
    from specsure.cli.vllm_argv import normalise
    assert "sekrit" not in _shown_command(normalise(["bench", "serve", "--api_key", "sekrit", "--api_key=sekrit"]))


def test_ctrl_c_keeps_the_levels_every_server_finished(url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from specsure.bench import load

    real, calls = load.run_level, []

    async def run_level(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(args[4])  # its concurrency; the warm-up's is 1 too
        if len(calls) == 3:  # the warm-up, level 1, then Ctrl-C at level 2
            raise KeyboardInterrupt
        return await real(*args, **kwargs)

    monkeypatch.setattr(load, "run_level", run_level)
    out = tmp_path / "out"
    code = main(["bench", "serve", "--url", url, "--api-key", "k", "--concurrency", "1,2,4", "--num-prompts", "2",
                 "--max-tokens", "3", "--out", str(out)])
    assert code == 130
    results = json.loads((out / "serve.json").read_text())
    assert [v["concurrency"] for v in results["levels"]] == [1]
    assert "after 1 of 3 concurrency levels" in results["settings"]["interrupted"]
    assert "interrupted:" in capsys.readouterr().err
