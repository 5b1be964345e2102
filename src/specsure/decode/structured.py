"""Structured outputs in the engine: each verify row's tokens limited to those that keep the output
a prefix of a text the request's constraint accepts.

The mask is part of the target's distribution, as logit_bias is: row i of a verify forward
follows the output plus the first i draft tokens, so its mask is the constraint's state after
them. A draft token the constraint refuses has probability 0 under that distribution and is
rejected like any other, so greedy output equals plain decoding with the same constraint, and
sampling keeps the constrained distribution. Drafts themselves are not constrained: a proposer
that drafts outside the grammar only loses acceptance.

Where the constraint leaves no choice (a JSON Schema's keys and punctuation, a tool call's name),
it drafts itself: ``Constraint.steer`` puts those bytes, written as the tokenizer writes them,
in place of a draft that does not begin with them. That draft depends only on the output so
far, never on the target's draws, so the rejection sampler keeps it lossless like any other;
the target may still write the same bytes as other tokens, and then the forced draft is rejected.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
import torch

from specsure.grammar import StructuredOutputs
from specsure.grammar.automaton import DEAD, ByteDFA, TokenAutomaton, TokenTable
from specsure.grammar.spec import compiled
from specsure.models.token_bytes import TokenizerKindError, token_bytes
from specsure.proposers.base import Draft

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

AUTOMATA_KEPT = 16
"""Constraints whose automata an engine keeps: requests with the same schema share one."""


class Grammars:
    """One engine's automata for structured outputs over its target's vocabulary, built on first use."""

    def __init__(self, tokenizer: "PreTrainedTokenizerBase | None", vocab_size: int) -> None:
        self.tokenizer, self.vocab_size = tokenizer, vocab_size
        self._table: TokenTable | None = None
        self._automata: OrderedDict[StructuredOutputs, TokenAutomaton] = OrderedDict()

    def spell(self, data: bytes) -> list[int]:
        """The tokenizer's tokens for ``data`` (its whole characters): how a forced text is drafted."""
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:  # the forced bytes stop inside a character
            text = data[:exc.start].decode("utf-8")
        if not text or self.tokenizer is None:
            return []
        return list(self.tokenizer.encode(text, add_special_tokens=False))

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
        if found is None or found.dfa.full:  # a blown-up automaton fails its request; the next starts afresh
            found = TokenAutomaton(ByteDFA(compiled(spec)), self.table())
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
        self.state = automaton.dfa.start

    def advance(self, tokens: Sequence[int]) -> None:
        """Move past committed output tokens (an end token ends the text; nothing follows it)."""
        self.state = self._after(self.state, tokens)

    def _after(self, state: int, tokens: Sequence[int]) -> int:
        for token in tokens:
            if state == DEAD or token in self.end_ids:
                return DEAD
            state = self.automaton.advance(state, token)
        return state

    def forced(self, limit: int) -> list[int]:
        """Up to ``limit`` tokens the constraint leaves no choice about from here: its forced bytes,
        then an end token if the text is complete there and nothing may follow."""
        tokens, state = self.automaton.forced(self.state, self._spell) if self.state != DEAD else ((), DEAD)
        out = list(tokens[:limit])
        dfa = self.automaton.dfa
        if (len(out) == len(tokens) < limit and state != DEAD and self._end is not None and dfa.accepting[state]
                and not dfa.can_continue(state)):
            out.append(self._end)
        return out

    def steer(self, draft: Draft, room: int) -> Draft:
        """The draft to verify: ``draft`` pruned, or the forced tokens where it does not write them.

        A point-mass draft whose text (its first chain, for a tree) begins with the forced text is
        kept, as it guesses past it, whichever tokens it writes it with; a sampled draft is
        replaced, since its q says nothing of the forced text.
        """
        if draft.token_ids and draft.probs is None:
            draft = self.prune(draft)
        forced = self.forced(room)
        if not forced:
            return draft
        parents = draft.parents
        chain = draft.token_ids if parents is None else \
            draft.token_ids[:next((i for i, p in enumerate(parents) if p != i), len(parents))]
        if draft.probs is None and self._text(chain).startswith(self._text(forced)):
            return draft
        return Draft(forced)

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
