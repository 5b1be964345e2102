"""Continuous batching: up to max_num_seqs requests share every target forward.

Each step, every running request drafts on its own and contributes its pending token plus its
draft (a chain or a tree) to one batched target forward; requests admitted this step contribute
their prompts to the same forward (unless the batch has reached ``disable_by_batch_size``: then
no sequence drafts that step). Then each request verifies on its own and rolls its own caches
back to what it accepted. A request that ends leaves at once, and the next waiting one takes its
slot at the next step.

Each admitted request holds a slot (``specsure.decode.slots``: a target view with its own KV cache,
and a proposer) until it ends; with prefix caching the slot's cache outlives it.

Chunked prefill (``max_num_batched_tokens``; `specsure serve` turns it on): a prompt is prefilled
in parts that end at multiples of that many tokens, at most that many prompt tokens a step, so the
running requests go on decoding between the parts of a long prompt instead of waiting for all of
it. A request between its parts is ``prefilling``: it holds its slot and has no update until its
last part. Another choice of the same request (``Request.prefill_from``) copies its leader's
prefill: in the step they join, if the leader's prompt fits one part; else it waits, ``sharing``,
for the leader's last part (not for heads, which observe every part's features themselves, nor
for scored prompts, whose every row is scored).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from specsure.decode.completion import StepUpdate
from specsure.decode.request import NO_DRAFT, Request
from specsure.decode.slots import Slots
from specsure.grammar.pattern import PatternError
from specsure.models.causal_lm import CausalLM
from specsure.proposers.base import Proposer, propose_all

logger = logging.getLogger(__name__)

DEFAULT_MAX_NUM_SEQS = 8
"""vLLM's name; 8 concurrent sequences is where a verify forward here still costs about 3x a single one."""
DEFAULT_MAX_NUM_BATCHED_TOKENS = 256
"""`specsure serve`'s chunk: the most prompt tokens one step prefills. On 2 cores the default model
prefills about 700 tokens a second, so a running request waits well under a second a step for a
long prompt (6 s for 3,000 tokens at once); parts of 256 rows cost no more than one pass over the
whole prompt. The engine's own default is None, a prompt at once, as before chunking existed."""


def check_batched_tokens(value: object) -> None:
    """max_num_batched_tokens: an int >= 1, or None (every prompt prefilled in one step)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"max_num_batched_tokens = {value!r} must be an int >= 1, or None (every prompt prefilled "
                         "in one step).")


class Scheduler:
    """Admits requests first come, first served, and runs the admitted ones one batched step at a time.

    Not thread-safe: one thread adds, aborts and steps.
    """

    def __init__(self, lm: CausalLM, proposer: Proposer | None, *, hidden: bool, aux_layers: tuple[int, ...],
                 max_num_seqs: int = DEFAULT_MAX_NUM_SEQS, disable_by_batch_size: int | None = None,
                 prefix_caching: bool = False,
                 max_num_batched_tokens: int | None = None) -> None:
        if isinstance(max_num_seqs, bool) or not isinstance(max_num_seqs, int) or max_num_seqs < 1:
            raise ValueError(f"max_num_seqs = {max_num_seqs!r} must be an int >= 1.")
        check_batched_tokens(max_num_batched_tokens)
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        """The most prompt tokens a step prefills (chunked prefill); None: every prompt at once."""
        self.disable_by_batch_size = disable_by_batch_size
        """A step that batches at least this many sequences drafts nothing (vLLM's key); None: never."""
        if disable_by_batch_size is not None and disable_by_batch_size > max_num_seqs:
            logger.warning("disable_by_batch_size = %d is above max_num_seqs = %d: no batch is ever that large, so "
                           "every step drafts", disable_by_batch_size, max_num_seqs)
        self.undrafted_steps = 0
        """Steps that had sequences to draft for and drafted nothing because of disable_by_batch_size."""
        self.prefix_caching = prefix_caching
        """A request takes the free slot whose cache holds the longest start of its prompt, and
        computes only the rest (vLLM's automatic prefix caching, per slot)."""
        self._lm, self._hidden, self._aux_layers = lm, hidden, aux_layers
        self.slots = Slots(lm, proposer, max_num_seqs, prefix_caching)
        self.waiting: deque[Request] = deque()
        self.prefilling: list[Request] = []
        """Requests with a slot whose prompt's last part is still to come, first come first."""
        self.sharing: list[Request] = []
        """Choices with a slot that wait for their leader's last part, whose prefill they copy."""
        self.running: list[Request] = []

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.prefilling and not self.sharing and not self.running

    @property
    def active(self) -> int:
        """Requests holding a slot: running, between the parts of their prompt, or sharing one."""
        return len(self.running) + len(self.prefilling) + len(self.sharing)

    @property
    def kv_cache_usage(self) -> float:
        """The share of the KV cache the requests holding a slot fill: their cached tokens over
        max_num_seqs full contexts (vLLM's kv_cache_usage_perc counts blocks the same way); 0 when
        the model states no context length."""
        context = self._lm.max_context
        if not context:
            return 0.0
        held = sum(r.lm.cache_len for r in (*self.running, *self.prefilling, *self.sharing) if r.lm is not None)
        return min(1.0, held / (self.max_num_seqs * context))

    def add(self, request: Request) -> None:
        """Queue ``request``; it is prefilled at the first step with a free slot."""
        self.waiting.append(request)

    def abort(self, request: Request) -> None:
        """Drop ``request`` now, wherever it is; its slot (and KV cache) serves the next one."""
        if request in self.waiting:
            self.waiting.remove(request)
            return
        for group in (self.running, self.prefilling, self.sharing):
            if request in group:
                group.remove(request)
                self.slots.release(request)
                break
        self._orphan(request)

    def _orphan(self, leader: Request) -> None:
        """The choices waiting on ``leader``'s prefill, which will not come, prefill their own."""
        for request in [r for r in self.sharing if r.prefill_from is leader]:
            self.sharing.remove(request)
            self.prefilling.append(request)

    def step(self) -> list[tuple[Request, StepUpdate]]:
        """One batched target forward: every running request verifies a draft, new ones prefill.

        Returns each request's update for this step, in order; a request whose update has a
        ``completion`` has left the scheduler.
        """
        decoding = list(self.running)
        joining: list[Request] = []
        while self.waiting and self.active + len(joining) < self.max_num_seqs:
            request = self.waiting.popleft()
            taken = self.slots.take(request)
            request.attach(taken.lm, taken.proposer, taken.cached, taken.source, self.prefix_caching)
            joining.append(request)
        if not decoding and not joining and not self.prefilling:
            return []
        chunk = self.max_num_batched_tokens
        # A choice whose leader prefills the same prompt copies that prefill instead of repeating it. A
        # head's state is its own slot's: it copies only from the same cached start.
        siblings = [r for r in joining if r.prefill_from is not None and r.prefill_from in joining
                    and r.prefill_from.prefill_from is None
                    and (self.slots.copies or r.cached_tokens == r.prefill_from.cached_tokens)]
        self.prefilling.extend(r for r in joining if r not in siblings)
        parts = self._parts(chunk)  # (request, end) of this step's prompt parts
        last = {id(r) for r, end in parts if end == len(r.prompt)}
        for request in siblings:  # a leader that joined this step and ends its prefill in it did it in one part
            if id(request.prefill_from) not in last:
                # Heads observe every part's features, and a scored prompt scores every row: both prefill their own.
                wait = self.slots.copies and request.params.prompt_logprobs is None
                (self.sharing if wait else self.prefilling).append(request)
        copying = [r for r in siblings + self.sharing if id(r.prefill_from) in last]
        # A full batch is compute-bound: verifying drafts there costs more rows than their accepted
        # tokens save, so under disable_by_batch_size every sequence decodes one token this step. The
        # batch counts the sequences that get a token in it, as before prompts came in parts.
        limit = self.disable_by_batch_size
        speculate = limit is None or len(decoding) + len(last) + len(copying) < limit
        if not speculate and decoding and self.slots.proposer(0) is not None:
            self.undrafted_steps += 1
        drafts = propose_all([r.draft_job() for r in decoding]) if speculate else [NO_DRAFT] * len(decoding)
        # A request whose drafter failed leaves the step with that error; the others verify as usual.
        calls = []
        for i, (request, draft) in enumerate(zip(decoding, drafts)):
            if isinstance(draft, Exception):
                continue
            try:  # a constraint steers the draft, and may fail its request there
                calls.append(request.draft_call(draft, steer=speculate))
            except PatternError as exc:
                logger.warning("a request's constraint failed it: %s", exc)
                drafts[i] = exc
        drafted = [(r, d) for r, d in zip(decoding, drafts) if not isinstance(d, Exception)]
        calls += [r.prefill_call(end) for r, end in parts]
        outs = self._lm.forward_batch(calls, hidden=self._hidden, aux_layers=self._aux_layers) if calls else []
        committed = {id(r): _isolated(r.commit, out) for (r, _), out in zip(drafted, outs)}
        updates = [(r, StepUpdate([], error=d) if isinstance(d, Exception) else committed[id(r)])
                   for r, d in zip(decoding, drafts)]
        prefills: dict[int, Any] = {}
        for (request, end), out in zip(parts, outs[len(drafted):]):
            if end < len(request.prompt):  # its next part comes in a later step; it keeps its place
                try:
                    request.commit_chunk(out, end)
                except Exception as exc:  # a bug; it fails this request alone, as _isolated does
                    logger.exception("a request failed while a part of its prompt was committed")
                    self.prefilling.remove(request)
                    updates.append((request, StepUpdate([], error=exc)))
                    self._orphan(request)
                continue
            self.prefilling.remove(request)
            prefills[id(request)] = out
            updates.append((request, _isolated(request.commit_prefill, out)))
            self.running.append(request)
        for request in copying:
            if request in self.sharing:
                self.sharing.remove(request)
            leader = request.prefill_from
            updates.append((request, _isolated(request.commit_prefill, prefills[id(leader)], shared_from=leader)))
            self.running.append(request)
        for request, update in updates:
            if update.completion is not None or update.error is not None:
                if request in self.running:
                    self.running.remove(request)
                self.slots.release(request)
        return updates

    def _parts(self, chunk: int | None) -> list[tuple[Request, int]]:
        """This step's prompt parts, (request, where its part ends): first come first, while their
        tokens fit ``chunk`` (the first always goes, so every prompt moves on)."""
        parts: list[tuple[Request, int]] = []
        budget = chunk
        for request in self.prefilling:
            end = request.prefill_end(chunk)
            size = end - request.prefilled
            if budget is not None and parts and size > budget:
                break
            parts.append((request, end))
            if budget is not None:
                budget -= size
        return parts


def _isolated(commit: Callable[..., StepUpdate], *args: Any, **kwargs: Any) -> StepUpdate:
    """One request's commit; an exception there fails that request alone, not the step's others."""
    try:
        return commit(*args, **kwargs)
    except Exception as exc:  # a bug, or a constraint past its bounds; the caller raises it for this request
        if isinstance(exc, PatternError):
            logger.warning("a request's constraint failed it: %s", exc)
        else:
            logger.exception("a request failed while its step was verified; the step's other requests go on")
        return StepUpdate([], error=exc)
