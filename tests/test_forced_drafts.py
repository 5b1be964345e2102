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


def test_the_foreseen_text_is_forced_or_what_the_output_chose_at_a_small_choice(engines: dict[str, Engine]) -> None:
    tok = engines["plain"].tokenizer
    grammars = Grammars(tok, len(tok))

    def constraint(regex: str) -> Constraint:
        return Constraint(grammars.automaton(StructuredOutputs(regex=regex)), frozenset({0}), grammars.spell, 0)

    ids = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    c = constraint("abc(de|df)g")
    assert c.foreseen() == b"abcd"
    c.advance(ids("abcde"))
    assert c.foreseen() == b"g"
    c.advance(ids("g"))
    assert c.foreseen() == b""  # complete: the end is a choice too
    listing = constraint("x([ ,;]x){1,4}")  # a separator of three after each x; the automaton counts them
    listing.advance(ids("x;x"))
    assert listing.foreseen() == b""  # "x" may end it
    schema = {"type": "object", "properties": {k: {"type": "integer"} for k in "abc"}, "required": list("abc")}
    pretty = Constraint(grammars.automaton(StructuredOutputs(json=schema)), frozenset({0}), grammars.spell, 0)
    pretty.advance(ids('{\n  "a": 1,\n  "b": 2,'))
    assert pretty.foreseen() == b'\n  "c":'  # its layout and the one key left; then a space or a number



def test_steer_drafts_the_forced_text_unless_the_draft_writes_it(engines: dict[str, Engine]) -> None:
    tok = engines["plain"].tokenizer
    grammars = Grammars(tok, len(tok))
    constraint = Constraint(grammars.automaton(StructuredOutputs(choice=CHOICES)), frozenset({0}), grammars.spell, 0)
    ids = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    assert constraint.steer(Draft([]), 8) == Draft([])  # y, n or m: a choice not yet made
    constraint.advance(ids("m"))
    forced = constraint.steer(Draft([]), 8).token_ids
    assert tok.decode(forced[:-1]) == "aybe" and forced[-1] == 0  # then nothing may follow: EOS
    assert constraint.steer(Draft(ids("xyz")), 8) == Draft(forced)
    written_otherwise = Draft([*[tok.convert_tokens_to_ids(c) for c in "aybe"], 0])
    assert constraint.steer(written_otherwise, 8) is not None
    assert constraint.steer(written_otherwise, 8).token_ids == written_otherwise.token_ids
    assert constraint.steer(Draft([]), 2) == Draft(forced[:2])
    sampled = Draft(ids("ay"), probs=torch.zeros(2, len(tok)))
    assert constraint.steer(sampled, 8) == Draft(forced)  # a sampled draft says nothing of the forced text


def test_a_sentencepiece_tokenizer_drafts_the_text_without_its_leading_space() -> None:
    """encode() of a SentencePiece tokenizer writes "aybe" as "▁aybe"; the draft must not."""
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    for piece in ["▁", "a", "y", "e", "s", "m", "b", "ye", "yes", "▁m", "ay", "be", "aybe"]:
        vocab.setdefault(piece, len(vocab))
    sp = Tokenizer(models.BPE(vocab, [], byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    sp.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    sp.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                    decoders.Strip(" ", 1, 0)])
    tok = PreTrainedTokenizerFast(tokenizer_object=sp, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    assert tok.convert_ids_to_tokens(tok.encode("aybe", add_special_tokens=False))[0] == "▁"
    grammars = Grammars(tok, len(tok))
    constraint = Constraint(grammars.automaton(StructuredOutputs(choice=["yes", "maybe"])), frozenset({2}),
                            grammars.spell, 2)
    constraint.advance([vocab["m"]])
    assert tok.convert_ids_to_tokens(constraint.steer(Draft([]), 8).token_ids) == ["aybe", "</s>"]


def test_forced_drafts_run_and_greedy_output_equals_plain(engines: dict[str, Engine],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    drafted: list[list[int]] = []
    original = Constraint._predicted

    def spy(self: Constraint, limit: int, data: bytes) -> list[int]:
        out = original(self, limit, data)
        drafted.append(out)
        return out

    monkeypatch.setattr(structured.Constraint, "_predicted", spy)
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
