"""Structured outputs in the engine: each verify row's tokens limited to those that keep the output
a prefix of a text the request's constraint accepts.

The mask is part of the target's distribution, as logit_bias is: row i of a verify forward
follows the output plus the first i draft tokens, so its mask is the constraint's state after
them. A draft token the constraint refuses has probability 0 under that distribution and is
rejected like any other, so greedy output equals plain decoding with the same constraint, and
sampling keeps the constrained distribution. Drafts themselves are not constrained: a proposer
that drafts outside the grammar only loses acceptance.

Where the constraint leaves no choice (a JSON Schema's keys and punctuation, a tool call's name),
it drafts itself, and at a state with a few choices (JSON's whitespace) it drafts the one the
output made there last: ``Constraint.steer`` puts that text, written as the tokenizer writes it,
in place of a draft that does not begin with it. That draft depends only on the output so far,
never on the target's draws, so the rejection sampler keeps it lossless like any other; the
target may write other bytes or the same bytes as other tokens, and then the draft is rejected.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
import torch

from specsure.grammar import StructuredOutputs
from specsure.grammar.automaton import DEAD, ByteDFA, TokenAutomaton, TokenTable
from specsure.grammar.spec import compiled, refuse_from_now
from specsure.models.token_bytes import TokenizerKindError, token_bytes
from specsure.proposers.base import Draft

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

AUTOMATA_KEPT = 16
"""Constraints whose automata an engine keeps: requests with the same schema share one."""
HABIT_BRANCHES = 8
"""A place with at most this many bytes leading on (JSON's whitespace before a key, true or false)
is drafted as the output went on from the same place last time; one with more (a string's
characters, a number's digits) ends the draft. 1 drafts forced text alone."""
FORESEEN_BYTES = 256
"""The most bytes drafted ahead: far more than a draft's tokens write."""
SPELLINGS_KEPT = 4096


class Grammars:
    """One engine's automata for structured outputs over its target's vocabulary, built on first use."""

    def __init__(self, tokenizer: "PreTrainedTokenizerBase | None", vocab_size: int) -> None:
        self.tokenizer, self.vocab_size = tokenizer, vocab_size
        self._table: TokenTable | None = None
        self._automata: OrderedDict[StructuredOutputs, TokenAutomaton] = OrderedDict()
        self._spellings: OrderedDict[bytes, list[int]] = OrderedDict()

    def spell(self, data: bytes) -> list[int]:
        """Tokens for ``data`` (its whole characters), as a drafted text: the tokenizer's own, where
        they write exactly those bytes, else the longest vocabulary token at each point (a
        SentencePiece tokenizer's encode adds a leading space, which the text lacks)."""
        found = self._spellings.get(data)
        if found is None:
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as exc:  # the foreseen bytes stop inside a character
                text = data[:exc.start].decode("utf-8")
            found = list(self.tokenizer.encode(text, add_special_tokens=False)) \
                if text and self.tokenizer is not None else []
            table = self.table()
            if b"".join(table.bytes[t] or b"" if 0 <= t < table.size else b"" for t in found) != text.encode():
                found = table.longest(text.encode())
            self._spellings[data] = found
            if len(self._spellings) > SPELLINGS_KEPT:
                self._spellings.popitem(last=False)
        return found

    def table(self) -> TokenTable:
        """The vocabulary's bytes; TokenizerKindError when they cannot be read."""
        if self._table is None:
            if self.tokenizer is None:
                raise TokenizerKindError("the model has no tokenizer files, so its tokens' text is unknown; "
                                         "add the tokenizer to the model folder")
            self._table = TokenTable(token_bytes(self.tokenizer, self.vocab_size))
        return self._table

    def automaton(self, spec: StructuredOutputs) -> TokenAutomaton:
        found = self._automata.get(spec)
        if found is None or found.dfa.full:
            nfa = compiled(spec) if found is None else found.dfa.nfa  # refused to new requests by now
            # A blown-up automaton fails its request, and from then on a new request naming the constraint
            # is refused when it is parsed (each would spend the server's seconds again); one already
            # admitted starts afresh here.
            found = TokenAutomaton(ByteDFA(nfa, lambda why: refuse_from_now(
                spec, f"its automaton grew past its bounds while an earlier request ran ({why})")), self.table())
            self._automata[spec] = found
            if len(self._automata) > AUTOMATA_KEPT:
                self._automata.popitem(last=False)
        self._automata.move_to_end(spec)
        return found


class Constraint:
    """One request's place in its constraint: the state its output has reached."""

    def __init__(self, automaton: TokenAutomaton, end_ids: frozenset[int],
                 spell: Callable[[bytes], list[int]] = lambda data: [], eos: int | None = None) -> None:
        self.automaton = automaton
        self.end_ids = sorted(end_ids)
        """The tokens that end the output (EOS, stop_token_ids): allowed only where the text is complete."""
        self._spell = spell
        self._end = eos if eos in end_ids else (self.end_ids[0] if self.end_ids else None)
        """The end token drafted where the text is complete and nothing may follow: EOS when it is one."""
        self._habits: dict[tuple[bytes, bytes], int] = {}
        """(the two bytes before, the bytes that may follow) -> the byte this output took there last."""
        self._tail = b""
        """The last two bytes the output chose where a few could follow."""
        self._foreseen: dict[tuple[int, bytes], tuple[bytes, int]] = {}
        """(state, tail) -> what ``_foresee`` found there, while the habits stay as they were."""
        self.state = automaton.dfa.start

    def advance(self, tokens: Sequence[int]) -> None:
        """Move past committed output tokens (an end token ends the text; nothing follows it)."""
        for token in tokens:
            self._learn(self.state, token)
            self.state = self._after(self.state, [token])

    def _after(self, state: int, tokens: Sequence[int]) -> int:
        for token in tokens:
            if state == DEAD or token in self.end_ids:
                return DEAD
            state = self.automaton.advance(state, token)
        return state

    def _learn(self, state: int, token: int) -> None:
        """At each place with a few ways on that ``token``'s bytes pass, remember the one they took.

        A place is the bytes that may follow and the last two bytes chosen at such places (a key's
        forced letters and a string's or a number's own characters are left out). JSON's layout
        repeats by that (after ': ' a quote, after the indentation a quote), while the
        automaton's states differ from one member to the next."""
        table = self.automaton.tokens
        raw = table.bytes[token] if 0 <= token < table.size else None
        dfa = self.automaton.dfa
        for byte in raw or b"":
            if state == DEAD:
                return
            live = dfa.live(state)
            if 1 < len(live) <= HABIT_BRANCHES:
                key = (self._tail, live.tobytes())
                if self._habits.get(key) != byte:
                    self._habits[key] = byte
                    self._foreseen.clear()  # what was foreseen from here on may change
                self._tail = (self._tail + bytes((byte,)))[-2:]
            state = int(dfa.table[state, byte])

    def foreseen(self) -> bytes:
        """The text that comes next as far as it can be foreseen: forced bytes, and where a few ways
        lead on (JSON's whitespace, a boolean) the one this output took at the same place last
        time. It stops where the text may end, or where many ways lead on (a string, a number)."""
        return self._foresee()[0]

    def _foresee(self) -> tuple[bytes, int]:
        """``foreseen()``'s text, and how many of its first bytes are forced (before any habit)."""
        found = self._foreseen.get((self.state, self._tail))
        if found is None:
            found = self._foreseen[(self.state, self._tail)] = self._walk_ahead()
        return found

    def _walk_ahead(self) -> tuple[bytes, int]:
        dfa, state, tail, data = self.automaton.dfa, self.state, self._tail, bytearray()
        forced = -1
        while state != DEAD and len(data) < FORESEEN_BYTES and not dfa.accepting[state]:
            live = dfa.live(state)
            if len(live) == 1:
                byte = int(live[0])
            elif len(live) <= HABIT_BRANCHES and (tail, live.tobytes()) in self._habits:
                byte = self._habits[(tail, live.tobytes())]
                tail = (tail + bytes((byte,)))[-2:]
                forced = len(data) if forced < 0 else forced
            else:
                break
            data.append(byte)
            state = int(dfa.table[state, byte])
        return bytes(data), len(data) if forced < 0 else forced

    def _predicted(self, limit: int, data: bytes) -> list[int]:
        """Up to ``limit`` tokens to draft: ``data`` (the foreseen text) as ``spell`` writes it, then an
        end token if the text is complete there and nothing may follow."""
        if self.state == DEAD:
            return []
        tokens, state, written = [], self.state, 0
        for token in self._spell(data) if data else []:
            nxt = self.automaton.advance(state, token)
            if nxt == DEAD or len(tokens) == limit:
                break
            tokens.append(token)
            state, written = nxt, written + len(self.automaton.tokens.bytes[token] or b"")
        dfa = self.automaton.dfa
        if (written == len(data) and len(tokens) < limit and state != DEAD and self._end is not None
                and dfa.accepting[state] and not dfa.can_continue(state)):
            tokens.append(self._end)
        return tokens

    def steer(self, draft: Draft, room: int) -> Draft:
        """The draft to verify: ``draft`` pruned, or the predicted tokens in its place.

        A point-mass draft (its first chain, for a tree) is kept when its text begins with the
        predicted text, or begins with the forced part of it and guesses further: past what is
        forced, the method's guess beats the output's habit. A sampled draft is replaced, since its
        q says nothing of the predicted text.
        """
        if draft.token_ids and draft.probs is None:
            draft = self.prune(draft)
        data, forced = self._foresee()
        predicted = self._predicted(room, data)
        if not predicted:
            return draft
        parents = draft.parents
        chain = draft.token_ids if parents is None else \
            draft.token_ids[:next((i for i, p in enumerate(parents) if p != i), len(parents))]
        text = self._text(chain)
        if draft.probs is None and (text.startswith(self._text(predicted))
                                    or (forced < len(data) and len(text) > forced and text.startswith(data[:forced]))):
            return draft
        return Draft(predicted)

    def _text(self, tokens: Sequence[int]) -> bytes:
        """The bytes ``tokens`` write, an end token as a byte no text holds after the end (0xFF is never UTF-8)."""
        table = self.automaton.tokens.bytes
        return b"".join(b"\xff" if t in self.end_ids else (table[t] or b"") if 0 <= t < len(table) else b"\xff"
                        for t in tokens)

    def prune(self, draft: Draft) -> Draft:
        """``draft`` without the tokens the constraint refuses and what follows them.

        Only for point-mass drafts (``probs`` None: ngram, suffix, trees, greedy drafting): a refused
        token would be rejected and the target's token drawn from p at that row either way, so
        dropping it only saves a verify row. A sampled draft (q a distribution) keeps every token:
        skipping rejection there would change the output's distribution.
        """
        assert draft.probs is None
        parents = draft.parents if draft.parents is not None else list(range(len(draft.token_ids)))
        states = [self.state]  # index 0: the pending token's state; node i's is states[i + 1]
        kept: list[int] = []  # new index of each node, -1 when dropped
        new_ids: list[int] = []
        new_parents: list[int] = []
        for token, parent in zip(draft.token_ids, parents):
            state = states[parent] if parent == 0 or kept[parent - 1] >= 0 else DEAD
            nxt = self._after(state, [token]) if state != DEAD else DEAD
            ends = token in self.end_ids and state != DEAD and self.automaton.dfa.accepting[state]
            if nxt == DEAD and not ends:
                kept.append(-1)
                states.append(DEAD)
                continue
            kept.append(len(new_ids) + 1)
            new_ids.append(token)
            new_parents.append(0 if parent == 0 else kept[parent - 1])
            states.append(nxt)  # DEAD after an end token: nothing may follow it
        if len(new_ids) == len(draft.token_ids):
            return draft
        if draft.parents is None:
            cut = next(i for i, k in enumerate(kept) if k < 0)
            return Draft(draft.token_ids[:cut])
        return Draft(new_ids, parents=new_parents)

    def allowed(self, state: int, vocab: int) -> np.ndarray | None:
        """[vocab] bool of what may follow ``state``; None for a row past a refused token (never reached)."""
        if state == DEAD:
            return None
        dfa = self.automaton.dfa
        mask = np.zeros(vocab, dtype=bool)
        if dfa.can_continue(state):
            tokens = self.automaton.allowed(state)
            mask[:len(tokens)] = tokens[:vocab]
        if dfa.accepting[state]:
            mask[[t for t in self.end_ids if t < vocab]] = True
        return mask

    def apply(self, logits: torch.Tensor, paths: Sequence[Sequence[int]]) -> torch.Tensor:
        """``logits`` [n, vocab] with -inf for what each row's state refuses; row i's state is the
        output's followed by ``paths[i]``."""
        vocab = logits.shape[-1]
        masks = [self.allowed(self._after(self.state, path), vocab) for path in paths]
        if all(m is None for m in masks):
            return logits
        keep = torch.from_numpy(np.stack([m if m is not None else np.ones(vocab, dtype=bool) for m in masks]))
        masked = logits.masked_fill(~keep, float("-inf"))  # [n, vocab]
        stuck = (masked == float("-inf")).all(dim=-1)
        if stuck.any():  # allowed_token_ids left no token the constraint allows: the output ends there
            ends = torch.tensor([t for t in self.end_ids if t < vocab], dtype=torch.long)
            masked[stuck.nonzero()[:, :1], ends[None, :]] = 0.0
        return masked
