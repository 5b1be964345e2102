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


def test_a_dynamic_rope_calls_the_module() -> None:
    module = _rotary(rope_type="dynamic", factor=2.0)
    table = RotaryTable(module)
    x = torch.zeros(1, 1, 64)
    far = torch.tensor([[5000]])  # past the trained context: dynamic NTK rescales the frequencies
    assert all(torch.equal(a, b) for a, b in zip(table(x, far), module(x, far)))
    assert not table._tables  # nothing tabulated


def test_table_tensors_take_part_in_training() -> None:
    table = RotaryTable(_rotary())
    with torch.inference_mode():  # the table is first made where the engine runs
        table(torch.zeros(1, 1, 64), torch.tensor([[3]]))
    q = torch.randn(1, 2, 16, requires_grad=True)  # head_dim 64 / 4
    cos, sin = table(q, torch.tensor([[1, 2]]))
    (q * cos + q * sin).sum().backward()  # inference tensors could not be saved for backward
    assert q.grad is not None
