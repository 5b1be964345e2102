"""Errors for users. Both are ValueErrors so callers can catch one family."""

from __future__ import annotations

import json
from typing import Any


class ConfigError(ValueError):
    """A configuration or checkpoint problem the user must fix.

    The message names the field, the value, what is allowed and the fix.
    """


class ConfigConflictError(ConfigError):
    """Evidence disagreed with an explicit value while ``strict=True``.

    The message is the same text the non-strict warning would have logged.
    """


def as_json(value: Any) -> str:
    """``value`` as a user wrote it in JSON (true, null, "4"), for messages; repr() when it is not JSON."""
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)
