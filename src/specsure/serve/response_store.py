"""The responses the server keeps (``store``), for GET /v1/responses/{id} and ``previous_response_id``."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from specsure.serve.errors import APIError

STORED_RESPONSES = 1024
"""How many responses the server keeps, in memory; the oldest goes first. Nothing is written to disk."""


@dataclass(frozen=True)
class Stored:
    body: dict[str, Any]
    """The response object as it was answered."""
    conversation: list[dict[str, Any]]
    """Its whole conversation as chat messages, its output last, without its instructions (OpenAI's
    rule: a later response's instructions replace them)."""


class ResponseStore:
    """The last ``capacity`` stored responses by id. Requests are parsed on worker threads while
    answers are kept from the event loop: one lock guards the dict."""

    def __init__(self, capacity: int = STORED_RESPONSES) -> None:
        if type(capacity) is not int or capacity < 0:
            raise ValueError(f"capacity = {capacity!r} must be an int >= 0 (0: keep none).")
        self._capacity = capacity
        self._kept: OrderedDict[str, Stored] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, body: dict[str, Any], conversation: list[dict[str, Any]]) -> None:
        if self._capacity == 0:
            return
        with self._lock:
            self._kept[body["id"]] = Stored(body, conversation)
            while len(self._kept) > self._capacity:
                self._kept.popitem(last=False)

    def get(self, response_id: str, param: str | None = None) -> Stored:
        """The stored response, or a 404 that says why it may be gone."""
        with self._lock:
            stored = self._kept.get(response_id)
        if stored is None:
            raise APIError(f"no stored response has the id {response_id!r}: it was never made here, was sent with "
                           f'"store": false, was deleted, or was dropped (this server keeps the last '
                           f"{self._capacity}, in memory, until it restarts).", 404, param=param,
                           code="response_not_found")
        return stored

    def conversation(self, response_id: str) -> list[dict[str, Any]]:
        """What ``previous_response_id`` continues: the stored response's messages, its output last."""
        return [dict(m) for m in self.get(response_id, "previous_response_id").conversation]

    def delete(self, response_id: str) -> None:
        with self._lock:
            found = self._kept.pop(response_id, None)
        if found is None:
            self.get(response_id)  # its 404
