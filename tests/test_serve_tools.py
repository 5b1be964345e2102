"""Tool calling over HTTP, as the official client does it: a named function and ``required`` are
enforced by structured outputs, ``auto`` is read back by the Hermes parser; streamed or not, the
calls are the same; every bad tool, choice or message is a 400 that names the field."""

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
from specsure.decode.engine import Engine
from specsure.serve import create_app
from specsure.serve.tool_calls import check_parser

TEMPLATE = ("{%- if tools %}<tools>{% for t in tools %}{{ t.function.name }} {% endfor %}</tools>\n{% endif %}"
            "{% for m in messages %}{% if m.role == 'tool' %}<tool_response>{{ m.content }}</tool_response>"
            "{% elif m.tool_calls %}{% for c in m.tool_calls %}<tool_call>"
            "{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}</tool_call>{% endfor %}"
            "{% else %}{{ m.content }}{% endif %}\n{% endfor %}")
"""A Hermes-style template: tools in a header, earlier calls as <tool_call> JSON, results as <tool_response>."""
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                                    "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"]}}}
NOW = {"type": "function", "function": {"name": "now"}}
TOOLS = [WEATHER, NOW]
MESSAGES = [{"role": "user", "content": '{"name": "yes"} What is the weather in Paris?'}]
HERMES_ANSWER = ('Sure\\.\\n<tool_call>\\{"name": "get_weather", "arguments": \\{"city": "Paris", "unit": "c"\\}\\}'
                 "</tool_call>")
"""A regex that makes the tiny model write one Hermes call, so that ``auto`` has one to find."""


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    folder = build_byte_level_model(tmp_path_factory.mktemp("bytes-tools"))
    return make_engine(str(folder), {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1},
                       dtype="float32")


def calls_of(message: Any) -> list[tuple[str, Any]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


def streamed(chunks: Any) -> tuple[str | None, list[tuple[str, Any]], str | None]:
    """Content, calls and finish_reason as a client joins a streamed answer."""
    content, calls, finish = "", {}, None
    for chunk in chunks:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for call in choice.delta.tool_calls or []:
                entry = calls.setdefault(call.index, {"name": "", "arguments": "", "id": None})
                entry["id"] = entry["id"] or call.id
                entry["name"] += call.function.name or ""
                entry["arguments"] += call.function.arguments or ""
            finish = choice.finish_reason or finish
    assert all(e["id"] for e in calls.values())
    return content or None, [(calls[i]["name"], json.loads(calls[i]["arguments"])) for i in sorted(calls)], finish


def test_named_and_required_calls_are_enforced_streamed_or_not(engine: Engine) -> None:
    with serving(create_app(engine, served_model_name="tiny", chat_template=TEMPLATE)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        named = {"type": "function", "function": {"name": "get_weather"}}
        ask = {"model": "tiny", "messages": MESSAGES, "max_tokens": 200, "tools": TOOLS}
        reply = client.chat.completions.create(**ask, tool_choice=named)
        choice = reply.choices[0]
        (name, arguments), = calls_of(choice.message)
        assert name == "get_weather" and list(arguments) == ["city", "unit"] and arguments["unit"] in ("c", "f")
        assert choice.finish_reason == "stop" and choice.message.content is None
        assert streamed(client.chat.completions.create(**ask, tool_choice=named, stream=True)) == \
            (None, calls_of(choice.message), "stop")

        one = client.chat.completions.create(**ask, tool_choice="required", parallel_tool_calls=False)
        (name, arguments), = calls_of(one.choices[0].message)
        assert name in ("get_weather", "now") and one.choices[0].finish_reason == "tool_calls"
        assert arguments == {} if name == "now" else list(arguments) == ["city", "unit"]
        assert streamed(client.chat.completions.create(**ask, tool_choice="required", parallel_tool_calls=False,
                                                       stream=True)) == (None, calls_of(one.choices[0].message),
                                                                         "tool_calls")


def test_an_answer_given_back_as_the_client_dumps_it_continues_the_chat(engine: Engine) -> None:
    # OpenAI's client dumps an answer with refusal, annotations, audio and function_call (null): the
    # usual loop appends message.model_dump() and then the tool's result
    with serving(create_app(engine, served_model_name="tiny", chat_template=TEMPLATE)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        ask = {"model": "tiny", "max_tokens": 200, "tools": TOOLS}
        message = client.chat.completions.create(**ask, messages=MESSAGES, tool_choice="required",
                                                 parallel_tool_calls=False).choices[0].message
        dumped = message.model_dump()
        assert {"refusal", "annotations", "audio", "function_call"} <= set(dumped) and dumped["tool_calls"]
        result = {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "18C"}
        follow = client.chat.completions.create(**ask, messages=[*MESSAGES, dumped, result], tool_choice="none")
        assert follow.choices[0].message.content
    http = TestClient(create_app(engine, served_model_name="tiny", chat_template=TEMPLATE))

    def rendered(*turns: dict) -> list[int]:
        reply = http.post("/tokenize", json={"messages": [*MESSAGES, *turns, {"role": "user", "content": "ok"}]})
        assert reply.status_code == 200, reply.text
        return reply.json()["tokens"]

    # null fields render as nothing; a refusal is the text the model wrote, as a field or a part
    plain = rendered({"role": "assistant", "content": "I can't help with that."})
    assert rendered({"role": "assistant", "content": "I can't help with that.", "refusal": None, "annotations": [],
                     "audio": None, "function_call": None}) == plain
    assert rendered({"role": "assistant", "content": None, "refusal": "I can't help with that."}) == plain
    assert rendered({"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't help with that."}]}) \
        == plain


def test_auto_finds_the_calls_the_model_writes(engine: Engine) -> None:
    app = create_app(engine, served_model_name="tiny", chat_template=TEMPLATE, tool_call_parser="hermes")
    with serving(app) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        ask = {"model": "tiny", "messages": MESSAGES, "max_tokens": 200, "tools": TOOLS,
               "extra_body": {"structured_outputs": {"regex": HERMES_ANSWER}}}
        reply = client.chat.completions.create(**ask)  # tool_choice defaults to auto when tools are given
        message = reply.choices[0].message
        assert message.content == "Sure."
        assert calls_of(message) == [("get_weather", {"city": "Paris", "unit": "c"})]
        assert message.tool_calls[0].id.startswith("chatcmpl-tool-") and message.tool_calls[0].type == "function"
        assert reply.choices[0].finish_reason == "tool_calls"
        assert streamed(client.chat.completions.create(**ask, stream=True)) == \
            ("Sure.", calls_of(message), "tool_calls")
        plain = client.chat.completions.create(**{**ask, "extra_body": {"structured_outputs": {"regex": "Hi there"}}})
        assert plain.choices[0].message.content == "Hi there" and not plain.choices[0].message.tool_calls
        assert plain.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(("parser", "forced"), [
    ("llama3_json", '\\{"name": "get_weather", "parameters": \\{"city": "Oslo", "unit": "f"\\}\\}'),
    ("granite", '<tool_call>\\[\\{"name": "get_weather", "arguments": \\{"city": "Oslo", "unit": "f"\\}\\}\\]')])
def test_auto_reads_json_calls(engine: Engine, parser: str, forced: str) -> None:
    client = TestClient(create_app(engine, served_model_name="tiny", chat_template=TEMPLATE, tool_call_parser=parser))
    body = {"messages": MESSAGES, "max_tokens": 200, "tools": TOOLS, "structured_outputs": {"regex": forced}}
    choice = client.post("/v1/chat/completions", json=body).json()["choices"][0]
    assert choice["message"]["content"] is None and choice["finish_reason"] == "tool_calls"
    call = choice["message"]["tool_calls"][0]["function"]
    assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Oslo", "unit": "f"}


def test_auto_reads_qwen3_coder_calls(engine: Engine) -> None:
    app = create_app(engine, served_model_name="tiny", chat_template=TEMPLATE, tool_call_parser="qwen3_coder")
    client = TestClient(app)
    forced = ("Let me check\\.\\n<tool_call>\\n<function=get_weather>\\n<parameter=city>\\nOslo\\n</parameter>\\n"
              "<parameter=unit>\\nf\\n</parameter>\\n</function>\\n</tool_call>")
    body = {"messages": MESSAGES, "max_tokens": 200, "tools": TOOLS, "structured_outputs": {"regex": forced}}
    choice = client.post("/v1/chat/completions", json=body).json()["choices"][0]
    assert choice["message"]["content"] == "Let me check." and choice["finish_reason"] == "tool_calls"
    call = choice["message"]["tool_calls"][0]["function"]
    assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Oslo", "unit": "f"}


def test_auto_reads_mistral_calls(tmp_path_factory: pytest.TempPathFactory) -> None:
    folder = build_byte_level_model(tmp_path_factory.mktemp("mistral-tags"), added=("[TOOL_CALLS]", "[ARGS]"))
    engine = make_engine(str(folder), None, dtype="float32")
    client = TestClient(create_app(engine, served_model_name="tiny", chat_template=TEMPLATE, tool_call_parser="mistral"))
    forced = 'Sure\\.\\[TOOL_CALLS\\]get_weather\\[ARGS\\]\\{"city": "Oslo", "unit": "f"\\}'
    body = {"messages": MESSAGES, "max_tokens": 200, "tools": TOOLS, "structured_outputs": {"regex": forced}}
    choice = client.post("/v1/chat/completions", json=body).json()["choices"][0]
    assert choice["message"]["content"] == "Sure." and choice["finish_reason"] == "tool_calls"
    call = choice["message"]["tool_calls"][0]
    assert call["function"]["name"] == "get_weather" and len(call["id"]) == 9
    assert json.loads(call["function"]["arguments"]) == {"city": "Oslo", "unit": "f"}
    raw = client.post("/v1/chat/completions", json={**body, "stream": True}).text
    chunks = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: {")]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("content") or "" for d in deltas) == "Sure."
    streamed = [t for d in deltas for t in d.get("tool_calls") or []]
    assert [t["function"]["arguments"] for t in streamed] == [call["function"]["arguments"]]
    special = build_byte_level_model(tmp_path_factory.mktemp("mistral-special"), special=("[TOOL_CALLS]", "[ARGS]"))
    assert check_parser("mistral", make_engine(str(special), None, dtype="float32").tokenizer)


def test_a_conversation_with_calls_and_results_renders(engine: Engine) -> None:
    client = TestClient(create_app(engine, served_model_name="tiny", chat_template=TEMPLATE))
    messages = [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18C"}]
    ids = client.post("/tokenize", json={"messages": messages}).json()["tokens"]
    text = client.post("/detokenize", json={"tokens": ids}).json()["prompt"]
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>' in text
    assert "<tool_response>18C</tool_response>" in text
    with_tools = client.post("/tokenize", json={"messages": messages, "tools": TOOLS}).json()["tokens"]
    assert client.post("/detokenize", json={"tokens": with_tools}).json()["prompt"].startswith("<tools>get_weather now ")
    assert client.post("/tokenize", json={"prompt": "hi", "tools": TOOLS}).json()["error"]["param"] == "tools"
    reply = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 3, "tools": TOOLS,
                                                      "tool_choice": "none"})
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["tool_calls"] == []


BAD = [
    ({"tools": {"get": 1}}, "tools", "must be a list"),
    ({"tools": [{"type": "code_interpreter"}]}, "tools[0]", "function tools are the only kind"),
    ({"tools": [{"type": "function", "function": {"name": "get weather"}}]}, "tools[0].function.name", "letters"),
    ({"tools": [NOW, NOW]}, "tools[1].function.name", "listed twice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "paramters": {}}}]}, "tools[0].function.paramters",
     "Did you mean 'parameters'"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_wether"}}},
     "tool_choice.function.name", "not in tools"),
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tools": TOOLS}, "tool_choice", 'tool_choice "auto" (the default when tools are given) needs'),
    ({"tools": TOOLS, "tool_choice": "auto"}, "tool_choice", 'tool_choice "auto" needs a server started with '
     "--enable-auto-tool-choice"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "none, auto, required"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string", "not": {}}}}],
      "tool_choice": "required"}, "tools[0].function.parameters", "'not'"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format",
     "send one of them"),
    ({"tools": TOOLS, "tool_choice": "none", "parallel_tool_calls": "yes"}, "parallel_tool_calls", "true or false"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "now"}, "x": 1}}, "tool_choice.x",
     "unknown field"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "now", "nmae": 1}}},
     "tool_choice.function.nmae", "unknown field"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {},
                                                                              "required": ["x"]}}}],
      "tool_choice": "required"}, "tools[0].function.parameters", "['x']"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {
        "name": "f", "arguments": "{}", "argumnets": "{}"}}]}]}, "messages[0].tool_calls[0].function.argumnets",
     "Did you mean 'arguments'"),
    ({"messages": [{"role": "user", "content": None}]}, "messages[0].content", "content is null"),
    ({"messages": [{"role": "tool", "content": "18C"}]}, "messages[0].tool_call_id", "answers one call"),
    ({"messages": [{"role": "user", "content": "hi", "tool_calls": []}]}, "messages[0].tool_calls",
     "A user message has"),
    ({"messages": [{"role": "assistant", "content": "hi", "refsual": None}]}, "messages[0].refsual",
     "Did you mean 'refusal'? An assistant message has"),
    ({"messages": [{"role": "assistant", "content": None, "audio": {"id": "a1"}}]}, "messages[0].audio",
     "audio is not supported"),
    ({"messages": [{"role": "assistant", "content": None, "function_call": {"name": "now", "arguments": "{}"}}]},
     "messages[0].function_call", "send it as tool_calls"),
    ({"messages": [{"role": "assistant", "content": None, "refusal": 3}]}, "messages[0].refusal", "string or null"),
    ({"messages": [{"role": "assistant", "content": "hi", "annotations": {}}]}, "messages[0].annotations",
     "list or null"),
    ({"messages": [{"role": "user", "content": [{"type": "refusal", "refusal": "no"}]}]}, "messages[0].content[0]",
     "the part 'refusal'"),  # only an assistant's content has refusal parts
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {
        "name": "f", "arguments": "{city: Paris}"}}]}]}, "messages[0].tool_calls[0].function.arguments", "not JSON"),
]


@pytest.mark.parametrize("body, param, words", BAD)
def test_a_bad_tool_request_is_a_400_that_names_the_field(engine: Engine, body: dict, param: str, words: str) -> None:
    client = TestClient(create_app(engine, served_model_name="tiny", chat_template=TEMPLATE))
    reply = client.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 2, **body})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and words in error["message"], error


def test_auto_is_refused_at_start_where_the_template_cannot_show_the_tools(engine: Engine,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="never mentions tools"):
        create_app(engine, served_model_name="tiny", tool_call_parser="hermes")
    client = TestClient(create_app(engine, served_model_name="tiny"))  # enforced choices need no tools in it
    enforced = client.post("/v1/chat/completions", json={"messages": MESSAGES, "tools": TOOLS, "max_tokens": 200,
                                                         "tool_choice": "required", "parallel_tool_calls": False})
    assert enforced.status_code == 200 and len(enforced.json()["choices"][0]["message"]["tool_calls"]) == 1
    named = {"default": engine.tokenizer.chat_template, "tool_use": TEMPLATE}  # as transformers picks: tool_use
    monkeypatch.setattr(engine.tokenizer, "chat_template", named)
    client = TestClient(create_app(engine, served_model_name="tiny", tool_call_parser="hermes"))
    ids = client.post("/tokenize", json={"messages": MESSAGES, "tools": TOOLS}).json()["tokens"]
    assert client.post("/detokenize", json={"tokens": ids}).json()["prompt"].startswith("<tools>")
    assert client.get("/tokenizer_info").json()["chat_template"] == named


def test_special_tags_are_decoded_for_answers_that_may_call(tmp_path_factory: pytest.TempPathFactory) -> None:
    # Hermes 2 Pro and 3 make <tool_call> a special token, which decoded text would leave out.
    folder = build_byte_level_model(tmp_path_factory.mktemp("special-tags"), special=("<tool_call>", "</tool_call>"))
    engine = make_engine(str(folder), None, dtype="float32")
    assert check_parser("hermes", engine.tokenizer) and not check_parser("llama3_json", engine.tokenizer)
    with pytest.raises(ValueError, match="choose one of granite, hermes, llama3_json, mistral"):
        check_parser("internlm", engine.tokenizer)
    client = TestClient(create_app(engine, served_model_name="tiny", chat_template=TEMPLATE, tool_call_parser="hermes"))
    opening = engine.tokenizer.convert_tokens_to_ids("<tool_call>")
    body = {"messages": MESSAGES, "max_tokens": 3, "tools": TOOLS, "logit_bias": {str(opening): 100}}
    message = client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
    assert message["content"] == "<tool_call>" * 3  # an unfinished call stays as written, its tags shown
    plain = client.post("/v1/chat/completions", json={**body, "tool_choice": "none"}).json()["choices"][0]
    assert plain["message"]["content"] == ""  # no parser reads it, so special tokens stay out, as by default
    refused = client.post("/v1/chat/completions", json={**body, "skip_special_tokens": True})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "skip_special_tokens"


def test_serve_tool_flags_are_checked_before_loading(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--enable-auto-tool-choice", "--port", "0"]) == 2
    assert "--tool-call-parser" in capsys.readouterr().err
    assert main(["serve", "--chat-template", "/no/such/template.jinja", "--port", "0"]) == 2
    assert "neither a file nor a Jinja template" in capsys.readouterr().err
