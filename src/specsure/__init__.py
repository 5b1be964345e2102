"""specsure: speculative decoding where what you configure is what runs.

``resolve`` and the errors import no torch; the engine API loads lazily on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from specsure.config import ConfigConflictError, ConfigError, Resolution, SpeculativeConfig, resolve

if TYPE_CHECKING:
    from specsure.decode.completion import ParamsError, PromptError, StepUpdate, TokenLogprob
    from specsure.decode.engine import Completion, Engine, make_engine
    from specsure.decode.metrics import SpecStats
    from specsure.grammar import GrammarError, StructuredOutputs
    from specsure.sampling import SamplingError, SamplingParams

__all__ = [
    "Completion", "ConfigConflictError", "ConfigError", "Engine", "GrammarError", "ParamsError", "PromptError",
    "Resolution", "SamplingError", "SamplingParams", "SpecStats", "SpeculativeConfig", "StepUpdate",
    "StructuredOutputs", "TokenLogprob", "make_engine", "resolve",
]
__version__ = "0.1.0"

_LAZY = {
    "make_engine": "specsure.decode.engine", "Engine": "specsure.decode.engine",
    "Completion": "specsure.decode.engine", "SamplingParams": "specsure.sampling",
    "SpecStats": "specsure.decode.metrics", "StructuredOutputs": "specsure.grammar",
    # The errors a generate call raises, and what a stream yields: catchable and typed by their own names.
    "ParamsError": "specsure.decode.completion", "PromptError": "specsure.decode.completion",
    "StepUpdate": "specsure.decode.completion", "TokenLogprob": "specsure.decode.completion",
    "SamplingError": "specsure.sampling", "GrammarError": "specsure.grammar",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        try:
            module = importlib.import_module(_LAZY[name])
        except ModuleNotFoundError as exc:
            if exc.name is None or exc.name.split(".")[0] == "specsure":
                raise
            raise ModuleNotFoundError(f"specsure.{name} needs the engine, and {exc.name!r} is not installed. Install "
                                      "it with: pip install 'specsure[engine]'", name=exc.name) from None
        return getattr(module, name)
    raise AttributeError(f"module 'specsure' has no attribute {name!r}")
