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
                                                                  default_model_cache: Path) -> None:
    k = 3
    engine = make_engine(None, {"method": "draft_model", "model": plain.target.path, "num_speculative_tokens": k},
                         dtype="float32")
    prompts = _prompts(engine)
    outs = engine.generate(prompts[:1], PARAMS)
    assert outs[0].token_ids == reference[0]
    assert outs[0].stats.mean_acceptance_length >= k + 0.9 - 0.2  # a 64-token tail step may be short
    assert outs[0].stats.acceptance_rate > 0.97


def test_text_prompt_and_eos(plain: Engine) -> None:
    out = plain.generate("The capital of France is", SamplingParams(max_tokens=8))[0]
    assert out.text and "Paris" in out.text
