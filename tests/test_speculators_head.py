"""EAGLE-3 heads in the speculators format (vllm-project/speculators), read as vLLM 0.33.0 reads them."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
import torch
from heads import rms, speculators_copy, write_eagle3_head
from safetensors.torch import load_file, save_file

from specsure import ConfigError, SamplingParams, make_engine, resolve
from tiny import build_tiny_llama

PROMPTS = ([5, 6, 7, 8, 9], [3], [9, 9, 9, 9, 9, 9, 9, 9], [1, 2, 3, 1, 2, 3, 1, 2])
GREEDY = SamplingParams(max_tokens=40, ignore_eos=True)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return build_tiny_llama(tmp_path_factory.mktemp("t") / "target", num_layers=4)


@pytest.fixture(scope="module")
def plain(target):
    engine = make_engine(str(target), None, dtype="float32")
    return [engine.generate(p, GREEDY)[0].token_ids for p in PROMPTS]


def run(target, head, k=3):  # noqa: ANN001, ANN201
    engine = make_engine(str(target), {"method": "eagle3", "model": str(head), "num_speculative_tokens": k},
                         dtype="float32")
    return engine, [engine.generate(p, GREEDY)[0].token_ids for p in PROMPTS]


def stats(engine):  # noqa: ANN001, ANN201
    s = engine.stats
    return s.drafts, s.draft_tokens, s.accepted_tokens, list(s.accepted_per_position)


LAYOUTS = {
    "reduced vocab with d2t/t2d": {"draft_vocab": 64},
    "target vocab, aux layer ids": {"layer_ids": [0, 1, 3]},
    "own embed_tokens, norm_before_residual": {"draft_vocab": 100, "own_embed": True, "norm_before_residual": True},
    "two decoder layers": {"draft_vocab": 64, "layers": 2},
    # rope_theta given: vLLM fills an absent one differently in the two layouts (a test below)
    "Qwen3 decoder layers": {"draft_vocab": 64, "qwen3": True, "layers": 2, "rope_theta": 1e6},
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_speculators_head_drafts_what_the_same_head_drafts_in_the_eagle3_layout(target, plain, tmp_path, layout):
    """The same weights in both layouts: the same drafts, step by step, and output equal to plain decoding."""
    original = write_eagle3_head(tmp_path / "eagle3", target, **LAYOUTS[layout])
    copy = speculators_copy(original, tmp_path / "speculators")
    want_engine, want = run(target, original)
    got_engine, got = run(target, copy)
    assert got == want == plain and stats(got_engine) == stats(want_engine)
    module = got_engine.proposer.module
    assert module.norm_before_residual is bool(LAYOUTS[layout].get("norm_before_residual", False))
    for (state, logits), (want_state, want_logits) in zip(steps(module), steps(want_engine.proposer.module)):
        assert torch.equal(state, want_state) and torch.equal(logits, want_logits)


def steps(module):  # noqa: ANN001, ANN201
    """A head module's fed-back state and logits for a 6-row first call and a 2-row second one."""
    from specsure.proposers.head_layer import HeadCache

    gen = torch.Generator().manual_seed(5)
    aux = torch.randn(6, module.fc.in_features, generator=gen)
    cache, out = HeadCache(), []
    with torch.inference_mode():
        state, logits = module(module.features(aux), torch.tensor([3, 9, 27, 81, 5, 7]), cache)
        out.append((state, logits))
        out.append(module(state[-2:], torch.tensor([11, 13]), cache))
    return out


def test_method_and_k_are_read_from_its_speculators_config(target, tmp_path):
    head = speculators_copy(write_eagle3_head(tmp_path / "e3", target, draft_vocab=64), tmp_path / "spec",
                            speculative_tokens=4)
    res = resolve({"model": str(head)}, model=str(target))
    assert (res.config.method, res.source("method")) == ("eagle3", "checkpoint")
    assert 'speculators_model_type="eagle3"' in res.reason("method")
    assert (res.config.num_speculative_tokens, res.source("num_speculative_tokens")) == (4, "checkpoint")
    assert "speculators_config.proposal_methods.0.speculative_tokens=4" in res.reason("num_speculative_tokens")
    res.check_runnable()


def test_another_k_is_kept_with_a_warning_and_strict_refuses_it(target, tmp_path, caplog):
    head = speculators_copy(write_eagle3_head(tmp_path / "e3", target, draft_vocab=64), tmp_path / "spec",
                            speculative_tokens=4)
    with caplog.at_level(logging.WARNING, logger="specsure.config"):
        res = resolve({"model": str(head), "num_speculative_tokens": 2}, model=str(target))
    assert (res.config.num_speculative_tokens, res.source("num_speculative_tokens")) == (2, "user")
    warned = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert "num_speculative_tokens" in warned and "2" in warned and "speculative_tokens=4" in warned
    with pytest.raises(ConfigError, match=r"num_speculative_tokens.*speculative_tokens=4"):
        resolve({"model": str(head), "num_speculative_tokens": 2}, model=str(target), strict=True)


def test_without_norm_before_residual_it_is_vllms_default_true(target, plain, tmp_path):
    """vLLM's update_eagle3 reads an absent norm_before_residual as True; specsure reads it the same."""
    original = write_eagle3_head(tmp_path / "e3", target, draft_vocab=64, norm_before_residual=True)
    copy = speculators_copy(original, tmp_path / "spec", drop=("norm_before_residual",))
    assert "norm_before_residual" not in json.loads((copy / "config.json").read_text())
    want_engine, want = run(target, original)
    got_engine, got = run(target, copy)
    assert got_engine.proposer.module.norm_before_residual is True
    assert got == want == plain and stats(got_engine) == stats(want_engine)


def _with_optional_norms(head: Path, hidden: int, *, norm_output: bool) -> Path:
    """Add vLLM's optional parts to a speculators head: input_norm (norm_before_fc), fc_norm, norm_output."""
    config = json.loads((head / "config.json").read_text())
    config.update(norm_before_fc=True, fc_norm=True, norm_output=norm_output)
    (head / "config.json").write_text(json.dumps(config))
    tensors = load_file(str(head / "model.safetensors"))
    gen = torch.Generator().manual_seed(7)
    tensors["input_norm.weight"] = 1 + 0.2 * torch.randn(3 * hidden, generator=gen)
    for i in range(3):
        tensors[f"fc_norm.{i}.weight"] = 1 + 0.2 * torch.randn(hidden, generator=gen)
    save_file(tensors, str(head / "model.safetensors"), metadata={"format": "pt"})
    return head


def test_the_optional_norms_before_fc_are_applied_in_vllms_order(target, plain, tmp_path):
    """norm_before_fc normalises the fused features as a whole, then fc_norm each layer's part (vLLM's
    combine_hidden_states); the engine stays exact."""
    hidden = json.loads((Path(target) / "config.json").read_text())["hidden_size"]
    head = _with_optional_norms(speculators_copy(write_eagle3_head(tmp_path / "e3", target, draft_vocab=64),
                                                 tmp_path / "spec"), hidden, norm_output=False)
    engine, got = run(target, head)
    assert got == plain
    module, tensors = engine.proposer.module, load_file(str(head / "model.safetensors"))
    aux = torch.randn(5, 3 * hidden, generator=torch.Generator().manual_seed(1))
    whole = rms(aux, tensors["input_norm.weight"])
    parts = [rms(p, tensors[f"fc_norm.{i}.weight"]) for i, p in enumerate(whole.chunk(3, dim=-1))]
    want = torch.cat(parts, dim=-1) @ tensors["fc.weight"].T
    torch.testing.assert_close(module.features(aux), want, rtol=1e-5, atol=1e-5)


def test_norm_output_feeds_back_the_normed_state(target, plain, tmp_path):
    """With norm_output, a later draft step reads the layer's output after the final norm (vLLM's
    aux_output), on the kernel path and on the torch ops alike."""
    from specsure.proposers.head_layer import HeadCache

    hidden = json.loads((Path(target) / "config.json").read_text())["hidden_size"]
    head = _with_optional_norms(speculators_copy(write_eagle3_head(tmp_path / "e3", target, draft_vocab=64),
                                                 tmp_path / "spec"), hidden, norm_output=True)
    engine, got = run(target, head)
    assert got == plain
    module = engine.proposer.module
    assert module.norm_output is True
    gen = torch.Generator().manual_seed(2)
    first, more = torch.randn(6, hidden, generator=gen), torch.randn(2, hidden, generator=gen)
    ids = torch.tensor([3, 9, 27, 81, 5, 7]), torch.tensor([11, 13])
    saved, outs = module._kernel, []
    with torch.inference_mode():
        for kernel, normed in ((saved, True), (None, True), (None, False)):
            module.norm_output = normed
            cache = HeadCache()
            module._kernel = None  # the first call sizes the cache on the torch ops either way
            module(first, ids[0], cache)
            module._kernel = kernel
            outs.append(module(more, ids[1], cache))
        module._kernel, module.norm_output = saved, True
    (kernel_state, kernel_logits), (state, logits), (prenorm, prenorm_logits) = outs
    torch.testing.assert_close(state, module.norm(prenorm), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits, prenorm_logits)  # the logits read the normed state either way
    torch.testing.assert_close(kernel_state, state, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(kernel_logits, logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("change", "match"), [
    ({"speculators_model_type": "dflash"}, r"DFlash drafter.*speculators_model_type=\"dflash\".* does not run"),
    ({"speculators_model_type": "peagle"}, r"PEagle.*speculators_model_type=\"peagle\".* does not run"),
    ({"transformer_layer_config.model_type": "mistral"}, r"transformer_layer_config\.model_type = \"mistral\".*"
                                                         r"'llama' or 'qwen3' decoder layers"),
    ({"transformer_layer_config.num_hidden_layers": 2}, r"transformer_layer_config\.num_hidden_layers = 2, but its "
                                                        r"tensors hold 1 decoder layer\(s\)"),
    ({"transformer_layer_config": [1]}, r"transformer_layer_config = \[1\] must be a JSON object"),
    ({"transformer_layer_config.hidden_size": "32"}, r"transformer_layer_config\.hidden_size = \"32\" must be a "
                                                     r"non-negative integer"),
])
def test_what_it_cannot_run_is_refused_by_name(target, tmp_path, change, match):
    head = _edited(write_eagle3_head(tmp_path / "e3", target, draft_vocab=64), tmp_path / "spec", change)
    with pytest.raises(ConfigError, match=match):
        make_engine(str(target), {"method": "eagle3", "model": str(head)}, dtype="float32")


DROP = object()


def _edited(original: Path, folder: Path, change: dict) -> Path:
    """A speculators copy of ``original`` with dotted keys (list indices as numbers) set, or dropped."""
    head = speculators_copy(original, folder)
    config = json.loads((head / "config.json").read_text())
    for key, value in change.items():
        where = config
        *path, last = key.split(".")
        for part in path:
            where = where[int(part)] if isinstance(where, list) else where[part]
        if value is DROP:
            del where[last]
        else:
            where[last] = value
    (head / "config.json").write_text(json.dumps(config))
    return head


K = "speculators_config.proposal_methods.0.speculative_tokens"


@pytest.mark.parametrize(("change", "match"), [
    *[({K: bad}, rf"{K} = {re.escape(json.dumps(bad))} must be a positive integer")
      for bad in (0, -2, "4", True, 2.5, None)],
    ({K: DROP}, rf"{K} = null must be a positive integer"),  # vLLM: "Missing 'speculative_tokens'"
    *[({"speculators_config.proposal_methods": bad}, r"speculators_config\.proposal_methods = .* must be a list of "
                                                     r"objects") for bad in ({}, ["greedy"], "greedy")],
    *[({"speculators_config": bad}, rf"speculators_config = {re.escape(json.dumps(bad))} must be a JSON object")
      for bad in ([1], "x", None)],
    ({"speculators_model_type": DROP}, r"speculators_model_type = null must name the head's kind, such as \"eagle3\""),
    ({"speculators_model_type": "EAGLE3"}, r"does not register .*\"speculators_model_type\": \"eagle3\""),
    ({"transformer_layer_config": {}}, r"transformer_layer_config has no hidden_size, num_attention_heads, "
                                       r"intermediate_size"),
    ({"transformer_layer_config.num_attention_heads": "4"}, r"transformer_layer_config\.num_attention_heads = \"4\" "
                                                            r"must be a positive integer"),
    ({"norm_before_residual": "false"}, r"norm_before_residual = \"false\" must be true or false"),
    ({"draft_vocab_size": DROP}, r"gives no draft_vocab_size, but its d2t maps 64 draft ids; set "
                                 r"\"draft_vocab_size\": 64"),
])
def test_malformed_fields_are_named_with_their_value_and_nothing_falls_back(target, tmp_path, change, match):
    """Never the default k for a k the file gets wrong, never LlamaConfig's defaults blamed, never a traceback."""
    head = _edited(write_eagle3_head(tmp_path / "e3", target, draft_vocab=64), tmp_path / "spec", change)
    with pytest.raises(ConfigError, match=match):
        make_engine(str(target), {"model": str(head)}, dtype="float32")


@pytest.mark.parametrize("change", [{"speculators_config.proposal_methods": DROP},
                                    {"speculators_config.proposal_methods": []}])
def test_a_head_that_declares_no_k_gets_the_default_and_says_so(target, tmp_path, change):
    head = _edited(write_eagle3_head(tmp_path / "e3", target, draft_vocab=64), tmp_path / "spec", change)
    res = resolve({"model": str(head)}, model=str(target))
    assert res.source("num_speculative_tokens") == "default" and "default k for eagle3" in res.reason(
        "num_speculative_tokens")


def test_an_empty_aux_id_list_is_vllms_default(target, plain, tmp_path):
    """vLLM copies eagle_aux_hidden_state_layer_ids only when the list is non-empty."""
    head = _edited(write_eagle3_head(tmp_path / "e3", target, draft_vocab=64), tmp_path / "spec",
                   {"eagle_aux_hidden_state_layer_ids": []})
    engine, got = run(target, head)
    assert engine.proposer.aux_layers == (2, 2, 1) and got == plain


def test_strict_names_the_disagreement_and_keeps_nothing(target, tmp_path):
    head = speculators_copy(write_eagle3_head(tmp_path / "e3", target, draft_vocab=64), tmp_path / "spec",
                            speculative_tokens=4)
    with pytest.raises(ConfigError) as err:
        resolve({"model": str(head), "num_speculative_tokens": 2}, model=str(target), strict=True)
    text = str(err.value)
    assert "Keeping your value" not in text and "set num_speculative_tokens to 4" in text


def test_the_sglang_export_says_sglang_may_not_read_the_format(target, tmp_path):
    from specsure.config.export import export

    head = speculators_copy(write_eagle3_head(tmp_path / "e3", target, draft_vocab=64), tmp_path / "spec")
    out = export(resolve({"model": str(head)}, model=str(target)), "sglang")
    assert any("speculators-format head" in w and "EAGLE-3 layout" in w for w in out.warnings)
    vllm = export(resolve({"model": str(head)}, model=str(target)), "vllm")
    assert not any("speculators-format head" in w for w in vllm.warnings)


def test_a_size_mismatch_cites_the_nested_key(target, tmp_path):
    other = build_tiny_llama(tmp_path / "wide", hidden_size=48, num_layers=4)
    head = speculators_copy(write_eagle3_head(tmp_path / "e3", other), tmp_path / "spec")
    with pytest.raises(ConfigError, match=r"spec.*transformer_layer_config\.hidden_size = 48.*needs 32"):
        make_engine(str(target), {"model": str(head)}, dtype="float32")


def test_explain_shows_the_flattened_head_and_its_keys(target, tmp_path):
    head = speculators_copy(write_eagle3_head(tmp_path / "e3", target, draft_vocab=64), tmp_path / "spec")
    text = resolve({"model": str(head)}, model=str(target)).explain()
    assert "speculators_model_type" in text and "speculative_tokens=3" in text


def test_a_qwen3_speculators_head_without_head_dim_reads_hidden_over_heads_as_vllm(target, plain, tmp_path):
    """vLLM's flattened config is no Qwen3Config, so an absent head_dim is hidden_size / num_attention_heads
    there (not Qwen3Config's 128); specsure reads it the same and runs the head."""
    head = _edited(write_eagle3_head(tmp_path / "e3", target, draft_vocab=64, qwen3=True), tmp_path / "spec",
                   {"transformer_layer_config.head_dim": DROP})
    engine, got = run(target, head)
    assert engine.proposer.module.midlayer.self_attn.head_dim == 8 and got == plain  # 32 / 4 heads


@pytest.mark.parametrize("change", [{}, {"transformer_layer_config.rope_parameters": {"rope_type": "default"}}])
def test_a_qwen3_speculators_head_without_rope_theta_rotates_by_vllms_qwen3_default(target, plain, tmp_path, change):
    """vLLM's Qwen3 layers fill an absent rope_theta with 1e6 (set_default_rope_theta), not Qwen3Config's 1e4:
    the head drafts as the same weights in the EAGLE-3 layout with rope_theta 1e6 say, step by step."""
    kept = write_eagle3_head(tmp_path / "kept", target, draft_vocab=64, qwen3=True, rope_theta=1e6)
    head = _edited(write_eagle3_head(tmp_path / "e3", target, draft_vocab=64, qwen3=True), tmp_path / "spec", change)
    engine, got = run(target, head)
    want_engine, want = run(target, kept)
    inv_freq = engine.proposer.module.rotary.module.inv_freq  # head_dim 8: base ** (-i / 4)
    assert inv_freq[1].item() == pytest.approx(1e6 ** -0.25)
    assert got == want == plain and stats(engine) == stats(want_engine)


def test_a_malformed_k_in_the_file_is_not_read_when_you_set_k(target, plain, tmp_path):
    """As a draft, vLLM never reads speculative_tokens: with num_speculative_tokens given, the file's
    broken value does not stop the head (without it, the value would fill k, and is refused above)."""
    head = _edited(write_eagle3_head(tmp_path / "e3", target, draft_vocab=64), tmp_path / "spec", {K: "four"})
    res = resolve({"model": str(head), "num_speculative_tokens": 2}, model=str(target))
    assert (res.config.num_speculative_tokens, res.source("num_speculative_tokens")) == (2, "user")
    assert res.warnings == ()
    assert run(target, head, k=2)[1] == plain


def test_a_null_speculators_config_is_no_speculators_config(tmp_path):
    """vLLM reads "speculators_config": null as absent: such a target is an ordinary model."""
    target = build_tiny_llama(tmp_path / "target", num_layers=4, extra_config={"speculators_config": None})
    assert resolve({"method": "ngram"}, model=str(target)).config.method == "ngram"
