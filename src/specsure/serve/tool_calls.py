"""The function calls in a chat answer: found in its text, whole or as it streams.

What each ``tool_choice`` generates (``specsure.serve.tools``) is read back here:
- ``auto``, Hermes format (``--tool-call-parser hermes``; Qwen2.5, Hermes 2 Pro and later): each call
  is ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``. Text outside calls is the
  message's content. A call whose JSON does not parse, or that lacks its name, stays in the
  content as written, so nothing the model wrote is lost.
- ``auto``, Llama 3 JSON format (``--tool-call-parser llama3_json``; Llama 3.1 to 3.3, 4): an
  answer that begins with ``{`` (after Llama's ``<|python_tag|>``, if the text shows it) is calls,
  ``{"name": ..., "parameters": {...}}`` (or ``"arguments"``), one after another, optionally
  separated by ``;``. What does not parse as a call, from there on, is the content.
- ``auto``, tag format (``--tool-call-parser qwen3_coder``; Qwen3-Coder, Qwen3.5): each call is a
  ``<tool_call>`` block of ``<function=NAME>`` and ``<parameter=KEY>value</parameter>`` tags, the
  values typed by the function's schema (``xml_calls``); otherwise as Hermes.
- ``auto``, Mistral format (``--tool-call-parser mistral``): ``[TOOL_CALLS]`` and then the calls,
  a JSON array or ``name[ARGS]{...}`` (``call_formats``); the text before it is the content. The
  calls are released when the answer ends.
- ``auto``, Granite format (``--tool-call-parser granite``; IBM Granite 3.x): an answer that begins
  with ``<|tool_call|>`` (or ``<tool_call>``) and a JSON array of ``{"name", "arguments"}`` is
  calls, released when the answer ends; any other answer is text.
- ``auto``, Python format (``--tool-call-parser pythonic``; Llama 3.2's small models, ToolACE): an
  answer that is a Python list of calls with keyword arguments, ``[get_weather(city="Oslo")]``, is
  calls; the arguments must be literals. Any other answer is text (one that begins with ``[`` is
  held back until it ends, to tell).
- ``required``: the whole output is a JSON array of ``{"name", "parameters"}`` objects.
- a named function: the whole output is the arguments.

``ToolCallStream`` gives the same calls and content as ``parse_answer``, in pieces: content as it
becomes final, each call once its text is complete. Whitespace at the end of the content is held
back while a call may follow, and dropped when calls were made, as ``parse_answer`` strips it.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from specsure.serve.tools import Tools
from specsure.serve.call_formats import ARGS, MARKER as MISTRAL, hermes_call, json_calls, llama3_call, \
    mistral_calls, mistral_id, python_calls
from specsure.serve.xml_calls import FUNCTION_END, xml_call

PARSERS = ("granite", "hermes", "llama3_json", "mistral", "pythonic", "qwen3_coder")
"""The values of ``--tool-call-parser``."""
HERMES_START, HERMES_END = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
"""What Llama 3 writes before a call; a special token, so decoded text usually leaves it out."""
GRANITE = "<|tool_call|>"
"""What Granite 3.x writes before its calls (vLLM's parser takes ``<tool_call>`` there too)."""


def check_parser(name: str, tokenizer: Any) -> bool:
    """Refuse an unknown parser or a model without a tokenizer; True when the parser's tags are
    special tokens, which decoded text skips: its requests then decode with them shown."""
    if name not in PARSERS:
        raise ValueError(f"tool_call_parser = {name!r} is not one specsure has; choose one of {', '.join(PARSERS)}.")
    if tokenizer is None:
        raise ValueError("tool_call_parser needs the model's tokenizer (its chat template renders the tools), and "
                         "this model has none.")
    tags = {"hermes": (HERMES_START, HERMES_END), "qwen3_coder": (HERMES_START, HERMES_END),
            "mistral": (MISTRAL, ARGS), "granite": (GRANITE,)}.get(name, ())
    return any(tokenizer.decode(tokenizer.encode(tag, add_special_tokens=False), skip_special_tokens=True) != tag
               for tag in tags)


@dataclass(frozen=True)
class ToolCall:
    """One call the model made; ``arguments`` is JSON text, as OpenAI sends it."""

    name: str
    arguments: str
    id: str = field(default_factory=lambda: f"chatcmpl-tool-{uuid.uuid4().hex}")

    def to_dict(self, index: int | None = None) -> dict[str, Any]:
        """The message's ``tool_calls`` entry; with ``index``, the streamed delta's."""
        head = {} if index is None else {"index": index}
        return {**head, "id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class Answer:
    """A chat choice's message after its calls are read: content (None when empty) and calls."""

    content: str | None
    tool_calls: list[ToolCall]
    finish_reason: str | None


def parse_answer(tools: Tools | None, text: str, finish_reason: str | None, parser: str = "hermes") -> Answer:
    """The message a finished chat choice's ``text`` gives under ``tools``; ``parser`` reads ``auto``."""
    stream = ToolCallStream(tools, parser)
    if stream.named is not None:
        return Answer(None, [ToolCall(stream.named, text)], finish_reason)
    content, calls = stream.push(text)
    rest, more = stream.finish()
    content += rest
    calls += more
    return Answer(content or None if calls else content, calls, stream.finish_reason(finish_reason))


class ToolCallStream:
    """One chat choice's text, pushed as it becomes final, split into content and calls."""

    def __init__(self, tools: Tools | None, parser: str = "hermes") -> None:
        self._mode = tools.choice if tools is not None else "none"
        self._parser = parser
        schemas = {f.name: f.parameters for f in tools.functions} if tools is not None else {}
        self._body_call = _hermes_call if parser != "qwen3_coder" else lambda body: _tagged_call(body, schemas)
        """Reads the text inside <tool_call> ... </tool_call>: JSON (hermes) or tags (qwen3_coder)."""
        self._calling: bool | None = None  # llama3_json, pythonic: None until the answer shows whether it is calls
        self._parallel = tools is None or tools.parallel
        self.named = tools.named if tools is not None and tools.choice == "named" else None
        self._pending = ""  # text not yet released: a tag arriving, a call's body, the array's rest
        self._held = ""  # content's trailing whitespace, released with the content after it
        self._in_call = False
        self._calls: list[ToolCall] = []
        self._named_call: ToolCall | None = None

    def deltas(self, text: str, final: bool = False) -> list[dict[str, Any]]:
        """The chat deltas for ``text`` (and, when ``final``, for everything still held back)."""
        if self.named is not None:
            if self._named_call is None:  # the first delta names the call; later ones add to its arguments
                self._named_call = ToolCall(self.named, text)
                return [{"tool_calls": [self._named_call.to_dict(0)]}]
            return [{"tool_calls": [{"index": 0, "function": {"arguments": text}}]}] if text else []
        before = len(self._calls)
        content, calls = self.push(text)
        if final:
            rest, more = self.finish()
            content, calls = content + rest, calls + more
        out: list[dict[str, Any]] = [{"content": content}] if content else []
        if calls:
            out.append({"tool_calls": [call.to_dict(before + i) for i, call in enumerate(calls)]})
        return out

    def push(self, text: str) -> tuple[str, list[ToolCall]]:
        """(content released, calls completed) after ``text``."""
        if self._mode == "none":
            return text, []
        self._pending += text
        return self._release(final=False)

    def finish(self) -> tuple[str, list[ToolCall]]:
        """The rest, once the choice has finished."""
        if self._mode == "none":
            return "", []
        return self._release(final=True)

    def finish_reason(self, reason: str | None) -> str | None:
        """``tool_calls`` when the model stopped after calling (OpenAI's), else the engine's reason."""
        return "tool_calls" if self._calls and reason == "stop" else reason

    def _release(self, final: bool) -> tuple[str, list[ToolCall]]:
        if self._mode == "required":
            content, calls = self._required(final)
        else:
            read = {"hermes": self._hermes, "qwen3_coder": self._hermes, "llama3_json": self._llama3,
                    "pythonic": self._pythonic, "mistral": self._mistral, "granite": self._granite}[self._parser]
            content, calls = read(final)
        return self._hold_whitespace(content, final), calls

    def _take(self, call: ToolCall) -> bool:
        """Record ``call`` unless parallel_tool_calls is false and one was made: then only the first counts."""
        if self._calls and not self._parallel:
            return False
        self._calls.append(call)
        return True

    def _pythonic(self, final: bool) -> tuple[str, list[ToolCall]]:
        if self._calling is None:
            head = self._pending.lstrip()
            if not head and not final:
                return "", []
            self._calling = head.startswith("[")
        if not self._calling:
            content, self._pending = self._pending, ""
            return content, []
        if not final:
            return "", []  # a list is calls only if the whole of it parses: wait for its end
        text, self._pending = self._pending.strip(), ""
        found = python_calls(text)
        if found is None:
            return text, []
        return "", [call for call in (ToolCall(*c) for c in found) if self._take(call)]

    def _granite(self, final: bool) -> tuple[str, list[ToolCall]]:
        tags = (GRANITE, HERMES_START)
        if self._calling is None:
            head = self._pending.lstrip()
            if not final and (not head or any(tag.startswith(head) for tag in tags)):
                return "", []  # nothing yet, or a tag still arriving: undecided
            self._calling = head.startswith((*tags, "["))
        if not self._calling:
            content, self._pending = self._pending, ""
            return content, []
        if not final:
            return "", []  # calls only if the whole answer parses: wait for its end
        text, self._pending = self._pending.strip(), ""
        body = text
        for tag in tags:
            body = body.removeprefix(tag).lstrip()
        found = json_calls(body) if body.startswith("[") else None
        if found is None:  # not calls: the text stays as written
            return text, []
        calls = [ToolCall(name, arguments) for name, arguments in found]
        return "", [call for call in calls if self._take(call)]

    def _mistral(self, final: bool) -> tuple[str, list[ToolCall]]:
        """The content up to ``[TOOL_CALLS]``; the calls after it once the answer has ended."""
        content = ""
        if not self._in_call:
            at = self._pending.find(MISTRAL)
            if at < 0:
                cut = len(self._pending) - (0 if final else _tag_prefix(self._pending, MISTRAL))
                content, self._pending = self._pending[:cut], self._pending[cut:]
                return content, []
            content, self._pending, self._in_call = self._pending[:at], self._pending[at:], True
        if not final:
            return content, []
        text, self._pending, self._in_call = self._pending, "", False
        found = mistral_calls(text[len(MISTRAL):])
        if found is None:  # not calls: the text stays as written
            return content + text, []
        calls = [ToolCall(name, arguments, mistral_id()) for name, arguments in found]
        return content, [call for call in calls if self._take(call)]

    def _llama3(self, final: bool) -> tuple[str, list[ToolCall]]:
        if self._calling is None:
            head = self._pending.lstrip()
            if not final and (not head or PYTHON_TAG.startswith(head)):
                return "", []  # nothing yet, or the tag still arriving: undecided
            if head.startswith(PYTHON_TAG):
                head = head[len(PYTHON_TAG):].lstrip()
            self._calling = head.startswith("{")
            if self._calling:
                self._pending = head
        if not self._calling:
            content, self._pending = self._pending, ""
            return content, []
        calls = []
        decoder = json.JSONDecoder()
        while True:
            text = self._pending.lstrip().lstrip(";").lstrip()
            try:
                item, end = decoder.raw_decode(text)
            except json.JSONDecodeError:
                if final or (text and text[0] != "{"):  # not a call: the rest is content
                    self._calling, content, self._pending = False, self._pending.lstrip(), ""
                    return content, calls
                return "", calls
            found = llama3_call(item)
            call = ToolCall(*found) if found is not None else None
            if call is None:
                self._calling, content, self._pending = False, self._pending.lstrip(), ""
                return content, calls
            if self._take(call):
                calls.append(call)
            self._pending = text[end:]

    def _hermes(self, final: bool) -> tuple[str, list[ToolCall]]:
        content, calls = "", []
        while True:
            if self._in_call:
                end = self._pending.find(HERMES_END)
                if self._parser == "qwen3_coder":  # a value may hold the tag: only the one after </function> ends
                    while end >= 0 and not self._pending[:end].rstrip().endswith(FUNCTION_END):
                        end = self._pending.find(HERMES_END, end + 1)
                if end < 0:
                    if final:  # an unfinished call stays as written
                        content += HERMES_START + self._pending
                        self._pending, self._in_call = "", False
                    break
                body = self._pending[:end]
                self._pending, self._in_call = self._pending[end + len(HERMES_END):], False
                call = self._body_call(body)
                if call is None:
                    content += HERMES_START + body + HERMES_END
                else:
                    # A call separates the text around it: whitespace before it goes (the text after
                    # keeps its own), as a call at the end drops it. Whitespace held from an earlier
                    # push goes too, unless text of this push stands between it and the call.
                    content = content.rstrip()
                    if not content:
                        self._held = ""
                    if self._take(call):
                        calls.append(call)
                continue
            start = self._pending.find(HERMES_START)
            if start >= 0:
                content += self._pending[:start]
                self._pending, self._in_call = self._pending[start + len(HERMES_START):], True
                continue
            keep = 0 if final else _tag_prefix(self._pending, HERMES_START)
            content += self._pending[:len(self._pending) - keep]
            self._pending = self._pending[len(self._pending) - keep:]
            return content, calls
        return content, calls

    def _required(self, final: bool) -> tuple[str, list[ToolCall]]:
        """``required``'s JSON array: each element becomes a call once it has parsed."""
        calls = []
        decoder = json.JSONDecoder()
        while True:
            text = self._pending.lstrip()
            text = text[1:] if text[:1] in ("[", ",") else text
            try:
                item, end = decoder.raw_decode(text.lstrip())
            except json.JSONDecodeError:
                break
            if not isinstance(item, dict) or not isinstance(item.get("name"), str) or "parameters" not in item:
                break  # the grammar rules this out; what is left becomes content below
            call = ToolCall(item["name"], json.dumps(item["parameters"], ensure_ascii=False))
            self._calls.append(call)
            calls.append(call)
            self._pending = text.lstrip()[end:]
        if not final:
            return "", calls
        rest, self._pending = self._pending.strip(), ""
        # Cut short (max_tokens) before the array closed: what did not parse is the content, as written.
        return ("" if rest == "]" else rest), calls

    def _hold_whitespace(self, content: str, final: bool) -> str:
        """``content`` less its trailing whitespace, which waits for the content after it; at the end an
        answer with calls drops it, as ``parse_answer`` does."""
        content, self._held = self._held + content, ""
        stripped = content.rstrip()
        if final:
            return stripped if self._calls else content
        self._held = content[len(stripped):]
        return stripped


def _tagged_call(body: str, schemas: dict[str, Any]) -> ToolCall | None:
    found = xml_call(body, schemas)
    return ToolCall(*found) if found is not None else None


def _hermes_call(body: str) -> ToolCall | None:
    found = hermes_call(body)
    return ToolCall(*found) if found is not None else None


def _tag_prefix(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that begins ``tag``: it may be a tag still arriving."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0
