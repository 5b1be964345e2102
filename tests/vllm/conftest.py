"""Shared setup for the real-vLLM checker tests (run by `make test-vllm` only).

Plain `pytest` does not collect this folder: pyproject's norecursedirs names it. The tests
need .venv-vllm (vllm==0.33.0), which `make test-vllm` creates.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 1000, "hidden_size": 64,
         "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "max_position_embeddings": 512}
EAGLE3 = {**LLAMA, "architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1, "draft_vocab_size": 500}
DEEPSEEK_V3 = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 1000,
               "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 4, "n_routed_experts": 4, "n_shared_experts": 1,
               "num_experts_per_tok": 2, "first_k_dense_replace": 1, "kv_lora_rank": 16, "q_lora_rank": 32,
               "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8, "max_position_embeddings": 512,
               "num_nextn_predict_layers": 1}

QWEN35 = {"architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", "vocab_size": 1000, "hidden_size": 64,
          "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 16, "max_position_embeddings": 512, "mtp_num_hidden_layers": 1,
          "layer_types": ["linear_attention", "full_attention"]}
# As the speculators library saves it: no top-level model_type (vLLM then reads it as "speculators").
SPECULATORS_EAGLE3 = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
                      "speculators_version": "0.3.0", "draft_vocab_size": 500, "norm_before_residual": True,
                      "transformer_layer_config": {**LLAMA, "num_hidden_layers": 1},
                      "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                             "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                             "verifier": {"name_or_path": "meta-llama/Llama-3.1-8B-Instruct",
                                                          "architectures": ["LlamaForCausalLM"]}}}

# name -> config.json; folder names are the point of these tests.
CHECKPOINTS = {
    "target": {**LLAMA, "num_hidden_layers": 4},
    "small-draft": LLAMA,
    "draft-n-predict-3": {**LLAMA, "n_predict": 3},
    "my-eagle-draft": LLAMA,
    "beagle-7b": LLAMA,
    "dsv3": DEEPSEEK_V3,
    "beagle-dsv3": DEEPSEEK_V3,
    "EAGLE3-LLaMA-head": EAGLE3,
    "head-three": EAGLE3,
    "qwen35-small": QWEN35,
    "spec-head": SPECULATORS_EAGLE3,
}


@pytest.fixture(scope="session")
def vllm_python() -> str:
    if not VLLM_PYTHON.is_file():
        pytest.fail(f"{VLLM_PYTHON} is missing; run `make test-vllm`, which creates it.")
    return str(VLLM_PYTHON)


@pytest.fixture(scope="session")
def ckpt(tmp_path_factory) -> dict[str, str]:
    """config.json-only checkpoints: vLLM's config resolution reads nothing else."""
    root = tmp_path_factory.mktemp("models")
    paths = {}
    for name, config in CHECKPOINTS.items():
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(config))
        paths[name] = str(root / name)
    return paths
