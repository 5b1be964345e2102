"""Answer-only training: the prompt is context, only the anchors the engine drafts from are scored.

Scoring from a later row must give exactly the rows the full computation gives there (the prompt
still shapes them through attention), and a training window must always hold an answer anchor.
"""

from __future__ import annotations

import pytest
import torch

from specsure.models.loading import load_model
from specsure.train.data import Sample, build_sequences
from specsure.train.eagle3 import default_aux_layers, draft_vocabulary, unrolled, window_loss
from specsure.train.eagle3 import initial_module as eagle3_module
from specsure.train.labels import DraftLabels
from specsure.train.mtp import chain_losses, initial_modules
from specsure.train.windows import answer_start, draw_window
from tiny import build_tiny_llama

PROMPTS = [list(range(5, 5 + n)) for n in (9, 14, 3, 40)]
"""Prompts of several lengths; the last is longer than the windows drawn below."""


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    folder = build_tiny_llama(tmp_path_factory.mktemp("answer") / "t", vocab_size=96, hidden_size=48, num_layers=6)
    return load_model(str(folder), dtype="float32")


@pytest.fixture(scope="module")
def samples(loaded) -> list[Sample]:  # noqa: ANN001
    aux = default_aux_layers(loaded.lm.num_layers)
    answers = [[(7 * i + 3 * j) % 90 + 3 for j in range(12)] for i in range(len(PROMPTS))]
    return build_sequences(loaded, PROMPTS, answers, aux_layers=aux)


def test_eagle3_rows_scored_from_later_equal_the_full_rows(loaded, samples) -> None:  # noqa: ANN001
    sample = samples[1]
    aux = default_aux_layers(loaded.lm.num_layers)
    draft_ids = draft_vocabulary(samples, loaded.lm.vocab_size, 40)
    module = eagle3_module(loaded.lm, aux, draft_ids, seed=2)
    lo, end = answer_start(sample), sample.token_ids.shape[0] - 1
    assert lo > 0
    with torch.no_grad():
        full = unrolled(module, sample, 0, end, 3)
        part = unrolled(module, sample, 0, end, 3, scored_from=lo)
        for s in range(3):
            torch.testing.assert_close(part[s], full[s][lo:])
        # The loss over the scored rows: step s's rows from s on are the chains anchored at lo and later.
        probs = torch.softmax(loaded.lm.lm_head_logits(sample.hidden[1: end + 1]), -1)[:, draft_ids]
        want = [-(probs[lo + s:] * torch.log_softmax(full[s][lo + s:], -1)).sum(-1).mean() for s in range(3)]
        weights = [0.8 ** s for s in range(3)]
        expected = sum(w * c for w, c in zip(weights, want)) / sum(weights)
        labels = DraftLabels(loaded.lm, draft_ids)
        torch.testing.assert_close(window_loss(module, labels, [(sample, 0, end, lo)], 3), expected)


def test_mtp_rows_scored_from_later_equal_the_full_rows(loaded, samples) -> None:  # noqa: ANN001
    sample = samples[0]
    modules = initial_modules(loaded.lm, "random", 3, 2)
    lo, end = answer_start(sample), sample.token_ids.shape[0] - 1
    with torch.no_grad():
        full = chain_losses(modules, loaded.lm, sample, 0, end, unroll=3)
        part = chain_losses(modules, loaded.lm, sample, 0, end, unroll=3, scored_from=lo)
    assert len(part) == len(full) == 3
    for (kl_full, agree_full), (kl_part, agree_part) in zip(full, part):
        torch.testing.assert_close(kl_part, kl_full[lo:])
        assert torch.equal(agree_part, agree_full[lo:])


def test_answer_windows_always_hold_an_answer_anchor(samples) -> None:  # noqa: ANN001
    gen = torch.Generator().manual_seed(0)
    starts: dict[int, set[int]] = {}
    for _ in range(400):
        sample, start, width, scored = draw_window(samples, 16, gen, answer_only=True)
        assert scored == max(answer_start(sample) - start, 0)
        entries = sample.token_ids.shape[0] - 1
        assert 0 <= start and start + width <= entries
        assert answer_start(sample) < start + width  # at least one answer anchor to score
        starts.setdefault(sample.prompt_len, set()).add(start)
    # Windows still move about: the long prompt's windows start at several places.
    assert len(starts[len(PROMPTS[-1])]) > 3
