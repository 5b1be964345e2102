"""The C decode kernel: bf16 one-token steps agree with the torch ops, and its absence (and the float32
kernel's) is explained."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import (
    LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Phi3Config, Phi3ForCausalLM, Qwen2Config,
    Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM,
)

from specsure.config.dtype_choice import c_compiler
from specsure.models import CausalLM
from specsure.models import float_kernel as float_kernels
from specsure.models import kernel as kernels
from tiny import gemma_families
from trees import TREE, node_paths

SHAPE = dict(vocab_size=96, hidden_size=64, intermediate_size=80, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512)
FAMILIES = {
    "llama": (LlamaForCausalLM, LlamaConfig(**SHAPE)),
    "llama-biased": (LlamaForCausalLM, LlamaConfig(**SHAPE, attention_bias=True)),
    "qwen2": (Qwen2ForCausalLM, Qwen2Config(**SHAPE, tie_word_embeddings=True)),
    "qwen3": (Qwen3ForCausalLM, Qwen3Config(**SHAPE, head_dim=16)),  # per-head q and k norms before RoPE
    # a window of 6, narrower than a 9-token verify step: its last rows see draft tokens only
    "mistral-window": (MistralForCausalLM, MistralConfig(**SHAPE, sliding_window=6)),
    # RoPE on the first 12 of each head's 16 dims; q|k|v and gate|up fused in the checkpoint; a window
    "phi4-mini": (Phi3ForCausalLM, Phi3Config(**SHAPE, pad_token_id=None, sliding_window=7,
                                              rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                                               "partial_rotary_factor": 0.75})),
    **gemma_families(SHAPE, head_dim=16),
}


@pytest.fixture(params=["amx", "dot"])
def products(request):
    """The kernel with its products on AMX tiles, then on the dot-product loop (None: no kernel here)."""
    kernel, _ = kernels.load()
    if kernel is None:
        yield None
        return
    yield kernel.with_amx(request.param == "amx")
    kernel.with_amx(kernel.amx)  # the switch is process-wide: put it back


def _pair(family: str, kernel: kernels.Kernel | None = None) -> tuple[CausalLM, CausalLM]:
    """Two bf16 copies of one random model: the first steps through the kernel, the second through torch."""
    cls, config = FAMILIES[family]
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        hf = cls(config).eval()
        with torch.no_grad():
            for p in hf.parameters():
                p.normal_(0.0, 0.2)
        models.append(CausalLM(hf.to(torch.bfloat16)))
    if kernel is not None:
        models[0]._native.kernel = kernel
    models[1]._native.kernel = None
    return models[0], models[1]


def test_products_are_row_invariant_and_close_to_torch(products):
    """Weight tails (rows not a multiple of the 4-row block, widths not of 32) and 1 to 13 rows (tiles
    of 6 and what is left): every row's bits whatever runs with it, and torch's up to bf16 rounding."""
    if products is None:
        return
    torch.manual_seed(0)
    for out_features, in_features in ((13, 37), (64, 64), (203, 96), (18, 600)):
        weight = torch.randn(out_features, in_features).to(torch.bfloat16)
        x = torch.randn(13, in_features).to(torch.bfloat16)
        want = (x.float() @ weight.float().T)
        for rows in range(1, 14):
            got = products.linear_rows(weight, x[:rows].contiguous())
            torch.testing.assert_close(got.float(), want[:rows], atol=0.02 * float(want.abs().max()), rtol=0.01)
            for i in range(rows):
                assert torch.equal(got[i], products.linear_rows(weight, x[i:i + 1].contiguous())[0])


@pytest.mark.parametrize("family", FAMILIES)
def test_kernel_steps_match_the_torch_ops(family, products):
    kernel, why = kernels.load()
    fast, ref = _pair(family, products)
    if kernel is None:  # a CPU without AVX512-BF16, or no compiler: the path must say so
        assert why in fast.path
        return
    assert "rows in C" in fast.path
    prompt = [5, 17, 3, 88, 42, 9, 61, 2, 30, 7]
    for lm in (fast, ref):
        lm.forward(prompt)
    token = 11
    for step in range(300):  # past the cache's first 256 positions, so its buffers grow mid-run
        a = fast.forward([token], hidden=True, aux_layers=(0, 2))
        b = ref.forward([token], hidden=True, aux_layers=(0, 2))
        scale = float(b.logits.abs().max())
        # bf16 rounds every step; the two differ only in float32 summation order inside them.
        torch.testing.assert_close(a.logits, b.logits, atol=0.03 * scale, rtol=0)
        torch.testing.assert_close(a.aux_hidden.float(), b.aux_hidden.float(), atol=0.05, rtol=0.05)
        token = int(b.logits[-1].argmax())
    assert fast.cache_len == ref.cache_len == len(prompt) + 300
    # What the kernel wrote into the cache serves torch's own multi-token forward afterwards.
    fast.crop(len(prompt) + 150)
    ref.crop(len(prompt) + 150)
    torch.testing.assert_close(fast.forward([1, 2, 3]).logits, ref.forward([1, 2, 3]).logits,
                               atol=0.03 * scale, rtol=0)


def test_the_kernel_can_be_turned_off_and_the_path_says_so(monkeypatch):
    monkeypatch.setattr(kernels, "_loaded", None)
    monkeypatch.setenv("SPECSURE_KERNEL", "0")
    fast, _ = _pair("llama")
    assert fast._native.kernel is None
    assert "few-row steps on torch ops: SPECSURE_KERNEL=0 turns the C kernel off" in fast.path


@pytest.mark.parametrize(("module", "needs"), [(kernels, {"avx512f", "avx512bw", "avx512vl", "avx512_bf16"}),
                                                (float_kernels, {"avx2", "fma"})], ids=["bf16", "float32"])
def test_a_compiler_that_fails_is_reported_not_hidden(monkeypatch, tmp_path, module, needs):
    monkeypatch.delenv("SPECSURE_KERNEL", raising=False)  # the switch would answer before the compiler
    if not needs <= kernels.cpu_flags():
        kernel, why = module._load()
        assert kernel is None and "this CPU lacks" in why
        return
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CC", "/bin/false")
    kernel, why = module._load()
    assert kernel is None and why.startswith("the C kernel did not build or load: /bin/false failed")
    assert not list(tmp_path.rglob("*.partial"))  # nothing half-written is left in the cache




@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral-window", "phi4-mini", "gemma2", "gemma3"])
def test_verify_rows_trees_and_batches_match_the_torch_ops(family, products):
    from specsure.models.causal_lm import Call
    from specsure.models.token_tree import TokenTree

    fast, ref = _pair(family, products)
    if products is None:
        return  # the path's reason is checked above; both run torch here
    prompt = [5, 17, 3, 88, 42, 9, 61, 2, 30, 7]
    for lm in (fast, ref):
        lm.forward(prompt)
    close = dict(atol=0.03 * float(ref.forward([1]).logits.abs().max()), rtol=0)
    fast.forward([1])
    for ids in ([4, 8, 15, 16, 23, 42, 50, 51, 52], [60, 61]):  # verify steps of a chain
        torch.testing.assert_close(fast.forward(ids).logits, ref.forward(ids).logits, **close)
    tree = TokenTree.from_parents(TREE)
    start = fast.cache_len
    torch.testing.assert_close(fast.forward(list(range(20, 27)), tree=tree).logits,
                               ref.forward(list(range(20, 27)), tree=tree).logits, **close)
    for lm in (fast, ref):
        lm.keep(start, [0, 3, 5, 6])
    # Two more sequences batched with the first: one a step, one a short continuation.
    fast_views, ref_views = [fast.fork(), fast.fork()], [ref.fork(), ref.fork()]
    for view in fast_views + ref_views:
        view.forward(prompt)
    calls = lambda lm, views: [Call(lm, [3]), Call(views[0], [7, 8, 9]), Call(views[1], [11])]  # noqa: E731
    for a, b in zip(fast.forward_batch(calls(fast, fast_views)), ref.forward_batch(calls(ref, ref_views))):
        torch.testing.assert_close(a.logits, b.logits, **close)


@pytest.mark.parametrize("family", ["llama", "llama-biased", "qwen3", "mistral-window", "phi4-mini", "gemma2",
                                    "gemma3"])
def test_exact_mode_verify_rows_equal_decode_steps_bit_for_bit(family, products):
    from specsure.models.token_tree import TokenTree

    verify, decode = _pair(family, products)
    if products is None:
        return
    decode._native.kernel = products
    prompt = [5, 17, 3, 88, 42, 9, 61, 2, 30, 7]
    for lm in (verify, decode):
        lm.forward(prompt)
        lm.forward([1])  # the kernels' buffers are ready after the first forward
    draft = [4, 8, 15, 16, 23, 42, 50, 51, 52]
    rows = verify.forward(draft).logits
    steps = torch.cat([decode.forward([t]).logits for t in draft])
    assert torch.equal(rows, steps)
    tree = TokenTree.from_parents(TREE)
    start = verify.cache_len
    nodes = verify.forward(list(range(20, 27)), tree=tree).logits
    for node, path in enumerate(node_paths(TREE)):  # each node equals decoding its own path one token at a time
        decode.crop(start)
        last = [decode.forward([20 + i]).logits for i in path][-1]
        assert torch.equal(nodes[node], last[0]), f"node {node}"


def test_in_bf16_every_method_equals_plain_decoding_on_the_kernel(tmp_path, products):
    """On the kernel (AMX or dot-product tiles) a verify row is the decode step's bits, so bf16 greedy
    output is plain's exactly."""
    from specsure import SamplingParams, make_engine
    from tiny import build_tiny_llama

    target = str(build_tiny_llama(tmp_path / "t", vocab_size=96, hidden_size=64, num_layers=3))
    greedy = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)
    prompts = [[5, 6, 7, 8, 9, 10, 5, 6, 7], [40, 41, 3, 50, 40, 41, 3, 50]]
    plain = make_engine(target, None, dtype="bfloat16")
    if products is None:  # no bit-exact claim without the kernel; the path says why
        assert kernels.load()[1] in plain.target.lm.path
        return
    expected = [[c.token_ids for c in plain.generate([p], greedy)] for p in prompts]
    specs = [{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3},
             {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3,
              "prompt_lookup_branches": 3},
             {"method": "suffix", "num_speculative_tokens": 6},
             {"method": "draft_model", "model": target, "num_speculative_tokens": 5}]
    for spec in specs:
        engine = make_engine(target, spec, dtype="bfloat16")
        got = [[c.token_ids for c in engine.generate([p], greedy)] for p in prompts]
        assert got == expected, spec
        assert engine.stats.drafts > 0


def test_draft_heads_run_their_bf16_products_on_the_kernel(tmp_path, products):
    """A loaded head's linears become RowLinear: kernel products for its few bf16 rows where there is
    a kernel, torch's otherwise."""
    from specsure import SamplingParams, make_engine
    from specsure.models.loading import load_model
    from specsure.proposers.head_layer import RowLinear
    from specsure.train import initial_module, save_mtp_head
    from tiny import build_tiny_llama

    target = str(build_tiny_llama(tmp_path / "t", vocab_size=96, hidden_size=64, num_layers=3))
    loaded = load_model(target, dtype="float32")
    head = save_mtp_head(initial_module(loaded.lm, seed=2), loaded.lm, tmp_path / "head", {})
    engine = make_engine(target, {"method": "mtp", "model": str(head), "num_speculative_tokens": 2},
                         dtype="bfloat16")
    linears = [m for m in engine.proposer.modules[0].modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(type(m) is RowLinear for m in linears)
    if products is None:  # no kernel on this CPU: the head keeps torch's bf16 products
        layer = linears[0]
        assert layer.kernel is None
        x = torch.randn(3, layer.in_features).to(torch.bfloat16)
        with torch.inference_mode():
            assert torch.equal(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))
        return
    layer = linears[0]
    layer.kernel = products
    x = torch.randn(3, layer.in_features).to(torch.bfloat16)
    with torch.inference_mode():
        got = layer(x)
        one = layer(x[:1])
    want = torch.nn.functional.linear(x, layer.weight, layer.bias)
    assert torch.equal(one, got[:1])  # row-invariant on either product path
    if products.amx:
        assert torch.equal(got, want)  # AMX products are oneDNN's bits
    else:  # the dot-product tiles sum in another order than oneDNN
        torch.testing.assert_close(got, want, atol=0.02, rtol=0.02)
    greedy = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    plain = make_engine(target, None, dtype="bfloat16")
    prompt = [5, 6, 7, 8, 9, 10, 5, 6, 7]
    assert engine.generate([prompt], greedy)[0].token_ids == plain.generate([prompt], greedy)[0].token_ids


def _kernel_then_torch(module: torch.nn.Module, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A head module's (hidden, logits) for 2 rows after a 6-row first call, on its kernel path, then
    on its torch ops: the first call sizes the cache on torch either way."""
    from specsure.proposers.head_layer import HeadCache

    gen = torch.Generator().manual_seed(seed)
    first, more = (torch.randn(n, 64, generator=gen).to(torch.bfloat16) for n in (6, 2))
    ids = torch.tensor([3, 9, 27, 81, 5, 7]), torch.tensor([11, 13])
    saved, outs = module._kernel, []
    with torch.inference_mode():
        for kernel in (saved, None):
            cache = HeadCache()
            module(first, ids[0], cache)
            module._kernel = kernel
            outs.append(module(more, ids[1], cache))
            assert cache.length == 8 and cache.kv.layers[0].get_seq_length() == 8
        module._kernel = saved
    return outs


def test_eagle3_midlayer_on_the_kernel_matches_its_torch_ops(tmp_path, products):
    """In bf16 the EAGLE-3 head's layer runs on the kernel: the same arithmetic as its torch
    ops up to float32 summation order, and the engine still equals plain decoding."""
    from heads import write_eagle3_head
    from specsure import SamplingParams, make_engine
    from tiny import build_tiny_llama

    target = build_tiny_llama(tmp_path / "t", vocab_size=96, hidden_size=64, num_layers=3)
    head = write_eagle3_head(tmp_path / "h", target, draft_vocab=48)
    engine = make_engine(str(target), {"method": "eagle3", "model": str(head), "num_speculative_tokens": 3},
                         dtype="bfloat16")
    module = engine.proposer.module
    if products is None:  # no kernel: the torch ops run
        assert module._kernel is None
        return
    assert module._kernel is not None
    (hidden, logits), (want_hidden, want_logits) = _kernel_then_torch(module, seed=3)
    # bf16 rounds every op; the two differ in float32 summation order inside them.
    torch.testing.assert_close(hidden.float(), want_hidden.float(), atol=0.03 * float(want_hidden.abs().max()), rtol=0)
    finite = torch.isfinite(want_logits)
    assert torch.equal(finite, torch.isfinite(logits))
    want = want_logits[finite]
    torch.testing.assert_close(logits[finite], want, atol=0.03 * float(want.abs().max()), rtol=0)
    greedy = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    plain = make_engine(str(target), None, dtype="bfloat16")
    prompt = [5, 6, 7, 8, 9, 10, 5, 6, 7]
    assert engine.generate([prompt], greedy)[0].token_ids == plain.generate([prompt], greedy)[0].token_ids


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_mtp_block_on_the_kernel_matches_its_torch_ops(tmp_path, products, family):
    """In bf16 a dense MTP module runs on the kernel (decode_rows on the head's cache), a Qwen3 block's
    per-head norms too: its torch ops' arithmetic up to float32 summation order, and the engine still
    equals plain."""
    from specsure import SamplingParams, make_engine
    from specsure.models.loading import load_model
    from specsure.train import initial_module, save_mtp_head
    from tiny import build_tiny_llama, random_model

    if family == "qwen3":
        target = str(tmp_path / "t")
        random_model(Qwen3ForCausalLM, Qwen3Config(vocab_size=96, hidden_size=64, intermediate_size=80,
                                                   num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                                   head_dim=16, max_position_embeddings=512)).save_pretrained(target)
    else:
        target = str(build_tiny_llama(tmp_path / "t", vocab_size=96, hidden_size=64, num_layers=3))
    loaded = load_model(target, dtype="float32")
    module = initial_module(loaded.lm, seed=4)
    with torch.no_grad():  # a random block, so the check is not of near-zero outputs
        for name, p in module.named_parameters():
            if "block." in name and not name.endswith("norm.weight"):
                p.normal_(0.0, 0.2)
    head = save_mtp_head(module, loaded.lm, tmp_path / "head", {})
    engine = make_engine(target, {"method": "mtp", "model": str(head), "num_speculative_tokens": 3}, dtype="bfloat16")
    module = engine.proposer.modules[0]
    if products is None:
        assert module._kernel is None
        return
    assert module._kernel is not None
    assert ("q_norm" in module._weights) == (family == "qwen3")
    (hidden, logits), (want_hidden, want_logits) = _kernel_then_torch(module, seed=5)
    # bf16 rounds every op; the two differ in float32 summation order inside them (as above).
    torch.testing.assert_close(hidden.float(), want_hidden.float(), atol=0.03 * float(want_hidden.abs().max()), rtol=0)
    torch.testing.assert_close(logits, want_logits, atol=0.03 * float(want_logits.abs().max()), rtol=0)
    greedy = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    plain = make_engine(target, None, dtype="bfloat16")
    prompt = [5, 6, 7, 8, 9, 10, 5, 6, 7]
    assert engine.generate([prompt], greedy)[0].token_ids == plain.generate([prompt], greedy)[0].token_ids


def test_a_kernel_library_others_could_write_is_never_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """Native code runs in the process: a cached library in a folder others can write is rebuilt privately."""
    import logging
    import os

    from specsure.models import kernel

    cc = c_compiler()
    assert cc is not None, "the kernels' tests need the C compiler the install needs"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    source = tmp_path / "k.c"
    source.write_text("int answer(void) { return 42; }\n")
    folder = tmp_path / "specsure" / "kernels"
    folder.mkdir(parents=True)
    os.chmod(folder, 0o777)  # the user's own folder, made under a loose umask: closed, then used
    first = kernel.build_library(cc, source, ("-shared", "-fPIC", "-O1"), "probe")
    assert first.parent == folder and not os.stat(folder).st_mode & 0o022
    monkeypatch.setattr(os, "geteuid", lambda: os.getuid() + 1)  # as another user sees it: not trusted
    with caplog.at_level(logging.WARNING, logger="specsure.models.kernel"):
        built = kernel.build_library(cc, source, ("-shared", "-fPIC", "-O1"), "probe")
    assert built.parent != folder and "belongs to another user" in caplog.text
    monkeypatch.undo()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    private = kernel.build_library(cc, source, ("-shared", "-fPIC", "-O1"), "probe")
    assert private.parent == folder and kernel.build_library(cc, source, ("-shared", "-fPIC", "-O1"), "probe") == private
    os.chmod(private, 0o666)  # the library itself made writable by others: built again, private
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="specsure.models.kernel"):
        again = kernel.build_library(cc, source, ("-shared", "-fPIC", "-O1"), "probe")
    assert again == private and "building it again" in caplog.text and not os.stat(private).st_mode & 0o022


def test_a_killed_builds_half_library_is_swept_by_the_next_build(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """gcc outlives a parent killed with -9 and leaves its .so.partial; one in progress is left alone."""
    import os
    import time

    from specsure.models import kernel

    cc = c_compiler()
    assert cc is not None, "the kernels' tests need the C compiler the install needs"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = tmp_path / "specsure" / "kernels"
    folder.mkdir(parents=True, mode=0o700)
    stale, fresh = folder / "tmpold.so.partial", folder / "tmpnew.so.partial"
    stale.write_bytes(b"half")
    fresh.write_bytes(b"half")
    old = time.time() - kernel.STALE_PARTIAL_S - 60
    os.utime(stale, (old, old))
    source = tmp_path / "k.c"
    source.write_text("int answer(void) { return 42; }\n")
    kernel.build_library(cc, source, ("-shared", "-fPIC", "-O1"), "probe")
    assert not stale.exists() and fresh.exists()
