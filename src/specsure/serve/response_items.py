"""A stored response's input items as OpenAI lists them: ``GET /v1/responses/{id}/input_items``.

The items are the request's own ``input`` (not the earlier turns a ``previous_response_id``
brought in, which their own responses list), each in the form the API returns: text input is one
user message of an ``input_text`` part, a message's text content becomes one part, and every item
has an id (its own, or a new one) and a status.
"""

from __future__ import annotations

from typing import Any

from specsure.serve.errors import RequestError, shown
from specsure.serve.response_object import new_id

DEFAULT_LIMIT = 20
MAX_LIMIT = 100
_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


def listed_items(value: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``input`` (already checked by `input_messages`) as the items the list route returns."""
    if isinstance(value, str):
        value = [{"type": "message", "role": "user", "content": value}]
    items: list[dict[str, Any]] = []
    seen: set[str] = set()
    for given in value:
        kind = given.get("type", "message")
        item_id = given.get("id")
        if not item_id or item_id in seen:  # ids must be unique for `after` to page through them
            item_id = new_id(_PREFIX[kind])
        seen.add(item_id)
        item = {"id": item_id, "type": kind, **{k: v for k, v in given.items() if k not in ("id", "type", "status")}}
        if kind == "message" and isinstance(item.get("content"), str):
            if item.get("role") == "assistant":
                item["content"] = [{"type": "output_text", "text": item["content"], "annotations": []}]
            else:
                item["content"] = [{"type": "input_text", "text": item["content"]}]
        item["status"] = given.get("status") or "completed"
        items.append(item)
    return items


def page(items: list[dict[str, Any]], after: str | None, limit: str | None, order: str | None) -> dict[str, Any]:
    """One page of ``items`` as OpenAI's list object: ``order`` "desc" (newest first, the default) or
    "asc", up to ``limit`` (1 to 100, default 20) after the item whose id is ``after``."""
    if order is None:
        order = "desc"
    if order not in ("asc", "desc"):
        raise RequestError(f"order = {shown(order)} must be asc or desc.", "order")
    count = DEFAULT_LIMIT
    if limit is not None:
        if not (limit.isascii() and limit.isdigit()) or not 1 <= int(limit) <= MAX_LIMIT:
            raise RequestError(f"limit = {shown(limit)} must be an integer from 1 to {MAX_LIMIT}.", "limit")
        count = int(limit)
    ordered = items if order == "asc" else items[::-1]
    start = 0
    if after is not None:
        ids = [item["id"] for item in ordered]
        if after not in ids:
            raise RequestError(f"after = {shown(after)} is not the id of one of this response's input items.", "after")
        start = ids.index(after) + 1
    data = ordered[start:start + count]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": start + count < len(ordered)}
