"""Decoding alone, specsure's plain decoding against llama-server on the same Q4_1 file.

    .venv/bin/python bench/decode_ab.py                          # needs `make llama-server`
    .venv/bin/python bench/decode_ab.py --prompt-tokens 200 --new-tokens 1   # prefill instead

An 8-token prompt and 128 new tokens with EOS ignored, the two alternating, median of 6 each; the
server's time is its own prompt_ms + predicted_ms, as in `specsure bench`. The bench's prompts are
long, so its figures weigh prefill in; this one shows decoding by itself. Not a test: a measurement
for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import urllib.request
from pathlib import Path

import torch

from specsure import SamplingParams, make_engine
from specsure.bench.llamacpp.server import DEFAULT_LLAMA_SERVER, LlamaServer
from specsure.config.checkpoint import default_gguf_path

PROMPT = [1, 9690, 198, 2683, 359, 253, 5356, 5646]
ROUNDS = 6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-tokens", type=int, default=len(PROMPT), help="prompt length (the prompt ids repeated)")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--model", default=None, help="a GGUF file (default: the packaged default model)")
    parser.add_argument("--int8-activations", action="store_true", help="specsure's target with int8 activations")
    parser.add_argument("--prompt-ids", default=",".join(map(str, PROMPT)),
                        help="the prompt's token ids, comma-separated (a small vocabulary needs small ones)")
    args = parser.parse_args()
    ids = [int(t) for t in args.prompt_ids.split(",")]
    prompt = (ids * (args.prompt_tokens // len(ids) + 1))[:args.prompt_tokens]
    torch.set_num_threads(2)
    gguf = Path(args.model) if args.model else default_gguf_path()
    if gguf is None:
        raise SystemExit("the packaged default model is not installed; run `make install`")
    engine = make_engine(args.model, None, int8_activations=args.int8_activations)
    server = LlamaServer(DEFAULT_LLAMA_SERVER, gguf, [], 2, 512)
    params = SamplingParams(max_tokens=args.new_tokens, temperature=0.0, ignore_eos=True)

    def ours() -> float:
        started = time.perf_counter()
        engine.generate([prompt], params)
        return time.perf_counter() - started

    def theirs() -> tuple[float, float]:
        body = {"prompt": prompt, "n_predict": args.new_tokens, "temperature": 0.0, "cache_prompt": False,
                "ignore_eos": True}
        request = urllib.request.Request(f"{server.url}/completion", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request) as answer:
            timings = json.load(answer)["timings"]
        return (timings["prompt_ms"] + timings["predicted_ms"]) / 1000, timings["predicted_ms"] / timings["predicted_n"]

    try:
        ours(), theirs()  # warm-up
        mine: list[float] = []
        other: list[tuple[float, float]] = []
        for i in range(ROUNDS):  # alternate which goes first
            if i % 2:
                mine.append(ours())
                other.append(theirs())
            else:
                other.append(theirs())
                mine.append(ours())
    finally:
        server.close()
    a, b = statistics.median(mine), statistics.median(s for s, _ in other)
    print(f"specsure plain {a * 1000:.0f} ms; llama-server {b * 1000:.0f} ms (decoding "
          f"{statistics.median(d for _, d in other):.2f} ms a token); llama-server is {a / b:.3f}x as fast")


if __name__ == "__main__":
    main()
