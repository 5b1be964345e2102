"""What the engine hands back: a prompt's Completion, each streamed step's update, and its user errors."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Sequence, Union

from specsure.decode.metrics import SpecStats

Prompt = Union[str, Sequence[int]]
FinishReason = Literal["stop", "length"]


class PromptError(ValueError):
    """A prompt the engine cannot run. ``detail`` is the message without the prompt's index."""

    def __init__(self, index: int, detail: str) -> None:
        self.index = index
        self.detail = detail
        super().__init__(f"prompt {index} {detail}")


class PromptTooLong(PromptError):
    """A prompt of ``tokens`` tokens that leaves no room to generate in a context of ``limit`` tokens."""

    def __init__(self, index: int, detail: str, tokens: int, limit: int) -> None:
        super().__init__(index, detail)
        self.tokens, self.limit = tokens, limit


class ParamsError(ValueError):
    """SamplingParams that are valid but that this engine's model cannot honour; ``field`` names the param.

    The message is ``SamplingParams.<field> = <value as Python writes it> <reason>``; a server names the
    field and value as its request wrote them, in front of the same ``reason``.
    """

    def __init__(self, field: str, value: object, reason: str) -> None:
        self.field, self.value, self.reason = field, value, reason
        super().__init__(f"SamplingParams.{field} = {value!r} {reason}")


@dataclass(frozen=True)
class TokenLogprob:
    """One output token's log-probability under the target, and the most likely alternatives there."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()
    """(token id, log-probability) of the ``SamplingParams.logprobs`` most likely tokens, best first."""
    rank: int | None = None
    """1 + how many tokens are more likely than this one there (vLLM's rank); None where not measured."""


@dataclass(frozen=True)
class Completion:
    """One prompt's result."""

    text: str | None
    """Decoded output (special tokens skipped); None when the model has no tokenizer."""
    token_ids: list[int]
    """Output token ids, including a final EOS token when generation ended on one."""
    finish_reason: FinishReason
    """'stop' for EOS or a stop string, 'length' for max_tokens or the context limit."""
    stats: SpecStats
    stop_reason: int | str | None = None
    """vLLM's stop_reason: the stop string or the stop token id (of ``SamplingParams.stop_token_ids``)
    that ended the output; None when EOS ended it or it ran to its length."""
    prompt_token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    """One per output token when ``SamplingParams.logprobs`` asked for them; else None."""
    prompt_logprobs: list[TokenLogprob | None] | None = None
    """One per prompt token when ``SamplingParams.prompt_logprobs`` asked for them, the first None
    (nothing precedes it), as vLLM gives them; else None."""
    cached_tokens: int = 0
    """The prompt's first tokens that were not computed again: an earlier request left their KV cache
    (prefix caching; OpenAI's ``cached_tokens``)."""


@dataclass(frozen=True)
class StepUpdate:
    """What one engine step committed, as ``Engine.generate_stream`` hands it out."""

    token_ids: list[int]
    """The output tokens this step added: the prompt forward's one token, then 1 to k + 1 per
    verification. On the last update, the ones kept after trimming at EOS, max_tokens or a stop
    string; so the updates' token ids, joined, are ``completion.token_ids``."""
    finish_reason: FinishReason | None = None
    """None while generating; on the last update, why generation ended."""
    completion: Completion | None = None
    """On the last update only: the whole result, as ``Engine.generate`` returns it."""
    logprobs: list[TokenLogprob] | None = None
    """One per token of ``token_ids`` when ``SamplingParams.logprobs`` asked for them; else None."""
    prompt_logprobs: list[TokenLogprob | None] | None = None
    """On the prompt's update (the first) only, ``Completion.prompt_logprobs``."""
    error: Exception | None = None
    """Set when verifying this request alone failed in the step (a bug: its input was checked before):
    it has left the scheduler, and the other requests of the step went on."""
    text: str | None = None
    """From ``Engine.generate_stream``: the text this step adds, final (a character still arriving in
    bytes, or what may be the start of a stop string, waits for the update that completes it); the
    updates' texts, joined, are ``completion.text``. None without a tokenizer."""
