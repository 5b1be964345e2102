"""Ask vLLM's own config code what it would run. Runs under vLLM's Python, never specsure's.

Standalone on purpose: it imports vLLM and the standard library only, so it runs in a
separate environment that has vLLM but not specsure. Input: a JSON list of cases on stdin,
each {"model": target path, "speculative_config": {...}}. Output: one stdout line
"SPECSURE_PROBE_RESULT <json>" with {"vllm_version", "results": [...]}; each result holds
what vLLM resolved (method, draft path, num_speculative_tokens, ngram bounds, the draft's
model_type and architectures after vLLM's rewrites) or an "error". vLLM's own logs go to
stderr. Exit 0 when vLLM imported, 3 when it did not.
"""

import json
import os
import sys
import traceback

MARKER = "SPECSURE_PROBE_RESULT "
# vLLM's suffix-decoding fields (the same names as specsure.config.schema.SUFFIX_FIELDS).
SUFFIX_KEYS = ("suffix_decoding_max_tree_depth", "suffix_decoding_max_cached_requests",
               "suffix_decoding_max_spec_factor", "suffix_decoding_min_token_prob")


def _probe(case):
    from vllm.engine.arg_utils import EngineArgs

    engine_args = EngineArgs(model=case["model"], speculative_config=dict(case["speculative_config"]),
                             skip_tokenizer_init=True)
    replaced = _speculators(engine_args)
    if replaced is not None:
        return replaced
    model_config = engine_args.create_model_config()
    parallel_config = engine_args.create_parallel_config() if hasattr(engine_args, "create_parallel_config") \
        else _parallel_config()
    spec = engine_args.create_speculative_config(model_config, parallel_config)
    if spec is None:
        return {"method": None}
    draft = spec.draft_model_config
    hf = getattr(draft, "hf_config", None)
    inner = getattr(hf, "model", None)  # EAGLEConfig wraps the checkpoint's own config
    return {
        "method": spec.method,
        "model": spec.model,
        "draft_path": getattr(draft, "model", None) if spec.method not in ("ngram", "ngram_gpu", "suffix") else None,
        "num_speculative_tokens": spec.num_speculative_tokens,
        "prompt_lookup_min": spec.prompt_lookup_min,
        "prompt_lookup_max": spec.prompt_lookup_max,
        **{key: getattr(spec, key, None) for key in SUFFIX_KEYS},
        "draft_model_type": getattr(inner, "model_type", None) or getattr(hf, "model_type", None),
        "draft_architectures": list(getattr(hf, "architectures", None) or []),
        "target_model_type": getattr(model_config.hf_config, "model_type", None),
    }


def _speculators(engine_args):
    """create_engine_config's first step: a speculators-format target replaces --model with its
    verifier and the method and draft with its own. Their answer, when it did (the verifier is a
    Hub repository, which this probe does not download), else None."""
    from vllm.engine import arg_utils

    override = getattr(arg_utils, "maybe_override_with_speculators", None)
    if override is None:
        return None
    asked = engine_args.model
    extra = {"hf_token": engine_args.hf_token} if hasattr(engine_args, "hf_token") else {}
    model, tokenizer, spec = override(model=asked, tokenizer=engine_args.tokenizer, revision=engine_args.revision,
                                      trust_remote_code=engine_args.trust_remote_code,
                                      vllm_speculative_config=engine_args.speculative_config, **extra)
    if model == asked:
        return None
    spec = dict(spec or {})
    return {"method": spec.get("method"), "model": spec.get("model"), "draft_path": spec.get("model"),
            "num_speculative_tokens": spec.get("num_speculative_tokens"), "target": model,
            "replaced_by_speculators": True}


def _plugin_installed():
    from importlib.metadata import entry_points

    return any(ep.name == "specsure" for ep in entry_points(group="vllm.general_plugins"))


def _parallel_config():
    from vllm.config import ParallelConfig

    return ParallelConfig()


def main():
    cases = json.load(sys.stdin)
    real_stdout = sys.stdout
    sys.stdout = sys.stderr  # vLLM's logs must not mix with the result line
    try:
        import vllm
    except Exception as exc:  # any import failure means "no usable vLLM here"
        print(MARKER + json.dumps({"import_error": f"{type(exc).__name__}: {exc}"}), file=real_stdout)
        return 3
    results = []
    for case in cases:
        try:
            results.append(_probe(case))
        except BaseException as exc:  # vLLM raises many types; each case reports its own
            if isinstance(exc, KeyboardInterrupt):
                raise
            results.append({"error": f"{type(exc).__name__}: {exc}",
                            "traceback": traceback.format_exc(limit=6)})
    print(MARKER + json.dumps({"vllm_version": getattr(vllm, "__version__", "unknown"),
                               "python": sys.executable, "pid": os.getpid(), "results": results,
                               "specsure_plugin": _plugin_installed()},
                              default=str), file=real_stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
