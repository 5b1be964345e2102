"""OpenAI request parsing and response bodies for ``specsure serve``.

Parsing is strict: an unknown field, a wrong type or a value out of range is a ``RequestError``
whose message names the field, the value and the fix; the app answers it with a 400 in OpenAI's
error shape. Sampling fields are validated by ``SamplingParams`` itself, so the server and the
Python API accept exactly the same values.
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

from specsure.config.schema import suggest
from specsure.decode.engine import Completion
from specsure.sampling import SamplingParams

COMPLETION_MAX_TOKENS = 16
"""max_tokens when a completion request omits it (OpenAI's and vLLM's default)."""
CHAT_MAX_TOKENS = 512
"""max_tokens when a chat request omits it. OpenAI's default is "the rest of the context", which
on a CPU can mean minutes for a model that never stops; the response says 'length' when cut."""

SAMPLING_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "ignore_eos")
COMMON_FIELDS = ("model", *SAMPLING_FIELDS, "n", "stream", "user")
COMPLETION_FIELDS = ("prompt", *COMMON_FIELDS)
CHAT_FIELDS = ("messages", "max_completion_tokens", *COMMON_FIELDS)
ENDPOINT_OF = {"prompt": "POST /v1/completions", "messages": "POST /v1/chat/completions"}
ROLES = ("system", "user", "assistant")
MESSAGE_FIELDS = ("role", "content", "name")

# OpenAI fields specsure does not implement. Each is accepted only as null or at the value that
# changes nothing, so clients that send defaults keep working and no setting is silently dropped.
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "presence_penalty": (0,), "frequency_penalty": (0,), "repetition_penalty": (1,),
    "logprobs": (False, 0), "top_logprobs": (0,), "echo": (False,), "best_of": (1,),
    "logit_bias": ({},), "suffix": (), "stream_options": (), "tools": ([],), "tool_choice": ("none",),
    "response_format": ({"type": "text"},),
}

_MISSING = object()
_SAMPLING_ERROR = re.compile(r"^SamplingParams\.(\w+) = ")


class RequestError(ValueError):
    """A client mistake, answered with one 400 in OpenAI's error shape."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        """The request field at fault (OpenAI's ``param``), or None for the body as a whole."""
        self.code = code

    def to_body(self) -> dict[str, Any]:
        return error_body(str(self), self.param, self.code)


def error_body(message: str, param: str | None = None, code: str | None = None,
               kind: str = "invalid_request_error") -> dict[str, Any]:
    """OpenAI's error object: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


@dataclass(frozen=True)
class CompletionRequest:
    """A validated POST /v1/completions body."""

    prompt: str | list[int]
    """One prompt: text, or token ids."""
    params: SamplingParams


@dataclass(frozen=True)
class ChatRequest:
    """A validated POST /v1/chat/completions body."""

    messages: list[dict[str, str]]
    """Messages as the chat template takes them: role, content (text), optionally name."""
    params: SamplingParams


def parse_completion(body: Any, model_name: str) -> CompletionRequest:
    body = _check_fields(body, COMPLETION_FIELDS, "POST /v1/completions")
    _check_common(body, model_name)
    prompt = _parse_prompt(body.get("prompt"))
    return CompletionRequest(prompt, _sampling(body, "max_tokens", COMPLETION_MAX_TOKENS))


def parse_chat(body: Any, model_name: str) -> ChatRequest:
    body = _check_fields(body, CHAT_FIELDS, "POST /v1/chat/completions")
    _check_common(body, model_name)
    messages = _parse_messages(body.get("messages"))
    new, old = body.get("max_completion_tokens"), body.get("max_tokens")
    if new is not None and old is not None and new != old:
        raise RequestError(f"max_completion_tokens = {_show(new)} and max_tokens = {_show(old)} disagree; they are "
                           "two names for the same limit. Send only max_completion_tokens.", "max_tokens")
    field = "max_completion_tokens" if new is not None else "max_tokens"
    return ChatRequest(messages, _sampling({**body, "max_tokens": body.get(field)}, field, CHAT_MAX_TOKENS))


def _check_fields(body: Any, allowed: tuple[str, ...], endpoint: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object with the fields of {endpoint}, got "
                           f"{_json_type(body)} {_show(body)}.")
    for key, value in body.items():
        if key in allowed:
            continue
        if key in NEUTRAL:
            neutral = NEUTRAL[key]
            # bool is an int in Python, but true is not a best_of of 1.
            if value is None or any(value == n and isinstance(value, bool) == isinstance(n, bool) for n in neutral):
                continue
            accepted = " or ".join(["null", *(_show(n) for n in neutral)])
            raise RequestError(f"{key} = {_show(value)} is not supported by specsure; remove the field "
                               f"(only {accepted} is accepted).", key, "unsupported_field")
        elsewhere = ENDPOINT_OF.get(key, endpoint)
        hint = f" {key!r} belongs to {elsewhere}." if elsewhere != endpoint else suggest(key, allowed)
        raise RequestError(f"unknown field {key!r} in the body of {endpoint}.{hint} Fields: {', '.join(allowed)}.",
                           key, "unknown_field")
    return body


def _check_common(body: dict[str, Any], model_name: str) -> None:
    model = body.get("model")
    if model is not None and model != model_name:
        raise RequestError(f"model = {_show(model)} is not served here; this server serves {model_name!r} "
                           "(GET /v1/models). Send that name, or omit the field.", "model", "model_not_found")
    n = body.get("n")
    if n is not None and (type(n) is not int or n != 1):
        raise RequestError(f"n = {_show(n)} is not supported: this server returns one choice per request. "
                           "Omit n or send n = 1; for several choices send several requests.", "n")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise RequestError(f"stream = {_show(stream)} must be true or false.", "stream")
    if stream:
        raise RequestError("stream is not supported yet: this server returns the whole completion in one "
                           "response. Send stream = false, or omit it.", "stream", "unsupported_field")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise RequestError(f"user = {_show(user)} must be a string (an end-user id).", "user")


def _sampling(body: dict[str, Any], max_field: str, default_max: int) -> SamplingParams:
    values = {k: body[k] for k in SAMPLING_FIELDS if body.get(k) is not None}
    values.setdefault("max_tokens", default_max)
    try:
        return SamplingParams(**values)
    except ValueError as exc:
        message = str(exc).removeprefix("SamplingParams.")
        match = _SAMPLING_ERROR.match(str(exc))
        param = match.group(1) if match else None
        if param == "max_tokens" and max_field != "max_tokens":
            param, message = max_field, max_field + message.removeprefix("max_tokens")
        raise RequestError(message, param) from None


def _parse_prompt(value: Any) -> str | list[int]:
    if value is None:
        raise RequestError('prompt is missing: send a string or a list of token ids, e.g. "prompt": "Hello".',
                           "prompt")
    if isinstance(value, list) and value and all(isinstance(p, (str, list)) for p in value):
        if len(value) != 1:
            raise RequestError(f"prompt holds {len(value)} prompts, but this server takes one prompt per request "
                               "(batch size 1); send each prompt as its own request.", "prompt")
        value = value[0]
    if isinstance(value, str):
        if not value:
            raise RequestError("prompt is an empty string; send some text or a list of token ids.", "prompt")
        return value
    if isinstance(value, list):
        if not value:
            raise RequestError("prompt is an empty list; send at least one token id, or a string.", "prompt")
        for token in value:
            if type(token) is not int:
                raise RequestError(f"prompt holds {_show(token)}, which is not a token id; a token-id prompt is "
                                   "a list of ints.", "prompt")
        return value
    raise RequestError(f"prompt = {_show(value)} is a JSON {_json_type(value)}; send a string, a list of token "
                       "ids, or a list holding one of them.", "prompt")


def _parse_messages(value: Any) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        shown = "messages is missing" if value is None else f"messages = {_show(value)} is not a non-empty list"
        raise RequestError(f'{shown}; send e.g. "messages": [{{"role": "user", "content": "Hello"}}].', "messages")
    messages = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise RequestError(f"{where} = {_show(message)} must be an object with role and content.", where)
        for key in message:
            if key not in MESSAGE_FIELDS:
                raise RequestError(f"unknown field {key!r} in {where}.{suggest(key, MESSAGE_FIELDS)} A message has "
                                   "role, content and optionally name.", f"{where}.{key}", "unknown_field")
        role = message.get("role")
        if role not in ROLES:
            raise RequestError(f"{where}.role = {_show(role)} is not a role this server renders; use one of "
                               f"{', '.join(ROLES)}.", f"{where}.role")
        rendered = {"role": role, "content": _content(message.get("content"), where)}
        if message.get("name") is not None:
            if not isinstance(message["name"], str):
                raise RequestError(f"{where}.name = {_show(message['name'])} must be a string.", f"{where}.name")
            rendered["name"] = message["name"]
        messages.append(rendered)
    return messages


def _content(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                       and isinstance(p.get("text"), str) for p in value):
        return "".join(p["text"] for p in value)
    raise RequestError(f"{where}.content = {_show(value)} must be a string or a list of text parts "
                       '({"type": "text", "text": "..."}); images and audio are not supported.', f"{where}.content")


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
    prompt_tokens, completion_tokens = len(completion.prompt_token_ids), len(completion.token_ids)
    return {
        "id": f"{prefix}-{uuid.uuid4().hex}",
        "object": kind,
        "created": int(time.time()),
        "model": model_name,
        "choices": [choice],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
        "speculative": {"method": method, **completion.stats.to_dict()},
    }


def _json_type(value: Any) -> str:
    names = {bool: "boolean", int: "number", float: "number", str: "string", list: "array", dict: "object"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _show(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
