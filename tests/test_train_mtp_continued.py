"""specsure train --method mtp --init-from: an MTP head continued, for example for more unrolled steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from specsure import SamplingParams, make_engine
from specsure.cli.main import main
from specsure.config.checkpoint import default_gguf_path
from tiny import build_tiny_llama

PROMPTS = [[5, 6, 7, 8, 9, 10, 5, 6, 7], [40, 41, 3, 50, 40, 41], [77, 12, 19, 80, 0, 75, 18, 36, 70],
           [11, 12, 13, 14, 11, 12], [90, 91, 92, 93, 94, 95, 90, 91], [20, 30, 40, 50, 20, 30, 40]]


@pytest.fixture(autouse=True)
def _sample_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg")))


def test_a_run_continues_an_mtp_head_keeping_its_modules_and_vocabulary(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """On the same data and seed the continued run's "before" is the first run's "after" (at step 0, which
    a longer unroll does not change); the draft vocabulary and module count stay; the head runs exactly;
    conflicting flags and foreign heads are refused with the fix."""
    folder = build_tiny_llama(tmp_path / "t", vocab_size=96, hidden_size=48, num_layers=2)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"category": "code", "prompt_ids": p}) + "\n" for p in PROMPTS))
    common = ["train", "--method", "mtp", "--model", str(folder), "--dtype", "float32", "--prompts", str(prompts),
              "--max-new-tokens", "16", "--no-progress", "--checkpoint-every", "0"]
    first, second = tmp_path / "first", tmp_path / "second"
    assert main([*common, "--out", str(first), "--steps", "6", "--draft-vocab-size", "40"]) == 0
    assert main([*common, "--out", str(second), "--steps", "4", "--unroll", "2", "--init-from", str(first)]) == 0
    assert "per draft step:" in capsys.readouterr().out
    one, two = (json.loads((f / "training.json").read_text()) for f in (first, second))
    assert two["heldout"]["top1_before"] == pytest.approx(one["heldout"]["top1_after"])
    assert two["heldout"]["kl_before"] == pytest.approx(one["heldout"]["kl_after"], rel=1e-5)
    assert len(two["heldout"]["top1_per_module"]) == 2 and len(two["losses"]) == 4
    settings = two["settings"]
    assert settings["init_from"] == str(first) and settings["init"] is None and settings["unroll"] == 2
    assert settings["modules"] == 1 and settings["draft_vocab_size"] == 40
    assert two["continued_from"] == one  # the first run's record travels with the head it became
    assert json.loads((second / "config.json").read_text())["draft_vocab_size"] == 40
    tensors = {f: load_file(str(f / "model.safetensors")) for f in (first, second)}
    assert torch.equal(tensors[first]["d2t"], tensors[second]["d2t"])
    assert not torch.equal(tensors[first]["layers.0.eh_proj.weight"], tensors[second]["layers.0.eh_proj.weight"])
    plain = make_engine(str(folder), None, dtype="float32")
    spec = make_engine(str(folder), {"method": "mtp", "model": str(second), "num_speculative_tokens": 2},
                       dtype="float32")
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    assert [c.token_ids for c in spec.generate(PROMPTS, params)] == [c.token_ids for c in plain.generate(PROMPTS, params)]

    def refused(extra: list[str], message: str, base: list[str] = common) -> None:
        assert main([*base, "--out", str(tmp_path / "x"), "--steps", "1", *extra]) != 0
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err
        assert not (tmp_path / "x").exists()

    refused(["--init-from", str(first), "--modules", "2"],
            "--modules 2: the head --init-from gives has 1 module(s) (num_nextn_predict_layers)")
    refused(["--init-from", str(first), "--draft-vocab-size", "48"],
            "--draft-vocab-size 48: the head --init-from gives drafts among 40 tokens")
    refused(["--init-from", str(first), "--init", "last_layer"],
            "--init last_layer: a continued head starts from the weights --init-from gives")
    refused(["--init-from", "shipped"], "--init-from shipped names the head shipped for the default model")
    if default_gguf_path() is not None:  # the default model named by its path is the default model: a later check
        default = [*common[:4], str(default_gguf_path()), *common[5:]]
        refused(["--init-from", "shipped", "--intermediate-size", "8"], "--intermediate-size 8: only --method eagle3",
                base=default)
    eagle3 = tmp_path / "eagle3"
    assert main([*common[:2], "eagle3", *common[3:], "--out", str(eagle3), "--steps", "1", "--unroll", "1"]) == 0
    capsys.readouterr()
    refused(["--init-from", str(eagle3)], "not an MTP head that specsure train wrote")
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("config.json", "training.json"):
        (broken / name).write_text((first / name).read_text())
    save_file({k: v for k, v in tensors[first].items() if k != "layers.0.eh_proj.weight"},
              str(broken / "model.safetensors"))
    refused(["--init-from", str(broken)], "missing tensors ['eh_proj.weight']")
    (first / "training.json").write_text("{not json")
    refused(["--init-from", str(first)], f"--init-from {str(first)!r}: its training.json cannot be read")
