"""The server's defaults for the sampling fields a request leaves out: vLLM's --override-generation-config.

specsure's requests decode greedily when they give no temperature (SamplingParams' default, 0),
where vLLM and OpenAI sample at 1.0 (vLLM: unless the model's generation_config says otherwise).
A server that must answer as vLLM does passes its defaults here, and a request's own value still
wins. Only fields whose meaning is the same everywhere are taken; anything else is refused at
start, so no default is silently dropped. ``max_new_tokens`` is vLLM's one exception to "the
request wins": it is the max_tokens of a chat or Responses request that gives none, and a limit on
every request's max_tokens, a completion's default 16 included (vLLM 0.33.0's get_max_tokens).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Final, Mapping, Sequence

from specsure.config.errors import suggest
from specsure.sampling import SamplingParams
from specsure.serve.errors import RequestError

SAMPLING: Final[tuple[str, ...]] = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                                    "presence_penalty", "frequency_penalty", "skip_special_tokens")
"""vLLM's generation-config fields that become the defaults of the request fields of the same name."""
LIMIT: Final[str] = "max_new_tokens"
FIELDS: Final[tuple[str, ...]] = (*SAMPLING, LIMIT)
"""Every key the flag takes: vLLM 0.33.0's ModelConfig.get_diff_sampling_param list."""
FLAG: Final[str] = "--override-generation-config"


def check_generation_defaults(defaults: Mapping[str, Any] | None, source: str = FLAG) -> dict[str, Any]:
    """``defaults`` checked as SamplingParams checks each field; ValueError naming the key and ``source``
    (the flag, or the generation_config.json they came from)."""
    if defaults is None:
        return {}
    if not isinstance(defaults, Mapping):
        raise ValueError(f"{source} must be a JSON object such as {{\"temperature\": 1.0}}, not {defaults!r}.")
    for key in defaults:
        if key not in FIELDS:
            hint = f" vLLM's name for it is {LIMIT!r}." if key == "max_tokens" else suggest(str(key), FIELDS)
            raise ValueError(f"{source}: {key!r} is not a default the server sets.{hint} It takes "
                             f"{', '.join(FIELDS)}.")
    limit = defaults.get(LIMIT)
    if limit is not None and (type(limit) is not int or limit < 1):
        raise ValueError(f"{source}: {LIMIT} = {limit!r} must be an integer >= 1: the most tokens a request may "
                         "generate, and a chat request's max_tokens when it gives none.")
    try:
        SamplingParams(**{k: v for k, v in defaults.items() if k != LIMIT})
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None
    return dict(defaults)


def with_defaults(defaults: Mapping[str, Any], body: Any, fields: Sequence[str]) -> Any:
    """``body`` with each default the endpoint takes (``fields``) where the request leaves the field out or null."""
    if not defaults or not isinstance(body, dict):
        return body
    given = {k: v for k, v in body.items() if not (v is None and k in defaults and k in SAMPLING)}
    # skip_special_tokens true is every request's default already; sent for it, it would read as
    # the request's own and refuse a tool parser whose tags are special tokens.
    taken = {k: v for k, v in defaults.items() if k in fields and k in SAMPLING
             and not (k == "skip_special_tokens" and v is True)}
    return {**taken, **given}


def within_limit(defaults: Mapping[str, Any], params: SamplingParams, chose: bool, has_default: bool,
                 limit: int | None) -> SamplingParams:
    """``params`` as vLLM 0.33.0 applies max_new_tokens: ``defaults``' is the max_tokens of a request
    that did not choose one where the endpoint has no default of its own (``has_default`` False:
    chat, Responses), and ``limit`` (the override flag's, or a --generation-config folder's; not the
    model's own under 'auto') the most any request gets. A RequestError when the request's
    min_tokens no longer fits."""
    fallback = defaults.get(LIMIT)
    wanted = params.max_tokens if chose or has_default or fallback is None else fallback
    if limit is None:
        return params if wanted == params.max_tokens else replace(params, max_tokens=wanted)
    if params.min_tokens > min(wanted, limit):
        raise RequestError(f"min_tokens = {params.min_tokens} is more than this server's limit of {limit} new "
                           f"tokens ({LIMIT} of its generation config); send at most {limit}.", "min_tokens")
    return replace(params, max_tokens=min(wanted, limit))
