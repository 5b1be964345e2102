"""Target-side evidence: mtp without a 'model' drafts with the target, so the target is read as the draft.

vLLM 0.33 sets the draft to the target path in that case and runs its detection on it. specsure
reads the target's head metadata and its whole-token path hints, keeps the user's value, and
warns (or, strict, raises) when they point elsewhere. A normal target says nothing.
"""

from __future__ import annotations

import json
import logging

import pytest

from checkpoints import EAGLE3_TENSORS, deepseek_v3, eagle3_head, llama, mtp_head, write_checkpoint
from specsure.cli.main import main
from specsure.config import ConfigConflictError, ConfigError, resolve
from specsure.config.export import export


@pytest.fixture
def eagle3_target(tmp_path):
    """The issue's case: an EAGLE-3 head served as the target, in a folder named after it."""
    config = eagle3_head(model_type="eagle3")
    return str(write_checkpoint(tmp_path / "models-eagle3-x", config, tensors=EAGLE3_TENSORS))


@pytest.fixture
def config_logger():
    """`specsure explain` quiets this logger; put its level back for the tests that follow."""
    log = logging.getLogger("specsure.config")
    level = log.level
    yield log
    log.setLevel(level)


@pytest.mark.parametrize("spec", [{"method": "mtp"}, {"method": "mtp", "model": None}])
def test_mtp_on_an_eagle3_target_warns_and_keeps_mtp(eagle3_target, caplog, spec):
    with caplog.at_level(logging.WARNING, logger="specsure.config"):
        res = resolve(spec, model=eagle3_target)
    assert res.config.method == "mtp" and res.source("method") == "user"
    (warning,) = res.warnings
    assert warning.startswith("method: you set 'mtp', but the evidence suggests 'eagle3'")
    assert "architectures=['LlamaForCausalLMEagle3']" in warning
    assert f"path token 'eagle3' in {eagle3_target!r}" in warning
    assert warning.endswith("Keeping your value 'mtp'.")
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [warning]

    with pytest.raises(ConfigConflictError) as err:
        resolve(spec, model=eagle3_target, strict=True)
    said = warning.removesuffix(" Keeping your value 'mtp'.")
    assert str(err.value).startswith(said) and str(err.value).endswith("(strict mode: disagreement is an error.)")
    assert "Keeping your value" not in str(err.value)


def test_check_runnable_names_the_target_as_an_eagle3_head(eagle3_target):
    res = resolve({"method": "mtp"}, model=eagle3_target)
    with pytest.raises(ConfigError) as err:
        res.check_runnable()
    text = str(err.value)
    assert "method 'mtp' was asked" in text
    assert f"the target {eagle3_target!r} is itself an EAGLE-3 head" in text and "LlamaForCausalLMEagle3" in text


def test_a_path_token_does_not_count_against_the_targets_stored_mtp_layers(tmp_path, caplog):
    # metadata first: the MTP layers in the target's weights agree with mtp, so the folder's 'eagle'
    # is no evidence against it (vLLM's own substring rule is export's and check-vllm's to flag)
    target = str(write_checkpoint(tmp_path / "models" / "eagle-dsv3", deepseek_v3(mtp_layers=1)))
    with caplog.at_level(logging.WARNING, logger="specsure.config"):
        res = resolve({"method": "mtp"}, model=target, strict=True)
    assert res.config.method == "mtp" and res.warnings == () and caplog.records == []
    res.check_runnable()
    # saved without its MTP weights, the target's metadata says nothing more, and the path token counts
    bare = str(write_checkpoint(tmp_path / "more" / "eagle-dsv3", deepseek_v3(mtp_layers=1),
                                ["model.embed_tokens.weight", "lm_head.weight"]))
    (warning,) = resolve({"method": "mtp"}, model=bare).warnings
    assert "suggests 'eagle'" in warning and f"path token 'eagle' in {bare!r}" in warning
    with pytest.raises(ConfigConflictError, match="path token 'eagle'"):
        resolve({"method": "mtp"}, model=bare, strict=True)


@pytest.mark.parametrize("folder, config", [
    ("beagle-dsv3", deepseek_v3(mtp_layers=1)),  # the seed case: vLLM runs EAGLE here, 'beagle' is no hint
    ("dsv3", deepseek_v3(mtp_layers=1)),
    ("dsv3-mtp", deepseek_v3(mtp_layers=1)),     # a hint that agrees
])
def test_mtp_target_that_agrees_gives_no_warning(tmp_path, caplog, folder, config):
    target = str(write_checkpoint(tmp_path / folder, config))
    with caplog.at_level(logging.WARNING, logger="specsure.config"):
        res = resolve({"method": "mtp"}, model=target, strict=True)
    assert res.config.method == "mtp" and res.warnings == () and caplog.records == []
    res.check_runnable()


def test_plain_llama_target_gives_no_warning_only_the_impossibility(tmp_path, caplog):
    # classify_draft calls a whole LlamaForCausalLM 'draft_model'; that is not head evidence.
    target = str(write_checkpoint(tmp_path / "llama-8b", llama(layers=4)))
    with caplog.at_level(logging.WARNING, logger="specsure.config"):
        res = resolve({"method": "mtp"}, model=target, strict=True)
    assert res.warnings == () and caplog.records == []
    with pytest.raises(ConfigError, match="declares none") as err:
        res.check_runnable()
    assert "is itself" not in str(err.value)


def test_target_evidence_counts_only_when_the_target_drafts(tmp_path):
    target = str(write_checkpoint(tmp_path / "eagle3-llama", llama(layers=4)))
    head = str(write_checkpoint(tmp_path / "head", mtp_head()))
    assert resolve({"method": "mtp", "model": head}, model=target).warnings == ()
    assert resolve({"method": "ngram"}, model=target).warnings == ()
    assert resolve({"method": "mtp"}, model=target).warnings != ()


def test_unset_method_on_an_eagle3_target_is_an_error_that_names_it(eagle3_target):
    with pytest.raises(ConfigError) as err:
        resolve({"num_speculative_tokens": 2}, model=eagle3_target)
    assert "is itself an EAGLE-3 head" in str(err.value) and "architectures=" in str(err.value)


def test_unset_method_ignores_mtp_layers_of_a_target_that_is_an_eagle3_head(tmp_path):
    config = eagle3_head(num_nextn_predict_layers=1, num_hidden_layers=4)
    target = str(write_checkpoint(tmp_path / "head", config, tensors=EAGLE3_TENSORS))
    with pytest.raises(ConfigError, match="is itself an EAGLE-3 head"):
        resolve({"num_speculative_tokens": 2}, model=target)


def test_unset_method_takes_target_metadata_over_its_path(tmp_path):
    target = str(write_checkpoint(tmp_path / "eagle-dsv3", deepseek_v3(mtp_layers=1)))
    res = resolve({"num_speculative_tokens": 1}, model=target, strict=True)
    assert res.config.method == "mtp" and res.source("method") == "checkpoint" and res.warnings == ()


def test_export_predicts_vllm_detection_on_the_target_path(eagle3_target):
    out = export(resolve({"method": "mtp"}, model=eagle3_target), "vllm")
    assert any("would run method 'eagle3'" in w and "target path" in w for w in out.warnings)


def test_explain_shows_the_warning(eagle3_target, capsys, config_logger):
    code = main(["explain", "--model", eagle3_target, "--speculative-config", json.dumps({"method": "mtp"})])
    captured = capsys.readouterr()
    assert code == 2  # the warning does not change the exit code; the impossibility does
    table = " ".join(captured.out.split())
    assert "warnings (1):" in table
    assert "you set 'mtp', but the evidence suggests 'eagle3'" in table
    assert "architectures=['LlamaForCausalLMEagle3']" in table and "path token 'eagle3'" in table
    assert captured.err.startswith("error: cannot run: ") and "is itself an EAGLE-3 head" in captured.err


def test_a_null_draft_vocab_size_is_no_eagle3_evidence(tmp_path) -> None:
    """null is unset in config.json: a whole causal LM that writes the key as null stays a draft model,
    with no warning against an explicit draft_model, and strict keeps it."""
    target = write_checkpoint(tmp_path / "target", llama(num_hidden_layers=8))
    draft = write_checkpoint(tmp_path / "small", llama(num_hidden_layers=4, draft_vocab_size=None))
    detected = resolve({"model": str(draft)}, model=str(target))
    assert detected.config.method == "draft_model" and detected.decisions["method"].source == "checkpoint"
    kept = resolve({"method": "draft_model", "model": str(draft)}, model=str(target), strict=True)
    assert kept.config.method == "draft_model" and not kept.warnings


def test_a_gguf_draft_is_a_whole_model_by_its_metadata_not_its_path(tmp_path) -> None:
    """No head is a GGUF file, so its metadata marks it a draft model, ahead of an 'eagle' in its name."""
    from checkpoints import write_gguf

    target = write_checkpoint(tmp_path / "target", llama(num_hidden_layers=8))
    draft = write_gguf(tmp_path / "eagle-small.gguf", layers=1)
    detected = resolve({"model": str(draft)}, model=str(target))
    assert detected.config.method == "draft_model" and detected.decisions["method"].source == "checkpoint"
    assert "block_count=1" in detected.decisions["method"].reason or "block_count=1" in str(detected.explain())
    with pytest.raises(ConfigConflictError):
        resolve({"method": "eagle", "model": str(draft)}, model=str(target), strict=True)
