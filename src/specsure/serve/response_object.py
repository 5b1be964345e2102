"""The Responses API's answer: the response object, whole, or as the events of a stream.

A response's ``output`` is a list of items in the order the model wrote them: its thinking (a
``reasoning`` item, under a reasoning parser), its text (a ``message`` item with one
``output_text`` part) and its calls (``function_call`` items). A stream tells the same object as
events: ``response.created`` and ``response.in_progress``; per item ``response.output_item.added``,
its deltas (``response.reasoning_text.delta``, ``response.output_text.delta``,
``response.function_call_arguments.delta``) between its part's ``added`` and ``done``, and
``response.output_item.done``; then ``response.completed`` (or ``response.incomplete`` when the
output hit ``max_output_tokens``) with the whole object. Every event carries its
``sequence_number`` and, as OpenAI writes them, an ``event:`` line with its type.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Callable, Literal, Sequence

from specsure.decode.completion import Completion, TokenLogprob
from specsure.serve.responses import ReasoningCount, TokenText, chat_logprobs, speculative
from specsure.serve.tool_calls import ToolCall

Status = Literal["completed", "incomplete", "failed", "in_progress", "queued", "cancelled"]


def new_id(prefix: str) -> str:
    """An object id in OpenAI's style: ``resp_``, ``msg_``, ``rs_``, ``fc_`` and 32 hex digits."""
    return f"{prefix}_{uuid.uuid4().hex}"


def reasoning_item(text: str, status: Status, item_id: str | None = None) -> dict[str, Any]:
    """The thinking as a reasoning item: its text as ``content`` (no summary is written)."""
    return {"id": item_id or new_id("rs"), "type": "reasoning", "summary": [],
            "content": [{"type": "reasoning_text", "text": text}], "status": status}


def message_item(text: str, logprobs: list[dict[str, Any]] | None, status: Status,
                 item_id: str | None = None) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
    if logprobs is not None:
        part["logprobs"] = logprobs
    return {"id": item_id or new_id("msg"), "type": "message", "role": "assistant", "status": status,
            "content": [part]}


def call_item(call: ToolCall, status: Status, item_id: str | None = None) -> dict[str, Any]:
    return {"id": item_id or new_id("fc"), "type": "function_call", "call_id": call.id, "name": call.name,
            "arguments": call.arguments, "status": status}


def output_items(reasoning: str | None, content: str | None, calls: Sequence[ToolCall],
                 logprobs: list[dict[str, Any]] | None, status: Status) -> list[dict[str, Any]]:
    """A finished answer's items: its thinking (when split off), its text, its calls; an answer that
    said nothing at all is one empty message (as its stream tells it). Only the last item is
    ``incomplete`` when the output was cut: the ones before it were finished."""
    items = [reasoning_item(reasoning, "completed")] if reasoning else []  # no thinking, no item (vLLM's)
    if content:
        items.append(message_item(content, logprobs, "completed"))
    items += [call_item(call, "completed") for call in calls]
    items = items or [message_item("", logprobs, "completed")]
    items[-1]["status"] = status
    return items


def text_logprobs(entries: Sequence[TokenLogprob], text: TokenText, before: Sequence[int] = ()) -> list[dict[str, Any]]:
    """An output_text's ``logprobs``: chat's entries (token, logprob, bytes, top_logprobs)."""
    return chat_logprobs(entries, text, before)["content"]


def as_messages(items: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """A response's output as the chat messages a later turn continues: one assistant turn."""
    message: dict[str, Any] = {"role": "assistant", "content": ""}
    for item in items:
        if item["type"] == "reasoning":
            message["reasoning"] = "".join(part["text"] for part in item["content"])
        elif item["type"] == "message":
            message["content"] += "".join(part["text"] for part in item["content"])
        else:
            message.setdefault("tool_calls", []).append(
                {"id": item["call_id"], "type": "function",
                 "function": {"name": item["name"], "arguments": item["arguments"]}})
    return [message]


def response_usage(completion: Completion | None, thinking: ReasoningCount | None) -> dict[str, Any] | None:
    if completion is None:
        return None
    prompt, out = len(completion.prompt_token_ids), len(completion.token_ids)
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": completion.cached_tokens}, "output_tokens": out,
            "output_tokens_details": {"reasoning_tokens": thinking(completion) if thinking is not None else 0},
            "total_tokens": prompt + out}


class ResponseHead:
    """What every form of one response shares: its id, creation time, model and the request's settings."""

    def __init__(self, model_name: str, method: str | None, settings: dict[str, Any]) -> None:
        self.id, self.created = new_id("resp"), int(time.time())
        self._model, self._method, self._settings = model_name, method, settings

    def body(self, status: Status, output: list[dict[str, Any]], completion: Completion | None = None,
             thinking: ReasoningCount | None = None, error: dict[str, Any] | None = None) -> dict[str, Any]:
        """The response object; ``completion`` gives its usage and speculative figures once it has run."""
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        done = status in ("completed", "incomplete")
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "completed_at": int(time.time()) if done else None, "error": error,
                "incomplete_details": incomplete, "model": self._model, "output": output, **self._settings,
                "usage": response_usage(completion, thinking),
                "speculative": speculative([completion], self._method) if completion is not None else None}


    def finished(self, completion: Completion, reasoning: str | None, content: str | None, calls: Sequence[ToolCall],
                 text: TokenText | None, thinking: ReasoningCount | None) -> dict[str, Any]:
        """A finished answer's object; ``text``: names its message's tokens in ``logprobs``, when asked for."""
        logprobs = None
        if text is not None and completion.logprobs is not None:
            # The message's own tokens: those of the thinking (and its closing tag) come first. (No
            # call shares them: logprobs with tools are refused.)
            skipped = thinking(completion) if thinking is not None else 0
            logprobs = text_logprobs(completion.logprobs[skipped:], text, completion.token_ids[:skipped])
        status = finished_status(completion)
        return self.body(status, output_items(reasoning, content, calls, logprobs, status), completion, thinking)


def finished_status(completion: Completion) -> Status:
    """``incomplete`` when the output was cut at its token limit (OpenAI's ``max_output_tokens`` reason)."""
    return "incomplete" if completion.finish_reason == "length" else "completed"


class ResponseEvents:
    """The events of one streamed response, fed as ``EventStream`` feeds a ``ChunkWriter``: text, or
    the chat deltas (reasoning, content, tool calls) a parser split it into, step by step.

    The items come in the order the whole object has them, one open at a time (OpenAI's contract):
    the thinking, then one message that stays open to the end (text after a call joins it, as in the
    whole answer), then the calls, each whole once the message has closed: a call parsed while the
    message may still grow is held until then.
    ``thought``: how many of the output's first tokens are thinking (its closing tag included), for
    the message's logprobs and the usage; ``stored``: called with the final object, to keep it.
    """

    def __init__(self, head: ResponseHead, text: TokenText, logprobs: bool,
                 thought: Callable[[Sequence[int]], int] | None, stored: Callable[[dict[str, Any]], None]) -> None:
        self._head, self._text, self._logprobs, self._thought, self._stored = head, text, logprobs, thought, stored
        self._seq = 0
        self._items: list[dict[str, Any]] = []
        """The output so far: finished items whole, open ones as they stand."""
        self._open: dict[int, str] = {}
        """Output index -> kind (reasoning, message, call) of each item still streaming."""
        self._message: int | None = None
        self._calls: dict[int, dict[str, Any]] = {}
        """A chat delta's call index -> its item, held until the message has closed."""
        self._ids: list[int] = []  # the output so far, and its logprob entries
        self._entries: list[TokenLogprob] = []
        self._shown = 0  # entries already given to the message
        self._skip: int | None = None  # the thinking's tokens, counted at the message's first text

    def start(self) -> bytes:
        snapshot = self._head.body("in_progress", [])
        return self._event("response.created", response=snapshot) + \
            self._event("response.in_progress", response=snapshot)

    def delta(self, index: int, text: str | None, token_ids: list[int],
              logprobs: list[TokenLogprob] | None = None, pieces: list[dict[str, Any]] | None = None) -> bytes:
        self._ids += token_ids
        self._entries += logprobs or []
        pieces = pieces if pieces is not None else ([{"content": text}] if text else [])
        out = b""
        for piece in pieces:
            if piece.get("reasoning"):
                out += self._reasoning(piece["reasoning"])
            if piece.get("content"):
                out += self._content(piece["content"])
            for call in piece.get("tool_calls") or []:
                out += self._call(call)
        return out

    def finish(self, index: int, completion: Completion, text: str | None, token_ids: list[int],
               logprobs: list[TokenLogprob] | None = None, pieces: list[dict[str, Any]] | None = None,
               finish_reason: str | None = None) -> bytes:
        out = self.delta(index, text, token_ids, logprobs, pieces)
        if not self._items and not self._calls:  # nothing was said: still an (empty) message, as unstreamed
            out += self._add(message_item("", [] if self._logprobs else None, "in_progress"), "message")
            self._message = len(self._items) - 1
            out += self._part("added", self._message, self._items[-1]["content"][0])
        if self._message is not None and self._message in self._open and (shown := self._message_logprobs()):
            # Tokens whose text is empty (the end-of-sequence token) carry logprobs all the same, as unstreamed.
            self._items[self._message]["content"][0]["logprobs"] += shown
            out += self._event("response.output_text.delta", **self._at(self._message), content_index=0, delta="",
                               logprobs=shown)
        status = finished_status(completion)
        calls = [self._calls[i] for i in sorted(self._calls)]
        for at in sorted(self._open):  # only the last item was cut
            out += self._close(at, status if at == len(self._items) - 1 and not calls else "completed")
        for number, call in enumerate(calls, start=1):
            arguments, call["arguments"] = call["arguments"], ""
            out += self._add(call, "call")
            at = len(self._items) - 1
            if arguments:
                call["arguments"] = arguments
                out += self._event("response.function_call_arguments.delta", **self._at(at), delta=arguments)
            out += self._close(at, status if number == len(calls) else "completed")
        self._calls.clear()  # in the items now: not held twice if the response fails after this
        return out

    def end(self, completions: Sequence[Completion]) -> bytes:
        completion = completions[0]
        status = finished_status(completion)
        thought = self._thought
        final = self._head.body(status, self._items, completion,
                                None if thought is None else lambda c: thought(c.token_ids))
        self._stored(final)
        return self._event(f"response.{status}", response=final)

    def failed(self, body: dict[str, Any]) -> bytes:
        """An error after the stream began: the ``error`` event, then ``response.failed``."""
        error = body["error"]
        out = self._event("error", code=error.get("code") or error.get("type"), message=error["message"],
                          param=error.get("param"))
        held = [{**call, "status": "incomplete"} for _, call in sorted(self._calls.items())]
        failed = self._head.body("failed", self._items + held, error={"code": "server_error",
                                                                       "message": error["message"]})
        return out + self._event("response.failed", response=failed)

    def _reasoning(self, text: str) -> bytes:
        out = b""
        at = self._open_reasoning()
        if at is None:
            out += self._add(reasoning_item("", "in_progress"), "reasoning")
            at = len(self._items) - 1
            out += self._part("added", at, {"type": "reasoning_text", "text": ""})
        self._items[at]["content"][0]["text"] += text
        return out + self._event("response.reasoning_text.delta", **self._at(at), content_index=0, delta=text)

    def _content(self, text: str) -> bytes:
        out = self._close_reasoning()
        if self._message is None:
            out += self._add(message_item("", [] if self._logprobs else None, "in_progress"), "message")
            self._message = len(self._items) - 1
            out += self._part("added", self._message, self._items[-1]["content"][0])
        part = self._items[self._message]["content"][0]
        part["text"] += text
        shown = self._message_logprobs()
        if self._logprobs:
            part["logprobs"] += shown
        return out + self._event("response.output_text.delta", **self._at(self._message), content_index=0,
                                 delta=text, logprobs=shown)

    def _message_logprobs(self) -> list[dict[str, Any]]:
        """The entries the message has not shown yet, after the thinking's tokens."""
        if not self._logprobs or not self._entries:
            return []
        if self._skip is None:  # the thinking has ended by the message's first text: its count is final
            self._skip = self._thought(self._ids[:len(self._entries)]) if self._thought is not None else 0
        start = max(self._shown, self._skip)
        if start >= len(self._entries):
            return []
        self._shown = len(self._entries)
        return text_logprobs(self._entries[start:], self._text, self._ids[:start])

    def _call(self, delta: dict[str, Any]) -> bytes:
        function = delta.get("function") or {}
        if delta["index"] not in self._calls:
            self._calls[delta["index"]] = call_item(ToolCall(function["name"], "", delta["id"]), "in_progress")
        self._calls[delta["index"]]["arguments"] += function.get("arguments") or ""
        return self._close_reasoning()

    def _add(self, item: dict[str, Any], kind: str) -> bytes:
        self._items.append(item)
        at = len(self._items) - 1
        self._open[at] = kind
        # The parts arrive with their own events: the item is announced without them (OpenAI's order).
        shown = {**item, "content": []} if "content" in item else item
        return self._event("response.output_item.added", output_index=at, item=shown)

    def _open_reasoning(self) -> int | None:
        return next((i for i, kind in self._open.items() if kind == "reasoning"), None)

    def _close_reasoning(self) -> bytes:
        at = self._open_reasoning()
        return b"" if at is None else self._close(at, "completed")

    def _close(self, at: int, status: Status) -> bytes:
        """Item ``at``'s closing events, with ``status``."""
        kind = self._open.pop(at)
        item = self._items[at]
        item["status"] = status
        out = b""
        if kind == "reasoning":
            text = item["content"][0]["text"]
            out += self._event("response.reasoning_text.done", **self._at(at), content_index=0, text=text)
            out += self._part("done", at, item["content"][0])
        elif kind == "message":
            part = item["content"][0]
            out += self._event("response.output_text.done", **self._at(at), content_index=0, text=part["text"],
                               logprobs=part.get("logprobs") or [])
            out += self._part("done", at, part)
        else:
            out += self._event("response.function_call_arguments.done", **self._at(at), name=item["name"],
                               arguments=item["arguments"])
        return out + self._event("response.output_item.done", output_index=at, item=item)

    def _part(self, stage: str, at: int, part: dict[str, Any]) -> bytes:
        return self._event(f"response.content_part.{stage}", **self._at(at), content_index=0, part=part)

    def _at(self, at: int) -> dict[str, Any]:
        return {"item_id": self._items[at]["id"], "output_index": at}

    def _event(self, kind: str, **fields: Any) -> bytes:
        # Written at once: the items go on changing after their events are sent.
        payload = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        text = json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        return f"event: {kind}\ndata: {text}\n\n".encode()
