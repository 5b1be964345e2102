"""The speculators format (vllm-project/speculators): a head's config.json that nests its layer.

Such a config keeps the decoder layer's sizes under ``transformer_layer_config`` and the
algorithm's under ``speculators_config``; the weights are the EAGLE-3 layout with ``layers.0.``
for ``midlayer.``. vLLM 0.33.0 reads it by flattening (SpeculatorsConfig.
extract_transformers_pre_trained_config): the layer config, then the algorithm's fields on top.
specsure flattens the same way when it reads the metadata, so every check and the proposer see
one config, and keeps where each flattened key came from, so messages cite the file's own key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Mapping

from specsure.config.errors import ConfigError, as_json
from specsure.config.vllm_rules import AUX_KEY

LAYER_KEY: Final[str] = "transformer_layer_config"
BLOCK_KEY: Final[str] = "speculators_config"
KIND_KEY: Final[str] = "speculators_model_type"

# vLLM's update_eagle3: these top-level keys are copied over the layer config, with its defaults.
# norm_before_residual defaults to True in vLLM, though the speculators library writes False when
# a head leaves it unset; vLLM is what serves these heads, so its reading is the one kept.
EAGLE3_FIELDS: Final[dict[str, Any]] = {
    "draft_vocab_size": None, "norm_before_residual": True, "norm_before_fc": False, "fc_norm": False,
    "norm_output": False,
}
EAGLE3_OPTIONAL: Final[tuple[str, ...]] = ("target_hidden_size", AUX_KEY)
EAGLE3_FLAGS: Final[tuple[str, ...]] = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
# what vLLM's Qwen3 layers (set_default_rope_theta) give a config that names no rope_theta
QWEN3_ROPE_THETA: Final[float] = 1_000_000.0
LAYER_REQUIRED: Final[tuple[str, ...]] = ("hidden_size", "num_attention_heads", "intermediate_size")
LAYER_INTEGERS: Final[tuple[str, ...]] = (*LAYER_REQUIRED, "num_key_value_heads", "head_dim", "num_hidden_layers")
EAGLE3_ARCHITECTURES: Final[dict[str, str]] = {"llama": "Eagle3LlamaForCausalLM", "qwen3": "Eagle3Qwen3ForCausalLM"}

KINDS: Final[dict[str, str]] = {
    "eagle3": "an EAGLE-3 head",
    "peagle": "a parallel-drafting EAGLE-3 head (PEagle), which vLLM runs as 'eagle3' with parallel_drafting",
    "dflash": "a DFlash drafter, made for vLLM's method 'dflash'",
    "dflash2": "a DFlash2 drafter, made for vLLM's method 'dflash'",
    "dspark": "a DSpark drafter, made for vLLM's method 'dspark'",
}
"""speculators_model_type values vLLM 0.33.0 registers, in a message's words; specsure runs 'eagle3'."""


@dataclass(frozen=True)
class Flattened:
    """A speculators config as vLLM reads it, and where each of its keys sits in the file."""

    config: dict[str, Any]
    origins: dict[str, str]
    """flattened key -> the dotted key in the file (``transformer_layer_config.hidden_size``)."""


def is_speculators(config: Mapping[str, Any]) -> bool:
    """Whether a config.json is in the speculators format (it has a speculators_config object)."""
    return isinstance(config.get(BLOCK_KEY), Mapping)


def check_block(config: Mapping[str, Any], where: str) -> None:
    """A config that names a speculators kind or block has a well-formed block: the keys specsure reads
    from it are what the format says, or a ConfigError names the key, the value and the fix."""
    if config.get(KIND_KEY) is None and config.get(BLOCK_KEY) is None:
        return  # vLLM reads a null speculators_config as none
    block = config.get(BLOCK_KEY)
    fix = "Fix the head's config.json, or re-save the head with the speculators library."
    if not isinstance(block, Mapping):
        raise ConfigError(f"{where}: {BLOCK_KEY} = {as_json(block)} must be a JSON object (with proposal_methods "
                          f"and verifier), as the speculators format has it; {KIND_KEY} = "
                          f"{as_json(config.get(KIND_KEY))} marks this file as that format. {fix}")
    kind = config.get(KIND_KEY)
    if not isinstance(kind, str):
        raise ConfigError(f"{where}: {KIND_KEY} = {as_json(kind)} must name the head's kind, such as \"eagle3\" for "
                          f"an EAGLE-3 head (the kinds vLLM 0.33.0 registers: {', '.join(KINDS)}). {fix}")


def flatten(config: Mapping[str, Any], where: str) -> Flattened | None:
    """The config vLLM builds from a speculators-format ``config`` (None for any other format).

    Only 'eagle3' is flattened, the one kind specsure runs; other kinds keep their file's keys and
    are refused by name where a head is checked. The speculators keys themselves are kept, so a
    target in this format is still recognised as one.
    """
    check_block(config, where)
    if not is_speculators(config) or config.get(KIND_KEY) != "eagle3":
        return None
    layer = config.get(LAYER_KEY)
    if not isinstance(layer, Mapping):
        raise ConfigError(f"{where}: {LAYER_KEY} = {as_json(layer)} must be a JSON object holding the head's "
                          "decoder-layer config (hidden_size, num_attention_heads, ...), as the speculators "
                          "library writes it. Re-export the head, or fix the file.")
    flat: dict[str, Any] = {k: v for k, v in layer.items() if k != "architectures"}
    origins = {key: f"{LAYER_KEY}.{key}" for key in flat}
    for key, default in EAGLE3_FIELDS.items():
        flat[key] = config.get(key, default)
        origins[key] = key if key in config else f"{key} (absent; vLLM's default)"
    for key in EAGLE3_OPTIONAL:
        if config.get(key) is not None and config.get(key) != []:  # vLLM copies an empty id list as absent
            flat[key], origins[key] = config[key], key
    layer_type = str(layer.get("model_type", "llama"))
    if layer_type in EAGLE3_ARCHITECTURES:
        flat["architectures"] = [EAGLE3_ARCHITECTURES[layer_type]]
        origins["architectures"] = f"{LAYER_KEY}.model_type"
    hidden, heads = layer.get("hidden_size"), layer.get("num_attention_heads")
    if "head_dim" not in layer and isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
        # vLLM's flattened config is no Qwen3Config (whose head_dim defaults to 128): its layers read
        # hidden_size / num_attention_heads
        flat["head_dim"], origins["head_dim"] = hidden // heads, "head_dim (absent; hidden_size / num_attention_heads)"
    rope = layer.get("rope_parameters")
    if layer_type == "qwen3" and "rope_theta" not in layer and not (isinstance(rope, Mapping) and "rope_theta" in rope):
        # nor is its rope_theta Qwen3Config's 1e4: vLLM's Qwen3 layer fills an absent one with 1e6
        flat["rope_theta"], origins["rope_theta"] = QWEN3_ROPE_THETA, "rope_theta (absent; vLLM's Qwen3 layer default)"
    for key in (LAYER_KEY, BLOCK_KEY, KIND_KEY, "speculators_version"):
        if key in config:
            flat[key], origins[key] = config[key], key
    return Flattened(flat, origins)


def check_head_config(config: Mapping[str, Any], where: str) -> None:
    """An EAGLE-3 head's config as a draft reads it: its flags are JSON booleans (the string "false"
    would read as true), and a flattened speculators head declares its decoder layer's sizes, which
    LlamaConfig would otherwise fill with its 8B defaults. Only a draft needs this: a target in the
    speculators format is served by its verifier."""
    eagle = config.get("eagle_config") if isinstance(config.get("eagle_config"), Mapping) else {}
    for key, value in [*((k, config.get(k)) for k in EAGLE3_FLAGS),
                       *((f"eagle_config.{k}", eagle.get(k)) for k in ("norm_before_fc", "use_aux_hidden_state"))]:
        if value is not None and not isinstance(value, bool):
            raise ConfigError(f"{where}: {key} = {as_json(value)} must be true or false (a JSON boolean). Fix the "
                              "head's config.json.")
    if eagle.get("use_aux_hidden_state") is False:  # vLLM then drafts from the last hidden state, without fc
        raise ConfigError(f"{where}: eagle_config.use_aux_hidden_state = false: such a head drafts from the target's "
                          "last hidden state without fc, which specsure does not run; give a head that fuses the "
                          "aux layers (the EAGLE-3 default).")
    layer = config.get(LAYER_KEY)
    if not is_speculators(config) or not isinstance(layer, Mapping):
        return
    missing = [key for key in LAYER_REQUIRED if key not in layer]
    if missing:  # the error would otherwise blame LlamaConfig's defaults
        raise ConfigError(f"{where}: {LAYER_KEY} has no {', '.join(missing)}; the head's decoder layer needs "
                          f"{', '.join(LAYER_REQUIRED)} there. Fix the head's config.json.")
    for key in LAYER_INTEGERS:
        value = layer.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"{where}: {LAYER_KEY}.{key} = {as_json(value)} must be a positive integer. Fix the "
                              "head's config.json.")


def declared_k(config: Mapping[str, Any], where: str, needed: bool) -> tuple[str, int] | None:
    """(dotted key, value) of the draft length a speculators head was trained for: its first proposal
    method's speculative_tokens. vLLM takes it as k only for such a checkpoint given as the target; as
    a draft it never reads it, so specsure does only to fill an unset k (``needed``): then a malformed
    value is a ConfigError naming it (never the method's default in its place), else it is ignored.
    A head whose proposal_methods is absent or empty declares none."""
    block = config.get(BLOCK_KEY)
    methods = block.get("proposal_methods") if isinstance(block, Mapping) else None
    if methods is None or methods == []:
        return None
    key = f"{BLOCK_KEY}.proposal_methods"
    fix = ("Fix the head's config.json, or set num_speculative_tokens yourself (then the file's value is not "
           "read).")
    if not isinstance(methods, list) or not isinstance(methods[0], Mapping):
        if needed:
            raise ConfigError(f"{where}: {key} = {as_json(methods)} must be a list of objects such as "
                              '{"proposal_type": "greedy", "speculative_tokens": 3}. ' + fix)
        return None
    value = methods[0].get("speculative_tokens")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return f"{key}.0.speculative_tokens", value
    if needed:
        raise ConfigError(f"{where}: {key}.0.speculative_tokens = {as_json(value)} must be a positive integer, the "
                          f"draft length the head was trained for. {fix}")
    return None


def unsupported(config: Mapping[str, Any]) -> str | None:
    """Why specsure cannot run this speculators-format head, in a sentence; None when it can."""
    kind = config.get(KIND_KEY)
    if kind != "eagle3":
        what = KINDS.get(str(kind), f"a speculators head of an unknown kind {kind!r}")
        return (f"it is {what} ({KIND_KEY} = {as_json(kind)}), and specsure runs speculators-format "
                "heads of kind 'eagle3' only")
    layer = config.get(LAYER_KEY) if isinstance(config.get(LAYER_KEY), Mapping) else config
    layer_type = str(layer.get("model_type", "llama"))
    if layer_type not in EAGLE3_ARCHITECTURES:  # vLLM's update_eagle3 refuses it too
        return (f"its decoder layer is a {layer_type!r} layer ({LAYER_KEY}.model_type = {as_json(layer_type)}), and "
                f"EAGLE-3 heads have {' or '.join(map(repr, EAGLE3_ARCHITECTURES))} decoder layers (vLLM 0.33.0 "
                "refuses others as well)")
    return None


def file_key(config: Mapping[str, Any], key: str) -> str:
    """How the file spells a key of a flattened config: nested under transformer_layer_config when the
    layer config gave it, else as is."""
    layer = config.get(LAYER_KEY)
    if is_speculators(config) and key not in (*EAGLE3_FIELDS, *EAGLE3_OPTIONAL) and isinstance(layer, Mapping) \
            and key in layer:
        return f"{LAYER_KEY}.{key}"
    return key
