"""A reasoning model over HTTP (``--reasoning-parser``): the thinking comes back as ``reasoning``,
the answer as ``content``, streamed or not alike; structured outputs and tool calls apply after
the thinking; a prompt that closed the thinking, or ``enable_thinking: false``, gives content only."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from fastapi.testclient import TestClient

from grammar_model import build_byte_level_model
from serving import serving
from specsure import make_engine
from specsure.cli.main import main
from specsure.cli.serve import REASONING_PARSERS
from specsure.decode.engine import Engine
from specsure.serve import create_app
from specsure.serve.reasoning import PARSERS, check_reasoning_parser

OPENS = "{% for m in messages %}{{ m['content'] }}{% endfor %}<think>\n"
"""A DeepSeek-R1-style template: the prompt opens the thinking; the model closes it."""
SHOWS = ("{% for m in messages %}{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}"
         "{{ m['content'] }}{% endfor %}{% if enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}")
"""A Qwen3-style template: earlier thinking shown, and with enable_thinking false the prompt closes it."""
MESSAGES = [{"role": "user", "content": "Say yes."}]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    folder = build_byte_level_model(tmp_path_factory.mktemp("bytes-think"), added=("<think>", "</think>"))
    return make_engine(str(folder), {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1},
                       dtype="float32")


def ids(engine: Engine, text: str) -> list[int]:
    return [engine.tokenizer.convert_tokens_to_ids(t) for t in text]


def joined(chunks: Any) -> tuple[str | None, str | None, str | None]:
    """(reasoning, content, finish_reason) as a client joins a streamed answer."""
    reasoning, content, finish = "", "", None
    for chunk in chunks:
        for choice in chunk.choices:
            reasoning += getattr(choice.delta, "reasoning", None) or ""
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
    return reasoning or None, content or None, finish


def test_the_thinking_is_reasoning_and_the_constraint_applies_after_it(engine: Engine) -> None:
    end = engine.tokenizer.convert_tokens_to_ids("</think>")
    with serving(create_app(engine, served_model_name="tiny", chat_template=OPENS,
                            reasoning_parser="deepseek_r1")) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        thought = []
        for seed in range(6):
            # Sampled among a few letters and </think>: the thinking is free, then the answer must be "yes".
            ask = {"model": "tiny", "messages": MESSAGES, "max_tokens": 40, "temperature": 1.0, "seed": seed,
                   "extra_body": {"structured_outputs": {"regex": "yes"}, "allowed_token_ids": [0, end, *ids(engine, "yesab")]},
                   "logit_bias": {str(end): 2}}
            reply = client.chat.completions.create(**ask)
            message = reply.choices[0].message
            assert message.content == "yes" and reply.choices[0].finish_reason == "stop"
            reasoning = getattr(message, "reasoning", None)
            assert reasoning is None or set(reasoning) <= set("yesab")
            thought.append(reasoning)
            # One token per letter (the allowed ids are single letters), then </think>.
            assert reply.usage.completion_tokens_details.reasoning_tokens == len(reasoning or "") + 1
            # A client joining the deltas of an empty thinking has nothing; the whole message says "".
            assert joined(client.chat.completions.create(**ask, stream=True)) == (reasoning or None, "yes", "stop")
        assert any(thought), "some seed should think before it answers"


def test_an_answer_that_never_closes_its_thinking_is_all_reasoning(engine: Engine) -> None:
    plain = TestClient(create_app(engine, served_model_name="tiny", chat_template=OPENS))
    client = TestClient(create_app(engine, served_model_name="tiny", chat_template=OPENS, reasoning_parser="qwen3"))
    body = {"messages": MESSAGES, "max_tokens": 12}
    text = plain.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]
    assert "</think>" not in text
    whole = client.post("/v1/chat/completions", json=body).json()
    reply = whole["choices"][0]
    assert reply["message"] == {"role": "assistant", "content": None, "reasoning": text}
    assert reply["finish_reason"] == "length"
    assert whole["usage"]["completion_tokens_details"] == {"reasoning_tokens": 12}  # every token thought
    logged = client.post("/v1/chat/completions", json={**body, "include_reasoning": False, "logprobs": True}).json()
    assert logged["choices"][0]["logprobs"] is None  # the thinking's tokens would show what was hidden
    hidden = client.post("/v1/chat/completions", json={**body, "include_reasoning": False}).json()
    assert hidden["choices"][0]["message"] == {"role": "assistant", "content": None, "reasoning": None}
    # A named call waits for the answer: none here, as the answer never came.
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    called = client.post("/v1/chat/completions", json={**body, "tools": [weather], "tool_choice": {
        "type": "function", "function": {"name": "get_weather"}}}).json()["choices"][0]
    assert called["message"]["tool_calls"] == [] and called["message"]["content"] is None
    assert called["message"]["reasoning"] == text  # the constraint starts after the thinking, so it is free


def test_no_thinking_when_the_prompt_closed_it_or_the_request_turned_it_off(engine: Engine) -> None:
    plain = TestClient(create_app(engine, served_model_name="tiny", chat_template=SHOWS))
    client = TestClient(create_app(engine, served_model_name="tiny", chat_template=SHOWS, reasoning_parser="qwen3"))
    off = {"messages": MESSAGES, "max_tokens": 12, "chat_template_kwargs": {"enable_thinking": False}}
    text = plain.post("/v1/chat/completions", json=off).json()["choices"][0]["message"]["content"]
    whole = client.post("/v1/chat/completions", json=off).json()
    assert whole["choices"][0]["message"] == {"role": "assistant", "content": text, "reasoning": None}
    assert whole["usage"]["completion_tokens_details"] == {"reasoning_tokens": 0}
    # deepseek_r1 has no switch, but the prompt the template wrote ends the thinking.
    r1 = TestClient(create_app(engine, served_model_name="tiny", chat_template=SHOWS, reasoning_parser="deepseek_r1"))
    assert r1.post("/v1/chat/completions", json=off).json()["choices"][0]["message"]["content"] == text


def test_earlier_thinking_and_template_variables_reach_the_template(engine: Engine) -> None:
    client = TestClient(create_app(engine, served_model_name="tiny", chat_template=SHOWS, reasoning_parser="qwen3"))
    turns = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "reasoning": "t"},
             {"role": "user", "content": "c"}]
    tokens = client.post("/tokenize", json={"messages": turns, "chat_template_kwargs": {"enable_thinking": False}})
    assert engine.tokenizer.decode(tokens.json()["tokens"]) == "a<think>t</think>bc<think>\n\n</think>\n\n"
    older = [*turns[:1], {"role": "assistant", "content": "b", "reasoning_content": "t"}, turns[2]]
    assert client.post("/tokenize", json={"messages": older}).json()["tokens"] == \
        client.post("/tokenize", json={"messages": turns}).json()["tokens"]


@pytest.mark.parametrize("body, param, words", [
    ({"chat_template_kwargs": ["enable_thinking"]}, "chat_template_kwargs", "must be an object"),
    ({"chat_template_kwargs": {"tools": []}}, "chat_template_kwargs.tools", "send it as the request's tools"),
    ({"chat_template_kwargs": {"add_generation_prompt": False}}, "chat_template_kwargs.add_generation_prompt",
     "set by the server"),
    ({"chat_template_kwargs": {"sanitize_control_tokens": False}}, "chat_template_kwargs.sanitize_control_tokens",
     "set by the server"),
    ({"chat_template_kwargs": {"add_special_tokens": True}}, "chat_template_kwargs.add_special_tokens",
     "set by the server"),
    ({"include_reasoning": "no"}, "include_reasoning", "true or false"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "reasoning": "x",
                                                      "reasoning_content": "y"}]}, "messages[1].reasoning",
     "send one of them"),
    ({"messages": [{"role": "user", "content": "a", "reasoning": "x"}]}, "messages[0].reasoning", "unknown field"),
])
def test_a_bad_reasoning_request_is_a_400_that_names_the_field(engine: Engine, body: dict, param: str,
                                                               words: str) -> None:
    client = TestClient(create_app(engine, served_model_name="tiny", chat_template=OPENS, reasoning_parser="qwen3"))
    reply = client.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 2, **body})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and words in error["message"]


def test_a_parser_whose_tags_decoding_hides_is_refused(engine: Engine) -> None:
    class Hides:
        def encode(self, text: str, add_special_tokens: bool) -> list[int]:
            return [7]

        def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
            return ""

    with pytest.raises(ValueError, match="special token"):
        check_reasoning_parser("qwen3", Hides())
    with pytest.raises(ValueError, match="choose one of deepseek_r1, qwen3"):
        create_app(engine, reasoning_parser="qwq")


def test_a_template_that_never_thinks_is_warned_of(engine: Engine, caplog: pytest.LogCaptureFixture) -> None:
    create_app(engine, chat_template=OPENS, reasoning_parser="qwen3")
    assert not caplog.records
    create_app(engine, chat_template="{{ messages[0]['content'] }}", reasoning_parser="qwen3")
    assert "never mentions <think>" in caplog.text and "null content" in caplog.text


def test_the_cli_offers_the_parsers(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--reasoning-parser", "granite"])
    err = capsys.readouterr().err
    assert "--reasoning-parser: invalid choice: 'granite'" in err and "deepseek_r1" in err and "qwen3" in err
    assert REASONING_PARSERS == PARSERS  # the CLI keeps its own copy, so --help needs no server imports


def test_a_prefilled_reply_continues_inside_or_after_its_thinking(engine: Engine) -> None:
    client = TestClient(create_app(engine, served_model_name="tiny", chat_template=SHOWS, reasoning_parser="qwen3"))
    plain = TestClient(create_app(engine, served_model_name="tiny", chat_template=SHOWS))
    past = {"messages": [*MESSAGES, {"role": "assistant", "content": "Yes, ", "reasoning": "easy"}],
            "add_generation_prompt": False, "continue_final_message": True, "max_tokens": 6}
    text = plain.post("/v1/chat/completions", json=past).json()["choices"][0]["message"]["content"]
    assert client.post("/v1/chat/completions", json=past).json()["choices"][0]["message"] == \
        {"role": "assistant", "content": text, "reasoning": None}
    inside = {**past, "messages": [*MESSAGES, {"role": "assistant", "content": "<think>Let me see, "}]}
    text = plain.post("/v1/chat/completions", json=inside).json()["choices"][0]["message"]["content"]
    assert "</think>" not in text
    assert client.post("/v1/chat/completions", json=inside).json()["choices"][0]["message"] == \
        {"role": "assistant", "content": None, "reasoning": text}


def test_the_prompts_tags_outrank_the_switch_and_odd_variables_are_the_clients_400(engine: Engine) -> None:
    # QwQ-style: the template opens the thinking whatever enable_thinking says; the prompt decides.
    client = TestClient(create_app(engine, served_model_name="tiny", chat_template=OPENS, reasoning_parser="qwen3"))
    off = {"messages": MESSAGES, "max_tokens": 6, "chat_template_kwargs": {"enable_thinking": False}}
    message = client.post("/v1/chat/completions", json=off).json()["choices"][0]["message"]
    assert message["content"] is None and message["reasoning"]
    arithmetic = TestClient(create_app(engine, served_model_name="tiny", reasoning_parser="qwen3",
                                       chat_template="{{ messages[0]['content'] }}{{ x + 1 }}<think>\n"))
    for route in ("/v1/chat/completions", "/tokenize"):
        reply = arithmetic.post(route, json={"messages": MESSAGES, "chat_template_kwargs": {"x": "a"}})
        assert reply.status_code == 400 and reply.json()["error"]["param"] == "chat_template_kwargs", reply.text
    # A named call under a prompt that closed the thinking: the empty answer is one empty call, streamed or not.
    closed = TestClient(create_app(engine, served_model_name="tiny", chat_template=SHOWS, reasoning_parser="qwen3"))
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    named = {**off, "allowed_token_ids": [0], "tools": [tool], "tool_choice": {"type": "function", "function": {"name": "f"}}}
    whole = closed.post("/v1/chat/completions", json=named).json()["choices"][0]["message"]["tool_calls"]
    events = closed.post("/v1/chat/completions", json={**named, "stream": True}).text.split("\n\n")
    streamed = [call for e in events if e.startswith("data: {") for choice in json.loads(e[6:])["choices"]
                for call in choice["delta"].get("tool_calls", [])]
    assert [c["function"]["name"] for c in whole] == [c["function"]["name"] for c in streamed] == ["f"]
