"""Logprobs come from the target's own distribution at each committed position, whatever drafted the token."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from serving import NGRAM
from specsure import SamplingParams, make_engine
from tiny import build_tiny_llama

SPECS = {
    "plain": None,
    "ngram": NGRAM,
    "ngram-tree": {**NGRAM, "prompt_lookup_branches": 3},
    "suffix": {"method": "suffix", "num_speculative_tokens": 5},
}
PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6], [40, 41, 3, 50, 40, 41, 3, 50, 40]]


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("logprobs") / "t", vocab_size=96, hidden_size=48, num_layers=3)


@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("temperature", [0.0, 0.1])
def test_logprobs_are_the_targets_at_each_position(target: Path, name: str, temperature: float) -> None:
    engine = make_engine(str(target), SPECS[name], dtype="float32", max_num_seqs=2)
    params = SamplingParams(max_tokens=30, ignore_eos=True, logprobs=3, temperature=temperature, seed=1)
    reference = make_engine(str(target), None, dtype="float32").target.lm
    for out in engine.generate(PROMPTS, params):
        assert out.logprobs is not None and [e.token_id for e in out.logprobs] == out.token_ids
        # One forward over prompt + output gives the target's distribution at every output position.
        reference.reset()
        ids = out.prompt_token_ids + out.token_ids
        logits = reference.forward(ids[:-1]).logits[len(out.prompt_token_ids) - 1:]  # [len(output), vocab]
        want = torch.log_softmax(logits, -1)
        got = torch.tensor([e.logprob for e in out.logprobs])
        torch.testing.assert_close(got, want.gather(-1, torch.tensor(out.token_ids)[:, None])[:, 0],
                                   atol=1e-4, rtol=1e-4)
        for entry, row in zip(out.logprobs, want):
            values, index = row.topk(3)
            assert [t for t, _ in entry.top] == index.tolist()
            torch.testing.assert_close(torch.tensor([v for _, v in entry.top]), values, atol=1e-4, rtol=1e-4)
    if name != "plain":
        assert engine.stats.accepted_tokens > 0  # drafted tokens were among those checked


def test_logprobs_follow_trimming_and_are_off_by_default(target: Path) -> None:
    engine = make_engine(str(target), SPECS["ngram"], dtype="float32")
    out = engine.generate(PROMPTS[0], SamplingParams(max_tokens=7, ignore_eos=True, logprobs=0))[0]
    assert len(out.token_ids) == 7 and len(out.logprobs) == 7 and all(e.top == () for e in out.logprobs)
    updates = list(engine.generate_stream(PROMPTS[0], SamplingParams(max_tokens=7, ignore_eos=True, logprobs=0)))
    assert [e for u in updates for e in u.logprobs] == out.logprobs
    assert engine.generate(PROMPTS[0], SamplingParams(max_tokens=3))[0].logprobs is None
    for bad in (-1, 21, 2.0, True):
        with pytest.raises(ValueError, match="logprobs"):
            SamplingParams(logprobs=bad)


@pytest.mark.parametrize("name", ["plain", "ngram"])
def test_on_the_float32_kernel_batched_logprobs_are_batch_one_logprobs_bit_for_bit(target: Path, name: str) -> None:
    """Every float32 forward runs in C, row by row, so a request's logprobs do not depend on a 96-token
    prompt prefilled in the same steps (past 64 rows, which torch's products computed until 2026-12-07)."""
    from specsure.models import float_kernel

    if float_kernel.load()[0] is None:  # torch's products: equal to float32 rounding only (test above)
        return
    params = SamplingParams(max_tokens=30, ignore_eos=True, logprobs=3)
    prompts = [PROMPTS[0] * 8, PROMPTS[1]]
    batched = make_engine(str(target), SPECS[name], dtype="float32", max_num_seqs=2).generate(prompts, params)
    alone = make_engine(str(target), SPECS[name], dtype="float32")
    for out in batched:
        one = alone.generate([out.prompt_token_ids], params)[0]
        assert out.token_ids == one.token_ids and out.logprobs == one.logprobs
