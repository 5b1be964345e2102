"""NgramProposer: golden cases of prompt lookup, a plain reference, and a property test."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specsure.sampling import SamplingParams
from specsure.proposers.base import Draft, Proposer
from specsure.proposers.ngram import NgramProposer, find_ngram_draft


def reference_ngram_draft(context: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Straight from the definition: longest n first, then the earliest earlier occurrence."""
    for n in range(max_n, min_n - 1, -1):
        suffix = context[len(context) - n :]
        for start in range(len(context) - n):  # start + n <= len - 1: strictly earlier
            if context[start : start + n] == suffix:
                return context[start + n : start + n + k]
    return []


@pytest.mark.parametrize(
    ("context", "min_n", "max_n", "k", "expected"),
    [
        ([1, 2, 3, 4, 1, 2, 3], 2, 2, 3, [4, 1, 2]),
        ([1, 3, 6, 2, 3, 4, 1, 2, 3], 1, 1, 2, [6, 2]),  # the first match wins
        ([2, 3, 4, 5, 1, 2, 3, 4, 1, 2, 3, 4], 3, 4, 2, [1, 2]),  # the 4-gram is preferred
        ([1, 2, 3, 100, 1, 2, 3, 200, 1, 2, 3, 300, 1, 2, 3], 3, 3, 2, [100, 1]),
        ([1, 2, 3, 4, 1, 2, 3, 5, 6], 2, 2, 2, []),  # no match
    ],
)
def test_golden_cases(context, min_n, max_n, k, expected):
    proposer = NgramProposer(prompt_lookup_min=min_n, prompt_lookup_max=max_n)
    draft = proposer.propose(context, k, SamplingParams(), None)
    assert draft == Draft(expected, None)
    assert reference_ngram_draft(context, k, min_n, max_n) == expected


def test_is_a_proposer_for_the_ngram_method():
    proposer = NgramProposer(1, 3)
    assert isinstance(proposer, Proposer)
    assert NgramProposer.method == "ngram"
    assert not proposer.needs_hidden


@pytest.mark.parametrize(
    ("context", "k", "expected"),
    [
        ([], 3, []),
        ([5], 3, []),
        ([5, 5], 3, [5]),  # the draft may run into the matched tail itself
        ([1, 2, 1, 2], 0, []),
        ([1, 2, 1, 2], 10, [1, 2]),  # fewer than k tokens follow the match
    ],
)
def test_edge_cases(context, k, expected):
    assert find_ngram_draft(context, k, 1, 2) == expected


def test_accepts_arrays_and_tensors():
    context = [1, 2, 3, 4, 1, 2, 3]
    expected = [4, 1, 2]
    assert find_ngram_draft(np.array(context, dtype=np.int32), 3, 2, 2) == expected
    assert find_ngram_draft(torch.tensor(context), 3, 2, 2) == expected


@pytest.mark.parametrize(
    ("min_n", "max_n", "fragment"),
    [(0, 3, "prompt_lookup_min = 0"), (2, 1, "greater than prompt_lookup_max = 1"),
     (1, True, "prompt_lookup_max = True"), (1.0, 2, "prompt_lookup_min = 1.0")],
)
def test_bad_lookup_bounds_are_rejected(min_n, max_n, fragment):
    with pytest.raises(ValueError, match=fragment):
        NgramProposer(min_n, max_n)


@settings(max_examples=400, deadline=None)
@given(
    context=st.lists(st.integers(0, 3), min_size=0, max_size=60),
    k=st.integers(0, 6),
    min_n=st.integers(1, 4),
    extra=st.integers(0, 3),
)
def test_matches_the_reference_on_small_alphabets(context, k, min_n, extra):
    max_n = min_n + extra
    assert find_ngram_draft(context, k, min_n, max_n) == reference_ngram_draft(context, k, min_n, max_n)


def test_long_contexts_match_the_reference():
    rng = np.random.default_rng(0)
    for alphabet in (3, 50, 5000):
        context = rng.integers(0, alphabet, size=3000).tolist()
        context += context[1000:1004]  # a tail that certainly occurs earlier
        for min_n, max_n in ((1, 1), (2, 5), (3, 8)):
            expected = reference_ngram_draft(context, 5, min_n, max_n)
            assert find_ngram_draft(context, 5, min_n, max_n) == expected
