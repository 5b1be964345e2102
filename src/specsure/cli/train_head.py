"""`specsure train`'s training phase: train the head on the data phase's samples, write it with its
training.json, clear the run's resume point, and say how to run it."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the command imports torch only once its flags are checked
    from specsure.models.loading import LoadedModel
    from specsure.train.data import Sample
    from specsure.train.eagle3 import Eagle3TrainSettings
    from specsure.train.mtp import MTPTrainSettings
    from specsure.train.starting_head import StartingHead, StartingMTPHead


def _resume_folder(args: argparse.Namespace, out: Path) -> Path | None:
    """Where resume points go: next to --out, hidden (None with --checkpoint-every 0)."""
    return _point_folder(out) if args.checkpoint_every else None


def _point_folder(out: Path) -> Path:
    folder = out.parent / f".{out.name}.resume"
    if folder.is_symlink():  # in a folder others can write, a planted link would have this run read and write there
        raise ValueError(f"--out {str(out)!r}: its resume folder {str(folder)!r} is a link (to "
                         f"{os.readlink(folder)!r}), which this run will not read or write through; delete the link.")
    return folder


def ignored_point(args: argparse.Namespace, out: Path) -> None:
    """Say so when --checkpoint-every 0 passes over the resume point of an earlier run on --out."""
    from specsure.train.resume import FILE

    folder = _point_folder(out)
    if not args.checkpoint_every and (folder / FILE).is_file():
        print(f"warning: --checkpoint-every 0: this run does not go on from the resume point an earlier run on this "
              f"--out left in {folder}, and removes it once its own head is written; to go on from it instead, stop "
              "now and run without --checkpoint-every 0.", file=sys.stderr)


def _finished(out: Path) -> None:
    """The head is written: its run's last resume point (kept until now, so that a crash while
    evaluating or writing lost no training), or an earlier run's that --checkpoint-every 0 passed
    over, is not needed any more."""
    from specsure.train.resume import clear_point

    clear_point(_point_folder(out))


def _steps_line(steps: int, seconds: float, resumed_from: int) -> str:
    if not resumed_from:
        return f"training: {steps} steps in {seconds:.0f} s"
    return (f"training: {steps} steps in {seconds:.0f} s, {steps - resumed_from} of them in this run, which went on "
            f"from the resume point of step {resumed_from}")


def _run_hint(args: argparse.Namespace, out: Path, k: int) -> str:
    model_flag = f" --model {shlex.quote(str(Path(args.model).expanduser().resolve()))}" if args.model else ""
    spec = json.dumps({"method": args.method, "model": str(Path(out).resolve()), "num_speculative_tokens": k})
    return f"run it: specsure generate{model_flag} --speculative-config '{spec}' PROMPT"


def train_mtp_head(args: argparse.Namespace, target: LoadedModel, samples: Sequence[Sample],
                   settings: MTPTrainSettings, common: dict[str, Any], data: dict[str, Any], out: Path, key: str,
                   start: StartingMTPHead | None) -> None:
    """Train an MTP head, write it to ``out`` with its record (``common``, ``data`` and the run's
    figures), and print what it reached. ``key`` names the samples, for the resume point."""
    import torch

    from specsure.train import save_mtp_head, train_mtp

    # What shapes the run, so a resume point is only taken up by the same run (lr and steps may differ).
    init = None if start is None else start.path
    resume_key = json.dumps([key, "mtp", settings.modules, settings.unroll, settings.init, settings.seq_len,
                             settings.seed, args.loss_on, settings.dtype, settings.draft_vocab_size]
                            + ([init] if init else []))
    result = train_mtp(target, samples, settings, progress=not args.no_progress, eval_every=args.eval_every,
                       resume=_resume_folder(args, out), resume_key=resume_key, checkpoint_every=args.checkpoint_every,
                       start=start)
    before, after = result.before, result.after
    training = {
        **common,
        "settings": {"steps": settings.steps, "lr": settings.lr, "seq_len": settings.seq_len, "seed": settings.seed,
                     "init": None if init else settings.init, "modules": settings.modules,
                     # the draft steps it trained (0 means one per module), which explain's depth note reads
                     "unroll": max(settings.unroll, settings.modules),
                     "loss_on": args.loss_on, "train_dtype": settings.dtype, "max_new_tokens": args.max_new_tokens,
                     # what the head drafts among (the whole vocabulary when the asked size covers it), as eagle3 records
                     "draft_vocab_size": 0 if result.draft_ids is None else int(result.draft_ids.numel()),
                     "threads": torch.get_num_threads(),
                     **({"init_from": init} if init else {})},
        "data": {**data, "train_sequences": result.train_sequences, "heldout_sequences": result.heldout_sequences},
        "heldout": {"measured_on": _measured_on(result.heldout_sequences),
                    "kl_before": before.kl, "kl_after": after.kl, "top1_before": before.agreement,
                    "top1_after": after.agreement, "entries": after.entries,
                    "top1_per_module": list(after.per_module), "acceptance_length": after.acceptance_length},
        "curve": [{"step": s, "heldout_top1": a, "heldout_acceptance_length": v} for s, a, v in result.curve],
        "losses": [round(v, 4) for v in result.losses],
        "train_seconds": round(result.train_s, 1),
        **({"resumed_from_step": result.resumed_from, "runs": result.runs} if result.resumed_from else {}),
        **({"continued_from": start.training} if start is not None and start.training is not None else {}),
    }
    save_mtp_head(result.modules or result.module, target.lm, out, training, result.draft_ids)
    _finished(out)
    where = "held-out" if result.heldout_sequences else "training (too few prompts to hold any out)"
    print(_steps_line(settings.steps, result.train_s, result.resumed_from))
    print(f"wrote {out}")
    print(_run_hint(args, out, max(settings.modules, settings.unroll)))
    # Over a draft vocabulary the target's probabilities are not renormalised, so the sum is the training
    # loss, KL's terms over the draft rows only, and can fall below 0.
    kl_name = "KL" if not settings.draft_vocab_size else "KL over the draft vocabulary's rows (the loss)"
    print(f"{where} top-1 agreement: {after.agreement:.1%} (before training {before.agreement:.1%}), "
          f"{kl_name} {before.kl:.3f} -> {after.kl:.3f} nats over {after.entries} continuation tokens")
    _warn_if_worse_mtp(where, kl_name, before, after)
    if len(after.per_module) > 1:
        per = " ".join(f"{a:.0%}" for a in after.per_module)
        print(f"per draft step: {per}; greedy acceptance length at k={len(after.per_module)}: "
              f"{after.acceptance_length:.2f}")


def train_eagle3_head(args: argparse.Namespace, target: LoadedModel, samples: Sequence[Sample],
                      settings: Eagle3TrainSettings, aux: tuple[int, ...], common: dict[str, Any], data: dict[str, Any],
                      out: Path, key: str, start: StartingHead | None) -> None:
    """Train an EAGLE-3 head fusing the target layers ``aux``, write it to ``out`` with its record,
    and print what it reached."""
    import torch

    from specsure.train.checkpoint import eagle3_config, eagle3_tensors, save_head
    from specsure.train.eagle3 import mlp_width, train_eagle3

    # What shapes the run, so a resume point is only taken up by the same run (lr and steps may differ).
    init = None if start is None else start.path
    width = settings.intermediate_size
    resume_key = json.dumps([key, settings.unroll, settings.draft_vocab_size, settings.seq_len, settings.seed, aux,
                             args.loss_on, settings.windows, settings.dtype] + ([init] if init else [])
                            + ([width] if width is not None else []))
    result = train_eagle3(target, samples, settings, aux, progress=not args.no_progress, eval_every=args.eval_every,
                          resume=_resume_folder(args, out), resume_key=resume_key,
                          checkpoint_every=args.checkpoint_every, start=start)
    before, after = result.before, result.after
    # The head is written in the target's dtype: what the engine would cast it to anyway, and half the size.
    dtype = target.lm.dtype
    draft_vocab = int(result.draft_ids.numel())
    training = {
        **common,
        "settings": {"steps": settings.steps, "lr": settings.lr, "seq_len": settings.seq_len, "seed": settings.seed,
                     "unroll": settings.unroll, "draft_vocab_size": draft_vocab, "aux_layers": list(aux),
                     "loss_on": args.loss_on, "batch_windows": settings.windows, "train_dtype": settings.dtype,
                     "max_new_tokens": args.max_new_tokens, "threads": torch.get_num_threads(),
                     "intermediate_size": mlp_width(result.module), **({"init_from": init} if init else {})},
        "data": {**data, "train_sequences": result.train_sequences, "heldout_sequences": result.heldout_sequences},
        "heldout": {"measured_on": _measured_on(result.heldout_sequences),
                    "acceptance_length_before": before.acceptance_length,
                    "acceptance_length_after": after.acceptance_length, "agreement_per_step": after.agreement,
                    "loss_before": before.loss, "loss_after": after.loss, "anchors": after.anchors,
                    "k": settings.unroll},
        "curve": [{"step": s, "heldout_acceptance_length": v} for s, v in result.curve],
        "losses": [round(v, 4) for v in result.losses],
        "train_seconds": round(result.train_s, 1),
        **({"resumed_from_step": result.resumed_from, "runs": result.runs} if result.resumed_from else {}),
        **({"continued_from": start.training} if start is not None and start.training is not None else {}),
    }
    save_head(out, eagle3_config(target.lm, aux, draft_vocab, dtype, mlp_width(result.module)),
              eagle3_tensors(result.module, result.draft_ids, target.lm.vocab_size, dtype), training)
    _finished(out)
    where = "held-out" if result.heldout_sequences else "training (too few prompts to hold any out)"
    print(_steps_line(settings.steps, result.train_s, result.resumed_from))
    print(f"wrote {out}")
    print(_run_hint(args, out, settings.unroll))
    steps = " ".join(f"{a:.0%}" for a in after.agreement)
    print(f"{where} greedy acceptance length at k={settings.unroll}: {after.acceptance_length:.2f} (before training "
          f"{before.acceptance_length:.2f}); agreement per draft step: {steps}; over {after.anchors} anchors")
    _warn_if_worse(where, f"greedy acceptance length {after.acceptance_length:.2f}", f"{before.acceptance_length:.2f}",
                   after.acceptance_length < before.acceptance_length)


def _warn_if_worse_mtp(where: str, kl_name: str, before: Any, after: Any) -> None:
    """`_warn_if_worse` for an MTP head's held-out figures (``agreement`` and ``kl``): worse when fewer
    tokens are right, or as many and the distribution further from the target's."""
    if after.agreement <= before.agreement and after.kl > before.kl:
        _warn_if_worse(where, f"{kl_name} {after.kl:.3f} nats and top-1 agreement {after.agreement:.1%}",
                       f"{before.kl:.3f} and {before.agreement:.1%}", True)
    else:
        _warn_if_worse(where, f"top-1 agreement {after.agreement:.1%}", f"{before.agreement:.1%}",
                       after.agreement < before.agreement)


def _warn_if_worse(where: str, after: str, before: str, worse: bool) -> None:
    """A run that leaves the head worse than it began (a learning rate too high, too little data) still
    writes it, as asked; it must not pass for a good one."""
    if worse:
        print(f"warning: the trained head is worse than before training ({where} {after}, was {before}): lower "
              "--lr, train on more data (more --prompts rows, or --corpus with --corpus-prompts), or keep the head you "
              "started from.", file=sys.stderr)


def _measured_on(heldout_sequences: int) -> str:
    """What training.json's "heldout" figures were measured on: with too few prompts none is held out, and
    the figures are the training sequences' (in-sample), which a reader comparing heads must know."""
    return "heldout" if heldout_sequences else "training sequences (too few prompts to hold any out)"
