"""Ngram token trees: the chain first, then other matches, merged by shared prefix."""

from __future__ import annotations


from hypothesis import given, settings
from hypothesis import strategies as st

from specsure.proposers.ngram import find_ngram_draft, find_ngram_tree


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
