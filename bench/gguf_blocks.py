"""Forwards of the default model with its weights read as the GGUF's Q4_1 / Q8_0 blocks against
the same forwards on the float32 weights they dequantise to, interleaved in one process, and
greedy decoding both ways (the outputs must be equal, token for token).

    .venv/bin/python bench/gguf_blocks.py [--model FILE.gguf] [--repeats 9] [--tokens 64]

Figures are medians over the repeats on 2 threads. Not a test: the measurement behind
BENCHMARKS.md's "The GGUF's blocks in the float32 kernel".
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specsure.models.loading import load_model

PROMPT = ("Write a short Python function that returns the n-th Fibonacci number iteratively, "
          "then explain in two sentences why it runs in linear time.")


def switch(lm, blocks: bool, saved: dict) -> None:
    """Point the kernel's layer structs and the LM head at the blocks or at the float32 weights."""
    decoder = lm._native
    for index, (struct, layer) in enumerate(zip(decoder._float_structs, decoder.layers)):
        for name in ("qkv", "o", "gate_up", "down"):
            key = (index, name)
            if key not in saved:
                saved[key] = (getattr(struct, name), getattr(struct, f"{name}_format"))
            pointer, fmt = saved[key] if blocks else (getattr(layer, name).data_ptr(), 0)
            setattr(struct, name, pointer)
            setattr(struct, f"{name}_format", fmt)
    if "head" not in saved:
        saved["head"] = (lm.head.blocks, lm.head.tiles)  # on an AMX CPU the kernel reads the tiles (A8)
    lm.head.blocks, lm.head.tiles = saved["head"] if blocks else (None, None)


def greedy(lm, ids: list[int], tokens: int) -> tuple[list[int], float]:
    lm.reset()
    started = time.perf_counter()
    out = lm.forward(ids, last_logits=1)
    new = []
    for _ in range(tokens):
        token = int(out.logits[-1].argmax())
        new.append(token)
        out = lm.forward([token])
    return new, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--model", default=None, help="a GGUF file (default: the packaged default model)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    loaded = load_model(args.model, dtype="float32")
    lm = loaded.lm
    print(lm.path)
    if not getattr(lm._native, "_blocks", None):
        raise SystemExit("the model's weights are not read as blocks here (see the path above)")
    saved: dict = {}
    lm.forward(list(range(100, 300)), last_logits=1)
    cached = lm.cache_len
    rows_tried = (1, 2, 3, 4, 8, 16)
    times = {(way, rows): [] for way in ("float32", "blocks") for rows in rows_tried}
    for _ in range(args.repeats):
        for (way, rows), samples in times.items():
            switch(lm, way == "blocks", saved)
            started = time.perf_counter()
            lm.forward([5] * rows)
            samples.append(time.perf_counter() - started)
            lm.crop(cached)
    for rows in rows_tried:
        f32, blocks = (statistics.median(times[(w, rows)]) * 1000 for w in ("float32", "blocks"))
        print(f"forward of {rows:2d} rows at {cached} cached: float32 {f32:6.1f} ms, blocks {blocks:6.1f} ms "
              f"({f32 / blocks:.2f}x)")
    text = loaded.tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                                tokenize=False)
    ids = loaded.tokenizer(text, add_special_tokens=False)["input_ids"]
    runs = {"float32": [], "blocks": []}
    outputs = {}
    for _ in range(max(3, args.repeats // 3)):
        for way in runs:
            switch(lm, way == "blocks", saved)
            outputs[way], seconds = greedy(lm, ids, args.tokens)
            runs[way].append(args.tokens / seconds)
    f32, blocks = (statistics.median(runs[w]) for w in ("float32", "blocks"))
    same = outputs["float32"] == outputs["blocks"]
    print(f"greedy, {len(ids)}-token prompt, {args.tokens} new tokens (prefill included): float32 {f32:.2f} tok/s, "
          f"blocks {blocks:.2f} tok/s ({blocks / f32:.2f}x); outputs equal: {same}")
    if not same:
        raise SystemExit("the outputs differ")


if __name__ == "__main__":
    main()
