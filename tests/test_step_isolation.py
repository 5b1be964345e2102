"""A request that fails while its step is verified fails alone: the step's other requests go on."""

from __future__ import annotations

from pathlib import Path

import pytest

from specsure import SamplingParams, make_engine
from specsure.decode.request import Request
from tiny import build_tiny_llama


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
    scheduler = engine.scheduler
    ours, theirs = engine.request([5, 6, 7, 5, 6], good), engine.request([9, 8, 7], bad)
    scheduler.add(ours)
    scheduler.add(theirs)
    errors = []
    while not scheduler.idle:
        errors += [(r, u.error) for r, u in scheduler.step() if u.error is not None]
    assert [(r is theirs, str(e)) for r, e in errors] == [(True, "a bug in one request")]
    assert ours.completion is not None and ours.completion.token_ids == expected
    with pytest.raises(RuntimeError, match="a bug in one request"):  # generate raises it, as before
        engine.generate([[5, 6, 7, 5, 6], [9, 8, 7]], [good, bad])
    assert engine.generate([[5, 6, 7, 5, 6]], good)[0].token_ids == expected  # and the engine runs on
