"""Quiet loads: transformers' per-load progress bars and LOAD REPORT tables, hidden around
specsure's own loads.

transformers draws a "Loading weights" bar on every ``from_pretrained`` and logs a LOAD REPORT
table of the checkpoint tensors its class does not use. specsure reads those tensors itself
(MTP layers inside a target) and turns missing ones into errors itself (``loading``), so both
only bury specsure's own lines. Every other transformers log record still shows, and nothing is
changed outside the ``with`` block.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Iterator

from transformers.utils import logging as hf_logging

REPORT_LOGGER = "transformers.modeling_utils"
"""The logger transformers writes its LOAD REPORT to (``_finalize_model_loading``)."""
_REPORT_TITLE = "LOAD REPORT"


class _HoldLoadReports(logging.Filter):
    """Holds back LOAD REPORT records and lets every other record through."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if _REPORT_TITLE in record.getMessage():
            self.held.append(record)
            return False
        return True


@contextmanager
def quiet_loading() -> Iterator[list[logging.LogRecord]]:
    """Hide transformers' progress bars and LOAD REPORT tables while the block runs.

    When the block raises, the held reports are logged after all: transformers' errors for
    mismatched shapes or failed conversions say the details are in the report above. The block
    gets the held records, and may clear them when its own error says what they would.
    """
    bars = hf_logging.is_progress_bar_enabled()
    if bars:
        hf_logging.disable_progress_bar()
    reports = logging.getLogger(REPORT_LOGGER)
    hold = _HoldLoadReports()
    reports.addFilter(hold)
    ok = False
    try:
        yield hold.held
        ok = True
    finally:
        reports.removeFilter(hold)
        if bars:
            hf_logging.enable_progress_bar()
        if not ok:
            for record in hold.held:
                reports.handle(record)
