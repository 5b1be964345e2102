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

Status = Literal["completed", "incomplete", "failed", "in_progress"]


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
    said nothing at all is one empty message (as its stream tells it)."""
    items = [reasoning_item(reasoning, status)] if reasoning else []  # no thinking, no item (vLLM's)
    if content:
        items.append(message_item(content, logprobs, status))
    items += [call_item(call, status) for call in calls]
    return items or [message_item("", logprobs, status)]


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
            message["content"] = "".join(part["text"] for part in item["content"])
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
            # The message's own tokens: those of the thinking (and its closing tag) come first.
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

    ``stored``: called with the final object, to keep it for ``previous_response_id``.
    """

    def __init__(self, head: ResponseHead, text: TokenText, logprobs: bool, thinking: ReasoningCount | None,
                 stored: Callable[[dict[str, Any]], None]) -> None:
        self._head, self._text, self._logprobs, self._thinking, self._stored = head, text, logprobs, thinking, stored
        self._seq = 0
        self._items: list[dict[str, Any]] = []
        """The output so far: finished items whole, the open one as it stands."""
        self._open: str | None = None
        """The kind of the last item while it is still streaming: reasoning, message or call."""
        self._calls: dict[int, int] = {}
        """A chat delta's call index -> its item's output index."""
        self._before: list[int] = []  # output ids in earlier logprobs: their texts follow them

    def start(self) -> bytes:
        snapshot = self._head.body("in_progress", [])
        return self._event("response.created", response=snapshot) + \
            self._event("response.in_progress", response=snapshot)

    def delta(self, index: int, text: str | None, token_ids: list[int],
              logprobs: list[TokenLogprob] | None = None, pieces: list[dict[str, Any]] | None = None) -> bytes:
        shown = self._shown(logprobs)
        pieces = pieces if pieces is not None else ([{"content": text}] if text else [])
        out = b""
        for piece in pieces:
            if piece.get("reasoning"):
                out += self._reasoning(piece["reasoning"])
            if piece.get("content"):
                out += self._content(piece["content"], shown)
                shown = []  # a step's logprobs go with its first text
            for call in piece.get("tool_calls") or []:
                out += self._call(call)
        return out

    def finish(self, index: int, completion: Completion, text: str | None, token_ids: list[int],
               logprobs: list[TokenLogprob] | None = None, pieces: list[dict[str, Any]] | None = None,
               finish_reason: str | None = None) -> bytes:
        out = self.delta(index, text, token_ids, logprobs, pieces)
        if not self._items:  # nothing was said: the answer is still an (empty) message, as unstreamed
            out += self._content("", [])
        return out + self._close(finished_status(completion))

    def end(self, completions: Sequence[Completion]) -> bytes:
        completion = completions[0]
        status = finished_status(completion)
        final = self._head.body(status, self._items, completion, self._thinking)
        self._stored(final)
        return self._event(f"response.{status}", response=final)

    def failed(self, body: dict[str, Any]) -> bytes:
        """An error after the stream began: the ``error`` event, then ``response.failed``."""
        error = body["error"]
        out = self._event("error", code=error.get("code") or error.get("type"), message=error["message"],
                          param=error.get("param"))
        failed = self._head.body("failed", self._items, error={"code": error.get("code") or "server_error",
                                                               "message": error["message"]})
        return out + self._event("response.failed", response=failed)

    def _shown(self, logprobs: list[TokenLogprob] | None) -> list[dict[str, Any]]:
        if not self._logprobs or not logprobs:
            return []
        shown = text_logprobs(logprobs, self._text, self._before)
        self._before += [e.token_id for e in logprobs]
        return shown

    def _reasoning(self, text: str) -> bytes:
        out = b""
        if self._open != "reasoning":
            item = reasoning_item("", "in_progress")
            out += self._add(item, "reasoning") + self._part("added", {"type": "reasoning_text", "text": ""})
        item = self._items[-1]
        item["content"][0]["text"] += text
        return out + self._event("response.reasoning_text.delta", **self._at(), content_index=0, delta=text)

    def _content(self, text: str, logprobs: list[dict[str, Any]]) -> bytes:
        out = b""
        if self._open != "message":
            out += self._add(message_item("", [] if self._logprobs else None, "in_progress"), "message")
            out += self._part("added", self._items[-1]["content"][0])
        part = self._items[-1]["content"][0]
        part["text"] += text
        if self._logprobs:
            part["logprobs"] += logprobs
        return out + self._event("response.output_text.delta", **self._at(), content_index=0, delta=text,
                                 logprobs=logprobs)

    def _call(self, delta: dict[str, Any]) -> bytes:
        function, out = delta.get("function") or {}, b""
        if delta["index"] not in self._calls:
            call = ToolCall(function["name"], "", delta["id"])
            out += self._add(call_item(call, "in_progress"), "call")
            self._calls[delta["index"]] = len(self._items) - 1
        arguments = function.get("arguments") or ""
        if not arguments:
            return out
        self._items[self._calls[delta["index"]]]["arguments"] += arguments
        return out + self._event("response.function_call_arguments.delta", **self._at(), delta=arguments)

    def _add(self, item: dict[str, Any], kind: str) -> bytes:
        out = self._close("completed")
        self._items.append(item)
        self._open = kind
        return out + self._event("response.output_item.added", output_index=len(self._items) - 1, item=item)

    def _close(self, status: Status) -> bytes:
        """The open item's closing events, with ``status``."""
        kind, self._open = self._open, None
        if kind is None:
            return b""
        item = self._items[-1]
        item["status"] = status
        out = b""
        if kind == "reasoning":
            text = item["content"][0]["text"]
            out += self._event("response.reasoning_text.done", **self._at(), content_index=0, text=text)
            out += self._part("done", item["content"][0])
        elif kind == "message":
            part = item["content"][0]
            out += self._event("response.output_text.done", **self._at(), content_index=0, text=part["text"],
                               logprobs=part.get("logprobs") or [])
            out += self._part("done", part)
        else:
            out += self._event("response.function_call_arguments.done", **self._at(), name=item["name"],
                               arguments=item["arguments"])
        return out + self._event("response.output_item.done", output_index=len(self._items) - 1, item=item)

    def _part(self, stage: str, part: dict[str, Any]) -> bytes:
        return self._event(f"response.content_part.{stage}", **self._at(), content_index=0, part=part)

    def _at(self) -> dict[str, Any]:
        return {"item_id": self._items[-1]["id"], "output_index": len(self._items) - 1}

    def _event(self, kind: str, **fields: Any) -> bytes:
        # Written at once: the items go on changing after their events are sent.
        payload = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        text = json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        return f"event: {kind}\ndata: {text}\n\n".encode()
