"""The rotary table gives the rotary module's own bits, for every position it grows to."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from specsure.models.rotary_table import FIRST_BLOCK, RotaryTable


def _rotary(**rope: object) -> LlamaRotaryEmbedding:
    config = LlamaConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=2048, rope_theta=100000.0,
                         **({"rope_scaling": rope} if rope else {}))
    return LlamaRotaryEmbedding(config)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rope", [{}, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 1024}])
def test_table_rows_are_the_modules_bits(dtype: torch.dtype, rope: dict) -> None:
    module = _rotary(**rope)
    table = RotaryTable(module)
    x = torch.zeros(1, 3, 64, dtype=dtype)
    for positions in ([0], [5, 6, 7], [FIRST_BLOCK - 1, FIRST_BLOCK], [3 * FIRST_BLOCK + 17], [40, 41], [9, 10, 10, 11]):
        given = torch.tensor([positions])
        want, got = module(x, given), table(x, given)
        for w, g in zip(want, got):
            assert g.dtype == w.dtype == dtype and g.shape == w.shape
            assert torch.equal(g, w), positions


LONGROPE = {"rope_type": "longrope", "original_max_position_embeddings": 1024,
            "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 3.0, 5.0, 8.0], "long_factor": [1.0, 2.0, 4.0, 8.0, 12.0, 16.0, 24.0, 32.0]}


@pytest.mark.parametrize("rope", [LONGROPE, {"rope_type": "dynamic", "factor": 2.0}], ids=["longrope", "dynamic"])
def test_a_varying_rope_turns_each_position_as_the_newest_of_its_sequence(rope: dict) -> None:
    """transformers' module picks a varying RoPE's frequencies for a whole call from its largest position,
    so a row would turn by which rows share its forward; the table's row for position p is the module's
    for a sequence that ends at p (short factors within the trained context, long past it; dynamic NTK
    for p + 1 positions), whatever else the call holds."""
    module, fresh = _rotary(**rope), _rotary(**rope)
    table = RotaryTable(module)
    x = torch.zeros(1, 1, 64)
    for position in (0, 1023, 1024, 2047, 2048, 2100):
        fresh(x, torch.tensor([[0]]))  # a sequence that starts again: the trained frequencies
        want = fresh(x, torch.tensor([[position]]))
        alone = table(x, torch.tensor([[position]]))
        beside = table(x, torch.tensor([[position, 2500]]))  # a later row in the same call changes nothing
        for w, a, b in zip(want, alone, beside):
            assert torch.equal(a[0, 0], w[0, 0]) and torch.equal(b[0, 0], w[0, 0]), position
    short = _rotary(**rope)(x, torch.tensor([[5]]))
    long = _rotary(**rope)(x, torch.tensor([[5, 2500]]))
    assert not torch.equal(short[0][0, 0], long[0][0, 1 - 1])  # what the module alone would have done


def test_table_tensors_take_part_in_training() -> None:
    table = RotaryTable(_rotary())
    with torch.inference_mode():  # the table is first made where the engine runs
        table(torch.zeros(1, 1, 64), torch.tensor([[3]]))
    q = torch.randn(1, 2, 16, requires_grad=True)  # head_dim 64 / 4
    cos, sin = table(q, torch.tensor([[1, 2]]))
    (q * cos + q * sin).sum().backward()  # inference tensors could not be saved for backward
    assert q.grad is not None


def test_transformers_own_layers_turn_a_varying_rope_by_position_too() -> None:
    """A model on transformers' modules (native=False here) gets the table in place of its rotary module:
    the rows past the trained context turn alike whether the call that holds them starts before it."""
    from transformers import Phi3Config, Phi3ForCausalLM

    from specsure.models import CausalLM

    config = Phi3Config(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                        pad_token_id=None, max_position_embeddings=256, original_max_position_embeddings=32,
                        rope_parameters={"rope_theta": 1e4, **{k: v for k, v in LONGROPE.items() if "factor" in k},
                                         "rope_type": "longrope"})
    torch.manual_seed(0)
    hf = Phi3ForCausalLM(config).eval()
    lm = CausalLM(hf, native=False)
    assert lm.path.startswith("transformers") and "turns each position by its own" in lm.path
    ids = [(7 * i) % 90 + 3 for i in range(40)]
    whole = lm.forward(ids).logits
    lm.crop(0)
    parts = torch.cat([lm.forward(ids[:30]).logits, lm.forward(ids[30:]).logits])
    torch.testing.assert_close(parts, whole, atol=1e-4, rtol=1e-4)


def test_a_dynamic_rope_runs_past_max_position_embeddings_and_speculation_equals_plain(tmp_path) -> None:  # noqa: ANN001
    """Dynamic NTK stretches the frequencies as the sequence grows past max_position_embeddings (48 here), so
    the context is 48 x its factor, as vLLM derives it; past 48 each position turns by its own length, and
    drafts verified there are accepted as plain decoding would choose."""
    from specsure import SamplingParams, make_engine
    from tiny import build_tiny_llama

    folder = build_tiny_llama(tmp_path / "dynamic", vocab_size=96, hidden_size=64, num_layers=2,
                              extra_config={"max_position_embeddings": 48,
                                            "rope_scaling": {"rope_type": "dynamic", "factor": 4.0}})
    plain = make_engine(str(folder), None, dtype="float32")
    assert plain.target.lm.max_context == 192
    prompt = [(7 * i) % 90 + 3 for i in range(40)]
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    expected = plain.generate(prompt, params)[0].token_ids
    for spec in ({"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 1, "prompt_lookup_max": 2},
                 {"method": "draft_model", "model": str(folder), "num_speculative_tokens": 4}):
        engine = make_engine(str(folder), spec, dtype="float32")
        assert engine.generate(prompt, params)[0].token_ids == expected, spec["method"]
        assert engine.stats.drafts > 0
