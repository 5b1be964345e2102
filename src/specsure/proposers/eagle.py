"""eagle: an EAGLE-1 head drafting from the target's last hidden state.

Checkpoint layout (the EAGLE repository's files, which vLLM's EagleLlamaForCausalLM also loads):

- ``fc.weight`` [H, 2H] (``fc.bias`` optional): fc(concat(embed(token_{t+1}), h_t)), embedding
  first, h_t the target's last hidden state after its final norm.
- ``layers.{i}.*``: Llama decoder layers; layer 0 has no input norm (a stored
  ``layers.0.input_layernorm.weight`` is ignored, as EAGLE and vLLM ignore it).
- ``embedding_layernorm.weight`` / ``hidden_states_layernorm.weight``: optional (HASS variant,
  config ``add_para_norm``), applied to the two halves before fc.
- No final norm and no LM head: logits are the target's LM head applied to the layer output.
  A stored ``embed_tokens.weight`` / ``lm_head.weight`` is checked but not used: the target's
  embedding and LM head are.

Public EAGLE-1 heads often declare plain ``LlamaForCausalLM``; ``fc.weight`` identifies them.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

from specsure.config.checkpoint import int_field
from specsure.config.compat import check_head_fits, check_head_tensors, eagle_shares
from specsure.config.errors import ConfigError
from specsure.models.rotary_table import RotaryTable
from specsure.proposers.head_blocks import blocks_note, blocks_wanted, int8_wanted, use_linear_blocks, with_int8
from specsure.proposers.head_chain import HeadChainProposer
from specsure.proposers.head_layer import HeadCache, run_blocks, use_cache_slots, use_row_kernel
from specsure.proposers.head_loading import (
    TensorFile, check_equal, llama_config, load_weights, read_head_config,
)

if TYPE_CHECKING:
    from specsure.config.resolution import Resolution
    from specsure.models.causal_lm import CausalLM
    from specsure.models.loading import LoadedModel

logger = logging.getLogger(__name__)

IGNORED = ("layers.0.input_layernorm.weight", "embed_tokens.weight", "lm_head.weight")
"""Stored by some exports, unused by EAGLE-1 (the target's embedding and LM head are shared)."""


class EagleModule(nn.Module):
    """fc over concat(embedding, hidden) followed by decoder layers; the target's LM head."""

    def __init__(self, config: Any, num_layers: int, fc_bias: bool, para_norm: bool) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=fc_bias)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, layer_idx=i) for i in range(num_layers))
        self.layers[0].input_layernorm = nn.Identity()
        if para_norm:
            self.embedding_layernorm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
            self.hidden_states_layernorm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)

    def attach(self, target: "CausalLM", config: Any) -> None:
        self.rotary = RotaryTable(LlamaRotaryEmbedding(config))  # a draft step looks its cos and sin up
        self.target = target
        use_cache_slots(list(self.layers))

    def forward(self, features: torch.Tensor, token_ids: torch.Tensor, cache: HeadCache,
                last: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        h = features[None].to(self.fc.weight.dtype)  # [1, n, H]
        e = self.target.embed(token_ids)[None].to(h.dtype)  # [1, n, H]
        if hasattr(self, "embedding_layernorm"):
            e, h = self.embedding_layernorm(e), self.hidden_states_layernorm(h)
        x = run_blocks(self.layers, self.fc(torch.cat([e, h], dim=-1)), cache, self.rotary)  # [1, n, H]
        return x[0], self.target.lm_head_logits(x[0, -1:] if last else x[0])


class EagleProposer(HeadChainProposer):
    method = "eagle"
    needs_hidden = True

    def __init__(self, module: EagleModule) -> None:
        super().__init__([module], lambda out: out.hidden)


def build(res: "Resolution", target: "LoadedModel", dtype: str) -> EagleProposer:
    assert res.config is not None and res.config.model is not None
    path = res.config.model
    config = read_head_config(path)
    weights = TensorFile(path)
    names = {n: n for n in weights.names}
    lm = target.lm
    check_head_tensors("eagle", path, names, config)
    check_head_fits("eagle", path, config, names, hidden_size=lm.hidden_size, vocab_size=lm.vocab_size,
                    target=target.path)
    where = eagle_shares(target.path)
    if "embed_tokens.weight" in names:
        shape = list(weights.read([names["embed_tokens.weight"]])[names["embed_tokens.weight"]].shape)
        check_equal(path, "embed_tokens.weight shape", shape, [lm.vocab_size, lm.hidden_size], where)
    layer_ids = sorted({int(m.group(1)) for n in names if (m := re.match(r"layers\.(\d+)\.", n))})
    if not layer_ids or layer_ids != list(range(len(layer_ids))):
        raise ConfigError(f"draft head {path!r}: decoder layers {layer_ids} found; an EAGLE-1 head needs "
                          "layers.0.* (and layers 1.. numbered without gaps).")
    check_equal(path, "num_hidden_layers", int_field(config, "num_hidden_layers"), len(layer_ids),
                "the layers.* tensors it stores")
    head_config = llama_config(config, f"{path}/config.json", num_hidden_layers=len(layer_ids))
    with torch.device("meta"):
        module = EagleModule(head_config, len(layer_ids), "fc.bias" in names, "embedding_layernorm.weight" in names)
    wanted = {c: n for c, n in names.items() if c not in IGNORED}
    tensors = weights.read(wanted.values())
    load_weights(module, {c: tensors[n] for c, n in wanted.items()}, path, lm.dtype)
    module.attach(lm, head_config)
    use_row_kernel(module, lm.row_kernel)  # few-row products: project in float32, the C kernel's in bf16
    quantised = use_linear_blocks(module) if blocks_wanted(lm) else 0
    if quantised and int8_wanted(lm):
        with_int8(module, lm.row_kernel, [])  # type: ignore[arg-type]
    logger.info("eagle head %s: %d decoder layer(s), fc bias %s%s", path, len(layer_ids), "fc.bias" in names,
                blocks_note(quantised, lm))
    return EagleProposer(module)
