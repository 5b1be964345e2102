"""Checkpoints made for vLLM methods specsure does not run, sizes nested in text_config, and path
words in any script: found from metadata before anything loads (a fourth user audit)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import vllm_standin
from checkpoints import eagle3_head, llama, write_checkpoint
from specsure.config.detect import path_hint
from specsure.config.errors import ConfigError
from specsure.config.export import export
from specsure.config.vllm_overrides import predict_vllm_overrides
from specsure.config.resolution import resolve
from specsure.vllm_plugin.patch import install

MEDUSA = {"architectures": ["MedusaModel"], "model_type": "medusa", "medusa_num_heads": 4, "hidden_size": 64}
MLP = {"architectures": ["MLPSpeculatorPreTrainedModel"], "model_type": "mlp_speculator", "n_predict": 3,
       "emb_dim": 64, "vocab_size": 1000}


@pytest.mark.parametrize("config, what", [(MEDUSA, "a Medusa head"), (MLP, "an MLP speculator")])
def test_a_medusa_or_mlp_speculator_draft_is_named_not_run_as_a_draft_model(tmp_path: Path, config, what) -> None:  # noqa: ANN001
    target = str(write_checkpoint(tmp_path / "target", llama(layers=4)))
    draft = str(write_checkpoint(tmp_path / "draft", config, ["heads.0.weight"]))
    with pytest.raises(ConfigError, match=rf"method is not set, and the draft checkpoint .* is {what} \(.*model_type="
                                          rf"\"{config['model_type']}\"\), made for vLLM's method"):
        resolve({"model": draft}, target)
    res = resolve({"method": "draft_model", "model": draft}, target)
    assert f"Its metadata marks it as {what}" in res.reason("model")  # the table says what the error says
    with pytest.raises(ConfigError, match=rf"method 'draft_model' was asked, but the draft checkpoint .* is {what}"):
        res.check_runnable()
    # vLLM 0.33.0 has neither method: it keeps draft_model for them (and then fails to load the head).
    assert predict_vllm_overrides(res) == ()
    assert any("specsure would refuse to run this config" in w for w in export(res, "vllm").warnings)


def test_sizes_nested_in_text_config_are_checked_before_loading(tmp_path: Path) -> None:
    target = write_checkpoint(tmp_path / "target", {"architectures": ["Gemma3ForConditionalGeneration"],
                                                    "model_type": "gemma3", "text_config": {
                                                        "num_hidden_layers": 4, "hidden_size": 64, "vocab_size": 2000}})
    draft = str(write_checkpoint(tmp_path / "draft", llama(vocab=1000)))
    with pytest.raises(ConfigError, match="vocab_size=1000 .* vocab_size=2000"):
        resolve({"method": "draft_model", "model": draft}, str(target)).check_runnable()
    head = str(write_checkpoint(tmp_path / "head", eagle3_head(vocab=2000, target_hidden_size=128)))
    with pytest.raises(ConfigError, match="target_hidden_size = 128"):
        resolve({"method": "eagle3", "model": head}, str(target)).check_runnable()
    bad = write_checkpoint(tmp_path / "bad", {"model_type": "gemma3", "text_config": {"vocab_size": "2000"}})
    with pytest.raises(ConfigError, match=r"text_config\.vocab_size = \"2000\" must be a non-negative integer"):
        resolve({"method": "ngram"}, str(bad))


def test_a_head_size_written_as_a_string_is_refused_not_skipped(tmp_path: Path) -> None:
    target = str(write_checkpoint(tmp_path / "target", llama(layers=4)))
    head = str(write_checkpoint(tmp_path / "head", eagle3_head(target_hidden_size="4096")))
    with pytest.raises(ConfigError, match=r"target_hidden_size = \"4096\" must be a non-negative integer"):
        resolve({"method": "eagle3", "model": head}, target)


@pytest.mark.parametrize("name", ["éeagle", "eagleé-draft", "eagle²", "Ѐeagle-x"])
def test_a_path_word_is_any_scripts_letters_and_digits(name: str) -> None:
    assert path_hint(f"/models/{name}") is None  # one word, as 'myeagle' is
    assert path_hint(f"/models/{name}-eagle") is not None


def test_guard_mode_logs_what_vllm_filled_in_not_specsures_defaults(tmp_path: Path, caplog) -> None:  # noqa: ANN001
    target = str(write_checkpoint(tmp_path / "target", llama(layers=4)))
    module = vllm_standin.arg_utils()
    install(module.EngineArgs, module, "9.9.9")
    args = module.EngineArgs(target, speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    with caplog.at_level(logging.INFO, logger="vllm.specsure"):
        args.create_speculative_config(vllm_standin.ModelConfig(target), None)
    assert "you set method='ngram', num_speculative_tokens=3; the fields you left unset take vLLM's own" in caplog.text
    assert "prompt_lookup_min=2" not in caplog.text  # specsure's default, which vLLM never received
    assert "vLLM 9.9.9 resolved the speculative config as: method='ngram'" in caplog.text
    assert "prompt_lookup_min=5, prompt_lookup_max=5" in caplog.text and "suffix_decoding" not in caplog.text


def test_an_accent_stored_as_a_combining_character_still_joins_its_word() -> None:
    import unicodedata

    assert path_hint("/models/" + unicodedata.normalize("NFD", "éeagle")) is None
