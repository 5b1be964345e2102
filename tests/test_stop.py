"""Stop strings on a tiny model with a word-level tokenizer: exact token ids and text.

The engine keeps the output tokens up to the one that completed the stop string, and the text
ends just before the stop string, wherever it falls inside or across tokens.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from words import write_word_tokenizer

from specsure import SamplingParams, make_engine
from tiny import build_tiny_llama

PROMPT = "w5 w6 w7 w8 w5 w6 w7 w8 w5"
FREE = [77, 124, 25, 25, 107, 57, 96, 5, 5, 5, 5, 82, 19, 88, 14, 104]
"""The greedy output without stop strings: "w77 w124 w25 w25 w107 w57 w96 w5 ..."."""

CASES = {
    "ends inside a token, across a boundary": ("w124 w2", [77, 124, 25], "w77 "),
    "inside a single token": ("10", [77, 124, 25, 25, 107], "w77 w124 w25 w25 w"),
    "a trailing space is completed by the next token": ("w124 ", [77, 124, 25], "w77 "),
    "the first of repeated matches": ("w25", [77, 124, 25], "w77 w124 "),
    "the earliest of several stops, whatever their order": (["w57", "w124"], [77, 124], "w77 "),
    # A step that overshoots also completes "w124 w25 w25 w107", which starts before "w25" but ends
    # after it: plain decoding never saw it, so the text is cut at "w25".
    "the first to end, not the first to start": (["w124 w25 w25 w107", "w25"], [77, 124, 25], "w77 w124 "),
}
ENGINES = {
    "plain": None,
    # A draft equal to the target is always accepted: each step commits k + 1 tokens and
    # overshoots the stop string, so the engine must cut back to the completing token.
    "draft_model = target, k = 4": {"method": "draft_model", "model": "{target}", "num_speculative_tokens": 4},
}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = build_tiny_llama(tmp_path_factory.mktemp("stop") / "words", vocab_size=128, hidden_size=48,
                              num_layers=3, seed=0)
    return write_word_tokenizer(folder, 128)


@pytest.fixture(scope="module", params=list(ENGINES))
def engine(request: pytest.FixtureRequest, model: Path):  # noqa: ANN201
    spec = ENGINES[request.param]
    if spec is not None:
        spec = {**spec, "model": str(model)}
    return make_engine(str(model), spec, dtype="float32")


def test_the_free_output_is_the_one_the_cases_are_written_for(engine) -> None:  # noqa: ANN001
    out = engine.generate(PROMPT, SamplingParams(max_tokens=16))[0]
    assert out.token_ids == FREE and out.finish_reason == "length"
    assert out.text == " ".join(f"w{i}" for i in FREE)


@pytest.mark.parametrize("case", CASES)
def test_stop_string_keeps_the_completing_token_and_cuts_the_text(engine, case: str) -> None:  # noqa: ANN001
    stop, token_ids, text = CASES[case]
    out = engine.generate(PROMPT, SamplingParams(max_tokens=16, stop=stop))[0]
    assert out.token_ids == token_ids
    assert out.text == text
    assert out.finish_reason == "stop"


def test_the_stop_string_is_kept_in_the_text_only_up_to_the_kept_tokens(engine) -> None:  # noqa: ANN001
    params = SamplingParams(max_tokens=16, stop=["w124 w25 w25 w107", "w25"], include_stop_str_in_output=True)
    out = engine.generate(PROMPT, params)[0]
    assert out.token_ids == [77, 124, 25] and out.text == "w77 w124 w25"


def test_a_stop_string_that_never_appears_changes_nothing(engine) -> None:  # noqa: ANN001
    out = engine.generate(PROMPT, SamplingParams(max_tokens=16, stop=["w1000", "w5w5"]))[0]
    assert out.token_ids == FREE and out.finish_reason == "length"
    assert out.text == " ".join(f"w{i}" for i in FREE)


@pytest.mark.parametrize("spec", [None, {"method": "draft_model", "model": "{target}", "num_speculative_tokens": 8},
                                  {"method": "ngram", "num_speculative_tokens": 8}])
def test_an_eos_just_past_max_tokens_is_not_output(tmp_path: Path, spec: dict | None) -> None:
    """A step that commits past max_tokens (every draft accepted, then the bonus) must not end on an EOS
    that plain decoding, stopping at max_tokens, never generates."""
    target = build_tiny_llama(tmp_path / "tiny", vocab_size=32, hidden_size=32, num_layers=4, seed=5)  # EOS id 2
    plain = make_engine(str(target), None, dtype="float32")
    rng = random.Random(0)
    for _ in range(400):  # a prompt whose greedy answer ends in EOS after a few tokens
        prompt = [rng.randrange(3, 32) for _ in range(rng.randrange(2, 8))]
        free = plain.generate(prompt, SamplingParams(max_tokens=8))[0].token_ids
        if free[-1] == 2 and len(free) >= 3:
            break
    else:
        pytest.fail("no prompt of the tiny model ends in EOS within 8 tokens")
    config = None if spec is None else {k: (str(target) if v == "{target}" else v) for k, v in spec.items()}
    engine = make_engine(str(target), config, dtype="float32")
    out = engine.generate(prompt, SamplingParams(max_tokens=len(free) - 1))[0]
    assert out.token_ids == free[:-1] and out.finish_reason == "length"
