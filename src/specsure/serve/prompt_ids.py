"""A request's prompt as the engine takes it: its token ids (truncated as vLLM's truncate_prompt_tokens
asks), the text an echo shows, and the params of each of its choices."""

from __future__ import annotations

from dataclasses import replace

from specsure.config.errors import as_json
from specsure.decode.completion import PromptTooLong
from specsure.decode.engine import Engine, ParamsError, PromptError
from specsure.sampling import SamplingParams
from specsure.serve.errors import RequestError


def choice_params(params: SamplingParams, n: int) -> list[SamplingParams]:
    """One SamplingParams per choice: a seeded request's choice i samples with seed + i, so choices differ."""
    if params.seed is None or n == 1:
        return [params] * n
    return [replace(params, seed=(params.seed + i) % 2**64) for i in range(n)]


def check_params(engine: Engine, params: SamplingParams) -> None:
    """The engine's own check of params it cannot honour (a token id past its vocabulary), as a 400."""
    try:
        engine.check_params(params)
    except ParamsError as exc:
        raise RequestError(f"{exc.field} = {as_json(exc.value)} {exc.reason}", exc.field) from None


def prompt_text(engine: Engine, given: str | list[int], ids: list[int]) -> str | None:
    """An echoed prompt's text: as the request wrote it, or its token ids decoded (None without a tokenizer)."""
    if isinstance(given, str):
        return given
    return None if engine.tokenizer is None else engine.tokenizer.decode(ids)


def encode_prompt(engine: Engine, prompt: str | list[int], subject: str, param: str, keep: int | None = None) -> list[int]:
    """The prompt's ids; ``keep``: vLLM's truncate_prompt_tokens (-1: as many as leave room to generate)."""
    context = engine.target.lm.max_context
    if keep == -1:
        keep = context - 1 if context else None
    elif keep is not None and context and keep >= context:
        raise RequestError(f"truncate_prompt_tokens = {keep} keeps no room to generate in "
                           f"{engine.target.lm.context_name} of "
                           f"{context} tokens; send at most {context - 1}, or -1 for as many as leave room.",
                           "truncate_prompt_tokens")
    try:
        return engine.encode(prompt, keep)
    except PromptTooLong as exc:  # vLLM's and OpenAI's sentence first: clients detect an overflow by it
        raise RequestError(f"This model's maximum context length is {exc.limit} tokens. However, your request has "
                           f"{exc.tokens} input tokens. Please reduce the length of the input messages. ({subject} "
                           f"{exc.detail})", param) from None
    except PromptError as exc:
        raise RequestError(f"{subject} {exc.detail}", param) from None
