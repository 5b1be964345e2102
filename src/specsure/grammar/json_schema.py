"""JSON Schema to a pattern: the JSON texts a schema accepts, as structured outputs generate them.

What it follows (as vLLM's default backend, xgrammar, does): properties in the schema's order;
no properties beyond those listed unless the schema lists none (``{"type": "object"}`` is any
object); ``oneOf`` as ``anyOf``; a ``$ref`` inside itself unrolled ``REF_RECURSION`` deep.
Whitespace between tokens is bounded (up to two spaces or tabs, or one line break and up to 16 of
indentation), so a model cannot pad forever; none before or after the value. ``COMPACT`` allows
none but the single spaces after "," and ":". A keyword that would change which texts are valid
and that this compiler cannot enforce (``not``, ``uniqueItems``, ``multipleOf``, ...) is refused
by name, never ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from specsure.grammar.pattern import (NEVER, Alt, Chars, Joined, Members, Pattern, PatternError, Repeat, Seq,
                                      either, literal, normalise, subtract)
from specsure.grammar.decimals import decimal_range, number_bounds
from specsure.grammar.integers import DIGIT, NONZERO, integer_bounds, integer_range
from specsure.grammar.regex import parse_regex
from specsure.grammar.string_formats import FORMATS

ANY_DEPTH = 4
"""How deep an object or array of unspecified content may nest (``{"type": "object"}``, json_object)."""
REF_RECURSION = 4
"""How many times one ``$ref`` may be open inside itself: a schema that refers to itself (pydantic's
tree of nodes) is unrolled this deep, and texts that nest deeper are not generated, as the
grammars' ``RECURSION_DEPTH`` and json_object's ``ANY_DEPTH``."""
MAX_REF_DEPTH = 32
"""How many ``$ref``s may be open at once, recursive ones counted each time."""
MAX_REF_COPIES = 2000
"""How many copies of referenced schemas one schema may compile to. Each $ref is compiled where it
is used, so a few hundred bytes that refer back to themselves from many places (16 properties, each
the whole schema again, four levels deep: 16^4 copies) would take minutes and gigabytes before any
other bound was reached; a tree of nodes with two children takes 30."""
ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
                         "discriminator", "$anchor",
                         "readOnly", "writeOnly", "$defs", "definitions", "strict"})
"""Keywords that describe a value without narrowing it."""
KEYWORDS = {
    "string": {"type", "enum", "const", "minLength", "maxLength", "pattern", "format"},
    "integer": {"type", "enum", "const", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"},
    "number": {"type", "enum", "const", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"},
    "boolean": {"type", "enum", "const"},
    "null": {"type", "enum", "const"},
    "object": {"type", "enum", "const", "properties", "required", "additionalProperties"},
    "array": {"type", "enum", "const", "items", "minItems", "maxItems", "prefixItems", "additionalItems"},
}

SPACE_TAB = Chars(((0x09, 0x09), (0x20, 0x20)))
WS = Alt((Repeat(SPACE_TAB, 0, 2), Seq((Repeat(literal("\r"), 0, 1), literal("\n"), Repeat(SPACE_TAB, 0, 16)))))
UNESCAPED = Chars(subtract(((0, 0x10FFFF),), ((0, 0x1F), (0x22, 0x22), (0x5C, 0x5C))))
ESCAPED = Alt((Seq((literal("\\"), Chars(normalise([(ord(c), ord(c)) for c in '"\\/bfnrt'])))),
               parse_regex(r"\\u(?:[0-9A-Ca-cE-Fe-f][0-9A-Fa-f]{3}|[Dd][0-7][0-9A-Fa-f]{2}"
                           r"|[Dd][89ABab][0-9A-Fa-f]{2}\\u[Dd][C-Fc-f][0-9A-Fa-f]{2})")))
"""An escape; a \\u escape of a UTF-16 surrogate only as a pair, high then low (a lone one is not
Unicode, and parsers such as pydantic's refuse it)."""
CHAR = Alt((UNESCAPED, ESCAPED))
"""One character of a JSON string's content, as written."""
NATURAL = Alt((literal("0"), Seq((NONZERO, Repeat(DIGIT, 0, None)))))
INTEGER = Seq((Repeat(literal("-"), 0, 1), NATURAL))
FRACTION_EXPONENT = Seq((Repeat(Seq((literal("."), Repeat(DIGIT, 1, None))), 0, 1),
                         Repeat(Seq((Chars(((0x45, 0x45), (0x65, 0x65))), Repeat(Chars(((0x2B, 0x2B), (0x2D, 0x2D))), 0, 1),
                                     Repeat(DIGIT, 1, None))), 0, 1)))
NUMBER = Seq((INTEGER, FRACTION_EXPONENT))
STRING = Seq((literal('"'), Repeat(CHAR, 0, None), literal('"')))
COMMA = Seq((WS, literal(","), WS))
COLON = Seq((WS, literal(":"), WS))


@dataclass(frozen=True)
class Layout:
    """Where whitespace may go: inside brackets (``ws``), and around the separators."""

    ws: Pattern
    comma: Pattern
    colon: Pattern


FREE = Layout(WS, COMMA, COLON)
"""Bounded whitespace between any two tokens: the default."""
COMPACT = Layout(literal(""), literal(", "), literal(": "))
"""vLLM's ``disable_any_whitespace`` (xgrammar without any_whitespace): one line, ", " and ": " as
Python's json.dumps writes them, nothing inside brackets."""


def any_value(depth: int = ANY_DEPTH, layout: Layout = FREE) -> Pattern:
    """Any JSON value whose objects and arrays nest at most ``depth`` deep."""
    scalars = [STRING, NUMBER, either("true", "false", "null")]
    if depth > 0:
        scalars += [any_object(depth - 1, layout), any_array(depth - 1, layout)]
    return Alt(tuple(scalars))


def any_object(depth: int = ANY_DEPTH, layout: Layout = FREE) -> Pattern:
    member = Seq((STRING, layout.colon, any_value(depth, layout)))
    return Seq((literal("{"), layout.ws, Repeat(Seq((Joined(member, layout.comma, 1), layout.ws)), 0, 1),
                literal("}")))


def any_array(depth: int, layout: Layout = FREE) -> Pattern:
    return Seq((literal("["), layout.ws, Repeat(Seq((Joined(any_value(depth, layout), layout.comma, 1), layout.ws)),
                                                0, 1), literal("]")))


def schema_pattern(schema: Any, layout: Layout = FREE) -> Pattern:
    """The pattern of the JSON texts ``schema`` accepts; PatternError names the keyword and its path."""
    return _Compiler(schema, layout).value(schema, "#", ("#",))  # the root is "#" open once, as a $ref to it is


class _Compiler:
    def __init__(self, root: Any, layout: Layout) -> None:
        self.root, self.layout = root, layout
        self.copies = 0

    def value(self, schema: Any, path: str, refs: tuple[str, ...]) -> Pattern:
        if isinstance(schema, dict) and any(isinstance(k, str) and k.startswith("x-") for k in schema):
            # Vendor extensions (pydantic's x-order, OpenAPI's x-*) describe; none narrows the texts.
            schema = {k: v for k, v in schema.items() if not (isinstance(k, str) and k.startswith("x-"))}
        if schema is True or schema == {}:
            return any_value(layout=self.layout)
        if not isinstance(schema, dict):
            raise PatternError(f"{path} is {json.dumps(schema)[:60]}; a schema is an object (or true)")
        for key in ("$ref", "const", "enum"):  # each names its texts outright: a sibling that narrows is refused
            rest = sorted(set(schema) - ANNOTATIONS - {key} - ({"type"} if key != "$ref" else set()))
            if key in schema and rest:
                raise PatternError(f"{path}: {key} beside {', '.join(map(repr, rest))} is not supported; keep {key} "
                                   "alone (with annotations such as description), or drop the others")
        if "$ref" in schema:
            return self.ref(schema, path, refs)
        for key in ("anyOf", "oneOf", "allOf"):
            if key in schema:
                return self.combined(schema, key, path, refs)
        if "const" in schema:
            kinds = schema.get("type")
            kind = _json_type(schema["const"])
            if kinds is not None and kind not in (kinds if isinstance(kinds, list) else [kinds]) and not (
                    kind == "integer" and "number" in (kinds if isinstance(kinds, list) else [kinds])):
                raise PatternError(f"{path}: const {_dump(schema['const'])} is not of the type {schema['type']}")
            return literal(_dump(schema["const"]))
        if "enum" in schema:
            options = schema["enum"]
            if not isinstance(options, list) or not options:
                raise PatternError(f"{path}/enum must be a non-empty list")
            kinds = schema.get("type")
            if kinds is not None:  # the values the type allows, as a validator would
                kinds = kinds if isinstance(kinds, list) else [kinds]
                options = [v for v in options if _json_type(v) in kinds or (_json_type(v) == "integer"
                                                                            and "number" in kinds)]
                if not options:
                    raise PatternError(f"{path}: no value of enum has the type {schema['type']}")
            return Alt(tuple(literal(_dump(v)) for v in options))
        kind = schema.get("type")
        if kind is None:
            kind = _implied_type(schema, path)
            if kind == "any":
                return any_value(layout=self.layout)
        if isinstance(kind, list):
            if not kind:
                raise PatternError(f"{path}/type is an empty list")
            return Alt(tuple(self.typed({**schema, "type": k}, k, path, refs) for k in kind))
        return self.typed(schema, kind, path, refs)

    def typed(self, schema: dict[str, Any], kind: Any, path: str, refs: tuple[str, ...]) -> Pattern:
        if kind not in KEYWORDS:
            raise PatternError(f"{path}/type is {json.dumps(kind)}; JSON Schema's types are "
                               f"{', '.join(sorted(KEYWORDS))}")
        for key in schema:
            if key == "format" and kind != "string":  # format narrows strings only: a number passes any
                continue
            if key not in KEYWORDS[kind] and key not in ANNOTATIONS:
                article = "an" if kind in ("integer", "array", "object") else "a"
                raise PatternError(f"{path}/{key}: specsure's structured outputs cannot enforce {key!r} on {article} "
                                   f"{kind}; drop it, or check that part of the output yourself")
        if kind == "string":
            return self.string(schema, path)
        if kind == "integer":
            return integer_range(*integer_bounds(schema, path))
        if kind == "number":
            low, high = number_bounds(schema, path)
            return NUMBER if low is None and high is None else decimal_range(low, high, path)
        if kind == "boolean":
            return either("true", "false")
        if kind == "null":
            return literal("null")
        if kind == "array":
            return self.array(schema, path, refs)
        return self.object(schema, path, refs)

    def string(self, schema: dict[str, Any], path: str) -> Pattern:
        fmt, pattern = schema.get("format"), schema.get("pattern")
        if fmt is not None and pattern is not None:
            raise PatternError(f"{path} has both format and pattern; keep one")
        lengths = sorted({"minLength", "maxLength"} & set(schema))
        if (fmt is not None or pattern is not None) and lengths:
            raise PatternError(f"{path}: {' and '.join(lengths)} beside {'format' if fmt else 'pattern'} is not "
                               "supported; put the length into a pattern (e.g. ^.{1,20}$) or drop it")
        if fmt is not None:
            if fmt not in FORMATS:
                raise PatternError(f"{path}/format is {fmt!r}; specsure can enforce {', '.join(sorted(FORMATS))}. "
                                   "Drop it, or give a pattern")
            return Seq((literal('"'), FORMATS[fmt], literal('"')))
        if pattern is not None:
            if not isinstance(pattern, str):
                raise PatternError(f"{path}/pattern must be a string")
            return Seq((literal('"'), _in_string(pattern, path), literal('"')))
        low = _count(schema, "minLength", path, 0)
        high = _count(schema, "maxLength", path, None)
        if high is not None and high < low:
            raise PatternError(f"{path}: maxLength {high} is below minLength {low}")
        return Seq((literal('"'), Repeat(CHAR, low, high), literal('"')))

    def array(self, schema: dict[str, Any], path: str, refs: tuple[str, ...]) -> Pattern:
        if "prefixItems" in schema or isinstance(schema.get("items"), list):
            return self.positional(schema, path, refs)
        item = self.value(schema.get("items", True), f"{path}/items", refs)
        low = _count(schema, "minItems", path, 0)
        high = _count(schema, "maxItems", path, None)
        if high is not None and high < low:
            raise PatternError(f"{path}: maxItems {high} is below minItems {low}")
        ws, comma = self.layout.ws, self.layout.comma
        if high == 0:
            return Seq((literal("["), ws, literal("]")))
        if low <= 1 and high is None:
            items = Seq((Joined(item, comma, 1), ws))
            body = items if low == 1 else Repeat(items, 0, 1)
        else:
            rest = Repeat(Seq((comma, item)), max(low - 1, 0), None if high is None else high - 1)
            body = Seq((item, rest, ws)) if low >= 1 else Repeat(Seq((item, rest, ws)), 0, 1)
        return Seq((literal("["), ws, body, literal("]")))

    def positional(self, schema: dict[str, Any], path: str, refs: tuple[str, ...]) -> Pattern:
        """An array whose first items each have their own schema (``prefixItems``, pydantic's tuples; or
        draft 7's ``items`` list), then ``items`` (``additionalItems`` in draft 7) for any after them."""
        key, rest_key = ("prefixItems", "items") if "prefixItems" in schema else ("items", "additionalItems")
        if "prefixItems" in schema and "additionalItems" in schema:
            raise PatternError(f"{path}/additionalItems beside prefixItems is not supported; say it with items")
        given = schema[key]
        if not isinstance(given, list):
            raise PatternError(f"{path}/{key} must be a list of schemas, one for each leading item")
        heads = [self.value(s, f"{path}/{key}/{i}", refs) for i, s in enumerate(given)]
        more = schema.get(rest_key, True)
        rest = None if more is False else self.value(more, f"{path}/{rest_key}", refs)
        low = _count(schema, "minItems", path, 0)
        high = _count(schema, "maxItems", path, None)
        if rest is None:
            high = len(heads) if high is None else min(high, len(heads))
        if (high is not None and high < low) or (rest is None and low > len(heads)):
            raise PatternError(f"{path}: no array has between {low} and {high} items here (minItems, maxItems and "
                               f"{key} with {rest_key} false disagree)")
        ws, comma = self.layout.ws, self.layout.comma

        def after(i: int) -> Pattern:
            """The items from index i on, each after its comma: required below minItems, else optional."""
            if high is not None and i >= high:
                return literal("")
            if i >= len(heads):
                assert rest is not None
                return Repeat(Seq((comma, rest)), max(low - i, 0), None if high is None else high - i)
            step = Seq((comma, heads[i], after(i + 1)))
            return step if i < low else Repeat(step, 0, 1)
        first = heads[0] if heads else rest
        if first is None or high == 0:
            return Seq((literal("["), ws, literal("]")))
        body = Seq((first, after(1), ws))
        return Seq((literal("["), ws, body if low >= 1 else Repeat(body, 0, 1), literal("]")))

    def object(self, schema: dict[str, Any], path: str, refs: tuple[str, ...]) -> Pattern:
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties", not props)
        if not isinstance(props, dict):
            raise PatternError(f"{path}/properties must be an object")
        required = schema.get("required", [])
        if not isinstance(required, list) or any(name not in props for name in required):
            missing = [n for n in required if n not in props] if isinstance(required, list) else required
            raise PatternError(f"{path}/required names {missing}, which properties does not list")
        if props and extra not in (False, None):
            raise PatternError(f"{path}/additionalProperties alongside properties is not supported; set it to "
                               "false, or describe every property")
        ws, comma, colon = self.layout.ws, self.layout.comma, self.layout.colon
        if not props:
            if extra is False:
                return Seq((literal("{"), ws, literal("}")))
            value = any_value(layout=self.layout) if extra is True else \
                self.value(extra, f"{path}/additionalProperties", refs)
            member = Seq((STRING, colon, value))
            return Seq((literal("{"), ws, Repeat(Seq((Joined(member, comma, 1), ws)), 0, 1), literal("}")))
        members = tuple((Seq((literal(json.dumps(name, ensure_ascii=False)), colon,  # raw, as model_dump_json writes
                              self.value(sub, f"{path}/properties/{name}", refs))), name in required)
                        for name, sub in props.items())
        return Seq((literal("{"), ws, Members(members, comma), ws, literal("}")))

    def combined(self, schema: dict[str, Any], key: str, path: str, refs: tuple[str, ...]) -> Pattern:
        options = schema[key]
        if not isinstance(options, list) or not options:
            raise PatternError(f"{path}/{key} must be a non-empty list of schemas")
        rest = {k: v for k, v in schema.items() if k != key and k not in ANNOTATIONS}
        if rest:
            raise PatternError(f"{path}: {key} beside {', '.join(sorted(rest))} is not supported; move them into "
                               f"each {key} option")
        if key == "allOf":
            if len(options) != 1:
                raise PatternError(f"{path}/allOf with {len(options)} schemas is not supported; merge them into one")
            return self.value(options[0], f"{path}/allOf/0", refs)
        return Alt(tuple(self.value(o, f"{path}/{key}/{i}", refs) for i, o in enumerate(options)))

    def ref(self, schema: dict[str, Any], path: str, refs: tuple[str, ...]) -> Pattern:
        target = schema["$ref"]
        if not isinstance(target, str) or not (target == "#" or target.startswith("#/")):
            raise PatternError(f"{path}/$ref is {target!r}; only references inside the schema (#/...) are supported")
        if refs.count(target) >= REF_RECURSION:
            return NEVER  # one level deeper than the unrolling goes: no text, so this branch is not taken
        self.copies += 1
        if self.copies > MAX_REF_COPIES:
            raise PatternError(f"{path}/$ref {target!r}: the schema's $refs compile to more than {MAX_REF_COPIES:,} "
                               f"copies of what they refer to (each is copied where it is used, and one that refers "
                               f"back to itself {REF_RECURSION} levels deep); refer back from fewer places")
        if len(refs) >= MAX_REF_DEPTH:
            raise PatternError(f"{path}/$ref {target!r} is the {len(refs) + 1}th $ref open at once; at most "
                               f"{MAX_REF_DEPTH} may nest")
        node: Any = self.root
        for part in target[2:].split("/") if target != "#" else ():
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, dict) or part not in node:
                raise PatternError(f"{path}/$ref {target!r} points at nothing in the schema")
            node = node[part]
        return self.value(node, target, (*refs, target))


def _count(schema: dict[str, Any], key: str, path: str, default: int | None) -> int | None:
    value = schema.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value > 1000:
        raise PatternError(f"{path}/{key} is {value!r}; it must be an integer from 0 to 1000")
    return value


def _implied_type(schema: dict[str, Any], path: str) -> str:
    """The type a schema without "type" describes, from its keywords (pydantic leaves it out at times)."""
    for kind in ("object", "array", "string"):
        if any(k in schema for k in KEYWORDS[kind] - {"type", "enum", "const"}):
            return kind
    if any(k in schema for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")):
        return "number"
    others = sorted(set(schema) - ANNOTATIONS)
    if others:
        raise PatternError(f"{path}: specsure's structured outputs cannot enforce {', '.join(map(repr, others))}; "
                           "drop it, or give the value a type")
    return "any"


def _in_string(source: str, path: str) -> Pattern:
    """A JSON Schema pattern inside a string's quotes: searched, not matched, unless anchored."""
    try:
        inner = parse_regex(source)
    except PatternError as e:
        raise PatternError(f"{path}/pattern: {e}") from None
    anchored_end = source.endswith("$") and not source.endswith("\\$")
    anything = Repeat(CHAR, 0, None)
    parts = ([] if source.startswith("^") else [anything]) + [_json_chars(inner, path)] + \
        ([] if anchored_end else [anything])
    return Seq(tuple(parts))


def _json_chars(p: Pattern, path: str) -> Pattern:
    """``p`` with every character class limited to what a JSON string holds unescaped."""
    if isinstance(p, Chars):
        ranges = subtract(p.ranges, ((0, 0x1F), (0x22, 0x22), (0x5C, 0x5C)))
        if not ranges:
            raise PatternError(f"{path}/pattern matches a quote, backslash or control character, which a JSON "
                               "string holds only escaped; this is not supported")
        return Chars(ranges)
    if isinstance(p, (Seq, Alt)):
        return type(p)(tuple(_json_chars(i, path) for i in p.items))
    if isinstance(p, Repeat):
        return Repeat(_json_chars(p.item, path), p.low, p.high)
    return p


def _json_type(value: Any) -> str:
    """JSON Schema's name for the type of a JSON value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "integer"
    return {float: "number", str: "string", list: "array", dict: "object"}.get(type(value), "unknown")


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
