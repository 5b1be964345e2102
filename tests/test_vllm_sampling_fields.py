"""vLLM's min_p, stop_token_ids, include_stop_str_in_output and min_tokens, as vLLM defines them,
with speculative output equal to plain decoding under each."""

from __future__ import annotations


import pytest
import torch

from serving import build_tiny_chat_model
from specsure import SamplingParams, make_engine
from specsure.decode.engine import Engine
from specsure.sampling import probs_from_logits

PROMPT = [[5, 6, 7, 5, 6, 7, 5, 6]]
METHODS = [None, {"method": "ngram", "num_speculative_tokens": 4},
           {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_branches": 3}]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_tiny_chat_model(tmp_path_factory.mktemp("chat")))


@pytest.fixture(scope="module")
def engines(model: str) -> list[Engine]:
    return [make_engine(model, spec, dtype="float32") for spec in METHODS]


def _all(engines: list[Engine], params: SamplingParams) -> list:  # noqa: ANN401
    """Every engine's completion; all must equal plain decoding's."""
    outs = [e.generate(PROMPT, params)[0] for e in engines]
    for out in outs[1:]:
        assert (out.token_ids, out.text, out.finish_reason) == (outs[0].token_ids, outs[0].text, outs[0].finish_reason)
    return outs


def test_a_stop_token_ends_the_output_and_leaves_the_text_unless_asked(engines: list[Engine]) -> None:
    base = engines[0].generate(PROMPT, SamplingParams(max_tokens=24, ignore_eos=True))[0]
    stop = base.token_ids[3]
    first = base.token_ids.index(stop)
    out = _all(engines, SamplingParams(max_tokens=24, ignore_eos=True, stop_token_ids=[stop]))[0]
    assert out.token_ids == base.token_ids[:first + 1] and out.finish_reason == "stop"
    tok = engines[0].tokenizer
    assert out.text == tok.decode(base.token_ids[:first])
    kept = _all(engines, SamplingParams(max_tokens=24, ignore_eos=True, stop_token_ids=[stop],
                                        include_stop_str_in_output=True))[0]
    assert kept.text == tok.decode(base.token_ids[:first + 1])
    # A stop token ends the output even with ignore_eos (vLLM's rule), and streaming gives the same text.
    streamed = list(engines[1].generate_stream(PROMPT[0], SamplingParams(max_tokens=24, ignore_eos=True,
                                                                         stop_token_ids=[stop])))
    assert [t for u in streamed for t in u.token_ids] == out.token_ids


def test_a_stop_string_can_stay_in_the_text(engines: list[Engine]) -> None:
    base = engines[0].generate(PROMPT, SamplingParams(max_tokens=24, ignore_eos=True))[0]
    stop = base.text.split()[2]
    cut = _all(engines, SamplingParams(max_tokens=24, ignore_eos=True, stop=stop))[0]
    kept = _all(engines, SamplingParams(max_tokens=24, ignore_eos=True, stop=stop, include_stop_str_in_output=True))[0]
    assert kept.text == cut.text + stop and kept.token_ids == cut.token_ids


def test_min_tokens_keeps_stop_tokens_and_strings_from_ending_the_output_early(engines: list[Engine]) -> None:
    base = engines[0].generate(PROMPT, SamplingParams(max_tokens=24, ignore_eos=True))[0]
    first = base.token_ids[0]
    out = _all(engines, SamplingParams(max_tokens=24, ignore_eos=True, stop_token_ids=[first], min_tokens=4))[0]
    assert out.token_ids[0] != first  # the target's own first choice had probability 0 there
    assert first not in out.token_ids[:4]
    words = base.text.split()
    early = _all(engines, SamplingParams(max_tokens=24, ignore_eos=True, stop=words[0], min_tokens=3))[0]
    assert early.finish_reason == "length" or len(early.token_ids) > 3


def test_min_p_drops_tokens_below_its_share_of_the_top_one() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    probs = probs_from_logits(logits, SamplingParams(temperature=1.0, min_p=0.25))
    torch.testing.assert_close(probs, torch.tensor([[0.5, 0.3, 0.15, 0.0]]) / 0.95)
    assert probs_from_logits(logits, SamplingParams(temperature=1.0, min_p=1.0))[0].tolist() == [1.0, 0.0, 0.0, 0.0]


def test_min_p_sampling_draws_only_tokens_min_p_keeps(engines: list[Engine]) -> None:
    params = [SamplingParams(max_tokens=6, temperature=1.5, min_p=0.3, seed=s) for s in range(30)]
    hf = engines[0].target.lm.hf
    seen = set()
    for engine in engines:  # each method's accepted, recovered and bonus tokens alike
        for out in engine.generate(PROMPT * len(params), params):
            ids = PROMPT[0] + out.token_ids
            with torch.no_grad():
                logits = hf(torch.tensor([ids])).logits[0, len(PROMPT[0]) - 1:-1]  # the row that chose each token
            kept = probs_from_logits(logits, params[0])  # [6, vocab]
            assert all(kept[i, t] > 0 for i, t in enumerate(out.token_ids)), out.token_ids
            seen.update(out.token_ids)
    assert len(seen) > 3  # it sampled, rather than always taking the top token


@pytest.mark.parametrize(("field", "value", "message"), [
    ("min_p", 1.5, "SamplingParams.min_p = 1.5 is invalid: it must be a number in [0, 1]"),
    ("stop_token_ids", [-1], "SamplingParams.stop_token_ids = [-1] is invalid"),
    ("include_stop_str_in_output", 1, "must be a bool"),
    ("min_tokens", 40, "SamplingParams.min_tokens = 40 is invalid: it must be an int from 0 to max_tokens (16)"),
])
def test_bad_values_are_named(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")
                       .replace(")", r"\)")):
        SamplingParams(**{field: value})


def test_the_server_takes_vllms_fields(model: str, engines: list[Engine]) -> None:
    from fastapi.testclient import TestClient

    from specsure.serve.app import create_app

    base = engines[0].generate(PROMPT, SamplingParams(max_tokens=12, ignore_eos=True))[0]
    client = TestClient(create_app(engines[1]))
    r = client.post("/v1/completions", json={"prompt": PROMPT[0], "max_tokens": 12, "ignore_eos": True,
                                             "stop_token_ids": [base.token_ids[2]], "min_p": 0.1, "min_tokens": 1})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["token_ids"] == base.token_ids[:base.token_ids.index(base.token_ids[2]) + 1]


PENALTIES = [{"presence_penalty": 1.5}, {"frequency_penalty": 0.7}, {"repetition_penalty": 1.8},
             {"presence_penalty": -0.5, "frequency_penalty": 0.3, "repetition_penalty": 0.7}]


def _penalised_logits(hf, prompt: list[int], output: list[int], params: SamplingParams) -> torch.Tensor:  # noqa: ANN001
    """The next token's logits after ``prompt + output`` with vLLM's penalty formulas, from the raw model."""
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + output])).logits[0, -1].float()
    counts = torch.zeros_like(logits)
    for t in output:
        counts[t] += 1
    if params.repetition_penalty != 1:
        seen = counts > 0
        seen[torch.tensor(prompt)] = True
        scaled = torch.where(logits > 0, logits / params.repetition_penalty, logits * params.repetition_penalty)
        logits = torch.where(seen, scaled, logits)
    return logits - params.frequency_penalty * counts - params.presence_penalty * (counts > 0).float()


@pytest.mark.parametrize("penalty", PENALTIES)
def test_penalties_are_vllms_and_every_method_equals_plain_decoding_under_them(engines: list[Engine],
                                                                              penalty: dict) -> None:
    params = SamplingParams(max_tokens=20, ignore_eos=True, **penalty)
    out = _all(engines, params)[0]  # greedy: ngram chains and trees equal plain, token for token
    hf, expected = engines[0].target.lm.hf, []
    for _ in range(20):
        expected.append(int(_penalised_logits(hf, PROMPT[0], expected, params).argmax()))
    assert out.token_ids == expected
    assert out.token_ids != engines[0].generate(PROMPT, SamplingParams(max_tokens=20, ignore_eos=True))[0].token_ids


def test_a_penalised_sample_draws_only_tokens_the_penalised_target_allows(engines: list[Engine]) -> None:
    params = [SamplingParams(max_tokens=5, temperature=1.0, top_k=2, presence_penalty=2.0, seed=s) for s in range(20)]
    hf = engines[0].target.lm.hf
    for engine in engines:  # accepted, recovered and bonus tokens: each among the penalised target's top 2
        for out in engine.generate(PROMPT * len(params), params):
            for i, token in enumerate(out.token_ids):
                top = _penalised_logits(hf, PROMPT[0], out.token_ids[:i], params[0]).topk(2).indices.tolist()
                assert token in top, (out.token_ids, i)


def test_help_and_ides_still_see_every_field() -> None:
    import dataclasses
    import inspect

    assert list(inspect.signature(SamplingParams).parameters) == [f.name for f in dataclasses.fields(SamplingParams)]


def test_prompt_logprobs_are_the_targets_own_for_every_prompt_token(engines: list[Engine]) -> None:
    params = SamplingParams(max_tokens=4, ignore_eos=True, prompt_logprobs=3)
    with torch.no_grad():
        logp = torch.log_softmax(engines[0].target.lm.hf(torch.tensor(PROMPT)).logits[0].float(), dim=-1)
    for engine in engines:
        out = engine.generate(PROMPT, params)[0]
        scored = out.prompt_logprobs
        assert scored is not None and len(scored) == len(PROMPT[0]) and scored[0] is None
        for i, entry in enumerate(scored[1:]):
            assert entry.token_id == PROMPT[0][i + 1]
            assert abs(entry.logprob - float(logp[i, entry.token_id])) < 1e-4
            assert [t for t, _ in entry.top] == logp[i].topk(3).indices.tolist()
        assert out.token_ids == engines[0].generate(PROMPT, SamplingParams(max_tokens=4, ignore_eos=True))[0].token_ids
    assert engines[0].generate(PROMPT, SamplingParams(max_tokens=2))[0].prompt_logprobs is None
    long = [5 + (i * 7) % 90 for i in range(300)]  # past the 256 rows scored at a time
    with torch.no_grad():
        logp = torch.log_softmax(engines[0].target.lm.hf(torch.tensor([long])).logits[0].float(), dim=-1)
    scored = engines[0].generate([long], SamplingParams(max_tokens=1, prompt_logprobs=0))[0].prompt_logprobs
    assert max(abs(scored[i].logprob - float(logp[i - 1, long[i]])) for i in range(1, 300)) < 1e-4
    with pytest.raises(ValueError, match="SamplingParams.prompt_logprobs = 21 is invalid"):
        SamplingParams(prompt_logprobs=21)


def test_skip_special_tokens_false_writes_them_but_not_the_token_that_ended_the_output(engines: list[Engine]) -> None:
    tok = engines[0].tokenizer
    start, eos = tok.convert_tokens_to_ids("<|im_start|>"), tok.eos_token_id
    ask = dict(max_tokens=40, temperature=1.0, seed=0, logit_bias={start: 3.0, eos: 2.0})
    out = _all(engines[:1], SamplingParams(**ask, skip_special_tokens=False))[0]
    hidden = engines[0].generate(PROMPT, SamplingParams(**ask))[0]
    assert out.token_ids == hidden.token_ids and start in out.token_ids[:-1] and out.finish_reason == "stop"
    assert out.token_ids[-1] == eos  # seeded: special tokens in the middle, and EOS ends it
    assert out.text == tok.decode(out.token_ids[:-1], skip_special_tokens=False)
    assert "<|im_start|>" in out.text and "<|im_start|>" not in hidden.text and "</s>" not in out.text
    kept = engines[0].generate(PROMPT, SamplingParams(**ask, skip_special_tokens=False,
                                                      include_stop_str_in_output=True))[0]
    assert kept.text == out.text + " </s>"
    streamed = list(engines[0].generate_stream(PROMPT[0], SamplingParams(**ask, skip_special_tokens=False)))
    assert streamed[-1].completion.text == out.text
