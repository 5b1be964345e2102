"""Draft-vocabulary labels: the target's softmax restricted to the draft ids, from the draft rows of its head."""

from __future__ import annotations

from pathlib import Path

import torch

from specsure.models.loading import load_model
from specsure.train.data import build_sequences
from specsure.train.labels import DraftLabels
from tiny import build_tiny_llama


def test_draft_labels_are_the_full_softmax_at_the_draft_ids(tmp_path: Path) -> None:
    loaded = load_model(str(build_tiny_llama(tmp_path / "t", vocab_size=96, num_layers=2)), dtype="float32")
    samples = build_sequences(loaded, [list(range(3, 40)), [7, 8, 9]], [list(range(50, 90)), [11, 12]])
    draft_ids = torch.tensor([0, 4, 9, 31, 50, 77, 95])
    labels = DraftLabels(loaded.lm, draft_ids)
    for sample in samples:
        n = sample.hidden.shape[0]
        want = torch.softmax(loaded.lm.lm_head_logits(sample.hidden), dim=-1)[:, draft_ids]
        torch.testing.assert_close(labels.probs(sample, 0, n), want)
        torch.testing.assert_close(labels.probs(sample, 2, n - 1), want[2: n - 1])  # the memo serves any window
    # The head's own rows, not a slice of something else: a permuted draft vocabulary permutes the labels.
    flipped = DraftLabels(loaded.lm, draft_ids.flip(0)).probs(samples[0], 0, 5)
    torch.testing.assert_close(flipped, labels.probs(samples[0], 0, 5).flip(-1))
