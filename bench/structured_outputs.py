"""Structured outputs on the default model: tokens/s with and without a JSON Schema for plain,
suffix and eagle3 (the shipped head), interleaved per prompt; under the schema every method's
output must equal plain's and every finished output must parse. Each prompt runs twice, so
suffix's second run drafts from its first answer (docs/serving.md, "Structured outputs").

    .venv/bin/python bench/structured_outputs.py
"""
import time, json, statistics
from specsure import make_engine, SamplingParams
engines = {"plain": make_engine(dtype="float32"), "suffix": make_engine(speculative={"method": "suffix"}, dtype="float32"),
           "eagle3": make_engine(speculative={"method": "eagle3"}, dtype="float32")}
tok = engines["plain"].tokenizer
schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
          "city": {"type": "string"}, "hobbies": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
          "required": ["name", "age", "city", "hobbies"]}
qs = ["Describe a person named Alice as JSON.", "Give me a JSON record for a customer from Paris.",
      "Make up a JSON profile of a chess player.", "Return JSON about a teacher called Bob."]
prompts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True) for q in qs]
rows = {}
for rep in range(2):
    for p in prompts:
        ref = None
        for name, e in engines.items():
            for label, so in (("free", None), ("schema", {"json": schema})):
                params = SamplingParams(max_tokens=96, structured_outputs=so)
                t = time.perf_counter(); c = e.generate(p, params)[0]; dt = time.perf_counter() - t
                rows.setdefault((name, label), []).append((dt, len(c.token_ids), c.stats.mean_acceptance_length))
                if label == "schema":
                    if ref is None: ref = c.token_ids
                    assert c.token_ids == ref, name
                    if c.finish_reason == "stop": json.loads(c.text)
for (name, label), v in rows.items():
    tps = sum(n for _, n, _ in v) / sum(d for d, _, _ in v)
    al = statistics.mean(a for _, _, a in v if a)if any(a for _,_,a in v) else 0
    print(f"{name:7s} {label:7s} {tps:6.1f} tok/s  acceptance length {al:.2f}")
