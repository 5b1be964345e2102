"""A Responses request's ``input``: its items (messages, function calls and their outputs,
reasoning) read as the chat messages they amount to, each error naming the item it is in."""

from __future__ import annotations

import json
from typing import Any

from specsure.config.errors import suggest
from specsure.serve.errors import RequestError, shown

ROLES = ("user", "system", "developer", "assistant")
ITEMS = ("message", "function_call", "function_call_output", "reasoning")
ITEM_FIELDS = {"message": ("type", "role", "content", "id", "status", "phase"),
               "function_call": ("type", "call_id", "name", "arguments", "id", "status"),
               "function_call_output": ("type", "call_id", "output", "id", "status"),
               "reasoning": ("type", "id", "summary", "content", "encrypted_content", "status")}
TEXT_PARTS = ("input_text", "output_text")


def input_messages(value: Any) -> list[dict[str, Any]]:
    """``input`` as chat messages: text is one user message; items become messages in order, an
    assistant's function calls join its message, and a reasoning item is the next assistant turn's."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise RequestError(f'input = {shown(value)} must be text or a non-empty list of items, e.g. "input": '
                           '[{"role": "user", "content": "Hello"}].', "input")
    out: list[dict[str, Any]] = []
    thought: str | None = None  # a reasoning item's text, waiting for the assistant turn it belongs to
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise RequestError(f"{where} = {shown(item)} must be an object: a message such as "
                               '{"role": "user", "content": "Hello"}, or a function_call, function_call_output '
                               "or reasoning item.", where)
        kind = item.get("type", "message")
        if kind not in ITEMS:
            raise RequestError(f"{where}.type = {shown(kind)} is not an item this server takes; send one of "
                               f"{', '.join(ITEMS)} (the model reads text only: no images, files or built-in "
                               "tools).", f"{where}.type")
        known(item, ITEM_FIELDS[kind], where)
        if kind == "reasoning":
            thought = (thought or "") + _reasoning_text(item, where)
            continue
        assistant = kind == "function_call" or (kind == "message" and item.get("role") == "assistant")
        if thought is not None and not assistant:  # thinking that led to no answer is still a turn
            out.append({"role": "assistant", "content": "", "reasoning": thought})
            thought = None
        if kind == "message":
            message = {"role": _role(item.get("role"), where), "content": _text(item.get("content"), where,
                                                                                  "content")}
        elif kind == "function_call_output":
            message = {"role": "tool", "tool_call_id": _string(item, "call_id", where),
                       "content": _text(item.get("output"), where, "output")}
        else:
            call = {"id": _string(item, "call_id", where), "type": "function",
                    "function": {"name": _string(item, "name", where), "arguments": _arguments(item, where)}}
            last = out[-1] if out else None
            if thought is None and last is not None and last["role"] == "assistant" and last.get("joinable"):
                last.setdefault("tool_calls", []).append(call)
                continue
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
        if thought is not None:
            message["reasoning"], thought = thought, None
        if message["role"] == "assistant":
            message["joinable"] = True  # the function calls right after it are the same turn's
        out.append(message)
    if thought is not None:
        out.append({"role": "assistant", "content": "", "reasoning": thought})
    for message in out:
        message.pop("joinable", None)
    return out


def _role(role: Any, where: str) -> str:
    if role not in ROLES:
        raise RequestError(f"{where}.role = {shown(role)} must be one of {', '.join(ROLES)}.", f"{where}.role")
    return "system" if role == "developer" else role


def _text(value: Any, where: str, field: str) -> str:
    """A message's content or a call's output: text, or a list of text parts joined."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for j, part in enumerate(value):
            at = f"{where}.{field}[{j}]"
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "refusal" and isinstance(part.get("refusal"), str):
                texts.append(part["refusal"])
                continue
            if kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
                raise RequestError(f"{at} = {shown(part)} must be a text part, "
                                   '{"type": "input_text", "text": "..."} (or output_text in an assistant message); '
                                   "the model reads text only.", at)
            known(part, ("type", "text", "annotations", "logprobs"), at)
            texts.append(part["text"])
        return "".join(texts)
    raise RequestError(f"{where}.{field} = {shown(value)} must be text or a list of text parts "
                       '({"type": "input_text", "text": "..."}).', f"{where}.{field}")


def _string(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or (key != "arguments" and not value):
        raise RequestError(f"{where}.{key} = {shown(value)} must be a non-empty string"
                           + (" (the arguments' JSON text)." if key == "arguments" else "."), f"{where}.{key}")
    return value


def _arguments(item: dict[str, Any], where: str) -> str:
    """A function call's arguments: the JSON text of an object, checked here so the error names the item."""
    text = _string(item, "arguments", where)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RequestError(f"{where}.arguments is not JSON ({exc.msg} at column {exc.colno}); send the arguments as "
                           "the call gave them.", f"{where}.arguments") from None
    if not isinstance(value, dict):
        raise RequestError(f"{where}.arguments = {shown(text)} must be the JSON text of an object.",
                           f"{where}.arguments")
    return text


def _reasoning_text(item: dict[str, Any], where: str) -> str:
    """A reasoning item's thinking: its content's text, else its summary's."""
    if item.get("encrypted_content") is not None:
        raise RequestError(f"{where}.encrypted_content: this server never encrypts reasoning, so it cannot read it; "
                           "send the item's content as the server returned it.", f"{where}.encrypted_content")
    for field, part_type in (("content", "reasoning_text"), ("summary", "summary_text")):
        parts = item.get(field)
        if parts is None or parts == []:
            continue
        if not isinstance(parts, list) or not all(isinstance(p, dict) and p.get("type") == part_type
                                                  and isinstance(p.get("text"), str) for p in parts):
            raise RequestError(f"{where}.{field} = {shown(parts)} must be a list of "
                               f'{{"type": "{part_type}", "text": "..."}} parts.', f"{where}.{field}")
        return "".join(p["text"] for p in parts)
    return ""


def known(obj: dict[str, Any], fields: tuple[str, ...], where: str) -> None:
    for key in obj:
        if key not in fields:
            raise RequestError(f"unknown field {key!r} in {where}.{suggest(key, fields)} Fields: {', '.join(fields)}.",
                               f"{where}.{key}", "unknown_field")
