"""Drafting asks a head for its last row's logits only; they must be that row of the full logits."""

from __future__ import annotations

import pytest
import torch

from heads import write_eagle3_head, write_eagle_head, write_mtp_head
from specsure import make_engine
from specsure.proposers.head_layer import HeadCache
from tiny import build_tiny_llama


@pytest.mark.parametrize("method", ["eagle", "eagle3", "mtp"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_last_row_logits_are_the_full_logits_last_row(tmp_path, method: str, dtype: str) -> None:
    target = build_tiny_llama(tmp_path / "t", num_layers=3)
    writer = {"eagle": write_eagle_head, "eagle3": write_eagle3_head, "mtp": write_mtp_head}[method]
    head = writer(tmp_path / "h", target)
    engine = make_engine(str(target), {"method": method, "model": str(head), "num_speculative_tokens": 2}, dtype=dtype)
    module = engine.proposer.modules[0]
    width = engine.target.lm.hidden_size
    gen = torch.Generator().manual_seed(1)
    first, more = (torch.randn(n, width, generator=gen).to(getattr(torch, dtype)) for n in (5, 3))
    ids = torch.tensor([3, 9, 27, 8, 5]), torch.tensor([11, 13, 2])
    with torch.inference_mode():
        results = []
        for last in (False, True):
            cache = HeadCache()
            module(first, ids[0], cache, last=last)  # the prompt-length call, then a few rows (the kernel's, in bf16)
            results.append(module(more, ids[1], cache, last=last))
    (hidden, full), (hidden_last, last_row) = results
    assert full.shape[0] == 3 and last_row.shape[0] == 1
    assert torch.equal(hidden, hidden_last)
    # One row and several take different product kernels (mv against mm), which may round differently.
    scale = float(full.abs().max())
    torch.testing.assert_close(last_row, full[-1:], atol=(1e-5 if dtype == "float32" else 0.02) * scale, rtol=0)


def test_a_heads_float32_linears_take_the_few_row_products() -> None:
    """float32 inference rows go through `products.project` (row-major, padded where it pays); under
    autograd the layer is F.linear itself, bit for bit, so training is unchanged."""
    from specsure.proposers.head_layer import RowLinear, use_row_kernel

    layer = torch.nn.Sequential(torch.nn.Linear(48, 80))
    assert use_row_kernel(layer, None) == 1 and type(layer[0]) is RowLinear
    gen = torch.Generator().manual_seed(0)
    for rows in (1, 3, 6):
        x = torch.randn(1, rows, 48, generator=gen)
        want = torch.nn.functional.linear(x, layer[0].weight, layer[0].bias)
        with torch.inference_mode():
            got = layer(x)
        assert got.shape == (1, rows, 80)
        torch.testing.assert_close(got, want.detach(), atol=1e-5 * float(want.detach().abs().max()), rtol=0)
        assert torch.equal(layer(x), want)  # grad enabled: F.linear
