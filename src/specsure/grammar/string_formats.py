"""The string formats a JSON Schema's ``format`` narrows a string to, as patterns of its text.

Each follows the RFC a format validator checks against, so that an output specsure ends is one
that pydantic's or jsonschema's format check takes.
"""

from __future__ import annotations

from specsure.grammar.pattern import Pattern, Seq, literal
from specsure.grammar.regex import parse_regex

YEAR = r"(?:[0-9]{3}[1-9]|[0-9]{2}[1-9]0|[0-9][1-9]00|[1-9]000)"
"""0001 to 9999: RFC 3339 writes 0000 too, but validators read a date with Python's, which has no year 0."""
LEAP_YEAR = r"(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
DATE = parse_regex(r"(?:" + YEAR + r"-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
                   r"|02-(?:0[1-9]|1[0-9]|2[0-8]))|" + LEAP_YEAR + r"-02-29)")
"""RFC 3339's full-date, each month's days counted (a format validator refuses 2024-02-30)."""
TIME = parse_regex(r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]+)?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])")
"""RFC 3339's full-time: the offset is part of it (a format validator refuses a time without one)."""
FORMATS: dict[str, Pattern] = {
    "date": DATE,
    "time": TIME,
    "date-time": Seq((DATE, literal("T"), TIME)),
    "uuid": parse_regex(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"),
    "email": parse_regex(r"[a-zA-Z0-9_%+-]+(?:\.[a-zA-Z0-9_%+-]+)*@(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?\.)+"
                         r"[a-zA-Z]{2,}"),
    "ipv4": parse_regex(r"(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"),
}
"""String formats that narrow the text. The email form is the common one, stricter than RFC 5322 and
within what pydantic's EmailStr takes: no dot at either end of the local part or two in a row, and
no domain label that starts or ends with '-'."""
