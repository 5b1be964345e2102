"""Models with sliding windows and other attention variants, written by transformers' save_pretrained:
Gemma 2 with an exact GELU runs on transformers' own modules, Mistral with a window and Gemma 3 on the
native forward.

Token trees on models whose layers do not all attend to every earlier position (sliding windows), and on
models whose attention adds its mask to the scores (eager): the tree's mask must say what transformers'
own masks say, or a tree's greedy output leaves plain decoding's. Models whose layers keep a state
beyond the KV cache are refused when they load."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from specsure import SamplingParams, make_engine

SHAPE = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=512, bos_token_id=None, eos_token_id=None,
             pad_token_id=None, tie_word_embeddings=False)
MODELS = {  # sliding_window 8, so the prompts below reach past it
    "mistral, every layer slides": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 8}),
    # exact GELU, which the native forward does not run: transformers' own (eager) modules do
    "gemma2, alternating, eager attention": ("Gemma2Config", "Gemma2ForCausalLM", {
        "sliding_window": 8, "final_logit_softcapping": 3.0, "attn_logit_softcapping": 5.0, "hidden_activation": "gelu"}),
    "gemma3, per-layer types": ("Gemma3TextConfig", "Gemma3ForCausalLM", {
        "sliding_window": 8, "num_hidden_layers": 3,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention"]}),
}


def _write(folder: Path, config: str, model: str, extra: dict) -> Path:
    cfg = getattr(transformers, config)(**{**SHAPE, **extra})
    cfg.architectures = [model]
    torch.manual_seed(0)
    hf = getattr(transformers, model)(cfg)
    with torch.no_grad():  # peaked logits, so greedy picks are far from ties
        for name, p in hf.named_parameters():
            p.normal_(0.0, 0.2 if p.dim() > 1 else 0.1)
    hf.save_pretrained(folder)
    return folder


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(7)
    out = []
    for _ in range(4):  # one motif followed by different continuations: prompt lookup finds several branches
        motif = torch.randint(3, 256, (3,), generator=gen).tolist()
        ids: list[int] = []
        for _ in range(8):
            ids += motif + torch.randint(3, 256, (4,), generator=gen).tolist()
        out.append(ids + motif)
    return out


@pytest.mark.parametrize("name", list(MODELS))
def test_an_ngram_tree_decodes_as_plain_on_sliding_and_eager_models(tmp_path: Path, name: str) -> None:
    target = str(_write(tmp_path / "model", *MODELS[name]))
    plain = make_engine(target, None, dtype="float32")
    tree = make_engine(target, {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
                                "prompt_lookup_max": 3, "prompt_lookup_branches": 4}, dtype="float32")
    params = SamplingParams(max_tokens=24, ignore_eos=True, logprobs=0)
    for prompt in _prompts():
        want, got = plain.generate(prompt, params)[0], tree.generate(prompt, params)[0]
        assert got.token_ids == want.token_ids
        assert max(abs(a.logprob - b.logprob) for a, b in zip(got.logprobs, want.logprobs)) < 1e-4
    assert tree.stats.draft_tokens > tree.stats.drafts > 0  # trees of several nodes were verified


@pytest.mark.parametrize(("config", "model", "extra", "says"), [
    ("MambaConfig", "MambaForCausalLM", {"state_size": 8}, "a decode or verify step with specsure's KV cache fails"),
    ("RwkvConfig", "RwkvForCausalLM", {"context_length": 512, "attention_hidden_size": 64},
     "gets other logits than with them in one forward"),
])
def test_a_model_with_recurrent_state_is_refused_at_load(tmp_path: Path, config: str, model: str, extra: dict,
                                                        says: str) -> None:
    """Its state is not in the rollback KV cache: decoding would crash (Mamba) or silently drop it (RWKV)."""
    from specsure.models import ModelLoadError, load_model

    fields = {k: v for k, v in SHAPE.items() if k not in ("num_key_value_heads", "head_dim")}
    cfg = getattr(transformers, config)(**{**fields, **extra})
    cfg.architectures = [model]
    torch.manual_seed(0)
    getattr(transformers, model)(cfg).save_pretrained(tmp_path / "model")
    with pytest.raises(ModelLoadError, match=f"{model} .*{says}.*recurrent, convolutional or linear-attention"):
        load_model(str(tmp_path / "model"), dtype="float32")


def test_a_model_without_a_separate_base_model_is_a_load_error(tmp_path: Path) -> None:
    from specsure.models import ModelLoadError, load_model

    cfg = transformers.Llama4TextConfig(**SHAPE)
    cfg.architectures = ["Llama4ForCausalLM"]
    torch.manual_seed(0)
    transformers.Llama4ForCausalLM(cfg).save_pretrained(tmp_path / "model")
    with pytest.raises(ModelLoadError, match=r"Llama4ForCausalLM \(model_type 'llama4_text'\) does not expose its "
                                             r"decoder as a base model.*not supported yet"):
        load_model(str(tmp_path / "model"), dtype="float32")


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_a_heads_tree_decodes_as_plain_on_a_sliding_window_target(tmp_path: Path, method: str) -> None:
    from heads import write_eagle3_head, write_eagle_head

    config, model, extra = MODELS["gemma3, per-layer types"]
    target = _write(tmp_path / "model", config, model, {**extra, "num_hidden_layers": 4, "layer_types": [
        "sliding_attention", "sliding_attention", "sliding_attention", "full_attention"]})
    head = (write_eagle3_head if method == "eagle3" else write_eagle_head)(tmp_path / "head", target)
    plain = make_engine(str(target), None, dtype="float32")
    tree = make_engine(str(target), {"method": method, "model": str(head),
                                     "speculative_token_tree": "[(0,), (1,), (0, 0), (2,)]"}, dtype="float32")
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    for prompt in _prompts()[:2]:
        assert tree.generate(prompt, params)[0].token_ids == plain.generate(prompt, params)[0].token_ids
    assert tree.stats.draft_tokens > tree.stats.drafts > 0


def test_aux_id_n_on_transformers_modules_is_the_stream_before_the_final_norm(tmp_path):
    """transformers' hidden_states[N] is already normed; EAGLE-3's id N (vLLM's) is the stream the norm reads."""
    from specsure.models import load_model

    config, model, extra = MODELS["gemma2, alternating, eager attention"]
    lm = load_model(str(_write(tmp_path / "m", config, model, extra)), "float32").lm
    assert lm._native is None  # transformers' own modules run it
    ids = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38]
    with torch.inference_mode():
        states = lm.hf(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
        lm.forward(ids[:6])
        out = lm.forward(ids[6:], hidden=True, aux_layers=(1, 2))
        first, last = out.aux_hidden.split(lm.hidden_size, dim=-1)
        torch.testing.assert_close(first, states[1][0, 6:], atol=1e-5, rtol=0)
        torch.testing.assert_close(lm.hf.base_model.norm(last), out.hidden, atol=1e-5, rtol=0)
        assert not torch.allclose(last, out.hidden, atol=1e-3)


@pytest.mark.parametrize(("config", "model", "extra", "norm"), [
    ("GPT2Config", "GPT2LMHeadModel", dict(vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=512), "ln_f"),
    ("OPTConfig", "OPTForCausalLM", dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                         ffn_dim=128, max_position_embeddings=512, word_embed_proj_dim=64),
     "decoder.final_layer_norm"),
])
def test_aux_id_n_finds_a_final_norm_of_another_name(tmp_path, config, model, extra, norm):
    """GPT-2 calls its final norm ln_f, OPT decoder.final_layer_norm: id N is the stream entering it there too."""
    from specsure.models import load_model

    cfg = getattr(transformers, config)(**extra)
    cfg.architectures = [model]
    torch.manual_seed(0)
    getattr(transformers, model)(cfg).save_pretrained(tmp_path / "m")
    lm = load_model(str(tmp_path / "m"), "float32").lm
    assert lm._native is None and lm.reads_last_output
    final = lm.hf.base_model
    for part in norm.split("."):
        final = getattr(final, part)
    with torch.inference_mode():
        out = lm.forward([3, 14, 15, 92, 65], hidden=True, aux_layers=(0, 2))
        torch.testing.assert_close(final(out.aux_hidden[:, 64:]), out.hidden, atol=1e-5, rtol=0)


def test_a_bidirectional_gemma3_is_refused_for_its_attention_not_for_a_state(tmp_path: Path) -> None:
    from specsure.models import ModelLoadError, load_model

    config, model, extra = MODELS["gemma3, per-layer types"]
    folder = _write(tmp_path / "bidirectional", config, model, {**extra, "use_bidirectional_attention": True})
    with pytest.raises(ModelLoadError) as err:
        load_model(str(folder), dtype="float32")
    assert "its config sets use_bidirectional_attention, so each token attends to the tokens after it" in str(err.value)
