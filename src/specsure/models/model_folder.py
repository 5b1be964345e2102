"""What a Hugging Face model folder must hold before transformers reads it: config.json whose
model type, architecture, dtype and sizes transformers can build, and safetensors weights.

transformers would fail later and in its own words (a KeyError for an unknown activation, a
modulo by zero for 0 heads) or, worse, load pickle; each check here names the file, the field
and the fix instead.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import torch

from specsure.config.checkpoint import config_json_problem, load_config_json
from specsure.config.weight_files import check_weight_files, read_safetensors_header, weight_files
from specsure.config.errors import ConfigError
from specsure.models.errors import ModelLoadError

logger = logging.getLogger(__name__)

_POSITIVE_SIZES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                   "intermediate_size", "head_dim", "max_position_embeddings")
_NORM_EPSILONS = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps")
"""What a norm adds to the variance before its square root: a NaN or a negative one makes every
output NaN, which would surface only as a forward that disagrees with itself."""
_PER_LAYER_SIZES = ("intermediate_size",)
"""Sizes a config may give per layer, as a list (Gemma 3n's intermediate_size)."""
_ACTIVATIONS = ("hidden_act", "hidden_activation")


def check_model_folder(folder: Path) -> dict[str, Any]:
    """Validate a model folder before handing it to transformers; return its config.json.

    Raises:
        ModelLoadError: naming the file or field at fault and how to fix it.
    """
    if (problem := config_json_problem(folder, str(folder))) is not None:
        raise ModelLoadError(problem)
    config_path = folder / "config.json"
    config = _read_config(config_path)
    _check_architecture(config_path, config)
    if isinstance(config.get("auto_map"), dict) and config["auto_map"]:
        # The checkpoint ships code of its own; the built-in class may not be what it was trained as.
        logger.warning("%s: auto_map names the checkpoint's own model code (%s); specsure never runs code from a "
                       "checkpoint and loads transformers' built-in %r class instead, which gives other output "
                       "wherever that code differs from it", config_path,
                       ", ".join(f"{k}: {v}" for k, v in sorted(config["auto_map"].items())), config.get("model_type"))
    _check_dtype_field(config_path, config)
    _check_sizes(config_path, config)
    _check_weights(folder)
    if config.get("quantization_config") is None:
        _check_weight_dtypes(folder)
    return config


def _read_config(config_path: Path) -> dict[str, Any]:
    try:
        return load_config_json(config_path)
    except ConfigError as err:
        raise ModelLoadError(str(err)) from None


def _check_architecture(config_path: Path, config: dict[str, Any]) -> None:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ModelLoadError(
            f"{config_path} has no 'model_type' string; add the transformers model type "
            "(e.g. \"llama\"), as save_pretrained writes it."
        )
    if model_type not in CONFIG_MAPPING_NAMES:
        raise ModelLoadError(
            f"{config_path}: model_type {model_type!r} is unknown to the installed transformers; "
            "specsure never runs checkpoint code (trust_remote_code), so use a built-in "
            "architecture or upgrade transformers."
        )
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ModelLoadError(
            f"{config_path}: model_type {model_type!r} has no causal-LM class in transformers; "
            "specsure needs a *ForCausalLM model."
        )
    architectures = config.get("architectures")
    if architectures is None:
        return
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        raise ModelLoadError(f"{config_path}: 'architectures' must be a list of class names.")
    import transformers

    unknown = [a for a in architectures if not hasattr(transformers, a)]
    if architectures and len(unknown) == len(architectures):
        raise ModelLoadError(
            f"{config_path}: architectures {unknown} are not transformers classes. A draft head "
            "(EAGLE, EAGLE-3, MTP) is not a standalone model: pass it as the speculative "
            "'model' with its method, not as the target."
        )


def _check_dtype_field(config_path: Path, config: dict[str, Any]) -> None:
    for key in ("dtype", "torch_dtype"):
        value = config.get(key)
        if value is None or value == "auto" or (isinstance(value, str) and isinstance(getattr(torch, value, None),
                                                                                      torch.dtype)):
            continue
        raise ModelLoadError(f"{config_path}: {key} = {json.dumps(value)} is not a torch dtype; use a name such as "
                             '"bfloat16", "float16" or "float32", or remove the field.')


INTEGER_DTYPES = frozenset({"BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64"})
"""safetensors dtypes that hold no float weights: transformers would cast them to floats silently."""


def _check_weight_dtypes(folder: Path) -> None:
    """A weight stored as integers without a quantization_config to read it by is not this model:
    cast to floats it runs, fluently wrong."""
    for file in sorted(folder.glob("*.safetensors")):
        try:
            header = read_safetensors_header(file)
        except ConfigError as err:
            raise ModelLoadError(str(err)) from None
        for name, entry in header.items():
            dtype = entry.get("dtype") if isinstance(entry, dict) else None
            if name.endswith(".weight") and dtype in INTEGER_DTYPES:
                raise ModelLoadError(f"{file}: the weight {name!r} is stored as {dtype} integers, and config.json has "
                                     "no quantization_config to read it by; save the weights in a float dtype "
                                     "(float32, bfloat16 or float16), or give the quantised model as a GGUF file.")


def _check_weights(folder: Path) -> None:
    try:
        check_weight_files(str(folder), *weight_files(folder), role="model")  # the shard index too
    except ConfigError as err:
        raise ModelLoadError(str(err)) from None


def _check_sizes(config_path: Path, config: dict[str, Any]) -> None:
    """The fields transformers divides by, looks up or raises to a power, each as what it must be."""
    from transformers.activations import ACT2FN

    for prefix, fields in (("", config), ("text_config.", config.get("text_config"))):
        if not isinstance(fields, dict):
            continue
        for key in _POSITIVE_SIZES:
            value = fields.get(key)
            if key in _PER_LAYER_SIZES and isinstance(value, list) and value:  # one per layer (Gemma 3n)
                value = next((v for v in value if isinstance(v, bool) or not isinstance(v, int) or v < 1), None)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ModelLoadError(f"{config_path}: {prefix}{key} = {json.dumps(value)} must be a positive integer; "
                                     "use the config.json the weights came with.")
        for key in _ACTIVATIONS:
            value = fields.get(key)
            if value is not None and (not isinstance(value, str) or value not in ACT2FN):
                known = ", ".join(sorted(k for k in ACT2FN if k in ("gelu", "gelu_pytorch_tanh", "relu", "silu")))
                raise ModelLoadError(f"{config_path}: {prefix}{key} = {json.dumps(value)} is not an activation the "
                                     f"installed transformers has (such as {known}); use the config.json the "
                                     "weights came with.")
        for key in _NORM_EPSILONS:
            value = fields.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value) or value < 0):
                raise ModelLoadError(f"{config_path}: {prefix}{key} = {json.dumps(value)} must be a small "
                                     "non-negative number (a norm's epsilon, such as 1e-05); use the config.json "
                                     "the weights came with.")
        rope = fields.get("rope_parameters") or fields.get("rope_scaling")
        for holder, name in ((fields, "rope_theta"), (rope if isinstance(rope, dict) else {}, "rope_theta")):
            value = holder.get(name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value) or value <= 0):
                raise ModelLoadError(f"{config_path}: {name} = {json.dumps(value)} must be a positive number (the "
                                     "rotary base, such as 10000.0).")
