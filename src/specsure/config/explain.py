"""Human-readable rendering of a Resolution: one row per field, then the warnings."""

from __future__ import annotations

import json
import textwrap
from typing import Any, Mapping, Protocol, Sequence

from specsure.config.token_tree import DraftTree


class Row(Protocol):
    """One field's decision, as explain shows it (``resolution.Decision`` is one)."""

    value: Any
    source: str
    reason: str

REASON_WIDTH = 72


def _show(value: Any) -> str:
    if isinstance(value, DraftTree):  # its own text, not JSON's nested lists
        return str(value)
    return "-" if value is None else (value if isinstance(value, str) else json.dumps(value))


def printable(text: str) -> str:
    """``text`` with control characters escaped (``\\x1b``, ``\\n``): a folder name holding a terminal's
    escape sequence or a newline must not recolour the terminal or break the table's rows."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def format_table(decisions: Mapping[str, Row], warnings: Sequence[str], *, speculative: bool = True) -> str:
    """The explain table: one row per field, then the warnings. Long reasons wrap under their own column.

    ``speculative=False`` adds the line that says plain decoding runs.
    """
    rows = [(name, printable(_show(d.value)), d.source, printable(d.reason)) for name, d in decisions.items()]
    w_name = max(len("field"), *(len(r[0]) for r in rows))
    w_value = min(48, max(len("value"), *(len(r[1]) for r in rows)))
    w_source = max(len("source"), *(len(r[2]) for r in rows))
    lines = [f"{'field':<{w_name}}  {'value':<{w_value}}  {'source':<{w_source}}  reason",
             f"{'-' * w_name}  {'-' * w_value}  {'-' * w_source}  {'-' * 6}"]
    indent = " " * (w_name + w_value + w_source + 6)
    for name, value, source, reason in rows:
        wrapped = textwrap.wrap(reason, REASON_WIDTH, break_on_hyphens=False) or [""]
        if len(value) > w_value:
            lines.append(f"{name:<{w_name}}  {value}")
            lines.append(f"{'':<{w_name}}  {'':<{w_value}}  {source:<{w_source}}  {wrapped[0]}")
        else:
            lines.append(f"{name:<{w_name}}  {value:<{w_value}}  {source:<{w_source}}  {wrapped[0]}")
        lines.extend(indent + more for more in wrapped[1:])
    if not speculative:
        lines.append("")
        lines.append("speculative decoding: off (no speculative config given); plain decoding runs.")
    lines.append("")
    if warnings:
        lines.append(f"warnings ({len(warnings)}):")
        # Paths must survive copy and paste, so never break inside one (at a hyphen or mid-word).
        lines.extend(textwrap.fill(printable(w), 100, initial_indent="  - ", subsequent_indent="    ",
                                   break_on_hyphens=False, break_long_words=False) for w in warnings)
    else:
        lines.append("warnings: none")
    return "\n".join(lines)
