"""The head a training run continues from (``specsure train --init-from``), EAGLE-3 or MTP.

A continued run keeps what the head's weights were trained for: an EAGLE-3 head's aux layers, an
MTP head's module count, and either's draft vocabulary. Everything is checked against the target
before any training, with the reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specsure.config.compat import aux_layer_ids
from specsure.config.detect import SPECSURE_MTP_HEAD, SPECSURE_MTP_MODEL_TYPE
from specsure.config.errors import ConfigError
from specsure.config.training_record import RECORD_FILE
from specsure.models.causal_lm import CausalLM
from specsure.proposers.eagle3 import VERIFIER_PARTS, canonical
from specsure.proposers.mtp import BLOCK_OVERRIDES, module_names
from specsure.config.checkpoint import int_field
from specsure.proposers.head_loading import TensorFile, check_equal, read_head_config, vocab_map


@dataclass(frozen=True)
class StartingHead:
    """An EAGLE-3 head's weights, and the aux layers and draft vocabulary they were trained for."""

    path: str
    aux_layers: tuple[int, ...]
    draft_ids: torch.Tensor
    """[draft_vocab] ascending target ids."""
    tensors: dict[str, torch.Tensor]
    """Float32, by the trainer module's names (``d2t``/``t2d`` left out)."""
    training: dict[str, Any] | None = None
    """The head's own training.json, kept in the continued head's record so that its history is not lost."""
    intermediate_size: int | None = None
    """Its MLP's units, from its config.json (the target's where the config does not say)."""


def read_starting_head(lm: CausalLM, folder: str, aux_layers: tuple[int, ...] | None = None,
                       draft_vocab_size: int | None = None, intermediate_size: int | None = None) -> StartingHead:
    """The EAGLE-3 head in ``folder``, checked against ``lm`` and against the ``--aux-layers``,
    ``--draft-vocab-size`` and ``--intermediate-size`` asked for, if any (ConfigError naming the field otherwise).

    It must share the target's embedding, as every head this trainer writes does; its midlayer's
    shapes are checked when the weights are loaded.
    """
    config = _config(folder, "eagle3")
    if SPECSURE_MTP_HEAD in (config.get("architectures") or []) or config.get("model_type") == SPECSURE_MTP_MODEL_TYPE:
        raise ConfigError(f"--init-from {folder!r} is an MTP head (architectures {config.get('architectures')}); "
                          "continue it with --method mtp, or give an EAGLE-3 head.")
    weights = TensorFile(folder)
    names = {canonical(n): n for n in weights.names if not n.startswith(VERIFIER_PARTS)}
    if "midlayer.hidden_norm.weight" not in names:
        raise ConfigError(f"--init-from {folder!r}: not an EAGLE-3 head (no midlayer.hidden_norm.weight); give a "
                          "folder that `specsure train --method eagle3` wrote, or the shipped head.")
    if deeper := sorted(n for n in names if n.startswith("more.")):
        layers = 1 + len({n.split(".")[1] for n in deeper})
        raise ConfigError(f"--init-from {folder!r}: the head has {layers} decoder layers (layers.1.* ...), and this "
                          "trainer trains EAGLE-3 heads of one; train a new head instead (leave out --init-from).")
    eagle = config.get("eagle_config") if isinstance(config.get("eagle_config"), dict) else {}
    kept = {"norm_before_residual": config.get("norm_before_residual"), "norm_before_fc": eagle.get("norm_before_fc",
            config.get("norm_before_fc")), "fc_norm": config.get("fc_norm"), "norm_output": config.get("norm_output")}
    if variants := [f"{key} = true" for key, value in kept.items() if value is True]:
        # the trainer's head has none of these, so a continued head would compute another function
        raise ConfigError(f"--init-from {folder!r}: the head sets {', '.join(variants)}, a variant of the EAGLE-3 "
                          "layer this trainer does not train; train a new head instead (leave out --init-from).")
    if "Eagle3Qwen3ForCausalLM" in (config.get("architectures") or []):
        raise ConfigError(f"--init-from {folder!r}: the head has Qwen3 decoder layers (Eagle3Qwen3ForCausalLM), and "
                          "this trainer trains Llama ones; train a new head instead (leave out --init-from).")
    if "embed_tokens.weight" in names:
        raise ConfigError(f"--init-from {folder!r}: the head has its own embed_tokens.weight, but this trainer's "
                          "heads share the target's embedding; train a new head instead (leave out --init-from).")
    vocab = lm.vocab_size
    check_equal(folder, "vocab_size", int_field(config, "vocab_size", vocab), vocab, "the target's vocabulary")
    check_equal(folder, "target_hidden_size", int_field(config, "target_hidden_size", lm.hidden_size),
                lm.hidden_size, "the target's hidden_size")
    draft_vocab = int_field(config, "draft_vocab_size", vocab)
    assert draft_vocab is not None
    d2t = vocab_map(weights, names, folder, draft_vocab, vocab)
    draft_ids = torch.arange(draft_vocab) if d2t is None else torch.arange(draft_vocab) + d2t.long()
    if bool((draft_ids[1:] <= draft_ids[:-1]).any()):
        raise ConfigError(f"--init-from {folder!r}: its d2t does not list the draft vocabulary in ascending target "
                          "ids, which this trainer's labels need; train a new head instead.")
    layers = aux_layer_ids(config, folder, lm.num_layers)
    if aux_layers is not None and tuple(aux_layers) != layers:
        raise ConfigError(f"--aux-layers {','.join(map(str, aux_layers))}: the head --init-from gives was trained on "
                          f"layers {list(layers)}, which a continued run keeps; leave --aux-layers out.")
    if draft_vocab_size is not None and draft_vocab_size != draft_vocab:
        raise ConfigError(f"--draft-vocab-size {draft_vocab_size}: the head --init-from gives drafts among "
                          f"{draft_vocab} tokens, which a continued run keeps; leave --draft-vocab-size out.")
    # A config without the key has the target's width, as the head's module is then built.
    width = int_field(config, "intermediate_size", lm.hf.config.get_text_config(decoder=True).intermediate_size)
    if intermediate_size is not None and intermediate_size != width:
        raise ConfigError(f"--intermediate-size {intermediate_size}: the head --init-from gives has an MLP of "
                          f"{width} units, which a continued run keeps; leave --intermediate-size out.")
    wanted = {c: n for c, n in names.items() if c not in ("d2t", "t2d")}
    tensors = weights.read(wanted.values())
    return StartingHead(folder, layers, draft_ids, {c: tensors[n].float() for c, n in wanted.items()},
                        _training_record(folder), width)


@dataclass(frozen=True)
class StartingMTPHead:
    """An MTP head's modules and the draft vocabulary they were trained for."""

    path: str
    modules: tuple[dict[str, torch.Tensor], ...]
    """Per module, float32, by `MTPModule`'s names (module 0 first)."""
    draft_ids: torch.Tensor | None
    """[draft_vocab] ascending target ids; None for the whole vocabulary."""
    training: dict[str, Any] | None = None
    """The head's own training.json (`StartingHead.training`)."""

    @property
    def draft_vocab_size(self) -> int:
        """As `MTPTrainSettings.draft_vocab_size` counts it: 0 for the whole vocabulary."""
        return 0 if self.draft_ids is None else int(self.draft_ids.numel())


def read_starting_mtp_head(lm: CausalLM, folder: str, modules: int | None = None,
                           draft_vocab_size: int | None = None) -> StartingMTPHead:
    """The MTP head in ``folder`` (a SpecsureMTPHead, as `specsure train --method mtp` writes), checked
    against ``lm`` and against the ``--modules`` and ``--draft-vocab-size`` asked for, if any
    (ConfigError naming the field otherwise). Its tensors' shapes are checked when they are loaded
    (`load_module_weights`)."""
    config = _config(folder, "mtp")
    if SPECSURE_MTP_HEAD not in (config.get("architectures") or []) \
            and config.get("model_type") != SPECSURE_MTP_MODEL_TYPE:
        raise ConfigError(f"--init-from {folder!r}: not an MTP head that specsure train wrote (architectures "
                          f"{config.get('architectures')}, not [\"{SPECSURE_MTP_HEAD}\"]); give a folder that "
                          "`specsure train --method mtp` wrote, or the shipped head.")
    vocab = lm.vocab_size
    check_equal(folder, "vocab_size", int_field(config, "vocab_size", vocab), vocab, "the target's vocabulary")
    check_equal(folder, "hidden_size", int_field(config, "hidden_size", lm.hidden_size), lm.hidden_size,
                "the target's hidden_size")
    text = lm.hf.config.get_text_config(decoder=True)
    for key in BLOCK_OVERRIDES:
        if key in config and config[key] != getattr(text, key, None):
            raise ConfigError(f"--init-from {folder!r}: its config.json sets {key} = {config[key]!r}, but this "
                              f"trainer's modules have the target's layer shape ({key} = {getattr(text, key, None)!r}); "
                              "train a new head instead (leave out --init-from).")
    count = int_field(config, "num_nextn_predict_layers", 1) or 1
    if modules is not None and modules != count:
        raise ConfigError(f"--modules {modules}: the head --init-from gives has {count} module(s) "
                          "(num_nextn_predict_layers), which a continued run keeps; leave --modules out.")
    weights = TensorFile(folder)
    names = [module_names(weights.names, f"layers.{i}.") for i in range(count)]
    for i, local in enumerate(names):
        if not local:
            raise ConfigError(f"--init-from {folder!r}: num_nextn_predict_layers = {count}, but the weights hold no "
                              f"tensors for module {i} (layers.{i}.*).")
        own = sorted(k for k in local if k.startswith(("embed_tokens.", "shared_head.head.")))
        if own:
            raise ConfigError(f"--init-from {folder!r}: module {i} has its own {', '.join(own)}, but this trainer's "
                              "heads share the target's; train a new head instead (leave out --init-from).")
    draft_vocab = int_field(config, "draft_vocab_size", vocab)
    assert draft_vocab is not None
    d2t = vocab_map(weights, {n: n for n in ("d2t", "t2d") if n in weights.names}, folder, draft_vocab, vocab)
    draft_ids = None if d2t is None else torch.arange(draft_vocab) + d2t.long()
    if draft_ids is not None and bool((draft_ids[1:] <= draft_ids[:-1]).any()):
        raise ConfigError(f"--init-from {folder!r}: its d2t does not list the draft vocabulary in ascending target "
                          "ids, which this trainer's labels need; train a new head instead.")
    found = 0 if draft_ids is None else draft_vocab
    if draft_vocab_size is not None and draft_vocab_size != found:
        raise ConfigError(f"--draft-vocab-size {draft_vocab_size}: the head --init-from gives drafts among "
                          f"{f'{found} tokens' if found else 'the whole vocabulary (0)'}, which a continued run keeps; "
                          "leave --draft-vocab-size out.")
    tensors = weights.read([n for local in names for n in local.values()])
    return StartingMTPHead(folder, tuple({k: tensors[n].float() for k, n in local.items()} for local in names),
                           draft_ids, _training_record(folder))


def load_module_weights(module: torch.nn.Module, tensors: dict[str, torch.Tensor], checkpoint: str) -> None:
    """Copy a starting head's tensors into a trainer's module (built and attached to the target), after
    checking that they are exactly its own: the same names (the target's shared parts aside) and shapes."""
    own = {k: v for k, v in module.state_dict(keep_vars=True).items() if not k.startswith(("rotary.", "target."))}
    missing, extra = sorted(set(own) - set(tensors)), sorted(set(tensors) - set(own))
    if missing or extra:
        raise ConfigError(f"--init-from {checkpoint!r}: missing tensors {missing[:6]} and unexpected tensors "
                          f"{extra[:6]} for this target's module layout; train a new head instead.")
    for name, param in own.items():
        if tuple(tensors[name].shape) != tuple(param.shape):
            raise ConfigError(f"--init-from {checkpoint!r}: tensor {name!r} has shape {list(tensors[name].shape)}, "
                              f"this target's module needs {list(param.shape)}; train a new head instead.")
    with torch.no_grad():
        for name, param in own.items():
            param.copy_(tensors[name])


def _config(folder: str, method: str) -> dict[str, Any]:
    if not (Path(folder) / "config.json").is_file():
        raise ConfigError(f"--init-from {folder!r}: no config.json there, so it is not a head; give a folder that "
                          f"`specsure train --method {method}` wrote, or 'shipped'.")
    return read_head_config(folder)


def _training_record(folder: str) -> dict[str, Any] | None:
    """The head's training.json; None when it has none (a head from elsewhere), an error when it is unreadable,
    since the continued head would otherwise claim a history it has lost."""
    path = Path(folder) / RECORD_FILE
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ConfigError(f"--init-from {folder!r}: its training.json cannot be read ({err}); restore it, or delete "
                          "it if the head's history is unknown.") from None
    if not isinstance(record, dict):
        raise ConfigError(f"--init-from {folder!r}: its training.json holds a {type(record).__name__}, not an "
                          "object; restore it, or delete it if the head's history is unknown.")
    return record
