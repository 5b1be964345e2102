"""Continuous batching: every method, run batched, gives each prompt its batch-1 output (float32)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from heads import build_mtp_target, write_eagle3_head, write_eagle_head
from serving import NGRAM
from stats import exact_second_token_distribution, tv

from specsure import SamplingParams, make_engine
from specsure.decode.scheduler import Scheduler
from tiny import build_tiny_llama

SHAPE = dict(vocab_size=96, hidden_size=48, num_layers=3)


def _prompts(count: int, seed: int = 0) -> list[list[int]]:
    """Prompts of different lengths with repeats in them, so lookup methods find matches."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        base = torch.randint(3, 96, (3 + i % 4,), generator=gen).tolist()
        out.append(base * 3 + torch.randint(3, 96, (i % 5,), generator=gen).tolist() + base[:2])
    return out


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("batching")
    target = build_tiny_llama(root / "target", seed=0, **SHAPE)
    return {
        "target": target,
        "draft": build_tiny_llama(root / "draft", seed=3, **SHAPE),
        "eagle": write_eagle_head(root / "eagle", target),
        "eagle3": write_eagle3_head(root / "eagle3", target, draft_vocab=64),
        "mtp_target": build_mtp_target(root / "mtp", modules=2, num_layers=3, vocab_size=96, hidden_size=48),
    }


METHODS = {
    "plain": None,
    "ngram": NGRAM,
    "ngram-tree": {**NGRAM, "prompt_lookup_branches": 3},
    "suffix": {"method": "suffix", "num_speculative_tokens": 6},
    "draft_model": {"method": "draft_model", "model": "draft", "num_speculative_tokens": 3},
    "eagle": {"method": "eagle", "model": "eagle", "num_speculative_tokens": 3},
    "eagle3": {"method": "eagle3", "model": "eagle3", "num_speculative_tokens": 3},
    "eagle3-tree": {"method": "eagle3", "model": "eagle3", "speculative_token_tree": "[(0,), (1,), (0, 0), (1, 0)]"},
    "mtp": {"method": "mtp", "num_speculative_tokens": 3},
}


def _engine(name: str, folders: dict[str, Path], max_num_seqs: int, **engine_args: object):
    spec = METHODS[name]
    if spec is not None and "model" in spec:
        spec = {**spec, "model": str(folders[spec["model"]])}
    target = folders["mtp_target"] if name == "mtp" else folders["target"]
    return make_engine(str(target), spec, dtype="float32", max_num_seqs=max_num_seqs, **engine_args)


@pytest.mark.parametrize("name", list(METHODS))
def test_batched_greedy_equals_batch_one(name: str, folders: dict[str, Path]) -> None:
    prompts = _prompts(7)
    # Different lengths, so requests leave at different steps and waiting ones join mid-run.
    params = [SamplingParams(max_tokens=12 + 5 * (i % 3), ignore_eos=True) for i in range(len(prompts))]
    alone = _engine(name, folders, max_num_seqs=1)
    want = [alone.generate(p, sp)[0].token_ids for p, sp in zip(prompts, params)]
    batched = _engine(name, folders, max_num_seqs=4)
    scheduler = batched.scheduler
    requests = [batched.request(p, sp) for p, sp in zip(prompts, params)]
    for request in requests:
        scheduler.add(request)
    widths = []
    while not scheduler.idle:
        widths.append(len(scheduler.running) + min(len(scheduler.waiting), 4 - len(scheduler.running)))
        scheduler.step()
    assert [r.completion.token_ids for r in requests] == want
    assert max(widths) == 4 and len(set(widths)) > 1  # four ran together, and the batch changed size
    if name != "plain":
        assert sum(r.stats.drafts for r in requests) > 0


@pytest.mark.parametrize("name", [n for n in METHODS if n != "plain"])
def test_a_batch_at_disable_by_batch_size_drafts_nothing_and_loses_nothing(name: str, folders: dict[str, Path]) -> None:
    prompts = _prompts(7, seed=2)
    params = [SamplingParams(max_tokens=12 + 5 * (i % 3), ignore_eos=True) for i in range(len(prompts))]
    want = [_engine("plain", folders, max_num_seqs=1).generate(p, sp)[0].token_ids for p, sp in zip(prompts, params)]
    spec = METHODS[name]
    folder = folders["mtp_target"] if name == "mtp" else folders["target"]
    spec = {**spec, "disable_by_batch_size": 3}
    if "model" in spec:
        spec["model"] = str(folders[spec["model"]])
    engine = make_engine(str(folder), spec, dtype="float32", max_num_seqs=4)
    # The sequences drafted alone and in pairs (as the batch drains), never in a batch of 3 or 4.
    requests = [engine.request(p, sp) for p, sp in zip(prompts, params)]
    for request in requests:
        engine.scheduler.add(request)
    while not engine.scheduler.idle:
        before = sum(r.stats.drafts for r in requests)
        width = len(engine.scheduler.running) + min(len(engine.scheduler.waiting), 4 - len(engine.scheduler.running))
        engine.scheduler.step()
        if width >= 3:
            assert sum(r.stats.drafts for r in requests) == before
    assert [r.completion.token_ids for r in requests] == want
    assert engine.scheduler.undrafted_steps > 0 and sum(r.stats.drafts for r in requests) > 0


def test_generate_on_a_list_runs_it_batched(folders: dict[str, Path]) -> None:
    engine = _engine("ngram", folders, max_num_seqs=8)
    prompts = _prompts(5, seed=1)
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    calls = []
    step = Scheduler.step

    def counting(self: Scheduler):
        calls.append(len(self.running) + len(self.waiting))
        return step(self)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Scheduler, "step", counting)
        batched = engine.generate(prompts, params)
    serial = [engine.generate(p, params)[0] for p in prompts]
    assert [c.token_ids for c in batched] == [c.token_ids for c in serial]
    assert calls[0] == 5 and len(calls) <= 21  # all five in every step, not five runs of 20 steps each


def test_an_aborted_request_frees_its_slot_for_the_next(folders: dict[str, Path]) -> None:
    engine = _engine("ngram", folders, max_num_seqs=2)
    scheduler = engine.scheduler
    long = [engine.request(p, SamplingParams(max_tokens=200, ignore_eos=True)) for p in _prompts(2)]
    late = engine.request(_prompts(3, seed=2)[2], SamplingParams(max_tokens=8, ignore_eos=True))
    for request in [*long, late]:
        scheduler.add(request)
    scheduler.step()
    assert late in scheduler.waiting
    scheduler.abort(long[0])
    scheduler.step()  # the freed slot takes the waiting request at the next step
    assert late in scheduler.running and long[0] not in scheduler.running
    while late.completion is None:
        scheduler.step()
    assert late.completion.token_ids == engine.generate(late.prompt, late.params)[0].token_ids


def test_batched_sampling_keeps_the_target_distribution(tmp_path: Path) -> None:
    # Many copies of one prompt sampled in one batch: the second token (after a verification with
    # rejections) must follow the target's distribution, computed by enumeration.
    target = str(build_tiny_llama(tmp_path / "t", vocab_size=24, hidden_size=32, num_layers=2, seed=5))
    draft = str(build_tiny_llama(tmp_path / "d", vocab_size=24, hidden_size=32, num_layers=2, seed=6))
    prompt, temperature, runs = [3, 9, 4], 1.5, 1200
    exact = exact_second_token_distribution(target, prompt, temperature)
    spec = make_engine(target, {"method": "draft_model", "model": draft, "num_speculative_tokens": 1},
                       dtype="float32", max_num_seqs=16)
    requests = [spec.request(prompt, SamplingParams(max_tokens=2, temperature=temperature, ignore_eos=True, seed=i))
                for i in range(runs)]
    for request in requests:
        spec.scheduler.add(request)
    while not spec.scheduler.idle:
        for request, update in spec.scheduler.step():
            if update.completion is not None:
                spec.finished(request)
    counts = torch.zeros(24)
    for request in requests:
        counts[request.completion.token_ids[1]] += 1
    assert spec.stats.drafts == runs and spec.stats.accepted_tokens < runs  # rejections did happen
    stranger = torch.softmax(torch.randn(24, generator=torch.Generator().manual_seed(0)) * 2, -1)
    # Sampling noise for 1200 draws over 24 tokens is about 0.05 in total variation.
    assert tv(counts / runs, exact) < 0.07
    assert tv(stranger, exact) > 3 * tv(counts / runs, exact)


@pytest.mark.parametrize("name", ["ngram", "eagle3", "mtp"])
def test_choices_of_one_prompt_share_its_prefill(name: str, folders: dict[str, Path]) -> None:
    engine = _engine(name, folders, max_num_seqs=4)
    prompt = _prompts(1, seed=4)[0]
    params = SamplingParams(max_tokens=15, ignore_eos=True)
    want = engine.generate(prompt, params)[0].token_ids
    fed: list[list[int]] = []
    real = engine.target.lm.forward_batch

    def counting(calls, **kwargs):  # noqa: ANN001, ANN202
        fed.append([len(c.token_ids) for c in calls])
        return real(calls, **kwargs)

    leader = engine.request(prompt, params)
    choices = [leader] + [engine.request(prompt, params) for _ in range(2)]
    for choice in choices[1:]:
        choice.prefill_from = leader
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(engine.target.lm, "forward_batch", counting)
        for choice in choices:
            engine.scheduler.add(choice)
        while not engine.scheduler.idle:
            engine.scheduler.step()
    assert fed[0] == [len(prompt)]  # one prefill for the three choices
    assert [c.completion.token_ids for c in choices] == [want] * 3


def test_draft_model_drafts_every_sequence_in_one_draft_forward(folders: dict[str, Path]) -> None:
    from specsure.models.causal_lm import CausalLM

    engine = _engine("draft_model", folders, max_num_seqs=4)
    draft_hf = engine.proposer.draft.hf
    widths: list[int] = []
    real = CausalLM.forward_batch

    def counting(self, calls, **kwargs):  # noqa: ANN001, ANN202
        if self.hf is draft_hf:
            widths.append(len(calls))
        return real(self, calls, **kwargs)

    prompts = _prompts(3, seed=5)
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(CausalLM, "forward_batch", counting)
        batched = engine.generate(prompts, params)
    assert max(widths) == 3  # the three sequences' draft steps ran as one draft forward
    assert [c.token_ids for c in batched] == [engine.generate(p, params)[0].token_ids for p in prompts]


def test_undrafted_steps_teach_the_lookup_methods_what_drafting_steps_do(folders: dict[str, Path]) -> None:
    # suffix: a request that never drafted still leaves its whole output to later requests.
    params = [SamplingParams(max_tokens=10, ignore_eos=True), SamplingParams(max_tokens=30, ignore_eos=True)]
    prompts = [[5, 6, 7, 8, 9] * 3, [10, 11, 12, 13] * 3]
    for limit in (None, 2):
        spec = {"method": "suffix", "num_speculative_tokens": 6, **({"disable_by_batch_size": limit} if limit else {})}
        engine = make_engine(str(folders["target"]), spec, dtype="float32", max_num_seqs=4)
        requests = [engine.request(p, sp) for p, sp in zip(prompts, params)]
        for request in requests:
            engine.scheduler.add(request)
        while not engine.scheduler.idle:
            engine.scheduler.step()
        proposer = engine.scheduler.slots.proposer(0)
        kept = sorted(proposer.global_tree.sequence(i) for i in proposer.cached_requests)
        # Each output, but perhaps its last token, which no forward fed (as without the key).
        for sequence, request in zip(kept, sorted(requests, key=lambda r: r.completion.token_ids)):
            out = request.completion.token_ids
            assert len(sequence) >= len(out) - 1 and out[:len(sequence)] == sequence, limit
    # ngram: the draft length follows what the drafts earned, not the tokens undrafted steps added.
    engine = _engine("ngram", folders, max_num_seqs=1)
    proposer = engine.scheduler.slots.proposer(0)
    context = _prompts(1, seed=4)[0]
    draft = proposer.propose(context, 4, SamplingParams(), None).token_ids
    assert draft
    proposer.observe([context[-1]], len(context) - 1, None)  # the draft's step: nothing accepted
    more = [7, 8, 9, 10]
    for i, token in enumerate(more):  # undrafted steps commit one token each
        proposer.observe([token], len(context) + i, None)
    proposer.propose([*context, *more, 11], 4, SamplingParams(), None)
    assert proposer._length == 3  # shrank by one, as after any rejected draft (not grown, as if all were taken)
