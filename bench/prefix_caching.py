"""A multi-turn chat with and without prefix caching, interleaved turn by turn (docs/serving.md).

Two engines on the default model (one with ``enable_prefix_caching``) hold the same conversation:
a long system message (the first part of specsure's own docs/configuration.md), then user turns,
each answer appended before the next turn; each repeat is a new conversation about another part of
the document. Each turn is timed on both engines back to back, the
order alternating; time to first token (the prompt's forward and its first token) and the whole
turn (prompt and cached tokens too) are reported as medians over the repeats, and the answers must
be equal.

    .venv/bin/python bench/prefix_caching.py --method ngram --repeats 3 --out bench/avx2-prefix-caching
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from specsure import SamplingParams, make_engine
from specsure.decode.engine import Engine

TURNS = ("What does specsure do with a method I set myself?", "And when I set nothing at all?",
         "Give me a short example config for ngram.", "Which field would you change first to go faster?",
         "Summarize our conversation in two sentences.")


def _system(chars: int, part: int) -> str:
    """A system message with a part of the document: each repeat talks about another part, so its
    first turn shares only the message's first line with the cache."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text()
    return "You answer questions about this document.\n\n" + text[part * chars: (part + 1) * chars]


def _turn(engine: Engine, prompt: list[int], params: SamplingParams) -> tuple[float, float, list[int], int]:
    start = time.perf_counter()
    first = None
    for update in engine.generate_stream(prompt, params):
        first = first or time.perf_counter() - start
        if update.completion is not None:
            return first, time.perf_counter() - start, update.completion.token_ids, update.completion.cached_tokens
    raise AssertionError("the stream ended without a completion")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="ngram", help="ngram, suffix or plain")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--system-chars", type=int, default=2400)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    spec = None if args.method == "plain" else {"method": args.method}
    engines = {caching: make_engine(None, spec, enable_prefix_caching=caching) for caching in (False, True)}
    tokenizer = engines[False].tokenizer
    params = SamplingParams(max_tokens=args.max_tokens)
    rows: list[dict] = []
    for repeat in range(args.repeats):
        messages = [{"role": "system", "content": _system(args.system_chars, repeat)}]
        for turn, question in enumerate(TURNS):
            messages.append({"role": "user", "content": question})
            prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                   return_dict=False)
            order = (False, True) if (repeat + turn) % 2 == 0 else (True, False)
            timed = {caching: _turn(engines[caching], prompt, params) for caching in order}
            assert timed[False][2] == timed[True][2], f"turn {turn}: the answers differ"
            rows.append({"repeat": repeat, "turn": turn, "prompt_tokens": len(prompt),
                         "cached_tokens": timed[True][3], "ttft_s": {str(c): timed[c][0] for c in timed},
                         "turn_s": {str(c): timed[c][1] for c in timed}})
            messages.append({"role": "assistant", "content": tokenizer.decode(timed[True][2], skip_special_tokens=True)})
    print(f"{'turn':>4} {'prompt':>6} {'cached':>6} {'ttft off':>9} {'ttft on':>8} {'ratio':>6} "
          f"{'turn off':>9} {'turn on':>8} {'ratio':>6}")
    summary = []
    for turn in range(len(TURNS)):
        mine = [r for r in rows if r["turn"] == turn]

        def median(kind: str, caching: bool) -> float:
            return statistics.median(r[kind][str(caching)] for r in mine)

        line = {"turn": turn, "prompt_tokens": statistics.median(r["prompt_tokens"] for r in mine),
                "cached_tokens": statistics.median(r["cached_tokens"] for r in mine),
                **{f"{kind}_{'on' if c else 'off'}": median(kind, c) for kind in ("ttft_s", "turn_s") for c in (False, True)}}
        summary.append(line)
        print(f"{turn:>4} {line['prompt_tokens']:>6.0f} {line['cached_tokens']:>6.0f} {line['ttft_s_off']:>9.3f} "
              f"{line['ttft_s_on']:>8.3f} {line['ttft_s_off'] / line['ttft_s_on']:>5.2f}x {line['turn_s_off']:>9.3f} "
              f"{line['turn_s_on']:>8.3f} {line['turn_s_off'] / line['turn_s_on']:>5.2f}x")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{args.method}.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                                  "rows": rows, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
