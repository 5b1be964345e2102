"""Greedy generation with llama-cpp-python. Runs under llama.cpp's Python, never specsure's.

Standalone on purpose: it imports llama_cpp and the standard library only (llama_cpp brings
numpy), so it runs in .venv-llamacpp, which has llama-cpp-python but not specsure. One
process serves a whole benchmark, so the bench can interleave llama.cpp with the other
configurations; it reads JSON lines on stdin and answers each with one stdout line
"SPECSURE_LLAMACPP <json>" (llama.cpp's own output goes to stderr).

1. Setup: {"models": [{"name", "path", "num_pred_tokens"}], "n_ctx", "n_threads", "n_batch"}
   -> {"llama_cpp_python", "system_info", "models": [name, ...]}, {"import_error"} or {"error"}.
   num_pred_tokens > 0 adds llama-cpp-python's prompt-lookup drafter with that k.
2. Each request: {"name", "prompt_ids", "max_tokens", "eos_ids"} -> {"token_ids", "seconds",
   "drafts", "draft_tokens", "accepted_tokens", "accepted_per_position"} or {"error"}.
   Greedy (temp 0 runs llama.cpp's greedy sampler; penalties neutral), the KV cache reset
   first so every call pays its prefill, stopped at max_tokens or an EOS id (not returned).
   `seconds` is the wall time of the whole generate loop, prefill included.
End of stdin ends the process (exit 0); exit 3 when llama_cpp does not import.
"""

import json
import sys
import time
import traceback

MARKER = "SPECSURE_LLAMACPP "


class Counting:
    """Wraps the prompt-lookup drafter to record each draft, for vLLM-style acceptance counts."""

    def __init__(self, drafter):
        self.drafter = drafter
        self.drafts = []

    def __call__(self, input_ids, /, **kwargs):
        draft = self.drafter(input_ids, **kwargs)
        self.drafts.append([int(t) for t in draft])
        return draft


def _load(setup):
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    models = {}
    for spec in setup["models"]:
        drafter = None
        if spec["num_pred_tokens"] > 0:
            drafter = Counting(LlamaPromptLookupDecoding(max_ngram_size=spec.get("max_ngram_size", 2),
                                                         num_pred_tokens=spec["num_pred_tokens"]))
        llm = Llama(model_path=spec["path"], n_ctx=setup["n_ctx"], n_batch=setup["n_batch"],
                    n_threads=setup["n_threads"], n_threads_batch=setup["n_threads"],
                    logits_all=False, draft_model=drafter, verbose=False)
        models[spec["name"]] = (llm, drafter)
    return models


def _generate(llm, drafter, prompt_ids, max_tokens, eos_ids):
    eos = set(eos_ids)
    token_ids = []
    seen = 0  # drafts already accounted for
    draft, position = [], 0  # the draft being verified and the next position to check in it
    drafts = draft_tokens = 0
    accepted = [0] * (drafter.drafter.num_pred_tokens if drafter is not None else 0)
    llm.reset()  # otherwise generate() reuses the cached prompt prefix and skips prefill
    start = time.perf_counter()
    # temp 0 is llama.cpp's greedy sampler (argmax); the penalty sampler in front is neutral.
    stream = llm.generate(list(prompt_ids), temp=0.0, repeat_penalty=1.0, frequency_penalty=0.0,
                          presence_penalty=0.0, reset=True)
    for token in stream:
        if drafter is not None and len(drafter.drafts) > seen:
            # This token is the first one sampled after a new draft was verified.
            draft, position = drafter.drafts[-1], 0
            seen = len(drafter.drafts)
            if draft:
                drafts += 1
                draft_tokens += len(draft)
        if position < len(draft):
            if token == draft[position]:
                accepted[position] += 1
                position += 1
            else:
                position = len(draft)  # rejected: the rest of this draft is discarded
        if token in eos:
            break
        token_ids.append(int(token))
        if len(token_ids) >= max_tokens:
            break
    seconds = time.perf_counter() - start
    stream.close()
    return {"token_ids": token_ids, "seconds": seconds, "drafts": drafts, "draft_tokens": draft_tokens,
            "accepted_tokens": sum(accepted), "accepted_per_position": accepted}


def _answer(out, value):
    out.write(MARKER + json.dumps(value) + "\n")
    out.flush()


def main():
    out = sys.stdout
    sys.stdout = sys.stderr  # anything else printed must not mix with the answer lines
    setup = json.loads(sys.stdin.readline())
    try:
        import llama_cpp
    except Exception as exc:  # any import failure means "no usable llama-cpp-python here"
        _answer(out, {"import_error": f"{type(exc).__name__}: {exc}"})
        return 3
    try:
        models = _load(setup)
    except Exception as exc:
        _answer(out, {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=6)})
        return 1
    _answer(out, {"llama_cpp_python": getattr(llama_cpp, "__version__", "unknown"), "python": sys.executable,
                  "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
                  "models": list(models)})
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        try:
            llm, drafter = models[request["name"]]
            _answer(out, _generate(llm, drafter, request["prompt_ids"], request["max_tokens"], request["eos_ids"]))
        except Exception as exc:
            _answer(out, {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=6)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
