"""Structured outputs: a user's regex, JSON schema or choice list compiled to a byte automaton, and
the tokens each of its states allows (``StructuredOutputs`` is what a request asks for).

No torch: patterns are checked when ``SamplingParams`` is built, before any model loads.
"""

from specsure.grammar.spec import GrammarError, StructuredOutputs

__all__ = ["GrammarError", "StructuredOutputs"]
