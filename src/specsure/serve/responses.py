"""OpenAI response bodies for ``specsure serve``: whole answers, and the chunks of a streamed one.

A streamed answer is server-sent events: ``data: <chunk JSON>`` lines, each followed by a blank
line, ending with ``data: [DONE]``. Chat chunks are ``chat.completion.chunk`` objects (the first
delta holds the role, then content deltas, then an empty delta with ``finish_reason``);
completion chunks are ``text_completion`` objects. The chunk with ``finish_reason`` also carries
``speculative``, and ``stream_options.include_usage`` adds a last chunk with ``usage`` and no
choices, as OpenAI does.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

from specsure.decode.engine import Completion

Endpoint = Literal["chat", "completion"]
DONE = b"data: [DONE]\n\n"


def completion_body(completion: Completion, model_name: str, method: str | None) -> dict[str, Any]:
    """OpenAI's text_completion object, plus ``token_ids`` per choice and ``speculative``."""
    choice = {"index": 0, "text": completion.text, "token_ids": completion.token_ids, "logprobs": None,
              "finish_reason": completion.finish_reason}
    return _body("cmpl", "text_completion", choice, completion, model_name, method)


def chat_body(completion: Completion, model_name: str, method: str | None) -> dict[str, Any]:
    """OpenAI's chat.completion object, plus ``speculative``."""
    choice = {"index": 0, "message": {"role": "assistant", "content": completion.text}, "logprobs": None,
              "finish_reason": completion.finish_reason}
    return _body("chatcmpl", "chat.completion", choice, completion, model_name, method)


def _body(prefix: str, kind: str, choice: dict[str, Any], completion: Completion, model_name: str,
          method: str | None) -> dict[str, Any]:
    return {
        "id": f"{prefix}-{uuid.uuid4().hex}",
        "object": kind,
        "created": int(time.time()),
        "model": model_name,
        "choices": [choice],
        "usage": usage(completion),
        "speculative": speculative(completion, method),
    }


def usage(completion: Completion) -> dict[str, int]:
    """OpenAI's usage object; completion_tokens counts a final EOS token, as vLLM does."""
    prompt_tokens, completion_tokens = len(completion.prompt_token_ids), len(completion.token_ids)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def speculative(completion: Completion, method: str | None) -> dict[str, Any]:
    """specsure's extension: this request's acceptance figures, with vLLM's definitions."""
    return {"method": method, **completion.stats.to_dict()}


def event(payload: dict[str, Any]) -> bytes:
    """One server-sent event; JSON as the non-streamed responses write it (no NaN)."""
    text = json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return b"data: " + text.encode() + b"\n\n"


class ChunkWriter:
    """The events of one streamed answer. Completion chunks carry ``token_ids`` as well as text."""

    def __init__(self, endpoint: Endpoint, model_name: str, method: str | None, include_usage: bool) -> None:
        chat = endpoint == "chat"
        self._chat, self._method, self._include_usage = chat, method, include_usage
        self._head = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
                      "object": "chat.completion.chunk" if chat else "text_completion",
                      "created": int(time.time()), "model": model_name}

    def start(self) -> bytes:
        """Chat's first chunk, the assistant's role; nothing for completions."""
        return self._chunk({"role": "assistant", "content": ""}) if self._chat else b""

    def delta(self, text: str | None, token_ids: list[int]) -> bytes:
        """A chunk of new text (and, for completions, the token ids it came from)."""
        return self._chunk({"content": text}) if self._chat else self._chunk(text, token_ids)

    def finish(self, completion: Completion, text: str | None, token_ids: list[int]) -> bytes:
        """The rest of the text, the chunk with finish_reason and speculative, usage if asked, [DONE]."""
        figures = {"speculative": speculative(completion, self._method)}
        if self._chat:
            rest = self._chunk({"content": text}) if text else b""
            last = rest + self._chunk({}, finish=completion.finish_reason, **figures)
        else:
            last = self._chunk(text, token_ids, finish=completion.finish_reason, **figures)
        if self._include_usage:
            last += event({**self._head, "choices": [], "usage": usage(completion)})
        return last + DONE

    def _chunk(self, content: dict[str, Any] | str | None, token_ids: list[int] | None = None, *,
               finish: str | None = None, **extra: Any) -> bytes:
        if self._chat:
            choice = {"index": 0, "delta": content, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": content, "token_ids": token_ids, "logprobs": None, "finish_reason": finish}
        chunk = {**self._head, "choices": [choice], **extra}
        if self._include_usage:
            chunk["usage"] = None  # OpenAI's shape: null on every chunk but the last
        return event(chunk)
