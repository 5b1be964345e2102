"""Errors for users. Both are ValueErrors so callers can catch one family."""

from __future__ import annotations

import difflib
import json
from typing import Any, Callable, Final

HUGE_INT_DIGITS: Final = 4000
"""Python will not turn an int of more than 4,300 digits into text (or back), so such a number is refused
where it is read, by name, before a message would have to print it."""
HUGE_INT_BITS: Final = int(HUGE_INT_DIGITS * 3.3219)


class ConfigError(ValueError):
    """A configuration or checkpoint problem the user must fix.

    The message names the field, the value, what is allowed and the fix.
    """


class ConfigConflictError(ConfigError):
    """Evidence disagreed with an explicit value while ``strict=True``.

    The message names the same disagreement and signal as the non-strict warning, and how to agree.
    """


def json_type(value: Any) -> str:
    """The JSON name of ``value``'s type (null, boolean, number, string, array, object)."""
    names = {bool: "boolean", int: "number", float: "number", str: "string", list: "array", dict: "object"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def as_json(value: Any) -> str:
    """``value`` as a user wrote it in JSON (true, null, "4"), for messages; repr() when it is not JSON."""
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        try:
            return repr(value)
        except ValueError:  # an int too long to print
            return f"(a {json_type(value)} too long to print)"


def json_int(source: str) -> Callable[[str], int]:
    """A ``parse_int`` for json.loads that refuses an integer literal too long for Python, naming ``source``."""
    def parse(text: str) -> int:
        if len(text) > HUGE_INT_DIGITS:
            raise ConfigError(f"{source} holds an integer of {len(text)} digits; no field takes a number that "
                              "large. Use a value in the field's range.")
        return int(text)
    return parse


def suggest(word: str, choices: tuple[str, ...] | list[str]) -> str:
    """A ' Did you mean ...?' suffix, or '' when nothing is close."""
    close = difflib.get_close_matches(word.lower(), list(choices), n=1, cutoff=0.6)
    return f" Did you mean {close[0]!r}?" if close else ""
