"""One test per class of bad input: a ConfigError whose message names the field, the value, the fix."""

from __future__ import annotations

import json

import pytest

from checkpoints import EAGLE_TENSORS, deepseek_v3, eagle3_head, eagle_head, llama, write_checkpoint
from specsure.config import ConfigConflictError, ConfigError, resolve


@pytest.fixture
def target(tmp_path):
    return str(write_checkpoint(tmp_path / "target", llama(layers=4)))


@pytest.fixture
def draft(tmp_path):
    return str(write_checkpoint(tmp_path / "draft", llama(layers=2)))


def error_of(spec, model, **kw) -> str:
    with pytest.raises(ConfigError) as info:
        resolve(spec, model=model, **kw)
    assert not isinstance(info.value, ConfigConflictError)
    return str(info.value)


def unrunnable(spec, model) -> str:
    res = resolve(spec, model=model)
    with pytest.raises(ConfigError) as info:
        res.check_runnable()
    return str(info.value)


# --- the user's keys and values ------------------------------------------------------------

def test_unknown_key_suggests_the_closest(target):
    msg = error_of({"method": "ngram", "num_speculative_token": 4}, target)
    assert "'num_speculative_token'" in msg and "Did you mean 'num_speculative_tokens'?" in msg
    assert "Valid keys:" in msg and "prompt_lookup_max" in msg


def test_unknown_key_far_from_everything_lists_valid_keys(target):
    msg = error_of({"method": "ngram", "zzz": 1}, target)
    assert "'zzz'" in msg and "Did you mean" not in msg and "num_speculative_tokens" in msg


def test_unknown_method_suggests_the_closest(target):
    msg = error_of({"method": "eagel3"}, target)
    assert 'unknown method "eagel3"' in msg and "Did you mean 'eagle3'?" in msg
    assert "ngram, draft_model, eagle, eagle3, mtp" in msg


@pytest.mark.parametrize("method", ["medusa", "mlp_speculator", "dflash", "dspark"])
def test_foreign_vllm_method_is_named_as_such(target, method):
    msg = error_of({"method": method}, target)
    assert f'"{method}"' in msg and "specsure does not run" in msg and "eagle3" in msg


def test_method_of_wrong_type(target):
    msg = error_of({"method": 3}, target)
    assert "method = 3 must be a string" in msg and "ngram" in msg


@pytest.mark.parametrize(("value", "shown", "hint"), [
    ("4", '"4"', "Write 4 without quotes or decimals."),
    ("4.0", '"4.0"', "Write 4 without quotes or decimals."),
    (4.0, "4.0", "Write 4 without quotes or decimals."),
    (2.5, "2.5", None),
    (100.0, "100.0", None),  # writing 100 would only meet the range error next
    ("0", '"0"', None),
    (True, "true", None),
    ([4], "[4]", None),
])
def test_num_speculative_tokens_wrong_type(target, value, shown, hint):
    msg = error_of({"method": "ngram", "num_speculative_tokens": value}, target)
    assert msg.startswith(f"num_speculative_tokens = {shown} must be an integer from 1 to 64.")
    if hint:
        assert hint in msg
    else:
        assert "Write" not in msg


@pytest.mark.parametrize("value", [0, -1, 65, 10**9])
def test_num_speculative_tokens_out_of_range(target, value):
    msg = error_of({"method": "ngram", "num_speculative_tokens": value}, target)
    assert msg == f"num_speculative_tokens = {value} is out of range: it must be from 1 to 64."


@pytest.mark.parametrize("key", ["prompt_lookup_min", "prompt_lookup_max"])
def test_prompt_lookup_out_of_range(target, key):
    msg = error_of({"method": "ngram", key: 0}, target)
    assert f"{key} = 0 is out of range" in msg


@pytest.mark.parametrize("value, words", [
    (1, "out of range: it must be >= 2"), (0, "out of range"), ("8", 'must be an integer >= 2'),
    (True, "must be an integer >= 2"), (8.0, "Write 8 without quotes or decimals"),
])
def test_disable_by_batch_size_out_of_range_or_of_the_wrong_type(target, value, words):
    msg = error_of({"method": "ngram", "disable_by_batch_size": value}, target)
    assert "disable_by_batch_size" in msg and words in msg


def test_prompt_lookup_min_above_max(target):
    msg = error_of({"method": "ngram", "prompt_lookup_min": 5, "prompt_lookup_max": 3}, target)
    assert "prompt_lookup_min = 5" in msg and "prompt_lookup_max = 3" in msg
    assert "Set prompt_lookup_min <= 3" in msg


def test_prompt_lookup_on_a_non_ngram_method(tmp_path, draft, target):
    msg = error_of({"method": "draft_model", "model": draft, "prompt_lookup_max": 3}, target)
    assert "prompt_lookup_max = 3 applies only to method 'ngram'" in msg and "'draft_model'" in msg
    assert "Remove prompt_lookup_max, or set method 'ngram'" in msg


def test_model_and_draft_model_disagree(target, draft, tmp_path):
    other = str(write_checkpoint(tmp_path / "other", llama(layers=2)))
    msg = error_of({"method": "draft_model", "model": draft, "draft_model": other}, target)
    assert repr(draft) in msg and repr(other) in msg and "Give only one of them" in msg


@pytest.mark.parametrize("first", ["model", "draft_model"])
def test_model_and_draft_model_disagreeing_name_each_value_under_its_own_key(target, draft, tmp_path, first):
    other = str(write_checkpoint(tmp_path / "other", llama(layers=2)))
    second = "draft_model" if first == "model" else "model"
    msg = error_of({"method": "draft_model", first: draft, second: other}, target)
    assert f"{first!r} = {draft!r} and {second!r} = {other!r} disagree" in msg


def test_model_and_draft_model_agreeing_is_fine(target, draft):
    res = resolve({"method": "draft_model", "model": draft, "draft_model": draft}, model=target)
    assert res.config.model == draft


def test_ngram_with_a_model(target, draft):
    msg = error_of({"method": "ngram", "model": draft}, target)
    assert f"model = {draft!r} is not used by method 'ngram'" in msg
    assert "Remove 'model', or choose method 'draft_model'" in msg


@pytest.mark.parametrize("method", ["ngram", "suffix"])
def test_a_method_without_a_draft_given_a_head_names_the_heads_method(target, tmp_path, method):
    """The fix follows the checkpoint: an EAGLE-3 head cannot run as draft_model, so that is not offered."""
    head = str(write_checkpoint(tmp_path / "head", eagle3_head()))
    msg = error_of({"method": method, "model": head}, target)
    assert "Remove 'model', or choose method 'eagle3'" in msg and "LlamaForCausalLMEagle3" in msg
    assert "'draft_model'" not in msg


def test_model_and_draft_model_spelling_one_folder_agree(target, draft, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = resolve({"method": "draft_model", "model": "./draft", "draft_model": draft}, model=target)
    assert res.config.model == draft


def test_a_method_a_path_hint_chose_that_cannot_run_says_it_came_from_the_path(target, tmp_path):
    """A whole model in an "mtp_logs" folder: the path hint fills method, the model cannot run it, and the
    error says the method was never set and how to set it, instead of answering a choice nobody made."""
    draft = str(write_checkpoint(tmp_path / "mtp_logs", llama(layers=1)))
    res = resolve({"model": draft}, model=target)
    assert (res.config.method, res.source("method")) == ("mtp", "path")
    with pytest.raises(ConfigError, match=r"needs an MTP head.*You did not set the method: .*path token 'mtp'.*"
                                          r"Set \"method\" yourself: \"draft_model\""):
        res.check_runnable()
    with pytest.raises(ConfigError) as explicit:  # asked for by name: no such note
        resolve({"method": "mtp", "model": draft}, model=target).check_runnable()
    assert "You did not set the method" not in str(explicit.value)


@pytest.mark.parametrize("value", ["", "   ", 7])
def test_model_of_wrong_type_or_empty(target, value):
    msg = error_of({"method": "draft_model", "model": value}, target)
    assert f"model = {json.dumps(value)} must be a non-empty path" in msg


def test_model_null_for_a_method_that_needs_a_draft(target):
    msg = error_of({"method": "draft_model", "model": None}, target)
    assert "model = null" in msg and "'draft_model' needs a draft checkpoint" in msg


def test_model_null_is_an_explicit_no_draft_for_ngram_and_mtp(target):
    # vLLM configs often carry "model": null; it means "no separate draft", given by the user.
    res = resolve({"method": "ngram", "model": None}, model=target)
    assert res.config.model is None and res.source("model") == "user" and res.warnings == ()
    res = resolve({"method": "mtp", "model": None}, model=target)
    assert res.config.model is None and res.source("model") == "user"
    assert "MTP layers inside the target" in res.reason("model")


def test_method_needing_a_model_without_one(target):
    msg = error_of({"method": "eagle3"}, target)
    assert "method 'eagle3' needs 'model'" in msg and "EAGLE-3 head" in msg


def test_nothing_to_detect_the_method_from(target):
    msg = error_of({"num_speculative_tokens": 3}, target)
    assert "method is not set" in msg and "Set method to one of" in msg


def test_speculative_config_not_a_mapping(target):
    msg = error_of(["ngram"], target)
    assert "must be a JSON object" in msg and "list" in msg


# --- checkpoints -------------------------------------------------------------------------

def test_draft_path_that_does_not_exist(tmp_path, target):
    missing = str(tmp_path / "no-such-draft")
    msg = error_of({"method": "draft_model", "model": missing}, target)
    assert msg.startswith("model (the draft checkpoint):") and repr(missing) in msg and "does not exist" in msg


def test_target_path_that_does_not_exist(tmp_path):
    msg = error_of({"method": "ngram"}, str(tmp_path / "nope"))
    assert msg.startswith("target (the model):") and "does not exist" in msg and "nope" in msg


@pytest.mark.parametrize("path", ["~no-such-user-xyz/draft", "d" * 300, "a\x00b"])
def test_draft_path_that_is_not_a_usable_path(target, path):
    msg = error_of({"method": "draft_model", "model": path}, target)
    assert msg.startswith("model (the draft checkpoint): checkpoint path")


def test_draft_folder_without_config_json(tmp_path, target):
    folder = write_checkpoint(tmp_path / "bare", None)
    msg = error_of({"method": "draft_model", "model": str(folder)}, target)
    assert "has no config.json" in msg and "bare" in msg


def test_draft_file_that_is_not_gguf(tmp_path, target):
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"\0" * 16)
    msg = error_of({"method": "draft_model", "model": str(weights)}, target)
    assert "is a file but not a .gguf file" in msg
    blob = tmp_path / "sha256-0123"  # how Ollama keeps a GGUF
    blob.write_bytes(b"GGUF" + b"\0" * 12)
    msg = error_of({"method": "draft_model", "model": str(blob)}, target)
    assert "is a GGUF file by its first bytes" in msg and f"ln -s {blob}" in msg


def test_malformed_config_json_names_the_file(tmp_path, target):
    folder = write_checkpoint(tmp_path / "broken", '{"architectures": ["LlamaForCausalLM"],')
    msg = error_of({"method": "draft_model", "model": str(folder)}, target)
    assert str(folder / "config.json") in msg and "is not valid JSON" in msg and "line 1" in msg


def test_config_json_that_is_not_an_object(tmp_path, target):
    folder = write_checkpoint(tmp_path / "list", "[1, 2]")
    msg = error_of({"method": "draft_model", "model": str(folder)}, target)
    assert str(folder / "config.json") in msg and "must hold a JSON object, got list" in msg


@pytest.mark.parametrize(("key", "value", "expected"), [
    ("num_hidden_layers", "2", 'num_hidden_layers = "2" must be a non-negative integer'),
    ("vocab_size", -1, "vocab_size = -1 must be a non-negative integer"),
    ("vocab_size", 0, "vocab_size = 0 must be a positive integer"),  # was told as a vocabulary mismatch
    ("hidden_size", 0, "hidden_size = 0 must be a positive integer"),
    ("max_position_embeddings", 0, "max_position_embeddings = 0 must be a positive integer"),  # was no limit
    ("num_nextn_predict_layers", True, "num_nextn_predict_layers = true must be a non-negative integer"),
    ("n_predict", -3, "n_predict = -3 must be a non-negative integer"),
    ("architectures", "LlamaForCausalLM", 'architectures = "LlamaForCausalLM" must be a list of strings'),
    ("eagle_config", [2], "eagle_config = [2] must be a JSON object"),
    ("model_type", ["deepseek_mtp"], 'model_type = ["deepseek_mtp"] must be a string'),  # was read as no type
])
def test_config_json_with_wrong_field_types(tmp_path, target, key, value, expected):
    folder = write_checkpoint(tmp_path / "typed", {**llama(layers=2), key: value})
    msg = error_of({"method": "draft_model", "model": str(folder)}, target)
    assert str(folder / "config.json") in msg and expected in msg


def test_damaged_safetensors_header_names_the_file(tmp_path, target):
    folder = write_checkpoint(tmp_path / "damaged", llama(layers=2), weights="none")
    (folder / "model.safetensors").write_bytes(b"\x05\0\0\0\0\0\0\0{nope")
    msg = error_of({"method": "draft_model", "model": str(folder)}, target)
    assert "model.safetensors is not a readable safetensors file" in msg


def test_deeply_nested_config_json_is_a_config_error(tmp_path, target):
    folder = write_checkpoint(tmp_path / "deep", "[" * 100_000)
    msg = error_of({"method": "draft_model", "model": str(folder)}, target)
    assert str(folder / "config.json") in msg and "nests too deeply" in msg


def test_deeply_nested_safetensors_header_is_a_config_error(tmp_path, target):
    folder = write_checkpoint(tmp_path / "deep-header", llama(layers=2), weights="none")
    header = b"[" * 100_000
    (folder / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    msg = error_of({"method": "draft_model", "model": str(folder)}, target)
    assert "model.safetensors is not a readable safetensors file" in msg and "nests too deeply" in msg


def test_target_that_is_neither_folder_nor_file():
    msg = error_of({"method": "ngram"}, "/dev/null")
    assert "'/dev/null' is neither a folder nor a regular file" in msg


# --- the method cannot run on these checkpoints (check_runnable; architecture.md "Resolution rules", 4) -------------

def test_draft_vocab_differs_from_target(tmp_path, target):
    draft = str(write_checkpoint(tmp_path / "draft", llama(layers=2, vocab=32000)))
    msg = unrunnable({"method": "draft_model", "model": draft}, target)
    assert "draft_model needs the target's vocabulary" in msg
    assert "vocab_size=32000" in msg and "vocab_size=49152" in msg and repr(draft) in msg


def test_eagle_asked_with_an_eagle3_head(tmp_path, target):
    head = str(write_checkpoint(tmp_path / "head", eagle3_head()))
    msg = unrunnable({"method": "eagle", "model": head}, target)
    assert "method 'eagle' was asked, which needs an EAGLE-1 head" in msg
    assert "is an EAGLE-3 head" in msg and "LlamaForCausalLMEagle3" in msg
    assert "specsure does not switch methods" in msg and "set method 'eagle3'" in msg


def test_eagle3_asked_with_an_eagle_head(tmp_path, target):
    head = str(write_checkpoint(tmp_path / "head", eagle_head(), tensors=EAGLE_TENSORS))
    msg = unrunnable({"method": "eagle3", "model": head}, target)
    assert "method 'eagle3' was asked, which needs an EAGLE-3 head" in msg
    assert "is an EAGLE-1 head" in msg and "EagleLlamaForCausalLM" in msg


def test_mtp_on_a_target_without_mtp_layers(target):
    msg = unrunnable({"method": "mtp"}, target)
    assert "method 'mtp' was asked without a 'model'" in msg
    assert repr(target) in msg and "declares none" in msg and "num_nextn_predict_layers" in msg
    assert "Give 'model'" in msg


def test_draft_model_pointing_at_an_eagle3_head(tmp_path, target):
    head = str(write_checkpoint(tmp_path / "head", eagle3_head()))
    msg = unrunnable({"method": "draft_model", "model": head}, target)
    assert "method 'draft_model' was asked, which needs a whole causal LM" in msg
    assert repr(head) in msg and "is an EAGLE-3 head" in msg


def test_mtp_asked_with_a_whole_lm_draft(tmp_path, target, draft):
    msg = unrunnable({"method": "mtp", "model": draft}, target)
    assert "method 'mtp' was asked" in msg and "is a whole causal LM" in msg


def test_pickle_only_draft_folder_is_refused(tmp_path, target):
    draft = str(write_checkpoint(tmp_path / "pickled", llama(layers=2), weights="pickle"))
    msg = unrunnable({"method": "draft_model", "model": draft}, target)
    assert "only pickle weights (pytorch_model.bin)" in msg and "safetensors" in msg and repr(draft) in msg


def test_draft_folder_without_weights_is_refused(tmp_path, target):
    draft = str(write_checkpoint(tmp_path / "empty", llama(layers=2), weights="none"))
    msg = unrunnable({"method": "draft_model", "model": draft}, target)
    assert "has config.json but no *.safetensors weights" in msg


def test_runnable_mtp_target_passes(tmp_path):
    target = str(write_checkpoint(tmp_path / "dsv3", deepseek_v3(mtp_layers=1)))
    resolve({"method": "mtp"}, model=target).check_runnable()


def test_values_are_checked_before_the_target_is_read(tmp_path):
    msg = error_of({"method": "ngram", "num_speculative_tokens": 0}, str(tmp_path / "no-such-target"))
    assert msg.startswith("num_speculative_tokens = 0 is out of range")


@pytest.mark.parametrize("key", ["method", "num_speculative_tokens", "speculative_token_tree", "prompt_lookup_min",
                                 "prompt_lookup_max", "prompt_lookup_branches"])
def test_null_is_unset_where_vllm_writes_it_for_unset(target, key):
    def outcome(spec):
        try:
            res = resolve(spec, model=target)
        except ConfigError as exc:
            return str(exc)
        return res.config, {name: d.source for name, d in res.decisions.items()}

    base = {"num_speculative_tokens": 3} if key == "method" else {"method": "ngram"}  # {} turns speculation off
    assert outcome({**base, key: None}) == outcome(base)


@pytest.mark.parametrize(("spec", "wanted", "unwanted"), [
    ({"method": "suffix", "suffix_decoding_max_cached_requests": -1.0}, "must be an integer >= 0", "Write"),
    ({"method": "suffix", "suffix_decoding_max_cached_requests": 5.0}, "Write 5 without quotes", None),
    ({"method": "ngram", "disable_by_batch_size": 1.0}, "disable_by_batch_size = 1.0 must be an integer >= 2", "Write"),
    ({"method": "ngram", "disable_by_batch_size": 1}, "disable_by_batch_size = 1 is out of range", None),
])
def test_an_integer_error_hints_only_at_a_valid_value(target, spec, wanted, unwanted):
    msg = error_of(spec, target)
    assert wanted in msg and (unwanted is None or unwanted not in msg), msg


def test_a_path_object_is_a_target_path(target):
    from pathlib import Path

    assert resolve({"method": "ngram"}, model=Path(target)).target_model == target


@pytest.mark.parametrize("strict", ["yes", 1, None])
def test_strict_must_be_a_bool(target, strict):
    with pytest.raises(ConfigError, match="strict = .* must be True or False"):
        resolve({"method": "ngram"}, model=target, strict=strict)


def test_an_n_predict_of_zero_never_fills_k(tmp_path, target):
    """vLLM would take n_predict 0 as k and draft nothing; specsure used its default k without a word."""
    folder = str(write_checkpoint(tmp_path / "zero", {**llama(layers=2), "n_predict": 0}))
    msg = error_of({"method": "draft_model", "model": folder}, target)
    assert "declares no draft tokens" in msg and "n_predict=0" in msg and "Set num_speculative_tokens" in msg
    res = resolve({"method": "draft_model", "model": folder, "num_speculative_tokens": 2}, model=target)
    assert (res.config.num_speculative_tokens, res.warnings) == (2, ())


def test_a_config_json_that_is_a_folder_is_named_as_such(tmp_path, target):
    folder = write_checkpoint(tmp_path / "odd", llama(layers=2))
    (folder / "config.json").unlink()
    (folder / "config.json").mkdir()
    msg = error_of({"method": "draft_model", "model": str(folder)}, target)
    assert "its config.json is not a file" in msg and "has no config.json" not in msg


def test_a_link_that_leads_nowhere_says_so(tmp_path):
    """'does not exist' sent users looking for a path that ls shows them."""
    from specsure.config import resolve
    from specsure.config.errors import ConfigError

    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    with pytest.raises(ConfigError, match="is a symbolic link that loops"):
        resolve(None, model=str(tmp_path / "a"))
    with pytest.raises(ConfigError, match=f"is a symbolic link to '{tmp_path / 'gone'}', which does not exist"):
        resolve(None, model=str(tmp_path / "dangling"))



def test_a_shard_index_that_names_missing_shards_is_refused_before_anything_loads(tmp_path, target):
    """explain said all was well for a folder generate could not load."""
    folder = write_checkpoint(tmp_path / "sharded", llama(layers=2))
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors"}}))
    msg = unrunnable({"method": "draft_model", "model": str(folder)}, target)
    assert "lists shards missing" in msg and "model-00002-of-00002.safetensors" in msg
    (folder / "model.safetensors.index.json").write_text("{")
    assert "is malformed" in unrunnable({"method": "draft_model", "model": str(folder)}, target)
