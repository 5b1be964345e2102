"""`specsure demo` (what `make demo` runs): ngram on an input-grounded prompt, against plain decoding."""

from __future__ import annotations

import argparse
import statistics

from specsure.cli.common import EXIT_OK
from specsure.cli.generate import print_effective, print_stats, render_prompt

DEMO_CODE = """def average_positive(values):
    total = 0
    count = 0
    for value in values:
        if value > 0:
            total += value
            count += 1
    if count == 0:
        return 0.0
    return total / count
"""
# Input-grounded: most of a good answer is copied from the prompt, which is what ngram drafts.
DEMO_PROMPT = (f"Here is a Python function:\n\n```python\n{DEMO_CODE}```\n\nRename the variable `total` to "
               "`running_sum` everywhere in this function. Show the full updated function.")
DEMO_CONFIG = {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_min": 2, "prompt_lookup_max": 5}


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("demo", help="generate on the default model with ngram and compare to plain decoding")
    parser.add_argument("--model", default=None, help="target model (default: packaged SmolLM2-135M-Instruct)")
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=2, help="timed runs of each, interleaved")
    parser.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"))
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from specsure.config import resolve
    from specsure.decode.engine import Engine, make_engine
    from specsure.decode.sampling import SamplingParams

    print("loading the model (the first run converts the packaged GGUF to safetensors once)...", flush=True)
    spec = make_engine(args.model, DEMO_CONFIG, dtype=args.dtype)
    # The plain engine shares the loaded target, so both runs use the same weights and threads.
    plain = Engine(resolve(None, model=args.model), spec.target, None)
    prompt = render_prompt(spec, DEMO_PROMPT, chat=True)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    warm = SamplingParams(max_tokens=8, temperature=0.0)
    plain.generate(prompt, warm)
    spec.generate(prompt, warm)
    plain_speeds, spec_speeds = [], []
    for _ in range(max(1, args.repeats)):
        base = plain.generate(prompt, params)[0]
        fast = spec.generate(prompt, params)[0]
        plain_speeds.append(base.stats.tokens_per_s)
        spec_speeds.append(fast.stats.tokens_per_s)
    print("\n--- prompt ---\n" + DEMO_PROMPT)
    print("--- completion (ngram) ---\n" + (fast.text or ""))
    print()
    print_effective(spec)
    print_stats(fast)
    p, s = statistics.median(plain_speeds), statistics.median(spec_speeds)
    same = "identical to" if fast.token_ids == base.token_ids else "DIFFERENT from"
    print(f"plain decoding: {p:.1f} tok/s; ngram: {s:.1f} tok/s; speedup {s / p:.2f}x "
          f"(median of {len(spec_speeds)} interleaved runs, dtype {str(spec.target.lm.dtype).removeprefix('torch.')})")
    print(f"ngram output is {same} plain greedy decoding ({len(fast.token_ids)} tokens).")
    return EXIT_OK
