"""A POST /v1/responses body (OpenAI's Responses API), read as the chat request it amounts to.

The Responses API says what chat completions say in other words: ``input`` items for messages,
``instructions`` for a first system message, flat function tools, ``text.format`` for
``response_format``, ``max_output_tokens`` for ``max_tokens``. The body is checked here in its
own words, then translated and parsed by the chat parser, so both endpoints take exactly the same
sampling values, tools and constraints; an error the chat parser raises is reworded to name the
Responses field. ``previous_response_id`` puts a stored response's conversation (its input and
output, not its instructions) before ``input``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from specsure.config.errors import json_type, suggest
from specsure.sampling import MAX_LOGPROBS
from specsure.serve.errors import RequestError, shown
from specsure.serve.openai_fields import check_labels
from specsure.serve.protocol import SAMPLING_FIELDS, ChatRequest, parse_chat
from specsure.serve.response_input import input_messages, known
from specsure.serve.response_items import listed_items

EXTENSIONS = tuple(f for f in SAMPLING_FIELDS if f not in ("max_tokens", "temperature", "top_p"))
"""vLLM's sampling extensions, taken here as on the chat endpoint."""
FIELDS = ("model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "tools", "tool_choice",
          "parallel_tool_calls", "text", "reasoning", "stream", "stream_options", "store", "previous_response_id",
          "metadata", "user", "safety_identifier", "prompt_cache_key", "top_logprobs", "include", "truncation",
          "background", "service_tier", "max_tool_calls", "prompt", "chat_template_kwargs", "include_reasoning",
          "structured_outputs", *EXTENSIONS)
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "background": (False, True), "truncation": ("disabled", "auto"), "service_tier": ("auto", "default"),
    "max_tool_calls": (), "prompt": (),
}
"""Fields accepted only as null or at these values: the first changes nothing; ``truncation`` "auto"
drops the oldest turns that do not fit the context (`truncated`); ``background`` true answers at once
and generates on (response_background.py)."""
LOGPROBS = "message.output_text.logprobs"
ENCRYPTED = "reasoning.encrypted_content"
INCLUDABLE = (LOGPROBS, ENCRYPTED)
"""What ``include`` may ask for: the tokens' log-probabilities; encrypted reasoning is accepted (Codex
asks for it) and changes nothing, as in vLLM: the thinking comes as the reasoning item's text."""
TOOL_FIELDS = ("type", "name", "description", "parameters", "strict")
FORMAT_FIELDS = {"text": ("type",), "json_object": ("type",),
                 "json_schema": ("type", "name", "schema", "strict", "description")}
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
SUMMARIES = (None, "auto", "concise", "detailed")

History = Callable[[str], list[dict[str, Any]]]
"""A stored response's conversation by its id (chat messages); raises an APIError for an unknown id."""

_CHAT_WORDS = ((r"tools\[(\d+)\]\.function\.", r"tools[\1]."), (r"tool_choice\.function\.", "tool_choice."),
               (r"response_format\.json_schema\.", "text.format."), (r"response_format", "text.format"),
               (r"\bmax_tokens\b", "max_output_tokens"), (r"\bmessages\b", "input"))
"""The chat parser's field names, and what the same field is called in a Responses body."""
_CHAT_SHAPES = (('{"type": "function", "function": {"name": "..."}}', '{"type": "function", "name": "..."}'),
                ('{"type": "function", "function": {"name": "get_weather", "parameters": {...}}}',
                 '{"type": "function", "name": "get_weather", "parameters": {...}}'),
                ('{"type": "function", "function": {...}}', '{"type": "function", "name": "...", "parameters": {...}}'))
"""Chat's shapes in the chat parser's fixes, and the Responses body's."""


@dataclass(frozen=True)
class ResponseRequest:
    """A validated POST /v1/responses body."""

    chat: ChatRequest
    """The chat request it amounts to: messages (instructions, history and input), sampling, tools."""
    conversation: list[dict[str, Any]]
    """The history and this input as chat messages, without instructions: what a later
    ``previous_response_id`` continues (with this response's output after it)."""
    settings: dict[str, Any]
    """The request's settings as the response object repeats them (OpenAI's fields, defaults filled)."""
    store: bool = True
    """Keep the response for GET /v1/responses/{id} and ``previous_response_id`` (OpenAI's default)."""
    logprobs: bool = False
    """Each output_text carries its tokens' log-probabilities."""
    input_items: list[dict[str, Any]] = field(default_factory=list)
    """The request's ``input`` as GET /v1/responses/{id}/input_items lists it."""
    truncate: bool = False
    """``truncation`` "auto": the oldest turns that do not fit the context are left out of the prompt."""
    background: bool = False
    """Answer at once, queued, and generate on; the stored response tells how it went."""


def parse_response(body: Any, model_name: str, history: History, auto_tool_parser: str | None = None,
                   special_tags: bool = False) -> ResponseRequest:
    """``history`` looks up ``previous_response_id``; the other arguments are ``parse_chat``'s."""
    body = _check_fields(body)
    given_input = body.get("input")
    if given_input is None:
        raise RequestError('input is missing; send the text, or a list of items, e.g. "input": "Hello".', "input")
    new = input_messages(given_input)
    previous = body.get("previous_response_id")
    if previous is not None and not isinstance(previous, str):
        raise RequestError(f"previous_response_id = {shown(previous)} must be the id of a stored response "
                           '("resp_...").', "previous_response_id")
    earlier = history(previous) if previous is not None else []
    _check_outputs(given_input, earlier)
    conversation = earlier + new
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise RequestError(f"instructions = {shown(instructions)} must be a string: the system message.",
                           "instructions")
    system = [{"role": "system", "content": instructions}] if instructions else []
    top = body.get("top_logprobs")
    if top is not None and (type(top) is not int or not 0 <= top <= MAX_LOGPROBS):
        raise RequestError(f"top_logprobs = {shown(top)} must be an integer from 0 to {MAX_LOGPROBS}: how many most "
                           "likely alternatives to return with each token.", "top_logprobs")
    # As in OpenAI's API and vLLM's, include asks for the logprobs and top_logprobs says how many alternatives.
    logprobs = LOGPROBS in _include(body.get("include"))
    chat_body: dict[str, Any] = {k: body[k] for k in ("model", "temperature", "top_p", "stream", "user",
                                                      "parallel_tool_calls", "tool_choice", "include_reasoning",
                                                      "structured_outputs", *EXTENSIONS)
                                 if body.get(k) is not None}
    chat_body["messages"] = system + conversation
    if body.get("max_output_tokens") is not None:
        chat_body["max_tokens"] = body["max_output_tokens"]
    if body.get("tools") is not None:
        chat_body["tools"] = _tools(body["tools"])
    if isinstance(body.get("tool_choice"), dict):
        chat_body["tool_choice"] = _named_choice(body["tool_choice"])
    fmt = _format(body.get("text"))
    if fmt is not None:
        chat_body["response_format"] = fmt
    variables = _template_variables(body)
    if variables is not None:
        chat_body["chat_template_kwargs"] = variables
    if logprobs:
        chat_body["logprobs"], chat_body["top_logprobs"] = True, top or 0
    _check_stream_options(body)
    if logprobs and body.get("tools") and body.get("tool_choice", "auto") != "none":
        raise RequestError(f'include {LOGPROBS!r} with tools: an output_text\'s logprobs would have to be told from '
                           'its calls\' tokens, which this server does not do; leave one of them out (or send '
                           '"tool_choice": "none").', "include")
    try:
        chat = parse_chat(chat_body, model_name, auto_tool_parser, special_tags)
    except RequestError as exc:
        raise in_responses_words(exc) from None
    chat = replace(chat, delivery=replace(chat.delivery, max_tokens_field="max_output_tokens"
                                          if body.get("max_output_tokens") is not None else None))
    store = body.get("store")
    if store is not None and not isinstance(store, bool):
        raise RequestError(f"store = {shown(store)} must be true or false: whether to keep the response for "
                           "GET /v1/responses/{id} and previous_response_id.", "store")
    background = body.get("background") is True
    if background and store is False:
        raise RequestError('background = true needs "store": true: a background response is read back from the '
                           "store (GET /v1/responses/{id}).", "store")
    if background and body.get("stream"):
        raise RequestError('background = true with "stream": true is not supported by specsure; poll GET '
                           "/v1/responses/{id} instead, or stream in the foreground.", "stream")
    return ResponseRequest(chat, conversation, _settings(body, chat), store is not False, logprobs,
                           listed_items(given_input), body.get("truncation") == "auto", background)


def _check_outputs(items: Any, earlier: list[dict[str, Any]]) -> None:
    """Every function_call_output answers a call made before it (in the previous response's turns or
    in the input), as OpenAI requires: a mistyped call_id would reach the model as an answer to nothing."""
    if not isinstance(items, list):
        return
    calls = {c["id"] for m in earlier for c in m.get("tool_calls") or () if "id" in c}
    for i, item in enumerate(items):
        kind = item.get("type", "message")
        if kind == "function_call":
            calls.add(item["call_id"])
        elif kind == "function_call_output" and item["call_id"] not in calls:
            made = f"the calls made so far: {', '.join(sorted(calls))}" if calls else "no call was made before it"
            raise RequestError(f"input[{i}].call_id = {shown(item['call_id'])} answers no earlier function_call "
                               f"({made}); send the call_id of the call it answers, with previous_response_id or "
                               "the function_call item before it.", f"input[{i}].call_id")


def truncated(messages: list[dict[str, Any]], fits: Callable[[list[dict[str, Any]]], bool]) -> list[dict[str, Any]]:
    """Chat ``messages`` without their oldest turns, as few as make ``fits`` true (truncation "auto").

    The cut falls only where a user message starts a turn, so the system message stays, a call is
    never parted from its results, and the kept messages start with a user turn as templates that
    want roles to alternate require; the newest turn always stays (a prompt still too long then
    gets the usual 400). The cut is found by bisection: a few renders, not one per turn.
    """
    start = 1 if messages and messages[0]["role"] == "system" else 0
    cuts = [i for i in range(start, len(messages)) if messages[i]["role"] == "user"]
    if not cuts or fits(messages):
        return messages
    low, high = 0, len(cuts) - 1  # keep from cuts[high] on: the newest turn, the most that may be dropped
    while low < high:
        middle = (low + high) // 2
        if fits(messages[:start] + messages[cuts[middle]:]):
            high = middle
        else:
            low = middle + 1
    return messages[:start] + messages[cuts[low]:]


def _tools(value: Any) -> Any:
    """Responses' flat function tools as chat's ``{"type": "function", "function": {...}}``."""
    if not isinstance(value, list):
        return value  # the chat parser names the shape it wants
    out = []
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise RequestError(f"{where} = {shown(tool)} is not a function tool; this server runs only the client's "
                               'functions, {"type": "function", "name": "...", "parameters": {...}} (no built-in '
                               "tools such as web_search).", f"{where}.type" if kind is not None else where)
        known(tool, TOOL_FIELDS, where)
        out.append({"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}})
    return out


def _named_choice(value: dict[str, Any]) -> dict[str, Any]:
    if value.get("type") != "function" or not isinstance(value.get("name"), str):
        raise RequestError(f"tool_choice = {shown(value)} must be none, auto, required, or "
                           '{"type": "function", "name": "..."} naming one of the tools.', "tool_choice")
    known(value, ("type", "name"), "tool_choice")
    return {"type": "function", "function": {"name": value["name"]}}


def _format(text: Any) -> dict[str, Any] | None:
    """``text.format`` as chat's ``response_format``; None for plain text."""
    if text is None:
        return None
    if not isinstance(text, dict):
        raise RequestError(f'text = {shown(text)} must be an object such as {{"format": {{"type": "json_object"}}}}.',
                           "text")
    known(text, ("format", "verbosity"), "text")
    verbosity = text.get("verbosity")
    if verbosity not in (None, "medium"):
        raise RequestError(f"text.verbosity = {shown(verbosity)} is not supported by specsure (the model's length is "
                           "not steerable here); leave it out, or send medium.", "text.verbosity",
                           "unsupported_field")
    fmt = text.get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if not isinstance(kind, str) or kind not in FORMAT_FIELDS:
        raise RequestError(f"text.format = {shown(fmt)} must be an object whose type is one of "
                           f"{', '.join(FORMAT_FIELDS)}, e.g. " + '{"type": "json_object"}.', "text.format")
    known(fmt, FORMAT_FIELDS[kind], "text.format")
    if kind != "json_schema":
        return {"type": kind}
    if not isinstance(fmt.get("schema"), dict) or not isinstance(fmt.get("name"), str):
        raise RequestError('text.format of type json_schema needs a name and a schema, e.g. {"type": "json_schema", '
                           f'"name": "answer", "schema": {{"type": "object"}}}}; got {shown(fmt)}.', "text.format")
    return {"type": "json_schema", "json_schema": {k: v for k, v in fmt.items() if k != "type"}}


def _template_variables(body: dict[str, Any]) -> Any:
    """``chat_template_kwargs``, with ``reasoning.effort`` as ``reasoning_effort``, and ``enable_thinking``
    false for the effort ``none`` unless the request set it (as vLLM hands them to the template:
    templates that do not read them ignore them)."""
    reasoning, variables = body.get("reasoning"), body.get("chat_template_kwargs")
    if reasoning is None:
        return variables
    if not isinstance(reasoning, dict):
        raise RequestError(f'reasoning = {shown(reasoning)} must be an object such as {{"effort": "low"}}.',
                           "reasoning")
    known(reasoning, ("effort", "summary", "generate_summary"), "reasoning")
    for key in ("summary", "generate_summary"):
        if reasoning.get(key) not in SUMMARIES:
            raise RequestError(f"reasoning.{key} = {shown(reasoning[key])} must be one of {', '.join(map(str, SUMMARIES[1:]))} "
                               "or null (no summary is written here: the thinking comes whole).", f"reasoning.{key}")
    effort = reasoning.get("effort")
    if effort is not None and effort not in EFFORTS:
        raise RequestError(f"reasoning.effort = {shown(effort)} must be one of {', '.join(EFFORTS)}.",
                           "reasoning.effort")
    if effort is None or not (variables is None or isinstance(variables, dict)):
        return variables
    if isinstance(variables, dict) and variables.get("reasoning_effort", effort) != effort:
        raise RequestError(f"reasoning.effort = {shown(effort)} and chat_template_kwargs.reasoning_effort = "
                           f"{shown(variables['reasoning_effort'])} disagree; send one of them.", "reasoning.effort")
    return {"enable_thinking": effort != "none", **(variables or {}), "reasoning_effort": effort}


def _include(value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RequestError(f'include = {shown(value)} must be a list of strings, e.g. ["{LOGPROBS}"].', "include")
    for item in value:
        if item not in INCLUDABLE:
            raise RequestError(f"include = {shown(value)}: {item!r} is not something this server returns; it can "
                               f"include {', '.join(INCLUDABLE)}.", "include")
    return list(value)


def _check_stream_options(body: dict[str, Any]) -> None:
    options = body.get("stream_options")
    if options is None:
        return
    if body.get("stream") is not True:
        raise RequestError("stream_options is only allowed with stream = true; remove stream_options, or send "
                           "stream = true.", "stream_options")
    if not isinstance(options, dict):
        raise RequestError(f"stream_options = {shown(options)} must be an object.", "stream_options")
    known(options, ("include_obfuscation",), "stream_options")
    if not isinstance(options.get("include_obfuscation", False), bool):
        raise RequestError(f"stream_options.include_obfuscation = {shown(options['include_obfuscation'])} must be "
                           "true or false (this server never pads its events, so either reads the same).",
                           "stream_options.include_obfuscation")


def _check_fields(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object with the fields of POST /v1/responses, got "
                           f"{json_type(body)} {shown(body)}.")
    for key, value in body.items():
        if key not in FIELDS:
            hint = {"messages": " Send the messages as input.", "max_tokens": " Send max_output_tokens.",
                    "max_completion_tokens": " Send max_output_tokens.",
                    "response_format": ' Send it as text.format, e.g. "text": {"format": {"type": "json_object"}}.',
                    "n": " A response has one answer; send several requests."}.get(key) or suggest(key, FIELDS)
            raise RequestError(f"unknown field {key!r} in the body of POST /v1/responses.{hint} Fields: "
                               f"{', '.join(FIELDS)}.", key, "unknown_field")
        if key in NEUTRAL and value is not None and not any(value == n and type(value) is type(n)
                                                            for n in NEUTRAL[key]):
            accepted = " or ".join(["null", *(shown(n) for n in NEUTRAL[key])])
            raise RequestError(f"{key} = {shown(value)} is not supported by specsure; leave the field out (only "
                               f"{accepted} is accepted).", key, "unsupported_field")
    check_labels(body)
    return body


def in_responses_words(exc: RequestError) -> RequestError:
    """The chat parser's error in the Responses body's words: its field, where the message names it
    (never inside what the client sent), and chat's shapes in the fixes as Responses writes them."""
    message, param = str(exc), exc.param
    if param is not None and not param.startswith("chat_template_kwargs"):
        ours = param
        for chat, word in _CHAT_WORDS:
            ours = re.sub(chat, word, ours)
        message = message.replace(f"{param} = ", f"{ours} = ").replace(f"{param}:", f"{ours}:")
        message = message.replace(f'"{param}": ', f'"{ours}": ')  # the key in an example of the fix
        message = re.sub(rf"(?<![\w.\[\"]){re.escape(param)}(?![\w\]\"])", ours, message)
        param = ours
    for chat, word in _CHAT_SHAPES:
        message = message.replace(chat, word)
    return RequestError(message, param, exc.code)


def _settings(body: dict[str, Any], chat: ChatRequest) -> dict[str, Any]:
    """The request's settings as the response object repeats them, OpenAI's defaults where none was sent."""
    tools = chat.tools
    reasoning = body.get("reasoning") or {}
    return {
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": body.get("metadata") or {},
        "parallel_tool_calls": tools.parallel if tools is not None else body.get("parallel_tool_calls") is not False,
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
        "store": body.get("store") is not False,
        "temperature": chat.params.temperature,
        "text": {"format": body["text"]["format"] if isinstance(body.get("text"), dict)
                 and body["text"].get("format") is not None else {"type": "text"}},
        "tool_choice": body.get("tool_choice") or ("auto" if tools is not None else "none"),
        "tools": body.get("tools") or [],
        "top_logprobs": body.get("top_logprobs") or 0,
        "top_p": chat.params.top_p,
        "truncation": body.get("truncation") or "disabled",
        "user": body.get("user"),
        "background": body.get("background") is True,
        "service_tier": body.get("service_tier") or "auto",
        "max_tool_calls": None,
        "safety_identifier": body.get("safety_identifier"),
        "prompt_cache_key": body.get("prompt_cache_key"),
    }
