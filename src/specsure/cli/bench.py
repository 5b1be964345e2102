"""`specsure bench`: Spec-Bench-style greedy benchmark of specsure against transformers.

The command line only: workloads, runners, results and plots live in ``specsure.bench``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from typing import Any

from specsure.bench.configs import (
    BASELINES, DEFAULT_K, DEFAULT_METHODS, DEFAULT_TREES, METHODS, Settings, build_specsure, build_transformers,
    check_checkpoint_flags, check_flag_values, dtype_name, lookup_max,
)
from specsure.bench.harness import Interrupted, Item, run_batched, run_interleaved, warm_up
from specsure.bench.llamacpp.baselines import LLAMA_CPP_BASELINES, add_llama_servers, build_llamacpp
from specsure.bench.llamacpp.server import DEFAULT_LLAMA_SERVER, LLAMA_SERVER_BASELINES
from specsure.bench.llamacpp.runner import DEFAULT_LLAMA_CPP_PYTHON, LlamaCppError
from specsure.bench.results import ALL, prompt_result, summarize
from specsure.bench.workload import (CATEGORIES, WorkloadError, category_list, encode, load_builtin, load_workloads,
                                      select)
from specsure.cli import bench_serve
from specsure.cli.bench_record import other_load, print_summary, run_meta, write_outputs
from specsure.cli.common import INT8_HELP, add_dtype_flag, int_at_least, writable_folder
from specsure.cli.guard import results_run
from specsure.config import ConfigError

QUICK = {"per_category": 2, "max_tokens": 96, "repeats": 3}
"""--quick: a few prompts per category, sized to finish in minutes on the default model."""
REFERENCE = "plain"
HF_BASELINE = "hf"


def _names(text: str, valid: tuple[str, ...], flag: str, nothing: str) -> list[str]:
    """The comma list of ``flag``; "none" alone means an empty list (``nothing`` says what that runs),
    and a list that names nothing at all is an error rather than a quiet default."""
    given = [n.strip() for n in text.split(",")]
    if not any(given):
        raise argparse.ArgumentTypeError(f"{flag} {text!r} names nothing; send a comma list of {', '.join(valid)}, "
                                         f"or 'none' for {nothing}.")
    if "" in given:  # plain,,ngram: a name was probably meant there
        raise argparse.ArgumentTypeError(f"{flag} {text!r} has an empty item; send a comma list of names without "
                                         "empty ones.")
    names = [n for n in given if n != "none"]
    bad = [n for n in names if n not in valid]
    if bad:
        raise argparse.ArgumentTypeError(f"{flag}: unknown {bad}; valid: {', '.join(valid)}")
    return list(dict.fromkeys(names))


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("bench", help="benchmark methods against Hugging Face transformers",
                            description="Greedy, batch 1, warm-up, interleaved repeats; tokens/s, speedups, "
                                        "acceptance and output equality per method and category.")
    add_arguments(parser)
    parser.set_defaults(run=run)
    # `specsure bench serve` loads running servers instead; plain `specsure bench` stays as it was.
    bench_serve.add_parser(parser.add_subparsers(dest="bench_mode", metavar="MODE"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the `specsure bench` options to `parser`."""
    parser.add_argument("--model", default=None, help="target: HF folder or .gguf (default: the packaged SmolLM2-135M-Instruct)")
    parser.add_argument("--methods", default=",".join(DEFAULT_METHODS),
                        help=f"comma list of specsure methods ({', '.join(METHODS)}; default all but the tree rows); "
                             "plain is always run")
    parser.add_argument("--baselines", default=",".join(BASELINES),
                        help=f"comma list of baselines, or none: transformers ({', '.join(BASELINES)}; the default) and "
                             f"llama.cpp ({', '.join(LLAMA_CPP_BASELINES)}; needs `make llama-cpp`; and "
                             f"{', '.join(LLAMA_SERVER_BASELINES)}; needs `make llama-server`)")
    parser.add_argument("--llama-cpp-python", default=DEFAULT_LLAMA_CPP_PYTHON, metavar="PATH",
                        help=f"the Python of an environment with llama-cpp-python (default {DEFAULT_LLAMA_CPP_PYTHON}, made by `make llama-cpp`)")
    parser.add_argument("--llama-server", default=DEFAULT_LLAMA_SERVER, metavar="PATH",
                        help=f"llama.cpp's llama-server binary (default {DEFAULT_LLAMA_SERVER}, made by `make llama-server`)")
    parser.add_argument("--categories", default=None, help="comma list of categories to run (default: all)")
    parser.add_argument("--workload", action="append", default=None, metavar="FILE.jsonl", help="your own prompts (schema: bench/README.md); repeatable")
    parser.add_argument("--heldout", action="store_true", help="use the built-in held-out split instead of the main one")
    parser.add_argument("--per-category", type=int_at_least(1), default=None, help="at most this many prompts per category")
    parser.add_argument("--max-tokens", type=int_at_least(1), default=None, help="new tokens per prompt unless the prompt sets max_tokens (default 128)")
    parser.add_argument("--repeats", type=int_at_least(1), default=None, help="timed repeats per configuration and prompt (default 3)")
    parser.add_argument("--warmup", type=int_at_least(0), default=1, help="untimed warm-up passes per configuration (default 1)")
    parser.add_argument("--quick", action="store_true", help=f"a few prompts per category: {QUICK} unless given explicitly")
    add_dtype_flag(parser, "auto, float32, bfloat16 or float16 (default auto)")
    parser.add_argument("--int8-activations", action="store_true",
                        help=f"every specsure row: {INT8_HELP}")
    parser.add_argument("--threads", type=int_at_least(1), default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--num-speculative-tokens", "-k", type=int_at_least(1), default=None,
                        help=f"k for every speculative configuration (default {DEFAULT_K} for ngram, ngram-tree, "
                             "suffix, draft_model and the baselines; the head's own default for eagle, eagle3 and "
                             "mtp, which for the shipped heads is a 2-node token tree in bf16 on a CPU with fast bf16 and their first "
                             "choice alone otherwise; -k N makes them chains of N)")
    parser.add_argument("--prompt-lookup-min", type=int, default=None, help="ngram: shortest n-gram to match")
    parser.add_argument("--prompt-lookup-max", type=int, default=None, help="ngram: longest n-gram to match")
    parser.add_argument("--prompt-lookup-branches", type=int_at_least(1), default=4,
                        help="ngram-tree: matches merged into each draft's token tree (default 4)")
    parser.add_argument("--token-tree", default=None, metavar="TREE",
                        help="eagle3-tree and mtp-tree: the speculative_token_tree, e.g. \"[(0,), (1,), (0, 0)]\" "
                             f"(default {DEFAULT_TREES['eagle3-tree']} for eagle3-tree and "
                             f"{DEFAULT_TREES['mtp-tree']} for mtp-tree, the shipped heads' own where bf16 is fast)")
    parser.add_argument("--suffix-max-tree-depth", type=int, default=None, help="suffix: suffix_decoding_max_tree_depth (vLLM's default 24)")
    parser.add_argument("--suffix-max-cached-requests", type=int, default=None,
                        help="suffix: suffix_decoding_max_cached_requests, earlier outputs kept (vLLM's default 10000; 0: off)")
    parser.add_argument("--suffix-max-spec-factor", type=float, default=None, help="suffix: suffix_decoding_max_spec_factor (vLLM's default 1.0)")
    parser.add_argument("--suffix-min-token-prob", type=float, default=None, help="suffix: suffix_decoding_min_token_prob (vLLM's default 0.1)")
    parser.add_argument("--draft-model", default=None, help="draft checkpoint for draft_model and hf-assisted (same tokenizer as the target)")
    parser.add_argument("--eagle-head", default=None, help="EAGLE-1 head checkpoint")
    parser.add_argument("--eagle3-head", default=None, help="EAGLE-3 head checkpoint")
    parser.add_argument("--mtp-head", default=None, help="MTP head checkpoint (default: MTP layers inside the target, if any)")
    parser.add_argument("--batched", type=int_at_least(0), default=0, metavar="N",
                        help="also run every prompt of each specsure configuration at once, N sequences batched, and "
                             "report its throughput and its exact-match rate against the same configuration at batch 1 "
                             "(default 0: off)")
    parser.add_argument("--out", default="bench/results", help="output folder (default bench/results)")


def _timed(args: argparse.Namespace, runners: list[Any], items: list[Item], repeats: int, asked: int,
           llama: Any) -> tuple[dict[Any, Any], list[Item], str | None, dict[str, Any] | None]:
    """The interleaved runs, then the batched pass: (runs, the items every configuration finished, what a
    Ctrl-C left out or None, the batched figures or None). llama.cpp's workers stop either way."""
    stopped: str | None = None  # what a Ctrl-C left out, for the results' header
    try:
        warm_up(runners, items[0], args.warmup)
        runs = run_interleaved(runners, items, repeats)
    except Interrupted as stop:
        # Ctrl-C: what every configuration finished is kept and written, marked as partial.
        if not stop.runs:
            raise
        runs = stop.runs
        kept = sorted({len(gens) for gens in runs.values()})
        span = str(kept[0]) if kept[0] == kept[-1] else f"{kept[0]} to {kept[-1]}"
        items = [it for it in items if it.prompt.id in stop.prompt_ids()]
        stopped = (f"stopped by Ctrl-C after {stop.done} of {stop.total} runs; these results hold the {len(items)} "
                   f"of {asked} prompts that every configuration finished, {span} of the {repeats} repeats "
                   "each" + (", without the batched pass" if args.batched else ""))
    finally:
        llama.close()
    batched = None
    if args.batched and stopped is None:
        try:
            batched = run_batched(args.batched, runners, items, runs)
        except KeyboardInterrupt:  # the batch-1 runs are whole: they are kept, the batched pass is not
            stopped = "stopped by Ctrl-C in the batched pass; the batch-1 results are whole, without the batched pass"
    return runs, items, stopped, batched


def _ran(runner: Any) -> dict[str, Any] | None:
    """The speculative config a specsure row ran (vLLM's keys, and its token tree); None for the others."""
    resolution = getattr(getattr(runner, "engine", None), "resolution", None)
    config = getattr(resolution, "config", None)
    if config is None:
        return None
    ran = config.to_vllm()
    if config.speculative_token_tree is not None:
        ran["speculative_token_tree"] = [list(node) for node in config.speculative_token_tree]
    return ran


def command_line(args: argparse.Namespace) -> str:
    """The `specsure bench` command that reproduces `args` (options left at default omitted)."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    defaults = vars(parser.parse_args([]))
    words = ["specsure", "bench"]
    for action in parser._actions:
        dest = action.dest
        if dest == "help" or getattr(args, dest, None) == defaults.get(dest):
            continue
        value = getattr(args, dest)
        flag = next(o for o in action.option_strings if o.startswith("--"))
        if value is True:
            words.append(flag)
        elif isinstance(value, list):
            for v in value:
                words += [flag, str(v)]
        else:
            words += [flag, str(value)]
    return shlex.join(words)


def _settings(args: argparse.Namespace, dtype: str) -> Settings:
    return Settings(
        model=args.model,
        dtype=dtype,
        num_speculative_tokens=args.num_speculative_tokens or DEFAULT_K,
        head_k=args.num_speculative_tokens,
        draft_model=args.draft_model,
        eagle_head=args.eagle_head,
        eagle3_head=args.eagle3_head,
        mtp_head=args.mtp_head,
        prompt_lookup_min=args.prompt_lookup_min,
        prompt_lookup_max=args.prompt_lookup_max,
        prompt_lookup_branches=args.prompt_lookup_branches,
        token_tree=args.token_tree,
        suffix_decoding_max_tree_depth=args.suffix_max_tree_depth,
        suffix_decoding_max_cached_requests=args.suffix_max_cached_requests,
        suffix_decoding_max_spec_factor=args.suffix_max_spec_factor,
        suffix_decoding_min_token_prob=args.suffix_min_token_prob,
        int8_activations=args.int8_activations,
    )


def _resolve_options(args: argparse.Namespace) -> tuple[int | None, int, int]:
    quick = QUICK if args.quick else {}
    per_category = args.per_category if args.per_category is not None else quick.get("per_category")
    max_tokens = args.max_tokens if args.max_tokens is not None else quick.get("max_tokens", 128)
    repeats = args.repeats if args.repeats is not None else quick.get("repeats", 3)
    for flag, value in (("--per-category", per_category), ("--max-tokens", max_tokens), ("--repeats", repeats), ("--num-speculative-tokens", args.num_speculative_tokens)):
        if value is not None and value <= 0:
            raise ValueError(f"{flag} must be a positive integer, got {value}")
    if args.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {args.warmup}")
    return per_category, max_tokens, repeats


def _load_prompts(args: argparse.Namespace, per_category: int | None):
    categories = category_list(args.categories)
    if args.workload and args.heldout:
        raise ValueError("--heldout chooses the built-in held-out split, and --workload your own prompts instead; "
                         "give one of them.")
    if args.workload:
        prompts = load_workloads(args.workload)
        for prompt in prompts:
            if prompt.category == ALL:
                raise WorkloadError(f"{prompt.source}: prompt {prompt.id!r} has category {ALL!r}, the name of the "
                                    "report's row over every category; choose another name.")
        if categories and (unknown := sorted(set(categories) - {p.category for p in prompts})):
            raise WorkloadError(f"--categories {args.categories}: no prompt of the --workload files has category "
                                f"{', '.join(map(repr, unknown))}; they have {sorted({p.category for p in prompts})}.")
    else:
        prompts = load_builtin(categories or CATEGORIES, heldout=args.heldout)
    chosen = select(prompts, categories, per_category)
    if not chosen:
        raise WorkloadError(f"no prompts left after --categories {args.categories}")
    return chosen


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; returns the process exit code."""
    try:
        with results_run(args.out):
            return _run(args)
    except (ConfigError, ValueError, argparse.ArgumentTypeError, LlamaCppError) as err:
        print(f"specsure bench: error: {err}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    import torch

    from specsure.models import load_model

    started = time.perf_counter()
    methods = _names(args.methods, METHODS, "--methods", f"'{REFERENCE}' alone")
    if REFERENCE not in methods:
        print(f"note: adding '{REFERENCE}' to --methods: it is the reference for speedups and output equality")
        methods.insert(0, REFERENCE)
    baselines = _names(args.baselines, BASELINES + LLAMA_CPP_BASELINES + LLAMA_SERVER_BASELINES, "--baselines",
                       "no baseline")
    per_category, max_tokens, repeats = _resolve_options(args)
    prompts = _load_prompts(args, per_category)
    # Before any model loads: a bad value is no skipped row, and a malformed one an error even where
    # no selected row reads it (every row's config is checked).
    check_flag_values([*methods, *(m for m in METHODS if m not in methods)], _settings(args, "auto"))  # asked first
    check_checkpoint_flags(methods, _settings(args, "auto"))
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    out_dir = writable_folder("--out", args.out)
    if (out_dir / "results.json").exists():
        print(f"note: {out_dir} holds an earlier run's results; this run's replace them when it ends", flush=True)

    print(f"loading target {args.model or '(packaged default)'} ...", flush=True)
    # transformers' baselines run this same model's own modules, which need its float32 weights
    target = load_model(args.model, args.dtype, args.int8_activations,
                        release_weights=not any(b in BASELINES for b in baselines))
    # Resolve 'auto' once so specsure and transformers run in exactly the same dtype.
    settings = _settings(args, dtype_name(target.lm.dtype))
    eos_ids = frozenset(target.eos_token_ids)
    items = [Item(p, encode(p, target.tokenizer), p.max_tokens or max_tokens) for p in prompts]
    context = target.lm.max_context
    for item in items:
        if bad := [t for t in item.prompt_ids if not 0 <= t < target.lm.vocab_size]:
            raise WorkloadError(f"prompt {item.prompt.id!r} holds token id {bad[0]}, outside the target's vocabulary "
                                f"[0, {target.lm.vocab_size}); fix its prompt_ids.")
        if context and len(item.prompt_ids) + item.max_tokens > context:  # each engine would stop at its own limit
            raise WorkloadError(f"prompt {item.prompt.id!r}: its {len(item.prompt_ids)} tokens and {item.max_tokens} "
                                f"new ones exceed the model's context of {context} tokens; lower --max-tokens (or the "
                                "prompt's max_tokens) or drop the prompt.")

    print(f"building engines: {', '.join(methods)} ...", flush=True)
    runners, skipped = build_specsure(methods, settings, eos_ids)
    asked = [m for m in methods if m != REFERENCE]
    if asked and {m for m, _ in skipped} >= set(asked):  # plain alone against nothing: a run that compares nothing
        raise ValueError("every method --methods asked for besides plain would be skipped ("
                         + "; ".join(f"{m}: {why}" for m, why in skipped) + "); give what they need, or ask for "
                         "--methods plain alone.")
    hf_runners, hf_skipped = build_transformers(
        [b for b in baselines if b in BASELINES], settings, target.lm.hf, eos_ids,
        lambda path: load_model(path, settings.dtype).lm.hf,
    )
    runners += hf_runners
    skipped += hf_skipped
    llama_names = [b for b in baselines if b in LLAMA_CPP_BASELINES]
    if llama_names:
        print(f"starting llama.cpp: {', '.join(llama_names)} ...", flush=True)
    # Room for the longest prompt, its new tokens and one full draft beyond them.
    n_ctx = max(len(it.prompt_ids) + it.max_tokens for it in items) + settings.num_speculative_tokens + 8
    llama = build_llamacpp(
        llama_names, python=args.llama_cpp_python, model=args.model, dtype=settings.dtype,
        num_speculative_tokens=settings.num_speculative_tokens, n_threads=torch.get_num_threads(),
        n_ctx=n_ctx, eos_ids=eos_ids, max_ngram_size=lookup_max(settings),
    )
    server_names = [b for b in baselines if b in LLAMA_SERVER_BASELINES]
    if server_names:
        print(f"starting llama-server: {', '.join(server_names)} ...", flush=True)
    try:  # from here on, _timed stops the llama.cpp processes; before it, a Ctrl-C must too
        add_llama_servers(llama, server_names, binary=args.llama_server, model=args.model,
                          k=settings.num_speculative_tokens, lookup_n=lookup_max(settings),
                          n_threads=torch.get_num_threads(), eos_ids=eos_ids, n_ctx=n_ctx)
    except BaseException:
        llama.close()
        raise
    runners += llama.runners
    skipped += llama.skipped
    if baselines and len(runners) == 1:  # plain alone: every baseline asked for was skipped, and no other method runs
        llama.close()
        raise ValueError("every baseline --baselines asked for would be skipped ("
                         + "; ".join(f"{m}: {why}" for m, why in skipped) + "), and --methods runs plain alone: "
                         "the run would compare nothing. Give the baselines what they need, or ask for more --methods.")
    for name, reason in skipped:
        print(f"skip {name}: {reason}")

    print(f"{len(items)} prompts x {len(runners)} configurations x {repeats} repeats, {settings.dtype}, {torch.get_num_threads()} threads")
    if (busy := other_load(torch.get_num_threads())) is not None:
        print(busy)
    if args.warmup == 0 and repeats < 3:  # a median of 3 or more leaves one slow first run out
        print("note: --warmup 0: each configuration's first timed run also pays its first-call costs (memory first "
              "touched, caches built), which weighs on its first prompt's figure; --warmup 1 or --repeats 3 keeps "
              "them out")
    runs, items, stopped, batched = _timed(args, runners, items, repeats, len(prompts), llama)
    ran = {r.name for r in runners}
    own_plain = {r.name: r.plain for r in runners if r.plain in ran}
    reference_ids = {it.prompt.id: runs[(REFERENCE, it.prompt.id)][0].token_ids for it in items}
    per_prompt = [
        prompt_result(
            r.name, it.prompt.id, it.prompt.category, len(it.prompt_ids), runs[(r.name, it.prompt.id)],
            None if r.name == REFERENCE else reference_ids[it.prompt.id],
            runs[(own_plain[r.name], it.prompt.id)][0].token_ids if r.name in own_plain else None,
        )
        for r in runners
        for it in items
    ]
    meta = run_meta(command_line(args), args, target, settings, max_tokens, repeats, len(items), llama.meta)
    results = summarize(meta, [(r.name, r.kind, r.speculative) for r in runners], skipped, per_prompt, REFERENCE, HF_BASELINE,
                        own_plain=own_plain, incomparable=[r.name for r in runners if not r.comparable],
                        speculative_configs={r.name: c for r in runners if (c := _ran(r)) is not None})
    if batched is not None:
        results.meta["batched"] = batched
    results.meta["wall_s"] = round(time.perf_counter() - started, 1)
    if stopped is not None:
        results.meta["interrupted"] = stopped
    write_outputs(results, out_dir)
    print_summary(results, out_dir)
    if stopped is not None:
        print(f"interrupted: {stopped}.", file=sys.stderr)
        return 130
    return 0


