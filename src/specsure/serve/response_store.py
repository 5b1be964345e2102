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
    """One kept response, as compact JSON text: kept as parsed objects, a response of many small
    items took 10 to 15 times the memory the store counted, so its bound meant gigabytes."""

    body_text: str
    conversation_text: str
    input_items_text: str

    @property
    def size(self) -> int:
        """Its JSON text, in characters: what the store counts against its bytes, and about what it holds."""
        return len(self.body_text) + len(self.conversation_text) + len(self.input_items_text)

    @property
    def body(self) -> dict[str, Any]:
        """The response object as it was answered."""
        return json.loads(self.body_text)

    @property
    def conversation(self) -> list[dict[str, Any]]:
        """Its whole conversation as chat messages, its output last, without its instructions (OpenAI's
        rule: a later response's instructions replace them)."""
        return json.loads(self.conversation_text)

    @property
    def input_items(self) -> list[dict[str, Any]]:
        """Its request's ``input`` as the items GET /v1/responses/{id}/input_items lists."""
        return json.loads(self.input_items_text)


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
        stored = Stored(_compact(body), _compact(conversation), _compact(input_items or []))
        size = stored.size
        with self._lock:
            replaced = self._kept.pop(body["id"], None)  # a background response's earlier state
            self._bytes -= replaced.size if replaced is not None else 0
            if self._capacity == 0 or size > self._max_bytes:
                return  # not kept (nor its earlier state: a stale in_progress would never end)
            self._kept[body["id"]] = stored
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
        return stored.conversation  # parsed afresh: the caller's to change

    def delete(self, response_id: str) -> None:
        with self._lock:
            found = self._kept.pop(response_id, None)
            self._bytes -= found.size if found is not None else 0
        if found is None:
            self.get(response_id)  # its 404


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
