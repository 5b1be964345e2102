"""The engine loop on tiny random models: lossless greedy, draft = target, rollback, bad input."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from stats import exact_second_token_distribution, tv

from specsure import ConfigError, SamplingParams, make_engine
from specsure.config import resolve
from specsure.decode.engine import Engine
from tiny import build_tiny_llama
from specsure.proposers.draft_model import DraftModelProposer

# A shape whose random weights give varied greedy output (smaller ones repeat one token).
SHAPE = dict(vocab_size=96, hidden_size=48, num_layers=3)
PROMPTS = [[5, 6, 7, 8, 9, 10, 5, 6, 7], [40, 41, 3, 50, 40, 41], [77, 12, 19, 80, 0, 75, 18, 36, 70]]
GREEDY = SamplingParams(max_tokens=80, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("engine")
    return {
        "target": str(build_tiny_llama(root / "target", seed=0, **SHAPE)),
        "draft": str(build_tiny_llama(root / "draft", seed=3, **SHAPE)),
        "other_vocab": str(build_tiny_llama(root / "other", seed=1, vocab_size=64, hidden_size=48, num_layers=2)),
    }


@pytest.fixture(scope="module")
def plain_outputs(models: dict[str, str]) -> list[list[int]]:
    engine = make_engine(models["target"], None, dtype="float32")
    assert engine.speculative_method is None
    return [c.token_ids for c in engine.generate(PROMPTS, GREEDY)]


SPECS = {
    "ngram": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3},
    "draft_model(other)": {"method": "draft_model", "model": "{draft}", "num_speculative_tokens": 3},
    "draft_model(same)": {"method": "draft_model", "model": "{target}", "num_speculative_tokens": 5},
}


def _spec(name: str, models: dict[str, str]) -> dict:
    return json.loads(json.dumps(SPECS[name]).replace("{draft}", models["draft"]).replace("{target}", models["target"]))


@pytest.mark.parametrize("name", list(SPECS))
def test_greedy_output_equals_plain_decoding(name: str, models: dict[str, str], plain_outputs: list[list[int]]) -> None:
    engine = make_engine(models["target"], _spec(name, models), dtype="float32")
    assert engine.speculative_method == SPECS[name]["method"]
    outs = engine.generate(PROMPTS, GREEDY)
    assert [c.token_ids for c in outs] == plain_outputs
    assert all(len(c.token_ids) == GREEDY.max_tokens and c.finish_reason == "length" for c in outs)
    assert engine.stats.drafts > 0


def test_draft_equal_to_target_accepts_nearly_everything(models: dict[str, str]) -> None:
    k = 4
    spec = {"method": "draft_model", "model": models["target"], "num_speculative_tokens": k}
    engine = make_engine(models["target"], spec, dtype="float32")
    out = engine.generate(PROMPTS[0], SamplingParams(max_tokens=200, ignore_eos=True))[0]
    assert out.stats.mean_acceptance_length >= k + 0.9
    assert out.stats.mean_acceptance_length == 1 + out.stats.accepted_tokens / out.stats.drafts


def test_sampled_draft_equal_to_target_accepts_nearly_everything(models: dict[str, str]) -> None:
    k = 4
    spec = {"method": "draft_model", "model": models["target"], "num_speculative_tokens": k}
    engine = make_engine(models["target"], spec, dtype="float32")
    out = engine.generate(PROMPTS[1], SamplingParams(max_tokens=200, temperature=1.0, seed=7, ignore_eos=True))[0]
    assert out.stats.mean_acceptance_length >= k + 0.9


def test_seeded_sampling_is_deterministic(models: dict[str, str]) -> None:
    engine = make_engine(models["target"], _spec("draft_model(other)", models), dtype="float32")
    params = SamplingParams(max_tokens=30, temperature=0.9, top_p=0.95, seed=11, ignore_eos=True)
    first = engine.generate(PROMPTS, params)
    second = engine.generate(PROMPTS, params)
    assert [c.token_ids for c in first] == [c.token_ids for c in second]
    other = engine.generate(PROMPTS, dataclasses.replace(params, seed=12))
    assert [c.token_ids for c in other] != [c.token_ids for c in first]


def test_an_engine_seed_repeats_the_run_and_its_requests_still_differ(models: dict[str, str]) -> None:
    params = SamplingParams(max_tokens=20, temperature=1.0, ignore_eos=True)  # no seed of its own

    def run() -> list[list[int]]:
        engine = make_engine(models["target"], None, dtype="float32", seed=3)
        batch = [c.token_ids for c in engine.generate([PROMPTS[0]] * 3, params)]
        return batch + [engine.generate(PROMPTS[0], params)[0].token_ids]

    first = run()
    assert run() == first  # the same engine seed, the same requests: the same samples
    assert len({tuple(t) for t in first}) == 4  # vLLM's LLM(seed=...): one stream, not one seed per request


def test_each_prompt_may_have_its_own_params(models: dict[str, str]) -> None:
    engine = make_engine(models["target"], None, dtype="float32")
    params = [SamplingParams(max_tokens=20, temperature=1.0, seed=s, ignore_eos=True) for s in (1, 2, 1)]
    same = [PROMPTS[0]] * 3
    out = [c.token_ids for c in engine.generate(same, params)]
    # A shared seed on equal prompts samples alike; its own seed samples its own tokens.
    assert out[0] == out[2] != out[1]
    assert out[1] == engine.generate(PROMPTS[0], params[1])[0].token_ids
    mixed = engine.generate(PROMPTS[:2], [GREEDY, dataclasses.replace(GREEDY, max_tokens=5)])
    assert [len(c.token_ids) for c in mixed] == [80, 5]
    with pytest.raises(ValueError, match="2 SamplingParams for 3 prompts"):
        engine.generate(PROMPTS, params[:2])


def _histogram(engine: Engine, prompt: list[int], runs: int, temperature: float) -> torch.Tensor:
    counts = torch.zeros(engine.target.lm.vocab_size)
    for seed in range(runs):
        out = engine.generate(prompt, SamplingParams(max_tokens=2, temperature=temperature, seed=seed,
                                                     ignore_eos=True))[0]
        counts[out.token_ids[1]] += 1
    return counts / runs


def test_sampling_keeps_the_target_distribution(tmp_path: Path) -> None:
    # A small vocabulary keeps the exact enumeration cheap; the draft differs from the target,
    # so rejections and recovered tokens happen often.
    target = str(build_tiny_llama(tmp_path / "t", vocab_size=24, hidden_size=32, num_layers=2, seed=5))
    draft = str(build_tiny_llama(tmp_path / "d", vocab_size=24, hidden_size=32, num_layers=2, seed=6))
    prompt, temperature, runs = [3, 9, 4], 1.5, 1500
    exact = exact_second_token_distribution(target, prompt, temperature)
    spec = make_engine(target, {"method": "draft_model", "model": draft, "num_speculative_tokens": 1}, dtype="float32")
    plain = make_engine(target, None, dtype="float32")
    tv_spec = tv(_histogram(spec, prompt, runs, temperature), exact)
    tv_plain = tv(_histogram(plain, prompt, runs, temperature), exact)
    assert spec.stats.drafts == runs and spec.stats.accepted_tokens < runs  # rejections did happen
    reference = torch.softmax(torch.randn(24, generator=torch.Generator().manual_seed(0)) * 2, -1)
    tv_reference = tv(reference, exact)
    # As close to the target as plain sampling with the same number of draws, and far from a stranger.
    assert tv_spec < max(1.5 * tv_plain, 0.06)
    assert tv_reference > 3 * tv_spec


def test_rollback_leaves_no_trace(models: dict[str, str]) -> None:
    engine = make_engine(models["target"], _spec("draft_model(other)", models), dtype="float32")
    out = engine.generate(PROMPTS[2], SamplingParams(max_tokens=40, ignore_eos=True))[0]
    assert out.stats.draft_tokens > out.stats.accepted_tokens  # some drafts were rejected
    committed = PROMPTS[2] + out.token_ids
    lm = engine.target.lm
    assert lm.cache_len == len(committed) - 1  # the last output token is pending
    next_logits = lm.forward([committed[-1]]).logits[-1]
    fresh = make_engine(models["target"], None, dtype="float32").target.lm
    fresh.reset()
    assert torch.allclose(next_logits, fresh.forward(committed).logits[-1], atol=1e-4)
    draft_lm = engine.proposer.draft
    draft_fresh = make_engine(models["draft"], None, dtype="float32").target.lm
    kept = draft_lm.cache_len
    assert engine.proposer._fed[:kept] == committed[:kept]
    draft_lm.crop(min(kept, len(committed) - 1))
    resumed = draft_lm.forward(committed[draft_lm.cache_len:]).logits[-1]
    draft_fresh.reset()
    assert torch.allclose(resumed, draft_fresh.forward(committed).logits[-1], atol=1e-4)


def test_eos_stops_every_method_at_the_same_token(models: dict[str, str], plain_outputs: list[list[int]]) -> None:
    eos = plain_outputs[0][10]
    expected = plain_outputs[0][: plain_outputs[0].index(eos) + 1]
    for spec in (None, _spec("ngram", models), _spec("draft_model(other)", models)):
        engine = make_engine(models["target"], spec, dtype="float32")
        engine.target = dataclasses.replace(engine.target, eos_token_ids=(eos,))
        out = engine.generate(PROMPTS[0], SamplingParams(max_tokens=80))[0]
        assert out.token_ids == expected and out.finish_reason == "stop"


def test_engine_refuses_a_proposer_other_than_the_resolved_method(models: dict[str, str]) -> None:
    engine = make_engine(models["target"], None, dtype="float32")
    res = resolve({"method": "ngram"}, model=models["target"])
    with pytest.raises(RuntimeError, match="resolution names method 'ngram' but the proposer is 'draft_model'"):
        Engine(res, engine.target, DraftModelProposer(engine.target.lm))
    with pytest.raises(RuntimeError, match="resolution names method None but the proposer is 'draft_model'"):
        engine.proposer = DraftModelProposer(engine.target.lm)  # a swap keeps the promise too
    assert engine.proposer is None and engine.speculative_method is None


@pytest.mark.parametrize("prompt, message", [
    ([], "is empty"),
    ("", "empty string"),
    ("some text", "has no tokenizer"),
    ([5, 999], "outside the vocabulary"),
    ([5] * 600, "context is 512 tokens"),
    ({"input_ids": [5, 6], "attention_mask": [1, 1]}, r'apply_chat_template returns: pass its \["input_ids"\]'),
])
def test_bad_prompts_are_clear_errors(models: dict[str, str], prompt, message: str) -> None:
    engine = make_engine(models["target"], None, dtype="float32")
    with pytest.raises(ValueError, match=message):
        engine.generate(prompt, GREEDY)


def test_stop_strings_without_a_tokenizer_are_refused_not_ignored(models: dict[str, str]) -> None:
    engine = make_engine(models["target"], None, dtype="float32")
    with pytest.raises(ValueError, match="stop = \\['x'\\] needs a tokenizer"):
        engine.generate(PROMPTS[0], SamplingParams(max_tokens=4, stop="x"))


def test_draft_with_another_vocabulary_is_refused(models: dict[str, str]) -> None:
    spec = {"method": "draft_model", "model": models["other_vocab"]}
    with pytest.raises(ConfigError, match="vocab_size=64.*vocab_size=96"):
        make_engine(models["target"], spec, dtype="float32")


def test_pickle_only_checkpoint_is_refused(tmp_path: Path, models: dict[str, str]) -> None:
    folder = tmp_path / "pickled"
    folder.mkdir()
    (folder / "config.json").write_text(Path(models["target"], "config.json").read_text())
    (folder / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(ConfigError, match="pytorch_model.bin.*safetensors"):
        make_engine(str(folder), None, dtype="float32")
    with pytest.raises(ConfigError, match="pytorch_model.bin"):
        make_engine(models["target"], {"method": "draft_model", "model": str(folder)}, dtype="float32")


def test_draft_with_a_shorter_context_stops_drafting_instead_of_failing(tmp_path: Path) -> None:
    target = str(build_tiny_llama(tmp_path / "t", **SHAPE, extra_config={"max_position_embeddings": 64}))
    draft = str(build_tiny_llama(tmp_path / "d", seed=3, **SHAPE, extra_config={"max_position_embeddings": 32}))
    params = SamplingParams(max_tokens=100, ignore_eos=True)
    plain = make_engine(target, None, dtype="float32").generate(PROMPTS[0], params)[0]
    spec = {"method": "draft_model", "model": draft, "num_speculative_tokens": 4}
    out = make_engine(target, spec, dtype="float32").generate(PROMPTS[0], params)[0]
    assert out.token_ids == plain.token_ids and out.finish_reason == plain.finish_reason == "length"
    assert len(PROMPTS[0]) + len(out.token_ids) == 64  # ran to the target's context, past the draft's
    assert out.stats.drafts > 0


def test_one_engine_from_two_threads_gives_each_its_own_output(models: dict[str, str]) -> None:
    """Threads take turns on the engine: stepping its one scheduler at once mixed their requests, and a
    thread could be handed the other's completion."""
    import threading

    engine = make_engine(models["target"], {"method": "ngram", "num_speculative_tokens": 3}, dtype="float32")
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    prompts = [[5, 6, 7, 5, 6], [9, 8, 7, 9, 8]]
    expected = {tuple(p): engine.generate(p, params)[0].token_ids for p in prompts}
    assert len({tuple(v) for v in expected.values()}) == 2
    wrong: list[object] = []

    ended = []

    def loop(prompt: list[int]) -> None:
        for i in range(6):
            try:
                if i % 2:  # a stream yields the engine between its steps: a generation meanwhile ends it
                    *_, last = engine.generate_stream(prompt, params)
                    got = last.completion.token_ids
                else:  # calls wait for each other
                    got = engine.generate(prompt, params)[0].token_ids
            except RuntimeError as exc:
                if i % 2 == 0 or "another generation started" not in str(exc):
                    wrong.append(exc)
                ended.append(exc)
                continue
            except Exception as exc:  # noqa: BLE001 - any other failure in a thread is the finding
                wrong.append(exc)
                continue
            if got != expected[tuple(prompt)]:
                wrong.append((prompt, got))  # never another request's output, never a mix

    threads = [threading.Thread(target=loop, args=(p,)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not wrong, wrong  # streams ended by the other thread's calls are in `ended`, said as such


def test_a_stream_left_open_blocks_no_other_thread(models: dict[str, str]) -> None:
    """A stream holds the engine only while it steps: one left open, or resumed from another thread,
    never leaves another thread's call waiting."""
    import threading

    engine = make_engine(models["target"], None, dtype="float32")
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    expected = engine.generate([5, 6, 7], params)[0].token_ids
    stream = engine.generate_stream([9, 8, 7], params)
    next(stream)  # opened, then left
    got: list[list[int]] = []
    other = threading.Thread(target=lambda: got.append(engine.generate([5, 6, 7], params)[0].token_ids))
    other.start()
    other.join(timeout=60)
    assert got == [expected]
    with pytest.raises(RuntimeError, match="another generation started"):
        next(stream)
