"""llama.cpp as a bench baseline: float GGUF copies, the worker protocol, the missing environment.

The real llama-cpp-python runs only in tests/llamacpp (`make test-llama-cpp`); here its
worker is a shell script or a fake Llama, and the GGUF files are built by the tests, except
the slow checks on the packaged default model.
"""

from __future__ import annotations

import ast
import json
import os
import stat
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from specsure.bench.generation import Generation
from specsure.bench.llamacpp import worker
from specsure.bench.llamacpp.baselines import config_name
from specsure.bench.llamacpp.convert import float_gguf, write_float_gguf
from specsure.bench.llamacpp.runner import LlamaCppError, LlamaCppWorker, ModelSpec
from specsure.bench.results import ALL, BenchResults, prompt_result, summarize
from specsure.cli.main import main

Q = gguf.GGMLQuantizationType

# --- float GGUF copies ---------------------------------------------------------------------


def _fields(path: Path) -> dict[str, object]:
    return {f.name: f.contents() for f in gguf.GGUFReader(path).fields.values() if not f.name.startswith("GGUF.")}


def _tiny_gguf(path: Path) -> dict[str, np.ndarray]:
    """A small llama GGUF: Q4_1 and Q8_0 matrices, an F32 norm, every kind of metadata value."""
    rng = np.random.default_rng(0)
    tensors = {"blk.0.attn_q.weight": rng.normal(size=(8, 64)).astype(np.float32),
               "token_embd.weight": rng.normal(size=(16, 32)).astype(np.float32),
               "blk.0.attn_norm.weight": rng.normal(size=(64,)).astype(np.float32)}
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_uint32("llama.block_count", 1)
    writer.add_float32("llama.rope.freq_base", 10000.0)
    writer.add_bool("tokenizer.ggml.add_bos_token", False)
    writer.add_string("tokenizer.ggml.model", "gpt2")
    writer.add_array("tokenizer.ggml.tokens", ["a", "b", "<|im_end|>"])
    writer.add_array("tokenizer.ggml.token_type", [1, 1, 3])
    writer.add_string("tokenizer.chat_template", "{{ messages }}")
    writer.add_file_type(int(gguf.LlamaFileType.MOSTLY_Q4_1))
    writer.add_tensor("blk.0.attn_q.weight", gguf.quants.quantize(tensors["blk.0.attn_q.weight"], Q.Q4_1), raw_dtype=Q.Q4_1)
    writer.add_tensor("token_embd.weight", gguf.quants.quantize(tensors["token_embd.weight"], Q.Q8_0), raw_dtype=Q.Q8_0)
    writer.add_tensor("blk.0.attn_norm.weight", tensors["blk.0.attn_norm.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return tensors


@pytest.mark.parametrize(("qtype", "torch_dtype"), [("BF16", torch.bfloat16), ("F16", torch.float16), ("F32", torch.float32)])
def test_float_gguf_keeps_metadata_and_holds_torchs_cast_of_the_dequantised_weights(tmp_path, qtype, torch_dtype):
    source = tmp_path / "tiny.Q4_1.gguf"
    _tiny_gguf(source)
    dest = tmp_path / f"tiny.{qtype}.gguf"
    write_float_gguf(source, dest, qtype)

    before, after = _fields(source), _fields(dest)
    assert list(after) == list(before)  # every key, in order, the tokenizer's included
    assert {k for k in before if before[k] != after[k]} == {"general.file_type"}
    assert after["general.file_type"] == int(gguf.LlamaFileType[{"BF16": "MOSTLY_BF16", "F16": "MOSTLY_F16", "F32": "ALL_F32"}[qtype]])

    src = {t.name: t for t in gguf.GGUFReader(source).tensors}
    out = {t.name: t for t in gguf.GGUFReader(dest).tensors}
    assert list(out) == list(src)
    for name, tensor in out.items():
        assert list(tensor.shape) == list(src[name].shape), name
        if src[name].tensor_type == Q.F32:
            assert tensor.tensor_type == Q.F32 and np.array_equal(tensor.data, src[name].data), name
            continue
        assert tensor.tensor_type == Q[qtype], name
        # What specsure runs: the float32 dequantisation, cast by torch to the run's dtype.
        expected = torch.from_numpy(gguf.quants.dequantize(src[name].data, src[name].tensor_type)).to(torch_dtype)
        stored = np.asarray(tensor.data)
        got = torch.from_numpy(stored.view(np.int16).copy()).view(torch.bfloat16) if qtype == "BF16" \
            else torch.from_numpy(stored.copy())
        assert torch.equal(got.reshape(expected.shape), expected), name


def test_float_gguf_is_cached_per_source_file(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    source = tmp_path / "tiny.Q4_1.gguf"
    _tiny_gguf(source)
    first = float_gguf(source, "bfloat16")
    assert first.is_relative_to(tmp_path / "cache" / "specsure") and first.name.endswith(".BF16.gguf")
    written = first.stat().st_mtime_ns
    assert float_gguf(source, "bfloat16") == first and first.stat().st_mtime_ns == written  # reused
    assert float_gguf(source, "float16").name.endswith(".F16.gguf")
    os.utime(source, ns=(written + 10**9, written + 10**9))  # a replaced source is converted again
    assert float_gguf(source, "bfloat16") != first
    assert not list((tmp_path / "cache").rglob("*.tmp-*"))
    with pytest.raises(ValueError, match="valid: float32, float16, bfloat16"):
        float_gguf(source, "int8")


def test_config_names_carry_the_weights() -> None:
    assert config_name("llama.cpp", "bfloat16") == "llama.cpp-bf16"
    assert config_name("llama.cpp-lookup", "float32") == "llama.cpp-f32-lookup"
    assert config_name("llama.cpp-q4_1-lookup", "bfloat16") == "llama.cpp-q4_1-lookup"
    assert config_name("llama.cpp-gguf", "float32") == "llama.cpp-gguf"  # the file as it is, whatever the dtype


# --- the worker's generation loop, on a fake Llama -----------------------------------------


class _Drafter:
    """Scripted drafts, one per call, like LlamaPromptLookupDecoding's interface."""

    def __init__(self, drafts: list[list[int]], num_pred_tokens: int):
        self.drafts, self.num_pred_tokens = list(drafts), num_pred_tokens

    def __call__(self, input_ids, /, **kwargs):
        return np.array(self.drafts.pop(0) if self.drafts else [], dtype=np.intc)


class _FakeLlama:
    """llama-cpp-python's generate loop reduced to its order of events: prefill, then per step a
    draft call, and one yielded token per verified position (accepted, recovered or bonus)."""

    def __init__(self, truth: list[int], draft_model=None):
        self.truth, self.draft_model, self.resets, self.kwargs = truth, draft_model, 0, {}

    def reset(self):
        self.resets += 1

    def generate(self, tokens, **kwargs):
        self.kwargs = kwargs
        ids, i = list(tokens), 0
        while True:
            draft = [] if i == 0 or self.draft_model is None else list(self.draft_model(np.array(ids)))
            for d in [*draft, None]:  # None: the bonus position after a fully accepted draft
                token = self.truth[i]
                i += 1
                ids.append(token)
                yield token
                if token != d:
                    break


def test_worker_counts_drafts_and_accepted_positions_like_vllm() -> None:
    truth = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    drafter = worker.Counting(_Drafter([[2, 3, 9], [], [6, 7]], num_pred_tokens=3))
    llm = _FakeLlama(truth, drafter)
    out = worker._generate(llm, drafter, [100, 101], max_tokens=8, eos_ids=[0])
    # prefill -> 1; draft 2 3 9 -> 2 3 accepted, 4 recovered; empty draft -> 5; draft 6 7 -> both, 8 bonus
    assert out["token_ids"] == truth[:8]
    assert (out["drafts"], out["draft_tokens"], out["accepted_tokens"]) == (2, 5, 4)
    assert out["accepted_per_position"] == [2, 2, 0]
    assert out["seconds"] > 0 and llm.resets == 1
    assert llm.kwargs["temp"] == 0.0 and llm.kwargs["repeat_penalty"] == 1.0


def test_worker_stops_at_eos_without_returning_it() -> None:
    llm = _FakeLlama([7, 8, 2, 9])
    out = worker._generate(llm, None, [1], max_tokens=16, eos_ids=[2])
    assert out["token_ids"] == [7, 8] and out["drafts"] == 0 and out["accepted_per_position"] == []


def test_worker_imports_only_the_standard_library_and_llama_cpp() -> None:
    tree = ast.parse(Path(worker.__file__).read_text(encoding="utf-8"))
    modules = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert {m.split(".")[0] for m in modules} <= set(sys.stdlib_module_names) | {"llama_cpp"}


# --- the worker protocol, on a fake Python -------------------------------------------------


def _fake_python(tmp_path: Path, body: str) -> str:
    path = tmp_path / "fake-python"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


READY = 'SPECSURE_LLAMACPP {"llama_cpp_python": "0.3.36", "system_info": "AVX2 = 1", "models": ["llama.cpp-bf16"]}'
ANSWER = ('SPECSURE_LLAMACPP {"token_ids": [5, 6], "seconds": 0.25, "drafts": 1, "draft_tokens": 3, '
          '"accepted_tokens": 1, "accepted_per_position": [1, 0, 0]}')


def test_worker_protocol_round_trip(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    python = _fake_python(tmp_path, f"""
read setup; echo "$setup" > {log}
echo 'llama.cpp noise on stdout'
echo '{READY}'
while read line; do echo "$line" >> {log}; echo '{ANSWER}'; done""")
    w = LlamaCppWorker(python, [ModelSpec("llama.cpp-bf16", "/m.gguf", 3, max_ngram_size=5)], n_ctx=96, n_threads=2)
    try:
        assert w.info["llama_cpp_python"] == "0.3.36"
        got = w.generate("llama.cpp-bf16", [9, 8], 4, frozenset({2, 0}))
        assert got == Generation((5, 6), 0.25, drafts=1, draft_tokens=3, accepted_tokens=1, accepted_per_position=(1, 0, 0))
    finally:
        w.close()
    setup, request = (json.loads(line) for line in log.read_text().splitlines())
    assert setup == {"models": [{"name": "llama.cpp-bf16", "path": "/m.gguf", "num_pred_tokens": 3, "max_ngram_size": 5}],
                     "n_ctx": 96, "n_threads": 2, "n_batch": 512}
    assert request == {"name": "llama.cpp-bf16", "prompt_ids": [9, 8], "max_tokens": 4, "eos_ids": [0, 2]}


@pytest.mark.parametrize(("body", "words"), [
    ("""read s; echo 'SPECSURE_LLAMACPP {"import_error": "ModuleNotFoundError: llama_cpp"}'""",
     r"llama_cpp does not import .*ModuleNotFoundError.*make llama-cpp"),
    ("""read s; echo 'SPECSURE_LLAMACPP {"error": "ValueError: Failed to load model"}'""",
     r"could not load the models: ValueError: Failed to load model"),
    ("read s; echo 'boom' >&2; kill -ILL $$", r"died starting \(killed by SIGILL\).*AMX.*make llama-cpp.*boom"),
    ("read s; echo 'SPECSURE_LLAMACPP [1]'", r"answered starting with .*worker\.py"),
])
def test_worker_start_failures_say_why(tmp_path: Path, body: str, words: str) -> None:
    with pytest.raises(LlamaCppError, match=f"(?s){words}"):
        LlamaCppWorker(_fake_python(tmp_path, body), [ModelSpec("m", "/m.gguf")], n_ctx=64, n_threads=1)


def test_worker_generate_error_is_a_llama_cpp_error(tmp_path: Path) -> None:
    python = _fake_python(tmp_path, f"""read s; echo '{READY}'
read line; echo 'SPECSURE_LLAMACPP {{"error": "RuntimeError: llama_decode returned -1"}}'
read line; exit 1""")
    w = LlamaCppWorker(python, [ModelSpec("m", "/m.gguf")], n_ctx=64, n_threads=1)
    try:
        with pytest.raises(LlamaCppError, match="failed generating with m: RuntimeError: llama_decode"):
            w.generate("m", [1], 2, frozenset())
        with pytest.raises(LlamaCppError, match=r"died generating with m \(exit 1\)"):
            w.generate("m", [1], 2, frozenset())
    finally:
        w.close()


# --- results: own plain, and configurations compared for information only ----------------


def test_own_plain_match_and_incomparable_configs_in_the_summary() -> None:
    ref = (1, 2, 3, 4)
    prompts = [
        prompt_result("plain", "p", "qa", 5, [Generation(ref, 1.0)], None),
        prompt_result("llama.cpp-bf16", "p", "qa", 5, [Generation((1, 2, 3, 5), 1.0)], ref),
        prompt_result("llama.cpp-bf16-lookup", "p", "qa", 5, [Generation((1, 2, 9, 9), 1.0)], ref, (1, 2, 3, 5)),
        prompt_result("llama.cpp-q4_1", "p", "qa", 5, [Generation((7, 7), 1.0)], ref),
    ]
    configs = [("plain", "specsure", False), ("llama.cpp-bf16", "llama.cpp", False),
               ("llama.cpp-bf16-lookup", "llama.cpp", True), ("llama.cpp-q4_1", "llama.cpp", False)]
    res = summarize({}, configs, [], prompts, "plain", own_plain={"llama.cpp-bf16-lookup": "llama.cpp-bf16"},
                    incomparable=["llama.cpp-q4_1"])
    lookup, q4 = res.row("llama.cpp-bf16-lookup", ALL), res.row("llama.cpp-q4_1", "qa")
    assert lookup.own_plain == "llama.cpp-bf16" and lookup.own_plain_exact_match_rate == 0.0
    assert prompts[2].own_plain_divergence == 2 and prompts[2].first_divergence == 2
    assert res.row("llama.cpp-bf16").own_plain is None
    assert q4.comparable is False and q4.outputs_equal is False
    # Q4_1's quantised kernels: a difference is not a mismatch; the bf16 copy's is.
    assert {r.config for r in res.mismatched} == {"llama.cpp-bf16", "llama.cpp-bf16-lookup"}
    assert BenchResults.from_dict(json.loads(json.dumps(res.to_dict()))) == res


# --- the bench without llama.cpp -----------------------------------------------------------


def _ids_workload(tmp_path: Path) -> Path:
    path = tmp_path / "ids.jsonl"
    path.write_text(json.dumps({"category": "qa", "prompt_ids": [5, 6, 7, 5, 6], "id": "a"}) + "\n")
    return path


def _bench(tmp_path: Path, model: Path, python: str) -> tuple[int, BenchResults]:
    out = tmp_path / "out"
    code = main(["bench", "--model", str(model), "--workload", str(_ids_workload(tmp_path)), "--dtype", "float32",
                 "--methods", "plain,ngram", "--baselines", "llama.cpp,llama.cpp-lookup", "--llama-cpp-python", python,
                 "--max-tokens", "4", "--repeats", "1", "--warmup", "0", "--out", str(out)])
    return code, BenchResults.from_dict(json.loads((out / "results.json").read_text()))


def test_missing_llama_cpp_skips_with_one_line_naming_make_llama_cpp(tiny_llama, tmp_path, capsys) -> None:
    missing = str(tmp_path / "nowhere" / "python")
    code, res = _bench(tmp_path, tiny_llama, missing)
    printed = capsys.readouterr()
    assert code == 0 and "Traceback" not in printed.out + printed.err
    lines = [line for line in printed.out.splitlines() if line.startswith("skip llama.cpp")]
    assert len(lines) == 2
    for name, line in zip(["llama.cpp", "llama.cpp-lookup"], lines):
        assert line == f"skip {name}: llama-cpp-python is not installed: no Python at {missing}; run `make llama-cpp` " \
                       "(builds llama-cpp-python==0.3.36 into .venv-llamacpp, about 15 minutes on 2 cores) or give " \
                       "--llama-cpp-python PATH"
    assert [s["name"] for s in res.skipped] == ["llama.cpp", "llama.cpp-lookup"]
    assert [c["name"] for c in res.configs] == ["plain", "ngram"]  # with plain alone the run would be an error


def test_llama_cpp_needs_a_gguf_target(tiny_llama, tmp_path, capsys) -> None:
    code, res = _bench(tmp_path, tiny_llama, _fake_python(tmp_path, "exit 9"))
    assert code == 0
    assert all("llama.cpp reads GGUF files only" in s["reason"] for s in res.skipped) and len(res.skipped) == 2


def test_unknown_baseline_lists_llama_cpp_ones(capsys) -> None:
    assert main(["bench", "--baselines", "llama.cpp-fast"]) == 2
    assert "llama.cpp-q4_1-lookup" in capsys.readouterr().err


# --- the packaged default model (slow) -----------------------------------------------------


def _unpermute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """GGUF's llama q/k row order back to Hugging Face's (what transformers does on load)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_HF_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
             "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}


def _hf_name(gguf_name: str) -> str:
    if gguf_name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if gguf_name == "output_norm.weight":
        return "model.norm.weight"
    _, layer, kind, _ = gguf_name.split(".")
    return f"model.layers.{layer}.{_HF_NAMES[kind]}.weight"


@pytest.mark.slow
@pytest.mark.parametrize(("dtype", "qtype"), [("bfloat16", "BF16"), ("float16", "F16")])
def test_float_copy_of_the_default_model_is_what_specsure_runs(default_model_cache, tmp_path, dtype, qtype) -> None:
    from specsure.models import load_model
    from specsure.models.gguf_cache import packaged_default_gguf

    source = packaged_default_gguf()
    dest = tmp_path / f"default.{qtype}.gguf"
    write_float_gguf(source, dest, qtype)
    before, after = _fields(source), _fields(dest)
    assert list(after) == list(before) and {k for k in before if before[k] != after[k]} == {"general.file_type"}

    reader = gguf.GGUFReader(dest)
    types = {t.name: t.tensor_type for t in gguf.GGUFReader(source).tensors}
    assert {types[t.name].name for t in reader.tensors if t.tensor_type == Q[qtype]} == {"Q4_1", "Q8_0"}
    assert {t.name for t in reader.tensors if t.tensor_type == Q.F32} == {n for n, t in types.items() if t == Q.F32}

    torch_dtype = getattr(torch, dtype)
    weights = load_model(None, dtype).lm.hf.state_dict()
    heads, kv_heads = before["llama.attention.head_count"], before["llama.attention.head_count_kv"]
    for tensor in reader.tensors:  # every tensor, bit for bit
        stored = np.asarray(tensor.data).copy()
        if tensor.tensor_type == Q.BF16:
            value = torch.from_numpy(stored.view(np.int16)).view(torch.bfloat16)
        else:
            value = torch.from_numpy(stored)
        value = value.reshape(tuple(reversed([int(n) for n in tensor.shape])))
        if tensor.tensor_type == Q.F32:  # the norms: llama.cpp reads them as F32, specsure in its dtype
            assert torch.equal(value.to(torch_dtype).float(), value), f"{tensor.name} is not exact in {dtype}"
        value = value.to(torch_dtype)
        if ".attn_q." in tensor.name:
            value = _unpermute(value, heads)
        elif ".attn_k." in tensor.name:
            value = _unpermute(value, kv_heads)
        assert torch.equal(value, weights[_hf_name(tensor.name)]), tensor.name
