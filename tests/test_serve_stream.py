"""Streaming and cancellation on a real uvicorn server, driven by the official openai client.

Greedy float32 on the tiny chat model, so a streamed answer must join to exactly the non-streamed
one. Cancellation tests slow each engine step down and record what the engine thread did, so they
assert on order and flags rather than on wall time.
"""

from __future__ import annotations

import itertools
import json
import time
from typing import Iterator

import httpx
import openai
import pytest

from serving import metric, CHAT, PROMPT_IDS, WORDS, Trace, serving, tiny_chat_engine
from specsure import SamplingParams, make_engine
from specsure.decode.engine import Engine
from specsure.serve import create_app



@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    return tiny_chat_engine(tmp_path_factory, "tiny-chat-stream")


@pytest.fixture(scope="module")
def url(engine: Engine) -> Iterator[str]:
    with serving(create_app(engine, served_model_name="tiny")) as base:
        yield base


@pytest.fixture(scope="module")
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)


def _figures(spec: dict) -> dict:
    return {k: v for k, v in spec.items() if k not in ("elapsed_s", "tokens_per_s")}


@pytest.mark.parametrize("prompt", [WORDS, PROMPT_IDS], ids=["text", "token-ids"])
def test_completion_stream_joins_to_the_whole_answer(client: openai.OpenAI, prompt: object) -> None:
    args = dict(model="tiny", prompt=prompt, max_tokens=40, temperature=0, extra_body={"ignore_eos": True})
    whole = client.completions.create(**args)
    chunks = list(client.completions.create(**args, stream=True))
    assert all(c.object == "text_completion" and c.id == chunks[0].id for c in chunks)
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    ids = [c.choices[0].model_extra["token_ids"] for c in chunks]
    assert sum(ids, []) == whole.choices[0].model_extra["token_ids"]
    assert any(len(i) > 1 for i in ids)  # a verification step's tokens arrive together
    assert [c.choices[0].finish_reason for c in chunks] == [None] * (len(chunks) - 1) + ["length"]
    assert _figures(chunks[-1].model_extra["speculative"]) == _figures(whole.model_extra["speculative"])


def test_chat_stream_has_openai_shape_and_joins_to_the_whole_answer(client: openai.OpenAI) -> None:
    args = dict(model="tiny", messages=CHAT, max_tokens=30, temperature=0, extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**args)
    chunks = list(client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    first, *middle, finish, usage = chunks
    assert first.choices[0].delta.role == "assistant" and not first.choices[0].delta.content
    assert all(c.choices[0].finish_reason is None and c.choices[0].delta.content for c in middle)
    assert "".join(c.choices[0].delta.content for c in middle) == whole.choices[0].message.content
    assert finish.choices[0].finish_reason == "length" == whole.choices[0].finish_reason
    assert finish.choices[0].delta.content is None and finish.choices[0].delta.role is None
    assert _figures(finish.model_extra["speculative"]) == _figures(whole.model_extra["speculative"])
    assert usage.choices == [] and usage.usage == whole.usage
    assert all(c.usage is None for c in chunks[:-1])


def test_special_tokens_shown_stream_as_they_come_whole(client: openai.OpenAI, engine: Engine) -> None:
    start = engine.tokenizer.convert_tokens_to_ids("<|im_start|>")
    args = dict(model="tiny", prompt=WORDS, max_tokens=40, temperature=1.0, seed=2,
                logit_bias={str(start): 3.0}, extra_body={"skip_special_tokens": False, "ignore_eos": True})
    whole = client.completions.create(**args)
    assert "<|im_start|>" in whole.choices[0].text
    chunks = list(client.completions.create(**args, stream=True, logprobs=0))
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    # logprobs name each token by the text it adds, special ones included, so they join to the text
    assert "".join(t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens) == \
        whole.choices[0].text
    hidden = client.completions.create(**{**args, "extra_body": {"ignore_eos": True}})
    assert "<|im_start|>" not in hidden.choices[0].text


def test_without_include_usage_no_usage_chunk(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=5, stream=True))
    assert chunks[-1].choices[0].finish_reason is not None and all(c.usage is None for c in chunks)


def _sse(text: str) -> list:
    events = [line.removeprefix("data: ") for line in text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_stream_stops_before_a_stop_string_like_the_whole_answer(url: str, engine: Engine) -> None:
    free = engine.generate(WORDS, SamplingParams(max_tokens=20, ignore_eos=True))[0].text
    # Stops inside a token, across tokens, and at a token's end; each must cut both answers alike.
    for start, size in ((5, 2), (7, 5), (12, 4), (20, 1), (3, 9)):
        stop = free[start:start + size]
        body = {"prompt": WORDS, "max_tokens": 20, "ignore_eos": True, "stop": stop}
        whole = httpx.post(f"{url}/v1/completions", json=body).json()["choices"][0]
        chunks = _sse(httpx.post(f"{url}/v1/completions", json={**body, "stream": True}).text)
        text = "".join(c["choices"][0]["text"] for c in chunks)
        assert text == whole["text"] and stop not in text, stop
        assert sum((c["choices"][0]["token_ids"] for c in chunks), []) == whole["token_ids"]
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop" == whole["finish_reason"]


LONG = {"prompt": WORDS, "max_tokens": 400, "ignore_eos": True}
SHORT = {"prompt": WORDS, "max_tokens": 3, "ignore_eos": True}


def test_a_dropped_stream_stops_its_generation_and_frees_the_engine(url: str, engine: Engine,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    trace = Trace(engine, monkeypatch, step_s=0.05)  # 400 tokens would take >= 80 steps, >= 4 s
    before = httpx.get(f"{url}/metrics").text
    with httpx.stream("POST", f"{url}/v1/completions", json={**LONG, "stream": True}) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        first = next(lines)
        assert first.startswith("data: ")
    received = len(json.loads(first[len("data: "):])["choices"][0]["token_ids"])
    dropped = time.monotonic()
    short = httpx.post(f"{url}/v1/completions", json=SHORT, timeout=30)
    took = time.monotonic() - dropped
    assert short.status_code == 200 and len(short.json()["choices"][0]["token_ids"]) == 3
    closed = trace.wait_for("closed", 400)
    assert closed[2] < 20  # stopped within a few steps of the disconnect, not after 80
    order = [e[:2] for e in trace.events]
    assert order.index(("closed", 400)) < order.index(("start", 3))
    assert took < 3.0  # generous: the short request needs ~0.2 s; the long one would need seconds more
    after = httpx.get(f"{url}/metrics").text
    def delta(name: str, **labels: str) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert delta("vllm:request_success_total", finished_reason="abort") == 1
    # The dropped stream's tokens count, as vLLM counts every step's: its prompt and what it generated.
    assert delta("vllm:prompt_tokens_total") == 2 * short.json()["usage"]["prompt_tokens"]
    assert 3 + received <= delta("vllm:generation_tokens_total") < 3 + 400


def test_a_dropped_plain_request_stops_too(url: str, engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    trace = Trace(engine, monkeypatch, step_s=0.05)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{url}/v1/completions", json=LONG, timeout=0.5)
    assert httpx.post(f"{url}/v1/completions", json=SHORT, timeout=30).status_code == 200
    assert trace.wait_for("closed", 400)[2] < 30
    order = [e[:2] for e in trace.events]
    assert order.index(("closed", 400)) < order.index(("start", 3))


def test_a_dropped_waiting_request_never_runs(url: str, engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    trace = Trace(engine, monkeypatch, step_s=0.05)
    monkeypatch.setattr(engine.scheduler, "max_num_seqs", 1)  # so the second request waits
    with httpx.stream("POST", f"{url}/v1/completions", json={**LONG, "stream": True}) as r:
        lines = r.iter_lines()  # kept: dropping the iterator would close the connection
        next(lines)
        with pytest.raises(httpx.ReadTimeout):  # queued behind the stream, then gone
            httpx.post(f"{url}/v1/completions", json={**SHORT, "max_tokens": 5}, timeout=0.3)
    assert httpx.post(f"{url}/v1/completions", json=SHORT, timeout=30).status_code == 200
    assert [e[:2] for e in trace.events if e[0] == "start"] == [("start", 400), ("start", 3)]
    assert metric(httpx.get(f"{url}/metrics").text, "vllm:num_requests_waiting") == 0


def test_latency_histograms_count_each_request_and_step(url: str, client: openai.OpenAI) -> None:
    before = httpx.get(f"{url}/metrics").text
    chunks = list(client.completions.create(model="tiny", prompt=WORDS, max_tokens=20, stream=True,
                                            extra_body={"ignore_eos": True}))
    after = httpx.get(f"{url}/metrics").text

    def delta(name: str) -> float:
        return metric(after, name) - metric(before, name)

    tokens = sum(len(c.choices[0].model_extra["token_ids"]) for c in chunks)
    assert tokens == 20
    assert delta("vllm:time_to_first_token_seconds_count") == 1
    assert delta("vllm:e2e_request_latency_seconds_count") == 1
    # One observation per engine step after the first; a step commits one token or more.
    assert 1 <= delta("vllm:inter_token_latency_seconds_count") <= tokens - 1
    assert delta("vllm:time_to_first_token_seconds_sum") <= delta("vllm:e2e_request_latency_seconds_sum")
    assert metric(after, "vllm:time_to_first_token_seconds_bucket", le="0.001") >= 0
    assert 'vllm:inter_token_latency_seconds_bucket{engine="0",le="0.01",model_name="tiny"}' in after


def test_a_model_without_tokenizer_streams_token_ids(tiny_llama) -> None:  # noqa: ANN001 - a Path
    from fastapi.testclient import TestClient

    client = TestClient(create_app(make_engine(str(tiny_llama), None, dtype="float32")))
    body = {"prompt": PROMPT_IDS, "max_tokens": 6}
    whole = client.post("/v1/completions", json=body).json()["choices"][0]
    chunks = _sse(client.post("/v1/completions", json={**body, "stream": True}).text)
    assert all(c["choices"][0]["text"] is None for c in chunks)
    assert [t for c in chunks for t in c["choices"][0]["token_ids"]] == whole["token_ids"]
    assert len(chunks) == len(whole["token_ids"])  # plain decoding: one token per step, one chunk each


def test_continuous_usage_counts_each_chunk_and_a_long_prompt_is_truncated(client: openai.OpenAI,
                                                                         engine: Engine) -> None:
    options = {"include_usage": True, "continuous_usage_stats": True}
    chunks = list(client.completions.create(model="tiny", prompt=PROMPT_IDS, max_tokens=12, stream=True,
                                            stream_options=options, extra_body={"ignore_eos": True}))
    *steps, last = chunks
    counts = [c.usage.completion_tokens for c in steps]
    assert counts == list(itertools.accumulate(len(c.choices[0].model_extra["token_ids"]) for c in steps))
    assert all(c.usage.prompt_tokens == len(PROMPT_IDS) for c in chunks) and last.usage.completion_tokens == 12
    plain = list(client.completions.create(model="tiny", prompt=PROMPT_IDS, max_tokens=4, stream=True,
                                           stream_options={"include_usage": True}))
    assert all(c.usage is None for c in plain[:-1])  # usage on the last chunk only, unless asked
    context = engine.target.lm.max_context
    long_prompt = (PROMPT_IDS * context)[:context + 5]
    kept = client.completions.create(model="tiny", prompt=long_prompt, max_tokens=2, echo=True,
                                     extra_body={"truncate_prompt_tokens": 7})
    assert kept.usage.prompt_tokens == 7
    assert kept.choices[0].text.startswith(engine.tokenizer.decode(long_prompt[-7:]))
    most = client.completions.create(model="tiny", prompt=long_prompt, max_tokens=1,
                                     extra_body={"truncate_prompt_tokens": -1})
    assert most.usage.prompt_tokens == context - 1
    with pytest.raises(openai.BadRequestError, match="keeps no room to generate"):
        client.completions.create(model="tiny", prompt=long_prompt, extra_body={"truncate_prompt_tokens": context})
    chat = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=2,
                                          extra_body={"truncate_prompt_tokens": 3})
    assert chat.usage.prompt_tokens == 3
