"""The optimisation loop both head trainers share: the optimiser and its schedule, steps, held-out
curve, resume points, divergence.

Each step draws one window (the caller's ``step_loss``) and takes one AdamW step. Every
``eval_every`` steps ``measure`` adds a point to the curve. Every ``checkpoint_every`` steps, and
after the last step, a resume point goes to ``resume`` (`specsure.train.resume`); a run finding one
with the same key continues from it, drawing the same windows. The last one stays until the caller
has written the head (`clear_point`), so a crash in the final evaluation or the write costs no
training. A loss that stops being finite raises FloatingPointError naming the last good point, so
no NaN head is ever written.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from specsure.train.resume import load_point, save_point

logger = logging.getLogger(__name__)

TRAIN_DTYPES = ("float32", "bfloat16")
"""The arithmetic a head's training forward may run in (`autocast`)."""


def autocast(dtype: str) -> contextlib.AbstractContextManager:
    """The context a training forward runs in: float32 as it is, or bfloat16 under CPU autocast.

    The weights, their gradients and the optimiser stay float32 either way; autocast runs the
    matrix products in bfloat16, which CPUs with bfloat16 matrix units (AMX, AVX512-BF16) do
    about three times faster, and keeps reductions such as softmax in float32.
    """
    if dtype == "bfloat16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


@dataclass
class Trained:
    """What `run_steps` did."""
    losses: list[float]
    """The loss of every step, an earlier run's too when this one resumed."""
    resumed_from: int
    """The step of the resume point this run went on from (0: it started at step 0)."""
    seconds: float
    """Seconds in the loop, the earlier runs' up to their resume point too."""
    runs: list[dict[str, float]] = field(default_factory=list)
    """Each run's ``from_step``, ``lr`` and ``steps``, the earlier (resumed) ones first: a run may go on
    with another rate or length, and the record says so."""


WEIGHT_LIMIT = 1e4
"""The largest weight a healthy head may reach, or a hundred times its largest at the start (at
least WEIGHT_FLOOR) if that is less. AdamW moves a weight about lr a step, so no sane run gets near
it (the shipped heads' largest weights grew from about 1 to 1.6 and 2.7 in 9,000 steps); a run
whose loss is still finite but whose weights blow up (a far too high --lr) is stopped before it
saves such a point as a good one, from which no lower rate could recover."""
WEIGHT_FLOOR = 10.0
"""The least limit, for a head that starts from tiny weights."""


def run_steps(module: torch.nn.Module, params: list[torch.nn.Parameter], optimiser: torch.optim.Optimizer,
              schedule: torch.optim.lr_scheduler.LambdaLR, gen: torch.Generator, steps: int, lr: float,
              step_loss: Callable[[], torch.Tensor], measure: Callable[[], Any], curve: list[Any], *,
              eval_every: int = 0, resume: Path | None = None, resume_key: str = "", checkpoint_every: int = 0,
              progress: bool = False) -> Trained:
    """Train ``module`` (its trainable ``params``) for ``steps`` steps.

    ``curve`` holds the points measured so far (the warm start); ``measure()`` gives the next one
    (a tuple whose first item the loop sets to the step). A resumed run replaces both lists with
    the saved ones. The caller measures the end of training itself.

    Raises:
        FloatingPointError: the loss stopped being finite, or the weights blew up; the last good
            resume point is kept.
    """
    started = time.perf_counter()
    initial = _largest(params)
    limit = min(WEIGHT_LIMIT, max(100 * initial, WEIGHT_FLOOR))
    first, losses, earlier, runs = 0, [], 0.0, []
    point = load_point(resume, resume_key, module, optimiser, schedule, gen, lr) if resume else None
    if point is not None:
        first, record = point
        if first > steps:  # the head would be the later step's, recorded as this run's
            raise ValueError(f"--steps {steps} is below the step of the resume point in {resume} ({first}); give "
                             f"--steps {first} or more to continue that run, or delete {resume} to start over.")
        losses = list(record["losses"])
        curve[:] = [tuple(c) for c in record["curve"]]
        earlier = float(record.get("seconds", 0.0))
        runs = list(record.get("runs", []))
        logger.info("resuming from step %d of %d, where an earlier run stopped (%s)", first, steps, resume)
        if runs and (runs[-1]["lr"], runs[-1]["steps"]) != (lr, steps):
            logger.info("that run trained at --lr %g for --steps %d; this one goes on at --lr %g for --steps %d "
                        "(training.json records both)", runs[-1]["lr"], runs[-1]["steps"], lr, steps)
    runs.append({"from_step": first, "lr": lr, "steps": steps})
    loaded = first if point is not None else None
    module.train()
    bar = tqdm(range(first, steps), desc="training", unit="step", disable=not progress, initial=first, total=steps)
    for step in bar:
        loss = step_loss()
        value = float(loss.detach())
        if not math.isfinite(value):
            if step == 0:  # no update has run: the learning rate cannot be the cause
                raise FloatingPointError(
                    f"the training loss was {value} at the first step, before any update, so training stopped and "
                    "no head was written: the target's features or labels are not finite (a float16 target can "
                    "overflow: train with --dtype bfloat16 or float32), or the starting head is (--init-from).")
            said = f"the training loss became {value} at step {step + 1}"
            raise FloatingPointError(_diverged(said, resume if first else None, first, loaded))
        losses.append(update(loss, params, optimiser, schedule))
        bar.set_postfix(loss_last_20=f"{sum(losses[-20:]) / len(losses[-20:]):.3f}")  # one step's loss is noisy
        if eval_every and (step + 1) % eval_every == 0 and step + 1 < steps:
            module.eval()
            curve.append((step + 1, *measure()))
            module.train()
        checkpoint = bool(resume and checkpoint_every) and ((step + 1) % checkpoint_every == 0 or step + 1 == steps)
        if checkpoint or step + 1 == steps:
            largest = _largest(params)
            if not largest <= limit:  # NaN too
                said = (f"the head's weights grew to {largest:.3g} by step {step + 1} (they began at most "
                        f"{initial:.3g}; the limit is {limit:.3g}) though the loss ({value:.4g}) was still finite")
                raise FloatingPointError(_diverged(said, resume if first else None, first, loaded))
        if checkpoint:
            seconds = earlier + time.perf_counter() - started
            save_point(resume, resume_key, step + 1, module, optimiser, schedule, gen,
                       {"losses": losses, "curve": curve, "seconds": round(seconds, 3), "runs": runs})
            first = step + 1
    module.eval()
    return Trained(losses, loaded or 0, earlier + time.perf_counter() - started, runs)


def _largest(params: list[torch.nn.Parameter]) -> float:
    """The largest weight's magnitude (NaN if any is NaN)."""
    with torch.no_grad():
        peaks = [p.detach().abs().max().float() for p in params if p.numel()]
        return float(torch.stack(peaks).max()) if peaks else 0.0  # torch's max keeps a NaN; Python's drops it


def _diverged(said: str, kept: Path | None, first: int, loaded: int | None) -> str:
    """The error for a run that diverged (``said`` what happened): what was lost, what was kept, what to do."""
    said += ", so training stopped and no head was written"
    if kept is None:
        return f"{said}; lower --lr (for example to half) and train again."
    if loaded == first:
        # This run began at that point and never got past it: the moments saved there may be what
        # diverges, and running the same command again would start from them again.
        return (f"{said}; it began from the resume point of step {first} in {kept}, and diverged again before the "
                f"next one; run the same command with a lower --lr (a tenth) to try that point once more, and if "
                f"that diverges too, delete {kept} to start over.")
    return (f"{said}; the last good state, from step {first}, is kept in {kept}; run the same command with a lower "
            f"--lr (for example half) to go on from it, or delete {kept} to start over.")


def update(loss: torch.Tensor, params: list[torch.nn.Parameter], optimiser: torch.optim.Optimizer,
           schedule: torch.optim.lr_scheduler.LRScheduler) -> float:
    """One optimiser step on ``loss`` (gradients clipped to norm 1); returns the loss as a float."""
    optimiser.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optimiser.step()
    schedule.step()
    return float(loss.detach())


def optimiser_for(params: list[torch.nn.Parameter], lr: float,
                  steps: int) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW at peak ``lr`` with a linear warm-up (a tenth of the steps, at most 20), then cosine decay to a tenth."""
    optimiser = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    warmup = max(1, min(20, steps // 10))
    return optimiser, torch.optim.lr_scheduler.LambdaLR(optimiser, lambda step: _lr_factor(step, warmup, steps))


def _lr_factor(step: int, warmup: int, total: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
