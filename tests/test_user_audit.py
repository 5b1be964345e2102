"""Bad input a user's audit found (2026-12-04): each is one clear error naming the field, never a
traceback, a silent fallback or a "runnable" that the engine then refuses."""

from __future__ import annotations

import json
import logging
import shutil
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from checkpoints import deepseek_v3, eagle3_head, eagle_head, llama, mtp_head, silent, write_checkpoint
from specsure.cli.common import parse_speculative_config
from specsure.cli.main import main
from specsure.config import ConfigError, resolve
from specsure.models import ModelLoadError, load_model
from tiny import build_tiny_llama


def _edited(tiny_llama: Path, folder: Path, **fields: object) -> Path:
    shutil.copytree(tiny_llama, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **fields}))
    return folder


# --- target checkpoints: config.json that transformers rejects, weights that do not fit -------

@pytest.mark.parametrize(("fields", "message"), [
    ({"num_attention_heads": 5}, r"not a valid configuration: .*not a multiple of the number of attention heads"),
    ({"num_hidden_layers": None}, r"not a valid configuration: .*'num_hidden_layers' expected int"),
    ({"max_position_embeddings": "8k"}, r'max_position_embeddings = "8k" must be a non-negative integer'),
    ({"max_position_embeddings": -1}, r"max_position_embeddings = -1 must be a non-negative integer"),
    ({"dtype": "junk"}, r'dtype = "junk" is not a torch dtype'),
    ({"rope_scaling": {"rope_type": "weird", "factor": 2.0}}, r'rope_type = "weird" is not a rotary embedding'),
])
def test_invalid_config_field_is_named(tiny_llama: Path, tmp_path: Path, fields: dict, message: str) -> None:
    folder = _edited(tiny_llama, tmp_path / "m", **fields)
    with pytest.raises(ModelLoadError, match=message) as info:
        load_model(str(folder), "float32")
    assert "config.json" in str(info.value)


def test_fewer_layers_in_config_than_in_the_weights_is_an_error(tiny_llama: Path, tmp_path: Path) -> None:
    """transformers drops the extra layers and reports them only as unused tensors."""
    folder = _edited(tiny_llama, tmp_path / "m", num_hidden_layers=1)
    with pytest.raises(ModelLoadError, match=r"num_hidden_layers = 1, but the weights also hold decoder layer 1,"):
        load_model(str(folder), "float32")


def test_declared_mtp_layers_are_not_extra_layers(tmp_path: Path) -> None:
    folder = build_tiny_llama(tmp_path / "m", num_layers=3)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 2, "num_nextn_predict_layers": 1}))
    assert load_model(str(folder), "float32").lm.num_layers == 2


def test_truncated_safetensors_is_one_error(tiny_llama: Path, tmp_path: Path) -> None:
    folder = _edited(tiny_llama, tmp_path / "m")
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match=r"SafetensorError: .*belong together and are complete"):
        load_model(str(folder), "float32")


def test_vocab_in_config_unlike_the_weights_names_the_tensor(tmp_path: Path) -> None:
    folder = build_tiny_llama(tmp_path / "m")
    weights = load_file(folder / "model.safetensors")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "vocab_size": 200}))
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"model.embed_tokens.weight is \[128, 32\] in the weights but "
                                             r"\[200, 32\] for config.json") as info:
        load_model(str(folder), "float32")
    assert "ignore_mismatched_sizes" not in str(info.value)


# --- draft heads: explain refuses what the engine would refuse ---------------------------------

@pytest.fixture
def target(tmp_path: Path) -> str:
    return str(write_checkpoint(tmp_path / "target", llama(layers=30)))


@pytest.mark.parametrize(("spec_of", "message"), [
    (lambda d: {"method": "eagle3", "model": d("eagle3-x", silent())}, r"set method 'draft_model' to run this"),
    (lambda d: {"method": "eagle", "model": d("beagle-qwen", silent())}, r"set method 'draft_model' to run this"),
    (lambda d: {"method": "mtp", "model": d("my_mtp_head", silent())}, r"set method 'draft_model' to run this"),
    (lambda d: {"model": d("e3", eagle3_head(vocab=32000))}, r"vocab_size = 32000, but the target .* needs 49152"),
    (lambda d: {"model": d("e3", eagle3_head(eagle_aux_hidden_state_layer_ids=[2, 15, 40]))},
     r"eagle_aux_hidden_state_layer_ids = \[2, 15, 40\], but the target with num_hidden_layers=30"),
])
def test_head_checkpoint_the_engine_cannot_run_is_not_runnable(tmp_path: Path, target: str, spec_of, message) -> None:
    def draft(name: str, config: dict) -> str:
        tensors = ["model.embed_tokens.weight", "lm_head.weight"] if config is not None and \
            config["architectures"] == ["LlamaForCausalLM"] else None
        return str(write_checkpoint(tmp_path / name, config, tensors))

    res = resolve(spec_of(draft), model=target)
    with pytest.raises(ConfigError, match=message):
        res.check_runnable()


def test_a_one_layer_whole_model_is_a_draft_model_whatever_its_folder_says(tmp_path: Path, target: str) -> None:
    # one layer, but a whole model's embedding (model.embed_tokens.weight): metadata, which outranks the
    # folder's name, so an unset method is draft_model and an explicit one gets no warning
    draft = str(write_checkpoint(tmp_path / "eagle3-but-not", silent(), ["model.embed_tokens.weight", "lm_head.weight"]))
    res = resolve({"model": draft}, model=target, strict=True)
    assert (res.config.method, res.source("method"), res.warnings) == ("draft_model", "checkpoint", ())
    assert "tensor model.embed_tokens.weight" in res.reason("method")
    res.check_runnable()
    assert not resolve({"method": "draft_model", "model": draft}, model=target, strict=True).warnings


def test_a_real_eagle3_head_still_resolves_runnable(tmp_path: Path, target: str) -> None:
    resolve({"model": str(write_checkpoint(tmp_path / "e3", eagle3_head()))}, model=target).check_runnable()


# --- the CLI's own input --------------------------------------------------------------------

def test_a_key_given_twice_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"gives 'method' twice \(\"ngram\" and \"suffix\"\)"):
        parse_speculative_config('{"method": "ngram", "method": "suffix"}')


@pytest.mark.parametrize(("text", "said"), [("", "is empty"), ("  ", "is empty"), ("{}", "is {}, which sets nothing")])
def test_a_config_that_sets_nothing_is_off_and_says_so(text: str, said: str, caplog: pytest.LogCaptureFixture) -> None:
    """An unset shell variable ("$SPEC") turns speculation off as in vLLM, but not silently."""
    with caplog.at_level(logging.WARNING, logger="specsure.cli.common"):
        assert parse_speculative_config(text) in (None, {})
    assert f"--speculative-config {said}" in caplog.text and "plain decoding runs" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="specsure.cli.common"):
        assert parse_speculative_config(None) is None and parse_speculative_config("null") is None  # as meant
    assert caplog.text == ""


def test_a_byte_order_mark_is_read_past(tmp_path: Path) -> None:
    path = tmp_path / "spec.json"
    path.write_bytes(b'\xef\xbb\xbf{"method": "ngram"}')
    assert parse_speculative_config(f"@{path}") == {"method": "ngram"}


def test_an_unknown_home_directory_is_an_error() -> None:
    with pytest.raises(ConfigError, match="cannot expand the path"):
        parse_speculative_config("@~no-such-user-here/spec.json")


@pytest.mark.parametrize("command", [["explain"], ["export", "--to", "vllm"]])
def test_json_output_on_an_error_is_still_json(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    rc = main([*command, "--json", "--speculative-config", '{"method": "bogus"}'])
    out, err = capsys.readouterr()
    assert rc == 2 and 'unknown method "bogus"' in json.loads(out)["error"] and err.startswith("error:")


def test_demo_refuses_zero_repeats(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["demo", "--repeats", "0"])
    assert stop.value.code == 2 and "--repeats: 0 must be at least 1" in capsys.readouterr().err


def test_a_closed_stdout_is_no_traceback() -> None:
    """`specsure explain ... | head -c 1`: the reader leaves early; no traceback, no complaint."""
    proc = subprocess.Popen([sys.executable, "-m", "specsure", "explain", "--json", "--speculative-config",
                             '{"method": "ngram"}'], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the child writes: its writes hit a closed pipe
    err = proc.stderr.read().decode()
    proc.wait(timeout=60)
    assert "Traceback" not in err and proc.returncode in (0, 1), err


def test_a_vllm_only_key_is_named_as_such() -> None:
    with pytest.raises(ConfigError, match=r"'draft_tensor_parallel_size' is a key of vLLM's speculative config"):
        resolve({"method": "ngram", "draft_tensor_parallel_size": 1})


def test_export_expands_a_home_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Quoted in the printed command, ~ would reach vLLM literally (a Hugging Face repo id to it)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    write_checkpoint(tmp_path / "target", llama(layers=4))
    write_checkpoint(tmp_path / "draft", llama(layers=2))
    for engine in ("vllm", "sglang"):
        rc = main(["export", "--to", engine, "--model", "~/target", "--speculative-config",
                   '{"method": "draft_model", "model": "~/draft"}'])
        out = capsys.readouterr().out
        assert rc == 0 and "~" not in out and str(tmp_path / "draft") in out and str(tmp_path / "target") in out


def test_export_keeps_a_path_that_starts_with_a_dash_a_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """`--model -tgt` would be an option to vLLM's and SGLang's parsers, not a path."""
    monkeypatch.chdir(tmp_path)
    write_checkpoint(tmp_path / "-tgt", llama(layers=4))
    write_checkpoint(tmp_path / "-draft", llama(layers=2))
    for engine, flag in (("vllm", "--model"), ("sglang", "--speculative-draft-model-path")):
        rc = main(["export", "--to", engine, "--model=-tgt", "--speculative-config", '{"model": "-draft"}'])
        words = shlex.split(capsys.readouterr().out.strip().splitlines()[-1])
        assert rc == 0 and not any(w.startswith("-") and w.strip("-") in ("tgt", "draft") for w in words), words
        assert words[words.index(flag) + 1].startswith("./-")


@pytest.mark.slow
def test_the_packaged_gguf_by_its_path_reuses_the_default_conversion(default_model_cache: Path) -> None:
    from specsure.models.gguf_cache import packaged_default_gguf
    from specsure.models.loading import weights_folder

    assert weights_folder(str(packaged_default_gguf())) == weights_folder(None)


@pytest.mark.parametrize("method", ["mtp", "eagle3"])
def test_the_packaged_gguf_by_its_path_gets_the_shipped_heads(method: str) -> None:
    """The default model named by its file is the default model: the head shipped for it applies."""
    from specsure.config.checkpoint import default_gguf_path

    path = default_gguf_path()
    assert path is not None
    by_path, default = resolve({"method": method}, model=str(path)), resolve({"method": method})
    assert (by_path.config.model, by_path.source("model")) == (default.config.model, "default")
    assert by_path.config.speculative_token_tree == default.config.speculative_token_tree


@pytest.mark.parametrize(("where", "ids", "engine", "message"), [
    # vLLM 0.33.0's default runner (V2) reads only a top-level list: one under eagle_config is not read
    ("eagle_config", [1], "vllm", "default model runner (V2) would fuse target layers [2, 15, 27], not [1]"),
    ("eagle_config", [3, 1, 0], "vllm", "not [0, 1, 3] as specsure does"),
    ("eagle_config", [3, 1, 0], "vllm", "VLLM_USE_V2_MODEL_RUNNER=0"),
    ("eagle_config", [2, 15, 27], "vllm", None),  # the default layers: the same either way
    ("top", [3, 1, 0], "vllm", None),  # read, and fused ascending, as specsure does
    ("top", [1, 3, 5, 7], "vllm", "vLLM builds the head's fc for 3 target layers"),  # a Llama head sizes fc by eagle_config
    ("eagle_config", [1, 3, 5, 7], "vllm", "default model runner (V2)"),
    ("eagle_config", [1], "sglang", "fuses 1 target layer(s)"),
    ("eagle_config", [2, 15, 27], "sglang", "reads listed ids as layer outputs"),
    ("eagle_config", [3, 1, 0], "sglang", "reads listed ids"),
])
def test_export_warns_of_aux_layers_the_engines_read_otherwise(tmp_path: Path, target: str, where: str, ids: list[int],
                                                               engine: str, message: str | None) -> None:
    from specsure.config.export import export

    placed = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": ids}} if where == "eagle_config" else {
        "eagle_aux_hidden_state_layer_ids": ids}
    head = write_checkpoint(tmp_path / "e3", eagle3_head(**placed))
    warnings = " ".join(export(resolve({"model": str(head)}, model=target), engine).warnings)
    assert (message in warnings) if message else "eagle_aux_hidden_state_layer_ids" not in warnings


@pytest.mark.parametrize(("ids", "refused"), [([1, 3, 5, 7], True), ([3, 1, 0], False)])
def test_strict_export_refuses_an_fc_vllm_refuses_and_keeps_what_it_runs(tmp_path: Path, target: str, ids: list[int],
                                                                         refused: bool) -> None:
    """A head vLLM builds a narrower fc for fails to load there: strict makes that export an error, while a
    list vLLM reads as specsure does exports as before."""
    from specsure.config.export import export

    head = write_checkpoint(tmp_path / "e3", eagle3_head(eagle_aux_hidden_state_layer_ids=ids))
    res = resolve({"model": str(head)}, model=target)
    if refused:
        with pytest.raises(ConfigError, match=r"vLLM builds the head's fc for 3 target layers.*strict mode"):
            export(res, "vllm", strict=True)
        assert " ".join(export(res, "vllm").warnings).count("vLLM builds the head's fc") == 1  # said once
    else:
        assert export(res, "vllm", strict=True).warnings == export(res, "vllm").warnings
    assert export(res, "sglang", strict=True).engine == "sglang"


@pytest.mark.parametrize(("prompt", "words"), [
    ([1, "a"], "mixes token ids with other values"), ([True, 2], r"prompt 0 holds True \(bool\)"), (b"hello", "is bytes"),
    ([[1.0, 2.0]], r"holds 1.0 \(float\), which is not a token id"), ([5.0, 6.0], r"prompt 0 holds 5.0 \(float\)"),
    (__import__("numpy").array([1, 2]), r"got ndarray \(.tolist\(\) makes one"),
])
def test_engine_prompts_of_the_wrong_type_are_one_clear_error(tiny_llama: Path, prompt: object, words: str) -> None:
    from specsure import SamplingParams, make_engine

    with pytest.raises(ValueError, match=words):
        make_engine(str(tiny_llama), dtype="float32").generate(prompt, SamplingParams(max_tokens=2))


def test_engine_takes_numpy_token_ids(tiny_llama: Path) -> None:
    import numpy as np

    from specsure import SamplingParams, make_engine

    engine, params = make_engine(str(tiny_llama), dtype="float32"), SamplingParams(max_tokens=3)
    assert engine.generate([np.int64(5), np.int64(6)], params)[0].token_ids == engine.generate([5, 6], params)[0].token_ids


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"seed": "1"}, "seed = '1' must be None or an int"), ({"seed": -1}, "seed = -1"),
    ({"strict": "yes"}, "strict = 'yes' must be True or False"), ({"dtype": ["float32"]}, "dtype = \\['float32'\\]"),
    ({"max_num_seqs": 0}, "max_num_seqs = 0 must be an int >= 1"),
])
def test_make_engine_checks_its_arguments_before_loading(monkeypatch: pytest.MonkeyPatch, kwargs: dict,
                                                         words: str) -> None:
    import specsure.decode.engine as engine_module

    monkeypatch.setattr(engine_module, "load_model", lambda *a, **k: pytest.fail("the model loaded first"))
    with pytest.raises(ValueError, match=words):
        engine_module.make_engine(None, None, **kwargs)


# --- explain refuses, before loading, what the proposers refuse at load -------------------------

@pytest.mark.parametrize(("method", "head"), [
    ("eagle", eagle_head(hidden_size=48)), ("eagle3", eagle3_head(target_hidden_size=48)),
    ("eagle3", eagle3_head(hidden_size=48)),  # shares the target's embedding (no embed_tokens.weight)
    ("mtp", mtp_head(hidden_size=48)),
])
def test_a_head_of_another_width_is_refused_by_resolution(tmp_path: Path, method: str, head: dict) -> None:
    target = write_checkpoint(tmp_path / "target", llama())  # hidden_size 64
    draft = write_checkpoint(tmp_path / "head", head)
    res = resolve({"method": method, "model": str(draft)}, model=str(target))
    with pytest.raises(ConfigError, match=r"hidden_size = 48, but .*needs 64"):
        res.check_runnable()


def test_an_eagle3_head_with_its_own_embedding_may_be_narrower(tmp_path: Path) -> None:
    target = write_checkpoint(tmp_path / "target", llama(layers=8))
    names = ["fc.weight", "midlayer.hidden_norm.weight", "d2t", "t2d", "lm_head.weight", "embed_tokens.weight"]
    draft = write_checkpoint(tmp_path / "head", eagle3_head(hidden_size=48), names)
    resolve({"method": "eagle3", "model": str(draft)}, model=str(target)).check_runnable()


@pytest.mark.parametrize("holder", ["head", "target"])
def test_a_tree_on_two_mtp_modules_is_refused_by_resolution(tmp_path: Path, holder: str) -> None:
    tree = "[(0,), (1,)]"
    if holder == "head":
        target = write_checkpoint(tmp_path / "target", llama())
        spec = {"method": "mtp", "model": str(write_checkpoint(tmp_path / "mtp2", mtp_head(modules=2))),
                "speculative_token_tree": tree}
    else:
        target = write_checkpoint(tmp_path / "target", deepseek_v3(mtp_layers=2))
        spec = {"method": "mtp", "speculative_token_tree": tree}
    res = resolve(spec, model=str(target))
    with pytest.raises(ConfigError, match="speculative_token_tree needs a head with one module.*has 2"):
        res.check_runnable()
    resolve({**spec, "speculative_token_tree": "[(0,), (0, 0)]"}, model=str(target)).check_runnable()  # a chain


def test_a_config_declaring_modules_its_weights_lack_is_a_plain_draft(tmp_path: Path) -> None:
    """transformers writes num_nextn_predict_layers = 1 into every DeepSeek-V3 config it saves, without
    MTP weights: such a one-layer draft is a causal LM, not an MTP head."""
    target = write_checkpoint(tmp_path / "target", deepseek_v3(mtp_layers=0))
    plain = write_checkpoint(tmp_path / "draft", deepseek_v3(layers=1),
                             ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "lm_head.weight"])
    res = resolve({"method": "draft_model", "model": str(plain)}, model=str(target))
    res.check_runnable()
    assert not res.warnings
    with_mtp = write_checkpoint(tmp_path / "with-mtp", deepseek_v3(layers=1))  # model.layers.1.eh_proj stored
    with pytest.raises(ConfigError, match="is an MTP head"):
        resolve({"method": "draft_model", "model": str(with_mtp)}, model=str(target)).check_runnable()


def test_a_target_declaring_modules_its_weights_lack_is_not_detected_as_mtp(tmp_path: Path) -> None:
    target = write_checkpoint(tmp_path / "target", deepseek_v3(layers=2),
                              ["model.embed_tokens.weight", "model.layers.1.mlp.gate.weight", "lm_head.weight"])
    with pytest.raises(ConfigError, match="num_nextn_predict_layers=1 declares some, but its weights store none"):
        resolve({"num_speculative_tokens": 2}, model=str(target))
    res = resolve({"prompt_lookup_max": 3}, model=str(target))  # ngram, with no MTP evidence against it
    assert res.config.method == "ngram" and not res.warnings
    with pytest.raises(ConfigError, match="saved without its MTP weights"):  # asked for: the precise refusal
        resolve({"method": "mtp"}, model=str(target)).check_runnable()


QWEN3_NEXT_MTP = ["model.embed_tokens.weight", "lm_head.weight", "mtp.fc.weight", "mtp.layers.0.mlp.gate.weight",
                  "mtp.pre_fc_norm_embedding.weight"]


@pytest.mark.parametrize("nested", [False, True], ids=["qwen3-next", "qwen3.5-text-config"])
def test_mtp_layers_in_another_layout_are_named_not_called_missing(tmp_path: Path, nested: bool) -> None:
    count = {"mtp_num_hidden_layers": 1}
    config = ({"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
               "text_config": {**llama(), **count}} if nested else {**llama(), **count})
    target = write_checkpoint(tmp_path / "target", config, QWEN3_NEXT_MTP)
    key = "text_config.mtp_num_hidden_layers" if nested else "mtp_num_hidden_layers"
    with pytest.raises(ConfigError) as err:
        resolve({"method": "mtp"}, model=str(target)).check_runnable()
    msg = str(err.value)
    assert f"{key}=1 declares" in msg and "another layout" in msg and "'mtp.fc.weight'" in msg, msg
    assert "saved without" not in msg and "declares none" not in msg
    with pytest.raises(ConfigError, match="another layout"):  # detection says why it found no MTP layers
        resolve({"num_speculative_tokens": 2}, model=str(target))


@pytest.mark.parametrize(("argv", "words"), [
    (["generate", "-n", "8", "hi"], "-n is llama.cpp's flag, not one of `specsure generate`'s; use --max-tokens N"),
    (["generate", "--ctx-size=256", "hi"], "--ctx-size is llama.cpp's flag, not one of `specsure generate`'s; use "
                                            "--max-model-len N"),
    (["bench", "--max-model-len", "4096"], "`specsure serve` and `specsure generate` cap it with --max-model-len N"),
    (["serve", "-n", "64"], "-n is llama.cpp's flag, not one of `specsure serve`'s; send max_tokens in each request"),
    (["bench", "-ngl", "99"], "-ngl is llama.cpp's flag, not one of `specsure bench`'s; there is no flag for it"),
    (["explain", "-t", "4"], "`specsure explain` has no such flag"),
    (["generate", "-md", "d.gguf", "hi"], "the draft goes in --speculative-config '{\"model\": \"DRAFT\"}'"),
    (["serve", "--trust-remote-code"], "specsure never runs a checkpoint's own code"),
    (["generate", "-r", "User:", "hi"], "use --stop TEXT"), (["generate", "--draft", "5", "hi"], "num_speculative_tokens"),
    (["generate", "--grammar-file", "g.gbnf", "hi"], "use --structured-outputs"),
    (["serve", "--grammar", "root ::= x"], "send structured_outputs in each request"),
    (["generate", "-hf", "a/b", "hi"], "specsure reads local files only"),
    (["generate", "--chat-template", "x", "hi"], "`specsure serve --chat-template` replaces it"),
    (["generate", "--tokenizer", "org/repo", "hi"], "the tokenizer is the model's own"),
    (["generate", "--served-model-name", "x", "hi"], "`specsure serve --served-model-name` names the served model"),
    (["serve", "--quantization", "awq"], "a GGUF file's Q4_0 to Q8_0 and K-quant blocks are read as they are"),
    (["serve", "--enforce-eager"], "with no CUDA graphs to turn off"), (["serve", "--kv-cache-dtype", "fp8"], "--dtype"),
    (["serve", "--seed", "3"], "--seed is vLLM's flag, not one of `specsure serve`'s; send seed in each request"),
    (["generate", "--seed", "3", "hi"], None),  # generate's own flag: no hint
    (["serve", "--enable-chunked-prefill"], "use --max-num-batched-tokens N"),
])
def test_another_engines_flag_says_what_specsure_takes(argv: list[str], words: str | None,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """llama.cpp's and vLLM's habits get the specsure spelling, not 'unrecognized arguments: hi'."""
    from specsure.cli.foreign_flags import foreign_flag_hint
    from specsure.cli.main import build_parser

    if words is None:  # spelled alike in both engines: the command's own flag, which argparse takes
        parser = build_parser([argv[0]]).get_default("command_parsers")[argv[0]]
        assert foreign_flag_hint(argv[1:], argv[0], parser._option_string_actions) is None
        return
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and "unrecognized" not in err, err


@pytest.mark.parametrize("command", ["generate", "serve", "bench", "explain", "train", "demo"])
def test_vllms_dtype_aliases_are_read_as_the_names_they_stand_for(command: str) -> None:
    from specsure.cli.main import build_parser

    parser = build_parser([command]).get_default("command_parsers")[command]
    required = {"generate": ["hi"], "train": ["--out", "x"]}.get(command, [])  # what the command cannot do without
    assert parser.parse_known_args([*required, "--dtype", "half"])[0].dtype == "float16"
    assert parser.parse_known_args([*required, "--dtype", "float"])[0].dtype == "float32"
    with pytest.raises(SystemExit):
        parser.parse_known_args([*required, "--dtype", "double"])


@pytest.mark.parametrize(("argv", "usage"), [(["explain", "--bogus", "w5"], "usage: specsure explain "),
                                             (["bench", "serve", "--bogus"], "usage: specsure bench serve ")])
def test_an_unknown_flag_after_a_command_shows_that_commands_usage(capsys, argv: list[str], usage: str) -> None:  # noqa: ANN001
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith(usage) and "unrecognized arguments: --bogus" in err


@pytest.mark.parametrize(("tensors", "family"), [
    (["model.mtp_layers.0.input_proj.weight", "model.mtp_layers.0.final_layernorm.weight"], "MiMo"),
    (["model.mtp_block.0.self_attn.q_proj.weight", "model.mtp_emb_norm.0.weight"], "ERNIE 4.5"),
])
def test_mimo_and_ernie_mtp_layers_are_named_not_called_missing(tmp_path: Path, tensors: list[str],
                                                                family: str) -> None:
    target = write_checkpoint(tmp_path / "target", {**llama(), "num_nextn_predict_layers": 1},
                              ["model.embed_tokens.weight", "lm_head.weight", *tensors])
    with pytest.raises(ConfigError) as err:
        resolve({"num_speculative_tokens": 1}, model=str(target))
    msg = str(err.value)
    assert "another layout (2 tensors under" in msg and f"as {family} stores them" in msg and "store none" not in msg


def test_ctrl_c_that_a_library_turned_into_its_own_error_exits_130(capsys) -> None:  # noqa: ANN001
    """transformers' lazy importer, interrupted while it imports, raises ModuleNotFoundError from it."""
    from specsure.cli.guard import guarded

    def importing() -> int:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as exc:
            raise ModuleNotFoundError("Could not import module 'PreTrainedModel'") from exc

    assert guarded(importing) == 130 and "interrupted" in capsys.readouterr().err


def test_the_generate_errors_are_public_and_sampling_params_take_keywords() -> None:
    import specsure
    from specsure.decode.completion import ParamsError, PromptError

    assert specsure.ParamsError is ParamsError and specsure.PromptError is PromptError
    assert issubclass(specsure.SamplingError, ValueError) and specsure.StepUpdate and specsure.TokenLogprob
    with pytest.raises(TypeError, match="positional"):
        specsure.SamplingParams(2)  # vLLM's first positional is n: ported code must not mean max_tokens silently


def test_a_tokenizer_that_fails_on_a_prompt_is_a_prompt_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A vocabulary without <unk> raised transformers' bare Exception at encode, past the CLI's guard."""
    from serving import build_tiny_chat_model

    from specsure import PromptError, make_engine

    engine = make_engine(str(build_tiny_chat_model(tmp_path / "chat")), dtype="float32")

    def fails(*_args, **_kwargs):  # noqa: ANN002, ANN003, ANN202
        raise Exception("Unk token `None` not found in the vocabulary")

    monkeypatch.setattr(type(engine.tokenizer), "__call__", fails)
    with pytest.raises(PromptError, match="cannot be encoded by the model's tokenizer .*Unk token"):
        engine.encode("w1 w2")


def test_a_hub_repository_id_as_a_model_says_specsure_never_downloads(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.chdir(tmp_path)  # so the id is no folder here
    with pytest.raises(ConfigError) as err:
        resolve({"method": "ngram"}, model="HuggingFaceTB/SmolLM2-135M-Instruct")
    assert "never downloads from the Hugging Face hub" in str(err.value)
    assert "hf download HuggingFaceTB/SmolLM2-135M-Instruct --local-dir DIR" in str(err.value)
    for missing in ("/no/such/folder", "models/model.gguf"):  # paths, not ids
        with pytest.raises(ConfigError) as err:
            resolve({"method": "ngram"}, model=missing)
        assert "does not exist" in str(err.value) and "hub" not in str(err.value)


def test_version_is_the_packages(capsys: pytest.CaptureFixture[str]) -> None:
    import tomllib

    from specsure import __version__

    declared = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]["version"]
    assert __version__ == declared
    for flag in ("--version", "-V"):
        with pytest.raises(SystemExit) as info:
            main([flag])
        assert info.value.code == 0 and capsys.readouterr().out == f"specsure {declared}\n"
