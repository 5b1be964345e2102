"""A chat request's ``messages``, checked and shaped as chat templates take them.

An assistant turn may carry its ``reasoning`` (or ``reasoning_content``, the older name), which
templates that show earlier thinking read. Besides text turns, a conversation with tools has the
assistant's earlier calls (``tool_calls``, their arguments JSON text) and the results (role
``tool``, with the ``tool_call_id`` they answer).
Templates read a call's arguments as an object (Qwen2.5's writes them with ``tojson``), so the
text is parsed here, as vLLM parses it, and bad JSON is the client's 400, not a template's.
"""

from __future__ import annotations

import json
from typing import Any

from specsure.config.errors import suggest
from specsure.serve.errors import RequestError, shown

ROLES = ("system", "user", "assistant", "tool")
FIELDS = {"system": ("role", "content", "name"), "user": ("role", "content", "name"),
          "assistant": ("role", "content", "name", "tool_calls", "reasoning", "reasoning_content", "refusal",
                        "annotations", "audio", "function_call"),
          "tool": ("role", "content", "tool_call_id", "name")}
"""Each role's fields. An assistant turn has those of the answer OpenAI's clients give back
(``message.model_dump()`` sends refusal, annotations, audio and function_call, null or not)."""
TEXT_PARTS = {"text": "text", "refusal": "refusal"}
"""Content parts that are text, and the key holding it (an assistant's refusal part is its text; only
an assistant's content has one)."""
CALL_FIELDS = ("id", "type", "function")
FUNCTION_FIELDS = ("name", "arguments")


def parse_messages(value: Any, answered: bool = True) -> list[dict[str, Any]]:
    """The body's messages as chat templates take them: role, content (text), and the tool fields.
    ``answered``: every tool result must answer an earlier call (a chat to generate from; /tokenize
    takes any part of a conversation, as vLLM's does)."""
    if not isinstance(value, list) or not value:
        said = "messages is missing" if value is None else f"messages = {shown(value)} is not a non-empty list"
        raise RequestError(f'{said}; send e.g. "messages": [{{"role": "user", "content": "Hello"}}].', "messages")
    messages = [_message(message, f"messages[{i}]") for i, message in enumerate(value)]
    if answered:
        _check_results(messages)
    return messages


def _check_results(messages: list[dict[str, Any]]) -> None:
    """Every tool result answers a call an earlier assistant message made, as OpenAI requires: a
    result with a mistyped id would otherwise reach the model as an answer to nothing."""
    calls: set[str] = set()  # the ids of the calls so far
    called = False
    for i, message in enumerate(messages):
        if message["role"] == "assistant" and message.get("tool_calls"):
            called = True
            calls.update(c["id"] for c in message["tool_calls"] if "id" in c)
        elif message["role"] == "tool":
            where = f"messages[{i}].tool_call_id"
            if not called:
                raise RequestError(f"messages[{i}] is a tool result, but no earlier assistant message has tool_calls; "
                                   "send the assistant's turn with the call before the result it answers.", where)
            if calls and message["tool_call_id"] not in calls:
                raise RequestError(f"{where} = {shown(message['tool_call_id'])} answers no call of an earlier "
                                   f"assistant message (their ids: {', '.join(sorted(calls))}); send the id of the "
                                   "call it answers.", where)


def _message(message: Any, where: str) -> dict[str, Any]:
    if not isinstance(message, dict):
        raise RequestError(f"{where} = {shown(message)} must be an object with role and content.", where)
    role = message.get("role")
    if role == "developer":  # OpenAI's newer name for system instructions, which its clients send
        role = "system"
    if role not in ROLES:
        raise RequestError(f"{where}.role = {shown(role)} is not a role this server renders; use one of "
                           f"{', '.join(ROLES)} (developer is taken as system).", f"{where}.role")
    fields = FIELDS[role]
    for key in message:
        if key not in fields:
            kind = f"{'An' if role == 'assistant' else 'A'} {role} message"
            raise RequestError(f"unknown field {key!r} in {where}.{suggest(key, fields)} {kind} has "
                               f"{', '.join(fields)}.", f"{where}.{key}", "unknown_field")
    calls = message.get("tool_calls")
    if role == "assistant":
        message = _answer_fields(message, where)
    if message.get("content") is None and not calls:
        said = f"{where}.content is null" if "content" in message else f"{where}.content is missing"
        raise RequestError(f'{said}; send the message\'s text, e.g. "content": "Hello"'
                           + (", or the assistant's tool_calls." if role == "assistant" else "."), f"{where}.content")
    # An assistant turn that only calls has no text: "" renders as nothing where None could print "None".
    rendered: dict[str, Any] = {"role": role, "content": "" if message.get("content") is None
                                else _content(message["content"], where, role == "assistant")}
    thought = [message[k] for k in ("reasoning", "reasoning_content") if message.get(k) is not None]
    if thought:
        if not all(isinstance(t, str) for t in thought):
            raise RequestError(f"{where}.reasoning = {shown(thought[0])} must be a string (the turn's thinking, as the "
                               "server returned it).", f"{where}.reasoning")
        if len(set(thought)) > 1:
            raise RequestError(f"{where}.reasoning and {where}.reasoning_content differ; reasoning_content is the "
                               "older name of reasoning: send one of them.", f"{where}.reasoning")
        # Templates read it as reasoning_content (Qwen3's), vLLM's name since is reasoning: both are set.
        rendered["reasoning"] = rendered["reasoning_content"] = thought[0]
    for key in ("name", "tool_call_id"):
        if message.get(key) is not None:
            if not isinstance(message[key], str):
                raise RequestError(f"{where}.{key} = {shown(message[key])} must be a string.", f"{where}.{key}")
            rendered[key] = message[key]
    if role == "tool" and "tool_call_id" not in rendered:
        raise RequestError(f"{where}.tool_call_id is missing: a tool message answers one call; send the id of the "
                           "assistant's tool call it answers.", f"{where}.tool_call_id")
    if calls is not None:
        if not isinstance(calls, list):
            raise RequestError(f"{where}.tool_calls = {shown(calls)} must be a list of calls.", f"{where}.tool_calls")
        rendered["tool_calls"] = [_call(call, f"{where}.tool_calls[{j}]") for j, call in enumerate(calls)]
    return rendered


def _answer_fields(message: dict[str, Any], where: str) -> dict[str, Any]:
    """An assistant turn as given back by a client: its refusal is what it said where it has no
    content (a refusal is text the model wrote), annotations (citations) render as nothing, and
    audio and a legacy function_call are refused unless null, as nothing here could render them."""
    refusal = message.get("refusal")
    if refusal is not None and not isinstance(refusal, str):
        raise RequestError(f"{where}.refusal = {shown(refusal)} must be a string or null (the refusal the "
                           "server returned).", f"{where}.refusal")
    annotations = message.get("annotations")
    if annotations is not None and not isinstance(annotations, list):
        raise RequestError(f"{where}.annotations = {shown(annotations)} must be a list or null.",
                           f"{where}.annotations")
    if message.get("audio") is not None:
        raise RequestError(f"{where}.audio = {shown(message['audio'])}: audio is not supported; send the turn's "
                           "text as content, or audio: null.", f"{where}.audio")
    if message.get("function_call") is not None:
        raise RequestError(f"{where}.function_call is the deprecated form of a call; send it as tool_calls "
                           '([{"id": ..., "type": "function", "function": {"name": ..., "arguments": "..."}}]), '
                           "or function_call: null.", f"{where}.function_call")
    if message.get("content") is None and refusal is not None:
        return {**message, "content": refusal}
    return message


def _call(call: Any, where: str) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or call.get("type", "function") != "function":
        raise RequestError(f'{where} = {shown(call)} must be {{"id": ..., "type": "function", "function": '
                           '{"name": ..., "arguments": "..."}}.', where)
    for key in call:
        if key not in CALL_FIELDS:
            raise RequestError(f"unknown field {key!r} in {where}.{suggest(key, CALL_FIELDS)} Fields: "
                               f"{', '.join(CALL_FIELDS)}.", f"{where}.{key}", "unknown_field")
    for key in function:
        if key not in FUNCTION_FIELDS:
            raise RequestError(f"unknown field {key!r} in {where}.function.{suggest(key, FUNCTION_FIELDS)} Fields: "
                               f"{', '.join(FUNCTION_FIELDS)}.", f"{where}.function.{key}", "unknown_field")
    name, arguments = function.get("name"), function.get("arguments")
    if not isinstance(name, str) or not name:
        raise RequestError(f"{where}.function.name = {shown(name)} must be the called function's name.",
                           f"{where}.function.name")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as exc:
            raise RequestError(f"{where}.function.arguments is not JSON ({exc.msg} at column {exc.colno}); send the "
                               "arguments as the JSON text of an object, as the call gave them.",
                               f"{where}.function.arguments") from None
    if not isinstance(arguments, dict):
        raise RequestError(f"{where}.function.arguments = {shown(function.get('arguments'))} must be the JSON text "
                           'of an object, e.g. "{\\"city\\": \\"Paris\\"}".', f"{where}.function.arguments")
    shaped: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if call.get("id") is not None:
        if not isinstance(call["id"], str):
            raise RequestError(f"{where}.id = {shown(call['id'])} must be a string.", f"{where}.id")
        shaped["id"] = call["id"]
    return shaped


def _content(value: Any, where: str, assistant: bool) -> str:
    if isinstance(value, str):
        return value
    parts = TEXT_PARTS if assistant else {"text": "text"}
    if isinstance(value, list) and all(isinstance(p, dict) and p.get("type") in parts
                                       and isinstance(p.get(parts[p["type"]]), str) for p in value):
        for i, part in enumerate(value):
            key = parts[part["type"]]
            if extra := sorted(set(part) - {"type", key}):  # as a message's unknown fields are: not dropped
                raise RequestError(f"{where}.content[{i}] has the unknown field {extra[0]!r}; a {part['type']} part "
                                   f'holds only "type" and "{key}".', f"{where}.content[{i}].{extra[0]}",
                                   "unknown_field")
        return "".join(p[parts[p["type"]]] for p in value)
    if isinstance(value, list):  # name the first part at fault: a missing text is not an image
        for i, part in enumerate(value):
            if not isinstance(part, dict) or part.get("type") not in parts:
                kind = part.get("type") if isinstance(part, dict) else None
                said = f"the part {kind!r}" if isinstance(kind, str) else f"{shown(part)}, not a text part"
                raise RequestError(f"{where}.content[{i}] is {said}; this server takes text only "
                                   '({"type": "text", "text": "..."}): images and audio are not supported.',
                                   f"{where}.content[{i}]")
            key = parts[part["type"]]
            if not isinstance(part.get(key), str):
                raise RequestError(f"{where}.content[{i}].{key} = {shown(part.get(key))} must be a string: the "
                                   "part's text.", f"{where}.content[{i}].{key}")
    raise RequestError(f"{where}.content = {shown(value)} must be a string or a list of text parts "
                       '({"type": "text", "text": "..."}); images and audio are not supported.', f"{where}.content")
