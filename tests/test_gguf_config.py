"""What transformers' GGUF reader leaves at a config class's defaults, read from the file as llama.cpp does."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from specsure.models.errors import ModelLoadError
from specsure.models.gguf_config import fit_to_file, unsupported_architecture


def metadata_only(path: Path, arch: str, **keys: int | float) -> Path:
    """A GGUF file of metadata alone: ``{arch}.KEY`` for each of ``keys`` (an int as uint32)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in keys.items():
        name = f"{arch}.{key.replace('__', '.')}"
        (writer.add_uint32 if isinstance(value, int) else writer.add_float32)(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_rope_base_and_the_rotating_share_come_from_the_file(tmp_path: Path) -> None:
    """StarCoder2 and StableLM's rope base, and StableLM and Phi-3's rotating share, which the reader left at
    the class's defaults: the model rotated otherwise than llama.cpp, fluent and wrong."""
    path = metadata_only(tmp_path / "slm.gguf", "stablelm", rope__freq_base=1e6, rope__dimension_count=8)
    config = SimpleNamespace(hidden_size=64, num_attention_heads=4, head_dim=None,
                             rope_parameters={"rope_theta": 10000.0, "partial_rotary_factor": 0.25})
    fit_to_file(path, config)
    assert config.rope_parameters == {"rope_theta": 1e6, "partial_rotary_factor": 0.5}
    llama = SimpleNamespace(hidden_size=64, num_attention_heads=4, head_dim=16,
                            rope_parameters={"rope_theta": 10000.0})  # no share to set: the class rotates whole heads
    fit_to_file(metadata_only(tmp_path / "sc2.gguf", "starcoder2", rope__freq_base=1e5, rope__dimension_count=8),
                llama)
    assert llama.rope_parameters == {"rope_theta": 1e5}


def test_sizes_the_reader_drops_come_from_the_file(tmp_path: Path) -> None:
    gpt2 = SimpleNamespace(n_positions=1024, pad_token_id=None)
    fit_to_file(metadata_only(tmp_path / "gpt2.gguf", "gpt2", context_length=256), gpt2)
    moe = SimpleNamespace(moe_intermediate_size=1408, shared_expert_intermediate_size=5632, pad_token_id=None)
    fit_to_file(metadata_only(tmp_path / "moe.gguf", "qwen2moe", expert_feed_forward_length=32,
                              expert_shared_feed_forward_length=64), moe)
    assert (gpt2.n_positions, moe.moe_intermediate_size, moe.shared_expert_intermediate_size) == (256, 32, 64)


def test_a_layout_the_reader_misreads_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="falcon.attention.head_count_kv = 2, Falcon-40B's"):
        fit_to_file(metadata_only(tmp_path / "f40.gguf", "falcon", attention__head_count_kv=2), SimpleNamespace())
    fit_to_file(metadata_only(tmp_path / "f7.gguf", "falcon", attention__head_count_kv=1), SimpleNamespace())
    text = unsupported_architecture(metadata_only(tmp_path / "deci.gguf", "deci"))
    assert "general.architecture = 'deci'" in text and "deci," not in text and "llama" in text
