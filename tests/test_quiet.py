"""Quiet loads: no transformers progress bars or LOAD REPORT tables around specsure's own loads,
while other warnings, and the report of a load that fails, still show."""

from __future__ import annotations

import json
import logging
import sys
import warnings
from pathlib import Path
from typing import Iterator

import pytest
from heads import build_mtp_target
from transformers import AutoModelForCausalLM
from transformers.utils import logging as hf_logging
from words import write_word_tokenizer

from specsure.cli.main import main
from specsure.models import ModelLoadError, load_model
from specsure.models.quiet import REPORT_LOGGER, quiet_loading
from tiny import build_tiny_llama

NOISE = ("Loading weights", "LOAD REPORT")


@pytest.fixture
def terminal(capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.CaptureFixture[str]]:
    """What a user's terminal would show, as in a fresh process: transformers' progress bars on
    (no HF_HUB_DISABLE_PROGRESS_BARS) and its log handler writing to this test's stderr (it keeps
    the sys.stderr of its first use, which under pytest is an earlier capture)."""
    for handler in logging.getLogger("transformers").handlers:
        if type(handler) is logging.StreamHandler:
            monkeypatch.setattr(handler, "stream", sys.stderr)
    before = hf_logging.is_progress_bar_enabled()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # huggingface_hub warns when its environment switch wins
        hf_logging.enable_progress_bar()
    capfd.readouterr()
    yield capfd
    if not before:
        hf_logging.disable_progress_bar()


@pytest.fixture(scope="module")
def mtp_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny target storing an MTP module as model.layers.2.*, which LlamaForCausalLM does not use."""
    folder = build_mtp_target(tmp_path_factory.mktemp("quiet") / "mtp-target")
    return write_word_tokenizer(folder, 128)


def test_loading_a_target_with_mtp_layers_prints_no_bars_or_load_report(mtp_target, terminal) -> None:  # noqa: ANN001
    load_model(str(mtp_target), "float32")
    out, err = terminal.readouterr()
    assert not [n for n in NOISE if n in out + err], out + err
    # Only around specsure's load: afterwards transformers is as it was, bars and report included.
    assert hf_logging.is_progress_bar_enabled() and not logging.getLogger(REPORT_LOGGER).filters
    AutoModelForCausalLM.from_pretrained(mtp_target)
    _, err = terminal.readouterr()
    assert all(n in err for n in NOISE) and "model.layers.2.eh_proj.weight" in err, err


def test_other_transformers_warnings_still_show(terminal) -> None:  # noqa: ANN001
    with quiet_loading():
        logging.getLogger(REPORT_LOGGER).warning("a real warning from the loader")
        logging.getLogger("transformers.configuration_utils").warning("a real warning from the config")
    _, err = terminal.readouterr()
    assert "a real warning from the loader" in err and "a real warning from the config" in err


def test_a_failed_load_names_the_mismatched_tensors_instead_of_the_report(tmp_path: Path, terminal) -> None:  # noqa: ANN001
    """transformers' error for mismatched shapes points at its report and at a flag the user never set;
    specsure's own error names the tensors and both shapes, so the report is not needed."""
    folder = build_tiny_llama(tmp_path / "mismatch")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "intermediate_size": 48}))  # stored: 64
    terminal.readouterr()
    with pytest.raises(ModelLoadError, match="do not fit its config.json") as caught:
        load_model(str(folder), "float32")
    assert "model.layers.0.mlp.down_proj.weight is [32, 64] in the weights but [32, 48] for config.json" in str(
        caught.value)
    _, err = terminal.readouterr()
    assert "LOAD REPORT" not in err, err


def test_a_failed_load_that_is_not_about_shapes_still_shows_its_report(terminal) -> None:  # noqa: ANN001
    with pytest.raises(RuntimeError):
        with quiet_loading():
            logging.getLogger(REPORT_LOGGER).warning("LlamaForCausalLM LOAD REPORT from: x")
            raise RuntimeError("conversion failed, see the report above")
    _, err = terminal.readouterr()
    assert "LOAD REPORT" in err, err


def test_generate_shows_only_specsure_lines(mtp_target, terminal, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)  # the CLI sets it; undone afterwards
    rc = main(["generate", "--model", str(mtp_target), "--dtype", "float32", "--max-tokens", "8",
               "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 2}', "w5 w6 w7"])
    out, err = terminal.readouterr()
    assert rc == 0, err
    assert "effective config" not in out  # the completion alone on stdout
    assert err.startswith("effective config (running: mtp, dtype ") and "tokens: 8" in err
    assert all(line.startswith(("effective config", "  ", "tokens: ", "mean acceptance length")) for line in
               err.splitlines()), err  # and nothing but specsure's own lines on stderr
