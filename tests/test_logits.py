"""CausalLM decodes from the model's own distribution: the logits transforms that transformers'
*ForCausalLM.forward applies after the base model are reproduced, and an unknown one is refused
when the model is wrapped (that is, at load)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel

from specsure.models import logits as logits_module
from specsure.models.causal_lm import CausalLM
from specsure.models.logits import LogitsTransform
from specsure.models.errors import ModelLoadError

COMMON: dict[str, Any] = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
SOFTCAP = {"final_logit_softcapping": 2.0}
MOE = {"num_local_experts": 4, "num_experts_per_tok": 2}

# (transformers class prefix, config fields that make the transform non-trivial)
FAMILIES = [
    pytest.param("Gemma2", {**SOFTCAP, "head_dim": 8, "sliding_window": 16}, id="gemma2-softcap"),
    pytest.param("VaultGemma", {**SOFTCAP, "head_dim": 8}, id="vaultgemma-softcap"),
    pytest.param("NanoChat", SOFTCAP, id="nanochat-softcap"),
    pytest.param("Cohere", {"logit_scale": 0.5}, id="cohere-logit_scale"),
    pytest.param("Cohere2", {"logit_scale": 0.5, "sliding_window": 16}, id="cohere2-logit_scale"),
    pytest.param("Cohere2Moe", {"logit_scale": 0.5, "sliding_window": 16, "num_experts": 4,
                                "num_experts_per_tok": 2, "moe_intermediate_size": 16},
                 id="cohere2moe-logit_scale"),
    pytest.param("Granite", {"logits_scaling": 4.0}, id="granite-logits_scaling"),
    pytest.param("GraniteSWA", {"logits_scaling": 4.0, "sliding_window": 16}, id="graniteswa-logits_scaling"),
    pytest.param("GraniteMoe", {"logits_scaling": 4.0, **MOE}, id="granitemoe-logits_scaling"),
    pytest.param("GraniteMoeSWA", {"logits_scaling": 4.0, "sliding_window": 16, **MOE},
                 id="granitemoeswa-logits_scaling"),
    pytest.param("GraniteMoeShared", {"logits_scaling": 4.0, "shared_intermediate_size": 16, **MOE},
                 id="granitemoeshared-logits_scaling"),
    pytest.param("GraniteMoeHybrid", {"logits_scaling": 4.0, "mamba_n_heads": 4,
                                      "layer_types": ["attention", "attention"], **MOE},
                 id="granitemoehybrid-logits_scaling"),
    pytest.param("HyperCLOVAX", {"logits_scaling": 4.0}, id="hyperclovax-logits_scaling"),
    # MiniCPM3 derives logits_scaling = hidden_size / dim_model_base = 4 and divides the hidden state.
    pytest.param("MiniCPM3", {"num_key_value_heads": 4, "dim_model_base": 8, "q_lora_rank": 16,
                              "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8,
                              "v_head_dim": 8}, id="minicpm3-hidden-scaling"),
]
IDS = [3, 9, 17, 40, 5, 7, 63, 21]


def build(prefix: str, fields: dict[str, Any], cls: type[PreTrainedModel] | None = None) -> PreTrainedModel:
    """A random float32 `{prefix}ForCausalLM`, weights large enough that logits exceed a cap of 2."""
    config = getattr(transformers, f"{prefix}Config")(**{**COMMON, **fields})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        hf = (cls or getattr(transformers, f"{prefix}ForCausalLM"))(config).eval()
        with torch.no_grad():
            for param in hf.parameters():
                if param.dim() > 1:
                    param.normal_(0.0, 0.5)
    return hf


@pytest.mark.parametrize(("prefix", "fields"), FAMILIES)
def test_logits_match_the_models_own_forward(prefix: str, fields: dict[str, Any]) -> None:
    hf = build(prefix, fields)
    with torch.no_grad():
        expected = hf(torch.tensor([IDS])).logits[0].float()  # [n, vocab]
        raw = hf.get_output_embeddings()(hf.model(torch.tensor([IDS])).last_hidden_state[0])  # [n, vocab]
    # Otherwise the comparison below could not tell a reproduced transform from a skipped one.
    assert (raw - expected).abs().max() > 0.1, "the transform should change the logits in this test"
    lm = CausalLM(hf)
    assert lm.logits_transform != LogitsTransform()
    first = lm.forward(IDS[:3], hidden=True)  # fed in two parts, so the cache path is checked too
    rest = lm.forward(IDS[3:], hidden=True)
    got = torch.cat([first.logits, rest.logits])  # [n, vocab]
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-5)
    # Draft heads call the head alone on hidden states; it must apply the same transform.
    assert rest.hidden is not None
    torch.testing.assert_close(lm.lm_head_logits(rest.hidden), rest.logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("prefix", "fields"), [FAMILIES[0], FAMILIES[6], FAMILIES[-1]])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_rounding_is_not_refused(prefix: str, fields: dict[str, Any], dtype: torch.dtype) -> None:
    """The model rounds its transform in its own dtype, CausalLM in float32; that is no mismatch."""
    lm = CausalLM(build(prefix, fields).to(dtype))
    assert lm.dtype == dtype


def test_check_leaves_the_cache_empty() -> None:
    lm = CausalLM(build("Granite", {"logits_scaling": 4.0}))
    assert lm.cache_len == 0
    assert lm._cache.get_seq_length() == 0 and not lm._cache.layers, "the load check wrote into the KV cache"


class ScaledLogitsLlamaForCausalLM(LlamaForCausalLM):
    """A Llama whose forward scales its logits, as an architecture unknown to specsure might."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        out = super().forward(*args, **kwargs)
        out.logits = out.logits * 3.0
        return out


def test_unknown_logits_transform_is_refused() -> None:
    config = LlamaConfig(**COMMON)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        hf = ScaledLogitsLlamaForCausalLM(config).eval()
    with pytest.raises(ModelLoadError, match="ScaledLogitsLlamaForCausalLM.*cannot decode this architecture"):
        CausalLM(hf)
    CausalLM(LlamaForCausalLM(config))  # the same model without the scale loads


def test_family_missing_from_the_table_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without its entry, Granite's division is an unknown transform, and the check names the class."""
    hf = build("Granite", {"logits_scaling": 4.0})
    monkeypatch.delitem(logits_module._SCALED_HEADS, "granite")
    with pytest.raises(ModelLoadError, match="GraniteForCausalLM.*differ from its base model"):
        CausalLM(hf)

