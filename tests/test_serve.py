"""`specsure serve`: OpenAI routes, errors, API key, vLLM-named metrics, one request at a time.

The fast tests use a tiny random Llama with a word-level tokenizer and a toy chat template
(tests/serving.py), so text prompts, stop strings and chat all run in seconds. One slow test serves the real
default model.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from specsure import SamplingParams, make_engine
from specsure.cli.main import build_parser, main
from specsure.decode.engine import Engine
from serving import metric, CHAT, PROMPT_IDS, WORDS, serving, tiny_chat_engine
from specsure.serve import create_app



@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    return tiny_chat_engine(tmp_path_factory, "tiny-chat")


@pytest.fixture(scope="module")
def client(engine: Engine) -> TestClient:
    return TestClient(create_app(engine, served_model_name="tiny"))


@pytest.fixture(scope="module")
def bare_client(tiny_llama: Path) -> TestClient:
    """A model without tokenizer files: token-id prompts only."""
    return TestClient(create_app(make_engine(str(tiny_llama), None, dtype="float32"), served_model_name="bare"))


def test_completion_greedy_equals_engine_generate(client: TestClient, engine: Engine) -> None:
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    for prompt in (PROMPT_IDS, WORDS):
        expected = engine.generate(prompt, params)[0]
        r = client.post("/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": 24,
                                                 "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["object"] == "text_completion" and body["model"] == "tiny" and body["id"].startswith("cmpl-")
        choice = body["choices"][0]
        assert choice["token_ids"] == expected.token_ids and choice["text"] == expected.text
        assert choice["finish_reason"] == "length" == expected.finish_reason
        assert body["usage"] == {"prompt_tokens": len(expected.prompt_token_ids), "completion_tokens": 24,
                                 "total_tokens": len(expected.prompt_token_ids) + 24,
                                 "prompt_tokens_details": {"cached_tokens": 0}}
        spec = body["speculative"]
        assert spec["method"] == "ngram"
        assert spec["drafts"] == expected.stats.drafts > 0
        assert spec["accepted_per_position"] == expected.stats.accepted_per_position
        assert spec["mean_acceptance_length"] == pytest.approx(1 + spec["accepted_tokens"] / spec["drafts"])


def test_prompt_forms_agree(client: TestClient) -> None:
    def ids(prompt: object) -> list[int]:
        r = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 8})
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["token_ids"]

    assert ids(PROMPT_IDS) == ids([PROMPT_IDS])
    assert ids(WORDS) == ids([WORDS])


def test_stop_string_ends_the_text(client: TestClient, engine: Engine) -> None:
    free = engine.generate(WORDS, SamplingParams(max_tokens=12, ignore_eos=True))[0].text.split()
    stop = free[3]  # a word the model will produce; the text must end just before its first use
    r = client.post("/v1/completions", json={"prompt": WORDS, "max_tokens": 12, "stop": stop, "ignore_eos": True})
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert stop not in choice["text"] and choice["text"].split() == free[: free.index(stop)]


def test_chat_renders_the_template(client: TestClient, engine: Engine) -> None:
    ids = engine.tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True, return_dict=False)
    expected = engine.generate(list(ids), SamplingParams(max_tokens=10))[0]
    r = client.post("/v1/chat/completions", json={"model": "tiny", "messages": CHAT, "max_completion_tokens": 10})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["choices"][0]["message"] == {"role": "assistant", "content": expected.text}
    assert body["choices"][0]["finish_reason"] == expected.finish_reason
    assert body["usage"]["prompt_tokens"] == len(ids)
    parts = [{"role": "system", "content": "w1 w2"},
             {"role": "user", "content": [{"type": "text", "text": WORDS[:12]}, {"type": "text", "text": WORDS[12:]}]}]
    again = client.post("/v1/chat/completions", json={"messages": parts, "max_tokens": 10}).json()
    assert again["choices"][0]["message"]["content"] == expected.text
    parts[0]["role"] = "developer"  # what OpenAI's newer clients send for system instructions
    developer = client.post("/v1/chat/completions", json={"messages": parts, "max_tokens": 10}).json()
    assert developer["choices"][0]["message"]["content"] == expected.text
    # OpenAI's defaults for fields specsure does not implement change nothing
    defaults = {"store": False, "service_tier": "auto", "modalities": ["text"], "audio": None, "reasoning_effort": None,
                "metadata": {"app": "notes"}, "safety_identifier": "u-1", "prompt_cache_key": "notes-v1"}
    same = client.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 10, **defaults})
    assert same.status_code == 200 and same.json()["choices"][0]["message"]["content"] == expected.text


def test_models_shows_effective_config_with_sources(client: TestClient) -> None:
    r = client.get("/v1/models")
    assert r.status_code == 200
    (card,) = r.json()["data"]
    assert card["id"] == "tiny" and card["object"] == "model"
    spec = card["speculative"]
    assert spec["method"] == "ngram"
    fields = spec["fields"]
    assert fields["method"]["value"] == "ngram" and fields["method"]["source"] == "user"
    assert fields["num_speculative_tokens"] == {**fields["num_speculative_tokens"], "value": 4, "source": "user"}
    assert fields["model"]["source"] == "derived" and fields["model"]["value"] is None
    assert all(f["reason"] for f in fields.values())


def test_metrics_count_what_the_responses_report(client: TestClient) -> None:
    before = client.get("/metrics").text
    bodies = [client.post("/v1/completions", json={"prompt": p, "max_tokens": n, "ignore_eos": True}).json()
              for p, n in ((PROMPT_IDS, 20), (WORDS, 7))]
    after = client.get("/metrics").text
    labels = {"model_name": "tiny", "engine": "0"}

    def delta(name: str, **extra: str) -> float:
        return metric(after, name, **labels, **extra) - metric(before, name, **labels, **extra)

    spec = [b["speculative"] for b in bodies]
    assert delta("vllm:spec_decode_num_drafts_total") == sum(s["drafts"] for s in spec) > 0
    assert delta("vllm:spec_decode_num_draft_tokens_total") == sum(s["draft_tokens"] for s in spec)
    assert delta("vllm:spec_decode_num_accepted_tokens_total") == sum(s["accepted_tokens"] for s in spec)
    for pos in range(4):
        expected = sum(s["accepted_per_position"][pos] for s in spec if pos < len(s["accepted_per_position"]))
        assert delta("vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(pos)) == expected
    assert delta("vllm:prompt_tokens_total") == sum(b["usage"]["prompt_tokens"] for b in bodies)
    assert delta("vllm:generation_tokens_total") == 27
    assert delta("vllm:request_success_total", finished_reason="length") == 2
    assert delta("vllm:e2e_request_latency_seconds_count") == 2
    # The per-request series vLLM's dashboards chart: phases that add up to the latency, and sizes.
    for phase in ("queue", "prefill", "decode", "inference"):
        assert delta(f"vllm:request_{phase}_time_seconds_count") == 2
    assert delta("vllm:request_inference_time_seconds_sum") == pytest.approx(
        delta("vllm:request_prefill_time_seconds_sum") + delta("vllm:request_decode_time_seconds_sum"), abs=1e-6)
    assert delta("vllm:request_queue_time_seconds_sum") + delta("vllm:request_inference_time_seconds_sum") \
        <= delta("vllm:e2e_request_latency_seconds_sum") + 1e-6
    assert delta("vllm:request_prompt_tokens_sum") == sum(b["usage"]["prompt_tokens"] for b in bodies)
    assert delta("vllm:request_generation_tokens_sum") == 27 and delta("vllm:request_generation_tokens_count") == 2
    assert metric(after, "vllm:request_generation_tokens_bucket", **labels, le="10.0") - metric(
        before, "vllm:request_generation_tokens_bucket", **labels, le="10.0") == 1  # the 7-token one
    assert "vllm:num_preemptions_total" in after and metric(after, "vllm:num_preemptions_total", **labels) == 0
    assert metric(after, "vllm:kv_cache_usage_perc", **labels) == 0  # idle: no request holds a slot
    # vLLM's request-parameter series: max_tokens as asked, n and the longest choice once per request
    assert (delta("vllm:request_params_max_tokens_sum"), delta("vllm:request_params_max_tokens_count")) == (27, 2)
    assert (delta("vllm:request_params_n_sum"), delta("vllm:request_params_n_count")) == (2, 2)
    assert delta("vllm:request_max_num_generation_tokens_sum") == 27
    assert delta("vllm:request_prefill_kv_computed_tokens_sum") == sum(b["usage"]["prompt_tokens"] for b in bodies)
    assert delta("vllm:prompt_tokens_by_source_total", source="local_compute") == delta("vllm:prompt_tokens_total")
    assert delta("vllm:prompt_tokens_by_source_total", source="local_cache_hit") == 0  # no prefix caching here
    assert delta("vllm:prompt_tokens_cached_total") == 0
    assert delta("vllm:request_num_preemptions_count") == 2 and delta("vllm:request_num_preemptions_sum") == 0
    # each request's decode time over its tokens after the first (19 and 6 of them)
    decode = delta("vllm:request_decode_time_seconds_sum")
    per_token = delta("vllm:request_time_per_output_token_seconds_sum")
    assert decode / 19 - 1e-9 <= per_token <= decode / 6 + 1e-9 and per_token > 0
    assert delta("vllm:request_time_per_output_token_seconds_count") == 2


def test_metrics_count_a_request_of_n_choices_once_for_its_n(client: TestClient) -> None:
    before = client.get("/metrics").text
    body = client.post("/v1/completions", json={"prompt": WORDS, "max_tokens": 6, "n": 3, "temperature": 1.0,
                                                "stop": ["w3"], "seed": 4}).json()
    after = client.get("/metrics").text
    labels = {"model_name": "tiny", "engine": "0"}

    def delta(name: str) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert (delta("vllm:request_params_n_sum"), delta("vllm:request_params_n_count")) == (3, 1)
    assert delta("vllm:request_max_num_generation_tokens_count") == 1
    assert delta("vllm:request_max_num_generation_tokens_sum") == max(
        len(c["token_ids"]) for c in body["choices"])
    assert (delta("vllm:request_params_max_tokens_sum"), delta("vllm:request_params_max_tokens_count")) == (18, 3)
    info = metric(after, "specsure_speculative_config_info", method="ngram", method_source="user",
                  num_speculative_tokens="4", num_speculative_tokens_source="user", running_method="ngram")
    assert info == 1.0
    assert metric(after, "vllm:num_requests_running", **labels) == 0


def test_apps_do_not_share_metrics(engine: Engine) -> None:
    one, two = TestClient(create_app(engine, served_model_name="a")), TestClient(create_app(engine))
    one.post("/v1/completions", json={"prompt": PROMPT_IDS, "max_tokens": 3})
    assert metric(one.get("/metrics").text, "vllm:generation_tokens_total") > 0
    assert metric(two.get("/metrics").text, "vllm:generation_tokens_total") == 0


def test_the_engine_thread_runs_with_the_threads_asked_for(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """`specsure serve` loads on one thread and hands the real count to the engine thread, where
    every forward runs (an OpenMP pool on the loading thread too halved the step rate)."""
    import threading

    import torch

    wanted = 2 if torch.get_num_threads() == 1 else 1  # differs from what the test thread has
    seen: list[tuple[str, int]] = []
    step = engine.scheduler.step

    def recording_step():  # type: ignore[no-untyped-def]
        seen.append((threading.current_thread().name, torch.get_num_threads()))
        return step()

    monkeypatch.setattr(engine.scheduler, "step", recording_step)
    client = TestClient(create_app(engine, threads=wanted))
    assert client.post("/v1/completions", json={"prompt": PROMPT_IDS, "max_tokens": 3}).status_code == 200
    assert seen and all(entry == ("specsure-engine", wanted) for entry in seen)
    with pytest.raises(ValueError, match="threads = 0 must be an int >= 1"):
        create_app(engine, threads=0)


def test_api_key(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    client = TestClient(create_app(engine, api_key="s3cret"))
    body = {"prompt": PROMPT_IDS, "max_tokens": 2}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
        r = client.post("/v1/completions", json=body, headers=headers)
        assert r.status_code == 401
        error = r.json()["error"]
        assert error["code"] == "invalid_api_key" and "Authorization: Bearer" in error["message"]
    assert client.get("/v1/models").status_code == 401
    ok = {"Authorization": "Bearer s3cret"}
    assert client.post("/v1/completions", json=body, headers=ok).status_code == 200
    assert client.get("/v1/models", headers=ok).status_code == 200
    assert client.get("/health").status_code == 200 and client.get("/metrics").status_code == 200
    assert client.head("/health").status_code == 200
    assert client.get("/ping").json() == client.post("/ping").json() == {"status": "ok"}  # vLLM's SageMaker route


BAD_COMPLETIONS = [
    ({"prompt": PROMPT_IDS, "max_token": 5}, "max_token", "Did you mean 'max_tokens'"),
    ({"prompt": PROMPT_IDS, "temprature": 0.5}, "temprature", "Did you mean 'temperature'"),
    ({"prompt": PROMPT_IDS, "temperature": "hot"}, "temperature", '"hot"'),
    ({"prompt": PROMPT_IDS, "temperature": -1}, "temperature", ">= 0"),
    ({"prompt": PROMPT_IDS, "top_p": 0}, "top_p", "(0, 1]"),
    ({"prompt": PROMPT_IDS, "top_k": 1.5}, "top_k", "1.5"),
    ({"prompt": PROMPT_IDS, "max_tokens": 0}, "max_tokens", "max_tokens = 0"),
    ({"prompt": PROMPT_IDS, "max_tokens": "8"}, "max_tokens", '"8"'),
    ({"prompt": PROMPT_IDS, "seed": -(2**63) - 1}, "seed", "-9223372036854775809"),
    ({"prompt": PROMPT_IDS, "stop": [""]}, "stop", "non-empty"),
    ({"prompt": PROMPT_IDS, "n": 17}, "n", "n = 17"),
    ({"prompt": PROMPT_IDS, "n": 0}, "n", "from 1 to 16"),
    ({"prompt": PROMPT_IDS, "logprobs": 21}, "logprobs", "from 0 to 20"),
    ({"prompt": PROMPT_IDS, "logprobs": True}, "logprobs", "= true"),
    ({"prompt": PROMPT_IDS, "model": "gpt-4"}, "model", "'tiny'"),
    ({"prompt": PROMPT_IDS, "stream": "yes"}, "stream", "must be true or false"),
    ({"prompt": PROMPT_IDS, "presence_penalty": 2.5}, "presence_penalty", "must be a number in [-2, 2]; send 0"),
    ({"prompt": PROMPT_IDS, "logit_bias": {"5": 1e3}}, "logit_bias", "must be a number in [-100, 100]"),
    ({"prompt": PROMPT_IDS, "best_of": True}, "best_of", "does not implement"),
    ({"prompt": PROMPT_IDS, "store": False}, "store", "specsure takes 'store' on POST /v1/chat/completions only"),
    ({"max_tokens": 4}, "prompt", "prompt is missing"),
    ({"prompt": ""}, "prompt", "empty string"),
    ({"prompt": []}, "prompt", "empty list"),
    ({"prompt": [[]]}, "prompt", "empty list"),
    ({"prompt": 7}, "prompt", "number"),
    ({"prompt": [1, "w2"]}, "prompt", "\"w2\""),
    ({"prompt": [PROMPT_IDS] * 65}, "prompt", "holds 65 prompts; one request takes at most 64"),
    ({"prompt": [WORDS, ""]}, "prompt", "prompt[1] is an empty string"),
    ({"prompt": [PROMPT_IDS, [3, "x"]]}, "prompt", "prompt[1] holds \"x\""),
    ({"prompt": [1, 5000]}, "prompt", "5000"),
    ({"prompt": [5] * 600}, "prompt", "600 tokens"),
]


@pytest.mark.parametrize("body, param, needle", BAD_COMPLETIONS, ids=[str(b[1]) + ":" + b[2][:14]
                                                                     for b in BAD_COMPLETIONS])
def test_bad_completion_is_a_400_naming_the_field(client: TestClient, body: dict, param: str, needle: str) -> None:
    r = client.post("/v1/completions", json=body)
    assert r.status_code == (404 if param == "model" else 400), r.text  # a model not served: OpenAI's 404
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert param.split(".")[-1] in error["message"] and needle in error["message"], error["message"]


BAD_CHATS = [
    ({"messages": []}, "messages", "messages = [] is not a non-empty list"),
    ({"messages": "hi"}, "messages", "\"hi\""),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role", "\"robot\""),
    ({"messages": [{"role": "user", "contnet": "hi"}]}, "messages[0].contnet", "Did you mean 'content'"),
    ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content", "3"),
    ({"messages": [{"role": "user"}]}, "messages[0].content", "messages[0].content is missing"),
    ({"messages": [{"role": "user", "content": None}]}, "messages[0].content", "messages[0].content is null"),
    ({"messages": CHAT, "max_tokens": 4, "max_completion_tokens": 5}, "max_tokens", "disagree"),
    ({"messages": CHAT, "max_completion_tokens": -1}, "max_completion_tokens", "max_completion_tokens = -1"),
    ({"messages": CHAT, "prompt": "hi"}, "prompt", "takes 'prompt' on POST /v1/completions only"),
    ({"messages": [{"role": "user", "content": "w1 " * 600}]}, "messages", "context is 512 tokens"),
    ({"messages": CHAT, "store": True}, "store", "only null or false is accepted"),
    ({"messages": CHAT, "reasoning_effort": "high"}, "reasoning_effort", "OpenAI field that specsure does not"),
    ({"messages": CHAT, "metadata": {"app": 1}}, "metadata", "at most 16 string values"),
    ({"messages": CHAT, "prompt_cache_key": 7}, "prompt_cache_key", "must be a string"),
    ({"messages": [*CHAT, {"role": "tool", "content": "18", "tool_call_id": "c1"}]}, "messages[2].tool_call_id",
     "no earlier assistant message has tool_calls"),
    ({"messages": [*CHAT, {"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "content": "18", "tool_call_id": "c2"}]}, "messages[3].tool_call_id",
     'answers no call of an earlier assistant message (their ids: c1)'),
]


@pytest.mark.parametrize("body, param, needle", BAD_CHATS, ids=[b[1] for b in BAD_CHATS])
def test_bad_chat_is_a_400_naming_the_field(client: TestClient, body: dict, param: str, needle: str) -> None:
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert needle in error["message"], error["message"]


def test_bad_bodies(client: TestClient) -> None:
    for content in (b"{not json", b"\xff\xfe", b"[1, 2]", b"null"):
        r = client.post("/v1/completions", content=content, headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text
    assert "not valid JSON" in client.post("/v1/completions", content=b"{").json()["error"]["message"]
    missing = client.post("/v1/embeddings", json={})
    assert missing.status_code == 404
    assert missing.json()["error"]["message"].startswith("POST /v1/embeddings: no such route; this server has GET "
                                                         "/v1/models, POST /v1/completions")
    wrong = client.get("/v1/completions")
    assert wrong.status_code == 405 and "GET /v1/completions: that method is not allowed there" in wrong.text


def test_whole_floats_are_read_as_the_integers_they_are(client: TestClient) -> None:
    """JavaScript clients send 4.0 for 4; vLLM's lax validation takes it, and so does specsure. A
    fraction stays an error."""
    ints = client.post("/v1/completions", json={"prompt": PROMPT_IDS, "max_tokens": 4, "n": 1, "seed": 7,
                                                "temperature": 0, "top_k": 5})
    floats = client.post("/v1/completions", json={"prompt": PROMPT_IDS, "max_tokens": 4.0, "n": 1.0, "seed": 7.0,
                                                  "temperature": 0, "top_k": 5.0})
    assert ints.status_code == floats.status_code == 200, floats.text
    assert floats.json()["choices"][0]["text"] == ints.json()["choices"][0]["text"]
    assert floats.json()["usage"]["completion_tokens"] == 4
    for bad in (2.5, 1e30):  # a fraction; a whole float past any integer a field takes (never converted)
        r = client.post("/v1/completions", json={"prompt": PROMPT_IDS, "max_tokens": bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens", r.text


@pytest.mark.parametrize(("body", "param", "message"), [
    ({"max_tokens": True}, "max_tokens", 'max_tokens = true is invalid: it must be an integer >= 1; send the number '
                                         'of new tokens to generate, e.g. "max_tokens": 16.'),
    ({"temperature": "0.5"}, "temperature", 'temperature = "0.5" is invalid'),
    ({"stop": [""]}, "stop", 'stop = [""] is invalid: every stop string must be a non-empty string'),
    ({"seed": -(2**63) - 1}, "seed", "seed = -9223372036854775809 is invalid: it must be null or an integer in "
                                    "[-2^63, 2^64); send null or -1"),
    ({"ignore_eos": "yes"}, "ignore_eos", 'ignore_eos = "yes" is invalid: it must be true or false; send true or false.'),
])
def test_a_bad_sampling_field_is_said_in_the_requests_json(client: TestClient, body, param, message) -> None:  # noqa: ANN001
    r = client.post("/v1/completions", json={"prompt": PROMPT_IDS, **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param
    assert message in r.json()["error"]["message"] and "None" not in r.json()["error"]["message"]


def test_a_top_p_below_float32s_range_samples_the_top_token_not_a_500(client: TestClient) -> None:
    r = client.post("/v1/completions", json={"prompt": PROMPT_IDS, "max_tokens": 4, "temperature": 1.0,
                                             "top_p": 1e-300, "seed": 1})
    greedy = client.post("/v1/completions", json={"prompt": PROMPT_IDS, "max_tokens": 4})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["token_ids"] == greedy.json()["choices"][0]["token_ids"]  # only the top token left


def test_deeply_nested_body_is_a_400(client: TestClient) -> None:
    r = client.post("/v1/completions", content=b"[" * 100_000, headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "nests too deeply" in r.json()["error"]["message"], r.text


def test_a_bug_is_a_500_without_a_traceback(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken():  # noqa: ANN202
        raise RuntimeError("secret internals")

    client = TestClient(create_app(engine), raise_server_exceptions=False)
    monkeypatch.setattr(engine.scheduler, "step", broken)
    r = client.post("/v1/completions", json={"prompt": PROMPT_IDS})
    assert r.status_code == 500
    assert r.json()["error"]["type"] == "internal_server_error" and "RuntimeError" in r.json()["error"]["message"]
    assert "secret internals" not in r.text and "Traceback" not in r.text
    page = client.get("/metrics").text  # counted as vLLM counts a failed request, beside 0 for repetition
    assert metric(page, "vllm:request_success_total", finished_reason="error") == 1
    assert "finished_reason=\"repetition\"" in page


def test_model_without_tokenizer(bare_client: TestClient) -> None:
    ok = bare_client.post("/v1/completions", json={"prompt": PROMPT_IDS, "max_tokens": 3})
    assert ok.status_code == 200 and ok.json()["choices"][0]["text"] is None
    assert len(ok.json()["choices"][0]["token_ids"]) == ok.json()["usage"]["completion_tokens"]
    for path, body, param in (("/v1/completions", {"prompt": "hello"}, "prompt"),
                              ("/v1/completions", {"prompt": PROMPT_IDS, "stop": "x"}, "stop"),
                              ("/v1/chat/completions", {"messages": CHAT}, "messages")):
        r = bare_client.post(path, json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        assert "tokenizer" in r.json()["error"]["message"]
    r = bare_client.post("/v1/completions", json={"prompt": PROMPT_IDS, "stop": "x"})
    assert r.json()["error"]["message"].startswith('stop = ["x"] needs a tokenizer')  # the request's words, in JSON
    assert bare_client.get("/v1/models").json()["data"][0]["speculative"]["method"] is None
    assert metric(bare_client.get("/metrics").text, "specsure_speculative_config_info", method="") == 1.0


def test_concurrent_requests_share_steps_and_the_loop_stays_free(engine: Engine,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    app = create_app(engine)
    widths: list[int] = []
    real = engine.scheduler.step

    def slow_step():  # noqa: ANN202
        updates = real()
        widths.append(len(updates))
        time.sleep(0.3)
        return updates

    monkeypatch.setattr(engine.scheduler, "step", slow_step)

    async def scenario() -> tuple[list[int], float, float]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            async def complete() -> int:
                return (await http.post("/v1/completions", json={"prompt": PROMPT_IDS, "max_tokens": 2,
                                                                 "ignore_eos": True})).status_code

            async def health() -> float:
                await asyncio.sleep(0.05)
                assert (await http.get("/health")).status_code == 200
                return time.perf_counter()

            start = time.perf_counter()
            codes, healthy = await asyncio.gather(asyncio.gather(*(complete() for _ in range(3))), health())
            return codes, healthy - start, time.perf_counter() - start

    codes, health_at, total = asyncio.run(scenario())
    assert codes == [200, 200, 200]
    assert max(widths) == 3  # the three requests ran in the same steps
    # Three requests of two tokens each need two steps or three when run together, six one after another.
    assert len(widths) <= 3 and total < 1.5
    assert health_at < 0.25  # /health answered while the first step was running


def test_serve_flags_default_to_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    args = build_parser().parse_args(["serve"])
    assert (args.host, args.port, args.api_key, args.served_model_name) == ("127.0.0.1", 8000, None, None)
    assert args.model is None and args.speculative_config is None and not args.strict and args.dtype == "auto"
    from specsure.decode.scheduler import DEFAULT_MAX_NUM_BATCHED_TOKENS
    assert args.max_num_batched_tokens == DEFAULT_MAX_NUM_BATCHED_TOKENS  # the CLI's copy of the default agrees
    args = build_parser().parse_args(["serve", "--speculative-config", '{"method": "ngram"}', "--port", "0",
                                      "--api-key", "k", "--served-model-name", "m", "--strict"])
    assert (args.port, args.api_key, args.served_model_name, args.strict) == (0, ["k"], ["m"], True)


def test_serve_config_error_exits_2_before_binding(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--speculative-config", '{"methd": "ngram"}', "--port", "0"]) == 2
    assert "Did you mean 'method'?" in capsys.readouterr().err


@pytest.mark.parametrize(("flag", "env", "wanted"), [
    ("", None, "--api-key is empty"), ("  ", "k", "--api-key is empty"), (" k", None, "starts or ends with whitespace"),
    (None, "", "SPECSURE_API_KEY is empty"), (None, "k\n", "starts or ends with whitespace")])
def test_an_empty_or_padded_api_key_exits_2_before_loading(flag: str | None, env: str | None, wanted: str,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    if env is None:
        monkeypatch.delenv("SPECSURE_API_KEY", raising=False)
    else:
        monkeypatch.setenv("SPECSURE_API_KEY", env)
    args = ["serve", "--model", "/no/such/model", "--port", "0", *(["--api-key", flag] if flag is not None else [])]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert wanted in err and "Traceback" not in err, err


def test_the_api_key_flag_wins_over_the_environment_and_vllms_variable_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """A deployment that passes vLLM its key as VLLM_API_KEY must not come up open on specsure."""
    from specsure.cli.common import api_key_from, api_keys_from

    monkeypatch.setenv("SPECSURE_API_KEY", "from-env")
    monkeypatch.setenv("VLLM_API_KEY", "from-vllm")
    assert api_key_from("given") == "given" and api_key_from(None) == "from-env"
    assert api_keys_from(["k1", "k2"]) == ("k1", "k2")
    monkeypatch.delenv("SPECSURE_API_KEY")
    assert api_keys_from(None) == ("from-vllm",)
    monkeypatch.delenv("VLLM_API_KEY")
    assert api_key_from(None) is None and api_keys_from(None) == ()
    monkeypatch.setenv("VLLM_API_KEY", "")
    with pytest.raises(ValueError, match="VLLM_API_KEY is empty"):
        api_keys_from(None)


def test_any_of_several_keys_opens_the_server(engine: Engine) -> None:
    keyed = TestClient(create_app(engine, served_model_name="tiny", api_key=["k1", "k2"]))
    assert keyed.get("/v1/models").status_code == 401
    assert keyed.get("/v1/models", headers={"Authorization": "Bearer k2"}).status_code == 200
    assert keyed.get("/v1/models", headers={"Authorization": "Bearer k3"}).status_code == 401
    assert keyed.get("/v1/models", headers={"Authorization": "Bearer "}).status_code == 401
    for bad in ("", [], ["k1", ""], [" k1"], ["k1", None]):  # an empty key would open the door to an empty token
        with pytest.raises(ValueError, match="every key must be a non-empty string"):
            create_app(engine, served_model_name="tiny", api_key=bad)


def test_a_repeated_api_key_is_an_error_that_shows_no_key(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:  # argparse's usage error
        main(["serve", "--model", "/no/such/model", "--api-key", "s3cret-A", "--api-key", "s3cret-B"])
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert "--api-key is given twice" in err and "s3cret" not in err


def test_a_negative_max_num_batched_tokens_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--model", "/no/such/model", "--port", "0", "--max-num-batched-tokens", "-1"]) == 2
    assert "--max-num-batched-tokens -1 must be >= 0" in capsys.readouterr().err


@pytest.mark.parametrize("port", ["-1", "65536"])
def test_serve_port_out_of_range_exits_2_before_loading(port: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--model", "/no/such/model", "--port", port]) == 2
    err = capsys.readouterr().err
    assert f"--port {port} is not a TCP port" in err and "Traceback" not in err


def test_uvicorn_serves_on_a_real_socket(engine: Engine) -> None:
    with serving(create_app(engine)) as base:
        assert base.startswith("http://127.0.0.1:")
        r = httpx.post(f"{base}/v1/completions", json={"prompt": PROMPT_IDS, "max_tokens": 3})
        assert r.status_code == 200 and len(r.json()["choices"][0]["token_ids"]) <= 3


@pytest.mark.slow
def test_chat_on_the_default_model(default_model_cache: Path) -> None:
    engine = make_engine(None, {"method": "ngram"}, dtype="float32")
    client = TestClient(create_app(engine))
    messages = [{"role": "user", "content": "Repeat exactly: the quick brown fox jumps over the lazy dog."}]
    r = client.post("/v1/chat/completions", json={"model": "SmolLM2-135M-Instruct", "messages": messages,
                                                  "max_tokens": 24})
    assert r.status_code == 200, r.text
    body = r.json()
    ids = engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert body["choices"][0]["message"]["content"] == engine.generate(list(ids), SamplingParams(max_tokens=24))[0].text
    assert body["speculative"]["method"] == "ngram" and body["speculative"]["drafts"] > 0
    card = client.get("/v1/models").json()["data"][0]
    assert card["id"] == "SmolLM2-135M-Instruct" and card["speculative"]["fields"]["target"]["source"] == "default"


def test_a_port_in_use_is_an_error_before_the_model_loads(capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    import specsure.decode.engine as engine_module

    def no_load(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model loaded before the port was checked")

    monkeypatch.setattr(engine_module, "make_engine", no_load)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["serve", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"--host 127.0.0.1 --port {port}: the address is in use" in err and "Traceback" not in err


def test_cors_is_off_unless_origins_are_allowed(engine: Engine) -> None:
    """vLLM allows any origin; specsure none by default, so a web page cannot use a local model."""
    preflight = {"Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization,content-type"}
    closed = TestClient(create_app(engine, served_model_name="tiny"))
    assert "access-control-allow-origin" not in closed.options("/v1/completions", headers=preflight).headers
    opened = TestClient(create_app(engine, served_model_name="tiny", api_key="k",
                                   allowed_origins=["http://localhost:3000"]))
    answer = opened.options("/v1/completions", headers=preflight)  # a preflight carries no key
    assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == "http://localhost:3000"
    call = opened.post("/v1/completions", json={"prompt": PROMPT_IDS, "max_tokens": 2},
                       headers={"Origin": "http://localhost:3000", "Authorization": "Bearer k"})
    assert call.status_code == 200 and call.headers["access-control-allow-origin"] == "http://localhost:3000"
    other = opened.options("/v1/completions", headers={**preflight, "Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in other.headers
    assert opened.post("/v1/completions", json={"prompt": PROMPT_IDS, "max_tokens": 2}).status_code == 401
    # without CORS a preflight with a key set is what it is without a key: no route answers OPTIONS
    keyed = TestClient(create_app(engine, served_model_name="tiny", api_key="k"))
    assert keyed.options("/v1/completions", headers=preflight).status_code == \
        closed.options("/v1/completions", headers=preflight).status_code == 405


def test_allowed_origins_must_be_a_json_list(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["serve", "--allowed-origins", "*"])
    assert stop.value.code == 2 and "is not a JSON list of origins" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        main(["serve", "--allowed-origins", '["localhost:3000"]'])
    assert stop.value.code == 2 and "is not an origin a browser sends" in capsys.readouterr().err


def test_several_served_names_are_each_accepted_and_answers_carry_the_first(engine: Engine) -> None:
    """vLLM's --served-model-name takes a list: a client may send any of them."""
    client = TestClient(create_app(engine, served_model_name=["tiny", "tiny-alias"]))
    assert [card["id"] for card in client.get("/v1/models").json()["data"]] == ["tiny", "tiny-alias"]
    assert client.get("/v1/models/tiny-alias").json()["id"] == "tiny-alias"
    body = {"model": "tiny-alias", "prompt": WORDS, "max_tokens": 2}
    answer = client.post("/v1/completions", json=body)
    assert answer.status_code == 200 and answer.json()["model"] == "tiny"
    chat = client.post("/v1/chat/completions", json={"model": "tiny-alias", "messages": CHAT, "max_tokens": 2})
    assert chat.status_code == 200 and chat.json()["model"] == "tiny"
    assert client.post("/tokenize", json={"model": "tiny-alias", "prompt": WORDS}).status_code == 200
    missing = client.post("/v1/completions", json={**body, "model": "other"})
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "model"
    assert "this server serves 'tiny' or 'tiny-alias'" in missing.json()["error"]["message"]
    with pytest.raises(ValueError, match="a list of distinct names"):
        create_app(engine, served_model_name=["a", "a"])
    args = build_parser(["serve"]).parse_args(["serve", "--served-model-name", "a", "b"])
    assert args.served_model_name == ["a", "b"]


def test_each_choice_names_its_stop_reason_as_vllm_does(client: TestClient) -> None:
    """The stop string or stop token id that ended a choice, None for length (and EOS), on both
    endpoints, streamed (on every chunk, set on the last) and not."""
    free = client.post("/v1/completions", json={"prompt": WORDS, "max_tokens": 8, "ignore_eos": True}).json()
    ids, text = free["choices"][0]["token_ids"], free["choices"][0]["text"]
    assert free["choices"][0]["stop_reason"] is None and free["choices"][0]["finish_reason"] == "length"
    word = text.split()[2]
    by_id = client.post("/v1/completions", json={"prompt": WORDS, "max_tokens": 8, "ignore_eos": True,
                                                 "stop_token_ids": [ids[3]]}).json()["choices"][0]
    assert (by_id["finish_reason"], by_id["stop_reason"]) == ("stop", ids[3])
    by_text = client.post("/v1/completions", json={"prompt": WORDS, "max_tokens": 8, "ignore_eos": True,
                                                   "stop": ["never", word]}).json()["choices"][0]
    assert (by_text["finish_reason"], by_text["stop_reason"]) == ("stop", word)
    said = client.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 8, "ignore_eos": True}
                       ).json()["choices"][0]["message"]["content"].split()[1]
    chat = client.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 8, "ignore_eos": True,
                                                     "stop": [said]}).json()["choices"][0]
    assert (chat["finish_reason"], chat["stop_reason"]) == ("stop", said)
    lines = client.post("/v1/completions", json={"prompt": WORDS, "max_tokens": 8, "ignore_eos": True,
                                                 "stop": [word], "stream": True}).text.splitlines()
    chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    reasons = [c["choices"][0]["stop_reason"] for c in chunks if c["choices"]]
    assert reasons[-1] == word and all(r is None for r in reasons[:-1])


def test_vllms_own_fields_at_their_defaults_change_nothing_and_others_say_what_to_use(client: TestClient) -> None:
    plain = client.post("/v1/completions", json={"prompt": WORDS, "max_tokens": 6}).json()["choices"][0]["text"]
    vllm_defaults = {"use_beam_search": False, "length_penalty": 1.0, "spaces_between_special_tokens": True,
                     "priority": 0, "return_token_ids": False, "return_tokens_as_token_ids": False,
                     "add_special_tokens": True}
    same = client.post("/v1/completions", json={"prompt": WORDS, "max_tokens": 6, **vllm_defaults})
    assert same.status_code == 200 and same.json()["choices"][0]["text"] == plain
    chat = client.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 4, "add_special_tokens": False,
                                                     "top_logprobs": 0, "return_tokens_as_token_ids": False})
    assert chat.status_code == 200, chat.text
    for body, words, code in (
            ({"use_beam_search": True}, "a vLLM field that specsure does not implement", "unsupported_field"),
            ({"add_special_tokens": False}, "send the prompt as token ids", "unsupported_field"),
            ({"max_completion_tokens": 3}, "Use max_tokens instead", "unknown_field"),
            ({"guided_json": {"type": "object"}}, 'Use structured_outputs: {"json": SCHEMA} instead', "unknown_field")):
        r = client.post("/v1/completions", json={"prompt": WORDS, "max_tokens": 3, **body})
        error = r.json()["error"]
        assert r.status_code == 400 and words in error["message"] and error["code"] == code, error
        assert "min_tokens" not in error["message"].split("Fields:")[0]


def test_version_and_the_model_card_as_vllm_shapes_them(client: TestClient) -> None:
    import specsure

    assert client.get("/version").json() == {"version": specsure.__version__}
    (card,) = client.get("/v1/models").json()["data"]
    assert {"id", "object", "created", "owned_by", "root", "parent", "max_model_len", "permission"} <= set(card)
    (permission,) = card["permission"]
    assert permission["object"] == "model_permission" and permission["allow_sampling"] is True
    assert client.get("/v1/models/tiny").json()["id"] == "tiny"


def test_stop_reason_names_a_models_other_eos_ids_as_vllm_does() -> None:
    """vLLM makes generation_config's EOS ids other than the tokenizer's stop token ids, so an output they
    end names them; the tokenizer's own EOS gives null."""
    from specsure.decode.request import Rules

    class Words:  # what detokenize reads of a tokenizer
        eos_token_id = 2

        def decode(self, ids, skip_special_tokens=True):  # noqa: ANN001, ANN201
            return " ".join(f"w{i}" for i in ids)

    rules = Rules([2, 5], Words(), 512)
    params = SamplingParams(max_tokens=8, stop_token_ids=[7])
    assert rules.detokenize([9, 2], params, "stop")[3] is None
    assert rules.detokenize([9, 5], params, "stop")[3] == 5
    assert rules.detokenize([9, 7], params, "stop")[3] == 7
    assert rules.detokenize([9, 7], params, "length")[3] is None
    assert Rules([2, 5], None, 512).detokenize([9, 5], params, "stop")[3] is None  # no tokenizer: no primary


def test_generation_defaults_fill_what_a_request_leaves_out_as_vllms_override(engine: Engine) -> None:
    """vLLM and OpenAI sample at temperature 1.0 when a request gives none; specsure decodes greedily
    unless the server is started with defaults, which a request's own value still overrides."""
    from specsure.serve.generation_defaults import check_generation_defaults

    greedy = TestClient(create_app(engine, served_model_name="tiny"))
    sampling = TestClient(create_app(engine, served_model_name="tiny",
                                     generation_defaults={"temperature": 1.0, "top_k": 50}))
    body = {"prompt": WORDS, "max_tokens": 8, "ignore_eos": True, "n": 4, "seed": 11}
    alike = {c["text"] for c in greedy.post("/v1/completions", json=body).json()["choices"]}
    varied = {c["text"] for c in sampling.post("/v1/completions", json=body).json()["choices"]}
    assert len(alike) == 1 and len(varied) > 1
    explicit = sampling.post("/v1/completions", json={**body, "temperature": 0}).json()["choices"]
    assert {c["text"] for c in explicit} == alike  # the request's own value wins
    nulled = sampling.post("/v1/completions", json={**body, "temperature": None}).json()["choices"]
    assert len({c["text"] for c in nulled}) > 1  # null is left out: the default applies
    chat = sampling.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 6, "n": 4, "seed": 3})
    assert chat.status_code == 200 and len({c["message"]["content"] for c in chat.json()["choices"]}) > 1
    for bad, words in (({"max_tokens": 5}, "vLLM's name for it is 'max_new_tokens'"),
                       ({"max_new_tokens": 0}, "max_new_tokens = 0 must be an integer >= 1"),
                       ({"max_new_tokens": 2.5}, "max_new_tokens = 2.5"),
                       ({"temprature": 1}, "Did you mean 'temperature'"), ({"top_p": 0}, "top_p"),
                       ({"presence_penalty": 3}, "presence_penalty")):
        with pytest.raises(ValueError, match=words):
            check_generation_defaults(bad)


def test_max_new_tokens_default_is_chats_max_tokens_and_every_requests_limit_as_in_vllm(engine: Engine) -> None:
    """vLLM 0.33.0: the generation config's max_new_tokens is the fallback of a request that sends no
    max_tokens (chat, Responses; a completion has its own 16) and a cap on every request's."""
    client = TestClient(create_app(engine, served_model_name="tiny", generation_defaults={"max_new_tokens": 5}))
    plain = TestClient(create_app(engine, served_model_name="tiny"))

    def used(reply: httpx.Response) -> int:
        assert reply.status_code == 200, reply.text
        usage = reply.json()["usage"]
        return usage["output_tokens" if "output_tokens" in usage else "completion_tokens"]

    chat = {"messages": CHAT, "ignore_eos": True}
    assert used(client.post("/v1/chat/completions", json=chat)) == 5  # the default, not 512
    assert used(client.post("/v1/chat/completions", json={**chat, "max_tokens": 3})) == 3
    capped = client.post("/v1/chat/completions", json={**chat, "max_completion_tokens": 40})
    assert used(capped) == 5 and capped.json()["choices"][0]["finish_reason"] == "length"
    assert used(plain.post("/v1/chat/completions", json={**chat, "max_tokens": 40})) == 40  # no flag, no cap
    completion = {"prompt": WORDS, "ignore_eos": True}
    assert used(client.post("/v1/completions", json=completion)) == 5  # min(16, 5)
    assert used(client.post("/v1/completions", json={**completion, "max_tokens": 2})) == 2
    assert used(client.post("/v1/responses", json={"input": "hi", "ignore_eos": True})) == 5
    refused = client.post("/v1/completions", json={**completion, "max_tokens": 9, "min_tokens": 7})
    assert refused.status_code == 400 and "limit of 5 new tokens" in refused.json()["error"]["message"]
    assert refused.json()["error"]["param"] == "min_tokens"
    shown = TestClient(create_app(engine, served_model_name="tiny", generation_defaults={"skip_special_tokens": False}))
    start = engine.tokenizer.convert_tokens_to_ids("<|im_start|>")
    special = {**completion, "max_tokens": 40, "temperature": 1.0, "seed": 2, "logit_bias": {str(start): 3.0}}
    assert "<|im_start|>" in shown.post("/v1/completions", json=special).json()["choices"][0]["text"]
    hidden = shown.post("/v1/completions", json={**special, "skip_special_tokens": True}).json()
    assert "<|im_start|>" not in hidden["choices"][0]["text"]  # the request's own value wins


def test_generation_config_auto_takes_the_models_sampling_defaults_as_vllm_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """vLLM's default (--generation-config auto) samples with the model's generation_config.json;
    specsure's ('vllm') does not, and says so when the model carries any."""
    import logging

    import uvicorn

    from serving import build_tiny_chat_model

    folder = build_tiny_chat_model(tmp_path / "m")
    (folder / "generation_config.json").write_text(json.dumps({"temperature": 0.9, "top_k": 50, "max_new_tokens": 5,
                                                               "eos_token_id": 2}))
    apps = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: apps.append(self.config.app))
    body = {"prompt": WORDS, "max_tokens": 8, "ignore_eos": True, "n": 4, "seed": 5}
    with caplog.at_level(logging.WARNING):
        assert main(["serve", "--model", str(folder), "--port", "0", "--dtype", "float32"]) == 0
    # transformers 5's GenerationConfig has no defaults, so vLLM takes top_k 50 too
    assert "generation_config.json sets temperature=0.9, top_k=50, max_new_tokens=5. specsure applies" in caplog.text
    greedy = TestClient(apps[-1]).post("/v1/completions", json=body).json()["choices"]
    assert len({c["text"] for c in greedy}) == 1
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert main(["serve", "--model", str(folder), "--port", "0", "--dtype", "float32",
                     "--generation-config", "auto", "--override-generation-config", '{"top_p": 0.95}']) == 0
    assert "(--generation-config auto): temperature=0.9, top_k=50, max_new_tokens=5" in caplog.text
    assert "specsure applies a model's sampling defaults only" not in caplog.text  # here it does
    auto = TestClient(apps[-1])
    sampled = auto.post("/v1/completions", json=body).json()["choices"]
    assert len({c["text"] for c in sampled}) > 1
    # The model's max_new_tokens is a chat request's default, not a limit (vLLM 0.33.0 under auto).
    chat = {"messages": CHAT, "ignore_eos": True}
    assert auto.post("/v1/chat/completions", json=chat).json()["usage"]["completion_tokens"] == 5
    assert auto.post("/v1/chat/completions", json={**chat, "max_tokens": 9}).json()["usage"]["completion_tokens"] == 9
    assert main(["serve", "--model", str(folder), "--port", "0", "--dtype", "float32",
                 "--generation-config", str(folder)]) == 0  # a folder's max_new_tokens limits too, as in vLLM
    folder_app = TestClient(apps[-1])
    assert folder_app.post("/v1/chat/completions", json={**chat, "max_tokens": 9}).json()["usage"]["completion_tokens"] == 5
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "generation_config.json").write_text(json.dumps({"temperature": -1}))
    assert main(["serve", "--model", str(folder), "--port", "0", "--generation-config", str(other)]) == 2
    assert main(["serve", "--model", str(folder), "--port", "0", "--generation-config", "autp"]) == 2


def test_vllm_fields_at_their_defaults_and_a_request_id_label_are_taken(client: TestClient) -> None:
    body = {"prompt": WORDS, "max_tokens": 3, "bad_words": [], "return_token_offsets": False,
            "return_weight_versions": False, "vllm_xargs": {}, "request_id": "trace-7"}
    done = client.post("/v1/completions", json=body)
    assert done.status_code == 200 and done.json()["id"] == "cmpl-trace-7"  # vLLM's id from the client's
    chat = client.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 3, "echo": False,
                                                     "request_id": "trace-8"})
    assert chat.status_code == 200 and chat.json()["id"] == "chatcmpl-trace-8", chat.text
    lines = client.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 3, "stream": True,
                                                      "request_id": "trace-9"}).text.splitlines()
    ids = {json.loads(line[6:])["id"] for line in lines if line.startswith("data: {")}
    assert ids == {"chatcmpl-trace-9"}
    for bad, param in (({"bad_words": ["w3"]}, "bad_words"), ({"request_id": 7}, "request_id")):
        r = client.post("/v1/completions", json={"prompt": WORDS, "max_tokens": 3, **bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == param
    echo = client.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 3, "echo": True})
    assert echo.status_code == 400 and "a vLLM field" in echo.json()["error"]["message"]


def test_http_series_count_requests_by_handler_method_and_status_class(engine: Engine) -> None:
    """vLLM's instrumentator series, which 5xx-rate alerts and per-handler latency panels read."""
    client = TestClient(create_app(engine, served_model_name="tiny"))
    client.post("/v1/completions", json={"prompt": WORDS, "max_tokens": 2})
    client.post("/v1/completions", json={"prompt": WORDS, "max_tokens": 0})  # a 400
    client.get("/v1/models/tiny")
    client.get("/no/such/route")
    client.get("/health")
    client.get("/v1/completions")  # a 405: named by its route, as the instrumentator names it
    client.request("MADEUP1", "/v1/models")
    client.request("MADEUP2", "/v1/models")  # made-up methods add no series
    page = client.get("/metrics").text
    assert metric(page, "http_requests_total", method="POST", status="2xx", handler="/v1/completions") == 1
    assert metric(page, "http_requests_total", method="POST", status="4xx", handler="/v1/completions") == 1
    assert metric(page, "http_requests_total", method="GET", status="2xx", handler="/v1/models/{model_id:path}") == 1
    assert metric(page, "http_requests_total", method="GET", status="4xx", handler="none") == 1
    assert 'handler="/health"' not in page and 'handler="/metrics"' not in page  # as vLLM leaves them out
    assert metric(page, "http_request_duration_seconds_count", method="POST", handler="/v1/completions") == 2
    assert metric(page, "http_requests_total", method="GET", status="4xx", handler="/v1/completions") == 1
    assert metric(page, "http_requests_total", method="other", status="4xx", handler="/v1/models") == 2
    assert "MADEUP" not in page
    assert metric(page, "http_request_duration_highr_seconds_count") == 7
    assert metric(page, "http_response_size_bytes_sum", handler="/v1/completions") > 0


def test_max_model_len_bounds_every_request_and_the_model_card(tmp_path_factory: pytest.TempPathFactory,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """`serve --max-model-len` as vLLM's: the card says it, a request past it is the usual 400, and more than
    the model's own context is refused at start, naming both."""
    from serving import build_tiny_chat_model, NGRAM

    folder = build_tiny_chat_model(tmp_path_factory.mktemp("capped"))
    client = TestClient(create_app(make_engine(str(folder), NGRAM, dtype="float32", max_model_len=24),
                                   served_model_name="capped"))
    (card,) = client.get("/v1/models").json()["data"]
    assert card["max_model_len"] == 24
    r = client.post("/v1/completions", json={"prompt": list(range(5, 25)), "max_tokens": 10})
    assert r.status_code == 400 and "maximum context length is 24 tokens" in r.json()["error"]["message"], r.text
    ok = client.post("/v1/completions", json={"prompt": list(range(5, 25)), "max_tokens": 4})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] <= 4
    # a prompt past the context: vLLM's sentence, which clients (litellm, LangChain) detect an overflow by
    long = client.post("/v1/completions", json={"prompt": list(range(5, 35)), "max_tokens": 1})
    assert long.status_code == 400 and long.json()["error"]["message"].startswith(
        "This model's maximum context length is 24 tokens. However, your request has 30 input tokens."), long.text
    # no max_tokens: the default is lowered to the room (4), below this min_tokens; a 400 naming it, not a 500
    floor = client.post("/v1/completions", json={"prompt": list(range(5, 25)), "min_tokens": 10})
    error = floor.json()["error"]
    assert floor.status_code == 400 and error["param"] == "min_tokens" and "can be at most 4" in error["message"]
    chat = client.post("/v1/chat/completions", json={"messages": CHAT, "min_tokens": 23})
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "min_tokens", chat.text
    context = make_engine(str(folder), None, dtype="float32").target.lm.max_context
    assert main(["serve", "--model", str(folder), "--port", "0", "--max-model-len", str(context + 1)]) == 2
    assert f"max_model_len = {context + 1} exceeds the model's context of {context} tokens" in capsys.readouterr().err
