"""Loading draft-head weights (EAGLE-1, EAGLE-3, MTP) and checking them against the target.

Heads are read tensor by tensor with ``safetensors.safe_open``: an MTP head may sit inside the
target's own checkpoint, next to tensors the target's class ignores. Every mismatch with the
target is a ConfigError that names the checkpoint, the field, the value found and the value
expected; nothing falls back to another method.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import torch
from huggingface_hub.errors import StrictDataclassError
from safetensors import SafetensorError, safe_open
from transformers import LlamaConfig, PreTrainedConfig

from specsure.config.checkpoint import read_config
from specsure.config.compat import mismatch
from specsure.config.errors import ConfigError
from specsure.models.decoder_family import rotary_dim


class TensorFile:
    """The tensors of one checkpoint folder, read lazily by name (all *.safetensors shards)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self._where: dict[str, Path] = {}
        for shard in sorted(self.folder.glob("*.safetensors")):
            try:
                with safe_open(str(shard), framework="pt") as fh:
                    for name in fh.keys():
                        self._where[name] = shard
            except (SafetensorError, OSError) as exc:  # truncated, garbage, unreadable
                raise ConfigError(f"draft head {str(folder)!r}: {shard.name} cannot be read as safetensors ({exc}); "
                                  "the file is damaged or cut short: download or write it again.") from None
        if not self._where:
            raise ConfigError(f"draft head {str(folder)!r} has no *.safetensors weights in {self.folder}.")

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self._where)

    def read(self, names: Iterable[str]) -> dict[str, torch.Tensor]:
        """Read ``names`` (each must exist), grouped by shard so each file opens once."""
        by_shard: dict[Path, list[str]] = {}
        for name in names:
            by_shard.setdefault(self._where[name], []).append(name)
        out: dict[str, torch.Tensor] = {}
        for shard, group in by_shard.items():
            try:
                with safe_open(str(shard), framework="pt") as fh:
                    for name in group:
                        out[name] = fh.get_tensor(name)
            except (SafetensorError, OSError) as exc:  # a header that reads over data cut short
                raise ConfigError(f"draft head {str(self.folder)!r}: {shard.name} cannot be read as safetensors "
                                  f"({exc}); the file is damaged or cut short: download or write it again.") from None
        return out


def read_head_config(folder: str) -> dict[str, Any]:
    """config.json of a head folder as the checks read it, a speculators-format one flattened as vLLM
    flattens it (ConfigError naming the file on any problem)."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise ConfigError(f"draft head {folder!r} has no config.json.")
    return read_config(path)[0]


def check_equal(checkpoint: str, field: str, found: Any, expected: Any, why: str) -> None:
    if found is not None and found != expected:
        raise mismatch(checkpoint, field, found, expected, why)


def llama_config(config: Mapping[str, Any], where: str = "the head's config.json",
                 kind: type[PreTrainedConfig] = LlamaConfig, **overrides: Any) -> PreTrainedConfig:
    """A LlamaConfig (or ``kind``) for a head's decoder layer, from its config.json (extra keys are kept);
    a value transformers refuses is a ConfigError naming ``where`` and transformers' own words."""
    fields = {k: v for k, v in config.items() if k not in ("architectures", "auto_map")}
    fields.update(overrides)
    try:
        built = kind.from_dict(fields)
    except (TypeError, ValueError, StrictDataclassError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"{where}: transformers cannot build the head's decoder layer from it ({first}). Fix "
                          "the field it names.") from None
    heads = int(getattr(built, "num_attention_heads", 0) or 1)
    head_dim = int(getattr(built, "head_dim", None) or built.hidden_size // heads)
    if (turned := rotary_dim(built, head_dim)) != head_dim:
        raise ConfigError(f"{where}: partial_rotary_factor turns {turned} of each head's {head_dim} dims, but a "
                          "Llama head layer (transformers' and specsure's) turns whole heads, so it would run "
                          "another attention than the head was trained with; remove the key if the head was "
                          "trained with a whole-head RoPE, or give a head that was.")
    built._attn_implementation = "sdpa"
    return built


def load_weights(module: torch.nn.Module, tensors: Mapping[str, torch.Tensor], checkpoint: str,
                 dtype: torch.dtype, spell: Callable[[str], str] = str,
                 fix: str = "Check that the method matches the checkpoint's format.") -> None:
    """Assign ``tensors`` (module-relative names) to a module built on the meta device.

    Raises ConfigError naming the missing or unexpected tensors, or a tensor whose shape differs
    from what the head's config (and the target) imply; ``spell`` gives a module name as the file
    spells it, and ``fix`` what to do, where the method is known to be right.
    """
    expected = module.state_dict()
    missing = sorted(spell(n) for n in set(expected) - set(tensors))
    extra = sorted(spell(n) for n in set(tensors) - set(expected))
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing tensors {missing[:6]}{' ...' if len(missing) > 6 else ''}")
        if extra:
            parts.append(f"unexpected tensors {extra[:6]}{' ...' if len(extra) > 6 else ''}")
        raise ConfigError(f"draft head {checkpoint!r}: {' and '.join(parts)} for this head layout. {fix}")
    for name, want in expected.items():
        got = tensors[name]
        if tuple(got.shape) != tuple(want.shape):
            raise mismatch(checkpoint, f"tensor {spell(name)!r} shape", list(got.shape), list(want.shape),
                           "the head's config.json with the target's sizes")
        if want.is_floating_point() and not got.is_floating_point():  # cast, it would be another head
            raise ConfigError(f"draft head {checkpoint!r}: tensor {spell(name)!r} is stored as {got.dtype} "
                              "(integers), and a head's weights are floats; save the head in float32, bfloat16 or "
                              "float16.")
    module.load_state_dict({k: v.to(dtype) if v.is_floating_point() else v for k, v in tensors.items()},
                           strict=True, assign=True)
    module.eval().requires_grad_(False)


def vocab_map(weights: TensorFile, names: Mapping[str, str], path: str, draft_vocab: int,
              vocab: int) -> torch.Tensor | None:
    """d2t (target id = draft id + d2t[draft id]), checked against t2d and the vocabularies; None when the
    draft vocabulary is the target's. ``names`` maps the head's own tensor names to the file's."""
    if "d2t" not in names:
        if draft_vocab != vocab:
            raise ConfigError(f"draft head {path!r}: draft_vocab_size = {draft_vocab} is smaller than the target's "
                              f"vocab_size = {vocab}, but there is no d2t tensor mapping draft ids to target ids.")
        return None
    d2t = weights.read([names["d2t"]])[names["d2t"]]
    check_equal(path, "d2t shape", list(d2t.shape), [draft_vocab], "draft_vocab_size")
    targets = torch.arange(draft_vocab) + d2t.long()
    if int(targets.min()) < 0 or int(targets.max()) >= vocab or targets.unique().numel() != draft_vocab:
        raise ConfigError(f"draft head {path!r}: d2t maps draft ids outside [0, {vocab}) or onto the same target "
                          "id twice; it was not made for this target's vocabulary.")
    if "t2d" in names:
        t2d = weights.read([names["t2d"]])[names["t2d"]].bool()
        check_equal(path, "t2d shape", list(t2d.shape), [vocab], "the target's vocab_size")
        if int(t2d.sum()) != draft_vocab or not bool(t2d[targets].all()):
            raise ConfigError(f"draft head {path!r}: t2d and d2t disagree about which target ids the draft "
                              "vocabulary holds.")
    return d2t
