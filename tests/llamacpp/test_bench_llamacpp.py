"""specsure bench with the real llama-cpp-python 0.3.36 on the packaged default model.

Tiny settings (2 prompts, 16 new tokens, 2 repeats): this checks that every llama.cpp
configuration runs, reports its figures and is compared with both references; the timings
themselves come from the full benchmark on a quiet machine.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specsure.bench.results import ALL, BenchResults
from specsure.cli.main import main

LLAMA = ["llama.cpp-bf16", "llama.cpp-bf16-lookup", "llama.cpp-q4_1", "llama.cpp-q4_1-lookup"]


@pytest.mark.slow  # all cores, as the real benchmark runs
def test_bench_runs_every_llama_cpp_configuration(default_model_cache, llama_cpp_python, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    k = 4
    code = main([
        "bench", "--categories", "summarization,code", "--per-category", "1", "--max-tokens", "16", "--repeats", "2",
        "--dtype", "bfloat16", "--methods", "plain,ngram", "-k", str(k),
        "--baselines", "hf,hf-prompt-lookup,llama.cpp,llama.cpp-lookup,llama.cpp-q4_1,llama.cpp-q4_1-lookup",
        "--llama-cpp-python", llama_cpp_python, "--out", str(out),
    ])
    printed = capsys.readouterr().out
    with capsys.disabled():
        print("\n" + printed[printed.index("config"):])
    assert code == 0
    res = BenchResults.from_dict(json.loads((out / "results.json").read_text()))
    assert [c["name"] for c in res.configs] == ["plain", "ngram", "hf", "hf-prompt-lookup", *LLAMA]
    assert res.skipped == []
    assert res.meta["llama_cpp_python"] == "0.3.36"
    assert res.meta["llama_cpp"]["weights"]["llama.cpp-bf16"].endswith(".BF16.gguf")
    assert res.meta["llama_cpp"]["n_threads"] == res.meta["threads"]

    for name in LLAMA:
        row = res.row(name, ALL)
        assert row.kind == "llama.cpp" and row.prompts == 2 and row.tokens_per_s > 0, name
        assert row.exact_match_rate is not None and row.comparable == ("q4_1" not in name), name
        if name.endswith("-lookup"):
            assert row.own_plain == name.removesuffix("-lookup") and row.own_plain_exact_match_rate is not None
            assert row.mean_acceptance_length >= 1.0 and len(row.per_position_acceptance) == k
        else:
            assert row.own_plain is None and row.mean_acceptance_length is None
    assert res.row("hf-prompt-lookup").own_plain == "hf"
    assert all(p.deterministic for p in res.prompts if p.config == "llama.cpp-bf16")
    assert "llama.cpp-bf16-lookup" in (out / "results.md").read_text()
