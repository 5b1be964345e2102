"""Provenance (source and reason per field), aliases, the frozen result, and no torch."""

from __future__ import annotations

import dataclasses
import json
import logging
import struct
import subprocess
import sys

import pytest

from checkpoints import deepseek_v3, eagle3_head, llama, silent, write_checkpoint, write_gguf
from specsure.config import ConfigError, Resolution, resolve
from specsure.config.schema import FIELDS, MTP_METHOD_ALIASES


@pytest.fixture
def target(tmp_path):
    return str(write_checkpoint(tmp_path / "target", llama(layers=4)))


def test_source_user_for_every_field_the_user_set(target):
    res = resolve({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2,
                   "prompt_lookup_max": 4}, model=target)
    for name in ("method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"):
        assert res.source(name) == "user"
    assert res.source("target") == "user" and res.reason("target") == "You gave the target model."
    assert res.reason("method") == "You set method 'ngram'; it is never replaced."


def test_source_checkpoint(tmp_path, target):
    head = str(write_checkpoint(tmp_path / "head", eagle3_head(n_predict=6)))
    res = resolve({"model": head}, model=target)
    assert res.source("method") == "checkpoint"
    assert res.reason("method").startswith("Detected from checkpoint metadata:")
    assert (res.config.num_speculative_tokens, res.source("num_speculative_tokens")) == (6, "checkpoint")
    assert "n_predict=6" in res.reason("num_speculative_tokens")


def test_source_path(tmp_path, target):
    head = str(write_checkpoint(tmp_path / "my-eagle3-head", silent()))
    res = resolve({"model": head}, model=target)
    assert (res.config.method, res.source("method")) == ("eagle3", "path")
    assert res.reason("method").startswith("Detected from a whole-token path hint: path token 'eagle3'")


def test_source_default(tmp_path, target):
    draft = str(write_checkpoint(tmp_path / "draft", silent()))
    res = resolve({"model": draft}, model=target)
    assert (res.config.method, res.source("method")) == ("draft_model", "default")
    assert (res.config.num_speculative_tokens, res.source("num_speculative_tokens")) == (4, "default")
    assert res.reason("num_speculative_tokens") == "The default k for draft_model is 4."
    ngram = resolve({"method": "ngram"}, model=target)
    assert [ngram.source(n) for n in ("prompt_lookup_min", "prompt_lookup_max")] == ["default", "default"]


def test_source_derived(tmp_path, target):
    res = resolve({"method": "ngram"}, model=target)
    assert (res.config.model, res.source("model")) == (None, "derived")
    assert "needs no draft model" in res.reason("model")
    only_max = resolve({"prompt_lookup_max": 3}, model=target)
    assert (only_max.config.method, only_max.source("method")) == ("ngram", "derived")
    assert (only_max.config.prompt_lookup_min, only_max.source("prompt_lookup_min")) == (3, "derived")
    mtp = resolve({"method": "mtp"}, model=str(write_checkpoint(tmp_path / "dsv3", deepseek_v3())))
    assert mtp.source("model") == "derived"
    assert mtp.reason("model").startswith("mtp without 'model' uses the MTP layers inside the target")
    draft = str(write_checkpoint(tmp_path / "draft", llama(layers=2)))
    eagle = resolve({"model": draft, "method": "draft_model"}, model=target)
    assert [eagle.source(n) for n in ("prompt_lookup_min", "prompt_lookup_max")] == ["derived", "derived"]


def test_gguf_target_metadata(tmp_path):
    target = str(write_gguf(tmp_path / "tiny.gguf", mtp_layers=2))
    res = resolve({"num_speculative_tokens": 1}, model=target)
    assert (res.config.method, res.source("method")) == ("mtp", "checkpoint")
    assert "tiny.gguf (GGUF metadata) num_nextn_predict_layers=2" in res.reason("method")
    res.check_runnable()


def test_gguf_target_vocab_is_checked_against_the_draft(tmp_path):
    target = str(write_gguf(tmp_path / "tiny.gguf", vocab=32000))
    draft = str(write_checkpoint(tmp_path / "draft", llama(layers=2)))
    res = resolve({"model": draft}, model=target)
    with pytest.raises(ConfigError, match="vocab_size=49152 .* vocab_size=32000"):
        res.check_runnable()


def test_damaged_gguf_file_names_the_file(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\0\0")
    with pytest.raises(ConfigError, match="bad.gguf is not a readable GGUF file"):
        resolve({"method": "ngram"}, model=str(bad))


@pytest.mark.parametrize(("name", "tail"), [
    # a string whose length field claims far more bytes than the file holds
    ("huge-string", struct.pack("<Q", 1) + b"k" + struct.pack("<IQ", 8, 2**62)),
    # arrays of arrays, nested thousands deep
    ("deep-array", struct.pack("<Q", 1) + b"k" + struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * 5000),
])
def test_hostile_gguf_header_is_a_config_error(tmp_path, name, tail):
    bad = tmp_path / f"{name}.gguf"
    bad.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + tail)
    with pytest.raises(ConfigError, match=f"{name}.gguf is not a readable GGUF file"):
        resolve({"method": "ngram"}, model=str(bad))


def test_absurd_mtp_layer_count_fails_fast(tmp_path):
    config = {**deepseek_v3(mtp_layers=1), "num_nextn_predict_layers": 10**18}
    target = str(write_checkpoint(tmp_path / "dsv3", config, tensors=["model.embed_tokens.weight"]))
    res = resolve({"method": "mtp"}, model=target)
    with pytest.raises(ConfigError, match=r"no 'model.layers.\d+.eh_proj.weight' \(MTP module 0\)"):
        res.check_runnable(weights=False)


def test_checkpoint_metadata_in_a_resolution_is_read_only(tmp_path):
    target = str(write_checkpoint(tmp_path / "t", llama(layers=4)))
    res = resolve({"method": "ngram"}, model=target)
    with pytest.raises(TypeError):
        res.target.config["num_hidden_layers"] = 99  # type: ignore[index]
    assert res.target.num_hidden_layers == 4


def test_checkpoint_k_above_the_maximum_is_capped_and_says_so(tmp_path):
    target = str(write_checkpoint(tmp_path / "dsv3", deepseek_v3(mtp_layers=100)))
    res = resolve({"method": "mtp"}, model=target)
    assert res.config.num_speculative_tokens == 64
    assert "capped at 64" in res.reason("num_speculative_tokens")


def test_unknown_field_name_is_a_config_error(target):
    res = resolve({"method": "ngram"}, model=target)
    with pytest.raises(ConfigError, match="no decision for field 'methd'"):
        res.source("methd")


def test_to_dict_is_json_serialisable_and_complete(tmp_path, target):
    head = str(write_checkpoint(tmp_path / "head", eagle3_head()))
    res = resolve({"model": head}, model=target)
    data = json.loads(json.dumps(res.to_dict()))
    assert set(data) == {"target", *FIELDS}
    for name, entry in data.items():
        assert set(entry) == {"value", "source", "reason"}
        assert entry["source"] == res.source(name) and entry["reason"] == res.reason(name)
    assert data["method"]["value"] == "eagle3" and data["model"]["value"] == head


def test_explain_lists_every_field_value_source_and_the_warnings(tmp_path, target):
    head = str(write_checkpoint(tmp_path / "head", eagle3_head()))
    res = resolve({"method": "eagle", "model": head, "num_speculative_tokens": 3}, model=target)
    text = res.explain()
    lines = text.splitlines()
    for name in ("target", *FIELDS):
        [row] = [line for line in lines if line.startswith(name + " ")]
    assert any(line.split()[:3] == ["method", "eagle", "user"] for line in lines)
    assert any(line.split()[:3] == ["num_speculative_tokens", "3", "user"] for line in lines)
    assert "warnings (1):" in text and "'eagle3'" in text


def test_explain_when_speculation_is_off(target):
    res = resolve(None, model=target)
    assert res.config is None and res.warnings == ()
    assert "speculative decoding: off" in res.explain()
    assert set(res.to_dict()) == {"target", *FIELDS}
    assert all(res.to_dict()[name]["value"] is None and res.source(name) == "default" for name in FIELDS)
    assert "speculative decoding is off" in res.reason("method")
    assert resolve({}, model=target).config is None


def test_resolution_and_config_are_frozen(target):
    res = resolve({"method": "ngram"}, model=target)
    assert isinstance(res, Resolution)
    with pytest.raises(dataclasses.FrozenInstanceError):
        res.config.method = "eagle"  # type: ignore[misc]
    with pytest.raises(TypeError):
        res.decisions["method"] = None  # type: ignore[index]


@pytest.mark.parametrize("alias", sorted(MTP_METHOD_ALIASES))
def test_deprecated_mtp_alias_becomes_mtp_with_a_warning(tmp_path, alias, caplog):
    target = str(write_checkpoint(tmp_path / "dsv3", deepseek_v3()))
    with caplog.at_level(logging.WARNING, logger="specsure.config"):
        res = resolve({"method": alias}, model=target)
    assert res.config.method == "mtp" and res.source("method") == "user"
    assert f"alias {alias!r}" in res.reason("method")
    [text] = res.warnings
    assert f"method {alias!r} is a deprecated alias of 'mtp'" in text
    assert [r.getMessage() for r in caplog.records] == [text]


@pytest.mark.parametrize(("spec", "written"), [
    ({"model": "[ngram]", "num_speculative_tokens": 3}, '"model": "[ngram]"'),
    ({"draft_model": "ngram"}, '"model": "ngram"'),
    ({"method": "[ngram]"}, '"method": "[ngram]"'),
    ({"method": "ngram", "model": "[ngram]"}, '"model": "[ngram]"'),
])
def test_vllms_older_ngram_spellings_run_ngram_with_a_warning(tmp_path, monkeypatch, target, spec, written):
    """vLLM still reads them as ngram (the plugin hands them on so); a path that does not exist is no answer."""
    monkeypatch.chdir(tmp_path)
    res = resolve(spec, model=target)
    assert (res.config.method, res.source("method"), res.config.model) == ("ngram", "user", None)
    assert written in res.reason("method")
    [text] = res.warnings
    assert text.startswith(f"{written} is vLLM's older spelling of method 'ngram'")
    (tmp_path / "ngram").mkdir()  # now a folder by that name exists: which is meant is not guessed
    if spec.get("draft_model") == "ngram":
        with pytest.raises(ConfigError, match="both vLLM's older spelling of method 'ngram' and a path here"):
            resolve(spec, model=target)


def test_deprecated_alias_is_matched_case_insensitively(tmp_path):
    target = str(write_checkpoint(tmp_path / "dsv3", deepseek_v3()))
    res = resolve({"method": "DeepSeek_MTP"}, model=target)
    assert res.config.method == "mtp" and "'DeepSeek_MTP'" in res.warnings[0]


def test_draft_model_key_is_an_alias_of_model(tmp_path, target):
    draft = str(write_checkpoint(tmp_path / "draft", llama(layers=2)))
    res = resolve({"method": "draft_model", "draft_model": draft}, model=target)
    assert res.config.model == draft and res.source("model") == "user"


def test_to_vllm_leaves_nothing_to_detect(tmp_path, target):
    head = str(write_checkpoint(tmp_path / "head", eagle3_head()))
    assert resolve({"model": head}, model=target).config.to_vllm() == {
        "method": "eagle3", "num_speculative_tokens": 5, "model": head}


NO_TORCH = """
import json, sys
import specsure.config
from specsure.config import resolve
from specsure import resolve as top_level_resolve
res = resolve({{"model": {head!r}}}, model={target!r})
res.check_runnable(); res.explain(); json.dumps(res.to_dict())
top_level_resolve({{"method": "ngram"}}, model={gguf!r}).explain()
heavy = sorted(m for m in ("torch", "transformers", "safetensors") if m in sys.modules)
print(json.dumps({{"method": res.config.method, "heavy": heavy}}))
"""


def test_resolve_imports_no_torch(tmp_path, target):
    head = str(write_checkpoint(tmp_path / "head", eagle3_head()))
    gguf = str(write_gguf(tmp_path / "tiny.gguf"))
    out = subprocess.run([sys.executable, "-c", NO_TORCH.format(head=head, target=target, gguf=gguf)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1]) == {"method": "eagle3", "heavy": []}


def test_explain_never_breaks_a_path_inside_a_warning(tmp_path):
    target = str(write_checkpoint(tmp_path / "target", llama(layers=4)))
    head = str(write_checkpoint(tmp_path / "a-long-hyphenated-folder-name" / "eagle3-draft-head", silent()))
    text = resolve({"method": "eagle", "model": head}, model=target).explain()
    assert f"'{head}'" in text.replace("\n    ", " ")
    assert head in text  # on one line: not split at a hyphen or mid-word


# --- prompt_lookup_branches: specsure's ngram token trees ------------------------------------------

def test_prompt_lookup_branches_defaults_to_a_chain_and_is_kept_when_given(tmp_path):
    from specsure.config.export import export

    res = resolve({"method": "ngram"})
    assert res.config.prompt_lookup_branches == 1 and res.source("prompt_lookup_branches") == "default"
    assert "one chain, as vLLM does" in res.reason("prompt_lookup_branches")
    tree = resolve({"prompt_lookup_branches": 4})
    assert tree.config.method == "ngram" and tree.source("method") == "derived"
    assert tree.config.prompt_lookup_branches == 4 and tree.source("prompt_lookup_branches") == "user"
    out = export(tree, "vllm")
    assert "prompt_lookup_branches" not in out.speculative_config
    assert any("vLLM drafts one chain" in w for w in out.warnings)


def test_prompt_lookup_branches_is_refused_out_of_range_and_for_other_methods():
    with pytest.raises(ConfigError, match="prompt_lookup_branches = 0 is out of range: it must be from 1 to 16"):
        resolve({"method": "ngram", "prompt_lookup_branches": 0})
    with pytest.raises(ConfigError, match="prompt_lookup_branches = 2 applies only to method 'ngram'"):
        resolve({"method": "suffix", "prompt_lookup_branches": 2})
