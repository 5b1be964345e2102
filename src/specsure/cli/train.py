"""`specsure train`: distill a draft head from a target (the logic lives in specsure.train)."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from specsure.cli.common import EXIT_OK

METHODS = ("mtp",)


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "train", help="distill an MTP draft head from a target (self-distillation)",
        description="Generate the target's own greedy continuations of the prompts, then train a head to "
                    "predict the target's next-next token distribution from its hidden states. Writes a "
                    "SpecsureMTPHead folder that runs with {\"method\": \"mtp\", \"model\": OUT}.")
    parser.add_argument("--method", default="mtp", choices=METHODS, help="head to train (default mtp)")
    parser.add_argument("--model", default=None,
                        help="target model: a Hugging Face folder or a .gguf file; default: the packaged "
                             "SmolLM2-135M-Instruct")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="head folder to write (its parent must exist; an earlier head there is replaced)")
    parser.add_argument("--prompts", action="append", default=None, metavar="FILE.jsonl",
                        help="training prompts in the bench workload schema (bench/README.md); repeatable; "
                             "default: the built-in bench workloads (not the held-out split)")
    parser.add_argument("--max-prompts", type=int, default=None, metavar="N", help="use at most the first N prompts")
    parser.add_argument("--max-new-tokens", type=int, default=128, metavar="N",
                        help="greedy tokens generated per prompt for the training text (default 128)")
    parser.add_argument("--steps", type=int, default=300, help="optimiser steps (default 300)")
    parser.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (default 2e-3)")
    parser.add_argument("--seq-len", type=int, default=256, help="longest training window in tokens (default 256)")
    parser.add_argument("--init", default="random", choices=("random", "last_layer"),
                        help="how the head's block starts: small random weights (default), or the target's last "
                             "layer with its output projections zeroed")
    parser.add_argument("--seed", type=int, default=0, help="seed for the held-out split and the window order")
    parser.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                        help="the target's dtype for generation and features; the head trains in float32")
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="torch CPU threads (default: every core this process may use)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.set_defaults(run=run)


def _positive(name: str, value: int | None) -> None:
    if value is not None and value <= 0:
        raise ValueError(f"{name} {value}: must be a positive integer.")


def run(args: argparse.Namespace) -> int:
    # Check everything a user can get wrong before loading torch or the model.
    for flag, value in (("--max-prompts", args.max_prompts), ("--max-new-tokens", args.max_new_tokens),
                        ("--threads", args.threads)):
        _positive(flag, value)
    from specsure.bench.workload import encode, load_builtin, load_workload
    from specsure.train import check_out_dir
    from specsure.train.mtp import MTPTrainSettings

    settings = MTPTrainSettings(steps=args.steps, lr=args.lr, seq_len=args.seq_len, seed=args.seed,
                               init=args.init)
    out = check_out_dir(args.out)
    rows = [p for path in args.prompts for p in load_workload(path)] if args.prompts else load_builtin()
    rows = rows[: args.max_prompts]

    import torch

    from specsure.models.loading import load_model
    from specsure.train import save_mtp_head, self_distill, train_mtp

    torch.set_num_threads(args.threads or len(os.sched_getaffinity(0)))
    started = time.perf_counter()
    target = load_model(args.model, dtype=args.dtype)
    prompts = [list(encode(row, target.tokenizer)) for row in rows]
    samples = self_distill(target, prompts, args.max_new_tokens, progress=not args.no_progress)
    data_s = time.perf_counter() - started
    tokens = sum(s.token_ids.shape[0] for s in samples)
    result = train_mtp(target, samples, settings, progress=not args.no_progress)
    before, after = result.before, result.after
    training = {
        "method": args.method, "target": args.model or "default (SmolLM2-135M-Instruct)",
        "target_folder": target.path, "dtype": str(target.lm.dtype).removeprefix("torch."),
        "settings": {"steps": settings.steps, "lr": settings.lr, "seq_len": settings.seq_len, "seed": settings.seed,
                     "init": settings.init, "max_new_tokens": args.max_new_tokens,
                     "threads": torch.get_num_threads()},
        "data": {"prompts": len(prompts), "tokens": tokens, "train_sequences": result.train_sequences,
                 "heldout_sequences": result.heldout_sequences, "seconds": round(data_s, 1)},
        "heldout": {"kl_before": before.kl, "kl_after": after.kl, "top1_before": before.agreement,
                    "top1_after": after.agreement, "entries": after.entries},
        "train_seconds": round(result.train_s, 1),
    }
    save_mtp_head(result.module, target.lm, out, training)
    where = "held-out" if result.heldout_sequences else "training (too few prompts to hold any out)"
    print(f"data: {len(prompts)} prompts, {tokens} tokens in {data_s:.0f} s; training: {settings.steps} steps "
          f"in {result.train_s:.0f} s")
    print(f"wrote {out}")
    model_flag = f" --model {args.model}" if args.model else ""
    spec = json.dumps({"method": "mtp", "model": str(Path(out).resolve()), "num_speculative_tokens": 2})
    print(f"run it: specsure generate{model_flag} --speculative-config '{spec}' PROMPT")
    print(f"{where} top-1 agreement: {after.agreement:.1%} (warm start {before.agreement:.1%}), "
          f"KL {before.kl:.3f} -> {after.kl:.3f} nats over {after.entries} continuation tokens")
    return EXIT_OK
