"""`specsure generate` and `specsure demo` as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from serving import build_tiny_chat_model

from specsure.cli.demo import equality_line
from specsure.cli.generate import DEFAULT_MAX_TOKENS, fit_max_tokens
from specsure.cli.main import main


def test_generate_on_a_model_without_tokenizer_is_a_clear_error(tiny_llama: Path, capsys) -> None:
    rc = main(["generate", "--model", str(tiny_llama), "--dtype", "float32", "hello"])
    err = capsys.readouterr().err
    assert rc == 2 and "has no tokenizer files" in err and "Traceback" not in err
    assert "add its tokenizer" in err and "pass token ids instead" not in err  # no advice the CLI cannot take


def exit_code(argv: list[str]) -> int:
    """main's return code, or argparse's exit code for a flag it refuses."""
    try:
        return main(argv)
    except SystemExit as stop:
        return int(stop.code or 0)


@pytest.mark.parametrize("flags, flag", [
    (["--temperature", "-1"], "--temperature"), (["--max-tokens", "0"], "--max-tokens"), (["--top-p", "2"], "--top-p"),
    (["--seed", "-1"], "--seed"), (["--top-k", "-2"], "--top-k"), (["--threads", "0"], "--threads"),
    (["--min-p", "2"], "--min-p"), (["--presence-penalty", "3"], "--presence-penalty"),
    (["--frequency-penalty", "nan"], "--frequency-penalty"), (["--repetition-penalty", "0"], "--repetition-penalty"),
    (["--min-tokens", "-1"], "--min-tokens"), (["--min-tokens", "9", "--max-tokens", "4"], "--min-tokens"),
    (["--logprobs", "21"], "--logprobs"),
])
def test_generate_bad_sampling_flags_name_the_flag(tiny_llama: Path, capsys, flags: list[str], flag: str) -> None:
    rc = exit_code(["generate", "--model", str(tiny_llama), *flags, "hello"])
    err = capsys.readouterr().err
    assert rc == 2 and flag in err and "SamplingParams" not in err and "Traceback" not in err


def test_generate_takes_threads_and_vllms_top_k_off_and_names_an_empty_prompt(tmp_path: Path, capsys) -> None:
    import torch

    model = build_tiny_chat_model(tmp_path / "chat")
    before = torch.get_num_threads()
    try:
        assert main(["generate", "--model", str(model), "--dtype", "float32", "--threads", "1", "--top-k", "-1",
                     "--max-tokens", "3", "hello"]) == 0
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert "warning" not in capsys.readouterr().err  # top-k -1 is off: nothing ignored
    assert main(["generate", "--model", str(model), "--dtype", "float32", "--top-p", "0.5", "--seed", "3",
                 "--max-tokens", "3", "hello"]) == 0
    assert "warning: --top-p, --seed shape sampling only, and --temperature 0" in capsys.readouterr().err
    assert main(["generate", "--model", str(model), ""]) == 2
    err = capsys.readouterr().err
    assert "PROMPT is empty" in err and "prompt 0" not in err and "token ids" not in err


@pytest.mark.parametrize("template", ["{{ raise_exception('only system turns here') }}", "{% if %}",
                                      "{{ messages[0].content + 1 }}"])
def test_a_chat_template_that_fails_is_one_error_line(tmp_path: Path, capsys, template: str) -> None:
    """A GGUF's or folder's broken template: exit 2 naming it, not jinja's traceback."""
    model = build_tiny_chat_model(tmp_path / "chat")
    for leftover in model.glob("chat_template.*"):
        leftover.unlink()
    config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
    rc = main(["generate", "--model", str(model), "--dtype", "float32", "--chat", "--max-tokens", "2", "hello"])
    err = capsys.readouterr().err
    assert rc == 2 and "the model's chat template" in err and "Drop --chat" in err and "Traceback" not in err, err


def test_generate_max_tokens_beyond_the_context_is_an_error_naming_the_room(tmp_path: Path, capsys) -> None:
    model = build_tiny_chat_model(tmp_path / "chat")
    context = json.loads((model / "config.json").read_text())["max_position_embeddings"]
    rc = main(["generate", "--model", str(model), "--dtype", "float32", "--max-tokens", str(context), "w1 w2 w3"])
    err = capsys.readouterr().err
    assert rc == 2 and f"--max-tokens {context} does not fit" in err and f"at most {context - 3} more" in err


def test_fit_max_tokens_lowers_only_the_default() -> None:
    assert fit_max_tokens(None, 100, 120) == 20  # the default, lowered to the room
    assert fit_max_tokens(None, 10, 1000) == DEFAULT_MAX_TOKENS
    assert fit_max_tokens(20, 100, 120) == 20 and fit_max_tokens(500, 10, None) == 500
    with pytest.raises(ValueError, match="at most 20 more fit"):
        fit_max_tokens(21, 100, 120)


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
    out, err = capsys.readouterr()
    assert rc == 0
    assert "effective config" not in out and out.strip()  # the completion alone on stdout
    assert "effective config (running: ngram, dtype float32)" in err
    assert "[user]" in err and "[default]" in err and "[derived]" in err
    assert "tokens: " in err and "tok/s" in err


@pytest.mark.slow
@pytest.mark.parametrize("method", ["ngram", "eagle3"])
def test_demo_runs_and_reports_speedup_and_equality(default_model_cache: Path, capsys, method: str) -> None:
    rc = main(["demo", "--max-tokens", "48", "--repeats", "1", *(["--method", method] if method != "ngram" else [])])
    out = capsys.readouterr().out
    assert rc == 0
    assert f"effective config (running: {method}, dtype " in out and "mean acceptance length" in out
    assert "speedup" in out and f"{method} output is identical to plain greedy decoding" in out
    assert f'specsure demo passes {{"method": "{method}"' in out


def test_a_dash_reads_the_prompt_from_stdin_and_stdout_holds_the_answer_alone(tmp_path: Path, capsys,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    model = build_tiny_chat_model(tmp_path / "chat")
    argv = ["generate", "--model", str(model), "--dtype", "float32", "--max-tokens", "4"]
    assert main([*argv, "w1 w2 w3"]) == 0
    typed = capsys.readouterr()
    monkeypatch.setattr("sys.stdin", io.StringIO("w1 w2 w3\n"))  # as `echo w1 w2 w3 |` sends it
    assert main([*argv, "-"]) == 0
    piped = capsys.readouterr()
    assert piped.out == typed.out and piped.out.count("\n") == 1  # the completion, and nothing else
    assert "effective config" in piped.err and "tokens: 4" in piped.err


def test_stop_and_ignore_eos_flags_reach_the_request(tmp_path: Path, capsys) -> None:
    model = build_tiny_chat_model(tmp_path / "chat")
    argv = ["generate", "--model", str(model), "--dtype", "float32", "--max-tokens", "8", "--ignore-eos"]
    assert main([*argv, "w1 w2 w3"]) == 0
    free = capsys.readouterr().out.strip()
    assert len(free.split()) >= 2
    cut = free.split()[1]
    assert main([*argv, "--stop", cut, "--stop", "never-said", "w1 w2 w3"]) == 0
    assert capsys.readouterr().out.strip() == free[:free.index(cut)].strip()
    assert main([*argv, "--stop", "", "w1"]) == 2
    assert "--stop: " in capsys.readouterr().err
    for flag, words in (("--temp", "use --temperature T"), ("-f", "specsure generate - < FILE")):
        assert main(["generate", flag, "x", "w1"]) == 2
        assert words in capsys.readouterr().err


def test_sampling_flags_reach_the_request_and_logprobs_are_printed(tmp_path: Path, capsys,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from specsure.decode.engine import Engine

    asked = []
    generate = Engine.generate

    def recording(self, prompts, params=None):
        asked.append(params)
        return generate(self, prompts, params)

    monkeypatch.setattr(Engine, "generate", recording)
    model = build_tiny_chat_model(tmp_path / "chat")
    assert main(["generate", "--model", str(model), "--dtype", "float32", "--max-tokens", "5", "--temperature", "0.8",
                 "--min-p", "0.05", "--presence-penalty", "0.5", "--frequency-penalty", "-0.5",
                 "--repetition-penalty", "1.2", "--min-tokens", "2", "--logprobs", "2", "--seed", "7", "w1 w2"]) == 0
    params = asked[-1]
    assert (params.min_p, params.presence_penalty, params.frequency_penalty, params.repetition_penalty,
            params.min_tokens, params.logprobs, params.max_tokens) == (0.05, 0.5, -0.5, 1.2, 2, 2, 5)
    err = capsys.readouterr().err
    lines = err[err.index("logprobs (token"):].splitlines()[1:]
    assert len(lines) == 5 and all(line.count("-") >= 1 and "[" in line for line in lines)
    assert main(["generate", "--model", str(model), "--dtype", "float32", "--max-tokens", "3", "--min-p", "0.1",
                 "w1"]) == 0
    assert "warning: --min-p shape sampling only" in capsys.readouterr().err
    assert main(["generate", "--repeat-penalty", "1.1", "w1"]) == 2
    assert "use --repetition-penalty P" in capsys.readouterr().err
    assert main(["serve", "--min-p", "0.1"]) == 2
    assert "send min_p in each request" in capsys.readouterr().err


def test_a_full_disk_is_one_line_not_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    """safetensors' writer reports ENOSPC as its own error type, which read as a crash."""
    import errno as errnos

    from safetensors import SafetensorError

    from specsure.cli.common import EXIT_FAIL
    from specsure.cli.guard import guarded

    def fills(error: Exception) -> int:
        raise error
    full = SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    assert guarded(lambda: fills(full)) == EXIT_FAIL
    assert "the disk ran out of space" in capsys.readouterr().err
    assert guarded(lambda: fills(OSError(errnos.ENOSPC, "No space left on device", "/x/model.safetensors"))) == \
        EXIT_FAIL
    assert "no space left on the device while writing /x/model.safetensors" in capsys.readouterr().err
    assert guarded(lambda: fills(OSError(errnos.ENOSPC, "No space left on device"))) == EXIT_FAIL
    assert "while writing a file this command writes" in capsys.readouterr().err  # stdout still takes writes
    with pytest.raises(RuntimeError):  # anything else is a bug, and keeps its traceback
        guarded(lambda: fills(RuntimeError("boom")))
