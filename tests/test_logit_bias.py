"""vLLM's and OpenAI's logit_bias and vLLM's allowed_token_ids: they shape the target's distribution
on every row, and every method's output equals plain decoding's under them."""

from __future__ import annotations

import pytest
import torch

from serving import build_tiny_chat_model
from specsure import SamplingParams, make_engine
from specsure.decode.completion import ParamsError
from specsure.decode.engine import Engine

PROMPT = [[5, 6, 7, 5, 6, 7, 5, 6]]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_tiny_chat_model(tmp_path_factory.mktemp("chat")))


@pytest.fixture(scope="module")
def engines(model: str) -> list[Engine]:
    specs = [None, {"method": "ngram", "num_speculative_tokens": 4},
             {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_branches": 3},
             {"method": "draft_model", "model": model, "num_speculative_tokens": 3}]
    return [make_engine(model, spec, dtype="float32") for spec in specs]


def _reference(engine: Engine, params: SamplingParams, steps: int) -> list[int]:
    """Greedy tokens from the raw model, the bias added and the ids not allowed at -inf, then vLLM's
    repetition penalty (applied after the bias)."""
    hf, out = engine.target.lm.hf, []
    for _ in range(steps):
        with torch.no_grad():
            logits = hf(torch.tensor([PROMPT[0] + out])).logits[0, -1].float()
        if params.allowed_token_ids is not None:
            keep = torch.full_like(logits, float("-inf"))
            keep[list(params.allowed_token_ids)] = 0
            logits = logits + keep
        for token, bias in params.logit_bias or ():
            logits[token] += bias
        if params.repetition_penalty != 1:
            seen = torch.zeros_like(logits, dtype=torch.bool)
            seen[torch.tensor(PROMPT[0] + out)] = True
            scaled = torch.where(logits > 0, logits / params.repetition_penalty, logits * params.repetition_penalty)
            logits = torch.where(seen, scaled, logits)
        out.append(int(logits.argmax()))
    return out


def test_a_banned_token_never_appears_and_every_method_equals_plain(engines: list[Engine]) -> None:
    plain = engines[0].generate(PROMPT, SamplingParams(max_tokens=16, ignore_eos=True))[0].token_ids
    banned = plain[0]
    params = SamplingParams(max_tokens=16, ignore_eos=True, logit_bias={banned: -100, plain[3]: 5.5})
    outs = [e.generate(PROMPT, params)[0].token_ids for e in engines]
    assert banned not in outs[0] and outs[0] != plain
    assert outs[0] == _reference(engines[0], params, 16)
    assert all(out == outs[0] for out in outs[1:])


def test_allowed_token_ids_leave_only_those_and_come_before_the_bias_and_penalties(engines: list[Engine]) -> None:
    plain = engines[0].generate(PROMPT, SamplingParams(max_tokens=12, ignore_eos=True))[0].token_ids
    allowed = sorted({9, 11, 13, 40, *plain[1:3]} - {plain[0]})
    params = SamplingParams(max_tokens=12, ignore_eos=True, allowed_token_ids=allowed, logit_bias={allowed[0]: 2.0,
                            plain[0]: 100}, repetition_penalty=1.5)
    outs = [e.generate(PROMPT, params)[0].token_ids for e in engines]
    assert set(outs[0]) <= set(allowed)  # a +100 bias does not bring back a token that is not allowed
    assert outs[0] == _reference(engines[0], params, 12)
    assert all(out == outs[0] for out in outs[1:])


def test_a_biased_sample_draws_only_allowed_tokens(engines: list[Engine]) -> None:
    allowed = [9, 11, 13]
    params = [SamplingParams(max_tokens=6, temperature=1.0, allowed_token_ids=allowed, seed=s) for s in range(8)]
    for engine in engines:  # accepted, recovered and bonus tokens alike
        for out in engine.generate(PROMPT * len(params), params):
            assert set(out.token_ids) <= set(allowed), out.token_ids


@pytest.mark.parametrize(("field", "value", "message"), [
    ("logit_bias", {"7": 1.0}, "its key '7' is not a token id"),
    ("logit_bias", {7: 101}, "the bias of token 7 must be a number in [-100, 100]"),
    ("logit_bias", [7, 1], "must be None or a dict of token id -> bias"),
    ("allowed_token_ids", [], "must be None or a non-empty list of token ids"),
    ("allowed_token_ids", [3, -1], "must be None or a non-empty list of token ids"),
])
def test_bad_values_are_named(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=f"SamplingParams.{field} = .* " + message.replace("[", r"\[")
                       .replace("]", r"\]")):
        SamplingParams(**{field: value})


def test_ids_outside_the_models_vocabulary_are_refused_at_the_call(engines: list[Engine]) -> None:
    vocab = engines[0].target.lm.vocab_size
    for params, field in ((SamplingParams(logit_bias={vocab: 1.0}), "logit_bias"),
                          (SamplingParams(allowed_token_ids=[3, vocab + 5]), "allowed_token_ids"),
                          (SamplingParams(stop_token_ids=[vocab + 1]), "stop_token_ids")):
        with pytest.raises(ParamsError, match=f"{field} = .* outside the model's vocabulary \\[0, {vocab}\\)") as err:
            engines[0].generate(PROMPT, params)
        assert err.value.field == field


def test_the_server_takes_openais_string_keys(engines: list[Engine]) -> None:
    from fastapi.testclient import TestClient

    from specsure.serve.app import create_app

    plain = engines[0].generate(PROMPT, SamplingParams(max_tokens=8, ignore_eos=True))[0].token_ids
    expected = engines[0].generate(PROMPT, SamplingParams(max_tokens=8, ignore_eos=True,
                                                          logit_bias={plain[0]: -100}))[0].token_ids
    client = TestClient(create_app(engines[1]))
    body = {"prompt": PROMPT[0], "max_tokens": 8, "ignore_eos": True, "logit_bias": {str(plain[0]): -100}}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["token_ids"] == expected
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                                                  "allowed_token_ids": [9, 11]})
    assert r.status_code == 200, r.text
    for bad, field, words in (({"logit_bias": {"x": 1}}, "logit_bias", "is not a token id"),
                              ({"logit_bias": {"5": 500}}, "logit_bias", "[-100, 100]"),
                              ({"logit_bias": {"999999": 1}}, "logit_bias", "outside the model's vocabulary"),
                              ({"stop_token_ids": [99999999]}, "stop_token_ids", "outside the model's vocabulary"),
                              ({"allowed_token_ids": []}, "allowed_token_ids", "non-empty list")):
        r = client.post("/v1/completions", json={"prompt": PROMPT[0], "max_tokens": 4, **bad})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == field and words in error["message"], error


def test_allowed_ids_that_are_all_stop_tokens_under_min_tokens_are_refused(engines: list[Engine]) -> None:
    eos = engines[0].target.eos_token_ids[0]
    with pytest.raises(ParamsError, match="holds only stop tokens, which min_tokens"):
        engines[0].generate(PROMPT, SamplingParams(max_tokens=4, allowed_token_ids=[eos], min_tokens=2))


def test_numpy_token_ids_are_taken_as_ints_in_both_fields() -> None:
    import numpy as np

    params = SamplingParams(allowed_token_ids=[np.int64(3), 5], logit_bias={np.int32(7): 1.0})
    assert params.allowed_token_ids == (3, 5) and all(type(i) is int for i in params.allowed_token_ids)
    assert params.logit_bias == ((7, 1.0),)
