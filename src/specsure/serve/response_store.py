"""The responses the server keeps (``store``), for GET /v1/responses/{id} (and its input items) and
``previous_response_id``."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from specsure.serve.errors import APIError, RequestError

STORED_RESPONSES = 1024
"""How many responses the server keeps, in memory; the oldest goes first. Nothing is written to disk."""
STORED_BYTES = 256 * 2**20
"""And how much JSON text they may hold together (bodies and conversations): the oldest go first."""


@dataclass(frozen=True)
class Stored:
    body: dict[str, Any]
    """The response object as it was answered."""
    size: int
    """Its body's and conversation's JSON text, in characters: what the store counts against its bytes."""
    conversation: list[dict[str, Any]]
    """Its whole conversation as chat messages, its output last, without its instructions (OpenAI's
    rule: a later response's instructions replace them)."""
    input_items: list[dict[str, Any]]
    """Its request's ``input`` as the items GET /v1/responses/{id}/input_items lists."""


class ResponseStore:
    """The last ``capacity`` stored responses by id. Requests are parsed on worker threads while
    answers are kept from the event loop: one lock guards the dict."""

    def __init__(self, capacity: int = STORED_RESPONSES, max_bytes: int = STORED_BYTES) -> None:
        if type(capacity) is not int or capacity < 0:
            raise ValueError(f"capacity = {capacity!r} must be an int >= 0 (0: keep none).")
        self._capacity, self._max_bytes, self._bytes = capacity, max_bytes, 0
        self._kept: OrderedDict[str, Stored] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, body: dict[str, Any], conversation: list[dict[str, Any]],
            input_items: list[dict[str, Any]] | None = None) -> None:
        items = input_items or []
        size = len(json.dumps(body)) + len(json.dumps(conversation)) + len(json.dumps(items))
        with self._lock:
            replaced = self._kept.pop(body["id"], None)  # a background response's earlier state
            self._bytes -= replaced.size if replaced is not None else 0
            if self._capacity == 0 or size > self._max_bytes:
                return  # not kept (nor its earlier state: a stale in_progress would never end)
            self._kept[body["id"]] = Stored(body, size, conversation, items)
            self._bytes += size
            while len(self._kept) > self._capacity or self._bytes > self._max_bytes:
                self._bytes -= self._kept.popitem(last=False)[1].size

    def get(self, response_id: str, param: str | None = None) -> Stored:
        """The stored response, or a 404 that says why it may be gone."""
        with self._lock:
            stored = self._kept.get(response_id)
        if stored is None:
            raise APIError(f"no stored response has the id {response_id!r}: it was never made here, was sent with "
                           f'"store": false, was deleted, or was dropped (this server keeps the last '
                           f"{self._capacity}, up to {self._max_bytes // 2**20} MiB of them, in memory, until it "
                           "restarts).", 404, param=param,
                           code="response_not_found")
        return stored

    def conversation(self, response_id: str) -> list[dict[str, Any]]:
        """What ``previous_response_id`` continues: the stored response's messages, its output last."""
        stored = self.get(response_id, "previous_response_id")
        if stored.body.get("status") in ("queued", "in_progress"):
            raise RequestError(f"previous_response_id = {response_id!r} is a background response still "
                               f"{stored.body['status']}; continue it once it has finished (GET /v1/responses/"
                               f"{response_id} tells).", "previous_response_id")
        return [dict(m) for m in stored.conversation]

    def delete(self, response_id: str) -> None:
        with self._lock:
            found = self._kept.pop(response_id, None)
            self._bytes -= found.size if found is not None else 0
        if found is None:
            self.get(response_id)  # its 404
