"""`specsure demo` (what `make demo` runs): ngram (or ``--method``) on an input-grounded prompt, against plain decoding."""

from __future__ import annotations

import argparse
import json
import statistics

from specsure.cli.common import EXIT_OK, INT8_HELP, add_dtype_flag, int_at_least
from specsure.cli.generate import fit_max_tokens, print_effective, print_stats, render_prompt

DEMO_CODE = """class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, name, quantity):
        if name in self.items:
            self.items[name] += quantity
        else:
            self.items[name] = quantity

    def remove(self, name, quantity):
        if name not in self.items:
            raise KeyError(name)
        self.items[name] -= quantity
        if self.items[name] <= 0:
            del self.items[name]
"""
# Input-grounded: most of a good answer is copied from the prompt, which is what ngram drafts.
DEMO_PROMPT = (f"Here is a Python class:\n\n```python\n{DEMO_CODE}```\n\nRename the method `remove` to `take`. "
               "Show the full updated class.")
DEMO_CONFIG = {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
DEMO_METHODS = ("ngram", "suffix", "eagle3", "mtp")
"""What --method takes; eagle3 and mtp run the heads shipped for the default model (docs/training.md)."""


DEMO_MAX_TOKENS = 200


def demo_config(method: str) -> dict[str, object]:
    """ngram's tuned demo settings; any other method as the user would write it, everything else resolved."""
    return dict(DEMO_CONFIG) if method == "ngram" else {"method": method}


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("demo", help="generate on the default model with ngram (or --method) and compare to plain "
                                         "decoding")
    parser.add_argument("--model", default=None, help="target model (default: packaged SmolLM2-135M-Instruct)")
    parser.add_argument("--method", default="ngram", choices=DEMO_METHODS,
                        help="the speculative method (default ngram); eagle3 and mtp use the heads shipped for the "
                             "default model")
    parser.add_argument("--max-tokens", type=int_at_least(1), default=None,
                        help=f"tokens to generate (default {DEMO_MAX_TOKENS}, or what the context has room for)")
    parser.add_argument("--repeats", type=int_at_least(1), default=2, help="timed runs of each, interleaved")
    # float32 by default: there the speculative output is bit-identical to plain greedy decoding,
    # which is what the demo shows. bfloat16 is faster where the CPU has fast bf16 (for a target of
    # safetensors) but may flip near-ties.
    add_dtype_flag(parser, "float32 (default) gives exact equality with plain decoding; auto picks float32 for a "
                           "GGUF target of blocks (the default model), else bfloat16 on CPUs with fast bf16, "
                           "which may differ at near-ties", default="float32")
    parser.add_argument("--int8-activations", action="store_true", help=INT8_HELP)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from specsure.config import resolve
    from specsure.decode.engine import Engine, make_engine
    from specsure.sampling import SamplingParams

    print("loading the model (the first run converts the packaged GGUF to safetensors once)..." if args.model is None
          else f"loading {args.model} ...", flush=True)
    try:
        spec = make_engine(args.model, demo_config(args.method), dtype=args.dtype, int8_activations=args.int8_activations)
    except ValueError as err:
        if args.model is None or args.method not in ("eagle3", "mtp"):
            raise
        # The resolution's fix says to add "model", which demo has no flag for.
        raise ValueError(f"{err} (specsure demo --method {args.method} runs the head shipped for the default model; for "
                         f"another model run specsure generate --model {args.model} --speculative-config "
                         f"'{{\"method\": \"{args.method}\", \"model\": \"/path/to/head\"}}'.)") from None
    # The plain engine shares the loaded target, so both runs use the same weights and threads.
    plain = Engine(resolve(None, model=args.model), spec.target, None)
    prompt = spec.encode(render_prompt(spec, DEMO_PROMPT, chat=True,
                                       why="specsure demo sends a chat prompt, and this model's tokenizer has no chat "
                                           "template; use specsure generate without --chat for it."))
    max_tokens = fit_max_tokens(args.max_tokens, len(prompt), spec.target.lm.max_context, DEMO_MAX_TOKENS)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    warm = SamplingParams(max_tokens=8, temperature=0.0)
    plain.generate(prompt, warm)
    spec.generate(prompt, warm)
    plain_speeds, spec_speeds = [], []
    for _ in range(args.repeats):
        base = plain.generate(prompt, params)[0]
        fast = spec.generate(prompt, params)[0]
        plain_speeds.append(base.stats.tokens_per_s)
        spec_speeds.append(fast.stats.tokens_per_s)
    print("\n--- prompt ---\n" + DEMO_PROMPT)
    print(f"--- completion ({args.method}) ---\n" + (fast.text or ""))
    print()
    # The demo writes the config a user would, so its fields carry source 'user'; say whose they are.
    print(f"specsure demo passes {json.dumps(demo_config(args.method))} as the speculative config "
          "(the fields marked [user] below are the demo's)")
    print_effective(spec)
    print_stats(fast)
    p, s = statistics.median(plain_speeds), statistics.median(spec_speeds)
    dtype = str(spec.target.lm.dtype).removeprefix("torch.")
    print(f"plain decoding: {p:.1f} tok/s; {args.method}: {s:.1f} tok/s; speedup {s / p:.2f}x "
          f"(median of {len(spec_speeds)} interleaved runs, dtype {dtype})")
    print(equality_line(fast.token_ids, base.token_ids, dtype, args.method))
    return EXIT_OK


def equality_line(fast: list[int], base: list[int], dtype: str, method: str = "ngram") -> str:
    """Whether the speculative output equals plain greedy decoding, and where it first differs."""
    if fast == base:
        return f"{method} output is identical to plain greedy decoding ({len(fast)} tokens)."
    first = next((i for i, (a, b) in enumerate(zip(fast, base)) if a != b), min(len(fast), len(base)))
    why = (" In bfloat16 a forward over several tokens rounds differently from one-token steps, so a near-tie"
           " can flip; run with --dtype float32 for exact equality." if dtype != "float32" else
           " In float32 this is a bug: please report it.")
    return f"{method} output DIFFERS from plain greedy decoding from token {first} on.{why}"
