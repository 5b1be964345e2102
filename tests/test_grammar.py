"""Structured outputs' compiler: regexes, JSON schemas and choices to byte automata, and the tokens
each state allows, checked against Python's ``re``, ``json`` and a token-by-token walk."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from specsure import SamplingParams
from specsure.grammar import GrammarError, StructuredOutputs
from specsure.grammar.automaton import DEAD, ByteDFA, TokenAutomaton, TokenTable
from specsure.grammar.integers import integer_range
from specsure.grammar.json_schema import REF_RECURSION
from specsure.grammar.pattern import compile_nfa
from specsure.grammar.spec import compiled
from specsure.sampling import SamplingError


def accepts(spec: StructuredOutputs | ByteDFA, text: str | bytes) -> bool:
    dfa = spec if isinstance(spec, ByteDFA) else ByteDFA(compiled(spec))
    state = dfa.walk(dfa.start, text.encode("utf-8") if isinstance(text, str) else text)
    return state != DEAD and dfa.accepting[state]


REGEXES = [r"[a-z]+@x\.com", r"\d{3}-\d{2,4}", r"(ab|cd)*e?", r"[^\d\s]+", r"colou?r", r"(?:\w+ ){1,3}\w+",
           r"^\(\d{3}\) \d{3}-\d{4}$", r"[+-]?(0|[1-9]\d*)(\.\d+)?", r"a{2}b{0,2}c{1,}", r".é.", r"[\u00e0-\u00ff]+x",
           r"(?P<year>\d{4})-(?P<m>0[1-9]|1[0-2])", r"[]a]+", r"[a\-z]+", r"x{,3}"]
TEXTS = ["", "a", "abc@x.com", "ab@x.com.", "123-45", "123-4567", "12-345", "ababcde", "abcde", "e", "abab",
         "hello", "hel lo", "h3llo", "color", "colour", "colouur", "one two", "one two three four", "one two three four five",
         "(555) 123-4567", "555 123-4567", "-12.5", "+0", "01", "3.", "aab", "aabbc", "aabbbc", "aaccc", "xéx", "aéa", "éé",
         "àéÿx", "ax", "été", "٣", "2024-09", "2024-13", "]a]", "a-z", "x{,3}", "中文", "😀", "a\nb"]


@pytest.mark.parametrize("source", REGEXES)
def test_a_regex_accepts_exactly_what_python_fullmatches(source: str) -> None:
    """In both of Python's dialects: \\d \\w \\s ASCII (re.ASCII, ECMAScript's), and their negations
    leaving out the Unicode ones as well (the default re, which validators run)."""
    dfa = ByteDFA(compiled(StructuredOutputs(regex=source)))
    for text in TEXTS:
        both = bool(re.fullmatch(source, text, re.ASCII)) and bool(re.fullmatch(source, text))
        assert accepts(dfa, text) == both, (source, text)


@pytest.mark.parametrize("source, construct", [("a(?=b)", "(?="), (r"(a)\1", "\\1"), (r"\bword", "\\b"),
                                               ("a**", "quantifier after a quantifier"), ("(ab", "without its ')'"),
                                               ("ab)", "unbalanced"), ("a^b", "anchor"), ("x{5,2}", "below its minimum"),
                                               ("x{2000}", "above 1000"), ("*a", "nothing to repeat")])
def test_a_regex_an_automaton_cannot_run_is_refused_by_name(source: str, construct: str) -> None:
    with pytest.raises(GrammarError, match=re.escape(construct)) as info:
        StructuredOutputs(regex=source)
    assert info.value.field == "regex" and "position" in str(info.value)


def test_any_character_is_valid_utf8_and_nothing_else() -> None:
    dfa = ByteDFA(compiled(StructuredOutputs(regex=r"[^x]")))
    for ch in ["a", "é", "中", "😀", "\u07ff", "\u0800", "\uffff", "\U00010000", "\U0010ffff"]:
        assert accepts(dfa, ch), ch
    for raw in [b"x", b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80", b"\xe4\xb8"]:
        assert not accepts(dfa, raw), raw  # lone, truncated, overlong, surrogate and out-of-range encodings


def test_integer_ranges_hold_exactly_their_integers() -> None:
    for low, high in [(-37, 104), (0, 9), (5, 5), (-1000, -999), (7, None), (None, -3), (0, 120), (99, 1001)]:
        dfa = ByteDFA(compile_nfa(integer_range(low, high)))
        for n in range(-1200, 1200):
            inside = (low is None or n >= low) and (high is None or n <= high)
            assert accepts(dfa, str(n)) == inside, (low, high, n)
        assert not accepts(dfa, "007") and not accepts(dfa, "-0") and not accepts(dfa, "+5")


PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 8},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "email": {"type": "string", "format": "email"},
    "tags": {"type": "array", "items": {"enum": ["a", "b", 3]}, "maxItems": 2},
    "kind": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/Kind"}]},
    "score": {"type": "number"}},
    "required": ["name", "age"], "$defs": {"Kind": {"type": "string", "enum": ["cat", "dog"]}}}


@pytest.mark.parametrize("text, valid", [
    ('{"name": "Al", "age": 30}', True),
    ('{"name":"Al","age":30}', True),
    ('{\n  "name": "Al",\n  "age": 30\n}', True),
    ('{"name": "Al", "age": 30, "tags": ["a", 3], "kind": "dog", "score": -1.5e3}', True),
    ('{"name": "Al", "age": 30, "email": "al@example.org", "kind": null}', True),
    ('{"name": "Al\\u00e9\\"", "age": 0}', True),
    ('{"name": "中文", "age": 120}', True),
    ('{"age": 30, "name": "Al"}', False),  # properties come in the schema's order
    ('{"name": "Al"}', False),  # age is required
    ('{"name": "", "age": 30}', False),  # minLength
    ('{"name": "Alexander the Great", "age": 30}', False),  # maxLength
    ('{"name": "Al", "age": 121}', False),
    ('{"name": "Al", "age": 30.5}', False),
    ('{"name": "Al", "age": 30, "tags": ["a", "b", 3]}', False),  # maxItems
    ('{"name": "Al", "age": 30, "kind": "cow"}', False),
    ('{"name": "Al", "age": 30, "email": "not an email"}', False),
    ('{"name": "Al", "age": 30, "extra": 1}', False),  # no properties beyond those listed
    ('{"name": "Al", "age": 30,}', False),
    ('{"name": "A\nl", "age": 30}', False),  # a raw control character in a string
    (' {"name": "Al", "age": 30}', False),  # nothing before the value
    ('{"name": "Al", "age": 30}\n', False),  # or after it
    ('{"name": "Al",' + " " * 40 + '"age": 30}', False),  # whitespace is bounded
])
def test_a_json_schema_accepts_its_documents(text: str, valid: bool) -> None:
    assert accepts(StructuredOutputs(json=PERSON), text) is valid
    if valid:
        json.loads(text)


def test_disable_any_whitespace_writes_json_as_json_dumps_does() -> None:
    compact = StructuredOutputs(json=PERSON, disable_any_whitespace=True)
    doc = {"name": "Al", "age": 30}
    assert accepts(compact, json.dumps(doc))
    for text in [json.dumps(doc, indent=2), json.dumps(doc, separators=(",", ":")), '{ "name": "Al", "age": 30}',
                 '{"name": "Al" , "age": 30}']:
        assert accepts(StructuredOutputs(json=PERSON), text) and not accepts(compact, text), text
    nested = {"a": [1, {"b": None}], "c": {}}
    objects = StructuredOutputs(json_object=True, disable_any_whitespace=True)
    assert accepts(objects, json.dumps(nested)) and not accepts(objects, json.dumps(nested, indent=1))
    assert StructuredOutputs.from_dict({"json_object": True, "disable_any_whitespace": None}) == \
        StructuredOutputs(json_object=True)
    with pytest.raises(GrammarError, match="disable_any_whitespace: is 'yes'; give true or false"):
        StructuredOutputs(json_object=True, disable_any_whitespace="yes")  # type: ignore[arg-type]


JSON_GBNF = r'''
# JSON objects, in the style users write GBNF grammars in
root ::= obj
obj ::= "{" sp (
    pair
    ("," sp pair)*
  )? "}" sp
pair ::= str ":" sp val
arr ::= "[" sp (val ("," sp val)*)? "]" sp
val ::= obj | arr | str | num | ("true" | "false" | "null") sp
str ::= "\"" ( [^"\\\x00-\x1F\x7F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" sp
num ::= "-"? ("0" | [1-9] [0-9]{0,15}) ("." [0-9]+)? ([eE] [-+]? [0-9]{1,3})? sp
sp ::= | " " | "\n" [ \t]{0,20}
'''
"""A JSON grammar with what users' GBNF grammars hold: rules over lines inside parentheses, an empty
alternative, escapes, classes, bounded repeats, recursion and comments."""


def test_a_gbnf_grammar_generates_its_language_nested_as_deep_as_unrolled() -> None:
    spec = StructuredOutputs(grammar=JSON_GBNF)
    for text in ['{}', '{"a": [1, 2.5, {"b": null}]}', '{"k":"v\\n","n":-3e5}', '{"a": {"b": {"c": {"d": 1}}}}',
                 '{"a": [true, false]}\n']:
        assert accepts(spec, text) and isinstance(json.loads(text), dict), text
    for text in ['[]', '{"a": }', '{"a": 1', "{'a': 1}", '{"a": {"b": {"c": {"d": {"e": 1}}}}}', '{"a": 01}']:
        assert not accepts(spec, text), text  # the fifth nests past RECURSION_DEPTH
    arithmetic = StructuredOutputs(grammar='root ::= expr\nexpr ::= term (("+" | "-") term)*\n'
                                           'term ::= [0-9]+ | "(" expr ")"  # a comment')
    for text, ok in [("1+2", True), ("(1-2)+3", True), ("((4))", True), ("1+", False), ("(1", False), ("", False)]:
        assert accepts(arithmetic, text) is ok, text
    assert accepts(StructuredOutputs(grammar='root ::= "\\x41" [\\u00e9] .{2} "\\""'), 'Aé\u4e2d!"')


def test_a_schema_whose_refs_multiply_is_refused_before_it_is_built() -> None:
    """376 bytes, 16 properties each the whole schema again: 16^4 copies, minutes and gigabytes to build."""
    wide = {"type": "object", "properties": {f"p{i}": {"$ref": "#"} for i in range(16)}}
    with pytest.raises(GrammarError, match="compile to more than 2,000 copies"):
        StructuredOutputs(json=wide)
    tree = {"type": "object", "properties": {"left": {"$ref": "#"}, "right": {"$ref": "#"}, "v": {"type": "integer"}}}
    assert accepts(StructuredOutputs(json=tree), '{"left": {"left": {"v": 1}}, "v": 2}')


def test_what_pydantic_writes_and_parses_is_what_the_schema_takes() -> None:
    """A discriminated union, vendor x- keys, an escaped surrogate pair: taken; a lone surrogate and
    a date-time without its offset, which pydantic's or a format validator's parse refuses: not written."""
    union = {"type": "object", "required": ["pet"], "properties": {"pet": {
        "discriminator": {"propertyName": "kind", "mapping": {"cat": "#/$defs/Cat", "dog": "#/$defs/Dog"}},
        "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}]}},
        "$defs": {"Cat": {"type": "object", "properties": {"kind": {"const": "cat"}}, "required": ["kind"]},
                  "Dog": {"type": "object", "properties": {"kind": {"const": "dog"}}, "required": ["kind"],
                          "x-order": 2}}}
    pets = StructuredOutputs(json=union)
    assert accepts(pets, '{"pet": {"kind": "dog"}}') and not accepts(pets, '{"pet": {"kind": "cow"}}')
    text = StructuredOutputs(json={"type": "string"})
    assert accepts(text, '"\\ud83d\\ude00 \\u00e9"')
    for lone in ('"\\ud800"', '"\\udc00"', '"\\ude00\\ud83d"'):
        assert not accepts(text, lone), lone
    stamp = StructuredOutputs(json={"type": "string", "format": "date-time"})
    assert accepts(stamp, '"2024-02-29T10:00:00.5+01:00"') and accepts(stamp, '"2024-01-01T00:00:00Z"')
    assert not accepts(stamp, '"2024-01-01T10:00:00"') and not accepts(stamp, '"2023-02-29T10:00:00Z"')


def test_a_tuple_holds_each_leading_item_by_its_own_schema() -> None:
    """pydantic writes tuple[int, str] as prefixItems with minItems = maxItems = 2."""
    pair = StructuredOutputs(json={"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}],
                                   "minItems": 2, "maxItems": 2})
    assert accepts(pair, '[1, "a"]')
    for text in ('[1]', '[1, "a", 2]', '["a", 1]', '[]'):
        assert not accepts(pair, text), text
    open_end = StructuredOutputs(json={"type": "array", "prefixItems": [{"type": "integer"}],
                                       "items": {"type": "string"}, "maxItems": 3})
    for text, ok in (('[]', True), ('[1]', True), ('[1, "a", "b"]', True), ('[1, "a", "b", "c"]', False),
                     ('["a"]', False), ('[1, 2]', False)):
        assert accepts(open_end, text) is ok, text
    closed = StructuredOutputs(json={"type": "array", "items": [{"type": "boolean"}], "additionalItems": False})
    assert accepts(closed, '[true]') and accepts(closed, '[]') and not accepts(closed, '[true, false]')
    with pytest.raises(GrammarError, match="no array has between 3 and"):
        StructuredOutputs(json={"type": "array", "prefixItems": [{}], "items": False, "minItems": 3})


@pytest.mark.parametrize("bounds", [
    {"minimum": 0, "maximum": 1}, {"exclusiveMinimum": 0}, {"minimum": -2.5, "exclusiveMaximum": 3.75},
    {"exclusiveMinimum": -1, "exclusiveMaximum": 0}, {"minimum": 0.1, "maximum": 0.1}, {"maximum": -0.05},
    {"minimum": 10, "maximum": 1000.5}, {"exclusiveMinimum": 0.25, "maximum": 0.3}, {"minimum": 0.001, "exclusiveMaximum": 2},
])
def test_a_number_between_bounds_is_exactly_the_decimals_between_them(bounds: dict) -> None:
    """pydantic's confloat(ge=0, le=1), Field(gt=0): every decimal text is weighed against its bounds
    exactly (no float rounding); exponents are not written; zero may be -0.0, as pydantic writes it."""
    import random
    from decimal import Decimal

    spec = StructuredOutputs(json={"type": "number", **bounds})
    limits = [Decimal(repr(v)) for v in bounds.values()]
    ops = {"minimum": Decimal.__ge__, "exclusiveMinimum": Decimal.__gt__, "maximum": Decimal.__le__,
           "exclusiveMaximum": Decimal.__lt__}
    rng = random.Random(7)
    texts = {f"{v}" for v in limits} | {f"{v}0" for v in limits if "." in f"{v}"} | \
        {f"{v:f}1" for v in limits if "." in f"{v:f}"}
    for _ in range(1500):
        digits = "".join(rng.choice("0123456789") for _ in range(rng.choice([0, 0, 1, 2, 4])))
        whole = rng.choice([0, 0, 1, 2, 3, 9, 10, 11, 999, 1000, 1001])
        texts.add(f"{rng.choice(['', '', '-'])}{whole}" + (f".{digits}" if digits else ""))
    for text in texts:
        value = Decimal(text)
        inside = all(ops[key](value, Decimal(repr(v))) for key, v in bounds.items())
        assert accepts(spec, text) is inside, text


def test_a_bounded_number_keeps_its_order_when_a_validator_reads_it_as_a_double() -> None:
    """0.99999999999999999 is 1.0 as a double: outside an exclusive maximum of 1 for a validator."""
    below_one = StructuredOutputs(json={"type": "number", "exclusiveMaximum": 1})
    assert accepts(below_one, "0.99999999999999") and not accepts(below_one, "0.99999999999999999")
    above_zero = StructuredOutputs(json={"type": "number", "exclusiveMinimum": 0})
    assert accepts(above_zero, "0.00000000000001") and not accepts(above_zero, "0." + "0" * 400 + "1")
    assert accepts(above_zero, "12345678901234567890")  # an integer is read exactly, whatever its length
    assert not accepts(above_zero, "1234567890123456.5")


def test_format_narrows_strings_wherever_it_stands_and_type_beside_ref_is_not_ignored() -> None:
    """A validator checked what specsure let through: a format beside enum or anyOf, or with no type,
    and a type beside $ref, were read as annotations."""
    assert accepts(StructuredOutputs(json={"format": "date"}), '"2024-01-01"')
    assert not accepts(StructuredOutputs(json={"format": "date"}), '"abc"')
    assert accepts(StructuredOutputs(json={"type": "integer", "format": "int32"}), "5")  # narrows strings only
    for schema in ({"$defs": {"A": {"type": "integer"}}, "$ref": "#/$defs/A", "type": "string"},
                   {"enum": ["x"], "format": "date"}, {"anyOf": [{"type": "string"}], "format": "date"}):
        with pytest.raises(GrammarError, match="beside"):
            StructuredOutputs(json=schema)


def test_negated_classes_leave_out_what_either_dialect_counts_in_them() -> None:
    """\\d is ASCII (ECMAScript's), but Python's re, which validators run, counts Arabic-Indic digits
    as \\d: \\D and [^\\d] take neither, so the text matches in both dialects."""
    for pattern, outside, inside in (("^\\D$", "\u0663", "a"), ("^\\W$", "\u00e9", "!"), ("^\\S$", "\u3000", "x"),
                                     ("^[^\\d]$", "\u0663", "x"), ("^[^\\s]$", "\ufeff", "y")):
        spec = StructuredOutputs(json={"type": "string", "pattern": pattern})
        assert accepts(spec, f'"{inside}"') and not accepts(spec, f'"{outside}"'), pattern
    assert not accepts(StructuredOutputs(regex="\\d"), "\u0663")  # and \\d itself stays ASCII
    assert not accepts(StructuredOutputs(regex="[^\\D]"), "\u0663")  # ECMAScript's [^\\D] is ASCII digits


def test_an_email_is_one_pydantics_emailstr_takes_and_a_property_is_written_as_pydantic_writes_it() -> None:
    email = StructuredOutputs(json={"type": "string", "format": "email"})
    assert accepts(email, '"a.b@ex-ample.co"')
    for text in ('"a..b@ex.com"', '".a@ex.com"', '"a@-ex.com"', '"a@ex.com."'):
        assert not accepts(email, text), text
    accented = StructuredOutputs(json={"type": "object", "properties": {"\u00e9": {"type": "integer"}}})
    assert accepts(accented, '{"\u00e9": 1}')  # raw, as model_dump_json writes it


def test_integer_bounds_near_ten_to_the_eighteen_compile_at_once() -> None:
    """Each digit's band once recursed into both its ends: 2^18 copies, a minute of CPU, then a refusal."""
    spec = StructuredOutputs(json={"type": "integer", "minimum": -10 ** 18, "maximum": 10 ** 18 - 1})
    assert accepts(spec, str(10 ** 18 - 1)) and accepts(spec, "-1000000000000000000") and not accepts(spec, str(10 ** 18))


def test_a_date_counts_each_months_days_and_leap_years() -> None:
    """RFC 3339's full-date: a format validator refuses 2024-02-30, so the output may not hold it."""
    import datetime

    spec = StructuredOutputs(json={"type": "string", "format": "date"})
    for year in (1, 4, 100, 400, 1900, 1996, 2000, 2023, 2024, 2100, 9999):
        for month in range(1, 13):
            for day in (28, 29, 30, 31):
                try:
                    valid = bool(datetime.date(year, month, day))
                except ValueError:
                    valid = False
                assert accepts(spec, f'"{year:04d}-{month:02d}-{day:02d}"') is valid, (year, month, day)
    for year_zero in ('"0000-01-01"', '"0000-02-29"'):  # Python's dates, which validators read with, have none
        assert not accepts(spec, year_zero), year_zero


def test_gbnf_takes_space_before_a_quantifier_and_names_llama_cpps_token_references() -> None:
    """llama.cpp skips space after an item before reading its quantifier."""
    spaced = StructuredOutputs(grammar='root ::= "a" * "b" +\nx ::= "y"')
    assert accepts(spaced, "aab") and accepts(spaced, "b") and not accepts(spaced, "a")
    for grammar, words in (('root ::= !<[1000]>', "token reference"), ('root ::= (?= "a") "a"', "lookahead")):
        with pytest.raises(GrammarError, match=words):
            StructuredOutputs(grammar=grammar)


def test_a_grammar_of_many_recursive_rules_is_refused_with_why() -> None:
    """llama.cpp's c.gbnf: statements in statements and expressions in expressions, each unrolled 4 deep."""
    c_like = ('root ::= statement*\n'
              'statement ::= ( "x=" expression ";" ) | ( "while(" expression "){" statement* "}" ) | '
              '( "if(" expression "){" statement* "}" ( "else{" statement* "}" )? ) | ( "{" statement* "}" )\n'
              'expression ::= term (("+" | "-") term)*\nterm ::= factor (("*" | "/") factor)*\n'
              'factor ::= [a-z]+ | [0-9]+ | "-" factor | "(" expression ")" | [a-z]+ "(" expression ("," expression)* ")"')
    with pytest.raises(GrammarError, match="each rule that refers to itself is unrolled 4 levels deep"):
        StructuredOutputs(grammar=c_like)


def trapped(spec: StructuredOutputs, limit: int = 5000) -> list[int]:
    """The reachable states of ``spec``'s automaton from which no text can be completed: a model that
    entered one would have no token left and its output would end unfinished."""
    dfa = ByteDFA(compiled(spec))
    seen, todo, edges = {dfa.start}, [dfa.start], {}
    while todo and len(seen) < limit:
        state = todo.pop()
        dfa.build(state)
        edges[state] = {int(t) for t in dfa.table[state] if t != DEAD}
        for nxt in edges[state] - seen:
            seen.add(nxt)
            todo.append(nxt)
    assert not todo, "the automaton is larger than the test explores"
    good = {s for s in seen if dfa.accepting[s]}
    while grown := {s for s in seen - good if edges[s] & good}:
        good |= grown
    return sorted(seen - good)


def test_a_rule_nested_past_its_depth_leaves_no_path_into_it() -> None:
    """The "[" that would open a fifth level is not allowed at all: with it a model could write
    "[[[[" and find no token to go on."""
    brackets = StructuredOutputs(grammar='root ::= "[" root "]" | "x"')
    assert accepts(brackets, "[[[x]]]") and not accepts(brackets, "[[[[x]]]]")
    assert trapped(brackets) == []
    optional = {"type": "object", "properties": {"v": {"type": "integer", "minimum": 0, "maximum": 9},
                                                 "next": {"$ref": "#"}}, "required": ["v"]}
    linked = StructuredOutputs(json=optional, disable_any_whitespace=True)
    assert accepts(linked, '{"v": 1, "next": {"v": 2}}')
    assert trapped(linked) == []


def test_a_schema_that_refers_to_itself_is_unrolled_as_deep_as_a_grammar() -> None:
    """pydantic writes a tree of nodes as a $ref inside its own definition: generated up to
    REF_RECURSION levels of nodes, the last with no children."""
    node = {"type": "object", "properties": {"name": {"type": "string"},
                                             "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
            "required": ["name"]}
    spec = StructuredOutputs(json={"$defs": {"Node": node}, "$ref": "#/$defs/Node"})

    def nested(depth: int) -> str:
        inner = f', "children": [{nested(depth - 1)}]' if depth > 1 else ""
        return f'{{"name": "n{depth}"{inner}}}'
    for depth in range(1, REF_RECURSION + 1):
        assert accepts(spec, nested(depth)), depth
    assert accepts(spec, '{"name": "a", "children": [{"name": "b"}, {"name": "c", "children": []}]}')
    assert not accepts(spec, nested(REF_RECURSION + 1))
    assert not accepts(spec, '{"children": []}')  # name is still required at every level
    optional = {"type": "object", "properties": {"v": {"type": "integer"},
                                                 "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
                "required": ["v", "next"]}
    linked = StructuredOutputs(json=optional)
    assert accepts(linked, '{"v": 1, "next": {"v": 2, "next": null}}')
    assert not accepts(linked, '{"v": 1, "next": {"v": 2}}')


@pytest.mark.parametrize("grammar, words", [
    ('rot ::= "a"', "no rule named root (rules: rot)"),
    ("root ::= foo", "the rule 'foo' is used but never defined"),
    ('root ::= "a" root', "no text matches it"),
    ('root ::= "a"\n  | "b"', "line 2, column 3"),
    ('root ::= (= "a")', "lookahead"),
    ('root ::= [z-a]', "reversed range"),
    ('root ::= "\\q"', "the escape '\\q'"),
    ('root ::= "a"{3,1}', "bounds are reversed"),
    ('root ::= <[1234]>', "token reference"),
    ('root ::= "a"\nroot ::= "b"', "defined twice"),
    ('root ::= ("a"', "without its ')'"),
])
def test_a_bad_grammar_is_refused_with_its_line_and_column(grammar: str, words: str) -> None:
    with pytest.raises(GrammarError, match=re.escape(words)) as info:
        StructuredOutputs(grammar=grammar)
    assert info.value.field == "grammar"


def test_a_constraint_that_failed_to_compile_fails_again_without_compiling(monkeypatch: pytest.MonkeyPatch) -> None:
    from specsure.grammar import spec as spec_module

    calls = []
    original = spec_module._compiled

    def counting(spec: StructuredOutputs):  # type: ignore[no-untyped-def]
        calls.append(spec)
        return original(spec)

    monkeypatch.setattr(spec_module, "_compiled", counting)
    for _ in range(3):
        with pytest.raises(GrammarError, match="used but never defined"):
            StructuredOutputs(grammar="root ::= undefined-rule-for-the-failure-cache")
    assert len(calls) == 1


def test_json_object_accepts_nested_json_and_refuses_other_values() -> None:
    spec = StructuredOutputs(json_object=True)
    for text in ['{}', '{"a": [1, 2.5, {"b": null}], "c": {"d": [true, false, "x"]}}', '{ "k" : [ ] }']:
        assert accepts(spec, text), text
    for text in ['[]', '"x"', '{"a": }', "{'a': 1}", '{"a": 1', '{"a": [[[[[[1]]]]]]}']:
        assert not accepts(spec, text), text  # the last nests deeper than ANY_DEPTH


@pytest.mark.parametrize("schema, words", [
    ({"type": "string", "not": {"const": "x"}}, "'not'"),
    ({"type": "array", "uniqueItems": True}, "'uniqueItems'"),
    ({"type": "integer", "multipleOf": 3}, "'multipleOf'"),
    ({"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}, "no text matches it"),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["b"]}, "['b']"),
    ({"type": "string", "format": "hostname"}, "'hostname'"),
    ({"type": "number", "minimum": 1, "maximum": 0.5}, "no number lies between its minimum and its maximum"),
    ({"type": "number", "maximum": 1e19}, "bounds beyond 10^18"),
    ({"type": "strng"}, '"strng"'),
    ({"$ref": "#/$defs/Missing"}, "points at nothing"),
    ({"type": "object", "properties": {"a": {}}, "additionalProperties": True}, "additionalProperties"),
    ({"type": "string", "pattern": "^a+$", "maxLength": 3}, "maxLength beside pattern"),
    ({"type": "string", "format": "date", "minLength": 3}, "minLength beside format"),
    ({"enum": ["a", "bb"], "minLength": 2}, "enum beside 'minLength'"),
    ({"$ref": "#/$defs/A", "maxLength": 2, "$defs": {"A": {"type": "string"}}}, "$ref beside 'maxLength'"),
    ({"type": "integer", "const": "x"}, "is not of the type integer"),
    ({"type": "boolean", "enum": [1, "x"]}, "no value of enum has the type boolean"),
])
def test_a_schema_keyword_that_cannot_be_enforced_is_refused_by_name(schema: dict, words: str) -> None:
    with pytest.raises(GrammarError, match=re.escape(words)) as info:
        StructuredOutputs(json=schema)
    assert info.value.field == "json"


def test_exactly_one_field_and_the_params_carry_it_as_given() -> None:
    with pytest.raises(GrammarError, match="exactly one"):
        StructuredOutputs(regex="a", choice=["a"])
    with pytest.raises(GrammarError, match="exactly one"):
        StructuredOutputs()
    with pytest.raises(GrammarError, match="structural_tag: is not a field specsure implements"):
        StructuredOutputs.from_dict({"structural_tag": {"type": "structural_tag"}})
    with pytest.raises(GrammarError, match="choices: is not a structured-outputs field; .* Did you mean 'choice'"):
        StructuredOutputs.from_dict({"choices": ["yes", "no"]})
    assert StructuredOutputs.from_dict({"choice": ["a"], "grammar": None, "disable_fallback": False,
                                        "disable_any_whitespace": False}) == StructuredOutputs(choice=["a"])
    with pytest.raises(GrammarError, match="disable_any_whitespace: applies to json and json_object only"):
        StructuredOutputs.from_dict({"choice": ["a"], "disable_any_whitespace": True})
    with pytest.raises(SamplingError, match=r"structured_outputs.*json: .*'not'"):
        SamplingParams(structured_outputs={"json": {"not": {}}})
    params = SamplingParams(structured_outputs={"json": PERSON})
    assert params.structured_outputs == StructuredOutputs(json=PERSON)
    assert hash(params) == hash(SamplingParams(structured_outputs=StructuredOutputs(json=json.dumps(PERSON))))
    assert accepts(StructuredOutputs(choice=["yes", "no"]), "no") and not accepts(StructuredOutputs(choice=["yes"]), "ye")


def test_enum_values_of_another_type_are_left_out_and_surrogates_refused() -> None:
    spec = StructuredOutputs(json={"type": "integer", "enum": [1, "x", 2.0, 2.5]})
    assert accepts(spec, "1") and accepts(spec, "2.0") and not accepts(spec, '"x"') and not accepts(spec, "2.5")
    with pytest.raises(GrammarError, match="only surrogates"):
        StructuredOutputs(regex="a[\ud800-\udfff]b|c")


def test_a_string_pattern_is_searched_unless_anchored_and_stays_inside_the_quotes() -> None:
    anchored = StructuredOutputs(json={"type": "string", "pattern": "^[A-Z]{2}[0-9]+$"})
    assert accepts(anchored, '"AB12"') and not accepts(anchored, '"xAB12"')
    searched = StructuredOutputs(json={"type": "string", "pattern": "[0-9]{3}"})
    assert accepts(searched, '"id 123 ok"') and not accepts(searched, '"id 12"')
    loose = StructuredOutputs(json={"type": "string", "pattern": "^[^,]+$"})
    assert accepts(loose, '"a b"') and not accepts(loose, '"a"b"')


VOCAB = [None, b"{", b'{"', b'"', b'":', b"a", b"ab", b"1", b"12", b"}", b" ", b"\xc3", b"\xa9", b"\xc3\xa9", b"x}",
         b'"}', b",", b"", None]


def test_the_allowed_tokens_are_the_ones_a_byte_walk_allows() -> None:
    automaton = TokenAutomaton(ByteDFA(compiled(StructuredOutputs(json_object=True))), TokenTable(VOCAB))
    dfa, state = automaton.dfa, automaton.dfa.start
    for token in [2, 5, 4, 10, 3, 11, 12, 13, 15]:  # {"a": "é é"}, the é once split over two tokens
        mask = automaton.allowed(state)
        walked = [raw is not None and raw != b"" and dfa.walk(state, raw) != DEAD for raw in VOCAB]
        assert mask.tolist() == walked
        assert mask[token], (token, VOCAB[token])
        state = automaton.advance(state, token)
    assert dfa.accepting[state] and automaton.advance(state, 9) == DEAD
    assert not np.any(automaton.allowed(state))  # complete: only an end token may follow


def test_a_point_mass_draft_loses_what_the_constraint_refuses() -> None:
    from specsure.decode.structured import Constraint
    from specsure.proposers.base import Draft

    vocab = [None, b"y", b"e", b"s", b"n", b"o", b"x"]  # id 0 ends the output
    automaton = TokenAutomaton(ByteDFA(compiled(StructuredOutputs(choice=["yes", "no"]))), TokenTable(vocab))
    constraint = Constraint(automaton, frozenset({0}))
    assert constraint.prune(Draft([1, 2, 3, 0, 1])).token_ids == [1, 2, 3, 0]  # nothing after the end
    assert constraint.prune(Draft([1, 6, 3])).token_ids == [1]
    assert constraint.prune(Draft([6])).token_ids == []
    tree = Draft([1, 4, 6, 2, 5, 3], parents=[0, 0, 0, 1, 2, 4])  # y, n, x; y>e, n>o, y>e>s
    pruned = constraint.prune(tree)
    assert pruned.token_ids == [1, 4, 2, 5, 3] and pruned.parents == [0, 0, 1, 2, 3]


def test_an_automaton_that_blows_up_fails_its_request_and_the_next_starts_afresh(monkeypatch) -> None:
    import specsure.grammar.automaton as automaton_module
    from specsure.decode.structured import Grammars
    from specsure.grammar.pattern import PatternError

    import collections

    import specsure.grammar.spec as spec_module

    monkeypatch.setattr(automaton_module, "MAX_DFA_STATES", 40)
    monkeypatch.setattr(spec_module, "_FAILED", collections.OrderedDict())  # what this test refuses stays here
    grammars = Grammars(None, len(VOCAB))
    grammars._table = TokenTable([None, b"a", b"b", b"ab"])  # the vocabulary without a tokenizer to read
    spec = StructuredOutputs(regex="[ab]*a[ab]{8}")  # 2^9 states: the last nine letters matter
    first = grammars.automaton(spec)
    with pytest.raises(PatternError, match="passed 40 states"):
        state = first.dfa.start
        for i in range(60):
            first.allowed(state)
            state = first.advance(state, 1 + bin(i * 2654435761).count("1") % 2)  # a and b mixed, no short period
    # At once, a new request naming it is refused when parsed: each repeat would spend the server's seconds again.
    with pytest.raises(GrammarError, match="grew past its bounds while an earlier request ran"):
        StructuredOutputs(regex="[ab]*a[ab]{8}")
    assert first.dfa.full and grammars.automaton(spec) is not first  # one already admitted starts afresh


def test_states_of_overlapping_alternatives_are_bounded_by_their_members() -> None:
    """Few states, each a huge set: seconds a token and a gigabyte before the state count was reached."""
    from specsure.grammar.automaton import ByteDFA
    from specsure.grammar.pattern import PatternError
    from specsure.grammar.spec import compiled

    dfa = ByteDFA(compiled(StructuredOutputs(regex="([a-z]|[a-y][a-z]|[a-x][a-z][a-z]){0,1000}")))
    state = dfa.start
    with pytest.raises(PatternError, match="grew too large"):
        for i in range(5000):
            dfa.build(state)
            state = int(dfa.table[state, ord("a") + i % 23])
    assert dfa.full


@pytest.mark.parametrize(("fields", "field"), [({"regex": "a" * 65_537}, "regex"),
                                               ({"choice": ["x" * 1000] * 66}, "choice"),
                                               ({"grammar": 'root ::= "' + "a" * 65_537 + '"'}, "grammar")])
def test_a_constraint_past_its_text_bound_is_refused_before_compiling(fields: dict, field: str) -> None:
    with pytest.raises(GrammarError, match="characters long; at most 65,536 are compiled") as err:
        StructuredOutputs(**fields)
    assert err.value.field == field
