"""Can the checkpoints run the resolved method? Impossibility is an error, never a switch.

Disagreement is only a warning, but a method the checkpoints cannot run stops the engine
before any weights load (docs/architecture.md, "Resolution rules", rule 4). The error names
both sides, what was asked and what the checkpoint is, and never switches the method.

The rules here are the only copies: the model loader and the proposers call them again on what
they actually load (a converted GGUF folder, the loaded model's vocabulary), so a check that
metadata could not make at resolve time is still made, with the same words.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Collection, Mapping

from specsure.config.checkpoint import DEFAULT_INSTALL_HINT, CheckpointInfo, int_field
from specsure.config.weight_files import check_weight_files
from specsure.config.detect import (
    MTP_HEAD_ARCHITECTURES, MTP_MODEL_TYPES, WHAT_IS, WHOLE_MODEL_TENSOR, Evidence, classify_head, deepseek_mtp_prefix, eagle3_tensor,
    foreign_head, other_mtp_layout,
)
from specsure.config.errors import ConfigError
from specsure.config.schema import SpeculativeConfig
from specsure.config.speculators import check_head_config, file_key, is_speculators, unsupported
from specsure.config.vocabulary import SharedTokenizer, compare_checkpoints
from specsure.config.token_tree import DraftTree, is_chain
from specsure.config.vllm_rules import AUX_KEY


def check_weights(info: CheckpointInfo, role: str, *, config_only: bool = False) -> None:
    """Weights load from safetensors or GGUF only; a pickle-only folder is refused. ``config_only``
    accepts a folder with no weight files at all (export reads only config.json), but not one whose
    only weights are pickle files: the engine handed the config would load them."""
    if info.kind == "hf_dir" and not (config_only and not info.pickle_files):
        check_weight_files(info.path, info.weight_files, info.pickle_files, role)


def check_runnable(target: CheckpointInfo, config: SpeculativeConfig | None, draft: CheckpointInfo | None,
                   draft_evidence: Evidence | None, *, weights: bool = True) -> None:
    """Raise ConfigError when the target or draft cannot run ``config.method``.

    ``weights=False`` checks the method against the checkpoints' metadata, for callers (export, the
    vLLM plugin) that never load weights here and accept config.json-only folders; pickle-only ones
    are refused still, after the method's checks: the engine handed the config (vLLM loads pickle)
    would run into those first, so they are the more useful error.
    """
    if weights:
        if target.note:
            raise ConfigError(f"target: {target.note}. Install it with: {DEFAULT_INSTALL_HINT}, or pass --model.")
        check_weights(target, "target")
    _check_method(target, config, draft, draft_evidence, weights)
    if not weights:
        check_weights(target, "target", config_only=True)
        if draft is not None:
            check_weights(draft, "draft", config_only=True)


def _check_method(target: CheckpointInfo, config: SpeculativeConfig | None, draft: CheckpointInfo | None,
                  draft_evidence: Evidence | None, weights: bool) -> None:
    """`check_runnable`'s checks of the method against the checkpoints (with ``weights``, the draft's
    weight files among them, in the order that has always named the first problem)."""
    if (head := classify_head(target)) is not None:
        asked = f"method {config.method!r} was asked, but " if config is not None else ""
        raise ConfigError(
            f"{asked}the target {target.path!r} is itself {WHAT_IS[head.value]} ({head.signal}), which drafts for a "
            "target and cannot serve as one. Give the model it was trained for as the target, and this "
            f"checkpoint as the speculative 'model' (method {head.value!r}).")
    if config is None:
        return
    method = config.method
    if method == "mtp" and draft is None:
        key, count = require_target_mtp(target)
        if target.tensor_names and target.num_hidden_layers is not None:
            check_mtp_tensors(target.tensor_names, target.num_hidden_layers, count,
                              holder=f"the target's safetensors ({target.path!r})", declared=target.signal(key))
        check_tree_modules(method, config.speculative_token_tree, count)
        return
    if draft is None:
        return
    if foreign := foreign_head(draft):
        raise ConfigError(f"method {method!r} was asked, but the draft checkpoint {draft.path!r} is {foreign}. "
                          f"{FOREIGN_FIX}")
    if method == "mtp" and draft.mtp_layers is not None:
        check_tree_modules(method, config.speculative_token_tree, draft.mtp_layers[1])
    if weights:
        check_weights(draft, "draft")
    if draft_evidence is not None and draft_evidence.value != method and not _whole_lm_as_draft(method, draft):
        raise ConfigError(
            f"method {method!r} was asked, which needs {WHAT_IS[method]}, but the draft checkpoint "
            f"{draft.path!r} is {WHAT_IS[draft_evidence.value]} ({draft_evidence.signal}). specsure does not "
            f"switch methods: set method {draft_evidence.value!r} to run this checkpoint, or give {WHAT_IS[method]}.")
    check_head(method, draft, target)
    if method == "draft_model":
        check_same_vocab(target.vocab_size, draft.vocab_size, target=target.path, draft=draft.path,
                         draft_where=f" ({draft.config_file})" if draft.config_file else "",
                         tokenizers=lambda: compare_checkpoints(target, draft))


FOREIGN_FIX = ("Give a draft made for one of specsure's methods (a causal LM with the target's vocabulary for "
               "'draft_model'; an EAGLE, EAGLE-3 or MTP head), or use method 'ngram' or 'suffix', which need none.")


LAYER_IDS_KEY = AUX_KEY


def check_head(method: str, draft: CheckpointInfo, target: CheckpointInfo) -> None:
    """The draft checkpoint holds the head ``method`` loads, sized for the target.

    Read from metadata: the safetensors headers' tensor names and config.json. A folder without
    readable weights (an export of a config-only folder, a GGUF) is checked when the proposer loads it.
    """
    if method in ("eagle", "eagle3", "mtp"):
        check_speculators_head(draft.path, draft.config)
    if method == "eagle3":
        check_head_config(draft.config, draft.config_file or draft.path)
    if method in ("eagle", "eagle3", "mtp") and draft.tensor_names:
        check_head_tensors(method, draft.path, draft.tensor_names, draft.config)
    if method in ("eagle", "eagle3", "mtp"):  # an MTP module reads the target's hidden states, whoever holds it
        check_head_fits(method, draft.path, draft.config, draft.tensor_names, hidden_size=target.hidden_size,
                        vocab_size=target.vocab_size, target=target.path)
    if method == "eagle3" and target.num_hidden_layers is not None:
        aux_layer_ids(draft.config, draft.path, target.num_hidden_layers)


def check_speculators_head(path: str, config: Mapping[str, Any]) -> None:
    """A speculators-format head is one specsure runs: an EAGLE-3 head of Llama decoder layers."""
    if is_speculators(config) and (why := unsupported(config)):
        raise ConfigError(f"the draft {path!r} is a speculators-format head that specsure cannot run: {why}. "
                          "Give an EAGLE-3 head with Llama decoder layers, in the speculators format or the "
                          "EAGLE-3 layout (LlamaForCausalLMEagle3: fc, midlayer.*, norm, lm_head, d2t, t2d), "
                          "such as one `specsure train --method eagle3` writes.")


def eagle_shares(target: str) -> str:
    """Why an EAGLE-1 head's widths are the target's, as the size errors say it."""
    return f"the target {target!r}, whose embedding and LM head EAGLE-1 shares,"


def not_an_mtp_head(path: str, architectures: Any) -> ConfigError:
    """The error for an mtp draft that is no MTP head in either layout specsure reads."""
    return ConfigError(f"method 'mtp' needs an MTP head (config.json architectures [\"SpecsureMTPHead\"], or a model "
                       f"with num_nextn_predict_layers and model.layers.N.eh_proj.weight), but the draft checkpoint "
                       f"{path!r} is neither (architectures={architectures}).")


def check_head_fits(method: str, path: str, config: Mapping[str, Any], names: Collection[str], *,
                    hidden_size: int | None, vocab_size: int | None, target: str) -> None:
    """A head's declared widths are the target's: the hidden size it reads (EAGLE-3's target_hidden_size,
    and its own hidden_size when it shares the target's embedding) and the vocabulary it drafts in.

    Resolution calls it on the target's config.json, the proposers again on the loaded target.
    """
    def declared(key: str) -> int | None:
        return int_field(config, key)

    def equal(field: str, found: int | None, expected: int | None, why: str) -> None:
        if found is not None and expected is not None and found != expected:
            raise mismatch(path, file_key(config, field), found, expected, why, method)

    if method == "eagle":
        where = eagle_shares(target)
        equal("hidden_size", declared("hidden_size"), hidden_size, where)
        equal("vocab_size", declared("vocab_size"), vocab_size, where)
    elif method == "eagle3":
        equal("vocab_size", declared("vocab_size"), vocab_size, f"the target {target!r}, by its vocab_size,")
        equal("target_hidden_size", declared("target_hidden_size"), hidden_size, f"the target {target!r}, by its hidden_size,")
        if names and not any(n.endswith("embed_tokens.weight") for n in names):
            equal("hidden_size", declared("hidden_size"), hidden_size,
                  f"sharing the target's embedding (the head has no embed_tokens.weight) with {target!r}")
    elif method == "mtp":
        for key, found in (("hidden_size", hidden_size), ("vocab_size", vocab_size)):
            equal(key, declared(key), found, f"the target {target!r}")


def check_tree_modules(method: str, tree: DraftTree | None, modules: int) -> None:
    """A token tree needs a head of one module: MTP modules chain depth by depth."""
    if tree is not None and not is_chain(tree) and modules > 1:
        raise ConfigError(f"speculative_token_tree needs a head with one module, but this {method} head has "
                          f"{modules} (MTP modules chain depth by depth); drop the tree, or draft a "
                          "chain of num_speculative_tokens tokens.")


def check_head_tensors(method: str, path: str, names: Collection[str], config: Mapping[str, Any]) -> None:
    """``names`` (canonical or as stored) include what ``method``'s head must hold."""
    archs = config.get("architectures") or []
    whole = ("a whole language model (model.embed_tokens.weight), which drafts with method 'draft_model'"
             if WHOLE_MODEL_TENSOR in names else None)
    if method == "eagle3" and eagle3_tensor(names) is None:
        what = "an EAGLE-1 head (it has fc.weight and layers.*)" if "fc.weight" in names else (
            whole or "not an EAGLE-3 head")
        raise ConfigError(f"method 'eagle3' needs an EAGLE-3 head (fc, midlayer.hidden_norm, d2t), but the draft "
                          f"checkpoint {path!r} is {what}: it has no midlayer.hidden_norm.weight. Use method "
                          "'eagle' for an EAGLE-1 head, or give an EAGLE-3 checkpoint.")
    if method == "eagle" and ("fc.weight" not in names or eagle3_tensor(names)):
        eagle3 = eagle3_tensor(names)
        what = (f"an EAGLE-3 head (tensor {eagle3!r}); use method 'eagle3' for it" if eagle3 else
                f"{whole}" if whole else f"not an EAGLE-1 head (no fc.weight among {sorted(names)[:4]}...)")
        raise ConfigError(f"method 'eagle' needs an EAGLE-1 head (fc.weight over concat(embedding, hidden) plus "
                          f"decoder layers), but the draft checkpoint {path!r} is {what}. Give an EAGLE-1 checkpoint.")
    if method == "mtp" and not (set(archs) & MTP_HEAD_ARCHITECTURES or str(config.get("model_type")) in MTP_MODEL_TYPES):
        layers = config.get("num_hidden_layers")
        if not (isinstance(layers, int) and deepseek_mtp_prefix(layers, 0) + "eh_proj.weight" in names):
            raise not_an_mtp_head(path, archs)


def aux_layer_ids(config: Mapping[str, Any], checkpoint: str, num_layers: int) -> tuple[int, ...]:
    """An EAGLE-3 head's eagle_config.eagle_aux_hidden_state_layer_ids (or the top-level key), else
    (2, N//2, N-3), in ascending order.

    Id j is the residual stream entering layer j, and id N the last layer's output before the final
    norm, as vLLM 0.33.0 collects them (``_maybe_add_hidden_state`` after each layer); vLLM fuses
    them in ascending layer order whatever order the config lists, so the head's fc reads them so.
    """
    declared = declared_aux_layers(config)
    field, ids = declared or ("default aux layers (2, N//2, N-3)", [2, num_layers // 2, num_layers - 3])
    if not (isinstance(ids, list) and ids and all(isinstance(i, int) and not isinstance(i, bool) for i in ids)):
        raise ConfigError(f"eagle3 draft head {checkpoint!r}: {field} = {ids!r} must be a list of layer indices, "
                          "such as [2, 15, 27]; fix it in the head's config.json.")
    bad = [i for i in ids if not 0 <= i <= (num_layers if declared else num_layers - 1)]
    if bad:
        raise mismatch(checkpoint, field, ids, f"indices in [0, {num_layers}]" if declared else
                       f"indices in [0, {num_layers})", f"the target with num_hidden_layers={num_layers}", "eagle3")
    if declared is None:  # the formula repeats layers below 7 (toy targets); specsure fuses them as listed
        return tuple(ids)
    if len(set(ids)) != len(ids):
        raise ConfigError(f"eagle3 draft head {checkpoint!r}: {field} = {ids!r} names a layer twice; vLLM collects "
                          "each layer once, so its fc would read fewer features than the head was made for. Fix "
                          "the list in the head's config.json.")
    return tuple(sorted(ids))


def declared_aux_layers(config: Mapping[str, Any]) -> tuple[str, Any] | None:
    """(where, value) of the aux layer ids an EAGLE-3 config.json gives, in vLLM 0.33.0's order
    (gpu_model_runner's _get_eagle3_aux_layers_from_config): the top level first, then eagle_config
    (EAGLE's and SpecForge's place); None when it gives none. Like vLLM, an empty list (or null) is
    no list."""
    if config.get(LAYER_IDS_KEY) not in (None, []):
        return LAYER_IDS_KEY, config[LAYER_IDS_KEY]
    eagle = config.get("eagle_config")
    if isinstance(eagle, Mapping) and eagle.get(LAYER_IDS_KEY) not in (None, []):
        return f"eagle_config.{LAYER_IDS_KEY}", eagle[LAYER_IDS_KEY]
    return None


def shadowed_aux_layers(config: Mapping[str, Any]) -> str | None:
    """A warning when config.json lists aux ids in both places and they differ: vLLM reads the top-level
    list and ignores eagle_config's, and so does specsure."""
    eagle = config.get("eagle_config")
    inner = eagle.get(LAYER_IDS_KEY) if isinstance(eagle, Mapping) else None
    outer = config.get(LAYER_IDS_KEY)
    if inner in (None, []) or outer in (None, []) or _as_set(inner) == _as_set(outer):
        return None  # fused ascending, so lists of one set run alike
    return (f"{LAYER_IDS_KEY} = {json.dumps(outer)} and eagle_config.{LAYER_IDS_KEY} = {json.dumps(inner)} differ; "
            "vLLM 0.33.0 reads the top-level list, and so does specsure. Remove the one the head was not trained on.")


def _as_set(ids: Any) -> Any:
    return frozenset(ids) if isinstance(ids, list) and all(isinstance(i, int) for i in ids) else ids


def mismatch(checkpoint: str, field: str, found: Any, expected: Any, why: str, method: str | None = None) -> ConfigError:
    """The one shape of a head/target mismatch: method (when known), checkpoint, field, value found, value expected."""
    head = f"{method} draft head" if method else "draft head"
    return ConfigError(f"{head} {checkpoint!r}: {field} = {json.dumps(found)}, but {why} needs "
                       f"{json.dumps(expected)}. Use a head trained for this target.")


def _whole_lm_as_draft(method: str, draft: CheckpointInfo) -> bool:
    """A whole causal LM that also carries MTP layers still runs as a plain draft model."""
    archs = draft.architectures
    return method == "draft_model" and any(a.endswith("ForCausalLM") for a in archs) and (
        draft.num_hidden_layers or 0) >= 2


def check_same_vocab(target_vocab: int | None, draft_vocab: int | None, *, target: str, draft: str,
                     draft_where: str = "", tokenizers: Callable[[], SharedTokenizer] | None = None) -> None:
    """draft_model compares token ids directly, so the draft must share the target's vocabulary.

    Embedding sizes (``vocab_size``) may differ by padding when ``tokenizers()`` shows one tokenizer
    whose every id both embeddings hold (`specsure.config.vocabulary`). Called on metadata at
    resolve time and again on the loaded models, whose vocabulary and tokenizers are known even
    when config.json nests them or the draft is a GGUF file.
    """
    if target_vocab is None or draft_vocab is None:
        return
    if target_vocab == draft_vocab:
        shared = tokenizers() if tokenizers is not None else SharedTokenizer(None, "")
        if shared.differs and shared.ordinary:  # one size, other tokens: every draft would mean other text
            raise ConfigError(
                f"draft_model needs the target's vocabulary, and the draft {draft!r} has the target's ({target!r}) "
                f"vocab_size={target_vocab}{draft_where}, but {shared.why}: its drafts would be token ids that mean "
                "other text, so none would be accepted. Use a draft made with the target's tokenizer, or method "
                "'ngram' or 'suffix'.")
        return
    shared = tokenizers() if tokenizers is not None else SharedTokenizer(None, "there is no tokenizer to compare")
    if shared.size is not None and shared.size <= min(target_vocab, draft_vocab):
        return
    detail = shared.why if shared.size is None else f"{shared.why}, more than the smaller embedding holds"
    raise ConfigError(
        f"draft_model needs the target's vocabulary, but the draft {draft!r} has vocab_size={draft_vocab}"
        f"{draft_where} and the target {target!r} has vocab_size={target_vocab}. The sizes may differ by "
        f"embedding padding when both share one tokenizer, but {detail}. Use a draft made with the target's "
        "tokenizer (its tokenizer.json beside it), or method 'ngram'.")


def require_target_mtp(target: CheckpointInfo) -> tuple[str, int]:
    """(config key, module count) of the MTP layers that ``mtp`` without a ``model`` runs."""
    # The config's declaration, not target_mtp's: modules declared but not stored get check_mtp_tensors'
    # error, which says the weights lack them, rather than "declares none".
    if target.mtp_layers is None:
        raise ConfigError(
            f"method 'mtp' was asked without a 'model', so it needs MTP layers inside the target, but the "
            f"target {target.path!r} declares none ({target.config_file or 'its metadata'} has no "
            "num_nextn_predict_layers, or 0). Give 'model': a standalone MTP head (specsure train can make one), "
            "or choose another method such as 'ngram'.")
    return target.mtp_layers


def check_mtp_tensors(names: Collection[str], num_hidden_layers: int, count: int, *, holder: str,
                      declared: str) -> None:
    """A checkpoint that declares MTP modules must store them (DeepSeek-V3 layout: layer N + i).

    ``names`` are the tensor names of the weights that will be read; ``declared`` cites the
    config key that declared ``count`` modules.
    """
    # The first gap is found within len(names) + 1 steps, however large the declared count.
    missing = next((i for i in range(count)
                    if deepseek_mtp_prefix(num_hidden_layers, i) + "eh_proj.weight" not in names), None)
    if missing is not None and (layout := other_mtp_layout(names)):
        raise ConfigError(f"method 'mtp' runs the MTP modules that {declared} declares, but in {holder} {layout}. "
                          "Give 'model': a standalone MTP head (specsure train can make one), or choose another "
                          "method such as 'ngram' or 'suffix'.")
    if missing is not None:
        tensor = deepseek_mtp_prefix(num_hidden_layers, missing) + "eh_proj.weight"
        raise ConfigError(
            f"method 'mtp' runs the {count} MTP module(s) that {declared} declares, but {holder} hold no "
            f"{tensor!r} (MTP module {missing}). The checkpoint was probably saved without its MTP weights "
            "(a GGUF or re-saved model drops them); use the original safetensors, or give 'model': a "
            "standalone MTP head.")
