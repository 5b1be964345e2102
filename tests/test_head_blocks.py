"""Draft heads (EAGLE-1, EAGLE-3, MTP) read Q8_0 blocks where their GGUF target reads blocks
(proposers/head_blocks.py): each weight rounded to the nearest step of its block, the head's
float32 products on those blocks (its logits those of a float32 head holding the blocks' values;
``SPECSURE_DRAFT_INT8=0``), its int8 products by default, whether the target's are float32 or int8,
chains and trees, and the output still plain decoding's bit for bit. Without AVX2 there is no
float32 kernel and no blocks, so the kernel tests skip."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from gguf_models import byte_bpe_tokenizer, write_llama_gguf
from heads import write_eagle3_head, write_eagle_head, write_mtp_head
from specsure.decode.engine import Engine, make_engine
from specsure.models import float_kernel as float_kernels
from specsure.models import gguf_blocks
from specsure.proposers.head_blocks import ENV, INT8_ENV
from specsure.proposers.head_layer import HeadCache, RowLinear, last_row, widened
from specsure.sampling import SamplingParams
from stats import chi2, chi2_critical, pooled, second_token_counts, second_token_marginal
from tiny import build_tiny_llama

VOCAB = 300
NO_KERNEL = "no float32 C kernel on this machine (AVX2, FMA and a C compiler), so nothing reads blocks"


def test_q8_blocks_round_each_weight_to_the_nearest_step_of_its_block() -> None:
    torch.manual_seed(0)
    weight = torch.randn(5, 96) * torch.tensor([1.0, 1e-3, 30.0]).repeat_interleave(32)  # blocks of unlike scales
    weight[2, 32:64] = 0.0  # an all-zero block: d = 0, every q 0
    matrix = gguf_blocks.q8_blocks(weight)
    assert matrix is not None and (matrix.format, matrix.rows, matrix.cols, matrix.kind) == (gguf_blocks.Q8_0, 5, 96, "Q8_0")
    step = weight.abs().reshape(5, 3, 32).amax(-1, keepdim=True) / 127
    error = (matrix.dequantized().reshape(5, 3, 32) - weight.reshape(5, 3, 32)).abs()
    assert bool((error <= step / 2 * (1 + 1e-5)).all())
    assert torch.equal(matrix.dequantized()[2, 32:64], torch.zeros(32))
    assert gguf_blocks.q8_blocks(torch.randn(4, 40)) is None  # not whole blocks: the head keeps float32 there
    weight[1, 3] = float("nan")
    assert gguf_blocks.q8_blocks(weight) is None  # no block scale for a NaN: float32 there too


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(GGUF file, the llama folder it was written from): Q8_0 and Q4_1 layers and LM head."""
    root = tmp_path_factory.mktemp("head-blocks")
    folder = build_tiny_llama(root / "llama", vocab_size=VOCAB, hidden_size=64)
    byte_bpe_tokenizer(folder, VOCAB)
    names = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
    types = {f"blk.{i}.{n}.weight": ("Q8_0" if i else "Q4_1") for i in (0, 1) for n in names}
    return write_llama_gguf(folder, root / "tiny.gguf", quantize={**types, "output.weight": "Q8_0"}), folder


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _head(method: str, folder: Path, out: Path) -> Path:
    if method == "mtp":
        return write_mtp_head(out, folder, seed=3)
    if method in ("mtp-own-head", "mtp-draft-vocab"):  # drafting among 200 of the 300 tokens
        gen = torch.Generator().manual_seed(5)
        kept = torch.randperm(VOCAB, generator=gen)[:200].sort().values
        t2d = torch.zeros(VOCAB, dtype=torch.bool)
        t2d[kept] = True
        tensors = {"d2t": kept - torch.arange(200), "t2d": t2d}
        if method == "mtp-own-head":  # with its own LM head; else the target's rows, as the shipped head
            tensors["layers.0.shared_head.head.weight"] = torch.randn(VOCAB, 64, generator=gen) * 0.5
        return write_mtp_head(out, folder, seed=3, tensors=tensors, draft_vocab_size=200)
    if method == "eagle":
        return write_eagle_head(out, folder, seed=3, naming="vllm")
    # a draft vocabulary of 197: its LM head's last group of 8 rows is short (padded where packed)
    return write_eagle3_head(out, folder, draft_vocab=197, layer_ids=[0, 1, 2], seed=3)  # 2: the last output


def _module_steps(engine: Engine, method: str) -> list[torch.Tensor]:
    """The head module's logits for a 6-entry catch-up (torch) and then two one-row steps (the C kernel)."""
    module = engine.proposer.modules[0]
    torch.manual_seed(1)
    hidden = engine.target.lm.hidden_size
    width = 3 * hidden if method == "eagle3" else hidden
    features = torch.randn(8, width)
    ids = torch.randint(3, VOCAB, (8,))
    cache, out = HeadCache(), []
    with torch.inference_mode():  # as the engine drafts: outside autograd, where the blocks are read
        if method == "eagle3":
            features = module.features(features)
        for lo, hi in ((0, 6), (6, 7), (7, 8)):
            out.append(widened(last_row(module(features[lo:hi], ids[lo:hi], cache, last=True)[1])))
    return out


@pytest.mark.parametrize("head", ["mtp", "mtp-own-head", "eagle3", "eagle"])
def test_a_head_of_a_gguf_target_reads_q8_blocks_and_the_output_stays_exact(
        head: str, target: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    gguf, folder = target
    monkeypatch.setenv(INT8_ENV, "0")  # the float32 products over the blocks, not the default int8 ones
    method = head.split("-")[0]
    spec = {"method": method, "model": str(_head(head, folder, tmp_path / "head")), "num_speculative_tokens": 3}
    with caplog.at_level(logging.INFO, logger=f"specsure.proposers.{method}"):
        engine = make_engine(str(gguf), spec, dtype="float32")
    module = engine.proposer.modules[0]
    linears = [m for m in module.modules() if isinstance(m, RowLinear)]
    if float_kernels.load()[0] is None:
        assert all(m.blocks is None for m in linears)
        pytest.skip(NO_KERNEL)
    # An own LM head with a draft vocabulary drafts from Q8_0 blocks of those rows only.
    gathered = [module.shared_head.head] if head == "mtp-own-head" else []
    read = [m for m in linears if not any(m is g for g in gathered)]
    assert read and all(m.blocks is not None and m.blocks.format == gguf_blocks.Q8_0 for m in read)
    assert all(m.blocks is None for m in gathered)
    if method == "mtp":  # the block's fused matrices, as the kernel's Layer struct reads them
        assert [getattr(module._layer[0], f"{n}_format") for n in float_kernels.MATRICES] == [gguf_blocks.Q8_0] * 4
    if method == "eagle3":  # the fused ones its kernel path multiplies by
        assert module._qkv_blocks is not None and module._gate_up_blocks is not None
    count = len(read) + len(gathered)
    assert caplog.text.rstrip().endswith(f"; {count} head matrices read as Q8_0 blocks")

    # The drafts are those of a float32 head holding the blocks' values (the products differ in their
    # last bits: torch's over float32 rows, the kernel's over blocks), not the float32 head's own.
    monkeypatch.setenv(ENV, "0")
    exact, twin = (make_engine(str(gguf), spec, dtype="float32") for _ in range(2))
    assert all(m.blocks is None for m in exact.proposer.modules[0].modules() if isinstance(m, RowLinear))
    twin_module = twin.proposer.modules[0]
    with torch.no_grad():
        for quantised, plain_linear in zip(linears, [m for m in twin_module.modules() if isinstance(m, RowLinear)]):
            plain_linear.weight.copy_(q8_values(quantised.weight))
    if method == "mtp":  # its draft rows are gathered at attach
        twin_module.attach(twin_module.target, twin_module.rotary, twin_module.draft_ids)
    if hasattr(twin_module, "use_kernel"):
        assert twin_module.use_kernel(twin.target.lm.row_kernel)  # its fused copies of the new weights
    for got, want, own in zip(*(_module_steps(e, method) for e in (engine, twin, exact))):
        finite = torch.isfinite(want)
        assert torch.equal(finite, torch.isfinite(got))
        torch.testing.assert_close(got[finite], want[finite], rtol=0.0, atol=1e-4 * float(want[finite].abs().max()))
        assert not torch.allclose(got[finite], own[finite], rtol=0.0, atol=1e-3)
    plain = make_engine(str(gguf), None, dtype="float32")
    prompts = [[5, 17, 33, 90, 4, 12], [250, 8, 8, 9, 100]]
    params = SamplingParams(max_tokens=30, temperature=0.0)
    want_ids = [c.token_ids for c in plain.generate(prompts, params)]
    got = engine.generate(prompts, params)
    assert [c.token_ids for c in got] == want_ids
    assert sum(c.stats.draft_tokens for c in got) > 0
    # A tree's levels run on the torch path (HeadCache.lay_out), through the RowLinears' blocks.
    monkeypatch.delenv(ENV)
    tree = make_engine(str(gguf), {**spec, "speculative_token_tree": "[(0,), (1,), (0, 0)]"}, dtype="float32")
    assert tree.proposer.tree is not None  # drafted as a tree, not a chain
    assert [c.token_ids for c in tree.generate(prompts, params)] == want_ids


@pytest.mark.parametrize("target_int8", [False, True], ids=["float32-target", "int8-target"])
@pytest.mark.parametrize("head", ["mtp", "mtp-own-head", "mtp-draft-vocab", "eagle3", "eagle"])
def test_a_head_takes_int8_activations_whatever_its_targets_products_and_the_output_stays_exact(
        head: str, target_int8: bool, target: tuple[Path, Path], tmp_path: Path,
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    # a draft's arithmetic only chooses what the target verifies, so the head's products are int8
    # (cheaper on AVX2) beside a float32 target too, and the output is that target's plain decoding
    gguf, folder = target
    if float_kernels.load()[0] is None:
        pytest.skip(NO_KERNEL)
    method = head.split("-")[0]
    spec = {"method": method, "model": str(_head(head, folder, tmp_path / "head")), "num_speculative_tokens": 3}
    with caplog.at_level(logging.INFO, logger=f"specsure.proposers.{method}"):
        engine = make_engine(str(gguf), spec, dtype="float32", int8_activations=target_int8)
    assert (engine.target.lm.int8_matrices > 0) == target_int8
    module = engine.proposer.modules[0]
    read = [m.blocks for m in module.modules() if isinstance(m, RowLinear) and m.blocks is not None]
    # packed 8 rows side by side (R8_0), a last group of fewer rows padded (the EAGLE-3 head's 197)
    assert read and {b.format for b in read} == {gguf_blocks.R8_0}
    if method == "eagle3":
        assert any(b.rows % 8 for b in read)
    if method == "mtp":
        assert {getattr(module._layer[0], f"{n}_format") for n in float_kernels.MATRICES} <= gguf_blocks.INT8_FORMATS
        assert module._blocks["down"] is module.block.mlp.down_proj.blocks  # packed once, not twice
    if method == "eagle3":
        assert {module._qkv_blocks.format, module._gate_up_blocks.format} <= gguf_blocks.INT8_FORMATS
    assert caplog.text.rstrip().endswith("head matrices read as Q8_0 blocks with int8 activations")
    # the int8 products' logits are the Q8_0 head's, up to the rounding of the activations: close, not equal
    monkeypatch.setenv(INT8_ENV, "0")
    q8 = make_engine(str(gguf), spec, dtype="float32")
    assert {m.blocks.format for m in q8.proposer.modules[0].modules()
            if isinstance(m, RowLinear) and m.blocks is not None} == {gguf_blocks.Q8_0}
    if head == "mtp-draft-vocab":  # the target's LM head rows of the draft vocabulary: packed, not Q8_0 floats
        normed = torch.randn(1, 64)
        with torch.inference_mode():  # as the engine drafts
            got, want = module._draft_logits(normed), q8.proposer.modules[0]._draft_logits(normed)
        torch.testing.assert_close(got, want, rtol=0.0, atol=0.05 * float(want.abs().max()))
        assert got.shape == (1, 200) and not torch.equal(got, want)
    monkeypatch.delenv(INT8_ENV)
    for got, want in zip(*(_module_steps(e, method) for e in (engine, q8))):
        finite = torch.isfinite(want)
        assert torch.equal(finite, torch.isfinite(got))
        scale = float(want[finite].abs().max())
        torch.testing.assert_close(got[finite], want[finite], rtol=0.0, atol=0.05 * scale)
        assert not torch.equal(got[finite], want[finite])
    plain = make_engine(str(gguf), None, dtype="float32", int8_activations=target_int8)
    prompts = [[5, 17, 33, 90, 4, 12], [250, 8, 8, 9, 100]]
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    want_ids = [c.token_ids for c in plain.generate(prompts, params)]
    got = engine.generate(prompts, params)
    assert [c.token_ids for c in got] == want_ids
    assert sum(c.stats.draft_tokens for c in got) > 0
    tree = make_engine(str(gguf), {**spec, "speculative_token_tree": "[(0,), (1,), (0, 0)]"}, dtype="float32",
                       int8_activations=target_int8)
    assert [c.token_ids for c in tree.generate(prompts, params)] == want_ids


def q8_values(weight: torch.Tensor) -> torch.Tensor:
    """The float32 values Q8_0 blocks of ``weight`` hold."""
    matrix = gguf_blocks.q8_blocks(weight)
    assert matrix is not None
    return matrix.dequantized()


def test_a_bf16_target_keeps_its_head_as_loaded(target: tuple[Path, Path], tmp_path: Path) -> None:
    # the kernel reads blocks in float32 only: in bf16 neither the target nor its head reads them
    gguf, folder = target
    spec = {"method": "mtp", "model": str(_head("mtp", folder, tmp_path / "head")), "num_speculative_tokens": 2}
    engine = make_engine(str(gguf), spec, dtype="bfloat16")
    assert not engine.target.lm.blocks_used
    assert all(m.blocks is None for m in engine.proposer.modules[0].modules() if isinstance(m, RowLinear))


def test_a_float32_target_from_safetensors_keeps_a_float32_head(tiny_llama: Path, tmp_path: Path) -> None:
    # blocks only where the target itself reads blocks: a safetensors target reads float32 rows
    head = str(write_mtp_head(tmp_path / "head", tiny_llama, seed=3))
    engine = make_engine(str(tiny_llama), {"method": "mtp", "model": head, "num_speculative_tokens": 2}, dtype="float32")
    module = engine.proposer.modules[0]
    assert all(m.blocks is None for m in module.modules() if isinstance(m, RowLinear))


@pytest.mark.parametrize("head", ["mtp-draft-vocab", "eagle3"])
def test_int8_drafts_beside_a_float32_target_keep_its_sampling_distribution(
        head: str, target: tuple[Path, Path], tmp_path: Path) -> None:
    # an int8 draft samples from its own q and the verifier corrects with that same q: the output
    # is still distributed as the float32 target's, whatever the draft's rounding
    gguf, folder = target
    if float_kernels.load()[0] is None:
        pytest.skip(NO_KERNEL)
    method = head.split("-")[0]
    spec = {"method": method, "model": str(_head(head, folder, tmp_path / "head")), "num_speculative_tokens": 2}
    engine = make_engine(str(gguf), spec, dtype="float32")
    read = {m.blocks.format for m in engine.proposer.modules[0].modules()
            if isinstance(m, RowLinear) and m.blocks is not None}
    assert read == {gguf_blocks.R8_0}  # the draft's products are int8, the target's float32
    assert engine.target.lm.int8_matrices == 0
    prompt, runs = [5, 17, 33, 90], 1200
    params = SamplingParams(max_tokens=3, temperature=1.0, top_k=6, ignore_eos=True)
    counts = second_token_counts(engine, prompt, params, runs, VOCAB)
    # a random head's drafts are mostly rejected: this checks the recovered tokens (the draft model
    # test in test_int8_activations.py checks mostly accepted drafts)
    assert 0 < engine.stats.accepted_per_position[0] < engine.stats.drafts
    lm = engine.target.lm
    got, want = pooled(counts, second_token_marginal(lm, prompt, params))
    assert chi2(got, want) < chi2_critical(len(want) - 1)
    # the test can fail: the same counts are far from the target's at another temperature
    got, other = pooled(counts, second_token_marginal(lm, prompt, SamplingParams(temperature=2.0, top_k=6)))
    assert chi2(got, other) > chi2_critical(len(other) - 1)
