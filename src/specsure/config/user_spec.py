"""What the user wrote: their speculative-config mapping read into canonical keys, every value
checked, the unset fields told from the null ones. Nothing here reads a checkpoint; resolution
(`specsure.config.resolution`) fills what is unset."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Final, Mapping

from specsure.config.errors import HUGE_INT_BITS, HUGE_INT_DIGITS, ConfigError, as_json, suggest
from specsure.config.schema import (
    FIELDS, FOREIGN_METHODS, KEY_ALIASES, MAX_PROMPT_LOOKUP, MAX_PROMPT_LOOKUP_BRANCHES, MAX_SPECULATIVE_TOKENS,
    METHODS, MTP_METHOD_ALIASES, SUFFIX_FIELDS, VLLM_ONLY_KEYS, check_batch_size, check_int, check_suffix_value,
)
from specsure.config.token_tree import parse_token_tree


class _Unset:
    """The state of a field the user did not give; distinct from every real value (None too)."""

    _instance: "_Unset | None" = None

    def __new__(cls) -> "_Unset":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNSET"

    def __bool__(self) -> bool:
        return False


UNSET: Final = _Unset()

NULL_IS_UNSET: Final[frozenset[str]] = frozenset({
    "method", "num_speculative_tokens", "speculative_token_tree", "prompt_lookup_min", "prompt_lookup_max",
    "prompt_lookup_branches"})
"""Keys whose null means unset, as in a config vLLM wrote out (None is its default for them). For
``model`` and ``disable_by_batch_size`` null is a value: no separate draft; drafting at every batch size."""


@dataclass(frozen=True)
class UserSpec:
    """What the user wrote, normalised to canonical keys; unset fields hold UNSET."""

    method: Any = UNSET
    model: Any = UNSET
    num_speculative_tokens: Any = UNSET
    speculative_token_tree: Any = UNSET
    prompt_lookup_min: Any = UNSET
    prompt_lookup_max: Any = UNSET
    prompt_lookup_branches: Any = UNSET
    suffix_decoding_max_tree_depth: Any = UNSET
    suffix_decoding_max_cached_requests: Any = UNSET
    suffix_decoding_max_spec_factor: Any = UNSET
    suffix_decoding_min_token_prob: Any = UNSET
    disable_by_batch_size: Any = UNSET
    method_alias: str | None = None
    """The deprecated MTP alias the user wrote, when the method came from one."""
    ngram_spelling: str | None = None
    """vLLM's older spelling of method ngram the user wrote (``"model": "[ngram]"``), when the method came from one."""


def parse_user_spec(speculative: Mapping[str, Any]) -> UserSpec:
    """Validate keys, types and ranges of the user's mapping; never reads checkpoints."""
    if not isinstance(speculative, Mapping):
        raise ConfigError(
            f"speculative config must be a JSON object (a mapping of keys to values), got "
            f"{type(speculative).__name__} {speculative!r}. Example: "
            '{"method": "ngram", "num_speculative_tokens": 4}'
        )
    values: dict[str, Any] = {}
    for key, value in speculative.items():
        if not isinstance(key, str):
            raise ConfigError(f"speculative config key {key!r} is not a string; keys are {', '.join(FIELDS)}.")
        canonical = KEY_ALIASES.get(key, key)
        if canonical in VLLM_ONLY_KEYS:
            raise ConfigError(
                f"{key!r} is a key of vLLM's speculative config for its own deployment and kernels, which "
                f"specsure's engine does not use (one process: no parallelism, quantization, revisions, backends "
                f"or batch schedules of vLLM's). Remove it here; `specsure export` and `specsure check-vllm` take "
                f"it and pass it on to vLLM (SGLang where it has a flag for it). specsure's keys: "
                f"{', '.join(FIELDS)}.")
        if canonical not in FIELDS:
            known = list(FIELDS) + list(KEY_ALIASES)
            raise ConfigError(
                f"unknown speculative config key {key!r}.{suggest(key, known)} "
                f"Valid keys: {', '.join(FIELDS)} (and 'draft_model' as an alias of 'model')."
            )
        if canonical in values and values[canonical] != value and not _same_file(values[canonical], value):
            first = "draft_model" if key == "model" else "model"  # the name the earlier value came under
            raise ConfigError(
                f"{first!r} = {values[canonical]!r} and {key!r} = {value!r} disagree; they are two "
                "names for the same field (the draft checkpoint). Give only one of them."
            )
        if _holds_huge_int(value):  # Python refuses to print it, so no later message could name it
            raise ConfigError(f"{key} holds an integer of more than {HUGE_INT_DIGITS} digits; no speculative config "
                              "field takes a number that large. Use a value in the field's range.")
        values[canonical] = value
    for key in NULL_IS_UNSET:
        if key in values and values[key] is None:
            del values[key]
    spelling = _legacy_ngram(values)
    alias = None
    if "method" in values:
        values["method"], alias = _check_method(values["method"])
    if "model" in values:
        values["model"] = _check_model(values["model"])
    if "num_speculative_tokens" in values:
        check_int("num_speculative_tokens", values["num_speculative_tokens"], MAX_SPECULATIVE_TOKENS)
    if "speculative_token_tree" in values:
        values["speculative_token_tree"] = parse_token_tree(values["speculative_token_tree"], MAX_SPECULATIVE_TOKENS)
    for key in ("prompt_lookup_min", "prompt_lookup_max"):
        if key in values:
            check_int(key, values[key], MAX_PROMPT_LOOKUP)
    if "prompt_lookup_branches" in values:
        check_int("prompt_lookup_branches", values["prompt_lookup_branches"], MAX_PROMPT_LOOKUP_BRANCHES)
    lo, hi = values.get("prompt_lookup_min"), values.get("prompt_lookup_max")
    if lo is not None and hi is not None and lo > hi:
        raise ConfigError(
            f"prompt_lookup_min = {lo} is larger than prompt_lookup_max = {hi}; the n-gram search runs "
            f"from max down to min, so min must be <= max. Set prompt_lookup_min <= {hi}."
        )
    for key in SUFFIX_FIELDS:
        if key in values:
            check_suffix_value(key, values[key])
    if "disable_by_batch_size" in values:
        check_batch_size(values["disable_by_batch_size"])
    return UserSpec(**values, method_alias=alias, ngram_spelling=spelling)


LEGACY_NGRAM_MODELS: Final[tuple[str, ...]] = ("ngram", "[ngram]")
"""Draft "paths" that vLLM still reads as method ngram (vllm/config/speculative.py), as it did before the method key."""


def _holds_huge_int(value: Any) -> bool:
    if isinstance(value, int):
        return value.bit_length() > HUGE_INT_BITS
    if isinstance(value, (list, tuple)):
        return any(_holds_huge_int(v) for v in value)
    if isinstance(value, Mapping):
        return any(_holds_huge_int(k) or _holds_huge_int(v) for k, v in value.items())
    return False


def _legacy_ngram(values: dict[str, Any]) -> str | None:
    """Turn vLLM's older spellings of ngram in ``values`` into method ngram without a draft; returns what was
    written, for the warning. specsure would otherwise read "[ngram]" as a folder that does not exist."""
    method = values.get("method", "ngram")
    method = method.strip().lower() if isinstance(method, str) else method  # as _check_method reads it
    if method == "[ngram]":
        values["method"] = method = "ngram"
        written = '"method": "[ngram]"'
    else:
        written = None
    if values.get("model") in LEGACY_NGRAM_MODELS and method == "ngram":
        if os.path.exists(model := values["model"]):
            raise ConfigError(f"model = {model!r} is both vLLM's older spelling of method 'ngram' and a path here; "
                              f"write {{\"method\": \"ngram\"}} for prompt lookup, or \"./{model}\" for the draft "
                              "checkpoint.")
        written = f'"model": {json.dumps(values.pop("model"))}'
        values["method"] = "ngram"
    return written


def _check_method(value: Any) -> tuple[str, str | None]:
    if not isinstance(value, str):
        raise ConfigError(
            f"method = {as_json(value)} must be a string, one of: {', '.join(METHODS)}."
        )
    name = value.strip().lower()
    if name in METHODS:
        return name, None
    if name in MTP_METHOD_ALIASES:
        return "mtp", value
    if name in FOREIGN_METHODS:
        raise ConfigError(
            f"method = {as_json(value)} is a vLLM method that specsure does not run. "
            f"Choose one of: {', '.join(METHODS)}."
        )
    raise ConfigError(
        f"unknown method {as_json(value)}.{suggest(name, METHODS)} Valid methods: {', '.join(METHODS)}."
    )


def _same_file(first: Any, second: Any) -> bool:
    """Two spellings of one existing path (``./draft`` and ``draft``, a link and its target)."""
    if not (isinstance(first, (str, os.PathLike)) and isinstance(second, (str, os.PathLike))):
        return False
    try:
        return os.path.samefile(os.path.expanduser(first), os.path.expanduser(second))
    except (OSError, ValueError):
        return False


def _check_model(value: Any) -> str | None:
    """A draft path, or None: an explicit "no separate draft" (vLLM configs write "model": null)."""
    if value is None:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(
            f"model = {as_json(value)} must be a non-empty path to the draft or head checkpoint "
            "(a folder with config.json and *.safetensors)."
        )
    return value
