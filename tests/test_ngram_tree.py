"""Ngram token trees: the chain first, then other matches, merged by shared prefix."""

from __future__ import annotations


import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specsure import SamplingParams, make_engine
from specsure.proposers.ngram import NgramProposer, find_ngram_draft, find_ngram_tree


def paths(tokens: list[int], parents: list[int]) -> list[list[int]]:
    """Every root-to-leaf token path of a tree (root excluded)."""
    nodes = [None, *tokens]
    leaves = [i for i in range(1, len(nodes)) if i not in parents]
    out = []
    for leaf in leaves:
        path, i = [], leaf
        while i != 0:
            path.insert(0, nodes[i])
            i = parents[i - 1]
        out.append(path)
    return out


def test_two_occurrences_make_two_branches_with_the_chain_first():
    #            0  1  2  3  4  5  6  7  8  9 10
    context = [5, 1, 2, 3, 9, 1, 2, 4, 8, 1, 2]  # tail (1, 2) occurred at 1-2 and 5-6
    tokens, parents = find_ngram_tree(context, 3, 2, 3, branches=4)
    assert find_ngram_draft(context, 3, 2, 3) == [3, 9, 1]
    assert tokens == [3, 9, 1, 4, 8, 1] and parents == [0, 1, 2, 0, 4, 5]
    assert paths(tokens, parents) == [[3, 9, 1], [4, 8, 1]]


def test_shared_prefixes_merge_and_the_branch_budget_holds():
    context = [7, 1, 2, 3, 4, 0, 1, 2, 3, 5, 0, 1, 2, 6, 0, 1, 2]
    tokens, parents = find_ngram_tree(context, 3, 1, 3, branches=2)
    # tail (0, 1, 2) matched at 5-7 and 10-12 (longest n = 3): continuations [3, 5, 0] and [6, 0, 1]
    assert paths(tokens, parents) == [[3, 5, 0], [6, 0, 1]]
    merged, merged_parents = find_ngram_tree([1, 2, 3, 9, 1, 2, 3, 8, 1, 2], 3, 2, 2, branches=4)
    assert paths(merged, merged_parents) == [[3, 9, 1], [3, 8, 1]]
    assert merged[0] == 3 and merged_parents.count(0) == 1  # one shared first node


def test_nothing_matches_gives_an_empty_tree():
    assert find_ngram_tree([1, 2, 3, 4], 5, 2, 5, branches=3) == ([], [])
    assert find_ngram_tree([1, 2, 1, 2], 0, 1, 2, branches=3) == ([], [])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=2, max_size=60), st.integers(1, 6), st.integers(1, 3),
       st.integers(0, 3), st.integers(1, 5))
def test_the_tree_holds_the_chain_and_is_well_formed(context, k, min_n, extra, branches):
    max_n = min_n + extra
    tokens, parents = find_ngram_tree(context, k, min_n, max_n, branches)
    chain = find_ngram_draft(context, k, min_n, max_n)
    assert len(tokens) == len(parents) and all(0 <= p <= i for i, p in enumerate(parents))
    if not chain:
        assert tokens == []
        return
    # The first branch is the chain: following the first child from the root spells it.
    node, spelled = 0, []
    for _ in chain:
        node = next(i + 1 for i, p in enumerate(parents) if p == node)
        spelled.append(tokens[node - 1])
    assert spelled == chain
    assert len(paths(tokens, parents)) <= branches
    assert max(len(p) for p in paths(tokens, parents)) <= k
    # Siblings never repeat a token: the tree is a trie.
    for node in range(len(parents) + 1):
        kids = [tokens[i] for i, p in enumerate(parents) if p == node]
        assert len(kids) == len(set(kids))


# --- the engine with tree drafts: output equals plain decoding, the cache stays exact -------------



@pytest.fixture(scope="module")
def engines(tiny_llama):
    plain = make_engine(str(tiny_llama), None, dtype="float32")
    tree = make_engine(str(tiny_llama), {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
                                         "prompt_lookup_max": 3}, dtype="float32")
    proposer = NgramProposer(1, 3, branches=4)
    trees = []
    propose = proposer.propose

    def counting(*args, **kwargs):  # records which drafts really were trees
        draft = propose(*args, **kwargs)
        trees.append(draft.parents is not None)
        return draft

    proposer.propose = counting
    tree.proposer = proposer
    return plain, tree, trees


def test_tree_drafts_give_plain_decodings_tokens(engines):
    plain, tree, trees = engines
    gen = torch.Generator().manual_seed(5)
    for _ in range(6):
        base = torch.randint(3, 128, (6,), generator=gen).tolist()
        prompt = base * 3 + base[:2] + torch.randint(3, 128, (4,), generator=gen).tolist() + base[:3]
        params = SamplingParams(max_tokens=40, ignore_eos=True)
        want = plain.generate(prompt, params)[0].token_ids
        got = tree.generate(prompt, params)[0]
        assert got.token_ids == want
    assert tree.stats.drafts > 0 and tree.stats.accepted_tokens > 0 and sum(trees) >= 10


def test_tree_sampling_is_reproducible_and_ends_cleanly(engines):
    _, tree, _ = engines
    prompt = [5, 6, 7, 8] * 4 + [5, 6]
    params = SamplingParams(max_tokens=24, temperature=0.8, seed=11, ignore_eos=True)
    first = tree.generate(prompt, params)[0]
    assert tree.generate(prompt, params)[0].token_ids == first.token_ids and len(first.token_ids) == 24


def _stepped(monkeypatch, commits):
    """Draft kinds over steps where the target commits ``commits[i]`` (accepted draft + new token)."""
    import specsure.proposers.ngram as ngram

    # Every lookup finds the same two branches: the chain 3 4, and 5 6.
    monkeypatch.setattr(ngram, "find_ngram_tree", lambda *a: ([3, 4, 5, 6], [0, 1, 0, 3]))
    monkeypatch.setattr(ngram, "find_ngram_draft", lambda *a: [3, 4])
    proposer = NgramProposer(1, 2, branches=2)
    context, kinds = [1, 2, 3, 4, 9, 1, 2, 5, 6, 9, 1, 2], []
    for commit in commits:
        draft = proposer.propose(context, 2, SamplingParams(max_tokens=8), None)
        kinds.append("tree" if draft.parents is not None else "chain")
        context = context + commit
    return kinds


def test_trees_back_off_while_their_extra_branches_go_unused(monkeypatch):
    # The target takes nothing, or only the chain's tokens: 1 chain, then 2, then 4 between trees.
    commits = [[7], [8], [3, 7], [8], [9], [3, 4, 7], [8], [9], [7], [8]]
    assert _stepped(monkeypatch, commits) == ["tree", "chain", "tree", "chain", "chain", "tree",
                                              "chain", "chain", "chain", "chain"]


def test_an_accepted_extra_branch_keeps_the_trees_coming(monkeypatch):
    # The target follows the second branch (5, then 5 6): no backoff, a tree every step.
    assert _stepped(monkeypatch, [[5, 7], [5, 6, 7], [5, 8], [5, 9]]) == ["tree"] * 4
    # One fruitless tree backs off once; the next accepted extra branch resets it.
    assert _stepped(monkeypatch, [[7], [8], [5, 7], [9]]) == ["tree", "chain", "tree", "tree"]


def test_draft_length_follows_what_the_drafts_earn(monkeypatch):
    import specsure.proposers.ngram as ngram

    asked = []
    monkeypatch.setattr(ngram, "find_ngram_draft", lambda context, k, *a: asked.append(k) or [3] * k)
    proposer = NgramProposer(1, 2)
    context = [1, 2, 3]
    # Rejected at once four times (one new token each), then two drafts accepted whole, then a miss.
    for grow in (1, 1, 1, 1, None, None, 1):
        proposer.propose(context, 5, SamplingParams(max_tokens=8), None)
        context = context + [7] * (grow if grow is not None else asked[-1] + 1)
    assert asked == [5, 4, 3, 2, 1, 3, 5]
    proposer.reset()  # a new sequence starts from k again
    proposer.propose([1, 2, 3], 5, SamplingParams(max_tokens=8), None)
    assert asked[-1] == 5
