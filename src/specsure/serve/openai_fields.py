"""OpenAI request fields that specsure takes without implementing them: neutral values and labels.

A client library sends some fields by default (``store: false``, ``service_tier: "auto"``), and
others label a request for OpenAI's own records (``metadata``, ``safety_identifier``,
``prompt_cache_key``). Each is accepted where it changes nothing here, so such clients keep working,
and refused where it would ask for something specsure does not do, so no setting is silently dropped.
"""

from __future__ import annotations

from typing import Any

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
}
COMPLETION_ONLY = frozenset({"echo", "best_of", "suffix"})
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
    for key in ("safety_identifier", "prompt_cache_key"):
        if body.get(key) is not None and not isinstance(body[key], str):
            raise RequestError(f"{key} = {shown(body[key])} must be a string.", key)
