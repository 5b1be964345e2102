"""`specsure generate` and `specsure demo` as a user runs them."""

from __future__ import annotations

from pathlib import Path

import pytest

from specsure.cli.demo import equality_line
from specsure.cli.main import main


def test_generate_on_a_model_without_tokenizer_is_a_clear_error(tiny_llama: Path, capsys) -> None:
    rc = main(["generate", "--model", str(tiny_llama), "--dtype", "float32", "hello"])
    err = capsys.readouterr().err
    assert rc == 2 and "has no tokenizer" in err and "Traceback" not in err


@pytest.mark.parametrize("flags, field", [
    (["--temperature", "-1"], "temperature"), (["--max-tokens", "0"], "max_tokens"), (["--top-p", "2"], "top_p"),
])
def test_generate_bad_sampling_flags_name_the_field(tiny_llama: Path, capsys, flags: list[str], field: str) -> None:
    rc = main(["generate", "--model", str(tiny_llama), *flags, "hello"])
    err = capsys.readouterr().err
    assert rc == 2 and field in err and "Traceback" not in err


def test_generate_bad_speculative_json_names_the_flag(tiny_llama: Path, capsys) -> None:
    rc = main(["generate", "--model", str(tiny_llama), "--speculative-config", "{method: ngram}", "hello"])
    err = capsys.readouterr().err
    assert rc == 2 and "--speculative-config is not valid JSON" in err


def test_equality_line_names_the_first_divergence() -> None:
    assert "identical" in equality_line([1, 2, 3], [1, 2, 3], "float32")
    line = equality_line([1, 2, 9, 4], [1, 2, 3, 4], "bfloat16")
    assert "from token 2 on" in line and "float32" in line
    assert "bug" in equality_line([1, 5], [1, 2], "float32")


@pytest.mark.slow
def test_generate_prints_completion_config_sources_and_acceptance(default_model_cache: Path, capsys) -> None:
    rc = main(["generate", "--chat", "--max-tokens", "24", "--dtype", "float32", "--speculative-config",
               '{"method": "ngram", "num_speculative_tokens": 4}',
               "Repeat this sentence: the quick brown fox jumps over the lazy dog."])
    out = capsys.readouterr().out
    assert rc == 0
    assert "effective config (running: ngram)" in out
    assert "[user]" in out and "[default]" in out and "[derived]" in out
    assert "tokens: " in out and "tok/s" in out


@pytest.mark.slow
@pytest.mark.parametrize("method", ["ngram", "eagle3"])
def test_demo_runs_and_reports_speedup_and_equality(default_model_cache: Path, capsys, method: str) -> None:
    rc = main(["demo", "--max-tokens", "48", "--repeats", "1", *(["--method", method] if method != "ngram" else [])])
    out = capsys.readouterr().out
    assert rc == 0
    assert f"effective config (running: {method})" in out and "mean acceptance length" in out
    assert "speedup" in out and f"{method} output is identical to plain greedy decoding" in out
