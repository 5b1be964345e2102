"""speculative_token_tree (the key of earlier vLLM releases): parsing and resolution, export and
check-vllm, and a head drafting the tree exactly as chains through each node would, lossless greedy
and sampled."""

from __future__ import annotations

import pytest
import torch
from heads import write_eagle3_head, write_eagle_head, write_mtp_head
from stats import chi2, chi2_critical, tv
from test_check_vllm import vllm_result
from test_eagle3 import RUNS, second_token_marginal
from test_export import write

from specsure import ConfigError, SamplingParams, make_engine, resolve
from specsure.bench.configs import Settings, speculative_config
from specsure.config.export import export
from specsure.config.token_tree import parse_token_tree
from specsure.proposers.head_layer import last_row, widened
from specsure.vllm_check import compare
from tiny import build_tiny_llama

PROMPT = [5, 6, 7, 8, 9]
WIDE = "[(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (1, 0, 0)]"


# --- the key ------------------------------------------------------------------------------------

def test_vllms_string_and_a_json_list_give_the_same_tree_breadth_first():
    assert parse_token_tree("[(0,), (0, 0), (1,)]", 64) == ((0,), (1,), (0, 0))
    assert parse_token_tree([[0, 0], [1], [0]], 64) == ((0,), (1,), (0, 0))


@pytest.mark.parametrize("tree, words", [
    ("[(0,), (0, 1", "not a list of tuples"),
    ("__import__('os').system('true')", "not a list of tuples"),
    ("[]", "non-empty list"),
    ("[(0,), 5]", "node 5 must be a non-empty tuple"),
    ("[(0,), ()]", "non-empty tuple"),
    ("[(0,), (-1,)]", "holds rank -1"),
    ([[True]], "holds rank True"),
    ("[(16,)]", "holds rank 16"),
    ("[(0,), (0,)]", "lists node (0,) twice"),
    ("[(0,), (0, 1, 0)]", "node (0, 1, 0) has no parent (0, 1)"),
    (str([(0,) * i for i in range(1, 66)]), "65 nodes; at most 64"),
])
def test_a_bad_tree_is_refused_with_the_field_and_the_fix(tree, words):
    with pytest.raises(ConfigError, match="speculative_token_tree") as err:
        resolve({"method": "eagle3", "speculative_token_tree": tree})
    assert words in str(err.value)


def test_k_is_the_node_count_and_a_different_explicit_k_is_an_error():
    res = resolve({"method": "eagle3", "speculative_token_tree": "[(0,), (1,), (0, 0)]"})
    assert res.config.num_speculative_tokens == 3 and res.source("num_speculative_tokens") == "derived"
    assert res.config.speculative_token_tree == ((0,), (1,), (0, 0)) and res.source("speculative_token_tree") == "user"
    assert "3 nodes over 2 levels (2, 1 per level)" in res.reason("speculative_token_tree")
    assert "[(0,), (1,), (0, 0)]" in res.explain()  # shown in vLLM's text
    same = resolve({"method": "mtp", "num_speculative_tokens": 2, "speculative_token_tree": [[0], [1]]})
    assert same.config.num_speculative_tokens == 2 and same.source("num_speculative_tokens") == "user"
    with pytest.raises(ConfigError, match="num_speculative_tokens = 2 but speculative_token_tree has 3 nodes"):
        resolve({"method": "eagle3", "num_speculative_tokens": 2, "speculative_token_tree": "[(0,), (1,), (2,)]"})


@pytest.mark.parametrize("method, hint", [("ngram", "prompt_lookup_branches"), ("suffix", "suffix trees"),
                                          ("draft_model", "")])
def test_only_the_head_methods_take_a_tree(tmp_path, method, hint):
    spec = {"method": method, "speculative_token_tree": "[(0,), (1,)]"}
    if method == "draft_model":
        spec["model"] = write(tmp_path / "small", num_hidden_layers=2)
    with pytest.raises(ConfigError, match="applies only to methods eagle, eagle3, mtp") as err:
        resolve(spec, model=write(tmp_path / "target"))
    assert hint in str(err.value) and "Remove speculative_token_tree" in str(err.value)


def test_no_tree_is_a_chain_by_default(target, heads):
    res = resolve({"method": "eagle3", "model": str(heads["eagle3"])}, model=str(target))
    assert res.config.speculative_token_tree is None and res.source("speculative_token_tree") == "default"
    assert "speculative_token_tree" not in res.config.to_vllm()


def test_vllm_gets_a_chain_of_k_with_a_warning_and_sglang_the_nearest_dynamic_tree():
    res = resolve({"method": "eagle3", "speculative_token_tree": [[1], [0], [0, 0]]})
    vllm = export(res, "vllm")  # vLLM 0.33.0 refuses the key
    assert "speculative_token_tree" not in vllm.speculative_config
    assert vllm.speculative_config["num_speculative_tokens"] == 3
    assert any("speculative_token_tree = [(0,), (1,), (0, 0)] is not a key of vLLM 0.33.0" in w
               and "a chain of num_speculative_tokens = 3" in w for w in vllm.warnings)
    chain = export(resolve({"method": "eagle3", "speculative_token_tree": "[(0,), (0, 0)]"}), "vllm")
    assert not any("speculative_token_tree" in w for w in chain.warnings)  # the same draft as k = 2
    sglang = export(res, "sglang")
    args = dict(zip(sglang.args[::2], sglang.args[1::2]))
    assert (args["--speculative-num-steps"], args["--speculative-eagle-topk"],
            args["--speculative-num-draft-tokens"]) == ("2", "2", "4")
    assert any("SGLang has no static speculative_token_tree" in w for w in sglang.warnings)


def test_check_vllm_compares_a_trees_k_and_not_the_tree_vllm_has_no_key_for(tmp_path):
    target, head = write(tmp_path / "target"), write(tmp_path / "head", architectures=["LlamaForCausalLMEagle3"],
                                                      num_hidden_layers=1)
    res = resolve({"method": "eagle3", "model": head, "speculative_token_tree": "[(0,), (1,), (2,)]"}, model=target)
    check = compare(res, vllm_result(method="eagle3", model=head, num_speculative_tokens=3), exported={})
    assert check.ok and "speculative_token_tree" not in {r.field for r in check.rows}
    assert not compare(res, vllm_result(method="eagle3", model=head, num_speculative_tokens=2), exported={}).ok


def test_the_bench_runs_each_tree_method_with_its_tree():
    s = Settings(model=None, dtype="float32", num_speculative_tokens=8, head_k=3)
    want = {"method": "eagle3", "speculative_token_tree": "[(0,), (1,)]"}  # the shipped head's tree
    assert speculative_config("eagle3-tree", s) == want  # the tree's node count is k, not -k
    ours = Settings(model=None, dtype="float32", num_speculative_tokens=8, token_tree="[(0,), (1,)]")
    assert speculative_config("mtp-tree", ours) == {"method": "mtp", "speculative_token_tree": "[(0,), (1,)]"}


# --- drafting and decoding ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return build_tiny_llama(tmp_path_factory.mktemp("t") / "target", num_layers=4)


@pytest.fixture(scope="module")
def heads(target, tmp_path_factory):
    folder = tmp_path_factory.mktemp("heads")
    return {"eagle3": write_eagle3_head(folder / "eagle3", target, draft_vocab=64),
            "eagle3, two layers": write_eagle3_head(folder / "eagle3-deep", target, draft_vocab=64, layers=2),
            "eagle": write_eagle_head(folder / "eagle", target),
            "mtp": write_mtp_head(folder / "mtp", target)}


def tree_engine(target, method, head, tree=WIDE):  # noqa: ANN001
    return make_engine(str(target), {"method": method.split(",")[0], "model": str(head),
                                     "speculative_token_tree": tree}, dtype="float32")


@pytest.mark.parametrize("method", ["eagle3", "eagle3, two layers", "eagle", "mtp"])
@pytest.mark.parametrize("text", [WIDE, "[(0,), (1,), (0, 0), (0, 0, 0)]"])  # the second grows one node a level
def test_each_node_is_what_a_chain_through_it_drafts(target, heads, method, text):
    engine = tree_engine(target, method, heads[method], tree=text)
    proposer, lm, tree = engine.proposer, engine.target.lm, parse_token_tree(text, 64)
    want = {"hidden": proposer.needs_hidden, "aux_layers": tuple(proposer.aux_layers)}
    out = lm.forward(PROMPT, **want)
    context = [*PROMPT, int(out.logits[-1].argmax())]
    proposer.observe(PROMPT, 0, out)
    draft = proposer.propose(context, len(tree), SamplingParams(), None)
    assert len(draft.token_ids) == len(tree) and draft.probs is None
    node_of = {node: i + 1 for i, node in enumerate(tree)}
    assert draft.parents == [node_of.get(node[:-1], 0) for node in tree]
    for node in tree:  # the chain of the node's ranks, drafted one step at a time on a fresh head
        chain = proposer.fork()
        chain.observe(PROMPT, 0, out)
        tokens = list(context)
        hidden, logits, _ = chain._depth_step(0, tokens, None)
        for depth, rank in enumerate(node):
            if depth:
                ids = torch.tensor(tokens[-1:], dtype=torch.long)
                hidden, rows = chain.modules[0](hidden[-1:], ids, chain._caches[0], last=True)
                logits = last_row(rows)
            tokens.append(int(widened(logits).topk(rank + 1).indices[rank]))
        assert draft.token_ids[node_of[node] - 1] == tokens[-1], node


@pytest.mark.parametrize("method", ["eagle3", "eagle3, two layers", "eagle", "mtp"])
def test_greedy_output_with_a_tree_equals_plain_decoding(target, heads, method):
    spec, plain = tree_engine(target, method, heads[method]), make_engine(str(target), None, dtype="float32")
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    for prompt in (PROMPT, [3], [9, 9, 9, 9, 9, 9, 9, 9]):
        assert spec.generate(prompt, params)[0].token_ids == plain.generate(prompt, params)[0].token_ids
    stats = spec.stats
    assert stats.drafts > 0 and len(stats.accepted_per_position) == 3  # the tree's depth


def test_sampled_output_with_a_tree_is_distributed_as_the_target(tmp_path):
    vocab = 12
    small = build_tiny_llama(tmp_path / "target", vocab_size=vocab, num_layers=4, seed=3)
    spec = tree_engine(small, "eagle3", write_eagle3_head(tmp_path / "head", small, draft_vocab=8, seed=1),
                       tree="[(0,), (1,), (0, 0)]")
    params = SamplingParams(max_tokens=4, temperature=1.0, ignore_eos=True)
    exact = second_token_marginal(spec.target.lm, [3, 4, 5], params)
    counts = torch.zeros(vocab)
    for seed in range(RUNS):
        out = spec.generate([3, 4, 5], SamplingParams(max_tokens=4, temperature=1.0, ignore_eos=True, seed=seed))
        counts[out[0].token_ids[1]] += 1
    stats = spec.stats
    assert 0 < stats.accepted_per_position[0] < stats.drafts, "both acceptance and rejection must occur"
    assert chi2(counts, exact) < chi2_critical(int((exact > 0).sum()) - 1)
    assert tv(counts, exact) < 0.08


def test_a_tree_near_max_tokens_drafts_its_first_nodes_only(target, heads):
    spec = tree_engine(target, "eagle3", heads["eagle3"])
    plain = make_engine(str(target), None, dtype="float32")
    for n in (1, 2, 3):
        params = SamplingParams(max_tokens=n, ignore_eos=True)
        assert spec.generate(PROMPT, params)[0].token_ids == plain.generate(PROMPT, params)[0].token_ids


def test_a_tree_on_an_mtp_head_of_two_modules_is_refused(target, tmp_path):
    head = write_mtp_head(tmp_path / "mtp2", target, modules=2)
    with pytest.raises(ConfigError, match="speculative_token_tree needs a head with one module.*has 2"):
        tree_engine(target, "mtp", head)
    chain = tree_engine(target, "mtp", head, tree="[(0,), (0, 0)]")  # a chain-shaped tree is a chain
    assert chain.proposer.tree is None


def test_a_tree_step_counts_every_node_drafted_and_one_position_per_depth(target, heads):
    engine = tree_engine(target, "eagle3", heads["eagle3"], tree="[(0,), (1,), (2,)]")
    stats = engine.generate(PROMPT, SamplingParams(max_tokens=40, ignore_eos=True))[0].stats
    assert stats.drafts > 0 and len(stats.accepted_per_position) == 1
    # Three nodes verified a step (fewer only in the last steps, where the room left to max_tokens trims the tree).
    assert 3 * stats.drafts - 4 <= stats.draft_tokens <= 3 * stats.drafts
    assert stats.accepted_tokens == stats.accepted_per_position[0]
