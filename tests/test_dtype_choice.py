"""dtype 'auto': float32 for a GGUF target whose layers the float32 kernel reads as blocks (faster than
bf16 even where bf16 is fast), bf16 on a CPU with fast bf16 otherwise, float32 elsewhere; each
choice says why, and loading and resolution choose alike."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gguf_models import byte_bpe_tokenizer, write_llama_gguf
from specsure.config import dtype_choice, resolve, shipped
from specsure.config.checkpoint import CheckpointInfo
from specsure.config.dtype_choice import auto_dtype, run_dtype
from specsure.models import float_kernel as float_kernels
from specsure.models.dtypes import resolve_dtype
from specsure.models import loading
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

    other = tmp_path / "stablelm.gguf"
    writer = gguf.GGUFWriter(str(other), "stablelm")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    assert "the kernel reads blocks for llama, phi3, qwen2, qwen3, gemma2, gemma3 only, not stablelm" in bf16(other)
    monkeypatch.setenv("SPECSURE_GGUF_BLOCKS", "0")
    assert "SPECSURE_GGUF_BLOCKS=0 keeps float32 weights" in bf16(quantised)
    loaded_kernel = auto_dtype(quantised, cpus["amx"], kernel_missing=lambda: "")  # as loading asks: still bf16
    assert loaded_kernel[0] == "bfloat16" and "SPECSURE_GGUF_BLOCKS=0" in loaded_kernel[1]
    monkeypatch.setenv("SPECSURE_KERNEL", "0")
    assert "SPECSURE_KERNEL=0 turns the C kernel off" in bf16(quantised)
    monkeypatch.delenv("SPECSURE_KERNEL")
    monkeypatch.delenv("SPECSURE_GGUF_BLOCKS")
    monkeypatch.setattr(dtype_choice, "c_compiler", lambda: None)
    assert "no C compiler (cc or gcc) is on PATH" in bf16(quantised)


def test_loading_with_auto_on_a_fast_bf16_cpu_reads_the_blocks(quantised: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The new path on any host: the CPU's flags faked as an AMX one's; float32 only if the kernel built."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for module in (dtype_choice, loading):
        monkeypatch.setattr(module, "cpu_bf16_flags", lambda cpuinfo=None: ("amx_bf16",))
    loaded = load_model(str(quantised), "auto")
    kernel, why = float_kernels.load()
    if kernel is not None:
        assert loaded.lm.dtype == torch.float32 and "chose float32 although this CPU has fast bf16" in loaded.dtype_reason
        assert loaded.lm.blocks_used == {"Q4_1": 4, "Q8_0": 3}  # the fused q|k|v and gate|up count once
    else:  # never float32 without the kernel that makes it pay
        assert loaded.lm.dtype == torch.bfloat16 and "the float32 kernel would not read" in loaded.dtype_reason, why
    assert load_model(str(quantised), "bfloat16").lm.dtype == torch.bfloat16  # explicit: never replaced


def test_explain_and_loading_name_the_same_file(quantised: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Through ~, a relative path and a symlink both sides weigh the resolved file, and say the same."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "link.gguf").symlink_to(quantised)
    monkeypatch.chdir(tmp_path)
    for given in ("~/link.gguf", "link.gguf", str(tmp_path / "link.gguf")):
        assert dtype_choice.target_gguf(given) == quantised.resolve()
        target = resolve({"method": "ngram"}, model=given).target
        assert run_dtype(target, "auto") == auto_dtype(quantised.resolve())
    assert dtype_choice.target_gguf(str(tmp_path)) is None  # a folder: its dtype is the CPU's
    assert run_dtype(CheckpointInfo(path=str(tmp_path), kind="hf_dir"), "auto") == auto_dtype(None)
    assert run_dtype(CheckpointInfo(path="x.gguf", kind="gguf"), "bfloat16") == (
        "bfloat16", "dtype='bfloat16' was given explicitly.")
    name, why = run_dtype(resolve({"method": "ngram"}, model="~/link.gguf").target, "auto")
    loaded = load_model("~/link.gguf", "auto", release_weights=True)  # as make_engine loads it
    if float_kernels.load()[0] is not None:  # else explain cannot know that the build fails
        assert (str(loaded.lm.dtype).removeprefix("torch."), loaded.dtype_reason) == (name, why)


def test_an_engine_weighs_its_blocks_not_the_float32_weights_they_replace(quantised: Path, tmp_path: Path,
                                                                          cpus: dict[str, Path]) -> None:
    """An engine holds the blocks and the float32 tensors no block replaces (early_blocks.py): memory
    between that and the whole float32 model runs an engine in float32 and any other load in bf16."""
    found = dtype_choice.gguf_blocks(quantised)
    engine_bytes = found.block_bytes + 4 * (found.parameters - found.blocked)
    assert 0 < found.blocked < found.parameters and 0 < found.block_bytes < found.blocked  # under a byte a weight
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemAvailable: {(engine_bytes + 4 * found.parameters) // 1024} kB\n")  # twice the mean
    name, why = auto_dtype(quantised, cpus["amx"], meminfo=meminfo)
    assert name == "float32" and "an engine holds those matrices as blocks only" in why
    name, why = auto_dtype(quantised, cpus["amx"], meminfo=meminfo, engine=False)
    assert name == "bfloat16" and "its float32 weights" in why and "kept beside the blocks" in why


def test_a_model_too_large_for_float32_beside_its_blocks_stays_bf16(quantised: Path, tmp_path: Path,
                                                                     cpus: dict[str, Path]) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       1000 kB\nMemAvailable:      100 kB\n")
    name, why = auto_dtype(quantised, cpus["amx"], meminfo=meminfo, engine=False)
    assert name == "bfloat16"
    assert "its float32 weights (0.0 GiB, kept beside the blocks) would take more than half the memory available" in why
    name, why = auto_dtype(quantised, cpus["amx"], meminfo=meminfo)  # an engine's: the blocks and the rest
    assert name == "bfloat16"
    assert "its blocks and the float32 weights no block replaces (0.0 GiB) would take more than half" in why
    assert auto_dtype(quantised, cpus["amx"], meminfo=tmp_path / "none")[0] == "float32"  # unreadable: no limit
    name, why = auto_dtype(quantised, cpus["amx"], kernel_missing=lambda: "the C kernel did not build or load: boom")
    assert name == "bfloat16" and why.endswith("as blocks: the C kernel did not build or load: boom.")


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


def test_a_kernel_that_fails_to_build_leaves_bf16_and_the_bf16_tree(monkeypatch: pytest.MonkeyPatch) -> None:
    """The config layer expected the float32 kernel (flags, a compiler); its build failed at load: the
    engine runs bf16 and resolves the shipped head's tree again for it."""
    from specsure.decode.engine import make_engine
    from specsure.models import dtypes

    for module in (dtype_choice, loading, shipped):
        monkeypatch.setattr(module, "cpu_bf16_flags", lambda cpuinfo=None: ("amx_bf16",))
    monkeypatch.setattr(dtype_choice, "_kernel_missing", lambda cpuinfo: "")
    monkeypatch.setattr(dtypes, "_float_kernel_missing", lambda: "the C kernel did not build or load: boom")
    assert shipped.shipped_tree("mtp", "auto")[0] == shipped.TREE_FLOAT32  # what resolution expects
    engine = make_engine(None, {"method": "mtp"})
    assert engine.target.lm.dtype == torch.bfloat16 and "boom" in engine.target.dtype_reason
    assert engine.resolution.config.speculative_token_tree == shipped.TREE_FAST_BF16
