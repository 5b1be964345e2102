"""Several sequences in one forward: each call gets what its own forward would give (float32)."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from specsure.models import CausalLM
from specsure.models.causal_lm import Call
from specsure.models.token_tree import TokenTree

SHAPE = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256)


def _lm(cls=LlamaForCausalLM, config=None, native: bool = True) -> CausalLM:
    torch.manual_seed(0)
    hf = cls(config or LlamaConfig(**SHAPE)).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.3)
    return CausalLM(hf, native=native)


def _ids(seed: int, n: int) -> list[int]:
    return torch.randint(0, SHAPE["vocab_size"], (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("native", [True, False], ids=["native", "transformers"])
def test_batched_calls_equal_their_own_forwards(native: bool) -> None:
    lm = _lm(native=native)
    prompts = [_ids(1, 11), _ids(2, 4), _ids(3, 7)]
    # Reference: each sequence alone, through the model's own cache.
    alone = []
    for prompt in prompts:
        lm.reset()
        first = lm.forward(prompt[:-3], last_logits=1)
        second = lm.forward(prompt[-3:], hidden=True, aux_layers=(0, 2))
        alone.append((first, second))
    views = [lm.fork() for _ in prompts]
    firsts = lm.forward_batch([Call(v, p[:-3], last_logits=1) for v, p in zip(views, prompts)])
    seconds = lm.forward_batch([Call(v, p[-3:]) for v, p in zip(views, prompts)], hidden=True, aux_layers=(0, 2))
    for (a1, a2), b1, b2, view, prompt in zip(alone, firsts, seconds, views, prompts):
        assert b1.logits.shape == (1, SHAPE["vocab_size"]) and b2.logits.shape == (3, SHAPE["vocab_size"])
        torch.testing.assert_close(b1.logits, a1.logits, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(b2.logits, a2.logits, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(b2.hidden, a2.hidden, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(b2.aux_hidden, a2.aux_hidden, atol=1e-4, rtol=1e-4)
        assert view.cache_len == len(prompt)


def test_views_roll_back_on_their_own_and_trees_batch_with_chains() -> None:
    lm = _lm(Qwen2ForCausalLM, Qwen2Config(**SHAPE, tie_word_embeddings=True))
    a, b = lm.fork(), lm.fork()
    pa, pb = _ids(4, 9), _ids(5, 6)
    lm.forward_batch([Call(a, pa), Call(b, pb)])
    a.crop(5)  # only a rolls back
    assert (a.cache_len, b.cache_len) == (5, 6)
    parents = [-1, 0, 0, 1]
    tree_tokens, chain_tokens = _ids(6, 4), _ids(7, 2)
    out_a, out_b = lm.forward_batch([Call(a, tree_tokens, tree=TokenTree.from_parents(parents)), Call(b, chain_tokens)])
    # The same, each alone, from fresh views fed the same kept prefixes.
    c, d = lm.fork(), lm.fork()
    c.forward(pa[:5])
    d.forward(pb)
    torch.testing.assert_close(out_a.logits, c.forward(tree_tokens, tree=TokenTree.from_parents(parents)).logits,
                               atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out_b.logits, d.forward(chain_tokens).logits, atol=1e-4, rtol=1e-4)
    a.keep(5, [0, 2])  # the tree's accepted path 0 -> 2 moves into place in a's cache only
    assert (a.cache_len, b.cache_len) == (7, 8)


def test_forward_batch_refuses_shared_views_and_foreign_models() -> None:
    lm, other = _lm(), _lm()
    view = lm.fork()
    with pytest.raises(ValueError, match="same view"):
        lm.forward_batch([Call(view, [1]), Call(view, [2])])
    with pytest.raises(ValueError, match="fork"):
        lm.forward_batch([Call(view, [1]), Call(other, [2])])
    too_long = [1] * (SHAPE["max_position_embeddings"] + 1)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        lm.forward_batch([Call(view, [1]), Call(lm.fork(), too_long)])
    assert view.cache_len == 0  # the checks run before anything is fed
