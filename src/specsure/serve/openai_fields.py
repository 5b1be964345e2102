"""OpenAI's and vLLM's request fields that specsure takes without implementing them: neutral values
and labels.

A client library sends some fields by default (``store: false``, ``service_tier: "auto"``), and
others label a request for OpenAI's own records (``metadata``, ``safety_identifier``,
``prompt_cache_key``). Each is accepted where it changes nothing here, so such clients keep working,
and refused where it would ask for something specsure does not do, so no setting is silently dropped.
"""

from __future__ import annotations

from typing import Any

from specsure.config.errors import json_type, suggest
from specsure.serve.errors import RequestError, shown

# Accepted only as null or at the value that changes nothing.
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "best_of": (1,),
    "suffix": (),
    "store": (False,),
    "service_tier": ("auto", "default"),
    "modalities": (["text"],),
    "audio": (),
    "prediction": (),
    "web_search_options": (),
    "functions": (),
    "function_call": (),
    "reasoning_effort": (),
    "verbosity": (),
    # vLLM's own fields, at the value that asks for what specsure does anyway
    "use_beam_search": (False,),
    "length_penalty": (1,),
    "spaces_between_special_tokens": (True,),
    "priority": (0,),
    "return_tokens_as_token_ids": (False,),
    "return_token_ids": (False,),
    "return_token_offsets": (False,),
    "return_weight_versions": (False,),
    "bad_words": ([],),
    "vllm_xargs": ({},),
    "echo": (False,),  # on chat: vLLM's echo of the last message (completions implement OpenAI's)
}
VLLM_FIELDS = frozenset({"use_beam_search", "length_penalty", "spaces_between_special_tokens", "priority",
                         "return_tokens_as_token_ids", "return_token_ids", "add_special_tokens",
                         "return_token_offsets", "return_weight_versions", "bad_words", "vllm_xargs", "echo"})
"""Fields of vLLM's requests (in NEUTRAL, or ADD_SPECIAL_TOKENS), not OpenAI's."""
ADD_SPECIAL_TOKENS: dict[str, bool] = {"POST /v1/completions": True, "POST /v1/chat/completions": False}
"""vLLM's add_special_tokens at its default per endpoint, which is what specsure does: a text prompt is
encoded with the tokenizer's special tokens (BOS), a chat template's rendering as it is."""
INSTEAD: dict[str, tuple[str, str]] = {
    "max_completion_tokens": ("max_tokens", "max_tokens"),
    "guided_json": ("structured_outputs", 'structured_outputs: {"json": SCHEMA}'),
    "guided_regex": ("structured_outputs", 'structured_outputs: {"regex": "..."}'),
    "guided_choice": ("structured_outputs", 'structured_outputs: {"choice": [...]}'),
    "guided_grammar": ("structured_outputs", 'structured_outputs: {"grammar": "..."}'),
    "guided_decoding_backend": ("structured_outputs", "structured_outputs alone (specsure has one backend)"),
    "guided_whitespace_pattern": ("structured_outputs", "structured_outputs alone"),
}
"""Fields another endpoint or an older vLLM spells so: (the field here that does their job, how to use it)."""
COMPLETION_ONLY = frozenset({"best_of", "suffix"})
"""OpenAI fields of the legacy completions endpoint; the chat endpoint has none of them."""
CHAT_ONLY = frozenset({"store", "service_tier", "modalities", "audio", "prediction", "web_search_options", "functions",
                       "function_call", "reasoning_effort", "verbosity"})
"""OpenAI fields of the chat endpoint (in NEUTRAL); the completions endpoint has none of them."""
MAX_METADATA = 16
"""OpenAI's limits on ``metadata``: 16 pairs, keys of at most 64 characters, values of at most 512."""


def check_labels(body: dict[str, Any]) -> None:
    """``metadata``, ``safety_identifier`` and ``prompt_cache_key`` in the shapes OpenAI takes."""
    metadata = body.get("metadata")
    if metadata is not None and not (isinstance(metadata, dict) and len(metadata) <= MAX_METADATA and all(
            isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512 for k, v in metadata.items())):
        raise RequestError(f"metadata = {shown(metadata)} must be an object of at most {MAX_METADATA} string values "
                           "(keys up to 64 characters, values up to 512).", "metadata")
    for key in ("safety_identifier", "prompt_cache_key", "request_id"):
        if body.get(key) is not None and not isinstance(body[key], str):
            raise RequestError(f"{key} = {shown(body[key])} must be a string.", key)


ENDPOINT_OF = {"prompt": "POST /v1/completions", "messages": "POST /v1/chat/completions"}
"""The endpoint whose request has each field, for a field sent to the other."""


def check_fields(body: Any, allowed: tuple[str, ...], endpoint: str) -> dict[str, Any]:
    """``body`` when it is an object whose every field ``endpoint`` takes (``allowed``), or that this
    module takes at its neutral value; else a 400 naming the field and what to send instead."""
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object with the fields of {endpoint}, got "
                           f"{json_type(body)} {shown(body)}.")
    for key, value in body.items():
        if key in allowed:
            continue
        if key == "add_special_tokens" and endpoint in ADD_SPECIAL_TOKENS:
            default = ADD_SPECIAL_TOKENS[endpoint]
            if value is None or value is default:
                continue
            yourself = ("send the prompt as token ids to choose its special tokens yourself" if default else
                        "write the special tokens the template leaves out into the messages, or send the rendered "
                        "prompt's token ids to POST /v1/completions")
            raise RequestError(f"add_special_tokens = {shown(value)} is a vLLM field that specsure takes only at "
                               f"vLLM's default on {endpoint}, {shown(default)}; {yourself}, or remove the field.",
                               key, "unsupported_field")
        if key in NEUTRAL and not (key in COMPLETION_ONLY and endpoint == ENDPOINT_OF["messages"]) and not (
                key in CHAT_ONLY and endpoint == ENDPOINT_OF["prompt"]):
            neutral = NEUTRAL[key]
            # bool is an int in Python, but true is not a best_of of 1.
            if value is None or any(value == n and isinstance(value, bool) == isinstance(n, bool) for n in neutral):
                continue
            accepted = " or ".join(["null", *(shown(n) for n in neutral)])
            owner = "a vLLM" if key in VLLM_FIELDS else "an OpenAI"
            raise RequestError(f"{key} = {shown(value)} is {owner} field that specsure does not implement; remove "
                               f"the field (only {accepted} is accepted).", key, "unsupported_field")
        elsewhere = (ENDPOINT_OF["prompt"] if key in COMPLETION_ONLY else ENDPOINT_OF["messages"] if key in CHAT_ONLY
                     else ENDPOINT_OF.get(key, endpoint))
        if key in INSTEAD and INSTEAD[key][0] in allowed:
            hint = f" Use {INSTEAD[key][1]} instead."
        elif elsewhere != endpoint:
            hint = f" specsure takes {key!r} on {elsewhere} only."
        else:
            hint = suggest(key, allowed)
        raise RequestError(f"unknown field {key!r} in the body of {endpoint}.{hint} Fields: {', '.join(allowed)}.",
                           key, "unknown_field")
    return body
