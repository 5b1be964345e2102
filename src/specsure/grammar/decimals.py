"""Numbers in a range as decimal text: the pattern behind JSON Schema's bounds on a number.

A number in range is written as an integer part and, if any, a fraction: never with an exponent,
whose digits an automaton could not weigh against a bound. Every text is a valid JSON number the
schema accepts; the ones left out (``1e-1`` for ``0.1``) say the same values another way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from specsure.grammar.integers import DIGIT, NONZERO, integer_range
from specsure.grammar.pattern import NEVER, Alt, Chars, Pattern, PatternError, Repeat, Seq, literal

MAX_MAGNITUDE = Decimal(10) ** 18
"""Bounds past this are refused, as the integers' are."""
ANY_FRACTION = Repeat(Seq((literal("."), Repeat(DIGIT, 1, None))), 0, 1)
ZEROS = Repeat(literal("0"), 1, None)


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
    if high is None:
        first = Seq((literal(str(lo_int)), _fraction(lo_frac, low.strict, None, False)))
        return Alt((first, Seq((integer_range(lo_int + 1, None), ANY_FRACTION))))
    hi_int, hi_frac = _split(high.value)
    if lo_int > hi_int or (low.value == high.value and (low.strict or high.strict)):
        return NEVER
    if lo_int == hi_int:
        return Seq((literal(str(lo_int)), _fraction(lo_frac, low.strict, hi_frac, high.strict)))
    options = [Seq((literal(str(lo_int)), _fraction(lo_frac, low.strict, None, False)))]
    if lo_int + 1 <= hi_int - 1:
        options.append(Seq((integer_range(lo_int + 1, hi_int - 1), ANY_FRACTION)))
    options.append(Seq((literal(str(hi_int)), _fraction(None, False, hi_frac, high.strict))))
    return Alt(tuple(options))


def _fraction(lo: str | None, lo_strict: bool, hi: str | None, hi_strict: bool) -> Pattern:
    """What may follow the integer part: nothing, or '.' and digits, so that the fraction is at
    least ``lo``'s (a string of digits; None: no lower bound) and at most ``hi``'s."""
    empty, digits = _digits(lo or "", hi or "", lo is not None, hi is not None, lo_strict, hi_strict, 0)
    tail = [] if digits == NEVER else [Seq((literal("."), digits))]
    return Alt(tuple(([literal("")] if empty else []) + tail))


def _digits(lo: str, hi: str, lo_tight: bool, hi_tight: bool, lo_strict: bool, hi_strict: bool,
            i: int) -> tuple[bool, Pattern]:
    """(whether the fraction may end here, the one or more digits that may follow), where the
    digits so far equal ``lo``'s first i while ``lo_tight`` and ``hi``'s while ``hi_tight``."""
    if lo_tight and i >= len(lo) and not lo_strict:
        lo_tight = False  # equal to the bound so far, and whatever follows is at least zero
    if not lo_tight and not hi_tight:
        return True, Repeat(DIGIT, 1, None)
    if hi_tight and i >= len(hi):  # equal to the upper bound: only zeros may follow, if the bound is in
        return (False, NEVER) if hi_strict or lo_tight else (True, ZEROS)
    if lo_tight and i >= len(lo) and not hi_tight:  # equal to an exclusive lower bound: a nonzero digit must come
        return False, Seq((Repeat(literal("0"), 0, None), NONZERO, Repeat(DIGIT, 0, None)))
    empty = not lo_tight and (not hi_tight or i < len(hi))
    groups: dict[tuple[bool, bool], list[int]] = {}
    for c in range(10):
        floor = int(lo[i]) if lo_tight and i < len(lo) else 0
        ceiling = int(hi[i]) if hi_tight else 9
        if floor <= c <= ceiling:
            groups.setdefault((lo_tight and c == floor, hi_tight and c == ceiling), []).append(c)
    options = []
    for (next_lo, next_hi), chosen in groups.items():
        more_empty, more = _digits(lo, hi, next_lo, next_hi, lo_strict, hi_strict, i + 1)
        after = [literal("")] if more_empty else []
        after += [more] if more != NEVER else []
        if after:
            ranges = tuple((0x30 + c, 0x30 + c) for c in chosen)
            options.append(Seq((Chars(_merged(ranges)), Alt(tuple(after)))))
    return empty, Alt(tuple(options)) if options else NEVER


def _merged(ranges: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    out: list[tuple[int, int]] = []
    for lo, hi in ranges:
        if out and lo == out[-1][1] + 1:
            out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return tuple(out)
