"""A byte DFA built lazily from a pattern's NFA, and the vocabulary's tokens each of its states allows.

States are built as decoding reaches them (the subset construction, one row of 256 bytes at a
time), so a large schema costs only the states its outputs visit. The tokens a state allows are
found for the whole vocabulary at once: every token's bytes are walked through the DFA column by
column with numpy, and the answer is kept per state, so a state seen again costs a lookup.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Sequence

import numpy as np

from specsure.grammar.pattern import NFA, PatternError

DEAD = -1
MAX_DFA_STATES = 100_000
MAX_DFA_MEMBERS = 2_000_000
"""The most NFA states all DFA states may hold together: a state's work and memory grow with its set,
and a pattern of few, huge sets took seconds a token and a gigabyte under the state count alone."""
MASKS_KEPT = 2048
"""Allowed-token masks kept per automaton, packed 8 tokens a byte (6 KB for 49,152 tokens)."""


class AutomatonTooLarge(PatternError):
    """A constraint's automaton passed its bounds while a request generated under it: the request
    fails (a client's constraint, not a server fault), and the constraint is refused from then on."""


class ByteDFA:
    """The deterministic automaton of an NFA over bytes; state ids are ints, ``DEAD`` is the empty set."""

    def __init__(self, nfa: NFA, on_full: Callable[[str], None] = lambda why: None) -> None:
        """``on_full``: told why, once, when the automaton passes its bounds."""
        self.nfa = nfa
        self._on_full = on_full
        self._sets: list[frozenset[int]] = []
        self._ids: dict[frozenset[int], int] = {}
        self.table = np.full((16, 256), DEAD, dtype=np.int32)
        """[state, byte] -> the next state; a row is valid once ``_built[state]``."""
        self._built: list[bool] = []
        self.accepting: list[bool] = []
        self.full = False
        """Set when a state past MAX_DFA_STATES was refused: the automaton serves no new request."""
        self._live: dict[int, np.ndarray] = {}
        self._members = 0
        self.start = self._intern(self._closure([nfa.start]))

    def _closure(self, states: Sequence[int]) -> frozenset[int]:
        seen, todo = set(states), list(states)
        while todo:
            for nxt in self.nfa.eps[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return frozenset(seen)

    def _intern(self, states: frozenset[int]) -> int:
        if not states:
            return DEAD
        sid = self._ids.get(states)
        if sid is None:
            sid = len(self._sets)
            if sid >= MAX_DFA_STATES:
                self._blown(f"the constraint's automaton passed {MAX_DFA_STATES:,} states; simplify it")
            self._members += len(states)
            if self._members > MAX_DFA_MEMBERS:
                self._blown(f"the constraint's automaton grew too large ({MAX_DFA_MEMBERS:,} pattern states across "
                            "its states: its alternatives overlap at every step); simplify it")
            self._sets.append(states)
            self._ids[states] = sid
            self._built.append(False)
            self.accepting.append(self.nfa.final in states)
            if sid >= len(self.table):
                self.table = np.concatenate([self.table, np.full_like(self.table, DEAD)])
        return sid

    def _blown(self, why: str) -> None:
        if not self.full:
            self.full = True
            self._on_full(why)
        raise AutomatonTooLarge(why)

    def build(self, sid: int) -> None:
        """Fill state ``sid``'s row of the table."""
        if self._built[sid]:
            return
        targets: dict[int, set[int]] = {}
        for s in self._sets[sid]:
            for lo, hi, to in self.nfa.edges[s]:
                for b in range(lo, hi + 1):
                    targets.setdefault(b, set()).add(to)
        by_set: dict[frozenset[int], int] = {}
        row = np.full(256, DEAD, dtype=np.int32)
        for b, tos in targets.items():
            key = frozenset(tos)
            if key not in by_set:
                by_set[key] = self._intern(self._closure(list(key)))
            row[b] = by_set[key]
        self.table[sid] = row
        self._built[sid] = True

    def walk(self, sid: int, data: bytes) -> int:
        """The state after reading ``data`` from ``sid`` (DEAD once any byte is refused)."""
        for b in data:
            if sid == DEAD:
                return DEAD
            self.build(sid)
            sid = int(self.table[sid, b])
        return sid

    def can_continue(self, sid: int) -> bool:
        """Whether any byte leads on from ``sid``."""
        self.build(sid)
        return bool((self.table[sid] != DEAD).any())

    def live(self, sid: int) -> np.ndarray:
        """The bytes that lead on from ``sid``, ascending."""
        found = self._live.get(sid)
        if found is None:
            self.build(sid)
            found = self._live[sid] = np.flatnonzero(self.table[sid] != DEAD)
        return found


class TokenTable:
    """The vocabulary as bytes, laid out for walking every token through a DFA at once."""

    def __init__(self, token_bytes: Sequence[bytes | None]) -> None:
        self.size = len(token_bytes)
        content = [i for i, b in enumerate(token_bytes) if b]
        lengths = np.array([len(token_bytes[i]) for i in content], dtype=np.int64)
        order = np.argsort(-lengths, kind="stable")  # longest first: each column's tokens are a prefix
        self.ids = np.array(content, dtype=np.int64)[order]
        self.lengths = lengths[order]
        width = int(self.lengths.max()) if len(content) else 0
        self.data = np.zeros((len(content), width), dtype=np.uint8)  # [tokens, bytes]
        for row, i in enumerate(self.ids.tolist()):
            raw = token_bytes[i]
            assert raw is not None
            self.data[row, :len(raw)] = np.frombuffer(raw, dtype=np.uint8)
        self.bytes = list(token_bytes)
        """Each token's bytes; None for special tokens, which no constraint's text holds."""
        self._by_bytes: dict[bytes, int] | None = None

    def longest(self, data: bytes) -> list[int]:
        """``data`` cut greedily into the longest tokens of the vocabulary (stops where none fits)."""
        if self._by_bytes is None:
            self._by_bytes = {}
            for i, raw in enumerate(self.bytes):
                if raw:
                    self._by_bytes.setdefault(raw, i)
        out, at, width = [], 0, self.data.shape[1]
        while at < len(data):
            token = next((self._by_bytes[data[at:at + n]] for n in range(min(width, len(data) - at), 0, -1)
                          if data[at:at + n] in self._by_bytes), None)
            if token is None:
                break
            out.append(token)
            at += len(self.bytes[token] or b"")
        return out


class TokenAutomaton:
    """One constraint's DFA over one vocabulary: the tokens each state allows, and where a token leads."""

    def __init__(self, dfa: ByteDFA, tokens: TokenTable) -> None:
        self.dfa, self.tokens = dfa, tokens
        self._masks: OrderedDict[int, np.ndarray] = OrderedDict()
        self._next: dict[tuple[int, int], int] = {}

    def allowed(self, sid: int) -> np.ndarray:
        """[vocab] bool: the tokens whose whole bytes ``sid`` can read (special tokens never)."""
        packed = self._masks.get(sid)
        if packed is not None:
            self._masks.move_to_end(sid)
            return np.unpackbits(packed, count=self.tokens.size).astype(bool)
        tokens, dfa = self.tokens, self.dfa
        mask = np.zeros(tokens.size, dtype=bool)
        count = len(tokens.ids)  # the tokens still walking are rows [0, count) minus the dead ones
        rows = np.arange(count)
        states = np.full(count, sid, dtype=np.int32)
        for j in range(tokens.data.shape[1]):
            ended = tokens.lengths[rows] == j
            mask[tokens.ids[rows[ended]]] = True
            rows, states = rows[~ended], states[~ended]
            if not rows.size:
                break
            for s in np.unique(states).tolist():
                dfa.build(s)
            states = dfa.table[states, tokens.data[rows, j]]
            alive = states != DEAD
            rows, states = rows[alive], states[alive]
        else:
            mask[tokens.ids[rows]] = True
        self._masks[sid] = np.packbits(mask)
        if len(self._masks) > MASKS_KEPT:
            self._masks.popitem(last=False)
        return mask

    def advance(self, sid: int, token: int) -> int:
        """The state after ``token`` (DEAD for a special token or one the state refuses)."""
        key = (sid, token)
        nxt = self._next.get(key)
        if nxt is None:
            raw = self.tokens.bytes[token] if 0 <= token < self.tokens.size else None
            nxt = self.dfa.walk(sid, raw) if raw and sid != DEAD else DEAD
            self._next[key] = nxt
        return nxt
