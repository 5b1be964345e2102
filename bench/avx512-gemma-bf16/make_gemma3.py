"""A random Gemma 3 with Gemma-3-270M's layers as a Hugging Face folder, for timing bf16 decoding.

    .venv/bin/python bench/avx512-gemma-bf16/make_gemma3.py /tmp/gem/gemma3-folder

18 layers, hidden 640, 4 heads of 256, 1 kv head, MLP 2048, five sliding layers (window 512, RoPE base
10,000) to one full layer (base 1,000,000), per-head q and k norms, Gemma's four norms and GELU; the
tests' 300-token byte-level BPE vocabulary, so only the layers' speed means anything.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from gguf_models import byte_bpe_tokenizer  # noqa: E402  (the tests' helpers)
from tiny import random_model  # noqa: E402


def main() -> None:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    out = Path(sys.argv[1])
    layers = 18
    config = Gemma3TextConfig(
        vocab_size=300, hidden_size=640, intermediate_size=2048, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256, sliding_window=512,
        layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(layers)],
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
        max_position_embeddings=32768, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    random_model(Gemma3ForCausalLM, config).save_pretrained(out)
    byte_bpe_tokenizer(out, 300)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
