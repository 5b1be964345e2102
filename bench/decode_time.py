"""Greedy decoding's time a token, for comparing two checkouts of specsure on one model.

    .venv/bin/python bench/decode_time.py [--model FILE.gguf|FOLDER] [--int8-activations] [--dtype bfloat16]
    PYTHONPATH=/tmp/old/src .venv/bin/python bench/decode_time.py ...   # an older checkout's code

An 8-token prompt, 128 new tokens with EOS ignored, one warm-up generation, then the mean of 3, 2
threads. Run the two checkouts alternately, several pairs, and compare pair by pair: one process
each, so the machine's drift between pairs does not count. Not a test: a measurement for
BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import time

import torch

from specsure import SamplingParams, make_engine

PROMPT = [1, 9690, 198, 2683, 359, 253, 5356, 5646]
RUNS, TOKENS = 3, 128


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None,
                        help="a GGUF file or a Hugging Face folder (default: the packaged default model)")
    parser.add_argument("--int8-activations", action="store_true", help="the target with int8 activations")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="the target's dtype")
    parser.add_argument("--prompt-ids", default=",".join(map(str, PROMPT)),
                        help="the prompt's token ids, comma-separated (a small vocabulary needs small ones)")
    args = parser.parse_args()
    prompt = [int(t) for t in args.prompt_ids.split(",")]
    torch.set_num_threads(2)
    engine = make_engine(args.model, dtype=args.dtype, int8_activations=args.int8_activations)
    params = SamplingParams(max_tokens=TOKENS, temperature=0.0, ignore_eos=True)
    engine.generate([prompt], params)
    start = time.perf_counter()
    for _ in range(RUNS):
        engine.generate([prompt], params)
    print(f"{(time.perf_counter() - start) / RUNS / TOKENS * 1000:.3f} ms a token")


if __name__ == "__main__":
    main()
