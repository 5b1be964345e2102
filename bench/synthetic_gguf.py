"""An F32 GGUF of a random Llama whose widths are multiples of 256, for timing K-quant files.

    .venv/bin/python bench/synthetic_gguf.py /tmp/kq/f32.gguf
    .venv-llamacpp/bin/python bench/quantize_gguf.py /tmp/kq/f32.gguf /tmp/kq/Q6_K.gguf Q6_K

The default model's width of 576 makes llama.cpp's quantiser fall back from K-quants for most of
its tensors, so its Q4_K_M, Q5_K_M and Q6_K files are mostly Q5_0 and Q8_0. This model (hidden
1024, 12 layers, 16 heads of 64, 4 kv heads, MLP 2816, 134M weights in its layers, the tests'
300-token byte-level BPE tokenizer) quantises as users' larger models do: Q4_K or Q5_K with Q6_K
for some v and down matrices, or all Q6_K. Its text is noise; only the speed means anything.
Prompts must use ids below 300 (`--prompt-ids 1,50,60,70,80,90,100,110`).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from gguf_models import byte_bpe_tokenizer, write_llama_gguf  # noqa: E402  (the tests' GGUF writer)
from tiny import build_tiny_llama  # noqa: E402

VOCAB = 300
SHAPE = {"intermediate_size": 2816, "num_attention_heads": 16, "num_key_value_heads": 4, "max_position_embeddings": 4096}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the F32 GGUF file to write")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        llama = build_tiny_llama(Path(folder) / "llama", vocab_size=VOCAB, hidden_size=1024, num_layers=12, tie=False,
                                 extra_config=SHAPE)
        byte_bpe_tokenizer(llama, VOCAB)
        write_llama_gguf(llama, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
