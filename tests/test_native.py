"""The native Llama-family forward matches transformers' own model, family by family (float32)."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    Gemma2Config, Gemma2ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM,
    MistralConfig, MistralForCausalLM, Phi3Config, Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM,
)

from specsure.models import CausalLM
from specsure.models.decoder_family import unsupported
from specsure.models.products import KERNEL_ROWS, project
from specsure.models import float_kernel as float_kernels
from specsure.models.token_tree import TokenTree
from tiny import gemma_families
from trees import TREE, node_paths

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
    "qwen3": (Qwen3ForCausalLM, Qwen3Config(**SHAPE, head_dim=8)),  # per-head q and k norms
    "mistral-window": (MistralForCausalLM, MistralConfig(**SHAPE, sliding_window=5)),
    # q|k|v and gate|up fused in the checkpoint, every layer windowed (Phi-3-mini-4k's sliding_window)
    "phi3-window": (Phi3ForCausalLM, Phi3Config(**SHAPE, sliding_window=5, pad_token_id=None)),
    # Phi-3.5-mini's LongRoPE: per-frequency factors and an attention factor on cos and sin
    "phi3-longrope": (Phi3ForCausalLM, Phi3Config(**SHAPE, pad_token_id=None, original_max_position_embeddings=64,
                                                  rope_parameters={"rope_type": "longrope", "rope_theta": 1e4,
                                                                   "short_factor": [1.0, 1.5, 3.0, 7.0],
                                                                   "long_factor": [1.0, 2.0, 9.0, 30.0]})),
    # Phi-4-mini's partial rotary: RoPE turns the first 3/4 of each head (6 of 8 dims here), LongRoPE too
    "phi4-mini": (Phi3ForCausalLM, Phi3Config(**SHAPE, pad_token_id=None, original_max_position_embeddings=64,
                                              rope_parameters={"rope_type": "longrope", "rope_theta": 1e4,
                                                               "partial_rotary_factor": 0.75,
                                                               "short_factor": [1.0, 2.0, 4.0],
                                                               "long_factor": [1.0, 3.0, 9.0]})),
    **gemma_families(SHAPE, head_dim=8),
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


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral-window", "phi3-window", "phi4-mini",
                                    "gemma2", "gemma3"])
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
    lm = CausalLM(_model(Gemma2ForCausalLM, Gemma2Config(**SHAPE, head_dim=8, hidden_activation="gelu")))
    assert lm.path.startswith("transformers (") and "hidden_activation 'gelu' is not gelu_pytorch_tanh" in lm.path
    gemma = dict(SHAPE, head_dim=8, layer_types=["sliding_attention", "full_attention", "sliding_attention"])
    assert unsupported(Gemma3TextConfig(**gemma, hidden_activation="gelu")) == \
        "hidden_activation 'gelu' is not gelu_pytorch_tanh"
    assert unsupported(Gemma3TextConfig(**gemma)) is None
    assert unsupported(MistralConfig(**SHAPE, sliding_window=16)) is None
    assert unsupported(LlamaConfig(**SHAPE, hidden_act="gelu")) == "hidden_act 'gelu' is not silu"
    assert unsupported(LlamaConfig(**SHAPE)) is None


# --- token trees: one forward over several candidate continuations, then the accepted path kept ---

TREE_IDS = [7, 21, 33, 45, 60, 71, 84]


@pytest.mark.parametrize("native", [True, False], ids=["native", "transformers"])
def test_each_tree_node_sees_exactly_its_path(native):
    cls, config = FAMILIES["llama"]
    lm, ref = CausalLM(_model(cls, config), native=native), CausalLM(_model(cls, config), native=native)
    prefix = [3, 14, 15, 92, 65]
    lm.forward(prefix)
    tree = TokenTree.from_parents(TREE)
    got = lm.forward(TREE_IDS, tree=tree).logits  # [7, vocab]
    for node, path in enumerate(node_paths(TREE)):  # each node's logits equal a plain forward over its own path
        ref.reset()
        ids = [TREE_IDS[i] for i in path]
        torch.testing.assert_close(got[node], ref.forward(prefix + ids).logits[-1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("native", [True, False], ids=["native", "transformers"])
@pytest.mark.parametrize("path", [(0, 3, 5, 6), (0, 1, 2), (0,)], ids=["moved", "in-place", "root"])
def test_keeping_the_accepted_path_leaves_the_cache_as_if_only_it_was_fed(native, path):
    """A path scattered through the tree is moved into place; one that is the first nodes fed
    (root -> 1 -> 2) is already there and only the rest is dropped."""
    cls, config = FAMILIES["qwen2"]
    lm, ref = CausalLM(_model(cls, config), native=native), CausalLM(_model(cls, config), native=native)
    prefix = [3, 14, 15, 92, 65]
    lm.forward(prefix)
    lm.forward(TREE_IDS, tree=TokenTree.from_parents(TREE))
    lm.keep(len(prefix), list(path))
    assert lm.cache_len == len(prefix) + len(path)
    ref.forward(prefix + [TREE_IDS[i] for i in path])
    torch.testing.assert_close(lm.forward([9, 10]).logits, ref.forward([9, 10]).logits, atol=1e-4, rtol=1e-4)


def test_malformed_trees_and_paths_are_refused():
    with pytest.raises(ValueError, match="not a tree in order"):
        TokenTree.from_parents([0, 0])
    with pytest.raises(ValueError, match="not a tree in order"):
        TokenTree.from_parents([-1, 2, 0])
    cls, config = FAMILIES["llama"]
    lm = CausalLM(_model(cls, config))
    lm.forward([1, 2, 3])
    with pytest.raises(ValueError, match="ascending, distinct"):
        lm.keep(1, [1, 0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 13, KERNEL_ROWS, KERNEL_ROWS + 1])
@pytest.mark.parametrize("c_kernel", [True, False], ids=["c-kernel", "torch"])
def test_project_is_f_linear_for_every_row_count(dtype: torch.dtype, rows: int, c_kernel: bool, monkeypatch) -> None:
    """Each way `project` takes (the float32 C kernel; without it mv, weight @ x.T padded or not,
    F.linear) computes x @ W.T + b, shaped [rows, out], row-major (the next product's fast layout)."""
    if not c_kernel:
        monkeypatch.setattr(float_kernels, "_loaded", (None, "off for this test"))
    gen = torch.Generator().manual_seed(rows)
    x, weight, bias = (torch.randn(*shape, generator=gen).to(dtype) for shape in ((rows, 48), (80, 48), (80,)))
    for b in (None, bias):
        got = project(x, weight, b)
        want = torch.nn.functional.linear(x.float(), weight.float(), None if b is None else b.float())
        assert got.shape == (rows, 80) and got.dtype == dtype and got.is_contiguous()
        tol = 1e-5 if dtype == torch.float32 else 5e-2
        torch.testing.assert_close(got.float(), want, atol=tol * float(want.abs().max()), rtol=0)
    if dtype == torch.bfloat16 and rows > 1:  # bf16 keeps F.linear's own arithmetic, bit for bit
        assert torch.equal(project(x, weight, bias), torch.nn.functional.linear(x, weight, bias))


def test_a_vision_language_gemma3_runs_its_text_decoder_natively(tmp_path) -> None:  # noqa: ANN001
    """Gemma 3 4B and up ship as Gemma3ForConditionalGeneration, the text decoder its language_model: text
    requests run that natively, as transformers' own model decodes them."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    from specsure import SamplingParams, make_engine

    text = dict(SHAPE, vocab_size=300, head_dim=8, query_pre_attn_scalar=8, sliding_window=4)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    hf = _model(Gemma3ForConditionalGeneration, Gemma3Config(
        text_config=text, vision_config=vision, mm_tokens_per_image=4, image_token_index=299, boi_token_index=297,
        eoi_token_index=298))
    with torch.no_grad():
        hf.get_input_embeddings().weight.normal_(0.0, 0.03)  # scaled by sqrt(hidden) on the way in
    hf.save_pretrained(tmp_path / "vlm")
    prompt = [5, 70, 71, 72, 80, 81, 90, 91, 92, 100, 5, 70, 33, 44, 55]
    with torch.no_grad():
        expected = hf.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False)[0, len(prompt):].tolist()
    engine = make_engine(str(tmp_path / "vlm"), None, dtype="float32")
    assert engine.target.lm.path.startswith("native")
    assert engine.generate(prompt, SamplingParams(max_tokens=16, ignore_eos=True))[0].token_ids == expected
