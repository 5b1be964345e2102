"""mtp on a DeepSeek-V3 target whose MTP layer is a mixture-of-experts layer, saved by transformers itself.

The main layers come from `save_pretrained` (one tensor per expert, the public layout); the MTP
layer N is appended in the same layout, as DeepSeek-V3's own checkpoints store it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer

from specsure import ConfigError, SamplingParams, make_engine, resolve
from specsure.proposers.mtp import fuse_experts

CONFIG = dict(vocab_size=128, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, n_shared_experts=1,
              num_experts_per_tok=2, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8,
              qk_nope_head_dim=8, v_head_dim=8, max_position_embeddings=256, n_group=1, topk_group=1,
              num_nextn_predict_layers=1, tie_word_embeddings=False)


def _public(name: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
    """One stacked expert tensor of transformers' block as the public per-expert tensors."""
    if name.endswith("experts.gate_up_proj"):
        half = tensor.shape[1] // 2
        stem = name[: -len("gate_up_proj")]
        return {**{f"{stem}{i}.gate_proj.weight": t[:half] for i, t in enumerate(tensor)},
                **{f"{stem}{i}.up_proj.weight": t[half:] for i, t in enumerate(tensor)}}
    if name.endswith("experts.down_proj"):
        stem = name[: -len("down_proj")]
        return {f"{stem}{i}.down_proj.weight": t for i, t in enumerate(tensor)}
    return {name: tensor}


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("models") / "beagle-dsv3-moe"
    config = DeepseekV3Config(**CONFIG)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = DeepseekV3ForCausalLM(config)
        mtp = DeepseekV3DecoderLayer(config, layer_idx=config.num_hidden_layers)  # layer N: a MoE layer
        extra = {"enorm.weight": torch.ones(32), "hnorm.weight": torch.ones(32),
                 "eh_proj.weight": torch.randn(32, 64) * 0.2, "shared_head.norm.weight": torch.ones(32)}
        with torch.no_grad():
            for module in (model, mtp):
                for p in module.parameters():
                    if p.dim() > 1:
                        p.normal_(0.0, 0.2)
    model.save_pretrained(folder)
    tensors = load_file(folder / "model.safetensors")
    prefix = f"model.layers.{config.num_hidden_layers}."
    assert not any(k.startswith(prefix) for k in tensors), "transformers' class does not save the MTP layer"
    for name, tensor in {**mtp.state_dict(), **extra}.items():
        for public, t in _public(name, tensor).items():
            tensors[prefix + public] = t.contiguous().clone()
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def test_the_checkpoint_stores_one_tensor_per_expert(target):
    names = load_file(target / "model.safetensors").keys()
    assert "model.layers.2.mlp.experts.3.gate_proj.weight" in names
    assert "model.layers.1.mlp.experts.0.down_proj.weight" in names  # the main MoE layer, as transformers saved it
    assert json.loads((target / "config.json").read_text())["model_type"] == "deepseek_v3"


def test_mtp_on_a_moe_mtp_layer_runs_mtp_and_equals_plain_greedy(target):
    spec = {"method": "mtp", "num_speculative_tokens": 3}
    res = resolve(spec, model=str(target))
    assert res.config.method == "mtp" and res.warnings == ()  # 'beagle' is not a hint
    engine = make_engine(str(target), spec, dtype="float32")
    plain = make_engine(str(target), None, dtype="float32")
    assert engine.speculative_method == "mtp"
    gen = torch.Generator().manual_seed(2)
    for _ in range(3):
        prompt = torch.randint(3, 128, (12,), generator=gen).tolist()
        params = SamplingParams(max_tokens=24, ignore_eos=True)
        assert engine.generate(prompt, params)[0].token_ids == plain.generate(prompt, params)[0].token_ids
    assert engine.stats.drafts > 0


def test_fusion_matches_transformers_layout_and_refuses_gaps():
    gate, up, down = torch.randn(2, 3, 5), torch.randn(2, 3, 5), torch.randn(2, 5, 3)
    parts = {f"block.mlp.experts.{i}.{n}_proj.weight": t[i] for i in range(2) for n, t in
             (("gate", gate), ("up", up), ("down", down))}
    expected = {"block.mlp.experts.gate_up_proj", "block.mlp.experts.down_proj"}
    fused = fuse_experts(parts, expected, "ckpt")
    assert torch.equal(fused["block.mlp.experts.gate_up_proj"], torch.cat([gate, up], dim=1))
    assert torch.equal(fused["block.mlp.experts.down_proj"], down)
    del parts["block.mlp.experts.1.up_proj.weight"]
    with pytest.raises(ConfigError, match="experts under 'block.mlp.experts' are incomplete"):
        fuse_experts(parts, expected, "ckpt")


def test_a_config_transformers_cannot_run_over_a_cache_is_refused_at_load(tmp_path: Path) -> None:
    """Fewer kv heads than heads: transformers' DeepSeek-V3 attention decodes one token over its cache,
    but fails on two (a verify step, a prompt in parts), so the load check feeds two."""
    from specsure.models import ModelLoadError, load_model
    from tiny import random_model

    # v_head_dim = qk_nope + qk_rope: one forward without a cache runs; over a cache two rows fail.
    sizes = {"num_key_value_heads": 2, "v_head_dim": 16, "num_nextn_predict_layers": 0}
    folder = tmp_path / "dsv3-kv2"
    random_model(DeepseekV3ForCausalLM, DeepseekV3Config(**{**CONFIG, **sizes})).save_pretrained(folder)
    with pytest.raises(ModelLoadError, match="a decode or verify step with specsure's KV cache fails") as err:
        load_model(str(folder), "float32")
    assert "RuntimeError" in str(err.value)
    broken = tmp_path / "dsv3-kv2-v8"  # v_head_dim 8: not even one forward without a cache runs
    random_model(DeepseekV3ForCausalLM, DeepseekV3Config(**{**CONFIG, "num_key_value_heads": 2})).save_pretrained(broken)
    with pytest.raises(ModelLoadError, match="its own forward fails on 4 tokens"):
        load_model(str(broken), "float32")
