"""A reasoning model's thinking, split from its answer (vLLM's ``--reasoning-parser``).

DeepSeek-R1, QwQ and Qwen3 think before they answer, between ``<think>`` and ``</think>``; their
chat templates often write the opening tag into the prompt, so the output may hold only the
closing one. With a reasoning parser, a chat answer's text up to the first ``</think>`` is the
message's ``reasoning`` (a leading ``<think>`` dropped) and the rest is its ``content``, in which
tool calls are then looked for. An answer that never closes its thinking (cut by max_tokens, or
a model that does not think) is all reasoning and has no content, as in vLLM.

With the ``qwen3`` parser, a ``<tool_call>`` followed by ``<function=`` (a tagged call, which
Qwen3.5 may write without closing its thinking) ends the thinking as well, as in vLLM, and the
call is the content's. No reasoning is looked for when the prompt already closed it: its last
thinking tag, among its last tokens (or anywhere in a prefilled reply), is ``</think>``, as
Qwen3's template with ``enable_thinking: false`` ends the prompt with
``<think>\\n\\n</think>\\n\\n``; nor, with the ``qwen3`` parser, when the request sends
``chat_template_kwargs.enable_thinking: false``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Sequence

PARSERS = ("deepseek_r1", "qwen3")
"""The values of ``--reasoning-parser``: both read ``<think>...</think>``; ``qwen3`` also takes the
request's ``enable_thinking`` switch."""
START, END = "<think>", "</think>"
CALL, FUNCTION = "<tool_call>", "<function="
"""A tagged call's opening (``--tool-call-parser qwen3_coder``), which ends a Qwen3 thinking too."""
TAIL_TOKENS = 16
"""Prompt tokens decoded to tell whether the prompt closed the thinking: far more than the tag's."""


def check_reasoning_parser(name: str, tokenizer: Any, template: str | None = None) -> None:
    """Refuse a parser this server cannot use: an unknown name, or tags the decoded text would hide;
    warn when the chat ``template`` never mentions the thinking (a model that does not think)."""
    if name not in PARSERS:
        raise ValueError(f"reasoning_parser = {name!r} is not one specsure has; choose one of {', '.join(PARSERS)}.")
    if tokenizer is None:
        raise ValueError("reasoning_parser needs the model's tokenizer, and this model has none.")
    for tag in (START, END):
        if tokenizer.decode(tokenizer.encode(tag, add_special_tokens=False), skip_special_tokens=True) != tag:
            raise ValueError(f"reasoning_parser = {name!r}: this tokenizer makes {tag} a special token, which decoded "
                             "text leaves out, so the thinking could not be told from the answer; start the server "
                             "without --reasoning-parser.")
    if template is not None and "think" not in template:
        # As in vLLM, an answer that never closes a thinking is all reasoning: say so before it surprises.
        logging.getLogger("specsure.serve").warning(
            "--reasoning-parser %s: the chat template never mentions <think>, so this model may not think; then "
            "every chat answer is reasoning, with null content", name)


def thinks(parser: str | None, prompt_tail: str, template_kwargs: dict[str, Any] | None) -> bool:
    """Whether an answer to this prompt starts inside its thinking.

    Args:
        parser: the server's reasoning parser; None: no answer is split.
        prompt_tail: the prompt's last tokens (all of a prefilled reply), decoded with special tokens kept.
        template_kwargs: the request's ``chat_template_kwargs``.
    """
    if parser is None:
        return False
    # The last tag decides: a prompt that closed its thinking (Qwen3's enable_thinking false, or a
    # prefilled reply past its thinking) is answered with content, and one that opened it (QwQ's,
    # whatever the switch says) with thinking first, as vLLM reads the prompt.
    opened, closed = prompt_tail.rfind(START), prompt_tail.rfind(END)
    if opened >= 0 or closed >= 0:
        return opened > closed
    return not (parser == "qwen3" and (template_kwargs or {}).get("enable_thinking", True) is False)


@dataclass(frozen=True)
class Thinking:
    """How one chat request's answers are split, under the server's reasoning parser."""

    starts_inside: bool
    """The answer starts inside the thinking (``thinks``); False: it is all content."""
    include: bool = True
    """The request's ``include_reasoning``: false leaves the thinking out of the answer."""
    calls_end: bool = False
    """A ``<tool_call>`` that opens a tagged call (``<function=``) ends the thinking too (``qwen3``)."""


@dataclass
class ReasoningStream:
    """One choice's text, pushed as it becomes final, split into reasoning and content."""

    thinking: bool
    """Whether the text starts inside the thinking (``thinks``); False passes everything as content."""
    calls_end: bool = False
    """``Thinking.calls_end``: Qwen3.5 may open a tagged call without closing its thinking first."""
    _opening: bool = True
    _held: str = ""

    def push(self, text: str) -> tuple[str, str]:
        """(reasoning, content) released by ``text``; a tag still arriving is held back."""
        if not self.thinking:
            return "", text
        text, self._held = self._held + text, ""
        if self._opening:
            # A leading <think> (the model opened its thinking itself) is not part of it.
            stripped = text.lstrip()
            if len(stripped) < len(START) and START.startswith(stripped):
                self._held = text
                return "", ""
            self._opening = False
            if stripped.startswith(START):
                text = stripped[len(START):]
        at = text.find(END)
        call = _call_opening(text) if self.calls_end else -1
        if call >= 0 and (at < 0 or call < at):
            self.thinking = False  # the call is the answer's: it stays in the content, tag and all
            return text[:call], text[call:]
        if at >= 0:
            self.thinking = False
            return text[:at], text[at + len(END):]
        keep = max(_partial_tag(text), _partial_call(text) if self.calls_end else 0)
        self._held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep], ""

    def finish(self) -> tuple[str, str]:
        """The rest once the choice has finished: a held partial tag was reasoning after all."""
        held, self._held = self._held, ""
        return (held, "") if self.thinking else ("", held)


def split_answer(thinking: bool, text: str, calls_end: bool = False) -> tuple[str | None, str | None]:
    """(reasoning, content) of a finished answer, as its streamed deltas join: a split answer's
    reasoning is text ("" when it thought nothing) and its content None when empty (vLLM's); an
    answer not split is its text, unchanged, as content."""
    if not thinking:
        return None, text
    stream = ReasoningStream(thinking, calls_end)
    reasoning, content = stream.push(text)
    more, rest = stream.finish()
    return reasoning + more, (content + rest) or None  # vLLM's: "" thinking stays "", no answer is null


def _partial_tag(text: str) -> int:
    """The length of the longest end of ``text`` that begins the closing tag."""
    for n in range(min(len(END) - 1, len(text)), 0, -1):
        if END.startswith(text[-n:]):
            return n
    return 0


def _call_opening(text: str) -> int:
    """Where the first ``<tool_call>`` that a ``<function=`` follows (after whitespace) begins; -1: none."""
    at = text.find(CALL)
    while at >= 0:
        if text[at + len(CALL):].lstrip().startswith(FUNCTION):
            return at
        at = text.find(CALL, at + 1)
    return -1


def _partial_call(text: str) -> int:
    """The length of the end of ``text`` that may still become ``<tool_call>`` and ``<function=``."""
    at = text.rfind(CALL)
    if at >= 0 and FUNCTION.startswith(text[at + len(CALL):].lstrip()):
        return len(text) - at
    return next((n for n in range(min(len(CALL) - 1, len(text)), 0, -1) if CALL.startswith(text[-n:])), 0)


def reasoning_tokens(tokenizer: Any, token_ids: Sequence[int], thinking: Thinking) -> int:
    """The output tokens up to the one that ends the thinking (all of them when it never ends; 0 when
    the answer was not split): vLLM's ``completion_tokens_details.reasoning_tokens``."""
    if not thinking.starts_inside:
        return 0

    def ended(n: int) -> bool:
        stream = ReasoningStream(True, thinking.calls_end)
        stream.push(tokenizer.decode(list(token_ids[:n]), skip_special_tokens=False))
        return not stream.thinking

    low, high = 0, len(token_ids)  # the end, once in a prefix, is in every longer one: search for the first
    if not ended(high):
        return high
    while low < high:
        mid = (low + high) // 2
        low, high = (low, mid) if ended(mid) else (mid + 1, high)
    return low
