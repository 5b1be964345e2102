"""Building the configurations a run compares, with a reason for each one that cannot run."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from specsure.bench.runners import Runner, SpecsureRunner, TransformersRunner
from specsure.config import ConfigError
from specsure.config.schema import SUFFIX_FIELDS
from specsure.config.lookup import lookup_range
from specsure.config.user_spec import parse_user_spec
from specsure.config.shipped import TREE_FAST_BF16

METHODS: tuple[str, ...] = ("plain", "ngram", "ngram-tree", "draft_model", "eagle", "eagle3", "eagle3-tree", "mtp",
                            "mtp-tree", "suffix")
"""specsure configurations, in report order; 'plain' is speculation off. 'ngram-tree' is ngram with
prompt_lookup_branches > 1; 'eagle3-tree' and 'mtp-tree' draft a speculative_token_tree."""
DEFAULT_METHODS: tuple[str, ...] = tuple(m for m in METHODS if m not in ("eagle3-tree", "mtp-tree"))
"""What --methods runs by default: the eagle3 and mtp rows draft what their shipped heads draft by
default on this CPU (shipped.py), unless --token-tree or -k sets something else; the tree rows are
asked for by name."""
DEFAULT_TREES: dict[str, str] = {f"{m}-tree": str(TREE_FAST_BF16) for m in ("eagle3", "mtp")}
"""The trees of 'eagle3-tree' and 'mtp-tree' unless --token-tree is given: the shipped heads' default
where bf16 is fast, their first two choices."""
BASELINES: tuple[str, ...] = ("hf", "hf-prompt-lookup", "hf-assisted")
"""transformers configurations: generate greedy, prompt lookup, assisted generation."""

DEFAULT_K = 8
"""k of the context-drafting methods, draft_model and the baselines when --num-speculative-tokens is not given."""

# The flag that supplies each method's draft or head checkpoint. Without one, eagle3 and mtp
# run with what resolution finds: on the packaged default target the heads shipped with
# specsure, and for mtp the target's own MTP layers; resolution's error says why otherwise.
_HEAD_FLAG = {"draft_model": "draft_model", "eagle": "eagle_head", "eagle3": "eagle3_head", "mtp": "mtp_head"}

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


@dataclass(frozen=True)
class Settings:
    """What the runners are built from (a subset of the CLI arguments)."""

    model: str | None
    dtype: str
    """An explicit dtype name ('auto' already resolved), so every configuration shares it."""
    num_speculative_tokens: int
    head_k: int | None = None
    """k for eagle, eagle3 and mtp; None leaves it to resolution (the head's or the method's default)."""
    draft_model: str | None = None
    eagle_head: str | None = None
    eagle3_head: str | None = None
    mtp_head: str | None = None
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    prompt_lookup_branches: int = 4
    """ngram-tree only: the branches merged into each draft's token tree."""
    token_tree: str | None = None
    """eagle3-tree and mtp-tree: the speculative_token_tree; None takes DEFAULT_TREES'."""
    # suffix only; None keeps vLLM's default.
    suffix_decoding_max_tree_depth: int | None = None
    suffix_decoding_max_cached_requests: int | None = None
    suffix_decoding_max_spec_factor: float | None = None
    suffix_decoding_min_token_prob: float | None = None
    int8_activations: bool = False
    """Every specsure row's target multiplies with int8 activations (`load_model`); plain too, so the
    rows still compare within one arithmetic."""


def lookup_max(s: Settings) -> int:
    """The longest n-gram the prompt-lookup baselines match: the prompt_lookup_max specsure's ngram runs
    with, so that a difference between the rows is the implementation's, not the matching rule's. (The
    transformers and llama-cpp-python baselines fall back down to 1-grams; ngram stops at its min.
    llama-server's ngram-simple matches this one length only: of its lengths 2 to 4 the longest was
    its fastest, measured.)"""
    return lookup_range(s.prompt_lookup_min, s.prompt_lookup_max)[1]


def dtype_name(dtype: torch.dtype) -> str:
    return _DTYPE_NAMES[dtype]


def speculative_config(method: str, s: Settings) -> dict[str, Any] | None:
    """The user speculative config (vLLM keys) for `method`; None for plain decoding.

    Raises:
        LookupError: the method needs a draft/head checkpoint and none was given.
    """
    if method == "plain":
        return None
    if method == "ngram-tree":
        return {**speculative_config("ngram", s), "prompt_lookup_branches": s.prompt_lookup_branches}
    if method in DEFAULT_TREES:  # k is the tree's node count
        base = {k: v for k, v in speculative_config(method.removesuffix("-tree"), s).items()  # type: ignore[union-attr]
                if k != "num_speculative_tokens"}
        return {**base, "speculative_token_tree": s.token_tree or DEFAULT_TREES[method]}
    # The heads take their own k unless one was asked for; the rest take the run's.
    k = s.head_k if method in ("eagle", "eagle3", "mtp") else s.num_speculative_tokens
    config: dict[str, Any] = {"method": method} if k is None else {"method": method, "num_speculative_tokens": k}
    if method == "ngram":
        if s.prompt_lookup_min is not None:
            config["prompt_lookup_min"] = s.prompt_lookup_min
        if s.prompt_lookup_max is not None:
            config["prompt_lookup_max"] = s.prompt_lookup_max
        return config
    if method == "suffix":
        config.update((key, getattr(s, key)) for key in SUFFIX_FIELDS if getattr(s, key) is not None)
        return config
    head = getattr(s, _HEAD_FLAG[method])
    if head is not None:
        config["model"] = head
    elif method in ("draft_model", "eagle") or (method == "eagle3" and s.model is not None):
        raise LookupError(f"no --{_HEAD_FLAG[method].replace('_', '-')} given")
    return config


FLAG_OF: dict[str, str] = {
    "num_speculative_tokens": "--num-speculative-tokens", "prompt_lookup_min": "--prompt-lookup-min",
    "prompt_lookup_max": "--prompt-lookup-max", "prompt_lookup_branches": "--prompt-lookup-branches",
    "speculative_token_tree": "--token-tree", **{key: "--" + key.replace("_decoding", "").replace("_", "-")
                                                 for key in SUFFIX_FIELDS},
}
"""The bench flag that sets each speculative config key."""


def check_flag_values(methods: Sequence[str], s: Settings) -> None:
    """Each method's config from the flags, checked as resolution checks values (no checkpoint read).

    A value out of range is the user's mistake, not a method this target cannot run: it is an error
    before anything loads, never a skipped row in a run that exits 0.
    """
    for method in methods:
        try:
            spec = speculative_config(method, s)
        except LookupError:
            continue  # a missing checkpoint flag: build_specsure skips the method and says why
        if spec is None:
            continue
        try:
            parse_user_spec(spec)
        except ConfigError as err:
            flag = next((FLAG_OF[key] for key in FLAG_OF if str(err).startswith(key)), None)
            raise ConfigError(f"{flag + ': ' if flag else ''}{err} (method {method!r})") from None


def check_checkpoint_flags(methods: Sequence[str], s: Settings) -> None:
    """A checkpoint flag the user gave (--draft-model, --eagle-head, --eagle3-head, --mtp-head) must name a
    checkpoint its selected rows can run, read from metadata before anything loads: a typo in a path is
    the user's mistake, never a skipped row in a run that exits 0 (only a flag not given skips its rows)."""
    from specsure.config import resolve

    for method in methods:
        flag = _HEAD_FLAG.get(method.removesuffix("-tree"))
        path = getattr(s, flag) if flag is not None else None
        if path is None:
            continue
        try:
            resolve(speculative_config(method, s), model=s.model, dtype=s.dtype).check_runnable()
        except ConfigError as err:
            raise ConfigError(f"--{flag.replace('_', '-')} {path!r} (the {method} row): {err} In specsure bench each "
                              "head kind has its own flag: --eagle-head, --eagle3-head, --mtp-head.") from None
    # --draft-model also feeds the hf-assisted baseline; a head flag feeds its rows alone.
    selected = {m.removesuffix("-tree") for m in methods}
    for method, flag in _HEAD_FLAG.items():
        if method != "draft_model" and getattr(s, flag) is not None and method not in selected:
            tree = f" (or {method}-tree)" if f"{method}-tree" in METHODS else ""
            raise ConfigError(f"--{flag.replace('_', '-')} is given, but no selected row uses it: add {method}{tree} "
                              f"to --methods ({', '.join(methods)}), or leave the flag out.")
    if s.token_tree is not None and not set(methods) & set(DEFAULT_TREES):
        raise ConfigError(f"--token-tree is given, but no selected row uses it: add {' or '.join(sorted(DEFAULT_TREES))} "
                          f"to --methods ({', '.join(methods)}), or leave the flag out.")


def build_specsure(methods: Sequence[str], s: Settings, eos_ids: frozenset[int]) -> tuple[list[Runner], list[tuple[str, str]]]:
    """One engine per method (built once, reused for every prompt), and the skipped ones.

    A method is skipped when its checkpoint flag is missing or `make_engine` raises a
    ConfigError (the error text is the reason). 'plain' is required: it is the reference.
    """
    from specsure.decode.engine import make_engine

    runners: list[Runner] = []
    skipped: list[tuple[str, str]] = []
    for method in methods:
        try:
            spec = speculative_config(method, s)
        except LookupError as err:
            skipped.append((method, str(err)))
            continue
        try:
            engine = make_engine(model=s.model, speculative=spec, dtype=s.dtype, int8_activations=s.int8_activations)
        except ConfigError as err:
            if method == "plain":
                raise
            skipped.append((method, f"make_engine refused {spec}: {err}"))
            continue
        runners.append(SpecsureRunner(method, engine, eos_ids))
    return runners, skipped


def build_transformers(
    baselines: Sequence[str], s: Settings, target_hf: Any, eos_ids: frozenset[int], load_hf: Any
) -> tuple[list[Runner], list[tuple[str, str]]]:
    """The transformers baselines on `target_hf`; `load_hf(path)` loads the assisted draft."""
    runners: list[Runner] = []
    skipped: list[tuple[str, str]] = []
    for name in baselines:
        if name == "hf":
            runners.append(TransformersRunner(name, target_hf, {}, eos_ids))
        elif name == "hf-prompt-lookup":
            lookup = {"prompt_lookup_num_tokens": s.num_speculative_tokens, "max_matching_ngram_size": lookup_max(s)}
            runners.append(TransformersRunner(name, target_hf, lookup, eos_ids, plain="hf"))
        elif name == "hf-assisted":
            if s.draft_model is None:
                skipped.append((name, "no --draft-model given (assisted generation uses the same draft as draft_model)"))
                continue
            try:
                assistant = load_hf(s.draft_model)
            except ConfigError as err:
                skipped.append((name, f"cannot load the draft model: {err}"))
                continue
            ours, theirs = (int(m.config.get_text_config(decoder=True).vocab_size) for m in (target_hf, assistant))
            if ours != theirs:  # transformers would stop the whole run mid-bench, asking for tokenizers
                skipped.append((name, f"the draft {s.draft_model!r} has vocab_size={theirs} and the target "
                                      f"{ours}; assisted generation compares token ids, so give --draft-model a "
                                      "draft with the target's tokenizer"))
                continue
            runners.append(TransformersRunner(name, target_hf, {"assistant_model": assistant}, eos_ids, plain="hf"))
    return runners, skipped
