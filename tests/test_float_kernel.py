"""The float32 C kernel: its forwards agree with the torch ops, a verify row is the decode step's
bits, and its absence is explained (its failing compiler: test_kernel.py)."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Phi3Config,
    Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM,
)

from specsure.models import CausalLM
from specsure.models import float_kernel as float_kernels
from specsure.models import products
from specsure.models.token_tree import TokenTree
from tiny import gemma_families
from trees import TREE, node_paths

SHAPE = dict(vocab_size=96, hidden_size=64, intermediate_size=84, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512)
FAMILIES = {
    "llama": (LlamaForCausalLM, LlamaConfig(**SHAPE)),
    "llama-biased": (LlamaForCausalLM, LlamaConfig(**SHAPE, attention_bias=True)),
    "qwen2": (Qwen2ForCausalLM, Qwen2Config(**SHAPE, tie_word_embeddings=True)),
    "odd-head-dim": (LlamaForCausalLM, LlamaConfig(**{**SHAPE, "hidden_size": 60, "num_attention_heads": 6})),
    # attention's code for the usual head sizes is its own (accumulators in registers): 64 and 128
    "head-dim-64": (LlamaForCausalLM, LlamaConfig(**{**SHAPE, "hidden_size": 128, "num_attention_heads": 2,
                                                     "num_key_value_heads": 1})),
    "head-dim-128": (LlamaForCausalLM, LlamaConfig(**{**SHAPE, "hidden_size": 256, "num_attention_heads": 2,
                                                      "num_key_value_heads": 1})),
    # a window of 6 positions, narrower than a 9-token verify step: its last rows see draft tokens only
    "mistral-window": (MistralForCausalLM, MistralConfig(**SHAPE, sliding_window=6)),
    # fused in the checkpoint, every layer windowed, LongRoPE's factors in the module's cos and sin
    "phi3": (Phi3ForCausalLM, Phi3Config(**SHAPE, sliding_window=6, pad_token_id=None,
                                         original_max_position_embeddings=256,
                                         rope_parameters={"rope_type": "longrope", "rope_theta": 1e4,
                                                          "short_factor": [1.0, 1.2, 1.5, 2.0, 3.0, 5.0, 8.0, 9.0],
                                                          "long_factor": [1.0] * 8})),
    # Phi-4-mini's partial rotary: the first 12 of each head's 16 dims turn, the last 4 pass
    "phi4-mini": (Phi3ForCausalLM, Phi3Config(**SHAPE, pad_token_id=None,
                                              rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                                               "partial_rotary_factor": 0.75})),
    **gemma_families(SHAPE, head_dim=16),
}
PROMPT = [5, 17, 3, 88, 42, 9, 61, 2, 30, 7]


@pytest.fixture
def kernel():
    """The float32 kernel, or None where this machine can't build it (then the path must say why)."""
    loaded, _ = float_kernels.load()
    return loaded


def _pair(family: str, kernel: float_kernels.FloatKernel | None) -> tuple[CausalLM, CausalLM]:
    """Two float32 copies of one random model: the first runs the C kernel, the second torch ops."""
    cls, config = FAMILIES[family]
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        hf = cls(config).eval()
        with torch.no_grad():
            for p in hf.parameters():
                p.normal_(0.0, 0.2)
        models.append(CausalLM(hf))
    models[0]._native.float_kernel = kernel
    models[1]._native.float_kernel = None
    return models[0], models[1]


@pytest.fixture(scope="module")
def narrow():
    """The AVX2 build on a CPU that has AVX-512 (None elsewhere: `kernel` is that build there)."""
    if float_kernels.load()[0] is None or not float_kernels.wide():
        return None
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(float_kernels.LANES_ENV, "8")
        return float_kernels._load()[0]


@pytest.mark.parametrize("build", ["loaded", "avx2"])
def test_products_are_row_invariant_and_close_to_torch(kernel, narrow, build):
    kernel = narrow if build == "avx2" else kernel
    if kernel is None:
        return
    torch.manual_seed(0)
    for out_features, in_features in ((13, 37), (7, 45), (64, 64), (200, 96)):  # tails of every width, 8 and 16 lanes
        weight, bias = torch.randn(out_features, in_features), torch.randn(out_features)
        x = torch.randn(11, in_features)
        for rows in range(1, 12):
            got = kernel.linear_rows(weight, x[:rows].contiguous(), bias)
            torch.testing.assert_close(got, x[:rows] @ weight.T + bias, atol=1e-4, rtol=1e-5)
            for i in range(rows):  # each row's bits whatever runs with it
                assert torch.equal(got[i], kernel.linear_rows(weight, x[i:i + 1].contiguous(), bias)[0])


def test_project_keeps_torch_products_where_gradients_are_wanted(kernel):
    weight = torch.randn(8, 16, requires_grad=True)
    out = products.project(torch.randn(3, 16), weight)
    assert out.grad_fn is not None  # training's products stay on autograd
    with torch.no_grad():
        assert products.project(torch.randn(3, 16), weight).grad_fn is None


@pytest.mark.parametrize("family", FAMILIES)
def test_kernel_steps_and_verify_rows_match_the_torch_ops(family, kernel):
    fast, ref = _pair(family, kernel)
    if kernel is None:
        assert float_kernels.load()[1] in fast.path
        return
    assert "float32 forwards in C" in fast.path
    for lm in (fast, ref):
        lm.forward(PROMPT)
    close = dict(atol=1e-4 * float(ref.forward([1]).logits.abs().max()), rtol=0)
    fast.forward([1])
    token = 11
    for _ in range(260):  # past the cache's first 256 positions, so its buffers grow mid-run
        a = fast.forward([token], hidden=True, aux_layers=(0, 2))
        b = ref.forward([token], hidden=True, aux_layers=(0, 2))
        torch.testing.assert_close(a.logits, b.logits, **close)
        torch.testing.assert_close(a.aux_hidden, b.aux_hidden, atol=1e-4, rtol=1e-4)
        token = int(b.logits[-1].argmax())
    for ids in ([4, 8, 15, 16, 23, 42, 50, 51, 52], [60, 61]):  # verify steps of a chain
        torch.testing.assert_close(fast.forward(ids).logits, ref.forward(ids).logits, **close)
    tree = TokenTree.from_parents(TREE)
    torch.testing.assert_close(fast.forward(list(range(20, 27)), tree=tree).logits,
                               ref.forward(list(range(20, 27)), tree=tree).logits, **close)
    # Two more sequences batched with the first: one a step, one a short continuation.
    from specsure.models.causal_lm import Call

    fast_views, ref_views = [fast.fork(), fast.fork()], [ref.fork(), ref.fork()]
    for view in fast_views + ref_views:
        view.forward(PROMPT)
    calls = lambda lm, views: [Call(lm, [3]), Call(views[0], [7, 8, 9]), Call(views[1], [11])]  # noqa: E731
    for a, b in zip(fast.forward_batch(calls(fast, fast_views)), ref.forward_batch(calls(ref, ref_views))):
        torch.testing.assert_close(a.logits, b.logits, **close)
    # What the kernel wrote into the cache serves torch's own long forward afterwards.
    fast.crop(len(PROMPT) + 150)
    ref.crop(len(PROMPT) + 150)
    long = list(range(1, 90))  # past the kernel's 64 rows: torch runs it
    torch.testing.assert_close(fast.forward(long).logits, ref.forward(long).logits, **close)


@pytest.mark.parametrize("family", ["llama", "llama-biased", "odd-head-dim", "head-dim-64", "head-dim-128",
                                    "mistral-window", "phi3", "phi4-mini", "gemma2", "gemma3"])
def test_verify_rows_equal_decode_steps_bit_for_bit(family, kernel):
    verify, decode = _pair(family, kernel)
    if kernel is None:
        return
    decode._native.float_kernel = kernel
    for lm in (verify, decode):
        # 41 cached positions: the rows see whole groups of 16 and 32 positions in the cache's own
        # order, groups that end among the draft's tokens, and a few positions past the last group
        lm.forward(PROMPT * 4)
        lm.forward([1])  # the kernel runs once a sequence's cache exists
    draft = [4, 8, 15, 16, 23, 42, 50, 51, 52]
    rows = verify.forward(draft).logits
    steps = torch.cat([decode.forward([t]).logits for t in draft])
    assert torch.equal(rows, steps)
    start = verify.cache_len
    nodes = verify.forward(list(range(20, 27)), tree=TokenTree.from_parents(TREE)).logits
    for node, path in enumerate(node_paths(TREE)):  # each node equals decoding its own path one token at a time
        decode.crop(start)
        last = [decode.forward([20 + i]).logits for i in path][-1]
        assert torch.equal(nodes[node], last[0]), f"node {node}"


def test_the_kernel_can_be_turned_off_and_the_path_says_so(monkeypatch):
    monkeypatch.setattr(float_kernels, "_loaded", None)
    monkeypatch.setenv("SPECSURE_KERNEL", "0")
    cls, config = FAMILIES["llama"]
    lm = CausalLM(cls(config).eval())
    assert lm._native.float_kernel is None
    assert "few-row steps on torch ops: SPECSURE_KERNEL=0 turns the C kernel off" in lm.path


@pytest.mark.parametrize("method", ["eagle3", "mtp"])
def test_draft_heads_run_their_layer_in_c_and_agree_with_their_torch_ops(method, kernel, tmp_path):
    from heads import build_mtp_target, write_eagle3_head

    from specsure import make_engine
    from specsure.proposers.head_layer import HeadCache
    from tiny import build_tiny_llama

    if method == "eagle3":
        target = build_tiny_llama(tmp_path / "t", num_layers=4)
        spec = {"method": "eagle3", "model": str(write_eagle3_head(tmp_path / "h", target, draft_vocab=64))}
    else:
        target = build_mtp_target(tmp_path / "t")
        spec = {"method": "mtp"}
    module = make_engine(str(target), spec, dtype="float32").proposer.modules[0]
    if kernel is None:
        assert module._kernel is None
        return
    assert module._kernel is kernel  # the target's float32 kernel, shared
    hidden = module.fc.out_features if method == "eagle3" else module.eh_proj.out_features
    width = module.fc.in_features if method == "eagle3" else hidden
    torch.manual_seed(0)
    fast, slow = HeadCache(), HeadCache()
    with torch.no_grad():
        prompt = (torch.randn(6, width), torch.tensor([3, 1, 4, 1, 5, 9]))
        prompt = (module.features(prompt[0]) if method == "eagle3" else prompt[0], prompt[1])
        for cache in (fast, slow):  # the first call sizes the head's cache on torch
            module(*prompt, cache)
        for step in range(4):
            features, tokens = torch.randn(1 + step % 2, hidden), torch.tensor([7, 2][: 1 + step % 2])
            a = module(features, tokens, fast)
            saved, module._kernel = module._kernel, None
            b = module(features, tokens, slow)
            module._kernel = saved
            torch.testing.assert_close(a[0], b[0], atol=1e-4, rtol=1e-4)
            finite = torch.isfinite(b[1])
            assert torch.equal(finite, torch.isfinite(a[1]))
            torch.testing.assert_close(a[1][finite], b[1][finite], atol=1e-4, rtol=1e-4)
    assert fast.length == slow.length == 6 + 1 + 2 + 1 + 2


def test_an_avx512_cpu_gets_16_lane_products_unless_told_8(monkeypatch):
    """The AVX-512 build sums in another order than the AVX2 one (close, not equal); each is row-invariant."""
    if float_kernels.load()[0] is None or not float_kernels.wide():
        assert float_kernels.load()[0] is None or "AVX2 products" in float_kernels.load()[1]
        return
    assert float_kernels.load()[1].startswith(("AVX-512 products, ",
                                               "AVX-512 products (Q4 and Q8_0 blocks on AMX tiles), ",
                                               "AVX-512 products (AMX refused by Linux), "))
    monkeypatch.setenv(float_kernels.LANES_ENV, "8")
    assert not float_kernels.wide()
    narrow, why = float_kernels._load()
    assert narrow is not None and why.startswith("AVX2 products, ")
    torch.manual_seed(0)
    weight, x = torch.randn(40, 80), torch.randn(3, 80)
    wide_rows, narrow_rows = float_kernels.load()[0].linear_rows(weight, x), narrow.linear_rows(weight, x)
    torch.testing.assert_close(wide_rows, narrow_rows, atol=1e-4, rtol=1e-5)
    assert not torch.equal(wide_rows, narrow_rows)  # really two builds: 240 sums in another order


def test_the_avx512_products_compile_on_any_machine_with_a_compiler(tmp_path):
    """The 16-lane code is built only on an AVX-512 CPU; elsewhere at least its syntax and types are checked."""
    import subprocess

    from specsure.config.dtype_choice import c_compiler

    cc = c_compiler()
    if cc is None:
        return
    flags = [*float_kernels.FLAGS, *float_kernels.WIDE_FLAGS]
    done = subprocess.run([cc, *flags, "-fsyntax-only", str(float_kernels.SOURCE)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_a_rows_bits_never_depend_on_what_shares_its_forward(family, kernel):
    """In float32 every forward runs in C, however many rows: a decode row batched beside another
    sequence's 150-token prefill has the bits of its one-row step, and a 300-token prompt (over two
    pieces) prefilled whole, in 40-token chunks or after a cached start leaves the same cache and
    logits. On torch's products past 64 rows the rounding moved with the batch."""
    from specsure.models.causal_lm import Call

    lm, _ = _pair(family, kernel)
    if kernel is None:
        return
    long_prompt = [(7 * i) % 90 + 3 for i in range(300)]
    whole = lm.forward(long_prompt).logits[-1]
    lm.crop(0)
    for at in range(0, 300, 40):
        chunked = lm.forward(long_prompt[at:at + 40]).logits[-1]
    assert torch.equal(whole, chunked)
    lm.crop(120)  # a prefix cache's start
    assert torch.equal(lm.forward(long_prompt[120:]).logits[-1], whole)
    alone = lm.forward([5]).logits[-1]
    lm.crop(300)
    other = lm.fork()
    batched = lm.forward_batch([Call(lm, [5]), Call(other, long_prompt[:150])])
    assert torch.equal(batched[0].logits[-1], alone)
