"""GBNF grammars (llama.cpp's format, which vLLM's ``grammar`` takes as xgrammar's EBNF) to a pattern.

A grammar is rules, ``name ::= alternatives``, one per line (a rule continues onto the next lines
only inside parentheses or after ``|``); the output is the rule ``root``. Items: string literals
(``"text"``, with ``\\n \\t \\r \\\\ \\" \\xHH \\uHHHH \\UHHHHHHHH``), classes (``[a-z]``,
``[^"\\n]``), ``.`` (any character), rule names, groups, and ``* + ? {m} {m,} {m,n} {,n}``.
``#`` starts a comment.

A finite automaton cannot count, so a rule that refers to itself (JSON's value inside an object
inside a value) is unrolled ``RECURSION_DEPTH`` levels deep: texts that nest deeper are not
generated, as json_object's objects nest at most ``ANY_DEPTH``. Other constructs of xgrammar's
dialect (lookaheads, ``<[token]>`` references) are refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass

from specsure.grammar.pattern import (EMPTY, MAX_CODEPOINT, NEVER, Alt, Chars, Joined, Pattern, PatternError, Repeat,
                                      Seq, negate, normalise)

RECURSION_DEPTH = 4
"""How many times a rule may be open inside itself (a JSON grammar's nesting depth)."""
MAX_REPEAT = 1000
ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-", "^": "^", "/": "/"}


@dataclass(frozen=True)
class _Ref:
    """A rule name inside another rule, replaced by the rule's pattern when the grammar is expanded."""

    name: str


def parse_gbnf(source: str) -> Pattern:
    """The texts the grammar's ``root`` rule generates; PatternError names the line and the construct."""
    rules = _Parser(source).rules()
    if "root" not in rules:
        raise PatternError(f"the grammar has no rule named root (rules: {', '.join(rules) or 'none'}); the output "
                           "is what root generates")
    return _expand(rules, rules["root"], ["root"])


def _expand(rules: dict[str, object], node: object, open_rules: list[str]) -> Pattern:
    if isinstance(node, _Ref):
        if node.name not in rules:
            raise PatternError(f"the rule {node.name!r} is used but never defined")
        if open_rules.count(node.name) >= RECURSION_DEPTH:
            return NEVER
        return _expand(rules, rules[node.name], [*open_rules, node.name])
    if isinstance(node, Seq):
        return Seq(tuple(_expand(rules, item, open_rules) for item in _joined(list(node.items))))
    if isinstance(node, Joined):
        return Joined(_expand(rules, node.item, open_rules), _expand(rules, node.sep, open_rules), node.low)
    if isinstance(node, Alt):
        return Alt(tuple(_expand(rules, item, open_rules) for item in node.items))
    if isinstance(node, Repeat):
        return Repeat(_expand(rules, node.item, open_rules), node.low, node.high)
    assert isinstance(node, Chars)
    return node


def _joined(items: list[object]) -> list[object]:
    """``x (sep x)*`` as one Joined: a single copy of x, so that a recursive rule written this way (a
    JSON grammar's members and elements) doubles the automaton at each level of nesting, not
    quadruples it."""
    for i, item in enumerate(items):
        if not (isinstance(item, Repeat) and item.low == 0 and item.high is None and isinstance(item.item, Seq)):
            continue
        body = list(item.item.items)
        for n in range(min(i, len(body) - 1), 0, -1):
            if body[-n:] == items[i - n:i]:
                x = items[i - n] if n == 1 else Seq(tuple(items[i - n:i]))  # type: ignore[arg-type]
                sep = body[0] if len(body) - n == 1 else Seq(tuple(body[:-n]))  # type: ignore[arg-type]
                return [*items[:i - n], Joined(x, sep, 1), *_joined(items[i + 1:])]  # type: ignore[arg-type]
    return items


class _Parser:
    def __init__(self, source: str) -> None:
        self.src, self.at = source, 0

    def fail(self, what: str) -> PatternError:
        line = self.src.count("\n", 0, self.at) + 1
        column = self.at - (self.src.rfind("\n", 0, self.at) + 1) + 1
        return PatternError(f"{what} at line {line}, column {column} of the grammar")

    def peek(self) -> str:
        return self.src[self.at] if self.at < len(self.src) else ""

    def space(self, newlines: bool) -> None:
        """Skip blanks and comments; line breaks too when ``newlines``."""
        while self.at < len(self.src):
            c = self.src[self.at]
            if c == "#":
                end = self.src.find("\n", self.at)
                self.at = len(self.src) if end < 0 else end
            elif c in " \t" or (newlines and c in "\r\n"):
                self.at += 1
            else:
                break

    def name(self) -> str:
        start = self.at
        while self.at < len(self.src) and (self.src[self.at].isascii() and (self.src[self.at].isalnum())
                                           or self.src[self.at] in "-_"):
            self.at += 1
        if self.at == start:
            raise self.fail(f"a rule name expected, found {self.peek()!r}" if self.peek() else "a rule name expected")
        return self.src[start:self.at]

    def rules(self) -> dict[str, object]:
        rules: dict[str, object] = {}
        self.space(newlines=True)
        while self.at < len(self.src):
            if self.peek() == "|":
                raise self.fail("a line that begins with '|' (a rule ends with its line: end the line before with "
                                "'|', or put the alternatives in parentheses)")
            name = self.name()
            self.space(newlines=False)
            if not self.src.startswith("::=", self.at):
                raise self.fail(f"'::=' expected after the rule name {name!r}")
            if name in rules:
                raise self.fail(f"the rule {name!r} is defined twice")
            self.at += 3
            self.space(newlines=True)
            rules[name] = self.alternatives(nested=False)
            if self.peek() not in ("", "\n", "\r"):
                raise self.fail(f"unexpected {self.peek()!r} (a rule ends at the end of its line, unless inside "
                                "parentheses or after '|')")
            self.space(newlines=True)
        return rules

    def alternatives(self, nested: bool) -> object:
        options = [self.sequence(nested)]
        while self.peek() == "|":
            self.at += 1
            self.space(newlines=True)
            options.append(self.sequence(nested))
        return options[0] if len(options) == 1 else Alt(tuple(options))  # type: ignore[arg-type]

    def sequence(self, nested: bool) -> object:
        items: list[object] = []
        while self.peek() and self.peek() not in "|)\r\n":
            items.append(self.quantified(self.item(), nested))
            self.space(newlines=nested)
        return items[0] if len(items) == 1 else Seq(tuple(items))  # type: ignore[arg-type]

    def item(self) -> object:
        c = self.peek()
        if c == '"':
            self.at += 1
            chars = []
            while self.peek() != '"':
                if not self.peek():
                    raise self.fail("a string literal without its closing '\"'")
                chars.append(self.char())
            self.at += 1
            return Seq(tuple(Chars(((cp, cp),)) for cp in chars)) if len(chars) != 1 else Chars(((chars[0],) * 2,))
        if c == "[":
            return Chars(self.klass())
        if c == ".":
            self.at += 1
            return Chars(((0, MAX_CODEPOINT),))
        if c == "(":
            self.at += 1
            self.space(newlines=True)
            if self.peek() in ("=", "!") or self.src.startswith(("?=", "?!"), self.at):
                raise self.fail("a lookahead assertion, which an automaton cannot run")
            inner = self.alternatives(nested=True) if self.peek() != ")" else EMPTY
            if self.peek() != ")":
                raise self.fail("a '(' without its ')'")
            self.at += 1
            return inner
        if c == "<" or self.src.startswith("!<", self.at):  # llama.cpp's token and negated token references
            raise self.fail("a token reference <...>, which specsure's grammars do not take; write the text")
        if c.isascii() and (c.isalnum() or c in "-_"):
            return _Ref(self.name())
        raise self.fail(f"unexpected {c!r}")

    def quantified(self, item: object, nested: bool) -> object:
        while True:
            before = self.at
            self.space(newlines=nested)  # llama.cpp takes `"a" *`: space may come before a quantifier
            if not (self.peek() and self.peek() in "*+?{"):
                self.at = before
                break
            c = self.peek()
            self.at += 1
            if c == "*":
                item = Repeat(item, 0, None)  # type: ignore[arg-type]
            elif c == "+":
                item = Repeat(item, 1, None)  # type: ignore[arg-type]
            elif c == "?":
                item = Repeat(item, 0, 1)  # type: ignore[arg-type]
            else:
                end = self.src.find("}", self.at)
                low, comma, high = self.src[self.at:end].replace(" ", "").partition(",") if end >= 0 else ("x", "", "")
                if end < 0 or not (low.isdigit() or (comma and not low)) or (high and not high.isdigit()):
                    raise self.fail("a repeat {m}, {m,}, {m,n} or {,n} expected")
                lo, hi = int(low or 0), (int(high) if high else None) if comma else int(low)
                if hi is not None and hi < lo or max(lo, hi or 0) > MAX_REPEAT:
                    raise self.fail(f"a repeat {{{self.src[self.at:end]}}} whose bounds are reversed or above "
                                    f"{MAX_REPEAT}")
                self.at = end + 1
                item = Repeat(item, lo, hi)  # type: ignore[arg-type]
        return item

    def char(self) -> int:
        """One character of a literal or a class, its escape read."""
        c = self.src[self.at]
        self.at += 1
        if c != "\\":
            return ord(c)
        e = self.src[self.at] if self.at < len(self.src) else ""
        self.at += 1
        if e in ESCAPES:
            return ord(ESCAPES[e])
        width = {"x": 2, "u": 4, "U": 8}.get(e)
        digits = self.src[self.at:self.at + width] if width else ""
        if not width or len(digits) != width or any(d not in "0123456789abcdefABCDEF" for d in digits):
            self.at -= 2
            raise self.fail(f"the escape '\\{e}' (escapes: \\n \\t \\r \\\\ \\\" \\xHH \\uHHHH \\UHHHHHHHH)")
        self.at += width
        if int(digits, 16) > MAX_CODEPOINT:
            raise self.fail(f"'\\{e}{digits}' is above U+10FFFF")
        return int(digits, 16)

    def klass(self) -> tuple[tuple[int, int], ...]:
        self.at += 1
        negated = self.peek() == "^"
        if negated:
            self.at += 1
        ranges: list[tuple[int, int]] = []
        while self.peek() != "]":
            if not self.peek():
                raise self.fail("a character class without its closing ']'")
            lo = self.char()
            hi = lo
            if self.peek() == "-" and self.src[self.at + 1:self.at + 2] not in ("]", ""):
                self.at += 1
                hi = self.char()
                if hi < lo:
                    raise self.fail("a reversed range in a character class")
            ranges.append((lo, hi))
        self.at += 1
        out = normalise(ranges)
        if negated:
            out = negate(out)
        if not out:
            raise self.fail("a character class that matches no character")
        return out
