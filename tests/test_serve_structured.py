"""Structured outputs over HTTP: OpenAI's response_format and vLLM's structured_outputs, as the
official client sends them, streamed or not; bad constraints are 400s that name the field."""

from __future__ import annotations

import json
import re

import openai
import pytest
from fastapi.testclient import TestClient

from grammar_model import build_byte_level_model
from serving import serving
from specsure import make_engine
from specsure.decode.engine import Engine
from specsure.serve import create_app

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 5},
                                           "ok": {"type": "boolean"}}, "required": ["name", "ok"]}
PROMPT = '{"name": "yes", "ok": true} {"na'


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    folder = build_byte_level_model(tmp_path_factory.mktemp("bytes-serve"))
    return make_engine(str(folder), {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1},
                       dtype="float32")


def test_the_official_client_gets_json_by_schema_streamed_or_not(engine: Engine) -> None:
    with serving(create_app(engine, served_model_name="tiny")) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
        messages = [{"role": "user", "content": PROMPT}]
        reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=120, response_format=fmt)
        text = reply.choices[0].message.content
        assert reply.choices[0].finish_reason == "stop"
        assert set(json.loads(text)) == {"name", "ok"}
        chunks = client.chat.completions.create(model="tiny", messages=messages, max_tokens=120, response_format=fmt,
                                                stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
        choice = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8,
                                           extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
        assert choice.choices[0].text in ("yes", "no")
        regex = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12,
                                          extra_body={"structured_outputs": {"regex": "[0-9]{3}-[a-z]{2}"}})
        assert re.fullmatch("[0-9]{3}-[a-z]{2}", regex.choices[0].text)
        obj = client.chat.completions.create(model="tiny", messages=messages, max_tokens=40,
                                             response_format={"type": "json_object"})
        content = obj.choices[0].message.content
        assert content.startswith("{") and (obj.choices[0].finish_reason == "length" or
                                            isinstance(json.loads(content), dict))


@pytest.mark.parametrize("body, param, words", [
    ({"response_format": {"type": "xml"}}, "response_format", "json_schema"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", '"schema"'),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "not": {}}}}},
     "response_format.json_schema.schema", "'not'"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "strcit": True}}},
     "response_format.json_schema.strcit", "Did you mean 'strict'"),
    ({"structured_outputs": {"regex": "a(?=b)"}}, "structured_outputs.regex", "(?="),
    ({"structured_outputs": {"grammar": "root ::= x"}}, "structured_outputs.grammar", "never defined"),
    ({"structured_outputs": {"choice": ["a"], "regex": "a"}}, "structured_outputs.choice", "exactly one"),
    ({"structured_outputs": "json"}, "structured_outputs", "must be an object"),
    ({"structured_outputs": {"choice": ["a"]}, "response_format": {"type": "json_object"}}, "structured_outputs",
     "send one of them"),
    ({"structured_outputs": {"choice": ["a"]}, "ignore_eos": True}, "structured_outputs", "drop ignore_eos"),
])
def test_a_bad_constraint_is_a_400_that_names_the_field(engine: Engine, body: dict, param: str, words: str) -> None:
    client = TestClient(create_app(engine, served_model_name="tiny"))
    for route, base in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                        ("/v1/completions", {"prompt": "hi"})):
        reply = client.post(route, json={**base, **body})
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["param"] == param and words in error["message"], error
    assert client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2,
                                                "response_format": {"type": "text"}}).status_code == 200


def test_a_constraint_that_blows_up_while_generating_is_a_400_and_refused_from_then_on(
        engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not a 500 "specsure bug": the client's constraint grew past the automaton's bounds, and a repeat
    would spend the server's seconds again, so it is refused when parsed from then on."""
    import collections

    import specsure.grammar.automaton as automaton_module
    import specsure.grammar.spec as spec_module

    monkeypatch.setattr(automaton_module, "MAX_DFA_STATES", 40)
    monkeypatch.setattr(spec_module, "_FAILED", collections.OrderedDict())  # what this test refuses stays here
    client = TestClient(create_app(engine, served_model_name="tiny"))
    body = {"prompt": "ab", "max_tokens": 80, "temperature": 1.0, "seed": 1,
            "structured_outputs": {"regex": "[ab]*a[ab]{8}"}}  # 2^9 states: the last nine letters matter
    first = client.post("/v1/completions", json=body)
    assert first.status_code == 400, first.text
    assert "passed 40 states" in first.json()["error"]["message"]
    again = client.post("/v1/completions", json=body)
    assert again.status_code == 400 and again.json()["error"]["param"] == "structured_outputs.regex"
    assert "while an earlier request ran" in again.json()["error"]["message"]
    streamed = client.post("/v1/completions", json={**body, "stream": True,
                                                     "structured_outputs": {"regex": "[ab]*b[ab]{8}"}})
    assert streamed.status_code == 200 and "passed 40 states" in streamed.text
    assert "internal_server_error" not in streamed.text
    assert client.post("/v1/completions", json={"prompt": "ab", "max_tokens": 3}).status_code == 200


def test_a_schema_written_inline_may_nest_as_pydantic_writes_one(engine: Engine) -> None:
    """Each inline object takes two levels of the body (properties, the property): eight objects deep
    passed the body's old bound of 16 levels."""
    schema: dict = {"type": "integer"}
    for depth in range(8):
        schema = {"type": "object", "properties": {f"k{depth}": schema}, "required": [f"k{depth}"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "deep", "schema": schema}}
    client = TestClient(create_app(engine, served_model_name="tiny"))
    reply = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": PROMPT}],
                                                      "max_tokens": 4, "response_format": fmt})
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"].startswith("{")
