"""The engine on the real default model (SmolLM2-135M-Instruct), float32: lossless greedy."""

from __future__ import annotations

from pathlib import Path

import pytest

from specsure import SamplingParams, make_engine
from specsure.decode.engine import Engine

pytestmark = pytest.mark.slow

QUESTIONS = [
    "Rewrite this function with `n` renamed to `count`:\n\ndef total(n):\n    s = 0\n    for i in range(n):\n"
    "        s += i * i\n    return s\n",
    "Summarise in two sentences: The river rose after three days of rain. The town moved its market to the "
    "hill, and the bakery gave bread to everyone who helped carry the stalls.",
    "List five colours and one fruit of each colour.",
]
PARAMS = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def plain(default_model_cache: Path) -> Engine:
    return make_engine(None, None, dtype="float32")


def _prompts(engine: Engine) -> list[list[int]]:
    tok = engine.tokenizer
    return [list(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                         tokenize=True, return_dict=False)) for q in QUESTIONS]


@pytest.fixture(scope="module")
def reference(plain: Engine) -> list[list[int]]:
    return [c.token_ids for c in plain.generate(_prompts(plain), PARAMS)]


def test_ngram_equals_plain_greedy(plain: Engine, reference: list[list[int]]) -> None:
    engine = make_engine(None, {"method": "ngram", "num_speculative_tokens": 6}, dtype="float32")
    outs = engine.generate(_prompts(engine), PARAMS)
    assert [c.token_ids for c in outs] == reference
    assert engine.speculative_method == "ngram" and engine.stats.accepted_tokens > 0


def test_draft_model_equal_to_target_equals_plain_and_accepts_all(plain: Engine, reference: list[list[int]],
                                                                  default_model_cache: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # float32 drafts run the target's own arithmetic, one row at a time, and a forward's rows are
    # computed alone: every draft token is the target's, on every CPU
    monkeypatch.setenv("SPECSURE_DRAFT_INT8", "0")
    k = 3
    engine = make_engine(None, {"method": "draft_model", "model": plain.target.path, "num_speculative_tokens": k},
                         dtype="float32")
    assert engine.proposer.draft.int8_matrices == 0
    outs = engine.generate(_prompts(engine), PARAMS)
    assert [c.token_ids for c in outs] == reference
    for out in outs:
        assert out.stats.accepted_tokens == out.stats.draft_tokens > 0


def test_int8_drafts_of_the_target_equal_plain(plain: Engine, reference: list[list[int]], default_model_cache: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # where int8 drafts are the default (a CPU without AMX tiles) they differ from the target only at
    # near-ties, so nearly all are accepted; how many depends on the CPU's float32 sums (AVX2 or
    # AVX-512 lanes), so the bound is loose; the output is the target's whatever the drafts
    from specsure.proposers.head_blocks import int8_wanted

    monkeypatch.setenv("SPECSURE_DRAFT_INT8", "1")
    if not int8_wanted(plain.target.lm):
        pytest.skip("drafts stay float32 here (the target on AMX tiles, or no float32 kernel to read blocks)")
    engine = make_engine(None, {"method": "draft_model", "model": plain.target.path, "num_speculative_tokens": 3},
                         dtype="float32")
    assert engine.proposer.draft.int8_matrices > 0
    outs = engine.generate(_prompts(engine), PARAMS)
    assert [c.token_ids for c in outs] == reference
    assert sum(c.stats.accepted_tokens for c in outs) > 0.85 * sum(c.stats.draft_tokens for c in outs)


def test_text_prompt_and_eos(plain: Engine) -> None:
    out = plain.generate("The capital of France is", SamplingParams(max_tokens=8))[0]
    assert out.text and "Paris" in out.text
