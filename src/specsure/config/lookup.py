"""The fields of the model-free methods: ngram's prompt-lookup keys and suffix decoding's four keys.

Each is the user's value when given, else a default (vLLM's, where vLLM has the key), and None
with a reason for every other method; a key given for another method is a ConfigError.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Final, Mapping

from specsure.config.decision import Decision
from specsure.config.errors import ConfigError
from specsure.config.schema import SUFFIX_FIELDS, check_suffix_value
from specsure.config.user_spec import UNSET, UserSpec

DEFAULT_PROMPT_LOOKUP: Final[tuple[int, int]] = (2, 5)
# vLLM 0.33.0's defaults (vllm/config/speculative.py); suffix's k defaults to the tree depth.
DEFAULT_SUFFIX: Final[Mapping[str, int | float]] = MappingProxyType({
    "suffix_decoding_max_tree_depth": 24, "suffix_decoding_max_cached_requests": 10000,
    "suffix_decoding_max_spec_factor": 1.0, "suffix_decoding_min_token_prob": 0.1})
_SUFFIX_MEANING: Final[Mapping[str, str]] = MappingProxyType({
    "suffix_decoding_max_tree_depth": "the trees hold token strings of up to {} tokens (pattern plus draft).",
    "suffix_decoding_max_cached_requests": "the global tree keeps the outputs of the {} most recent requests.",
    "suffix_decoding_max_spec_factor": "a match of m tokens drafts at most {} x m tokens.",
    "suffix_decoding_min_token_prob": "drafting stops before a token whose estimated probability is below {}.",
})


def decide_suffix(spec: UserSpec, method: str) -> dict[str, Decision]:
    """vLLM's four suffix-decoding keys: the user's, else vLLM's defaults; None for other methods."""
    given = {name: getattr(spec, name) for name in SUFFIX_FIELDS}
    if method != "suffix":
        for name, value in given.items():
            if value is not UNSET:
                raise ConfigError(f"{name} = {value} applies only to method 'suffix', but the method is "
                                  f"{method!r}. Remove {name}, or set method 'suffix'.")
        why = f"Only suffix decoding uses it; the method is {method!r}."
        return {name: Decision(name, None, "derived", why) for name in SUFFIX_FIELDS}
    out = {}
    for name, value in given.items():
        if value is UNSET:
            out[name] = Decision(name, DEFAULT_SUFFIX[name], "default",
                                 "vLLM's default: " + _SUFFIX_MEANING[name].format(DEFAULT_SUFFIX[name]))
        elif name == "suffix_decoding_max_cached_requests" and value == 0:
            out[name] = Decision(name, 0, "user", "You set 0: the global tree of earlier outputs is off, and "
                                                  "only this request's own tree drafts.")
        else:
            out[name] = Decision(name, check_suffix_value(name, value), "user", f"You set {name}.")
    return out

def decide_prompt_lookup(spec: UserSpec, method: str) -> dict[str, Decision]:
    lo, hi, branches = spec.prompt_lookup_min, spec.prompt_lookup_max, spec.prompt_lookup_branches
    names = ("prompt_lookup_min", "prompt_lookup_max", "prompt_lookup_branches")
    if method != "ngram":
        for name, value in zip(names, (lo, hi, branches)):
            if value is not UNSET:
                raise ConfigError(f"{name} = {value} applies only to method 'ngram', but the method is "
                                  f"{method!r}. Remove {name}, or set method 'ngram'.")
        why = f"Only ngram uses prompt lookup; the method is {method!r}."
        return {n: Decision(n, None, "derived", why) for n in names}
    if branches is UNSET:
        tree = Decision("prompt_lookup_branches", 1, "default",
                        "The default drafts one chain, as vLLM does; set it above 1 to verify several matches as "
                        "one token tree.")
    else:
        tree = Decision("prompt_lookup_branches", branches, "user", "You set prompt_lookup_branches.")
    return {**_decide_lookup_range(lo, hi), "prompt_lookup_branches": tree}

def lookup_range(lo: int | None, hi: int | None) -> tuple[int, int]:
    """(min, max) of the n-grams ngram matches for prompt_lookup_min and _max (None: not set), by the
    same rule resolution applies: vLLM's, where one bound alone sets both."""
    decided = _decide_lookup_range(UNSET if lo is None else lo, UNSET if hi is None else hi)
    return decided["prompt_lookup_min"].value, decided["prompt_lookup_max"].value


def _decide_lookup_range(lo: Any, hi: Any) -> dict[str, Decision]:
    if lo is UNSET and hi is UNSET:
        why = "The default n-gram range is {}..{}.".format(*DEFAULT_PROMPT_LOOKUP)
        return {"prompt_lookup_min": Decision("prompt_lookup_min", DEFAULT_PROMPT_LOOKUP[0], "default", why),
                "prompt_lookup_max": Decision("prompt_lookup_max", DEFAULT_PROMPT_LOOKUP[1], "default", why)}
    if lo is UNSET:
        return {"prompt_lookup_min": Decision("prompt_lookup_min", hi, "derived",
                                              "Only prompt_lookup_max was given; min = max (vLLM's rule)."),
                "prompt_lookup_max": Decision("prompt_lookup_max", hi, "user", "You set prompt_lookup_max.")}
    if hi is UNSET:
        return {"prompt_lookup_min": Decision("prompt_lookup_min", lo, "user", "You set prompt_lookup_min."),
                "prompt_lookup_max": Decision("prompt_lookup_max", lo, "derived",
                                              "Only prompt_lookup_min was given; max = min (vLLM's rule).")}
    return {"prompt_lookup_min": Decision("prompt_lookup_min", lo, "user", "You set prompt_lookup_min."),
            "prompt_lookup_max": Decision("prompt_lookup_max", hi, "user", "You set prompt_lookup_max.")}
