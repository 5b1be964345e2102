"""A random Qwen3 with Qwen3-0.6B's layers as a Hugging Face folder, for timing bf16 decoding.

    .venv/bin/python bench/avx512-bf16-kernel/make_qwen3.py /tmp/phi/qwen3-folder

28 layers, hidden 1024, 16 heads of 128, 8 kv heads, MLP 3072, per-head q and k norms; the tests'
300-token byte-level BPE vocabulary, so only the layers' speed means anything.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from gguf_models import byte_bpe_tokenizer  # noqa: E402  (the tests' helpers)
from tiny import random_model  # noqa: E402


def main() -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    out = Path(sys.argv[1])
    config = Qwen3Config(vocab_size=300, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                         num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    random_model(Qwen3ForCausalLM, config).save_pretrained(out)
    byte_bpe_tokenizer(out, 300)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
