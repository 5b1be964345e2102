"""Drafts from the constraint: what a structured output's foreseen text adds to each method's
drafting. Three variants of every method, interleaved prompt by prompt, on the default model in
float32, greedy; every constrained output must equal plain decoding's:
- foreseen: the default (forced text, and the output's own choice at places with a few ways on);
- forced only: ``HABIT_BRANCHES`` patched to 1, so only text the constraint forces is drafted;
- pruned only: ``Constraint._predicted`` patched to draft nothing, as before drafts from the constraint.

    .venv/bin/python bench/forced_drafts.py [--tokens 96] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from typing import Any, Iterator

from specsure import SamplingParams, make_engine
from specsure.decode import structured

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "city": {"type": "string"},
                                           "hobbies": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
          "required": ["name", "age", "city", "hobbies"]}
WEATHER = {"type": "object", "properties": {"city": {"type": "string"},
                                            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 14}},
           "required": ["city", "unit", "days"]}
WORKLOADS = {
    "json schema": (PERSON, ["Describe a person named Alice as JSON.", "Give me a JSON record for a customer from Paris.",
                             "Make up a JSON profile of a chess player.", "Return JSON about a teacher called Bob.",
                             "Write a JSON profile of a retired sailor.", "A JSON entry for a student who likes music."]),
    "tool arguments": (WEATHER, ["What will the weather be in Oslo this week?", "Is it going to rain in Lima tomorrow?",
                                 "Forecast for Tokyo for the next ten days, please.", "How hot is it in Cairo?",
                                 "Will it snow in Denver over the weekend?", "Weather in Sydney in fahrenheit."]),
}
WORKLOADS["json schema, one line"] = (PERSON, WORKLOADS["json schema"][1])
"""The same requests with disable_any_whitespace: every separator is forced."""
METHODS = ("ngram", "suffix", "eagle3", "mtp")


VARIANTS = ("foreseen", "forced only", "pruned only")


@contextlib.contextmanager
def variant(name: str) -> Iterator[None]:
    """Run the constraint's drafting as ``name`` says (module docstring)."""
    predicted, branches = structured.Constraint._predicted, structured.HABIT_BRANCHES
    if name == "pruned only":
        structured.Constraint._predicted = lambda self, limit, data: []  # type: ignore[method-assign]
    elif name == "forced only":
        structured.HABIT_BRANCHES = 1
    try:
        yield
    finally:
        structured.Constraint._predicted, structured.HABIT_BRANCHES = predicted, branches  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    # One engine per variant: suffix's drafts come from earlier answers, which must be each variant's own.
    engines = {("plain", "-"): make_engine(dtype="float32")}
    for method in METHODS:
        for name in VARIANTS:
            engines[(method, name)] = make_engine(speculative={"method": method}, dtype="float32")
    tok = engines[("plain", "-")].tokenizer
    rows: dict[tuple[str, str, str], list[Any]] = {}
    for workload, (schema, questions) in WORKLOADS.items():
        compact = workload.endswith("one line")
        params = SamplingParams(max_tokens=args.tokens,
                                structured_outputs={"json": schema, "disable_any_whitespace": compact})
        for i, question in enumerate(questions):
            prompt = tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                             add_generation_prompt=True)
            ref = None
            order = list(engines.items()) if i % 2 == 0 else list(reversed(engines.items()))
            for (name, how), engine in order:
                with variant(how):
                    start = time.perf_counter()
                    out = engine.generate(prompt, params)[0]
                    elapsed = time.perf_counter() - start
                ref = out.token_ids if ref is None else ref
                assert out.token_ids == ref, (name, how, question)
                if out.finish_reason == "stop":
                    json.loads(out.text)
                rows.setdefault((workload, name, how), []).append(
                    (elapsed, len(out.token_ids), out.stats.accepted_tokens, out.stats.drafts))
    rows = dict(sorted(rows.items(), key=lambda kv: (kv[0][0], list(engines).index(kv[0][1:]))))
    lines = ["| workload | method | drafting | tok/s | vs plain | acceptance length |", "|---|---|---|---|---|---|"]
    for workload in WORKLOADS:
        plain = rows[(workload, "plain", "-")]
        base = sum(n for _, n, _, _ in plain) / sum(t for t, _, _, _ in plain)
        for (w, name, how), runs in rows.items():
            if w != workload:
                continue
            tps = sum(n for _, n, _, _ in runs) / sum(t for t, _, _, _ in runs)
            drafts = sum(d for *_, d in runs)
            length = 1 + sum(a for _, _, a, _ in runs) / drafts if drafts else 1.0
            lines.append(f"| {workload} | {name} | {how} | {tps:.1f} | {tps / base:.2f}x | {length:.2f} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(f"# .venv/bin/python bench/forced_drafts.py --tokens {args.tokens}\n{text}\n")


if __name__ == "__main__":
    main()
