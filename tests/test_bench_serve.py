"""`specsure bench serve` against real uvicorn servers on the tiny chat model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest

from serving import WORDS, serving, tiny_chat_engine
from specsure.bench.load import Outcome, percentile, summarize
from specsure.cli.main import main
from specsure.decode.engine import Engine
from specsure.serve import create_app


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    return tiny_chat_engine(tmp_path_factory, "tiny-chat-bench-serve")


@pytest.fixture(scope="module")
def url(engine: Engine) -> Iterator[str]:
    with serving(create_app(engine, served_model_name="tiny", api_key="k")) as base:
        yield base


def test_percentiles_and_the_summary_of_a_level() -> None:
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0 and percentile([1.0, 2.0], 99) == pytest.approx(1.99)
    outcomes = [Outcome(200, tokens=5, ttft_s=0.1, e2e_s=0.5, gaps_s=[0.1] * 4),
                Outcome(200, tokens=5, ttft_s=0.3, e2e_s=0.7, gaps_s=[0.1, 0.3]), Outcome(503, error="HTTP 503")]
    level = summarize("x", 2, outcomes, wall_s=1.0)
    assert (level.requests, level.failed, level.output_tokens, level.tokens_per_s) == (3, 1, 10, 10.0)
    assert level.ttft_p50_s == pytest.approx(0.2) and level.tpot_p50_s == pytest.approx(0.1)
    assert level.itl_p99_s == pytest.approx(0.3, abs=0.01) and level.errors == ("HTTP 503",)


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_bench_serve_measures_every_level(url: str, tmp_path: Path, endpoint: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    workload = tmp_path / "prompts.jsonl"
    workload.write_text("".join(json.dumps({"category": "chat", "prompt": f"{WORDS} w{i}"}) + "\n" for i in range(3)))
    out = tmp_path / "out"
    code = main(["bench", "serve", "--url", f"spec={url}", "--api-key", "k", "--endpoint", endpoint,
                 "--concurrency", "1,3", "--num-prompts", "6", "--max-tokens", "7", "--workload", str(workload),
                 "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    results = json.loads((out / "serve.json").read_text())
    levels = results["levels"]
    assert [(v["label"], v["concurrency"]) for v in levels] == [("spec", 1), ("spec", 3)]
    for level in levels:
        assert level["failed"] == 0 and level["requests"] == 6 and level["output_tokens"] == 42
        assert level["tokens_per_s"] > 0 and 0 < level["ttft_p50_s"] <= level["ttft_p99_s"]
        assert level["itl_p50_s"] <= level["itl_p99_s"]
    assert (out / "serve.png").stat().st_size > 0 and "c=3" in (out / "serve.md").read_text()


def test_bench_serve_errors_name_the_flag(url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for flags, needle in ((["--url", "localhost:1"], "must start with http://"),
                          (["--concurrency", "1,x"], "--concurrency"),
                          (["--url", "a=http://127.0.0.1:9", "--url", "a=http://127.0.0.1:8"], "labels"),
                          (["--url", "http://127.0.0.1:9"], "cannot reach"),
                          (["--url", url], "wrong --api-key")):
        assert main(["bench", "serve", *flags, "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert needle in err and "Traceback" not in err, err
    (tmp_path / "a-file").write_text("mine")
    for flags, needle in ((["--url", url, "--api-key", "x", "--out", str(tmp_path / "a-file")], "cannot write results"),):
        assert main(["bench", "serve", *flags]) == 2
        err = capsys.readouterr().err
        assert needle in err and "Traceback" not in err, err
