"""Errors raised while loading a model checkpoint."""

from __future__ import annotations

from specsure.config.errors import ConfigError


class ModelLoadError(ConfigError):
    """A checkpoint cannot be loaded; the message names the path or field and the fix.

    A ConfigError (hence a ValueError), so one except clause catches every problem the user
    must fix in what they configured.
    """
