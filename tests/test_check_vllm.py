"""check-vllm without vLLM: the comparison logic, and the CLI against a fake vLLM Python.

The real vLLM runs only in tests/vllm/ (make test-vllm).
"""

from __future__ import annotations

import ast
import json
import stat
import sys
from pathlib import Path

import pytest

from specsure.cli.main import main
from specsure.config import resolve
from specsure.vllm_check import ProbeError, compare, run_probe

from test_export import write


@pytest.fixture
def target(tmp_path: Path) -> str:
    return write(tmp_path / "target")


def vllm_result(**fields):
    base = {"method": "draft_model", "model": None, "num_speculative_tokens": 4, "prompt_lookup_min": 0,
            "prompt_lookup_max": 0, "draft_model_type": "llama", "draft_architectures": ["LlamaForCausalLM"]}
    return {**base, **fields}


def test_agreement_is_ok(tmp_path, target):
    draft = write(tmp_path / "small", num_hidden_layers=2)
    res = resolve({"method": "draft_model", "model": draft}, model=target)
    check = compare(res, vllm_result(model=draft), exported={"method": "draft_model"}, vllm_version="0.33.0")
    assert check.ok and all(r.agree for r in check.rows)
    assert "OK" in check.table()


def test_ngram_placeholders_are_normalised(target):
    res = resolve({"method": "ngram", "num_speculative_tokens": 3}, model=target)
    result = vllm_result(method="ngram", model="ngram", num_speculative_tokens=3, prompt_lookup_min=2,
                         prompt_lookup_max=5)
    assert compare(res, result, exported={}).ok
    assert not compare(res, {**result, "prompt_lookup_min": 5}, exported={}).ok


def test_specsures_own_keys_get_a_note_saying_what_vllm_does_instead(target):
    result = vllm_result(method="ngram", model="ngram", num_speculative_tokens=3, prompt_lookup_min=2,
                         prompt_lookup_max=5)
    res = resolve({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_branches": 2,
                   "disable_by_batch_size": 4}, model=target)
    check = compare(res, result, exported=res.config.to_vllm())
    assert check.ok
    assert any("prompt_lookup_branches = 2 is specsure's own key" in n and "a chain of" in n for n in check.notes)
    assert any("num_speculative_tokens_per_batch_size = [[1, 3, 3], [4, 4, 0]]" in n for n in check.notes)
    assert "prompt_lookup_branches = 2" in check.table()
    plain = resolve({"method": "ngram", "num_speculative_tokens": 3}, model=target)
    assert compare(plain, result, exported={}).notes == ()


def test_path_substring_is_named_with_a_symlink_fix(tmp_path, target):
    draft = write(tmp_path / "my-eagle-draft", num_hidden_layers=2)
    res = resolve({"method": "draft_model", "model": draft}, model=target)
    check = compare(res, vllm_result(method="eagle", model=draft), exported={})
    (m,) = check.mismatches
    assert (m.field, m.specsure, m.vllm) == ("method", "draft_model", "eagle")
    assert "folder-name substring" in m.cause and "'eagle-'" in m.cause
    assert "ln -s" in m.fix and "my-eagle_draft" in m.fix
    assert "differs" in check.table()


def test_mtp_target_path_substring(tmp_path):
    target = write(tmp_path / "beagle-dsv3", architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3",
                   num_nextn_predict_layers=1)
    res = resolve({"method": "mtp"}, model=target)
    (m,) = compare(res, vllm_result(method="eagle", model=target, num_speculative_tokens=1), exported={}).mismatches
    assert "target path" in m.cause and "--model" in m.fix


def test_path_substring_over_an_mtp_model_type_offers_no_symlink(tmp_path, target):
    draft = write(tmp_path / "beagle-dsv3", architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3",
                  num_nextn_predict_layers=1)
    res = resolve({"method": "draft_model", "model": draft}, model=target)
    (m,) = compare(res, vllm_result(method="eagle", model=draft), exported={}).mismatches
    assert "folder-name substring" in m.cause
    assert "ln -s" not in m.fix and "not enough" in m.fix and "'mtp'" in m.fix


def test_model_type_rewrite_is_named(tmp_path, target):
    draft = write(tmp_path / "dsv3", architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3",
                  num_nextn_predict_layers=1)
    res = resolve({"method": "draft_model", "model": draft}, model=target)
    result = vllm_result(method="mtp", model=draft, draft_model_type="deepseek_mtp")
    (m,) = compare(res, result, exported={}).mismatches
    assert "model_type rewrite" in m.cause and "'deepseek_v3'" in m.cause and "'deepseek_mtp'" in m.cause


def test_different_draft_is_a_mismatch(tmp_path, target):
    draft = write(tmp_path / "small", num_hidden_layers=2)
    res = resolve({"method": "draft_model", "model": draft}, model=target)
    (m,) = compare(res, vllm_result(model=str(tmp_path / "other")), exported={}).mismatches
    assert m.field == "model"


def test_symlinked_draft_is_the_same_draft(tmp_path, target):
    draft = write(tmp_path / "small", num_hidden_layers=2)
    link = tmp_path / "link"
    link.symlink_to(draft)
    res = resolve({"method": "draft_model", "model": str(link)}, model=target)
    assert compare(res, vllm_result(model=draft), exported={}).ok


VLLM_SUFFIX_DEFAULTS = {"suffix_decoding_max_tree_depth": 24, "suffix_decoding_max_cached_requests": 10000,
                        "suffix_decoding_max_spec_factor": 1.0, "suffix_decoding_min_token_prob": 0.1}


def test_suffix_rows_compare_every_suffix_key(target):
    res = resolve({"method": "suffix", "suffix_decoding_max_spec_factor": 0.5}, model=target)
    # vLLM 0.33.0 resolves suffix with model 'suffix', no draft config and prompt lookup left None.
    result = vllm_result(method="suffix", model="suffix", num_speculative_tokens=24, prompt_lookup_min=None,
                         prompt_lookup_max=None, draft_model_type=None, draft_architectures=[],
                         **{**VLLM_SUFFIX_DEFAULTS, "suffix_decoding_max_spec_factor": 0.5})
    check = compare(res, result, exported=res.config.to_vllm(), vllm_version="0.33.0")
    assert check.ok, check.table()
    rows = {r.field: r for r in check.rows}
    assert rows["suffix_decoding_max_spec_factor"].asked == 0.5 and rows["suffix_decoding_max_spec_factor"].vllm == 0.5
    assert rows["suffix_decoding_max_tree_depth"].asked is None and rows["suffix_decoding_max_tree_depth"].vllm == 24
    assert rows["model"].specsure is None and rows["model"].vllm is None
    assert "suffix_decoding_min_token_prob" in check.table()
    (m,) = compare(res, {**result, "suffix_decoding_min_token_prob": 0.3}, exported={}).mismatches
    assert (m.field, m.specsure, m.vllm) == ("suffix_decoding_min_token_prob", 0.1, 0.3)


def test_vllms_suffix_defaults_do_not_matter_for_other_methods(target):
    res = resolve({"method": "ngram", "num_speculative_tokens": 3}, model=target)
    result = vllm_result(method="ngram", model="ngram", num_speculative_tokens=3, prompt_lookup_min=2,
                         prompt_lookup_max=5, **VLLM_SUFFIX_DEFAULTS)
    check = compare(res, result, exported={})
    assert check.ok and {r.field: r.vllm for r in check.rows}["suffix_decoding_max_tree_depth"] is None


# ---- CLI against a fake vLLM Python ------------------------------------------------------------

def fake_python(tmp_path: Path, body: str) -> str:
    path = tmp_path / "fake-python"
    path.write_text("#!/bin/sh\ncat > /dev/null\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def answer(*results) -> str:
    line = "SPECSURE_PROBE_RESULT " + json.dumps({"vllm_version": "0.33.0", "results": list(results)})
    return f"echo 'vllm log line'\necho '{line}'"


def run_cli(target: str, spec: dict, python: str, *extra: str) -> int:
    return main(["check-vllm", "--model", target, "--speculative-config", json.dumps(spec),
                 "--vllm-python", python, *extra])


def test_cli_exit_0_when_vllm_agrees(tmp_path, target, capsys):
    draft = write(tmp_path / "small", num_hidden_layers=2)
    ok = vllm_result(model=draft)
    assert run_cli(target, {"method": "draft_model", "model": draft}, fake_python(tmp_path, answer(ok, ok))) == 0
    out = capsys.readouterr().out
    assert "you asked" in out and "specsure runs" in out and "vLLM 0.33.0 runs" in out


def test_cli_exit_1_names_cause(tmp_path, target, capsys):
    draft = write(tmp_path / "beagle-7b", num_hidden_layers=2)
    bad = vllm_result(method="eagle", model=draft)
    assert run_cli(target, {"draft_model": draft, "method": "draft_model"},
                   fake_python(tmp_path, answer(bad, bad)), "--json") == 1
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is False and "folder-name substring" in data["mismatches"][0]["cause"]


def test_cli_exit_2_when_vllm_config_fails(tmp_path, target, capsys):
    err = {"error": "ValueError: boom"}
    assert run_cli(target, {"method": "ngram"}, fake_python(tmp_path, answer(err, err))) == 2
    assert "config code failed" in capsys.readouterr().err


def test_cli_exit_2_when_vllm_missing(tmp_path, target, capsys):
    assert run_cli(target, {"method": "ngram"}, str(tmp_path / "nope" / "python")) == 2
    assert "--vllm-python" in capsys.readouterr().err


def test_cli_exit_2_without_default_venv(tmp_path, target, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["check-vllm", "--model", target, "--speculative-config", '{"method": "ngram"}']) == 2
    assert ".venv-vllm/bin/python does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("case", ["bad config", "vLLM missing", "vLLM's config fails", "no environment"])
def test_cli_json_errors_are_json_on_stdout_and_a_line_on_stderr(tmp_path, target, capsys, monkeypatch, case):
    spec, python = {"method": "ngram"}, fake_python(tmp_path, answer({"error": "ValueError: boom"}, {}))
    if case == "bad config":
        spec = {"method": "bogus"}
    elif case == "vLLM missing":
        python = str(tmp_path / "nope" / "python")
    args = ["check-vllm", "--model", target, "--speculative-config", json.dumps(spec), "--json"]
    if case == "no environment":
        monkeypatch.chdir(tmp_path)
    else:
        args += ["--vllm-python", python]
    assert main(args) == 2
    captured = capsys.readouterr()
    error = json.loads(captured.out)["error"]
    assert captured.err.strip() == f"error: {error}"


def test_probe_import_failure_is_a_probe_error(tmp_path):
    python = fake_python(tmp_path, "echo 'SPECSURE_PROBE_RESULT {\"import_error\": \"ModuleNotFoundError: vllm\"}'")
    with pytest.raises(ProbeError, match="import vllm failed"):
        run_probe(python, [])


def test_probe_answer_without_results_is_a_probe_error(tmp_path, target, capsys):
    line = "SPECSURE_PROBE_RESULT " + json.dumps({"vllm_version": "0.33.0"})
    assert run_cli(target, {"method": "ngram"}, fake_python(tmp_path, f"echo '{line}'")) == 2
    err = capsys.readouterr().err
    assert "without one result per case" in err and "Traceback" not in err


def test_probe_without_answer_shows_stderr(tmp_path):
    python = fake_python(tmp_path, "echo 'Traceback: kaboom' >&2; echo '  RuntimeError: no' >&2; exit 1")
    with pytest.raises(ProbeError, match="Its last output: Traceback: kaboom [|] RuntimeError: no$"):
        run_probe(python, [])  # one line: the CLI's errors are a paragraph, where \n would print as \\n


def test_probe_script_imports_only_stdlib_and_vllm():
    tree = ast.parse((Path(__file__).parents[1] / "src/specsure/vllm_check/probe.py").read_text())
    roots = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
             for alias in node.names}
    roots |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert roots <= {"importlib", "json", "os", "sys", "traceback", "vllm"}


def test_real_probe_without_vllm_is_a_probe_error():
    # specsure's own venv has no vLLM: the real probe script must say so, not crash.
    with pytest.raises(ProbeError, match="import vllm failed"):
        run_probe(sys.executable, [{"model": "x", "speculative_config": {}}], timeout=120)


@pytest.mark.parametrize("timeout", ["0", "-1", "nan", "inf"])
def test_cli_bad_timeout_exits_2(tmp_path, target, capsys, timeout):
    assert run_cli(target, {"method": "ngram"}, str(tmp_path / "python"), "--timeout", timeout) == 2
    assert "--timeout" in capsys.readouterr().err


def test_gguf_target_is_asked_as_its_converted_folder(tmp_path, capsys):
    # vLLM cannot open a bare .gguf without a tokenizer repository; the packaged default is one.
    seen = tmp_path / "cases.json"
    python = tmp_path / "recording-python"
    ok = vllm_result(method="ngram", model=None, prompt_lookup_min=5, prompt_lookup_max=5,
                     draft_model_type=None, draft_architectures=None)
    line = "SPECSURE_PROBE_RESULT " + json.dumps({"vllm_version": "0.33.0", "results": [ok, ok]})
    python.write_text(f"#!/bin/sh\ncat > {seen}\necho '{line}'\n")
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    spec = {"method": "ngram", "prompt_lookup_min": 5, "prompt_lookup_max": 5, "num_speculative_tokens": 4}
    main(["check-vllm", "--speculative-config", json.dumps(spec), "--vllm-python", str(python)])
    err = capsys.readouterr().err
    models = {case["model"] for case in json.loads(seen.read_text())}
    assert len(models) == 1
    folder = Path(models.pop())
    assert folder.is_dir() and (folder / "config.json").is_file()
    assert "is a GGUF file" in err and str(folder) in err


def test_gguf_target_without_the_engine_is_a_clear_error(tmp_path, capsys, monkeypatch):
    """check-vllm runs without torch; only a .gguf target, converted first, needs the engine."""
    import specsure.cli.check_vllm as command

    monkeypatch.setattr(command, "missing_modules", lambda extra: ["torch", "gguf"])
    python = fake_python(tmp_path, answer())
    rc = main(["check-vllm", "--speculative-config", '{"method": "ngram"}', "--vllm-python", python])
    err = capsys.readouterr().err
    assert rc == 2 and "is a GGUF file" in err and "pip install 'specsure[engine]'" in err and "Traceback" not in err


def test_a_speculators_target_that_vllm_replaces_is_a_mismatch(tmp_path, target):
    from test_export import _speculators_target

    spec = _speculators_target(tmp_path / "spec-head", "meta-llama/Llama-3.1-8B-Instruct")
    draft = write(tmp_path / "small", num_hidden_layers=2)
    res = resolve({"method": "draft_model", "model": draft}, model=spec, strict=False)
    replaced = vllm_result(method="eagle3", model=spec, target="meta-llama/Llama-3.1-8B-Instruct",
                           replaced_by_speculators=True)
    check = compare(res, replaced, exported={"method": "draft_model"}, vllm_version="0.33.0")
    assert not check.ok
    by_field = {m.field: m for m in check.mismatches}
    assert {"method", "model"} <= set(by_field) and "speculators-format" in by_field["method"].cause
    assert "--model meta-llama/Llama-3.1-8B-Instruct" in by_field["method"].fix
    # The same method and draft as vLLM's still serve another target: that is a mismatch too.
    same = resolve({"method": "eagle3", "model": spec, "num_speculative_tokens": 4}, model=spec, strict=False)
    check = compare(same, {**replaced, "num_speculative_tokens": 4}, exported={}, vllm_version="0.33.0")
    (mismatch,) = check.mismatches
    assert (mismatch.field, mismatch.vllm) == ("target", "meta-llama/Llama-3.1-8B-Instruct")


def test_a_config_specsure_refuses_is_never_ok_though_vllm_agrees(tmp_path, target, capsys):
    """vLLM runs method 'eagle' with this draft as asked; specsure refuses it (the draft is an EAGLE-3 head):
    the table still shows vLLM's answer, but no "OK", and the exit is 2."""
    head = write(tmp_path / "head", architectures=["LlamaForCausalLMEagle3"], num_hidden_layers=1, draft_vocab_size=64)
    agree = vllm_result(method="eagle", model=head)
    assert run_cli(target, {"method": "eagle", "model": head}, fake_python(tmp_path, answer(agree, agree))) == 2
    out = capsys.readouterr().out
    assert "OK:" not in out and "NOT RUNNABLE: specsure would refuse this config" in out and "EAGLE-3 head" in out


def test_cli_hands_vllms_own_keys_to_vllm_as_export_does(tmp_path, target, capsys):
    """Draft parallelism, quantization, backends, vLLM's schedule: specsure's engine does not read them, but
    the config a user deploys has them, so check-vllm asks vLLM with them, as export writes them."""
    draft = write(tmp_path / "small", num_hidden_layers=2)
    ok = vllm_result(model=draft, num_speculative_tokens=2)
    line = "SPECSURE_PROBE_RESULT " + json.dumps({"vllm_version": "0.33.0", "results": [ok, ok]})
    python = tmp_path / "recording-python"
    python.write_text(f"#!/bin/sh\ncat > {tmp_path / 'asked.json'}\necho '{line}'\n")
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    theirs = {"draft_tensor_parallel_size": 1, "quantization": "fp8", "attention_backend": "FLASH_ATTN",
              "num_speculative_tokens_per_batch_size": [[1, 4, 2], [5, 8, 1]]}
    assert run_cli(target, {"method": "draft_model", "model": draft, "num_speculative_tokens": 2, **theirs},
                   str(python)) == 0
    asked = json.loads((tmp_path / "asked.json").read_text())
    cases = asked["cases"] if isinstance(asked, dict) else asked
    exported, as_written = (case["speculative_config"] for case in cases)
    assert {k: exported[k] for k in theirs} == theirs and {k: as_written[k] for k in theirs} == theirs
    assert exported["method"] == "draft_model"


def test_vllms_errors_come_on_one_line_without_pydantics_echo(tmp_path, target, capsys):
    from specsure.vllm_check.compare import concise

    raw = ("ValidationError: 1 validation error for SpeculativeConfig\n  Value error, num_speculative_tokens:3 must "
           "be divisible by n_predict=2 [type=value_error, input_value=ArgsKwargs((), {'method': 'mtp', 'x': [1, 2]}), "
           "input_type=ArgsKwargs]\n    For further information visit https://errors.pydantic.dev/2.12/v/value_error")
    assert concise(raw) == ("ValidationError: 1 validation error for SpeculativeConfig Value error, "
                            "num_speculative_tokens:3 must be divisible by n_predict=2")
    err = {"error": raw.replace("'", "")}  # the fake's shell quotes with '
    line = "SPECSURE_PROBE_RESULT " + json.dumps({"vllm_version": "0.33.0", "results": [err, err]})
    assert run_cli(target, {"method": "ngram"}, fake_python(tmp_path, f"printf '%s\\n' '{line}'")) == 2
    line = capsys.readouterr().err
    assert line.count("\n") == 1 and "input_value" not in line and "must be divisible by n_predict=2." in line
