"""Can the checkpoints run the resolved method? (design rule 4: impossibility is an error.)

Disagreement is only a warning, but a method the checkpoints cannot run stops the engine
before any weights load. The error names both sides, what was asked and what the checkpoint
is, and never switches the method.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specsure.config.checkpoint import DEFAULT_INSTALL_HINT, CheckpointInfo
from specsure.config.detect import target_mtp
from specsure.config.errors import ConfigError

if TYPE_CHECKING:
    from specsure.config.resolution import Resolution

WHAT_IS: dict[str, str] = {
    "draft_model": "a whole causal LM",
    "eagle": "an EAGLE-1 head",
    "eagle3": "an EAGLE-3 head",
    "mtp": "an MTP head (or a model with MTP layers)",
}


def check_weights(info: CheckpointInfo, role: str) -> None:
    """Weights load from safetensors or GGUF only; a pickle-only folder is refused."""
    if info.kind != "hf_dir" or info.weight_files:
        return
    if info.pickle_files:
        raise ConfigError(
            f"{role} checkpoint {info.path!r} has only pickle weights ({', '.join(info.pickle_files)}). "
            "specsure loads safetensors or GGUF only, because pickle files can run code. Convert them: "
            "load with transformers and call save_pretrained(folder, safe_serialization=True).")
    raise ConfigError(f"{role} checkpoint {info.path!r} has config.json but no *.safetensors weights. "
                      "Add the weights, or point to the folder that has them.")


def check_runnable(res: "Resolution", *, weights: bool = True) -> None:
    """Raise ConfigError when the target or draft cannot run ``res.config.method``.

    ``weights=False`` checks only the method against the checkpoints' metadata, for callers
    (export) that never load weights here and accept config.json-only folders.
    """
    if weights and res.target.note:
        raise ConfigError(f"target: {res.target.note}. Install it with: {DEFAULT_INSTALL_HINT}, or pass --model.")
    if weights:
        check_weights(res.target, "target")
    config = res.config
    if config is None:
        return
    method = config.method
    if method == "mtp" and res.draft is None:
        if target_mtp(res.target) is None:
            raise ConfigError(
                f"method 'mtp' was asked without a 'model', so it needs MTP layers inside the target, but the "
                f"target {res.target.path!r} declares none ({res.target.config_file or 'its metadata'} has no "
                "num_nextn_predict_layers). Give 'model': a standalone MTP head (specsure train can make one), "
                "or choose another method such as 'ngram'.")
        _check_mtp_tensors(res.target)
        return
    draft = res.draft
    if draft is None:
        return
    if weights:
        check_weights(draft, "draft")
    evidence = res.draft_evidence
    if evidence is not None and evidence.value != method and not _whole_lm_as_draft(method, draft):
        raise ConfigError(
            f"method {method!r} was asked, which needs {WHAT_IS[method]}, but the draft checkpoint "
            f"{draft.path!r} is {WHAT_IS[evidence.value]} ({evidence.signal}). specsure does not switch "
            f"methods: set method {evidence.value!r} to run this checkpoint, or give {WHAT_IS[method]}.")
    if method == "draft_model":
        _check_same_vocab(res.target, draft)


def _whole_lm_as_draft(method: str, draft: CheckpointInfo) -> bool:
    """A whole causal LM that also carries MTP layers still runs as a plain draft model."""
    archs = draft.architectures
    return method == "draft_model" and any(a.endswith("ForCausalLM") for a in archs) and (
        draft.num_hidden_layers or 0) >= 2


def _check_same_vocab(target: CheckpointInfo, draft: CheckpointInfo) -> None:
    tv, dv = target.vocab_size, draft.vocab_size
    if tv is not None and dv is not None and tv != dv:
        raise ConfigError(
            f"draft_model needs the target's vocabulary, but the draft {draft.path!r} has vocab_size={dv} "
            f"({draft.config_file}) and the target {target.path!r} has vocab_size={tv}. Use a draft trained "
            "with the target's tokenizer, or method 'ngram'.")


def _check_mtp_tensors(target: CheckpointInfo) -> None:
    """A target that declares MTP modules must store them (DeepSeek-V3 layout: layer N + i)."""
    found = target.mtp_layers
    layers = target.num_hidden_layers
    if found is None or layers is None or not target.tensor_names:
        return
    key, count = found
    # The first gap is found within len(tensor_names) + 1 steps, however large the declared count.
    missing = next((layers + i for i in range(count)
                    if f"model.layers.{layers + i}.eh_proj.weight" not in target.tensor_names), None)
    if missing is not None:
        raise ConfigError(
            f"method 'mtp' uses the MTP layers inside the target, and {target.signal(key)} declares {count}, but "
            f"the target's safetensors hold no 'model.layers.{missing}.eh_proj.weight' (MTP module {missing - layers}"
            "). The checkpoint was probably saved without its MTP weights; use the original files, or give "
            "'model': a standalone MTP head.")
