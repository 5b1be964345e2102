"""The speculative config's vocabulary (keys, methods, aliases, bounds), the checks of its values, and
the frozen effective config. What the user wrote is read in `specsure.config.user_spec`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final, Literal, Mapping

from specsure.config.errors import ConfigError, as_json
from specsure.config.token_tree import TREE_METHODS, DraftTree, parse_token_tree
from specsure.config.vllm_rules import MTP_MODEL_TYPES

Method = Literal["ngram", "draft_model", "eagle", "eagle3", "mtp", "suffix"]
METHODS: Final[tuple[str, ...]] = ("ngram", "draft_model", "eagle", "eagle3", "mtp", "suffix")
NO_DRAFT_METHODS: Final[frozenset[str]] = frozenset({"ngram", "suffix"})
"""Methods that draft from token history alone and never take a draft checkpoint."""

# vLLM's per-model MTP method names; they all mean "mtp" (vLLM 0.33.0 warns the same way).
MTP_METHOD_ALIASES: Final[frozenset[str]] = MTP_MODEL_TYPES - {"mtp"}

# vLLM methods specsure does not run; named so the error can say so instead of "unknown".
FOREIGN_METHODS: Final[frozenset[str]] = frozenset({"medusa", "mlp_speculator", "dflash", "dspark", "ngram_gpu",
                                                   "extract_hidden_states", "custom_class"})

SUFFIX_FIELDS: Final[tuple[str, ...]] = (
    "suffix_decoding_max_tree_depth", "suffix_decoding_max_cached_requests",
    "suffix_decoding_max_spec_factor", "suffix_decoding_min_token_prob",
)
"""vLLM's suffix-decoding keys, in vLLM's order; only method 'suffix' reads them."""
FIELDS: Final[tuple[str, ...]] = (
    "method", "model", "num_speculative_tokens", "speculative_token_tree",
    "prompt_lookup_min", "prompt_lookup_max", "prompt_lookup_branches",
    *SUFFIX_FIELDS, "disable_by_batch_size",
)
SPECSURE_ONLY_FIELDS: Final[frozenset[str]] = frozenset({"prompt_lookup_branches", "speculative_token_tree",
                                                         "disable_by_batch_size"})
"""Keys vLLM 0.33.0 does not have: exports leave them out (and say what vLLM does instead), but
disable_by_batch_size, which they give vLLM as its batch-size schedule (VLLM_SCHEDULE_KEY) where it
runs one. speculative_token_tree and disable_by_batch_size are keys of earlier vLLM releases, which
0.33.0 refuses."""
VLLM_INSTEAD: Final[Mapping[str, str]] = {
    "prompt_lookup_branches": "a chain of num_speculative_tokens = {k} tokens",
    "speculative_token_tree": "a chain of num_speculative_tokens = {k} tokens",
    "disable_by_batch_size": "at every batch size (it runs suffix on its V1 model runner, which turns its "
                             "batch-size schedule, num_speculative_tokens_per_batch_size, off)"}
"""What vLLM 0.33.0 drafts without each of SPECSURE_ONLY_FIELDS ({k}: the resolved k)."""
VLLM_SCHEDULE_KEY: Final[str] = "num_speculative_tokens_per_batch_size"
"""vLLM 0.33.0's batch-size schedule: inclusive (first, last, k) ranges, the last k carried on to
every larger batch (vllm/v1/spec_decode/dynamic/utils.py)."""
KEY_ALIASES: Final[Mapping[str, str]] = {"draft_model": "model"}
VLLM_ONLY_KEYS: Final[frozenset[str]] = frozenset({
    "draft_tensor_parallel_size", "tensor_parallel_size", "quantization", "draft_lm_head_quantization",
    "max_model_len", "revision", "code_revision", "draft_load_config", "enforce_eager", "moe_backend",
    "attention_backend", "kv_cache_dtype", "disable_padded_drafter_batch", "disable_eagle_block_drop",
    "disable_lookahead_block_hashes", "index_share_for_mtp_iteration", "use_local_argmax_reduction",
    "use_heterogeneous_vocab", "parallel_drafting", "num_speculative_tokens_per_batch_size",
    "rejection_sample_method", "draft_sample_method", "enable_adaptive_verification", "synthetic_acceptance_rates",
    "synthetic_acceptance_length", "dspark_draft_topk", "xpress_topc", "fly_window_size", "fly_entropy_threshold",
    "fly_entropy_top_k",
})
"""Keys of vLLM 0.33.0's speculative config (vllm/config/speculative.py) for its own deployment and
kernels (parallelism, quantization, revisions, attention and MoE backends, batching, its samplers and
schedules, other methods' knobs) that specsure's one-process engine does not read: its engine
refuses them by name, and `export` and `check-vllm` pass them on to vLLM as given."""
MAX_SPECULATIVE_TOKENS: Final[int] = 64
MAX_PROMPT_LOOKUP: Final[int] = 64
MAX_PROMPT_LOOKUP_BRANCHES: Final[int] = 16
"""A tree of b branches of depth k feeds up to b * k + 1 tokens per verify forward."""
MAX_SUFFIX_TREE_DEPTH: Final[int] = 128
"""specsure's ceiling on suffix_decoding_max_tree_depth: each committed token costs O(depth) tree
updates and each step O(depth^2) lookups in the worst case, in Python (vLLM sets none)."""


def check_batch_size(value: Any) -> None:
    """disable_by_batch_size: null, or an integer >= 2 (vLLM's bound: at 1 no step would ever draft)."""
    if type(value) is int and value == 1:  # 1.0 gets the integer error first
        raise ConfigError("disable_by_batch_size = 1 is out of range: it must be >= 2 (vLLM's bound); at 1 no step "
                          "would draft, which is plain decoding: remove the speculative config instead.")
    if value is not None:
        _check_at_least("disable_by_batch_size", value, 2, "steps whose batch holds at least that many sequences draft "
                        "nothing")


def _check_at_least(field: str, value: Any, low: int, meaning: str) -> None:
    """An integer >= ``low``; ``meaning`` says what the value does, in both errors."""
    if isinstance(value, bool) or not isinstance(value, int):
        # The hint only where following it gives a valid value, as in _check_int.
        hint = (f" Write {int(float(value))} without quotes or decimals."
                if _is_whole(value) and float(value) >= low else "")
        raise ConfigError(f"{field} = {as_json(value)} must be an integer >= {low} ({meaning}).{hint}")
    if value < low:
        raise ConfigError(f"{field} = {value} is out of range: it must be >= {low} ({meaning}).")


def check_int(field: str, value: Any, upper: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        # The hint only where following it gives a valid value; 100.0 would just meet the range error next.
        hint = (f" Write {int(float(value))} without quotes or decimals."
                if _is_whole(value) and 1 <= float(value) <= upper else "")
        raise ConfigError(f"{field} = {as_json(value)} must be an integer from 1 to {upper}.{hint}")
    if not 1 <= value <= upper:
        raise ConfigError(f"{field} = {value} is out of range: it must be from 1 to {upper}.")


def check_suffix_value(field: str, value: Any) -> int | float:
    """One suffix_decoding_* value, checked against vLLM's bounds (and specsure's depth ceiling).

    Returns the value in vLLM's type: the spec factor and the probability are floats in vLLM,
    and a JSON integer there is the same number as that float.
    """
    if field == "suffix_decoding_max_tree_depth":
        check_int(field, value, MAX_SUFFIX_TREE_DEPTH)
        return value
    if field == "suffix_decoding_max_cached_requests":
        _check_at_least(field, value, 0, "0 turns the global tree of earlier requests off")
        return value
    allowed = "a finite number >= 0" if field == "suffix_decoding_max_spec_factor" else "a number from 0 to 1"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        hint = f" Write {_number_text(value)} without quotes." if _is_number(value) else ""
        raise ConfigError(f"{field} = {as_json(value)} must be {allowed}.{hint}")
    try:
        number = float(value)
    except OverflowError:  # an integer beyond any float
        number = math.inf
    if not math.isfinite(number) or number < 0 or (field == "suffix_decoding_min_token_prob" and number > 1):
        raise ConfigError(f"{field} = {as_json(value)} is out of range: it must be {allowed}.")
    return number


def _is_number(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        return math.isfinite(float(value))
    except ValueError:
        return False


def _number_text(value: str) -> str:
    number = float(value)
    return str(int(number)) if number.is_integer() and "." not in value else repr(number)


def _is_whole(value: Any) -> bool:
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return False
    return math.isfinite(number) and number.is_integer() and not isinstance(value, bool)


@dataclass(frozen=True)
class SpeculativeConfig:
    """The effective speculative config: what runs. Built only by ``resolve``."""

    method: Method
    """The speculative method that runs: ngram, draft_model, eagle, eagle3, mtp or suffix."""
    model: str | None
    """Draft or head checkpoint path; None for ngram and suffix, and for mtp using the target's own layers."""
    num_speculative_tokens: int
    """k: draft tokens proposed per verification step, 1..64 (a token tree's node count)."""
    prompt_lookup_min: int | None = None
    """ngram only: the shortest n-gram matched, 1..64, <= prompt_lookup_max."""
    prompt_lookup_max: int | None = None
    """ngram only: the longest n-gram matched, 1..64."""
    prompt_lookup_branches: int | None = None
    """ngram only (a specsure key; vLLM has none): how many earlier matches one draft merges into a
    token tree, verified in one forward, 1..16. 1 drafts a single chain, as vLLM does."""
    suffix_decoding_max_tree_depth: int | None = None
    """suffix only: the longest token string the suffix trees hold, 1..128; it bounds the matched
    pattern plus the draft that follows it."""
    suffix_decoding_max_cached_requests: int | None = None
    """suffix only: how many earlier requests' outputs the global tree keeps (FIFO); 0 turns it off."""
    suffix_decoding_max_spec_factor: float | None = None
    """suffix only: a match of m tokens drafts at most floor(factor * m) tokens (and at most k); >= 0."""
    suffix_decoding_min_token_prob: float | None = None
    """suffix only: drafting stops before a token whose estimated probability (from the trees'
    counts, multiplied along the draft) is below this, 0..1."""
    speculative_token_tree: DraftTree | None = None
    """eagle, eagle3 and mtp (the key of earlier vLLM releases): the draft tree as child-rank paths,
    breadth-first; None drafts a chain of k tokens."""
    disable_by_batch_size: int | None = None
    """Every method: a step whose batch holds at least this many sequences drafts nothing (each
    sequence decodes one token, as plain decoding); None drafts at every batch size."""

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ConfigError(f"method = {self.method!r} is not one of {', '.join(METHODS)}.")
        check_int("num_speculative_tokens", self.num_speculative_tokens, MAX_SPECULATIVE_TOKENS)
        is_ngram = self.method == "ngram"
        if is_ngram and self.prompt_lookup_branches is None:  # a chain, as before the key existed
            object.__setattr__(self, "prompt_lookup_branches", 1)
        for key in ("prompt_lookup_min", "prompt_lookup_max", "prompt_lookup_branches"):
            value = getattr(self, key)
            if is_ngram:
                check_int(key, value, MAX_PROMPT_LOOKUP if key != "prompt_lookup_branches" else
                           MAX_PROMPT_LOOKUP_BRANCHES)
            elif value is not None:
                raise ConfigError(f"{key} = {value} applies only to method 'ngram', not {self.method!r}.")
        if is_ngram and self.prompt_lookup_min > self.prompt_lookup_max:  # type: ignore[operator]
            raise ConfigError(
                f"prompt_lookup_min = {self.prompt_lookup_min} is larger than prompt_lookup_max = "
                f"{self.prompt_lookup_max}; set min <= max."
            )
        tree = self.speculative_token_tree
        if tree is not None:
            tree = parse_token_tree(tree, MAX_SPECULATIVE_TOKENS)  # checked and breadth-first, however it was built
            object.__setattr__(self, "speculative_token_tree", tree)
            if self.method not in TREE_METHODS:
                raise ConfigError(f"speculative_token_tree applies only to methods {', '.join(TREE_METHODS)}, "
                                  f"not {self.method!r}.")
            if len(tree) != self.num_speculative_tokens:
                raise ConfigError(f"speculative_token_tree has {len(tree)} nodes but num_speculative_tokens is "
                                  f"{self.num_speculative_tokens}; they must be equal.")
        if self.method in NO_DRAFT_METHODS and self.model is not None:
            raise ConfigError(f"model = {self.model!r} is not used by method {self.method!r}; remove it.")
        for key in SUFFIX_FIELDS:
            value = getattr(self, key)
            if self.method == "suffix":
                if value is None:
                    raise ConfigError(f"{key} is required for method 'suffix'; resolve() fills it.")
                check_suffix_value(key, value)
            elif value is not None:
                raise ConfigError(f"{key} = {value} applies only to method 'suffix', not {self.method!r}.")
        check_batch_size(self.disable_by_batch_size)

    def to_vllm(self) -> dict[str, Any]:
        """Every field explicit, in vLLM's key names, so vLLM has nothing left to detect."""
        out: dict[str, Any] = {"method": self.method, "num_speculative_tokens": self.num_speculative_tokens}
        if self.model is not None:
            out["model"] = self.model
        if self.method == "ngram":
            out["prompt_lookup_min"] = self.prompt_lookup_min
            out["prompt_lookup_max"] = self.prompt_lookup_max
        if self.method == "suffix":
            out.update({key: getattr(self, key) for key in SUFFIX_FIELDS})
        if (schedule := self.vllm_batch_schedule()) is not None:
            out[VLLM_SCHEDULE_KEY] = schedule
        return out

    def vllm_batch_schedule(self) -> list[list[int]] | None:
        """disable_by_batch_size as vLLM 0.33.0's schedule: k below the limit, none from it on. None
        without a limit, and for suffix: vLLM runs suffix on its V1 model runner, which turns the
        schedule off (vllm/config/vllm.py, _maybe_disable_dynamic_sd_for_v1)."""
        limit = self.disable_by_batch_size
        if limit is None or self.method == "suffix":
            return None
        return [[1, limit - 1, self.num_speculative_tokens], [limit, limit, 0]]
