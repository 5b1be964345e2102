"""SpecStats: vLLM's definitions, merging, and the log line."""

from __future__ import annotations

import json
import re

import pytest

from specsure.decode.metrics import SpecStats


def three_steps() -> SpecStats:
    stats = SpecStats()
    stats.observe(3, 3)  # all accepted: 3 accepted + bonus
    stats.observe(3, 1)
    stats.observe(3, 0)
    return stats


def test_counters_follow_vllm():
    stats = three_steps()
    assert (stats.drafts, stats.draft_tokens, stats.accepted_tokens) == (3, 9, 4)
    assert stats.accepted_per_position == [2, 1, 1]


def test_mean_acceptance_length_counts_the_bonus_token():
    stats = three_steps()
    assert stats.mean_acceptance_length == pytest.approx(1 + 4 / 3)  # (4 + 2 + 1) outputs / 3 steps
    assert stats.acceptance_rate == pytest.approx(4 / 9)
    assert stats.per_position_acceptance_rate == pytest.approx([2 / 3, 1 / 3, 1 / 3])


def test_a_step_without_draft_tokens_is_not_a_draft():
    stats = three_steps()
    stats.observe(0, 0)
    assert stats.drafts == 3
    assert stats.mean_acceptance_length == pytest.approx(1 + 4 / 3)


def test_shorter_drafts_still_count_in_every_position_denominator():
    stats = SpecStats()
    stats.observe(1, 1)  # ngram may find fewer than k tokens
    stats.observe(3, 3)
    assert stats.accepted_per_position == [2, 1, 1]
    assert stats.per_position_acceptance_rate == pytest.approx([1.0, 0.5, 0.5])


def test_empty_stats_have_defined_figures():
    stats = SpecStats()
    assert stats.mean_acceptance_length == 1.0
    assert stats.acceptance_rate == 0.0
    assert stats.per_position_acceptance_rate == []
    assert stats.tokens_per_s == 0.0
    json.dumps(stats.to_dict(), allow_nan=False)


@pytest.mark.parametrize(("drafted", "accepted"), [(2, 3), (2, -1), (-1, 0)])
def test_impossible_observations_are_rejected(drafted, accepted):
    with pytest.raises(ValueError, match="num_accepted"):
        SpecStats().observe(drafted, accepted)


def test_merge_and_iadd_add_everything():
    a = three_steps()
    a.add_generated(10)
    a.add_time(2.0)
    b = SpecStats()
    b.observe(5, 4)
    b.add_generated(5)
    b.add_time(0.5)
    a += b
    assert (a.drafts, a.draft_tokens, a.accepted_tokens) == (4, 14, 8)
    assert a.accepted_per_position == [3, 2, 2, 1, 0]
    assert (a.generated_tokens, a.elapsed_s) == (15, 2.5)
    assert a.tokens_per_s == pytest.approx(6.0)
    assert b.accepted_per_position == [1, 1, 1, 1, 0]  # the merged-in stats are left alone


def test_to_dict_is_json_and_carries_the_derived_figures():
    stats = three_steps()
    stats.add_time(1.0)
    data = json.loads(json.dumps(stats.to_dict(), allow_nan=False))
    assert data["drafts"] == 3
    assert data["mean_acceptance_length"] == pytest.approx(1 + 4 / 3)
    assert data["per_position_acceptance_rate"] == pytest.approx([2 / 3, 1 / 3, 1 / 3])


def test_log_line_uses_vllms_format():
    stats = three_steps()
    stats.add_time(2.0)
    assert stats.log_line() == (
        "SpecDecoding metrics: Mean acceptance length: 2.33, Accepted throughput: 2.00 tokens/s, "
        "Drafted throughput: 4.50 tokens/s, Accepted: 4 tokens, Drafted: 9 tokens, "
        "Per-position acceptance rate: 0.667, 0.333, 0.333, Avg Draft acceptance rate: 44.4%"
    )
    # The regex users already point at vLLM's log parses ours.
    match = re.search(r"Mean acceptance length: ([\d.]+).*Per-position acceptance rate: ([\d., ]+),", stats.log_line())
    assert match and float(match.group(1)) == 2.33


def test_since_is_what_was_counted_after_a_copy():
    from dataclasses import replace

    stats = SpecStats()
    stats.observe(3, 1)
    earlier = replace(stats, accepted_per_position=list(stats.accepted_per_position))
    stats.observe(4, 3)
    stats.add_generated(5)
    step = stats.since(earlier)
    assert (step.drafts, step.draft_tokens, step.accepted_tokens, step.generated_tokens) == (1, 4, 3, 5)
    assert step.accepted_per_position == [1, 1, 1, 0]
