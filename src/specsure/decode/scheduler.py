"""Continuous batching: up to max_num_seqs requests share every target forward.

Each step, every running request drafts on its own and contributes its pending token plus its
draft (a chain or a tree) to one batched target forward; requests admitted this step contribute
their prompts to the same forward (unless the batch has reached ``disable_by_batch_size``: then
no sequence drafts that step). Then each request verifies on its own and rolls its own caches
back to what it accepted. A request that ends leaves at once, and the next waiting one takes its
slot at the next step.

A slot is a target view (``CausalLM.fork``: the target's weights, a KV cache of its own) and a
proposer (``Proposer.fork``). Slots are made as concurrency first needs them and kept, so their
cache buffers serve request after request. Slot 0 is the engine's own target and proposer: at
batch size 1 nothing is forked and decoding runs exactly as it always has.

With prefix caching, a slot's cache outlives its request: the next request whose prompt starts
with what a slot holds prefills only the rest (``_take`` says which slot, and from where).

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from specsure.decode.completion import StepUpdate
from specsure.decode.request import NO_DRAFT, Request
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


@dataclass
class _Slot:
    lm: CausalLM
    proposer: Proposer | None
    used: int = 0
    """When a request last took it (the scheduler's count of admissions): prefix caching evicts the oldest."""
    prompt_len: int = 0
    """The prompt length of the request that last took it: a prompt that repeats all of it is a retry."""


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
        # A head's caches hold what the target's features made: they stay with their slot, never copied.
        self._copies = proposer is None or not proposer.reads_features
        self._lm, self._hidden, self._aux_layers = lm, hidden, aux_layers
        self._slots = [_Slot(lm, proposer)]
        self._free = [0]
        self._uses = 0
        self._slot_of: dict[int, int] = {}  # id(request) -> slot index
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
        context = self._slots[0].lm.max_context
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
                self._release(request)
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
            slot, cached, source = self._take(request)
            self._slot_of[id(request)] = slot
            self._slots[slot].prompt_len = len(request.prompt)
            request.attach(self._slots[slot].lm, self._slots[slot].proposer, cached, source, self.prefix_caching)
            joining.append(request)
        if not decoding and not joining and not self.prefilling:
            return []
        chunk = self.max_num_batched_tokens
        # A choice whose leader prefills the same prompt copies that prefill instead of repeating it. A
        # head's state is its own slot's: it copies only from the same cached start.
        siblings = [r for r in joining if r.prefill_from is not None and r.prefill_from in joining
                    and r.prefill_from.prefill_from is None
                    and (self._copies or r.cached_tokens == r.prefill_from.cached_tokens)]
        self.prefilling.extend(r for r in joining if r not in siblings)
        parts = self._parts(chunk)  # (request, end) of this step's prompt parts
        last = {id(r) for r, end in parts if end == len(r.prompt)}
        for request in siblings:  # a leader that joined this step and ends its prefill in it did it in one part
            if id(request.prefill_from) not in last:
                # Heads observe every part's features, and a scored prompt scores every row: both prefill their own.
                wait = self._copies and request.params.prompt_logprobs is None
                (self.sharing if wait else self.prefilling).append(request)
        copying = [r for r in siblings + self.sharing if id(r.prefill_from) in last]
        # A full batch is compute-bound: verifying drafts there costs more rows than their accepted
        # tokens save, so under disable_by_batch_size every sequence decodes one token this step. The
        # batch counts the sequences that get a token in it, as before prompts came in parts.
        limit = self.disable_by_batch_size
        speculate = limit is None or len(decoding) + len(last) + len(copying) < limit
        if not speculate and decoding and self._slots[0].proposer is not None:
            self.undrafted_steps += 1
        drafts = propose_all([r.draft_job() for r in decoding]) if speculate else [NO_DRAFT] * len(decoding)
        # A request whose drafter failed leaves the step with that error; the others verify as usual.
        drafted = [(r, d) for r, d in zip(decoding, drafts) if not isinstance(d, Exception)]
        calls = [r.draft_call(d, steer=speculate) for r, d in drafted] + [r.prefill_call(end) for r, end in parts]
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
                self._release(request)
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

    def _take(self, request: Request) -> tuple[int, int, CausalLM | None]:
        """A free slot for ``request``, how much of its prompt it starts with, and the view to copy that
        much from (None: the slot's own cache holds it).

        Without prefix caching: the first free slot, or a new one. With it: a free slot whose whole
        cache the prompt continues (a conversation's next turn), the longest; else an empty free slot,
        a new slot while there are fewer than max_num_seqs, or the free slot used least recently
        (taken or copied from), which starts with
        the longest start of the prompt any slot holds, running or free (a system prompt shared
        by conversations) copied over, so every other slot keeps its conversation (not for heads,
        whose own caches cannot be copied: theirs is the slot's own share, so a free slot whose
        last prompt this one repeats is taken first). The proposer may keep less than the slot
        holds (``Request.attach``).
        """
        self._uses += 1
        if not self.prefix_caching:
            slot = self._free.pop(0) if self._free else self._new_slot()
            return self._used(slot), 0, None
        # A prompt that is scored needs every row: it reuses nothing, and takes a slot as one that shares nothing.
        scored = request.params.prompt_logprobs is not None
        shared = {i: 0 if scored else _shared(slot.lm.cached_ids, request.prompt) for i, slot in enumerate(self._slots)}
        continued = [i for i in self._free if shared[i] and shared[i] >= len(self._slots[i].lm.cached_ids) - 1]
        if continued:
            slot = max(continued, key=lambda i: shared[i])
            self._free.remove(slot)
            return self._used(slot), shared[slot], None
        if not self._copies:
            # A head's caches cannot come from another slot, so a prompt's start is reused only where it
            # lies. A prompt that repeats the whole prompt a free slot last served (a regenerated answer,
            # or that prompt resent with more) takes that slot; one that shares less, say a system
            # prompt, may be another conversation's, whose slot it leaves alone.
            again = [i for i in self._free if shared[i] and shared[i] >= self._slots[i].prompt_len - 1]
            if again:
                slot = max(again, key=lambda i: shared[i])
                self._free.remove(slot)
                return self._used(slot), shared[slot], None
        empty = [i for i in self._free if not self._slots[i].lm.cached_ids]  # taking it loses nothing
        if empty:
            slot = empty[0]
            self._free.remove(slot)
        elif len(self._slots) < self.max_num_seqs or not self._free:
            slot = self._new_slot()
        else:
            slot = min(self._free, key=lambda i: self._slots[i].used)
            self._free.remove(slot)
        source = max(shared, key=lambda i: (shared[i], i == slot)) if self._copies else slot
        cached = shared.get(source, 0)  # a new slot holds nothing
        copied = None
        if source != slot and cached:
            copied = self._slots[source].lm
            self._used(source)  # a start that others copy (a system prompt) stays longer
        return self._used(slot), cached, copied

    def _new_slot(self) -> int:
        root = self._slots[0]
        self._slots.append(_Slot(root.lm.fork(), root.proposer.fork() if root.proposer is not None else None))
        return len(self._slots) - 1

    def _used(self, slot: int) -> int:
        self._slots[slot].used = self._uses
        return slot

    def _release(self, request: Request) -> None:
        # The caches stay as they are until the slot's next request resets them: the buffers are
        # reused, never freed, and nothing is copied on the way out.
        slot = self._slot_of.pop(id(request))
        if self._slots[slot].proposer is not None:
            self._slots[slot].proposer.retire()
        self._free.append(slot)
        self._free.sort()  # slot 0 first: a lone request always runs on the engine's own caches


def _shared(cached: Sequence[int], prompt: list[int]) -> int:
    """How many first tokens of ``prompt`` the cache holds, leaving at least its last to compute (its
    logits choose the first output token)."""
    n = 0
    for a, b in zip(cached, prompt[:-1]):
        if a != b:
            break
        n += 1
    return n


def _isolated(commit: Callable[..., StepUpdate], *args: Any, **kwargs: Any) -> StepUpdate:
    """One request's commit; an exception there fails that request alone, not the step's others."""
    try:
        return commit(*args, **kwargs)
    except Exception as exc:  # a bug; the caller raises it for this request
        logger.exception("a request failed while its step was verified; the step's other requests go on")
        return StepUpdate([], error=exc)
