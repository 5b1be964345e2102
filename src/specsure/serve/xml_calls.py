"""Function calls written as tags (``--tool-call-parser qwen3_coder``: Qwen3-Coder, Qwen3.5):

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

A parameter's value is raw text (one newline after its opening tag and one before its closing
tag are layout), so its JSON type comes from the function's schema, as vLLM reads it: strings
stay text, integers, numbers and booleans are parsed, objects and arrays are read as JSON or as
Python literals (``ast.literal_eval``, which evaluates nothing), and ``null`` is null where the
schema allows it. A value that does not parse as its type stays the text it was, and a parameter
the schema does not list is text. This module reads one call's body; ``tool_calls`` finds the
``<tool_call>`` blocks, streamed or not.
"""

from __future__ import annotations

import ast
import json
import math
from typing import Any

FUNCTION, FUNCTION_END = "<function=", "</function>"
PARAMETER, PARAMETER_END = "<parameter=", "</parameter>"
TEXT_TYPES = ("string", "str", "text", "varchar", "char", "enum")
INTEGER_PREFIXES = ("int", "uint", "long", "short", "unsigned")
NOT_IN_NAMES = "{}<>\"'"


def xml_call(body: str, schemas: dict[str, Any]) -> tuple[str, str] | None:
    """(name, arguments JSON text) of a ``<tool_call>`` block's body, or None when it is not a call.

    Args:
        body: the text between ``<tool_call>`` and ``</tool_call>``.
        schemas: each offered function's name to its ``parameters`` schema (None when it has none).
    """
    text = body.strip()
    if not text.startswith(FUNCTION):
        return None
    close = text.find(">")
    if close < 0:
        return None
    name = text[len(FUNCTION):close].strip()
    if not name or any(c in NOT_IN_NAMES or c.isspace() for c in name):
        return None  # a template placeholder or prose, not a function's name (vLLM refuses these too)
    rest = text[close + 1:]
    end = rest.rfind(FUNCTION_END)
    rest = rest[:end] if end >= 0 else rest
    properties = _properties(schemas.get(name))
    arguments: dict[str, Any] = {}
    at = rest.find(PARAMETER)
    if (rest[:at] if at >= 0 else rest).strip():
        return None  # text that is no parameter: not this format
    while at >= 0:
        close = rest.find(">", at)
        if close < 0:
            return None
        key = rest[at + len(PARAMETER):close].strip()
        value, at = _value(rest, close + 1)
        arguments[key] = _typed(value, properties[key]) if key in properties else value
    return name, json.dumps(arguments, ensure_ascii=False)


def _value(text: str, start: int) -> tuple[str, int]:
    """A parameter's raw value from ``start``, and where the next parameter opens (-1: none). Only a
    ``</parameter>`` that the next parameter or the end follows closes the value (code may hold the
    tag), and a missing one ends it at the next parameter, as vLLM reads them."""
    nxt = text.find(PARAMETER, start)
    limit = nxt if nxt >= 0 else len(text)
    end = text.find(PARAMETER_END, start, limit)
    while end >= 0 and not _structural(text[end + len(PARAMETER_END):]):
        end = text.find(PARAMETER_END, end + 1, limit)
    if end >= 0:
        value, after = text[start:end], end + len(PARAMETER_END)
        nxt = text.find(PARAMETER, after)
        if text[after:nxt if nxt >= 0 else len(text)].strip():
            nxt = -1  # text after the last parameter, before </function>: the value ends here anyway
    else:
        value = text[start:limit]
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value, nxt


def _structural(after: str) -> bool:
    """Whether text after a ``</parameter>`` shows it closes the value: another parameter, or nothing."""
    rest = after.lstrip()
    return not rest or rest.startswith(PARAMETER)


def _properties(schema: Any) -> dict[str, Any]:
    if isinstance(schema, dict) and isinstance(schema.get("properties"), dict):
        return schema["properties"]
    return {}


def _typed(value: str, schema: Any) -> Any:
    """``value`` as its schema's type; the text itself where it is not one (or not JSON's: a Python
    literal may be a set, bytes or a complex number)."""
    typed = _parsed(value, schema)
    try:
        json.dumps(typed, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return value
    return typed


def _parsed(value: str, schema: Any) -> Any:
    kind, nullable = _kind(schema)
    if nullable and value.lower() in ("null", "none"):
        return None
    if kind in TEXT_TYPES:
        return value
    if value.lower() in ("null", "none"):
        return None
    try:
        if kind.startswith(INTEGER_PREFIXES):
            return int(value)
        if kind.startswith(("num", "float")):
            number = float(value)
            if not math.isfinite(number):
                return value  # JSON has no NaN or infinity
            return int(number) if number.is_integer() else number
    except ValueError:
        return value
    if kind in ("boolean", "bool", "binary"):
        # vLLM reads anything but "true" as false; a value that is neither stays as written here.
        return {"true": True, "false": False}.get(value.strip().lower(), value)
    try:
        return json.loads(value)
    except (ValueError, RecursionError):  # a value nested past Python's stack stays text
        pass
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return value


def _kind(schema: Any) -> tuple[str, bool]:
    """(the value's type name, lowercased, and whether null is allowed) from its schema."""
    if not isinstance(schema, dict):
        return "string", False
    declared = schema.get("type")
    if declared is None and isinstance(schema.get("anyOf"), list):
        declared = [o.get("type") for o in schema["anyOf"] if isinstance(o, dict) and "type" in o]
    names = [str(t).strip().lower() for t in (declared if isinstance(declared, list) else [declared])
             if t is not None]
    kinds = [n for n in names if n != "null"]
    return (kinds[0] if kinds else ("null" if names else "string")), "null" in names
