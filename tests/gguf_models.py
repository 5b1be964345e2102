"""Real llama GGUF files written from a tiny Hugging Face model, in llama.cpp's layout (its q/k row
order, its tensor names, a byte-level BPE tokenizer in the metadata); test-only code."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np

TEXT = "def add(x, y): return x + y\nThe quick brown fox jumps over the lazy dog. Hello world.\n" * 30
HF_TO_GGUF = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
              "lm_head.weight": "output.weight"}
LAYER = {"input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
         "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
         "self_attn.o_proj.weight": "attn_output.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
         "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
         "mlp.down_proj.weight": "ffn_down.weight"}


def byte_bpe_tokenizer(folder: Path, vocab: int) -> None:
    """A byte-level BPE tokenizer of exactly ``vocab`` tokens (3 special, 256 bytes, merges), saved into ``folder``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TEXT], trainer)
    assert tok.get_vocab_size() == vocab, "the text is too short to train that many merges"
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
                            ).save_pretrained(folder)


def tiny_llama_gguf(root: Path, name: str, quantize: Mapping[str, str] | None = None, *, hidden: int = 64,
                    vocab: int = 300, tie: bool = False, **kwargs: Any) -> Path:
    """A tiny random Llama with a byte-level BPE tokenizer, under ``root``, as the GGUF ``root/name.gguf``
    (``quantize`` and ``kwargs`` as `write_llama_gguf` takes them)."""
    from tiny import build_tiny_llama

    folder = build_tiny_llama(root / f"{name}-hf", vocab_size=vocab, hidden_size=hidden, tie=tie)
    byte_bpe_tokenizer(folder, vocab)
    return write_llama_gguf(folder, root / f"{name}.gguf", quantize=quantize, **kwargs)


def write_bpe_tokenizer(writer: Any, tokenizer: Mapping[str, Any], merges: bool = True) -> None:
    """A byte-level BPE tokenizer.json into a GGUF writer's metadata, as llama.cpp's converter writes it."""
    import gguf

    vocab = {**tokenizer["model"]["vocab"], **{a["content"]: a["id"] for a in tokenizer["added_tokens"]}}
    tokens = sorted(vocab, key=vocab.get)
    special = {a["content"] for a in tokenizer["added_tokens"]}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens])
    if merges:
        writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]])


def write_llama_gguf(hf: Path, out: Path, *, skip: tuple[str, ...] = (), metadata: Mapping[str, Any] | None = None,
                     raw: Mapping[str, Any] | None = None, merges: bool = True,
                     quantize: Mapping[str, str] | None = None, keys: Mapping[str, Any] | None = None,
                     tensors: Mapping[str, np.ndarray] | None = None) -> Path:
    """``hf`` (a llama folder with tokenizer.json) as a GGUF file of F32 tensors.

    skip: GGUF tensor names left out; metadata: llama.* values that replace the true ones;
    raw: GGUF tensor names written as raw bytes of another GGML type, ``{name: type_name}``;
    merges: False leaves the BPE merges out; quantize: GGUF tensor names written quantised by gguf-py,
    ``{name: type_name}`` (Q4_0, Q4_1, Q8_0, ...); keys: more metadata (an int as uint32, a float as
    float32, a str as string); tensors: more float32 tensors (``rope_freqs.weight``).
    """
    import gguf
    from safetensors.numpy import load_file

    config = json.loads((hf / "config.json").read_text())
    tokenizer = json.loads((hf / "tokenizer.json").read_text())
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    values = {"context_length": config["max_position_embeddings"], "embedding_length": config["hidden_size"],
              "feed_forward_length": config["intermediate_size"], "block_count": config["num_hidden_layers"],
              "attention.head_count": heads, "attention.head_count_kv": kv_heads,
              "vocab_size": config["vocab_size"], **(metadata or {})}
    writer = gguf.GGUFWriter(str(out), "llama")
    for key, value in values.items():
        writer.add_uint32(f"llama.{key}", value)
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", config["rms_norm_eps"])
    writer.add_float32("llama.rope.freq_base", float((config.get("rope_parameters") or {}).get("rope_theta", 10000.0)))
    writer.add_uint32("llama.rope.dimension_count", config["hidden_size"] // heads)
    write_bpe_tokenizer(writer, tokenizer, merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    for key, value in (keys or {}).items():
        {int: writer.add_uint32, float: writer.add_float32, str: writer.add_string}[type(value)](key, value)
    for name, array in (tensors or {}).items():
        writer.add_tensor(name, np.asarray(array, dtype=np.float32))
    names = dict(HF_TO_GGUF)
    for i in range(config["num_hidden_layers"]):
        names.update({f"model.layers.{i}.{k}": f"blk.{i}.{v}" for k, v in LAYER.items()})
    for hf_name, array in load_file(str(hf / "model.safetensors")).items():
        name = names[hf_name]
        if name in skip:
            continue
        array = array.astype(np.float32)
        if name.endswith(("attn_q.weight", "attn_k.weight")):  # llama.cpp's rotary row order
            n = heads if name.endswith("attn_q.weight") else kv_heads
            array = array.reshape(n, 2, array.shape[0] // n // 2, -1).swapaxes(1, 2).reshape(array.shape)
        if raw and name in raw:
            kind = gguf.GGMLQuantizationType[raw[name]]
            block, size = gguf.GGML_QUANT_SIZES[kind]
            data = np.zeros((array.shape[0], array.shape[1] // block * size), dtype=np.uint8)
            writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=kind)
        elif quantize and name in quantize:
            kind = gguf.GGMLQuantizationType[quantize[name]]
            data = quantised(quantize[name], array.shape[0], array.shape[1], array=array)
            writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=kind)
        else:
            writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


K_SCALES = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}
"""Where each super-block of the K-quants (which gguf-py cannot quantise) keeps its float16 scales."""


def quantised(name: str, rows: int, cols: int, seed: int = 0, array: np.ndarray | None = None) -> np.ndarray:
    """[rows, row bytes] of GGUF type ``name``: gguf-py's quantisation of ``array`` (or of random
    weights with a zero and a constant block); for a K-quant, which gguf-py cannot quantise, random
    quants and sub-scales under small random float16 scales of either sign."""
    import gguf

    rng = np.random.default_rng(seed)
    kind = gguf.GGMLQuantizationType[name]
    if name not in K_SCALES:
        if array is None:
            array = rng.normal(0, 0.3, (rows, cols)).astype(np.float32)
            array[3 % rows] = 0.0  # a block of zeros (scale 0)
            array[5 % rows, :32] = 7.5  # a constant block (Q4_1: d 0, all in m)
        return gguf.quants.quantize(array.astype(np.float32), kind)
    block, size = gguf.GGML_QUANT_SIZES[kind]
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    for at in K_SCALES[name]:
        scale = rng.uniform(2e-4, 2e-3, (rows, cols // block)) * rng.choice([-1, 1], (rows, cols // block))
        raw[..., at:at + 2] = scale.astype(np.float16).view(np.uint8).reshape(rows, cols // block, 2)
    return raw.reshape(rows, -1)


def write_gemma2(folder: Path, out: Path, vocab: int = 290, quantize: Mapping[str, str] | None = None
                 ) -> tuple[Path, Path]:
    """A tiny random Gemma 2 (head_dim 16, so its attention scale is not transformers' default of 256)
    with a byte-level BPE tokenizer, and the same weights as a GGUF file in llama.cpp's layout (its
    norm weights stored with the 1 that Gemma's norm adds, as convert_hf_to_gguf writes them);
    ``quantize`` as `_write_model`'s."""
    import gguf
    from transformers import Gemma2Config, Gemma2ForCausalLM

    from tiny import random_model

    config = Gemma2Config(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16,
                          sliding_window=4, max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = random_model(Gemma2ForCausalLM, config)
    _unscaled_embedding(model)
    model.save_pretrained(folder)
    byte_bpe_tokenizer(folder, vocab)
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    writer = gguf.GGUFWriter(str(out), "gemma2")
    for key, value in (("context_length", 256), ("embedding_length", 64), ("feed_forward_length", 128),
                       ("block_count", 2), ("attention.head_count", 4), ("attention.head_count_kv", 2),
                       ("attention.key_length", 16), ("attention.value_length", 16), ("attention.sliding_window", 4)):
        writer.add_uint32(f"gemma2.{key}", value)
    writer.add_float32("gemma2.attention.layer_norm_rms_epsilon", config.rms_norm_eps)
    writer.add_float32("gemma2.attn_logit_softcapping", config.attn_logit_softcapping)
    writer.add_float32("gemma2.final_logit_softcapping", config.final_logit_softcapping)
    _write_model(writer, folder, tokenizer, gguf.MODEL_ARCH.GEMMA2, norms_plus_one=True, quantize=quantize)
    return folder, out


GEMMA3_TINY: Final[dict[str, int]] = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, query_pre_attn_scalar=16, sliding_window=4, max_position_embeddings=256)
"""6 layers: 5 with a sliding window of 4 positions and their local RoPE, then one full layer
(transformers' and llama.cpp's default pattern); heads 16 wide."""


def _unscaled_embedding(model: Any) -> None:
    """A Gemma's tied embedding at std 0.03: Gemma multiplies it by sqrt(hidden) on the way in, and at the
    tests' std of 0.2 the scaled input outweighs every layer, so greedy decoding repeated its last token
    whatever attention, windows or norms did, and tests of them could not fail."""
    import torch

    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(4)
        model.get_input_embeddings().weight.normal_(0.0, 0.03)


def write_gemma3(folder: Path, out: Path, vocab: int = 290, quantize: Mapping[str, str] | None = None,
                 shape: Mapping[str, int] = GEMMA3_TINY) -> tuple[Path, Path]:
    """A random Gemma 3 text model of ``shape`` (tied embeddings) and the same weights as a GGUF file in
    llama.cpp's layout, every norm stored with the 1 Gemma's norm adds; ``quantize`` as `_write_model`'s."""
    import gguf
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    from tiny import random_model

    config = Gemma3TextConfig(vocab_size=vocab, bos_token_id=1, eos_token_id=2, pad_token_id=0, **shape)
    model = random_model(Gemma3ForCausalLM, config)
    with torch.random.fork_rng(devices=[]), torch.no_grad():  # norms that are not all zero, so each counts
        torch.manual_seed(3)
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(-0.5, 0.5)
    _unscaled_embedding(model)
    model.save_pretrained(folder)
    byte_bpe_tokenizer(folder, vocab)
    writer = gguf.GGUFWriter(str(out), "gemma3")
    for key, field in (("context_length", "max_position_embeddings"), ("embedding_length", "hidden_size"),
                       ("feed_forward_length", "intermediate_size"), ("block_count", "num_hidden_layers"),
                       ("attention.head_count", "num_attention_heads"),
                       ("attention.head_count_kv", "num_key_value_heads"), ("attention.key_length", "head_dim"),
                       ("attention.value_length", "head_dim"), ("attention.sliding_window", "sliding_window")):
        writer.add_uint32(f"gemma3.{key}", getattr(config, field))
    writer.add_float32("gemma3.attention.layer_norm_rms_epsilon", config.rms_norm_eps)
    writer.add_float32("gemma3.rope.freq_base", float(config.rope_parameters["full_attention"]["rope_theta"]))
    _write_model(writer, folder, json.loads((folder / "tokenizer.json").read_text()), gguf.MODEL_ARCH.GEMMA3,
                 norms_plus_one=True, quantize=quantize, layers=config.num_hidden_layers)
    return folder, out


def write_qwen3(folder: Path, out: Path, vocab: int = 290, quantize: Mapping[str, str] | None = None,
                tie: bool = False) -> tuple[Path, Path]:
    """A tiny random Qwen3 whose heads are 16 wide (not Qwen3Config's default 128), and the same weights
    as a GGUF file in llama.cpp's layout, the width in qwen3.attention.key_length; ``quantize`` as
    `_write_model`'s."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from tiny import random_model

    config = Qwen3Config(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=tie)
    model = random_model(Qwen3ForCausalLM, config)
    with torch.random.fork_rng(devices=[]), torch.no_grad():  # q and k norms that are not all ones, so each counts
        torch.manual_seed(2)
        for name, param in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                param.uniform_(0.5, 2.0)
    return write_qwen_gguf(model, folder, out, "qwen3", quantize)


def write_qwen_gguf(model: Any, folder: Path, out: Path, family: str,
                    quantize: Mapping[str, str] | None = None) -> tuple[Path, Path]:
    """``model`` (transformers' Qwen2 or Qwen3) saved in ``folder`` with the tests' byte-level BPE
    tokenizer, and the same weights as GGUF file ``out`` in llama.cpp's layout (no rotary row
    permutation, unlike llama's; an explicit head_dim in {family}.attention.key_length);
    ``quantize`` as `_write_model`'s."""
    import gguf

    config = model.config
    model.save_pretrained(folder)
    byte_bpe_tokenizer(folder, config.vocab_size)
    writer = gguf.GGUFWriter(str(out), family)
    dim = getattr(config, "head_dim", None)
    for key, value in (("context_length", config.max_position_embeddings), ("embedding_length", config.hidden_size),
                       ("feed_forward_length", config.intermediate_size), ("block_count", config.num_hidden_layers),
                       ("attention.head_count", config.num_attention_heads),
                       ("attention.head_count_kv", config.num_key_value_heads),
                       *((("attention.key_length", dim), ("attention.value_length", dim)) if dim else ())):
        writer.add_uint32(f"{family}.{key}", value)
    writer.add_float32(f"{family}.attention.layer_norm_rms_epsilon", config.rms_norm_eps)
    writer.add_float32(f"{family}.rope.freq_base", float(config.rope_parameters["rope_theta"]))
    _write_model(writer, folder, json.loads((folder / "tokenizer.json").read_text()),
                 getattr(gguf.MODEL_ARCH, family.upper()), quantize=quantize, layers=config.num_hidden_layers)
    return folder, out


def write_qwen2(folder: Path, out: Path, vocab: int = 290, quantize: Mapping[str, str] | None = None,
                tie: bool = False) -> tuple[Path, Path]:
    """A tiny random Qwen2 (q/k/v biases, random too) and the same weights as a GGUF file
    (`write_qwen_gguf`); ``quantize`` as `_write_model`'s."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from tiny import random_model

    config = Qwen2Config(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=tie)
    model = random_model(Qwen2ForCausalLM, config)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(1)
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.normal_(0.0, 0.5)
    return write_qwen_gguf(model, folder, out, "qwen2", quantize)


def _write_model(writer: Any, folder: Path, tokenizer: Mapping[str, Any], arch: Any,
                 norms_plus_one: bool = False, quantize: Mapping[str, str] | None = None, layers: int = 2) -> None:
    """The tokenizer and ``folder``'s model of ``layers`` layers into ``writer`` under llama.cpp's tensor
    names, then the file; ``norms_plus_one``: norm weights stored with the 1 Gemma's norm adds, as
    llama.cpp keeps them; ``quantize``: GGUF tensor names written quantised by gguf-py, ``{name: type_name}``."""
    import gguf
    from safetensors.numpy import load_file

    write_bpe_tokenizer(writer, tokenizer)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    names = gguf.get_tensor_name_map(arch, layers)
    for name, array in load_file(str(folder / "model.safetensors")).items():
        array = array.astype(np.float32)
        name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if quantize and name in quantize:
            data = quantised(quantize[name], array.shape[0], array.shape[1], array=array)
            writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=gguf.GGMLQuantizationType[quantize[name]])
        else:
            writer.add_tensor(name, array + 1 if norms_plus_one and name.endswith("norm.weight") else array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


PHI3_TINY: Final[dict[str, int]] = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                                     "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 256}


def write_phi3(folder: Path, out: Path, vocab: int = 290, longrope: bool = False,
               quantize: Mapping[str, str] | None = None, shape: Mapping[str, int] = PHI3_TINY,
               partial_rotary: float = 1.0) -> tuple[Path, Path]:
    """A random Phi-3 of ``shape`` and the same weights as a GGUF file that names no padding token, as
    llama.cpp's converter writes a vocabulary without one; with ``longrope``, a 128k-style model
    (Phi-3.5-mini's LongRoPE: per-frequency short and long factors, the context 4x the original),
    its factors written as llama.cpp's converter writes them: two tensors and the attention factor;
    ``quantize`` as `_write_model`'s (q|k|v in blk.N.attn_qkv, gate|up in blk.N.ffn_up);
    ``partial_rotary``: the share of each head RoPE turns (Phi-4-mini's 0.75; rope.dimension_count)."""
    import gguf
    from transformers import Phi3Config, Phi3ForCausalLM

    from tiny import random_model

    context = shape["max_position_embeddings"]
    rotated = int(shape["hidden_size"] // shape["num_attention_heads"] * partial_rotary)
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": partial_rotary}
    original = context
    if longrope:
        original = context // 4
        ramp = np.linspace(0.0, 1.0, rotated // 2)
        rope = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": partial_rotary,
                "short_factor": [float(v) for v in (1.0 + 7.0 * ramp ** 2).astype(np.float32)],
                "long_factor": [float(v) for v in (1.0 + 31.0 * ramp ** 1.5).astype(np.float32)]}
    config = Phi3Config(vocab_size=vocab, original_max_position_embeddings=original, bos_token_id=1, eos_token_id=2,
                        pad_token_id=None, tie_word_embeddings=False, rope_parameters=rope, **shape)
    random_model(Phi3ForCausalLM, config).save_pretrained(folder)
    byte_bpe_tokenizer(folder, vocab)
    writer = gguf.GGUFWriter(str(out), "phi3")
    for key, field in (("context_length", "max_position_embeddings"), ("embedding_length", "hidden_size"),
                       ("feed_forward_length", "intermediate_size"), ("block_count", "num_hidden_layers"),
                       ("attention.head_count", "num_attention_heads"),
                       ("attention.head_count_kv", "num_key_value_heads")):
        writer.add_uint32(f"phi3.{key}", getattr(config, field))
    writer.add_uint32("phi3.rope.dimension_count", rotated)
    writer.add_float32("phi3.attention.layer_norm_rms_epsilon", config.rms_norm_eps)
    writer.add_float32("phi3.rope.freq_base", float(config.rope_parameters["rope_theta"]))
    if longrope:  # as llama.cpp's Phi3MiniModel converter writes a LongRoPE model
        writer.add_uint32("phi3.rope.scaling.original_context_length", original)
        writer.add_float32("phi3.rope.scaling.attn_factor", math.sqrt(1 + math.log(context / original) / math.log(original)))
        writer.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], dtype=np.float32))
        writer.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], dtype=np.float32))
    _write_model(writer, folder, json.loads((folder / "tokenizer.json").read_text()), gguf.MODEL_ARCH.PHI3,
                 quantize=quantize, layers=config.num_hidden_layers)
    return folder, out


def assert_decodes_as(folder: Path, gguf: Path) -> None:
    """Greedy decoding of the GGUF file equals transformers' on its Hugging Face source, in float32."""
    import torch
    from transformers import AutoModelForCausalLM

    from specsure import SamplingParams, make_engine

    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    prompt = [5, 70, 71, 72, 80, 81, 90, 91, 92, 100, 5, 70]
    expected = reference.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)[0, len(prompt):].tolist()
    got = make_engine(str(gguf), None, dtype="float32").generate(prompt, SamplingParams(max_tokens=8, ignore_eos=True))
    assert got[0].token_ids == expected
