"""The engine: propose -> verify in one target forward -> rejection-sample -> commit, roll back.

One loop serves every method: plain decoding is the same loop with no draft tokens, and the
proposer is whatever the Resolution names (no per-method branches here).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from typing import Iterator, Sequence

import torch
from transformers import PreTrainedTokenizerBase  # at run time too: get_type_hints reads the annotations

from specsure.config import ConfigError, Resolution, resolve
from specsure.config.dtype_choice import run_dtype
from specsure.decode.completion import (
    Completion, ParamsError, Prompt, PromptError, StepUpdate,
)
from specsure.decode.detokenize import TextDeltas
from specsure.decode.metrics import SpecStats
from specsure.decode.prompt_ids import as_batch, prompt_ids
from specsure.decode.request import Request, Rules
from specsure.decode.scheduler import DEFAULT_MAX_NUM_SEQS, Scheduler, check_batched_tokens
from specsure.decode.structured import Grammars
from specsure.models.errors import ModelLoadError
from specsure.models.loading import LoadedModel, load_model
from specsure.models.sampling_defaults import say_unapplied
from specsure.models.token_bytes import TokenizerKindError
from specsure.sampling import SEED_LIMIT, SamplingParams, generator_seed
from specsure.proposers.base import Proposer
from specsure.proposers.factory import build_proposer

logger = logging.getLogger(__name__)


class Engine:
    """Runs what the Resolution says. Build it with ``make_engine``.

    ``max_num_seqs`` bounds how many sequences its scheduler runs batched at once (vLLM's name);
    ``enable_prefix_caching`` lets a request reuse the start of its prompt that an earlier request
    left in a sequence slot's KV cache (vLLM's name; `specsure serve` turns it on);
    ``max_num_batched_tokens`` is the most prompt tokens a step prefills (chunked prefill; None, the
    default: a prompt at once; `specsure serve` prefills 256 a step).
    """

    def __init__(self, resolution: Resolution, target: LoadedModel, proposer: Proposer | None,
                 seed: int | None = None, max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
                 enable_prefix_caching: bool = False,
                 max_num_batched_tokens: int | None = None) -> None:
        config = resolution.config
        self.resolution = resolution
        self.target = target
        self.seed = seed
        # vLLM's LLM(seed=...): one stream for the whole engine, from which each request without a seed
        # of its own draws one; a run repeats, and unseeded requests still sample independently.
        self._seeds: torch.Generator | None = None if seed is None else torch.Generator().manual_seed(generator_seed(seed))
        self.stats = SpecStats()
        self.max_num_seqs = max_num_seqs
        self.enable_prefix_caching = enable_prefix_caching
        self.max_num_batched_tokens = max_num_batched_tokens
        self._k = config.num_speculative_tokens if config is not None else 0
        self._running: object | None = None
        self._lock = threading.RLock()
        """Held for a whole ``generate`` call, and for each step of a stream: the scheduler, its caches
        and the seed stream are one per engine, and two threads stepping them at once mixed their
        requests' outputs. A stream holds it only while it steps, so one left open (or resumed from
        another thread) never blocks the others: a generation that starts meanwhile ends it."""
        self._grammars = Grammars(target.tokenizer, target.lm.vocab_size)
        self.proposer = proposer

    @property
    def proposer(self) -> Proposer | None:
        """The proposer of the engine's own sequence slot (slot 0); concurrent sequences draft with its forks."""
        return self._proposer

    @proposer.setter
    def proposer(self, proposer: Proposer | None) -> None:
        """Swap in another proposer of the same method (its settings may differ); a new scheduler runs it."""
        running = proposer.method if proposer is not None else None
        config = self.resolution.config
        asked = config.method if config is not None else None
        if running != asked:
            # The promise of the product: the proposer that runs is the one the user resolved.
            raise RuntimeError(f"engine refuses the proposer: the resolution names method {asked!r} but the "
                               f"proposer is {running!r}. This is a specsure bug; please report it.")
        self._proposer = proposer
        hidden = bool(proposer is not None and proposer.needs_hidden)
        aux_layers = tuple(proposer.aux_layers) if proposer is not None else ()
        self.scheduler = Scheduler(self.target.lm, proposer, hidden=hidden, aux_layers=aux_layers,
                                   max_num_seqs=self.max_num_seqs,
                                   disable_by_batch_size=config.disable_by_batch_size if config is not None else None,
                                   prefix_caching=self.enable_prefix_caching,
                                   max_num_batched_tokens=self.max_num_batched_tokens)
        """The one scheduler of this engine: ``generate`` runs on it, and so does the server."""

    @property
    def speculative_method(self) -> str | None:
        """The method of the proposer actually running (None when speculation is off)."""
        return self.proposer.method if self.proposer is not None else None

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase | None:
        """The target's tokenizer; None when its folder has no tokenizer files."""
        return self.target.tokenizer

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 params: SamplingParams | Sequence[SamplingParams] | None = None) -> list[Completion]:
        """Generate for one prompt or a list, in order; up to ``max_num_seqs`` of them run batched.

        ``params`` is one SamplingParams for every prompt, or a list of one per prompt (each its own
        seed, for example, since one seed shared by equal prompts samples them alike).
        """
        batch = as_batch(prompts)
        if isinstance(params, Sequence):
            if len(params) != len(batch):
                raise ValueError(f"params: {len(params)} SamplingParams for {len(batch)} prompts; give one for "
                                 "every prompt, or a single SamplingParams for all.")
            each = [self._checked(p) for p in params]
        else:
            each = [self._checked(params)] * len(batch)
        with self._lock:
            requests = [self.request(self._encode(p, i), q) for i, (p, q) in enumerate(zip(batch, each))]
            for _ in self._run(requests):
                pass
        completions = [r.completion for r in requests]
        assert all(c is not None for c in completions), "the scheduler went idle with a request unfinished"
        return completions  # type: ignore[return-value]

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

    def encode(self, prompt: Prompt, keep_last: int | None = None) -> list[int]:
        """The token ids ``generate`` would run for ``prompt``; PromptError when it cannot run.
        ``keep_last``: only the prompt's last this many tokens (vLLM's truncate_prompt_tokens)."""
        return self._encode(prompt, 0, keep_last)

    def _checked(self, params: SamplingParams | None) -> SamplingParams:
        params = params if params is not None else SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}.")
        self.check_params(params)
        return params

    def check_params(self, params: SamplingParams) -> None:
        """Raise ParamsError for valid params that this model cannot honour (stop strings need a tokenizer;
        logit_bias, allowed_token_ids and stop_token_ids need ids in its vocabulary)."""
        vocab = self.target.lm.vocab_size
        allowed = params.allowed_token_ids
        if allowed and params.min_tokens and set(allowed) <= set(self._rules().stop_ids(params)):
            raise ParamsError("allowed_token_ids", list(allowed), f"holds only stop tokens, which min_tokens "
                                                                 f"({params.min_tokens}) forbids before then: no token "
                                                                 "could be generated; allow other tokens or set "
                                                                 "min_tokens 0.")
        for field, ids in (("logit_bias", [t for t, _ in params.logit_bias or ()]),
                           ("allowed_token_ids", params.allowed_token_ids or ()),
                           ("stop_token_ids", params.stop_token_ids or ())):  # one outside would never stop it
            outside = sorted({t for t in ids if t >= vocab})
            if outside:
                value = dict(params.logit_bias or ()) if field == "logit_bias" else list(ids)
                raise ParamsError(field, value, f"names token id(s) {outside[:8]} outside the model's vocabulary "
                                                f"[0, {vocab}); give ids its tokenizer makes.")
        if params.structured_outputs is not None:
            self._check_structured(params)
        if params.stop and self.tokenizer is None:
            raise ParamsError("stop", list(params.stop), f"needs a tokenizer to match text, but the model at "
                                                          f"{self.target.path} has none; omit stop (generation still "
                                                          "ends at max_tokens or EOS), or add the tokenizer to the "
                                                          "model folder.")

    def _check_structured(self, params: SamplingParams) -> None:
        spec = params.structured_outputs
        assert spec is not None
        shown = {spec.field: getattr(spec, spec.field)}
        try:
            self._grammars.table()
        except TokenizerKindError as e:
            raise ParamsError("structured_outputs", shown, f"cannot run: {e}.") from None
        if not self._rules().stop_ids(params):
            raise ParamsError("structured_outputs", shown, "needs a token that ends the output once its text is "
                                                          "complete, but ignore_eos is set and stop_token_ids is "
                                                          "empty; drop ignore_eos, or give stop_token_ids.")

    def _encode(self, prompt: Prompt, index: int, keep_last: int | None = None) -> list[int]:
        return prompt_ids(prompt, index, self.tokenizer, self.target, keep_last)

    def _generator(self, params: SamplingParams) -> torch.Generator | None:
        if params.greedy:
            return None
        seed = params.seed
        if seed is None and self._seeds is not None:
            seed = int(torch.randint(0, 2**63 - 1, (), generator=self._seeds))
        gen = torch.Generator()
        if seed is None:
            gen.seed()
        else:
            gen.manual_seed(generator_seed(seed))
        return gen

    def request(self, prompt_ids: list[int], params: SamplingParams) -> Request:
        """A Request for checked prompt ids and params, ready for ``scheduler.add``."""
        return Request(prompt_ids, params, self._generator(params), self._rules(), self._k)

    def _rules(self) -> Rules:
        """When a request's output ends, for this target (its EOS ids, tokenizer and context)."""
        return Rules(self.target.eos_token_ids, self.target.tokenizer, self.target.lm.max_context, self._grammars)

    def finished(self, request: Request) -> None:
        """Count a completed request's work in ``engine.stats`` (the scheduler's users call it)."""
        assert request.completion is not None
        self.stats.merge(request.stats)

    def _run(self, requests: list[Request]) -> Iterator[list[tuple[Request, StepUpdate]]]:
        """Run ``requests`` through the scheduler to the end, one step's updates at a time.

        Closing the iterator aborts what has not finished; its work is not counted.
        """
        scheduler = self.scheduler
        with self._lock:
            run = self._running = object()  # the caches are this run's until another one starts
            # an earlier stream's requests, which now fail at their next step
            for stale in [*scheduler.waiting, *scheduler.prefilling, *scheduler.sharing, *scheduler.running]:
                scheduler.abort(stale)
            for request in requests:
                scheduler.add(request)
        try:
            while True:
                with self._lock:  # one step at a time, whichever thread runs it; yielded outside the lock
                    if self._running is not run:
                        raise RuntimeError("another generation started on this engine while this stream was open; "
                                           "the engine runs one generation at a time (pass several prompts to one "
                                           "generate call to batch them). Finish or close a stream before "
                                           "starting the next generation.")
                    if scheduler.idle:
                        return
                    updates = scheduler.step()
                    for request, update in updates:
                        if update.error is not None:
                            raise update.error
                        if update.completion is not None:
                            self.finished(request)
                yield updates
        finally:
            with self._lock:
                for request in requests:
                    scheduler.abort(request)

    def _steps(self, prompt: list[int], params: SamplingParams) -> Iterator[StepUpdate]:
        """One prompt's updates, step by step; ``generate_stream`` hands them out."""
        with self._lock:
            request = self.request(prompt, params)
        tokenizer = self.tokenizer
        deltas = TextDeltas(tokenizer, params.stop, params.skip_special_tokens) if tokenizer is not None else None
        for updates in self._run([request]):
            for _, update in updates:
                if deltas is not None:  # the text each step adds, as the server streams it
                    final = update.completion
                    text = deltas.finish(final.text or "") if final is not None else deltas.push(update.token_ids)
                    update = dataclasses.replace(update, text=text)
                yield update


def make_engine(model: str | os.PathLike[str] | None = None, speculative: dict | None = None, *, strict: bool = False,
                dtype: str = "auto", seed: int | None = None, max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
                enable_prefix_caching: bool = False, max_num_batched_tokens: int | None = None,
                int8_activations: bool = False, max_model_len: int | None = None) -> Engine:
    """Resolve the config, check it can run, load the target, build the named proposer.

    ``seed`` seeds the engine as vLLM's ``LLM(seed=...)`` does: each request without a seed of its own
    draws one from the engine's stream, so the same run repeats and its requests sample independently.
    ``int8_activations``: the target's products as llama.cpp's (`load_model`). ``max_model_len``: the
    most positions a request may hold, prompt and output (vLLM's; at most the model's own context, which
    is the default; -1 or None: that).
    """
    _check_engine_args(strict, dtype, seed, max_num_seqs)  # before the model loads, not after
    if isinstance(model, os.PathLike):
        model = os.fspath(model)
    if not isinstance(enable_prefix_caching, bool):
        raise ValueError(f"enable_prefix_caching = {enable_prefix_caching!r} must be True or False.")
    if not isinstance(int8_activations, bool):
        raise ValueError(f"int8_activations = {int8_activations!r} must be True or False.")
    check_batched_tokens(max_num_batched_tokens)  # before the model loads too
    if max_model_len == -1 and not isinstance(max_model_len, bool):  # vLLM's 'auto': the model's own
        max_model_len = None
    if max_model_len is not None and (isinstance(max_model_len, bool) or not isinstance(max_model_len, int)
                                      or max_model_len < 1):
        raise ValueError(f"max_model_len = {max_model_len!r} must be a whole number of tokens >= 1; leave it out "
                         "(or give -1) for the model's own context.")
    res = resolve(speculative, model=model, strict=strict, dtype=dtype)
    res.check_runnable()
    try:
        target = load_model(model, dtype=dtype, int8_activations=int8_activations, release_weights=True)
    except ModelLoadError as exc:  # named as the draft's errors are: the two may share a folder name
        raise ModelLoadError(f"target (the model): {exc}") from None
    if max_model_len is not None:
        target.lm.limit_context(max_model_len)
    loaded = str(target.lm.dtype).removeprefix("torch.")
    logger.info("dtype %s: %s", loaded, target.dtype_reason)
    say_unapplied(target.path)
    if dtype == "auto" and loaded != run_dtype(res.target, "auto")[0]:
        # The config layer expected the float32 kernel, which then failed to build: the defaults that
        # follow the dtype (a shipped head's tree) are resolved again for the one that loaded.
        res = resolve(speculative, model=model, strict=strict, dtype=loaded)
    proposer = build_proposer(res, target, dtype)
    engine = Engine(res, target, proposer, seed=seed, max_num_seqs=max_num_seqs,
                    enable_prefix_caching=enable_prefix_caching, max_num_batched_tokens=max_num_batched_tokens)
    logger.info("effective speculative config: %s; running proposer: %s", res.summary(), engine.speculative_method)
    return engine


def _check_engine_args(strict: object, dtype: object, seed: object, max_num_seqs: object) -> None:
    if not isinstance(strict, bool):
        raise ValueError(f"strict = {strict!r} must be True or False.")
    if not isinstance(dtype, str):
        raise ValueError(f"dtype = {dtype!r} must be a string: auto, float32, bfloat16 or float16.")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < SEED_LIMIT):
        raise ValueError(f"seed = {seed!r} must be None or an int in [0, 2**64), as SamplingParams.seed.")
    if isinstance(max_num_seqs, bool) or not isinstance(max_num_seqs, int) or max_num_seqs < 1:
        raise ValueError(f"max_num_seqs = {max_num_seqs!r} must be an int >= 1.")


__all__ = ["Completion", "ConfigError", "Engine", "ParamsError", "PromptError", "StepUpdate", "make_engine"]
