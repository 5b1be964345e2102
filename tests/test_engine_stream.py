"""Engine.generate_stream and TextDeltas: step-by-step output that joins to exactly what generate returns."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest
from words import write_word_tokenizer

from specsure import SamplingParams, make_engine
from specsure.decode.detokenize import TextDeltas
from specsure.decode.engine import Engine
from tiny import build_tiny_llama

PROMPT = "w5 w6 w7 w8 w5 w6 w7 w8 w5"
GREEDY = SamplingParams(max_tokens=40, ignore_eos=True)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = build_tiny_llama(tmp_path_factory.mktemp("stream") / "words", vocab_size=128, hidden_size=48,
                              num_layers=3, seed=0)
    return write_word_tokenizer(folder, 128)


@pytest.fixture(scope="module")
def engine(model: Path) -> Engine:
    # A draft equal to the target is always accepted, so steps commit k + 1 tokens at once.
    return make_engine(str(model), {"method": "draft_model", "model": str(model), "num_speculative_tokens": 3},
                       dtype="float32")


def _without_time(stats: dict) -> dict:
    return {k: v for k, v in stats.items() if k not in ("elapsed_s", "tokens_per_s")}


@pytest.mark.parametrize("params", [GREEDY, SamplingParams(max_tokens=16, stop="w25"),
                                    SamplingParams(max_tokens=30, temperature=0.8, seed=7, ignore_eos=True)],
                         ids=["greedy", "stop", "sampled"])
def test_stream_joins_to_what_generate_returns(engine: Engine, params: SamplingParams) -> None:
    expected = engine.generate(PROMPT, params)[0]
    updates = list(engine.generate_stream(PROMPT, params))
    *steps, last = updates
    assert all(u.finish_reason is None and u.completion is None for u in steps)
    assert last.completion is not None and last.finish_reason == expected.finish_reason
    assert [t for u in updates for t in u.token_ids] == expected.token_ids == last.completion.token_ids
    assert last.completion.text == expected.text
    assert _without_time(last.completion.stats.to_dict()) == _without_time(expected.stats.to_dict())
    assert len(steps[0].token_ids) == 1  # the prompt's forward gives one token


def test_steps_commit_several_tokens(engine: Engine) -> None:
    sizes = [len(u.token_ids) for u in engine.generate_stream(PROMPT, GREEDY)]
    assert max(sizes) == 4 and sum(sizes) == GREEDY.max_tokens


def test_closing_a_stream_stops_the_engine_at_once(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = engine.target.lm.forward
    monkeypatch.setattr(engine.target.lm, "forward", lambda *a, **k: calls.append(1) or real(*a, **k))
    before = engine.stats.generated_tokens
    stream = engine.generate_stream(PROMPT, GREEDY)
    next(stream), next(stream)
    forwards = len(calls)
    stream.close()
    assert len(calls) == forwards and engine.stats.generated_tokens == before
    # The next generation starts from clean caches.
    monkeypatch.undo()
    assert engine.generate(PROMPT, GREEDY)[0].token_ids == [t for u in engine.generate_stream(PROMPT, GREEDY)
                                                           for t in u.token_ids]


def test_a_second_generation_invalidates_an_open_stream(engine: Engine) -> None:
    stream = engine.generate_stream(PROMPT, GREEDY)
    next(stream)
    engine.generate(PROMPT, SamplingParams(max_tokens=3))
    with pytest.raises(RuntimeError, match="one generation at a time"):
        next(stream)


def test_bad_input_is_refused_at_the_call(engine: Engine) -> None:
    with pytest.raises(ValueError, match="empty string"):
        engine.generate_stream("", GREEDY)


class ByteTokenizer:
    """Token i decodes to the bytes ``VOCAB[i]``, UTF-8 with replacement, as byte-level BPE does."""

    def __init__(self, vocab: list[bytes], clean_up: bool = False) -> None:
        self.vocab, self.clean_up_tokenization_spaces = vocab, clean_up

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        text = b"".join(self.vocab[i] for i in ids).decode("utf-8", errors="replace")
        if self.clean_up_tokenization_spaces:
            for old, new in ((" .", "."), (" ,", ","), (" n't", "n't"), (" 's", "'s")):
                text = text.replace(old, new)
        return text


TEXT = "héllo wörld 😀 it isn't so , ok . 🎉 done"


def _run(tokenizer: ByteTokenizer, ids: list[int], stop: tuple[str, ...], sizes: list[int]) -> tuple[list[str], str]:
    """Feed ``ids`` in steps of ``sizes`` as the engine would (stopping at the first stop string)."""
    deltas, stream, done = [], TextDeltas(tokenizer, stop), 0
    for size in itertools.cycle(sizes):
        step, done = ids[done:done + size], min(done + size, len(ids))
        text = tokenizer.decode(ids[:done])
        hits = [text.find(s) for s in stop if s in text]
        if hits or done == len(ids):
            final = text[: min(hits)] if hits else text
            deltas.append(stream.finish(final))
            return deltas, final
        deltas.append(stream.push(step))
    raise AssertionError("unreachable")


@pytest.mark.parametrize("clean_up", [False, True])
def test_text_deltas_never_split_a_character_and_join_to_the_final_text(clean_up: bool) -> None:
    data = TEXT.encode()
    rng = random.Random(0)
    for trial in range(200):
        cuts = sorted(rng.sample(range(1, len(data)), rng.randint(5, 30)))
        vocab = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]
        tokenizer = ByteTokenizer(vocab, clean_up)
        ids = list(range(len(vocab)))
        start = rng.randrange(len(TEXT) - 4)
        stop = (TEXT[start:start + rng.randint(1, 4)],) if trial % 2 else ()
        deltas, final = _run(tokenizer, ids, stop, [rng.randint(1, 4) for _ in range(5)])
        assert "".join(deltas) == final, (vocab, stop)
        assert all("\ufffd" not in d for d in deltas), deltas
        released = ""
        for d in deltas[:-1]:
            released += d
            assert final.startswith(released)  # nothing released is ever taken back


@pytest.mark.parametrize("stop", [None, ["w8 w5"]])
def test_a_streams_text_deltas_join_to_the_completions_text(engine: Engine, stop: list[str] | None) -> None:
    """A stream says the text each step adds, final, as the server streams it: no re-decoding by the caller."""
    updates = list(engine.generate_stream(PROMPT, SamplingParams(max_tokens=40, ignore_eos=True, stop=stop)))
    final = updates[-1].completion
    assert final is not None and all(isinstance(u.text, str) for u in updates)
    assert "".join(u.text for u in updates) == final.text and final.text
    assert sum(bool(u.text) for u in updates) > 1  # handed out as it came, not all at the end
