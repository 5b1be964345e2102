"""OpenAI's Responses API (POST /v1/responses) as the official client uses it: each request
answers what the chat request it amounts to answers, streamed or not alike; stored responses
continue with ``previous_response_id``; function tools, reasoning, structured text and logprobs;
every bad field is a 400 that names it in the Responses API's words."""

from __future__ import annotations

import asyncio
import json
import time
from types import SimpleNamespace
from typing import Any, Iterator

import httpx
import openai
import pytest
from fastapi.testclient import TestClient

from grammar_model import build_byte_level_model
from serving import serving
from specsure import make_engine
from specsure.decode.engine import Engine
from specsure.serve import create_app
from specsure.serve.errors import APIError, RequestError
from specsure.serve.response_input import input_messages
from specsure.serve.response_background import BackgroundResponses
from specsure.serve.response_object import ResponseHead
from specsure.serve.response_store import ResponseStore
from specsure.serve.runner import ClientGone

TEMPLATE = ("{%- if tools %}<tools>{% for t in tools %}{{ t.function.name }} {% endfor %}</tools>\n{% endif %}"
            "{% for m in messages %}{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}"
            "{% if m.role == 'tool' %}<tool_response>{{ m.tool_call_id }}:{{ m.content }}</tool_response>"
            "{% elif m.tool_calls %}{{ m.content }}{% for c in m.tool_calls %}<tool_call>"
            "{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}</tool_call>{% endfor %}"
            "{% else %}{{ m.role[0] }}:{{ m.content }}{% endif %}\n{% endfor %}"
            "{% if reasoning_effort %}effort={{ reasoning_effort }}{% endif %}")
"""Hermes-style tools and calls, each turn's role and thinking shown, and reasoning_effort: the
prompt shows everything a request carried over, so equal prompts mean equal translations."""
THINKS = TEMPLATE + "<think>\n"
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
                          "required": ["city"]}}
AS_CHAT_TOOL = {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
HERMES = ('Sure\\.\\n<tool_call>\\{"name": "get_weather", "arguments": \\{"city": "Paris"\\}\\}</tool_call>')


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    folder = build_byte_level_model(tmp_path_factory.mktemp("bytes-responses"), added=("<think>", "</think>"))
    return make_engine(str(folder), {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1},
                       dtype="float32")


@pytest.fixture(scope="module")
def url(engine: Engine) -> Iterator[str]:
    with serving(create_app(engine, served_model_name="tiny", chat_template=TEMPLATE, tool_call_parser="hermes")) \
            as base:
        yield base


@pytest.fixture(scope="module")
def sdk(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)


def chat(sdk: openai.OpenAI, messages: list[dict[str, Any]], **fields: Any) -> Any:
    return sdk.chat.completions.create(model="tiny", messages=messages, **fields)


def events(url: str, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(event line, data) of each server-sent event of a streamed response."""
    raw = httpx.post(f"{url}/v1/responses", json={**body, "stream": True}, timeout=60)
    assert raw.status_code == 200 and raw.headers["content-type"].startswith("text/event-stream")
    out = []
    for block in raw.text.strip().split("\n\n"):
        head, data = block.split("\n")
        assert head.startswith("event: ") and data.startswith("data: ")
        out.append((head[len("event: "):], json.loads(data[len("data: "):])))
    return out


def test_a_response_answers_what_the_chat_request_answers(sdk: openai.OpenAI) -> None:
    reply = chat(sdk, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}],
                 max_tokens=12)
    response = sdk.responses.create(model="tiny", instructions="Be brief.", input="Hello", max_output_tokens=12)
    assert response.output_text == reply.choices[0].message.content
    assert response.id.startswith("resp_") and response.output[0].id.startswith("msg_")
    assert (response.usage.input_tokens, response.usage.output_tokens) == (reply.usage.prompt_tokens,
                                                                           reply.usage.completion_tokens)
    assert response.usage.total_tokens == reply.usage.total_tokens
    cut = reply.choices[0].finish_reason == "length"
    assert response.status == ("incomplete" if cut else "completed")
    assert (response.incomplete_details.reason if cut else response.incomplete_details) == \
        ("max_output_tokens" if cut else None)
    assert response.max_output_tokens == 12 and response.instructions == "Be brief."
    assert response.model_extra["speculative"]["method"] == "ngram"


def test_a_streamed_response_tells_the_same_object_event_by_event(sdk: openai.OpenAI, url: str) -> None:
    body = {"model": "tiny", "input": "Say yes", "max_output_tokens": 8, "structured_outputs": {"regex": "ye+s"}}
    whole = httpx.post(f"{url}/v1/responses", json=body, timeout=60).json()
    said = events(url, body)
    kinds = [kind for kind, _ in said]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert all(data["type"] == kind for kind, data in said)
    assert [data["sequence_number"] for _, data in said] == list(range(len(said)))
    text = "".join(data["delta"] for kind, data in said if kind == "response.output_text.delta")
    final = said[-1][1]["response"]
    assert text == whole["output"][0]["content"][0]["text"] == final["output"][0]["content"][0]["text"]
    assert final["usage"] == whole["usage"] and final["status"] == whole["status"] == "completed"
    assert said[0][1]["response"]["id"] == final["id"] != whole["id"]
    with sdk.responses.stream(model="tiny", input="Say yes", max_output_tokens=8,
                              extra_body={"structured_outputs": {"regex": "ye+s"}}) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        assert "".join(deltas) == stream.get_final_response().output_text == text


def test_previous_response_id_continues_the_stored_conversation(sdk: openai.OpenAI, url: str) -> None:
    first = sdk.responses.create(model="tiny", instructions="Old rules.", input="Hi", max_output_tokens=6)
    second = sdk.responses.create(model="tiny", instructions="New rules.", input="More", max_output_tokens=6,
                                  previous_response_id=first.id)
    # The first instructions are not carried over (OpenAI's rule); its input and output are.
    reply = chat(sdk, [{"role": "system", "content": "New rules."}, {"role": "user", "content": "Hi"},
                       {"role": "assistant", "content": first.output_text}, {"role": "user", "content": "More"}],
                 max_tokens=6)
    assert second.output_text == reply.choices[0].message.content
    assert second.usage.input_tokens == reply.usage.prompt_tokens
    assert second.previous_response_id == first.id
    assert sdk.responses.retrieve(first.id).output_text == first.output_text
    streamed = events(url, {"input": "Again", "max_output_tokens": 4, "previous_response_id": second.id})
    third = sdk.responses.retrieve(streamed[-1][1]["response"]["id"])  # a streamed response is stored too
    assert third.output_text == streamed[-1][1]["response"]["output"][0]["content"][0]["text"]
    unstored = sdk.responses.create(model="tiny", input="Hi", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError, match="store"):
        sdk.responses.retrieve(unstored.id)
    with pytest.raises(openai.NotFoundError) as caught:
        sdk.responses.create(model="tiny", input="x", previous_response_id=unstored.id)
    assert caught.value.body["param"] == "previous_response_id"
    assert httpx.delete(f"{url}/v1/responses/{first.id}").json() == {"id": first.id, "object": "response",
                                                                      "deleted": True}
    assert httpx.get(f"{url}/v1/responses/{first.id}").status_code == 404


def test_a_function_call_output_must_answer_an_earlier_call(sdk: openai.OpenAI) -> None:
    call = {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Oslo"}'}
    for given, index in (([{"role": "user", "content": "Hi"}, {"type": "function_call_output", "call_id": "c1",
                                                                "output": "Sunny"}], 1),
                         ([call, {"type": "function_call_output", "call_id": "c9", "output": "Sunny"}], 1)):
        with pytest.raises(openai.BadRequestError, match="answers no earlier function_call") as caught:
            sdk.responses.create(model="tiny", input=given, max_output_tokens=4)
        assert caught.value.body["param"] == f"input[{index}].call_id"
    first = sdk.responses.create(model="tiny", input=[{"role": "user", "content": "Hi"}, call], max_output_tokens=2)
    answered = sdk.responses.create(model="tiny", previous_response_id=first.id, max_output_tokens=2,
                                    input=[{"type": "function_call_output", "call_id": "c1", "output": "Sunny"}])
    assert answered.status in ("completed", "incomplete")  # accepted: the call came in the previous turns


def test_input_items_list_the_requests_own_input(sdk: openai.OpenAI, url: str) -> None:
    given = [{"role": "user", "content": "Say hi"}, {"type": "message", "role": "assistant", "content": "Hello",
                                                    "id": "msg_mine"},
             {"role": "user", "content": [{"type": "input_text", "text": "Again"}]},
             {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
             {"type": "function_call_output", "call_id": "c1", "output": "Sunny"}]
    first = sdk.responses.create(model="tiny", input=given, max_output_tokens=4)
    listed = sdk.responses.input_items.list(first.id, order="asc")
    assert [(i.type, getattr(i, "role", None)) for i in listed.data] == [
        ("message", "user"), ("message", "assistant"), ("message", "user"), ("function_call", None),
        ("function_call_output", None)]
    assert listed.data[0].content[0].type == "input_text" and listed.data[0].content[0].text == "Say hi"
    assert listed.data[1].id == "msg_mine" and listed.data[1].content[0].type == "output_text"
    assert listed.data[3].arguments == '{"city": "Oslo"}' and listed.data[4].output == "Sunny"
    assert all(i.id and i.status == "completed" for i in listed.data)
    newest = sdk.responses.input_items.list(first.id)  # OpenAI's default order: newest first
    assert [i.id for i in newest.data] == [i.id for i in reversed(listed.data)]
    # Pages: limit, then after the last one's id.
    page = httpx.get(f"{url}/v1/responses/{first.id}/input_items", params={"order": "asc", "limit": 2}).json()
    assert [i["id"] for i in page["data"]] == [i.id for i in listed.data[:2]] and page["has_more"] is True
    assert page["first_id"] == listed.data[0].id and page["last_id"] == listed.data[1].id
    rest = httpx.get(f"{url}/v1/responses/{first.id}/input_items",
                     params={"order": "asc", "limit": 10, "after": page["last_id"]}).json()
    assert [i["id"] for i in rest["data"]] == [i.id for i in listed.data[2:]] and rest["has_more"] is False
    # A continued response lists its own input only; text input is one user message.
    second = sdk.responses.create(model="tiny", input="More", max_output_tokens=2, previous_response_id=first.id)
    (only,) = sdk.responses.input_items.list(second.id).data
    assert (only.role, only.content[0].type, only.content[0].text) == ("user", "input_text", "More")
    for params, param in (({"order": "sideways"}, "order"), ({"limit": 0}, "limit"), ({"limit": 101}, "limit"),
                          ({"after": "msg_nobody"}, "after")):
        bad = httpx.get(f"{url}/v1/responses/{first.id}/input_items", params=params)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == param, params
    with pytest.raises(openai.NotFoundError):
        sdk.responses.input_items.list("resp_nobody")


def test_truncation_auto_drops_the_oldest_turns_that_do_not_fit(sdk: openai.OpenAI, engine: Engine) -> None:
    context = engine.target.lm.max_context
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "words " * 12}
             for i in range(41)]  # far past the tiny model's context
    with pytest.raises(openai.BadRequestError):
        sdk.responses.create(model="tiny", input=turns, instructions="Be brief.", max_output_tokens=8)
    answer = sdk.responses.create(model="tiny", input=turns, instructions="Be brief.", max_output_tokens=8,
                                  truncation="auto")
    assert answer.truncation == "auto" and answer.usage.input_tokens + 8 <= context
    # The longest run of the newest turns that fits, starting at a user turn, after the instructions:
    # what chat answers for it.
    for kept in range(len(turns), 0, -1):
        if turns[-kept]["role"] != "user":
            continue
        try:
            reply = chat(sdk, [{"role": "system", "content": "Be brief."}, *turns[-kept:]], max_tokens=1)
        except openai.BadRequestError:  # longer than the context
            continue
        if reply.usage.prompt_tokens + 8 <= context:
            break
    assert 1 < kept < len(turns)
    reply = chat(sdk, [{"role": "system", "content": "Be brief."}, *turns[-kept:]], max_tokens=8)
    assert answer.output_text == reply.choices[0].message.content
    assert answer.usage.input_tokens == reply.usage.prompt_tokens
    # The stored conversation keeps every turn: truncation shapes this prompt only.
    assert len(sdk.responses.input_items.list(answer.id, limit=100).data) == len(turns)


def test_a_background_response_is_queued_then_stored_or_cancelled(sdk: openai.OpenAI, url: str) -> None:
    started = sdk.responses.create(model="tiny", input="Hi", max_output_tokens=6, background=True)
    assert started.status == "queued" and started.background is True and started.output == []
    done, deadline = started, time.monotonic() + 60
    while done.status in ("queued", "in_progress") and time.monotonic() < deadline:  # the client's way: poll
        time.sleep(0.01)
        done = sdk.responses.retrieve(started.id)
    foreground = sdk.responses.create(model="tiny", input="Hi", max_output_tokens=6)
    assert done.status == foreground.status and done.output_text == foreground.output_text
    assert done.usage.output_tokens == foreground.usage.output_tokens and done.id == started.id
    follow = sdk.responses.create(model="tiny", input="More", max_output_tokens=2, previous_response_id=done.id)
    assert follow.status in ("completed", "incomplete")
    assert sdk.responses.cancel(done.id).status == done.status  # a cancel crossing the finish gets the end
    with pytest.raises(openai.BadRequestError, match="only a background response can be cancelled"):
        sdk.responses.cancel(follow.id)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.cancel("resp_nobody")


class _StuckRunner:
    """A runner whose job steps once, then waits for its stop signal, as a long answer would."""

    def __init__(self) -> None:
        self.cancelled: list[object] = []
        self.stepped: set[object] = set()

    async def next_update(self, job: object, gone: asyncio.Future[None]) -> SimpleNamespace:
        if job not in self.stepped:
            self.stepped.add(job)
            return SimpleNamespace(completion=None)  # its first step: the response is in progress
        await gone
        raise ClientGone()

    def cancel(self, job: object) -> None:
        self.cancelled.append(job)


def test_a_running_background_response_is_cancelled_and_its_job_dropped() -> None:
    async def scenario() -> None:
        store, runner = ResponseStore(), _StuckRunner()
        background = BackgroundResponses(runner, store)  # type: ignore[arg-type]
        head = ResponseHead("tiny", None, {"background": True})
        request = SimpleNamespace(conversation=[{"role": "user", "content": "Hi"}], input_items=[])
        assert background.start(head, "job", request, lambda c: {})["status"] == "queued"  # type: ignore[arg-type]
        await asyncio.sleep(0)
        assert background.running(head.id) and store.get(head.id).body["status"] == "in_progress"
        with pytest.raises(RequestError, match="still in_progress") as caught:
            store.conversation(head.id)  # previous_response_id waits for the end
        assert caught.value.param == "previous_response_id"
        assert (await background.cancel(head.id))["status"] == "cancelled"
        assert runner.cancelled == ["job"] and not background.running(head.id)
        assert store.get(head.id).body["status"] == "cancelled"
        assert (await background.cancel(head.id))["status"] == "cancelled"  # again: as it ended
        # DELETE stops a running one first, so its later states are not stored after it is gone.
        other = ResponseHead("tiny", None, {"background": True})
        background.start(other, "job 2", request, lambda c: {})  # type: ignore[arg-type]
        await asyncio.sleep(0)
        await background.stop(other.id)
        store.delete(other.id)
        assert runner.cancelled == ["job", "job 2"] and not background.running(other.id)
        with pytest.raises(APIError, match="no stored response"):
            store.get(other.id)

    asyncio.run(scenario())


def test_truncation_cuts_only_where_a_user_turn_starts() -> None:
    from specsure.serve.response_request import truncated

    call = {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u1"},
                {"role": "assistant", "content": None, "tool_calls": [call, {**call, "id": "b"}]},
                {"role": "tool", "tool_call_id": "a", "content": "ra"}, {"role": "tool", "tool_call_id": "b",
                                                                         "content": "rb"},
                {"role": "assistant", "content": "done"}, {"role": "user", "content": "u2"},
                {"role": "assistant", "content": "x"}, {"role": "user", "content": "u3"}]
    renders: list[int] = []

    def fits(limit: int) -> Any:
        return lambda kept: renders.append(len(kept)) or len(kept) <= limit

    for limit, kept in ((9, messages), (8, [messages[0], *messages[6:]]), (4, [messages[0], *messages[6:]]),
                        (2, [messages[0], messages[8]]), (1, [messages[0], messages[8]])):
        got = truncated(messages, fits(limit))
        assert got == kept, limit  # never a tool result without its call; the system message and newest turn stay
    many = [messages[0], *[{"role": r, "content": str(i)} for i in range(400) for r in ("user", "assistant")]]
    renders.clear()
    assert len(truncated(many, fits(101))) == 101
    assert len(renders) <= 10  # bisection: a few renders for 400 turns, not one per turn


def test_input_item_ids_are_unique_and_limits_are_plain_numbers() -> None:
    from specsure.serve.response_items import listed_items, page

    items = listed_items([{"role": "user", "content": "a", "id": "m1"}, {"role": "user", "content": "b", "id": "m1"}])
    assert items[0]["id"] == "m1" and items[1]["id"] not in ("m1", None)  # `after` can page through them
    assert [i["id"] for i in page(items, "m1", "5", "asc")["data"]] == [items[1]["id"]]
    with pytest.raises(RequestError, match="limit"):
        page(items, None, "²", None)  # a digit to str.isdigit, not to int


def test_the_store_keeps_the_newest_responses() -> None:
    store = ResponseStore(2)
    for i in range(3):
        store.put({"id": f"resp_{i}"}, [{"role": "user", "content": str(i)}])
    with pytest.raises(Exception, match="keeps the last 2"):
        store.get("resp_0")
    assert store.conversation("resp_2") == [{"role": "user", "content": "2"}]
    store.delete("resp_1")
    with pytest.raises(Exception, match="resp_1"):
        store.conversation("resp_1")


def test_function_tools_are_called_as_on_the_chat_endpoint(sdk: openai.OpenAI, url: str) -> None:
    named = sdk.responses.create(model="tiny", input="Weather?", tools=[WEATHER],
                                 tool_choice={"type": "function", "name": "get_weather"})
    reply = chat(sdk, [{"role": "user", "content": "Weather?"}], tools=[AS_CHAT_TOOL],
                 tool_choice={"type": "function", "function": {"name": "get_weather"}})
    (call,) = named.output
    assert call.type == "function_call" and call.id.startswith("fc_") and call.name == "get_weather"
    assert call.arguments == reply.choices[0].message.tool_calls[0].function.arguments
    said = events(url, {"input": "Weather?", "tools": [WEATHER], "tool_choice": "required"})
    kinds = [kind for kind, _ in said]
    assert "response.content_part.added" not in kinds  # a call has no content parts
    final = said[-1][1]["response"]
    arguments = "".join(d["delta"] for k, d in said if k == "response.function_call_arguments.delta")
    assert final["output"][0]["arguments"] == arguments and json.loads(arguments)["city"]
    # auto: the Hermes parser finds the call the model writes after its text.
    auto = sdk.responses.create(model="tiny", input="Weather?", tools=[WEATHER], max_output_tokens=200,
                                extra_body={"structured_outputs": {"regex": HERMES}})
    assert [item.type for item in auto.output] == ["message", "function_call"]
    assert auto.output_text == "Sure." and json.loads(auto.output[1].arguments) == {"city": "Paris"}
    # The call and its result go back as items; the prompt is the chat request's with the same turns.
    result = sdk.responses.create(model="tiny", tools=[WEATHER], tool_choice="none", max_output_tokens=5, input=[
        {"role": "user", "content": "Weather?"}, *[item.model_dump(exclude_none=True) for item in auto.output],
        {"type": "function_call_output", "call_id": auto.output[1].call_id, "output": "sunny"}])
    turns = [{"role": "user", "content": "Weather?"},
             {"role": "assistant", "content": "Sure.", "tool_calls": [{"id": auto.output[1].call_id, "type": "function",
                                                                       "function": {"name": "get_weather",
                                                                                    "arguments": auto.output[1].arguments}}]},
             {"role": "tool", "tool_call_id": auto.output[1].call_id, "content": "sunny"}]
    reply = chat(sdk, turns, tools=[AS_CHAT_TOOL], tool_choice="none", max_tokens=5)
    assert result.usage.input_tokens == reply.usage.prompt_tokens
    assert result.output_text == reply.choices[0].message.content


def test_thinking_is_a_reasoning_item(engine: Engine) -> None:
    end = engine.tokenizer.convert_tokens_to_ids("</think>")
    letters = [engine.tokenizer.convert_tokens_to_ids(c) for c in "abyes"]
    with serving(create_app(engine, served_model_name="tiny", chat_template=THINKS,
                            reasoning_parser="deepseek_r1")) as base:
        sdk = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=60)
        seen = 0
        for seed in range(4):
            body = {"model": "tiny", "input": "Say yes.", "max_output_tokens": 30, "temperature": 1.0, "seed": seed,
                    "structured_outputs": {"regex": "yes"}, "allowed_token_ids": [end, *letters],
                    "logit_bias": {str(end): 2}, "reasoning": {"effort": "low"},
                    "include": ["message.output_text.logprobs"]}
            whole = httpx.post(f"{base}/v1/responses", json=body, timeout=60).json()
            *thought, message = whole["output"]  # an empty thinking has no item
            assert message["content"][0]["text"] == "yes" and whole["status"] == "completed"
            reasoning = thought[0]["content"][0]["text"] if thought else ""
            assert all(t["type"] == "reasoning" and t["id"].startswith("rs_") and t["summary"] == [] and reasoning
                       for t in thought)
            # reasoning.effort reaches the template as reasoning_effort, as vLLM hands it over.
            asked = chat(sdk, [{"role": "user", "content": "Say yes."}], max_tokens=1,
                         extra_body={"chat_template_kwargs": {"reasoning_effort": "low"}})
            assert whole["usage"]["input_tokens"] == asked.usage.prompt_tokens == len(engine.tokenizer(
                "u:Say yes.effort=low<think>")["input_ids"])
            assert whole["usage"]["output_tokens_details"]["reasoning_tokens"] == len(reasoning) + 1
            said = events(base, body)
            assert "".join(d["delta"] for k, d in said if k == "response.reasoning_text.delta") == reasoning
            # The message's logprobs are its own tokens, streamed or not: not the thinking's, nor its closing tag.
            assert _items(said[-1][1]["response"]) == _items(whole)
            assert [e["token"] for e in message["content"][0]["logprobs"]] == ["y", "e", "s", ""]
            assert [item["type"] for item in said[-1][1]["response"]["output"]] == (["reasoning", "message"]
                                                                                   if reasoning else ["message"])
            seen += bool(reasoning)
            # The thinking goes back with the next turn, as the assistant's reasoning.
            later = sdk.responses.create(model="tiny", input="More.", previous_response_id=whole["id"],
                                         max_output_tokens=1)
            reply = chat(sdk, [{"role": "user", "content": "Say yes."},
                               {"role": "assistant", "content": "yes", "reasoning": reasoning},
                               {"role": "user", "content": "More."}], max_tokens=1)
            assert later.usage.input_tokens == reply.usage.prompt_tokens
        assert seen, "some seed should think before it answers"


def test_text_format_and_logprobs(sdk: openai.OpenAI, url: str) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    response = sdk.responses.create(model="tiny", input="JSON please", max_output_tokens=40,
                                    text={"format": {"type": "json_schema", "name": "answer", "schema": schema}})
    assert isinstance(json.loads(response.output_text)["ok"], bool)
    assert response.text.format.type == "json_schema"
    body = {"input": "Hello", "max_output_tokens": 6, "include": ["message.output_text.logprobs"], "top_logprobs": 2,
            "structured_outputs": {"regex": "[a-z ]+"}}  # one character a token: the tokens' texts join to the text
    whole = httpx.post(f"{url}/v1/responses", json=body, timeout=60).json()
    entries = whole["output"][0]["content"][0]["logprobs"]
    assert len(entries) == whole["usage"]["output_tokens"] and all(len(e["top_logprobs"]) == 2 for e in entries)
    assert "".join(e["token"] for e in entries) == whole["output"][0]["content"][0]["text"]
    said = events(url, body)
    streamed = [e for k, d in said if k == "response.output_text.delta" for e in d["logprobs"]]
    assert [e["logprob"] for e in streamed] == [e["logprob"] for e in entries]
    assert said[-1][1]["response"]["output"][0]["content"][0]["logprobs"] == streamed
    plain = httpx.post(f"{url}/v1/responses", json={**body, "include": []}, timeout=60).json()
    assert "logprobs" not in plain["output"][0]["content"][0]


@pytest.mark.parametrize(("body", "param", "said"), [
    ({"messages": [{"role": "user", "content": "x"}]}, "messages", "Send the messages as input"),
    ({"input": "x", "max_tokens": 5}, "max_tokens", "max_output_tokens"),
    ({"input": "x", "n": 2}, "n", "one answer"),
    ({}, "input", "input is missing"),
    ({"input": []}, "input", "non-empty list"),
    ({"input": [{"type": "input_image", "image_url": "x"}]}, "input[0].type", "text only"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0]",
     "text only"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role", "user, system, developer, assistant"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id", "non-empty"),
    ({"input": [{"type": "reasoning", "summary": [], "encrypted_content": "abc"}]}, "input[0].encrypted_content",
     "never encrypts"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type", "no built-in tools"),
    ({"input": "x", "tools": [{**WEATHER, "name": "bad name"}]}, "tools[0].name", "tools[0].name"),
    ({"input": "x", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name",
     "not in tools"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens", '= 0 is invalid: it must be an integer >= 1; send '
     'the number of new tokens to generate, e.g. "max_output_tokens": 16.'),
    ({"input": "x", "max_output_tokens": 10**6}, "max_output_tokens", "Please reduce the length of the input"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "a"}}}, "text.format", "text.format"),
    ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format", "json_object"),
    ({"input": "x", "text": {"verbosity": "low"}}, "text.verbosity", "not supported"),
    ({"input": "x", "background": "yes"}, "background", "not supported"),
    ({"input": "x", "background": True, "store": False}, "store", 'needs "store": true'),
    ({"input": "x", "background": True, "stream": True}, "stream", "poll GET"),
    ({"input": "x", "truncation": "sometimes"}, "truncation", "not supported"),
    ({"input": "x", "include": ["file_search_call.results"]}, "include", "message.output_text.logprobs"),
    ({"input": "x", "text": {"format": {"type": []}}}, "text.format", "json_object"),
    ({"input": [{"role": "user", "content": "x"}, {"type": "function_call", "call_id": "c", "name": "f",
                                                 "arguments": "{bad"}], "instructions": "be"},
     "input[1].arguments", "not JSON"),
    ({"input": "x", "tools": [WEATHER], "include": ["message.output_text.logprobs"]}, "include", "tools"),
    ({"input": "x", "reasoning": {"summary": 5}}, "reasoning.summary", "concise"),
    ({"input": "x", "tool_choice": "sometimes"}, "tool_choice", '{"type": "function", "name": "..."}'),
    ({"input": "x", "top_logprobs": 99}, "top_logprobs", "from 0 to 20"),
    ({"input": "x", "reasoning": {"effort": "max"}}, "reasoning.effort", "minimal"),
    ({"input": "x", "metadata": {"k": 1}}, "metadata", "string values"),
    ({"input": "x", "store": "yes"}, "store", "true or false"),
    ({"input": "x", "temperature": -1}, "temperature", "temperature = -1"),
    ({"input": "x", "stream_options": {"include_obfuscation": False}}, "stream_options", "stream = true"),
    ({"input": "x", "model": "other"}, "model", "not served here"),
])
def test_bad_fields_are_400s_in_the_responses_words(url: str, body: dict[str, Any], param: str, said: str) -> None:
    r = httpx.post(f"{url}/v1/responses", json=body, timeout=60)
    assert r.status_code == (404 if param == "model" else 400), r.text  # a model not served: OpenAI's 404
    error = r.json()["error"]
    assert error["param"] == param and said in error["message"]
    assert "messages" not in error["message"] or param == "messages"


def test_the_chat_parsers_words_are_reworded_only_where_they_name_the_field(url: str) -> None:
    error = httpx.post(f"{url}/v1/responses", json={"input": "x", "temperature": "messages max_tokens"}).json()["error"]
    assert error["param"] == "temperature" and '"messages max_tokens"' in error["message"]


def _items(body: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [(i["type"], i["status"], i.get("arguments"), [(p["text"], [e["token"] for e in p.get("logprobs") or []])
                                                        for p in i.get("content") or []]) for i in body["output"]]


@pytest.mark.parametrize("body", [
    # Text, a call, more text, another call: one message (its text joined, as in the whole answer), two calls.
    {"input": "W?", "tools": [WEATHER], "max_output_tokens": 300, "structured_outputs": {"regex": HERMES + (
        '\\nAnd\\.\\n<tool_call>\\{"name": "get_weather", "arguments": \\{"city": "Rome"\\}\\}</tool_call>')}},
    # A call, then text: the message comes first all the same, as in the whole answer.
    {"input": "W?", "tools": [WEATHER], "max_output_tokens": 300, "structured_outputs": {"regex": HERMES.removeprefix(
        "Sure\\.\\n") + "\\nDone\\."}},
    # Cut by max_output_tokens: only the last item is incomplete.
    {"input": "W?", "tools": [WEATHER], "max_output_tokens": 40, "structured_outputs": {"regex": HERMES}},
    {"input": "Hello", "max_output_tokens": 6, "include": ["message.output_text.logprobs"], "top_logprobs": 1,
     "structured_outputs": {"regex": "[a-z ]+"}},
])
def test_streamed_and_whole_responses_hold_the_same_items(url: str, body: dict[str, Any]) -> None:
    whole = httpx.post(f"{url}/v1/responses", json=body, timeout=60).json()
    said = events(url, body)
    assert _items(said[-1][1]["response"]) == _items(whole)
    open_item = None
    for kind, data in said:
        if kind == "response.output_item.added":  # the parts come with their own events, as OpenAI sends them
            assert data["item"].get("content", []) == [] and data["item"]["status"] == "in_progress"
            assert open_item is None, "one item open at a time: each closes before the next is added"
            open_item = data["output_index"]
        elif kind == "response.output_item.done":
            assert data["output_index"] == open_item
            open_item = None
        elif "output_index" in data:
            assert data["output_index"] == open_item, kind
    texts = [c for _, _, _, parts in _items(whole) for c, _ in parts]
    assert len(texts) <= 1  # one message at most


def test_a_later_state_too_large_to_keep_drops_the_earlier_one() -> None:
    store = ResponseStore(4, max_bytes=400)
    store.put({"id": "resp_bg", "status": "in_progress"}, [])
    store.put({"id": "resp_bg", "status": "completed", "output": "x" * 500}, [])  # over the bytes: not kept
    with pytest.raises(APIError, match="no stored response"):
        store.get("resp_bg")  # gone, not stuck in_progress


def test_the_store_keeps_what_fits_its_bytes() -> None:
    store = ResponseStore(10, max_bytes=2_000)
    for i in range(4):
        store.put({"id": f"resp_{i}", "text": "x" * 600}, [])
    with pytest.raises(Exception, match="resp_0"):
        store.get("resp_0")
    assert store.get("resp_3").body["text"] == "x" * 600
    store.put({"id": "resp_big", "text": "x" * 3_000}, [])  # larger than the whole store: not kept
    with pytest.raises(Exception, match="resp_big"):
        store.get("resp_big")
    # Kept as the JSON text it counts (parsed objects of many small items took 10 to 15 times more memory),
    # and each read is the caller's own copy.
    kept = store.get("resp_3")
    assert kept.size == len(kept.body_text) + len(kept.conversation_text) + len(kept.input_items_text)
    kept.body["text"] = "changed"
    assert store.get("resp_3").body["text"] == "x" * 600


def test_input_items_become_chat_turns() -> None:
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    assert input_messages([
        {"role": "developer", "content": [{"type": "input_text", "text": "rules"}]},
        {"role": "user", "content": "go"},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok", "annotations": []}]},
        call, {**call, "call_id": "c2"},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "later"}]},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "two"}]},
    ]) == [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "ok", "reasoning": "hm", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "assistant", "content": "", "reasoning": "later"},  # thinking that led to no answer
        {"role": "tool", "tool_call_id": "c2", "content": "two"},
    ]
    with pytest.raises(RequestError, match=r"input\[0\]\.content"):
        input_messages([{"role": "user", "content": 5}])


def test_the_api_key_guards_the_responses_routes(engine: Engine) -> None:
    client = TestClient(create_app(engine, served_model_name="tiny", chat_template=TEMPLATE, api_key="k"))
    assert client.post("/v1/responses", json={"input": "x"}).status_code == 401
    assert client.get("/v1/responses/resp_x").status_code == 401
    assert client.get("/v1/responses/resp_x", headers={"Authorization": "Bearer k"}).status_code == 404
