"""The native Llama-family forward matches transformers' own model, family by family (float32)."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    Gemma2Config, Gemma2ForCausalLM, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
    Qwen2Config, Qwen2ForCausalLM,
)

from specsure.models import CausalLM
from specsure.models.native import unsupported

SHAPE = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256)
FAMILIES = {
    "llama": (LlamaForCausalLM, LlamaConfig(**SHAPE)),
    "llama-biased": (LlamaForCausalLM, LlamaConfig(**SHAPE, attention_bias=True)),
    "llama-rope-scaled": (LlamaForCausalLM, LlamaConfig(**SHAPE, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64})),
    "mistral": (MistralForCausalLM, MistralConfig(**SHAPE, sliding_window=None)),
    "qwen2": (Qwen2ForCausalLM, Qwen2Config(**SHAPE, tie_word_embeddings=True)),
}


def _model(cls, config, seed: int = 0):
    torch.manual_seed(seed)
    hf = cls(config).eval()
    with torch.no_grad():  # larger weights than the default init, so differences are visible
        for p in hf.parameters():
            p.normal_(0.0, 0.3)
    return hf


@pytest.mark.parametrize("family", FAMILIES)
def test_native_logits_match_the_models_own_forward(family):
    cls, config = FAMILIES[family]
    hf = _model(cls, config)
    ids = torch.randint(0, SHAPE["vocab_size"], (20,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(ids[None]).logits[0]  # [20, vocab], before CausalLM fuses the weights
    lm = CausalLM(hf)
    assert lm.path.startswith("native")
    # Prefill in two chunks, then single tokens: every cache shape the engine uses.
    got = torch.cat([lm.forward(ids[:7].tolist()).logits, lm.forward(ids[7:16].tolist()).logits,
                     *(lm.forward([t]).logits for t in ids[16:].tolist())])
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    # The modules keep views of the fused weights, so transformers' own forward still agrees.
    with torch.no_grad():
        torch.testing.assert_close(hf(ids[None]).logits[0], expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_rollback_and_aux_layers_match_transformers(family):
    cls, config = FAMILIES[family]
    native, plain = CausalLM(_model(cls, config)), CausalLM(_model(cls, config), native=False)
    assert native.path.startswith("native") and plain.path.startswith("transformers")
    ids = [5, 17, 3, 88, 42, 9, 61, 2, 30, 7]
    layers = (2, 0)
    a = native.forward(ids, hidden=True, aux_layers=layers)
    b = plain.forward(ids, hidden=True, aux_layers=layers)
    torch.testing.assert_close(a.hidden, b.hidden, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(a.aux_hidden, b.aux_hidden, atol=1e-4, rtol=1e-4)
    for lm in (native, plain):  # a rejected draft: 4 tokens in, 3 rolled back
        lm.forward([11, 12, 13, 14])
        lm.crop(len(ids) + 1)
    torch.testing.assert_close(native.forward([50, 51]).logits, plain.forward([50, 51]).logits, atol=1e-4, rtol=1e-4)
    assert native.cache_len == plain.cache_len == len(ids) + 3


def test_other_architectures_run_on_transformers_and_say_why():
    lm = CausalLM(_model(Gemma2ForCausalLM, Gemma2Config(**SHAPE, head_dim=8)))
    assert lm.path.startswith("transformers (") and "gemma2" in lm.path
    assert unsupported(MistralConfig(**SHAPE, sliding_window=16)) == "Mistral's sliding window is not implemented natively"
    assert unsupported(LlamaConfig(**SHAPE, hidden_act="gelu")) == "hidden_act 'gelu' is not silu"
    assert unsupported(LlamaConfig(**SHAPE)) is None
