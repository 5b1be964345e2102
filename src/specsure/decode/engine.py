"""The engine: propose -> verify in one target forward -> rejection-sample -> commit, roll back.

One loop serves every method: plain decoding is the same loop with no draft tokens, and the
proposer is whatever the Resolution names (no per-method branches here).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Iterator, Sequence

import torch

from specsure.config import ConfigError, Resolution, resolve
from specsure.decode.completion import (
    Completion, FinishReason, ParamsError, Prompt, PromptError, StepUpdate,
)
from specsure.decode.metrics import SpecStats
from specsure.decode.rejection import verify_greedy, verify_sampled
from specsure.decode.tree import depth, verify_tree
from specsure.sampling import SamplingParams, draw, probs_from_logits
from specsure.models.causal_lm import ForwardOutput
from specsure.models.loading import LoadedModel, load_model
from specsure.models.token_tree import TokenTree
from specsure.proposers.base import Draft, Proposer
from specsure.proposers.factory import build_proposer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

NO_DRAFT = Draft([])


class Engine:
    """Runs what the Resolution says. Build it with ``make_engine``."""

    def __init__(self, resolution: Resolution, target: LoadedModel, proposer: Proposer | None,
                 seed: int | None = None) -> None:
        config = resolution.config
        running = proposer.method if proposer is not None else None
        asked = config.method if config is not None else None
        if running != asked:
            # The promise of the product: the proposer that runs is the one the user resolved.
            raise RuntimeError(f"engine refuses to start: the resolution names method {asked!r} but the "
                               f"proposer built is {running!r}. This is a specsure bug; please report it.")
        self.resolution = resolution
        self.target = target
        self.proposer = proposer
        self.seed = seed
        self.stats = SpecStats()
        self._k = config.num_speculative_tokens if config is not None else 0
        self._hidden = bool(proposer is not None and proposer.needs_hidden)
        self._aux_layers = tuple(proposer.aux_layers) if proposer is not None else ()
        self._running: object | None = None

    @property
    def speculative_method(self) -> str | None:
        """The method of the proposer actually running (None when speculation is off)."""
        return self.proposer.method if self.proposer is not None else None

    @property
    def tokenizer(self) -> "PreTrainedTokenizerBase | None":
        """The target's tokenizer; None when its folder has no tokenizer files."""
        return self.target.tokenizer

    def generate(self, prompts: Prompt | Sequence[Prompt], params: SamplingParams | None = None) -> list[Completion]:
        """Generate for one prompt or a list; each runs at batch size 1, in order."""
        params = self._checked(params)
        batch = [self._encode(p, i) for i, p in enumerate(_as_batch(prompts))]
        return [_last(self._steps(ids, params)).completion for ids in batch]

    def generate_stream(self, prompt: Prompt, params: SamplingParams | None = None) -> Iterator[StepUpdate]:
        """Generate for one prompt, yielding what each engine step commits, as it is verified.

        The prompt and params are checked at the call (PromptError, ParamsError), before the first
        step. The first update holds the token from the prompt's forward; each later one the
        tokens one verification step accepted (1 to k + 1). The last update has ``finish_reason``
        and ``completion``, exactly what ``generate`` returns for this prompt. Closing the iterator
        (``.close()``, or dropping it) stops generation after the current step; the work of a
        closed stream is not added to ``engine.stats``.
        """
        params = self._checked(params)
        return self._steps(self._encode(prompt, 0), params)

    def encode(self, prompt: Prompt) -> list[int]:
        """The token ids ``generate`` would run for ``prompt``; PromptError when it cannot run."""
        return self._encode(prompt, 0)

    def _checked(self, params: SamplingParams | None) -> SamplingParams:
        params = params if params is not None else SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}.")
        self.check_params(params)
        return params

    def check_params(self, params: SamplingParams) -> None:
        """Raise ParamsError for valid params that this model cannot honour (stop strings need a tokenizer)."""
        if params.stop and self.tokenizer is None:
            raise ParamsError("stop", f"SamplingParams.stop = {list(params.stop)!r} needs a tokenizer to match text, "
                                      f"but the model at {self.target.path} has none; omit stop (generation still "
                                      "ends at max_tokens or EOS), or add the tokenizer to the model folder.")

    def _encode(self, prompt: Prompt, index: int) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise PromptError(index, "is an empty string; give some text or token ids.")
            if self.tokenizer is None:
                raise PromptError(index, f"is text, but the model at {self.target.path} has no tokenizer files; "
                                         "pass token ids instead, or add the tokenizer to the model folder.")
            ids = list(self.tokenizer(prompt, add_special_tokens=True)["input_ids"])
        else:
            ids = list(prompt)
        if not ids:
            raise PromptError(index, "is empty; give at least one token.")
        vocab = self.target.lm.vocab_size
        for tok in ids:
            if isinstance(tok, bool) or not isinstance(tok, int) or not 0 <= tok < vocab:
                raise PromptError(index, f"holds token id {tok!r}, outside the vocabulary [0, {vocab}).")
        limit = self.target.lm.max_context
        if limit and len(ids) >= limit:
            raise PromptError(index, f"has {len(ids)} tokens, but the model's context is {limit} tokens and "
                                     "generation needs room for at least one more; shorten the prompt.")
        return ids

    def _generator(self, params: SamplingParams) -> torch.Generator | None:
        if params.greedy:
            return None
        seed = params.seed if params.seed is not None else self.seed
        gen = torch.Generator()
        if seed is None:
            gen.seed()
        else:
            gen.manual_seed(seed)
        return gen

    def _pick(self, logits: torch.Tensor, params: SamplingParams, gen: torch.Generator | None) -> int:
        """The next token from one row of target logits: argmax, or a sample from p."""
        return draw(logits, params, gen)[0]

    def _steps(self, prompt: list[int], params: SamplingParams) -> Iterator[StepUpdate]:
        """The decode loop, one update per step; ``generate`` drains it, ``generate_stream`` hands it out."""
        started = time.perf_counter()
        run = self._running = object()  # the caches below are this run's until another one starts
        lm, proposer, stats = self.target.lm, self.proposer, SpecStats()
        gen = self._generator(params)
        lm.reset()
        if proposer is not None:
            proposer.reset()
        out = lm.forward(prompt, hidden=self._hidden, aux_layers=self._aux_layers, last_logits=1)
        if proposer is not None:
            proposer.observe(prompt, 0, out)
        output = [self._pick(out.logits[-1], params, gen)]
        streamed = 0  # output tokens already handed out; the tokens of a step that ends nothing are final
        finish = self._finished(output, 1, params, lm.cache_len)
        while finish is None:
            yield StepUpdate(output[streamed:])
            if self._running is not run:
                raise RuntimeError("another generation started on this engine while this stream was open; the "
                                   "engine runs one generation at a time (batch size 1). Finish or close a "
                                   "stream before starting the next generation.")
            streamed = len(output)
            pending = output[-1]
            # Room for the draft: the verify forward must fit the context. Tokens past max_tokens
            # are cut after verification, which leaves the kept ones distributed as before.
            room = min(self._k, params.max_tokens - len(output),
                       (lm.max_context or 1 << 30) - lm.cache_len - 2)
            draft = proposer.propose(prompt + output, room, params, gen) if proposer and room > 0 else NO_DRAFT
            start = lm.cache_len
            fed = [pending, *draft.token_ids]
            if draft.parents is not None and draft.token_ids:
                kept, new = self._verify_tree(fed, [-1, *draft.parents], params, gen, stats)
            else:
                out = lm.forward(fed, hidden=self._hidden, aux_layers=self._aux_layers)  # logits [1 + k, vocab]
                if not draft.token_ids:
                    accepted, new = 0, [self._pick(out.logits[0], params, gen)]
                else:
                    verdict = (verify_greedy(out.logits, draft.token_ids) if params.greedy else
                               verify_sampled(probs_from_logits(out.logits, params), draft.token_ids, draft.probs,
                                              gen))
                    accepted, new = verdict.accepted, verdict.output_ids
                    stats.observe(len(draft.token_ids), accepted)
                    lm.crop(start + 1 + accepted)  # rejected positions leave the target cache
                kept = (fed[: 1 + accepted], out.rows(1 + accepted))
            if proposer is not None:
                proposer.observe(kept[0], start, kept[1])
            before = len(output)
            output.extend(new)
            finish = self._finished(output, before, params, lm.cache_len)
        text, output, finish = self._detokenize(output, params, finish)
        assert len(output) > streamed, "trimming at EOS, max_tokens or a stop string only cuts the last step"
        stats.add_generated(len(output))
        stats.add_time(time.perf_counter() - started)
        self.stats.merge(stats)
        completion = Completion(text=text, token_ids=output, finish_reason=finish, stats=stats,
                                prompt_token_ids=prompt)
        yield StepUpdate(output[streamed:], finish, completion)

    def _verify_tree(self, fed: list[int], parents: list[int], params: SamplingParams, gen: torch.Generator | None,
                     stats: SpecStats) -> tuple[tuple[list[int], ForwardOutput], list[int]]:
        """Verify a token tree in one forward and keep its accepted path: ((kept tokens, their rows), output)."""
        lm = self.target.lm
        start = lm.cache_len
        # The nodes are in parent-first order, so any prefix of them is a tree: cut to the context.
        fit = max(1, (lm.max_context or 1 << 30) - start - 1)
        fed, parents = fed[:fit], parents[:fit]
        out = lm.forward(fed, hidden=self._hidden, aux_layers=self._aux_layers,
                         tree=TokenTree.from_parents(parents))  # logits [nodes, vocab]
        verdict = (verify_tree(None, out.logits, fed, parents, None) if params.greedy else
                   verify_tree(probs_from_logits(out.logits, params), None, fed, parents, gen))
        stats.observe(depth(parents), verdict.accepted)
        lm.keep(start, verdict.path)  # the accepted path moves into place; other branches leave the cache
        return ([fed[i] for i in verdict.path], out.pick(verdict.path)), verdict.output_ids

    def _finished(self, output: list[int], checked: int, params: SamplingParams, cache_len: int) -> FinishReason | None:
        """Trim ``output`` in place at EOS or max_tokens; return why generation ends, if it does."""
        if not params.ignore_eos:
            for i in range(max(0, checked - 1), len(output)):
                if output[i] in self.target.eos_token_ids:
                    del output[i + 1:]
                    return "stop"
        if len(output) >= params.max_tokens:
            del output[params.max_tokens:]
            return "length"
        if params.stop and self.tokenizer is not None and self._stop_at(output, params.stop) is not None:
            return "stop"
        limit = self.target.lm.max_context
        if limit and cache_len + 1 >= limit:
            return "length"
        return None

    def _stop_at(self, output: list[int], stops: Sequence[str]) -> int | None:
        text = self.tokenizer.decode(output, skip_special_tokens=True)
        hits = [text.find(s) for s in stops if s in text]
        return min(hits) if hits else None

    def _detokenize(self, output: list[int], params: SamplingParams,
                    finish: FinishReason) -> tuple[str | None, list[int], FinishReason]:
        if self.tokenizer is None:
            return None, output, finish
        text = self.tokenizer.decode(output, skip_special_tokens=True)
        if params.stop:
            cut = self._stop_at(output, params.stop)
            if cut is not None:
                # Keep the tokens up to the one that completed the stop string; the text ends before it.
                while len(output) > 1 and self._stop_at(output[:-1], params.stop) is not None:
                    output = output[:-1]
                return text[:cut], output, "stop"
        return text, output, finish


def _last(steps: Iterator[StepUpdate]) -> StepUpdate:
    for update in steps:
        if update.completion is not None:
            return update
    raise AssertionError("the decode loop ended without a completion")


def _as_batch(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, Sequence) and prompts and all(isinstance(t, int) and not isinstance(t, bool)
                                                         for t in prompts):
        return [prompts]
    if isinstance(prompts, Sequence) and not isinstance(prompts, (bytes, bytearray)):
        if not prompts:
            raise ValueError("prompts is empty; give a string, a list of token ids, or a list of either.")
        return list(prompts)
    raise ValueError(f"prompts must be a string, a list of token ids, or a list of either; got "
                     f"{type(prompts).__name__}.")


def make_engine(model: str | None = None, speculative: dict | None = None, *, strict: bool = False,
                dtype: str = "auto", seed: int | None = None) -> Engine:
    """Resolve the config, check it can run, load the target, build the named proposer."""
    res = resolve(speculative, model=model, strict=strict)
    res.check_runnable()
    target = load_model(model, dtype=dtype)
    logger.info("dtype %s: %s", str(target.lm.dtype).removeprefix("torch."), target.dtype_reason)
    proposer = build_proposer(res, target, dtype)
    engine = Engine(res, target, proposer, seed=seed)
    logger.info("effective speculative config: %s; running proposer: %s", res.summary(), engine.speculative_method)
    return engine


__all__ = ["Completion", "ConfigError", "Engine", "ParamsError", "PromptError", "StepUpdate", "make_engine"]
