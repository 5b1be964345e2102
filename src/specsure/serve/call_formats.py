"""The text formats in which models write function calls, each read into (name, arguments JSON).

``tool_calls`` finds where the calls are in an answer, whole or streamed; this module reads them:
- Hermes' JSON body, ``{"name": ..., "arguments": {...}}`` (inside ``<tool_call>`` tags);
- Llama 3's JSON object, ``{"name": ..., "parameters": {...}}`` (or ``"arguments"``);
- a Python list of calls with literal keyword arguments, ``[get_weather(city="Oslo")]``, parsed
  and never run (``pythonic``);
- Mistral's, after ``[TOOL_CALLS]`` (a special token), in one of two layouts, as vLLM's parser
  reads them: a JSON array, ``[{"name": "get_weather", "arguments": {"city": "Paris"}}, ...]``
  (tokenizers v3 to v7; a single object without the array is read too), or
  ``get_weather[ARGS]{"city": "Paris"}`` (tokenizer v11 and later, ``[ARGS]`` a special token
  too), each further call after another ``[TOOL_CALLS]``. Mistral's chat templates take only
  tool call ids of 9 letters and digits, so these calls get such ids (as vLLM's
  ``MistralToolCall`` does);
- Granite's JSON array of ``{"name", "arguments"}`` (after ``<|tool_call|>``), as Mistral's older one.
Qwen3-Coder's tag format is read by ``xml_calls``.
"""

from __future__ import annotations

import ast
import json
import re
import secrets
import string
from typing import Any

Call = tuple[str, str]
"""A call as read: the function's name and its arguments' JSON text (an object)."""

MARKER, ARGS = "[TOOL_CALLS]", "[ARGS]"
ID_CHARACTERS = string.ascii_letters + string.digits
_NAMED = re.compile(r"([A-Za-z0-9_.-]+)\s*(?:\[ARGS\])?\s*(\{.*\})", re.DOTALL)


def mistral_id() -> str:
    """A tool call id as Mistral's templates require it: 9 letters and digits."""
    return "".join(secrets.choice(ID_CHARACTERS) for _ in range(9))


def mistral_calls(text: str) -> list[Call] | None:
    """(name, arguments JSON) of each call in ``text``, what follows the first ``[TOOL_CALLS]``; None
    unless all of it is calls."""
    calls: list[Call] = []
    for segment in text.split(MARKER):
        segment = segment.strip()
        if segment.startswith(("[", "{")):
            found = json_calls(segment)
            if found is None:
                return None
            calls += found
            continue
        named = _NAMED.fullmatch(segment)
        if named is None:
            return None
        try:
            arguments = json.loads(named.group(2))
        except json.JSONDecodeError:
            return None
        if not isinstance(arguments, dict):
            return None
        calls.append((named.group(1), json.dumps(arguments, ensure_ascii=False)))
    return calls or None


def json_calls(text: str) -> list[Call] | None:
    """A JSON array of ``{"name", "arguments"}`` calls (or one such object) as (name, arguments JSON);
    None unless all of ``text`` is that (Mistral's older layout, and Granite's)."""
    try:
        items = json.loads(text)
    except json.JSONDecodeError:
        return None
    calls = [_json_call(item) for item in (items if isinstance(items, list) else [items])]
    return None if not calls or any(c is None for c in calls) else calls  # type: ignore[return-value]


def _called(item: Any, keys: tuple[str, ...]) -> Call | None:
    """An object as a call: a string ``name``, at most one of ``keys`` holding the arguments (an
    object, or its JSON text, as some answers write them; none: no arguments), and no other key but
    ``"type": "function"`` and an ``id`` (Mistral's templates write one into each earlier call, so its
    models write it too; vLLM ignores both). Anything else is not a call, and its text stays in the
    content as written: an answer that is JSON with a ``name`` (``{"name": "Alice", "age": 3}``), or a
    call under a key its format does not use, would otherwise become a call with its arguments dropped."""
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return None
    given = [key for key in keys if key in item]
    others = set(item) - {"name", *given}
    if len(given) > 1 or others - {"type", "id"} or item.get("type", "function") != "function":
        return None  # two argument keys could disagree (Llama 3's parameters and arguments)
    arguments = item[given[0]] if given else {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return item["name"], json.dumps(arguments, ensure_ascii=False)


def _json_call(item: Any) -> Call | None:
    """``{"name", "arguments"}`` (Mistral's older layout, Granite's)."""
    return _called(item, ("arguments",))


def hermes_call(body: str) -> Call | None:
    """The text inside ``<tool_call>`` ... ``</tool_call>``: ``{"name": ..., "arguments": {...}}``."""
    try:
        item = json.loads(body)
    except json.JSONDecodeError:
        return None
    return _called(item, ("arguments",))


def llama3_call(item: Any) -> Call | None:
    """One decoded JSON value as Llama 3's call: ``{"name", "parameters"}`` (or ``"arguments"``)."""
    return _called(item, ("parameters", "arguments"))


def python_calls(text: str) -> list[Call] | None:
    """``[f(a=1), g(b="x")]`` as calls; None unless the whole text is such a list of literal-argument calls."""
    try:
        tree = ast.parse(text, mode="eval").body  # parsed, never evaluated
    except (SyntaxError, ValueError):
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    calls = []
    for node in tree.elts:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args
                and all(k.arg is not None for k in node.keywords)):
            return None
        try:
            arguments = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
            calls.append((node.func.id, json.dumps(arguments, ensure_ascii=False)))
        except (ValueError, TypeError, SyntaxError):  # not a literal, or not JSON (a set, bytes)
            return None
    return calls
