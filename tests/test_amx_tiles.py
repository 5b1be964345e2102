"""Q4_0 and Q4_1 matrices (float_kernel.c's A4) and Q8_0 ones (A8) on AMX tiles, on a CPU whose Linux grants them:
float32-accurate products whose rows do not depend on each other, so a verify row still equals the
decode step and greedy speculative decoding still equals plain decoding bit for bit. Where there
are no tiles, the tile code still compiles and nothing is packed for them."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from gguf_models import byte_bpe_tokenizer, quantised, write_llama_gguf
from specsure.config.dtype_choice import c_compiler
from specsure.models import float_kernel as float_kernels
from specsure.models import gguf_blocks
from specsure.models.loading import load_model
from tiny import build_tiny_llama

TYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 8}
NO_TILES = "no AMX tiles here (a CPU without AMX, Linux refused them, or the AMX build failed)"
EPS = float(np.finfo(np.float32).eps)


def _tiled_kernel() -> float_kernels.FloatKernel:
    kernel, _ = float_kernels.load()
    if kernel is None or not kernel.amx:
        pytest.skip(NO_TILES)
    return kernel


def test_the_tile_code_compiles_on_any_machine_with_a_compiler() -> None:
    cc = c_compiler()
    if cc is None:
        pytest.skip("no C compiler")
    flags = [*float_kernels.FLAGS, *float_kernels.WIDE_FLAGS, *float_kernels.AMX_FLAGS]
    done = subprocess.run([cc, *flags, "-fsyntax-only", str(float_kernels.SOURCE)], capture_output=True, text=True,
                          timeout=120)
    # an old compiler without the AMX options is the one acceptable failure: the loader then builds without them
    assert done.returncode == 0 or "amx" in done.stderr, done.stderr


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("cols", [96, 256, 576])  # 3 blocks (an odd last one), 8, 18
def test_tile_products_are_float32_accurate_and_row_invariant(name: str, cols: int) -> None:
    kernel = _tiled_kernel()
    matrix = gguf_blocks.repack(quantised(name, 48, cols, seed=3), TYPES[name], cols)
    tiled = kernel.amx_pack(matrix)
    packing = gguf_blocks.A8 if name == "Q8_0" else gguf_blocks.A4
    assert tiled is not None and (tiled.format, tiled.rows, tiled.cols) == (packing, 48, cols)
    torch.manual_seed(1)
    x, bias = torch.randn(40, cols), torch.randn(48)
    weight = matrix.dequantized().double()
    exact = x.double() @ weight.T + bias.double()
    scale = x.double().abs() @ weight.abs().T + bias.double().abs()
    together = kernel.linear_blocks(tiled, x, bias)
    # float32 sums of exact products: well inside the naive bound of cols roundings
    assert bool(((together.double() - exact).abs() <= 4 * EPS * scale + 1e-30).all())
    for rows in (1, 2, 3, 5, 8, 15, 16, 17, 33, 40):  # one tile pass, several, and a partial last one
        assert torch.equal(kernel.linear_blocks(tiled, x[:rows].contiguous(), bias), together[:rows]), rows
        alone = kernel.linear_blocks(tiled, x[rows - 1:rows].contiguous(), bias)
        assert torch.equal(alone[0], together[rows - 1]), rows


@pytest.mark.parametrize("name", ["Q4_1", "Q8_0"])
def test_tile_products_are_the_same_on_two_threads(name: str) -> None:
    # conftest runs tests on one thread; each thread's tiles and buffers are its own, so two threads
    # splitting the weight rows must give the one-thread bits
    kernel = _tiled_kernel()
    tiled = kernel.amx_pack(gguf_blocks.repack(quantised(name, 1024, 2048, seed=4), TYPES[name], 2048))
    torch.manual_seed(2)
    x = torch.randn(20, 2048)
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            results.append([kernel.linear_blocks(tiled, x[:rows].contiguous()) for rows in (1, 3, 5, 8, 20)])
    finally:
        torch.set_num_threads(before)
    for one, two in zip(*results):
        assert torch.equal(one, two)


@pytest.mark.parametrize("name", ["Q4_0", "Q8_0"])
def test_a_tiled_matrix_is_not_dequantised(name: str) -> None:
    kernel = _tiled_kernel()
    tiled = kernel.amx_pack(gguf_blocks.repack(quantised(name, 16, 64), TYPES[name], 64))
    with pytest.raises(ValueError, match="AMX tiles"):
        tiled.dequantized()


def test_only_q4_and_q8_0_matrices_of_whole_tiles_are_packed() -> None:
    kernel = _tiled_kernel()
    assert kernel.amx_pack(gguf_blocks.repack(quantised("Q5_1", 32, 64), 7, 64)) is None  # Q8_M blocks
    assert kernel.amx_pack(gguf_blocks.repack(quantised("Q4_1", 40, 64), 3, 64)) is None  # 40 rows: not 16s
    assert kernel.amx_pack(gguf_blocks.repack(quantised("Q8_0", 40, 64), 8, 64)) is None
    off = float_kernels.FloatKernel(kernel.library, amx=False)
    assert off.amx_pack(gguf_blocks.repack(quantised("Q4_1", 32, 64), 3, 64)) is None


@pytest.fixture(scope="module")
def q4_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama whose layers are Q4_1 and Q4_0 (hidden 96: three blocks a row, an odd one last) and
    whose LM head is Q8_0 (304 rows: 19 tiles' worth)."""
    root = tmp_path_factory.mktemp("q4")
    folder = build_tiny_llama(root / "llama", vocab_size=304, hidden_size=96, tie=False)
    byte_bpe_tokenizer(folder, 304)
    types = {f"blk.{layer}.{name}.weight": "Q4_1" if layer == 0 else "Q4_0" for layer in (0, 1)
             for name in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")}
    types["output.weight"] = "Q8_0"
    return write_llama_gguf(folder, root / "q4.gguf", quantize=types)


def test_a_q4_gguf_on_tiles_decodes_as_its_verify_rows_do(q4_gguf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _tiled_kernel()
    monkeypatch.setenv("XDG_CACHE_HOME", str(q4_gguf.parent / "cache"))
    lm = load_model(str(q4_gguf), dtype="float32").lm
    assert lm.path.endswith("as the GGUF's blocks (9 of them on AMX tiles)"), lm.path  # the LM head too
    with pytest.MonkeyPatch.context() as patch:  # the same file on the AVX-512 products, for comparison
        patch.setenv(float_kernels.AMX_ENV, "0")
        patch.setattr(float_kernels, "_loaded", float_kernels._load())
        products = load_model(str(q4_gguf), dtype="float32").lm
    assert products.tiled_matrices == 0
    prompt = [5, 17, 33, 90, 4, 12, 250, 8]
    a, b = lm.forward(prompt, last_logits=1), products.forward(prompt, last_logits=1)
    for _ in range(24):  # two float32 sums in another order: close, and one decode step per token
        torch.testing.assert_close(a.logits, b.logits, atol=1e-4, rtol=1e-4)
        token = int(a.logits[-1].argmax())
        a, b = lm.forward([token]), products.forward([token])
    for rows in (3, 9, 20):  # a verify forward: each row the one-row step's bits
        start = lm.cache_len
        ids = [int(t) for t in torch.randint(3, 300, (rows,))]
        together = lm.forward(ids).logits
        lm.crop(start)
        for i, token in enumerate(ids):
            assert torch.equal(lm.forward([token]).logits[0], together[i])
