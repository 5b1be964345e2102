"""Chunked prefill: a prompt prefilled in parts gives every method the output of one pass (float32),
and the running requests decode between the parts of a long prompt."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_batching import METHODS, folders  # noqa: F401 (the fixture, shared)
from test_batching import _engine as batching_engine

from specsure import SamplingParams, make_engine

CHUNK = 7  # odd, so the parts end anywhere in the prompts' repeats


def _engine(name: str, folders: dict[str, Path], chunk: int | None, max_num_seqs: int = 3):
    return batching_engine(name, folders, max_num_seqs, max_num_batched_tokens=chunk)


def _long_prompts(count: int, seed: int = 1) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        base = torch.randint(3, 96, (5 + i,), generator=gen).tolist()
        out.append(base * (4 + i % 3) + torch.randint(3, 96, (3,), generator=gen).tolist() + base[:3])
    return out


@pytest.mark.parametrize("name", list(METHODS))
def test_a_prompt_in_parts_gives_the_output_of_one_pass(name: str, folders: dict[str, Path]) -> None:
    prompts = _long_prompts(4)
    assert all(len(p) > 3 * CHUNK for p in prompts)
    params = [SamplingParams(max_tokens=10 + 3 * i, ignore_eos=True) for i in range(len(prompts))]
    one_pass = _engine("mtp" if name == "mtp" else "plain", folders, None)  # mtp runs on a target of its own
    want = [c.token_ids for c in one_pass.generate(prompts, params)]
    got = _engine(name, folders, CHUNK).generate(prompts, params)
    assert [c.token_ids for c in got] == want


def test_running_requests_decode_between_the_parts_of_a_long_prompt(folders: dict[str, Path]) -> None:
    engine = _engine("ngram", folders, CHUNK)
    short, long = _long_prompts(2)[0][:6], _long_prompts(2)[1]
    scheduler = engine.scheduler
    first = engine.request(short, SamplingParams(max_tokens=40, ignore_eos=True))
    scheduler.add(first)
    scheduler.step()
    second = engine.request(long, SamplingParams(max_tokens=4, ignore_eos=True))
    scheduler.add(second)
    parts = -(-len(long) // CHUNK)
    for step in range(parts):
        updated = [r for r, _ in scheduler.step()]
        assert first in updated  # it decodes at every step
        assert (second in updated) == (step == parts - 1)  # its first token comes with its last part
        assert scheduler.active == 2
    alone = _engine("ngram", folders, None).generate([short, long], [SamplingParams(max_tokens=40, ignore_eos=True),
                                                                     SamplingParams(max_tokens=4, ignore_eos=True)])
    while not scheduler.idle:
        scheduler.step()
    assert [first.completion.token_ids, second.completion.token_ids] == [c.token_ids for c in alone]


def test_prompt_logprobs_score_every_part(folders: dict[str, Path]) -> None:
    prompt = _long_prompts(1)[0]
    params = SamplingParams(max_tokens=2, prompt_logprobs=2)
    one = _engine("plain", folders, None).generate(prompt, params)[0].prompt_logprobs
    parts = _engine("plain", folders, CHUNK).generate(prompt, params)[0].prompt_logprobs
    assert len(parts) == len(one) == len(prompt) and one[0] is None and parts[0] is None
    for a, b in zip(one[1:], parts[1:]):
        assert a.token_id == b.token_id and a.logprob == pytest.approx(b.logprob, abs=1e-5)
        assert [t for t, _ in a.top] == [t for t, _ in b.top]


def test_a_request_aborted_between_its_parts_frees_its_slot(folders: dict[str, Path]) -> None:
    engine = _engine("eagle", folders, CHUNK, max_num_seqs=1)
    scheduler = engine.scheduler
    prompt = _long_prompts(1)[0]
    dropped = engine.request(prompt, SamplingParams(max_tokens=5, ignore_eos=True))
    scheduler.add(dropped)
    assert scheduler.step() == [] and scheduler.prefilling == [dropped]
    scheduler.abort(dropped)
    assert scheduler.idle
    params = SamplingParams(max_tokens=5, ignore_eos=True)
    want = _engine("eagle", folders, None).generate(prompt, params)[0].token_ids
    assert engine.generate(prompt, params)[0].token_ids == want


def _choices(engine, prompt: list[int], params: SamplingParams, n: int) -> list:
    """n choices of one request, as the server makes them: the later ones copy the first's prefill."""
    requests = [engine.request(prompt, params) for _ in range(n)]
    for request in requests[1:]:
        request.prefill_from = requests[0]
    return requests


def _prompt_rows(engine) -> list[int]:
    """Wrap the engine's target so each forward's prompt rows (calls of more than one token) are counted."""
    fed: list[int] = []
    inner = engine.scheduler._lm.forward_batch

    def counting(calls, **kwargs):
        fed.append(sum(len(c.token_ids) for c in calls if c.last_logits is not None))  # a prompt part reads its last row
        return inner(calls, **kwargs)

    engine.scheduler._lm.forward_batch = counting
    return fed


@pytest.mark.parametrize("name", ["plain", "suffix", "eagle"])
def test_choices_of_a_long_prompt_share_one_prefill(name: str, folders: dict[str, Path]) -> None:
    engine = _engine(name, folders, CHUNK, max_num_seqs=4)
    fed = _prompt_rows(engine)
    short, prompt = _long_prompts(2)[0][:5], _long_prompts(2)[1]
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    first = engine.request(short, params)  # takes the first step's budget, so the leader starts a step later
    choices = _choices(engine, prompt, params, 3)
    for request in (first, *choices):
        engine.scheduler.add(request)
    while not engine.scheduler.idle:
        engine.scheduler.step()
    want = _engine(name, folders, None).generate(prompt, params)[0].token_ids
    assert all(c.completion.token_ids == want for c in choices)
    heads = name == "eagle"  # a head observes every part's features: each choice prefills its own
    assert sum(fed) == len(short) + len(prompt) * (3 if heads else 1)


def test_choices_waiting_on_an_aborted_leader_prefill_their_own(folders: dict[str, Path]) -> None:
    engine = _engine("ngram", folders, CHUNK, max_num_seqs=3)
    prompt = _long_prompts(1)[0]
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    leader, follower = _choices(engine, prompt, params, 2)
    engine.scheduler.add(leader)
    engine.scheduler.add(follower)
    engine.scheduler.step()
    assert engine.scheduler.sharing == [follower]
    engine.scheduler.abort(leader)
    while not engine.scheduler.idle:
        engine.scheduler.step()
    assert follower.completion.token_ids == _engine("ngram", folders, None).generate(prompt, params)[0].token_ids


def test_scored_choices_prefill_their_own_and_score_every_row(folders: dict[str, Path]) -> None:
    engine = _engine("plain", folders, CHUNK, max_num_seqs=2)
    prompt = _long_prompts(1)[0]
    params = SamplingParams(max_tokens=2, prompt_logprobs=1)
    choices = _choices(engine, prompt, params, 2)
    for request in choices:
        engine.scheduler.add(request)
    while not engine.scheduler.idle:
        engine.scheduler.step()
    want = _engine("plain", folders, None).generate(prompt, params)[0].prompt_logprobs
    for request in choices:
        got = request.completion.prompt_logprobs
        assert len(got) == len(want) and [e and e.token_id for e in got] == [e and e.token_id for e in want]


@pytest.mark.parametrize("value", [0, -1, 2.5, True])
def test_max_num_batched_tokens_is_checked_before_loading(value: object) -> None:
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        make_engine("/no/such/model", None, max_num_batched_tokens=value)  # type: ignore[arg-type]
