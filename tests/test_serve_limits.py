"""Limits and back-pressure on a real uvicorn server: --max-queue, --request-timeout, the context
room, and a corpus of bad input for every endpoint. Nothing may hang, reset a connection or 500."""

from __future__ import annotations

import json
import threading
import time
from typing import Iterator

import httpx
import openai
import pytest

from serving import WORDS, Trace, metric, serving, tiny_chat_engine
from specsure.cli.main import build_parser, main
from specsure.decode.engine import Engine
from specsure.serve import create_app
from specsure.serve.app import DEFAULT_MAX_QUEUE

LONG = {"prompt": WORDS, "max_tokens": 400, "ignore_eos": True}
SHORT = {"prompt": WORDS, "max_tokens": 3, "ignore_eos": True}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    return tiny_chat_engine(tmp_path_factory, "tiny-chat-limits")


@pytest.fixture(scope="module")
def url(engine: Engine) -> Iterator[str]:
    with serving(create_app(engine, served_model_name="tiny")) as base:
        yield base


def _wait_until(check, timeout: float = 20) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def test_beyond_max_queue_requests_get_a_clean_503(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    trace = Trace(engine, monkeypatch, step_s=0.05)
    monkeypatch.setattr(engine.scheduler, "max_num_seqs", 1)  # one generating, so the queue fills at once
    with serving(create_app(engine, served_model_name="tiny", max_queue=2)) as url:
        results: list[object] = []

        def call() -> None:
            try:
                results.append(httpx.post(f"{url}/v1/completions", json=SHORT, timeout=60))
            except httpx.HTTPError as exc:  # a reset or a hang would land here
                results.append(exc)

        with httpx.stream("POST", f"{url}/v1/completions", json={**LONG, "stream": True}) as holder:
            lines = holder.iter_lines()
            next(lines)  # the engine is busy with the holder for seconds
            callers = [threading.Thread(target=call) for _ in range(6)]
            for t in callers:
                t.start()
            _wait_until(lambda: len(results) >= 4)  # the four beyond the queue are answered at once
            busy = httpx.get(f"{url}/metrics").text
            sdk = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
            with pytest.raises(openai.APIStatusError) as refused:
                sdk.completions.create(model="tiny", prompt=WORDS, max_tokens=3)
        for t in callers:
            t.join(timeout=60)
        assert all(isinstance(r, httpx.Response) for r in results), results
        codes = sorted(r.status_code for r in results)
        assert codes == [200, 200, 503, 503, 503, 503]
        for r in results:
            if r.status_code == 503:
                error = r.json()["error"]
                assert r.headers["retry-after"] == "1" and error["code"] == "queue_full"
                assert error["type"] == "server_error" and "--max-queue 2" in error["message"]
                assert "--max-num-seqs 1" in error["message"]
        assert refused.value.status_code == 503 and refused.value.response.headers["retry-after"] == "1"
        labels = {"model_name": "tiny", "engine": "0"}
        assert metric(busy, "vllm:num_requests_running", **labels) == 1
        assert metric(busy, "vllm:num_requests_waiting", **labels) == 2
        assert 0 < metric(busy, "vllm:kv_cache_usage_perc", **labels) <= 1  # the holder's prompt and tokens
        after = httpx.get(f"{url}/metrics").text
        assert metric(after, "vllm:admission_rejections_total", reason="max_num_queued_reqs") == 5
        assert metric(after, "vllm:num_requests_waiting", **labels) == 0
        # The two that waited behind the holder spent at least one of its 0.05-s steps in the queue each;
        # their prefill and decode did not count that wait.
        assert metric(after, "vllm:request_queue_time_seconds_sum", **labels) >= 2 * 0.05
        assert metric(after, "vllm:request_queue_time_seconds_count", **labels) == 2
        assert httpx.get(f"{url}/health").json() == {"status": "ok"}
        assert httpx.post(f"{url}/v1/completions", json=SHORT).status_code == 200
    assert [e[1] for e in trace.events if e[0] == "start"] == [400, 3, 3, 3]


def test_request_timeout_stops_a_long_generation_with_a_504(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    trace = Trace(engine, monkeypatch, step_s=0.1)
    with serving(create_app(engine, served_model_name="tiny", request_timeout=1.5)) as url:
        r = httpx.post(f"{url}/v1/completions", json=LONG, timeout=30)
        assert r.status_code == 504 and r.headers["x-should-retry"] == "false"
        error = r.json()["error"]
        assert error["code"] == "request_timeout" and "--request-timeout of 1.5 s" in error["message"]
        assert "its generation was stopped; ask for fewer tokens (max_tokens)" in error["message"]
        assert trace.wait_for("closed", 400)[2] < 25  # 400 tokens need 80 steps or more
        assert httpx.post(f"{url}/v1/completions", json=SHORT, timeout=30).status_code == 200
        text = httpx.get(f"{url}/metrics").text
        assert metric(text, "vllm:request_success_total", finished_reason="abort") == 1


def test_a_timeout_while_the_prompt_is_read_says_so(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """No token was generated: fewer max_tokens would not help, a shorter prompt would."""
    Trace(engine, monkeypatch, step_s=0.1)
    monkeypatch.setattr(engine.scheduler, "max_num_batched_tokens", 1)  # the prompt read a token a step, 0.1 s each
    fresh = {"prompt": list(range(20, 32)), "max_tokens": 3, "ignore_eos": True}  # no slot has it cached
    with serving(create_app(engine, served_model_name="tiny", request_timeout=0.3)) as url:  # 12 tokens: 1.2 s
        error = httpx.post(f"{url}/v1/completions", json=fresh, timeout=30).json()["error"]
    assert "before its first token, while its prompt of" in error["message"] and "send a shorter prompt" in error["message"]


def test_request_timeout_ends_a_stream_with_an_error_event(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    Trace(engine, monkeypatch, step_s=0.1)
    with serving(create_app(engine, served_model_name="tiny", request_timeout=0.8)) as url:
        sdk = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        chunks = []
        with pytest.raises(openai.APIError, match="--request-timeout"):
            for chunk in sdk.chat.completions.create(model="tiny", messages=[{"role": "user", "content": WORDS}],
                                                     max_tokens=400, stream=True, extra_body={"ignore_eos": True}):
                chunks.append(chunk)
        assert chunks and chunks[0].choices[0].delta.role == "assistant"  # it streamed, then stopped
        raw = httpx.post(f"{url}/v1/completions", json={**LONG, "stream": True}, timeout=30)
        assert raw.status_code == 200 and raw.text.endswith("data: [DONE]\n\n") and '"request_timeout"' in raw.text


def test_request_timeout_fails_a_streamed_response(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    Trace(engine, monkeypatch, step_s=0.1)
    with serving(create_app(engine, served_model_name="tiny", request_timeout=0.8)) as url:
        raw = httpx.post(f"{url}/v1/responses", json={"input": WORDS, "max_output_tokens": 400, "ignore_eos": True,
                                                      "stream": True}, timeout=30)
        said = [json.loads(line[len("data: "):]) for line in raw.text.splitlines() if line.startswith("data: ")]
        assert raw.status_code == 200 and said[0]["type"] == "response.created"
        assert said[-2]["type"] == "error" and said[-2]["code"] == "request_timeout"
        failed = said[-1]["response"]
        assert said[-1]["type"] == "response.failed" and failed["status"] == "failed"
        # OpenAI's ResponseError codes have no timeout: the object says server_error, the error event why.
        assert failed["error"]["code"] == "server_error" and "--request-timeout" in failed["error"]["message"]
        assert failed["output"][0]["content"][0]["text"]  # what it said before it stopped
        assert httpx.get(f"{url}/v1/responses/{failed['id']}").status_code == 404  # a failed response is not kept


def test_request_timeout_in_the_queue_is_a_503(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    trace = Trace(engine, monkeypatch, step_s=2.0)  # one step outlasts both deadlines
    monkeypatch.setattr(engine.scheduler, "max_num_seqs", 1)  # so the second request waits
    with serving(create_app(engine, served_model_name="tiny", request_timeout=0.5)) as url:
        first: list[httpx.Response] = []
        runner = threading.Thread(target=lambda: first.append(httpx.post(f"{url}/v1/completions", json=LONG)))
        runner.start()
        trace.wait_for("start", 400)
        queued = httpx.post(f"{url}/v1/completions", json=SHORT, timeout=30)
        runner.join(timeout=30)
        assert first[0].status_code == 504
        assert queued.status_code == 503 and queued.headers["retry-after"] == "1"
        assert queued.json()["error"]["code"] == "request_timeout"
        trace.wait_for("closed", 400)
        assert httpx.get(f"{url}/health").status_code == 200
        # Both count as aborts, as in vLLM; what the running one prefilled and generated counts too.
        text = httpx.get(f"{url}/metrics").text
        assert metric(text, "vllm:request_success_total", finished_reason="abort") == 2
        prompt = httpx.post(f"{url}/tokenize", json={"prompt": WORDS}).json()["count"]
        assert metric(text, "vllm:prompt_tokens_total") == prompt
        assert metric(text, "vllm:generation_tokens_total") >= 1
    assert [e for e in trace.events if e[0] == "start"] == [("start", 400, 0)]  # the queued one never ran


def test_max_tokens_beyond_the_context_is_a_400_naming_the_room(url: str) -> None:
    r = httpx.post(f"{url}/v1/completions", json={"prompt": WORDS, "max_tokens": 600})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "max_tokens"
    assert error["message"].startswith("This model's maximum context length is 512 tokens. However, you requested "
                                       "609 tokens (9 in the prompt, 600 in the completion).")
    assert "max_tokens can be at most 503" in error["message"]
    chat = httpx.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": WORDS}],
                                                          "max_completion_tokens": 10**12})
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "max_completion_tokens"
    assert "in the messages" in chat.json()["error"]["message"]


def test_the_whole_room_can_be_used_and_a_default_max_tokens_shrinks_to_it(url: str) -> None:
    prompt = [5] * 500
    full = httpx.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 12, "ignore_eos": True})
    assert full.status_code == 200 and full.json()["usage"]["completion_tokens"] == 12
    assert httpx.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 13}).status_code == 400
    shrunk = httpx.post(f"{url}/v1/completions", json={"prompt": [5] * 505, "ignore_eos": True}).json()
    assert shrunk["usage"]["completion_tokens"] == 7 and shrunk["choices"][0]["finish_reason"] == "length"
    chat = httpx.post(f"{url}/v1/chat/completions",  # the chat default (512) is more than the room
                      json={"messages": [{"role": "user", "content": "w1 " * 490}], "ignore_eos": True}).json()
    assert chat["usage"]["total_tokens"] == 512 and chat["choices"][0]["finish_reason"] == "length"


BASES = {"completions": '"prompt": "w5 w6"', "chat/completions": '"messages": [{"role": "user", "content": "w5"}]'}
EITHER = [  # (body, with {base} standing for the endpoint's prompt or messages; the param named)
    (b"", None), (b"{base,", None), (b"[1, 2]", None), (b'"a string"', None), (b"[" * 100_000, None),
    (b'{base, "max_tokens": "8"}', "max_tokens"), (b'{base, "max_tokens": 16.5}', "max_tokens"),
    (b'{base, "max_tokens": true}', "max_tokens"), (b'{base, "temperature": [1]}', "temperature"),
    (b'{base, "top_p": "x"}', "top_p"), (b'{base, "top_k": -2}', "top_k"), (b'{base, "seed": 1.5}', "seed"),
    (b'{base, "stop": 5}', "stop"), (b'{base, "stop": [1, 2]}', "stop"), (b'{base, "ignore_eos": "yes"}', "ignore_eos"),
    (b'{base, "n": "1"}', "n"), (b'{base, "user": 3}', "user"), (b'{base, "model": 7}', "model"),
    (b'{base, "temperature": NaN}', "temperature"), (b'{base, "top_p": Infinity}', "top_p"),
    (b'{base, "temperature": -Infinity}', "temperature"), (b'{base, "temperature": 1e999}', "temperature"),
    (b'{base, "max_tokens": 1000000000000000000}', "max_tokens"),
    (b'{base, "max_tokens": 1' + b"0" * 30 + b"}", "max_tokens"), (b'{base, "seed": 18446744073709551616}', "seed"),
    (b'{base, "top_k": 100000000000000000000}', "top_k"), (b'{base, "max_tokens": 1' + b"0" * 5000 + b"}", None),
    (b'{base, "stop": "\\ud800"}', "stop"), (b'{base, "stop": "\xff\xfe"}', None),
    (b'{base, "stop": ' + b"[" * 40 + b"]" * 40 + b"}", "stop"),
    (b'{base, "tempreature": 0.5}', "tempreature"), (b'{base, "logprobs": 50}', "logprobs"),
    (b'{base, "top_logprobs": 3}', "top_logprobs"), (b'{base, "n": 1000}', "n"),
    (b'{base, "stream": "true"}', "stream"), (b'{base, "stream": 1}', "stream"),
    (b'{base, "stream_options": {"include_usage": true}}', "stream_options"),
    (b'{base, "stream": false, "stream_options": {"include_usage": true}}', "stream_options"),
    (b'{base, "stream": true, "stream_options": [1]}', "stream_options"),
    (b'{base, "stream": true, "stream_options": {"include_usage": "yes"}}', "stream_options.include_usage"),
    (b'{base, "stream": true, "stream_options": {"inclde_usage": true}}', "stream_options.inclde_usage"),
]
ONLY = {
    "completions": [(b"{}", "prompt"), (b'{"prompt": {"a": 1}}', "prompt"), (b'{"prompt": "\\udc00"}', "prompt"),
                    (b'{"prompt": [1.5]}', "prompt"), (b'{"prompt": [' + b"5, " * 600 + b"5]}", "prompt")],
    "chat/completions": [(b"{}", "messages"), (b'{"messages": {"role": "user"}}', "messages"),
                         (b'{"messages": [{"role": "user", "content": "\\udc00"}]}', "messages[0].content"),
                         (b'{"messages": [{"role": "user", "content": {"x": 1}}]}', "messages[0].content"),
                         (b'{"messages": [{"role": "user", "content": "' + b"w1 " * 600 + b'"}]}', "messages"),
                         (b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "w1", "foo": 1}]}]}',
                          "messages[0].content[0].foo"),
                         (b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "w1"}, {"type": "text"}]}]}',
                          "messages[0].content[1].text"),
                         (b'{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}',
                          "messages[0].content[0]"),
                         (b'{"messages": [{"role": "user", "content": "w1"}], "echo": true}', "echo"),
                         (b'{"messages": [{"role": "user", "content": "w1"}], "best_of": 1}', "best_of")],
}
RESPONSES = [(body.replace(b'"max_tokens"', b'"max_output_tokens"'),
              param.replace("max_tokens", "max_output_tokens") if param else None)
             for body, param in EITHER if param != "top_logprobs"] + [  # top_logprobs alone is fine there
    (b"{}", "input"), (b'{"input": {"a": 1}}', "input"), (b'{"input": "\\udc00"}', "input"),
    (b'{"input": [{"role": "user", "content": {"x": 1}}]}', "input[0].content"),
    (b'{"input": "' + b"w1 " * 600 + b'"}', "input"), (b'{"input": "w1", "top_logprobs": 3.5}', "top_logprobs"),
    (b'{"input": [{"role": "user", "content": [{"type": "input_text", "text": "w1", "foo": 1}]}]}',
     "input[0].content[0].foo"), (b'{"input": "w1", "previous_response_id": 5}', "previous_response_id"),
    (b'{"input": "w1", "tools": [{"type": "function"}]}', "tools[0].name")]
CORPUS = [(endpoint, body.replace(b"{base", b"{" + BASES[endpoint].encode()), param)
          for endpoint in BASES for body, param in [*EITHER, *ONLY[endpoint]]] + \
    [("responses", body.replace(b"{base", b'{"input": "w5"'), param) for body, param in RESPONSES]


@pytest.mark.parametrize("endpoint, body, param", CORPUS,
                         ids=[f"{e}:{p}:{b[:40]!r}" for e, b, p in CORPUS])
def test_bad_input_is_a_4xx_naming_the_field(url: str, endpoint: str, body: bytes, param: str | None) -> None:
    r = httpx.post(f"{url}/v1/{endpoint}", content=body, headers={"Content-Type": "application/json"})
    assert 400 <= r.status_code < 500, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    if param is None:
        assert error["param"] is None, error
    else:
        assert error["param"] is not None and error["param"].startswith(param), error
        assert param.split(".")[-1].split("[")[0] in error["message"], error


def test_a_body_over_the_limit_is_a_413(url: str) -> None:
    r = httpx.post(f"{url}/v1/completions", content=b'{"prompt": "' + b"w1 " * (6 * 2**20) + b'"}')
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"


def test_a_body_that_is_not_json_by_its_content_type_is_a_415(url: str) -> None:
    """A browser sends text/plain and forms from any page without a CORS preflight: read as JSON,
    they would let every web page use a local server that has no key."""
    body = b'{"prompt": "w1", "max_tokens": 2}'
    for media in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        r = httpx.post(f"{url}/v1/completions", content=body, headers={"Content-Type": media})
        assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type", media
    for media in ("application/json", "application/json; charset=utf-8", "Application/JSON", "application/vnd.x+json"):
        assert httpx.post(f"{url}/v1/completions", content=body, headers={"Content-Type": media}).status_code == 200
    assert httpx.post(f"{url}/v1/completions", content=body).status_code == 200  # none: read as JSON, as FastAPI
    assert httpx.post(f"{url}/tokenize", content=b'{"prompt": "w1"}',
                      headers={"Content-Type": "text/plain"}).status_code == 415


def test_a_body_declared_far_over_the_limit_is_a_413_before_it_is_sent(url: str) -> None:
    import socket
    from urllib.parse import urlsplit

    where = urlsplit(url)
    with socket.create_connection((where.hostname, where.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100000000000\r\n\r\n{")
        answer = b""
        while b"body_too_large" not in answer and (part := sock.recv(4096)):  # headers and body may come apart
            answer += part
    assert answer.startswith(b"HTTP/1.1 413") and b"body_too_large" in answer


def test_a_compressed_body_is_a_415_naming_the_encoding(url: str) -> None:
    import gzip

    body = gzip.compress(b'{"prompt": "w1", "max_tokens": 2}')
    r = httpx.post(f"{url}/v1/completions", content=body, headers={"Content-Encoding": "gzip"})
    assert r.status_code == 415 and "Content-Encoding 'gzip'" in r.json()["error"]["message"]


def test_the_server_stays_healthy_after_the_corpus(url: str) -> None:
    for endpoint, body, _ in CORPUS:
        assert httpx.post(f"{url}/v1/{endpoint}", content=body).status_code < 500
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}
    assert httpx.post(f"{url}/v1/completions", json=SHORT).status_code == 200
    text = httpx.get(f"{url}/metrics").text
    assert metric(text, "vllm:num_requests_running") == 0 and metric(text, "vllm:num_requests_waiting") == 0


def test_serve_limit_flags(capsys: pytest.CaptureFixture[str], engine: Engine) -> None:
    args = build_parser().parse_args(["serve"])
    assert (args.max_queue, args.request_timeout) == (DEFAULT_MAX_QUEUE, None) == (64, None)
    args = build_parser().parse_args(["serve", "--max-queue", "0", "--request-timeout", "2.5"])
    assert (args.max_queue, args.request_timeout) == (0, 2.5)
    for flags, needle in ((["--max-queue", "-1"], "--max-queue -1 must be >= 0"),
                          (["--request-timeout", "0"], "--request-timeout 0 must be"),
                          (["--request-timeout", "inf"], "--request-timeout inf must be"),
                          (["--served-model-name", "a", "b", "a"], "--served-model-name gives 'a' more than once"),
                          (["--served-model-name", ""], "--served-model-name '' is not a name")):
        assert main(["serve", "--model", "/no/such/model", *flags]) == 2
        err = capsys.readouterr().err
        assert needle in err and "Traceback" not in err
    with pytest.raises(ValueError, match="max_queue"):
        create_app(engine, max_queue=-1)
    with pytest.raises(ValueError, match="request_timeout"):
        create_app(engine, request_timeout=0)


def test_a_timed_out_requests_place_is_free_when_its_504_arrives(engine: Engine,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    Trace(engine, monkeypatch, step_s=0.1)
    monkeypatch.setattr(engine.scheduler, "max_num_seqs", 1)
    with serving(create_app(engine, served_model_name="tiny", request_timeout=1.5, max_queue=0)) as url:
        assert httpx.post(f"{url}/v1/completions", json=LONG, timeout=30).status_code == 504
        assert httpx.post(f"{url}/v1/completions", json=SHORT, timeout=30).status_code == 200  # not "queue full"


def test_more_choices_than_the_server_ever_holds_is_a_400(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine.scheduler, "max_num_seqs", 1)
    with serving(create_app(engine, served_model_name="tiny", max_queue=1)) as url:
        r = httpx.post(f"{url}/v1/completions", json={**SHORT, "n": 3}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "n" and "n <= 2" in r.json()["error"]["message"]
        assert httpx.post(f"{url}/v1/completions", json={**SHORT, "n": 2}, timeout=30).status_code == 200
        r = httpx.post(f"{url}/v1/completions", json={**SHORT, "prompt": [SHORT["prompt"]] * 2, "n": 2}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
        assert "2 prompts with n = 2 (4 sequences)" in r.json()["error"]["message"]


def test_a_stop_list_past_its_bounds_is_a_400(url: str) -> None:
    """Each step searches the output for every stop string: a million of them stalled every request."""
    for stop, words in ((["w1"] * 65, "at most 64 stop strings"), (["w" * 1025], "at most 1024 characters")):
        reply = httpx.post(f"{url}/v1/completions", json={**SHORT, "stop": stop}, timeout=30)
        error = reply.json()["error"]
        assert reply.status_code == 400 and error["param"] == "stop" and words in error["message"], error
