"""Export of a Resolution to vLLM / SGLang arguments, on config.json-only checkpoints."""

from __future__ import annotations

import json
import shlex
import shutil
import struct
from pathlib import Path

import pytest

from specsure.cli.main import main
from specsure.config import ConfigError, resolve
from specsure.config.export import Export, export
from specsure.config.vllm_overrides import neutral_name, predict_vllm_overrides, vllm_path_trap

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 1000, "hidden_size": 64,
         "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
         "max_position_embeddings": 512}


def write(folder: Path, weights: bool = True, **overrides) -> str:
    """A checkpoint folder: config.json, plus an empty safetensors file so specsure's checks pass."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**LLAMA, **overrides}))
    if weights:
        header = b'{"__metadata__": {}}'
        (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    return str(folder)


@pytest.fixture
def ckpts(tmp_path: Path) -> dict[str, str]:
    return {
        "target": write(tmp_path / "target"),
        "draft": write(tmp_path / "small-draft", num_hidden_layers=2),
        "eagle": write(tmp_path / "head-one", architectures=["EagleLlamaForCausalLM"], num_hidden_layers=1),
        "eagle3": write(tmp_path / "head-three", architectures=["LlamaForCausalLMEagle3"], num_hidden_layers=1,
                        draft_vocab_size=500),
        "dsv3": write(tmp_path / "dsv3", architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3",
                      num_nextn_predict_layers=1),
        "eagle_named_draft": write(tmp_path / "my-eagle-draft", num_hidden_layers=2),
        "beagle_draft": write(tmp_path / "beagle-7b", num_hidden_layers=2),
        "beagle_dsv3": write(tmp_path / "beagle-dsv3", architectures=["DeepseekV3ForCausalLM"],
                             model_type="deepseek_v3", num_nextn_predict_layers=1),
    }


def vllm_json(out) -> dict:
    args = list(out.args)
    return json.loads(args[args.index("--speculative-config") + 1])


def flags(out) -> dict[str, str]:
    args = list(out.args)
    return dict(zip(args[::2], args[1::2]))


# ---- vLLM: every method, every field explicit --------------------------------------------------

def test_vllm_ngram_every_field_explicit(ckpts):
    res = resolve({"method": "ngram"}, model=ckpts["target"])
    out = export(res, "vllm")
    assert out.args[:2] == ("--model", ckpts["target"])
    assert vllm_json(out) == {"method": "ngram", "num_speculative_tokens": 5,
                              "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    assert out.speculative_config == vllm_json(out)


def test_vllm_draft_model(ckpts):
    res = resolve({"model": ckpts["draft"], "num_speculative_tokens": 3}, model=ckpts["target"])
    out = export(res, "vllm")
    assert vllm_json(out) == {"method": "draft_model", "model": ckpts["draft"], "num_speculative_tokens": 3}
    assert out.warnings == () and out.workarounds == ()


@pytest.mark.parametrize("kind, method", [("eagle", "eagle"), ("eagle3", "eagle3")])
def test_vllm_eagle_heads_detected_then_made_explicit(ckpts, kind, method):
    res = resolve({"model": ckpts[kind]}, model=ckpts["target"])
    assert res.source("method") == "checkpoint"
    assert vllm_json(export(res, "vllm")) == {"method": method, "model": ckpts[kind], "num_speculative_tokens": 5}


def test_vllm_mtp_inside_target(ckpts):
    res = resolve({"method": "mtp"}, model=ckpts["dsv3"])
    out = export(res, "vllm")
    # vLLM's own rule for mtp without a model is "use the target", the same as specsure's.
    assert vllm_json(out) == {"method": "mtp", "num_speculative_tokens": 1}
    assert out.args[1] == ckpts["dsv3"]
    assert out.warnings == ()


def test_vllm_command_is_shell_pasteable(ckpts):
    res = resolve({"method": "ngram", "num_speculative_tokens": 4}, model=ckpts["target"])
    out = export(res, "vllm")
    assert tuple(shlex.split(out.command())) == out.args


# ---- SGLang --------------------------------------------------------------------------------------

def test_sglang_ngram_flags(ckpts):
    res = resolve({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
                   "prompt_lookup_max": 3}, model=ckpts["target"])
    out = export(res, "sglang")
    # SGLang 0.5.23 has no match-window flags: an argument it does not know stops it at start.
    assert flags(out) == {"--model-path": ckpts["target"], "--speculative-algorithm": "NGRAM",
                          "--speculative-num-draft-tokens": "5", "--speculative-ngram-min-bfs-breadth": "1",
                          "--speculative-ngram-max-bfs-breadth": "1"}
    assert any("prompt_lookup_min = 1 and prompt_lookup_max = 3 have no SGLang flag" in w for w in out.warnings)
    default = export(resolve({"method": "ngram"}, model=ckpts["target"]), "sglang")
    assert not any("prompt_lookup" in w for w in default.warnings)  # specsure's defaults, not the user's values


def test_sglang_never_asks_for_more_tree_nodes_than_its_steps_offer(ckpts):
    """SGLang verifies at most topk + (steps - 1) * topk^2 nodes (organize_draft_results); a full
    binary tree of depth 3 (14 nodes) would fail its first draft step."""
    full = [[0], [1], [0, 0], [0, 1], [1, 0], [1, 1], *([a, b, c] for a in (0, 1) for b in (0, 1) for c in (0, 1))]
    res = resolve({"method": "eagle3", "model": ckpts["eagle3"], "speculative_token_tree": str(full)},
                  model=ckpts["target"])
    out = export(res, "sglang")
    got = flags(out)
    assert (got["--speculative-num-steps"], got["--speculative-eagle-topk"]) == ("3", "2")
    assert got["--speculative-num-draft-tokens"] == "11"  # 10 nodes + the current token
    assert any("the tree has 14 nodes" in w and "at most 10" in w for w in out.warnings)
    fits = resolve({"method": "eagle3", "model": ckpts["eagle3"], "speculative_token_tree": "[(0,), (1,), (0, 0)]"},
                   model=ckpts["target"])
    assert flags(export(fits, "sglang"))["--speculative-num-draft-tokens"] == "4"


def test_sglang_is_told_when_a_head_names_a_class_it_does_not_register(ckpts, tmp_path):
    head = tmp_path / "vllm-named-head"
    shutil.copytree(ckpts["eagle3"], head)
    config = json.loads((head / "config.json").read_text())
    (head / "config.json").write_text(json.dumps({**config, "architectures": ["Eagle3LlamaForCausalLM"]}))
    res = resolve({"method": "eagle3", "model": str(head), "num_speculative_tokens": 2}, model=ckpts["target"])
    assert any("'Eagle3LlamaForCausalLM'" in w and '"architectures": ["LlamaForCausalLMEagle3"]' in w
               for w in export(res, "sglang").warnings)
    shipped = resolve({"method": "eagle3", "model": ckpts["eagle3"], "num_speculative_tokens": 2}, model=ckpts["target"])
    assert not any("registers" in w for w in export(shipped, "sglang").warnings)


@pytest.mark.parametrize("kind, spec, algorithm", [
    ("draft", {"method": "draft_model"}, "STANDALONE"),
    ("eagle", {"method": "eagle"}, "EAGLE"),
    ("eagle3", {"method": "eagle3"}, "EAGLE3"),
])
def test_sglang_draft_methods(ckpts, kind, spec, algorithm):
    res = resolve({**spec, "model": ckpts[kind], "num_speculative_tokens": 3}, model=ckpts["target"])
    got = flags(export(res, "sglang"))
    assert got == {"--model-path": ckpts["target"], "--speculative-algorithm": algorithm,
                   "--speculative-draft-model-path": ckpts[kind], "--speculative-num-steps": "3",
                   "--speculative-eagle-topk": "1", "--speculative-num-draft-tokens": "4"}


def test_sglang_mtp_names_the_target_as_draft(ckpts):
    res = resolve({"method": "mtp", "num_speculative_tokens": 2}, model=ckpts["dsv3"])
    out = export(res, "sglang")
    got = flags(out)
    assert got["--speculative-algorithm"] == "NEXTN"
    assert got["--speculative-draft-model-path"] == ckpts["dsv3"]
    assert got["--speculative-num-steps"] == "2" and got["--speculative-num-draft-tokens"] == "3"
    assert any("NEXTN" in w for w in out.warnings)


# ---- what an engine cannot express is an error ---------------------------------------------------

@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_specsure_only_mtp_head_is_an_error(tmp_path, ckpts, engine):
    head = write(tmp_path / "mtp-head", architectures=["SpecsureMTPHead"], model_type="specsure_mtp",
                 num_hidden_layers=1)
    res = resolve({"method": "mtp", "model": head}, model=ckpts["target"])
    with pytest.raises(ConfigError, match="specsure-format head"):
        export(res, engine)


def test_speculation_off_is_an_error(ckpts):
    with pytest.raises(ConfigError, match="nothing to export"):
        export(resolve(None, model=ckpts["target"]), "vllm")


def test_unknown_engine_is_an_error(ckpts):
    with pytest.raises(ConfigError, match="vllm, sglang"):
        export(resolve({"method": "ngram"}, model=ckpts["target"]), "tensorrt")


# ---- vLLM's substring trap: warn and propose the symlink ----------------------------------------

@pytest.mark.parametrize("path, trap", [
    ("/m/my-eagle-draft", ("eagle-", "eagle")),
    ("/m/beagle-7b", ("eagle-", "eagle")),
    ("/m/Qwen3-8B_EAGLE3", ("eagle3", "eagle3")),
    ("/eagle-models/draft", ("eagle-", "eagle")),
    ("/m/dflash_qwen", ("dflash", "dflash")),
    ("/m/eagle_draft", None),
    ("/m/eagles", None),
    ("/m/tiny-llama", None),
])
def test_vllm_path_trap_matches_vllm_substring_rule(path, trap):
    assert vllm_path_trap(path) == trap


@pytest.mark.parametrize("name", ["my-eagle-draft", "beagle-7b", "EAGLE3-LLaMA", "dflash-x", "dspark-y"])
def test_neutral_name_passes_the_trap(name):
    assert vllm_path_trap(neutral_name(name)) is None


@pytest.mark.parametrize("kind", ["eagle_named_draft", "beagle_draft"])
def test_trapped_draft_path_warns_with_symlink(ckpts, kind):
    res = resolve({"method": "draft_model", "model": ckpts[kind]}, model=ckpts["target"])
    out = export(res, "vllm")
    assert vllm_json(out)["model"] == ckpts[kind]  # the export keeps the user's path
    (warning,) = out.warnings
    assert "'eagle'" in warning and "'eagle-'" in warning and "ln -s" in warning
    (command,) = out.workarounds
    link = shlex.split(command)[-1]
    assert shlex.split(command)[:3] == ["ln", "-s", ckpts[kind]]
    assert vllm_path_trap(link) is None


def test_trapped_target_path_for_mtp_warns(ckpts):
    res = resolve({"method": "mtp"}, model=ckpts["beagle_dsv3"])
    out = export(res, "vllm")
    assert any("target path" in w and "--model" in w for w in out.warnings)
    assert out.workarounds and vllm_path_trap(shlex.split(out.workarounds[0])[-1]) is None


def test_symlink_fix_skips_trapped_parent(tmp_path):
    draft = write(tmp_path / "eagle-zoo" / "small", num_hidden_layers=2)
    target = write(tmp_path / "target")
    res = resolve({"method": "draft_model", "model": draft}, model=target)
    (override,) = predict_vllm_overrides(res)
    link = shlex.split(override.workaround)[-1]
    assert vllm_path_trap(link) is None and link.startswith(str(tmp_path))


def test_eagle_methods_are_not_trapped(tmp_path, ckpts):
    head = write(tmp_path / "my-eagle-head", architectures=["EagleLlamaForCausalLM"], num_hidden_layers=1)
    res = resolve({"method": "eagle", "model": head}, model=ckpts["target"])
    assert export(res, "vllm").warnings == ()


def test_mtp_model_type_draft_as_draft_model_warns(ckpts):
    res = resolve({"method": "draft_model", "model": ckpts["dsv3"]}, model=ckpts["target"])
    (override,) = predict_vllm_overrides(res)
    assert override.vllm == "mtp" and "deepseek_mtp" in override.cause
    assert override.workaround is None


def test_path_trap_with_an_mtp_model_type_behind_it_offers_no_symlink(ckpts):
    # vLLM's substring test hides its model_type rule: a neutral symlink would trade 'eagle' for 'mtp'.
    res = resolve({"method": "draft_model", "model": ckpts["beagle_dsv3"]}, model=ckpts["target"])
    (override,) = predict_vllm_overrides(res)
    assert override.vllm == "eagle" and override.workaround is None
    assert "not enough" in override.fix and "'mtp'" in override.fix and "deepseek_mtp" in override.fix
    out = export(res, "vllm")
    assert out.workarounds == () and any("not enough" in w for w in out.warnings)


def test_draft_already_of_an_mtp_model_type_reads_cleanly(tmp_path, ckpts):
    draft = write(tmp_path / "mtp-typed", model_type="deepseek_mtp", num_hidden_layers=2)
    res = resolve({"method": "draft_model", "model": draft}, model=ckpts["target"], strict=False)
    (override,) = predict_vllm_overrides(res)
    assert "has model_type 'deepseek_mtp'; vLLM detects 'mtp'" in override.cause, override.cause


def test_strict_makes_a_predicted_override_an_error(ckpts):
    res = resolve({"method": "draft_model", "model": ckpts["eagle_named_draft"]}, model=ckpts["target"])
    with pytest.raises(ConfigError, match="strict"):
        export(res, "vllm", strict=True)
    export(res, "sglang", strict=True)  # SGLang takes the algorithm as given


# ---- CLI -----------------------------------------------------------------------------------------

def test_cli_json(ckpts, capsys):
    spec = json.dumps({"method": "draft_model", "model": ckpts["beagle_draft"], "num_speculative_tokens": 2})
    assert main(["export", "--to", "vllm", "--model", ckpts["target"], "--speculative-config", spec,
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["speculative_config"] == {"method": "draft_model", "model": ckpts["beagle_draft"],
                                          "num_speculative_tokens": 2}
    assert data["workarounds"] and data["warnings"]


def test_cli_carries_vllms_deployment_keys_to_the_engine(ckpts, capsys):
    """A vLLM config file holds draft parallelism, quantization, revisions: specsure does not run them,
    and the export passes them on (vLLM has no flag of its own for them; SGLang has two)."""
    spec = json.dumps({"method": "draft_model", "model": ckpts["draft"], "num_speculative_tokens": 2,
                       "draft_tensor_parallel_size": 1, "quantization": "fp8", "revision": "main"})
    assert main(["export", "--to", "vllm", "--model", ckpts["target"], "--speculative-config", spec,
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["speculative_config"] == {"method": "draft_model", "model": ckpts["draft"],
                                          "num_speculative_tokens": 2, "draft_tensor_parallel_size": 1,
                                          "quantization": "fp8", "revision": "main"}
    assert json.loads(data["args"][data["args"].index("--speculative-config") + 1]) == data["speculative_config"]
    assert main(["export", "--to", "sglang", "--model", ckpts["target"], "--speculative-config", spec,
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert flags(Export("sglang", tuple(data["args"])))["--speculative-draft-model-quantization"] == "fp8"
    assert flags(Export("sglang", tuple(data["args"])))["--speculative-draft-model-revision"] == "main"
    assert any("draft_tensor_parallel_size = 1 is a vLLM deployment key, and SGLang has no flag for it" in w
               for w in data["warnings"])
    assert main(["explain", "--model", ckpts["target"], "--speculative-config", spec]) == 2  # not specsure's to run
    assert "`specsure export` and `specsure check-vllm` take it" in capsys.readouterr().err


def test_cli_text_prints_args_and_warnings(ckpts, capsys):
    spec = json.dumps({"method": "draft_model", "model": ckpts["eagle_named_draft"]})
    assert main(["export", "--to", "vllm", "--model", ckpts["target"], "--speculative-config", spec]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("--model ") and "--speculative-config" in captured.out
    assert "warning:" in captured.err and "workaround: ln -s" in captured.err


def test_cli_error_exits_2(ckpts, capsys):
    assert main(["export", "--to", "vllm", "--model", ckpts["target"]]) == 2
    assert "nothing to export" in capsys.readouterr().err


def test_unrunnable_config_warns_and_strict_refuses(ckpts):
    # vLLM keeps draft_model for an EAGLE-3 head in a neutral folder; specsure warns that it cannot run.
    res = resolve({"method": "draft_model", "model": ckpts["eagle3"]}, model=ckpts["target"])
    out = export(res, "vllm")
    assert any("would refuse" in w and "EAGLE-3" in w for w in out.warnings)
    with pytest.raises(ConfigError, match="would refuse"):
        export(res, "vllm", strict=True)


@pytest.mark.parametrize("role", ["target", "draft"])
def test_pickle_only_weights_are_refused_on_export_too(tmp_path, ckpts, role):
    folder = write(tmp_path / f"pickled-{role}", weights=False, num_hidden_layers=2)
    (Path(folder) / "pytorch_model.bin").write_bytes(b"not loaded")
    spec, target = ({"model": folder}, ckpts["target"]) if role == "draft" else ({"method": "ngram"}, folder)
    res = resolve(spec, model=target)
    out = export(res, "vllm")
    assert any("would refuse" in w and "only pickle weights" in w for w in out.warnings)
    with pytest.raises(ConfigError, match="only pickle weights"):
        export(res, "vllm", strict=True)


def test_a_pickled_heads_kind_is_named_before_its_pickle(tmp_path, ckpts):
    # vLLM loads pickle: the mismatch it would run into first is the warning worth giving.
    head = write(tmp_path / "head", weights=False, architectures=["LlamaForCausalLMEagle3"], num_hidden_layers=1,
                 draft_vocab_size=500)
    (Path(head) / "pytorch_model.bin").write_bytes(b"not loaded")
    out = export(resolve({"method": "eagle", "model": head}, model=ckpts["target"]), "vllm")
    assert any("would refuse" in w and "EAGLE-3" in w for w in out.warnings), out.warnings


def test_config_only_folders_export_without_a_warning(tmp_path, ckpts):
    draft = write(tmp_path / "config-only", weights=False, num_hidden_layers=2)
    assert export(resolve({"model": draft}, model=ckpts["target"]), "vllm").warnings == ()


def test_symlink_fix_never_names_a_path_that_exists(tmp_path):
    draft = write(tmp_path / "eagle-exp" / "llama-1b", num_hidden_layers=2)
    other = write(tmp_path / "llama-1b", num_hidden_layers=3)  # another model where the link would go
    res = resolve({"method": "draft_model", "model": draft}, model=write(tmp_path / "target"))
    (override,) = predict_vllm_overrides(res)
    link = shlex.split(override.workaround)[-1]
    assert link != other and not Path(link).exists() and vllm_path_trap(link) is None
    Path(link).symlink_to(draft)  # made as told: the next export passes the same link, with nothing to run
    (again,) = predict_vllm_overrides(res)
    assert again.workaround is None and f"pass the neutral symlink {link!r}, which already links" in again.fix


@pytest.mark.parametrize(("architecture", "model_type", "rewritten"), [
    ("Glm4MoeForCausalLM", "glm4_moe", "glm4_moe_mtp"), ("MiMoForCausalLM", "mimo", "mimo_mtp")])
def test_a_draft_vllm_rewrites_by_architecture_warns(ckpts, tmp_path, architecture, model_type, rewritten):
    draft = write(tmp_path / "draft", architectures=[architecture], model_type=model_type, num_hidden_layers=2)
    res = resolve({"method": "draft_model", "model": draft}, model=ckpts["target"])
    (override,) = predict_vllm_overrides(res)
    assert override.vllm == "mtp" and rewritten in override.cause and architecture in override.cause
    with pytest.raises(ConfigError, match="would run method 'mtp'"):
        export(res, "vllm", strict=True)


@pytest.mark.parametrize(("architecture", "model_type", "extra", "rewritten"), [
    ("Qwen3_5ForConditionalGeneration", "qwen3_5", {}, "qwen3_5_mtp"),  # a small Qwen3.5 drafting for a large one
    ("Qwen3_5MoeForCausalLM", "qwen3_5_moe_text", {}, "qwen3_5_mtp"),
    ("Step3p5ForCausalLM", "step3p5", {}, "step3p5_mtp"),
    ("GlmOcrForConditionalGeneration", "glm_ocr", {}, "glm_ocr_mtp"),
    ("NemotronHForCausalLM", "nemotron_h", {"num_nextn_predict_layers": 1}, "nemotron_h_mtp"),
    ("NemotronHForCausalLM", "nemotron_h", {"num_nextn_predict_layers": 0}, None),
    ("Exaone4_5ForConditionalGeneration", "exaone4_5_text", {}, "exaone4_5_mtp"),  # vLLM tests a substring
    ("Gemma4AssistantForCausalLM", "gemma4_assistant", {}, "gemma4_mtp"),
    ("LlamaForCausalLM", "llama", {}, None),
])
def test_vllm_0_33s_mtp_rewrites_are_foreseen(ckpts, tmp_path, architecture, model_type, extra, rewritten):
    """The rules of the 0.33.0 wheel's SpeculativeConfig.hf_config_override, by model_type or architecture."""
    draft = write(tmp_path / "draft", architectures=[architecture], model_type=model_type, num_hidden_layers=2, **extra)
    res = resolve({"method": "draft_model", "model": draft}, model=ckpts["target"], strict=False)
    overrides = predict_vllm_overrides(res)
    if rewritten is None:
        assert overrides == ()
        return
    (override,) = overrides
    assert (override.asked, override.vllm) == ("draft_model", "mtp") and repr(rewritten) in override.cause


def test_a_draft_architecture_of_a_foreign_method_switches_it_in_vllm(ckpts, tmp_path):
    draft = write(tmp_path / "draft", architectures=["Qwen3DSparkModel"], model_type="qwen3", num_hidden_layers=2)
    res = resolve({"method": "draft_model", "model": draft}, model=ckpts["target"], strict=False)
    (override,) = predict_vllm_overrides(res)
    assert override.vllm == "dspark" and "Qwen3DSparkModel" in override.cause


def _speculators_target(folder, verifier):  # noqa: ANN001, ANN202
    return write(folder, architectures=["Eagle3Speculator"], model_type="llama", num_hidden_layers=1,
                 speculators_model_type="eagle3", transformer_layer_config={"hidden_size": 64},
                 speculators_config={"proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                     "verifier": {"name_or_path": verifier}})


def test_a_speculators_target_replaces_the_whole_config_in_vllm(ckpts, tmp_path):
    """vLLM's create_engine_config serves the verifier and runs the checkpoint's own method and draft."""
    target = _speculators_target(tmp_path / "spec-head", "meta-llama/Llama-3.1-8B-Instruct")
    res = resolve({"method": "draft_model", "model": ckpts["draft"]}, model=target, strict=False)
    (override,) = predict_vllm_overrides(res)
    assert (override.field, override.asked, override.vllm) == ("method", "draft_model", "eagle3")
    assert "meta-llama/Llama-3.1-8B-Instruct" in override.cause and "--model meta-llama/" in override.fix
    assert any("would run method 'eagle3'" in w for w in export(res, "vllm", strict=False).warnings)
    # specsure itself refuses first: the target is an EAGLE-3 head, named by its speculators_model_type.
    with pytest.raises(ConfigError, match=r"is itself an EAGLE-3 head \(.*speculators_model_type=\"eagle3\"\)"):
        export(res, "vllm", strict=True)


def test_a_speculators_target_with_a_local_verifier_is_refused_by_vllm(ckpts, tmp_path):
    target = _speculators_target(tmp_path / "spec-head", str(ckpts["target"]))
    res = resolve({"method": "draft_model", "model": ckpts["draft"]}, model=target, strict=False)
    assert predict_vllm_overrides(res) == ()
    assert any("is not a remote repository" in w for w in export(res, "vllm", strict=False).warnings)
    with pytest.raises(ConfigError, match="is itself an EAGLE-3 head"):  # specsure refuses it first
        export(res, "vllm", strict=True)


def test_an_mtp_k_that_vllm_refuses_is_named(tmp_path):
    target = write(tmp_path / "dsv3", architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3",
                   num_nextn_predict_layers=2)
    refused = export(resolve({"method": "mtp", "num_speculative_tokens": 3}, model=target), "vllm")
    assert any("refuses num_speculative_tokens = 3 with 2 MTP modules" in w and "to 2 or 4" in w
               for w in refused.warnings)
    for k in (1, 2, 4):
        out = export(resolve({"method": "mtp", "num_speculative_tokens": k}, model=target), "vllm")
        assert not any("MTP modules" in w for w in out.warnings)
    with pytest.raises(ConfigError, match="refuses num_speculative_tokens = 3 .*strict mode"):
        export(resolve({"method": "mtp", "num_speculative_tokens": 3}, model=target), "vllm", strict=True)


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "EagleLlamaForCausalLM"])
def test_a_draft_n_predict_that_vllm_checks_k_against_is_named(tmp_path, ckpts, arch):
    """vLLM checks any draft's config.json n_predict against k, not only an MTP module count."""
    method = "eagle" if arch.startswith("Eagle") else "draft_model"
    draft = write(tmp_path / "np3", architectures=[arch], num_hidden_layers=1 if method == "eagle" else 2, n_predict=3)
    zero = write(tmp_path / "np0", num_hidden_layers=2, n_predict=0)

    def warnings(model: str, k: int, method: str = method) -> list[str]:
        config = {"method": method, "model": model, "num_speculative_tokens": k}
        return [w for w in export(resolve(config, model=ckpts["target"]), "vllm").warnings if "n_predict" in w]

    assert any("refuses num_speculative_tokens = 5" in w and "n_predict = 3" in w and "to 3 or 6" in w
               for w in warnings(draft, 5))
    assert not [w for w in warnings(draft, 6) if "refuses" in w] and not [w for w in warnings(draft, 2) if "refuses" in w]
    assert any("ZeroDivisionError" in w for w in warnings(zero, 2, "draft_model"))


@pytest.mark.parametrize(("layers", "k", "expected"), [(0, 3, "ZeroDivisionError"), (2, 3, "to 2 or 4"), (1, 3, None)])
def test_a_draft_vllm_makes_an_mtp_model_is_checked_by_its_module_count(tmp_path, ckpts, layers, k, expected):
    """vLLM rewrites a GLM-4.5 draft's model_type to glm4_moe_mtp and takes its num_nextn_predict_layers as
    n_predict: 0 divides by zero when vLLM starts, and k must be a whole number of rounds above it."""
    glm = write(tmp_path / f"glm-{layers}", architectures=["Glm4MoeForCausalLM"], model_type="glm4_moe",
                num_hidden_layers=2, num_nextn_predict_layers=layers)
    res = resolve({"method": "draft_model", "model": glm, "num_speculative_tokens": k}, model=ckpts["target"])
    named = [w for w in export(res, "vllm").warnings if "num_nextn_predict_layers" in w and "n_predict" in w]
    if expected is None:
        assert not named
    else:
        assert len(named) == 1 and expected in named[0] and f"num_nextn_predict_layers = {layers}" in named[0]


def test_disable_by_batch_size_is_vllms_batch_size_schedule_and_named_for_sglang(ckpts):
    """vLLM 0.33.0 refuses the key ("Unexpected keyword argument") but has a schedule that says the
    same: k up to the limit, none from it on (the last range's k carries to larger batches)."""
    res = resolve({"method": "ngram", "num_speculative_tokens": 5, "disable_by_batch_size": 8},
                  model=ckpts["target"])
    assert res.decisions["disable_by_batch_size"].source == "user"
    out = export(res, "vllm")
    spec = vllm_json(out)
    assert "disable_by_batch_size" not in spec
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 7, 5], [8, 8, 0]]
    assert not any("disable_by_batch_size" in w for w in out.warnings)
    suffix = export(resolve({"method": "suffix", "disable_by_batch_size": 8}, model=ckpts["target"]), "vllm")
    assert "num_speculative_tokens_per_batch_size" not in vllm_json(suffix)  # vLLM's V1 runner turns it off
    assert any("disable_by_batch_size = 8 is left out" in w and "V1 model runner" in w for w in suffix.warnings)
    sglang = export(res, "sglang")
    assert not any("batch" in flag for flag in flags(sglang))
    assert any("disable_by_batch_size = 8 has no SGLang flag" in w for w in sglang.warnings)
    unset = resolve({"method": "ngram"}, model=ckpts["target"])
    assert unset.decisions["disable_by_batch_size"].source == "default"
    assert "disable_by_batch_size" not in vllm_json(export(unset, "vllm"))


@pytest.mark.parametrize(("verifier", "remote"), [
    ("meta-llama/Llama-3.1-8B-Instruct", True), ("gpt2", True), ("a" * 50 + "/" + "b" * 50, True),
    ("x.git", False), ("org-/repo", False), ("org/-repo", False), ("org./repo", False), ("a/b/c", False),
    ("/abs/path", False), ("org/re--po", False), (7, False),
])
def test_the_verifier_vllm_fetches_is_a_hub_repository_id(verifier, remote):
    """huggingface_hub's validate_repo_id, which vLLM applies to a speculators verifier."""
    from specsure.config.vllm_rules import remote_verifier

    assert remote_verifier(verifier) is remote


def test_rule_details_of_vllm_0_33():
    from specsure.config.vllm_rules import foreign_method, vllm_mtp_type

    # 0.33.0 normalises a MiniMaxM3MTP draft's architectures but leaves its model_type: no switch to mtp.
    assert vllm_mtp_type("minimax_m3", ("MiniMaxM3MTP",), {}) is None
    # A rewritten draft's architectures are replaced before the DFlash/DSpark test reads them.
    assert foreign_method(("Qwen3DSparkModel",), "qwen3_5_text", {}) is None
    assert foreign_method(("Qwen3DSparkModel",), "qwen3", {}) == "dspark"


def test_a_speculators_format_head_is_named_not_blamed_on_its_target(ckpts, tmp_path):
    """Its sizes sit under transformer_layer_config; a mismatch cites that key, not a top-level one."""
    head = _speculators_target(tmp_path / "spec-head", "meta-llama/Llama-3.1-8B-Instruct")
    config = json.loads((Path(head) / "config.json").read_text())
    config["transformer_layer_config"].update(num_attention_heads=4, intermediate_size=128, vocab_size=77)
    (Path(head) / "config.json").write_text(json.dumps(config))
    res = resolve({"method": "eagle3", "model": head}, model=ckpts["target"], strict=False)
    with pytest.raises(ConfigError, match=r"transformer_layer_config\.vocab_size = 77, but the target .* needs"):
        res.check_runnable()

@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_relative_path_is_exported_as_typed_with_what_it_needs(ckpts: dict[str, str], tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch, engine: str) -> None:
    """Started elsewhere, vLLM and SGLang read a path that is no folder there as a hub repository id."""
    monkeypatch.chdir(tmp_path)
    res = resolve({"method": "draft_model", "model": "small-draft", "num_speculative_tokens": 2}, model="target")
    out = export(res, engine)
    assert "target" in out.args and ("small-draft" in out.args or '"small-draft"' in out.command())  # as typed
    relative = [w for w in out.warnings if "is relative" in w]
    assert len(relative) == 2, out.warnings
    assert f"absolute path {str(tmp_path / 'target')!r}" in relative[0]
    assert f"absolute path {str(tmp_path / 'small-draft')!r}" in relative[1] and "repository id" in relative[1]
    absolute = export(resolve({"method": "draft_model", "model": ckpts["draft"], "num_speculative_tokens": 2},
                              model=ckpts["target"]), engine)
    assert not [w for w in absolute.warnings if "is relative" in w]


def test_every_key_of_vllms_speculative_config_exports_whole(ckpts, capsys):
    """vLLM 0.33.0's keys for its kernels, samplers and schedules are not specsure's to run, but a vLLM config
    file holding them exports as written (they were "unknown" keys); vLLM's schedule given by hand next to
    disable_by_batch_size, which exports a schedule of its own, is refused rather than one silently kept."""
    theirs = {"attention_backend": "FLASH_ATTN", "kv_cache_dtype": "fp8", "parallel_drafting": False,
              "rejection_sample_method": "standard", "tensor_parallel_size": 1, "draft_load_config": None,
              "num_speculative_tokens_per_batch_size": [[1, 4, 2], [5, 8, 1]]}
    spec = {"method": "draft_model", "model": ckpts["draft"], "num_speculative_tokens": 2, **theirs}
    assert main(["export", "--to", "vllm", "--model", ckpts["target"], "--speculative-config", json.dumps(spec),
                 "--json"]) == 0
    assert {k: v for k, v in json.loads(capsys.readouterr().out)["speculative_config"].items() if k in theirs} == theirs
    assert main(["explain", "--model", ckpts["target"], "--speculative-config", json.dumps(spec)]) == 2
    assert "'attention_backend' is a key of vLLM's speculative config for its own deployment and kernels" in \
        capsys.readouterr().err
    clash = {"method": "ngram", "num_speculative_tokens": 3, "disable_by_batch_size": 4,
             "num_speculative_tokens_per_batch_size": [[1, 8, 3]]}
    assert main(["export", "--to", "vllm", "--model", ckpts["target"], "--speculative-config", json.dumps(clash)]) == 2
    assert "num_speculative_tokens_per_batch_size = [[1, 8, 3]] disagrees with the [[1, 3, 3], [4, 4, 0]]" in \
        capsys.readouterr().err


def test_vllms_own_flags_on_export_are_pointed_at_vllms_command_line(ckpts, capsys):
    """They were told to use `specsure export --to vllm`, the command being run, or that the tokenizer is
    the model's own where the same export tells a GGUF target's user to give vLLM --tokenizer."""
    base = ["export", "--to", "vllm", "--model", ckpts["target"], "--speculative-config", '{"method": "ngram"}']
    for flag in ("--tensor-parallel-size", "--tokenizer", "--enforce-eager"):
        assert main([*base, flag, "4"]) == 2
        assert (f"{flag} is vLLM's own flag; `specsure export` writes the model and speculative flags only. Give it "
                f'to vLLM beside them: eval "vllm serve $(specsure export ...) {flag} ...".') in capsys.readouterr().err
    with pytest.raises(SystemExit):  # one specsure has no word for: argparse's refusal, with the same advice
        main([*base, "--swap-space", "4"])
    assert "give vLLM's or SGLang's own flags to the engine beside them" in capsys.readouterr().err
