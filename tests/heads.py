"""Tiny random draft heads in each public layout, written as config.json + safetensors.

The tensor names and shapes are spelled out here, independently of the proposers' modules, so a
test fails if a proposer expects a layout that public checkpoints do not have.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from tiny import build_tiny_llama

HEADS, KV_HEADS = 4, 2


def target_config(target: Path) -> dict[str, Any]:
    return json.loads((Path(target) / "config.json").read_text())


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _rand(gen: torch.Generator, *shape: int, std: float = 0.2) -> torch.Tensor:
    return torch.randn(*shape, generator=gen) * std


def block_tensors(prefix: str, hidden: int, gen: torch.Generator, *, qkv_in: int | None = None,
                  input_norm: bool = True) -> dict[str, torch.Tensor]:
    """One Llama decoder layer's tensors (4 heads, 2 KV heads, MLP 2H) under ``prefix``."""
    hd, qkv_in = hidden // HEADS, qkv_in or hidden
    out = {
        "self_attn.q_proj.weight": _rand(gen, HEADS * hd, qkv_in),
        "self_attn.k_proj.weight": _rand(gen, KV_HEADS * hd, qkv_in),
        "self_attn.v_proj.weight": _rand(gen, KV_HEADS * hd, qkv_in),
        "self_attn.o_proj.weight": _rand(gen, hidden, HEADS * hd),
        "mlp.gate_proj.weight": _rand(gen, 2 * hidden, hidden),
        "mlp.up_proj.weight": _rand(gen, 2 * hidden, hidden),
        "mlp.down_proj.weight": _rand(gen, hidden, 2 * hidden),
        "post_attention_layernorm.weight": 1 + _rand(gen, hidden, std=0.1),
    }
    if input_norm:
        out["input_layernorm.weight"] = 1 + _rand(gen, hidden, std=0.1)
    return {prefix + k: v for k, v in out.items()}


def rms(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm as Llama's and vLLM's layers compute it, for plain-torch references in tests."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _head_config(target: Path, arch: str, **extra: Any) -> dict[str, Any]:
    t = target_config(target)
    return {"architectures": [arch], "model_type": "llama", "num_hidden_layers": 1,
            "hidden_size": t["hidden_size"], "intermediate_size": 2 * t["hidden_size"],
            "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "vocab_size": t["vocab_size"],
            "rms_norm_eps": 1e-6, "max_position_embeddings": 512, "torch_dtype": "float32", **extra}


def _write(folder: Path, config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    return folder


def write_eagle3_head(folder: Path, target: Path, *, draft_vocab: int | None = None, layer_ids: list[int] | None = None,
                      seed: int = 0, naming: str = "midlayer", arch: str = "LlamaForCausalLMEagle3",
                      own_embed: bool = False, layers: int = 1, qwen3: bool = False, **extra: Any) -> Path:
    """An EAGLE-3 head: fc 3H->H, midlayer with 2H-wide q/k/v, norm, lm_head over draft_vocab, d2t/t2d.

    naming: "midlayer" (EAGLE / SpecForge) or "layers.0" (the spelling vLLM also accepts).
    draft_vocab None: the same vocabulary as the target, no d2t/t2d.
    layers > 1: plain decoder layers ``layers.{i}.*`` (H-wide q/k/v) after the first, as vLLM's and
    speculators' deeper heads store them.
    qwen3: Qwen3 decoder layers (``self_attn.q_norm`` and ``k_norm`` per head), as vLLM's
    Eagle3Qwen3ForCausalLM loads them.
    """
    t, gen = target_config(target), _gen(seed)
    hidden, vocab = t["hidden_size"], t["vocab_size"]
    layer = {"midlayer": "midlayer.", "layers.0": "layers.0."}[naming]
    tensors = {"fc.weight": _rand(gen, hidden, 3 * hidden), "norm.weight": 1 + _rand(gen, hidden, std=0.1),
               layer + "hidden_norm.weight": 1 + _rand(gen, hidden, std=0.1),
               **block_tensors(layer, hidden, gen, qkv_in=2 * hidden)}
    for i in range(1, layers):
        tensors.update(block_tensors(f"layers.{i}.", hidden, gen))
    if qwen3:
        for prefix in [layer, *(f"layers.{i}." for i in range(1, layers))]:
            for norm in ("q_norm", "k_norm"):
                tensors[f"{prefix}self_attn.{norm}.weight"] = 1 + _rand(gen, hidden // HEADS, std=0.3)
        arch = "Eagle3Qwen3ForCausalLM" if arch == "LlamaForCausalLMEagle3" else arch
        extra = {"model_type": "qwen3", "head_dim": hidden // HEADS, **extra}
    config = _head_config(target, arch, **{"num_hidden_layers": layers, **extra})
    dv = draft_vocab or vocab
    tensors["lm_head.weight"] = _rand(gen, dv, hidden, std=0.5)
    if draft_vocab is not None:
        config["draft_vocab_size"] = draft_vocab
        kept = torch.randperm(vocab, generator=gen)[:draft_vocab].sort().values
        tensors["d2t"] = kept - torch.arange(draft_vocab)
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[kept] = True
        tensors["t2d"] = t2d
    if own_embed:
        tensors["embed_tokens.weight"] = _rand(gen, vocab, hidden)
    if layer_ids is not None:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": layer_ids, "use_aux_hidden_state": True}
    return _write(folder, config, tensors)


def write_eagle_head(folder: Path, target: Path, *, seed: int = 0, naming: str = "eagle",
                     arch: str = "LlamaForCausalLM", layers: int = 1,
                     tensors: dict[str, torch.Tensor] | None = None) -> Path:
    """An EAGLE-1 head: fc over concat(embed, hidden) and decoder layers; no norm, no LM head.

    naming: "eagle" (the EAGLE repo's files: fc.weight and fc.bias, layers.N.* where layer 0
    keeps its unused input_layernorm, and a copy of embed_tokens) or "vllm" (what vLLM's
    EagleLlamaForCausalLM defines: fc without bias, no layer-0 input norm, no embed_tokens).
    Public EAGLE-1 heads often declare plain LlamaForCausalLM. ``tensors`` overrides by name.
    """
    t, gen = target_config(target), _gen(seed)
    hidden = t["hidden_size"]
    out = {"fc.weight": _rand(gen, hidden, 2 * hidden)}
    if naming == "eagle":
        out["fc.bias"] = _rand(gen, hidden, std=0.05)
        out["embed_tokens.weight"] = load_file(str(Path(target) / "model.safetensors"))["model.embed_tokens.weight"]
    for i in range(layers):
        out.update(block_tensors(f"layers.{i}.", hidden, gen, input_norm=i > 0 or naming == "eagle"))
    out.update(tensors or {})
    return _write(folder, _head_config(target, arch, num_hidden_layers=layers), out)


def mtp_tensors(prefix: str, hidden: int, vocab: int, gen: torch.Generator, *,
                own_head: bool = True) -> dict[str, torch.Tensor]:
    """One MTP module (DeepSeek-V3 names) under ``prefix``: enorm, hnorm, eh_proj, block, shared_head."""
    out = {"enorm.weight": 1 + _rand(gen, hidden, std=0.1), "hnorm.weight": 1 + _rand(gen, hidden, std=0.1),
           "eh_proj.weight": _rand(gen, hidden, 2 * hidden), "shared_head.norm.weight": 1 + _rand(gen, hidden, std=0.1),
           **block_tensors("", hidden, gen)}
    if own_head:
        out["shared_head.head.weight"] = _rand(gen, vocab, hidden)
    return {prefix + k: v for k, v in out.items()}


def build_mtp_target(folder: Path, *, modules: int = 1, num_layers: int = 2, seed: int = 0, own_head: bool = True,
                     **kwargs: Any) -> Path:
    """A tiny Llama target that declares num_nextn_predict_layers and stores the modules as
    model.layers.{num_layers + i}.* in its own safetensors (the DeepSeek-V3 layout)."""
    build_tiny_llama(folder, num_layers=num_layers, seed=seed,
                     extra_config={"num_nextn_predict_layers": modules}, **kwargs)
    t, gen = target_config(folder), _gen(seed + 1000)
    weights = Path(folder) / "model.safetensors"
    tensors = load_file(str(weights))
    for i in range(modules):
        tensors.update(mtp_tensors(f"model.layers.{num_layers + i}.", t["hidden_size"], t["vocab_size"], gen,
                                   own_head=own_head))
    save_file(tensors, str(weights), metadata={"format": "pt"})
    return Path(folder)


def write_mtp_head(folder: Path, target: Path, *, modules: int = 1, seed: int = 0,
                   tensors: dict[str, torch.Tensor] | None = None, **extra: Any) -> Path:
    """A standalone SpecsureMTPHead folder (docs/heads.md): layers.{i}.* with DeepSeek-V3 names."""
    t, gen = target_config(target), _gen(seed)
    out: dict[str, torch.Tensor] = {}
    for i in range(modules):
        out.update(mtp_tensors(f"layers.{i}.", t["hidden_size"], t["vocab_size"], gen, own_head=False))
    out.update(tensors or {})
    config = {"architectures": ["SpecsureMTPHead"], "model_type": "specsure_mtp", "num_nextn_predict_layers": modules,
              "num_hidden_layers": 1, "hidden_size": t["hidden_size"], "vocab_size": t["vocab_size"], **extra}
    return _write(folder, config, out)


# --- driving a head proposer by hand (rollback checks) -----------------------------------------

def check_rollback(engine, prompt: list[int], k: int, accepted: int = 1) -> None:  # noqa: ANN001
    """After a rejection, the head's next proposal equals a fresh head's fed the committed sequence.

    Drives the engine's target and proposer by hand: prefill, a k-token draft of which
    ``accepted`` tokens are kept and then a different (recovered) token, then a sampled proposal.
    A fresh run over the committed tokens must give the same draft tokens and the same q rows.
    """
    from specsure.sampling import SamplingParams

    lm, proposer = engine.target.lm, engine.proposer
    want = {"hidden": proposer.needs_hidden, "aux_layers": tuple(proposer.aux_layers)}
    sampled = SamplingParams(temperature=0.9, top_k=20)
    lm.reset()
    proposer.reset()
    out = lm.forward(prompt, **want)
    proposer.observe(prompt, 0, out)
    context = [*prompt, int(out.logits[-1].argmax())]
    first = proposer.propose(context, k, SamplingParams(), None)
    assert len(first.token_ids) == k
    start, fed = lm.cache_len, [context[-1], *first.token_ids]
    out = lm.forward(fed, **want)
    lm.crop(start + 1 + accepted)
    proposer.observe(fed[: 1 + accepted], start, out.rows(1 + accepted))
    recovered = (first.token_ids[accepted] + 1) % lm.vocab_size
    context = [*context, *first.token_ids[:accepted], recovered]
    after = proposer.propose(context, k, sampled, torch.Generator().manual_seed(7))

    lm.reset()
    proposer.reset()
    out = lm.forward(context[:-1], **want)
    proposer.observe(context[:-1], 0, out)
    fresh = proposer.propose(context, k, sampled, torch.Generator().manual_seed(7))
    assert after.token_ids == fresh.token_ids
    torch.testing.assert_close(after.probs, fresh.probs, atol=1e-5, rtol=1e-4)



# --- heads that copy the target's own computation (exact acceptance) ---------------------------

def build_bigram_target(folder: Path, *, vocab_size: int = 128, seed: int = 0) -> Path:
    """A one-layer Llama target whose next token depends on the current token only.

    Its attention output projection is zero, so position t's logits are a function of token t
    alone; its embedding rows have unit RMS, so an RMS norm with unit weight leaves them as they
    are. A head that copies this layer, fed token t+1, computes exactly the target's logits at
    t+1: every draft token it proposes is the target's greedy choice.
    """
    build_tiny_llama(folder, num_layers=1, vocab_size=vocab_size, seed=seed)
    weights = Path(folder) / "model.safetensors"
    tensors = load_file(str(weights))
    tensors["model.layers.0.self_attn.o_proj.weight"].zero_()
    embed = tensors["model.embed_tokens.weight"]
    tensors["model.embed_tokens.weight"] = embed / embed.pow(2).mean(-1, keepdim=True).sqrt()
    tensors.pop("lm_head.weight", None)  # tied: saved once
    save_file(tensors, str(weights), metadata={"format": "pt"})
    return Path(folder)


def target_layer(target: Path, prefix: str) -> dict[str, torch.Tensor]:
    """The target's layer 0 tensors, renamed under ``prefix``."""
    tensors = load_file(str(Path(target) / "model.safetensors"))
    layer = "model.layers.0."
    return {prefix + k[len(layer):]: v.clone() for k, v in tensors.items() if k.startswith(layer)}


def select(hidden: int, part: str) -> torch.Tensor:
    """[H, 2H] that keeps the first ("embedding") or second ("hidden") half of a concat."""
    eye, zero = torch.eye(hidden), torch.zeros(hidden, hidden)
    return torch.cat([eye, zero] if part == "embedding" else [zero, eye], dim=1)


def copy_mtp_module(target: Path, prefix: str) -> dict[str, torch.Tensor]:
    """An MTP module that is the bigram target's own layer on the next token's embedding."""
    hidden = target_config(target)["hidden_size"]
    return {prefix + "enorm.weight": torch.ones(hidden), prefix + "hnorm.weight": torch.ones(hidden),
            prefix + "eh_proj.weight": select(hidden, "embedding"),
            prefix + "shared_head.norm.weight": torch.ones(hidden), **target_layer(target, prefix)}


def add_mtp_modules(target: Path, modules: dict[str, torch.Tensor], count: int) -> Path:
    """Store MTP modules in the target's safetensors and declare them in its config.json."""
    weights = Path(target) / "model.safetensors"
    tensors = load_file(str(weights))
    tensors.update(modules)
    save_file(tensors, str(weights), metadata={"format": "pt"})
    config = target_config(target)
    config["num_nextn_predict_layers"] = count
    (Path(target) / "config.json").write_text(json.dumps(config, indent=2))
    return Path(target)


def assert_first_draft_is_pending_token(engine: Any, vocab: int = 128) -> None:
    """For a pass-through head (it keeps h_t and its block is the identity), the first draft must be
    what the target predicts at t: the pending token. A one-position feature shift would instead
    give the last prompt token's successor, which differs on at least half of these prompts."""
    from specsure import SamplingParams

    lm, proposer = engine.target.lm, engine.proposer
    discriminating = 0
    for length in range(2, 12):
        prompt = [(7 * i + 3) % vocab for i in range(length)]
        lm.reset()
        proposer.reset()
        out = lm.forward(prompt, hidden=True)
        proposer.observe(prompt, 0, out)
        pending = int(out.logits[-1].argmax())
        assert proposer.propose([*prompt, pending], 2, SamplingParams(), None).token_ids == [pending, pending]
        discriminating += int(out.logits[-2].argmax()) != pending
    assert discriminating >= 5


SPECULATORS_TOP = ("draft_vocab_size", "norm_before_residual", "norm_before_fc", "fc_norm", "norm_output",
                   "target_hidden_size", "eagle_aux_hidden_state_layer_ids")


def speculators_copy(head: Path, folder: Path, *, verifier: str = "meta-llama/Llama-3.1-8B-Instruct",
                     speculative_tokens: int = 3, drop: tuple[str, ...] = (), **top: Any) -> Path:
    """``head`` (an EAGLE-3 head in the EAGLE layout) rewritten as the speculators library saves it:
    ``layers.0.`` for ``midlayer.``, the layer's config under transformer_layer_config, the algorithm's
    fields at the top, and speculators_config naming the proposal method and the verifier. ``top``
    adds or overrides top-level keys; ``drop`` removes them (to test vLLM's defaults)."""
    config = json.loads((Path(head) / "config.json").read_text())
    tensors = load_file(str(Path(head) / "model.safetensors"))
    layer = {k: v for k, v in config.items() if k not in (*SPECULATORS_TOP, "architectures", "eagle_config")}
    out: dict[str, Any] = {
        "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "speculators_version": "0.3.0",
        "norm_before_residual": bool(config.get("norm_before_residual", False)),
        **{k: config[k] for k in SPECULATORS_TOP if k in config},
        "transformer_layer_config": layer,
        "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                               "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": speculative_tokens,
                                                     "verifier_accept_k": 1, "accept_tolerance": 0.0}],
                               "verifier": {"name_or_path": verifier, "architectures": ["LlamaForCausalLM"]}},
        **top,
    }
    ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if ids is not None:
        out["eagle_aux_hidden_state_layer_ids"] = ids
    for key in drop:
        out.pop(key, None)
    renamed = {("layers.0." + k.removeprefix("midlayer.")) if k.startswith("midlayer.") else k: v
               for k, v in tensors.items()}
    return _write(folder, out, renamed)
