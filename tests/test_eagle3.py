"""eagle3: lossless drafting from EAGLE-3 heads in the public layouts, exact rollback, validation."""

from __future__ import annotations

import logging

import pytest
import torch
from heads import check_rollback, rms, write_eagle3_head, write_eagle_head
from stats import chi2, chi2_critical, second_token_marginal, tv

from specsure import ConfigError, SamplingParams, make_engine, resolve
from tiny import build_tiny_llama

PROMPT = [5, 6, 7, 8, 9]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return build_tiny_llama(tmp_path_factory.mktemp("t") / "target", num_layers=4)


def engine(target, head, k=3):
    return make_engine(str(target), {"method": "eagle3", "model": str(head), "num_speculative_tokens": k},
                       dtype="float32")


LAYOUTS = {
    "reduced vocab, d2t/t2d, midlayer.*": {"draft_vocab": 64},
    "same vocab, no d2t, layers.0.*, eagle_config ids": {"naming": "layers.0", "layer_ids": [0, 1, 3]},
    "own embed_tokens, Eagle3LlamaForCausalLM": {"draft_vocab": 100, "own_embed": True,
                                                 "arch": "Eagle3LlamaForCausalLM"},
    "norm_before_residual": {"draft_vocab": 64, "norm_before_residual": True},
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_greedy_output_equals_plain_decoding(target, tmp_path, layout):
    head = write_eagle3_head(tmp_path / "head", target, **LAYOUTS[layout])
    spec = engine(target, head)
    plain = make_engine(str(target), None, dtype="float32")
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    for prompt in (PROMPT, [3], [9, 9, 9, 9, 9, 9, 9, 9]):
        assert spec.generate(prompt, params)[0].token_ids == plain.generate(prompt, params)[0].token_ids
    assert spec.speculative_method == "eagle3"
    assert spec.stats.drafts > 0 and spec.stats.draft_tokens > spec.stats.drafts


def test_aux_layers_default_to_2_n_half_n_minus_3(target, tmp_path):
    assert engine(target, write_eagle3_head(tmp_path / "h", target)).proposer.aux_layers == (2, 2, 1)
    ids = engine(target, write_eagle3_head(tmp_path / "h2", target, layer_ids=[0, 1, 3])).proposer.aux_layers
    assert ids == (0, 1, 3)


def test_declared_aux_layers_fuse_in_vllms_ascending_order_and_may_name_the_last_output(target, tmp_path, caplog):
    """vLLM 0.33.0 collects id j entering layer j and id N after the last layer, in layer order: a head
    listing [4, 0, 2] reads the same features as one listing [0, 2, 4], and stays exact."""
    plain = make_engine(str(target), None, dtype="float32")
    params = SamplingParams(max_tokens=30, ignore_eos=True)
    listed = write_eagle3_head(tmp_path / "unsorted", target, draft_vocab=64, layer_ids=[4, 0, 2])
    ordered = write_eagle3_head(tmp_path / "sorted", target, draft_vocab=64, layer_ids=[0, 2, 4])
    runs = []
    for head in (listed, ordered):
        with caplog.at_level(logging.WARNING, logger="specsure"):
            spec = engine(target, head)
        assert spec.proposer.aux_layers == (0, 2, 4)
        runs.append((spec.generate(PROMPT, params)[0].token_ids, spec.stats.accepted_tokens, spec.stats.draft_tokens))
    assert runs[0] == runs[1] and runs[0][0] == plain.generate(PROMPT, params)[0].token_ids
    (warned,) = [r.getMessage() for r in caplog.records if "ascending" in r.getMessage()]  # the unsorted head only
    assert "unsorted" in warned and "[4, 0, 2]" in warned and "[0, 2, 4]" in warned
    twice = write_eagle3_head(tmp_path / "twice", target, layer_ids=[1, 1, 3])
    with pytest.raises(ConfigError, match=r"twice.*eagle_aux_hidden_state_layer_ids = \[1, 1, 3\] names a layer twice"):
        engine(target, twice)


def test_q_rows_live_on_the_target_vocab_and_vanish_outside_the_draft_vocab(target, tmp_path):
    head = write_eagle3_head(tmp_path / "head", target, draft_vocab=40)
    spec = engine(target, head, k=4)
    lm, proposer = spec.target.lm, spec.proposer
    out = lm.forward(PROMPT, aux_layers=proposer.aux_layers)
    proposer.observe(PROMPT, 0, out)
    draft = proposer.propose([*PROMPT, 3], 4, SamplingParams(temperature=1.0), torch.Generator().manual_seed(0))
    in_draft_vocab = proposer.module.draft_to_target
    assert draft.probs.shape == (4, lm.vocab_size)
    torch.testing.assert_close(draft.probs.sum(-1), torch.ones(4))
    outside = torch.ones(lm.vocab_size, dtype=torch.bool)
    outside[in_draft_vocab] = False
    assert draft.probs[:, outside].sum() == 0
    assert all(t in set(in_draft_vocab.tolist()) for t in draft.token_ids)


@pytest.mark.parametrize("accepted", [0, 1, 2])
def test_rollback_is_exact(target, tmp_path, accepted):
    spec = engine(target, write_eagle3_head(tmp_path / "head", target, draft_vocab=64), k=3)
    check_rollback(spec, PROMPT, k=3, accepted=accepted)


# --- losslessness when sampling -----------------------------------------------------------------

RUNS = 800


def test_sampled_output_is_distributed_as_the_target(tmp_path):
    vocab = 12
    small = build_tiny_llama(tmp_path / "target", vocab_size=vocab, num_layers=4, seed=3)
    head = write_eagle3_head(tmp_path / "head", small, draft_vocab=8, seed=1)
    spec = engine(small, head, k=2)
    plain = make_engine(str(small), None, dtype="float32")
    params = SamplingParams(max_tokens=4, temperature=1.0, ignore_eos=True)
    exact = second_token_marginal(spec.target.lm, [3, 4, 5], params)

    def counts(eng) -> torch.Tensor:  # noqa: ANN001
        c = torch.zeros(vocab)
        for seed in range(RUNS):
            out = eng.generate([3, 4, 5], SamplingParams(max_tokens=4, temperature=1.0, ignore_eos=True, seed=seed))
            c[out[0].token_ids[1]] += 1
        return c

    spec_counts, plain_counts = counts(spec), counts(plain)
    stats = spec.stats
    assert 0 < stats.accepted_per_position[0] < stats.drafts, "both acceptance and rejection must occur"
    df = int((exact > 0).sum()) - 1
    assert chi2(spec_counts, exact) < chi2_critical(df)
    # As close to the target as plain sampling is (TV 0.046 vs 0.043 when written) ...
    assert tv(spec_counts, exact) < max(2.0 * tv(plain_counts, exact), 0.06)
    # ... and far from the draft vocabulary's uniform spread, where a sampler that kept drafts would drift.
    spread = torch.zeros(vocab)
    spread[spec.proposer.module.draft_to_target] = 1 / 8
    assert tv(spec_counts, spread) > 4 * tv(spec_counts, exact)


# --- validation against the target, and the wrong format ----------------------------------------

def test_validation_names_checkpoint_field_found_and_expected(target, tmp_path):
    bad_ids = write_eagle3_head(tmp_path / "ids", target, layer_ids=[0, 1, 7])
    with pytest.raises(ConfigError, match=r"ids.*eagle_aux_hidden_state_layer_ids = \[0, 1, 7\].*\[0, 4\]"):
        engine(target, bad_ids)
    other = build_tiny_llama(tmp_path / "wide", hidden_size=48, num_layers=4)
    wide = write_eagle3_head(tmp_path / "wide_head", other)
    with pytest.raises(ConfigError, match=r"wide_head.*hidden_size = 48.*needs 32"):
        engine(target, wide)
    vocab = build_tiny_llama(tmp_path / "v", vocab_size=200, num_layers=4)
    with pytest.raises(ConfigError, match=r"vocab_size = 200.*needs 128"):
        engine(target, write_eagle3_head(tmp_path / "vh", vocab))
    tiny = build_tiny_llama(tmp_path / "two", num_layers=2)
    with pytest.raises(ConfigError, match=r"default aux layers.*\[2, 1, -1\].*\[0, 2\)"):
        engine(tiny, write_eagle3_head(tmp_path / "th", tiny))


def test_eagle3_on_an_eagle1_head_names_both_sides(target, tmp_path):
    head = write_eagle_head(tmp_path / "eagle1", target, arch="EagleLlamaForCausalLM")
    with pytest.raises(ConfigError, match=r"'eagle3'.*EAGLE-3 head.*eagle1.*EAGLE-1 head"):
        engine(target, head)
    silent = write_eagle_head(tmp_path / "silent", target)  # LlamaForCausalLM: only fc.weight tells
    with pytest.raises(ConfigError, match=r"'eagle3'.*EAGLE-3.*silent.*EAGLE-1 head"):
        engine(target, silent)


def test_draft_model_on_an_eagle3_head_names_both_sides(target, tmp_path):
    head = write_eagle3_head(tmp_path / "e3", target, draft_vocab=64)
    with pytest.raises(ConfigError, match=r"'draft_model'.*whole causal LM.*e3.*EAGLE-3 head"):
        make_engine(str(target), {"method": "draft_model", "model": str(head)}, dtype="float32")


def test_explain_says_where_the_head_is_and_why(target, tmp_path, caplog):
    head = write_eagle3_head(tmp_path / "my-head", target, draft_vocab=64)
    with caplog.at_level(logging.ERROR, logger="specsure.config"):
        res = resolve({"model": str(head)}, model=str(target))
    assert res.config.method == "eagle3" and res.source("method") == "checkpoint"
    assert "LlamaForCausalLMEagle3" in res.reason("method")
    assert str(head) in res.explain()


# --- heads of more than one decoder layer (vLLM's and speculators' layers.1.* ...) ------------------

def _steps(module, rows=(6, 2), seed=5):  # noqa: ANN001, ANN202
    """A head's (state, logits) over random features, in calls of ``rows`` entries each, on its torch ops."""
    from specsure.proposers.head_layer import HeadCache

    gen = torch.Generator().manual_seed(seed)
    total = sum(rows)
    features = module.features(torch.randn(total, module.fc.in_features, generator=gen))
    ids = torch.randint(0, 128, (total,), generator=gen)
    saved, module._kernel, cache, out, at = module._kernel, None, HeadCache(), [], 0
    with torch.inference_mode():
        for n in rows:
            out.append(module(features[at:at + n], ids[at:at + n], cache))
            at += n
    module._kernel = saved
    return out


def test_a_deeper_heads_extra_layer_that_adds_nothing_drafts_as_the_one_layer_head(target, tmp_path):
    """Layer 1 with zero o_proj and down_proj adds exactly nothing to the stream, so the 2-layer head's
    states and logits are the 1-layer head's: the extra layer sits on the stream, after the first."""
    from safetensors.torch import load_file, save_file

    one = write_eagle3_head(tmp_path / "one", target, draft_vocab=64)
    two = write_eagle3_head(tmp_path / "two", target, draft_vocab=64, layers=2)
    tensors = load_file(str(one / "model.safetensors"))
    extra = {k: v for k, v in load_file(str(two / "model.safetensors")).items() if k.startswith("layers.1.")}
    extra["layers.1.self_attn.o_proj.weight"].zero_()
    extra["layers.1.mlp.down_proj.weight"].zero_()
    save_file({**tensors, **extra}, str(two / "model.safetensors"), metadata={"format": "pt"})
    deep, shallow = engine(target, two).proposer.module, engine(target, one).proposer.module
    assert len(deep.more) == 1 and not hasattr(shallow, "more")
    for (state, logits), (want_state, want_logits) in zip(_steps(deep), _steps(shallow)):
        torch.testing.assert_close(state, want_state, rtol=0, atol=0)
        torch.testing.assert_close(logits, want_logits, rtol=0, atol=0)


@pytest.mark.parametrize("naming", ["midlayer", "layers.0"])
def test_a_deeper_head_is_exact_and_its_cache_extends_as_one_call(target, tmp_path, naming):
    head = write_eagle3_head(tmp_path / "deep", target, draft_vocab=64, layers=3, naming=naming)
    spec = engine(target, head)
    module = spec.proposer.module
    assert len(module.more) == 2 and module._kernel is None  # the C kernel runs one-layer heads only
    (_, _), (state, logits) = _steps(module, rows=(6, 2))
    ((whole_state, whole_logits),) = _steps(module, rows=(8,))
    torch.testing.assert_close(state, whole_state[6:], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits, whole_logits[6:], rtol=1e-5, atol=1e-5)
    plain = make_engine(str(target), None, dtype="float32")
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    for prompt in (PROMPT, [9, 9, 9, 9, 9, 9, 9, 9]):
        assert spec.generate(prompt, params)[0].token_ids == plain.generate(prompt, params)[0].token_ids
    check_rollback(spec, PROMPT, k=3)


def test_a_layer_count_that_its_tensors_contradict_is_named(target, tmp_path):
    head = write_eagle3_head(tmp_path / "deep", target, draft_vocab=64, layers=2, num_hidden_layers=3)
    with pytest.raises(ConfigError, match=r"deep.*num_hidden_layers = 3, but its tensors hold 2 decoder layer\(s\); "
                                          r"re-save the head with all of its layers"):
        engine(target, head)
    gap = write_eagle3_head(tmp_path / "gap", target, draft_vocab=64, layers=3)
    from safetensors.torch import load_file, save_file

    tensors = {k: v for k, v in load_file(str(gap / "model.safetensors")).items() if not k.startswith("layers.1.")}
    save_file(tensors, str(gap / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ConfigError, match=r"gap.*decoder layers \[0, 2\] found.*without gaps"):
        engine(target, gap)


# --- heads of Qwen3 decoder layers (vLLM's Eagle3Qwen3ForCausalLM) -----------------------------------

@pytest.mark.parametrize("layers", [1, 2])
def test_a_qwen3_layer_head_is_exact_and_its_q_and_k_norms_count(target, tmp_path, layers):
    """Its layers normalise each head's queries and keys: scaling q_norm changes the drafts' logits, so the
    norms are read and applied, not dropped; the output still equals plain decoding."""
    from safetensors.torch import load_file, save_file

    head = write_eagle3_head(tmp_path / "qwen3", target, draft_vocab=64, qwen3=True, layers=layers)
    spec = engine(target, head)
    module = spec.proposer.module
    assert type(module.midlayer).__name__ == "Qwen3DecoderLayer" and module._kernel is None
    plain = make_engine(str(target), None, dtype="float32")
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    for prompt in (PROMPT, [9, 9, 9, 9, 9, 9, 9, 9]):
        assert spec.generate(prompt, params)[0].token_ids == plain.generate(prompt, params)[0].token_ids
    check_rollback(spec, PROMPT, k=3)
    (_, _), (state, logits) = _steps(module, rows=(6, 2))
    ((whole_state, _),) = _steps(module, rows=(8,))
    torch.testing.assert_close(state, whole_state[6:], rtol=1e-5, atol=1e-5)
    tensors = load_file(str(head / "model.safetensors"))
    tensors["midlayer.self_attn.q_norm.weight"] = tensors["midlayer.self_attn.q_norm.weight"] * 3
    save_file(tensors, str(head / "model.safetensors"), metadata={"format": "pt"})
    (_, _), (_, scaled) = _steps(engine(target, head).proposer.module, rows=(6, 2))
    assert not torch.allclose(scaled, logits, atol=1e-3)


def test_a_qwen3_layer_head_with_a_sliding_window_is_refused(target, tmp_path):
    head = write_eagle3_head(tmp_path / "slides", target, draft_vocab=64, qwen3=True, use_sliding_window=True,
                             sliding_window=4, max_window_layers=0)
    with pytest.raises(ConfigError, match=r"slides.*layer\(s\) \[0\] attend over a sliding window"):
        engine(target, head)


def test_tensor_errors_of_a_deeper_head_name_the_files_tensors_and_the_right_fix(target, tmp_path):
    from safetensors.torch import load_file, save_file

    head = write_eagle3_head(tmp_path / "deep", target, draft_vocab=64, layers=2, naming="layers.0")
    tensors = load_file(str(head / "model.safetensors"))
    del tensors["layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(head / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ConfigError) as err:
        engine(target, head)
    assert "missing tensors ['layers.1.mlp.up_proj.weight']" in str(err.value) and "more." not in str(err.value)
    assert "do not match its config.json" in str(err.value) and "method matches" not in str(err.value)


def test_aux_ids_that_the_fc_width_contradicts_are_named(target, tmp_path):
    head = write_eagle3_head(tmp_path / "four", target, draft_vocab=64, layer_ids=[0, 1, 2, 3])
    with pytest.raises(ConfigError, match=r"four.*fc reads 3 target layers .* but eagle_config\."
                                          r"eagle_aux_hidden_state_layer_ids gives 4: \[0, 1, 2, 3\]"):
        engine(target, head)


def test_top_level_aux_ids_win_over_eagle_config_as_in_vllm_with_a_warning(target, tmp_path, caplog):
    import json

    head = write_eagle3_head(tmp_path / "both", target, draft_vocab=64, layer_ids=[0, 1, 3])
    config = json.loads((head / "config.json").read_text())
    config["eagle_aux_hidden_state_layer_ids"] = [1, 2, 4]
    (head / "config.json").write_text(json.dumps(config))
    with caplog.at_level(logging.WARNING, logger="specsure"):
        spec = engine(target, head)
    assert spec.proposer.aux_layers == (1, 2, 4)
    assert any("[1, 2, 4]" in r.getMessage() and "[0, 1, 3]" in r.getMessage() and "top-level" in r.getMessage()
               for r in caplog.records)


@pytest.mark.parametrize(("eagle", "match"), [
    ({"norm_before_fc": "false"}, r"eagle_config\.norm_before_fc = \"false\" must be true or false"),
    ({"use_aux_hidden_state": False}, r"eagle_config\.use_aux_hidden_state = false: .* does not run"),
])
def test_eagle_config_flags_are_checked_like_top_level_ones(target, tmp_path, eagle, match):
    import json

    head = write_eagle3_head(tmp_path / "flags", target, draft_vocab=64, layer_ids=[0, 1, 3])
    config = json.loads((head / "config.json").read_text())
    config["eagle_config"].update(eagle)
    (head / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=match):
        engine(target, head)


def _reference(tensors: dict, features: torch.Tensor, embed: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               layers: int, qwen3: bool, heads: int = 4, kv_heads: int = 2) -> torch.Tensor:
    """vLLM's EAGLE-3 forward over one fresh sequence, in plain torch from the file's tensors: the first
    layer over concat(input_layernorm(embed), hidden_norm(g)) with g as its residual, then plain
    pre-norm layers on the stream; returns the draft-vocabulary logits [n, Vd]."""
    def rotate(x: torch.Tensor) -> torch.Tensor:  # [heads, n, d]
        half = x.shape[-1] // 2
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin

    def attention(prefix: str, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = (x @ tensors[f"{prefix}self_attn.{p}_proj.weight"].T for p in "qkv")
        q, k, v = (t.view(n, -1, q.shape[-1] // heads).transpose(0, 1) for t in (q, k, v))
        if qwen3:
            q = rms(q, tensors[f"{prefix}self_attn.q_norm.weight"])
            k = rms(k, tensors[f"{prefix}self_attn.k_norm.weight"])
        q, k = rotate(q), rotate(k)
        k, v = (t.repeat_interleave(heads // kv_heads, dim=0) for t in (k, v))
        scores = q @ k.transpose(1, 2) / q.shape[-1] ** 0.5
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        return (scores.softmax(-1) @ v).transpose(0, 1).reshape(n, -1) @ tensors[f"{prefix}self_attn.o_proj.weight"].T

    def mlp(prefix: str, x: torch.Tensor) -> torch.Tensor:
        h = rms(x, tensors[f"{prefix}post_attention_layernorm.weight"])
        gate, up = (h @ tensors[f"{prefix}mlp.{p}_proj.weight"].T for p in ("gate", "up"))
        return (torch.nn.functional.silu(gate) * up) @ tensors[f"{prefix}mlp.down_proj.weight"].T

    g = features @ tensors["fc.weight"].T
    e = rms(embed, tensors["layers.0.input_layernorm.weight"])
    h = g + attention("layers.0.", torch.cat([e, rms(g, tensors["layers.0.hidden_norm.weight"])], dim=-1))
    out = h + mlp("layers.0.", h)
    for i in range(1, layers):
        h = out + attention(f"layers.{i}.", rms(out, tensors[f"layers.{i}.input_layernorm.weight"]))
        out = h + mlp(f"layers.{i}.", h)
    return rms(out, tensors["norm.weight"]) @ tensors["lm_head.weight"].T


@pytest.mark.parametrize(("layers", "qwen3"), [(1, False), (2, False), (3, False), (1, True), (2, True)])
def test_a_heads_first_call_equals_a_plain_torch_reference_of_vllms_forward(target, tmp_path, layers, qwen3):
    """An independent check of the layers' wiring (the tests above check exactness, which any head passes)."""
    from safetensors.torch import load_file

    from specsure.proposers.head_layer import HeadCache

    head = write_eagle3_head(tmp_path / "h", target, draft_vocab=64, layers=layers, qwen3=qwen3, naming="layers.0")
    module = engine(target, head).proposer.module
    tensors = load_file(str(head / "model.safetensors"))
    gen = torch.Generator().manual_seed(9)
    aux = torch.randn(7, module.fc.in_features, generator=gen)
    ids = torch.randint(0, 128, (7,), generator=gen)
    with torch.inference_mode():
        cos, sin = module.rotary(aux[None, :, :32], torch.arange(7)[None])
        want = _reference(tensors, aux, module.target.embed(ids).float(), cos[0], sin[0], layers, qwen3)
        saved, module._kernel = module._kernel, None
        _, logits = module(module.features(aux), ids, HeadCache())
        module._kernel = saved
    draft = module.draft_to_target
    torch.testing.assert_close(logits[:, draft], want, rtol=1e-4, atol=1e-4)
