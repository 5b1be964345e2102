"""Helpers shared by the CLI commands: flags and their values, the speculative config, logging, and what
each install extra brings (how a command runs and fails: `cli/guard.py`)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from specsure.config.cpu import DTYPE_NAMES
from specsure.config.errors import ConfigError, json_int, json_type

if TYPE_CHECKING:
    from specsure.decode.engine import Engine

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
logger = logging.getLogger(__name__)

_ENGINE = ("torch", "transformers", "safetensors", "tokenizers", "gguf", "accelerate", "numpy", "tqdm")
CONVERSION_LOGGER = "specsure.models.gguf_cache"
"""The logger that says a GGUF is being converted; named, not imported, so `explain` stays light."""
STATS_LOGGER = "specsure.serve.stats_log"
"""The server's periodic throughput and acceptance lines (vLLM's); `specsure serve` shows them without -v."""
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "engine": _ENGINE,
    "serve": (*_ENGINE, "fastapi", "uvicorn", "prometheus_client"),
    "bench": (*_ENGINE, "matplotlib", "httpx"),
    "train": _ENGINE,
}
"""The modules each install extra of pyproject.toml brings; `pip install specsure` brings none of them."""


def missing_modules(extra: str) -> list[str]:
    """The modules of ``extra`` that are not installed (found without importing them)."""
    return [name for name in EXTRA_MODULES[extra] if importlib.util.find_spec(name) is None]


def missing_extra_message(command: str, extra: str, missing: list[str]) -> str:
    return (f"specsure {command} needs the {extra!r} extra, and {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not installed. Install it with: pip install 'specsure[{extra}]' "
            "(explain, export and check-vllm work without it).")


def parse_speculative_config(text: str | None, flag: str = "--speculative-config") -> dict[str, Any] | None:
    """vLLM's flag: inline JSON, or @file.json. None, '' or JSON null means speculation off; dashes in
    keys read as underscores, as vLLM reads them."""
    if text is None:
        return None
    if not text.strip():  # an unset shell variable, most likely: off, as vLLM reads it, but said
        logger.warning("%s is empty: speculative decoding is off and plain decoding runs. Give it a method "
                       "(%s '{\"method\": \"ngram\"}') to turn it on, or leave the flag out.", flag, flag)
        return None
    source = flag
    if text.startswith("@"):
        try:
            path = Path(text[1:]).expanduser()
        except RuntimeError as exc:  # ~user that does not exist
            raise ConfigError(f"{flag} {text!r}: cannot expand the path ({exc}); give the file's full path.") from None
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{flag} {text!r}: cannot read {path}: {exc.strerror}.") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{flag} {text!r}: {path} is not UTF-8 text ({exc.reason} at byte {exc.start}); "
                              "save the JSON file as UTF-8.") from None
        source = f"{flag} file {path}"
    if text.startswith("\ufeff"):  # a byte-order mark, as some Windows editors write UTF-8
        text = text[1:]
    try:
        value = json.loads(text, object_pairs_hook=_unique_keys(source), parse_int=json_int(source))
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{source} is not valid JSON ({exc.msg} at column {exc.colno}): {text!r}. "
            'Example: --speculative-config \'{"method": "ngram", "num_speculative_tokens": 4}\'') from None
    except RecursionError:
        raise ConfigError(f"{source} nests too deeply to parse; a speculative config is one flat JSON object, "
                          'for example {"method": "ngram", "num_speculative_tokens": 4}.') from None
    if value is None:  # JSON null: off, as vLLM reads it
        return None
    if not isinstance(value, dict):
        kind = json_type(value)
        article = "an " if kind[0] in "aeiou" else "a "
        raise ConfigError(f"{source} must be a JSON object, got {article}{kind}: {text!r}. Example: "
                          '{"method": "ngram", "num_speculative_tokens": 4}')
    if not value:
        logger.warning("%s is %s, which sets nothing: speculative decoding is off and plain decoding runs. Give "
                       "it a method ({\"method\": \"ngram\"}) to turn it on.", source, text.strip())
    # vLLM reads a key's dashes as underscores (EngineArgs.create_speculative_config)
    keys: dict[str, Any] = {}
    for key, item in value.items():
        name = key.replace("-", "_")
        if name in keys and keys[name] != item:
            raise ConfigError(f"{source} gives {name!r} twice, as {name!r} and with dashes ({json.dumps(keys[name])} "
                              f"and {json.dumps(item)}); keep the one you mean.")
        keys[name] = item
    return keys


def _unique_keys(source: str) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    """A json object hook that refuses a key given twice (json would keep the last one silently)."""
    def build(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, value in pairs:
            if key in seen:
                raise ConfigError(f"{source} gives {key!r} twice ({json.dumps(seen[key])} and {json.dumps(value)}); "
                                  "keep the one you mean.")
            seen[key] = value
        return seen
    return build


def writable_folder(flag: str, path: str) -> Path:
    """``path`` as a folder made (if missing) and written to once, so a run cannot end in a traceback
    after its work when the results cannot be saved."""
    folder = Path(path).expanduser()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".specsure-write-probe"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"{flag} {path!r}: cannot write results there ({exc.strerror}); give a writable folder.") \
            from None
    return folder


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``low`` (argparse names the flag and exits 2 otherwise)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} must be at least {low}")
        return value
    return parse


_SI = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def model_len(text: str) -> int | None:
    """An argparse type: --max-model-len as vLLM 0.33.0 reads it: a number of tokens, with k, m, g, t
    for powers of 1,000 (decimals allowed: 25.6k) or K, M, G, T for powers of 1,024; 'auto' or -1 for
    the model's own context (None)."""
    text = text.strip()
    if text == "-1" or text.lower() == "auto":
        return None
    # vLLM's pattern: digits, an optional decimal part, one suffix letter; anything else is a plain int
    suffixed = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", text)
    try:
        if suffixed is None:
            value = int(text)
        elif (suffix := suffixed[2]) in _SI:
            value = int(float(suffixed[1]) * _SI[suffix])
        else:
            value = int(suffixed[1]) * _BINARY[suffix]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of tokens (say 8192, 8k, 8K, or auto for the model's own context; a "
            "binary suffix K, M, G, T takes a whole number)") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} must be at least 1 token (auto or -1: the model's own context)")
    return value


def add_model_len_flag(parser: argparse.ArgumentParser) -> None:
    """--max-model-len, as vLLM names it."""
    parser.add_argument("--max-model-len", type=model_len, default=None, metavar="N",
                        help="the most tokens a request may hold, prompt and output together, as vLLM's "
                             "--max-model-len (8192, 8k, 8K; at most the model's own context, which is the "
                             "default: auto)")


def seed_value(text: str) -> int:
    """An argparse type: a sampling seed, an integer in [0, 2**64) (torch's generator range)."""
    value = int_at_least(0)(text)
    if value >= 2**64:
        raise argparse.ArgumentTypeError(f"{value} must be below 2**64, the range of torch's generator")
    return value


API_KEY_VARIABLES = ("SPECSURE_API_KEY", "VLLM_API_KEY")
"""Where the key comes from without --api-key, in this order; vLLM's variable too, so a deployment
that passes vLLM its key in the environment does not come up open on specsure."""


def api_keys_from(flags: str | Sequence[str] | None) -> tuple[str, ...]:
    """The server's API keys (any one is accepted, as vLLM takes several): ``--api-key``, else the first
    of API_KEY_VARIABLES that is set, else none. An empty or padded key is an error, not a server
    without a key or with one no client can send: an unset shell variable gives ``--api-key ""``, and
    HTTP drops the spaces around a header's value."""
    if flags is not None:
        given = [("--api-key", key) for key in ([flags] if isinstance(flags, str) else flags)]
    else:
        given = [(name, os.environ[name]) for name in API_KEY_VARIABLES if os.environ.get(name) is not None][:1]
    for source, key in given:
        if not key.strip():
            raise ValueError(f"{source} is empty ({key!r}): give a key, or leave {source} out to serve without one.")
        if key != key.strip():
            raise ValueError(f"{source} = {key!r} starts or ends with whitespace, which clients cannot send in the "
                             "Authorization header; give the key without it.")
    return tuple(key for _, key in given)


def api_key_from(flag: str | None) -> str | None:
    """The one key a client sends (`bench serve`): ``--api-key``, else the environment's, as the server reads it."""
    keys = api_keys_from(flag)
    return keys[0] if keys else None


def add_model_flags(parser: Any, *, speculative: bool = True) -> None:
    """The vLLM-shaped flags every command shares."""
    parser.add_argument("--model", default=None,
                        help="target model: a Hugging Face folder (config.json + safetensors) or a .gguf file; "
                             "default: the packaged SmolLM2-135M-Instruct")
    if speculative:
        parser.add_argument("--speculative-config", "-sc", default=None, metavar="JSON",
                            help="speculative config as JSON (vLLM's keys) or @file.json; as in vLLM, keys may "
                                 "also come one by one: --speculative-config.method ngram")
        parser.add_argument("--strict", action="store_true",
                            help="make any disagreement between evidence and an explicit value an error")


INT8_HELP = ("multiply the GGUF target's quantised matrices (Q4_0 to Q8_0, Q4_K to Q6_K) with int8 activations, "
             "as llama.cpp does: faster decoding on AVX2, outputs no longer float32's (speculation still equals "
             "plain decoding)")
"""--int8-activations, as generate, serve, demo and bench explain it."""


def products_note(engine: "Engine") -> str:
    """"; int8 activations on N weight matrices" where the target has them (--int8-activations), else
    nothing: a user sees the mode without -v."""
    count = engine.target.lm.int8_matrices
    return f"; int8 activations on {count} weight matrices" if count else ""


def setup_logging(verbose: bool) -> None:
    # transformers draws progress bars for every weight load; the CLI keeps its output readable.
    # The environment switch (read when transformers loads) keeps `explain` free of that import.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    # The first load of a GGUF converts it (seconds, once per machine); without this line the
    # CLI would sit silent through it.
    logging.getLogger(CONVERSION_LOGGER).setLevel(logging.INFO)


DTYPE_ALIASES = {"half": "float16", "float": "float32"}
"""vLLM's other names for --dtype values."""


def dtype_flag(value: str) -> str:
    """A --dtype value, vLLM's aliases (half, float) read as the names they stand for."""
    return DTYPE_ALIASES.get(value, value)


def add_dtype_flag(parser: argparse.ArgumentParser, help: str, default: str = "auto") -> None:
    """A command's --dtype: one of DTYPE_NAMES, or vLLM's alias of one."""
    parser.add_argument("--dtype", default=default, type=dtype_flag, choices=DTYPE_NAMES, help=help)
