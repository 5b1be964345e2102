"""mtp: multi-token-prediction modules, inside the target (DeepSeek-V3 layout) or a standalone head.

A module's step (DeepSeek-V3): ``h' = block(eh_proj(concat(enorm(embed(token_{t+1})), hnorm(h_t))))``,
logits = ``shared_head.head(shared_head.norm(h'))``. The embedding comes first in the concat;
h_t is the target's last hidden state after its final norm (the previous module's h' for
module i > 0). The block is the target's own decoder-layer class, built from the target's config.

Where the modules are (docs/heads.md):
- inside the target: config ``num_nextn_predict_layers`` = M, module i stored as
  ``model.layers.{num_hidden_layers + i}.*``, read straight from the target's safetensors (the
  target's transformers class ignores them);
- a standalone folder: config.json ``"architectures": ["SpecsureMTPHead"]``, module i stored as
  ``layers.{i}.*`` with the same names.

Tensor names per module: ``enorm``, ``hnorm``, ``eh_proj`` [H, 2H], the block's own tensors
(``self_attn.*``, ``mlp.*``, ``input_layernorm``, ``post_attention_layernorm``),
``shared_head.norm``, and optionally ``shared_head.head`` and ``embed_tokens`` (the target's LM
head and embedding otherwise).
"""

from __future__ import annotations

import copy
import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch
from torch import nn

from specsure.config.checkpoint import int_field
from specsure.config.compat import check_head_fits, check_mtp_tensors, not_an_mtp_head, require_target_mtp
from specsure.config.detect import SPECSURE_MTP_HEAD, SPECSURE_MTP_MODEL_TYPE, deepseek_mtp_prefix
from specsure.config.errors import ConfigError
from specsure.models.decoder_family import rotary_dim
from specsure.models.float_kernel import AnyKernel
from specsure.models.gguf_blocks import q8_blocks, stack
from specsure.models.kernel import MAX_HEAD_DIM, ShapeStruct
from specsure.models.products import project
from specsure.models.rotary_table import RotaryTable
from specsure.proposers.head_blocks import (
    blocks_note, blocks_wanted, clear_linear_blocks, int8_wanted, product, use_linear_blocks, with_int8,
)
from specsure.proposers.head_chain import HeadChainProposer
from specsure.proposers.head_layer import (
    DraftRow, HeadCache, Logits, Rotary, ascends, commit_rows, kernel_ready, kernel_segment, use_cache_slots,
    use_row_kernel, widen,
)
from specsure.proposers.head_loading import (
    TensorFile, load_weights, read_head_config, vocab_map,
)

if TYPE_CHECKING:
    from specsure.config.resolution import Resolution
    from specsure.models.causal_lm import CausalLM
    from specsure.models.loading import LoadedModel

logger = logging.getLogger(__name__)

OWN = ("enorm.", "hnorm.", "eh_proj.", "shared_head.", "embed_tokens.")
"""Module-level tensor prefixes; everything else under a module's prefix belongs to its block."""
BLOCK_OVERRIDES = ("intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps")
"""Fields a standalone head's config.json may set to shape its block differently from the target's layers."""


class MTPModule(nn.Module):
    """One MTP module: the two input norms, eh_proj, a transformer block and the shared-head norm."""

    def __init__(self, target_base: nn.Module, block_config: Any, own_embed: bool, own_head: bool) -> None:
        super().__init__()
        hidden, vocab = block_config.hidden_size, block_config.vocab_size
        eps = getattr(block_config, "rms_norm_eps", 1e-6)
        norm_cls: Callable[..., nn.Module] = type(target_base.norm)
        self.enorm, self.hnorm = norm_cls(hidden, eps=eps), norm_cls(hidden, eps=eps)
        self.eh_proj = nn.Linear(2 * hidden, hidden, bias=False)
        last = len(target_base.layers) - 1  # built as the target's last layer kind (dense or MoE, full or sliding)
        self.block = type(target_base.layers[last])(block_config, layer_idx=last)
        self.shared_head = nn.Module()
        self.shared_head.norm = norm_cls(hidden, eps=eps)
        if own_head:
            self.shared_head.head = nn.Linear(hidden, vocab, bias=False)
        if own_embed:
            self.embed_tokens = nn.Embedding(vocab, hidden)
        self._kernel: AnyKernel | None = None
        self.draft_ids: torch.Tensor | None = None
        """[Vd] ascending target ids the engine drafts among (None: the whole vocabulary)."""
        self._draft_logits: Callable[[torch.Tensor], torch.Tensor] | None = None
        self._float_draft_logits: Callable[[torch.Tensor], torch.Tensor] | None = None

    def attach(self, target: "CausalLM", rotary: Rotary, draft_ids: torch.Tensor | None = None) -> None:
        """Wire the target's shared parts; with ``draft_ids`` (ascending target ids) inference drafts
        among those tokens only."""
        self.target, self.rotary = target, rotary
        self.draft_ids, self._draft_logits = draft_ids, None
        self._ascending = ascends(draft_ids)
        if draft_ids is not None:
            own = getattr(self.shared_head, "head", None)
            if own is None:
                self._draft_logits = target.draft_head(draft_ids)
            else:
                weight = own.weight[draft_ids].contiguous()  # [Vd, H], gathered once
                self._draft_logits = lambda normed: project(normed, weight).float()
        self._float_draft_logits = self._draft_logits
        use_cache_slots([self.block])

    def use_kernel(self, kernel: AnyKernel | None) -> bool:
        """Run inference steps on ``kernel`` (the target's, so the target's family runs on the C path,
        and the block is its layer class: the bf16 one or the float32 one) where the
        block is a dense layer in the kernel's dtype; returns whether it will. The arithmetic is
        `entries`' (in bf16 rounded at the same points), in a few C calls instead of some sixty small
        torch ops."""
        clear_linear_blocks(self)  # blocks are a snapshot of the weights `use_blocks` saw
        self._draft_logits = self._float_draft_logits
        block = self.block
        attn, mlp = getattr(block, "self_attn", None), getattr(block, "mlp", None)
        dim = getattr(attn, "head_dim", None)
        if (kernel is None or self.eh_proj.weight.dtype != kernel.dtype
                or hasattr(block, "pre_feedforward_layernorm")  # a Gemma layer: its norms and GELU are the target's
                or not all(hasattr(mlp, p) for p in ("gate_proj", "up_proj", "down_proj"))
                or not all(hasattr(attn, p) for p in ("q_proj", "k_proj", "v_proj", "o_proj"))
                or not isinstance(dim, int) or dim > MAX_HEAD_DIM):
            self._kernel = None
            return False
        projections = [attn.q_proj, attn.k_proj, attn.v_proj]
        biases = [p.bias for p in projections]
        with torch.no_grad():
            self._weights = {  # kept alive here: the struct holds their addresses
                "input_norm": block.input_layernorm.weight, "post_norm": block.post_attention_layernorm.weight,
                "qkv": torch.cat([p.weight for p in projections]).contiguous(),
                "qkv_bias": torch.cat(biases).contiguous() if all(b is not None for b in biases) else None,
                "o": attn.o_proj.weight, "o_bias": attn.o_proj.bias,
                "gate_up": torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).contiguous(),
                "down": mlp.down_proj.weight}
        fields = dict(kernel.layer_struct._fields_)
        norms = {n: getattr(attn, n).weight for n in ("q_norm", "k_norm") if getattr(attn, n, None) is not None}
        self._weights.update(norms)
        if any(b is not None for b in biases) and self._weights["qkv_bias"] is None:
            self._kernel = None
            return False
        self._layer = (kernel.layer_struct * 1)()
        for name, tensor in self._weights.items():
            setattr(self._layer[0], name, None if tensor is None else tensor.data_ptr())
        config = attn.config
        turned = rotary_dim(config, dim)  # the target's RoPE, which the block shares (Phi-4-mini's turns 3/4)
        self._shape = ShapeStruct(self.eh_proj.out_features, int(config.num_attention_heads),
                                  int(config.num_key_value_heads), dim, mlp.down_proj.in_features,
                                  float(block.input_layernorm.variance_epsilon), 0.0, 0.0,
                                  turned if turned != dim else 0)
        self._kernel = kernel
        return True

    def use_blocks(self, int8: bool = False) -> int:
        """Have the kernel read the module's weight matrices as Q8_0 blocks (head_blocks.py), with int8
        activations if ``int8``; after `use_kernel` returned True. Returns how many of its matrices it
        reads so."""
        own, kernel = getattr(self.shared_head, "head", None), self._kernel
        gathered = own is not None and self.draft_ids is not None  # drafting reads its draft-vocabulary rows only
        # eh_proj, an own head, and the block's projections for its torch path (a first call, tree levels)
        count = use_linear_blocks(self, skip=(own,) if gathered else ())
        int8 = int8 and kernel is not None
        if int8 and own is None and self.draft_ids is not None:  # the target's head's draft rows, packed too
            self._draft_logits = self.target.draft_head(self.draft_ids, int8_activations=True)
        if gathered and kernel is not None:
            rows = q8_blocks(own.weight[self.draft_ids].contiguous())
            if rows is not None:
                rows = kernel.prepared(rows, True) if int8 else rows  # type: ignore[union-attr]
                self._draft_logits = lambda normed: kernel.linear_blocks(rows, normed.contiguous())  # type: ignore[union-attr]
                count += 1
        attn, mlp = self.block.self_attn, self.block.mlp
        # The kernel's fused matrices, from the projections' blocks: a block is one row's 32 weights,
        # so stacking rows gives the blocks of the fused rows without quantising them again.
        fused = [stack([attn.q_proj.blocks, attn.k_proj.blocks, attn.v_proj.blocks]), attn.o_proj.blocks,
                 stack([mlp.gate_proj.blocks, mlp.up_proj.blocks]), mlp.down_proj.blocks]
        if int8:
            fused = with_int8(self, kernel, fused)  # type: ignore[arg-type]
        self._blocks = dict(zip(("qkv", "o", "gate_up", "down"), fused))
        for name, matrix in self._blocks.items():
            if matrix is not None:
                setattr(self._layer[0], name, matrix.data.data_ptr())
                setattr(self._layer[0], f"{name}_format", matrix.format)
        return count

    def forward(self, features: torch.Tensor, token_ids: torch.Tensor, cache: HeadCache,
                last: bool = False) -> tuple[torch.Tensor, Logits]:
        n = token_ids.shape[0]
        if self._kernel is not None and features.dtype == self._kernel.dtype and kernel_ready(cache, n):
            return self._kernel_forward(features, token_ids, cache, last)
        out = self.entries(features, token_ids, cache.positions(n), cache.mask(n, self.eh_proj.weight.dtype), cache.kv,
                           last, draft=True)
        cache.advance(n)
        return out

    def entries(self, features: torch.Tensor, token_ids: torch.Tensor, positions: torch.Tensor,
                mask: torch.Tensor | None, kv: Any, last: bool = False,
                first_row: int = 0, draft: bool = False,
                head: Callable[[torch.Tensor], torch.Tensor] | None = None) -> tuple[torch.Tensor, Logits]:
        """`forward` with explicit positions [1, n], additive mask [1, 1, n, past + n] and transformers cache:
        what training uses to lay out unrolled draft steps as the engine runs them. Logits only for
        rows from ``first_row`` on (training scores no earlier row); over the whole vocabulary unless
        ``draft`` (inference) and the head has a draft vocabulary. ``head`` replaces the LM head
        (post-norm rows -> logits): a trainer's differentiable draft-vocabulary head. With ``last`` and
        ``draft`` and a draft vocabulary, a `DraftRow`."""
        h = features[None].to(self.eh_proj.weight.dtype)  # [1, n, H]
        embed = self.embed_tokens(token_ids) if hasattr(self, "embed_tokens") else self.target.embed(token_ids)
        x = self.eh_proj(torch.cat([self.enorm(embed[None].to(h.dtype)), self.hnorm(h)], dim=-1))
        x = self.block(x, attention_mask=mask, position_ids=positions, cache=kv, use_cache=True,
                       position_embeddings=self.rotary(x, positions))  # [1, n, H], fed back before the norm
        normed = self.shared_head.norm(x[:, -1:] if last else x[:, first_row:])[0]
        return x[0], head(normed) if head is not None else self._logits(normed, draft, last)

    def _kernel_forward(self, features: torch.Tensor, token_ids: torch.Tensor, cache: HeadCache,
                        last: bool) -> tuple[torch.Tensor, Logits]:
        """`forward` on the C kernel: the block through `decode_rows` on the head's own cache."""
        kernel, shape = self._kernel, self._shape
        assert kernel is not None
        n, hidden = features.shape[0], shape.hidden
        embed = self.embed_tokens(token_ids) if hasattr(self, "embed_tokens") else self.target.embed(token_ids)
        e, g = (torch.empty(n, hidden, dtype=kernel.dtype) for _ in range(2))
        kernel.add_norm(embed.to(kernel.dtype).contiguous(), None, self.enorm.weight, e, self.enorm.variance_epsilon)
        kernel.add_norm(features.contiguous(), None, self.hnorm.weight, g, self.hnorm.variance_epsilon)
        x = product(kernel, self.eh_proj.weight, getattr(self.eh_proj, "blocks", None), torch.cat([e, g], dim=-1))
        cos, sin = self.rotary(x[None], cache.positions(n))
        kernel.decode_rows(shape, self._layer, 0, 1, kernel_segment(cache, n), 1, cos[0].contiguous(),
                           sin[0].contiguous(), x, kernel.rows_scratch(shape, n))
        commit_rows(cache, n)
        rows = x[-1:] if last else x
        normed = torch.empty_like(rows)
        kernel.add_norm(rows, None, self.shared_head.norm.weight, normed, self.shared_head.norm.variance_epsilon)
        return x, self._logits(normed, draft=True, last=last)

    def _logits(self, normed: torch.Tensor, draft: bool, last: bool = False) -> Logits:
        """Target-vocabulary logits [n, V]; with ``draft`` and a draft vocabulary, -inf outside it,
        or for the last row alone (``last``) a `DraftRow`."""
        if draft and self._draft_logits is not None:
            logits = self._draft_logits(normed)  # [n, Vd]
            if last:
                assert self.draft_ids is not None
                return DraftRow(logits[-1], self.draft_ids, self.target.vocab_size, self._ascending)
            return widen(logits, self.draft_ids, self.target.vocab_size)
        if hasattr(self.shared_head, "head"):
            return self.shared_head.head(normed).float()
        return self.target.lm_head_logits(normed)


class MTPProposer(HeadChainProposer):
    method = "mtp"
    needs_hidden = True

    def __init__(self, modules: list[MTPModule]) -> None:
        super().__init__(modules, lambda out: out.hidden)


def build(res: "Resolution", target: "LoadedModel", dtype: str) -> MTPProposer:
    assert res.config is not None
    lm = target.lm
    text_config = lm.hf.config.get_text_config(decoder=True)
    if res.config.model is None:
        key, modules = require_target_mtp(res.target)
        label, weights = target.path, TensorFile(target.path)
        # The loaded folder, not the checkpoint given: a GGUF target's converted copy drops the modules.
        check_mtp_tensors(weights.names, lm.num_layers, modules, holder=f"the weights in {label!r}",
                          declared=res.target.signal(key))
        prefixes = [deepseek_mtp_prefix(lm.num_layers, i) for i in range(modules)]
        block_config, where = copy.deepcopy(text_config), f"{res.target.config_file} {key}={modules}"
    else:
        label = res.config.model
        config = read_head_config(label)
        weights = TensorFile(label)
        prefixes, where = _standalone_prefixes(config, weights, label)
        check_head_fits("mtp", label, config, weights.names, hidden_size=lm.hidden_size, vocab_size=lm.vocab_size,
                        target=target.path)
        block_config = copy.deepcopy(text_config)
        for key in BLOCK_OVERRIDES:
            if key in config:
                setattr(block_config, key, config[key])
    base = lm.hf.base_model
    if not hasattr(base, "rotary_emb"):
        raise ConfigError(f"method 'mtp' supports targets with rotary position embeddings; {target.path!r} "
                          f"({type(lm.hf).__name__}) has none.")
    modules_out = [_load_module(weights, prefix, base, block_config, label, lm) for prefix in prefixes]
    draft_ids = None
    if res.config.model is not None:
        draft_vocab = int_field(config, "draft_vocab_size", lm.vocab_size)
        d2t = vocab_map(weights, {n: n for n in ("d2t", "t2d") if n in weights.names}, label, draft_vocab,
                        lm.vocab_size)
        draft_ids = None if d2t is None else torch.arange(d2t.shape[0]) + d2t.long()
    quantised = 0
    rotary = lm.rotary_table or RotaryTable(base.rotary_emb)  # the target's cos and sin, shared
    for module in modules_out:
        module.attach(lm, rotary, draft_ids)
        use_row_kernel(module, lm.row_kernel)
        if module.use_kernel(lm.row_kernel) and blocks_wanted(lm):
            quantised += module.use_blocks(int8_wanted(lm))
    logger.info("mtp: %d module(s) from %s (%s), drafting among %s tokens%s", len(modules_out), label, where,
                lm.vocab_size if draft_ids is None else int(draft_ids.numel()),
                blocks_note(quantised, lm))
    return MTPProposer(modules_out)


def _standalone_prefixes(config: dict[str, Any], weights: TensorFile, label: str) -> tuple[list[str], str]:
    archs = config.get("architectures") or []
    modules = int_field(config, "num_nextn_predict_layers", 1) or 1
    config_file = str(Path(label) / "config.json")
    if SPECSURE_MTP_HEAD in archs or config.get("model_type") == SPECSURE_MTP_MODEL_TYPE:
        return [f"layers.{i}." for i in range(modules)], f"{config_file} num_nextn_predict_layers={modules}"
    layers = int_field(config, "num_hidden_layers")
    if layers is not None and deepseek_mtp_prefix(layers, 0) + "eh_proj.weight" in weights.names:
        check_mtp_tensors(weights.names, layers, modules, holder=f"the weights in {label!r}",
                          declared=f"{config_file} num_nextn_predict_layers={modules}")
        return ([deepseek_mtp_prefix(layers, i) for i in range(modules)],
                f"{config_file} num_nextn_predict_layers={modules} (DeepSeek-V3 layout)")
    raise not_an_mtp_head(label, archs)


def _load_module(weights: TensorFile, prefix: str, base: nn.Module, block_config: Any, label: str,
                 lm: "CausalLM") -> MTPModule:
    local = module_names(weights.names, prefix)
    with torch.device("meta"):
        module = MTPModule(base, block_config, "embed_tokens.weight" in local, "shared_head.head.weight" in local)
    tensors = weights.read(local.values())
    by_name = fuse_experts({k: tensors[n] for k, n in local.items()}, set(module.state_dict()), f"{label} ({prefix}*)")
    layer = type(module.block).__name__
    # the file's own names in the error; the block's tensors are those of the target's decoder layer
    # class (a Qwen3 layer has q and k norms, a Qwen2 one q/k/v biases), which a head made for
    # another family lacks
    load_weights(module, by_name, f"{label} ({prefix}*)", lm.dtype,
                 spell=lambda n: prefix + (n[len("block."):] if n.startswith("block.") else n),
                 fix=f"Its block is built as the target's own decoder layer ({layer}) and needs that layer's "
                     "tensors: give a head made for this target, and check that the method matches the "
                     "checkpoint's format.")
    return module


def module_names(names: frozenset[str], prefix: str) -> dict[str, str]:
    """The file's tensors under ``prefix`` (one module), keyed by `MTPModule`'s own names: the block's
    tensors gain ``block.``, the module-level ones (`OWN`) keep theirs."""
    local = {n[len(prefix):]: n for n in names if n.startswith(prefix)}
    return {(k if k.startswith(OWN) else "block." + k): n for k, n in local.items()}


_EXPERT = re.compile(r"^(?P<prefix>.+\.experts)\.(?P<index>\d+)\.(?P<part>gate|up|down)_proj\.weight$")


def fuse_experts(tensors: dict[str, torch.Tensor], expected: set[str], checkpoint: str) -> dict[str, torch.Tensor]:
    """Per-expert MoE tensors, stacked the way the block's own class holds them.

    The public DeepSeek-V3 layout stores ``experts.{i}.{gate,up,down}_proj.weight``; transformers
    5 fuses them when it loads the main layers (``gate_up_proj`` [E, 2I, H]: each expert's gate
    rows then its up rows; ``down_proj`` [E, H, I]). The MTP layers are read here, so they are
    fused here the same way, for every experts module whose fused tensors the block expects.
    """
    groups: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    out: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        match = _EXPERT.match(name)
        if match is None or f"{match['prefix']}.gate_up_proj" not in expected:
            out[name] = tensor
            continue
        groups.setdefault(match["prefix"], {}).setdefault(int(match["index"]), {})[match["part"]] = tensor
    for prefix, experts in groups.items():
        ids = sorted(experts)
        incomplete = [i for i in ids if set(experts[i]) != {"gate", "up", "down"}]
        if ids != list(range(len(ids))) or incomplete:
            raise ConfigError(f"draft head {checkpoint!r}: the experts under {prefix!r} are incomplete (experts {ids}, "
                              f"missing projections in {incomplete}); every expert needs gate_proj, up_proj and "
                              "down_proj weights.")
        out[f"{prefix}.gate_up_proj"] = torch.stack([torch.cat([experts[i]["gate"], experts[i]["up"]]) for i in ids])
        out[f"{prefix}.down_proj"] = torch.stack([experts[i]["down"] for i in ids])
    return out
