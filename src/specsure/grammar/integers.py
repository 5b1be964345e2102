"""Integers in a range as decimal text: the pattern behind JSON Schema's integer bounds."""

from __future__ import annotations

import math
from typing import Any

from specsure.grammar.pattern import Alt, Chars, Pattern, PatternError, Repeat, Seq, literal

DIGIT = Chars(((0x30, 0x39),))
NONZERO = Chars(((0x31, 0x39),))


def integer_range(low: int | None, high: int | None) -> Pattern:
    """The decimal integers from ``low`` to ``high`` (None: unbounded), written without leading zeros."""
    if low is not None and high is not None and low > high:
        raise PatternError(f"no integer lies between {low} and {high}")
    options: list[Pattern] = []
    if low is None or low < 0:  # the negative ones, as '-' and their magnitude
        top = None if low is None else -low
        bottom = 1 if high is None or high >= 0 else -high
        options.append(Seq((literal("-"), _naturals(bottom, top))))
    if high is None or high >= 0:
        options.append(_naturals(max(low or 0, 0), high))
    return options[0] if len(options) == 1 else Alt(tuple(options))


def _naturals(low: int, high: int | None) -> Pattern:
    """low..high (>= 0; high None is unbounded) in decimal without leading zeros."""
    options: list[Pattern] = []
    last = len(str(high)) if high is not None else len(str(low))
    for n in range(len(str(low)), last + 1):
        lo = max(low, 10 ** (n - 1) if n > 1 else 0)
        hi = min(high, 10 ** n - 1) if high is not None else 10 ** n - 1
        if lo <= hi:
            options.append(_fixed(str(lo), str(hi)))
    if high is None:  # every longer number
        options.append(Seq((NONZERO, Repeat(DIGIT, last, None))))
    return options[0] if len(options) == 1 else Alt(tuple(options))


def _fixed(lo: str, hi: str) -> Pattern:
    """Digit strings of this one length from lo to hi (leading zeros allowed past the first digit)."""
    if lo.strip("0") == "" and hi.strip("9") == "":  # every string of the length: one repeat, not two recursions
        return Repeat(DIGIT, len(lo), len(lo))
    if len(lo) == 1:
        return Chars(((ord(lo), ord(hi)),))
    if lo[0] == hi[0]:
        return Seq((literal(lo[0]), _fixed(lo[1:], hi[1:])))
    k = len(lo) - 1
    options = [Seq((literal(lo[0]), _fixed(lo[1:], "9" * k)))]
    if int(lo[0]) + 1 <= int(hi[0]) - 1:
        options.append(Seq((Chars(((ord(lo[0]) + 1, ord(hi[0]) - 1),)), Repeat(DIGIT, k, k))))
    options.append(Seq((literal(hi[0]), _fixed("0" * k, hi[1:]))))
    return Alt(tuple(options))


def integer_bounds(schema: dict[str, Any], path: str) -> tuple[int | None, int | None]:
    """(low, high) from minimum, maximum and their exclusive forms, rounded inward to integers."""
    bounds: list[int | None] = [None, None]
    for i, (key, strict, rounding) in enumerate((("minimum", "exclusiveMinimum", math.ceil),
                                                  ("maximum", "exclusiveMaximum", math.floor))):
        for name, shift in ((key, 0), (strict, 1 if i == 0 else -1)):
            value = schema.get(name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise PatternError(f"{path}/{name} is {value!r}; it must be a finite number")
            bound = rounding(value) + (shift if rounding(value) == value else 0) if shift else rounding(value)
            if abs(bound) > 10 ** 18:
                raise PatternError(f"{path}/{name} is {value}; bounds beyond 10^18 are not supported")
            current = bounds[i]
            bounds[i] = bound if current is None else (max(current, bound) if i == 0 else min(current, bound))
    return bounds[0], bounds[1]
