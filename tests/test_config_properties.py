"""Property tests: an explicit method always survives, and junk never escapes as a crash."""

from __future__ import annotations

import itertools
import json
import math
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checkpoints import write_checkpoint
from specsure.config import ConfigError, Resolution, resolve
from specsure.config.schema import FIELDS, METHODS, MTP_METHOD_ALIASES

# A fixed seed in the suite, so that CI's verdict does not depend on the draw; set
# SPECSURE_EXPLORE=N to search N fresh random examples a test instead (run it after changing resolution).
EXPLORE = int(os.environ.get("SPECSURE_EXPLORE") or 0)
SETTINGS = settings(max_examples=EXPLORE or 60, deadline=None, derandomize=not EXPLORE, database=None,
                    suppress_health_check=[HealthCheck.too_slow])

ARCHITECTURES = (
    "LlamaForCausalLM", "LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "EagleLlamaForCausalLM",
    "LlamaForCausalLMEagle", "DeepseekV3ForCausalLM", "SpecsureMTPHead", "Qwen2ForCausalLM", "GPT2LMHeadModel",
    "MedusaModel", "MLPSpeculatorPreTrainedModel",
)
MODEL_TYPES = ("llama", "deepseek_v3", "deepseek_mtp", "qwen3_next_mtp", "specsure_mtp", "medusa",
               "mlp_speculator", "eagle", "eagle3", "mtp")
TENSORS = ("fc.weight", "d2t", "t2d", "midlayer.hidden_norm.weight", "lm_head.weight",
           "model.layers.0.mlp.gate_proj.weight", "model.layers.2.eh_proj.weight", "enorm.weight")
NAME_TOKENS = ("eagle", "eagle3", "EAGLE3", "Eagle", "mtp", "MTP", "beagle", "eagle-eye", "eagles", "draft",
               "head", "llama", "7b", "my", "deepseek", "golden-eagle")

_ids = itertools.count()

small_int = st.integers(min_value=0, max_value=200)
metadata = st.fixed_dictionaries({}, optional={
    "architectures": st.lists(st.sampled_from(ARCHITECTURES), max_size=2),
    "model_type": st.sampled_from(MODEL_TYPES),
    "num_hidden_layers": small_int,
    "num_nextn_predict_layers": small_int,
    "mtp_num_hidden_layers": small_int,
    "draft_vocab_size": small_int,
    "n_predict": small_int,
    "vocab_size": st.sampled_from((32000, 49152)),
    "eagle_config": st.just({"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}),
})
folder_name = st.lists(st.sampled_from(NAME_TOKENS), min_size=1, max_size=3).flatmap(
    lambda words: st.sampled_from(("-", "_", ".")).map(lambda sep: sep.join(words)))
tensor_names = st.lists(st.sampled_from(TENSORS), max_size=4)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("props")


def _folder(root, name, config, tensors=("lm_head.weight",)):
    """A fresh folder per example: <unique>/<parent>/<name>, so both path components vary."""
    return str(write_checkpoint(root / str(next(_ids)) / name, config, tensors))


@SETTINGS
@given(method=st.sampled_from(METHODS + tuple(sorted(MTP_METHOD_ALIASES))),
       target_meta=metadata, target_name=folder_name,
       draft_meta=metadata, draft_tensors=tensor_names, draft_parent=folder_name, draft_name=folder_name,
       give_model_for_mtp=st.booleans(), k=st.none() | st.integers(1, 64))
def test_explicit_method_is_never_replaced(root, method, target_meta, target_name, draft_meta, draft_tensors,
                                           draft_parent, draft_name, give_model_for_mtp, k):
    expected = "mtp" if method in MTP_METHOD_ALIASES else method
    target = _folder(root, target_name, target_meta)
    spec: dict = {"method": method}
    if expected in ("draft_model", "eagle", "eagle3") or (expected == "mtp" and give_model_for_mtp):
        spec["model"] = _folder(root, f"{draft_parent}/{draft_name}", draft_meta, draft_tensors)
    if k is not None:
        spec["num_speculative_tokens"] = k
    res = resolve(spec, model=target)
    assert res.config.method == expected and res.source("method") == "user"
    if "model" in spec:
        assert res.config.model == spec["model"] and res.source("model") == "user"
    if k is not None:
        assert res.config.num_speculative_tokens == k
    for text in res.warnings:  # a disagreement is reported, and the user's value stays
        assert "Keeping your value" in text or "deprecated alias" in text
    try:  # impossibility is an error that names the asked method; it never switches it
        res.check_runnable()
    except ConfigError as exc:
        assert expected in str(exc)


leaf = (st.none() | st.booleans() | st.integers(-10, 100) | st.integers()
        | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12)
        | st.sampled_from(METHODS + ("deepseek_mtp", "medusa", "EAGLE3", " ngram ", "4", "2.0", "~x/y", "")))
junk_value = st.recursive(leaf, lambda inner: st.lists(inner, max_size=3)
                          | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)
junk_key = st.sampled_from(FIELDS + ("draft_model", "Method", "num_speculative_token", "speculative_model")) \
    | st.text(max_size=10)
# Values that sit on the edge of each field's checks, so 60 examples reach them.
edge_number = st.sampled_from(("4", "2.0", "1e400", " 3 ", 4.0, 2.5, 1e300, math.nan, True, 0, 65, -1, 2**70))
edge_path = st.sampled_from(("~no-such-user-xyz/draft", "d" * 300, "a\x00b", "", " ", "/", ".", "x.gguf"))
keyed_junk = st.fixed_dictionaries({}, optional={
    "method": st.sampled_from(METHODS + ("deepseek_mtp", "MTP", "medusa", "eagel")) | junk_value,
    "model": edge_path | junk_value,
    "draft_model": edge_path | junk_value,
    "num_speculative_tokens": edge_number | junk_value,
    "prompt_lookup_min": edge_number | junk_value,
    "prompt_lookup_max": edge_number | junk_value,
    "suffix_decoding_max_tree_depth": edge_number | junk_value,
    "suffix_decoding_max_cached_requests": edge_number | junk_value,
    "suffix_decoding_max_spec_factor": edge_number | junk_value,
    "suffix_decoding_min_token_prob": edge_number | st.sampled_from((0.5, 1, 1.0000001, -0.0)) | junk_value,
})


@pytest.fixture(scope="module")
def junk_folders(root):
    """Real checkpoint folders that junk configs may point at, plus the target."""
    target = _folder(root, "target", {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 4,
                                      "vocab_size": 49152})
    drafts = [
        _folder(root, "draft", {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2}),
        _folder(root, "eagle3-head", {"architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": 8}),
        _folder(root, "beagle-mtp", {"architectures": ["DeepseekV3ForCausalLM"], "num_nextn_predict_layers": 1}),
    ]
    return target, drafts


def _check_outcome(make):
    try:
        res = make()
    except ConfigError as exc:
        assert str(exc)  # a message, never an empty error
        return
    assert isinstance(res, Resolution)
    json.dumps(res.to_dict())
    assert res.explain()
    try:
        res.check_runnable()
    except ConfigError:
        pass


@SETTINGS
@given(data=st.data(), junk=keyed_junk | st.dictionaries(junk_key, junk_value, max_size=5))
def test_junk_speculative_config_is_a_resolution_or_a_config_error(junk_folders, data, junk):
    target, drafts = junk_folders
    if data.draw(st.booleans(), label="point model at a real folder"):
        junk[data.draw(st.sampled_from(("model", "draft_model")))] = data.draw(st.sampled_from(drafts))
    _check_outcome(lambda: resolve(junk, model=target))


@SETTINGS
@given(junk=junk_value)
def test_junk_that_is_not_a_dict_is_a_config_error(junk_folders, junk):
    target, _ = junk_folders
    _check_outcome(lambda: resolve(junk, model=target))


json_leaf = (st.none() | st.booleans() | st.integers(-5, 10**12) | st.text(max_size=8)
             | st.floats(allow_nan=False, allow_infinity=False))
json_junk = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=3)
                         | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)
config_key = st.sampled_from(("architectures", "model_type", "num_hidden_layers", "vocab_size", "hidden_size",
                              "draft_vocab_size", "n_predict", "num_nextn_predict_layers", "eagle_config",
                              "n_mtp_layers")) | st.text(max_size=8)


@SETTINGS
@given(target_json=st.dictionaries(config_key, json_junk, max_size=5) | json_junk,
       draft_json=st.dictionaries(config_key, json_junk, max_size=5) | json_junk,
       spec=st.sampled_from(({"method": "mtp"}, {"method": "draft_model"}, {}, {"method": "ngram"},
                             {"num_speculative_tokens": 2})),
       with_draft=st.booleans())
def test_junk_checkpoint_metadata_is_a_resolution_or_a_config_error(root, target_json, draft_json, spec,
                                                                     with_draft):
    target = _folder(root, "t", json.dumps(target_json))
    spec = dict(spec)
    if with_draft and spec.get("method") != "ngram":
        spec["model"] = _folder(root, "d", json.dumps(draft_json))
    _check_outcome(lambda: resolve(spec or None, model=target))


def test_nan_model_and_draft_model_is_a_config_error(junk_folders):
    """NaN compares unequal to itself; the model/draft_model check must still give a ConfigError."""
    with pytest.raises(ConfigError):
        resolve({"model": math.nan, "draft_model": math.nan}, model=junk_folders[0])


@pytest.mark.parametrize("method", ["mtp", "eagle3", "eagle"])
def test_a_head_for_another_vocabulary_is_an_error_naming_the_method(root, method):
    # Found by the property test above: the mismatch named the head and the field, not the method asked.
    target = _folder(root, "eagle", {"architectures": [], "vocab_size": 32000})
    kind, tensors = {"mtp": ("SpecsureMTPHead", []),
                     "eagle3": ("LlamaForCausalLMEagle3", ["fc.weight", "midlayer.hidden_norm.weight", "lm_head.weight"]),
                     "eagle": ("EagleLlamaForCausalLM", ["fc.weight"])}[method]
    draft = _folder(root, "eagle/eagle", {"model_type": "llama", "vocab_size": 49152, "architectures": [kind]}, tensors)
    with pytest.raises(ConfigError, match=f"^{method} draft head .*vocab_size = 49152, but the target .* needs 32000"):
        resolve({"method": method, "model": draft}, model=target).check_runnable()
