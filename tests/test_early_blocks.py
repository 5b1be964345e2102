"""An engine's model drops the layer matrices a GGUF's blocks hold before anything copies them
(early_blocks.py): aligning and fusing never see their float32 weights, the head's check still runs,
and a dropped matrix the kernel does not take is an error, not a null pointer."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from gguf_models import tiny_llama_gguf
from specsure.models import causal_lm as causal_lm_module
from specsure.models import float_kernel as float_kernels
from specsure.models.causal_lm import CausalLM
from specsure.models.early_blocks import drop_matched, native_float_kernel
from specsure.models.errors import ModelLoadError
from specsure.models.fused_layer import meta_weight
from specsure.models.gguf_blocks import FileBlocks
from specsure.models.loading import load_model

VOCAB = 300
NAMES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
         "mlp.down_proj")
TYPES = {**{f"blk.0.{n}.weight": "Q4_0" for n in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                                                  "ffn_down")},
         **{f"blk.1.{n}.weight": "Q8_0" for n in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up")}}
"""Every layer matrix in blocks but layer 1's down, which stays F32 in the file."""


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llama_gguf(tmp_path_factory.mktemp("early"), "early", TYPES, vocab=VOCAB)


@pytest.fixture(autouse=True)
def _setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv(float_kernels.AMX_ENV, "0")  # the rows' own bits, as test_gguf_blocks.py holds them
    monkeypatch.setattr(float_kernels, "_loaded", float_kernels._load())
    if float_kernels.load()[0] is None:
        pytest.skip("no float32 C kernel on this machine, so nothing reads blocks")


def _meta_when_aligned(monkeypatch: pytest.MonkeyPatch) -> dict[tuple[int, str], bool]:
    """Which layer matrices were meta tensors when `align_weights` (the first copy) ran."""
    seen: dict[tuple[int, str], bool] = {}
    align = causal_lm_module.align_weights

    def recording(hf: Any) -> None:
        for index, layer in enumerate(hf.base_model.layers):
            seen.update({(index, name): layer.get_submodule(name).weight.is_meta for name in NAMES})
        align(hf)

    monkeypatch.setattr(causal_lm_module, "align_weights", recording)
    return seen


def test_an_engine_never_copies_a_matrix_it_reads_as_blocks(gguf_file: Path, monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    kept = load_model(str(gguf_file), dtype="float32").lm
    seen = _meta_when_aligned(monkeypatch)
    with caplog.at_level(logging.INFO, logger="specsure.models.loading"):
        dropped = load_model(str(gguf_file), dtype="float32", release_weights=True).lm
    assert seen == {(i, n): (i, n) != (1, "mlp.down_proj") for i in (0, 1) for n in NAMES}
    served = [kept.hf.base_model.layers[i].get_submodule(n).weight for i in (0, 1) for n in NAMES
              if (i, n) != (1, "mlp.down_proj")]
    mib = (sum(w.numel() * 4 for w in served) + kept.hf.get_output_embeddings().weight.numel() * 4) / 2**20
    assert f"dropped the float32 copies of the matrices read as blocks ({mib:.0f} MiB)" in caplog.text
    assert dropped.blocks_used == kept.blocks_used
    prompt = [5, 17, 33, 90, 4, 12, 250, 8]
    assert torch.equal(dropped.forward(prompt, last_logits=1).logits, kept.forward(prompt, last_logits=1).logits)


def test_a_model_kept_for_transformers_drops_nothing_early(gguf_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _meta_when_aligned(monkeypatch)
    lm = load_model(str(gguf_file), dtype="float32").lm
    assert seen and not any(seen.values())
    ids = torch.tensor([[5, 6, 7]])
    assert lm.hf(ids).logits.shape == (1, 3, VOCAB)  # transformers' own forward still runs


class ScaledLogitsLlamaForCausalLM(LlamaForCausalLM):
    """A Llama whose forward scales its logits, as an architecture unknown to specsure might."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        out = super().forward(*args, **kwargs)
        out.logits = out.logits * 3.0
        return out


def _with_dropped_layers(hf: LlamaForCausalLM) -> LlamaForCausalLM:
    for layer in hf.model.layers:
        for name in NAMES:
            module = layer.get_submodule(name)
            module.weight = meta_weight(module.weight)
    return hf


def test_the_heads_check_runs_when_the_layers_are_dropped() -> None:
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(0)
    with pytest.raises(ModelLoadError, match="ScaledLogitsLlamaForCausalLM.*cannot decode this architecture"):
        CausalLM(_with_dropped_layers(ScaledLogitsLlamaForCausalLM(config).eval()))
    hf = _with_dropped_layers(LlamaForCausalLM(config).eval())
    CausalLM(hf)  # the same model without the scale passes
    assert "forward" not in vars(hf.model)  # its base model's own forward again


def test_a_dropped_matrix_the_kernel_does_not_take_is_an_error(gguf_file: Path) -> None:
    from specsure.models.loading import _file_blocks, _from_folder, weights_folder

    hf, _tokenizer = _from_folder(weights_folder(str(gguf_file)), torch.float32)
    blocks = _file_blocks(hf, gguf_file)
    assert isinstance(blocks, FileBlocks)
    kernel = native_float_kernel(hf)
    assert kernel is not None and drop_matched(hf, blocks, kernel) > 0
    lm = CausalLM(hf)
    blocks.layers[0]["o"] = None  # as if the file had changed since
    with pytest.raises(ModelLoadError, match=r"layer 0's o weights were dropped .* report this as a specsure bug"):
        lm.use_blocks(blocks)
