"""The server's defaults for the sampling fields a request leaves out: vLLM's --override-generation-config.

specsure's requests decode greedily when they give no temperature (SamplingParams' default, 0),
where vLLM and OpenAI sample at 1.0 (vLLM: unless the model's generation_config says otherwise).
A server that must answer as vLLM does passes its defaults here, and a request's own value still
wins. Only fields whose meaning is the same everywhere are taken; anything else is refused at
start, so no default is silently dropped.
"""

from __future__ import annotations

from typing import Any, Final, Mapping, Sequence

from specsure.config.errors import suggest
from specsure.sampling import SamplingParams

FIELDS: Final[tuple[str, ...]] = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
"""vLLM's generation-config fields that become request defaults, but max_new_tokens (each endpoint
has its own default max_tokens)."""
FLAG: Final[str] = "--override-generation-config"


def check_generation_defaults(defaults: Mapping[str, Any] | None) -> dict[str, Any]:
    """``defaults`` checked as SamplingParams checks each field; ValueError naming the key and the flag."""
    if defaults is None:
        return {}
    if not isinstance(defaults, Mapping):
        raise ValueError(f"{FLAG} must be a JSON object such as {{\"temperature\": 1.0}}, not {defaults!r}.")
    for key in defaults:
        if key not in FIELDS:
            hint = " max_tokens is each request's own (16 on completions, 512 on chat)." \
                if key in ("max_new_tokens", "max_tokens") else suggest(str(key), FIELDS)
            raise ValueError(f"{FLAG}: {key!r} is not a default the server sets.{hint} It takes "
                             f"{', '.join(FIELDS)}.")
    try:
        SamplingParams(**dict(defaults))
    except ValueError as exc:
        raise ValueError(f"{FLAG}: {exc}") from None
    return dict(defaults)


def with_defaults(defaults: Mapping[str, Any], body: Any, fields: Sequence[str]) -> Any:
    """``body`` with each default the endpoint takes (``fields``) where the request leaves the field out or null."""
    if not defaults or not isinstance(body, dict):
        return body
    given = {k: v for k, v in body.items() if not (v is None and k in defaults)}
    return {**{k: v for k, v in defaults.items() if k in fields}, **given}
