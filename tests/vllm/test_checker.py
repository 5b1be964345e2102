"""check-vllm against the real vLLM 0.33.0, on CPU, with config.json-only checkpoints.

One probe call resolves every case (importing vLLM costs ~30-60 s on two cores); a few
end-to-end CLI runs check the exit codes.
"""

from __future__ import annotations

import json
import shlex
import sys

import pytest

from specsure.cli.main import main
from specsure.config import resolve
from specsure.config.export import export
from specsure.vllm_check import compare, run_probe

# (case id, target, speculative config, expected method vLLM runs, cause substring or None)
CASES = [
    ("draft_model in my-eagle-draft", "target", {"method": "draft_model", "model": "my-eagle-draft"},
     "eagle", "folder-name substring"),
    ("draft_model in beagle-7b", "target", {"method": "draft_model", "model": "beagle-7b"},
     "eagle", "folder-name substring"),
    ("mtp on DeepSeek-V3 in beagle-dsv3", "beagle-dsv3", {"method": "mtp"}, "eagle", "folder-name substring"),
    ("draft_model with an EAGLE-3 checkpoint", "target", {"method": "draft_model", "model": "EAGLE3-LLaMA-head"},
     "eagle3", "folder-name substring"),
    ("draft_model with a DeepSeek-V3 draft", "target", {"method": "draft_model", "model": "dsv3"},
     "mtp", "model_type rewrite"),
    ("draft_model with a small Qwen3.5 draft", "target", {"method": "draft_model", "model": "qwen35-small"},
     "mtp", "model_type rewrite"),
    ("draft_model, neutral folder", "target", {"method": "draft_model", "model": "small-draft"}, "draft_model", None),
    ("draft_model, detected", "target", {"model": "small-draft", "num_speculative_tokens": 3}, "draft_model", None),
    ("mtp on DeepSeek-V3, neutral folder", "dsv3", {"method": "mtp"}, "mtp", None),
    ("eagle3 head, detected, neutral folder", "target", {"model": "head-three"}, "eagle3", None),
    ("eagle3 in an eagle3 folder", "target", {"method": "eagle3", "model": "EAGLE3-LLaMA-head"}, "eagle3", None),
    ("speculators-format eagle3 head, detected", "target", {"model": "spec-head"}, "eagle3", None),
    ("ngram, defaults", "target", {"method": "ngram"}, "ngram", None),
    ("ngram, k and bounds", "target", {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4},
     "ngram", None),
]


def _spec(ckpt, spec):
    return {k: (ckpt[v] if k == "model" else v) for k, v in spec.items()}


@pytest.fixture(scope="module")
def probed(vllm_python, ckpt):
    """Every case's Resolution, export and vLLM answer, from one probe call."""
    resolved = []
    for _, target, spec, _, _ in CASES:
        res = resolve(_spec(ckpt, spec), model=ckpt[target])
        resolved.append((res, export(res, "vllm")))
    cases = [{"model": out.args[1], "speculative_config": dict(out.speculative_config)} for _, out in resolved]
    answer = run_probe(vllm_python, cases)
    assert answer["vllm_version"] == "0.33.0"
    return [(res, out, result) for (res, out), result in zip(resolved, answer["results"])]


@pytest.mark.parametrize("index", range(len(CASES)), ids=[c[0] for c in CASES])
def test_case(probed, index):
    _, _, _, vllm_method, cause = CASES[index]
    res, out, result = probed[index]
    assert "error" not in result, result
    assert result["method"] == vllm_method
    check = compare(res, result, exported=out.speculative_config, vllm_version="0.33.0")
    if cause is None:
        assert check.ok, check.table()
        assert not out.workarounds
    else:
        assert not check.ok
        (mismatch,) = check.mismatches
        assert mismatch.field == "method" and mismatch.specsure == res.config.method
        assert cause in mismatch.cause
        # The export predicted the same override before vLLM was asked.
        assert any(f"would run method {vllm_method!r}" in w for w in out.warnings), out.warnings


def test_symlink_workaround_makes_vllm_agree(vllm_python, ckpt, tmp_path):
    """The export's proposed fix, applied, gives back the asked method in vLLM itself."""
    fixed = []
    for name, target, spec in [("draft", "target", {"method": "draft_model", "model": "my-eagle-draft"}),
                               ("draft", "target", {"method": "draft_model", "model": "beagle-7b"}),
                               ("target", "beagle-dsv3", {"method": "mtp"}),
                               ("draft", "target", {"method": "draft_model", "model": "EAGLE3-LLaMA-head"})]:
        res = resolve(_spec(ckpt, spec), model=ckpt[target])
        (command,) = export(res, "vllm").workarounds
        argv = shlex.split(command)
        link = tmp_path / f"{len(fixed)}" / argv[-1].rsplit("/", 1)[-1]
        link.parent.mkdir()
        link.symlink_to(argv[-2])
        spec2 = {**_spec(ckpt, spec), **({"model": str(link)} if name == "draft" else {})}
        res2 = resolve(spec2, model=str(link) if name == "target" else ckpt[target])
        out2 = export(res2, "vllm")
        assert out2.workarounds == ()
        fixed.append((res2, out2))
    answer = run_probe(vllm_python, [{"model": o.args[1], "speculative_config": dict(o.speculative_config)}
                                     for _, o in fixed])
    for (res2, out2), result in zip(fixed, answer["results"]):
        assert result["method"] == res2.config.method, result
        assert compare(res2, result, exported=out2.speculative_config).ok


def cli(ckpt, vllm_python, target, spec, *extra):
    return main(["check-vllm", "--model", ckpt[target], "--speculative-config", json.dumps(_spec(ckpt, spec)),
                 "--vllm-python", vllm_python, *extra])


def test_cli_exit_1_names_cause_and_fix(ckpt, vllm_python, capsys):
    assert cli(ckpt, vllm_python, "target", {"method": "draft_model", "model": "my-eagle-draft"}) == 1
    out = capsys.readouterr().out
    print(out)
    assert "MISMATCH method: specsure runs draft_model, vLLM would run eagle" in out
    assert "folder-name substring" in out and "ln -s" in out


def test_cli_exit_0_for_neutral_folder(ckpt, vllm_python, capsys):
    assert cli(ckpt, vllm_python, "target", {"method": "draft_model", "model": "small-draft"}, "--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] and data["vllm_version"] == "0.33.0"
    assert {r["field"] for r in data["fields"]} >= {"method", "model", "num_speculative_tokens"}


def test_cli_exit_2_when_python_has_no_vllm(ckpt, capsys):
    assert cli(ckpt, sys.executable, "target", {"method": "ngram"}) == 2
    assert "import vllm failed" in capsys.readouterr().err


def test_suffix_keys_resolve_the_same_in_vllm(vllm_python, ckpt, tmp_path, monkeypatch):
    """vLLM 0.33.0 resolves every suffix_decoding_* key the export writes as specsure does.

    vLLM refuses suffix without the arctic-inference package, which this environment does not
    install; its config code only checks that the module can be found, so an empty stand-in
    package on PYTHONPATH lets vLLM resolve the config.
    """
    specs = [{"method": "suffix"},
             {"method": "suffix", "num_speculative_tokens": 6, "suffix_decoding_max_tree_depth": 16,
              "suffix_decoding_max_cached_requests": 0, "suffix_decoding_max_spec_factor": 2,
              "suffix_decoding_min_token_prob": 0.25}]
    resolved = [(res, export(res, "vllm")) for res in (resolve(spec, model=ckpt["target"]) for spec in specs)]
    cases = [{"model": ckpt["target"], "speculative_config": dict(out.speculative_config)} for _, out in resolved]
    stand_in = tmp_path / "stand-in" / "arctic_inference"
    stand_in.mkdir(parents=True)
    (stand_in / "__init__.py").write_text("")
    monkeypatch.setenv("PYTHONPATH", str(stand_in.parent))
    answer = run_probe(vllm_python, cases)
    for (res, out), result in zip(resolved, answer["results"]):
        assert "error" not in result, result
        check = compare(res, result, exported=out.speculative_config, vllm_version="0.33.0")
        assert check.ok, check.table()
        assert {r.field: r.vllm for r in check.rows}["suffix_decoding_max_tree_depth"] == \
            res.config.suffix_decoding_max_tree_depth
        assert any("arctic-inference" in w for w in out.warnings)


def test_a_token_tree_exports_as_a_chain_that_vllm_accepts(vllm_python, ckpt):
    """vLLM 0.33.0 has no speculative_token_tree (its config refuses the key), so the export leaves
    it out; vLLM then runs the same method and draft with k = the tree's node count."""
    res = resolve({"method": "eagle3", "model": ckpt["head-three"], "speculative_token_tree": "[(1,), (0, 0), (0,)]"},
                  model=ckpt["target"])
    out = export(res, "vllm")
    assert "speculative_token_tree" not in out.speculative_config
    written = {**out.speculative_config, "speculative_token_tree": "[(0,), (1,), (0, 0)]"}
    answer = run_probe(vllm_python, [{"model": ckpt["target"], "speculative_config": dict(out.speculative_config)},
                                     {"model": ckpt["target"], "speculative_config": written}])
    exported, as_written = answer["results"]
    assert "error" not in exported and exported["num_speculative_tokens"] == 3
    assert compare(res, exported, exported=out.speculative_config).ok
    assert "speculative_token_tree" in as_written["error"]  # why the export leaves it out


def test_a_speculators_target_is_replaced_as_predicted(vllm_python, ckpt):
    """vLLM serves the verifier and runs the checkpoint's method and draft: check-vllm and export both say so."""
    res = resolve({"method": "draft_model", "model": ckpt["small-draft"], "num_speculative_tokens": 2},
                  model=ckpt["spec-head"], strict=False)
    out = export(res, "vllm")
    (result,) = run_probe(vllm_python, [{"model": out.args[1], "speculative_config": dict(out.speculative_config)}])[
        "results"]
    assert result["replaced_by_speculators"] and result["method"] == "eagle3", result
    assert result["target"] == "meta-llama/Llama-3.1-8B-Instruct" and result["num_speculative_tokens"] == 2
    check = compare(res, result, exported=out.speculative_config, vllm_version="0.33.0")
    assert not check.ok and all("speculators-format" in m.cause for m in check.mismatches), check.table()
    assert any("would run method 'eagle3'" in w and "speculators-format" in w for w in out.warnings), out.warnings


def test_a_draft_n_predict_refusal_is_vllms_own(vllm_python, ckpt):
    """The export names the refusal for k = 4 against a draft's n_predict = 3, and vLLM makes it; k = 6 it accepts."""
    answers = []
    for k in (4, 6):
        res = resolve({"method": "draft_model", "model": ckpt["draft-n-predict-3"], "num_speculative_tokens": k},
                      model=ckpt["target"])
        out = export(res, "vllm")
        assert any("refuses" in w and "n_predict = 3" in w for w in out.warnings) == (k == 4), out.warnings
        answers.append(out)
    refused, accepted = run_probe(vllm_python, [{"model": ckpt["target"], "speculative_config": dict(o.speculative_config)}
                                                for o in answers])["results"]
    assert "divisible by n_predict=3" in refused["error"], refused
    assert "error" not in accepted and accepted["num_speculative_tokens"] == 6, accepted
