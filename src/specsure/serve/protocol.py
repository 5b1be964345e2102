"""OpenAI request parsing for ``specsure serve`` (errors: ``errors``; output constraints:
``response_format``; chat messages: ``messages``; tools: ``tools``; bodies: ``responses``).

Parsing is strict: an unknown field, a wrong type or a value out of range is a ``RequestError``
whose message names the field, the value and the fix; the app answers it with a 400 in OpenAI's
error shape. Sampling fields are validated by ``SamplingParams`` itself, so the server and the
Python API accept exactly the same values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from specsure.config.errors import json_type, suggest
from specsure.sampling import MAX_LOGPROBS, SamplingError, SamplingParams
from specsure.serve.body import flag
from specsure.serve.chat_template import parse_template_kwargs, template_flags
from specsure.serve.errors import RequestError, not_served, shown
from specsure.serve.messages import parse_messages
from specsure.serve.openai_fields import check_fields, check_labels
from specsure.serve.response_format import output_constraint
from specsure.serve.tools import Tools, parse_tools


COMPLETION_MAX_TOKENS = 16
"""max_tokens when a completion request omits it (OpenAI's and vLLM's default)."""
CHAT_MAX_TOKENS = 512
"""max_tokens when a chat request omits it. OpenAI's default is "the rest of the context", which
on a CPU can mean minutes for a model that never stops; the response says 'length' when cut.
Either default is lowered to the room the prompt leaves in the context."""

SAMPLING_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "ignore_eos", "min_p",
                   "stop_token_ids", "include_stop_str_in_output", "min_tokens", "presence_penalty",
                   "frequency_penalty", "repetition_penalty", "logit_bias", "allowed_token_ids", "skip_special_tokens")
"""OpenAI's sampling fields and vLLM's extensions that specsure implements."""
COMMON_FIELDS = ("model", *SAMPLING_FIELDS, "n", "stream", "stream_options", "user", "response_format",
                 "structured_outputs", "truncate_prompt_tokens", "request_id")
COMPLETION_FIELDS = ("prompt", "logprobs", "echo", "prompt_logprobs", *COMMON_FIELDS)
CHAT_FIELDS = ("messages", "max_completion_tokens", "logprobs", "top_logprobs", "prompt_logprobs", "tools", "tool_choice",
               "parallel_tool_calls", "chat_template_kwargs", "include_reasoning", "add_generation_prompt",
               "continue_final_message", "metadata", "safety_identifier", "prompt_cache_key", *COMMON_FIELDS)
"""``metadata``, ``safety_identifier`` and ``prompt_cache_key`` label a request for OpenAI's own
records and routing; they are checked as OpenAI checks them and change nothing here (prefix caching
finds a shared prefix without a key)."""
MAX_N = 16
"""The most choices one request may ask for: each is a sequence in the running batch."""
MAX_PROMPTS = 64
"""The most prompts one completions request may hold."""
STREAM_OPTION_FIELDS = ("include_usage", "continuous_usage_stats")

_JSON_WORDS = ((r"\bNone\b", "null"), (r"\ba bool\b", "true or false"), (r"\ban int\b", "an integer"),
               (r"\bint\b", "integer"), (r"\bints\b", "integers"), (r"\ba dict\b", "an object"), (r"\ba str\b", "a string"), (r"\bstr\b", "string"), (r"2\*\*64", "2^64"), (r"2\*\*63", "2^63"))
SAMPLING_FIXES = {
    "max_tokens": 'send the number of new tokens to generate, e.g. "{param}": 16',
    "temperature": "send 0 for greedy decoding or a positive number such as 0.7",
    "top_p": "send 1 to disable nucleus sampling",
    "top_k": "send 0 or -1 to disable top-k",
    "seed": "send null or -1, or leave it out, for an unseeded generator",
    "stop": 'send a string or a list of non-empty strings, e.g. "stop": ["\\n\\n"]',
    "ignore_eos": "send true or false",
    "logprobs": "send the number of alternatives to return per token",
    "min_p": "send 0 to disable it",
    "stop_token_ids": 'send a list of token ids, e.g. "stop_token_ids": [2]',
    "include_stop_str_in_output": "send true or false",
    "skip_special_tokens": "send true (the default) or false",
    "min_tokens": "send at most the request's max_tokens, or 0",
    "presence_penalty": "send 0 to disable it",
    "frequency_penalty": "send 0 to disable it",
    "repetition_penalty": "send 1 to disable it",
    "logit_bias": 'send an object of token ids (as strings) to biases in [-100, 100], e.g. "logit_bias": {{"50256": -100}}',
    "allowed_token_ids": 'send a non-empty list of token ids, e.g. "allowed_token_ids": [11, 13, 42]',
}
"""The fix for each SamplingParams field, in the request's JSON."""


@dataclass(frozen=True)
class Delivery:
    """How a request wants its answer, and whether it chose its own max_tokens."""

    stream: bool = False
    """Server-sent events (OpenAI's chunk objects) instead of one body."""
    n: int = 1
    """Choices to generate for the one prompt; each runs as its own sequence in the batch."""
    include_usage: bool = False
    """``stream_options.include_usage``: a last chunk with ``usage`` and no choices."""
    max_tokens_field: str | None = None
    """The field that set max_tokens (``max_tokens`` or ``max_completion_tokens``); None when the
    endpoint's default applies, which is lowered to the room the prompt leaves."""
    continuous_usage: bool = False
    """``stream_options.continuous_usage_stats`` (vLLM's) with include_usage: every chunk carries
    its choice's usage so far."""
    truncate_prompt_tokens: int | None = None
    """vLLM's ``truncate_prompt_tokens``: keep only the prompt's last this many tokens (-1: as many
    as leave room in the context to generate); None keeps it whole."""
    prompt_logprobs: int | None = None
    """vLLM's ``prompt_logprobs``: the response carries each prompt token's log-probability, rank and
    this many most likely alternatives (``prompt_logprobs`` beside the choices); None: not asked."""
    request_id: str | None = None
    """vLLM's ``request_id``: the response's id is ``cmpl-<request_id>`` (``chatcmpl-`` on chat), as vLLM
    builds it, so a client finds its answer by the id it chose; None: a fresh one."""


@dataclass(frozen=True)
class CompletionRequest:
    """A validated POST /v1/completions body."""

    prompts: list[str | list[int]]
    """Each prompt: text, or token ids (one, unless the body sent a list of them)."""
    params: SamplingParams
    delivery: Delivery = Delivery()
    echo: bool = False
    """Each choice's text (and logprobs) begins with its prompt's (OpenAI's echo)."""
    prompt_only: bool = False
    """echo with max_tokens 0: each choice is its prompt alone, no output."""


@dataclass(frozen=True)
class ChatRequest:
    """A validated POST /v1/chat/completions body."""

    messages: list[dict[str, Any]]
    """Messages as the chat template takes them (``specsure.serve.messages``)."""
    params: SamplingParams
    delivery: Delivery = Delivery()
    tools: Tools | None = None
    """The functions offered and how they may be called; None without tools."""
    template_kwargs: dict[str, Any] | None = None
    """``chat_template_kwargs``: more variables for the chat template (Qwen3's ``enable_thinking``)."""
    include_reasoning: bool = True
    """vLLM's ``include_reasoning``: with a reasoning parser, false leaves the thinking out of the answer."""
    add_generation_prompt: bool = True
    """The template opens the assistant's turn after the messages (vLLM's field, default true)."""
    continue_final_message: bool = False
    """The last message is left open and the answer continues it: a prefilled reply (vLLM's field)."""


def parse_completion(body: Any, model_name: str) -> CompletionRequest:
    body = check_fields(body, COMPLETION_FIELDS, "POST /v1/completions")
    _check_common(body, model_name)
    check_labels(body)
    prompts = _parse_prompts(body.get("prompt"))
    given = "max_tokens" if body.get("max_tokens") is not None else None
    logprobs = body.get("logprobs")
    if logprobs is not None and (type(logprobs) is not int or not 0 <= logprobs <= MAX_LOGPROBS):
        raise RequestError(f"logprobs = {shown(logprobs)} must be an integer from 0 to {MAX_LOGPROBS}: how many "
                           "most likely alternatives to return with each token (0: only the chosen one's).",
                           "logprobs")
    echo = body.get("echo")
    if echo is not None and not isinstance(echo, bool):
        raise RequestError(f"echo = {shown(echo)} must be true or false: whether each choice's text begins with its "
                           "prompt.", "echo")
    # max_tokens 0 with echo scores the prompt alone (vLLM's echo without generation): one token is
    # generated, as the prompt's forward gives it anyway, and left out of the answer.
    zero = type(body.get("max_tokens")) is int and body["max_tokens"] == 0
    if zero and echo is not True:
        raise RequestError('max_tokens = 0 generates nothing; send at least 1, or "echo": true with it to score the '
                           "prompt alone.", "max_tokens")
    prompt_only = zero and echo is True
    params = _sampling({**body, "max_tokens": 1} if prompt_only else body, "max_tokens", COMPLETION_MAX_TOKENS,
                       logprobs)
    delivery = _delivery(body, given)
    echoed = logprobs if echo else None  # the prompt's tokens get their log-probabilities too, as in vLLM
    scored = [n for n in (echoed, delivery.prompt_logprobs) if n is not None]
    if scored:
        params = replace(params, prompt_logprobs=max(scored))
    return CompletionRequest(prompts, params, delivery, bool(echo), prompt_only)


def parse_chat(body: Any, model_name: str, auto_tool_parser: str | None = None,
               special_tags: bool = False) -> ChatRequest:
    """``auto_tool_parser``: the server's --tool-call-parser when --enable-auto-tool-choice is on;
    ``special_tags``: its tags are special tokens, so an answer that may call is decoded with
    special tokens shown (as vLLM's parsers ask), unless the request says otherwise."""
    body = check_fields(body, CHAT_FIELDS, "POST /v1/chat/completions")
    _check_common(body, model_name)
    check_labels(body)
    messages = parse_messages(body.get("messages"))
    tools = parse_tools(body, auto_tool_parser)
    new, old = body.get("max_completion_tokens"), body.get("max_tokens")
    if new is not None and old is not None and new != old:
        raise RequestError(f"max_completion_tokens = {shown(new)} and max_tokens = {shown(old)} disagree; they are "
                           "two names for the same limit. Send only max_completion_tokens.", "max_tokens")
    field = "max_completion_tokens" if new is not None else "max_tokens"
    params = _sampling({**body, "max_tokens": body.get(field)}, field, CHAT_MAX_TOKENS, _chat_logprobs(body))
    enforced = tools.constraint() if tools is not None else None
    if enforced is not None:
        if params.structured_outputs is not None:
            given = "response_format" if body.get("response_format") is not None else "structured_outputs"
            raise RequestError(f"tool_choice {shown(body.get('tool_choice'))} constrains the output to tool calls, "
                               f"and {given} constrains it too; send one of them.", given)
        params = replace(params, structured_outputs=enforced)
    if special_tags and tools is not None and tools.choice == "auto":
        if body.get("skip_special_tokens") is True:
            raise RequestError(f"skip_special_tokens = true hides this model's {auto_tool_parser} tags, which are "
                               "special tokens, so tool_choice auto could not find its calls; leave the field out.",
                               "skip_special_tokens")
        params = replace(params, skip_special_tokens=False)
    include = body.get("include_reasoning")
    if include is not None and not isinstance(include, bool):
        raise RequestError(f"include_reasoning = {shown(include)} must be true or false: whether the answer carries "
                           "the model's thinking (with a reasoning parser).", "include_reasoning")
    delivery = _delivery(body, field if body.get(field) is not None else None)
    if delivery.prompt_logprobs is not None:
        params = replace(params, prompt_logprobs=delivery.prompt_logprobs)
    return ChatRequest(messages, params, delivery, tools,
                       parse_template_kwargs(body.get("chat_template_kwargs")), include is not False,
                       *template_flags(body))





def _chat_logprobs(body: dict[str, Any]) -> int | None:
    """Chat's pair: logprobs (a bool) turns them on, top_logprobs (0 to 20) asks for alternatives."""
    wanted, top = body.get("logprobs"), body.get("top_logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        raise RequestError(f"logprobs = {shown(wanted)} must be true or false on /v1/chat/completions (the "
                           "number of alternatives goes in top_logprobs).", "logprobs")
    if top is not None and (type(top) is not int or not 0 <= top <= MAX_LOGPROBS):
        raise RequestError(f"top_logprobs = {shown(top)} must be an integer from 0 to {MAX_LOGPROBS}.", "top_logprobs")
    if top and not wanted:  # 0 asks for nothing (some SDKs send it by default); vLLM refuses only more
        raise RequestError("top_logprobs needs logprobs = true; send both, or neither.", "top_logprobs")
    return (top or 0) if wanted else None


def fit_to_context(params: SamplingParams, prompt_tokens: int, context: int | None, delivery: Delivery,
                   prompt_name: str) -> SamplingParams:
    """``params`` with max_tokens inside the room the prompt leaves in the context.

    A default max_tokens is lowered to the room; one the client chose that does not fit is a
    RequestError, with OpenAI's wording, that names the room.
    """
    room = context - prompt_tokens if context else None
    if room is None or params.max_tokens <= room:
        return params
    field = delivery.max_tokens_field
    if field is None:
        if params.min_tokens > room:  # the default lowered past the client's floor: min_tokens cannot be met
            raise RequestError(f"This model's maximum context length is {context} tokens. However, you requested "
                               f"at least {prompt_tokens + params.min_tokens} tokens ({prompt_tokens} in the "
                               f"{prompt_name}, min_tokens = {params.min_tokens} in the completion). Please reduce "
                               f"the length of the {prompt_name} or min_tokens: it can be at most {room} for "
                               f"{'these' if prompt_name.endswith('s') else 'this'} {prompt_name}.", "min_tokens")
        return replace(params, max_tokens=room)
    raise RequestError(f"This model's maximum context length is {context} tokens. However, you requested "
                       f"{prompt_tokens + params.max_tokens} tokens ({prompt_tokens} in the {prompt_name}, "
                       f"{params.max_tokens} in the completion). Please reduce the length of the {prompt_name} or "
                       f"completion: {field} can be at most {room} for "
                       f"{'these' if prompt_name.endswith('s') else 'this'} {prompt_name}.", field)


def _check_common(body: dict[str, Any], model_name: str) -> None:
    model = body.get("model")
    if model is not None and model != model_name:
        raise not_served(model, repr(model_name))
    n = body.get("n")
    if n is not None and (type(n) is not int or not 1 <= n <= MAX_N):
        raise RequestError(f"n = {shown(n)} must be an integer from 1 to {MAX_N}: the number of choices to "
                           "generate for the prompt.", "n")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise RequestError(f"stream = {shown(stream)} must be true or false.", "stream")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise RequestError(f"user = {shown(user)} must be a string (an end-user id).", "user")


def _delivery(body: dict[str, Any], max_tokens_field: str | None) -> Delivery:
    stream, options = body.get("stream") is True, body.get("stream_options")
    n = body.get("n") or 1
    scored = _prompt_logprobs(body.get("prompt_logprobs"), stream)
    truncate = body.get("truncate_prompt_tokens")
    if truncate is not None and (type(truncate) is not int or truncate == 0 or truncate < -1):
        raise RequestError(f"truncate_prompt_tokens = {shown(truncate)} must be an integer >= 1 (keep the prompt's last "
                           "that many tokens) or -1 (as many as leave room to generate); leave it out to keep the whole "
                           "prompt.", "truncate_prompt_tokens")
    if options is None:
        return Delivery(stream, n, False, max_tokens_field, truncate_prompt_tokens=truncate, prompt_logprobs=scored,
                        request_id=body.get("request_id"))
    if not stream:
        raise RequestError("stream_options is only allowed with stream = true; remove stream_options, or send "
                           "stream = true.", "stream_options")
    if not isinstance(options, dict):
        raise RequestError(f"stream_options = {shown(options)} must be an object such as "
                           '{"include_usage": true}.', "stream_options")
    for key in options:
        if key not in STREAM_OPTION_FIELDS:
            raise RequestError(f"unknown field {key!r} in stream_options.{suggest(key, STREAM_OPTION_FIELDS)} "
                               f"Fields: {', '.join(STREAM_OPTION_FIELDS)}.", f"stream_options.{key}",
                               "unknown_field")
    usage, continuous = (flag(options, key, False, f"stream_options.{key}")
                         for key in ("include_usage", "continuous_usage_stats"))
    # vLLM's rule: per-chunk usage only together with the usage chunk.
    return Delivery(stream, n, usage, max_tokens_field, usage and continuous, truncate, scored,
                    body.get("request_id"))


def _prompt_logprobs(value: Any, stream: bool) -> int | None:
    """vLLM's ``prompt_logprobs``: alternatives per prompt token, 0 to MAX_LOGPROBS; not with stream (vLLM's rule)."""
    if value is None:
        return None
    if type(value) is not int or not (0 <= value <= MAX_LOGPROBS or value == -1):
        raise RequestError(f"prompt_logprobs = {shown(value)} must be an integer from 0 to {MAX_LOGPROBS}: how many "
                           "most likely alternatives to return with each prompt token.", "prompt_logprobs")
    if value == -1:
        raise RequestError(f"prompt_logprobs = -1 (the whole vocabulary at every prompt token) is not served here; "
                           f"send at most {MAX_LOGPROBS}.", "prompt_logprobs")
    if stream:  # vLLM accepts 0 there and returns nothing: refused, not dropped
        raise RequestError("prompt_logprobs are not available when stream = true (as in vLLM); send stream = false, "
                           "or leave prompt_logprobs out.", "prompt_logprobs")
    return value


def _sampling(body: dict[str, Any], max_field: str, default_max: int, logprobs: int | None) -> SamplingParams:
    values = {k: body[k] for k in SAMPLING_FIELDS if body.get(k) is not None}
    if "logit_bias" in values:
        values["logit_bias"] = _bias_keys(values["logit_bias"])
    values.setdefault("max_tokens", default_max)
    values["logprobs"] = logprobs
    structured = output_constraint(body)
    if structured is not None:
        values["structured_outputs"] = structured
    try:
        return SamplingParams(**values)
    except SamplingError as exc:
        param = max_field if exc.field == "max_tokens" else exc.field
        # SamplingParams speaks Python (None, True, max_tokens=16); the client wrote JSON.
        allowed = exc.allowed
        for python, json_word in _JSON_WORDS:
            allowed = re.sub(python, json_word, allowed)
        fix = SAMPLING_FIXES[exc.field].format(param=param)
        raise RequestError(f"{param} = {shown(body.get(param, values.get(exc.field)))} {allowed}; {fix}.",
                           param) from None


def _bias_keys(bias: Any) -> Any:
    """logit_bias with JSON's string keys as token ids ("50256" -> 50256), as OpenAI's clients send it."""
    if not isinstance(bias, dict):
        return bias  # SamplingParams names the field and the shape it wants
    out = {}
    for key, value in bias.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit()):
            raise RequestError(f"logit_bias key {shown(key)} is not a token id; key each bias by a token id written "
                               'as a string, e.g. "logit_bias": {"50256": -100}.', "logit_bias")
        out[int(key)] = value
    return out


def _parse_prompts(value: Any) -> list[str | list[int]]:
    """The body's prompt: one (text or token ids), or a list of them, as OpenAI's completions take it."""
    if value is None:
        raise RequestError('prompt is missing: send a string or a list of token ids, e.g. "prompt": "Hello".',
                           "prompt")
    if isinstance(value, list) and value and all(isinstance(p, (str, list)) for p in value):
        if len(value) > MAX_PROMPTS:
            raise RequestError(f"prompt holds {len(value)} prompts; one request takes at most {MAX_PROMPTS}: split "
                               "them over several requests (they run batched).", "prompt")
        if len({type(p) for p in value}) > 1:  # OpenAI's and vLLM's schemas have no mixed list
            first = next(i for i, p in enumerate(value) if type(p) is not type(value[0]))
            raise RequestError(f"prompt mixes strings and token-id lists (prompt[0] is a JSON "
                               f"{json_type(value[0])}, prompt[{first}] a JSON {json_type(value[first])}); send a "
                               "list of strings or a list of token-id lists, or one request for each kind.", "prompt")
        return [_parse_prompt(p, f"prompt[{i}]") for i, p in enumerate(value)]
    return [_parse_prompt(value, "prompt")]


def _parse_prompt(value: Any, where: str) -> str | list[int]:
    if isinstance(value, str):
        if not value:
            raise RequestError(f"{where} is an empty string; send some text or a list of token ids.", "prompt")
        return value
    if isinstance(value, list):
        if not value:
            raise RequestError(f"{where} is an empty list; send at least one token id, or a string.", "prompt")
        for token in value:
            if type(token) is not int:
                raise RequestError(f"{where} holds {shown(token)}, which is not a token id; a token-id prompt is "
                                   "a list of ints.", "prompt")
        return value
    raise RequestError(f"{where} = {shown(value)} is a JSON {json_type(value)}; send a string, a list of token "
                       "ids, or a list of those (several prompts).", "prompt")
