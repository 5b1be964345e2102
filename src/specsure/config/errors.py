"""Errors for users. Both are ValueErrors so callers can catch one family."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration or checkpoint problem the user must fix.

    The message names the field, the value, what is allowed and the fix.
    """


class ConfigConflictError(ConfigError):
    """Evidence disagreed with an explicit value while ``strict=True``.

    The message is the same text the non-strict warning would have logged.
    """
