"""dtype 'auto': float32 for a GGUF target whose layers the float32 kernel reads as blocks (faster than
bf16 even where bf16 is fast), bf16 on a CPU with fast bf16 otherwise, float32 elsewhere; each
choice says why, and loading and resolution choose alike."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gguf_models import byte_bpe_tokenizer, write_llama_gguf
from specsure.config import dtype_choice, shipped
from specsure.config.checkpoint import CheckpointInfo
from specsure.config.dtype_choice import auto_dtype, run_dtype
from specsure.models import float_kernel as float_kernels
from specsure.models.dtypes import resolve_dtype
from specsure.models.loading import load_model
from tiny import build_tiny_llama

VOCAB = 300
LAYER = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
AMX = "flags\t\t: fpu sse avx2 fma avx512f avx512_bf16 amx_bf16\n"


def _gguf(factory: pytest.TempPathFactory, name: str, types: dict[str, str]) -> Path:
    root = factory.mktemp(name)
    folder = build_tiny_llama(root / "llama", vocab_size=VOCAB, hidden_size=64)
    byte_bpe_tokenizer(folder, VOCAB)
    return write_llama_gguf(folder, root / f"{name}.gguf", quantize=types)


@pytest.fixture(scope="module")
def quantised(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Layer 0 in Q4_1, layer 1 in Q8_0 but its down projection float32: 13 of 14 matrices as blocks."""
    types = {f"blk.0.{n}.weight": "Q4_1" for n in LAYER} | {f"blk.1.{n}.weight": "Q8_0" for n in LAYER[:-1]}
    return _gguf(tmp_path_factory, "tiny-q", types)


@pytest.fixture(scope="module")
def mostly_float(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _gguf(tmp_path_factory, "tiny-f", {"blk.0.attn_q.weight": "Q8_0"})


@pytest.fixture()
def cpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """cpuinfo files for an AMX CPU, an AVX-512 one without fast bf16 nor AVX2 (made up), and an AVX2 one."""
    for name in ("SPECSURE_KERNEL", "SPECSURE_GGUF_BLOCKS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(dtype_choice, "c_compiler", lambda: "cc")
    files = {"amx": AMX, "no-avx2": "flags\t\t: fpu sse avx512f avx512_bf16\n", "avx2": "flags\t\t: fpu sse avx2 fma\n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return {name: tmp_path / name for name in files}


def test_a_gguf_of_blocks_runs_float32_even_where_bf16_is_fast(quantised: Path, cpus: dict[str, Path]) -> None:
    name, why = auto_dtype(quantised, cpus["amx"])
    assert name == "float32"
    assert why.startswith("dtype='auto' chose float32 although this CPU has fast bf16 (avx512_bf16, amx_bf16): ")
    assert "tiny-q.gguf holds 13 of its 14 layer weight matrices as blocks (7 Q4_1, 6 Q8_0)" in why
    assert "pass dtype='bfloat16'" in why
    assert resolve_dtype("auto", gguf=quantised, cpuinfo=cpus["amx"]) == (torch.float32, why)
    assert auto_dtype(quantised, cpus["avx2"])[0] == "float32"  # no fast bf16: float32 as before
    assert "reports no fast bf16" in auto_dtype(quantised, cpus["avx2"])[1]


def test_bf16_stays_where_the_kernel_would_not_read_blocks(quantised: Path, mostly_float: Path, tmp_path: Path,
                                                           cpus: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    def bf16(gguf: Path | None, cpu: str = "amx") -> str:
        name, why = auto_dtype(gguf, cpus[cpu])
        assert name == "bfloat16" and why.startswith("dtype='auto' chose bfloat16 because this CPU has fast bf16 "), why
        return why

    assert bf16(None).endswith("(avx512_bf16, amx_bf16).")  # a folder of safetensors
    assert "tiny-f.gguf as blocks: only 1 of its 14 layer weight matrices are in block formats" in bf16(mostly_float)
    assert "this CPU lacks avx2, fma" in bf16(quantised, "no-avx2")
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF\x03\x00")
    assert "broken.gguf as blocks: its header cannot be read" in bf16(broken)
    import gguf

    other = tmp_path / "qwen.gguf"
    writer = gguf.GGUFWriter(str(other), "qwen2")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    assert "the kernel reads blocks for llama only, not qwen2" in bf16(other)
    monkeypatch.setenv("SPECSURE_GGUF_BLOCKS", "0")
    assert "SPECSURE_GGUF_BLOCKS=0 keeps float32 weights" in bf16(quantised)
    monkeypatch.setenv("SPECSURE_KERNEL", "0")
    assert "SPECSURE_KERNEL=0 turns the C kernel off" in bf16(quantised)
    monkeypatch.delenv("SPECSURE_KERNEL")
    monkeypatch.delenv("SPECSURE_GGUF_BLOCKS")
    monkeypatch.setattr(dtype_choice, "c_compiler", lambda: None)
    assert "no C compiler (cc or gcc) is on PATH" in bf16(quantised)


def test_loading_with_auto_makes_the_same_choice_and_reads_the_blocks(quantised: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    loaded = load_model(str(quantised), "auto")
    name, why = auto_dtype(quantised)
    assert loaded.lm.dtype == getattr(torch, name) and loaded.dtype_reason == why
    if name == "float32" and float_kernels.load()[0] is not None:
        assert loaded.lm.blocks_used == {"Q4_1": 4, "Q8_0": 3}  # the fused q|k|v and gate|up count once
    assert load_model(str(quantised), "bfloat16").lm.dtype == torch.bfloat16  # explicit: never replaced


@pytest.mark.parametrize("kernel", [True, False])
def test_the_shipped_heads_tree_follows_the_dtype_auto_runs(kernel: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shipped, "cpu_bf16_flags", lambda: ("amx_bf16",))
    monkeypatch.setattr(shipped, "auto_dtype", lambda gguf: ("float32" if kernel else "bfloat16", ""))
    tree, why = shipped.shipped_tree("mtp", "auto")
    if kernel:
        assert tree == shipped.TREE_FLOAT32 and "float32 on its GGUF's blocks" in why and "(amx_bf16)" in why
    else:
        assert tree == shipped.TREE_FAST_BF16 and "dtype 'auto' runs bfloat16 there" in why
    assert shipped.shipped_tree("mtp", "bfloat16")[0] == shipped.TREE_FAST_BF16  # explicit bf16: the bf16 tree


def test_explain_and_loading_weigh_the_same_file(quantised: Path, tmp_path: Path) -> None:
    """A GGUF target's own file, a folder's none (a converted folder keeps the CPU's choice)."""
    assert run_dtype(CheckpointInfo(path=str(quantised), kind="gguf"), "auto") == auto_dtype(quantised)
    assert run_dtype(CheckpointInfo(path=str(tmp_path), kind="hf_dir"), "auto") == auto_dtype(None)
    assert run_dtype(CheckpointInfo(path=str(quantised), kind="gguf"), "bfloat16") == (
        "bfloat16", "dtype='bfloat16' was given explicitly.")
