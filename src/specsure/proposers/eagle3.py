"""eagle3: an EAGLE-3 head drafting from three fused target layers.

Checkpoint layout (LlamaForCausalLMEagle3 / Eagle3LlamaForCausalLM, as SpecForge, the EAGLE
repository and vLLM use it; ``layers.0.`` is accepted for ``midlayer.``, as vLLM accepts it):

- ``fc.weight`` [H, 3 * target_hidden]: fuses the residual-stream inputs of the aux layers;
  applied to target features only (the first draft step).
- ``midlayer.*``: one Llama decoder layer whose q/k/v take
  ``concat(input_layernorm(embed(tok)), hidden_norm(g))`` (2H wide), plus ``hidden_norm``.
- ``norm.weight``, ``lm_head.weight`` [draft_vocab_size, H]: its own final norm and LM head.
- ``d2t`` [draft_vocab_size]: target id = draft id + d2t[draft id]; ``t2d`` [vocab] a bool mask.
  Both are absent when the draft vocabulary is the target's.
- ``embed_tokens.weight``: optional; the target's embedding is used when absent.
- ``input_norm.weight`` [3 * target_hidden] (``norm_before_fc``) and ``fc_norm.{i}.weight``
  (``fc_norm``, one per aux layer): optional RMSNorms before ``fc``, in vLLM's order.

Later draft steps feed back the layer's output before ``norm`` (after it with ``norm_output``).
A speculators-format head is read through the config vLLM flattens it to (config/speculators.py).
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any, Collection, Mapping

import torch
from torch import nn
from transformers import LlamaConfig, Qwen3Config
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding
from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer

from specsure.config.checkpoint import int_field
from specsure.config.compat import (
    aux_layer_ids, check_head_fits, check_head_tensors, check_speculators_head, declared_aux_layers,
    shadowed_aux_layers,
)
from specsure.config.errors import ConfigError
from specsure.config.speculators import check_head_config, file_key
from specsure.models.transformers_model import FINAL_NORMS
from specsure.models.float_kernel import AnyKernel
from specsure.models.gguf_blocks import stack
from specsure.models.kernel import MAX_HEAD_DIM, ShapeStruct
from specsure.models.rotary_table import RotaryTable
from specsure.proposers.head_blocks import (
    blocks_note, blocks_wanted, clear_linear_blocks, int8_wanted, product, use_linear_blocks, with_int8,
)
from specsure.proposers.head_chain import HeadChainProposer
from specsure.proposers.head_layer import (
    DraftRow, HeadCache, Logits, ascends, attend, commit_rows, kernel_ready, kernel_segment, use_row_kernel, widen,
)
from specsure.proposers.head_loading import (
    TensorFile, llama_config, load_weights, mismatch, read_head_config, vocab_map,
)

if TYPE_CHECKING:
    from specsure.config.resolution import Resolution
    from specsure.models.causal_lm import CausalLM
    from specsure.models.loading import LoadedModel

logger = logging.getLogger(__name__)

class Eagle3Module(nn.Module):
    """fc over the fused target layers, the 2H-wide midlayer, and the draft-vocabulary head."""

    def __init__(self, config: Any, fused_width: int, draft_vocab: int, own_embed: bool, own_head: bool,
                 layers: int = 1, qwen3: bool = False) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.fc = nn.Linear(fused_width, hidden, bias=False)
        # vLLM's Eagle3Qwen3ForCausalLM: the same head with Qwen3's layers (q_norm and k_norm per head)
        block = Qwen3DecoderLayer if qwen3 else LlamaDecoderLayer
        self.midlayer = block(config, layer_idx=0)
        if layers > 1:  # vLLM's and speculators' deeper heads: plain decoder layers on the stream after the first
            self.more = nn.ModuleList(block(config, layer_idx=i) for i in range(1, layers))
        attn, bias = self.midlayer.self_attn, config.attention_bias
        for name in ("q_proj", "k_proj", "v_proj"):
            old = getattr(attn, name)
            setattr(attn, name, nn.Linear(2 * hidden, old.out_features, bias=bias))
        self.midlayer.hidden_norm = LlamaRMSNorm(hidden, eps=eps)
        self.norm = LlamaRMSNorm(hidden, eps=eps)
        if own_head:
            self.lm_head = nn.Linear(hidden, draft_vocab, bias=False)
        if own_embed:
            self.embed_tokens = nn.Embedding(config.vocab_size, hidden)
        self.norm_before_residual = bool(getattr(config, "norm_before_residual", False))
        self.norm_output = bool(getattr(config, "norm_output", False))
        eagle = getattr(config, "eagle_config", None) or {}
        if bool(eagle.get("norm_before_fc", getattr(config, "norm_before_fc", False))):
            self.input_norm = LlamaRMSNorm(fused_width, eps=eps)
        if bool(getattr(config, "fc_norm", False)):
            part = int(getattr(config, "target_hidden_size", None) or hidden)
            self.fc_norm = nn.ModuleList(LlamaRMSNorm(part, eps=eps) for _ in range(fused_width // part))
        self._kernel: AnyKernel | None = None

    def attach(self, target: "CausalLM", config: Any, d2t: torch.Tensor | None) -> None:
        """Wire the parts that are not weights: rotary embedding, shared target parts, vocab map."""
        self.rotary = RotaryTable(LlamaRotaryEmbedding(config))  # a draft step looks its cos and sin up
        self.target = target
        self.vocab_size = target.vocab_size
        self.draft_to_target = None if d2t is None else torch.arange(d2t.shape[0]) + d2t.long()  # [Vd]
        self._ascending = ascends(self.draft_to_target)

    def features(self, aux_hidden: torch.Tensor) -> torch.Tensor:
        """g = fc(concat of the aux layers) [n, H]: applied to target features only; the optional
        norms first, as vLLM's combine_hidden_states applies them (the whole, then each part)."""
        x = aux_hidden.to(self.fc.weight.dtype)
        if hasattr(self, "input_norm"):
            x = self.input_norm(x)
        if hasattr(self, "fc_norm"):
            parts = x.chunk(len(self.fc_norm), dim=-1)
            x = torch.cat([norm(part) for norm, part in zip(self.fc_norm, parts)], dim=-1)
        return self.fc(x)

    def use_kernel(self, kernel: AnyKernel | None) -> bool:
        """Run inference steps of the midlayer on ``kernel`` (the target's: the bf16 one or the float32
        one) where the layer has no biases and the head is in the kernel's dtype;
        returns whether it will. The layer's arithmetic is the same as `forward`'s torch ops (in
        bf16 rounded at the same points), in a dozen C calls instead of some eighty small torch
        ops: the ops, not the weight reads, were half of a draft step's time."""
        clear_linear_blocks(self)  # blocks are a snapshot of the weights `use_blocks` saw
        self._qkv_blocks = self._gate_up_blocks = None
        layer = self.midlayer
        attn, mlp = layer.self_attn, layer.mlp
        linears = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        dim = getattr(attn, "head_dim", None)
        if (kernel is None or hasattr(self, "more") or hasattr(attn, "q_norm")  # one Llama layer only
                or any(p.bias is not None for p in linears)
                or self.fc.weight.dtype != kernel.dtype or not isinstance(dim, int) or dim > MAX_HEAD_DIM):
            self._kernel = None
            return False
        config = attn.config
        heads, kv_heads = int(config.num_attention_heads), int(config.num_key_value_heads)
        with torch.no_grad():
            self._qkv = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).contiguous()
            self._gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).contiguous()
        self._shape = ShapeStruct(self.fc.out_features, heads, kv_heads, dim, mlp.down_proj.in_features,
                                  float(layer.input_layernorm.variance_epsilon))
        self._kernel = kernel
        return True

    def use_blocks(self, int8: bool = False) -> int:
        """Have the kernel read the head's weight matrices as Q8_0 blocks (head_blocks.py), with int8
        activations if ``int8``; after `use_kernel` returned True. Returns how many of its matrices it
        reads so."""
        count = use_linear_blocks(self)  # fc, lm_head, and the projections for the torch path (a first call, tree levels)
        attn, mlp = self.midlayer.self_attn, self.midlayer.mlp  # the kernel's fused ones, from the parts' blocks
        fused = [stack([attn.q_proj.blocks, attn.k_proj.blocks, attn.v_proj.blocks]),
                 stack([mlp.gate_proj.blocks, mlp.up_proj.blocks])]
        if int8 and self._kernel is not None:
            fused = with_int8(self, self._kernel, fused)  # type: ignore[arg-type]
        self._qkv_blocks, self._gate_up_blocks = fused
        return count

    def forward(self, features: torch.Tensor, token_ids: torch.Tensor, cache: HeadCache,
                last: bool = False) -> tuple[torch.Tensor, Logits]:
        if self._kernel_can_run(features, cache):
            return self._kernel_forward(features, token_ids, cache, last)
        x = features[None]  # [1, n, H]
        embed = self.embed_tokens(token_ids) if hasattr(self, "embed_tokens") else self.target.embed(token_ids)
        layer = self.midlayer
        e = layer.input_layernorm(embed[None].to(x.dtype))  # [1, n, H]
        if self.norm_before_residual:
            g = layer.hidden_norm(x)
            residual = g
        else:
            residual, g = x, layer.hidden_norm(x)
        if not hasattr(self, "more"):
            h = residual + attend(layer.self_attn, torch.cat([e, g], dim=-1), cache, self.rotary, x)
            out = h + layer.mlp(layer.post_attention_layernorm(h))  # [1, n, H], fed back before the norm
        else:  # every layer writes its entries at the same positions; the cache advances once
            positions, mask = cache.positions(x.shape[1]), cache.mask(x.shape[1], x.dtype)
            rotary = self.rotary(x, positions)
            attended, _ = layer.self_attn(hidden_states=torch.cat([e, g], dim=-1), position_embeddings=rotary,
                                          attention_mask=mask, cache=cache.kv, position_ids=positions)
            h = residual + attended
            out = h + layer.mlp(layer.post_attention_layernorm(h))
            for block in self.more:
                out = block(out, attention_mask=mask, position_ids=positions, cache=cache.kv, use_cache=True,
                            position_embeddings=rotary)
            cache.advance(x.shape[1])
        if self.norm_output:  # fed back after it
            normed = self.norm(out)
            return normed[0], self._logits(normed[0, -1:] if last else normed[0], last)
        return out[0], self._logits(self.norm(out[:, -1:] if last else out)[0], last)

    def _kernel_can_run(self, features: torch.Tensor, cache: HeadCache) -> bool:
        return (self._kernel is not None and features.dtype == self._kernel.dtype
                and kernel_ready(cache, features.shape[0]))

    def _kernel_forward(self, features: torch.Tensor, token_ids: torch.Tensor, cache: HeadCache,
                        last: bool) -> tuple[torch.Tensor, Logits]:
        """`forward` on the C kernel: the same steps (in bf16 each rounded where torch rounds it)."""
        kernel, layer, shape = self._kernel, self.midlayer, self._shape
        assert kernel is not None
        n, eps = features.shape[0], shape.eps
        embed = self.embed_tokens(token_ids) if hasattr(self, "embed_tokens") else self.target.embed(token_ids)
        x = features.contiguous().clone()  # [n, H]: the residual stream, updated in place
        e, g = torch.empty_like(x), torch.empty_like(x)
        kernel.add_norm(embed.to(x.dtype).contiguous(), None, layer.input_layernorm.weight, e, eps)
        kernel.add_norm(x, None, layer.hidden_norm.weight, g, eps)
        if self.norm_before_residual:
            x = g.clone()
        qkv = product(kernel, self._qkv, self._qkv_blocks, torch.cat([e, g], dim=-1))
        positions = cache.positions(n)
        cos, sin = self.rotary(x[None], positions)
        att = torch.empty(n, shape.heads * shape.head_dim, dtype=x.dtype)
        kernel.attend_rows(shape, kernel_segment(cache, n), 0, 1, qkv, cos[0].contiguous(), sin[0].contiguous(), att)
        commit_rows(cache, n)
        h = torch.empty_like(x)
        o, down = layer.self_attn.o_proj, layer.mlp.down_proj
        attended = product(kernel, o.weight, getattr(o, "blocks", None), att)
        kernel.add_norm(x, attended, layer.post_attention_layernorm.weight, h, eps)
        act = torch.empty(n, shape.intermediate, dtype=x.dtype)
        kernel.silu_mul(product(kernel, self._gate_up, self._gate_up_blocks, h), act)
        normed = torch.empty_like(x)
        mixed = product(kernel, down.weight, getattr(down, "blocks", None), act)
        kernel.add_norm(x, mixed, self.norm.weight, normed, eps)
        return normed if self.norm_output else x, self._logits(normed[-1:] if last else normed, last)

    def _logits(self, normed: torch.Tensor, last: bool = False) -> Logits:
        """Target-vocabulary logits [n, V]; tokens outside the draft vocabulary get -inf (for the
        last row alone, ``last``, a `DraftRow`)."""
        if not hasattr(self, "lm_head"):
            return self.target.lm_head_logits(normed)
        draft = self.lm_head(normed).float()  # [n, Vd]
        if self.draft_to_target is None:
            return draft
        if last:
            return DraftRow(draft[-1], self.draft_to_target, self.vocab_size, self._ascending)
        return widen(draft, self.draft_to_target, self.vocab_size)


class Eagle3Proposer(HeadChainProposer):
    method = "eagle3"

    def __init__(self, module: Eagle3Module, aux_layers: tuple[int, ...]) -> None:
        super().__init__([module], lambda out: module.features(out.aux_hidden))
        self.aux_layers = aux_layers
        self.module = module


VERIFIER_PARTS = ("verifier_norm.", "verifier_lm_head.")
QWEN3_ARCHITECTURE = "Eagle3Qwen3ForCausalLM"
"""vLLM builds a head that names it with Qwen3's decoder layers, whatever its model_type says."""


def canonical(name: str) -> str:
    """Checkpoint tensor name -> this module's name (EAGLE repo, SpecForge and vLLM spellings): layer 0
    is the midlayer, layers 1.. of a deeper head (vLLM's and speculators' ``layers.{i}.``) are ``more``."""
    if name.startswith("layers.0."):
        return "midlayer." + name.removeprefix("layers.0.")
    if (found := re.match(r"layers\.(\d+)\.(.*)", name)) and int(found.group(1)) > 0:
        return f"more.{int(found.group(1)) - 1}.{found.group(2)}"
    return name


def head_layers(path: str, config: Mapping[str, Any], names: Collection[str]) -> int:
    """How many decoder layers a head holds: its tensors' ``layers.{i}.`` (or midlayer alone), which
    must be numbered without gaps and agree with config.json's num_hidden_layers when it gives one."""
    found = sorted({int(m.group(1)) for n in names if (m := re.match(r"more\.(\d+)\.", n))})
    count = 1 + len(found)
    if found != list(range(len(found))):
        raise ConfigError(f"eagle3 draft head {path!r}: decoder layers {[0, *(i + 1 for i in found)]} found; a head "
                          "needs layers 0.. numbered without gaps (midlayer.* or layers.0.*, then layers.1.* ...).")
    declared = config.get("num_hidden_layers")
    if isinstance(declared, int) and not isinstance(declared, bool) and declared != count:
        raise ConfigError(f"eagle3 draft head {path!r}: {file_key(config, 'num_hidden_layers')} = {declared}, but its "
                          f"tensors hold {count} decoder layer(s); re-save the head with all of its layers, or fix "
                          "num_hidden_layers in its config.json.")
    return count


def build(res: "Resolution", target: "LoadedModel", dtype: str) -> Eagle3Proposer:
    assert res.config is not None and res.config.model is not None
    path = res.config.model
    config = read_head_config(path)
    check_speculators_head(path, config)
    check_head_config(config, f"{path}/config.json")
    weights = TensorFile(path)
    # The speculators library's trainer holds the verifier's norm and LM head; a head saved with them
    # still drafts with its own, so they are left unread.
    names = {canonical(n): n for n in weights.names if not n.startswith(VERIFIER_PARTS)}
    lm = target.lm
    check_head_tensors("eagle3", path, names, config)
    check_head_fits("eagle3", path, config, names, hidden_size=lm.hidden_size, vocab_size=lm.vocab_size,
                    target=target.path)
    vocab = int_field(config, "vocab_size", lm.vocab_size)
    own_embed = "embed_tokens.weight" in names
    draft_vocab = int_field(config, "draft_vocab_size", vocab)
    assert draft_vocab is not None and vocab is not None
    if draft_vocab > vocab:
        raise mismatch(path, "draft_vocab_size", draft_vocab, f"at most {vocab}", "the target's vocabulary")
    aux = aux_layer_ids(config, path, lm.num_layers)
    declared = declared_aux_layers(config)
    if lm.num_layers in aux and not lm.reads_last_output:
        field = (declared or ("aux layers", None))[0]
        raise ConfigError(f"eagle3 draft head {path!r}: {field} = {list(aux)} includes {lm.num_layers}, the target's "
                          f"last layer output before its final norm, and specsure cannot find that norm in "
                          f"{type(lm.hf.base_model).__name__} ({', '.join(FINAL_NORMS)}); this head cannot run on this "
                          "target here.")
    if shadowed := shadowed_aux_layers(config):
        logger.warning("eagle3 draft head %s: %s", path, shadowed)
    if declared and list(declared[1]) != list(aux):
        logger.warning("eagle3 draft head %s lists %s = %s; vLLM fuses the aux layers in ascending layer order, %s, "
                       "and so does specsure, so both run the head alike", path, declared[0], declared[1], list(aux))
    own_head = "lm_head.weight" in names
    if not own_head and draft_vocab != vocab:
        raise ConfigError(f"draft head {path!r}: draft_vocab_size = {draft_vocab} but there is no lm_head.weight.")
    if "d2t" in names and config.get("draft_vocab_size") is None:
        size = weights.read([names["d2t"]])[names["d2t"]].shape[0]
        raise ConfigError(f"eagle3 draft head {path!r}: its config.json gives no draft_vocab_size, but its d2t maps "
                          f"{size} draft ids; set \"draft_vocab_size\": {size} in the config.json.")
    d2t = vocab_map(weights, names, path, draft_vocab, vocab)
    wanted = {c: n for c, n in names.items() if c not in ("d2t", "t2d")}
    tensors = weights.read(wanted.values())
    fc_in = tensors[names["fc.weight"]].shape[-1] if "fc.weight" in names else None
    if fc_in is not None and fc_in != len(aux) * lm.hidden_size and fc_in % lm.hidden_size == 0:
        field = (declared or ("the default aux layers (2, N//2, N-3)", None))[0]
        raise ConfigError(f"eagle3 draft head {path!r}: its fc reads {fc_in // lm.hidden_size} target layers "
                          f"(fc.weight is [.., {fc_in}]), but {field} gives {len(aux)}: {list(aux)}; list the "
                          "layers the head was trained on in its config.json.")
    layers = head_layers(path, config, names)
    qwen3 = QWEN3_ARCHITECTURE in (config.get("architectures") or [])
    # vLLM builds the config from model_type (AutoConfig), whatever class the architectures name
    kind = Qwen3Config if config.get("model_type") == "qwen3" else LlamaConfig
    head_config = llama_config(config, f"{path}/config.json", kind,
                               num_hidden_layers=layers, vocab_size=vocab)
    types = getattr(head_config, "layer_types", None) or []
    if qwen3 and (sliding := [i for i, name in enumerate(types[:layers]) if name != "full_attention"]):
        raise ConfigError(f"eagle3 draft head {path!r}: its Qwen3 layer(s) {sliding} attend over a sliding window "
                          f"(layer_types, use_sliding_window), which specsure's head cache does not apply; give a head "
                          "whose layers attend fully.")
    with torch.device("meta"):
        module = Eagle3Module(head_config, len(aux) * lm.hidden_size, draft_vocab, own_embed, own_head, layers, qwen3)
    layer0 = "layers.0." if any(n.startswith("layers.0.") for n in names.values()) else "midlayer."

    def spell(name: str) -> str:  # as the file names it, or would
        if name in names:
            return names[name]
        if found := re.match(r"more\.(\d+)\.(.*)", name):
            return f"layers.{int(found.group(1)) + 1}.{found.group(2)}"
        return layer0 + name.removeprefix("midlayer.") if name.startswith("midlayer.") else name

    load_weights(module, {c: tensors[n] for c, n in wanted.items()}, path, lm.dtype, spell,
                 "Its tensors do not match its config.json (num_hidden_layers, norm_before_fc, fc_norm, "
                 "architectures, the aux layer count); re-save the head, or fix the config.")
    module.attach(lm, head_config, d2t)
    use_row_kernel(module, lm.row_kernel)
    quantised = module.use_blocks(int8_wanted(lm)) if module.use_kernel(lm.row_kernel) and blocks_wanted(lm) else 0
    logger.info("eagle3 head %s: hidden %s, %d decoder layer(s), draft vocab %d of %d, aux layers %s%s", path,
                head_config.hidden_size, layers, draft_vocab, vocab, aux,
                blocks_note(quantised, lm))
    return Eagle3Proposer(module, aux)
