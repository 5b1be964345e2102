"""A request that fails while its step is verified fails alone: the step's other requests go on."""

from __future__ import annotations

from pathlib import Path

import pytest

from specsure import SamplingParams, make_engine
from specsure.decode.request import Request
from tiny import build_tiny_llama


def _two_requests(engine, good: SamplingParams, bad: SamplingParams) -> tuple[Request, list[tuple[bool, str]]]:  # noqa: ANN001
    """Run a good and a bad request in one batch to the end: the good one, and each error (from the bad one?, text)."""
    scheduler = engine.scheduler
    ours, theirs = engine.request([5, 6, 7, 5, 6], good), engine.request([9, 8, 7], bad)
    scheduler.add(ours)
    scheduler.add(theirs)
    errors = []
    while not scheduler.idle:
        errors += [(r is theirs, str(u.error)) for r, u in scheduler.step() if u.error is not None]
    return ours, errors


def test_one_failing_request_leaves_the_others_of_its_step_running(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    engine = make_engine(str(build_tiny_llama(tmp_path / "m")), {"method": "ngram", "num_speculative_tokens": 3},
                         dtype="float32")
    good, bad = SamplingParams(max_tokens=12, ignore_eos=True), SamplingParams(max_tokens=12, ignore_eos=True, seed=7)
    expected = engine.generate([[5, 6, 7, 5, 6]], good)[0].token_ids
    commit = Request.commit

    def failing(self: Request, out):  # noqa: ANN001, ANN202
        if self.params.seed == 7 and len(self.output) >= 3:
            raise RuntimeError("a bug in one request")
        return commit(self, out)

    monkeypatch.setattr(Request, "commit", failing)
    ours, errors = _two_requests(engine, good, bad)
    assert errors == [(True, "a bug in one request")]
    assert ours.completion is not None and ours.completion.token_ids == expected
    with pytest.raises(RuntimeError, match="a bug in one request"):  # generate raises it, as before
        engine.generate([[5, 6, 7, 5, 6], [9, 8, 7]], [good, bad])
    assert engine.generate([[5, 6, 7, 5, 6]], good)[0].token_ids == expected  # and the engine runs on



@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_a_drafter_that_fails_for_one_request_fails_that_request_alone(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       method: str) -> None:
    model = str(build_tiny_llama(tmp_path / "m"))
    engine = make_engine(model, {"method": method, "num_speculative_tokens": 3,
                                 **({"model": model} if method == "draft_model" else {})}, dtype="float32")
    good, bad = SamplingParams(max_tokens=12, ignore_eos=True), SamplingParams(max_tokens=12, ignore_eos=True, seed=7)
    expected = engine.generate([[5, 6, 7, 5, 6]], good)[0].token_ids
    kind = type(engine.scheduler.slots.proposer(0))
    if method == "ngram":  # drafts one sequence at a time: only the failing one's request fails
        propose = kind.propose

        def failing(self, context, k, params, generator):  # noqa: ANN001, ANN202
            if params.seed == 7 and len(context) >= 6:
                raise RuntimeError("a bug in a drafter")
            return propose(self, context, k, params, generator)

        monkeypatch.setattr(kind, "propose", failing)
    else:  # one batched draft forward for every sequence: a failure there is all of theirs
        batch = kind.propose_batch.__func__

        def failing_batch(cls, jobs):  # noqa: ANN001, ANN202
            if any(job.params.seed == 7 and len(job.context) >= 6 for job in jobs):
                raise RuntimeError("a bug in a drafter")
            return batch(cls, jobs)

        monkeypatch.setattr(kind, "propose_batch", classmethod(failing_batch))
    ours, errors = _two_requests(engine, good, bad)
    if method == "draft_model":
        assert sorted(errors) == [(False, "a bug in a drafter"), (True, "a bug in a drafter")]
    else:
        assert errors == [(True, "a bug in a drafter")]
        assert ours.completion is not None and ours.completion.token_ids == expected
    assert engine.generate([[5, 6, 7, 5, 6]], good)[0].token_ids == expected  # the engine runs on
