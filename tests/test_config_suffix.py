"""method 'suffix': vLLM's four suffix_decoding_* keys resolved, explained, checked and exported."""

from __future__ import annotations

import json

import pytest

from checkpoints import llama, write_checkpoint
from specsure.config import ConfigError, SpeculativeConfig, resolve
from specsure.config.errors import as_json
from specsure.config.export import export
from specsure.config.schema import FIELDS, METHODS, SUFFIX_FIELDS

DEFAULTS = {"suffix_decoding_max_tree_depth": 24, "suffix_decoding_max_cached_requests": 10000,
            "suffix_decoding_max_spec_factor": 1.0, "suffix_decoding_min_token_prob": 0.1}


@pytest.fixture
def target(tmp_path):
    return str(write_checkpoint(tmp_path / "target", llama(layers=4)))


@pytest.fixture
def draft(tmp_path):
    return str(write_checkpoint(tmp_path / "draft", llama(layers=2)))


def error_of(spec, model) -> str:
    with pytest.raises(ConfigError) as info:
        resolve(spec, model=model)
    return str(info.value)


def test_suffix_is_a_method_and_its_keys_are_fields():
    assert "suffix" in METHODS
    assert FIELDS[-5:-1] == SUFFIX_FIELDS == tuple(DEFAULTS)


def test_defaults_are_vllms_and_k_is_the_tree_depth(target):
    res = resolve({"method": "suffix"}, model=target)
    config = res.config
    assert (config.method, config.model, config.num_speculative_tokens) == ("suffix", None, 24)
    assert {key: getattr(config, key) for key in SUFFIX_FIELDS} == DEFAULTS
    assert all(res.source(key) == "default" and "vLLM's default" in res.reason(key) for key in SUFFIX_FIELDS)
    assert res.source("num_speculative_tokens") == "derived"
    assert "tree depth" in res.reason("num_speculative_tokens") and "= 24" in res.reason("num_speculative_tokens")
    assert res.source("model") == "derived" and "needs no draft model" in res.reason("model")
    assert res.config.prompt_lookup_min is None and res.source("prompt_lookup_min") == "derived"
    assert res.warnings == ()


def test_explicit_values_are_kept_and_k_follows_an_explicit_depth(target):
    spec = {"method": "suffix", "suffix_decoding_max_tree_depth": 40, "suffix_decoding_max_cached_requests": 3,
            "suffix_decoding_max_spec_factor": 0.5, "suffix_decoding_min_token_prob": 0.3}
    res = resolve(spec, model=target)
    assert {key: getattr(res.config, key) for key in SUFFIX_FIELDS} == {k: v for k, v in spec.items() if k != "method"}
    assert all(res.source(key) == "user" for key in SUFFIX_FIELDS)
    assert res.config.num_speculative_tokens == 40 and res.source("num_speculative_tokens") == "derived"
    explicit = resolve({**spec, "num_speculative_tokens": 7}, model=target)
    assert explicit.config.num_speculative_tokens == 7 and explicit.source("num_speculative_tokens") == "user"


def test_a_depth_above_the_k_ceiling_caps_the_derived_k_and_says_so(target):
    res = resolve({"method": "suffix", "suffix_decoding_max_tree_depth": 100}, model=target)
    assert res.config.suffix_decoding_max_tree_depth == 100
    assert res.config.num_speculative_tokens == 64 and "capped at 64" in res.reason("num_speculative_tokens")


def test_zero_cached_requests_turns_the_global_tree_off_and_says_so(target):
    res = resolve({"method": "suffix", "suffix_decoding_max_cached_requests": 0}, model=target)
    assert res.config.suffix_decoding_max_cached_requests == 0
    assert "global tree of earlier outputs is off" in res.reason("suffix_decoding_max_cached_requests")


def test_integer_factor_and_probability_are_the_same_numbers_as_floats(target):
    res = resolve({"method": "suffix", "suffix_decoding_max_spec_factor": 2, "suffix_decoding_min_token_prob": 1},
                  model=target)
    assert res.config.suffix_decoding_max_spec_factor == 2.0
    assert isinstance(res.config.suffix_decoding_min_token_prob, float)


def test_suffix_keys_alone_derive_the_method(target):
    res = resolve({"suffix_decoding_min_token_prob": 0.2}, model=target)
    assert res.config.method == "suffix" and res.source("method") == "derived"
    assert "suffix_decoding_min_token_prob was given" in res.reason("method")


def test_other_methods_show_the_suffix_keys_as_unused(target):
    res = resolve({"method": "ngram"}, model=target)
    for key in SUFFIX_FIELDS:
        assert getattr(res.config, key) is None and res.source(key) == "derived"
        assert res.reason(key) == "Only suffix decoding uses it; the method is 'ngram'."
    assert "suffix_decoding_max_tree_depth" in res.explain()
    assert set(res.to_dict()) == {"target", *FIELDS}


@pytest.mark.parametrize("key", SUFFIX_FIELDS)
def test_a_suffix_key_with_another_method_is_an_error(target, draft, key):
    msg = error_of({"method": "draft_model", "model": draft, key: 1}, target)
    assert msg == (f"{key} = 1 applies only to method 'suffix', but the method is 'draft_model'. "
                   f"Remove {key}, or set method 'suffix'.")
    assert "applies only to method 'suffix'" in error_of({"method": "ngram", key: 1}, target)


def test_suffix_and_prompt_lookup_keys_without_a_method_is_an_error(target):
    msg = error_of({"prompt_lookup_max": 3, "suffix_decoding_max_tree_depth": 8}, target)
    assert "prompt_lookup_max (ngram's)" in msg and "suffix_decoding_max_tree_depth (suffix's)" in msg
    assert "Set method 'ngram' or 'suffix'" in msg


def test_suffix_with_a_draft_model_is_an_error_and_null_is_fine(target, draft):
    msg = error_of({"method": "suffix", "model": draft}, target)
    assert f"model = {draft!r} is not used by method 'suffix'" in msg and "Remove 'model'" in msg
    res = resolve({"method": "suffix", "model": None}, model=target)
    assert res.config.model is None and res.source("model") == "user" and "needs none" in res.reason("model")


@pytest.mark.parametrize(("key", "value", "fragment"), [
    ("suffix_decoding_max_tree_depth", 0, "is out of range: it must be from 1 to 128"),
    ("suffix_decoding_max_tree_depth", 129, "is out of range: it must be from 1 to 128"),
    ("suffix_decoding_max_tree_depth", "24", "must be an integer from 1 to 128. Write 24 without quotes"),
    ("suffix_decoding_max_tree_depth", 2.5, "must be an integer from 1 to 128."),
    ("suffix_decoding_max_cached_requests", -1, "is out of range: it must be >= 0"),
    ("suffix_decoding_max_cached_requests", 5.0, "must be an integer >= 0 (0 turns the global tree of earlier "
                                                 "requests off). Write 5 without quotes or decimals."),
    ("suffix_decoding_max_cached_requests", True, "must be an integer >= 0"),
    ("suffix_decoding_max_spec_factor", -0.5, "is out of range: it must be a finite number >= 0"),
    ("suffix_decoding_max_spec_factor", float("inf"), "is out of range: it must be a finite number >= 0"),
    ("suffix_decoding_max_spec_factor", 10**400, "is out of range: it must be a finite number >= 0"),
    ("suffix_decoding_max_spec_factor", "1.5", "must be a finite number >= 0. Write 1.5 without quotes."),
    ("suffix_decoding_min_token_prob", 1.5, "is out of range: it must be a number from 0 to 1"),
    ("suffix_decoding_min_token_prob", float("nan"), "is out of range: it must be a number from 0 to 1"),
    ("suffix_decoding_min_token_prob", None, "must be a number from 0 to 1."),
    ("suffix_decoding_min_token_prob", False, "must be a number from 0 to 1."),
])
def test_bad_suffix_values_name_the_field_the_value_and_what_is_allowed(target, key, value, fragment):
    msg = error_of({"method": "suffix", key: value}, target)
    assert msg.startswith(f"{key} = {as_json(value)} ") and fragment in msg


def test_suffix_key_typo_suggests_the_key(target):
    msg = error_of({"method": "suffix", "suffix_decoding_max_tree_dept": 8}, target)
    assert "Did you mean 'suffix_decoding_max_tree_depth'?" in msg


def test_strict_mode_resolves_suffix(target):
    res = resolve({"method": "suffix", "num_speculative_tokens": 8}, model=target, strict=True)
    assert res.config.num_speculative_tokens == 8 and res.warnings == ()


def test_the_frozen_config_refuses_suffix_fields_that_do_not_belong():
    with pytest.raises(ConfigError, match="applies only to method 'suffix', not 'ngram'"):
        SpeculativeConfig("ngram", None, 4, 2, 5, suffix_decoding_max_tree_depth=24)
    with pytest.raises(ConfigError, match="suffix_decoding_min_token_prob is required for method 'suffix'"):
        SpeculativeConfig("suffix", None, 4, **{k: v for k, v in DEFAULTS.items()
                                                if k != "suffix_decoding_min_token_prob"})
    with pytest.raises(ConfigError, match="not used by method 'suffix'"):
        SpeculativeConfig("suffix", "/ckpt", 4, **DEFAULTS)


def test_to_vllm_writes_every_suffix_key(target):
    res = resolve({"method": "suffix", "num_speculative_tokens": 6, "suffix_decoding_min_token_prob": 0.2},
                  model=target)
    assert res.config.to_vllm() == {"method": "suffix", "num_speculative_tokens": 6,
                                    **DEFAULTS, "suffix_decoding_min_token_prob": 0.2}


def test_export_to_vllm_is_explicit_and_names_arctic_inference(target):
    out = export(resolve({"method": "suffix"}, model=target), "vllm")
    args = list(out.args)
    assert args[:2] == ["--model", target]
    assert json.loads(args[args.index("--speculative-config") + 1]) == {
        "method": "suffix", "num_speculative_tokens": 24, **DEFAULTS}
    assert any("arctic-inference" in w for w in out.warnings)
    assert out.workarounds == ()


def test_export_to_sglang_is_an_error_never_an_approximation(target):
    with pytest.raises(ConfigError) as info:
        export(resolve({"method": "suffix"}, model=target), "sglang")
    msg = str(info.value)
    assert "SGLang has no 'suffix' method" in msg and "never exports an approximation" in msg
    assert "NGRAM" in msg and "specsure export --to vllm" in msg
