"""The scheduler's slots: which one a request takes, and how much of its prompt that slot holds.

A slot is a target view (``CausalLM.fork``: the target's weights, a KV cache of its own) and a
proposer (``Proposer.fork``). Slots are made as concurrency first needs them and kept, so their
cache buffers serve request after request. Slot 0 is the engine's own target and proposer: at
batch size 1 nothing is forked and decoding runs exactly as it always has.

With prefix caching, a slot's cache outlives its request: the next request whose prompt starts
with what a slot holds prefills only the rest (``Slots.take`` says which slot, and from where).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specsure.decode.request import Request
from specsure.models.causal_lm import CausalLM
from specsure.proposers.base import Proposer


@dataclass
class _Slot:
    lm: CausalLM
    proposer: Proposer | None
    used: int = 0
    """When a request last took it (the count of admissions): prefix caching evicts the oldest."""
    prompt_len: int = 0
    """The prompt length of the request that last took it: a prompt that repeats all of it is a retry."""


@dataclass(frozen=True)
class Taken:
    """A slot a request took: its target view and proposer, how many of the prompt's first tokens it
    starts with, and the view to copy them from (None: the slot's own cache holds them)."""

    lm: CausalLM
    proposer: Proposer | None
    cached: int
    source: CausalLM | None


class Slots:
    """The slots of one scheduler, made as needed up to ``max_num_seqs``, and which request holds which."""

    def __init__(self, lm: CausalLM, proposer: Proposer | None, max_num_seqs: int, prefix_caching: bool) -> None:
        self.max_num_seqs, self.prefix_caching = max_num_seqs, prefix_caching
        # A head's caches hold what the target's features made: they stay with their slot, never copied.
        self.copies = proposer is None or not proposer.reads_features
        self._slots = [_Slot(lm, proposer)]
        self._free = [0]
        self._uses = 0
        self._slot_of: dict[int, int] = {}  # id(request) -> slot index

    @property
    def count(self) -> int:
        """Slots made so far."""
        return len(self._slots)

    def proposer(self, slot: int) -> Proposer | None:
        """Slot ``slot``'s proposer (slot 0's is the engine's own)."""
        return self._slots[slot].proposer

    def take(self, request: Request) -> Taken:
        """A free slot for ``request``, held until ``release``.

        Without prefix caching: the first free slot, or a new one. With it: a free slot whose whole
        cache the prompt continues (a conversation's next turn), the longest; else an empty free slot,
        a new slot while there are fewer than max_num_seqs, or the free slot used least recently
        (taken or copied from), which starts with the longest start of the prompt any slot holds,
        running or free (a system prompt shared by conversations) copied over, so every other slot
        keeps its conversation (not for heads, whose own caches cannot be copied: theirs is the
        slot's own share, so a free slot whose last prompt this one repeats is taken first). The
        proposer may keep less than the slot holds (``Request.attach``).
        """
        slot, cached, source = self._choose(request)
        self._slot_of[id(request)] = slot
        self._slots[slot].prompt_len = len(request.prompt)
        return Taken(self._slots[slot].lm, self._slots[slot].proposer, cached, source)

    def release(self, request: Request) -> None:
        """``request``'s slot is free again; its caches stay as they are until its next request resets
        them (the buffers are reused, never freed, and nothing is copied on the way out)."""
        slot = self._slot_of.pop(id(request))
        if self._slots[slot].proposer is not None:
            self._slots[slot].proposer.retire()
        self._free.append(slot)
        self._free.sort()  # slot 0 first: a lone request always runs on the engine's own caches

    def _choose(self, request: Request) -> tuple[int, int, CausalLM | None]:
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
        if not self.copies:
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
        source = max(shared, key=lambda i: (shared[i], i == slot)) if self.copies else slot
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


def _shared(cached: Sequence[int], prompt: list[int]) -> int:
    """How many first tokens of ``prompt`` the cache holds, leaving at least its last to compute (its
    logits choose the first output token)."""
    n = 0
    for a, b in zip(cached, prompt[:-1]):
        if a != b:
            break
        n += 1
    return n
