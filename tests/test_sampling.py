"""SamplingParams validation and the logits -> probs transform."""

from __future__ import annotations

import math

import pytest
import torch

from specsure.sampling import SamplingParams, argmax_ids, draw, probs_from_logits, sample


# --- SamplingParams validation: one case per bad value, asserting on the message -------------

@pytest.mark.parametrize(
    ("kwargs", "fragments"),
    [
        ({"max_tokens": 0}, ["SamplingParams.max_tokens = 0", "int >= 1", "max_tokens=16"]),
        ({"max_tokens": -3}, ["SamplingParams.max_tokens = -3", "int >= 1"]),
        ({"max_tokens": 2.0}, ["SamplingParams.max_tokens = 2.0", "int >= 1"]),
        ({"max_tokens": True}, ["SamplingParams.max_tokens = True", "int >= 1"]),
        ({"temperature": -0.1}, ["SamplingParams.temperature = -0.1", "finite number >= 0", "use 0 for greedy"]),
        ({"temperature": math.inf}, ["SamplingParams.temperature = inf", "finite"]),
        ({"temperature": math.nan}, ["SamplingParams.temperature = nan", "finite"]),
        ({"temperature": "0.7"}, ["SamplingParams.temperature = '0.7'", "finite number"]),
        ({"temperature": False}, ["SamplingParams.temperature = False", "finite number"]),
        ({"top_p": 1.5}, ["SamplingParams.top_p = 1.5 is out of range: it must be in (0, 1]",
                          "use 1.0 to disable nucleus sampling"]),
        ({"top_p": 0.0}, ["SamplingParams.top_p = 0.0", "(0, 1]"]),
        ({"top_p": math.nan}, ["SamplingParams.top_p = nan", "(0, 1]"]),
        ({"top_k": -2}, ["SamplingParams.top_k = -2", "int >= 0, or -1", "use 0 (or -1) to disable top-k"]),
        ({"top_k": 5.0}, ["SamplingParams.top_k = 5.0", "int >= 0"]),
        ({"top_k": True}, ["SamplingParams.top_k = True", "int >= 0"]),
        ({"seed": -(2**63) - 1}, ["SamplingParams.seed = -9223372036854775809", "[-2**63, 2**64)", "use None (or -1)"]),
        ({"seed": 2**64}, ["SamplingParams.seed = 18446744073709551616", "[-2**63, 2**64)"]),
        ({"seed": 1.0}, ["SamplingParams.seed = 1.0", "None or an int"]),
        ({"seed": True}, ["SamplingParams.seed = True", "None or an int"]),
        ({"stop": ""}, ["SamplingParams.stop = ''", "non-empty str"]),
        ({"stop": ["a", ""]}, ["SamplingParams.stop = ['a', '']", "non-empty str"]),
        ({"stop": ["a", 3]}, ["SamplingParams.stop = ['a', 3]", "non-empty str"]),
        ({"stop": 5}, ["SamplingParams.stop = 5", "None, a str, or a list of str"]),
        ({"ignore_eos": 1}, ["SamplingParams.ignore_eos = 1", "bool"]),
    ],
)
def test_bad_value_is_rejected_with_a_helpful_message(kwargs, fragments):
    with pytest.raises(ValueError) as info:
        SamplingParams(**kwargs)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_vllms_spelling_of_no_top_k_is_no_top_k():
    assert SamplingParams(top_k=-1) == SamplingParams(top_k=0)


@pytest.mark.parametrize(("name", "fragment"), [
    ("n", "pass the prompt n times"), ("best_of", "vLLM has it"), ("guided_decoding", "give structured_outputs"),
    ("use_beam_search", "vLLM has it"),
    ("temprature", "Did you mean 'temperature'?"),
    ("stop_strings", "transformers' generate() name; specsure takes vLLM's, 'stop'"),
    ("max_new_tokens", "vLLM's, 'max_tokens'"), ("do_sample", "'temperature' (0 is greedy"),
    ("num_return_sequences", "transformers' name for vLLM's 'n'"),
])
def test_a_field_specsure_lacks_is_named_with_what_to_do(name: str, fragment: str):
    with pytest.raises(TypeError, match=f"SamplingParams has no field {name!r}") as info:
        SamplingParams(**{name: 1})
    assert fragment in str(info.value)


def test_defaults_are_greedy_and_valid():
    params = SamplingParams()
    assert params.greedy
    assert (params.max_tokens, params.top_p, params.top_k, params.seed, params.stop) == (16, 1.0, 0, None, None)
    assert not SamplingParams(temperature=0.5).greedy


@pytest.mark.parametrize(
    ("stop", "expected"),
    [("\n", ("\n",)), (["a", "b"], ("a", "b")), (("x",), ("x",)), ([], None), (None, None)],
)
def test_stop_is_normalised_to_a_tuple(stop, expected):
    assert SamplingParams(stop=stop).stop == expected


def test_params_are_frozen_and_hashable():
    params = SamplingParams(stop=["a"])
    with pytest.raises(AttributeError):
        params.top_k = 3  # type: ignore[misc]
    assert hash(params) == hash(SamplingParams(stop=("a",)))


# --- probs_from_logits ------------------------------------------------------------------------

LOGITS = torch.tensor([[2.0, 1.0, 0.5, 3.0, -1.0, 0.0]])  # sorted ids: 3, 0, 1, 2, 5, 4


def test_greedy_gives_a_one_hot_at_the_argmax():
    probs = probs_from_logits(LOGITS, SamplingParams(temperature=0.0, top_k=2))
    assert probs.dtype == torch.float32
    assert torch.equal(probs, torch.tensor([[0.0, 0, 0, 1, 0, 0]]))


def test_temperature_only_is_the_tempered_softmax():
    probs = probs_from_logits(LOGITS.double(), SamplingParams(temperature=0.7))
    assert probs.dtype == torch.float32
    torch.testing.assert_close(probs, torch.softmax(LOGITS / 0.7, dim=-1))


def test_top_k_keeps_exactly_k_tokens_renormalised():
    probs = probs_from_logits(LOGITS, SamplingParams(temperature=1.0, top_k=2))
    expected = torch.zeros(1, 6)
    expected[0, [3, 0]] = torch.softmax(torch.tensor([3.0, 2.0]), dim=-1)
    torch.testing.assert_close(probs, expected)


def test_top_k_at_least_the_vocabulary_is_a_no_op():
    params = SamplingParams(temperature=1.0, top_k=6)
    torch.testing.assert_close(probs_from_logits(LOGITS, params), torch.softmax(LOGITS, dim=-1))


def test_top_p_keeps_the_smallest_set_reaching_the_mass():
    probs = torch.tensor([[0.1, 0.4, 0.05, 0.3, 0.15]])
    logits = probs.log()
    # Sorted: 0.4, 0.3, 0.15, 0.1, 0.05. Mass 0.7 needs {1, 3}; 0.71 needs {1, 3, 4}.
    out = probs_from_logits(logits, SamplingParams(temperature=1.0, top_p=0.7))
    torch.testing.assert_close(out, torch.tensor([[0.0, 0.4 / 0.7, 0.0, 0.3 / 0.7, 0.0]]))
    out = probs_from_logits(logits, SamplingParams(temperature=1.0, top_p=0.71))
    torch.testing.assert_close(out, torch.tensor([[0.0, 0.4, 0.0, 0.3, 0.15]]) / 0.85)


def test_tiny_top_p_still_keeps_the_top_token():
    out = probs_from_logits(LOGITS, SamplingParams(temperature=2.0, top_p=1e-6))
    assert torch.equal(out, torch.tensor([[0.0, 0, 0, 1, 0, 0]]))


def test_top_p_applies_to_the_top_k_renormalised_distribution():
    # After top-k=3 the mass is on ids 3, 0, 1; top-p is then measured within those three.
    params = SamplingParams(temperature=1.0, top_k=3, top_p=0.8)
    out = probs_from_logits(LOGITS, params)
    top3 = torch.softmax(torch.tensor([3.0, 2.0, 1.0]), dim=-1)  # 0.665, 0.245, 0.090
    expected = torch.zeros(1, 6)
    expected[0, [3, 0]] = top3[:2] / top3[:2].sum()
    torch.testing.assert_close(out, expected)


def test_rows_are_transformed_independently():
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(temperature=0.8, top_k=10, top_p=0.9)
    batched = probs_from_logits(logits, params)
    for row in range(5):
        torch.testing.assert_close(batched[row], probs_from_logits(logits[row : row + 1], params)[0])
    torch.testing.assert_close(batched.sum(-1), torch.ones(5))
    assert ((batched > 0).sum(-1) <= 10).all()


# --- sample -----------------------------------------------------------------------------------

def test_sample_is_deterministic_for_a_seeded_generator():
    probs = torch.softmax(torch.randn(4, 100, generator=torch.Generator().manual_seed(1)), dim=-1)
    first = sample(probs, torch.Generator().manual_seed(7))
    second = sample(probs, torch.Generator().manual_seed(7))
    assert first.shape == (4,) and first.dtype == torch.int64
    assert torch.equal(first, second)
    single = sample(probs[0], torch.Generator().manual_seed(7))
    assert single.shape == ()


def test_sample_never_picks_a_zero_probability_token():
    probs = torch.tensor([0.0, 0.5, 0.0, 0.5]).expand(2000, 4)
    ids = sample(probs, torch.Generator().manual_seed(0))
    assert set(ids.tolist()) == {1, 3}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_argmax_ids_is_torch_argmax_ties_nan_and_inf_included(dtype):
    gen = torch.Generator().manual_seed(0)
    rows = torch.randint(-3, 4, (64, 50), generator=gen).to(dtype)  # small integers: many tied maxima
    rows[5, 7] = rows[5, 30] = math.nan  # the first NaN wins, as in torch
    rows[9] = -math.inf
    rows[11, [2, 40]] = math.inf
    assert argmax_ids(rows) == rows.argmax(-1).tolist()
    assert argmax_ids(rows[5]) == [7] and argmax_ids(rows[9]) == [0] and argmax_ids(rows[11]) == [2]
    assert argmax_ids(rows[20]) == [int(rows[20].argmax())]
    with torch.inference_mode():  # the engine's tensors
        assert argmax_ids(rows[:3] * 1) == rows[:3].argmax(-1).tolist()


def test_draw_is_argmax_when_greedy_and_a_sample_from_the_transform_otherwise():
    logits = torch.randn(50, generator=torch.Generator().manual_seed(1))
    assert draw(logits, SamplingParams(), None) == (int(logits.argmax()), None)
    params = SamplingParams(temperature=0.8, top_k=20, top_p=0.9)
    token, q = draw(logits, params, torch.Generator().manual_seed(3))
    assert torch.equal(q, probs_from_logits(logits, params))
    assert token == int(sample(q, torch.Generator().manual_seed(3)))
    assert q[token] > 0


@pytest.mark.parametrize("temperature", [1e-38, 1e-7])
def test_a_temperature_too_small_to_sample_with_is_refused(temperature):
    # Far below 1e-5, logits / temperature overflows float32 and multinomial fails on inf/nan.
    with pytest.raises(ValueError, match=r"SamplingParams.temperature = .* must be 0 or >= 1e-05.*use 0 for greedy"):
        SamplingParams(temperature=temperature)
    smallest = SamplingParams(temperature=1e-5)
    logits = 50 * torch.randn(20, generator=torch.Generator().manual_seed(0))
    assert draw(logits, smallest, torch.Generator().manual_seed(1))[0] == int(logits.argmax())


def test_numpy_scalars_are_numbers_and_stored_as_pythons() -> None:
    import numpy as np

    params = SamplingParams(max_tokens=np.int64(8), temperature=np.float32(0.5), top_p=np.float32(0.75),
                            top_k=np.int32(5), seed=np.uint64(3), logprobs=np.int8(2))
    assert (params.max_tokens, params.temperature, params.top_p, params.top_k, params.seed, params.logprobs) == \
        (8, 0.5, 0.75, 5, 3, 2)
    assert all(type(v) in (int, float) for v in (params.max_tokens, params.temperature, params.top_p, params.seed))
    # np.float64 is a float subclass, np.int64 in a list a token id, as in allowed_token_ids
    more = SamplingParams(max_tokens=4, temperature=np.float64(0.7), min_p=np.float64(0.1), min_tokens=np.int16(1),
                          repetition_penalty=np.float64(1.2), presence_penalty=np.float32(0.5),
                          stop_token_ids=[np.int64(5)])
    assert more.stop_token_ids == (5,) and type(more.stop_token_ids[0]) is int
    assert all(type(v) in (int, float) for v in (more.temperature, more.min_p, more.min_tokens,
                                                  more.repetition_penalty, more.presence_penalty))
    with pytest.raises(ValueError, match=r"top_p = '0\.9' is invalid: it must be a number in \(0, 1\]"):
        SamplingParams(top_p="0.9")
    with pytest.raises(ValueError, match="max_tokens = np.True_|max_tokens = True"):
        SamplingParams(max_tokens=np.bool_(True))


def test_seeds_are_read_as_vllm_reads_them_and_all_64_bits_count() -> None:
    """-1 is unseeded (vLLM, llama.cpp), another negative seed its two's complement; torch's CPU generator
    keeps 32 bits of a seed, so larger seeds are mixed into them rather than cut."""
    import torch

    from specsure.sampling import generator_seed

    assert SamplingParams(seed=-1).seed is None and SamplingParams(seed=-2).seed == 2**64 - 2
    assert SamplingParams(seed=2**64 - 1).seed == 2**64 - 1

    def first_draws(seed: int) -> list[float]:
        return torch.rand(4, generator=torch.Generator().manual_seed(generator_seed(seed))).tolist()

    assert generator_seed(12345) == 12345  # small seeds sample as they always did
    draws = [first_draws(s) for s in (0, 2**32, 2**33, 2**63, 2**64 - 1, 2**32 - 1)]
    assert len({tuple(d) for d in draws}) == len(draws)
    assert all(0 <= generator_seed(s) < 2**32 for s in (2**32, 2**40 + 7, 2**64 - 1))
