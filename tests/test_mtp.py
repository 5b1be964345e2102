"""mtp: modules inside the target (DeepSeek-V3 layout) and standalone heads; lossless, exact rollback."""

from __future__ import annotations

import logging

import pytest
import torch
from heads import (
    assert_first_draft_is_pending_token,
    add_mtp_modules, build_bigram_target, build_mtp_target, check_rollback, copy_mtp_module, select, target_layer,
    write_eagle3_head, write_mtp_head,
)

from specsure import ConfigError, SamplingParams, make_engine, resolve
from tiny import build_tiny_llama

PROMPT = [5, 6, 7, 8, 9]
GREEDY = SamplingParams(max_tokens=40, ignore_eos=True)


def mtp_engine(target, k=3, model=None):  # noqa: ANN001, ANN201
    spec = {"method": "mtp", "num_speculative_tokens": k, **({"model": str(model)} if model else {})}
    return make_engine(str(target), spec, dtype="float32")


def same_as_plain(target, spec) -> None:  # noqa: ANN001
    plain = make_engine(str(target), None, dtype="float32")
    for prompt in (PROMPT, [3], [9] * 8):
        assert spec.generate(prompt, GREEDY)[0].token_ids == plain.generate(prompt, GREEDY)[0].token_ids
    assert spec.speculative_method == "mtp" and spec.stats.draft_tokens >= spec.stats.drafts > 0


@pytest.mark.parametrize(("modules", "k", "own_head"), [(1, 1, True), (1, 3, True), (2, 2, False), (2, 5, True)])
def test_deepseek_layout_in_the_target_is_lossless(tmp_path, modules, k, own_head):
    target = build_mtp_target(tmp_path / "target", modules=modules, own_head=own_head)
    same_as_plain(target, mtp_engine(target, k=k))


@pytest.mark.parametrize(("modules", "k"), [(1, 3), (2, 3)])
def test_standalone_head_is_lossless(tmp_path, modules, k):
    target = build_tiny_llama(tmp_path / "target")
    head = write_mtp_head(tmp_path / "head", target, modules=modules)
    same_as_plain(target, mtp_engine(target, k=k, model=head))


def test_the_bug_report_case_beagle_folder_runs_mtp(tmp_path, caplog):
    target = build_mtp_target(tmp_path / "my-beagle-model", modules=1)
    with caplog.at_level(logging.WARNING, logger="specsure.config"):
        engine = mtp_engine(target, k=3)
    assert engine.speculative_method == "mtp"
    assert engine.resolution.config.num_speculative_tokens == 3
    assert not [r for r in caplog.records if r.name == "specsure.config"], "the path names no method"
    out = engine.generate(PROMPT, SamplingParams(max_tokens=12, ignore_eos=True))[0]
    assert len(out.token_ids) == 12 and engine.stats.drafts > 0


@pytest.mark.parametrize(("modules", "accepted"), [(1, 0), (1, 2), (2, 0), (2, 1), (2, 3)])
def test_rollback_is_exact(tmp_path, modules, accepted):
    target = build_mtp_target(tmp_path / "target", modules=modules)
    check_rollback(mtp_engine(target, k=4), PROMPT, k=4, accepted=accepted)


# --- a head that copies the target's own computation ---------------------------------------------

@pytest.mark.parametrize(("modules", "k"), [(1, 1), (1, 4), (2, 4)])
def test_a_head_copying_the_target_layer_is_always_accepted(tmp_path, modules, k):
    target = build_bigram_target(tmp_path / "bigram")
    copies = {}
    for i in range(modules):
        copies.update(copy_mtp_module(target, f"model.layers.{1 + i}."))
    add_mtp_modules(target, copies, modules)
    engine = mtp_engine(target, k=k)
    same_as_plain(target, engine)
    stats = engine.stats
    assert stats.accepted_tokens == stats.draft_tokens, stats  # token shift and positions line up exactly
    assert stats.mean_acceptance_length > k  # k accepted + the bonus token, but for rounds cut by max_tokens


def test_the_first_feature_is_the_pending_tokens_position(tmp_path):
    """A module that passes h_t through unchanged predicts what the target predicts at t: the pending
    token. Feeding the feature one position early would predict the last prompt token's successor."""
    target = build_tiny_llama(tmp_path / "target", num_layers=2, seed=4)
    hidden = 32
    module = {"model.layers.2.enorm.weight": torch.ones(hidden), "model.layers.2.hnorm.weight": torch.ones(hidden),
              "model.layers.2.eh_proj.weight": select(hidden, "hidden"),
              "model.layers.2.shared_head.norm.weight": torch.ones(hidden), **target_layer(target, "model.layers.2.")}
    module["model.layers.2.self_attn.o_proj.weight"].zero_()
    module["model.layers.2.mlp.down_proj.weight"].zero_()  # the block is the identity
    add_mtp_modules(target, module, 1)
    engine = mtp_engine(target, k=2)
    assert_first_draft_is_pending_token(engine)


# --- the wrong format, and validation -------------------------------------------------------------

def test_mtp_on_a_target_without_mtp_layers_names_both_sides(tmp_path):
    target = build_tiny_llama(tmp_path / "plain")
    with pytest.raises(ConfigError, match=r"'mtp'.*without a 'model'.*MTP layers inside the target.*plain.*declares "
                                          r"none"):
        mtp_engine(target)


def test_mtp_declared_but_not_stored_names_the_missing_tensor(tmp_path):
    target = build_tiny_llama(tmp_path / "t", extra_config={"num_nextn_predict_layers": 1})
    with pytest.raises(ConfigError, match=r"num_nextn_predict_layers=1.*no 'model.layers.2.eh_proj.weight'"):
        mtp_engine(target)


def test_mtp_with_an_eagle3_head_names_both_sides(tmp_path):
    target = build_tiny_llama(tmp_path / "t", num_layers=4)
    head = write_eagle3_head(tmp_path / "e3", target, draft_vocab=64)
    with pytest.raises(ConfigError, match=r"'mtp'.*MTP head.*e3.*EAGLE-3 head"):
        mtp_engine(target, model=head)


def test_standalone_head_validation_names_field_found_and_expected(tmp_path):
    target = build_tiny_llama(tmp_path / "t")
    wide = build_tiny_llama(tmp_path / "wide", hidden_size=48)
    with pytest.raises(ConfigError, match=r"'.*h48': hidden_size = 48.*needs 32"):
        mtp_engine(target, model=write_mtp_head(tmp_path / "h48", wide))
    small = build_tiny_llama(tmp_path / "small", vocab_size=100)
    with pytest.raises(ConfigError, match=r"vocab_size = 100.*needs 128"):
        mtp_engine(target, model=write_mtp_head(tmp_path / "v100", small))
    short = write_mtp_head(tmp_path / "short", target, modules=1, num_nextn_predict_layers=2)
    with pytest.raises(ConfigError, match=r"short.*missing tensors"):
        mtp_engine(target, model=short)


def test_explain_says_the_heads_are_inside_the_target(tmp_path):
    target = build_mtp_target(tmp_path / "beagle", modules=2)
    res = resolve({"method": "mtp"}, model=str(target))
    assert res.config.model is None and res.source("model") == "derived"
    assert "num_nextn_predict_layers=2" in res.reason("model")
    assert res.config.num_speculative_tokens == 2 and "MTP module" in res.reason("num_speculative_tokens")
    detected = resolve({"num_speculative_tokens": 2}, model=str(target))
    assert detected.config.method == "mtp" and detected.source("method") == "checkpoint"
