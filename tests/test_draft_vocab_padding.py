"""draft_model with a draft whose embedding is padded to another size than the target's, as the
Qwen2.5 family's is (one tokenizer; 151,936 rows in 0.5B, 152,064 in 7B): it drafts exactly, and a
draft whose tokenizer differs is still refused, before anything loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from specsure import SamplingParams, make_engine
from specsure.config.errors import ConfigError
from specsure.config.resolution import resolve
from tiny import build_tiny_llama
from words import write_word_tokenizer

WORDS = 100
"""The shared tokenizer's size: every id below it is a word; the rows above are padding."""
GREEDY = SamplingParams(max_tokens=24, ignore_eos=True)


def _model(folder: Path, rows: int, seed: int, words: int = WORDS) -> str:
    build_tiny_llama(folder, vocab_size=rows, num_layers=2, seed=seed)
    write_word_tokenizer(folder, words)
    return str(folder)


def _padded_copy(target: str, folder: Path, rows: int) -> str:
    """The target's own weights with its (tied) embedding cut or padded to ``rows``: its drafts are
    the target's tokens wherever the target would not choose a row the copy lacks."""
    _model(folder, rows, seed=0)
    tensors = load_file(str(Path(target) / "model.safetensors"))
    embed = tensors["model.embed_tokens.weight"]
    grown = torch.cat([embed, torch.full((max(0, rows - len(embed)), embed.shape[1]), -0.5)])
    tensors["model.embed_tokens.weight"] = grown[:rows].contiguous()
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return str(folder)


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _model(tmp_path_factory.mktemp("target"), 128, seed=0)


@pytest.mark.parametrize("rows", [112, 144])
def test_a_draft_padded_to_another_size_drafts_exactly(target: str, tmp_path: Path, rows: int) -> None:
    draft = _padded_copy(target, tmp_path / "draft", rows)
    spec = make_engine(target, {"method": "draft_model", "model": draft, "num_speculative_tokens": 3}, dtype="float32")
    plain = make_engine(target, None, dtype="float32")
    # The second prompt holds id 120, a padding row of the target that a 112-row draft cannot embed:
    # that request goes on without drafts, as plain decoding.
    prompts = [[5, 17, 33, 2, 41], [9, 120, 7]]
    got = spec.generate(prompts, GREEDY)
    assert [c.token_ids for c in got] == [c.token_ids for c in plain.generate(prompts, GREEDY)]
    assert spec.stats.accepted_tokens > 0
    sampled = spec.generate([[5, 17, 33]], SamplingParams(max_tokens=16, temperature=0.8, top_k=50, seed=3))
    assert len(sampled[0].token_ids) == 16 and all(t < 128 for t in sampled[0].token_ids)


def test_a_draft_with_another_tokenizer_is_refused_naming_the_first_difference(target: str, tmp_path: Path) -> None:
    draft = _model(tmp_path / "draft", 112, seed=1)
    vocab = json.loads((Path(draft) / "tokenizer.json").read_text())
    vocab["model"]["vocab"]["w7"], vocab["model"]["vocab"]["w8"] = 8, 7
    (Path(draft) / "tokenizer.json").write_text(json.dumps(vocab))
    with pytest.raises(ConfigError, match=r"vocab_size=112 .* vocab_size=128\. The sizes may differ by embedding "
                                          r"padding when both share one tokenizer, but their tokenizer\.json files "
                                          r"differ \(token 'w7': id 7 in the target's, id 8 in the draft's\)"):
        resolve({"method": "draft_model", "model": draft}, target).check_runnable()
    (Path(draft) / "tokenizer.json").unlink()
    with pytest.raises(ConfigError, match=r"but the draft has no tokenizer\.json to compare"):
        resolve({"method": "draft_model", "model": draft}, target).check_runnable()


def test_a_tokenizer_with_ids_beyond_the_smaller_embedding_is_refused(target: str, tmp_path: Path) -> None:
    draft = _model(tmp_path / "draft", 96, seed=0, words=WORDS)  # 100 words, 96 rows
    target_96 = _model(tmp_path / "target", 128, seed=0, words=WORDS)
    with pytest.raises(ConfigError, match=r"are the same \(100 tokens, ids below 100\), more than the smaller "
                                          r"embedding holds"):
        resolve({"method": "draft_model", "model": draft}, target_96).check_runnable()
