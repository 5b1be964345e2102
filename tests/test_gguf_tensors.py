"""Converting a GGUF tensor by tensor (gguf_tensors.py) writes the folder transformers' own reader writes,
bit for bit, for every architecture it runs for, in one file or in shards, and refuses the same faults."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gguf_models import byte_bpe_tokenizer, tiny_llama_gguf, write_gemma2, write_gemma3, write_llama_gguf, write_phi3, write_qwen2, write_qwen3
from specsure.models import gguf_conversion, gguf_tensors
from specsure.models.errors import ModelLoadError
from specsure.models.loading import load_model
from tiny import build_tiny_llama

QUANTISED = {"blk.0.attn_q.weight": "Q4_0", "blk.0.ffn_down.weight": "Q8_0", "blk.1.attn_k.weight": "Q4_1"}


def _llama(root: Path) -> Path:
    return tiny_llama_gguf(root, "llama", QUANTISED)


def _tied_llama(root: Path) -> Path:
    return tiny_llama_gguf(root, "tied", tie=True, skip=("output.weight",))


FAMILIES: dict[str, Callable[[Path], Path]] = {
    "llama": _llama,
    "llama, tied": _tied_llama,
    "llama, F16 and BF16": lambda root: tiny_llama_gguf(root, "halves", {"blk.0.attn_v.weight": "F16",
                                                                        "blk.1.ffn_up.weight": "BF16"}),
    "qwen2": lambda root: write_qwen2(root / "qwen2", root / "qwen2.gguf")[1],
    "qwen3": lambda root: write_qwen3(root / "qwen3", root / "qwen3.gguf")[1],
    "gemma2": lambda root: write_gemma2(root / "gemma2", root / "gemma2.gguf")[1],
    "gemma3": lambda root: write_gemma3(root / "gemma3", root / "gemma3.gguf")[1],
    "phi3": lambda root: write_phi3(root / "phi3", root / "phi3.gguf", quantize={"blk.0.attn_qkv.weight": "Q8_0"})[1],
}


def _convert(gguf: Path, out: Path, streamed: bool, monkeypatch: pytest.MonkeyPatch) -> dict[str, torch.Tensor]:
    with monkeypatch.context() as patch:
        if not streamed:
            patch.setattr(gguf_conversion, "streams", lambda _architecture: False)
        out.mkdir()
        gguf_conversion.write_conversion(gguf, out)
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(out.glob("*.safetensors")):
        tensors.update(load_file(shard))
    return tensors


def _json(path: Path) -> dict:
    data = json.loads(path.read_text())
    data.pop("transformers_version", None)
    return data


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_streamed_conversion_is_transformers_own_bit_for_bit(family: str, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    gguf = FAMILIES[family](tmp_path)
    from specsure.config.gguf_header import read_gguf_metadata
    assert gguf_tensors.streams(read_gguf_metadata(str(gguf))["general.architecture"])
    theirs = _convert(gguf, tmp_path / "theirs", False, monkeypatch)
    monkeypatch.setattr(gguf_tensors, "SHARD_BYTES", 40_000)  # several shards, and tensors larger than one
    monkeypatch.setattr(gguf_tensors, "PIECE_BYTES", 1_000)  # tensors de-quantised a few rows at a time
    ours = _convert(gguf, tmp_path / "ours", True, monkeypatch)
    assert sorted(ours) == sorted(theirs)
    for name, tensor in theirs.items():
        assert ours[name].dtype == torch.float32 and torch.equal(ours[name].view(torch.int32), tensor.view(torch.int32)), name
    assert len(list((tmp_path / "ours").glob("model-*-of-*.safetensors"))) > 1
    index = json.loads((tmp_path / "ours" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(ours) and index["metadata"]["total_size"] == 4 * sum(t.numel() for t in ours.values())
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert _json(tmp_path / "ours" / name) == _json(tmp_path / "theirs" / name), name


def test_a_streamed_conversion_in_shards_decodes_as_one_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    gguf = _llama(tmp_path)
    one = load_model(str(gguf), dtype="float32")
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    expected = one.lm.hf(ids).logits
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache2"))
    monkeypatch.setattr(gguf_tensors, "SHARD_BYTES", 40_000)
    sharded = load_model(str(gguf), dtype="float32")
    assert len(list(Path(sharded.path).glob("model-*.safetensors"))) > 1
    assert torch.equal(sharded.lm.hf(ids).logits, expected)


def test_a_tensor_of_the_wrong_shape_is_refused_naming_it(tmp_path: Path) -> None:
    import numpy as np

    # the metadata says 64 wide, the file's norm has 60 entries
    gguf = tiny_llama_gguf(tmp_path, "odd", skip=("blk.0.attn_norm.weight",), tensors={"blk.0.attn_norm.weight": np.ones(60)})
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ModelLoadError, match=r"model\.layers\.0\.input_layernorm\.weight is \[60\] in the file but \[64\]"):
        gguf_conversion.write_conversion(gguf, out)


def test_a_missing_tensor_is_refused_naming_it(tmp_path: Path) -> None:
    gguf = tiny_llama_gguf(tmp_path, "short", skip=("blk.1.ffn_up.weight",))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ModelLoadError, match=r"lacks 1 tensor\(s\) its architecture needs \(model\.layers\.1\.mlp\.up_proj"):
        gguf_conversion.write_conversion(gguf, out)


def test_a_llama_file_without_a_kv_head_count_decodes_as_its_source(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """llama.cpp reads a missing head_count_kv as head_count; transformers' reader then left the q and k
    rows in llama.cpp's order, a model that decodes nonsense without an error."""
    import gguf
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    folder = build_tiny_llama(tmp_path / "mha", vocab_size=300, hidden_size=64, tie=False,
                              extra_config={"num_key_value_heads": 4})
    byte_bpe_tokenizer(folder, 300)
    add = gguf.GGUFWriter.add_uint32
    with monkeypatch.context() as patch:
        patch.setattr(gguf.GGUFWriter, "add_uint32",
                      lambda writer, key, value: None if key == "llama.attention.head_count_kv" else add(writer, key, value))
        path = write_llama_gguf(folder, tmp_path / "mha.gguf")
    from specsure.config.gguf_header import read_gguf_metadata
    assert "llama.attention.head_count_kv" not in read_gguf_metadata(str(path))
    ids = torch.tensor([[5, 17, 33, 90, 4, 12]])
    expected = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)(ids).logits
    assert torch.equal(load_model(str(path), dtype="float32").lm.hf(ids).logits, expected)


@pytest.mark.parametrize("where", ["shard", "index"])
def test_a_full_disk_while_the_conversion_writes_is_a_full_disk(where: str, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Not "transformers could not read the GGUF file": the CLI's guard names a full disk (exit 1)."""
    import errno

    def full(*_args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(gguf_tensors, "SHARD_BYTES", 40_000)
    if where == "shard":
        monkeypatch.setattr(gguf_tensors._ShardFile, "write", full)
    else:
        monkeypatch.setattr(gguf_conversion, "write_index", full)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(OSError) as raised:
        gguf_conversion.write_conversion(tiny_llama_gguf(tmp_path, "full"), out)
    assert raised.value.errno == errno.ENOSPC and not isinstance(raised.value, ModelLoadError)


def test_head_counts_written_as_one_layer_arrays_read_as_their_value(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A one-layer file may give its head counts as per-layer arrays; the q and k rows still come out in
    transformers' order (the header reader gives an array's length, not its values)."""
    import gguf

    folder = build_tiny_llama(tmp_path / "one", vocab_size=300, hidden_size=64, num_layers=1, tie=False)
    byte_bpe_tokenizer(folder, 300)
    add = gguf.GGUFWriter.add_uint32
    arrays = ("llama.attention.head_count", "llama.attention.head_count_kv")
    with monkeypatch.context() as patch:
        patch.setattr(gguf.GGUFWriter, "add_uint32", lambda writer, key, value: writer.add_array(key, [value])
                      if key in arrays else add(writer, key, value))
        path = write_llama_gguf(folder, tmp_path / "one.gguf")
    ours = _convert(path, tmp_path / "ours", True, monkeypatch)
    source = load_file(folder / "model.safetensors")
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight"):
        assert torch.equal(ours[name], source[name]), name
