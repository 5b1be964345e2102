"""The data phase of `specsure train`: the prompts its flags name, then the target's samples (cached)."""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the engine's imports load torch, which `run` defers until the flags are checked
    from specsure.bench.workload import Prompt
    from specsure.models.loading import LoadedModel
    from specsure.train.data import Sample

DERIVED_VERSION = 2
"""Bumped when task_prompts.derived_prompts changes, so cached samples built the old way are not reused."""


@dataclass
class TrainingPrompts:
    """The prompts a run trains on, before the target has seen them."""

    rows: list[Prompt]
    sources: list[dict[str, object]]
    """Each source with its licence and prompt count, as training.json records them."""
    chat_rows: list[int] = field(default_factory=list)
    """Indices into ``rows`` of specsure's chat prompts and the target's own, whose answers the derived
    tasks build on."""
    self_rows: list[int] = field(default_factory=list)
    """Indices into ``rows`` of the prompts the target writes (``--corpus self``), empty until it does."""
    pieces: list[str] = field(default_factory=list)
    """--data text: each row's package text, the answer teacher forcing labels."""


def training_prompts(args: argparse.Namespace) -> TrainingPrompts:
    """The rows of --prompts and --corpus (or the built-in bench workloads), cut to --max-prompts."""
    from specsure.bench.workload import Prompt, load_builtin, load_workloads
    from specsure.train.corpus import corpus_prompts, short_sources, sources_of

    if args.data == "text" and (args.prompts or not args.corpus):
        raise ValueError("--data text teacher-forces the corpus's own text: give --corpus with package names, and "
                         "no --prompts (a prompt file has no answers to teacher-force).")
    rows = load_workloads(args.prompts, unique=False) if args.prompts else []  # a file twice weighs it twice
    if capped := [row for row in rows if row.max_tokens is not None]:  # the bench's field, not dropped unsaid
        print(f"note: {len(capped)} row(s) of --prompts set max_tokens (first: {capped[0].source}), which train does "
              f"not read: every answer is at most --max-new-tokens ({args.max_new_tokens}) tokens.", file=sys.stderr)
    sources: list[dict[str, object]] = [{"source": str(path), "licence": "given by the user (--prompts)"}
                                        for path in args.prompts or []]
    chat_rows: list[int] = []
    self_rows: list[int] = []
    pieces: list[str] = []
    if args.corpus:
        packages, weights = corpus_mix(args.corpus)
        corpus = corpus_prompts(packages, args.corpus_prompts, args.seed, weights)
        for name, given, share in short_sources(corpus, packages, weights, args.corpus_prompts):
            print(f"note: --corpus {name} gave {given} prompts, short of its share of {share} of --corpus-prompts "
                  f"{args.corpus_prompts}: it has no more. The other sources filled the rest, so the mix is not "
                  "what the weights say (training.json records each source's count).", file=sys.stderr)
        if args.data == "text":
            corpus = [c for c in corpus if c.piece]
            if not corpus:
                raise ValueError(f"--data text needs package names in --corpus (their docstrings and functions are "
                                 f"the text); {args.corpus!r} has none.")
            pieces = [c.piece for c in corpus]
        chat_rows = [len(rows) + i for i, c in enumerate(corpus) if c.package in ("chat", "self")]
        self_rows = [len(rows) + i for i, c in enumerate(corpus) if c.package == "self"]
        rows += [Prompt(id=f"corpus-{i}", category="corpus", prompt=c.text, source=c.where) for i, c in enumerate(corpus)]
        sources += sources_of(corpus)
    if not rows:
        rows = load_builtin()
        sources = [{"source": "specsure's built-in bench workloads (main split, not held out)",
                    "licence": "Apache-2.0 (this repository)"}]
    rows = rows[: args.max_prompts]
    return TrainingPrompts(rows, sources, [i for i in chat_rows if i < len(rows)],
                           [i for i in self_rows if i < len(rows)], pieces)


def cache_folder(args: argparse.Namespace) -> Path | None:
    """Where the data phase caches what it makes: --cache-dir, the user cache, or None with --no-cache."""
    from specsure.train.cache import default_cache_dir

    if args.no_cache:
        return None
    folder = Path(args.cache_dir).expanduser() if args.cache_dir else default_cache_dir()
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"--cache-dir {str(folder)!r} is a file; give a folder for the data cache (made if missing), "
                         "or --no-cache.")
    try:  # found now, not after the first chunk of generation (permission bits miss read-only mounts)
        folder.mkdir(parents=True, exist_ok=True)
        handle, probe = tempfile.mkstemp(prefix=".specsure-probe-", dir=folder)
        os.close(handle)
        os.unlink(probe)
    except OSError as exc:
        flag = "--cache-dir" if args.cache_dir else "the data cache ($XDG_CACHE_HOME/specsure/train)"
        raise ValueError(f"{flag} {str(folder)!r} cannot be written ({exc.strerror}); give a writable --cache-dir, "
                         "or --no-cache.") from None
    return folder


def written_prompts(args: argparse.Namespace, target: LoadedModel, prompts: TrainingPrompts) -> TrainingPrompts:
    """``prompts`` with the target's own requests in the ``self`` rows (rows it could not fill dropped)."""
    from dataclasses import replace

    from specsure.train.self_prompts import LICENCE, cached_prompts

    if not prompts.self_rows:
        return prompts
    texts = cached_prompts(target, len(prompts.self_rows), args.seed, cache_folder(args),
                           progress=not args.no_progress)
    filled = dict(zip(prompts.self_rows, texts))
    unfilled = set(prompts.self_rows) - filled.keys()
    keep = [i for i in range(len(prompts.rows)) if i not in unfilled]
    index = {old: new for new, old in enumerate(keep)}
    rows = [replace(prompts.rows[i], prompt=filled[i]) if i in filled else prompts.rows[i] for i in keep]
    sources = [dict(s, prompts=len(texts)) if s.get("licence") == LICENCE else s for s in prompts.sources]
    return TrainingPrompts(rows, sources, [index[i] for i in prompts.chat_rows if i in index],
                           [index[i] for i in filled], prompts.pieces)


def corpus_mix(text: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """``--corpus`` as names and weights: ``chat:2,numpy`` takes two chat prompts per numpy prompt."""
    names, weights = [], []
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        name, _, weight = item.partition(":")
        if weight and not (weight.isdigit() and int(weight) >= 1):
            raise ValueError(f"--corpus {text!r}: the weight in {item!r} must be a positive integer, for example "
                             f"{name}:2 (two of its prompts for each one of a package without a weight).")
        names.append(name.strip())
        weights.append(int(weight) if weight else 1)
    return tuple(names), tuple(weights)


def recorded_layers(num_layers: int, wanted: tuple[int, ...]) -> tuple[int, ...]:
    """The layers whose inputs the data phase records: EAGLE-3's defaults, the last layer's input and any
    asked for, in ascending order. Recording a layer costs little in the same forward, and one cached data
    set then serves both methods and the usual layer choices (make heads trains the MTP head on the
    EAGLE-3 head's samples)."""
    from specsure.train.eagle3 import default_aux_layers

    return tuple(sorted({*default_aux_layers(num_layers), num_layers - 1, *wanted}))


def training_samples(args: argparse.Namespace, target: LoadedModel, prompts: TrainingPrompts,
                     aux: tuple[int, ...], started: float) -> tuple[list[Sample], str, dict[str, Any]]:
    """(samples, cache key, the data record of training.json): the target's samples for ``prompts``,
    from the cache when an earlier run made the same ones. ``started`` is when loading began."""
    from specsure.bench.workload import encode
    from specsure.train import self_distill
    from specsure.train.cache import cache_key, cached_samples
    from specsure.train.continuations import ContinuationStore
    from specsure.train.data import DISTILL_BATCH, build_sequences

    prompts = written_prompts(args, target, prompts)
    rows = prompts.rows
    text = next((row for row in rows if row.prompt_ids is None), None)
    if target.tokenizer is None and text is not None:  # the target is at fault, not the prompt file
        raise ValueError(f"the target {target.path} has no tokenizer files, and the training prompts are text (the "
                         f"first: {text.source or text.id}); add the model's tokenizer (tokenizer.json, "
                         "tokenizer_config.json) to its folder, or train on --prompts files whose rows hold "
                         "prompt_ids.")
    token_prompts = [list(encode(row, target.tokenizer)) for row in rows]
    vocab = target.lm.vocab_size
    for row, ids in zip(rows, token_prompts):
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:  # named by its file and line, before any generation
            raise ValueError(f"{row.source or row.id}: prompt_ids holds token id {bad}, outside the target's "
                             f"vocabulary [0, {vocab}); give ids the target's tokenizer makes.")
    context = target.lm.max_context
    for row, ids in zip(rows, token_prompts):
        if context and len(ids) >= context:  # no room for one token: named by its file and line, before any work
            raise ValueError(f"{row.source or row.id}: the prompt has {len(ids)} tokens, but the target's context is "
                             f"{context} tokens, which leaves no room to continue it; shorten it or leave it out.")
    cut = [ids for ids in token_prompts if context and len(ids) + args.max_new_tokens > context]
    if cut and not prompts.pieces:  # generation stops at the context, as the engine does: say so, once
        print(f"note: --max-new-tokens {args.max_new_tokens}: {len(cut)} prompt(s) leave less room than that in the "
              f"target's context of {context} tokens (the longest, {max(map(len, cut))} tokens, leaves "
              f"{max(context - max(map(len, cut)), 0)}); their continuations stop at the context.", flush=True)
    dtype = str(target.lm.dtype).removeprefix("torch.")
    templated = target.tokenizer is not None and bool(getattr(target.tokenizer, "chat_template", None))
    if prompts.chat_rows and not templated:
        print(f"note: --corpus chat: the target at {target.path} has no chat template, so its chat prompts go to it "
              "as plain text, and the tasks built on their answers (second turns, summaries, translations, passage "
              "questions: conversations) are left out.", file=sys.stderr)
    follow_up = _derived(rows, prompts.chat_rows, target.tokenizer, args.seed) \
        if prompts.chat_rows and templated else None
    # The batch is part of the key: batching may change a near-tied greedy token, so samples
    # generated 8 at a time are not the ones 32 at a time would give.
    derived = f"derived-{DERIVED_VERSION}-seed{args.seed}-" if follow_up else ""
    key = cache_key(target.path, dtype, token_prompts, args.max_new_tokens, aux, extra=f"{derived}batch{DISTILL_BATCH}")
    folder = cache_folder(args)
    if prompts.pieces:  # teacher forcing: the package's own text is the answer, cut to twice the continuation length
        answers = [target.tokenizer.encode(p, add_special_tokens=False)[: 2 * args.max_new_tokens]
                   for p in prompts.pieces]
        key = cache_key(target.path, dtype, [[*a, -1, *b] for a, b in zip(token_prompts, answers)],
                        args.max_new_tokens, aux, extra="teacher-forced text")
        store = None  # nothing is generated

        def build() -> list[Sample]:
            return build_sequences(target, token_prompts, answers, aux_layers=aux, progress=not args.no_progress)
    else:
        # Generation's progress, beside the samples file: an interrupted run goes on where it stopped.
        store = ContinuationStore(folder, key) if folder is not None else None

        def build() -> list[Sample]:
            return self_distill(target, token_prompts, args.max_new_tokens, aux_layers=aux,
                                progress=not args.no_progress, follow_up=follow_up, store=store)
    samples, hit = cached_samples(folder, key, build, target.lm.vocab_size)
    if store is not None and not hit:
        store.clear()  # the samples file holds them all now
    sources = list(prompts.sources)
    if len(samples) > len(rows):
        sources.append({"source": "tasks built on the target's answers to the chat prompts (specsure's, and its own "
                                  "with --corpus self: a second turn, a summary, a translation, a passage question; "
                                  "train/task_prompts.py)",
                        "licence": "Apache-2.0 (templates written for this repository; the text is the target's own)",
                        "prompts": len(samples) - len(rows)})
    data = {"kind": args.data, "prompts": len(samples), "tokens": sum(s.token_ids.shape[0] for s in samples),
            "tokens_sha256": tokens_digest(samples), "seconds": round(time.perf_counter() - started, 1),
            "from_cache": hit, "sources": sources, "environment": environment(target)}
    resumed = store.resumed if store is not None else 0
    if resumed:
        data["resumed_prompts"] = resumed
    print(f"data: {len(samples)} prompts, {data['tokens']} tokens in {data['seconds']:.0f} s"
          + (f" (from the cache in {folder})" if hit else "")
          + (f" (generation went on from an interrupted run: {resumed} prompts' continuations read back from "
             f"{folder})" if resumed else ""))
    expected = args.expect_data_sha256
    if expected is not None and expected != data["tokens_sha256"]:
        print(f"warning: this run's data has tokens_sha256 {data['tokens_sha256']}, not the {expected} that "
              "--expect-data-sha256 gives, so the head will differ from the one trained on that data. The prompts "
              "come from the installed packages' files and the answers depend on torch, transformers, the CPU and "
              f"the forward path; this run's: {data['environment']} (make heads pins the packages in "
              "heads-constraints.txt).", file=sys.stderr)
    return samples, key, data


def tokens_digest(samples: list[Sample]) -> str:
    """SHA-256 of every sample's length, prompt length and token ids, in order: two runs made the same
    data exactly when their digests match (the features follow from the tokens on one machine)."""
    digest = hashlib.sha256()
    for sample in samples:
        ids = sample.token_ids.to("cpu").long().numpy().astype("<i8")
        digest.update(len(ids).to_bytes(8, "little") + sample.prompt_len.to_bytes(8, "little") + ids.tobytes())
    return digest.hexdigest()


def environment(target: LoadedModel) -> dict[str, str]:
    """What the data depends on besides the flags: transformers' and numpy's files are prompts, and a
    near-tied greedy token can go the other way with another torch, transformers, CPU or forward path
    (transformers 5.24.0 and 5.25.0 converted the GGUF target alike; docs/training.md)."""
    import numpy
    import torch
    import transformers

    from specsure.config.cpu import cpu_model

    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "numpy": numpy.__version__, "cpu": cpu_model(),
            "forward": target.lm.path}


def _derived(rows, chat_rows, tokenizer, seed):  # noqa: ANN001, ANN202
    """The follow_up of `self_distill`: tasks built on the answers to the chat prompts at ``chat_rows``."""
    from specsure.bench.workload import Prompt, encode
    from specsure.train.task_prompts import derived_prompts

    def build(continuations):  # noqa: ANN001, ANN202
        pairs = [(rows[i].prompt, tokenizer.decode(continuations[i], skip_special_tokens=True)) for i in chat_rows]
        turns = derived_prompts(pairs, seed)
        return [list(encode(Prompt(id=f"derived-{j}", category="derived", messages=tuple(t)), tokenizer))
                for j, t in enumerate(turns)]

    return build
