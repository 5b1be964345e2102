"""Loading a target or draft model: a local HF folder, a GGUF file, or the packaged default."""

from __future__ import annotations

import ctypes
import json
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedConfig, PreTrainedTokenizerBase

from specsure.config.checkpoint import MTP_LAYER_KEYS, broken_link, is_default_gguf
from specsure.config.weight_files import weight_files
from specsure.config.cpu import cpu_bf16_flags
from specsure.config.dtype_choice import BLOCK_ARCHITECTURES, GGUF_ARCHITECTURES, target_gguf
from specsure.models.causal_lm import CausalLM
from specsure.models.dtypes import resolve_dtype
from specsure.models.errors import ModelLoadError
from specsure.models.model_folder import check_model_folder
from specsure.models.early_blocks import drop_matched, native_float_kernel
from specsure.models.gguf_blocks import FileBlocks, read_blocks, source_gguf
from specsure.models.gguf_cache import (convert_again, convert_gguf, damaged_conversion, default_model_folder,
                                        gguf_cache_folder, packaged_default_gguf)
from specsure.models.quiet import quiet_loading

logger = logging.getLogger(__name__)

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
_VOCABULARY_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "tiktoken.model")
_LAYER_INDEX = re.compile(r"^(?:model\.)?(?:language_model\.)?(?:model\.)?layers\.(\d+)\.")
"""A decoder layer's tensor name (not a vision tower's, whose layers count separately)."""


@dataclass
class LoadedModel:
    """A model ready to decode, with what the engine needs to know about it."""

    lm: CausalLM
    """The model and its KV cache."""
    tokenizer: PreTrainedTokenizerBase | None
    """None when the checkpoint ships no tokenizer files (token-id prompts still work)."""
    path: str
    """The folder the weights were read from (the cache folder for GGUF / the default)."""
    eos_token_ids: tuple[int, ...]
    """Token ids that end generation, from generation_config, config and tokenizer."""
    dtype_reason: str
    """One sentence saying why `lm.dtype` was chosen."""


def load_model(path: str | None, dtype: str = "auto", int8_activations: bool = False, *,
               int8_required: bool = True, release_weights: bool = False) -> LoadedModel:
    """Load a causal LM for decoding.

    Args:
        path: a local HF folder (config.json + *.safetensors, tokenizer optional), a `.gguf`
            file, or None for the packaged default SmolLM2-135M-Instruct.
        dtype: "auto" (float32 for a GGUF of blocks the float32 kernel reads, else bfloat16 on
            CPUs with fast bf16 and float32 elsewhere), "float32", "bfloat16" or "float16".
        int8_activations: multiply the GGUF's quantised matrices (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, and
            the K-quants Q4_K, Q5_K and Q6_K) with each row of activations rounded to int8 blocks, as
            llama.cpp does (float_kernel.c, `rgemm`): faster
            decoding, outputs no longer float32's. Rows stay independent of each other, so
            speculation still equals plain decoding in this mode.
        int8_required: with int8_activations, whether a model that cannot have them is an error
            (a target: the user asked for them) or loads with float32 products (a draft model,
            whose arithmetic decides only the proposals; the log says which).
        release_weights: drop the float32 matrices the float32 kernel reads as the GGUF's blocks, the
            layers' and the LM head's (`CausalLM.release_block_weights`): a decoding engine's memory
            then holds the blocks, not both (`specsure serve` on the default model: 1,090 -> 519 MiB).
            Left out where transformers' own forward of the same weights must still run (its
            `generate` as a bench baseline, a head trainer).

    Raises:
        ValueError: `dtype` is not a valid name, or int8_activations was asked of a model that
            cannot have them (not float32, or no such matrix read as blocks).
        ModelLoadError: the checkpoint is missing, malformed, pickled, or not a causal LM.
    """
    torch_dtype, dtype_reason = resolve_dtype(dtype, gguf=target_gguf(path) if dtype == "auto" else None,
                                              engine=release_weights)
    if int8_activations and torch_dtype != torch.float32 and not int8_required:
        int8_activations = False  # a draft in another dtype: its products stay that dtype's
    if int8_activations and torch_dtype != torch.float32:
        raise ValueError(f"int8_activations needs the model in float32, but dtype = {dtype!r} runs it in "
                         f"{str(torch_dtype).removeprefix('torch.')} ({dtype_reason.rstrip('.')}); pass dtype='float32' "
                         "(--dtype float32) or drop int8_activations (--int8-activations).")
    folder = weights_folder(path)
    started = time.perf_counter()
    try:
        hf, tokenizer = _from_folder(folder, torch_dtype)
    except ModelLoadError as err:
        source = damaged_conversion(folder)
        if source is None:
            raise
        # specsure made this folder from a GGUF that is still there: damaged since (a disk that filled, a
        # partial copy of the cache), it is made again rather than blamed on the user's checkpoint.
        logger.warning("%s, specsure's conversion of %s, no longer loads (%s); converting it again", folder,
                       source, err)
        folder = convert_again(source, folder)
        hf, tokenizer = _from_folder(folder, torch_dtype)
    kernel = native_float_kernel(hf) if torch_dtype == torch.float32 else None  # where it may read blocks
    gguf, why = (_given_gguf(path) or source_gguf(folder)) if kernel is not None else (None, "")
    blocks = _file_blocks(hf, gguf) if gguf is not None else None
    # An engine's model drops the layer matrices its blocks hold before they are copied (early_blocks.py).
    dropped = drop_matched(hf, blocks, kernel) if release_weights and isinstance(blocks, FileBlocks) else 0
    lm = CausalLM(hf)
    if lm.dtype == torch.float32 and lm.row_kernel is not None:
        lm.path += _read_blocks(lm, gguf, blocks, int8_activations) if gguf is not None and blocks is not None else \
            f"; every weight matrix read as float32 ({why})" if why else ""
    if release_weights and (dropped := dropped + lm.release_block_weights()):
        _give_back_memory()
        logger.info("dropped the float32 copies of the matrices read as blocks (%.0f MiB)", dropped / 2**20)
    if int8_activations and not lm.int8_matrices and int8_required:
        raise ValueError(f"int8_activations: no weight matrix of {path or 'the default model'} can have them (forward: "
                         f"{lm.path}); they need a GGUF target whose quantised matrices (Q4_0 to Q8_0, Q4_K to Q6_K) "
                         "the float32 kernel reads as blocks. Drop int8_activations (--int8-activations).")
    if dtype == "auto" and lm.dtype == torch.float32 and cpu_bf16_flags() and not lm.blocks_used:
        logger.warning("dtype='auto' chose float32 for the GGUF's blocks, but the kernel reads none of them (%s); "
                       "pass dtype='bfloat16', faster on this CPU without the blocks.", lm.path)
    logger.info(
        "loaded %s (%s, %d layers, vocab %d, %s; forward: %s) in %.1f s",
        folder, type(hf).__name__, lm.num_layers, lm.vocab_size, lm.dtype, lm.path, time.perf_counter() - started,
    )
    return LoadedModel(
        lm=lm,
        tokenizer=tokenizer,
        path=str(folder),
        eos_token_ids=_eos_token_ids(hf, tokenizer),
        dtype_reason=dtype_reason,
    )


def _give_back_memory() -> None:
    """Hand the heap's free pages back to the system. glibc keeps freed memory for reuse, and weights
    freed in the middle of its heap stay resident otherwise: dropping the default model's float32
    copies lowered its resident memory by 28 MB without this and by 430 MB with it."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (musl, macOS): their allocators decide for themselves
        pass


def _given_gguf(path: str | None) -> tuple[Path, str] | None:
    """The GGUF file ``load_model`` was given (the packaged one for None), whose blocks the float32
    kernel may read; None for a folder, which names its source in its conversion marker."""
    if path is None:
        return packaged_default_gguf(), ""
    p = Path(path).expanduser()
    return (p.resolve(), "") if p.suffix.lower() == ".gguf" and p.is_file() else None


def _file_blocks(hf: Any, gguf: Path) -> FileBlocks | str:
    """``gguf``'s block matrices for ``hf``'s weights (gguf_blocks.py), or why none are read: what the
    model's ``path`` adds then. ``SPECSURE_GGUF_BLOCKS=0`` keeps the float32 weights (for comparing the two)."""
    if os.environ.get("SPECSURE_GGUF_BLOCKS") == "0":
        return f"; every weight matrix read as float32 (SPECSURE_GGUF_BLOCKS=0, not {gguf.name}'s blocks)"
    text = hf.config.get_text_config(decoder=True)
    model_type = getattr(text, "model_type", None)
    model_type = GGUF_ARCHITECTURES.get(model_type, model_type)
    if model_type not in BLOCK_ARCHITECTURES:
        return (f"; every weight matrix read as float32 ({gguf.name}'s blocks are read for "
                f"{', '.join(BLOCK_ARCHITECTURES)} only, not {model_type})")
    heads = int(text.num_attention_heads)
    try:
        return read_blocks(gguf, int(text.num_hidden_layers), heads,
                           int(getattr(text, "num_key_value_heads", None) or heads),
                           bool(getattr(hf.config, "tie_word_embeddings", False)), BLOCK_ARCHITECTURES[model_type])
    except (OSError, ValueError) as err:  # the file changed since its conversion: the weights still load
        return f"; every weight matrix read as float32 ({gguf} cannot be read for its blocks: {err})"


def _read_blocks(lm: CausalLM, gguf: Path, blocks: FileBlocks | str, int8_activations: bool) -> str:
    """Have the float32 kernel read the weights that came from ``gguf``'s quantised tensors as its
    ``blocks`` (gguf_blocks.py: the same bits, or on AMX tiles float32 sums in another order, from a
    fraction of the bytes a step reads); returns what the model's ``path`` adds: which it reads, or
    why none."""
    if isinstance(blocks, str):
        return blocks
    used = lm.use_blocks(blocks, int8_activations)
    if not used:
        return f"; every weight matrix read as float32 ({gguf.name} has no matrix of a type the kernel reads that matches)"
    shown = ", ".join(f"{count} {name}" for name, count in sorted(used.items()))
    tiled = lm.tiled_matrices
    packings = ", ".join(f"{count} {name}" for name, count in sorted(lm.int8_packings.items()))
    tiles = f" ({tiled} of them on AMX tiles)" if tiled else \
        f" ({lm.int8_matrices} of them with int8 activations, packed as {packings}; every forward in C, whatever " \
        "its rows)" if lm.int8_matrices else ""
    return f"; of its {4 * lm.num_layers + 1} weight matrices the kernel reads {shown} as the GGUF's blocks{tiles}"


def _from_folder(folder: Path, torch_dtype: torch.dtype) -> tuple[Any, PreTrainedTokenizerBase | None]:
    """The transformers model and tokenizer in ``folder``, each checked; ModelLoadError names the fault."""
    config = check_model_folder(folder)
    hf_config = _hf_config(folder)
    with quiet_loading() as reports:
        try:
            hf, info = AutoModelForCausalLM.from_pretrained(
                folder,
                config=hf_config,
                dtype=torch_dtype,
                use_safetensors=True,
                trust_remote_code=False,
                local_files_only=True,
                output_loading_info=True,
            )
        except Exception as err:  # transformers' and safetensors' own error types; each becomes one message
            raise _load_error(folder, hf_config, err, reports) from err
    _check_loading_info(folder, info, config)
    return hf, _load_tokenizer(folder)


def weights_folder(path: str | None) -> Path:
    """The HF folder the weights load from: ``path`` itself, or a GGUF's converted folder (made once).

    Raises:
        ModelLoadError: the path does not exist, or is a file other than a .gguf.
    """
    if path is None:
        return default_model_folder()
    p = Path(path).expanduser()
    if not p.exists():
        raise ModelLoadError(
            f"model path {str(p)!r} {broken_link(p) or 'does not exist'}; pass an HF model folder, a .gguf file, "
            "or no path for the packaged default model."
        )
    if p.is_dir():
        return p
    if p.suffix.lower() == ".gguf":
        if is_default_gguf(p):  # the packaged file by its path: the default's conversion, not a second one
            return default_model_folder()
        return convert_gguf(p, gguf_cache_folder(p))
    raise ModelLoadError(
        f"model path {str(p)!r} is a file but not a .gguf; pass the folder that holds "
        "config.json and the *.safetensors weights instead."
    )




def _hf_config(folder: Path) -> PreTrainedConfig:
    """transformers' config for ``folder``, every field checked as its class checks it.

    Raises:
        ModelLoadError: naming config.json and the field transformers rejects.
    """
    config_path = folder / "config.json"
    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    except Exception as err:  # huggingface_hub's strict-dataclass errors name the field; others name the value
        detail = " ".join(str(err).split()).rstrip(".") or type(err).__name__
        raise ModelLoadError(f"{config_path} is not a valid configuration: {detail}. Fix that field, or use the "
                             "config.json the weights came with.") from None
    _check_rope_type(config_path, config)
    return config


def _check_rope_type(config_path: Path, config: PreTrainedConfig) -> None:
    """A rope type transformers has no function for fails deep in model building as a bare KeyError."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    rope_type = params.get("rope_type", params.get("type")) if isinstance(params, dict) else None
    if rope_type not in (None, "default") and rope_type not in ROPE_INIT_FUNCTIONS:
        known = ", ".join(sorted(["default", *ROPE_INIT_FUNCTIONS]))
        raise ModelLoadError(f"{config_path}: rope_type = {json.dumps(rope_type)} is not a rotary embedding the "
                             f"installed transformers knows ({known}). Fix rope_parameters (rope_scaling).")


def _load_error(folder: Path, hf_config: PreTrainedConfig, err: Exception, reports: list[Any]) -> ModelLoadError:
    """One message for a failed ``from_pretrained``: the tensors whose shapes config.json contradicts
    when that is the cause (instead of transformers' LOAD REPORT), else transformers' own words."""
    mismatched = _shape_mismatches(folder, hf_config) if "mismatched" in str(err) else []
    if mismatched:
        reports.clear()
        shown = "; ".join(f"{name} is {list(have)} in the weights but {list(want)} for config.json"
                          for name, have, want in mismatched[:3])
        more = f" and {len(mismatched) - 3} more" if len(mismatched) > 3 else ""
        return ModelLoadError(f"the weights in {folder} do not fit its config.json: {shown}{more}. A size in "
                              "config.json (hidden_size, vocab_size, intermediate_size, head counts) differs from "
                              "the weights; use the config.json the weights came with.")
    detail = " ".join(str(err).split()).rstrip(".") or "no message"
    return ModelLoadError(f"transformers could not load the model in {folder} ({type(err).__name__}: {detail}). "
                          "Check that config.json and the *.safetensors files belong together and are complete.")


def _shape_mismatches(folder: Path, hf_config: PreTrainedConfig) -> list[tuple[str, tuple[int, ...], tuple[int, ...]]]:
    """(name, shape in the weights, shape the config's model has) for every tensor both name alike."""
    from safetensors import SafetensorError, safe_open

    with torch.device("meta"):
        wanted = {name: tuple(t.shape) for name, t in AutoModelForCausalLM.from_config(hf_config).state_dict().items()}
    found = []
    for file in weight_files(folder)[0]:
        try:
            with safe_open(str(folder / file), framework="pt") as handle:
                for name in handle.keys():
                    have = tuple(handle.get_slice(name).get_shape())
                    if name in wanted and wanted[name] != have:
                        found.append((name, have, wanted[name]))
        except (OSError, SafetensorError):  # an unreadable file: transformers' own message covers it
            return []
    return sorted(found)


def _check_loading_info(folder: Path, info: dict[str, Any], config: dict[str, Any]) -> None:
    # transformers fills weights missing from the checkpoint with random values and only
    # logs it; decoding with them would produce fluent-looking garbage, so refuse.
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ModelLoadError(
            f"the weights in {folder} lack {len(missing)} tensor(s) the config.json architecture "
            f"needs ({shown}); the checkpoint and its config.json do not match."
        )
    unexpected = info.get("unexpected_keys") or ()
    _check_layer_count(folder, unexpected, config)
    if unexpected:
        # Expected for checkpoints that carry extra modules (e.g. MTP layers) the base class skips.
        logger.info("%s: %d checkpoint tensor(s) unused by the model", folder, len(unexpected))


def _check_layer_count(folder: Path, unexpected: Any, config: dict[str, Any]) -> None:
    """Decoder layers in the weights beyond num_hidden_layers (and the MTP layers config.json declares
    after them) would be dropped: the model would run, fluent and wrong, without them."""
    layers = config.get("num_hidden_layers")
    if not isinstance(layers, int):
        return
    mtp_key = next((key for key in MTP_LAYER_KEYS if isinstance(config.get(key), int)), None)
    declared = layers + (config[mtp_key] if mtp_key else 0)
    extra = sorted({int(m.group(1)) for name in unexpected if (m := _LAYER_INDEX.search(name))} - set(range(declared)))
    if extra:
        mtp = f" and {mtp_key} = {config[mtp_key]}" if mtp_key else ""
        held = f"{extra[0]}" if len(extra) == 1 else f"{extra[0]} to {extra[-1]}"
        raise ModelLoadError(f"{folder / 'config.json'}: num_hidden_layers = {layers}{mtp}, but the weights also hold "
                             f"decoder layer {held}, which the model would run without. Set num_hidden_layers to the "
                             "number of layers the weights hold, or use the config.json they came with.")


def _load_tokenizer(folder: Path) -> PreTrainedTokenizerBase | None:
    if not any((folder / name).is_file() for name in _TOKENIZER_FILES):
        logger.info("%s has no tokenizer files; only token-id prompts will work", folder)
        return None
    if not any((folder / name).is_file() for name in _VOCABULARY_FILES):
        # transformers would try to build one from tokenizer_config.json alone and ask for sentencepiece.
        raise ModelLoadError(f"{folder} holds tokenizer_config.json but no vocabulary file ({', '.join(_VOCABULARY_FILES)}"
                             "); copy tokenizer.json from where the model came from, or remove tokenizer_config.json "
                             "to load the model for token-id prompts only.")
    vocabulary = folder / "tokenizer.json"
    if vocabulary.is_file():
        try:
            json.loads(vocabulary.read_bytes())
        except (ValueError, RecursionError) as err:  # transformers would say only where the JSON broke
            raise ModelLoadError(f"{vocabulary} is not valid JSON ({err}); the file is damaged or cut short: copy "
                                 "tokenizer.json again from where the model came from.") from None
    try:
        return AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, KeyError) as err:
        if "trust_remote_code" in str(err):  # its advice names an option specsure never offers
            raise ModelLoadError(f"the tokenizer in {folder} needs its own Python code (auto_map in "
                                 "tokenizer_config.json), and specsure never runs code from a checkpoint; use a "
                                 "tokenizer.json with a standard tokenizer_class.") from None
        raise ModelLoadError(f"the tokenizer files in {folder} could not be loaded: {err}") from err


def _eos_token_ids(hf: Any, tokenizer: PreTrainedTokenizerBase | None) -> tuple[int, ...]:
    found: list[int] = []
    sources: list[Any] = [
        getattr(hf.generation_config, "eos_token_id", None),
        getattr(hf.config, "eos_token_id", None),
    ]
    if tokenizer is not None:
        sources.append(tokenizer.eos_token_id)
    vocab = int(hf.config.get_text_config(decoder=True).vocab_size)
    for value in sources:
        for token in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab:
                if token is not None:  # an id no output can hold, or not an id: generation would not stop at it
                    logger.warning("ignoring eos_token_id %r of the model's config files: not a token id in the "
                                   "vocabulary [0, %d); output ends at max_tokens or the other EOS ids", token, vocab)
                continue
            if token not in found:
                found.append(token)
    return tuple(found)
