"""The EAGLE-3 head a training run continues from (``specsure train --init-from``).

A continued run keeps what the head's weights were trained for: its aux layers and its draft
vocabulary. Everything is checked against the target before any training, with the reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specsure.config.errors import ConfigError
from specsure.models.causal_lm import CausalLM
from specsure.proposers.eagle3 import aux_layer_ids, canonical
from specsure.proposers.head_loading import TensorFile, check_equal, int_field, read_head_config, vocab_map


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


def read_starting_head(lm: CausalLM, folder: str, aux_layers: tuple[int, ...] | None = None,
                       draft_vocab_size: int | None = None) -> StartingHead:
    """The EAGLE-3 head in ``folder``, checked against ``lm`` and against the ``--aux-layers`` and
    ``--draft-vocab-size`` asked for, if any (ConfigError naming the field otherwise).

    It must share the target's embedding, as every head this trainer writes does; its midlayer's
    shapes are checked when the weights are loaded.
    """
    config = read_head_config(folder)
    weights = TensorFile(folder)
    names = {canonical(n): n for n in weights.names}
    if "midlayer.hidden_norm.weight" not in names:
        raise ConfigError(f"--init-from {folder!r}: not an EAGLE-3 head (no midlayer.hidden_norm.weight); give a "
                          "folder that `specsure train --method eagle3` wrote, or the shipped head.")
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
    wanted = {c: n for c, n in names.items() if c not in ("d2t", "t2d")}
    tensors = weights.read(wanted.values())
    return StartingHead(folder, layers, draft_ids, {c: tensors[n].float() for c, n in wanted.items()},
                        _training_record(folder))


def _training_record(folder: str) -> dict[str, Any] | None:
    """The head's training.json; None when it has none (a head from elsewhere), an error when it is unreadable,
    since the continued head would otherwise claim a history it has lost."""
    path = Path(folder) / "training.json"
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
