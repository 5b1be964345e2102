"""Sampling parameters: vLLM's names and meanings, each value checked, and the seed torch's generator takes."""

from __future__ import annotations

import math
import numbers
import difflib
import inspect
from dataclasses import dataclass, fields
from collections.abc import Mapping
from typing import Sequence

from specsure.grammar import GrammarError, StructuredOutputs

SEED_LIMIT = 2**64  # torch.Generator.manual_seed rejects seeds at or above this
SEED_FLOOR = -(2**63)  # and below this; it reads a negative seed as its two's complement, as vLLM passes one
_TORCH_SEED_BITS = 32  # torch's CPU generator (mt19937) keeps only the low 32 bits of its seed


def generator_seed(seed: int) -> int:
    """The seed handed to torch's CPU generator for ``seed`` (a SamplingParams or engine seed).

    torch keeps only a seed's low 32 bits, so 0, 2**32 and 2**63 would sample alike. A seed below
    2**32 goes as it is; a larger one is mixed (splitmix64's finaliser) into 32 bits, so seeds
    that differ in their high bits (64-bit hashes, UUID halves) sample apart, two of them
    colliding with probability 2**-32."""
    if seed < 2**_TORCH_SEED_BITS:
        return seed
    mask = 2**64 - 1
    z = (seed + 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    z ^= z >> 31
    return (z ^ (z >> 32)) & (2**_TORCH_SEED_BITS - 1)
MAX_STOP_STRINGS = 64
MAX_STOP_CHARS = 1024
MAX_LOGPROBS = 20
"""The most alternatives ``logprobs`` may ask for per position (OpenAI's and vLLM's limit)."""
MIN_TEMPERATURE = 1e-5
"""The smallest positive temperature (vLLM's sampling epsilon). Far below it, logits / temperature
overflows float32 and the sampler fails on inf/nan; that close to 0, greedy is what is meant."""


class SamplingError(ValueError):
    """A SamplingParams field with a value it refuses; ``field`` and ``allowed`` let the server say it in JSON."""

    def __init__(self, field: str, value: object, allowed: str, fix: str) -> None:
        super().__init__(f"SamplingParams.{field} = {value!r} {allowed}; {fix}")
        self.field = field
        self.allowed = allowed
        """What is wrong, in words ("is invalid: it must be an int >= 1")."""


def _fail(field: str, value: object, allowed: str, fix: str) -> SamplingError:
    return SamplingError(field, value, allowed, fix)


VLLM_ONLY_FIELDS: dict[str, str] = {
    "n": "pass the prompt n times in one generate() call, each copy with its own seed (the server takes n)",
    "best_of": "pass the prompt several times and keep the best completion yourself",
    "use_beam_search": "beam search is not speculative decoding's to speed up; generate greedily (temperature 0)",
    "guided_decoding": "give structured_outputs, vLLM's newer name for it (json, regex, choice or grammar)",
}
"""vLLM SamplingParams fields specsure does not implement, and what to do instead."""
TRANSFORMERS_NAMES: dict[str, str] = {
    "max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens", "stop_strings": "stop",
    "eos_token_id": "stop_token_ids", "num_return_sequences": "n", "do_sample": "temperature",
}
"""transformers' generate() names for SamplingParams fields (vLLM's names)."""


def _unknown_field(name: str, known: list[str]) -> str:
    if name in VLLM_ONLY_FIELDS:
        return (f"SamplingParams has no field {name!r}: vLLM has it, specsure does not implement it; "
                f"{VLLM_ONLY_FIELDS[name]}.")
    if TRANSFORMERS_NAMES.get(name) in VLLM_ONLY_FIELDS:
        ours = TRANSFORMERS_NAMES[name]
        return (f"SamplingParams has no field {name!r}: that is transformers' name for vLLM's {ours!r}, which "
                f"specsure's SamplingParams does not implement; {VLLM_ONLY_FIELDS[ours]}.")
    if name in TRANSFORMERS_NAMES and TRANSFORMERS_NAMES[name] in known:
        said = " (0 is greedy, do_sample=False; above 0 samples)" if name == "do_sample" else ""
        return (f"SamplingParams has no field {name!r}: that is transformers' generate() name; specsure takes "
                f"vLLM's, {TRANSFORMERS_NAMES[name]!r}{said}.")
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return f"SamplingParams has no field {name!r}.{hint} Fields: {', '.join(known)}."


def _is_int(value: object) -> bool:
    # bool is an int subclass, but True as a token count or seed is always a mistake.
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """How to pick each output token. Frozen; validated on construction."""

    max_tokens: int = 16
    """The most new tokens to generate for one prompt (>= 1)."""
    temperature: float = 0.0
    """Softmax temperature: 0, or at least ``MIN_TEMPERATURE``. 0 means greedy: always the most
    likely token."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of most likely tokens whose mass is >= top_p,
    in (0, 1]. 1.0 disables it."""
    top_k: int = 0
    """Keep only the k most likely tokens (>= 1). 0 disables it; -1, vLLM's other spelling of
    disabled, is stored as 0."""
    seed: int | None = None
    """Seed for this request's torch.Generator, for reproducible sampling, an int in [-2**63, 2**64)
    (vLLM's int64, and unsigned 64-bit seeds too); None = unseeded, and so is -1 (vLLM's and llama.cpp's "random"). Another
    negative seed is stored as its two's complement (what torch and vLLM make of it); a seed of 2**32
    or more is mixed into the 32 bits torch's generator keeps (``generator_seed``). The draft
    decides how much of the random stream a step uses, so with suffix decoding, whose drafts also
    come from earlier requests' outputs, a seed repeats its output only on a fresh engine, and with
    ``disable_by_batch_size``, which drafts or not by how full the batch is, only at the same load
    (the output's distribution is the target's either way; greedy output does not change)."""
    stop: tuple[str, ...] | None = None
    """Strings that end generation when they appear in the output text. A single str or a list
    is accepted and stored as a tuple; an empty collection is stored as None."""
    ignore_eos: bool = False
    """Keep generating past the end-of-sequence token (useful for benchmarks)."""
    logprobs: int | None = None
    """Also return each output token's log-probability under the target's own distribution (its
    logits before temperature, top-k or top-p), with this many most likely alternatives
    (0 to MAX_LOGPROBS); None returns none."""
    prompt_logprobs: int | None = None
    """Also return each prompt token's log-probability under the target's own distribution (the first
    token has none: nothing precedes it), with this many most likely alternatives (0 to
    MAX_LOGPROBS), as vLLM does; None returns none. The prompt's forward then computes the logits
    of every prompt position, not only its last."""
    min_p: float = 0.0
    """Drop the tokens whose probability (after temperature) is below min_p times the most likely
    one's, in [0, 1], before top-k and top-p, as vLLM does. 0 disables it."""
    stop_token_ids: tuple[int, ...] | None = None
    """Token ids that end generation when generated, even with ignore_eos (as in vLLM); the token
    stays in the output ids, its text leaves the text unless include_stop_str_in_output."""
    include_stop_str_in_output: bool = False
    """Keep the stop string (or a stop token's text) at the end of the text."""
    skip_special_tokens: bool = True
    """Leave special tokens' text out of the output text (vLLM's default); False writes them, as a
    tool-call parser whose tags are special tokens needs. The token that ended the output (EOS or
    a stop token) stays out of the text either way, unless include_stop_str_in_output."""
    min_tokens: int = 0
    """Generate at least this many tokens before EOS, a stop token or a stop string may end the
    output; until then the target's EOS and stop tokens get probability 0 (vLLM's rule)."""
    presence_penalty: float = 0.0
    """Subtracted from the logit of every token the output holds, in [-2, 2] (OpenAI's and vLLM's)."""
    frequency_penalty: float = 0.0
    """Subtracted from a token's logit once per time the output holds it, in [-2, 2]."""
    repetition_penalty: float = 1.0
    """For tokens in the prompt or the output: positive logits divided by it, negative ones multiplied;
    any finite number above 0, as vLLM takes it; 1 disables it."""
    logit_bias: tuple[tuple[int, float], ...] | None = None
    """Added to the target's logits of these token ids before anything else but allowed_token_ids
    (vLLM's order), each bias in [-100, 100] (OpenAI's range): -100 all but bans a token. Given as a
    dict {token id: bias}, as vLLM and OpenAI take it; stored as (id, bias) pairs in id order, so
    that the params stay hashable. An empty dict is stored as None."""
    allowed_token_ids: tuple[int, ...] | None = None
    """Only these token ids may be generated: every other logit is -inf (vLLM's field). A list is
    stored as a tuple; it may not be empty."""
    structured_outputs: StructuredOutputs | None = None
    """Constrain the output text to a JSON Schema, a regular expression, a list of choices or any
    JSON object (vLLM's field; ``specsure.grammar``). A dict with vLLM's keys (``{"json": schema}``,
    ``{"regex": ...}``, ``{"choice": [...]}``, ``{"json_object": True}``) is accepted."""

    def __new__(cls, *args: object, **kwargs: object) -> "SamplingParams":
        # The generated __init__ would refuse a vLLM field specsure lacks with a bare TypeError;
        # code ported from vLLM deserves the field's name and what to do instead.
        known = {f.name for f in fields(cls)}
        for name in kwargs:
            if name not in known:
                raise TypeError(_unknown_field(name, sorted(known)))
        return super().__new__(cls)

    def __post_init__(self) -> None:
        # numpy's and other libraries' scalars are numbers too; stored as Python's so every later use is
        # plain (np.float64 is a float subclass, so the type itself is compared).
        for name in ("max_tokens", "top_k", "seed", "logprobs", "prompt_logprobs", "min_tokens"):
            value = getattr(self, name)
            if isinstance(value, numbers.Integral) and type(value) not in (bool, int):
                object.__setattr__(self, name, int(value))
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
            value = getattr(self, name)
            if isinstance(value, numbers.Real) and type(value) not in (bool, int, float):
                object.__setattr__(self, name, float(value))
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise _fail("max_tokens", self.max_tokens, "is invalid: it must be an int >= 1",
                        "pass the number of new tokens to generate, e.g. max_tokens=16")
        if not _is_real(self.temperature) or not math.isfinite(self.temperature) or self.temperature < 0:
            raise _fail("temperature", self.temperature, "is invalid: it must be a finite number >= 0",
                        "use 0 for greedy decoding or a positive value such as 0.7 to sample")
        if 0 < self.temperature < MIN_TEMPERATURE:
            raise _fail("temperature", self.temperature, f"is too small to sample with: it must be 0 or >= "
                        f"{MIN_TEMPERATURE:g}", "use 0 for greedy decoding")
        if not _is_real(self.top_p):
            raise _fail("top_p", self.top_p, "is invalid: it must be a number in (0, 1]",
                        "use 1.0 to disable nucleus sampling")
        if not 0 < self.top_p <= 1:  # also rejects NaN
            raise _fail("top_p", self.top_p, "is out of range: it must be in (0, 1]",
                        "use 1.0 to disable nucleus sampling")
        if not _is_int(self.top_k) or self.top_k < -1:
            raise _fail("top_k", self.top_k, "is invalid: it must be an int >= 0, or -1",
                        "use 0 (or -1) to disable top-k filtering")
        if self.top_k == -1:
            object.__setattr__(self, "top_k", 0)
        if self.seed is not None and (not _is_int(self.seed) or not SEED_FLOOR <= self.seed < SEED_LIMIT):
            raise _fail("seed", self.seed, "is invalid: it must be None or an int in [-2**63, 2**64)",
                        "use None (or -1) for an unseeded (random) generator")
        if self.seed is not None:
            object.__setattr__(self, "seed", None if self.seed == -1 else int(self.seed) % SEED_LIMIT)
        object.__setattr__(self, "stop", self._normalise_stop(self.stop))
        if not isinstance(self.ignore_eos, bool):
            raise _fail("ignore_eos", self.ignore_eos, "is invalid: it must be a bool",
                        "pass True or False")
        if self.logprobs is not None and (not _is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_LOGPROBS):
            raise _fail("logprobs", self.logprobs, f"is invalid: it must be None or an int from 0 to {MAX_LOGPROBS}",
                        "pass the number of alternatives to return per token (0: only the chosen token's)")
        if self.prompt_logprobs is not None and (not _is_int(self.prompt_logprobs)
                                                 or not 0 <= self.prompt_logprobs <= MAX_LOGPROBS):
            raise _fail("prompt_logprobs", self.prompt_logprobs, "is invalid: it must be None or an int from 0 to "
                        f"{MAX_LOGPROBS}", "pass the number of alternatives to return per prompt token (0: only "
                        "the prompt token's own)")
        if not _is_real(self.min_p) or not 0 <= self.min_p <= 1:  # also rejects NaN
            raise _fail("min_p", self.min_p, "is invalid: it must be a number in [0, 1]", "use 0 to disable it")
        object.__setattr__(self, "stop_token_ids", self._normalise_ids(self.stop_token_ids))
        for name in ("include_stop_str_in_output", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise _fail(name, getattr(self, name), "is invalid: it must be a bool", "pass True or False")
        for name, low, high in (("presence_penalty", -2.0, 2.0), ("frequency_penalty", -2.0, 2.0),
                                ("repetition_penalty", 0.0, math.inf)):
            value = getattr(self, name)
            inside = _is_real(value) and (low < value < high if name == "repetition_penalty" else low <= value <= high)
            if not inside:  # also NaN
                span = "(0, inf), finite" if name == "repetition_penalty" else f"[{low:g}, {high:g}]"
                neutral = 1 if name == "repetition_penalty" else 0
                raise _fail(name, value, f"is invalid: it must be a number in {span}", f"use {neutral} to disable it")
        object.__setattr__(self, "logit_bias", _token_bias(self.logit_bias))
        object.__setattr__(self, "allowed_token_ids", _allowed_ids(self.allowed_token_ids))
        object.__setattr__(self, "structured_outputs", _structured(self.structured_outputs))
        if not _is_int(self.min_tokens) or not 0 <= self.min_tokens <= self.max_tokens:
            raise _fail("min_tokens", self.min_tokens, f"is invalid: it must be an int from 0 to max_tokens "
                        f"({self.max_tokens})", "use 0 to let EOS end the output at any time")

    @staticmethod
    def _normalise_ids(ids: object) -> tuple[int, ...] | None:
        if ids is None:
            return None
        if isinstance(ids, (list, tuple)):  # numpy's integers are token ids too, as allowed_token_ids takes them
            ids = [int(i) if isinstance(i, numbers.Integral) and not isinstance(i, bool) else i for i in ids]
        if not isinstance(ids, (list, tuple)) or not all(_is_int(i) and i >= 0 for i in ids):
            raise _fail("stop_token_ids", ids, "is invalid: it must be None or a list of token ids (ints >= 0)",
                        "pass e.g. stop_token_ids=[2]")
        return tuple(ids) or None

    @staticmethod
    def _normalise_stop(stop: object) -> tuple[str, ...] | None:
        if stop is None:
            return None
        strings: Sequence[object] = (stop,) if isinstance(stop, str) else stop  # type: ignore[assignment]
        if not isinstance(strings, (list, tuple)):
            raise _fail("stop", stop, "is invalid: it must be None, a str, or a list of str",
                        "pass e.g. stop=['\\n\\n']")
        for s in strings:
            if not isinstance(s, str) or not s:
                raise _fail("stop", stop, "is invalid: every stop string must be a non-empty str",
                            "remove empty or non-string entries")
        # Every step searches the output for each stop string: a million of them stalled every request
        # of a server for minutes. The bounds are far above any real use (OpenAI's own limit is 4).
        if len(strings) > MAX_STOP_STRINGS:
            raise _fail("stop", f"<{len(strings)} strings>", f"is invalid: at most {MAX_STOP_STRINGS} stop strings "
                        "are taken", f"pass {MAX_STOP_STRINGS} or fewer")
        if longest := max((s for s in strings if len(s) > MAX_STOP_CHARS), key=len, default=None):  # type: ignore[arg-type]
            raise _fail("stop", f"<a string of {len(longest)} characters>", f"is invalid: a stop string may hold at "
                        f"most {MAX_STOP_CHARS} characters", "pass a shorter one")
        return tuple(strings) or None  # type: ignore[arg-type]

    @property
    def greedy(self) -> bool:
        """True when decoding picks the argmax (temperature 0)."""
        return self.temperature == 0


def _structured(value: object) -> StructuredOutputs | None:
    if value is None or isinstance(value, StructuredOutputs):
        return value
    if not isinstance(value, Mapping):
        raise _fail("structured_outputs", value, "is invalid: it must be None, a StructuredOutputs or a dict",
                    'pass e.g. structured_outputs={"json": {"type": "object"}}')
    try:
        return StructuredOutputs.from_dict(value)
    except GrammarError as e:
        raise _fail("structured_outputs", value, f"is invalid: {e}", "change that field as it says") from None


MAX_BIAS = 100.0
"""The largest logit_bias magnitude, OpenAI's limit."""


def _token_bias(bias: object) -> tuple[tuple[int, float], ...] | None:
    if bias is None:
        return None
    # a tuple of pairs is what a stored value reads back as (dataclasses.replace passes it in again)
    pairs = list(bias.items()) if isinstance(bias, Mapping) else bias
    if not isinstance(pairs, (list, tuple)):
        raise _fail("logit_bias", bias, "is invalid: it must be None or a dict of token id -> bias",
                    "pass e.g. logit_bias={50256: -100}")
    out: dict[int, float] = {}
    for item in pairs:
        if not (isinstance(item, (list, tuple)) and len(item) == 2):
            raise _fail("logit_bias", bias, "is invalid: it must be None or a dict of token id -> bias",
                        "pass e.g. logit_bias={50256: -100}")
        token, value = item
        if isinstance(token, numbers.Integral) and not isinstance(token, bool):
            token = int(token)
        if not _is_int(token) or token < 0:
            raise _fail("logit_bias", bias, f"is invalid: its key {token!r} is not a token id (an int >= 0)",
                        "key each bias by a token id, e.g. logit_bias={50256: -100}")
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            value = float(value)
        if not _is_real(value) or not -MAX_BIAS <= value <= MAX_BIAS:  # also NaN
            raise _fail("logit_bias", bias, f"is invalid: the bias of token {token} must be a number in "
                        f"[{-MAX_BIAS:g}, {MAX_BIAS:g}]", "use -100 to ban a token and 100 to all but force it")
        out[token] = float(value)
    return tuple(sorted(out.items())) or None


def _allowed_ids(ids: object) -> tuple[int, ...] | None:
    if ids is None:
        return None
    if isinstance(ids, (list, tuple)):  # numpy's integers are token ids too, as logit_bias takes them
        ids = [int(i) if isinstance(i, numbers.Integral) and not isinstance(i, bool) else i for i in ids]
    if not isinstance(ids, (list, tuple)) or not ids or not all(_is_int(i) and i >= 0 for i in ids):
        raise _fail("allowed_token_ids", ids, "is invalid: it must be None or a non-empty list of token ids "
                    "(ints >= 0)", "pass the ids that may be generated, e.g. allowed_token_ids=[11, 13, 42]")
    return tuple(ids)


# __new__ takes (*args, **kwargs) to name a vLLM field it lacks; help() and IDEs read the fields from here.
_SIGNATURE = inspect.signature(SamplingParams.__init__)
SamplingParams.__signature__ = _SIGNATURE.replace(parameters=list(_SIGNATURE.parameters.values())[1:])  # type: ignore[attr-defined]
