"""An F32 GGUF of a random Llama, Qwen2, Qwen3, Gemma 3 or Phi-3 for timing K-quant files.

    .venv/bin/python bench/synthetic_gguf.py /tmp/kq/f32.gguf [--family qwen2|qwen3|gemma3|phi3]
    .venv-llamacpp/bin/python bench/quantize_gguf.py /tmp/kq/f32.gguf /tmp/kq/Q6_K.gguf Q6_K
    .venv/bin/python bench/synthetic_gguf.py /tmp/kq/q4_0.gguf --family phi3 --layers 6 --quantize Q4_0

The default model's width of 576 makes llama.cpp's quantiser fall back from K-quants for most of
its tensors, so its Q4_K_M, Q5_K_M and Q6_K files are mostly Q5_0 and Q8_0. The llama model (hidden
1024, 12 layers, 16 heads of 64, 4 kv heads, MLP 2816, 134M weights in its layers) quantises as
users' larger models do: Q4_K or Q5_K with Q6_K for some v and down matrices, or all Q6_K. The
qwen3 one has Qwen3-0.6B's layers (hidden 1024, 28 layers, 16 heads of 128, 8 kv heads, MLP 3072,
per-head q and k norms; 440M weights in its layers), the qwen2 one Qwen2.5-0.5B's (hidden 896, 24
layers, 14 heads of 64, 2 kv heads, MLP 4864, q|k|v biases; 358M weights in its layers; 896 is not a
multiple of 256, so its K-quant files fall back as the real one's do), the gemma3 one Gemma-3-270M's
(hidden 640, 18 layers of which every sixth has full attention and the rest a window of 512, 4 heads
of 256, 1 kv head, MLP 2048; 100M weights in its layers, where the real model's tied 262,144-row
embedding adds 168M), the phi3 one Phi-3-mini's (hidden 3072, 32 layers, 32 heads of 96, 32 kv heads,
MLP 8192, its q|k|v and gate|up fused in the file; 113M weights a layer; --layers fewer, as a whole
model's float32 conversion takes 15 GB). --quantize Q4_0, Q4_1 or Q8_0 writes the layers' matrices
quantised by gguf-py (no llama.cpp needed). All have the tests'
300-token byte-level BPE tokenizer (so an LM head of 300 rows where Qwen3-0.6B's has 151,936):
their text is noise; only the speed of the layers means anything. Prompts must use ids below 300
(`--prompt-ids 1,50,60,70,80,90,100,110`).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from gguf_models import (  # noqa: E402  (the tests' GGUF writer)
    byte_bpe_tokenizer, write_gemma3, write_llama_gguf, write_phi3, write_qwen_gguf,
)
from tiny import build_tiny_llama, random_model  # noqa: E402

VOCAB = 300
SHAPE = {"intermediate_size": 2816, "num_attention_heads": 16, "num_key_value_heads": 4, "max_position_embeddings": 4096}
QWEN = {  # Qwen3-0.6B's layers, and Qwen2.5-0.5B's (its q|k|v biases too)
    "qwen3": {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
              "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 4096},
    "qwen2": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
              "num_key_value_heads": 2, "max_position_embeddings": 4096},
}
GEMMA3_270M = {"hidden_size": 640, "intermediate_size": 2048, "num_hidden_layers": 18, "num_attention_heads": 4,
               "num_key_value_heads": 1, "head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 512,
               "max_position_embeddings": 4096}
"""Gemma-3-270M's layers: 15 sliding (a window of 512) and 3 full, heads of 256."""
PHI3_MINI = {"hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32, "num_attention_heads": 32,
             "num_key_value_heads": 32, "max_position_embeddings": 4096}
"""Phi-3-mini-4k's layers (its GGUF files run without its sliding window, as llama.cpp runs them)."""


def _qwen(family: str, folder: Path, out: Path) -> None:
    import transformers

    name = family.capitalize()
    config = getattr(transformers, f"{name}Config")(vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                                                    tie_word_embeddings=False, **QWEN[family])
    write_qwen_gguf(random_model(getattr(transformers, f"{name}ForCausalLM"), config), folder, out, family)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the F32 GGUF file to write")
    parser.add_argument("--family", choices=("llama", *QWEN, "gemma3", "phi3"), default="llama")
    parser.add_argument("--layers", type=int, help="phi3: this many of Phi-3-mini's layers (default all 32)")
    parser.add_argument("--quantize", choices=("Q4_0", "Q4_1", "Q8_0"), help="phi3: the layers' matrices in this type")
    args = parser.parse_args()
    if (args.layers or args.quantize) and args.family != "phi3":
        parser.error("--layers and --quantize are for --family phi3; quantise the others with bench/quantize_gguf.py")
    with tempfile.TemporaryDirectory() as folder:
        if args.family == "phi3":
            shape = {**PHI3_MINI, "num_hidden_layers": args.layers or PHI3_MINI["num_hidden_layers"]}
            names = ("attn_qkv", "attn_output", "ffn_up", "ffn_down")
            types = {f"blk.{i}.{n}.weight": args.quantize for i in range(shape["num_hidden_layers"]) for n in names}
            write_phi3(Path(folder) / "phi3", args.out, VOCAB, quantize=types if args.quantize else None, shape=shape)
        elif args.family == "gemma3":
            write_gemma3(Path(folder) / "gemma3", args.out, VOCAB, shape=GEMMA3_270M)
        elif args.family in QWEN:
            _qwen(args.family, Path(folder) / args.family, args.out)
        else:
            llama = build_tiny_llama(Path(folder) / "llama", vocab_size=VOCAB, hidden_size=1024, num_layers=12,
                                     tie=False, extra_config=SHAPE)
            byte_bpe_tokenizer(llama, VOCAB)
            write_llama_gguf(llama, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
