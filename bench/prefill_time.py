"""A prompt's prefill time, for comparing two checkouts of specsure on one model.

    .venv/bin/python bench/prefill_time.py --tokens 1000 [--model FILE.gguf|FOLDER] [--dtype bfloat16]
    PYTHONPATH=/tmp/old/src .venv/bin/python bench/prefill_time.py ...   # an older checkout's code

One forward over a prompt of --tokens ids (a fixed pattern below the vocabulary's size), one warm-up,
then the median of 3, 2 threads; prints the time and the last row's top logit, so two checkouts'
runs show they computed the same model. Run the two alternately, several pairs, one process each.
Not a test: a measurement for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specsure import make_engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, required=True, help="the prompt's length")
    parser.add_argument("--model", default=None, help="a GGUF file or a Hugging Face folder (default: the packaged model)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="the target's dtype")
    args = parser.parse_args()
    torch.set_num_threads(2)
    lm = make_engine(args.model, dtype=args.dtype).target.lm
    ids = [(37 * i) % (lm.vocab_size - 3) + 3 for i in range(args.tokens)]
    times, top = [], 0.0
    for _ in range(4):
        lm.crop(0)
        started = time.perf_counter()
        top = float(lm.forward(ids).logits[-1].max())
        times.append(time.perf_counter() - started)
    print(f"{args.tokens} tokens: {1000 * statistics.median(times[1:]):.0f} ms (top logit {top:.6f})")


if __name__ == "__main__":
    main()
