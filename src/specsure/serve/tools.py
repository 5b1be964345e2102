"""The functions a chat request offers the model (OpenAI's ``tools``) and how it may call them.

``tool_choice`` decides what the output is:
- ``none``: text; the tools are still rendered into the prompt (as vLLM does).
- ``auto``: the model chooses between text and calls, in its own format; the server's tool-call
  parser (``--tool-call-parser``) finds the calls afterwards (``tool_calls``). Nothing is enforced.
- ``required``: one or more calls, enforced by structured outputs: the output is a JSON array of
  ``{"name": ..., "parameters": {...}}`` objects, each one a listed function with its arguments
  valid under its ``parameters`` schema (vLLM's shape).
- a named function: the output is that function's arguments, a JSON object valid under its
  schema, also enforced.

As in OpenAI's API, ``tool_choice`` defaults to ``auto`` when ``tools`` is given, else ``none``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from specsure.config.errors import suggest
from specsure.grammar import GrammarError, StructuredOutputs
from specsure.serve.errors import RequestError, shown

MAX_TOOLS = 128
"""OpenAI's limit on the functions one request may list."""
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""A function name as OpenAI takes it."""
TOOL_FIELDS = ("type", "function")
FUNCTION_FIELDS = ("name", "description", "parameters", "strict")
CHOICES = ("none", "auto", "required")
NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}
"""The empty object, the arguments of a function that takes none."""
ANY_ARGUMENTS: dict[str, Any] = {"type": "object"}
"""Any object: the arguments of ``"parameters": {}``."""


@dataclass(frozen=True)
class Function:
    """One function the model may call."""

    name: str
    description: str | None
    parameters: dict[str, Any] | None
    """Its arguments' JSON Schema as the client sent it; None when the tool has none."""
    strict: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        """The OpenAI tool object, as chat templates take ``tools``."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        if self.parameters is not None:
            function["parameters"] = self.parameters
        return {"type": "function", "function": function}

    def arguments_schema(self) -> dict[str, Any]:
        """The schema the arguments are enforced with.

        A function without ``parameters``, or with an empty ``properties`` object, takes none: its
        arguments are ``{}`` (specsure's compiler would read an object schema that lists no
        properties as any object). ``"parameters": {}`` takes any object: arguments are an object,
        even where the schema would allow any value.
        """
        params = self.parameters
        if params is None or (params.get("type") == "object" and params.get("properties") == {}
                              and not params.get("required")
                              and set(params) <= {"type", "properties", "additionalProperties", "required",
                                                  "description", "title"}):
            return NO_ARGUMENTS
        return ANY_ARGUMENTS if params == {} else params


@dataclass(frozen=True)
class Tools:
    """A chat request's ``tools``, ``tool_choice`` and ``parallel_tool_calls``."""

    functions: tuple[Function, ...]
    choice: Literal["none", "auto", "required", "named"]
    named: str | None = None
    """The function ``tool_choice`` names, when ``choice`` is ``named``."""
    parallel: bool = True
    """Whether one answer may call several functions (OpenAI's ``parallel_tool_calls``)."""

    def for_template(self) -> list[dict[str, Any]]:
        return [f.to_dict() for f in self.functions]

    def function(self, name: str) -> Function:
        return next(f for f in self.functions if f.name == name)

    def constraint(self) -> StructuredOutputs | None:
        """The structured output that ``required`` and a named function enforce; None otherwise."""
        if self.choice == "named":
            assert self.named is not None
            where = f"tools[{self._index(self.named)}].function.parameters"
            return _compiled(lambda: StructuredOutputs(json=self.function(self.named).arguments_schema()), where)
        if self.choice != "required":
            return None
        for i, f in enumerate(self.functions):  # each schema's error names its tool
            _compiled(lambda: StructuredOutputs(json=f.arguments_schema()), f"tools[{i}].function.parameters")
        calls = {"type": "array", "minItems": 1,
                 "items": {"anyOf": [{"type": "object",
                                      "properties": {"name": {"const": f.name}, "parameters": f.arguments_schema()},
                                      "required": ["name", "parameters"]} for f in self.functions]}}
        if not self.parallel:
            calls["maxItems"] = 1
        return _compiled(lambda: StructuredOutputs(json=calls), "tools")

    def _index(self, name: str) -> int:
        return next(i for i, f in enumerate(self.functions) if f.name == name)


def parse_tools(body: dict[str, Any], auto_parser: str | None) -> Tools | None:
    """The body's tools, or None when it offers none and chooses none.

    ``auto_parser``: the server's tool-call parser when it was started with
    ``--enable-auto-tool-choice``, else None (then ``auto`` is refused, as vLLM refuses it).
    """
    given, choice, parallel = body.get("tools"), body.get("tool_choice"), body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise RequestError(f"parallel_tool_calls = {shown(parallel)} must be true or false.", "parallel_tool_calls")
    functions = _functions(given) if given is not None else ()
    if choice is None:
        choice = "auto" if functions else "none"
    kind, named = _choice(choice, functions)
    if not functions:
        if kind != "none":
            raise RequestError(f"tool_choice = {shown(choice)} needs tools: list the functions the model may call "
                               'in "tools", or send "tool_choice": "none".', "tool_choice")
        return None
    if kind == "auto" and auto_parser is None:
        said = 'tool_choice "auto"' if body.get("tool_choice") is not None else \
            'tool_choice "auto" (the default when tools are given)'
        raise RequestError(f"{said} needs a server started with "
                           "--enable-auto-tool-choice --tool-call-parser hermes, which finds the calls in the "
                           'model\'s text. Send "tool_choice": "required" or a named function (both enforced by '
                           'structured outputs), or "none".', "tool_choice")
    return Tools(functions, kind, named, True if parallel is None else parallel)


def _functions(value: Any) -> tuple[Function, ...]:
    if not isinstance(value, list) or len(value) > MAX_TOOLS:
        raise RequestError(f"tools = {shown(value)} must be a list of at most {MAX_TOOLS} tools such as "
                           '{"type": "function", "function": {"name": "get_weather", "parameters": {...}}}.', "tools")
    functions: list[Function] = []
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise RequestError(f'{where} = {shown(tool)} must be {{"type": "function", "function": {{...}}}}; '
                               "function tools are the only kind.", where)
        _known(tool, TOOL_FIELDS, where)
        spec, where = tool["function"], f"{where}.function"
        _known(spec, FUNCTION_FIELDS, where)
        name = spec.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise RequestError(f"{where}.name = {shown(name)} must be 1 to 64 letters, digits, _ or -.",
                               f"{where}.name")
        if any(f.name == name for f in functions):
            raise RequestError(f"{where}.name = {shown(name)} is listed twice; each function needs its own name.",
                               f"{where}.name")
        description, params, strict = spec.get("description"), spec.get("parameters"), spec.get("strict")
        if description is not None and not isinstance(description, str):
            raise RequestError(f"{where}.description = {shown(description)} must be a string.",
                               f"{where}.description")
        if params is not None and not isinstance(params, dict):
            raise RequestError(f"{where}.parameters = {shown(params)} must be a JSON Schema object such as "
                               '{"type": "object", "properties": {...}}.', f"{where}.parameters")
        if strict is not None and not isinstance(strict, bool):
            raise RequestError(f"{where}.strict = {shown(strict)} must be true or false.", f"{where}.strict")
        functions.append(Function(name, description, params, strict))
    return tuple(functions)


def _choice(value: Any, functions: tuple[Function, ...]) -> tuple[Literal["none", "auto", "required", "named"],
                                                                  str | None]:
    if isinstance(value, str) and value in CHOICES:
        return value, None  # type: ignore[return-value]
    spec = value.get("function") if isinstance(value, dict) and value.get("type") == "function" else None
    name = spec.get("name") if isinstance(spec, dict) else None
    if not isinstance(name, str):
        raise RequestError(f"tool_choice = {shown(value)} must be one of {', '.join(CHOICES)}, or "
                           '{"type": "function", "function": {"name": "..."}} naming one of the tools.', "tool_choice")
    _known(value, TOOL_FIELDS, "tool_choice")
    _known(spec, ("name",), "tool_choice.function")
    names = [f.name for f in functions]
    if functions and name not in names:
        raise RequestError(f"tool_choice names the function {name!r}, which is not in tools.{suggest(name, names)} "
                           f"Functions: {', '.join(names)}.", "tool_choice.function.name")
    return "named", name


def _known(obj: dict[str, Any], fields: tuple[str, ...], where: str) -> None:
    for key in obj:
        if key not in fields:
            raise RequestError(f"unknown field {key!r} in {where}.{suggest(key, fields)} Fields: {', '.join(fields)}.",
                               f"{where}.{key}", "unknown_field")


def _compiled(make: Any, where: str) -> StructuredOutputs:
    try:
        return make()
    except GrammarError as exc:
        detail = str(exc).partition(": ")[2] or str(exc)
        raise RequestError(f"{where}: the arguments' schema cannot be enforced: {detail}. Simplify the schema, or "
                           'send "tool_choice": "auto" (not enforced).', where) from None

