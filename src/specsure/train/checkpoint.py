"""Writing a trained MTP module as a SpecsureMTPHead folder (docs/heads.md), atomically.

The folder is written under a temporary name next to its destination and renamed into place,
so a crash or Ctrl-C never leaves a half-written head where the engine would load it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from specsure.config.checkpoint import load_config_json
from specsure.config.detect import SPECSURE_MTP_HEAD, SPECSURE_MTP_MODEL_TYPE
from specsure.config.errors import ConfigError
from specsure.models.causal_lm import CausalLM
from specsure.proposers.mtp import MTPModule

HEAD_ARCH = SPECSURE_MTP_HEAD
TRAINING_FILE = "training.json"
"""How the head was made (settings, data, figures); the engine does not read it."""


def check_out_dir(out: str | Path) -> Path:
    """The destination as a Path, checked before any work is spent.

    It may not exist yet (its parent must), or be empty, or hold an earlier SpecsureMTPHead
    (which the new one replaces). Anything else is refused rather than overwritten.

    Raises:
        ValueError: naming the path and the fix.
    """
    out = Path(out).expanduser()
    if not out.parent.is_dir():
        raise ValueError(f"--out {str(out)!r}: its parent folder {str(out.parent)!r} does not exist; create it "
                         "first or choose another path.")
    if not out.exists():
        return out
    if not out.is_dir():
        raise ValueError(f"--out {str(out)!r} is a file; give a folder path for the head.")
    if any(out.iterdir()) and not _is_head(out):
        raise ValueError(f"--out {str(out)!r} already holds files that are not a {HEAD_ARCH} folder; choose an "
                         "empty or new folder (specsure only replaces an earlier head).")
    return out


def _is_head(folder: Path) -> bool:
    try:
        config = load_config_json(folder / "config.json")
    except ConfigError:
        return False
    return HEAD_ARCH in (config.get("architectures") or [])


def head_tensors(module: MTPModule, index: int = 0) -> dict[str, torch.Tensor]:
    """The module's tensors under ``layers.{index}.`` with the DeepSeek-V3 names, float32."""
    out = {}
    for name, tensor in module.state_dict().items():
        if name.startswith(("rotary.", "target.")):
            continue
        local = name[len("block."):] if name.startswith("block.") else name
        out[f"layers.{index}.{local}"] = tensor.detach().float().contiguous().clone()
    return out


def head_config(lm: CausalLM) -> dict[str, Any]:
    return {"architectures": [HEAD_ARCH], "model_type": SPECSURE_MTP_MODEL_TYPE, "num_nextn_predict_layers": 1,
            "num_hidden_layers": 1, "hidden_size": lm.hidden_size, "vocab_size": lm.vocab_size,
            "torch_dtype": "float32"}


def save_mtp_head(module: MTPModule, lm: CausalLM, out: str | Path, training: dict[str, Any]) -> Path:
    """Write config.json, model.safetensors and training.json to ``out``, replacing an earlier head."""
    out = check_out_dir(out)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        (tmp / "config.json").write_text(json.dumps(head_config(lm), indent=2) + "\n", encoding="utf-8")
        save_file(head_tensors(module), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / TRAINING_FILE).write_text(json.dumps(training, indent=2) + "\n", encoding="utf-8")
        os.chmod(tmp, 0o755)  # mkdtemp makes it owner-only; a head folder is ordinary data
        for path in tmp.iterdir():
            os.chmod(path, 0o644)
        _swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _swap_into_place(tmp: Path, out: Path) -> None:
    if not out.exists():
        tmp.rename(out)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
    old.rmdir()
    out.rename(old)
    try:
        tmp.rename(out)
    except OSError:
        old.rename(out)
        raise
    shutil.rmtree(old, ignore_errors=True)
