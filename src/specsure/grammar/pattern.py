"""The pattern tree that regexes and JSON schemas compile to, and its byte NFA.

Patterns are over characters; the NFA is over the UTF-8 bytes of the text, because tokens are
byte strings (a token may hold half of a character). Character classes become UTF-8 byte-range
sequences, so one automaton checks both the characters and their encoding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Union

MAX_CODEPOINT = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)
MAX_NFA_STATES = 200_000
TOO_MANY_STATES = f"the constraint needs more than {MAX_NFA_STATES:,} automaton states"
"""A pattern whose automaton grows past this many states is refused: it would take seconds to
compile and memory per request (bounded repeats such as ``{0,100000}`` are what reach it)."""


class PatternError(ValueError):
    """A pattern this compiler cannot build; the message says what and why."""


@dataclass(frozen=True)
class Chars:
    """One character from a set, as inclusive codepoint ranges, sorted and disjoint."""

    ranges: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Seq:
    items: tuple["Pattern", ...]


@dataclass(frozen=True)
class Alt:
    items: tuple["Pattern", ...]


@dataclass(frozen=True)
class Repeat:
    """``item`` from ``low`` to ``high`` times; ``high`` None is unbounded."""

    item: "Pattern"
    low: int
    high: int | None


@dataclass(frozen=True)
class Joined:
    """``item (sep item)*``, at least ``low`` items when ``low`` is 1 (else also nothing). Built with
    one copy of ``item`` and a loop back through ``sep``, so nesting it (JSON's objects of arrays of
    objects) does not double the automaton at each level as ``item (sep item)*`` would."""

    item: "Pattern"
    sep: "Pattern"
    low: int


@dataclass(frozen=True)
class Members:
    """JSON object members in a fixed order, each present or (when not required) absent, with
    ``sep`` between the present ones. Built as two hubs per member (none written yet, some written)
    around one copy of it, so k optional members cost k copies, not the 2^k that nested
    alternatives would."""

    items: tuple[tuple["Pattern", bool], ...]
    """(the member's ``"key": value`` pattern, required)."""
    sep: "Pattern"


Pattern = Union[Chars, Seq, Alt, Repeat, Joined, Members]
EMPTY = Seq(())
NEVER = Alt(())
"""A pattern no text matches: what a recursive rule or $ref nested past its depth becomes."""


def prune(p: Pattern) -> Pattern:
    """``p`` without the branches no text can complete, NEVER when nothing is left. Unrolled
    recursion ends in NEVER; without this the automaton would keep the edges that lead into it
    (the "[" before a rule nested too deep), and a model that took one would be left with no
    token to end its output."""
    memo: dict[int, Pattern] = {}

    def walk(q: Pattern) -> Pattern:
        done = memo.get(id(q))
        if done is None:
            done = memo[id(q)] = _pruned(q, walk)
        return done
    return walk(p)


def _pruned(p: Pattern, walk: Callable[[Pattern], Pattern]) -> Pattern:
    if isinstance(p, Chars):
        return p if p.ranges else NEVER
    if isinstance(p, Seq):
        items = tuple(walk(i) for i in p.items)
        return NEVER if NEVER in items else Seq(items)
    if isinstance(p, Alt):
        items = tuple(i for i in map(walk, p.items) if i != NEVER)
        return Alt(items) if items else NEVER
    if isinstance(p, Repeat):
        item = walk(p.item)
        return Repeat(item, p.low, p.high) if item != NEVER else (EMPTY if p.low == 0 else NEVER)
    if isinstance(p, Joined):
        item = walk(p.item)
        return Joined(item, walk(p.sep), p.low) if item != NEVER else (EMPTY if p.low == 0 else NEVER)
    members = tuple((walk(member), required) for member, required in p.items)
    if any(required and member == NEVER for member, required in members):
        return NEVER
    return Members(tuple((m, r) for m, r in members if m != NEVER), p.sep)


def literal(text: str) -> Pattern:
    """The exact text."""
    return Seq(tuple(Chars(((ord(c), ord(c)),)) for c in text))


def either(*options: str) -> Pattern:
    return Alt(tuple(literal(o) for o in options))


def normalise(ranges: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Sorted, merged, disjoint ranges."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return tuple(out)


def negate(ranges: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    """Every codepoint not in ``ranges``."""
    out, at = [], 0
    for lo, hi in normalise(list(ranges)):
        if lo > at:
            out.append((at, lo - 1))
        at = hi + 1
    if at <= MAX_CODEPOINT:
        out.append((at, MAX_CODEPOINT))
    return tuple(out)


def subtract(ranges: tuple[tuple[int, int], ...], minus: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    """The codepoints of ``ranges`` not in ``minus``."""
    keep = negate(minus)
    out = [(max(a, c), min(b, d)) for a, b in ranges for c, d in keep if max(a, c) <= min(b, d)]
    return normalise(out)


def _encode(cp: int) -> bytes:
    return chr(cp).encode("utf-8", "surrogatepass")


def utf8_sequences(lo: int, hi: int) -> list[list[tuple[int, int]]]:
    """The codepoints lo..hi as UTF-8: alternatives, each a sequence of inclusive byte ranges."""
    for edge in (0x7F, 0x7FF, 0xFFFF):  # split where the encoded length changes
        if lo <= edge < hi:
            return utf8_sequences(lo, edge) + utf8_sequences(edge + 1, hi)
    n = len(_encode(lo))
    for i in range(1, n):  # split until lo..hi differ only in whole trailing continuation bytes
        m = (1 << (6 * i)) - 1
        if lo & ~m != hi & ~m:
            if lo & m:
                return utf8_sequences(lo, lo | m) + utf8_sequences((lo | m) + 1, hi)
            if hi & m != m:
                return utf8_sequences(lo, (hi & ~m) - 1) + utf8_sequences(hi & ~m, hi)
    a, b = _encode(lo), _encode(hi)
    return [[(a[i], b[i]) for i in range(n)]]


class NFA:
    """A byte NFA: per state, byte-range edges ``(lo, hi, to)`` and epsilon edges; one start, one final."""

    def __init__(self) -> None:
        self.edges: list[list[tuple[int, int, int]]] = []
        self.eps: list[list[int]] = []
        self.start = self.final = 0

    def state(self) -> int:
        if len(self.edges) >= MAX_NFA_STATES:
            raise PatternError(f"{TOO_MANY_STATES}; make it smaller: fewer or smaller bounded repeats ({{m,n}}, "
                               "maxLength, maxItems), or fewer properties, choices or enum values")
        self.edges.append([])
        self.eps.append([])
        return len(self.edges) - 1


def compile_nfa(pattern: Pattern) -> NFA:
    """The byte NFA that accepts exactly the UTF-8 encodings of the texts ``pattern`` matches."""
    nfa = NFA()
    nfa.start, nfa.final = _build(nfa, pattern)
    return nfa


def _build(nfa: NFA, p: Pattern) -> tuple[int, int]:
    """(start, end) of a fragment for ``p``; ``end`` has no edges yet."""
    if isinstance(p, Chars):
        start, end = nfa.state(), nfa.state()
        if not p.ranges:
            raise PatternError("a character class that matches no character")
        # Sequences that end alike share their tail: the continuation bytes of every multi-byte
        # character of a wide class are a few states, not one path per sequence.
        tails: dict[tuple[tuple[int, int], ...], int] = {(): end}

        def tail(rest: tuple[tuple[int, int], ...]) -> int:
            if rest not in tails:
                state = nfa.state()
                nfa.edges[state].append((rest[0][0], rest[0][1], tail(rest[1:])))
                tails[rest] = state
            return tails[rest]

        for lo, hi in p.ranges:
            for s_lo, s_hi in ((lo, min(hi, SURROGATES[0] - 1)), (max(lo, SURROGATES[1] + 1), hi)):
                for seq in (utf8_sequences(s_lo, s_hi) if s_lo <= s_hi else []):
                    nfa.edges[start].append((seq[0][0], seq[0][1], tail(tuple(seq[1:]))))
        if not nfa.edges[start]:  # only surrogates, which UTF-8 cannot hold
            raise PatternError("a character class that matches only surrogates (U+D800 to U+DFFF), which text "
                               "cannot hold")
        return start, end
    if isinstance(p, Seq):
        if not p.items:
            start = end = nfa.state()
            return start, end
        start, end = _build(nfa, p.items[0])
        for item in p.items[1:]:
            s, e = _build(nfa, item)
            nfa.eps[end].append(s)
            end = e
        return start, end
    if isinstance(p, Alt):
        start, end = nfa.state(), nfa.state()
        for item in p.items:
            s, e = _build(nfa, item)
            nfa.eps[start].append(s)
            nfa.eps[e].append(end)
        return start, end
    if isinstance(p, Repeat):
        start = end = nfa.state()
        for _ in range(p.low):
            s, e = _build(nfa, p.item)
            nfa.eps[end].append(s)
            end = e
        if p.high is None:
            s, e = _build(nfa, p.item)
            nfa.eps[end].append(s)
            nfa.eps[e].append(end)  # loop: end -> item -> end
            return start, end
        last = nfa.state()
        nfa.eps[end].append(last)
        for _ in range(p.high - p.low):
            s, e = _build(nfa, p.item)
            nfa.eps[end].append(s)
            nfa.eps[e].append(last)
            end = e
        return start, last
    if isinstance(p, Joined):
        start, end = nfa.state(), nfa.state()
        s, e = _build(nfa, p.item)
        ss, se = _build(nfa, p.sep)
        nfa.eps[start].append(s)
        if p.low == 0:
            nfa.eps[start].append(end)
        nfa.eps[e] += [end, ss]
        nfa.eps[se].append(s)
        return start, end
    if isinstance(p, Members):
        n = len(p.items)
        none = [nfa.state() for _ in range(n + 1)]
        some = [nfa.state() for _ in range(n + 1)]
        for i, (item, required) in enumerate(p.items):
            s, e = _build(nfa, item)  # one copy: from either hub it leads to some[i + 1]
            nfa.eps[none[i]].append(s)
            nfa.eps[e].append(some[i + 1])
            if i:
                ss, se = _build(nfa, p.sep)
                nfa.eps[some[i]].append(ss)
                nfa.eps[se].append(s)
            if not required:
                nfa.eps[none[i]].append(none[i + 1])
                nfa.eps[some[i]].append(some[i + 1])
        end = nfa.state()
        nfa.eps[none[n]].append(end)
        nfa.eps[some[n]].append(end)
        return none[0], end
    raise AssertionError(f"not a pattern: {p!r}")


def after_marker(nfa: NFA, marker: bytes) -> NFA:
    """An NFA for any bytes up to the first ``marker``, then ``marker`` and a text ``nfa`` accepts.

    Before the marker every byte is allowed and the output may end there too: a reasoning model's
    thinking is free, and only its answer after ``</think>`` is constrained (as vLLM does). The
    free part is the marker's matching automaton (Knuth-Morris-Pratt), so the constraint starts at
    the marker's first occurrence and never at a later one.
    """
    if not marker:
        raise PatternError("the marker after which the constraint starts is empty")
    out = NFA()
    matched = [out.state() for _ in marker]  # state i: the text ends with the marker's first i bytes
    offset = len(out.edges)
    out.edges += [[(lo, hi, to + offset) for lo, hi, to in row] for row in nfa.edges]
    out.eps += [[to + offset for to in row] for row in nfa.eps]
    final = out.state()  # its own: nfa's final may have edges (a loop), which the free part must not reach
    out.eps[nfa.final + offset].append(final)
    fail = [0] * len(marker)
    for i in range(1, len(marker)):
        j = fail[i - 1]
        while j and marker[i] != marker[j]:
            j = fail[j - 1]
        fail[i] = j + 1 if marker[i] == marker[j] else 0
    for i, state in enumerate(matched):
        targets = []
        for byte in range(256):
            j = i
            while j and marker[j] != byte:
                j = fail[j - 1]
            j = j + 1 if marker[j] == byte else 0
            targets.append(nfa.start + offset if j == len(marker) else matched[j])
        lo = 0
        for byte in range(1, 257):
            if byte == 256 or targets[byte] != targets[lo]:
                out.edges[state].append((lo, byte - 1, targets[lo]))
                lo = byte
        out.eps[state].append(final)
    out.start, out.final = matched[0], final
    return out
