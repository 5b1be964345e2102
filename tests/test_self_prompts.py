"""--corpus self: user requests the target writes from its chat template, cached, and trained on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specsure.models.loading import load_model
from specsure.train import self_prompts
from specsure.train.corpus import CorpusError, corpus_prompts, sources_of
from specsure.train.self_prompts import cached_prompts, sample_prompts, user_turn_prefix
from tiny import build_tiny_llama
from words import write_word_tokenizer

VOCAB = 96
TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'user' %}w3 {% else %}w4 {% endif %}{{ m['content'] }} w2 "
            "{% endfor %}{% if add_generation_prompt %}w4 {% endif %}")
"""w3 opens a user's turn, w4 the assistant's, w2 (an EOS id) ends either."""


@pytest.fixture(autouse=True)
def _sample_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg")))


@pytest.fixture(scope="module")
def chat_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny chat model: a word tokenizer with a chat template, and a dozen end-of-turn ids, so its
    sampled turns end within a few words."""
    folder = build_tiny_llama(tmp_path_factory.mktemp("self") / "t", vocab_size=VOCAB, hidden_size=48, num_layers=6,
                              extra_config={"eos_token_id": list(range(2, 14))})
    write_word_tokenizer(folder, VOCAB)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_the_prefix_is_the_template_up_to_the_users_text(chat_target: Path) -> None:
    assert user_turn_prefix(load_model(str(chat_target), dtype="float32")) == [3]


def test_written_prompts_are_finished_distinct_and_the_same_for_a_seed(chat_target: Path) -> None:
    target = load_model(str(chat_target), dtype="float32")
    first = sample_prompts(target, 12, seed=0, batch_size=8)
    assert 6 <= len(first) <= 12, first  # a dozen EOS ids in 96: most turns end within the length limit
    assert len({" ".join(t.split()) for t in first}) == len(first)
    assert all(len(t.split()) >= self_prompts.MIN_WORDS for t in first)
    assert all(w.startswith("w") and int(w[1:]) not in range(2, 14) for t in first for w in t.split())
    assert sample_prompts(target, 12, seed=0, batch_size=8) == first
    assert sample_prompts(target, 12, seed=1, batch_size=8) != first


def test_written_prompts_are_read_back_from_the_cache(chat_target: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    target = load_model(str(chat_target), dtype="float32")
    made = cached_prompts(target, 8, seed=3, folder=tmp_path, batch_size=8)
    assert len(list(tmp_path.glob("self-prompts-*.json"))) == 1

    def refuse(*args: object, **kwargs: object) -> list[str]:
        raise AssertionError("sampled again although the cache holds these prompts")

    monkeypatch.setattr(self_prompts, "sample_prompts", refuse)
    assert cached_prompts(target, 8, seed=3, folder=tmp_path, batch_size=8) == made
    with pytest.raises(AssertionError, match="sampled again"):
        cached_prompts(target, 8, seed=4, folder=tmp_path, batch_size=8)


def test_a_target_without_a_chat_template_is_refused_with_the_fix(tmp_path: Path) -> None:
    folder = build_tiny_llama(tmp_path / "plain", vocab_size=VOCAB, hidden_size=48, num_layers=2)
    write_word_tokenizer(folder, VOCAB)
    with pytest.raises(CorpusError, match=r"no chat template.*leave 'self' out of --corpus"):
        user_turn_prefix(load_model(str(folder), dtype="float32"))


def test_self_holds_places_in_the_mix_recorded_as_the_targets_own_text() -> None:
    mixed = corpus_prompts(("self", "chat"), limit=6)
    assert [p.package for p in mixed] == ["self", "chat"] * 3
    assert all(p.text == "" for p in mixed if p.package == "self")
    recorded = {s["source"]: s for s in sources_of(mixed)}
    mine = next(s for name, s in recorded.items() if "wrote itself" in name)
    assert mine["prompts"] == 3 and "target's own text" in mine["licence"] and "version" not in mine


def test_train_cli_trains_on_the_targets_own_prompts_and_tasks_on_their_answers(
        chat_target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from specsure import SamplingParams, make_engine
    from specsure.cli.main import main

    out = tmp_path / "head"
    rc = main(["train", "--method", "eagle3", "--model", str(chat_target), "--dtype", "float32", "--out", str(out),
               "--corpus", "self", "--corpus-prompts", "8", "--max-new-tokens", "12", "--steps", "4",
               "--unroll", "2", "--draft-vocab-size", "48", "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    data = json.loads((out / "training.json").read_text())["data"]
    written = next(s for s in data["sources"] if "wrote itself" in s["source"])
    assert 4 <= written["prompts"] <= 8
    # Every written prompt is answered, and tasks are built on the answers that have text.
    assert data["prompts"] >= written["prompts"]
    prompts = [[3, 20, 21, 22, 2, 4], [3, 30, 31, 2, 4]]
    spec = make_engine(str(chat_target), {"method": "eagle3", "model": str(out), "num_speculative_tokens": 2},
                       dtype="float32")
    plain = make_engine(str(chat_target), None, dtype="float32")
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    assert [c.token_ids for c in spec.generate(prompts, params)] == \
        [c.token_ids for c in plain.generate(prompts, params)]
