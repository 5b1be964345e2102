"""Tree verification: greedy follows the target's argmax down the tree; sampling keeps p exactly."""

from __future__ import annotations

import pytest
import torch

from specsure.decode.rejection import verify_greedy
from specsure.decode.tree import verify_tree
from specsure.models.token_tree import depth
from stats import chi2, chi2_critical

V = 6


def onehot_rows(*ids: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(ids), V).float()


def test_greedy_walks_the_matching_branch_and_ends_with_the_bonus_token():
    # root(4) -> {1: node 1 -> {2: node 2}, 3: node 3}
    tokens, parents = [4, 1, 2, 3], [-1, 0, 1, 0]
    verdict = verify_tree(None, onehot_rows(3, 2, 5, 0), tokens, parents, None)
    assert verdict.path == [0, 3] and verdict.output_ids == [3, 0]  # took branch 3, bonus from its row
    full = verify_tree(None, onehot_rows(1, 2, 5, 0), tokens, parents, None)
    assert full.path == [0, 1, 2] and full.output_ids == [1, 2, 5] and full.accepted == 2
    miss = verify_tree(None, onehot_rows(5, 2, 5, 0), tokens, parents, None)
    assert miss.path == [0] and miss.output_ids == [5]  # recovered token at the root


def test_a_chain_tree_agrees_with_the_chain_verifier():
    gen = torch.Generator().manual_seed(3)
    for _ in range(50):
        logits = torch.randn(5, V, generator=gen)
        draft = torch.randint(0, V, (4,), generator=gen).tolist()
        tree = verify_tree(None, logits, [0, *draft], [-1, 0, 1, 2, 3], None)
        chain = verify_greedy(logits, draft)
        assert (tree.accepted, tree.output_ids) == (chain.accepted, chain.output_ids)


def test_depth_counts_draft_positions():
    assert depth([-1, 0, 1, 0, 3, 3, 5]) == 3 and depth([-1]) == 0


def test_malformed_trees_are_refused():
    with pytest.raises(ValueError, match="one parent per token"):
        verify_tree(None, onehot_rows(1, 2), [4, 1], [0, 0], None)


def test_sampled_tree_verification_keeps_the_targets_distribution():
    # root -> {1: node 1 -> {2: node 2}, 3: node 3}; p differs per node.
    tokens, parents = [4, 1, 2, 3], [-1, 0, 1, 0]
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(4, V, generator=gen), dim=-1)
    first = torch.zeros(V)
    after_1 = torch.zeros(V)  # the second output token when the first was 1 (node 1's row)
    after_3 = torch.zeros(V)
    trials = 30000
    for _ in range(trials):
        out = verify_tree(p, None, tokens, parents, gen).output_ids
        first[out[0]] += 1
        if out[0] == 1:
            after_1[out[1]] += 1
        elif out[0] == 3:
            after_3[out[1]] += 1
    assert chi2(first, p[0]) < chi2_critical(V - 1)
    assert after_1.sum() > 1000 and after_3.sum() > 1000  # both branches were really exercised
    assert chi2(after_1, p[1]) < chi2_critical(V - 1)
    assert chi2(after_3, p[3]) < chi2_critical(V - 1)
