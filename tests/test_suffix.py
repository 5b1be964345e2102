"""Suffix decoding: the counted suffix trees, the drafting rule, the global tree, and the engine.

Golden cases are computed by hand in the comments; a brute-force reference (count every string,
then apply the drafting rule) checks the trees and the proposer on random histories.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import specsure.proposers.suffix as suffix_module
from specsure import SamplingParams, make_engine
from specsure.proposers.base import Draft, Proposer
from specsure.proposers.factory import REGISTRY
from specsure.proposers.suffix import SuffixProposer
from specsure.proposers.suffix_tree import Node, SuffixTree, Tail
from stats import exact_second_token_distribution, tv
from test_engine import _histogram
from tiny import build_tiny_llama

GREEDY = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)


# --- a brute-force reference -------------------------------------------------------------------

def reference_counts(sequences, depth: int) -> Counter:
    """Every string of at most ``depth`` tokens of ``sequences``, with its number of occurrences."""
    counts: Counter = Counter()
    for seq in sequences:
        for start in range(len(seq)):
            for end in range(start + 1, min(start + depth, len(seq)) + 1):
                counts[tuple(seq[start:end])] += 1
    return counts


def tree_counts(tree: SuffixTree) -> dict:
    """The tree's strings and counts, chains expanded; checks each node's bookkeeping on the way."""
    found: dict = {}

    def walk(node: Node, prefix: tuple) -> None:
        assert node.out == sum(child.count for child in node.children.values())
        if node.best is not None:
            assert node.best == min(node.children, key=lambda t: (-node.children[t].count, t))
        for token, child in node.children.items():
            if isinstance(child, Tail):
                assert child.seq[child.start] == token and child.length >= 1
                for i in range(child.length):
                    found[prefix + tuple(child.seq[child.start : child.start + i + 1])] = 1
            else:
                assert child.count >= 1
                found[prefix + (token,)] = child.count
                walk(child, prefix + (token,))

    walk(tree.root, ())
    return found


def reference_draft(context, outputs, k: int, depth: int, factor: float, min_prob: float) -> list[int]:
    """The drafting rule, from the definition, over brute-force counts."""
    def children(counts):
        index = defaultdict(dict)
        for string, count in counts.items():
            index[string[:-1]][string[-1]] = count
        return index

    def walk(index, string, limit):
        tokens, score, prob = [], 0.0, 1.0
        while len(tokens) < limit and index.get(string):
            nxt = index[string]
            token = min(nxt, key=lambda t: (-nxt[t], t))
            step = prob * (nxt[token] / sum(nxt.values()))
            if step < min_prob:
                break
            tokens.append(token)
            score += step
            prob = step
            string += (token,)
        return tokens, score

    best_key, best = (0.0, 0, 0), []
    for own, sequences in ((1, [context]), (0, outputs)):
        index = children(reference_counts(sequences, depth))
        for m in range(1, min(len(context), depth - 1) + 1):
            pattern = tuple(context[-m:])
            limit = min(k, int(factor * m + 1e-9), depth - m)
            if limit <= 0 or not index.get(pattern):
                continue
            tokens, score = walk(index, pattern, limit)
            if tokens and (score, own, m) > best_key:
                best_key, best = (score, own, m), tokens
    return best


def propose(proposer: SuffixProposer, context, k: int = 8) -> list[int]:
    draft = proposer.propose(list(context), k, SamplingParams(), None)
    assert isinstance(draft, Draft) and draft.probs is None  # a point mass: q = 1
    return draft.token_ids


# --- the tree ----------------------------------------------------------------------------------

def test_golden_tree_of_a_short_sequence():
    # "1 2 1 2 3", depth 3: 1, 2 and "1 2" occur twice (nodes); everything else once (chains).
    tree = SuffixTree(3)
    tree.extend(0, [1, 2, 1, 2, 3])
    assert tree_counts(tree) == {
        (1,): 2, (2,): 2, (3,): 1, (1, 2): 2, (2, 1): 1, (2, 3): 1, (1, 2, 1): 1, (2, 1, 2): 1, (1, 2, 3): 1}
    assert tree.root.out == 5
    one, two = tree.root.children[1], tree.root.children[2]
    assert isinstance(one, Node) and isinstance(two, Node) and isinstance(tree.root.children[3], Tail)
    assert one.out == 2 and two.out == 2  # "1 2" twice; "2 1" and "2 3" once each
    chain = two.children[1]
    assert isinstance(chain, Tail) and chain.seq[chain.start : chain.start + chain.length] == [1, 2]
    assert tree.size() == (3, 5)  # nodes 1, 2, "1 2"; chains 3, "2 1 2", "2 3", "1 2 1", "1 2 3"


def test_appending_in_pieces_equals_appending_at_once():
    whole, pieces = SuffixTree(4), SuffixTree(4)
    seq = [5, 1, 5, 1, 5, 2, 5, 1]
    whole.extend(0, seq)
    for start in range(0, len(seq), 3):
        pieces.extend(0, seq[start : start + 3])
    assert tree_counts(whole) == tree_counts(pieces) == dict(reference_counts([seq], 4))


def test_only_the_sequence_extended_last_can_grow():
    tree = SuffixTree(4)
    tree.extend(0, [1, 2])
    tree.extend(1, [3])
    with pytest.raises(ValueError, match="sequence 0 is closed"):
        tree.extend(0, [4])
    with pytest.raises(ValueError, match="depth = 0"):
        SuffixTree(0)


def test_removing_every_sequence_leaves_an_empty_tree():
    tree = SuffixTree(5)
    for seq_id, seq in enumerate(([1, 2, 3, 1, 2], [2, 3, 1, 2, 4], [9])):
        tree.extend(seq_id, seq)
    for seq_id in (1, 0, 2):
        tree.remove(seq_id)
    assert tree.root.children == {} and tree.root.out == 0 and tree.size() == (0, 0)


sequences = st.lists(st.lists(st.integers(0, 3), min_size=0, max_size=25), min_size=1, max_size=6)


@settings(max_examples=150, deadline=None)
@given(seqs=sequences, depth=st.integers(1, 6), removals=st.lists(st.integers(0, 5), max_size=6),
       chunk=st.integers(1, 7))
def test_counts_match_the_reference_after_adds_and_removes(seqs, depth, removals, chunk):
    tree = SuffixTree(depth)
    for seq_id, seq in enumerate(seqs):
        tree.extend(seq_id, [])  # an empty sequence is a sequence too
        for start in range(0, len(seq), chunk):
            tree.extend(seq_id, seq[start : start + chunk])
    live = dict(enumerate(seqs))
    for seq_id in removals:
        if seq_id in live:
            tree.remove(seq_id)
            del live[seq_id]
    assert tree_counts(tree) == dict(reference_counts(live.values(), depth))


# --- drafting: golden cases --------------------------------------------------------------------

# "1 2 3" occurs four times, followed by 4, 4, 5 and (at the end) nothing: P(4) = 2/3. After
# "1 2 3 4" come 9 and 8 once each: the tie goes to 8, path probability 2/3 * 1/2 = 1/3. After
# "1 2 3 4 8" comes "1 2 3 5 7 1 2 3", once: probability 1 each, path probability stays 1/3.
HISTORY = [1, 2, 3, 4, 9, 1, 2, 3, 4, 8, 1, 2, 3, 5, 7, 1, 2, 3]


@pytest.mark.parametrize(("depth", "factor", "min_prob", "expected", "score"), [
    # m = 3 may draft 3: [4, 8, 1] scores 2/3 + 1/3 + 1/3 = 4/3; m = 2 gives [4, 8] (1.0), m = 1 [4].
    (24, 1.0, 0.1, [4, 8, 1], 4 / 3),
    # factor 2: m = 3 may draft 6 and follows the chain: 2/3 + 5 * 1/3 = 7/3.
    (24, 2.0, 0.1, [4, 8, 1, 2, 3, 5], 7 / 3),
    # factor 0.5: floor(1.5) = 1 token for m = 3 and m = 2, equal scores; the longer match wins.
    (24, 0.5, 0.1, [4], 2 / 3),
    # Depth 4: m = 3 leaves room for 1 token (2/3), m = 2 for 2 ([4, 8], 1.0): the shorter match wins.
    (4, 1.0, 0.1, [4, 8], 1.0),
    # min_token_prob 0.5 stops before 8 (1/3); 0.7 stops before 4 (2/3), so nothing is drafted.
    (24, 1.0, 0.5, [4], 2 / 3),
    (24, 1.0, 0.7, [], 0.0),
])
def test_golden_drafts(depth, factor, min_prob, expected, score):
    proposer = SuffixProposer(depth, 0, factor, min_prob)
    assert propose(proposer, HISTORY) == expected
    assert proposer.last_score == pytest.approx(score)  # what the draft expects to be accepted
    assert reference_draft(HISTORY, [], 8, depth, factor, min_prob) == expected


def test_k_caps_the_draft():
    assert propose(SuffixProposer(24, 0, 2.0, 0.1), HISTORY, k=2) == [4, 8]
    assert propose(SuffixProposer(24, 0, 2.0, 0.1), HISTORY, k=0) == []
    assert propose(SuffixProposer(24, 0, 1e308, 0.1), HISTORY, k=3) == [4, 8, 1]  # factor * m overflows


def test_the_length_grows_with_the_match():
    # A context that repeats itself: after m matched tokens, factor 1 drafts m tokens.
    proposer = SuffixProposer(24, 0, 1.0, 0.1)
    text = [7, 1, 2, 3, 4, 5, 6, 8, 9, 7, 1, 2, 3, 4, 5, 6, 8, 9]
    assert propose(proposer, text[:11]) == [2, 3]  # "7 1" matched: 2 tokens
    assert propose(proposer, text[:13]) == [4, 5, 6, 8]  # "7 1 2 3" matched: 4 tokens


# --- the global tree ---------------------------------------------------------------------------

def run_request(proposer: SuffixProposer, prompt: list[int], output: list[int]) -> list[int]:
    """One request as the engine runs it: reset, then a propose per output token; the first draft."""
    proposer.reset()
    first = propose(proposer, prompt + output[:1])
    for i in range(2, len(output) + 1):
        propose(proposer, prompt + output[:i])
    return first


def test_an_earlier_output_is_drafted_and_an_evicted_one_is_not():
    proposer = SuffixProposer(8, 1, 1.0, 0.1)
    run_request(proposer, [10, 11], [20, 21, 22, 23, 24, 25])  # A
    # B asks again for what A answered: its own tree has never seen 23, the global tree has.
    assert run_request(proposer, [30, 20, 21], [22]) == [23, 24, 25]
    assert proposer.cached_requests == (0,)  # A is cached; B joins when the next request starts
    # C: B's output [22] joined, and with room for one request A was evicted.
    assert run_request(proposer, [30, 20, 21], [22]) == []
    assert proposer.cached_requests == (1,)
    assert sum(proposer.global_tree.size()) == 1  # only B's [22] is left (a node: A shared it)
    assert tree_counts(proposer.global_tree) == {(22,): 1}


def test_eviction_is_first_in_first_out_and_memory_stays_bounded():
    proposer = SuffixProposer(6, 2, 1.0, 0.1)
    outputs = [[100 + 3 * i, 101 + 3 * i, 102 + 3 * i, 7, 8, 9, i] for i in range(6)]
    for output in outputs:
        run_request(proposer, [1, 2], output)
    proposer.reset()  # the last output joins too
    assert proposer.cached_requests == (4, 5)
    live = reference_counts(outputs[-2:], 6)
    assert tree_counts(proposer.global_tree) == dict(live)  # nothing of the evicted four is left
    assert 3 not in proposer.global_tree and 4 in proposer.global_tree
    # Each stored node or chain holds at least one string of a cached output.
    assert sum(proposer.global_tree.size()) <= len(live)


def test_zero_cached_requests_turns_the_global_tree_off():
    proposer = SuffixProposer(8, 0, 1.0, 0.1)
    run_request(proposer, [10, 11], [20, 21, 22, 23])
    assert proposer.global_tree is None and proposer.cached_requests == ()
    assert run_request(proposer, [30, 20, 21], [22]) == []


def test_the_outputs_committed_after_the_last_draft_join_too():
    # The last verification step commits the draft it accepted; observe() reports it.
    proposer = SuffixProposer(8, 4, 1.0, 0.1)
    proposer.reset()
    propose(proposer, [10, 11, 20])  # prompt [10, 11], pending 20
    proposer.observe([10, 11], 0, None)
    proposer.observe([20, 21, 22, 23], 2, None)
    proposer.reset()
    assert proposer.global_tree.sequence(0) == [20, 21, 22, 23]


def test_clear_history_forgets_earlier_requests():
    proposer = SuffixProposer(8, 4, 1.0, 0.1)
    run_request(proposer, [10, 11], [20, 21, 22, 23])
    proposer.clear_history()
    assert run_request(proposer, [30, 20, 21], [22]) == []  # A never joined: it was forgotten with the rest


def test_a_tie_goes_to_the_requests_own_tree():
    proposer = SuffixProposer(8, 4, 1.0, 0.1)
    run_request(proposer, [50], [1, 2, 9, 4])  # the global tree: "1 2" -> 9 4
    # Own tree: "1 2" -> 8 0, also 2.0 for m = 2: a tie, which the request's own tree wins.
    assert run_request(proposer, [1, 2, 8, 0, 1], [2]) == [8, 0]
    # Own tree: "1 2" -> 8 or 7 (1/2 each) scores 1.0; the global tree's 9 4 scores 2.0 and wins.
    assert run_request(proposer, [1, 2, 8, 1, 2, 7, 1], [2]) == [9, 4]


@settings(max_examples=60, deadline=None)
@given(requests=st.lists(st.tuples(st.lists(st.integers(0, 4), min_size=1, max_size=12),
                                   st.lists(st.integers(0, 4), min_size=1, max_size=20)), min_size=1, max_size=5),
       depth=st.integers(2, 7), cached=st.integers(0, 3), factor=st.sampled_from((0.5, 1.0, 2.0)),
       min_prob=st.sampled_from((0.0, 0.1, 0.4)), k=st.integers(1, 6))
def test_every_draft_matches_the_reference(requests, depth, cached, factor, min_prob, k):
    proposer = SuffixProposer(depth, cached, factor, min_prob)
    outputs: list[list[int]] = []
    for prompt, output in requests:
        proposer.reset()
        for i in range(1, len(output) + 1):
            context = prompt + output[:i]
            expected = reference_draft(context, outputs[-cached:] if cached else [], k, depth, factor, min_prob)
            assert propose(proposer, context, k) == expected
        outputs.append(output)


# --- cost: incremental updates, nothing tried when nothing matches -----------------------------

def test_each_step_feeds_only_the_new_tokens(monkeypatch):
    appended = []
    original = SuffixTree._append

    def counting(self, seq, frontier, token):
        appended.append(token)
        return original(self, seq, frontier, token)

    monkeypatch.setattr(SuffixTree, "_append", counting)
    proposer = SuffixProposer(24, 10, 1.0, 0.1)
    proposer.reset()
    context = list(range(40))
    propose(proposer, context)
    assert appended == context
    appended.clear()
    propose(proposer, context + [3, 4, 5])  # a step that committed three tokens
    assert appended == [3, 4, 5]


def test_a_context_that_repeats_nothing_tries_no_draft(monkeypatch):
    tried = []
    monkeypatch.setattr(suffix_module, "draft_from", lambda *a: tried.append(a) or ([], 0.0))
    proposer = SuffixProposer(24, 10, 1.0, 0.1)
    run_request(proposer, [1000, 1001], list(range(2000, 2030)))  # the global tree holds 2000..2029
    assert run_request(proposer, [3000, 3001], list(range(4000, 4030))) == []
    assert tried == []


def test_is_the_proposer_of_the_suffix_method():
    proposer = SuffixProposer(24, 10, 1.0, 0.1)
    assert isinstance(proposer, Proposer) and SuffixProposer.method == "suffix" and not proposer.needs_hidden
    assert REGISTRY["suffix"] == "specsure.proposers.suffix:build"


@pytest.mark.parametrize(("args", "fragment"), [
    ((0, 1, 1.0, 0.1), "max_tree_depth = 0"), ((4, -1, 1.0, 0.1), "max_cached_requests = -1"),
    ((4, 1, -1.0, 0.1), "max_spec_factor = -1.0"), ((4, 1, 1.0, 1.5), "min_token_prob = 1.5"),
    ((True, 1, 1.0, 0.1), "max_tree_depth = True"),
])
def test_bad_parameters_are_rejected(args, fragment):
    with pytest.raises(ValueError, match=fragment):
        SuffixProposer(*args)


# --- the engine: lossless, and the global tree pays off across requests ------------------------

SHAPE = dict(vocab_size=96, hidden_size=48, num_layers=3)
PROMPTS = [[5, 6, 7, 8, 9, 10, 5, 6, 7], [40, 41, 3, 50, 40, 41], [77, 12, 19, 80, 0, 75, 18, 36, 70]]


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_tiny_llama(tmp_path_factory.mktemp("suffix") / "target", seed=0, **SHAPE))


@pytest.fixture(scope="module")
def plain_outputs(target: str) -> list[list[int]]:
    return [c.token_ids for c in make_engine(target, None, dtype="float32").generate(PROMPTS, GREEDY)]


@pytest.mark.parametrize("spec", [
    {"method": "suffix"},
    {"method": "suffix", "num_speculative_tokens": 3, "suffix_decoding_max_tree_depth": 6,
     "suffix_decoding_min_token_prob": 0.0, "suffix_decoding_max_spec_factor": 2.0},
])
def test_greedy_output_equals_plain_decoding_across_repeated_requests(target, plain_outputs, spec):
    engine = make_engine(target, spec, dtype="float32")
    assert engine.speculative_method == "suffix"
    first = engine.generate(PROMPTS, GREEDY)
    second = engine.generate(PROMPTS, GREEDY)  # now every prompt's output is in the global tree
    assert [c.token_ids for c in first] == plain_outputs
    assert [c.token_ids for c in second] == plain_outputs
    accepted = [sum(c.stats.accepted_tokens for c in run) for run in (first, second)]
    assert accepted[1] > accepted[0]  # the global tree drafts what the first pass answered
    assert engine.stats.drafts > 0


def test_without_the_global_tree_a_repeat_gains_nothing(target, plain_outputs):
    engine = make_engine(target, {"method": "suffix", "suffix_decoding_max_cached_requests": 0}, dtype="float32")
    first = engine.generate(PROMPTS, GREEDY)
    second = engine.generate(PROMPTS, GREEDY)
    assert [c.token_ids for c in second] == plain_outputs
    assert [c.stats.accepted_tokens for c in first] == [c.stats.accepted_tokens for c in second]


def test_eos_stops_at_the_same_token_as_plain_decoding(target, plain_outputs):
    import dataclasses

    eos = plain_outputs[0][10]
    expected = plain_outputs[0][: plain_outputs[0].index(eos) + 1]
    engine = make_engine(target, {"method": "suffix"}, dtype="float32")
    engine.target = dataclasses.replace(engine.target, eos_token_ids=(eos,))
    for _ in range(2):  # the second time drafts from the first one's output
        out = engine.generate(PROMPTS[0], SamplingParams(max_tokens=80))[0]
        assert out.token_ids == expected and out.finish_reason == "stop"


def _second_token_histogram(engine, prompt: list[int], runs: int, temperature: float) -> torch.Tensor:
    """Three tokens per run, so the second is drafted (from earlier runs' outputs) and verified."""
    counts = torch.zeros(engine.target.lm.vocab_size)
    for seed in range(runs):
        params = SamplingParams(max_tokens=3, temperature=temperature, seed=seed, ignore_eos=True)
        counts[engine.generate(prompt, params)[0].token_ids[1]] += 1
    return counts / runs


def test_sampling_keeps_the_target_distribution(tmp_path: Path):
    # Point-mass drafts from the trees: a draft token is accepted with probability p(token).
    target = str(build_tiny_llama(tmp_path / "t", vocab_size=24, hidden_size=32, num_layers=2, seed=5))
    prompt, temperature, runs = [3, 9, 4, 3, 9], 1.5, 1500
    exact = exact_second_token_distribution(target, prompt, temperature)
    engine = make_engine(target, {"method": "suffix", "suffix_decoding_min_token_prob": 0.0}, dtype="float32")
    plain = make_engine(target, None, dtype="float32")
    tv_spec = tv(_second_token_histogram(engine, prompt, runs, temperature), exact)
    tv_plain = tv(_histogram(plain, prompt, runs, temperature), exact)
    stats = engine.stats
    assert stats.drafts > runs // 2 and 0 < stats.accepted_tokens < stats.draft_tokens  # drafts, and rejections
    reference = torch.softmax(torch.randn(24, generator=torch.Generator().manual_seed(0)) * 2, -1)
    assert tv_spec < max(1.5 * tv_plain, 0.06)
    assert tv(reference, exact) > 3 * tv_spec
