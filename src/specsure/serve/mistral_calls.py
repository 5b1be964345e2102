"""Function calls in Mistral's format (``--tool-call-parser mistral``: Mistral 7B Instruct v0.3,
Mistral Small, Ministral, Devstral, Magistral).

The model writes ``[TOOL_CALLS]`` (a special token) and then its calls, in one of two layouts,
as vLLM's parser reads them:
- a JSON array, ``[{"name": "get_weather", "arguments": {"city": "Paris"}}, ...]`` (Mistral's
  tokenizers v3 to v7; a single object without the array is read too);
- ``get_weather[ARGS]{"city": "Paris"}`` (tokenizer v11 and later, ``[ARGS]`` a special token
  too), each further call after another ``[TOOL_CALLS]``.
The calls end the answer: text before the first ``[TOOL_CALLS]`` is the message's content, and
an answer whose text after it is not calls keeps all of it as content, as written. Mistral's chat
templates take only tool call ids of 9 letters and digits, so these calls get such ids (as
vLLM's ``MistralToolCall`` does).
"""

from __future__ import annotations

import json
import re
import secrets
import string
from typing import Any

MARKER, ARGS = "[TOOL_CALLS]", "[ARGS]"
ID_CHARACTERS = string.ascii_letters + string.digits
_NAMED = re.compile(r"([A-Za-z0-9_.-]+)\s*(?:\[ARGS\])?\s*(\{.*\})", re.DOTALL)


def mistral_id() -> str:
    """A tool call id as Mistral's templates require it: 9 letters and digits."""
    return "".join(secrets.choice(ID_CHARACTERS) for _ in range(9))


def mistral_calls(text: str) -> list[tuple[str, str]] | None:
    """(name, arguments JSON) of each call in ``text``, what follows the first ``[TOOL_CALLS]``; None
    unless all of it is calls."""
    calls: list[tuple[str, str]] = []
    for segment in text.split(MARKER):
        segment = segment.strip()
        if segment.startswith(("[", "{")):
            try:
                items = json.loads(segment)
            except json.JSONDecodeError:
                return None
            for item in items if isinstance(items, list) else [items]:
                call = _json_call(item)
                if call is None:
                    return None
                calls.append(call)
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


def _json_call(item: Any) -> tuple[str, str] | None:
    """``{"name", "arguments"}``; the arguments an object, or its JSON text (as some answers write them)."""
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return None
    arguments = item.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return item["name"], json.dumps(arguments, ensure_ascii=False)
