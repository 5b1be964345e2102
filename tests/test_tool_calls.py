"""Reading calls back from a chat answer's text: whole (``parse_answer``) and streamed in pieces
(``ToolCallStream``), which must agree at every split of the text."""

from __future__ import annotations

import json
from typing import Any

import pytest

from specsure.serve.tool_calls import ToolCallStream, _tag_prefix, parse_answer
from specsure.serve.tools import Function, Tools

WEATHER = Function("get_weather", None, {"type": "object", "properties": {"city": {"type": "string"}}})
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def tools(choice: str = "auto", parallel: bool = True, named: str | None = None) -> Tools:
    return Tools((WEATHER, Function("now", None, None)), choice, named, parallel)  # type: ignore[arg-type]


def joined(stream: ToolCallStream, pieces: list[str]) -> tuple[str | None, list[tuple[str, str]]]:
    """Content and (name, arguments) per call, as a client joins the streamed deltas."""
    content, calls = "", {}
    deltas = [d for i, p in enumerate(pieces) for d in stream.deltas(p, final=i == len(pieces) - 1)]
    for delta in deltas:
        content += delta.get("content", "")
        for call in delta.get("tool_calls", []):
            entry = calls.setdefault(call["index"], ["", ""])
            entry[0] += call.get("function", {}).get("name", "")
            entry[1] += call["function"].get("arguments", "")
    return content or None, [tuple(calls[i]) for i in sorted(calls)]  # type: ignore[misc]


HERMES_CASES = [
    ("just text, no call", "just text, no call", []),
    (f"Sure.\n{CALL}", "Sure.", [("get_weather", '{"city": "Paris"}')]),
    (f"{CALL}\n{CALL}\n", None, [("get_weather", '{"city": "Paris"}')] * 2),
    (f'{CALL}<tool_call>{{"name": "now"}}</tool_call>', None, [("get_weather", '{"city": "Paris"}'), ("now", "{}")]),
    (f"{CALL}\nDone.", "\nDone.", [("get_weather", '{"city": "Paris"}')]),
    (f"Hello {CALL} after", "Hello after", [("get_weather", '{"city": "Paris"}')]),
    (f"Hi {CALL} mid {CALL} end", "Hi mid end", [("get_weather", '{"city": "Paris"}')] * 2),
    ("<tool_call>{not json}</tool_call> after", "<tool_call>{not json}</tool_call> after", []),
    ('<tool_call>{"arguments": {}}</tool_call>', '<tool_call>{"arguments": {}}</tool_call>', []),
    (f'{CALL}<tool_call>{{"name": "now", "argu', '<tool_call>{"name": "now", "argu',
     [("get_weather", '{"city": "Paris"}')]),
    ("a < b and <tool_ but no call", "a < b and <tool_ but no call", []),
    # arguments under a key Hermes does not use: kept as written, not a call whose arguments are dropped
    ('<tool_call>{"name": "get_weather", "parameters": {"city": "Paris"}}</tool_call>',
     '<tool_call>{"name": "get_weather", "parameters": {"city": "Paris"}}</tool_call>', []),
]


LLAMA3_CASES = [
    ("The weather is fine.", "The weather is fine.", []),
    ('{"name": "get_weather", "parameters": {"city": "Paris"}}', None, [("get_weather", '{"city": "Paris"}')]),
    ('<|python_tag|>{"name": "now", "arguments": {}}; {"name": "get_weather", "parameters": {"city": "Oslo"}}', None,
     [("now", "{}"), ("get_weather", '{"city": "Oslo"}')]),
    ('  {"answer": 42}', '{"answer": 42}', []),  # JSON that is no call is the content
    ('{"name": "now", "parameters": {}} and then text', "and then text", [("now", "{}")]),
    ('{"name": "now", "param', '{"name": "now", "param', []),  # cut short: as written
    ("<|python", "<|python", []),
    ('{"name": "Alice", "age": 3}', '{"name": "Alice", "age": 3}', []),  # an answer with a name is no call
    ('{"name": "now", "parameters": {"a": 1}, "arguments": {"b": 2}}',  # which? neither: as written
     '{"name": "now", "parameters": {"a": 1}, "arguments": {"b": 2}}', []),
    ('{"type": "function", "name": "now", "parameters": {}}', None, [("now", "{}")]),
]


PYTHONIC_CASES = [
    ("Sunny, 20 degrees.", "Sunny, 20 degrees.", []),
    ('[get_weather(city="Oslo", days=3), now()]', None, [("get_weather", '{"city": "Oslo", "days": 3}'),
                                                         ("now", "{}")]),
    (' [get_weather(city=\'Lima\', tags=["a", None, True])]', None,
     [("get_weather", '{"city": "Lima", "tags": ["a", null, true]}')]),
    ("[1] A footnote.", "[1] A footnote.", []),
    ("[get_weather(city=input())]", "[get_weather(city=input())]", []),  # not a literal: never evaluated
    ('[get_weather("Oslo")]', '[get_weather("Oslo")]', []),  # positional arguments have no names
    ('[get_weather(city="Os', '[get_weather(city="Os', []),
]


TAGGED = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
QWEN3_CODER_CASES = [
    ("No call here.", "No call here.", []),
    (f"Checking.\n{TAGGED}", "Checking.", [("get_weather", '{"city": "Paris"}')]),
    (f"{TAGGED}\n<tool_call>\n<function=now>\n</function>\n</tool_call>", None,
     [("get_weather", '{"city": "Paris"}'), ("now", "{}")]),
    # Values are text unless the schema types them; an unlisted function's are all text.
    ("<tool_call><function=get_weather><parameter=city>\n 2 cities \n</parameter>"
     "<parameter=extra>\n3\n</parameter></function></tool_call>", None,
     [("get_weather", '{"city": " 2 cities ", "extra": "3"}')]),
    ('<tool_call>{"name": "now"}</tool_call>', '<tool_call>{"name": "now"}</tool_call>', []),  # JSON: not this format
    (f"{TAGGED[:40]}", TAGGED[:40], []),  # cut short: as written
    # Code may hold the tags: only a </parameter> before the next parameter (or the end) closes a value,
    # and only a </tool_call> after </function> closes the call.
    ('<tool_call><function=get_weather><parameter=city>\nx("</parameter>", "</tool_call>")\n</parameter>'
     "</function></tool_call>", None, [("get_weather", '{"city": "x(\\"</parameter>\\", \\"</tool_call>\\")"}')]),
    ("<tool_call><function={{ name }}></function></tool_call>", "<tool_call><function={{ name }}></function></tool_call>",
     []),  # a template placeholder is no function's name
]


MISTRAL_CASES = [
    ("Sunny.", "Sunny.", []),
    ('Checking.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "now", "arguments": {}}]',
     "Checking.", [("get_weather", '{"city": "Paris"}'), ("now", "{}")]),
    ('[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}[TOOL_CALLS]now[ARGS]{}', None,
     [("get_weather", '{"city": "Oslo"}'), ("now", "{}")]),  # tokenizer v11's layout
    ('[TOOL_CALLS] {"name": "now", "arguments": "{}"}', None, [("now", "{}")]),  # one object, arguments as text
    # the id Mistral's templates write into earlier calls, which its models then write too: ignored, as vLLM does
    ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abcDEF123"}]', None,
     [("get_weather", '{"city": "Paris"}')]),
    ("See [TOOL_CALLS] nothing", "See [TOOL_CALLS] nothing", []),  # not calls: as written
    ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"ci', '[TOOL_CALLS][{"name": "get_weather", "arguments": {"ci',
     []),  # cut short
    ("A list: [TOOL_C", "A list: [TOOL_C", []),
]

GRANITE_CASES = [
    ("Sunny.", "Sunny.", []),
    ('<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "now", "arguments": {}}]', None,
     [("get_weather", '{"city": "Paris"}'), ("now", "{}")]),
    (' <tool_call> [{"name": "now", "arguments": {}}]', None, [("now", "{}")]),
    ('[{"name": "now", "arguments": {}}]', None, [("now", "{}")]),
    ("[1] A footnote.", "[1] A footnote.", []),
    ('<|tool_call|>[{"name": "now"', '<|tool_call|>[{"name": "now"', []),  # cut short: as written
    ('Text first <|tool_call|>[{"name": "now", "arguments": {}}]',
     'Text first <|tool_call|>[{"name": "now", "arguments": {}}]', []),  # calls only open an answer
]


@pytest.mark.parametrize("parser, text, content, calls", [
    *(("hermes", *case) for case in HERMES_CASES), *(("llama3_json", *case) for case in LLAMA3_CASES),
    *(("pythonic", *case) for case in PYTHONIC_CASES), *(("qwen3_coder", *case) for case in QWEN3_CODER_CASES),
    *(("mistral", *case) for case in MISTRAL_CASES), *(("granite", *case) for case in GRANITE_CASES)])
def test_calls_are_the_same_whole_or_split_anywhere(parser: str, text: str, content: str | None,
                                                    calls: list[tuple[str, str]]) -> None:
    answer = parse_answer(tools(), text, "stop", parser)
    assert (answer.content, [(c.name, c.arguments) for c in answer.tool_calls]) == (content, calls)
    assert answer.finish_reason == ("tool_calls" if calls else "stop")
    for cut in range(len(text) + 1):
        for second in (cut, min(len(text), cut + 3)):
            pieces = [text[:cut], text[cut:second], text[second:]]
            assert joined(ToolCallStream(tools(), parser), pieces) == (content, calls), pieces


def test_parallel_tool_calls_false_keeps_the_first_call() -> None:
    answer = parse_answer(tools(parallel=False), f"{CALL}{CALL}", "stop")
    assert len(answer.tool_calls) == 1 and answer.content is None


def test_required_array_becomes_calls_element_by_element() -> None:
    text = '[{"name": "get_weather", "parameters": {"city": "Oslo"}}, {"name": "now", "parameters": {}}]'
    expected = [("get_weather", '{"city": "Oslo"}'), ("now", "{}")]
    answer = parse_answer(tools("required"), text, "stop")
    assert (answer.content, [(c.name, c.arguments) for c in answer.tool_calls]) == (None, expected)
    assert answer.finish_reason == "tool_calls"
    seen: list[int] = []
    stream = ToolCallStream(tools("required"))
    for i, ch in enumerate(text):  # one character at a time: each call comes once its object has closed
        for delta in stream.deltas(ch, final=i == len(text) - 1):
            seen += [c["index"] for c in delta.get("tool_calls", [])]
            if c := delta.get("tool_calls"):
                assert json.loads(text[: i + 1].rstrip("]") + "]")[c[0]["index"]]["name"] == c[0]["function"]["name"]
    assert seen == [0, 1]
    for cut in range(len(text) + 1):
        assert joined(ToolCallStream(tools("required")), [text[:cut], text[cut:]]) == (None, expected)


def test_a_required_answer_cut_short_keeps_its_text() -> None:
    text = '[{"name": "get_weather", "parameters": {"ci'
    answer = parse_answer(tools("required"), text, "length")
    assert answer.tool_calls == [] and answer.content == text and answer.finish_reason == "length"


def test_a_named_call_streams_its_arguments() -> None:
    text = '{"city": "Rome"}'
    answer = parse_answer(tools("named", named="get_weather"), text, "stop")
    assert answer.content is None and answer.finish_reason == "stop"
    assert [(c.name, c.arguments) for c in answer.tool_calls] == [("get_weather", text)]
    stream = ToolCallStream(tools("named", named="get_weather"))
    deltas: list[dict[str, Any]] = [*stream.deltas('{"ci'), *stream.deltas('ty": "Rome"}'), *stream.deltas("", True)]
    assert deltas[0]["tool_calls"][0]["function"]["name"] == "get_weather" and "id" in deltas[0]["tool_calls"][0]
    assert "".join(d["tool_calls"][0]["function"]["arguments"] for d in deltas) == text


def test_the_arguments_are_always_an_object() -> None:
    assert Function("f", None, None).arguments_schema() == Function("f", None, {"type": "object", "properties": {}})\
        .arguments_schema() == {"type": "object", "properties": {}, "additionalProperties": False}  # takes none
    assert Function("f", None, {}).arguments_schema() == {"type": "object"}  # any object, never a bare value


def test_tag_prefix_holds_back_only_what_can_start_the_tag() -> None:
    assert _tag_prefix("text <tool", "<tool_call>") == 5
    assert _tag_prefix("text <", "<tool_call>") == 1
    assert _tag_prefix("text <tx", "<tool_call>") == 0


def test_tagged_values_take_their_schemas_types() -> None:
    schema = {"type": "object", "properties": {
        "n": {"type": "integer"}, "x": {"type": "number"}, "ok": {"type": "boolean"}, "tags": {"type": "array"},
        "opt": {"anyOf": [{"type": "integer"}, {"type": "null"}]}, "name": {"type": ["string", "null"]},
        "m": {"type": "object"}, "bad": {"type": "integer"}, "maybe": {"type": "boolean"},
        "deep": {"type": "array"}}}
    offered = Tools((Function("f", None, schema),), "auto")
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in [
        ("n", "3"), ("x", "2.50"), ("ok", "True"), ("tags", "['a', \"b\"]"), ("opt", "None"), ("name", "null"),
        ("m", "{1, 2}"), ("bad", "three"), ("maybe", "perhaps"), ("deep", "[" * 5000 + "]" * 5000)])
    answer = parse_answer(offered, f"<tool_call>\n<function=f>\n{body}</function>\n</tool_call>", "stop",
                          "qwen3_coder")
    (call,) = answer.tool_calls
    # A set is no JSON value, and neither "three" nor "perhaps" is its type: each stays as written.
    assert json.loads(call.arguments) == {"n": 3, "x": 2.5, "ok": True, "tags": ["a", "b"], "opt": None,
                                          "name": None, "m": "{1, 2}", "bad": "three", "maybe": "perhaps",
                                          "deep": "[" * 5000 + "]" * 5000}  # nested past Python's stack: text


def test_mistral_calls_have_the_ids_its_templates_take() -> None:
    answer = parse_answer(tools(), '[TOOL_CALLS]now[ARGS]{}[TOOL_CALLS]now[ARGS]{}', "stop", "mistral")
    ids = [call.id for call in answer.tool_calls]
    assert len(set(ids)) == 2 and all(len(i) == 9 and i.isalnum() and i.isascii() for i in ids)
