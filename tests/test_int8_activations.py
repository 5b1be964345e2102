"""Int8 activations (`load_model(..., int8_activations=True)`, `--int8-activations`): the float32
kernel's integer products over Q4_0, Q4_1 and Q8_0 blocks, as llama.cpp multiplies them.

What must hold: each output is the integer arithmetic it claims to be (against a numpy reference),
every row's bits are independent of the rows beside it (so a verify row equals the decode step and
speculation equals plain decoding in this mode), and a model that cannot have them says so."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from gguf_models import quantised, tiny_llama_gguf
from specsure import SamplingParams, make_engine
from specsure.cli.main import main
from specsure.models import float_kernel as float_kernels
from specsure.models import gguf_blocks
from specsure.models.loading import load_model
from specsure.proposers import head_blocks
from stats import chi2, chi2_critical, pooled, second_token_counts, second_token_marginal

VOCAB = 300
NARROWER = {"Q5_0": gguf_blocks.R5_0, "Q5_1": gguf_blocks.R5_M, "Q5_K": gguf_blocks.R5_M, "Q6_K": gguf_blocks.R6_H}
"""The types whose quants an 8-bit packing would hold in 5 or 6 bits, and that packing."""
GGML = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
NO_KERNEL = "no float32 C kernel on this machine (AVX2, FMA and a C compiler), so nothing reads blocks"
MIXED = {  # layer 0 Q4_1; layer 1 Q4_0 and Q8_0, its q|k|v fused from both (Q8_X), its down float32
    **{f"blk.0.{n}.weight": "Q4_1" for n in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                                             "ffn_down")},
    "blk.1.attn_q.weight": "Q8_0", "blk.1.attn_k.weight": "Q4_0", "blk.1.attn_v.weight": "Q4_0",
    "blk.1.attn_output.weight": "Q4_0", "blk.1.ffn_gate.weight": "Q8_0", "blk.1.ffn_up.weight": "Q8_0",
    "output.weight": "Q8_0",
}


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llama_gguf(tmp_path_factory.mktemp("int8"), "tiny-int8", MIXED, vocab=VOCAB)


@pytest.fixture(scope="module")
def draft_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same weights as `gguf_file`'s, every matrix Q8_0: a draft model whose drafts are mostly right."""
    return tiny_llama_gguf(tmp_path_factory.mktemp("int8-draft"), "tiny-q8", {name: "Q8_0" for name in MIXED},
                           vocab=VOCAB)


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _kernel() -> float_kernels.FloatKernel:
    kernel, _ = float_kernels.load()
    if kernel is None:
        pytest.skip(NO_KERNEL)
    return kernel


def _reference(matrix: gguf_blocks.BlockMatrix, x: torch.Tensor) -> np.ndarray:
    """The integer products in numpy, float64 after the rounding to int8: x's blocks rounded as the
    kernel rounds them (float32 127 / max |x|, ties to even), each half block's integer dot product
    scaled by its d_w (Q8_H and Q8_X have one per 16 weights) times d_x, and a block's offset (Q4_0's
    -8 d, Q4_1's, Q8_M's and Q8_X's m) times d_x sum(q)."""
    fmt, rows, blocks = matrix.format, matrix.rows, matrix.cols // 32
    header = {gguf_blocks.Q4_0: 1, gguf_blocks.Q8_0: 1, gguf_blocks.Q8_X: 3}.get(fmt, 2)
    raw = matrix.data.numpy().reshape(rows, blocks, -1)
    scales = raw[..., :4 * header].copy().view(np.float32).astype(np.float64)  # [rows, blocks, header]
    if fmt in (gguf_blocks.Q4_0, gguf_blocks.Q4_1):
        nibbles = raw[..., 4 * header:].astype(np.int64)
        q = np.concatenate([nibbles & 15, nibbles >> 4], axis=-1)
    else:
        q = raw[..., 4 * header:].copy().view(np.int8).astype(np.int64)
    two = fmt in (gguf_blocks.Q8_H, gguf_blocks.Q8_X)
    halves = np.stack([scales[..., 0], scales[..., 1] if two else scales[..., 0]], axis=-1)  # [rows, blocks, 2]
    if fmt in (gguf_blocks.Q4_1, gguf_blocks.Q8_M, gguf_blocks.Q8_X):
        offset = scales[..., -1]
    else:
        offset = -8.0 * scales[..., 0] if fmt == gguf_blocks.Q4_0 else np.zeros_like(scales[..., 0])
    xs = x.numpy().reshape(x.shape[0], blocks, 32)
    amax = np.abs(xs).max(axis=-1, keepdims=True)
    scale = np.where(amax > 0, np.float32(127.0) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    xq = np.rint((xs * scale).astype(np.float32)).astype(np.int64)  # numpy's rint rounds ties to even
    dx = (amax[..., 0] / np.float32(127.0)).astype(np.float32).astype(np.float64)
    dots = np.einsum("rbhi,abhi->arbh", q.reshape(rows, blocks, 2, 16),
                     xq.reshape(-1, blocks, 2, 16)).astype(np.float64)
    return ((dots * halves[None]).sum(-1) * dx[:, None]).sum(-1) + \
        (offset[None] * (dx * xq.sum(-1))[:, None]).sum(-1)


def _matrix(name: str, rows: int) -> gguf_blocks.BlockMatrix:
    """Random blocks of GGUF type ``name`` as the kernel holds them; "A+B" fuses A's rows and B's
    (Q4_K_M's q|k in Q4_K with v in Q6_K, widened to Q8_X)."""
    parts = [gguf_blocks.repack(quantised(part, rows // 2 if "+" in name else rows, 256, seed=i), GGML[part], 256)
             for i, part in enumerate(name.split("+"))]
    matrix = gguf_blocks.stack(parts)
    assert matrix is not None
    return matrix


@pytest.mark.parametrize("name, rows", [("Q4_0", 80), ("Q4_1", 80), ("Q8_0", 80), ("Q5_0", 80), ("Q5_1", 80),
                                        ("Q5_K", 80), ("Q6_K", 80), ("Q4_K+Q6_K", 80), ("Q4_0", 70), ("Q4_1", 70),
                                        ("Q8_0", 70), ("Q5_0", 70), ("Q5_1", 70), ("Q6_K", 70), ("Q4_K+Q6_K", 70)])
def test_int8_products_are_the_integer_arithmetic_and_rows_do_not_affect_each_other(name: str, rows: int) -> None:
    # 80 rows: groups of 8 rows packed side by side; 70: a last group of 6, padded with zero rows
    kernel = _kernel()
    torch.manual_seed(0)
    matrix = _matrix(name, rows)
    tagged = kernel.int8_pack(matrix)
    assert tagged is not None and tagged.format == NARROWER.get(name, gguf_blocks.PACKED[matrix.format])
    assert kernel.prepared(matrix, True).format == tagged.format  # what a model with int8 activations reads
    with pytest.raises(ValueError, match="stack the blocks, then pack"):  # groups of rows: no stacking
        gguf_blocks.stack([tagged, tagged])
    bias, x = torch.randn(rows), torch.randn(64, 256)
    x[2, :32] = 0.0  # a block of zeros (scale 0)
    float32 = kernel.linear_blocks(matrix, x, bias)
    for count in (1, 2, 3, 4, 5, 7, 9, 16, 64):  # every pass shape (1 to 4 rows of x at a time, then the rest)
        got = kernel.linear_blocks(tagged, x[:count].contiguous(), bias)
        assert torch.equal(got, kernel.linear_blocks(tagged, x[:count].contiguous(), bias, streamed=True)), count
        for i in {0, count // 2, count - 1}:
            assert torch.equal(got[i], kernel.linear_blocks(tagged, x[i:i + 1].contiguous(), bias)[0]), (count, i)
    got = kernel.linear_blocks(tagged, x, bias).double().numpy()
    expected = _reference(matrix, x) + bias.double().numpy()
    assert np.allclose(got, expected, rtol=1e-5, atol=1e-4 * np.abs(expected).max())
    # and what the rounding of x costs: close to the float32 products, not equal to them
    error = (got - float32.double().numpy()).std() / float32.double().numpy().std()
    assert 1e-4 < error < 0.03


def test_every_block_format_has_integer_products_whatever_its_row_count() -> None:
    # Q5_0's 5-bit quants are held as Q8_0 blocks, Q5_1's with an offset per block (Q8_M), Q6_K's
    # with two scales per block (Q8_H), each packed in its own bits; float32 rows have none
    kernel = _kernel()
    for name in ("Q5_0", "Q5_1", "Q6_K"):
        for rows in (8, 5):
            matrix = gguf_blocks.repack(quantised(name, rows, 256), GGML[name], 256)
            tagged = kernel.int8_pack(matrix)
            assert tagged is not None and (tagged.format, tagged.rows) == (NARROWER[name], rows), (name, rows)
    rows = gguf_blocks.BlockMatrix(torch.zeros(8, 64 * 4, dtype=torch.uint8), 0, 8, 64, "F32")
    assert kernel.int8_pack(rows) is None


@pytest.mark.parametrize("name", ["Q5_0", "Q5_1", "Q5_K", "Q6_K"])
def test_narrow_packings_give_the_eight_bit_packings_bits(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # R5_0, R5_M and R6_H only store the quants in fewer bytes: every output must be the 8-bit
    # packing's, bit for bit, quants at both ends of their range included; wider quants stay 8-bit
    kernel = _kernel()
    matrix = _matrix(name, 22)  # a last group of 6 rows
    header = 4 if matrix.format == gguf_blocks.Q8_0 else 8
    quants = matrix.data.view(22, 8, header + 32)[..., header:].view(torch.int8)
    low, high = {gguf_blocks.Q8_0: (-16, 15), gguf_blocks.Q8_M: (0, 31), gguf_blocks.Q8_H: (-32, 31)}[matrix.format]
    quants[0, 0, :16], quants[0, 0, 16:], quants[21, 7, ::2] = low, high, high
    narrow = kernel.int8_pack(matrix)
    assert narrow is not None and narrow.format == NARROWER[name]
    monkeypatch.setattr(float_kernels, "_fits", lambda matrix, low, high: False)
    eight = kernel.int8_pack(matrix)
    assert eight is not None and eight.format == gguf_blocks.PACKED[matrix.format]
    assert narrow.data.numel() < eight.data.numel()
    bias, x = torch.randn(22), torch.randn(9, 256)
    for count in (1, 2, 3, 4, 9):
        part = x[:count].contiguous()
        assert torch.equal(kernel.linear_blocks(narrow, part, bias), kernel.linear_blocks(eight, part, bias)), count
    monkeypatch.undo()
    quants[5, 3, 9] = high + 1  # one quant past the range: the whole matrix keeps 8 bits
    assert kernel.int8_pack(matrix).format == gguf_blocks.PACKED[matrix.format]


def test_a_model_with_int8_activations_decodes_each_row_as_its_one_row_step(gguf_file: Path) -> None:
    _kernel()
    lm = load_model(str(gguf_file), dtype="float32", int8_activations=True).lm
    # all 8 block matrices, the fused q|k|v of Q8_0 and Q4_0 parts (Q8_X) packed as R8_X; the log
    # names the packings, and no row limit for the C forwards (the mode has none)
    assert lm.path.endswith("the kernel reads 1 Q4_0, 4 Q4_1, 2 Q8_0, 1 Q8_0+Q4_0 as the GGUF's blocks (8 of them "
                            "with int8 activations, packed as 1 R4_0, 4 R4_1, 2 R8_0, 1 R8_X; every forward in C, "
                            "whatever its rows)"), lm.path
    assert "float32 forwards in C" in lm.path and "rows in C" not in lm.path
    exact = load_model(str(gguf_file), dtype="float32").lm
    prompt = [5, 17, 33, 90, 4, 12, 250, 8]
    a, b = lm.forward(prompt, last_logits=1).logits, exact.forward(prompt, last_logits=1).logits
    # a short prompt's prefill runs in the kernel too: close to float32's logits, not equal to them
    assert not torch.equal(a, b) and float((a - b).abs().max()) < 0.1 * float(b.abs().max())
    token = int(a[-1].argmax())
    steps = []
    for _ in range(12):
        step = lm.forward([token]).logits[0]
        steps.append(step)
        token = int(step.argmax())
    assert not torch.equal(steps[-1], exact.forward([token]).logits[0])  # the integer products ran
    for rows in (2, 4, 9, 70):  # a verify forward (or a batch past 64 rows) gives each row the one-row step's bits
        start = lm.cache_len
        ids = [int(t) for t in torch.randint(3, VOCAB, (rows,))]
        together = lm.forward(ids).logits
        lm.crop(start)
        for i, tok in enumerate(ids):
            assert torch.equal(lm.forward([tok]).logits[0], together[i]), (rows, i)


@pytest.mark.parametrize("method", ["draft_model", "ngram", "suffix"])
def test_speculation_with_int8_activations_equals_plain_decoding_in_that_mode(gguf_file: Path, draft_file: Path,
                                                                            method: str) -> None:
    _kernel()
    # the same weights in Q8_0 as the draft model, with int8 activations too: drafts that are mostly right
    speculative = {"method": method, "num_speculative_tokens": 4, **({"model": str(draft_file)} if method == "draft_model"
                                                                       else {})}
    plain = make_engine(str(gguf_file), None, dtype="float32", int8_activations=True)
    spec = make_engine(str(gguf_file), speculative, dtype="float32", int8_activations=True)
    if method == "draft_model":
        assert spec.proposer.draft.int8_matrices > 0
    prompts = [[5, 17, 33, 90, 5, 17, 33, 90, 5, 17], [40, 41, 42, 43, 40, 41, 42], [7, 8, 9, 10, 11, 12, 7, 8, 9]]
    params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
    want = plain.generate(prompts, params)
    got = spec.generate(prompts, params)
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    drafted = sum(c.stats.draft_tokens for c in got)
    accepted = sum(c.stats.accepted_tokens for c in got)
    assert drafted > 0  # verify forwards of several rows ran
    if method == "draft_model":  # and both ways out of a verification: drafts kept and drafts rejected
        assert 0 < accepted < drafted


def test_a_draft_model_of_a_float32_target_takes_int8_activations(gguf_file: Path, draft_file: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # the target's products stay float32 and its output exact; only the draft's (the proposals) are int8,
    # unless SPECSURE_DRAFT_INT8=0
    _kernel()
    speculative = {"method": "draft_model", "model": str(draft_file), "num_speculative_tokens": 4}
    plain = make_engine(str(gguf_file), None, dtype="float32")
    spec = make_engine(str(gguf_file), speculative, dtype="float32")
    assert spec.target.lm.int8_matrices == 0 and spec.proposer.draft.int8_matrices > 0
    prompts = [[5, 17, 33, 90, 5, 17, 33, 90, 5, 17], [40, 41, 42, 43, 40, 41, 42]]
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    got = spec.generate(prompts, params)
    assert [c.token_ids for c in got] == [c.token_ids for c in plain.generate(prompts, params)]
    assert 0 < sum(c.stats.accepted_tokens for c in got) < sum(c.stats.draft_tokens for c in got)
    monkeypatch.setenv(head_blocks.INT8_ENV, "0")
    assert make_engine(str(gguf_file), speculative, dtype="float32").proposer.draft.int8_matrices == 0


def test_a_draft_model_without_int8_blocks_keeps_its_float32_products(tiny_llama: Path, gguf_file: Path) -> None:
    # a draft's arithmetic decides only the proposals: where it cannot have the target's int8
    # activations (safetensors, no blocks), it loads with float32 products rather than failing
    _kernel()
    assert load_model(str(tiny_llama), dtype="float32", int8_activations=True, int8_required=False).lm.int8_matrices == 0
    assert load_model(str(gguf_file), dtype="float32", int8_activations=True, int8_required=False).lm.int8_matrices > 0
    assert load_model(str(gguf_file), dtype="float32", int8_activations=False, int8_required=False).lm.int8_matrices == 0


def test_a_model_that_cannot_have_int8_activations_says_why(gguf_file: Path, tiny_llama: Path) -> None:
    _kernel()
    with pytest.raises(ValueError, match=r"needs the model in float32, but dtype = 'bfloat16'.*--dtype float32"):
        load_model(str(gguf_file), dtype="bfloat16", int8_activations=True)
    with pytest.raises(ValueError, match=r"no weight matrix of .* can have them .*matrices \(Q4_0 to Q8_0, Q4_K to Q6_K\)"):
        load_model(str(tiny_llama), dtype="float32", int8_activations=True)  # safetensors: float32 rows only
    with pytest.raises(ValueError, match=r"int8_activations = 'yes' must be True or False"):
        make_engine(str(gguf_file), None, dtype="float32", int8_activations="yes")  # type: ignore[arg-type]


def test_generate_takes_int8_activations(gguf_file: Path, tiny_llama: Path, capsys) -> None:
    _kernel()
    assert main(["generate", "--model", str(gguf_file), "--dtype", "float32", "--int8-activations",
                 "--max-tokens", "4", "hello"]) == 0
    err = capsys.readouterr().err
    assert "tokens: 4 in" in err  # the stats line; the text is stdout
    assert "(running: plain decoding, dtype float32; int8 activations on 8 weight matrices)" in err  # the mode, without -v
    assert main(["generate", "--model", str(gguf_file), "--dtype", "float32", "--max-tokens", "4", "hello"]) == 0
    assert "int8 activations" not in capsys.readouterr().err
    assert main(["generate", "--model", str(tiny_llama), "--int8-activations", "--max-tokens", "4", "hello"]) == 2
    err = capsys.readouterr().err
    assert "int8_activations" in err and "Traceback" not in err


def test_with_int8_activations_a_long_prompt_prefills_the_same_bits_whole_or_in_pieces(gguf_file: Path) -> None:
    # past 64 rows float32 mode prefills on torch; int8 mode stays in C, so how a prompt is cut
    # (chunked prefill, a cached prefix) cannot change its cache
    _kernel()
    lm = load_model(str(gguf_file), dtype="float32", int8_activations=True).lm
    prompt = [int(t) for t in torch.randint(3, VOCAB, (150,), generator=torch.Generator().manual_seed(3))]
    whole = lm.forward(prompt, last_logits=1).logits[-1]
    after_whole = lm.forward([7]).logits[0]
    lm.crop(0)
    for start in range(0, 150, 40):
        pieces = lm.forward(prompt[start:start + 40], last_logits=1).logits[-1]
    assert torch.equal(pieces, whole) and torch.equal(lm.forward([7]).logits[0], after_whole)
    lm.crop(0)
    assert torch.equal(lm.forward(prompt).logits[-1], whole)  # every row's logits, 150 rows of the LM head


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q5_1", "Q6_K", "Q4_K+Q6_K"])
def test_a_nan_or_an_inf_in_the_activations_stays_visible(name: str) -> None:
    kernel = _kernel()
    tagged = kernel.int8_pack(_matrix(name, 8))
    assert tagged is not None
    for bad in (float("nan"), float("inf")):
        for at in (0, 13, 31, 40, 200):  # first chunk, middle, a block's last value, later blocks
            x = torch.randn(2, 256)
            x[0, at] = bad
            out = kernel.linear_blocks(tagged, x)
            assert not torch.isfinite(out[0]).any(), (bad, at)
            assert torch.isfinite(out[1]).all()  # the other row is untouched
    x = torch.randn(1, 256)
    x[0, :32] = 1e-38  # a block too small to invert: read as zeros, not as -128s
    assert torch.isfinite(kernel.linear_blocks(tagged, x)).all()


def test_a_long_forward_is_cut_into_pieces_in_the_rows_order() -> None:
    from specsure.models.segment import Segment
    from specsure.models.row_pieces import pieces
    from specsure.models.token_tree import TokenTree

    a, b, c = object(), object(), object()
    tree = TokenTree.from_parents([-1, 0, 0, 1])
    segments = [Segment(10, 40, a), Segment(3, 4, b, tree), Segment(0, 17, c)]  # type: ignore[arg-type]
    got = [[(s.cache, s.start, s.length, s.tree) for s in part] for part in pieces(segments, 16)]
    assert got == [[(a, 10, 16, None)], [(a, 26, 16, None)], [(a, 42, 8, None), (b, 3, 4, tree)],
                   [(c, 0, 16, None)], [(c, 16, 1, None)]]
    assert pieces([Segment(0, 20, a, tree)], 16) == [[Segment(0, 20, a, tree)]]  # a tree is never cut


def test_with_int8_activations_a_forward_past_the_piece_size_gives_the_same_bits(gguf_file: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from specsure.models import native

    _kernel()
    lm = load_model(str(gguf_file), dtype="float32", int8_activations=True).lm
    prompt = [int(t) for t in torch.randint(3, VOCAB, (90,), generator=torch.Generator().manual_seed(5))]
    whole = lm.forward(prompt).logits
    monkeypatch.setattr(native, "PIECE_ROWS", 16)  # 90 rows as 6 forwards
    lm.crop(0)
    cut = lm.forward(prompt).logits
    assert torch.equal(cut, whole)


@pytest.mark.parametrize("head", ["Q6_K", None])
def test_with_int8_activations_the_lm_head_takes_every_row_count_in_c(tmp_path: Path, head: str | None) -> None:
    # llama.cpp's files often keep the LM head in Q6_K (300 rows here, packed in 6 bits, a last group
    # of 4 padded), and a head left in float32 has no blocks at all: past 64 rows either must still
    # run the kernel's products, not torch's, or a batch's verify rows would differ
    _kernel()
    types = {f"blk.{i}.{n}.weight": "Q4_0" for i in (0, 1) for n in ("attn_q", "attn_k", "attn_v", "attn_output",
                                                                       "ffn_gate", "ffn_up", "ffn_down")}
    gguf = tiny_llama_gguf(tmp_path, "head", {**types, **({"output.weight": head} if head else {})}, hidden=256,
                           vocab=VOCAB)
    lm = load_model(str(gguf), dtype="float32", int8_activations=True).lm
    if head:
        assert "1 Q6_K" in lm.path and lm.head.int8 is not None and lm.head.int8.format == gguf_blocks.R6_H
    else:
        assert lm.head.blocks is None and lm.head.int8 is None
    lm.forward([5, 6, 7])
    ids = [int(t) for t in torch.randint(3, VOCAB, (70,), generator=torch.Generator().manual_seed(2))]
    together = lm.forward(ids).logits
    lm.crop(3)
    for i, token in enumerate(ids):
        assert torch.equal(lm.forward([token]).logits[0], together[i]), i


def test_a_draft_model_with_int8_activations_keeps_a_float32_targets_sampling_distribution(
        gguf_file: Path, draft_file: Path) -> None:
    # the draft (the target's weights as Q8_0, int8 products) is mostly right and its q close to the
    # target's p but not equal: the accepted drafts and the few recovered tokens together must be
    # distributed as the float32 target's sampling
    _kernel()
    speculative = {"method": "draft_model", "model": str(draft_file), "num_speculative_tokens": 2}
    spec = make_engine(str(gguf_file), speculative, dtype="float32")
    assert spec.target.lm.int8_matrices == 0 and spec.proposer.draft.int8_matrices > 0
    prompt, runs = [5, 17, 33, 90], 1200
    params = SamplingParams(max_tokens=3, temperature=1.0, top_k=6, ignore_eos=True)
    counts = second_token_counts(spec, prompt, params, runs, VOCAB)
    assert 0.5 * spec.stats.drafts < spec.stats.accepted_per_position[0] < spec.stats.drafts
    lm = spec.target.lm
    got, want = pooled(counts, second_token_marginal(lm, prompt, params))
    assert chi2(got, want) < chi2_critical(len(want) - 1)
    got, other = pooled(counts, second_token_marginal(lm, prompt, SamplingParams(temperature=2.0, top_k=6)))
    assert chi2(got, other) > chi2_critical(len(other) - 1)  # the test can fail
