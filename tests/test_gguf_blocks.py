"""A GGUF target's quantised weights (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) read as their
blocks by the float32 kernel: the same values as gguf-py dequantises, the same bits as the float32
weights in every product, forward and decoded token; a matrix that would differ, or a file that
cannot be read, leaves the float32 weights in use and says so. Without AVX2 there is no float32
kernel, so these tests skip; test_float_kernel.py checks that the model's path then says why."""

from __future__ import annotations

import shutil
from typing import Any
from pathlib import Path

import numpy as np
import pytest
import torch

from gguf_models import byte_bpe_tokenizer, quantised, write_gemma2, write_gemma3, write_llama_gguf, write_qwen2, write_qwen3
from specsure.models import float_kernel as float_kernels
from specsure.models import gguf_blocks
from specsure.models.loading import load_model
from tiny import build_tiny_llama

VOCAB = 300
NO_KERNEL = "no float32 C kernel on this machine (AVX2, FMA and a C compiler), so nothing reads blocks"
TYPES = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
MIXED = {  # GGUF name -> type: layer 0 all Q4_1, layer 1 mixed (its q|k|v widened to Q8_X, its down float32)
    **{f"blk.0.{n}.weight": "Q4_1" for n in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                                             "ffn_down")},
    "blk.1.attn_q.weight": "Q8_0", "blk.1.attn_k.weight": "Q4_0", "blk.1.attn_v.weight": "Q4_0",
    "blk.1.attn_output.weight": "Q4_0", "blk.1.ffn_gate.weight": "Q8_0", "blk.1.ffn_up.weight": "Q8_0",
    "output.weight": "Q8_0",
}
def _gguf(factory: pytest.TempPathFactory, name: str, hidden: int, types: dict[str, str], tie: bool = False) -> Path:
    root = factory.mktemp(name)
    folder = build_tiny_llama(root / "llama", vocab_size=VOCAB, hidden_size=hidden, tie=tie)
    byte_bpe_tokenizer(folder, VOCAB)
    return write_llama_gguf(folder, root / f"{name}.gguf", quantize=types)


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _gguf(tmp_path_factory, "tiny-mixed", 64, MIXED)


K_MIXED = {  # a Q4_K_M-like mix: q|k Q4_K with v Q6_K (q|k|v widened to Q8_X), Q5_K and Q6_K elsewhere
    **{f"blk.0.{n}.weight": "Q4_K" for n in ("attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up")},
    "blk.0.attn_v.weight": "Q6_K", "blk.0.ffn_down.weight": "Q5_K",
    **{f"blk.1.{n}.weight": "Q6_K" for n in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                                             "ffn_down")},
    "output.weight": "Q6_K",
}


@pytest.fixture(scope="module")
def k_gguf_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _gguf(tmp_path_factory, "tiny-k", 256, K_MIXED)


@pytest.fixture(scope="module", autouse=True)
def _no_amx_tiles():
    """These tests hold the blocks to the float32 rows' bits, which the AVX-512 products keep and the
    AMX tiles do not (their sums round in another order); test_amx_tiles.py checks the tiles."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(float_kernels.AMX_ENV, "0")
        patch.setattr(float_kernels, "_loaded", float_kernels._load())
        yield


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.mark.parametrize("name", TYPES)
def test_blocks_dequantise_to_gguf_pys_values(name: str) -> None:
    import gguf

    raw = quantised(name, 12, 512, seed=1)
    expected = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[name])
    matrix = gguf_blocks.repack(raw, TYPES[name], 512)
    assert matrix is not None and (matrix.rows, matrix.cols, matrix.kind) == (12, 512, name)
    assert torch.equal(matrix.dequantized(), torch.from_numpy(expected.astype(np.float32)))


def _float_builds(monkeypatch: pytest.MonkeyPatch) -> list[float_kernels.FloatKernel]:
    """The float32 kernel's builds to check: the loaded one, and on an AVX-512 CPU the AVX2 one too,
    which AVX2-only CPUs run (skips without a kernel)."""
    kernel, _ = float_kernels.load()
    if kernel is None:
        pytest.skip(NO_KERNEL)
    builds = [kernel]
    if float_kernels.wide():
        monkeypatch.setenv(float_kernels.LANES_ENV, "8")
        builds.append(float_kernels._load()[0])
    return builds


@pytest.mark.parametrize("name", TYPES)
def test_rows_looked_up_in_the_blocks_are_their_dequantised_bits(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    builds = _float_builds(monkeypatch)
    matrix = gguf_blocks.repack(quantised(name, 40, 256, seed=2), TYPES[name], 256)
    weight = matrix.dequantized()
    ids = torch.tensor([[39, 0, 7], [7, 21, 38]])  # any shape, repeats, both ends
    for build in builds:  # signed zeros included (a Q4_0 zero keeps its scale's sign)
        assert torch.equal(build.dequantized_rows(matrix, ids).view(torch.int32), weight[ids].view(torch.int32))
        assert build.dequantized_rows(matrix, torch.tensor([], dtype=torch.long)).shape == (0, 256)
        assert torch.equal(build.dequantized_rows(matrix, ids.int()), weight[ids])  # int32 ids read as int64


def test_a_type_the_kernel_does_not_read_is_not_repacked() -> None:
    assert gguf_blocks.repack(np.zeros((4, 84), dtype=np.uint8), 10, 256) is None  # Q2_K
    assert gguf_blocks.repack(np.zeros((4, 34), dtype=np.uint8), 8, 48) is None  # a width not of whole blocks


@pytest.mark.parametrize("name", TYPES)
def test_block_products_are_the_float32_products_bits(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    builds = _float_builds(monkeypatch)
    torch.manual_seed(0)
    matrix = gguf_blocks.repack(quantised(name, 70, 256), TYPES[name], 256)  # 70 rows: a partial block of rows
    weight, bias = matrix.dequantized().contiguous(), torch.randn(70)
    x = torch.randn(64, 256)
    for build in builds:
        for rows in (1, 2, 3, 4, 5, 6, 7, 8, 13, 16, 64):  # direct passes, and unpacked ones (from 6 rows, 16 on AVX-512)
            got = build.linear_blocks(matrix, x[:rows].contiguous(), bias)
            assert torch.equal(got, build.linear_rows(weight, x[:rows].contiguous(), bias)), rows
            assert torch.equal(got[rows - 1], build.linear_blocks(matrix, x[rows - 1:rows].contiguous(), bias)[0])
            # a decoder's matrix (STREAMED: prefetched past the cache) is the same product
            assert torch.equal(got, build.linear_blocks(matrix, x[:rows].contiguous(), bias, streamed=True)), rows


@pytest.mark.parametrize("name", TYPES)
def test_a_widened_matrix_keeps_every_bit(name: str) -> None:
    # a fused q|k|v whose parts differ (Q4_K and Q6_K, say) is read in the widest format, Q8_X
    matrix = gguf_blocks.repack(quantised(name, 12, 256, seed=2), TYPES[name], 256)
    wide = gguf_blocks.stack([matrix, gguf_blocks.repack(quantised("Q6_K", 4, 256), TYPES["Q6_K"], 256)])
    if name == "Q6_K":
        assert wide.format == gguf_blocks.Q8_H  # one format: kept as it is
        return
    assert (wide.format, wide.kind, wide.rows) == (gguf_blocks.Q8_X, f"{name}+Q6_K", 16)
    assert torch.equal(wide.dequantized()[:12].view(torch.int32), matrix.dequantized().view(torch.int32))
    kernel, _ = float_kernels.load()
    if kernel is None:
        pytest.skip(NO_KERNEL)
    x = torch.randn(7, 256)
    for rows in (1, 3, 7):
        assert torch.equal(kernel.linear_blocks(wide, x[:rows].contiguous())[:, :12],
                           kernel.linear_blocks(matrix, x[:rows].contiguous()))


def test_a_quantised_gguf_decodes_the_same_bits_from_its_blocks(gguf_file: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = load_model(str(gguf_file), dtype="float32").lm
    if float_kernels.load()[0] is None:
        assert "blocks" not in blocks.path
        pytest.skip(NO_KERNEL)
    assert blocks.path.endswith("of its 9 weight matrices the kernel reads 1 Q4_0, 4 Q4_1, 2 Q8_0, 1 Q8_0+Q4_0 as the GGUF's blocks")
    monkeypatch.setenv("SPECSURE_GGUF_BLOCKS", "0")
    plain = load_model(str(gguf_file), dtype="float32").lm
    assert plain.path.endswith("every weight matrix read as float32 (SPECSURE_GGUF_BLOCKS=0, not tiny-mixed.gguf's blocks)")
    prompt = [5, 17, 33, 90, 4, 12, 250, 8]
    a, b = blocks.forward(prompt, last_logits=1), plain.forward(prompt, last_logits=1)
    for _ in range(40):
        assert torch.equal(a.logits, b.logits)
        token = int(a.logits[-1].argmax())
        a, b = blocks.forward([token]), plain.forward([token])
    # A draft vocabulary's rows of the LM head (an MTP head's logits) read the same rows of the blocks.
    rows, hidden = torch.tensor([3, 7, 100, 250, 299]), torch.randn(3, 64)
    assert blocks.head.blocks is not None
    assert torch.equal(blocks.draft_head(rows)(hidden), plain.draft_head(rows)(hidden))
    # A verify forward of several rows (direct, then unpacked) gives each row the one-row step's bits.
    for rows in (4, 9):
        start = blocks.cache_len
        ids = [int(t) for t in torch.randint(3, VOCAB, (rows,))]
        together = blocks.forward(ids).logits
        blocks.crop(start)
        for i, token in enumerate(ids):
            assert torch.equal(blocks.forward([token]).logits[0], together[i])


NAMES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
         "mlp.down_proj")


def test_an_engine_drops_the_float32_copies_of_the_matrices_it_reads_as_blocks(gguf_file: Path) -> None:
    from specsure import SamplingParams, make_engine

    kept = load_model(str(gguf_file), dtype="float32").lm
    if float_kernels.load()[0] is None:
        pytest.skip(NO_KERNEL)
    dropped = load_model(str(gguf_file), dtype="float32", release_weights=True).lm
    before, after = kept.hf.base_model.layers, dropped.hf.base_model.layers
    for name in NAMES:
        weight, original = after[0].get_submodule(name).weight, before[0].get_submodule(name).weight
        assert weight.is_meta and weight.shape == original.shape and not original.is_meta, name
    assert after[1].self_attn.q_proj.weight.is_meta and after[1].mlp.gate_proj.weight.is_meta
    # layer 1's down is F32 in the file: no blocks, so the kernel still reads its float32 weight
    assert torch.equal(after[1].mlp.down_proj.weight, before[1].mlp.down_proj.weight)
    assert all(getattr(dropped._native.layers[0], n).is_meta for n in ("qkv", "o", "gate_up", "down"))
    # its own Q8_0 head is dropped too; the embedding (F32 in the file, untied) stays
    assert dropped.hf.get_output_embeddings().weight.is_meta and not dropped.hf.get_input_embeddings().weight.is_meta
    prompt = [5, 17, 33, 90, 4, 12, 250, 8]
    a, b = dropped.forward(prompt, last_logits=1), load_model(str(gguf_file), dtype="float32").lm.forward(
        prompt, last_logits=1)
    assert torch.equal(a.logits, b.logits)
    # engines drop them, and speculation over the dropped weights still equals plain decoding
    params = SamplingParams(max_tokens=24, temperature=0.0)
    plain = make_engine(str(gguf_file), None, dtype="float32")
    assert plain.target.lm.hf.base_model.layers[0].mlp.gate_proj.weight.is_meta
    expected = plain.generate([prompt], params)[0].token_ids
    ngram = make_engine(str(gguf_file), {"method": "ngram", "num_speculative_tokens": 3}, dtype="float32")
    assert ngram.generate([prompt], params)[0].token_ids == expected
    # what it reports dropping: every matrix read as blocks, in float32 bytes (not layer 1's down)
    served = [before[i].get_submodule(n).weight for i in (0, 1) for n in NAMES if (i, n) != (1, "mlp.down_proj")]
    head = kept.hf.get_output_embeddings().weight
    assert kept.release_block_weights() == sum(w.numel() * 4 for w in served) + head.numel() * 4
    assert kept.release_block_weights() == 0  # nothing left to drop


def test_blocks_that_differ_from_the_loaded_weights_are_not_read(gguf_file: Path) -> None:
    lm = load_model(str(gguf_file), dtype="float32").lm
    native = lm._native
    if native.float_kernel is None:
        pytest.skip(NO_KERNEL)
    found = gguf_blocks.read_blocks(gguf_file, 2, 4, 2, tied=False)
    assert found.layers[1]["down"] is None  # F32 in the file
    assert (found.layers[1]["qkv"].format, found.layers[1]["qkv"].kind) == (gguf_blocks.Q8_X, "Q8_0+Q4_0")
    tampered = found.layers[0]["gate_up"]
    data = tampered.data.clone()
    data[3, 10] ^= 1  # one quant of one weight
    found.layers[0]["gate_up"] = gguf_blocks.BlockMatrix(data, tampered.format, tampered.rows, tampered.cols, tampered.kind)
    used = native.use_blocks(found)
    assert used == {"Q4_0": 1, "Q4_1": 3, "Q8_0": 1, "Q8_0+Q4_0": 1}
    assert native._float_structs[0].gate_up_format == 0
    assert native._float_structs[0].gate_up == native.layers[0].gate_up.data_ptr()


def test_a_conversion_whose_gguf_is_gone_reads_float32_and_says_so(gguf_file: Path, tmp_path: Path) -> None:
    from specsure.models.gguf_cache import gguf_cache_folder

    copy = tmp_path / "copy.gguf"
    shutil.copy(gguf_file, copy)
    folder = gguf_cache_folder(copy)
    assert "blocks" in load_model(str(copy), dtype="float32").lm.path or float_kernels.load()[0] is None
    copy.unlink()
    lm = load_model(str(folder), dtype="float32").lm  # the converted folder, as a user may keep it
    if float_kernels.load()[0] is None:
        pytest.skip(NO_KERNEL)
    assert lm.path.endswith(f"every weight matrix read as float32 ({copy}, which it was converted from, is gone)")


def _same_decoding(blocks, plain) -> None:  # noqa: ANN001
    """24 greedy steps of both models give the same logits' bits, and a verify forward of 7 rows
    (the unpacked path of the AVX2 build) gives each row the bits of its one-row step."""
    prompt = [5, 17, 33, 90, 4, 12]
    a, b = blocks.forward(prompt, last_logits=1), plain.forward(prompt, last_logits=1)
    for _ in range(24):
        assert torch.equal(a.logits, b.logits)
        token = int(a.logits[-1].argmax())
        a, b = blocks.forward([token]), plain.forward([token])
    start = blocks.cache_len
    ids = [7, 8, 9, 250, 3, 4, 5]
    together = blocks.forward(ids).logits
    blocks.crop(start)
    for i, token in enumerate(ids):
        assert torch.equal(blocks.forward([token]).logits[0], together[i])


def test_k_quants_decode_the_same_bits_from_their_blocks(k_gguf_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = load_model(str(k_gguf_file), dtype="float32").lm
    if float_kernels.load()[0] is None:
        pytest.skip(NO_KERNEL)
    assert blocks.path.endswith("of its 9 weight matrices the kernel reads 2 Q4_K, 1 Q4_K+Q6_K, 1 Q5_K, 5 Q6_K as the GGUF's blocks")
    monkeypatch.setenv("SPECSURE_GGUF_BLOCKS", "0")
    plain = load_model(str(k_gguf_file), dtype="float32").lm
    _same_decoding(blocks, plain)


def test_a_tied_q8_0_embedding_is_read_as_the_lm_head(tmp_path_factory: pytest.TempPathFactory) -> None:
    gguf = _gguf(tmp_path_factory, "tiny-tied", 64, {"token_embd.weight": "Q8_0", "blk.0.ffn_down.weight": "Q4_1"},
                 tie=True)  # as the default model: its head is its Q8_0 token embedding
    lm = load_model(str(gguf), dtype="float32").lm
    if lm.row_kernel is None:
        pytest.skip(NO_KERNEL)
    assert lm.path.endswith("the kernel reads 1 Q4_1, 1 Q8_0 as the GGUF's blocks") and lm.head.blocks is not None
    hidden = torch.randn(2, 64)
    traced = lm.lm_head_logits(hidden.clone().requires_grad_(True))  # a head in training: torch's products
    assert traced.grad_fn is not None
    torch.testing.assert_close(traced.detach(), lm.lm_head_logits(hidden), atol=1e-4, rtol=1e-5)
    # An engine drops the tied weight: the embedding is looked up in the head's blocks, the same bits.
    dropped = load_model(str(gguf), dtype="float32", release_weights=True).lm
    ids = torch.tensor([[0, 5, 299], [17, 17, 3]])
    assert dropped.hf.get_input_embeddings().weight.is_meta and dropped.hf.get_output_embeddings().weight.is_meta
    assert torch.equal(dropped.embed(ids).view(torch.int32), lm.embed(ids).view(torch.int32))
    for bad in (300, -1):  # the kernel reads any row it is given: the range is checked before, as nn.Embedding's
        with pytest.raises(IndexError, match=f"token id {bad} is out of the embedding's range 0..299"):
            dropped.embed(torch.tensor([3, bad]))
    assert torch.equal(dropped.lm_head_logits(hidden), lm.lm_head_logits(hidden))
    rows = torch.tensor([3, 7, 100, 250])  # a draft vocabulary's rows (an MTP head's) come from the blocks too
    assert torch.equal(dropped.draft_head(rows)(hidden), lm.draft_head(rows)(hidden))
    prompt = [5, 17, 33, 90, 4]
    assert torch.equal(dropped.forward(prompt).logits, lm.forward(prompt).logits)
    assert dropped.release_block_weights() == 0 and dropped.embed(ids).shape == (2, 3, 64)  # once only


def test_the_blocks_are_found_whichever_folder_the_file_was_first_named_from(
        gguf_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if float_kernels.load()[0] is None:
        pytest.skip(NO_KERNEL)
    monkeypatch.chdir(gguf_file.parent)
    assert "as the GGUF's blocks" in load_model(gguf_file.name, dtype="float32").lm.path  # relative, converted here
    monkeypatch.chdir(tmp_path)
    assert "as the GGUF's blocks" in load_model(str(gguf_file), dtype="float32").lm.path  # the same conversion


def test_a_source_replaced_since_its_conversion_still_loads_and_says_why(gguf_file: Path, tmp_path: Path) -> None:
    from specsure.models.gguf_cache import gguf_cache_folder

    if float_kernels.load()[0] is None:
        pytest.skip(NO_KERNEL)
    copy = tmp_path / "copy.gguf"
    shutil.copy(gguf_file, copy)
    folder = gguf_cache_folder(copy)
    load_model(str(copy), dtype="float32")
    copy.write_bytes(b"not a gguf any more")
    lm = load_model(str(folder), dtype="float32").lm  # the converted folder, its source now garbage
    assert f"every weight matrix read as float32 ({copy} cannot be read for its blocks:" in lm.path


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_a_qwen_gguf_reads_its_blocks_in_transformers_row_order(family: str, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # llama.cpp's Qwen2 and Qwen3 converters keep q and k in transformers' order (its Llama one
    # interleaves them); Qwen2's q|k|v biases and Qwen3's q and k norms stay float32 beside the blocks
    types = {f"blk.{i}.{n}.weight": ("Q4_1" if i else "Q8_0") for i in (0, 1)
             for n in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")}
    write = write_qwen2 if family == "qwen2" else write_qwen3
    _, gguf = write(tmp_path / family, tmp_path / f"{family}.gguf", VOCAB, {**types, "token_embd.weight": "Q8_0"},
                    tie=True)
    blocks = load_model(str(gguf), dtype="float32").lm
    if float_kernels.load()[0] is None:
        pytest.skip(NO_KERNEL)
    layer = blocks._native.layers[0]
    assert blocks.hf.config.model_type == family
    assert (layer.qkv_bias if family == "qwen2" else layer.q_norm) is not None
    assert blocks.path.endswith("of its 9 weight matrices the kernel reads 4 Q4_1, 5 Q8_0 as the GGUF's blocks")
    assert load_model(str(gguf), dtype="float32", int8_activations=True).lm.int8_matrices == 9
    monkeypatch.setenv("SPECSURE_GGUF_BLOCKS", "0")
    plain = load_model(str(gguf), dtype="float32").lm
    _same_decoding(blocks, plain)


@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
def test_a_gemma_gguf_runs_natively_on_its_blocks_and_every_method_equals_plain(family: str, tmp_path: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Gemma 3 (sliding layers past a 4-position window, each layer type its own RoPE, GELU, four norms a
    layer, a tied and quantised embedding) and Gemma 2 (alternating windows, soft-capped scores and
    logits) in the float32 kernel on their blocks: the same bits as their float32 weights, transformers'
    greedy tokens on the Hugging Face source, and plain decoding's tokens from ngram trees, suffix and a
    draft model."""
    from gguf_models import assert_decodes_as

    write, layers = (write_gemma3, 6) if family == "gemma3" else (write_gemma2, 2)
    types = {f"blk.{i}.{n}.weight": ("Q4_1" if i % 2 else "Q8_0") for i in range(layers)
             for n in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")}
    folder, gguf = write(tmp_path / family, tmp_path / f"{family}.gguf", VOCAB, {**types, "token_embd.weight": "Q8_0"})
    blocks = load_model(str(gguf), dtype="float32").lm
    assert blocks.path.startswith("native")
    if float_kernels.load()[0] is None:
        pytest.skip(NO_KERNEL)
    q4 = layers // 2 * 4  # each odd layer's four matrices
    assert blocks.path.endswith(f"of its {layers * 4 + 1} weight matrices the kernel reads {q4} Q4_1, "
                                f"{layers * 4 + 1 - q4} Q8_0 as the GGUF's blocks")
    monkeypatch.setenv("SPECSURE_GGUF_BLOCKS", "0")
    _same_decoding(blocks, load_model(str(gguf), dtype="float32").lm)
    monkeypatch.delenv("SPECSURE_GGUF_BLOCKS")
    plain_folder, plain_gguf = write(tmp_path / "plain", tmp_path / "plain.gguf", VOCAB)
    assert_decodes_as(plain_folder, plain_gguf)
    for method, stats in _methods_against_plain(gguf, ("ngram", "suffix", "draft_model")).items():
        assert stats.accepted_tokens > 0, method


@pytest.mark.parametrize("longrope, partial", [(False, 1.0), (True, 1.0), (True, 0.75)],
                         ids=["phi3", "phi3-longrope", "phi4-mini"])
def test_a_phi3_gguf_reads_its_fused_blocks_and_every_method_equals_plain(longrope: bool, partial: float,
                                                                          tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Phi-3's file keeps q|k|v as one tensor (attn_qkv) and gate|up as ffn_up, in transformers' row
    order: the float32 kernel reads them as they are, with the same bits as their float32 weights,
    LongRoPE's factors and Phi-4-mini's partial rotary included, and speculative decoding equals plain
    decoding on them."""
    from gguf_models import assert_decodes_as, write_phi3

    types = {f"blk.{i}.{n}.weight": ("Q4_1" if i else "Q8_0") for i in (0, 1)
             for n in ("attn_qkv", "attn_output", "ffn_up", "ffn_down")}
    _, gguf = write_phi3(tmp_path / "phi3", tmp_path / "phi3.gguf", VOCAB, longrope, {**types, "output.weight": "Q8_0"},
                         partial_rotary=partial)
    blocks = load_model(str(gguf), dtype="float32").lm
    assert blocks.hf.config.model_type == "phi3" and blocks.path.startswith("native")
    if float_kernels.load()[0] is None:
        pytest.skip(NO_KERNEL)
    assert blocks.path.endswith("of its 9 weight matrices the kernel reads 4 Q4_1, 5 Q8_0 as the GGUF's blocks")
    assert load_model(str(gguf), dtype="float32", int8_activations=True).lm.int8_matrices == 9
    monkeypatch.setenv("SPECSURE_GGUF_BLOCKS", "0")
    _same_decoding(blocks, load_model(str(gguf), dtype="float32").lm)
    monkeypatch.delenv("SPECSURE_GGUF_BLOCKS")
    plain_folder, plain_gguf = write_phi3(tmp_path / "plain", tmp_path / "plain.gguf", VOCAB, longrope,
                                          partial_rotary=partial)
    assert_decodes_as(plain_folder, plain_gguf)
    stats = _methods_against_plain(gguf, ("ngram", "draft_model"))
    assert stats["ngram"].draft_tokens > 0 and stats["draft_model"].accepted_tokens > 0


def _methods_against_plain(gguf: Path, methods: tuple[str, ...]) -> dict[str, Any]:
    """Each method's stats over a 40-token greedy decode of ``gguf`` that equals plain decoding's (asserted),
    plain's text being the model's own (not one token repeated)."""
    from specsure import SamplingParams, make_engine

    params = SamplingParams(max_tokens=40, ignore_eos=True)
    prompt = [5, 70, 71, 72, 80, 81, 5, 70, 71, 72, 90, 91, 5, 70, 71]
    expected = make_engine(str(gguf), None, dtype="float32").generate(prompt, params)[0].token_ids
    assert len(set(expected)) > 5, expected
    specs = {"ngram": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3,
                       "prompt_lookup_branches": 3},
             "suffix": {"method": "suffix", "num_speculative_tokens": 6},
             "draft_model": {"method": "draft_model", "model": str(gguf), "num_speculative_tokens": 3}}
    stats = {}
    for method in methods:
        engine = make_engine(str(gguf), specs[method], dtype="float32")
        assert engine.generate(prompt, params)[0].token_ids == expected, method
        stats[method] = engine.stats
    return stats


def test_a_longrope_phi3_past_its_trained_context_is_invariant_to_what_shares_a_forward(tmp_path: Path) -> None:
    """LongRoPE takes its long factors past the trained context (64 here). transformers' module picks them
    for a whole call from its largest position, so a verify step or prefill chunk that crossed the
    boundary turned its earlier rows with the long ones too: speculation differed from plain decoding,
    a chunked prefill from a whole one, and a long request changed a short one batched beside it. Each
    position now turns by its own position; up to the trained context that is transformers' output."""
    from gguf_models import write_phi3

    from specsure import SamplingParams, make_engine

    _, gguf = write_phi3(tmp_path / "phi3", tmp_path / "phi3.gguf", VOCAB, longrope=True)
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    prompt = [5 + (7 * i) % 250 for i in range(40)]  # 40 + 40 tokens: the boundary at 64 falls mid-answer
    short = [5, 70, 71, 72, 80, 81]
    plain = make_engine(str(gguf), None, dtype="float32")
    expected = plain.generate(prompt, params)[0].token_ids
    alone = plain.generate(short, params)[0].token_ids
    long_prompt = [9 + (5 * i) % 250 for i in range(90)]  # past the boundary from its prefill on
    for spec in ({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 2},
                 {"method": "draft_model", "model": str(gguf), "num_speculative_tokens": 5}):
        engine = make_engine(str(gguf), spec, dtype="float32")
        assert engine.generate(prompt, params)[0].token_ids == expected, spec["method"]
        assert engine.stats.drafts > 0
    chunked = make_engine(str(gguf), None, dtype="float32", max_num_batched_tokens=16)
    assert chunked.generate(long_prompt, params)[0].token_ids == plain.generate(long_prompt, params)[0].token_ids
    assert [c.token_ids for c in plain.generate([short, long_prompt], params)][0] == alone
