"""Forced drafts: where a structured output leaves no choice, the constraint drafts the text itself.
The bytes it forces, the tokens it drafts and the drafts it keeps; in the engine, greedy output
still equals plain decoding's and sampled choices keep plain decoding's distribution."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from grammar_model import build_byte_level_model
from specsure import SamplingParams, make_engine
from specsure.decode import structured
from specsure.decode.engine import Engine
from specsure.decode.structured import Constraint, Grammars
from specsure.grammar import StructuredOutputs
from specsure.grammar.automaton import ByteDFA
from specsure.grammar.pattern import compile_nfa
from specsure.grammar.regex import parse_regex
from specsure.proposers.base import Draft

CHOICES = ["yes", "no", "maybe"]
PROMPT = '{"name": "yes", "age": 12, "ok": true} {"na'


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_byte_level_model(tmp_path_factory.mktemp("forced")))


@pytest.fixture(scope="module")
def engines(model: str) -> dict[str, Engine]:
    return {"plain": make_engine(model, None, dtype="float32"),
            "ngram": make_engine(model, {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1},
                                 dtype="float32"),
            "draft_model": make_engine(model, {"method": "draft_model", "model": model, "num_speculative_tokens": 3},
                                       dtype="float32")}


def test_forced_bytes_stop_where_a_choice_or_the_end_comes() -> None:
    dfa = ByteDFA(compile_nfa(parse_regex("abc(de|df)g")))
    assert dfa.forced(dfa.start) == b"abcd"
    assert dfa.forced(dfa.walk(dfa.start, b"abcde")) == b"g"
    assert dfa.forced(dfa.walk(dfa.start, b"abcdeg")) == b""  # complete: the end is a choice too
    assert dfa.forced(dfa.start, limit=2) == b"ab"


def test_steer_drafts_the_forced_text_unless_the_draft_writes_it(engines: dict[str, Engine]) -> None:
    tok = engines["plain"].tokenizer
    grammars = Grammars(tok, len(tok))
    constraint = Constraint(grammars.automaton(StructuredOutputs(choice=CHOICES)), frozenset({0}), grammars.spell, 0)
    ids = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    assert constraint.forced(8) == []  # y, n or m: a choice
    constraint.advance(ids("m"))
    forced = constraint.forced(8)
    assert tok.decode(forced[:-1]) == "aybe" and forced[-1] == 0  # then nothing may follow: EOS
    assert constraint.steer(Draft(ids("xyz")), 8) == Draft(forced)
    written_otherwise = Draft([*[tok.convert_tokens_to_ids(c) for c in "aybe"], 0])
    assert constraint.steer(written_otherwise, 8) is not None
    assert constraint.steer(written_otherwise, 8).token_ids == written_otherwise.token_ids
    assert constraint.steer(Draft([]), 2) == Draft(forced[:2])
    sampled = Draft(ids("ay"), probs=torch.zeros(2, len(tok)))
    assert constraint.steer(sampled, 8) == Draft(forced)  # a sampled draft says nothing of the forced text


def test_forced_drafts_run_and_greedy_output_equals_plain(engines: dict[str, Engine],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    drafted: list[list[int]] = []
    original = Constraint.forced

    def spy(self: Constraint, limit: int) -> list[int]:
        out = original(self, limit)
        drafted.append(out)
        return out

    monkeypatch.setattr(structured.Constraint, "forced", spy)
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                               "ok": {"type": "boolean"}}, "required": ["name", "ok"]}
    for spec in ({"json": schema}, {"choice": CHOICES}, {"regex": "(ab|12)+x"}):
        params = SamplingParams(max_tokens=60, structured_outputs=spec)
        outs = {name: e.generate([PROMPT, PROMPT[:9]], params) for name, e in engines.items()}
        for name in ("ngram", "draft_model"):
            assert [c.token_ids for c in outs[name]] == [c.token_ids for c in outs["plain"]], (name, spec)
    assert sum(1 for d in drafted if d) >= 3  # the tests above drafted forced text


def test_sampled_choices_keep_plain_decodings_distribution(engines: dict[str, Engine]) -> None:
    """Sampled at temperature 1, the choices' frequencies under forced drafts (ngram's point masses,
    draft_model's q replaced) match plain decoding's, within 4.5 standard errors. The choices share
    prefixes, so a forced draft is verified before the rest is chosen."""
    runs, choices = 300, ["yes", "yet", "yellow", "no", "nope"]
    counts = {}
    for name, engine in engines.items():
        params = [SamplingParams(max_tokens=8, temperature=1.0, seed=seed, structured_outputs={"choice": choices})
                  for seed in range(runs)]
        counts[name] = Counter(c.text for c in engine.generate([PROMPT[:12]] * runs, params))
        assert set(counts[name]) <= set(choices)
    for name in ("ngram", "draft_model"):
        for choice in choices:
            p = (counts["plain"][choice] + counts[name][choice]) / (2 * runs)
            se = (2 * p * (1 - p) / runs) ** 0.5
            assert abs(counts[name][choice] - counts["plain"][choice]) / runs <= 4.5 * se + 1e-9, (name, counts)
