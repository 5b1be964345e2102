"""specsure bench with the real llama-server (`make llama-server`) on the packaged default model.

Tiny settings: both llama-server configurations start, answer greedy requests of token ids, and
report their figures; lookup reproduces the server's own plain output and reports its drafts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specsure.bench.results import ALL, BenchResults
from specsure.cli.main import main


@pytest.mark.slow  # all cores, as the real benchmark runs
def test_bench_runs_both_llama_server_configurations(default_model_cache, llama_server, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    code = main([
        "bench", "--categories", "summarization,code", "--per-category", "1", "--max-tokens", "48", "--repeats", "2",
        # 2-grams: on two short answers a 5-gram (the default) may never come up, and this checks the counters.
        "--methods", "plain,ngram", "-k", "4", "--prompt-lookup-max", "2", "--baselines", "llama-server,llama-server-lookup",
        "--llama-server", llama_server, "--out", str(out),
    ])
    assert code == 0, capsys.readouterr().out
    res = BenchResults.from_dict(json.loads((out / "results.json").read_text()))
    assert [c["name"] for c in res.configs] == ["plain", "ngram", "llama-server", "llama-server-lookup"]
    assert res.skipped == [] and len(res.meta["llama_server"]["commands"]) == 2
    for name in ("llama-server", "llama-server-lookup"):
        row = res.row(name, ALL)
        assert row.kind == "llama.cpp" and row.prompts == 2 and row.tokens_per_s > 0 and not row.comparable, name
    lookup = res.row("llama-server-lookup", ALL)
    assert lookup.own_plain == "llama-server" and lookup.own_plain_exact_match_rate == 1.0
    assert lookup.mean_acceptance_length is not None and lookup.mean_acceptance_length > 1.0  # it drafted, and some held
    assert all(p.deterministic for p in res.prompts if p.config == "llama-server")
