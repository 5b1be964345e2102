"""`specsure train`: distill a draft head from a target (the logic lives in specsure.train)."""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from specsure.cli.common import EXIT_OK, add_dtype_flag, seed_value
from specsure.config.checkpoint import is_default_gguf
from specsure.config.shipped import shipped_head

if TYPE_CHECKING:
    from specsure.train.eagle3 import Eagle3TrainSettings
    from specsure.train.mtp import MTPTrainSettings

METHODS = ("mtp", "eagle3")
DEFAULT_LR = {"mtp": 2e-3, "eagle3": 1e-3}
DRAFT_VOCAB = 8192
"""Default draft vocabulary: 93% of the default model's answer tokens on the bench's held-out prompts."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "train", help="distill an MTP or EAGLE-3 draft head from a target (self-distillation)",
        description="Generate the target's own greedy continuations of the prompts, then train a head to "
                    "predict the target's next-next token distribution from its features. --method mtp writes "
                    "a SpecsureMTPHead folder that runs with {\"method\": \"mtp\", \"model\": OUT}; --method "
                    "eagle3 writes an EAGLE-3 head in the public layout (LlamaForCausalLMEagle3) that runs "
                    "with {\"method\": \"eagle3\", \"model\": OUT} here, in vLLM and in SGLang.")
    parser.add_argument("--method", default="mtp", choices=METHODS, help="head to train (default mtp)")
    parser.add_argument("--model", default=None,
                        help="target model: a Hugging Face folder or a .gguf file; default: the packaged "
                             "SmolLM2-135M-Instruct")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="head folder to write (its parent must exist; an earlier head there is replaced)")
    parser.add_argument("--prompts", action="append", default=None, metavar="FILE.jsonl",
                        help="training prompts in the bench workload schema (bench/README.md); repeatable; "
                             "default: the built-in bench workloads (not the held-out split)")
    parser.add_argument("--corpus", default=None, metavar="PACKAGES",
                        help="also (or, without --prompts, only) prompts made from the docstrings and functions of "
                             "these installed PyPI packages, comma-separated, each recorded with its licence "
                             "(for example numpy,transformers,jinja2,tqdm; docs/training.md), a name:N weight "
                             "taking N of its prompts per round (chat:2); the name chat adds "
                             "specsure's own chat-style prompts and tasks built on their answers, math its word "
                             "problems, chatterbot-corpus the opening turns of that package's conversations, "
                             "self requests the target writes itself (sampled from its chat template's user turn; "
                             "tasks are built on their answers too)")
    parser.add_argument("--data", default="self-distill", choices=("self-distill", "text"),
                        help="self-distill (default): the target answers every prompt and the head learns its "
                             "answers; text: teacher forcing over the corpus's own docstrings and functions, each "
                             "the answer to its prompt, labelled with the target's distribution (no generation; "
                             "package prompts only)")
    parser.add_argument("--corpus-prompts", type=int, default=800, metavar="N",
                        help="how many --corpus prompts, spread over the packages (default 800)")
    parser.add_argument("--max-prompts", type=int, default=None, metavar="N", help="use at most the first N prompts")
    parser.add_argument("--max-new-tokens", type=int, default=128, metavar="N",
                        help="greedy tokens generated per prompt for the training text (default 128)")
    parser.add_argument("--steps", type=int, default=300, help="optimiser steps (default 300)")
    parser.add_argument("--lr", type=float, default=None, help="peak learning rate (default 2e-3 for mtp, 1e-3 for eagle3)")
    parser.add_argument("--seq-len", type=int, default=256, help="longest training window in tokens (default 256)")
    parser.add_argument("--modules", type=int, default=None, metavar="N",
                        help="mtp: modules trained together (num_nextn_predict_layers); module i drafts token i+1 "
                             "(default 1, or the --init-from head's)")
    parser.add_argument("--init", default=None, choices=("random", "last_layer"),
                        help="mtp: how a new head's block starts: small random weights (default), or the target's "
                             "last layer with its output projections zeroed")
    parser.add_argument("--init-from", default=None, metavar="DIR",
                        help="continue training this head of the --method's kind (its weights and draft vocabulary; "
                             "an EAGLE-3 head's aux layers, an MTP head's modules) instead of starting a new one, for "
                             "example for more unrolled steps or your own --prompts; 'shipped' names the head "
                             "shipped for the default model")
    parser.add_argument("--unroll", type=int, default=None, metavar="N",
                        help="draft steps unrolled in training, each fed back as the engine drafts it (eagle3: the "
                             "training-time test, default 7; mtp: steps beyond --modules reuse the modules "
                             "cyclically, default --modules)")
    parser.add_argument("--aux-layers", default=None, metavar="I,J,K",
                        help="eagle3: the target layers whose residual-stream inputs the head fuses, ascending "
                             "comma-separated indices in [0, N] for a target of N layers, N meaning the last "
                             "layer's output before the final norm (default 2,N/2,N-3, EAGLE-3's); "
                             "written to the head's eagle_aux_hidden_state_layer_ids, which vLLM and SGLang read "
                             "(they fuse exactly three)")
    parser.add_argument("--draft-vocab-size", type=int, default=None, metavar="N",
                        help="tokens the head drafts among, the most frequent in the training text, at most the "
                             "target's vocabulary (default 8192). eagle3: the head's own LM head has these rows; "
                             "mtp: the head trains and drafts among these, reading a fraction of the target's LM "
                             "head per step (0: the whole vocabulary)")
    parser.add_argument("--intermediate-size", type=int, default=None, metavar="N",
                        help="eagle3: the new head's MLP units (default: the target's intermediate_size). Wider "
                             "learned no more from the shipped heads' data on 2 cores (docs/training.md); a run "
                             "with far more data may want it")
    parser.add_argument("--loss-on", default="all", choices=("answer", "all"),
                        help="all (default): score every position, the prompt's text too; answer: only the positions "
                             "the engine drafts from, the answer after each prompt, with the prompt as context "
                             "(faster steps, but fewer entries a step; docs/training.md)")
    parser.add_argument("--train-dtype", default="float32", choices=("float32", "bfloat16"),
                        help="the head's arithmetic while it trains: float32 (default), or bfloat16 under autocast, "
                             "the weights and optimiser still float32: eagle3 steps about 1.16x faster on CPUs with "
                             "bfloat16 matrix units (AMX, AVX512-BF16), mtp steps no faster, and slower on CPUs "
                             "without such units (docs/training.md)")
    parser.add_argument("--batch-windows", type=int, default=1, metavar="N",
                        help="eagle3: training windows (each of a random sequence) packed into one optimiser step "
                             "(default 1); more windows a step take fewer, larger matrix products")
    parser.add_argument("--eval-every", type=int, default=0, metavar="STEPS",
                        help="measure the held-out acceptance length (mtp: and first-step agreement) every this "
                             "many steps, the curve in training.json (default: only before and after)")
    parser.add_argument("--checkpoint-every", type=int, default=100, metavar="STEPS",
                        help="write a resume point every this many steps next to --out; a run interrupted "
                             "or diverged goes on from it when the same command runs again (default 100; 0: off)")
    parser.add_argument("--seed", type=seed_value, default=0,
                        help="seed for the held-out split and the window order")
    add_dtype_flag(parser, "the target's dtype for generation and features; the head trains in float32")
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="torch CPU threads (default: every core this process may use)")
    parser.add_argument("--cache-dir", default=None, metavar="DIR",
                        help="where the self-distilled samples are cached, so a second run on the same data starts "
                             "training at once (default $XDG_CACHE_HOME/specsure/train)")
    parser.add_argument("--no-cache", action="store_true", help="neither read nor write the sample cache")
    parser.add_argument("--expect-data-sha256", default=None, metavar="HEX",
                        help="the tokens_sha256 that an earlier run's training.json records for its data; a warning "
                             "says so when this run's data differs (other package versions, CPU or forward path), "
                             "since its head will then differ too (make heads gives the shipped heads' digest)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.set_defaults(run=run_guarded)


def _positive(name: str, value: int | None) -> None:
    if value is not None and value <= 0:
        raise ValueError(f"{name} {value}: must be a positive integer.")


def run(args: argparse.Namespace) -> int:
    # Check everything a user can get wrong before loading torch or the model.
    for flag, value in (("--max-prompts", args.max_prompts), ("--max-new-tokens", args.max_new_tokens),
                        ("--threads", args.threads), ("--corpus-prompts", args.corpus_prompts),
                        ("--batch-windows", args.batch_windows), ("--intermediate-size", args.intermediate_size)):
        _positive(flag, value)
    if args.corpus is not None and not args.corpus.strip(" ,"):  # "" would fall back to the built-in prompts unsaid
        raise ValueError(f"--corpus {args.corpus!r} names no source; give sources such as chat,numpy, or leave the "
                         "flag out for the built-in prompts.")
    if args.checkpoint_every < 0:
        raise ValueError(f"--checkpoint-every {args.checkpoint_every}: must be 0 (off) or a positive number of steps.")
    if args.eval_every < 0:
        raise ValueError(f"--eval-every {args.eval_every}: must be 0 (off) or a positive number of steps.")
    expected = args.expect_data_sha256
    if expected is not None:
        if not re.fullmatch(r"[0-9a-fA-F]{64}", expected):
            raise ValueError(f"--expect-data-sha256 {expected!r}: give the 64 hex digits of a training.json's "
                             "data.tokens_sha256.")
        args.expect_data_sha256 = expected.lower()  # as hexdigest() writes it
    from specsure.train import check_out_dir
    from specsure.train.out_lock import hold

    lr = args.lr if args.lr is not None else DEFAULT_LR[args.method]
    if args.method == "mtp" and args.batch_windows != 1:
        raise ValueError(f"--batch-windows {args.batch_windows}: only --method eagle3 packs windows; leave it at 1 "
                         "for mtp (its steps are one window each).")
    if args.init is not None and args.init_from is not None:
        raise ValueError(f"--init {args.init}: a continued head starts from the weights --init-from gives; leave "
                         "--init out.")
    if args.init_from not in (None, "shipped") and not Path(args.init_from).expanduser().is_dir():
        raise ValueError(f"--init-from {args.init_from!r} is not a folder; give the folder of a head to continue "
                         "(one specsure train wrote, or 'shipped').")
    if args.init_from == "shipped" and args.model is not None and not is_default_gguf(args.model):
        raise ValueError("--init-from shipped names the head shipped for the default model, but --model gives "
                         f"another target ({args.model}); give the folder of a head made for it.")
    if args.method == "mtp" and args.intermediate_size is not None:
        raise ValueError(f"--intermediate-size {args.intermediate_size}: only --method eagle3 sizes its own MLP (an "
                         "MTP head's block takes the target's sizes); leave it out for mtp.")
    for flag, value in (("--modules", args.modules), ("--init", args.init)):
        if args.method == "eagle3" and value is not None:
            raise ValueError(f"{flag} {value}: only --method mtp takes it (an EAGLE-3 head has one layer and starts "
                             "from random weights or --init-from); leave it out for eagle3.")
    if args.method == "mtp" and args.aux_layers is not None:
        raise ValueError(f"--aux-layers {args.aux_layers}: only --method eagle3 fuses aux layers (an MTP head reads "
                         "the target's last hidden state); leave it out for mtp.")
    try:
        settings = _settings(args, lr)
    except ValueError as err:  # the settings name their fields; the user typed flags
        field, _, rest = str(err).partition(" = ")
        raise ValueError(f"--{field.replace('_', '-')} {rest}" if rest and field.isidentifier() else str(err)) from None
    out = check_out_dir(args.out)
    start = shipped_head(args.method) if args.init_from == "shipped" else args.init_from
    if start is not None and Path(start).expanduser().resolve() == out.resolve():
        raise ValueError(f"--out {args.out!r} is the --init-from head: the run would replace the head it starts from, "
                         "and a worse one would leave nothing to go back to; give another --out.")
    if out.is_dir() and any(out.iterdir()):  # check_out_dir let only an earlier head of specsure's through
        print(f"note: {out} holds an earlier head; this run's head replaces it when training ends", flush=True)
    with hold(out):
        return _train(args, out, settings)


def _train(args: argparse.Namespace, out: Path, settings: "MTPTrainSettings | Eagle3TrainSettings") -> int:
    """The run once its flags are checked and --out is locked: data, training, the head."""
    from specsure.cli.train_data import cache_folder, recorded_layers, training_prompts, training_samples
    from specsure.cli.train_head import ignored_point, train_eagle3_head, train_mtp_head

    cache_folder(args)  # a cache that cannot be written fails now, not after the first chunk of generation
    prompts = training_prompts(args)
    ignored_point(args, out)
    logging.getLogger(LOOP_LOGGER).setLevel(logging.INFO)  # "resuming from step N" is worth a line

    import torch

    from specsure.models.loading import load_model
    from specsure.train.data import select_layers

    torch.set_num_threads(args.threads or len(os.sched_getaffinity(0)))
    started = time.perf_counter()
    target = load_model(args.model, dtype=args.dtype)
    if args.draft_vocab_size is not None and args.draft_vocab_size > target.lm.vocab_size:
        raise ValueError(f"--draft-vocab-size {args.draft_vocab_size} is larger than the target's vocabulary "
                         f"({target.lm.vocab_size} tokens); give at most {target.lm.vocab_size}.")
    wanted = _aux_layers(args.aux_layers, target.lm.num_layers) if args.method == "eagle3" else ()
    if target.lm.num_layers in wanted and not target.lm.reads_last_output:
        raise ValueError(f"--aux-layers {args.aux_layers}: {target.lm.num_layers}, the last layer's output, needs the "
                         "target's final norm, which specsure cannot find in it; give ids below "
                         f"{target.lm.num_layers}.")
    start = None
    if args.init_from is not None:
        from dataclasses import replace

        from specsure.train.starting_head import read_starting_head, read_starting_mtp_head

        # absolute, as training.json records it and the resume key names it: the run may go on from another folder
        folder = shipped_head(args.method) if args.init_from == "shipped" else str(Path(args.init_from).expanduser().resolve())
        if folder is None:
            raise ValueError(f"--init-from shipped: this installation has no shipped {args.method} head "
                             "(specsure/heads/).")
        if args.method == "mtp":
            start = read_starting_mtp_head(target.lm, folder, args.modules, args.draft_vocab_size)
            settings = replace(settings, modules=len(start.modules), draft_vocab_size=start.draft_vocab_size)
        else:
            start = read_starting_head(target.lm, folder, wanted if args.aux_layers is not None else None,
                                       args.draft_vocab_size, args.intermediate_size)
            wanted = start.aux_layers
        _other_target(start.training, target.path, folder)
    if args.method == "eagle3" and len(wanted) != 3:  # the layers the head will have: a continued one keeps its own
        print(f"warning: the head fuses {len(wanted)} target layer(s) {list(wanted)}; specsure runs it, but vLLM's and "
              "SGLang's EAGLE-3 models fuse exactly 3, so they cannot load it.", file=sys.stderr)
    aux = recorded_layers(target.lm.num_layers, wanted)
    args.phase = "data"
    samples, key, data = training_samples(args, target, prompts, aux, started)
    args.phase = "training"
    given = str(Path(args.model).expanduser().resolve()) if args.model else "default (SmolLM2-135M-Instruct)"
    common = {"method": args.method, "target": given,
              "target_folder": target.path, "dtype": str(target.lm.dtype).removeprefix("torch.")}
    try:
        if args.method == "mtp":
            train_mtp_head(args, target, samples, settings, common, data, out, key, start)
        else:
            train_eagle3_head(args, target, select_layers(samples, aux, wanted), settings, wanted, common, data, out, key,
                          start)
    except FloatingPointError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return EXIT_OK


LOOP_LOGGER = "specsure.train.loop"
"""Named, not imported: the command imports torch only once its flags are checked."""


def run_guarded(args: argparse.Namespace) -> int:
    """`run`, and what to do after Ctrl-C: both phases keep their progress (docs/training.md)."""
    try:
        return run(args)
    except KeyboardInterrupt:
        # What the run had reached, not what its flags allow: before its data phase nothing is kept,
        # and before training no resume point exists.
        phase = getattr(args, "phase", None)
        cached = not args.no_cache and args.data != "text"
        kept = ([] if phase is None or not cached else
                ["generation from its last finished chunk"] if phase == "data" else ["its data from the cache"]) \
            + (["training from its last resume point, if it reached one"]
               if phase == "training" and args.checkpoint_every else [])
        print("interrupted" + (f": run the same command again to go on where it stopped ({', '.join(kept)})"
                               if kept else ""), file=sys.stderr)
        return 130


def _other_target(record: dict | None, target_folder: str, head: str) -> None:
    """Warn when the --init-from head was trained for another target: its shapes fit (they were
    checked), but what it learned is another model's features. Folders are compared by name, since
    a model moves between machines (the default one lives in each user's cache)."""
    trained_for = (record or {}).get("target_folder")
    if isinstance(trained_for, str) and Path(trained_for).name != Path(target_folder).name:
        print(f"warning: --init-from {head!r} was trained for the target in {trained_for}, not this run's "
              f"({target_folder}); its shapes fit, so it trains on, but it starts from another model's features.",
              file=sys.stderr)


def _settings(args: argparse.Namespace, lr: float) -> "MTPTrainSettings | Eagle3TrainSettings":
    """The trainer's settings from the flags, validated by their own checks."""
    from specsure.train.eagle3 import Eagle3TrainSettings
    from specsure.train.mtp import MTPTrainSettings

    vocab = DRAFT_VOCAB if args.draft_vocab_size is None else args.draft_vocab_size
    if args.method == "mtp":
        return MTPTrainSettings(steps=args.steps, lr=lr, seq_len=args.seq_len, seed=args.seed,
                                init=args.init or "random", modules=1 if args.modules is None else args.modules,
                                unroll=args.unroll or 0, answer_only=args.loss_on == "answer", dtype=args.train_dtype,
                                draft_vocab_size=vocab)
    return Eagle3TrainSettings(steps=args.steps, lr=lr, seq_len=args.seq_len,
                               unroll=7 if args.unroll is None else args.unroll, draft_vocab_size=vocab, seed=args.seed,
                               answer_only=args.loss_on == "answer", dtype=args.train_dtype,
                               intermediate_size=args.intermediate_size, windows=args.batch_windows)


def _aux_layers(text: str | None, num_layers: int) -> tuple[int, ...]:
    """``--aux-layers`` as layer indices, checked against the target (EAGLE-3's defaults when not given)."""
    from specsure.train.eagle3 import default_aux_layers

    default = default_aux_layers(num_layers)
    if text is None:
        return default
    example = ",".join(map(str, default))
    items = [t.strip() for t in text.split(",")]  # an empty item is a typo, not a layer left out
    if not all(t.isdigit() for t in items):
        raise ValueError(f"--aux-layers {text!r}: give comma-separated layer indices (0 or more, no empty item), "
                         f"for example {example}.")
    layers = tuple(int(t) for t in items)
    # vLLM and SGLang collect the aux layers as the target runs, so in ascending order: a head trained
    # on another order would read its inputs permuted there.
    if list(layers) != sorted(set(layers)) or any(i > num_layers for i in layers):
        raise ValueError(f"--aux-layers {text!r}: give each index once, in ascending order (the order in which vLLM "
                         f"and SGLang fuse them), in [0, {num_layers}] ({num_layers}, the target's num_hidden_layers, "
                         f"is its last layer's output); for example {example}.")
    return layers
