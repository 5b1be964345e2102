"""GGUF files as users bring them: each broken one is refused naming the file, the tensor and the
fix, never converted with random or missing weights; the tokenizer is always the file's own."""

from __future__ import annotations

import json
import logging
import shutil
from typing import Any
from pathlib import Path

import numpy as np
import pytest
import torch

from gguf_models import assert_decodes_as, byte_bpe_tokenizer, write_gemma2, write_llama_gguf, write_phi3, write_qwen3
from specsure.models.errors import ModelLoadError
from specsure.models.loading import load_model
from tiny import build_tiny_llama
from words import write_word_tokenizer

VOCAB = 300


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = build_tiny_llama(tmp_path_factory.mktemp("hf") / "llama", vocab_size=VOCAB, hidden_size=32, tie=False)
    byte_bpe_tokenizer(folder, VOCAB)
    return folder


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def test_a_sound_gguf_loads_as_its_source_with_its_own_tokenizer(hf: Path, tmp_path: Path) -> None:
    # Beside it, another model's tokenizer files (a folder of several models, say): not read.
    folder = tmp_path / "models"
    folder.mkdir()
    gguf = write_llama_gguf(hf, folder / "tiny.gguf")
    write_word_tokenizer(folder, 50)
    loaded, source = load_model(str(gguf), dtype="float32"), load_model(str(hf), dtype="float32")
    # transformers' GGUF reader adds <|endoftext|> past the vocabulary to a gpt2-style tokenizer; the
    # conversion leaves it out, so the vocabulary is the file's, exactly.
    assert loaded.tokenizer.get_vocab() == source.tokenizer.get_vocab()
    ids = torch.tensor([[5, 17, 33, 2]])
    torch.testing.assert_close(loaded.lm.hf(ids).logits, source.lm.hf(ids).logits)


def test_text_of_a_token_transformers_invents_is_text_as_llama_cpp_reads_it(hf: Path, tmp_path: Path) -> None:
    """The file has no <|endoftext|>: as llama.cpp, which reads only the file's tokens, the prompt's
    "<|endoftext|>" is ordinary text (it was refused as a token past the model's vocabulary)."""
    from specsure import SamplingParams, make_engine

    engine = make_engine(str(write_llama_gguf(hf, tmp_path / "tiny.gguf")), dtype="float32")
    text = "hi <|endoftext|> there"
    ids = engine.tokenizer.encode(text, add_special_tokens=False)
    assert len(engine.tokenizer) == VOCAB and max(ids) < VOCAB and engine.tokenizer.decode(ids) == text
    assert engine.generate(text, SamplingParams(max_tokens=2, ignore_eos=True))[0].prompt_token_ids[-len(ids):] == ids


def test_a_new_conversion_of_a_file_removes_its_older_ones(hf: Path, tmp_path: Path) -> None:
    """An earlier conversion of the same file (its older contents, or an older conversion version) is
    float32 weights no load reaches again; another file's conversion stays."""
    from specsure.models import gguf_cache

    gguf, other = write_llama_gguf(hf, tmp_path / "a.gguf"), write_llama_gguf(hf, tmp_path / "b.gguf")
    old, kept = Path(load_model(str(gguf), dtype="float32").path), Path(load_model(str(other), dtype="float32").path)
    gguf.write_bytes(gguf.read_bytes())  # rewritten in place: a new conversion
    new = Path(load_model(str(gguf), dtype="float32").path)
    assert new != old and gguf_cache.is_converted(new) and not old.exists() and gguf_cache.is_converted(kept)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"skip": ("blk.1.ffn_up.weight",)}, r"lacks 1 tensor\(s\) its architecture needs \(model\.layers\.1\.mlp\.up_proj"),
    ({"metadata": {"block_count": 3}}, r"lacks 9 tensor\(s\) .*model\.layers\.2\."),
    ({"metadata": {"block_count": 1}}, r"llama\.block_count = 1, but the file also holds block 1"),
    ({"metadata": {"attention.head_count": 3}}, r"llama\.attention\.head_count = 3 does not divide "
                                                 r"llama\.embedding_length = 32"),
    ({"metadata": {"attention.head_count_kv": 3}}, r"llama\.attention\.head_count_kv = 3 does not divide "
                                                    r"llama\.attention\.head_count = 4"),
    ({"metadata": {"feed_forward_length": 48}},
     r"the tensors do not fit the model transformers builds from the file's metadata \(model\.layers\.0\.mlp\.down_proj\.weight is \[32, 64\] in the file "
     r"but \[32, 48\]"),
    ({"merges": False}, r"byte-level BPE \(tokenizer\.ggml\.model = 'gpt2'\) but the metadata has no tokenizer\.ggml\.merges"),
    ({"raw": {"blk.0.ffn_up.weight": "Q8_1"}},
     r"tensor 'blk\.0\.ffn_up\.weight' is of type Q8_1, which the installed gguf package cannot de-quantise \(it reads "
     r"F32, F16, .*Q8_0"),
])
def test_a_broken_gguf_is_refused_naming_what_is_wrong(hf: Path, tmp_path: Path, kwargs, message: str) -> None:  # noqa: ANN001
    gguf = write_llama_gguf(hf, tmp_path / "broken.gguf", **kwargs)
    with pytest.raises(ModelLoadError, match=message):
        load_model(str(gguf), dtype="float32")
    assert not list((tmp_path / "cache" / "specsure").glob("broken-*/model.safetensors"))  # nothing cached


def test_a_gguf_whose_block_scale_is_nan_is_refused_naming_the_tensor(hf: Path, tmp_path: Path,
                                                                    recwarn: pytest.WarningsRecorder) -> None:
    """A damaged file de-quantises to NaN weights: refused at conversion, nothing cached, no raw numpy warning."""
    from specsure.config.gguf_header import read_gguf_tensors
    from specsure.models.gguf_cache import cache_root

    path = write_llama_gguf(hf, tmp_path / "damaged.gguf", quantize={"blk.0.attn_v.weight": "Q8_0"})
    entry = next(t for t in read_gguf_tensors(str(path))[1] if t.name == "blk.0.attn_v.weight")
    with open(path, "r+b") as fh:
        fh.seek(entry.start)
        fh.write(bytes([0x00, 0x7E]))  # the first block's float16 scale: NaN
    with pytest.raises(ModelLoadError, match=r"tensor model\.layers\.0\.self_attn\.v_proj\.weight .* de-quantises "
                                             r"to \d+ NaN or infinite value.*Download or convert the model again"):
        load_model(str(path), dtype="float32")
    assert not any(issubclass(w.category, RuntimeWarning) for w in recwarn.list)
    assert not list(cache_root().glob("damaged*"))


LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def _llama3_gguf(tmp_path: Path, **kwargs: object) -> tuple[Path, Path]:
    """A Llama 3.1-style model (llama3 rope scaling) and its GGUF file as llama.cpp writes it: the
    scaling as rope_freqs.weight, each frequency's divisor (from transformers' own two tables here)."""
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = build_tiny_llama(tmp_path / "llama3", vocab_size=VOCAB, hidden_size=64, tie=False,
                          extra_config={"max_position_embeddings": 16384, "rope_parameters": LLAMA3_ROPE})
    byte_bpe_tokenizer(hf, VOCAB)
    head_dim = 64 // 4
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](AutoConfig.from_pretrained(hf), "cpu")
    plain = 1.0 / (LLAMA3_ROPE["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    freqs = (plain / scaled.double()).numpy()
    assert abs(freqs.max() - 8) < 1e-6 and abs(freqs.min() - 1) < 1e-6 and ((freqs > 1.01) & (freqs < 7.99)).any()
    return hf, write_llama_gguf(hf, tmp_path / "llama3.gguf", tensors={"rope_freqs.weight": freqs}, **kwargs)


def test_a_llama3_rope_scaled_gguf_rotates_as_its_source(tmp_path: Path) -> None:
    """transformers' GGUF reader drops rope_freqs.weight; the conversion puts the scaling back."""
    hf, gguf = _llama3_gguf(tmp_path, keys={"tokenizer.ggml.eot_token_id": 5})
    ids = torch.tensor([[(7 * i) % (VOCAB - 3) + 3 for i in range(400)]])
    want = load_model(str(hf), dtype="float32").lm.hf(ids).logits
    converted = load_model(str(gguf), dtype="float32")
    assert converted.lm.hf.config.rope_parameters == {**LLAMA3_ROPE, "rope_theta": LLAMA3_ROPE["rope_theta"]}
    assert torch.allclose(converted.lm.hf(ids).logits, want, atol=1e-4)
    unscaled = load_model(str(write_llama_gguf(hf, tmp_path / "unscaled.gguf")), dtype="float32")
    assert not torch.allclose(unscaled.lm.hf(ids).logits, want, atol=1e-4)  # what was loaded before: another model
    assert set(converted.eos_token_ids) >= {2, 5}  # llama.cpp stops at the end-of-turn token too
    from specsure import SamplingParams, make_engine

    prompt, params = ids[0, :300].tolist(), SamplingParams(max_tokens=12, ignore_eos=True)
    outputs = [make_engine(str(m), dtype="float32").generate([prompt], params)[0].token_ids for m in (hf, gguf)]
    assert outputs[0] == outputs[1]  # the engine's own decoder (rotary tables, kernels) rotates the same


def test_rope_factors_that_match_no_llama3_scaling_are_refused(tmp_path: Path) -> None:
    hf = build_tiny_llama(tmp_path / "odd", vocab_size=VOCAB, hidden_size=64, tie=False)
    byte_bpe_tokenizer(hf, VOCAB)
    gguf = write_llama_gguf(hf, tmp_path / "odd.gguf", tensors={"rope_freqs.weight": np.linspace(1, 3, 8)})
    with pytest.raises(ModelLoadError, match=r"rope_freqs\.weight scales the rotary frequencies in a way that "
                                             r"matches no Llama 3 scaling.*Hugging Face folder"):
        load_model(str(gguf), dtype="float32")
    linear = write_llama_gguf(hf, tmp_path / "linear.gguf", keys={"llama.rope.scaling.type": "linear",
                                                                  "llama.rope.scaling.factor": 4.0})
    assert load_model(str(linear), dtype="float32").lm.hf.config.rope_parameters["factor"] == 4.0
    from specsure.models.gguf_rope import gguf_rope_parameters

    per_type = {"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                "full_attention": {"rope_type": "default", "rope_theta": 1e6}}  # Gemma 3's, in transformers 5
    assert gguf_rope_parameters(linear, per_type, 16) == {  # llama.cpp scales the global layers only
        **per_type, "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 4.0}}
    read = {"rope_type": "yarn", "rope_theta": 1.5e5, "factor": 32.0}  # what transformers reads for gpt-oss
    assert gguf_rope_parameters(linear, read, 16) is None
    yarn = write_llama_gguf(hf, tmp_path / "yarn.gguf", keys={"llama.rope.scaling.type": "yarn",
                                                              "llama.rope.scaling.factor": 4.0})
    with pytest.raises(ModelLoadError, match=r"rope\.scaling\.type = 'yarn'.*cannot read from a GGUF file yet"):
        load_model(str(yarn), dtype="float32")


def test_a_special_token_id_past_the_vocabulary_is_named(hf: Path, tmp_path: Path) -> None:
    """transformers would fail reading the tokenizer with a bare IndexError."""
    path = write_llama_gguf(hf, tmp_path / "pad.gguf", keys={"tokenizer.ggml.padding_token_id": 5000})
    with pytest.raises(ModelLoadError, match=r"tokenizer\.ggml\.padding_token_id = 5000 is not a token of its "
                                             r"vocabulary of 300 tokens.*gguf_set_metadata"):
        load_model(str(path), dtype="float32")
    ignored = write_llama_gguf(hf, tmp_path / "eot.gguf", keys={"tokenizer.ggml.eot_token_id": 5000})
    assert 5000 not in load_model(str(ignored), dtype="float32").eos_token_ids  # transformers never reads it


def test_a_split_ggufs_part_or_a_folder_holding_a_gguf_names_what_to_do(hf: Path, tmp_path: Path) -> None:
    from specsure.config import resolve
    from specsure.config.errors import ConfigError

    part = write_llama_gguf(hf, tmp_path / "m-00001-of-00002.gguf", keys={"split.count": 2, "split.no": 0})
    with pytest.raises(ModelLoadError, match=r"part 1 of a GGUF split into 2 files.*llama-gguf-split --merge"):
        load_model(str(part), dtype="float32")
    with pytest.raises(ConfigError, match=r"no config\.json.*To load a GGUF file, pass its path: .*m-00001-of"):
        resolve({"method": "ngram"}, model=str(tmp_path))


def test_a_truncated_gguf_names_the_tensor_past_its_end(hf: Path, tmp_path: Path) -> None:
    whole = write_llama_gguf(hf, tmp_path / "whole.gguf")
    cut = tmp_path / "cut.gguf"
    shutil.copyfile(whole, cut)
    with open(cut, "r+b") as handle:
        handle.truncate(cut.stat().st_size - 10)
    with pytest.raises(ModelLoadError, match=r"cut\.gguf is truncated: tensor '.*' \(F32, shape .*\) ends at byte "
                                             rf"{whole.stat().st_size}, but the file has {cut.stat().st_size} bytes; "
                                             "re-download it"):
        load_model(str(cut), dtype="float32")


# --- Hugging Face folders: config.json fields transformers would trip on, tokenizers half there ------------

def _folder_with(hf: Path, tmp_path: Path, **fields: object) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(hf, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(fields)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(("fields", "message"), [
    ({"hidden_act": "nope"}, r"hidden_act = \"nope\" is not an activation the installed transformers has"),
    ({"num_attention_heads": 0}, r"num_attention_heads = 0 must be a positive integer"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": "abc"}}, r"rope_theta = \"abc\" must be a positive"),
    ({"max_position_embeddings": 0}, r"max_position_embeddings = 0 must be a positive integer"),  # was no limit
    # was "the logits of its own forward differ", blamed on the architecture
    ({"rms_norm_eps": float("nan")}, r"rms_norm_eps = NaN must be a small non-negative number"),
    ({"rms_norm_eps": -1.0}, r"rms_norm_eps = -1.0 must be a small non-negative number"),
])
def test_a_config_field_transformers_would_trip_on_is_named(hf: Path, tmp_path: Path, fields, message: str) -> None:  # noqa: ANN001
    with pytest.raises(ModelLoadError, match=message):
        load_model(str(_folder_with(hf, tmp_path, **fields)), dtype="float32")


def test_a_malformed_index_or_a_half_tokenizer_is_named(hf: Path, tmp_path: Path) -> None:
    folder = _folder_with(hf, tmp_path)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": ["a"]}))
    with pytest.raises(ModelLoadError, match=r"index\.json is malformed \(weight_map must map tensor names"):
        load_model(str(folder), dtype="float32")
    (folder / "model.safetensors.index.json").unlink()
    (folder / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match=r"holds tokenizer_config\.json but no vocabulary file"):
        load_model(str(folder), dtype="float32")


def test_a_tokenizer_asking_for_its_own_code_is_refused_without_running_it(hf: Path, tmp_path: Path) -> None:
    folder = _folder_with(hf, tmp_path)
    marker = tmp_path / "ran"
    (folder / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('x')\nclass EvilTok: pass\n")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.update({"tokenizer_class": "EvilTok", "auto_map": {"AutoTokenizer": ["evil.EvilTok", None]}})
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=r"needs its own Python code \(auto_map in tokenizer_config\.json\), and "
                                             r"specsure never runs code from a checkpoint"):
        load_model(str(folder), dtype="float32")
    assert not marker.exists()


def test_a_draft_of_the_targets_size_with_another_tokenizer_is_an_error(hf: Path, tmp_path: Path) -> None:
    """One size, other ordinary tokens: every draft would mean other text. Named with both paths, before any
    weight loads, and again on the loaded tokenizers."""
    from specsure import make_engine
    from specsure.config.errors import ConfigError
    from specsure.config.resolution import resolve

    draft = _folder_with(hf, tmp_path)
    write_word_tokenizer(draft, VOCAB)
    res = resolve({"method": "draft_model", "model": str(draft)}, str(hf))
    with pytest.raises(ConfigError, match="tokenizer.json files differ") as err:
        res.check_runnable()
    assert repr(str(draft)) in str(err.value) and repr(str(hf)) in str(err.value) and "'ngram'" in str(err.value)
    with pytest.raises(ConfigError, match="its drafts would be token ids that mean other text"):
        make_engine(str(hf), {"method": "draft_model", "model": str(draft)}, dtype="float32")
    same = resolve({"method": "draft_model", "model": str(hf)}, str(hf))
    assert not same.warnings
    same.check_runnable()


def test_a_draft_whose_special_tokens_alone_differ_is_a_warning(hf: Path, tmp_path: Path) -> None:
    """Models of one family name their reserved special tokens differently: a warning, and strict refuses it."""
    from specsure.config.errors import ConfigConflictError
    from specsure.config.resolution import resolve

    draft = Path(shutil.copytree(hf, tmp_path / "renamed-special"))
    tokenizer = json.loads((draft / "tokenizer.json").read_text())
    tokenizer["added_tokens"][0]["content"] = "<|reserved_0|>"
    (draft / "tokenizer.json").write_text(json.dumps(tokenizer))
    res = resolve({"method": "draft_model", "model": str(draft)}, str(hf))
    res.check_runnable()
    assert any("vocab_size and ordinary tokens, but their tokenizer.json files differ" in w for w in res.warnings)
    from specsure import make_engine

    make_engine(str(hf), {"method": "draft_model", "model": str(draft)}, dtype="float32")  # loads and runs as said
    with pytest.raises(ConfigConflictError, match="tokenizer.json files differ"):
        resolve({"method": "draft_model", "model": str(draft)}, str(hf), strict=True)


def test_a_gguf_draft_of_the_targets_size_with_another_tokenizer_is_an_error(hf: Path, tmp_path: Path) -> None:
    """GGUF files carry their token lists: two of one size that spell tokens differently are compared too."""
    from specsure.config.errors import ConfigError
    from specsure.config.resolution import resolve

    target = write_llama_gguf(hf, tmp_path / "target.gguf")
    other = _folder_with(hf, tmp_path)
    write_word_tokenizer(other, VOCAB)
    draft = write_llama_gguf(other, tmp_path / "draft.gguf", merges=False)
    with pytest.raises(ConfigError, match="GGUF token lists differ"):
        resolve({"method": "draft_model", "model": str(draft)}, str(target)).check_runnable()
    same = write_llama_gguf(hf, tmp_path / "same.gguf")
    resolve({"method": "draft_model", "model": str(same)}, str(target)).check_runnable()


def test_a_per_layer_intermediate_size_is_a_size_not_an_error(hf: Path, tmp_path: Path) -> None:
    from specsure.models.model_folder import check_model_folder

    folder = _folder_with(hf, tmp_path, intermediate_size=[64, 64])  # as Gemma 3n writes it
    assert check_model_folder(folder)["intermediate_size"] == [64, 64]
    with pytest.raises(ModelLoadError, match=r"intermediate_size = 0 must be a positive integer"):
        check_model_folder(_folder_with(hf, tmp_path / "bad", intermediate_size=[64, 0]))


def test_text_the_tokenizer_maps_past_the_models_vocabulary_is_named(hf: Path, tmp_path: Path) -> None:
    from specsure import make_engine
    from specsure.decode.completion import PromptError

    folder = Path(shutil.copytree(hf, tmp_path / "extra"))  # a tokenizer one added token past the model's rows
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    tokenizer["added_tokens"].append({"id": VOCAB, "content": "<|extra|>", "single_word": False, "lstrip": False,
                                      "rstrip": False, "normalized": False, "special": True})
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    engine = make_engine(str(folder), None, dtype="float32")
    with pytest.raises(PromptError, match=r"is text whose token '<\|extra\|>' has id 300, which the tokenizer "
                                          r"holds but the model's vocabulary \[0, 300\) does not"):
        engine.generate("hello <|extra|>")


def test_an_eos_id_outside_the_vocabulary_is_ignored_with_a_warning(hf: Path, tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    folder = _folder_with(hf, tmp_path, eos_token_id=[10**6, 3])
    with caplog.at_level(logging.WARNING, logger="specsure.models.loading"):
        model = load_model(str(folder), dtype="float32")
    assert 10**6 not in model.eos_token_ids and 3 in model.eos_token_ids
    assert any("ignoring eos_token_id 1000000" in r.message and f"[0, {VOCAB})" in r.message for r in caplog.records)


def test_a_gemma2_gguf_scales_attention_as_llama_cpp_does(tmp_path: Path) -> None:
    """The file has no key for query_pre_attn_scalar: llama.cpp takes head_dim (16 here), where transformers'
    reader leaves its default, 256, and decoded other tokens than llama.cpp without a word."""
    from transformers import AutoModelForCausalLM

    folder, gguf = write_gemma2(tmp_path / "gemma2", tmp_path / "gemma2.gguf")
    loaded = load_model(str(gguf), "float32")
    assert loaded.lm.hf.config.query_pre_attn_scalar == 16
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)  # scalar 16, as llama.cpp
    prompt = [5, 70, 71, 72, 80, 81, 90, 91, 92, 100, 5, 70]  # token ids: the file's tokenizer is not the point
    expected = reference.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)[0, len(prompt):].tolist()
    from specsure import SamplingParams, make_engine

    got = make_engine(str(gguf), None, dtype="float32").generate(prompt, SamplingParams(max_tokens=8, ignore_eos=True))
    assert got[0].token_ids == expected


def test_a_qwen3_gguf_takes_its_head_width_from_the_file_as_llama_cpp_does(tmp_path: Path) -> None:
    """transformers' reader keeps Qwen3Config's head_dim of 128, so a Qwen3 with narrower heads did not load;
    qwen3.attention.key_length says 16, and the model decodes as its Hugging Face source."""
    folder, gguf = write_qwen3(tmp_path / "qwen3", tmp_path / "qwen3.gguf")
    assert load_model(str(gguf), "float32").lm.hf.config.head_dim == 16
    assert_decodes_as(folder, gguf)


def test_a_phi3_gguf_without_a_padding_token_gets_none_not_phi3s_default(tmp_path: Path) -> None:
    """transformers' reader gave Phi3Config's pad_token_id 32000 to a 290-token vocabulary, and the embedding
    refused it with a bare AssertionError; llama.cpp runs the file."""
    folder, gguf = write_phi3(tmp_path / "phi3", tmp_path / "phi3.gguf")
    assert load_model(str(gguf), "float32").lm.hf.config.pad_token_id is None
    assert_decodes_as(folder, gguf)


def test_a_longrope_phi3_gguf_rotates_with_the_files_factors(tmp_path: Path) -> None:
    """A 128k-context Phi-3 (Phi-3.5-mini, Phi-4-mini) keeps its LongRoPE factors in two tensors and
    its attention factor in the metadata, none of which transformers' reader reads: the model rotated as
    a plain RoPE one, fluent and wrong. It rotates as its Hugging Face source now."""
    folder, gguf = write_phi3(tmp_path / "phi3", tmp_path / "phi3.gguf", longrope=True)
    rope = load_model(str(gguf), "float32").lm.hf.config.rope_parameters
    assert rope["rope_type"] == "longrope" and rope["original_max_position_embeddings"] == 64
    assert rope["short_factor"][-1] == 8.0 and rope["long_factor"][-1] == 32.0
    assert_decodes_as(folder, gguf)


@pytest.mark.parametrize("short, long, original, other, message", [
    ([1.0] * 8, None, 64, None, "but not rope_factors_long.weight"),
    ([1.0] * 8, [1.0] * 6, 64, None, "rope_factors_long.weight is [6]"),
    ([1.0] * 8, [1.0] * 7 + [float("nan")], 64, None, "not a positive number"),
    ([1.0] * 8, [2.0] * 8, None, None, "no phi3.rope.scaling.original_context_length"),
    ([1.0] * 8, np.ones(8, dtype=np.float16), 64, None, "rope_factors_long.weight is [8] of GGML type F16;"),
    # Llama 3's scaling tensor beside LongRoPE's (no converter writes both), and per-layer-type parameters
    ([1.0] * 8, [2.0] * 8, 64, "freqs", "rope_freqs.weight beside rope_factors_long.weight, rope_factors_short"),
    ([1.0] * 8, [2.0] * 8, 64, "nested", "rope_factors_short.weight, on a model with per-layer-type rotary"),
])
def test_longrope_factors_that_do_not_fit_are_refused_by_name(tmp_path: Path, short: list[float],
                                                              long: list[float] | None, original: int | None,
                                                              other: str | None, message: str) -> None:
    import gguf as gguf_py

    from specsure.models.errors import ModelLoadError
    from specsure.models.gguf_rope import gguf_rope_parameters

    path = tmp_path / "phi3.gguf"
    writer = gguf_py.GGUFWriter(str(path), "phi3")
    writer.add_uint32("phi3.context_length", 256)
    if original is not None:
        writer.add_uint32("phi3.rope.scaling.original_context_length", original)
    writer.add_tensor("rope_factors_short.weight", np.array(short, dtype=np.float32))
    if long is not None:  # an array keeps its own type (F16 factors)
        writer.add_tensor("rope_factors_long.weight", long if isinstance(long, np.ndarray) else
                          np.array(long, dtype=np.float32))
    if other == "freqs":
        writer.add_tensor("rope_freqs.weight", np.ones(8, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    base: dict[str, Any] = {"rope_type": "default", "rope_theta": 10000.0}
    if other == "nested":  # Gemma 3's way: one set of parameters per layer type
        base = {"full_attention": dict(base), "sliding_attention": dict(base)}
    with pytest.raises(ModelLoadError, match=message.replace("[", r"\[").replace("]", r"\]")):
        gguf_rope_parameters(path, base, 16)


@pytest.mark.parametrize("keys, message", [
    ({"original_context_length": 0}, "original_context_length = 0, the context past which the long factors apply; "
                                     "it must be a positive token count"),
    ({"original_context_length": 512}, "original_context_length = 512 exceeds phi3.context_length = 256"),
    ({"context_length": None}, "no phi3.context_length, the context the long factors stretch to"),
    ({"attn_factor": float("nan")}, "phi3.rope.scaling.attn_factor = nan; it scales every rotary cos and sin"),
    ({"attn_factor": -1.0}, "phi3.rope.scaling.attn_factor = -1.0; it scales every rotary cos and sin"),
])
def test_longrope_metadata_that_does_not_fit_is_refused_by_name(tmp_path: Path, keys: dict[str, Any],
                                                                message: str) -> None:
    """transformers only warns about these (a NaN attention factor decoded token 0 forever)."""
    import gguf as gguf_py

    from specsure.models.errors import ModelLoadError
    from specsure.models.gguf_rope import gguf_rope_parameters

    values = {"context_length": 256, "original_context_length": 64, "attn_factor": 1.1, **keys}
    path = tmp_path / "phi3.gguf"
    writer = gguf_py.GGUFWriter(str(path), "phi3")
    for key in ("context_length", "original_context_length"):
        if values[key] is not None:
            writer.add_uint32(f"phi3.{'rope.scaling.' if key.startswith('original') else ''}{key}", values[key])
    writer.add_float32("phi3.rope.scaling.attn_factor", values["attn_factor"])
    for name in ("rope_factors_short.weight", "rope_factors_long.weight"):
        writer.add_tensor(name, np.ones(8, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelLoadError, match=message.replace(".", r"\.")):
        gguf_rope_parameters(path, {"rope_type": "default", "rope_theta": 10000.0}, 16)


def test_an_architecture_transformers_cannot_read_is_named_with_the_fix(hf: Path, tmp_path: Path) -> None:
    gguf = write_llama_gguf(hf, tmp_path / "olmo.gguf")
    data = gguf.read_bytes()
    # the same length, so the header's string length stays right: 'llama' -> 'olmoo'
    gguf.write_bytes(data.replace(b"general.architecture\x08\x00\x00\x00\x05\x00\x00\x00\x00\x00\x00\x00llama",
                                  b"general.architecture\x08\x00\x00\x00\x05\x00\x00\x00\x00\x00\x00\x00olmoo", 1))
    with pytest.raises(ModelLoadError) as err:
        load_model(str(gguf), "float32")
    text = str(err.value)
    assert "general.architecture = 'olmoo'" in text and "qwen3" in text and "Hugging Face folder" in text


def test_a_cache_that_cannot_be_written_is_named_with_the_fix(hf: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    gguf = write_llama_gguf(hf, tmp_path / "tiny.gguf")
    (tmp_path / "a-file").write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "a-file"))
    with pytest.raises(ModelLoadError, match=r"cannot be written \(Not a directory.*set XDG_CACHE_HOME to a folder"):
        load_model(str(gguf), "float32")


def test_a_context_length_of_zero_is_refused_not_read_as_no_limit(hf: Path, tmp_path: Path) -> None:
    gguf = write_llama_gguf(hf, tmp_path / "ctx0.gguf", metadata={"context_length": 0})
    with pytest.raises(ModelLoadError, match="llama.context_length = 0, a context of no tokens"):
        load_model(str(gguf), "float32")


def test_a_phi3_gguf_window_is_said_to_be_left_out_as_llama_cpp_leaves_it(tmp_path: Path,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    import gguf as gguf_py
    from transformers import Phi3Config

    from specsure.models.gguf_config import fit_to_file

    path = tmp_path / "phi3.gguf"
    writer = gguf_py.GGUFWriter(str(path), "phi3")
    writer.add_uint32("phi3.attention.sliding_window", 2047)  # Phi-3-mini-4k's, as llama.cpp's converter writes it
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    with caplog.at_level(logging.WARNING, logger="specsure.models.gguf_config"):
        config = fit_to_file(path, Phi3Config(vocab_size=96, hidden_size=64, num_attention_heads=4, pad_token_id=None))
    assert config.sliding_window is None
    assert "phi3.attention.sliding_window = 2047 is not applied: llama.cpp runs Phi-3 files without" in caplog.text
