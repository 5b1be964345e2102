"""vLLM 0.33.0's rules for what a draft checkpoint makes it run, as data.

Read from the 0.33.0 wheel's vllm/config/speculative.py: ``hf_config_override`` rewrites a draft's
model_type (by its model_type or its architecture) to an MTP type before method detection, and
``__post_init__`` then switches the method from the draft path's substrings, some architectures,
and any MTP model_type, without a log line. ``vllm_mtp_type`` replays the rewrite on a
checkpoint's config.json; ``foreign_method`` names the architectures that switch to a method
specsure does not run.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Final, Mapping

VLLM_TESTED_VERSIONS: Final[tuple[str, ...]] = ("0.33.0",)
"""The vLLM releases these rules were read from (and check-vllm was run against)."""

# SpeculativeConfig.__post_init__: unless the method is one of these, it searches the lower-cased
# draft path for substrings, in this order, and replaces the method.
DETECTION_SKIPPED: Final[frozenset[str]] = frozenset({"eagle", "eagle3", "dflash", "dspark"})
PATH_TRAPS: Final[tuple[tuple[str, str], ...]] = (
    ("eagle-", "eagle"), ("eagle3", "eagle3"), ("dflash", "dflash"), ("dspark", "dspark"))

# MTPModelTypes: a draft of one of these model_types (after the rewrite) runs as 'mtp', and each
# is also a method name vLLM takes as 'mtp' (deprecated, with a warning).
MTP_MODEL_TYPES: Final[frozenset[str]] = frozenset({
    "deepseek_mtp", "dots3_note_mtp", "mimo_mtp", "mimo_v2_mtp", "glm4_moe_mtp", "glm4_moe_lite_mtp",
    "glm_ocr_mtp", "ernie_mtp", "nemotron_h_mtp", "exaone_moe_mtp", "exaone4_5_mtp", "qwen3_next_mtp",
    "qwen4_exp_mtp", "qwen3_5_mtp", "longcat_flash_mtp", "bailing_hybrid_v3_mtp", "minimax_m3_mtp",
    "bailing_hybrid_mtp", "mtp", "kimi_k3_mtp", "pangu_ultra_moe_mtp", "step3p5_mtp", "step5_mtp", "hy_v3_mtp",
    "hy_v4_mtp", "gemma4_mtp", "inkling_mtp", "glm5_next_mtp",
})

# hf_config_override, by the draft's model_type.
MODEL_TYPE_REWRITES: Final[Mapping[str, str]] = {
    "dots3_note": "dots3_note_mtp", "deepseek_v3": "deepseek_mtp", "deepseek_v32": "deepseek_mtp",
    "glm_moe_dsa": "deepseek_mtp", "deepseek_v4": "deepseek_mtp", "deepseek_v41": "deepseek_mtp",
    "pangu_ultra_moe": "pangu_ultra_moe_mtp", "kimi_k3": "kimi_k3_mtp", "ernie4_5_moe": "ernie_mtp",
    "qwen3_next": "qwen3_next_mtp", "qwen4_exp": "qwen4_exp_mtp", "qwen4_exp_text": "qwen4_exp_mtp",
    "bailing_hybrid": "bailing_hybrid_mtp", "exaone_moe": "exaone_moe_mtp", "qwen3_5": "qwen3_5_mtp",
    "qwen3_5_moe": "qwen3_5_mtp", "qwen3_5_text": "qwen3_5_mtp", "qwen3_5_moe_text": "qwen3_5_mtp",
    "intern_s2_preview": "qwen3_5_mtp", "interns2_mobius": "qwen3_5_mtp", "longcat_flash": "longcat_flash_mtp",
    "step3p5": "step3p5_mtp", "step3p7": "step3p5_mtp", "step5": "step5_mtp", "step5_vl": "step5_mtp",
    "hy_v3": "hy_v3_mtp", "hy_v4": "hy_v4_mtp", "inkling_mm_model": "inkling_mtp", "inkling_model": "inkling_mtp",
    "gemma4_assistant": "gemma4_mtp", "gemma4_unified_assistant": "gemma4_mtp", "minimax_m3_vl": "minimax_m3_mtp",
    "glm5_next": "glm5_next_mtp",
}
# hf_config_override, by the draft's first architecture, whatever its model_type.
ARCHITECTURE_REWRITES: Final[Mapping[str, str]] = {
    "MiMoForCausalLM": "mimo_mtp", "MiMoV2ForCausalLM": "mimo_v2_mtp", "MiMoV2OmniForCausalLM": "mimo_v2_mtp",
    "MiMoV2FlashForCausalLM": "mimo_v2_mtp", "Glm4MoeForCausalLM": "glm4_moe_mtp",
    "Glm4MoeLiteForCausalLM": "glm4_moe_lite_mtp", "GlmOcrForConditionalGeneration": "glm_ocr_mtp",
    "BailingMoeV3ForCausalLM": "bailing_hybrid_v3_mtp", "BailingMoeV3VLForConditionalGeneration": "bailing_hybrid_v3_mtp",
    "Step3p5ForCausalLM": "step3p5_mtp", "Step3p7ForConditionalGeneration": "step3p5_mtp",
    "MiniMaxM3SparseForConditionalGeneration": "minimax_m3_mtp",
}
# hf_config_override, by any of the draft's architectures.
ANY_ARCHITECTURE_REWRITES: Final[Mapping[str, str]] = {
    "BailingMoeV2_5ForCausalLM": "bailing_hybrid_mtp", "Step5ForCausalLM": "step5_mtp",
    "Step5ForConditionalGeneration": "step5_mtp",
}
# Nemotron-H is an MTP draft only when it has MTP layers; these VLM architectures are read by their text_config.
NEMOTRON_TYPES: Final[frozenset[str]] = frozenset({"nemotron_h", "nemotron_h_puzzle"})
NEMOTRON_VLM_ARCHITECTURES: Final[frozenset[str]] = frozenset({
    "NemotronH_Super_Omni_Reasoning_V3", "NemotronH_Omni_Reasoning_V3"})

# __post_init__: draft architectures that switch the method, after the path test and before MTP.
FOREIGN_ARCHITECTURES: Final[Mapping[str, str]] = {
    "MuseGlimmerAssistantModel": "dflash", "Qwen3DSparkModel": "dspark", "Qwen3OmniDSparkModel": "dspark",
    "MuseSparkDSparkModel": "dspark", "Gemma4DSparkModel": "dspark",
}


def vllm_mtp_type(model_type: str | None, architectures: tuple[str, ...],
                  config: Mapping[str, Any]) -> tuple[str, str | None] | None:
    """(the MTP model_type vLLM 0.33.0 gives this draft, the architecture that made it so or None), or
    None when the draft has no MTP model_type there."""
    first = architectures[0] if architectures else None
    if first == "RadioMBartPrefixForCausalLM" and _get(config.get("decoder"), "causal_vision_prefix"):
        return "mtp", first
    if first in NEMOTRON_VLM_ARCHITECTURES and isinstance(config.get("text_config"), Mapping):
        config = config["text_config"]
        model_type = config.get("model_type")
    if first in ARCHITECTURE_REWRITES:
        return ARCHITECTURE_REWRITES[first], first
    for arch in architectures:
        if arch in ANY_ARCHITECTURE_REWRITES:
            return ANY_ARCHITECTURE_REWRITES[arch], arch
    if not isinstance(model_type, str) or not model_type:
        return None
    if model_type in MODEL_TYPE_REWRITES:
        return MODEL_TYPE_REWRITES[model_type], None
    if model_type in NEMOTRON_TYPES:
        layers = config.get("num_nextn_predict_layers")
        return ("nemotron_h_mtp", None) if isinstance(layers, int) and layers > 0 else None
    if "exaone4_5" in model_type:  # a substring test in vLLM
        return "exaone4_5_mtp", None
    if model_type in "pangu_ultra_moe":  # vLLM tests `in ("pangu_ultra_moe")`, a string, not a tuple
        return "pangu_ultra_moe_mtp", None
    return (model_type, None) if model_type in MTP_MODEL_TYPES else None


def foreign_method(architectures: tuple[str, ...], model_type: str | None, config: Mapping[str, Any]) -> str | None:
    """The method specsure does not run (dflash, dspark) that vLLM 0.33.0 detects from these architectures.
    A draft whose model_type it rewrites to an MTP type has its architectures replaced first."""
    mtp = vllm_mtp_type(model_type, architectures, config)
    if mtp is not None and (mtp[1] is not None or mtp[0] != model_type):
        return None
    for arch in architectures:
        if arch in FOREIGN_ARCHITECTURES:
            return FOREIGN_ARCHITECTURES[arch]
    if "DSparkDraftModel" in architectures and model_type == "qwen3":
        return "dspark"
    return None


def _get(section: Any, key: str) -> Any:
    return section.get(key) if isinstance(section, Mapping) else None


# transformers_utils/configs/speculators/base.py: speculators_model_type names that vLLM runs as another method.
SPECULATORS_METHODS: Final[Mapping[str, str]] = {"peagle": "eagle3", "dflash2": "dflash"}
_REPO_ID = re.compile(r"^(\b[\w\-.]{1,96}\b/)?\b[\w\-.]{1,96}\b$")
"""huggingface_hub's REPO_ID_REGEX, which validate_repo_id applies."""


def speculators_target(config: Mapping[str, Any]) -> tuple[str, Any] | None:
    """(the method, the verifier as written) when a target's config.json is in the speculators format.

    vLLM 0.33.0's EngineArgs.create_engine_config then replaces the method and the draft with the
    checkpoint's own (the target folder as the draft) and ``--model`` with the verifier, keeping the
    user's other keys (transformers_utils/config.py maybe_override_with_speculators)."""
    block = config.get("speculators_config")
    kind = config.get("speculators_model_type")
    methods = block.get("proposal_methods") if isinstance(block, Mapping) else None
    first = methods[0] if isinstance(methods, list) and methods else None
    # What validate_speculators_config requires; without it vLLM refuses the target, loudly.
    if not (isinstance(block, Mapping) and isinstance(kind, str) and _get(first, "speculative_tokens") is not None
            and isinstance(config.get("transformer_layer_config"), Mapping)):
        return None
    return SPECULATORS_METHODS.get(kind, kind), _get(block.get("verifier"), "name_or_path")


def remote_verifier(verifier: Any) -> bool:
    """Whether vLLM 0.33.0 takes ``verifier`` as the model to serve: a Hugging Face repository id that
    names no local path (huggingface_hub's validate_repo_id); anything else it refuses, loudly."""
    if not isinstance(verifier, str) or not _REPO_ID.match(verifier):
        return False
    if "--" in verifier or ".." in verifier or verifier.endswith(".git"):
        return False
    path = Path(verifier)
    return not (path.exists() or path.is_symlink())


# Which target layers an EAGLE-3 head fuses in vLLM 0.33.0, and how wide it builds the head's fc.
AUX_KEY: Final[str] = "eagle_aux_hidden_state_layer_ids"


def vllm_aux_layers(config: Mapping[str, Any], num_layers: int, runner: str = "v2") -> tuple[int, ...]:
    """The layers vLLM collects for an EAGLE-3 draft's ``config``, as its target runs (so ascending,
    each once: _set_aux_hidden_state_layers), for EAGLE-3's keys only. Model Runner V2, the default on a GPU
    (v1/worker/gpu/spec_decode/eagle/eagle3_utils.py), reads the top-level list, else
    eagle_config's ``layer_ids``; the V1 runner (VLLM_USE_V2_MODEL_RUNNER=0, gpu_model_runner.py) the
    top-level list, else eagle_config's ``eagle_aux_hidden_state_layer_ids``; both else (2, N//2, N-3)."""
    eagle = _get_mapping(config, "eagle_config")
    ids = config.get(AUX_KEY) or eagle.get("layer_ids" if runner == "v2" else AUX_KEY)
    if not (isinstance(ids, (list, tuple)) and ids):
        ids = [2, num_layers // 2, num_layers - 3]
    return tuple(sorted({int(i) for i in ids if isinstance(i, int)}))


def vllm_fc_layers(config: Mapping[str, Any]) -> int:
    """How many target layers vLLM 0.33.0 sizes an EAGLE-3 draft's fc for: (Qwen3: num_aux_layers, then)
    num_aux_hidden_states, else the
    length of the id list its model class reads (llama_eagle3.py: eagle_config's only; qwen3_eagle3.py:
    the top-level list, else eagle_config's), else 3."""
    qwen3 = "Eagle3Qwen3ForCausalLM" in (config.get("architectures") or [])
    for key in ("num_aux_layers", "num_aux_hidden_states") if qwen3 else ("num_aux_hidden_states",):
        if isinstance(count := config.get(key), int) and not isinstance(count, bool):
            return count
    eagle = _get_mapping(config, "eagle_config")
    ids = (config.get(AUX_KEY) or eagle.get(AUX_KEY)) if qwen3 else eagle.get(AUX_KEY)
    return len(ids) if isinstance(ids, (list, tuple)) and ids else 3


def _get_mapping(config: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = config.get(key)
    return value if isinstance(value, Mapping) else {}
