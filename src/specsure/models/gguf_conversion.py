"""Writing a GGUF file's model as a Hugging Face folder: transformers' GGUF reader, then what it
leaves out or gets wrong (the file's own values, tokens it invents, blocks that are not finite)
put right, each named by the file when it cannot be. ``gguf_cache`` decides when, and where.
"""

from __future__ import annotations

import errno
import functools
import json
import logging
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final, Iterator

import numpy
import torch

from specsure.config.gguf_header import TOKENS_KEY, read_gguf_metadata
from specsure.models.errors import ModelLoadError
from specsure.models.gguf_config import fit_to_file, unsupported_architecture
from specsure.models.gguf_rope import gguf_rope_parameters
from specsure.models.gguf_tensors import streams, write_index, write_tensors

logger = logging.getLogger(__name__)

GEMMA_27B_LAYERS: Final[dict[str, int]] = {"gemma2": 46, "gemma3_text": 62, "gemma3": 62}
"""The layer count by which llama.cpp tells a 27B Gemma, whose attention scale it takes from hidden / heads."""


def write_conversion(gguf: Path, out: Path) -> None:
    """The GGUF's model as float32 safetensors, its tokenizer and config, into the empty folder ``out``."""
    # Imported here: most loads hit the cache and never need the GGUF machinery.
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from specsure.models.gguf_file import check_gguf
    from specsure.models.quiet import quiet_loading

    check_gguf(gguf)
    streamed = streams(read_gguf_metadata(str(gguf)).get("general.architecture"))
    # transformers reads tokenizer files beside a GGUF before the GGUF's own tokenizer, so a GGUF
    # kept next to another model's would encode with that vocabulary; it loads from a folder that
    # holds a link to the file and nothing else (the conversion's own, still empty, folder).
    alone = out / gguf.name
    os.symlink(gguf.resolve(), alone)
    kwargs = {"gguf_file": gguf.name, "local_files_only": True, "trust_remote_code": False}
    try:
        # numpy's warnings about NaN block scales would come out raw; _check_finite names the tensor instead.
        with quiet_loading(), no_dequantizing_bar(), numpy.errstate(invalid="ignore", over="ignore"):
            tokenizer = AutoTokenizer.from_pretrained(out, **kwargs)
            config = fit_to_file(gguf, AutoConfig.from_pretrained(out, **kwargs))
            if streamed:  # the weights go to disk tensor by tensor (gguf_tensors); the model here has none
                with torch.device("meta"):
                    model = AutoModelForCausalLM.from_config(config)
                written = write_tensors(gguf, model, out, functools.partial(_not_finite, gguf))
                info = {"missing_keys": written.missing_keys, "mismatched_keys": written.mismatched_keys}
            else:
                # Mismatched sizes are reported below, naming the tensors, rather than raised as transformers'
                # "see the report above", which quiet loading hides.
                model, info = AutoModelForCausalLM.from_pretrained(
                    out, config=config, dtype=torch.float32, output_loading_info=True, ignore_mismatched_sizes=True,
                    **kwargs)
    except ModelLoadError:  # the file's own values refused by name (fit_to_file)
        raise
    except ImportError as err:
        raise ModelLoadError(
            f"loading {gguf} needs the `gguf` and `accelerate` packages ({err}); "
            "run `pip install gguf accelerate`."
        ) from err
    except OSError as err:
        if err.errno in (errno.ENOSPC, errno.EDQUOT):  # the conversion's own writes: the CLI names a full disk
            raise
        raise ModelLoadError(f"transformers could not read the GGUF file {gguf}: {err}") from err
    except (ValueError, KeyError, NotImplementedError, AssertionError, TypeError,
            StrictDataclassError) as err:  # the last: a config value transformers' validators refuse
        # A KeyError is a metadata key transformers looks up ('scores': tokenizer.ggml.scores); an
        # AssertionError or TypeError, a metadata value the model's modules cannot be built with (a
        # padding token id past the vocabulary, for one).
        detail = (f"its metadata lacks the key {err} that transformers reads" if isinstance(err, KeyError) else
                  f"{type(err).__name__}: {err}" if isinstance(err, (AssertionError, TypeError)) else
                  (str(err).strip().splitlines() or [type(err).__name__])[-1].strip()
                  if isinstance(err, StrictDataclassError) else str(err))
        if isinstance(err, ValueError) and ("is not supported yet" in detail or "Unrecognized model" in detail):
            raise ModelLoadError(unsupported_architecture(gguf)) from err
        raise ModelLoadError(f"transformers could not read the GGUF file {gguf}: {detail}") from err
    finally:
        alone.unlink()
    _check_conversion(gguf, info)
    if not streamed:  # the streamed tensors were checked as they were written
        _check_finite(gguf, model)
    _add_what_transformers_leaves_out(gguf, model)
    # The weights are already dequantised; save_pretrained refuses to serialise a model that still
    # carries the GGUF quantizer, so drop every trace of it.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if streamed:  # the index, config and generation config as save_pretrained writes them beside its weights
        write_index(written, out)
        model.config.dtype = "float32"
        model.config.architectures = [type(model).__name__]
        model.config.save_pretrained(out)
        model.generation_config.save_pretrained(out)
    else:
        with quiet_loading():  # save_pretrained draws a "Writing model shards" bar
            model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    _drop_invented_tokens(gguf, out)


def _drop_invented_tokens(gguf: Path, folder: Path) -> None:
    """transformers' GGUF tokenizer adds GPT-2's ``<|endoftext|>`` to a byte-level BPE vocabulary that
    lacks it, past the file's last token (and makes it bos or eos where the file names none). No
    embedding row is that id's, and llama.cpp, reading the file's tokens only, takes such text as
    text; so the tokenizer saved here holds the file's tokens and no role names another."""
    count = read_gguf_metadata(str(gguf)).get(TOKENS_KEY)
    path = folder / "tokenizer.json"
    if not isinstance(count, int) or not path.is_file():
        return
    data = json.loads(path.read_text(encoding="utf-8"))
    added = data.get("added_tokens") or []
    invented = {t.get("content") for t in added if isinstance(t.get("id"), int) and t["id"] >= count}
    if not invented:
        return
    data["added_tokens"] = [t for t in added if t.get("content") not in invented]
    path.write_text(json.dumps(data, ensure_ascii=False, indent=2), encoding="utf-8")
    config_path = folder / "tokenizer_config.json"
    if config_path.is_file():
        config = json.loads(config_path.read_text(encoding="utf-8"))
        for key, value in list(config.items()):
            if key.endswith("_token") and (value.get("content") if isinstance(value, dict) else value) in invented:
                config[key] = None
        if isinstance(decoder := config.get("added_tokens_decoder"), dict):
            config["added_tokens_decoder"] = {i: t for i, t in decoder.items()
                                              if not (isinstance(t, dict) and t.get("content") in invented)}
        config_path.write_text(json.dumps(config, ensure_ascii=False, indent=2), encoding="utf-8")
    logger.info("%s: left out token(s) %s that transformers adds past the file's %d tokens", gguf.name,
                sorted(invented), count)


def _check_conversion(gguf: Path, info: dict) -> None:
    """transformers fills a tensor the file lacks with random values and, with ignore_mismatched_sizes,
    one whose shape the metadata contradicts; the cache would keep them as if they were the model's."""
    mismatched = list(info.get("mismatched_keys") or ())
    if mismatched:
        shown = "; ".join(f"{name} is {list(have)} in the file but {list(want)} for its metadata"
                          for name, have, want in sorted(mismatched)[:3])
        raise ModelLoadError(f"{gguf}: the tensors do not fit the model transformers builds from the file's metadata "
                             f"({shown}). If llama.cpp runs this file, transformers' GGUF reader misreads a size or a "
                             "tensor's shape for this architecture: load the model's Hugging Face folder instead. "
                             "Otherwise a size in the metadata (embedding_length, head_count, head_count_kv, "
                             "feed_forward_length, vocab_size) is wrong, and re-converting the model fixes it.")
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ModelLoadError(f"{gguf} lacks {len(missing)} tensor(s) its architecture needs ({shown}, in "
                             "transformers' names), or holds them under names transformers does not map; "
                             "re-convert the model.")


def _add_what_transformers_leaves_out(gguf: Path, model: Any) -> None:
    """transformers' GGUF reader drops a Llama-family file's rope scaling and its end-of-turn
    tokens, both of which llama.cpp reads: without them the model rotates as an unscaled one, and
    generation runs on past the end of a turn it should stop at."""
    config = model.config
    rope = getattr(config, "rope_parameters", None)
    if isinstance(rope, dict):
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        if (scaled := gguf_rope_parameters(gguf, rope, head_dim)) is not None:
            config.rope_parameters = scaled
            if "original_max_position_embeddings" in scaled and hasattr(config, "original_max_position_embeddings"):
                # Phi-3's config keeps its own copy, which transformers puts back into rope_parameters on load
                config.original_max_position_embeddings = scaled["original_max_position_embeddings"]
    if (layers_27b := GEMMA_27B_LAYERS.get(config.model_type)) is not None:
        # The file has no key for it: llama.cpp takes 1/sqrt(head_dim), or, at the 27B's layer count,
        # 1/sqrt(hidden / heads); transformers' default (256) is right only where head_dim is 256.
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        config.query_pre_attn_scalar = config.hidden_size // config.num_attention_heads \
            if config.num_hidden_layers == layers_27b else head_dim
    metadata = read_gguf_metadata(str(gguf))
    ends = [metadata.get(f"tokenizer.ggml.{kind}_token_id") for kind in ("eos", "eot", "eom")]
    ids = list(dict.fromkeys(i for i in ends if isinstance(i, int) and not isinstance(i, bool)
                             and 0 <= i < config.vocab_size))
    if len(ids) > 1:  # llama.cpp ends generation at any of them
        model.generation_config.eos_token_id = ids


def _check_finite(gguf: Path, model: torch.nn.Module) -> None:
    """A block whose float16 scale is NaN or infinite (a file damaged in transit, or written wrong)
    de-quantises to NaN weights; such a model would only ever produce NaN logits."""
    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            _not_finite(gguf, name, int((~torch.isfinite(tensor)).sum()), tensor.numel())


def _not_finite(gguf: Path, name: str, bad: int, total: int) -> None:
    """Refuse ``gguf`` for the ``bad`` NaN or infinite values of its tensor ``name`` (of ``total``)."""
    raise ModelLoadError(f"{gguf}: tensor {name} (transformers' name) de-quantises to {bad} NaN or infinite "
                         f"value(s) of {total}: the file is damaged or was written wrong (its block scales are "
                         "not finite numbers). Download or convert the model again.")


@contextmanager
def no_dequantizing_bar() -> Iterator[None]:
    """Hide the bar transformers draws while it de-quantises GGUF tensors.

    transformers draws it with a bare ``tqdm`` that its own progress-bar switch (which
    ``quiet_loading`` turns off) does not reach, so it printed through ``--no-progress``.
    """
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    bar = getattr(gguf_utils, "tqdm", None)
    if bar is None:  # a transformers that draws no bar there
        yield
        return
    gguf_utils.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = bar
