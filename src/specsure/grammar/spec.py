"""What a request asks its output to be: ``StructuredOutputs``, vLLM's field of the same name."""

from __future__ import annotations

import difflib
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, fields, replace
from functools import lru_cache
from typing import Any, Mapping

from specsure.grammar.gbnf import RECURSION_DEPTH, parse_gbnf
from specsure.grammar.json_schema import COMPACT, FREE, Layout, any_object, schema_pattern
from specsure.grammar.pattern import (NEVER, NFA, TOO_MANY_STATES, Alt, Pattern, PatternError, after_marker,
                                      compile_nfa, literal, prune)
from specsure.grammar.regex import parse_regex

MAX_CHOICES = 1000
MAX_CONSTRAINT_CHARS = 65_536
"""The most characters a regex, a grammar or a choice list (all its strings) may hold."""
MAX_SCHEMA_CHARS = 262_144
"""The most characters a JSON Schema may hold, written compactly."""
KINDS = ("json", "regex", "choice", "grammar", "json_object")
"""The fields that say what the output is; exactly one is set."""
VLLM_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "structural_tag": (None,), "whitespace_pattern": (None,), "disable_fallback": (None, False),
    "disable_additional_properties": (None, False, True),
}
"""vLLM's other StructuredOutputsParams keys, taken at the values that change nothing here (a client
may send all of them): no additional properties is already specsure's rule, so True is neutral too."""


class GrammarError(ValueError):
    """A StructuredOutputs that cannot be compiled; ``field`` is the one at fault (``json``, ``regex``, ...)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"structured_outputs.{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class StructuredOutputs:
    """Constrain the output's text (vLLM's ``StructuredOutputsParams``); set exactly one field.

    The constraint is on the whole output text: generation can only end (EOS or a stop token)
    where the text is complete, and every token is one that keeps it a prefix of a valid text.
    """

    json: str | None = None
    """A JSON Schema, as its JSON text (a dict is accepted and stored as compact JSON, so the
    params stay hashable). The output is one JSON value the schema accepts."""
    regex: str | None = None
    """A regular expression (Python syntax, the automaton-friendly subset; ``\\d \\w \\s`` are ASCII,
    as with ``re.ASCII``) the whole output matches."""
    choice: tuple[str, ...] | None = None
    """The output is exactly one of these strings (a list is stored as a tuple)."""
    grammar: str | None = None
    """A GBNF grammar (llama.cpp's format, vLLM's ``grammar``): the output is what its ``root`` rule
    generates; a rule inside itself nests at most ``gbnf.RECURSION_DEPTH`` deep."""
    json_object: bool = False
    """The output is one JSON object of any content (OpenAI's ``response_format: json_object``)."""
    disable_any_whitespace: bool = False
    """With ``json`` or ``json_object``: the JSON on one line, written as ``json.dumps`` writes it
    (", " and ": ", nothing else between tokens), as vLLM's option of the same name; by default
    bounded whitespace may go between any two tokens."""
    after: str | None = None
    """specsure's own, set by the server for a reasoning model (never taken from a request): the
    output is free up to the first occurrence of this text (``</think>``), and may end there; only
    what follows it is constrained."""

    def __post_init__(self) -> None:
        if isinstance(self.json, str):  # one spelling per schema, so equal schemas share an automaton
            try:
                object.__setattr__(self, "json", _compact(json.loads(self.json)))
            except json.JSONDecodeError:
                pass  # compiled() names the error
        elif isinstance(self.json, (Mapping, bool)):
            object.__setattr__(self, "json", _compact(self.json))
        if isinstance(self.choice, list):
            object.__setattr__(self, "choice", tuple(self.choice))
        given = [f.name for f in fields(self) if f.name in KINDS and getattr(self, f.name) not in (None, False)]
        if len(given) != 1:
            raise GrammarError("json" if not given else given[1],
                               f"set exactly one of json, regex, choice, grammar and json_object (given: "
                               f"{', '.join(given) or 'none'})")
        if self.json is not None and not isinstance(self.json, str):
            raise GrammarError("json", f"is a {type(self.json).__name__}; give a JSON Schema as a dict or its JSON text")
        if self.regex is not None and (not isinstance(self.regex, str) or not self.regex):
            raise GrammarError("regex", f"is {self.regex!r}; give a non-empty regular expression string")
        if self.grammar is not None and (not isinstance(self.grammar, str) or not self.grammar.strip()):
            raise GrammarError("grammar", f"is {self.grammar!r}; give a GBNF grammar, e.g. 'root ::= \"yes\" | \"no\"'")
        if self.choice is not None and (not isinstance(self.choice, tuple) or not self.choice
                                        or len(self.choice) > MAX_CHOICES
                                        or not all(isinstance(c, str) and c for c in self.choice)):
            raise GrammarError("choice", f"must be a list of 1 to {MAX_CHOICES} non-empty strings")
        if not isinstance(self.json_object, bool):
            raise GrammarError("json_object", f"is {self.json_object!r}; give true or false")
        if not isinstance(self.disable_any_whitespace, bool):
            raise GrammarError("disable_any_whitespace", f"is {self.disable_any_whitespace!r}; give true or false")
        if self.disable_any_whitespace and self.json is None and not self.json_object:
            raise GrammarError("disable_any_whitespace", "applies to json and json_object only; a regex, choice or "
                               "grammar says its own whitespace, so drop it")
        if self.after is not None and (not isinstance(self.after, str) or not self.after):
            raise GrammarError("after", f"is {self.after!r}; give the non-empty text after which the constraint starts")
        # Compiling is pure Python on a server's threads: a 10 MB choice list took 25 s before its refusal,
        # slowing every request meanwhile. The bounds are far past what any real constraint needs.
        size = len(self.regex or self.grammar or self.json or "") + sum(map(len, self.choice or ()))
        limit = MAX_SCHEMA_CHARS if self.json is not None else MAX_CONSTRAINT_CHARS
        if size > limit:
            raise GrammarError(self.field, f"is {size:,} characters long; at most {limit:,} are compiled, so give a "
                                           "shorter constraint")
        compiled(self)  # refuse what cannot compile now, not when a model has loaded

    @property
    def field(self) -> str:
        """The one field that is set."""
        return next(f.name for f in fields(self) if f.name in KINDS and getattr(self, f.name) not in (None, False))

    @classmethod
    def from_dict(cls, body: Mapping[str, Any]) -> "StructuredOutputs":
        """From vLLM's JSON shape; an unknown key names the ones there are."""
        known = {f.name for f in fields(cls)} - {"after"}
        body = {k: v for k, v in body.items() if not (k in VLLM_NEUTRAL and v in VLLM_NEUTRAL[k])
                and not (k == "disable_any_whitespace" and v is None)}
        for key in body:
            if key in VLLM_NEUTRAL or key == "after":  # a real field: vLLM's, or specsure's own inner one
                raise GrammarError(key, f"is not a field specsure implements; fields: {', '.join(sorted(known))}")
            if key not in known:
                close = difflib.get_close_matches(str(key).lower(), sorted(known), n=1, cutoff=0.6)
                raise GrammarError(key, f"is not a structured-outputs field; fields: {', '.join(sorted(known))}."
                                        + (f" Did you mean {close[0]!r}?" if close else ""))
        return cls(**dict(body))


def _pattern(spec: StructuredOutputs, layout: Layout) -> Pattern:
    if spec.json is not None:
        try:
            schema = json.loads(spec.json)
        except json.JSONDecodeError as e:
            raise PatternError(f"is not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
        return schema_pattern(schema, layout)
    if spec.regex is not None:
        return parse_regex(spec.regex)
    if spec.choice is not None:
        return Alt(tuple(literal(c) for c in spec.choice))
    if spec.grammar is not None:
        return parse_gbnf(spec.grammar)
    return any_object(layout=layout)


def _compact(schema: Any) -> str:
    return json.dumps(schema, ensure_ascii=False, separators=(",", ":"))


def compiled(spec: StructuredOutputs) -> NFA:
    """The byte NFA of ``spec``'s texts, compiled once per distinct constraint; a constraint that
    failed fails again at once (a client that repeats a schema too large to compile would otherwise
    spend a second of the server's each time)."""
    with _FAILED_LOCK:
        failed = _FAILED.get(spec)
    if failed is not None:
        raise GrammarError(spec.field, failed)
    try:
        return _compiled(spec)
    except GrammarError as exc:
        with _FAILED_LOCK:
            _FAILED[spec] = str(exc).partition(": ")[2]
            if len(_FAILED) > FAILURES_KEPT:
                _FAILED.popitem(last=False)
        raise


def refuse_from_now(spec: StructuredOutputs, why: str) -> None:
    """Refuse ``spec`` at its next parse: its automaton blew past a bound while a request ran, and each
    repeat would spend the server's seconds and memory again."""
    with _FAILED_LOCK:
        _FAILED[spec] = why
        if len(_FAILED) > FAILURES_KEPT:
            _FAILED.popitem(last=False)


FAILURES_KEPT = 256
_FAILED: OrderedDict[StructuredOutputs, str] = OrderedDict()
_FAILED_LOCK = threading.Lock()  # requests are parsed on several threads


@lru_cache(maxsize=16)
def _compiled(spec: StructuredOutputs) -> NFA:
    if spec.after is not None:
        return after_marker(compiled(replace(spec, after=None)), spec.after.encode())
    field = spec.field
    layout = COMPACT if spec.disable_any_whitespace else FREE
    try:
        pattern = prune(_pattern(spec, layout))
        if pattern == NEVER:
            # A request under it could take no token: refused now, with the likely cause.
            raise PatternError("no text matches it; a rule or $ref that can only end inside itself (each is "
                               f"unrolled {RECURSION_DEPTH} deep) or a required branch that allows nothing "
                               "leaves no way to finish the output")
        return compile_nfa(pattern)
    except (PatternError, RecursionError) as e:
        message = str(e) if isinstance(e, PatternError) else "nests too deeply to compile"
        if field == "grammar" and message.startswith(TOO_MANY_STATES):  # repeats are rarely why, there
            message = (f"{TOO_MANY_STATES}: each rule that refers to itself is unrolled {RECURSION_DEPTH} levels "
                       "deep, so a grammar of many rules that recur through each other (a programming language's "
                       "statement and expression) multiplies past it; constrain the output with fewer recursive "
                       "rules, such as one for the statements the answer needs")
        raise GrammarError(field, message) from None
