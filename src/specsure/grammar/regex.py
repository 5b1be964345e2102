"""A regular-expression parser for structured outputs: Python's ``re`` syntax, full-match.

``\\d``, ``\\w`` and ``\\s`` are ASCII classes, as in JSON Schema's (ECMAScript) patterns and in
Python with ``re.ASCII``; Python's default Unicode classes would let ``\\w`` take any letter. Their
negations (``\\D``, ``[^\\d]``) leave out the Unicode ones too: ``\\D`` takes no Arabic-Indic digit,
as Python's ``re`` (which validators such as jsonschema run) has it, and ``\\S`` no U+3000, as
ECMAScript's and Python's both have it. So a text matches in either dialect.

The subset every regex engine shares and a finite automaton can run: literals, ``.``, classes
(``[a-z]``, ``[^"]``, ``\\d \\w \\s`` and their negations), groups (``(...)``, ``(?:...)``,
``(?P<name>...)``), alternation, and the quantifiers ``* + ? {m} {m,} {m,n}`` (lazy or greedy
alike: only the set of texts matters). The whole output must match, so ``^`` at the start and
``$`` at the end are accepted and change nothing. Lookarounds, backreferences and other anchors
cannot be run by an automaton and are refused by name.
"""

from __future__ import annotations

import functools
import re

from specsure.grammar.pattern import (EMPTY, MAX_CODEPOINT, SURROGATES, Alt, Chars, Pattern, PatternError, Repeat,
                                      Seq, negate, normalise)

DIGIT = ((0x30, 0x39),)
WORD = normalise([(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)])
SPACE = normalise([(0x09, 0x0D), (0x20, 0x20)])
ESCAPE_CLASSES = {"d": DIGIT, "w": WORD, "s": SPACE}
ECMASCRIPT_SPACE_ONLY = ((0xFEFF, 0xFEFF),)
"""ECMAScript's \\s beyond Python's Unicode one: the byte order mark."""


@functools.lru_cache(maxsize=None)
def unicode_class(letter: str) -> tuple[tuple[int, int], ...]:
    """Python's Unicode ``\\d``, ``\\w`` or ``\\s`` as ranges (``\\s`` with ECMAScript's too): what a
    negated class leaves out. Read from ``re`` itself over every code point, once."""
    low, high = SURROGATES
    text = "".join(map(chr, range(low))) + "".join(map(chr, range(high + 1, MAX_CODEPOINT + 1)))
    ranges = []
    for run in re.finditer(rf"\{letter}+", text):
        start, end = run.start(), run.end() - 1
        shift = (lambda i: i if i < low else i + high - low + 1)  # noqa: E731 - back over the surrogates
        ranges.append((shift(start), shift(end)))
    return normalise(ranges + (list(ECMASCRIPT_SPACE_ONLY) if letter == "s" else []))
ESCAPE_CHARS = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "a": "\a", "0": "\0"}
MAX_REPEAT = 1000
"""The largest bound of ``{m,n}``: each bounded copy is a copy of the automaton."""


def parse_regex(source: str) -> Pattern:
    """The pattern ``source`` matches in full; PatternError names the construct and its position."""
    parser = _Parser(source)
    if source.startswith("^"):
        parser.at = 1
    pattern = parser.alternation()
    if parser.at < len(source):
        raise parser.fail("unbalanced ')'")
    return pattern


class _Parser:
    def __init__(self, source: str) -> None:
        self.src, self.at = source, 0

    def fail(self, what: str) -> PatternError:
        return PatternError(f"{what} at position {self.at} of the regex {self.src!r}")

    def peek(self) -> str | None:
        return self.src[self.at] if self.at < len(self.src) else None

    def take(self) -> str:
        if self.at >= len(self.src):
            raise self.fail("the regex ends too early")
        self.at += 1
        return self.src[self.at - 1]

    def alternation(self) -> Pattern:
        options = [self.sequence()]
        while self.peek() == "|":
            self.at += 1
            options.append(self.sequence())
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def sequence(self) -> Pattern:
        items: list[Pattern] = []
        while (c := self.peek()) is not None and c not in "|)":
            if c == "$" and self.at == len(self.src) - 1:
                self.at += 1  # the end anchor: the match is whole anyway
                break
            items.append(self.quantified(self.atom()))
        return items[0] if len(items) == 1 else Seq(tuple(items))

    def quantified(self, item: Pattern) -> Pattern:
        while (c := self.peek()) is not None and c in "*+?{":
            start = self.at
            self.at += 1
            if c == "*":
                item = Repeat(item, 0, None)
            elif c == "+":
                item = Repeat(item, 1, None)
            elif c == "?":
                item = Repeat(item, 0, 1)
            else:
                bounds = self.bounds()
                if bounds is None:  # a '{' that is no quantifier is a literal, as in Python
                    self.at = start
                    return item
                item = Repeat(item, *bounds)
            if self.peek() in ("?", "+"):  # lazy or possessive: the same texts match
                self.at += 1
            if isinstance(item, Repeat) and self.peek() is not None and self.peek() in "*+{":
                raise self.fail("a quantifier after a quantifier")
        return item

    def bounds(self) -> tuple[int, int | None] | None:
        end = self.src.find("}", self.at)
        body = self.src[self.at:end] if end >= 0 else ""
        low, comma, high = body.partition(",")
        if end < 0 or not (low.isdigit() or (comma and not low)) or (high and not high.isdigit()):
            return None  # Python reads '{' that opens no repeat as a literal
        lo = int(low) if low else 0
        hi = (int(high) if high else None) if comma else lo
        if hi is not None and hi < lo:
            raise self.fail(f"a repeat {{{body}}} whose maximum is below its minimum")
        if max(lo, hi or 0) > MAX_REPEAT:
            raise self.fail(f"a repeat {{{body}}} above {MAX_REPEAT}")
        self.at = end + 1
        return lo, hi

    def atom(self) -> Pattern:
        c = self.take()
        if c == "(":
            return self.group()
        if c == "[":
            return Chars(self.klass())
        if c == ".":
            return Chars(negate(((0x0A, 0x0A),)))
        if c == "\\":
            return Chars(self.escape())
        if c in "*+?":
            self.at -= 1
            raise self.fail(f"nothing to repeat before {c!r}")
        if c in "^$":
            self.at -= 1
            raise self.fail(f"the anchor {c!r} inside the regex (only a leading ^ and a trailing $ are "
                            "allowed: the whole output must match)")
        return Chars(((ord(c), ord(c)),))

    def group(self) -> Pattern:
        if self.peek() == "?":
            self.at += 1
            kind = self.take()
            if kind == "P" and self.peek() == "<":
                end = self.src.find(">", self.at)
                if end < 0:
                    raise self.fail("an unterminated group name")
                self.at = end + 1
            elif kind != ":":
                self.at -= 2
                raise self.fail(f"the group '(?{kind}' (lookarounds, flags and conditionals cannot run as an "
                                "automaton; use (?:...) for a plain group)")
        inner = self.alternation() if self.peek() != ")" else EMPTY
        if self.peek() != ")":
            raise self.fail("a '(' without its ')'")
        self.at += 1
        return inner

    def escape(self, negated: bool = False) -> tuple[tuple[int, int], ...]:
        """One escape's characters; ``negated``: it stands in a class that is negated as a whole, which
        then leaves out what either dialect puts in the escape (so the widest of the two here)."""
        c = self.take()
        if c.lower() in ESCAPE_CLASSES:
            if c.isupper():  # \D: ECMAScript's (not ASCII digits) is the wider, Python's the narrower
                return negate(ESCAPE_CLASSES[c.lower()]) if negated else negate(unicode_class(c.lower()))
            return unicode_class(c) if negated else ESCAPE_CLASSES[c]
        if c in ESCAPE_CHARS:
            cp = ord(ESCAPE_CHARS[c])
        elif c in "xuU":
            width = {"x": 2, "u": 4, "U": 8}[c]
            digits = self.src[self.at:self.at + width]
            if len(digits) != width or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise self.fail(f"'\\{c}' needs {width} hex digits")
            self.at += width
            cp = int(digits, 16)
            if cp > MAX_CODEPOINT:
                raise self.fail(f"'\\{c}{digits}' is above U+10FFFF")
        elif c.isalnum():
            self.at -= 2
            raise self.fail(f"the escape '\\{c}' (backreferences and anchors such as \\b cannot run as an automaton)")
        else:
            cp = ord(c)
        return ((cp, cp),)

    def klass(self) -> tuple[tuple[int, int], ...]:
        negated = self.peek() == "^"
        if negated:
            self.at += 1
        ranges: list[tuple[int, int]] = []
        first = True
        while True:
            c = self.take()
            if c == "]" and not first:
                break
            first = False
            lo = self.escape(negated) if c == "\\" else ((ord(c), ord(c)),)
            if self.peek() == "-" and self.at + 1 < len(self.src) and self.src[self.at + 1] != "]" and len(lo) == 1 \
                    and lo[0][0] == lo[0][1]:
                self.at += 1
                h = self.take()
                hi = self.escape() if h == "\\" else ((ord(h), ord(h)),)
                if len(hi) != 1 or hi[0][0] != hi[0][1] or hi[0][0] < lo[0][0]:
                    raise self.fail("a bad range in a character class")
                ranges.append((lo[0][0], hi[0][0]))
            else:
                ranges.extend(lo)
        out = normalise(ranges)
        return negate(out) if negated else out
