"""OpenAI response bodies for ``specsure serve``: whole answers, and the chunks of a streamed one.

A streamed answer is server-sent events: ``data: <chunk JSON>`` lines, each followed by a blank
line, ending with ``data: [DONE]``. Chat chunks are ``chat.completion.chunk`` objects (the first
delta holds the role, then content deltas, then an empty delta with ``finish_reason``);
completion chunks are ``text_completion`` objects. With ``n`` > 1, each chunk belongs to one
choice (its ``index``), and the choices' chunks interleave as their steps are verified. Each
choice's chunk with ``finish_reason`` also carries ``speculative``, and
``stream_options.include_usage`` adds a last chunk with ``usage`` and no choices, as OpenAI does.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any, Callable, Literal, Sequence

from specsure.decode.completion import Completion, TokenLogprob
from specsure.decode.metrics import SpecStats
from specsure.models.token_bytes import BYTE_LEVEL
from specsure.serve.tool_calls import Answer

Endpoint = Literal["chat", "completion", "response"]
DONE = b"data: [DONE]\n\n"


class TokenText:
    """The text of each output token as logprobs name it: what the token adds to the decoded output.

    Decoding a token alone can lose what joins it to the text before (a word-level tokenizer's
    spaces), so each token's text is the output decoded through it, minus the output decoded before
    it; the tokens' texts then join to the completion's text. Alternatives are measured the same
    way, at the same position. A model without a tokenizer names tokens ``token_id:N`` (vLLM's
    spelling).
    """

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._byte_of = _byte_level_alphabet(tokenizer)
        """A byte-level BPE's character -> byte map (GPT-2's alphabet), or None for other tokenizers."""
        if self._byte_of is not None:
            self._special = set(tokenizer.all_special_ids) if skip_special_tokens else set()
            self._added_text = {i: text for text, i in tokenizer.get_added_vocab().items()}

    def _decode(self, ids: Sequence[int]) -> str:
        if self._byte_of is not None:
            # A token can hold part of a character (emoji, CJK): decoding the bytes so far without the
            # unfinished character gives each token the text it completes, and "" to the parts before.
            return b"".join(self.raw_bytes(i) or b"" for i in ids).decode("utf-8", errors="ignore")
        return self._tokenizer.decode(list(ids), skip_special_tokens=self._skip)

    def raw_bytes(self, token_id: int) -> bytes | None:
        """The token's own bytes (b"" for a special token the text skips) for a byte-level BPE, else None."""
        if self._byte_of is None:
            return None
        if token_id in self._special:
            return b""
        if token_id in self._added_text:
            return self._added_text[token_id].encode("utf-8")
        piece = self._tokenizer.convert_ids_to_tokens(token_id)
        try:
            return bytes(self._byte_of[c] for c in piece)
        except KeyError:  # not in the alphabet: a token stored as plain text
            return piece.encode("utf-8")

    def __call__(self, before: Sequence[int], entries: Sequence[TokenLogprob]) -> list[tuple[str, list[str]]]:
        """(text, alternatives' texts) for each entry, the first following the output ids ``before``."""
        if self._tokenizer is None:
            return [(f"token_id:{e.token_id}", [f"token_id:{t}" for t, _ in e.top]) for e in entries]
        ids = list(before)
        prev = self._decode(ids)
        out = []
        for entry in entries:
            alternatives = [self._added(prev, ids, t) for t, _ in entry.top]
            ids.append(entry.token_id)
            text = self._added(prev, ids[:-1], entry.token_id)
            prev = self._decode(ids)
            out.append((text, alternatives))
        return out

    def _added(self, prev: str, ids: list[int], token: int) -> str:
        text = self._decode([*ids, token])
        return text[len(prev):] if text.startswith(prev) else self._decode([token])


def token_text_of(tokenizer: Any, skip_special_tokens: bool = True) -> TokenText:
    return TokenText(tokenizer, skip_special_tokens)


def _byte_level_alphabet(tokenizer: Any) -> dict[str, int] | None:
    """BYTE_LEVEL when ``tokenizer`` decodes byte-level (GPT-2, Llama 3, Qwen, SmolLM2), else None. A type
    check, not the tokenizer's JSON: this runs for every response."""
    from tokenizers import decoders

    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    return BYTE_LEVEL if isinstance(decoder, decoders.ByteLevel) else None


def completion_logprobs(entries: Sequence[TokenLogprob], text: TokenText, before: Sequence[int] = (),
                        offset: int = 0) -> dict[str, Any]:
    """The completions endpoint's logprobs object; ``text_offset`` counts from ``offset``."""
    named = text(before, entries)
    tokens = [t for t, _ in named]
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    # OpenAI: the chosen token is always among the alternatives, so there may be logprobs + 1.
    tops = [{**{alt: v for alt, (_, v) in zip(alts, e.top)}, token: e.logprob}
            for e, (token, alts) in zip(entries, named)]
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries], "top_logprobs": tops,
            "text_offset": offsets}


@dataclass(frozen=True)
class Echo:
    """A completions choice's prompt, echoed before its output (OpenAI's ``echo``)."""

    text: str | None
    """The prompt as the request gave it (token ids decoded); None without a tokenizer."""
    prompt: list[int]
    top: int | None = None
    """The alternatives the echoed logprobs show (the request's ``logprobs``); its prompt may be scored
    with more, for ``prompt_logprobs``."""


def echo_logprobs(echo: Echo, scored: Sequence[TokenLogprob | None], text: TokenText) -> dict[str, Any]:
    """The logprobs object of an echoed prompt: its first token's log-probability and alternatives
    are null (nothing precedes it), as OpenAI and vLLM give them."""
    entries = [TokenLogprob(t, math.nan) if e is None else e if echo.top is None else replace(e, top=e.top[:echo.top])
               for t, e in zip(echo.prompt, scored)]
    block = completion_logprobs(entries, text)
    for i, entry in enumerate(scored):
        if entry is None:
            block["token_logprobs"][i] = block["top_logprobs"][i] = None
    return block


def _echoed(echo: Echo | None, completion: Completion, text: TokenText) -> tuple[str | None, dict[str, Any] | None]:
    """A completions choice's text and logprobs object, the prompt's first when echoed."""
    shift = len(echo.text or "") if echo is not None else 0
    logprobs = None if completion.logprobs is None else completion_logprobs(completion.logprobs, text, offset=shift)
    if echo is None:
        return completion.text, logprobs
    if logprobs is not None and completion.prompt_logprobs is not None:
        head = echo_logprobs(echo, completion.prompt_logprobs, text)
        logprobs = {key: head[key] + logprobs[key] for key in logprobs}
    joined = None if completion.text is None or echo.text is None else echo.text + completion.text
    return joined, logprobs


def prompt_logprobs(completion: Completion, text: TokenText, top: int) -> list[dict[str, Any] | None] | None:
    """vLLM's ``prompt_logprobs``: null for the first prompt token (nothing precedes it), then for each
    token {token id: {logprob, rank, decoded_token}}, the prompt's own token first, then its ``top``
    most likely alternatives. A -inf log-probability is -9999.0, as vLLM clamps it (JSON has no -inf)."""
    scored = completion.prompt_logprobs
    if scored is None:
        return None
    entries = [e for e in scored[1:] if e is not None]
    out: list[dict[str, Any] | None] = [None]
    for entry, (shown, alternatives) in zip(entries, text(completion.prompt_token_ids[:1], entries)):
        tokens = {str(entry.token_id): _ranked(entry.logprob, entry.rank, shown)}
        for rank, ((token, value), name) in enumerate(zip(entry.top[:top], alternatives), start=1):
            tokens.setdefault(str(token), _ranked(value, rank, name))
        out.append(tokens)
    return out


def _ranked(logprob: float, rank: int | None, shown: str) -> dict[str, Any]:
    return {"logprob": max(logprob, -9999.0), "rank": rank, "decoded_token": shown}


def chat_logprobs(entries: Sequence[TokenLogprob], text: TokenText, before: Sequence[int] = ()) -> dict[str, Any]:
    """The chat endpoint's logprobs object: one entry per token, its alternatives best first."""
    def one(shown: str, token_id: int, value: float) -> dict[str, Any]:
        raw = text.raw_bytes(token_id)  # a token's own bytes, even when they end inside a character
        return {"token": shown, "logprob": value, "bytes": list(shown.encode("utf-8") if raw is None else raw)}

    return {"content": [{**one(token, e.token_id, e.logprob),
                         "top_logprobs": [one(alt, t, v) for alt, (t, v) in zip(alts, e.top)]}
                        for e, (token, alts) in zip(entries, text(before, entries))], "refusal": None}


def completion_body(completions: Sequence[Completion], model_name: str, method: str | None,
                    text: TokenText, n: int = 1, echoes: Sequence[Echo | None] | None = None,
                    prompt_top: int | None = None, request_id: str | None = None) -> dict[str, Any]:
    """OpenAI's text_completion object, plus ``token_ids`` (the output's) per choice and ``speculative``;
    ``n`` choices a prompt, prompt after prompt (choice j of prompt i has index i * n + j, as in
    vLLM), each after its prompt where ``echoes`` gives one; each with its prompt's ``prompt_logprobs``
    (``prompt_top`` alternatives) where the request asked for them, as vLLM's choices carry them."""
    choices = []
    for i, c in enumerate(completions):
        shown, logprobs = _echoed(echoes[i] if echoes else None, c, text)
        choice = {"index": i, "text": shown, "token_ids": c.token_ids, "logprobs": logprobs,
                  "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}
        if prompt_top is not None:
            choice["prompt_logprobs"] = prompt_logprobs(c, text, prompt_top)
        choices.append(choice)
    return _body("cmpl", "text_completion", choices, completions, model_name, method, n, request_id=request_id)


def chat_body(completions: Sequence[Completion], model_name: str, method: str | None,
              text: TokenText, answers: Sequence[Answer] | None = None,
              contents: Sequence[str | None] | None = None,
              reasoning: Sequence[str | None] | None = None,
              thinking: ReasoningCount | None = None, prompt_top: int | None = None,
              request_id: str | None = None) -> dict[str, Any]:
    """OpenAI's chat.completion object, plus ``speculative``; ``answers``: each choice's content and
    tool calls when the request offered tools; ``contents`` and ``reasoning``: each choice's answer
    and thinking, under a reasoning parser (the message then carries ``reasoning``, as vLLM's)."""
    choices = []
    for i, c in enumerate(completions):
        message: dict[str, Any] = {"role": "assistant", "content": c.text if contents is None else contents[i]}
        if reasoning is not None:
            message["reasoning"] = reasoning[i]
        finish = c.finish_reason
        if answers is not None:
            message["content"], finish = answers[i].content, answers[i].finish_reason
            message["tool_calls"] = [call.to_dict() for call in answers[i].tool_calls]
        choices.append({"index": i, "message": message,
                        "logprobs": None if c.logprobs is None else chat_logprobs(c.logprobs, text),
                        "finish_reason": finish, "stop_reason": c.stop_reason})
    # One prompt for every choice: usage counts it once, as the streamed answer does.
    body = _body("chatcmpl", "chat.completion", choices, completions, model_name, method, len(completions), thinking,
                 request_id)
    if prompt_top is not None:  # beside the choices, as vLLM's: the choices share their prompt
        body["prompt_logprobs"] = prompt_logprobs(completions[0], text, prompt_top)
    return body


def _body(prefix: str, kind: str, choices: list[dict[str, Any]], completions: Sequence[Completion],
          model_name: str, method: str | None, n: int = 1, thinking: ReasoningCount | None = None,
          request_id: str | None = None) -> dict[str, Any]:
    return {
        "id": answer_id(prefix, request_id),
        "object": kind,
        "created": int(time.time()),
        "model": model_name,
        "choices": choices,
        "usage": usage(completions, n, thinking),
        "speculative": speculative(completions, method),
    }


def answer_id(prefix: str, request_id: str | None) -> str:
    """An answer's id: vLLM's ``<prefix>-<request_id>`` where the request named one, else a fresh one."""
    return f"{prefix}-{request_id if request_id is not None else uuid.uuid4().hex}"


ReasoningCount = Callable[[Completion], int]
"""A choice's output tokens spent thinking, under a reasoning parser."""


def usage(completions: Sequence[Completion], n: int = 1, thinking: ReasoningCount | None = None) -> dict[str, Any]:
    """OpenAI's usage object: each prompt once (``n`` choices a prompt, prompt after prompt), every
    choice's tokens (a final EOS counts, as in vLLM), the prompt tokens a slot's cache held
    (``prompt_tokens_details.cached_tokens``, prefix caching); with ``thinking``, the tokens spent thinking
    as ``completion_tokens_details.reasoning_tokens``, as vLLM reports them."""
    prompt_tokens = sum(len(c.prompt_token_ids) for c in completions[::n])
    completion_tokens = sum(len(c.token_ids) for c in completions)
    cached = sum(c.cached_tokens for c in completions[::n])
    out: dict[str, Any] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                           "total_tokens": prompt_tokens + completion_tokens,
                           "prompt_tokens_details": {"cached_tokens": cached}}
    if thinking is not None:
        out["completion_tokens_details"] = {"reasoning_tokens": sum(thinking(c) for c in completions)}
    return out


def speculative(completions: Sequence[Completion], method: str | None) -> dict[str, Any]:
    """specsure's extension: this request's acceptance figures (all its choices), with vLLM's definitions."""
    stats = SpecStats()
    for completion in completions:
        stats.merge(completion.stats)
    stats.elapsed_s = max(c.stats.elapsed_s for c in completions)  # the choices ran side by side
    return {"method": method, **stats.to_dict()}


def event(payload: dict[str, Any]) -> bytes:
    """One server-sent event; JSON as the non-streamed responses write it (no NaN)."""
    text = json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return b"data: " + text.encode() + b"\n\n"


class ChunkWriter:
    """The events of one streamed answer, for each of its choices. Completion chunks carry ``token_ids`` too."""

    def __init__(self, endpoint: Endpoint, model_name: str, method: str | None, include_usage: bool,
                 text: TokenText, n: int = 1, per_prompt: int | None = None,
                 prompt_tokens: list[int] | None = None, thinking: ReasoningCount | None = None,
                 request_id: str | None = None) -> None:
        """``prompt_tokens``: each choice's prompt length, for usage on every chunk (vLLM's
        continuous_usage_stats); None puts usage on the last chunk only. ``request_id``: the request's own
        (vLLM's field), from which the chunks' id is made."""
        chat = endpoint == "chat"
        self._chat, self._method, self._include_usage, self._text, self._n = chat, method, include_usage, text, n
        self._prompt_tokens = prompt_tokens
        self._thinking = thinking
        self._generated = [0] * n  # each choice's output tokens in the chunks so far
        self._per_prompt = per_prompt or n  # choices a prompt, for usage
        self._offsets = [0] * n  # each choice's text_offset so far
        self._before: list[list[int]] = [[] for _ in range(n)]  # each choice's output ids in earlier chunks
        self._head = {"id": answer_id("chatcmpl" if chat else "cmpl", request_id),
                      "object": "chat.completion.chunk" if chat else "text_completion",
                      "created": int(time.time()), "model": model_name}

    def start(self) -> bytes:
        """Chat's first chunk per choice, the assistant's role; nothing for completions."""
        return b"".join(self._chunk(i, {"role": "assistant", "content": ""}) for i in range(self._n)) \
            if self._chat else b""

    def echo(self, index: int, echo: Echo, scored: Sequence[TokenLogprob | None] | None) -> bytes:
        """Choice ``index``'s echoed prompt, before its first output, with the prompt's logprobs if scored."""
        shown = None if scored is None else echo_logprobs(echo, scored, self._text)
        self._offsets[index] += len(echo.text or "")
        choice = {"index": index, "text": echo.text, "token_ids": [], "logprobs": shown, "finish_reason": None,
                  "stop_reason": None}
        return event({**self._head, "choices": [choice], **self._usage_so_far(index)})

    def delta(self, index: int, text: str | None, token_ids: list[int],
              logprobs: list[TokenLogprob] | None = None, pieces: list[dict[str, Any]] | None = None) -> bytes:
        """A chunk of new text for choice ``index`` (and, for completions, the token ids it came from);
        with ``pieces``, the chat deltas a request with tools made of the text (the logprobs go with
        the first)."""
        self._generated[index] += len(token_ids)
        if pieces is not None:
            return b"".join(self._chunk(index, piece, logprobs=logprobs if j == 0 else None)
                            for j, piece in enumerate(pieces))
        if self._chat:
            return self._chunk(index, {"content": text}, logprobs=logprobs)
        return self._chunk(index, text, token_ids, logprobs=logprobs)

    def finish(self, index: int, completion: Completion, text: str | None, token_ids: list[int],
               logprobs: list[TokenLogprob] | None = None, pieces: list[dict[str, Any]] | None = None,
               finish_reason: str | None = None) -> bytes:
        """Choice ``index``'s rest of the text (or the ``pieces`` of it, as in ``delta``), then its chunk
        with finish_reason (``finish_reason`` replaces the engine's) and speculative."""
        self._generated[index] += len(token_ids)
        figures = {"speculative": speculative([completion], self._method)}
        if self._chat:
            reason = finish_reason or completion.finish_reason
            if pieces is not None:
                rest = self.delta(index, None, [], logprobs, pieces or ([{}] if logprobs else []))
            else:
                rest = self._chunk(index, {"content": text}, logprobs=logprobs) if text or logprobs else b""
            return rest + self._chunk(index, {}, finish=reason, stop=completion.stop_reason, **figures)
        return self._chunk(index, text, token_ids, logprobs=logprobs, finish=completion.finish_reason,
                           stop=completion.stop_reason, **figures)

    def end(self, completions: Sequence[Completion]) -> bytes:
        """The usage chunk, if asked, then [DONE]."""
        last = event({**self._head, "choices": [], "usage": usage(completions, self._per_prompt, self._thinking)}) \
            if self._include_usage else b""
        return last + DONE

    def failed(self, body: dict[str, Any]) -> bytes:
        """An error after the stream began: its error object as an event, then [DONE]."""
        return event(body) + DONE

    def _chunk(self, index: int, content: dict[str, Any] | str | None, token_ids: list[int] | None = None, *,
               logprobs: list[TokenLogprob] | None = None, finish: str | None = None, stop: int | str | None = None,
               **extra: Any) -> bytes:
        shown = None
        if logprobs:
            before = self._before[index]
            if self._chat:
                shown = chat_logprobs(logprobs, self._text, before)
            else:
                shown = completion_logprobs(logprobs, self._text, before, self._offsets[index])
                self._offsets[index] += sum(len(t) for t in shown["tokens"])
            before += [e.token_id for e in logprobs]
        if self._chat:
            choice = {"index": index, "delta": content, "logprobs": shown, "finish_reason": finish}
        else:
            choice = {"index": index, "text": content, "token_ids": token_ids, "logprobs": shown,
                      "finish_reason": finish}
        choice["stop_reason"] = stop  # vLLM's: on every chunk, None until the one that ended the choice
        return event({**self._head, "choices": [choice], **extra, **self._usage_so_far(index)})

    def _usage_so_far(self, index: int) -> dict[str, Any]:
        """A chunk's usage: choice ``index``'s so far with continuous_usage_stats, else OpenAI's null on
        every chunk but the last (when include_usage), else none."""
        if self._prompt_tokens is not None:
            prompt, out = self._prompt_tokens[index], self._generated[index]
            return {"usage": {"prompt_tokens": prompt, "completion_tokens": out, "total_tokens": prompt + out}}
        return {"usage": None} if self._include_usage else {}
