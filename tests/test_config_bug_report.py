"""The five cases of the original bug report: an explicit setting is never overridden."""

from __future__ import annotations

import logging

import pytest

from checkpoints import (EAGLE_TENSORS, deepseek_v3, eagle3_head, llama, mtp_head, silent,
                         write_checkpoint)
from specsure.config import resolve
from specsure.config.detect import path_hint


@pytest.fixture
def llama_target(tmp_path):
    return str(write_checkpoint(tmp_path / "target", llama(layers=4)))


# 1. Explicit mtp is kept when the target's path contains "beagle".
def test_explicit_mtp_kept_on_beagle_target(tmp_path, caplog):
    target = write_checkpoint(tmp_path / "tmp" / "beagle-dsv3", deepseek_v3(mtp_layers=2))
    with caplog.at_level(logging.WARNING, logger="specsure.config"):
        res = resolve({"method": "mtp"}, model=str(target))
    assert res.config.method == "mtp"
    assert res.source("method") == "user"
    assert res.config.model is None and res.source("model") == "derived"
    assert "MTP layers inside the target" in res.reason("model")
    assert res.config.num_speculative_tokens == 2 and res.source("num_speculative_tokens") == "checkpoint"
    assert res.warnings == () and caplog.records == []
    res.check_runnable()


# 2. A missing method is detected from checkpoint metadata.
def test_missing_method_detected_from_eagle3_architectures(tmp_path, llama_target):
    head = write_checkpoint(tmp_path / "head", eagle3_head())
    res = resolve({"model": str(head)}, model=llama_target)
    assert res.config.method == "eagle3"
    assert res.source("method") == "checkpoint"
    assert "LlamaForCausalLMEagle3" in res.reason("method")
    assert res.warnings == ()
    res.check_runnable()


def test_missing_method_whole_lm_in_eagle_folder_is_draft_model(tmp_path, llama_target):
    draft = write_checkpoint(tmp_path / "home" / "user" / "my-eagle-draft", llama(layers=2))
    res = resolve({"model": str(draft)}, model=llama_target)
    assert res.config.method == "draft_model"
    assert res.source("method") == "checkpoint"
    assert "whole causal LM" in res.reason("method")
    assert res.warnings == ()
    res.check_runnable()


@pytest.mark.parametrize(("config", "signal"), [
    ({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": 12}, "n_layer=12"),
    ({"architectures": ["MPTForCausalLM"], "model_type": "mpt", "n_layers": 8}, "n_layers=8"),
    ({"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
      "text_config": {"num_hidden_layers": 6, "vocab_size": 49152}}, "text_config.num_hidden_layers=6"),
])
def test_a_whole_model_under_another_layer_count_name_is_no_eagle_head(tmp_path, llama_target, config, signal):
    """GPT-2 says n_layer and a multimodal model nests its count: still metadata, so the folder name is not asked."""
    draft = write_checkpoint(tmp_path / "my-eagle-draft", {"vocab_size": 49152, "hidden_size": 64, **config})
    res = resolve({"model": str(draft)}, model=llama_target)
    assert (res.config.method, res.source("method")) == ("draft_model", "checkpoint")
    assert signal in res.reason("method") and "path" not in res.reason("method")
    explicit = resolve({"method": "draft_model", "model": str(draft)}, model=llama_target, strict=True)
    assert explicit.warnings == ()


def test_explicit_draft_model_in_eagle_folder_gives_no_warning(tmp_path, llama_target):
    """The upstream hijack: '/home/user/my-eagle-draft' turned an explicit draft_model into eagle."""
    draft = write_checkpoint(tmp_path / "home" / "user" / "my-eagle-draft", llama(layers=2))
    res = resolve({"method": "draft_model", "model": str(draft)}, model=llama_target)
    assert res.config.method == "draft_model" and res.warnings == ()


def test_missing_method_eagle_head_from_fc_tensor(tmp_path, llama_target):
    """Public EAGLE-1 heads often say LlamaForCausalLM; their fc layer gives them away."""
    head = write_checkpoint(tmp_path / "plain-name", silent(), tensors=EAGLE_TENSORS)
    res = resolve({"model": str(head)}, model=llama_target)
    assert (res.config.method, res.source("method")) == ("eagle", "checkpoint")
    assert "fc.weight" in res.reason("method")


def test_missing_method_mtp_from_target_layers(tmp_path):
    target = write_checkpoint(tmp_path / "dsv3", deepseek_v3(mtp_layers=1))
    res = resolve({"num_speculative_tokens": 2}, model=str(target))
    assert (res.config.method, res.source("method")) == ("mtp", "checkpoint")
    assert "num_nextn_predict_layers" in res.reason("method")


# 3. An override attempt gives a WARNING that names both methods (and the signal).
def test_override_attempt_warns_with_both_methods(tmp_path, llama_target, caplog):
    draft = write_checkpoint(tmp_path / "dsv3-small", deepseek_v3(mtp_layers=1, layers=4))
    with caplog.at_level(logging.WARNING, logger="specsure.config"):
        res = resolve({"method": "draft_model", "model": str(draft)}, model=llama_target)
    assert res.config.method == "draft_model" and res.source("method") == "user"
    assert res.config.model == str(draft)
    [record] = [r for r in caplog.records if r.name == "specsure.config"]
    assert record.levelno == logging.WARNING
    text = record.getMessage()
    assert "'draft_model'" in text and "'mtp'" in text
    assert "num_nextn_predict_layers" in text and "config.json" in text
    assert "Keeping your value" in text
    assert res.warnings == (text,)
    res.check_runnable()  # a whole causal LM with MTP layers still runs as a draft model


def test_override_by_path_hint_warns_with_path_token(tmp_path, llama_target, caplog):
    head = write_checkpoint(tmp_path / "my-eagle3-head", silent())
    with caplog.at_level(logging.WARNING, logger="specsure.config"):
        res = resolve({"method": "eagle", "model": str(head)}, model=llama_target)
    assert res.config.method == "eagle"
    [text] = res.warnings
    assert "'eagle'" in text and "'eagle3'" in text and "path token 'eagle3'" in text
    assert [r.getMessage() for r in caplog.records] == [text]


# 4. `beagle` is not EAGLE.
@pytest.mark.parametrize("name", ["beagle", "beagle-7b", "eagle-eye-7b", "eagle_eye", "eagles", "golden-eagle",
                                  "beagle3", "myeagle", "eagle3x", "mtpx", "smtp-relay"])
def test_not_a_path_hint(name):
    assert path_hint(f"/models/{name}") is None


@pytest.mark.parametrize(("path", "method"), [
    ("/m/my-eagle-draft", "eagle"), ("/m/EAGLE3-LLaMA3.1-8B", "eagle3"), ("/m/eagle3", "eagle3"),
    ("/m/llama_mtp_head", "mtp"), ("/m/Eagle.llama", "eagle"), ("/m/eagle/head", "eagle"),
    ("/m/eagle-eye-7b/eagle3-head", "eagle3"),
])
def test_whole_token_path_hint(path, method):
    assert path_hint(path).value == method


@pytest.mark.parametrize("name", ["beagle-7b", "eagle-eye-7b", "eagles"])
def test_beagle_draft_runs_as_draft_model(tmp_path, llama_target, name):
    draft = write_checkpoint(tmp_path / name, silent())
    res = resolve({"model": str(draft)}, model=llama_target)
    assert (res.config.method, res.source("method")) == ("draft_model", "default")
    assert res.warnings == ()


def test_eagle_folder_with_silent_metadata_uses_path_hint(tmp_path, llama_target):
    head = write_checkpoint(tmp_path / "my-eagle-head", silent())
    res = resolve({"model": str(head)}, model=llama_target)
    assert (res.config.method, res.source("method")) == ("eagle", "path")
    assert "path token 'eagle'" in res.reason("method")


def test_a_path_hints_alike_however_it_is_spelled(tmp_path, llama_target, monkeypatch):
    """'.', '../x', '~' and 'x/y/..' name the same folder as its full path, so they hint alike."""
    head = write_checkpoint(tmp_path / "my-eagle-head", silent())
    (head / "sub").mkdir()
    monkeypatch.setenv("HOME", str(head))
    monkeypatch.chdir(head)
    for spelled in (".", "./", "../my-eagle-head", "~", "sub/..", str(head)):
        res = resolve({"model": spelled}, model=llama_target)
        assert (res.config.method, res.source("method")) == ("eagle", "path"), spelled
        assert "path token 'eagle'" in res.reason("method"), spelled
    # '.' in a linked folder reads the link's name, as the shell shows it ($PWD), not the real folder's.
    real = write_checkpoint(tmp_path / "x123", silent())
    link = tmp_path / "eagle-link"
    link.symlink_to(real)
    monkeypatch.chdir(link)
    monkeypatch.setenv("PWD", str(link))
    assert resolve({"model": "."}, model=llama_target).config.method == "eagle"


# 5. A user-given draft model is kept when detection points elsewhere.
def test_user_model_kept_when_target_has_mtp_layers(tmp_path, caplog):
    target = write_checkpoint(tmp_path / "dsv3", deepseek_v3(mtp_layers=1))
    head = write_checkpoint(tmp_path / "my-mtp-head", mtp_head(modules=2))
    with caplog.at_level(logging.WARNING, logger="specsure.config"):
        res = resolve({"method": "mtp", "model": str(head)}, model=str(target))
    assert res.config.model == str(head) and res.source("model") == "user"
    [text] = res.warnings
    assert text.startswith("model:") and str(head) in text and "num_nextn_predict_layers" in text
    assert "Keeping your value" in text
    assert res.config.num_speculative_tokens == 2  # the user's head declares 2 modules
    res.check_runnable()


def test_user_model_kept_when_its_metadata_says_another_method(tmp_path, llama_target):
    head = write_checkpoint(tmp_path / "head", eagle3_head())
    res = resolve({"method": "eagle", "model": str(head)}, model=llama_target)
    assert (res.config.method, res.config.model) == ("eagle", str(head))
    assert "'eagle3'" in res.warnings[0]
