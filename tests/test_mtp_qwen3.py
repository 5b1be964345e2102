"""An MTP head on a Qwen3 target: its block is a Qwen3 layer, whose per-head q and k norms the
float32 C kernel must run as the torch path does (else its drafts go wrong, silently: the target
still verifies them)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from heads import write_mtp_head
from specsure import SamplingParams, make_engine
from specsure.models import float_kernel as float_kernels
from specsure.proposers.head_layer import HeadCache, last_row, widened
from tiny import random_model

VOCAB, HIDDEN, HEAD_DIM = 96, 32, 8


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    folder = tmp_path_factory.mktemp("qwen3-mtp") / "target"
    config = Qwen3Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=HEAD_DIM, max_position_embeddings=256,
                         bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    model = random_model(Qwen3ForCausalLM, config)
    with torch.no_grad():  # norms that are not all ones, so a skipped one shows
        for name, param in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                param.uniform_(0.5, 2.0)
    model.save_pretrained(folder)
    return folder


def _steps(module: torch.nn.Module) -> list[torch.Tensor]:
    """The module's logits for a 6-entry catch-up and then two one-row steps (the C kernel's, where it runs)."""
    gen = torch.Generator().manual_seed(1)
    features, ids = torch.randn(8, HIDDEN, generator=gen), torch.randint(3, VOCAB, (8,), generator=gen)
    cache, out = HeadCache(), []
    with torch.inference_mode():
        for lo, hi in ((0, 6), (6, 7), (7, 8)):
            out.append(widened(last_row(module(features[lo:hi], ids[lo:hi], cache, last=True)[1])))
    return out


def test_an_mtp_head_on_a_qwen3_target_runs_its_q_and_k_norms_in_c(target: Path, tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(7)
    norms = {f"layers.0.self_attn.{n}.weight": 0.5 + 1.5 * torch.rand(HEAD_DIM, generator=gen)
             for n in ("q_norm", "k_norm")}
    head = write_mtp_head(tmp_path / "head", target, seed=3, tensors=norms)
    spec = {"method": "mtp", "model": str(head), "num_speculative_tokens": 2}
    engine = make_engine(str(target), spec, dtype="float32")
    module = engine.proposer.modules[0]
    if float_kernels.load()[0] is None:
        pytest.skip("no float32 C kernel on this machine")
    assert engine.target.lm.path.startswith("native") and module._kernel is not None  # the C path
    in_c = _steps(module)
    module.use_kernel(None)  # every step on torch, the block's own Qwen3 layer
    for got, want in zip(in_c, _steps(module)):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    plain = make_engine(str(target), None, dtype="float32")
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    prompts = [[5, 17, 33, 60, 4], [40, 41, 42]]
    assert [c.token_ids for c in make_engine(str(target), spec, dtype="float32").generate(prompts, params)] == \
        [c.token_ids for c in plain.generate(prompts, params)]


def test_a_head_made_for_another_family_is_refused_in_the_files_own_names(target: Path, tmp_path: Path) -> None:
    from specsure.config import ConfigError

    llama_like = write_mtp_head(tmp_path / "head", target, seed=3)  # a Llama block: no q and k norms
    with pytest.raises(ConfigError) as err:
        make_engine(str(target), {"method": "mtp", "model": str(llama_like)}, dtype="float32")
    said = str(err.value)
    assert "missing tensors ['layers.0.self_attn.k_norm.weight', 'layers.0.self_attn.q_norm.weight']" in said, said
    assert "built as the target's own decoder layer (Qwen3DecoderLayer)" in said and "block." not in said
