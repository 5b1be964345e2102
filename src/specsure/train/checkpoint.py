"""Writing a trained head as a folder the engine loads (docs/heads.md), atomically: an MTP module
as a SpecsureMTPHead, an EAGLE-3 head in the public LlamaForCausalLMEagle3 layout.

The folder is written under a temporary name next to its destination and renamed into place,
so a crash or Ctrl-C never leaves a half-written head where the engine would load it.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from collections.abc import Sequence
from typing import Any

import torch
from safetensors.torch import save_file

from specsure.config.checkpoint import load_config_json
from specsure.config.detect import SPECSURE_MTP_HEAD, SPECSURE_MTP_MODEL_TYPE
from specsure.config.errors import ConfigError
from specsure.config.training_record import RECORD_FILE
from specsure.models.causal_lm import CausalLM
from specsure.proposers.mtp import MTPModule
from specsure.train.leftovers import stale, tag

logger = logging.getLogger(__name__)

HEAD_ARCH = SPECSURE_MTP_HEAD
EAGLE3_ARCH = "LlamaForCausalLMEagle3"
HEAD_ARCHS = (HEAD_ARCH, EAGLE3_ARCH)
"""What specsure train writes, so what an --out folder may hold to be replaced."""


def check_out_dir(out: str | Path) -> Path:
    """The destination as a Path, checked before any work is spent.

    It may not exist yet (its parent must), or be empty, or hold an earlier head that specsure
    train wrote (which the new one replaces). Anything else is refused rather than overwritten.

    Raises:
        ValueError: naming the path and the fix.
    """
    given = str(out)
    out = Path(out).expanduser()
    if not given.strip() or out.name in ("", ".", ".."):  # the head is renamed into place, which a cwd cannot be
        raise ValueError(f"--out {given!r}: give the path of a folder for the head, such as ./my-head (not the "
                         "current or a parent folder itself).")
    if out.is_symlink() and not out.exists():  # the head is renamed into place, which a dangling link blocks
        raise ValueError(f"--out {str(out)!r} is a link to {os.readlink(out)!r}, which does not exist; remove the "
                         "link, or give the folder it should name.")
    if out.is_symlink():
        # The head goes where the link points, renamed into place and locked there: renaming the link itself
        # would leave the folder it names stale, and a run given the folder's own path would not share the lock.
        out = Path(os.path.realpath(out))
    if out.parent.exists() and not out.parent.is_dir():
        raise ValueError(f"--out {str(out)!r}: its parent {str(out.parent)!r} is a file, not a folder; choose "
                         "another path.")
    if not out.parent.is_dir():
        raise ValueError(f"--out {str(out)!r}: its parent folder {str(out.parent)!r} does not exist; create it "
                         "first or choose another path.")
    _check_writable(out.parent, given)  # found now, not after hours of training
    _sweep(out)
    if not out.exists():
        return out
    if not out.is_dir():
        raise ValueError(f"--out {str(out)!r} is a file; give a folder path for the head.")
    if any(out.iterdir()) and not _is_head(out):
        raise ValueError(f"--out {str(out)!r} already holds files that are not a head specsure train wrote ("
                         f"{', '.join(sorted(HEAD_FILES))} of a {' or '.join(HEAD_ARCHS)} and nothing else: a "
                         f"downloaded head has no {RECORD_FILE}); choose an empty or new folder (specsure only "
                         "replaces an earlier head of its own).")
    return out


def _check_writable(folder: Path, given: str) -> None:
    """The head, its resume points and a temporary folder go in ``folder``. Permission bits do not
    tell a read-only mount or a /proc path; trying does."""
    try:
        handle, probe = tempfile.mkstemp(prefix=".specsure-probe-", dir=folder)
    except OSError as exc:
        raise ValueError(f"--out {given!r}: cannot write in its folder {str(folder)!r} ({exc.strerror}); choose a "
                         "writable path.") from None
    os.close(handle)
    os.unlink(probe)


def _sweep(out: Path) -> None:
    """Remove what a killed save_head left next to ``out``; put back the head it was replacing.

    A save killed between moving the earlier head aside and renaming the new one into place
    leaves no head at ``out``: the earlier one, complete, is in its ``.old-`` folder, and is what
    goes back (the new one may be half-written)."""
    for path in sorted(out.parent.glob(f".{glob.escape(out.name)}.*")):
        if stale(path, f".{out.name}.tmp-"):
            _remove(path)
            logger.info("removed %s, a head that a killed run was writing", path)
        elif stale(path, f".{out.name}.old-"):
            if out.exists():
                _remove(path)
            else:
                path.rename(out)
                logger.warning("put back the head at %s, which a run killed while replacing it had moved to %s",
                               out, path.name)


def _remove(path: Path) -> None:
    """A folder, or a link (a link to an --out folder, moved aside before --out links were followed):
    rmtree refuses a link, which ignore_errors then left in place for good."""
    if path.is_symlink():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


HEAD_FILES = frozenset({"config.json", "model.safetensors", RECORD_FILE})
"""What save_head writes, and so all that a folder it may replace holds."""


def _is_head(folder: Path) -> bool:
    """A head this trainer wrote: its three files and nothing else. A downloaded head is not replaced,
    since replacing deletes it and what else it holds (a README, a tokenizer): without the record
    this trainer writes, a head's config.json and weights are someone else's."""
    if {p.name for p in folder.iterdir()} != HEAD_FILES:
        return False
    try:
        config = load_config_json(folder / "config.json")
    except ConfigError:
        return False
    return any(arch in HEAD_ARCHS for arch in (config.get("architectures") or []))


def head_tensors(module: MTPModule, index: int = 0, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """The module's tensors under ``layers.{index}.`` with the DeepSeek-V3 names, in ``dtype``."""
    out = {}
    for name, tensor in module.state_dict().items():
        if name.startswith(("rotary.", "target.")):
            continue
        local = name[len("block."):] if name.startswith("block.") else name
        out[f"layers.{index}.{local}"] = tensor.detach().to(dtype).contiguous().clone()
    return out


def head_config(lm: CausalLM, modules: int = 1, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    return {"architectures": [HEAD_ARCH], "model_type": SPECSURE_MTP_MODEL_TYPE, "num_nextn_predict_layers": modules,
            "num_hidden_layers": 1, "hidden_size": lm.hidden_size, "vocab_size": lm.vocab_size,
            "torch_dtype": str(dtype).removeprefix("torch.")}


def save_mtp_head(module: MTPModule | Sequence[MTPModule], lm: CausalLM, out: str | Path,
                  training: dict[str, Any], draft_ids: torch.Tensor | None = None) -> Path:
    """Write config.json, model.safetensors and training.json to ``out``, replacing an earlier head.

    Several modules are written as layers.0, layers.1, ... (num_nextn_predict_layers of them). The
    tensors are in the target's dtype, which the engine would cast them to anyway (half the size
    of float32 for a bf16 target). With ``draft_ids`` (ascending target ids), the head drafts
    among those tokens only: ``draft_vocab_size`` in the config, ``d2t`` and ``t2d`` as EAGLE-3 has them.
    """
    modules = [module] if isinstance(module, MTPModule) else list(module)
    tensors = {name: t for i, m in enumerate(modules) for name, t in head_tensors(m, i, lm.dtype).items()}
    config = head_config(lm, len(modules), lm.dtype)
    if draft_ids is not None:
        tensors.update(vocab_tensors(draft_ids, lm.vocab_size))
        config["draft_vocab_size"] = int(draft_ids.numel())
    return save_head(out, config, tensors, training)


def save_head(out: str | Path, config: dict[str, Any], tensors: dict[str, torch.Tensor],
              training: dict[str, Any]) -> Path:
    """config.json, model.safetensors and training.json, written next to ``out`` and renamed into place."""
    out = check_out_dir(out)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-{tag()}-", dir=out.parent))
    try:
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / RECORD_FILE).write_text(json.dumps(training, indent=2) + "\n", encoding="utf-8")
        os.chmod(tmp, 0o755)  # mkdtemp makes it owner-only; a head folder is ordinary data
        for path in tmp.iterdir():
            os.chmod(path, 0o644)
        _swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def llama_fields(text: Any) -> dict[str, Any]:
    """A Llama layer's config fields for a head of the target whose text config is ``text``: its sizes,
    norm epsilon and RoPE. A target with one RoPE per layer type (Gemma 3) gives its full-attention
    layers' (the global base); a target whose own layer differs (Gemma's GELU and norms, Qwen2's
    biases) gives only what a Llama layer reads, so the head is the Llama layer vLLM and SGLang load; a
    partial rotary (Phi-4-mini's) gives a plain RoPE of its base."""
    keep = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
            "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings",
            "hidden_act", "attention_bias", "mlp_bias", "initializer_range", "bos_token_id", "eos_token_id",
            "pad_token_id", "tie_word_embeddings")
    config = {k: getattr(text, k) for k in keep if getattr(text, k, None) is not None}
    rope = config.get("rope_parameters")
    per_type = {k: v for k, v in rope.items() if isinstance(v, dict)} if isinstance(rope, dict) else {}
    if per_type:  # transformers keeps a flat copy beside them, of whichever type it read last
        config["rope_parameters"] = dict(per_type.get("full_attention") or next(iter(per_type.values())))
    rope = config.get("rope_parameters")
    if isinstance(rope, dict) and rope.get("partial_rotary_factor") not in (None, 1, 1.0):
        # A Llama layer turns whole heads, and scaling factors counted for a partial rotary (Phi-4-mini's
        # LongRoPE lists 3/4 of a head's frequencies) would not fit it: the head gets a plain RoPE of the
        # target's base, which it is trained with, and which vLLM and SGLang read from its config too.
        config["rope_parameters"] = {"rope_type": "default", "rope_theta": rope.get("rope_theta", 10000.0)}
        config.pop("rope_scaling", None)  # the same parameters under their old name, which LlamaConfig reads last
    return config


def eagle3_config(lm: CausalLM, aux_layers: tuple[int, ...], draft_vocab: int, dtype: torch.dtype,
                  intermediate_size: int | None = None) -> dict[str, Any]:
    """The head's config.json as vLLM, SGLang and specsure read an EAGLE-3 head; its MLP has
    ``intermediate_size`` units (None: the target's, which every other size is)."""
    config = llama_fields(lm.hf.config.get_text_config(decoder=True))
    config.update({"architectures": [EAGLE3_ARCH], "model_type": "llama", "num_hidden_layers": 1,
                   "vocab_size": lm.vocab_size, "draft_vocab_size": draft_vocab, "target_hidden_size": lm.hidden_size,
                   "tie_word_embeddings": False, "torch_dtype": str(dtype).removeprefix("torch."),
                   **({"intermediate_size": intermediate_size} if intermediate_size is not None else {}),
                   # vLLM's model runner reads the top-level key (vllm/v1/worker/gpu_model_runner.py) and
                   # otherwise takes the target's default layers; EAGLE's and SpecForge's configs nest it.
                   "eagle_aux_hidden_state_layer_ids": list(aux_layers),
                   "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(aux_layers),
                                    "use_aux_hidden_state": True}})
    return config


def eagle3_tensors(module: torch.nn.Module, draft_ids: torch.Tensor, vocab: int,
                   dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """fc, midlayer.*, norm, lm_head in ``dtype``, plus d2t (int64) and t2d (bool)."""
    out = {name: tensor.detach().to(dtype).contiguous().clone() for name, tensor in module.state_dict().items()
           if not name.startswith(("rotary.", "target."))}
    out.update(vocab_tensors(draft_ids, vocab))
    return out


def vocab_tensors(draft_ids: torch.Tensor, vocab: int) -> dict[str, torch.Tensor]:
    """d2t (int64: target id = draft id + d2t) and t2d (bool over the target's vocabulary) of a draft vocabulary."""
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[draft_ids] = True
    return {"d2t": (draft_ids - torch.arange(draft_ids.numel())).long(), "t2d": t2d}


def _swap_into_place(tmp: Path, out: Path) -> None:
    if not out.exists():
        tmp.rename(out)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-{tag()}-", dir=out.parent))
    old.rmdir()
    out.rename(old)
    try:
        tmp.rename(out)
    except OSError:
        old.rename(out)
        raise
    shutil.rmtree(old, ignore_errors=True)
