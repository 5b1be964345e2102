"""The specsure plugin inside the real vLLM 0.33.0 (run by `make test-vllm`, which installs it there).

vLLM's own `EngineArgs(...)` loads the plugin through its `vllm.general_plugins` entry point; the
script below then asks vLLM's config code for the speculative config, as `create_engine_config`
does. One subprocess per mode resolves every case (importing vLLM costs ~30-60 s on two cores).
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

SCRIPT = r"""
import json, sys
from vllm.config import ParallelConfig
from vllm.engine.arg_utils import EngineArgs
from vllm.logger import configure_logging_if_needed
out = []
for case in json.load(sys.stdin):
    try:
        args = EngineArgs(model=case["model"], speculative_config=case["speculative_config"], skip_tokenizer_init=True,
                          quantization=case.get("quantization"))
        configure_logging_if_needed(args.create_logging_config())  # as create_engine_config does first
        spec = args.create_speculative_config(args.create_model_config(), ParallelConfig())
        out.append({"method": spec.method, "model": spec.model, "quantization": spec.quantization,
                    "schedule": spec.num_speculative_tokens_per_batch_size})
    except Exception as exc:
        out.append({"error": f"{type(exc).__name__}: {exc}"})
print("RESULT " + json.dumps(out))
"""

# (case id, target, speculative config, what vLLM must run: (method, checkpoint) or "refused").
# Some cases set k so that vLLM accepts them as written, which the "off" comparison needs.
CASES = [
    ("draft_model in my-eagle-draft", "target", {"method": "draft_model", "model": "my-eagle-draft", "num_speculative_tokens": 2},
     ("draft_model", "my-eagle-draft")),
    ("draft_model in beagle-7b", "target", {"method": "draft_model", "model": "beagle-7b", "num_speculative_tokens": 2},
     ("draft_model", "beagle-7b")),
    ("caps: draft_model in MY-EAGLE-DRAFT", "target", {"method": "draft_model", "model": "MY-EAGLE-DRAFT"},
     ("draft_model", "MY-EAGLE-DRAFT")),
    ("parent folder eagle-experiments/", "target", {"method": "draft_model", "model": "eagle-experiments/draft"},
     ("draft_model", "eagle-experiments/draft")),
    ("the seed case: mtp on beagle-dsv3", "beagle-dsv3", {"method": "mtp", "num_speculative_tokens": 1},
     ("mtp", "beagle-dsv3")),
    ("the seed case with --quantization fp8", "beagle-dsv3", {"method": "mtp", "num_speculative_tokens": 1},
     ("mtp", "beagle-dsv3")),
    ("explicit mtp with a beagle draft", "target", {"method": "mtp", "model": "beagle-dsv3",
                                                    "num_speculative_tokens": 1}, ("mtp", "beagle-dsv3")),
    ("draft_model with an EAGLE-3 checkpoint", "target", {"method": "draft_model", "model": "EAGLE3-LLaMA-head"},
     ("draft_model", "EAGLE3-LLaMA-head")),
    ("draft_model with a DeepSeek-V3 draft", "target", {"method": "draft_model", "model": "dsv3", "num_speculative_tokens": 2}, "refused"),
    ("neutral: draft_model", "target", {"method": "draft_model", "model": "small-draft", "num_speculative_tokens": 2},
     ("draft_model", "small-draft")),
    ("neutral: detected draft", "target", {"model": "small-draft", "num_speculative_tokens": 3},
     ("draft_model", "small-draft")),
    ("neutral: mtp on dsv3", "dsv3", {"method": "mtp", "num_speculative_tokens": 1}, ("mtp", "dsv3")),
    ("neutral: eagle3 in an eagle3 folder", "target", {"method": "eagle3", "model": "EAGLE3-LLaMA-head"},
     ("eagle3", "EAGLE3-LLaMA-head")),
    ("neutral: ngram", "target", {"method": "ngram", "num_speculative_tokens": 3}, ("ngram", None)),
    ("ngram with disable_by_batch_size (vLLM's schedule)", "target",
     {"method": "ngram", "num_speculative_tokens": 3, "disable_by_batch_size": 4}, ("ngram", None)),
    ("eagle3 with a token tree (no vLLM 0.33.0 key)", "target",
     {"method": "eagle3", "model": "EAGLE3-LLaMA-head", "speculative_token_tree": "[(0,), (1,)]"},
     "refused: a key vLLM lacks"),
    ("eagle3 with a chain as its tree (what vLLM drafts without the key)", "target",
     {"method": "eagle3", "model": "EAGLE3-LLaMA-head", "speculative_token_tree": "[(0,), (0, 0)]"},
     ("eagle3", "EAGLE3-LLaMA-head")),
]
SCHEDULES = {"ngram with disable_by_batch_size (vLLM's schedule)": [[1, 3, 3], [4, 4, 0]]}
"""The batch-size schedule vLLM must hold: disable_by_batch_size as its own key."""
EXTRA = {"MY-EAGLE-DRAFT": "small-draft", "eagle-experiments/draft": "small-draft"}
QUANTIZED = {"the seed case with --quantization fp8": "fp8"}
"""The target's --quantization, which vLLM gives an MTP draft it fills from the target itself."""


@pytest.fixture(scope="module")
def paths(ckpt, tmp_path_factory):
    """The conftest checkpoints plus the folder names only this test needs."""
    root = tmp_path_factory.mktemp("plugin-models")
    out = dict(ckpt)
    for name, like in EXTRA.items():
        (root / name).mkdir(parents=True)
        (root / name / "config.json").write_text((open(os.path.join(ckpt[like], "config.json"))).read())
        out[name] = str(root / name)
    return out


def _run(vllm_python, paths, mode, tmp_path, chosen=CASES):
    cases = [{"model": paths[target], "speculative_config": {k: (paths[v] if k == "model" else v)
                                                             for k, v in spec.items()},
              "quantization": QUANTIZED.get(case)}
             for case, target, spec, _ in chosen]
    env = {**os.environ, "SPECSURE_VLLM_PLUGIN": mode, "SPECSURE_VLLM_LINKS": str(tmp_path / "links")}
    done = subprocess.run([vllm_python, "-c", SCRIPT], input=json.dumps(cases), capture_output=True, text=True,
                          timeout=900, env=env)
    line = next((l for l in done.stdout.splitlines() if l.startswith("RESULT ")), None)
    assert line is not None, done.stderr[-3000:]
    return json.loads(line[len("RESULT "):]), done.stdout + done.stderr  # vLLM logs to stdout


@pytest.fixture(scope="module")
def enforced(vllm_python, paths, tmp_path_factory):
    return _run(vllm_python, paths, "enforce", tmp_path_factory.mktemp("enforce"))


@pytest.fixture(scope="module")
def strict(vllm_python, paths, tmp_path_factory):
    """SPECSURE_VLLM_PLUGIN=strict on a config specsure's --strict refuses, and on a neutral one."""
    chosen = [c for c in CASES if c[0] in ("draft_model with an EAGLE-3 checkpoint", "neutral: draft_model")]
    return _run(vllm_python, paths, "strict", tmp_path_factory.mktemp("strict"), chosen)[0]


@pytest.fixture(scope="module")
def off(vllm_python, paths, tmp_path_factory):
    return _run(vllm_python, paths, "off", tmp_path_factory.mktemp("off"))[0]


@pytest.mark.parametrize("index", range(len(CASES)), ids=[c[0] for c in CASES])
def test_enforce_runs_the_users_method_and_draft_or_refuses(enforced, paths, index):
    _, _, spec, expected = CASES[index]
    got = enforced[0][index]
    if expected == "refused: a key vLLM lacks":  # enforce never drops an explicit key to let vLLM start
        error = got.get("error", "")
        assert error.startswith("PluginRefusal") and "speculative_token_tree = " in error, got
        assert "is a specsure key" in error
        return
    if expected == "refused":
        error = got.get("error", "")
        assert error.startswith("PluginRefusal") and "you asked for 'draft_model'" in error, got
        assert "would run 'mtp'" in error and "Fix:" in error
        return
    method, folder = expected
    assert "error" not in got, got
    assert got["method"] == method and got["quantization"] == QUANTIZED.get(CASES[index][0])
    assert got["schedule"] == SCHEDULES.get(CASES[index][0]), got
    if folder is not None:
        assert os.path.realpath(got["model"]) == os.path.realpath(paths[folder])


def test_enforce_logs_the_effective_config_with_sources(enforced):
    assert "specsure: effective speculative config: method='mtp' (user)" in enforced[1]
    assert "neutral link" in enforced[1]


def test_specsures_own_warnings_print_in_vllms_log_format(enforced):
    line = next(l for l in enforced[1].splitlines() if "you set 'draft_model', but the evidence suggests" in l)
    assert "WARNING" in line and "specsure: method: you set" in line, line  # vLLM's prefix, not a bare line


def test_strict_refuses_what_specsures_strict_refuses(strict):
    refused, neutral = strict
    assert refused.get("error", "").startswith("PluginRefusal") and "SPECSURE_VLLM_PLUGIN=strict" in refused["error"]
    assert neutral.get("method") == "draft_model", neutral


def test_off_restores_vllms_own_overrides(off):
    by_id = {c[0]: r for c, r in zip(CASES, off)}
    assert by_id["the seed case: mtp on beagle-dsv3"]["method"] == "eagle"
    assert by_id["draft_model in my-eagle-draft"]["method"] == "eagle"
    assert by_id["draft_model with a DeepSeek-V3 draft"]["method"] == "mtp"
    assert by_id["neutral: draft_model"]["method"] == "draft_model"
