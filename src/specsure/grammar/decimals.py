"""Numbers in a range as decimal text: the pattern behind JSON Schema's bounds on a number.

A number in range is written as an integer part and, if any, a fraction: never with an exponent,
whose digits an automaton could not weigh against a bound. A text with a fraction has at most
MAX_DIGITS digits: a validator reads it as a double, and ``0.99999999999999999`` is 1.0 there,
outside an exclusive maximum of 1. Every text is a valid JSON number the schema accepts, read
exactly or as a double; the ones left out (``1e-1``, more digits) say the same values another way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from specsure.grammar.integers import DIGIT, NONZERO, integer_range
from specsure.grammar.pattern import NEVER, Alt, Chars, Pattern, PatternError, Repeat, Seq, literal, normalise

MAX_MAGNITUDE = Decimal(10) ** 18
"""Bounds past this are refused, as the integers' are."""
MAX_DIGITS = 15
"""The most digits, integer part and fraction together, of a text with a fraction: a double holds
15 significant decimal digits exactly, so such a text keeps its order against every bound when a
validator reads both as doubles. A text without a fraction is read as an exact integer."""


@dataclass(frozen=True)
class Bound:
    """One end of a range: its value, and whether the value itself is left out (exclusive)."""

    value: Decimal
    strict: bool


def number_bounds(schema: dict[str, Any], path: str) -> tuple[Bound | None, Bound | None]:
    """(low, high) from minimum, exclusiveMinimum, maximum and exclusiveMaximum: the tighter of each pair."""
    ends: list[Bound | None] = [None, None]
    for i, keys in enumerate((("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum"))):
        for name, strict in zip(keys, (False, True)):
            value = schema.get(name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise PatternError(f"{path}/{name} is {value!r}; it must be a finite number")
            bound = Bound(Decimal(repr(value)) if isinstance(value, float) else Decimal(value), strict)
            if abs(bound.value) > MAX_MAGNITUDE:
                raise PatternError(f"{path}/{name} is {value}; bounds beyond 10^18 are not supported")
            ends[i] = bound if ends[i] is None else _tighter(ends[i], bound, i == 0)  # type: ignore[arg-type]
    return ends[0], ends[1]


def _tighter(a: Bound, b: Bound, low: bool) -> Bound:
    if a.value != b.value:
        return (a if a.value > b.value else b) if low else (a if a.value < b.value else b)
    return a if a.strict else b


def decimal_range(low: Bound | None, high: Bound | None, path: str) -> Pattern:
    """The decimal texts of the numbers from ``low`` to ``high`` (None: unbounded)."""
    options = []
    if high is None or high.value > 0 or (high.value == 0 and not high.strict):
        floor = low if low is not None and low.value >= 0 else Bound(Decimal(0), False)
        options.append(_magnitudes(floor, high))
    if low is None or low.value < 0:  # '-' and the magnitude, above 0 (zero is written without its sign)
        bottom = Bound(-high.value, high.strict) if high is not None and high.value < 0 else Bound(Decimal(0), True)
        top = Bound(-low.value, low.strict) if low is not None else None
        options.append(Seq((literal("-"), _magnitudes(bottom, top))))
    options = [o for o in options if o != NEVER and not (isinstance(o, Seq) and NEVER in o.items)]
    if (low is None or low.value < 0 or (low.value == 0 and not low.strict)) and \
            (high is None or high.value > 0 or (high.value == 0 and not high.strict)):
        options.append(Seq((literal("-0"), Repeat(Seq((literal("."), Repeat(literal("0"), 1, MAX_DIGITS - 1))), 0, 1))))
        # zero in range: pydantic writes a negative zero as -0.0
    if not options:
        raise PatternError(f"{path}: no number lies between its minimum and its maximum")
    return options[0] if len(options) == 1 else Alt(tuple(options))


def _split(value: Decimal) -> tuple[int, str]:
    """A non-negative value's integer part and its fraction's digits, without trailing zeros."""
    whole, _, fraction = format(value, "f").partition(".")
    return int(whole), fraction.rstrip("0")


def _magnitudes(low: Bound, high: Bound | None) -> Pattern:
    """The non-negative numbers from ``low`` to ``high``, as an integer part and a fraction."""
    lo_int, lo_frac = _split(low.value)
    options = [Seq((literal(str(lo_int)), _fraction(lo_int, lo_frac, low.strict, None, False)))] \
        if high is None or lo_int < int(_split(high.value)[0]) else []
    if high is None:
        return Alt((*options, *_whole_parts(lo_int + 1, None)))
    hi_int, hi_frac = _split(high.value)
    if lo_int > hi_int or (low.value == high.value and (low.strict or high.strict)):
        return NEVER
    if lo_int == hi_int:
        return Seq((literal(str(lo_int)), _fraction(lo_int, lo_frac, low.strict, hi_frac, high.strict)))
    options += _whole_parts(lo_int + 1, hi_int - 1)
    options.append(Seq((literal(str(hi_int)), _fraction(hi_int, None, False, hi_frac, high.strict))))
    return Alt(tuple(options))


def _whole_parts(low: int, high: int | None) -> list[Pattern]:
    """The integers from ``low`` to ``high`` (None: unbounded), each with any fraction that keeps
    the text within MAX_DIGITS: one option per length of the integer part."""
    options: list[Pattern] = []
    length = len(str(low))
    while high is None or low <= high:
        top = 10 ** length - 1 if high is None else min(high, 10 ** length - 1)
        room = MAX_DIGITS - length
        fraction = Repeat(Seq((literal("."), Repeat(DIGIT, 1, room))), 0, 1) if room > 0 else literal("")
        if high is None and room <= 0:  # every longer integer, without a fraction
            options.append(integer_range(low, None))
            break
        options.append(Seq((integer_range(low, top), fraction)))
        low, length = top + 1, length + 1
    return options


def _fraction(whole: int, lo: str | None, lo_strict: bool, hi: str | None, hi_strict: bool) -> Pattern:
    """What may follow the integer part ``whole``: nothing, or '.' and digits, so that the fraction
    is at least ``lo``'s (a string of digits; None: no lower bound) and at most ``hi``'s."""
    room = MAX_DIGITS - len(str(whole))
    empty, digits = _digits(lo or "", hi or "", lo is not None, hi is not None, lo_strict, hi_strict, 0, room)
    tail = [] if digits == NEVER else [Seq((literal("."), digits))]
    if not empty and not tail:
        return NEVER
    return Alt(tuple(([literal("")] if empty else []) + tail))


def _digits(lo: str, hi: str, lo_tight: bool, hi_tight: bool, lo_strict: bool, hi_strict: bool,
            i: int, room: int) -> tuple[bool, Pattern]:
    """(whether the fraction may end here, the one or more digits, at most ``room``, that may
    follow), where the digits so far equal ``lo``'s first i while ``lo_tight`` and ``hi``'s while
    ``hi_tight``."""
    if lo_tight and i >= len(lo) and not lo_strict:
        lo_tight = False  # equal to the bound so far, and whatever follows is at least zero
    if room <= 0:  # no digit more: the fraction ends here, if it may
        return not lo_tight and (not hi_tight or i < len(hi) or not hi_strict), NEVER
    if not lo_tight and not hi_tight:
        return True, Repeat(DIGIT, 1, room)
    if hi_tight and i >= len(hi):  # equal to the upper bound: only zeros may follow, if the bound is in
        return (False, NEVER) if hi_strict or lo_tight else (True, Repeat(literal("0"), 1, room))
    if lo_tight and i >= len(lo) and not hi_tight:  # equal to an exclusive lower bound: a nonzero digit must come
        return False, Alt(tuple(Seq((literal("0" * k), NONZERO, Repeat(DIGIT, 0, room - k - 1))) for k in range(room)))
    empty = not lo_tight and (not hi_tight or i < len(hi))
    groups: dict[tuple[bool, bool], list[int]] = {}
    for c in range(10):
        floor = int(lo[i]) if lo_tight and i < len(lo) else 0
        ceiling = int(hi[i]) if hi_tight else 9
        if floor <= c <= ceiling:
            groups.setdefault((lo_tight and c == floor, hi_tight and c == ceiling), []).append(c)
    options = []
    for (next_lo, next_hi), chosen in groups.items():
        more_empty, more = _digits(lo, hi, next_lo, next_hi, lo_strict, hi_strict, i + 1, room - 1)
        after = [literal("")] if more_empty else []
        after += [more] if more != NEVER else []
        if after:
            options.append(Seq((Chars(normalise([(0x30 + c, 0x30 + c) for c in chosen])), Alt(tuple(after)))))
    return empty, Alt(tuple(options)) if options else NEVER
