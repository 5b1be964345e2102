"""Damaged or extreme input that used to leak Python's own wording: each is one line naming its source."""

from __future__ import annotations

import json
import logging
import struct
from pathlib import Path

import pytest

from checkpoints import eagle3_head, llama, silent, write_checkpoint, write_gguf
from specsure.cli.guard import guarded
from specsure.cli.main import build_parser
from specsure.config import ConfigError, resolve


def explain(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    args = build_parser().parse_args(["explain", *argv])
    config_logger = logging.getLogger("specsure.config")
    level = config_logger.level
    try:
        code = guarded(lambda: args.run(args))
    finally:
        config_logger.setLevel(level)  # explain quiets it, as main() puts back; later tests read its warnings
    return code, capsys.readouterr().err


def gguf_with(path: Path, *entries: bytes) -> Path:
    """A llama GGUF header with four layers and the extra key/value ``entries``, no tensors."""
    def text(value: str) -> bytes:
        return struct.pack("<Q", len(value)) + value.encode()

    base = [text("general.architecture") + struct.pack("<I", 8) + text("llama"),
            text("llama.block_count") + struct.pack("<II", 4, 4),
            text("llama.embedding_length") + struct.pack("<II", 4, 64),
            text("llama.vocab_size") + struct.pack("<II", 4, 1000)]
    kvs = base + list(entries)
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(kvs))
    return path


def test_an_integer_too_long_for_python_is_named_in_a_flag_and_in_a_config_json(tmp_path, capsys):
    huge = "9" * 5000
    code, err = explain(capsys, "-sc", f'{{"method": "ngram", "num_speculative_tokens": {huge}}}')
    assert code == 2 and "--speculative-config holds an integer of 5000 digits" in err
    draft = write_checkpoint(tmp_path / "draft", llama())
    (draft / "config.json").write_text(json.dumps(llama()).replace('"num_hidden_layers": 2', f'"num_hidden_layers": {huge}'))
    with pytest.raises(ConfigError, match=r"draft/config.json holds an integer of 5000 digits"):
        resolve({"model": str(draft)}, model=str(write_checkpoint(tmp_path / "target", llama(layers=4))))


@pytest.mark.parametrize("spec", [{"method": "ngram", "num_speculative_tokens": 10**5000},
                                  {"method": 10**5000}, {"method": "eagle", "speculative_token_tree": [[10**5000]]},
                                  {"method": "eagle", "speculative_token_tree": [(0,), {"a": 10**5000}]}])
def test_an_integer_too_long_to_print_is_a_config_error_from_the_api(spec):
    key = next(iter(spec)) if len(spec) == 1 else list(spec)[1]
    with pytest.raises(ConfigError, match=rf"^{key} holds an integer of more than 4000 digits"):
        resolve(spec)


@pytest.mark.parametrize("method", ["NGRAM", "Ngram", "[NGRAM]", " ngram", "[ngram] "])
@pytest.mark.parametrize("model", ["ngram", "[ngram]"])
def test_the_older_ngram_spelling_takes_the_method_in_any_case(method, model):
    res = resolve({"method": method, "model": model})
    assert res.config.method == "ngram" and res.config.model is None


@pytest.mark.parametrize("key, value", [("llama.nextn_predict_layers", -3), ("llama.block_count", -2)])
def test_a_negative_size_in_gguf_metadata_is_refused_by_its_key(tmp_path, key, value):
    name = key.encode()
    damaged = gguf_with(tmp_path / "damaged.gguf", struct.pack("<Q", len(name)) + name + struct.pack("<Ii", 5, value))
    target = write_gguf(tmp_path / "target.gguf", vocab=1000)
    for spec, model in (({"num_speculative_tokens": 2}, damaged), ({"model": str(damaged)}, target)):
        with pytest.raises(ConfigError, match=rf"{key} = {value} is not a valid size.*Download or convert it again"):
            resolve(spec, model=str(model))


def test_a_gguf_array_length_past_the_end_of_the_file_is_named(tmp_path, capsys):
    name = b"tokenizer.ggml.scores"
    array = struct.pack("<Q", len(name)) + name + struct.pack("<IIQ", 9, 0, 2**64 - 1)
    code, err = explain(capsys, "--model", str(gguf_with(tmp_path / "damaged.gguf", array)))
    assert code == 2 and "is not a readable GGUF file (file ends inside an array" in err


def test_a_path_holding_a_newline_keeps_the_error_on_one_line(tmp_path, capsys):
    folder = tmp_path / "two\nlines"
    draft = write_checkpoint(folder / "head", eagle3_head())
    target = write_checkpoint(tmp_path / "target", llama(layers=4))
    code, err = explain(capsys, "--model", str(target), "--strict", "-sc",
                        json.dumps({"method": "draft_model", "model": str(draft)}))
    assert code == 2 and err.count("\n") == 1 and "two\\nlines" in err


def test_dots_after_a_link_name_the_folder_the_os_reads(tmp_path):
    (tmp_path / "real" / "sub").mkdir(parents=True)
    write_checkpoint(tmp_path / "real" / "drafty", silent())
    (tmp_path / "eagle-dir").mkdir()
    (tmp_path / "eagle-dir" / "lnk").symlink_to(tmp_path / "real" / "sub")
    target = write_checkpoint(tmp_path / "target", llama(layers=4))
    res = resolve({"model": str(tmp_path / "eagle-dir" / "lnk" / ".." / "drafty")}, model=str(target))
    assert res.decisions["method"].source != "path", res.decisions["method"]  # not 'eagle' from a folder the draft is not in


def test_after_the_dots_a_link_keeps_the_name_it_was_given(tmp_path):
    write_checkpoint(tmp_path / "real" / "plain", silent())
    (tmp_path / "real" / "sub").mkdir()
    (tmp_path / "real" / "eagle3-head").symlink_to(tmp_path / "real" / "plain")
    (tmp_path / "beagle").mkdir()
    (tmp_path / "beagle" / "lnk").symlink_to(tmp_path / "real" / "sub")
    target = write_checkpoint(tmp_path / "target", llama(layers=4))
    res = resolve({"model": str(tmp_path / "beagle" / "lnk" / ".." / "eagle3-head")}, model=str(target))
    assert (res.config.method, res.decisions["method"].source) == ("eagle3", "path")
    assert str(tmp_path / "real" / "eagle3-head") in res.decisions["method"].reason
