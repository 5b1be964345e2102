"""The vLLM plugin on stand-ins of vLLM's classes (tests/vllm_standin.py): rewrite, guard, modes, links.

The same cases run against the real vLLM 0.33.0 in tests/vllm/test_plugin.py (`make test-vllm`).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

import vllm_standin
from checkpoints import deepseek_v3, eagle3_head, llama, write_checkpoint
from specsure.vllm_plugin import PluginRefusal
from specsure.vllm_plugin.links import link_name, neutral_link
from specsure.vllm_plugin.patch import install
from specsure.vllm_plugin.plan import make_plan, user_config

TESTED = "0.33.0"


@pytest.fixture(autouse=True)
def _links(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECSURE_VLLM_LINKS", str(tmp_path / "links"))
    monkeypatch.delenv("SPECSURE_VLLM_PLUGIN", raising=False)


@pytest.fixture
def models(tmp_path: Path) -> dict[str, str]:
    root = tmp_path / "models"
    made = {
        "target": llama(layers=4), "small-draft": llama(), "my-eagle-draft": llama(), "beagle-7b": llama(),
        "MY-EAGLE-DRAFT": llama(), "dsv3": deepseek_v3(), "beagle-dsv3": deepseek_v3(),
        "EAGLE3-LLaMA-head": eagle3_head(), "eagle-experiments/draft": llama(), "beagle-target": deepseek_v3(),
    }
    return {name: str(write_checkpoint(root / name, config)) for name, config in made.items()}


def vllm(model: str, version: str = TESTED, speculators: dict | None = None, quantization: str | None = None,
         **engine_kwargs):
    """Build the speculative config the way vLLM would, with the plugin installed (or not: version=None)."""
    module = vllm_standin.arg_utils(speculators)
    if version is not None:
        install(module.EngineArgs, module, version)
    args = module.EngineArgs(model, **engine_kwargs)
    if isinstance(args.speculative_config, dict):
        module.maybe_override_with_speculators(model, None, False, vllm_speculative_config=args.speculative_config)
    return args.create_speculative_config(vllm_standin.ModelConfig(model, quantization=quantization), None)


def same_folder(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


# --- what the stand-in does without the plugin: the overrides we fix ---------------------------

def test_without_the_plugin_the_standin_overrides_as_vllm_does(models):
    assert vllm(models["beagle-dsv3"], None, speculative_config={"method": "mtp", "num_speculative_tokens": 1}
                ).method == "eagle"
    assert vllm(models["target"], None, speculative_config={"method": "draft_model", "model": models["beagle-7b"]}
                ).method == "eagle"
    assert vllm(models["target"], None, speculative_config={"method": "draft_model", "model": models["dsv3"]}
                ).method == "mtp"


# --- enforce (the default) ----------------------------------------------------------------------

def test_the_seed_case_runs_mtp_on_the_target_itself(models, caplog):
    with caplog.at_level(logging.INFO, logger="vllm.specsure"):
        spec = vllm(models["beagle-dsv3"], speculative_config={"method": "mtp", "num_speculative_tokens": 1})
    assert spec.method == "mtp" and same_folder(spec.model, models["beagle-dsv3"])
    assert "eagle-" not in spec.model.lower()
    line = next(r.message for r in caplog.records if "effective speculative config" in r.message)
    assert "method='mtp' (user)" in line and "num_speculative_tokens=1 (user)" in line and "neutral link" in line


@pytest.mark.parametrize(("folder", "asked", "runs"), [("beagle-dsv3", None, "fp8"), ("dsv3", None, "fp8"),
                                                      ("beagle-dsv3", "fp8", "fp8")])
def test_mtp_on_the_target_itself_keeps_the_targets_quantization(models, folder, asked, runs):
    """vLLM gives an MTP draft it fills from the target the target's --quantization; the link the plugin
    names for a trap-named target must not lose it (the MTP layers would load unquantised)."""
    spec = vllm(models[folder], quantization="fp8", speculative_config={
        "method": "mtp", "num_speculative_tokens": 1, **({"quantization": asked} if asked else {})})
    assert (spec.method, spec.quantization) == ("mtp", runs) and same_folder(spec.model, models[folder])


@pytest.mark.parametrize("name", ["my-eagle-draft", "beagle-7b", "MY-EAGLE-DRAFT", "eagle-experiments/draft",
                                  "EAGLE3-LLaMA-head"])
def test_an_explicit_draft_model_keeps_its_method_and_draft(models, name):
    spec = vllm(models["target"], speculative_config={"method": "draft_model", "model": models[name]})
    assert spec.method == "draft_model" and same_folder(spec.model, models[name])


def test_explicit_mtp_with_a_draft_in_a_beagle_folder_is_kept(models):
    spec = vllm(models["target"], speculative_config={"method": "mtp", "model": models["beagle-target"],
                                                      "num_speculative_tokens": 1})
    assert spec.method == "mtp" and same_folder(spec.model, models["beagle-target"])


def test_a_token_tree_stops_vllm_in_enforce_mode_naming_the_key(models):
    with pytest.raises(PluginRefusal) as err:
        vllm(models["target"], speculative_config={"method": "eagle3", "model": models["EAGLE3-LLaMA-head"],
                                                   "speculative_token_tree": "[(0, 0), (1,), (0,)]"})
    text = str(err.value)
    assert 'speculative_token_tree = "[(0, 0), (1,), (0,)]" is a specsure key that vLLM does not have' in text
    assert "a chain of num_speculative_tokens = 3 tokens" in text and "SPECSURE_VLLM_PLUGIN=warn" in text


def test_a_token_tree_is_handed_to_vllm_as_a_chain_in_warn_mode_and_the_plugin_says_so(models, caplog, monkeypatch):
    monkeypatch.setenv("SPECSURE_VLLM_PLUGIN", "warn")
    with caplog.at_level(logging.WARNING, logger="vllm.specsure"):
        spec = vllm(models["target"], speculative_config={"method": "eagle3", "model": models["EAGLE3-LLaMA-head"],
                                                          "speculative_token_tree": "[(0, 0), (1,), (0,)]"})
    assert spec.method == "eagle3" and spec.num_speculative_tokens == 3
    assert "speculative_token_tree" not in spec.extra  # vLLM 0.33.0 would refuse the key
    assert any('speculative_token_tree = "[(0, 0), (1,), (0,)]" is a specsure key that vLLM does not have' in r.message
               for r in caplog.records)


def test_disable_by_batch_size_reaches_vllm_as_its_batch_size_schedule(models, caplog, monkeypatch):
    spec = vllm(models["target"], speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                                                      "disable_by_batch_size": 4})
    assert spec.method == "ngram" and "disable_by_batch_size" not in spec.extra  # vLLM 0.33.0 would refuse it
    assert spec.extra["num_speculative_tokens_per_batch_size"] == [[1, 3, 3], [4, 4, 0]]
    with pytest.raises(PluginRefusal, match="both say when to draft"):  # the user's own vLLM key beside it
        vllm(models["target"], speculative_config={"method": "ngram", "disable_by_batch_size": 4,
                                                   "num_speculative_tokens_per_batch_size": [[1, 8, 2]]})
    for alone in ({}, {"disable_by_batch_size": None}):  # vLLM's own key alone is the user's, handed as given
        spec = vllm(models["target"], speculative_config={"method": "ngram", **alone,
                                                          "num_speculative_tokens_per_batch_size": [[1, 8, 2]]})
        assert spec.extra["num_speculative_tokens_per_batch_size"] == [[1, 8, 2]]
    monkeypatch.setenv("SPECSURE_VLLM_PLUGIN", "warn")
    with caplog.at_level(logging.WARNING, logger="vllm.specsure"):
        spec = vllm(models["target"], speculative_config={"method": "suffix", "disable_by_batch_size": 4})
    assert spec.method == "suffix" and "num_speculative_tokens_per_batch_size" not in spec.extra
    assert any("disable_by_batch_size = 4 is a specsure key" in r.message and "V1 model runner" in r.message
               for r in caplog.records)


def test_a_model_type_rewrite_is_refused_naming_both_sides_and_the_fix(models):
    with pytest.raises(PluginRefusal) as err:
        vllm(models["target"], speculative_config={"method": "draft_model", "model": models["dsv3"]})
    text = str(err.value)
    assert "method: you asked for 'draft_model'" in text and "would run 'mtp'" in text
    assert "deepseek_v3" in text and "Fix:" in text and "SPECSURE_VLLM_PLUGIN=warn" in text


def test_a_model_type_rewrite_behind_a_path_trap_is_foretold_then_refused(models, caplog):
    with caplog.at_level(logging.WARNING, logger="vllm.specsure"), pytest.raises(PluginRefusal) as err:
        vllm(models["target"], speculative_config={"method": "draft_model", "model": models["beagle-dsv3"]})
    assert "would run 'mtp'" in str(err.value)  # the neutral link fixed the path; the model_type rewrite stays
    assert any("will switch method 'draft_model' to 'mtp' whatever it is handed" in r.message for r in caplog.records)


def test_neutral_configs_pass_through_unchanged(models):
    spec = vllm(models["target"], speculative_config={"model": models["small-draft"], "num_speculative_tokens": 3})
    assert (spec.method, spec.model, spec.num_speculative_tokens) == ("draft_model", models["small-draft"], 3)
    ngram = vllm(models["target"], speculative_config={"method": "ngram", "num_speculative_tokens": 4})
    assert (ngram.method, ngram.prompt_lookup_min, ngram.prompt_lookup_max) == ("ngram", 2, 5)


def test_spec_flags_are_resolved_like_the_dict(models):
    spec = vllm(models["beagle-dsv3"], spec_method="mtp", spec_tokens=1)
    assert spec.method == "mtp" and same_folder(spec.model, models["beagle-dsv3"])
    with pytest.raises(ValueError, match=r"--spec-method and --speculative-config\['method'\] are mutually exclusive"):
        vllm(models["target"], speculative_config={"method": "ngram"}, spec_method="ngram")


def test_vllm_only_keys_pass_through(models):
    spec = vllm(models["target"], speculative_config={"model": models["small-draft"],
                                                      "draft_tensor_parallel_size": 1})
    assert spec.extra == {"draft_tensor_parallel_size": 1}


def test_suffix_is_handed_with_every_suffix_key_explicit(models, caplog):
    with caplog.at_level(logging.INFO, logger="vllm.specsure"):
        spec = vllm(models["target"], speculative_config={"method": "suffix", "suffix_decoding_max_tree_depth": 16,
                                                          "suffix_decoding_min_token_prob": 0.25})
    assert (spec.method, spec.num_speculative_tokens, spec.suffix_decoding_max_tree_depth) == ("suffix", 16, 16)
    assert (spec.suffix_decoding_max_cached_requests, spec.suffix_decoding_max_spec_factor,
            spec.suffix_decoding_min_token_prob) == (10000, 1.0, 0.25)
    assert spec.extra == {}  # every suffix key reached vLLM's own fields
    line = next(r.message for r in caplog.records if "effective speculative config" in r.message)
    assert "num_speculative_tokens=16 (derived)" in line and "suffix_decoding_min_token_prob=0.25 (user)" in line
    plan = make_plan({"method": "suffix"}, models["target"])
    assert plan.handed == {"method": "suffix", "num_speculative_tokens": 24, "suffix_decoding_max_tree_depth": 24,
                           "suffix_decoding_max_cached_requests": 10000, "suffix_decoding_max_spec_factor": 1.0,
                           "suffix_decoding_min_token_prob": 0.1}


def test_a_method_specsure_does_not_model_is_guarded_not_rewritten(models):
    plan = make_plan({"method": "medusa", "model": models["small-draft"]}, models["target"])
    assert plan.handed is None and "specsure does not run" in plan.guard_only


def test_a_speculators_target_that_replaces_the_method_is_refused(models):
    with pytest.raises(PluginRefusal, match=r"method: you asked for 'ngram', but vLLM 0\.33\.0 would run 'eagle3'"):
        vllm(models["target"], speculators={"method": "eagle3", "num_speculative_tokens": 3},
             speculative_config={"method": "ngram", "num_speculative_tokens": 3})


# --- warn, off, bad mode, untested versions -----------------------------------------------------

def test_warn_lets_vllms_choice_stand_and_says_so(models, monkeypatch, caplog):
    monkeypatch.setenv("SPECSURE_VLLM_PLUGIN", "warn")
    with caplog.at_level(logging.WARNING, logger="vllm.specsure"):
        spec = vllm(models["target"], speculative_config={"method": "draft_model", "model": models["dsv3"]})
    assert spec.method == "mtp"
    assert any("you asked for 'draft_model'" in r.message and "vLLM's choice stands" in r.message
               for r in caplog.records)


def test_off_restores_vllms_behaviour(models, monkeypatch):
    monkeypatch.setenv("SPECSURE_VLLM_PLUGIN", "off")
    assert vllm(models["beagle-dsv3"], speculative_config={"method": "mtp", "num_speculative_tokens": 1}
                ).method == "eagle"


def test_a_bad_mode_stops_vllm_with_the_choices(models, monkeypatch):
    monkeypatch.setenv("SPECSURE_VLLM_PLUGIN", "enforced")
    with pytest.raises(ValueError, match="SPECSURE_VLLM_PLUGIN='enforced' is not a mode; use one of strict, enforce, warn, off"):
        vllm(models["target"], speculative_config={"method": "ngram"})


def test_a_bad_mode_at_start_up_still_guards_a_retry_in_the_same_process(models, monkeypatch):
    """vLLM marks its plugins loaded before calling them, so a register() that raised before wrapping left
    a retry (a notebook, a service) to run vLLM's own override silently."""
    import sys
    import types

    from specsure.vllm_plugin import register

    module = vllm_standin.arg_utils()
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__=TESTED))
    monkeypatch.setitem(sys.modules, "vllm.engine", types.SimpleNamespace(arg_utils=module))
    monkeypatch.setenv("SPECSURE_VLLM_PLUGIN", "bogus")
    with pytest.raises(ValueError, match="not a mode"):
        register()
    spec = {"method": "mtp", "num_speculative_tokens": 1}
    retry = module.EngineArgs(models["beagle-dsv3"], speculative_config=dict(spec))
    with pytest.raises(ValueError, match="not a mode"):  # not eagle, silently
        retry.create_speculative_config(vllm_standin.ModelConfig(models["beagle-dsv3"]), None)
    monkeypatch.setenv("SPECSURE_VLLM_PLUGIN", "enforce")
    fixed = module.EngineArgs(models["beagle-dsv3"], speculative_config=dict(spec))
    assert fixed.create_speculative_config(vllm_standin.ModelConfig(models["beagle-dsv3"]), None).method == "mtp"


def test_a_config_specsure_cannot_resolve_is_refused_saying_why_it_went_unchanged(models):
    """vLLM coerces "2"; specsure does not, so the config goes to vLLM unchanged (no neutral link) and the
    refusal says so, with the path vLLM's test caught."""
    with pytest.raises(PluginRefusal, match=r"handed your config to vLLM unchanged: specsure cannot resolve this "
                                            r"config \(.*num_speculative_tokens.*contains 'eagle-'"):
        vllm(models["target"], speculative_config={"method": "draft_model", "model": models["beagle-7b"],
                                                   "num_speculative_tokens": "2"})


@pytest.mark.parametrize("legacy", [{"model": "ngram"}, {"model": "[ngram]"}, {"method": "[ngram]"},
                                    {"method": "ngram", "model": "ngram"}, {"method": None, "model": "ngram"}])
def test_vllms_older_ngram_spellings_resolve_as_ngram(models, caplog, legacy):
    with caplog.at_level(logging.INFO, logger="vllm.specsure"):
        spec = vllm(models["target"], speculative_config={**legacy, "num_speculative_tokens": 3})
    assert (spec.method, spec.prompt_lookup_min, spec.prompt_lookup_max) == ("ngram", 2, 5)  # specsure's, explicit
    assert any("effective speculative config: method='ngram'" in r.message for r in caplog.records)


@pytest.mark.parametrize(("parallel", "links_set", "warned"), [
    ({"nnodes": 2}, False, True), ({"distributed_executor_backend": "ray"}, False, True),
    ({"nnodes": 2}, True, False), ({}, False, False)])
def test_a_neutral_link_on_a_vllm_that_may_span_nodes_is_a_warning(models, caplog, monkeypatch, parallel, links_set,
                                                                   warned):
    """The link exists on the host that resolved the config; workers on other nodes read the same path."""
    import types

    if not links_set:
        monkeypatch.delenv("SPECSURE_VLLM_LINKS")
        monkeypatch.setenv("XDG_CACHE_HOME", str(Path(models["target"]).parent.parent / "cache"))
    module = vllm_standin.arg_utils()
    install(module.EngineArgs, module, TESTED)
    args = module.EngineArgs(models["beagle-dsv3"], speculative_config={"method": "mtp", "num_speculative_tokens": 1})
    with caplog.at_level(logging.WARNING, logger="vllm.specsure"):
        spec = args.create_speculative_config(vllm_standin.ModelConfig(models["beagle-dsv3"]),
                                              types.SimpleNamespace(**parallel))
    assert spec.method == "mtp"
    assert any("exists on this host only" in r.message and "SPECSURE_VLLM_LINKS" in r.message
               for r in caplog.records) == warned


@pytest.mark.parametrize("legacy", [{"method": "[ngram]"}, {"model": "[ngram]"}])
def test_an_older_ngram_spelling_on_a_target_specsure_cannot_read_is_ngram_to_the_guard(legacy):
    """A Hugging Face id as the target: the config goes to vLLM unchanged, and the guard must not take
    '[ngram]' against vLLM's 'ngram' for an override."""
    spec = vllm("Qwen/Qwen3-8B", speculative_config={**legacy, "num_speculative_tokens": 3})
    assert spec.method == "ngram"


def test_an_untested_version_only_guards(models, caplog):
    with caplog.at_level(logging.WARNING, logger="vllm.specsure"):
        module = vllm_standin.arg_utils()
        assert install(module.EngineArgs, module, "9.9.9")
    assert "not a tested version" in caplog.text and "guard mode only" in caplog.text
    args = module.EngineArgs(models["beagle-dsv3"], speculative_config={"method": "mtp", "num_speculative_tokens": 1})
    with pytest.raises(PluginRefusal, match=r"you asked for 'mtp', but vLLM 9\.9\.9 would run 'eagle'"):
        args.create_speculative_config(vllm_standin.ModelConfig(models["beagle-dsv3"]), None)


def test_a_vllm_without_the_guarded_method_starts_with_a_warning(caplog):
    """A plugin's exception stops vLLM starting; a layout without create_speculative_config gets a warning."""
    class EngineArgs:  # another release's EngineArgs, without the method the plugin wraps
        pass

    with caplog.at_level(logging.WARNING, logger="vllm.specsure"):
        assert install(EngineArgs, object(), "0.99.0") is False
    assert "has no EngineArgs.create_speculative_config" in caplog.text and "does nothing" in caplog.text
    assert not hasattr(EngineArgs, "create_speculative_config")


def test_install_is_idempotent(models):
    module = vllm_standin.arg_utils()
    assert install(module.EngineArgs, module, TESTED) is True
    wrapped = module.EngineArgs.create_speculative_config
    assert install(module.EngineArgs, module, TESTED) is False
    assert module.EngineArgs.create_speculative_config is wrapped


# --- the neutral link cache ---------------------------------------------------------------------

def test_links_are_deterministic_and_reused(models, tmp_path):
    first = neutral_link(models["my-eagle-draft"])
    assert neutral_link(models["my-eagle-draft"]) == first
    assert Path(first).parent == tmp_path / "links" and os.readlink(first) == models["my-eagle-draft"]
    assert "eagle-" not in first.lower() and "eagle3" not in first.lower()
    assert Path(first).name == link_name(Path(models["my-eagle-draft"]))
    assert neutral_link(models["beagle-7b"]) != first


def test_a_stale_link_is_replaced_never_followed(models, tmp_path):
    link = Path(neutral_link(models["my-eagle-draft"]))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link.unlink()
    link.symlink_to(elsewhere)
    assert neutral_link(models["my-eagle-draft"]) == str(link)
    assert os.readlink(link) == models["my-eagle-draft"] and not any(elsewhere.iterdir())


def test_the_link_cache_refuses_a_trapped_path_and_non_links(models, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECSURE_VLLM_LINKS", str(tmp_path / "eagle-links"))
    with pytest.raises(ValueError, match="contains 'eagle-'.*SPECSURE_VLLM_LINKS"):
        neutral_link(models["my-eagle-draft"])
    monkeypatch.setenv("SPECSURE_VLLM_LINKS", str(tmp_path / "links"))
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / link_name(Path(models["beagle-7b"]))).mkdir()
    with pytest.raises(ValueError, match="is not a link"):
        neutral_link(models["beagle-7b"])


def test_a_link_cache_that_cannot_be_made_names_the_folder_and_the_fix(models, tmp_path, monkeypatch):
    """A cache path through a file (as a read-only home fails): one clear error, not vLLM's raw OSError."""
    (tmp_path / "a-file").write_text("")
    for where in (tmp_path / "a-file" / "links", tmp_path / "a-file"):
        monkeypatch.setenv("SPECSURE_VLLM_LINKS", str(where))
        with pytest.raises(ValueError, match=r"link cache .*Set SPECSURE_VLLM_LINKS to a writable folder|"
                                             r"is not a plain folder"):
            neutral_link(models["beagle-7b"])


# --- the plan on its own -------------------------------------------------------------------------

def test_user_config_merges_the_flags_as_vllm_does():
    assert user_config(None, {}) is None
    assert user_config({"num-speculative-tokens": 2}, {"spec_method": "ngram"}) == {
        "num_speculative_tokens": 2, "method": "ngram"}


def test_the_plan_warns_when_specsures_engine_would_refuse(models):
    plan = make_plan({"method": "draft_model", "model": models["EAGLE3-LLaMA-head"]}, models["target"])
    assert plan.handed is not None and plan.handed["method"] == "draft_model"
    assert any("would refuse" in w and "EAGLE-3 head" in w for w in plan.warnings)


def test_a_folder_ending_in_eagle_under_a_trapped_parent_gets_a_link_vllm_passes(tmp_path, models):
    draft = str(write_checkpoint(tmp_path / "models" / "eagle-runs" / "qwen-eagle", llama()))
    spec = vllm(models["target"], speculative_config={"method": "draft_model", "model": draft,
                                                      "num_speculative_tokens": 3})
    assert spec.method == "draft_model" and same_folder(spec.model, draft)


def test_guard_mode_leaves_the_fields_you_did_not_set_to_vllm(models):
    module = vllm_standin.arg_utils()
    install(module.EngineArgs, module, "9.9.9")
    args = module.EngineArgs(models["target"], speculative_config={"method": "ngram", "num_speculative_tokens": 4})
    spec = args.create_speculative_config(vllm_standin.ModelConfig(models["target"]), None)
    assert spec.method == "ngram" and (spec.prompt_lookup_min, spec.prompt_lookup_max) == (5, 5)  # vLLM's own


@pytest.mark.parametrize("name", ["deepseek_mtp", "exaone_moe_mtp"])
def test_every_mtp_name_vllm_takes_is_mtp_to_the_plugin(models, monkeypatch, name):
    monkeypatch.setattr(vllm_standin, "MTP_ALIASES", vllm_standin.MTP_ALIASES | {"exaone_moe_mtp"})
    spec = vllm(models["dsv3"], speculative_config={"method": name, "num_speculative_tokens": 1})
    assert spec.method == "mtp"


def test_a_gguf_draft_under_a_trapped_folder_gets_a_neutral_link_to_the_file(tmp_path, monkeypatch):
    """vLLM reads a GGUF draft by its extension: the link to the file keeps it (a folder-only link stopped vLLM)."""
    monkeypatch.setenv("SPECSURE_VLLM_LINKS", str(tmp_path / "links"))
    gguf = tmp_path / "eagle-experiments" / "tiny-eagle3.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF")
    link = neutral_link(str(gguf))
    assert os.path.islink(link) and os.path.realpath(link) == str(gguf.resolve()) and link.endswith(".gguf")
    from specsure.config.vllm_overrides import vllm_path_trap

    assert vllm_path_trap(link) is None and neutral_link(str(gguf)) == link


@pytest.mark.parametrize("spec", [{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_branches": 1},
                                  {"method": "eagle3", "speculative_token_tree": "[(0,), (0, 0)]"}],
                         ids=["one branch", "a chain tree"])
def test_a_specsure_key_that_drafts_vllms_own_chain_is_left_out_with_a_note(models, caplog, spec):
    if spec["method"] == "eagle3":
        spec = {**spec, "model": models["EAGLE3-LLaMA-head"]}
    with caplog.at_level(logging.INFO, logger="vllm.specsure"):
        handed = vllm(models["target"], speculative_config=spec)
    assert handed.method == spec["method"]
    assert "prompt_lookup_branches" not in handed.extra and "speculative_token_tree" not in handed.extra
    assert any("as vLLM does without the key, which it does not have: left out" in r.message for r in caplog.records)


def test_strict_mode_refuses_what_specsures_strict_refuses(models, monkeypatch):
    monkeypatch.setenv("SPECSURE_VLLM_PLUGIN", "strict")
    with pytest.raises(PluginRefusal) as err:  # draft_model on an EAGLE-3 head: its config says eagle3
        vllm(models["target"], speculative_config={"method": "draft_model", "model": models["EAGLE3-LLaMA-head"],
                                                   "num_speculative_tokens": 2})
    assert "cannot be handed to vLLM as configured" in str(err.value) and "'eagle3'" in str(err.value)
    assert "vLLM does not start (SPECSURE_VLLM_PLUGIN=strict)" in str(err.value)
    monkeypatch.setenv("SPECSURE_VLLM_PLUGIN", "enforce")  # the same config starts, with warnings
    assert vllm(models["target"], speculative_config={"method": "draft_model", "model": models["EAGLE3-LLaMA-head"],
                                                      "num_speculative_tokens": 2}).method == "draft_model"


def test_specsures_disagreement_warnings_reach_vllms_logger(models, caplog):
    with caplog.at_level(logging.WARNING, logger="vllm.specsure"):
        vllm(models["target"], speculative_config={"method": "draft_model", "model": models["EAGLE3-LLaMA-head"],
                                                   "num_speculative_tokens": 2})
    forwarded = [r for r in caplog.records if r.name == "vllm.specsure" and "evidence suggests" in r.getMessage()]
    assert forwarded and forwarded[0].getMessage().startswith("specsure: ")
    assert not logging.getLogger("specsure").handlers  # forwarded while the plugin resolved, and only then
