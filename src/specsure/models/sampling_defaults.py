"""The sampling defaults a checkpoint's generation_config.json carries, read as vLLM reads them.

vLLM (``--generation-config auto``, its default) makes them the defaults of every request that
leaves a field out. specsure applies them only where asked (``specsure serve --generation-config
auto``), and says so when a model carries any, so none is dropped without a word.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Final

logger = logging.getLogger(__name__)

FIELDS: Final[tuple[str, ...]] = ("repetition_penalty", "presence_penalty", "frequency_penalty", "temperature",
                                  "top_k", "top_p", "min_p", "max_new_tokens")
"""vLLM 0.33.0's list (ModelConfig.get_diff_sampling_param), but skip_special_tokens, which no
generation_config.json holds."""


def model_sampling_defaults(folder: str | Path) -> dict[str, Any]:
    """``{field: value}`` for each of FIELDS the folder's generation_config.json sets (not null): vLLM
    takes what differs from transformers' GenerationConfig defaults, which transformers 5 leaves all
    unset, so every value the file holds; {} without the file. ValueError naming the file when it
    is not a JSON object."""
    path = Path(folder) / "generation_config.json"
    if not path.is_file():
        return {}
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} cannot be read as JSON ({exc}); fix the file or remove it.") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path} holds {type(config).__name__}, not a JSON object; fix the file or remove it.")
    return {k: config[k] for k in FIELDS if config.get(k) is not None}


def say_unapplied(folder: str | Path) -> None:
    """One WARNING naming the sampling defaults the model carries and that specsure does not apply."""
    try:
        found = model_sampling_defaults(folder)
    except ValueError as exc:
        logger.warning("%s", exc)
        return
    if found:
        shown = ", ".join(f"{k}={v}" for k, v in found.items())
        logger.warning("%s/generation_config.json sets %s. specsure applies a model's sampling defaults only "
                       "where asked (specsure serve --generation-config auto, vLLM's default); elsewhere a request "
                       "that leaves them out decodes greedily with no penalty. Pass them in SamplingParams or as "
                       "flags to use them.", folder, shown)
