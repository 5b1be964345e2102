"""Fake checkpoints for config tests: config.json plus a tiny, valid safetensors file.

Nothing here needs torch. The safetensors file holds one float32 scalar per tensor name, so
its header is real and the config layer can read tensor names from it; no model can load
from it, and none needs to: `specsure.config` reads metadata only.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, Iterable, Mapping

from specsure.config.detect import EAGLE3_ARCHITECTURES, EAGLE_ARCHITECTURES, MTP_HEAD_ARCHITECTURES

VOCAB = 49152
"""The default model's vocabulary size (SmolLM2); drafts share it unless a test says otherwise."""


def write_safetensors(path: Path, names: Iterable[str]) -> Path:
    """A valid safetensors file with one F32 [1] tensor per name (all zeros)."""
    names = sorted(set(names)) or ["lm_head.weight"]
    header = {name: {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]}
              for i, name in enumerate(names)}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header to 8 bytes with spaces
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(4 * len(names)))
    return path


def write_checkpoint(folder: Path, config: Mapping[str, Any] | str | None,
                     tensors: Iterable[str] | None = None,
                     *, weights: str = "safetensors") -> Path:
    """Create ``folder`` with config.json (a dict, raw text, or None for none) and weights.

    weights: "safetensors" (a real header), "pickle" (a pytorch_model.bin stub) or "none".
    tensors: names in the header; by default a head's own tensors for a config with a head's
    architectures (EAGLE_TENSORS, EAGLE3_TENSORS, an MTP head's layers.0.eh_proj), a head's own
    embedding and LM head for a config of one layer (`silent`: a whole model's
    model.embed_tokens.weight would mark it as one), else a whole model's embedding and LM head, plus the MTP modules' ``eh_proj`` (stored as layers N + i) when the
    config declares num_nextn_predict_layers.
    """
    archs = set(config.get("architectures") or ()) if isinstance(config, Mapping) else set()
    if tensors is None and archs & EAGLE3_ARCHITECTURES:
        tensors = list(EAGLE3_TENSORS)
    elif tensors is None and archs & EAGLE_ARCHITECTURES:
        tensors = list(EAGLE_TENSORS)
    elif tensors is None and archs & MTP_HEAD_ARCHITECTURES:
        tensors = [f"layers.{i}.eh_proj.weight" for i in range(min(config.get("num_nextn_predict_layers") or 1, 256))]
    if (tensors is None and isinstance(config, Mapping) and config.get("num_hidden_layers") == 1
            and not config.get("num_nextn_predict_layers")):
        tensors = ["embed_tokens.weight", "lm_head.weight"]  # as a head names them: `silent` stays silent
    if tensors is None:
        tensors = ["model.embed_tokens.weight", "lm_head.weight"]
        if isinstance(config, Mapping) and config.get("num_nextn_predict_layers"):
            base = config.get("num_hidden_layers", 0)
            tensors += [f"model.layers.{base + i}.eh_proj.weight"
                        for i in range(min(config["num_nextn_predict_layers"], 256))]
    folder.mkdir(parents=True, exist_ok=True)
    if config is not None:
        text = config if isinstance(config, str) else json.dumps(config)
        (folder / "config.json").write_text(text, encoding="utf-8")
    if weights == "safetensors":
        write_safetensors(folder / "model.safetensors", tensors)
    elif weights == "pickle":
        (folder / "pytorch_model.bin").write_bytes(b"not really a pickle")
    elif weights != "none":
        raise ValueError(f"weights = {weights!r}: use safetensors, pickle or none")
    return folder


def llama(layers: int = 2, vocab: int = VOCAB, **extra: Any) -> dict[str, Any]:
    """A whole causal LM (target or independent draft)."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": layers,
            "hidden_size": 64, "vocab_size": vocab, **extra}


def deepseek_v3(mtp_layers: int = 1, layers: int = 4, vocab: int = VOCAB, **extra: Any) -> dict[str, Any]:
    """A target that declares MTP modules (DeepSeek-V3 layout)."""
    return {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
            "num_hidden_layers": layers, "num_nextn_predict_layers": mtp_layers, "hidden_size": 64,
            "vocab_size": vocab, **extra}


def eagle3_head(vocab: int = VOCAB, **extra: Any) -> dict[str, Any]:
    """An EAGLE-3 head as published: one layer, a reduced draft vocabulary."""
    return {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
            "hidden_size": 64, "vocab_size": vocab, "draft_vocab_size": 32000, **extra}


def eagle_head(vocab: int = VOCAB, **extra: Any) -> dict[str, Any]:
    """An EAGLE-1 head as published: one layer, the target's vocabulary."""
    return {"architectures": ["EagleLlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 1,
            "hidden_size": 64, "vocab_size": vocab, **extra}


def mtp_head(modules: int = 1, vocab: int = VOCAB, **extra: Any) -> dict[str, Any]:
    """A standalone MTP head in specsure's format."""
    return {"architectures": ["SpecsureMTPHead"], "model_type": "specsure_mtp", "num_hidden_layers": 1,
            "num_nextn_predict_layers": modules, "hidden_size": 64, "vocab_size": vocab, **extra}


def silent(vocab: int = VOCAB, **extra: Any) -> dict[str, Any]:
    """A one-layer LlamaForCausalLM: its metadata says nothing about the method."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 1,
            "hidden_size": 64, "vocab_size": vocab, **extra}


EAGLE3_TENSORS = ("fc.weight", "midlayer.hidden_norm.weight", "d2t", "t2d", "lm_head.weight")
EAGLE_TENSORS = ("fc.weight", "layers.0.self_attn.q_proj.weight")


def write_gguf(path: Path, *, layers: int = 2, vocab: int = VOCAB, mtp_layers: int | None = None) -> Path:
    """A tiny llama GGUF file: real metadata, one scalar tensor (reads in milliseconds)."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(layers)
    writer.add_embedding_length(64)
    writer.add_vocab_size(vocab)
    if mtp_layers is not None:
        writer.add_uint32("llama.nextn_predict_layers", mtp_layers)
    writer.add_tensor("token_embd.weight", np.zeros((1,), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
