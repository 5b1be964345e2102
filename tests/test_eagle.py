"""eagle: lossless drafting from EAGLE-1 heads in the public layouts, exact rollback, validation."""

from __future__ import annotations

import pytest
import torch
from checkpoints import silent, write_checkpoint
from heads import (
    assert_first_draft_is_pending_token,
    build_bigram_target, check_rollback, select, target_layer, write_eagle3_head, write_eagle_head,
)

from specsure import ConfigError, SamplingParams, make_engine, resolve
from specsure.sampling import probs_from_logits
from tiny import build_tiny_llama

PROMPT = [5, 6, 7, 8, 9]
GREEDY = SamplingParams(max_tokens=40, ignore_eos=True)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return build_tiny_llama(tmp_path_factory.mktemp("t") / "target", num_layers=2)


def eagle_engine(target, head, k=3):  # noqa: ANN001, ANN201
    return make_engine(str(target), {"method": "eagle", "model": str(head), "num_speculative_tokens": k},
                       dtype="float32")


def same_as_plain(target, spec) -> None:  # noqa: ANN001
    plain = make_engine(str(target), None, dtype="float32")
    for prompt in (PROMPT, [3], [9] * 8):
        assert spec.generate(prompt, GREEDY)[0].token_ids == plain.generate(prompt, GREEDY)[0].token_ids
    assert spec.speculative_method == "eagle" and spec.stats.draft_tokens >= spec.stats.drafts > 0


LAYOUTS = {
    "EAGLE repo files, declared LlamaForCausalLM": {"naming": "eagle"},
    "vLLM's layout, EagleLlamaForCausalLM, two layers": {"naming": "vllm", "arch": "EagleLlamaForCausalLM",
                                                          "layers": 2},
    "LlamaForCausalLMEagle": {"naming": "eagle", "arch": "LlamaForCausalLMEagle"},
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_greedy_output_equals_plain_decoding(target, tmp_path, layout):
    same_as_plain(target, eagle_engine(target, write_eagle_head(tmp_path / "head", target, **LAYOUTS[layout])))


@pytest.mark.parametrize("accepted", [0, 1, 3])
def test_rollback_is_exact(target, tmp_path, accepted):
    check_rollback(eagle_engine(target, write_eagle_head(tmp_path / "head", target), k=4), PROMPT, k=4,
                   accepted=accepted)


@pytest.mark.parametrize("k", [1, 4])
def test_a_head_copying_the_target_layer_is_always_accepted(tmp_path, k):
    """fc keeps the next token's embedding; the layer is the target's own. EAGLE-1 has no final norm,
    so its logits are the target's up to a positive scale (the target's norm weight is all ones)."""
    bigram = build_bigram_target(tmp_path / "bigram")
    copy = {"fc.weight": select(32, "embedding"), "fc.bias": torch.zeros(32), **target_layer(bigram, "layers.0.")}
    engine = eagle_engine(bigram, write_eagle_head(tmp_path / "copy", bigram, tensors=copy), k=k)
    same_as_plain(bigram, engine)
    assert engine.stats.accepted_tokens == engine.stats.draft_tokens, engine.stats


def test_the_first_feature_is_the_pending_tokens_position(target, tmp_path):
    """A head that passes h_t through predicts what the target predicts at t: the pending token."""
    passthrough = {"fc.weight": select(32, "hidden"), "fc.bias": torch.zeros(32),
                   **target_layer(target, "layers.0.")}
    passthrough["layers.0.self_attn.o_proj.weight"] = torch.zeros(32, 32)
    passthrough["layers.0.mlp.down_proj.weight"] = torch.zeros(32, 64)
    engine = eagle_engine(target, write_eagle_head(tmp_path / "pass", target, tensors=passthrough), k=2)
    assert_first_draft_is_pending_token(engine)


def test_sampled_drafts_carry_q_rows(target, tmp_path, monkeypatch):
    """q row i is the head's own logits for draft token i through the target's transform, so the
    verifier's p/q ratio is the right one; greedy drafts are point masses (q = None)."""
    engine = eagle_engine(target, write_eagle_head(tmp_path / "head", target), k=3)
    proposer, module = engine.proposer, engine.proposer.modules[0]
    drafts = []  # (Draft, the head's last-row logits of each module call that made it)
    calls: list[torch.Tensor] = []
    real_forward, real_propose = module.forward, proposer.propose

    def forward(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        hidden, logits = real_forward(*args, **kwargs)
        calls.append(logits[-1])  # every call drafts one token from its last row
        return hidden, logits

    def propose(*args):  # noqa: ANN002, ANN202
        calls.clear()
        draft = real_propose(*args)
        drafts.append((draft, list(calls)))
        return draft

    monkeypatch.setattr(module, "forward", forward)
    monkeypatch.setattr(proposer, "propose", propose)
    params = SamplingParams(max_tokens=20, temperature=0.8, top_k=40, seed=3, ignore_eos=True)
    out = engine.generate(PROMPT, params)[0]

    assert len(out.token_ids) == 20 and drafts
    assert sum(len(d.token_ids) for d, _ in drafts) == engine.stats.draft_tokens > 0
    for draft, logits in drafts:
        q = draft.probs
        assert q is not None and q.shape == (len(draft.token_ids), 128) and q.dtype == torch.float32
        assert len(logits) == len(draft.token_ids)
        assert (q >= 0).all() and torch.allclose(q.sum(-1), torch.ones(len(q)))
        assert ((q > 0).sum(-1) <= params.top_k).all()
        for row, token, row_logits in zip(q, draft.token_ids, logits):
            assert row[token] > 0, "drafted a token its own q rules out"
            assert torch.equal(row, probs_from_logits(row_logits[None], params)[0])

    drafts.clear()
    engine.generate(PROMPT, SamplingParams(max_tokens=12, ignore_eos=True))
    assert drafts and all(d.probs is None and d.token_ids for d, _ in drafts)


# --- the wrong format, and validation -------------------------------------------------------------

def test_eagle_on_an_eagle3_head_names_both_sides(tmp_path):
    target = build_tiny_llama(tmp_path / "t", num_layers=4)
    head = write_eagle3_head(tmp_path / "e3", target, draft_vocab=64)
    with pytest.raises(ConfigError, match=r"'eagle'.*EAGLE-1 head.*e3.*EAGLE-3 head"):
        eagle_engine(target, head)
    disguised = write_eagle3_head(tmp_path / "disguised", target, arch="LlamaForCausalLM")  # no d2t, midlayer.*
    with pytest.raises(ConfigError, match=r"'eagle'.*EAGLE-1 head.*disguised.*EAGLE-3 head"):
        eagle_engine(target, disguised)


def test_eagle_on_a_checkpoint_without_fc_names_both_sides(target, tmp_path):
    folder = write_checkpoint(tmp_path / "plain-one-layer", silent(vocab=128, hidden_size=32),
                              tensors=("layers.0.self_attn.q_proj.weight",))
    with pytest.raises(ConfigError, match=r"'eagle' needs an EAGLE-1 head.*plain-one-layer.*not an EAGLE-1 head"):
        eagle_engine(target, folder)


def test_validation_names_checkpoint_field_found_and_expected(target, tmp_path):
    wide = build_tiny_llama(tmp_path / "wide", hidden_size=48)
    with pytest.raises(ConfigError, match=r"'.*h48': hidden_size = 48.*needs 32"):
        eagle_engine(target, write_eagle_head(tmp_path / "h48", wide))
    small = build_tiny_llama(tmp_path / "small", vocab_size=100)
    with pytest.raises(ConfigError, match=r"v100.*vocab_size = 100.*needs 128"):
        eagle_engine(target, write_eagle_head(tmp_path / "v100", small, naming="vllm"))


def test_explain_says_the_head_was_recognised_by_its_fc_tensor(target, tmp_path):
    head = write_eagle_head(tmp_path / "some-draft", target)  # declares LlamaForCausalLM
    res = resolve({"model": str(head)}, model=str(target))
    assert res.config.method == "eagle" and res.source("method") == "checkpoint"
    assert "fc.weight" in res.reason("method") and str(head) in res.reason("method")
