"""What a request says its output must be: OpenAI's ``response_format`` or vLLM's ``structured_outputs``."""

from __future__ import annotations

from typing import Any, Callable

from specsure.config.errors import suggest
from specsure.grammar import GrammarError, StructuredOutputs
from specsure.serve.errors import RequestError, shown

RESPONSE_FORMATS = ("text", "json_object", "json_schema")
JSON_SCHEMA_FIELDS = ("name", "schema", "strict", "description")


def output_constraint(body: dict[str, Any]) -> StructuredOutputs | None:
    """The body's constraint on the output: OpenAI's response_format or vLLM's structured_outputs."""
    fmt, extra = body.get("response_format"), body.get("structured_outputs")
    if fmt is not None and extra is not None:
        raise RequestError("response_format and structured_outputs both constrain the output; send one of them.",
                           "structured_outputs")
    if extra is not None:
        if not isinstance(extra, dict):
            raise RequestError(f"structured_outputs = {shown(extra)} must be an object such as "
                               '{"json": {"type": "object"}}, {"regex": "..."} or {"choice": ["a", "b"]}.',
                               "structured_outputs")
        return _grammar(lambda: StructuredOutputs.from_dict(extra), "structured_outputs")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind not in RESPONSE_FORMATS:
        raise RequestError(f"response_format = {shown(fmt)} must be an object whose type is one of "
                           f"{', '.join(RESPONSE_FORMATS)}, e.g. " + '{"type": "json_object"}.', "response_format")
    unknown = sorted(set(fmt) - {"type", "json_schema"})
    if unknown or (kind != "json_schema" and "json_schema" in fmt):
        field = unknown[0] if unknown else "json_schema"
        raise RequestError(f"unknown field {field!r} in response_format of type {kind!r}.", f"response_format.{field}",
                           "unknown_field")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutputs(json_object=True)
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        raise RequestError('response_format of type json_schema needs "json_schema": {"name": ..., "schema": {...}}; '
                           f"got {shown(spec)}.", "response_format.json_schema")
    for key in spec:
        if key not in JSON_SCHEMA_FIELDS:
            raise RequestError(f"unknown field {key!r} in response_format.json_schema.{suggest(key, JSON_SCHEMA_FIELDS)}"
                               f" Fields: {', '.join(JSON_SCHEMA_FIELDS)}.", f"response_format.json_schema.{key}",
                               "unknown_field")
    return _grammar(lambda: StructuredOutputs(json=spec["schema"]), "response_format.json_schema.schema")


def _grammar(make: Callable[[], StructuredOutputs], param: str) -> StructuredOutputs:
    try:
        return make()
    except GrammarError as exc:
        where = param if param.startswith("response_format") else f"structured_outputs.{exc.field}"
        raise RequestError(f"{where}: {str(exc).split(': ', 1)[1]}.", where) from None
