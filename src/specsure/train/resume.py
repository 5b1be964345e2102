"""A training run's resume point: stop it (Ctrl-C, a crash, a diverging loss) and start again where it was.

Every ``checkpoint_every`` steps the trainer writes the module's weights, the optimiser's moments,
the learning-rate schedule, the window sampler's RNG state, the losses and the curve to one
safetensors file (never pickle) plus its JSON metadata, atomically. A later run with the same
``key`` (the data and the settings that shape the model) loads it and continues from that step,
drawing the same windows it would have drawn; the learning rate and the number of steps may
change between runs, so a diverged run can go on from its last good point with a lower rate.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from specsure.train.leftovers import save_tensors

FILE = "resume.safetensors"
logger = logging.getLogger(__name__)


def save_point(folder: Path, key: str, step: int, module: torch.nn.Module, optimiser: torch.optim.Optimizer,
               schedule: torch.optim.lr_scheduler.LRScheduler, generator: torch.Generator,
               record: dict[str, Any]) -> None:
    """Write the state after ``step`` steps; ``record`` (losses, curve) must be JSON-serialisable."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {f"module.{k}": v.detach().contiguous().clone() for k, v in module.state_dict().items()}
    state = optimiser.state_dict()
    for index, moments in state["state"].items():
        for name, value in moments.items():
            tensors[f"optimiser.{index}.{name}"] = torch.as_tensor(value).contiguous().clone()
    tensors["generator"] = generator.get_state()
    sched = {k: v for k, v in schedule.state_dict().items() if k != "lr_lambdas"}
    meta = {"key": key, "step": str(step), "param_groups": json.dumps(state["param_groups"]),
            "schedule": json.dumps(sched), "record": json.dumps(record)}
    save_tensors(tensors, folder / FILE, ".resume-", metadata=meta)  # an interrupted write leaves the previous point


def load_point(folder: Path, key: str, module: torch.nn.Module, optimiser: torch.optim.Optimizer,
               schedule: torch.optim.lr_scheduler.LRScheduler, generator: torch.Generator,
               lr: float) -> tuple[int, dict[str, Any]] | None:
    """Restore a saved point made with the same ``key``; (its step, its record), or None when there is none."""
    path = folder / FILE
    if not path.is_file():
        return None
    try:
        tensors = load_file(str(path))
        with open(path, "rb") as handle:
            size = int.from_bytes(handle.read(8), "little")
            meta = json.loads(handle.read(size))["__metadata__"]
        if meta["key"] != key:
            logger.warning("the resume point in %s was made by a run with other data or settings, so this run "
                           "starts from step 0 and replaces it at its first resume point; to continue that run, "
                           "stop this one and give the original command.", folder)
            return None
        module.load_state_dict({k.removeprefix("module."): v for k, v in tensors.items() if k.startswith("module.")})
        groups = json.loads(meta["param_groups"])
    except (OSError, SafetensorError, ValueError, KeyError, RuntimeError) as exc:
        logger.warning("the resume point in %s cannot be read (%s), so this run starts from step 0.", folder,
                       type(exc).__name__)
        return None
    moments: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in tensors.items():
        if name.startswith("optimiser."):
            _, index, field = name.split(".", 2)
            moments.setdefault(int(index), {})[field] = value
    for group in groups:
        group["lr"] = group["initial_lr"] = lr  # the rate may change between runs
    optimiser.load_state_dict({"state": moments, "param_groups": groups})
    sched = json.loads(meta["schedule"])
    sched["base_lrs"] = [lr] * len(sched.get("base_lrs", [lr]))
    sched["lr_lambdas"] = [None] * len(schedule.lr_lambdas)  # plain functions are not state; ours stay
    schedule.load_state_dict(sched)
    for group, factor, base in zip(optimiser.param_groups, schedule.lr_lambdas, schedule.base_lrs):
        group["lr"] = base * factor(schedule.last_epoch)  # the rate of the step the run stopped before
    generator.set_state(tensors["generator"])
    return int(meta["step"]), json.loads(meta["record"])


def clear_point(folder: Path) -> None:
    """The run finished: its resume point is not needed any more, nor anything a killed write of one left.

    The folder belongs to one --out, whose lock (`specsure.train.out_lock`) the caller holds, so no
    other run is writing in it: the whole folder goes."""
    shutil.rmtree(folder, ignore_errors=True)
