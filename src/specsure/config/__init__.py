"""The faithful configuration layer: what you configure is what runs. Imports no torch."""

from specsure.config.checkpoint import CheckpointInfo, read_checkpoint
from specsure.config.errors import ConfigConflictError, ConfigError
from specsure.config.resolution import Decision, Resolution, resolve
from specsure.config.schema import METHODS, SpeculativeConfig

__all__ = [
    "METHODS", "CheckpointInfo", "ConfigConflictError", "ConfigError", "Decision", "Resolution",
    "SpeculativeConfig", "read_checkpoint", "resolve",
]
