"""`python -m specsure explain`: exit 0 with a table or JSON; exit 2 with one `error:` paragraph.

The main cases run as real subprocesses; they all start at once (module fixture) because each
interpreter start costs seconds on a small machine. A few more go through the same parser and
error guard in-process.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from dataclasses import dataclass

import pytest

from checkpoints import EAGLE_TENSORS, deepseek_v3, eagle_head, llama, write_checkpoint
from specsure.cli.guard import guarded
from specsure.cli.main import build_parser
from specsure.config import resolve
from specsure.config.dtype_choice import run_dtype


@dataclass(frozen=True)
class Run:
    code: int
    out: str
    err: str


def _checkpoints(root):
    return {
        "target": str(write_checkpoint(root / "target", llama(layers=4))),
        "draft": str(write_checkpoint(root / "my-eagle-draft", llama(layers=2))),
        "eagle": str(write_checkpoint(root / "eagle-head", eagle_head(), tensors=EAGLE_TENSORS)),
        "mtp_draft": str(write_checkpoint(root / "dsv3-draft", deepseek_v3(mtp_layers=1))),
    }


def _cases(root):
    ck = _checkpoints(root)
    target = ck["target"]
    good = json.dumps({"method": "draft_model", "model": ck["draft"]})
    return {
        "good": ["--model", target, "--speculative-config", good],
        "good_json": ["--model", target, "--speculative-config", good, "--json"],
        "no_model": ["--speculative-config", '{"method": "ngram"}', "--json"],
        "bad_json": ["--model", target, "--speculative-config", '{"method": ngram}'],
        "unknown_key": ["--model", target, "--speculative-config", '{"method": "ngram", "num_speculative_token": 4}'],
        "missing_file": ["--model", target, "--speculative-config", f"@{root / 'nope.json'}"],
        "unrunnable": ["--model", target, "--speculative-config",
                       json.dumps({"method": "eagle3", "model": ck["eagle"]})],
        "suffix": ["--model", target, "--speculative-config",
                   '{"method": "suffix", "suffix_decoding_max_cached_requests": 0}'],
        "suffix_with_model": ["--model", target, "--speculative-config",
                              json.dumps({"method": "suffix", "model": ck["draft"]})],
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    procs = {name: subprocess.Popen([sys.executable, "-m", "specsure", "explain", *argv], cwd=root,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, argv in _cases(root).items()}
    done = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=180)
        done[name] = Run(proc.returncode, out, err)
    return done


def assert_one_paragraph_error(run: Run, *fragments: str) -> None:
    assert run.code == 2, run
    assert "Traceback" not in run.err + run.out
    err = run.err.strip()
    assert err.startswith("error: ") and "\n\n" not in err, err
    for fragment in fragments:
        assert fragment in err, err


def test_good_config_prints_the_table(runs):
    run = runs["good"]
    assert run.code == 0, run.err
    rows = {line.split()[0]: line.split()[1:3] for line in run.out.splitlines()[2:] if line.strip()}
    assert rows["method"] == ["draft_model", "user"]
    assert rows["num_speculative_tokens"] == ["4", "default"]
    assert rows["prompt_lookup_min"] == ["-", "derived"]
    assert "warnings: none" in run.out
    assert run.err == ""


def test_good_config_as_json(runs):
    run = runs["good_json"]
    assert run.code == 0, run.err
    data = json.loads(run.out)
    assert data["runnable"] is True and data["error"] is None and data["warnings"] == []
    assert data["fields"]["method"] == {"value": "draft_model", "source": "user",
                                        "reason": "You set method 'draft_model'; it is never replaced."}
    assert set(data["fields"]) == {"target", "method", "model", "num_speculative_tokens", "speculative_token_tree",
                                   "prompt_lookup_min",
                                   "prompt_lookup_max", "prompt_lookup_branches", "suffix_decoding_max_tree_depth",
                                   "suffix_decoding_max_cached_requests", "suffix_decoding_max_spec_factor",
                                   "suffix_decoding_min_token_prob", "disable_by_batch_size"}
    assert data["fields"]["suffix_decoding_max_tree_depth"] == {
        "value": None, "source": "derived", "reason": "Only suffix decoding uses it; the method is 'draft_model'."}


def test_suffix_prints_every_suffix_key_with_its_source(runs):
    run = runs["suffix"]
    assert run.code == 0, run.err
    rows = {line.split()[0]: line.split()[1:3] for line in run.out.splitlines()[2:] if line.strip()}
    assert rows["method"] == ["suffix", "user"]
    assert rows["model"] == ["-", "derived"]
    assert rows["num_speculative_tokens"] == ["24", "derived"]
    assert rows["suffix_decoding_max_tree_depth"] == ["24", "default"]
    assert rows["suffix_decoding_max_cached_requests"] == ["0", "user"]
    assert rows["suffix_decoding_max_spec_factor"] == ["1.0", "default"]
    assert rows["suffix_decoding_min_token_prob"] == ["0.1", "default"]
    assert "global tree of earlier outputs is off" in run.out


def test_suffix_with_a_draft_model_is_an_error(runs):
    assert_one_paragraph_error(runs["suffix_with_model"], "not used by method 'suffix'", "Remove 'model'")


def test_no_model_reads_the_default_gguf_metadata(runs):
    run = runs["no_model"]
    assert run.code == 0, run.err
    fields = json.loads(run.out)["fields"]
    assert fields["target"]["source"] == "default"
    assert fields["target"]["value"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert fields["method"]["value"] == "ngram"
    dtype = json.loads(run.out)["dtype"]  # what the run would load in, and why, as loading decides
    assert (dtype["value"], dtype["reason"]) == run_dtype(resolve({"method": "ngram"}).target, "auto")


def test_bad_json(runs):
    assert_one_paragraph_error(runs["bad_json"], "--speculative-config is not valid JSON", "Example:")


def test_unknown_key(runs):
    assert_one_paragraph_error(runs["unknown_key"], "'num_speculative_token'",
                               "Did you mean 'num_speculative_tokens'?")


def test_missing_spec_file(runs):
    assert_one_paragraph_error(runs["missing_file"], "nope.json", "cannot read")


def test_unrunnable_method_shows_the_table_and_an_error(runs):
    run = runs["unrunnable"]
    assert_one_paragraph_error(run, "error: cannot run: method 'eagle3' was asked", "is an EAGLE-1 head",
                               "set method 'eagle'")
    assert "method " in run.out  # the table still explains what was resolved


# The cases below run in-process (same parser, same error handling, no interpreter start).

@pytest.fixture
def explain(tmp_path, capsys):
    """Run `specsure explain ARGS` through the real parser and error guard; return a Run."""
    config_logger = logging.getLogger("specsure.config")
    level = config_logger.level

    def run(*argv: str) -> Run:
        args = build_parser().parse_args(["explain", *argv])
        code = guarded(lambda: args.run(args))
        out, err = capsys.readouterr()
        return Run(code, out, err)

    yield run
    config_logger.setLevel(level)  # explain quiets this logger; leave it as other tests expect


def test_speculative_config_from_a_file_detects_the_method(tmp_path, explain):
    ck = _checkpoints(tmp_path)
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps({"model": ck["draft"], "num_speculative_tokens": 3}))
    run = explain("--model", ck["target"], "--speculative-config", f"@{spec_file}")
    assert run.code == 0, run.err
    method = next(line for line in run.out.splitlines() if line.startswith("method "))
    assert method.split()[1:3] == ["draft_model", "checkpoint"]  # a whole LM, despite 'my-eagle-draft'


def test_unrunnable_method_as_json(tmp_path, explain):
    ck = _checkpoints(tmp_path)
    run = explain("--model", ck["target"], "--json",
                  "--speculative-config", json.dumps({"method": "eagle3", "model": ck["eagle"]}))
    assert_one_paragraph_error(run, "cannot run:")
    data = json.loads(run.out)
    assert data["runnable"] is False and "EAGLE-1 head" in data["error"]
    assert data["fields"]["method"]["value"] == "eagle3"


def test_strict_conflict(tmp_path, explain):
    ck = _checkpoints(tmp_path)
    run = explain("--model", ck["target"], "--strict",
                  "--speculative-config", json.dumps({"method": "draft_model", "model": ck["mtp_draft"]}))
    assert_one_paragraph_error(run, "method: you set 'draft_model'", "'mtp'", "num_nextn_predict_layers",
                               "strict mode")


def test_missing_target(tmp_path, explain):
    run = explain("--model", str(tmp_path / "no-such-target"), "--speculative-config", '{"method": "ngram"}')
    assert_one_paragraph_error(run, "no-such-target", "does not exist")


def test_speculative_config_that_is_not_an_object(tmp_path, explain):
    ck = _checkpoints(tmp_path)
    run = explain("--model", ck["target"], "--speculative-config", '["ngram"]')
    assert_one_paragraph_error(run, "must be a JSON object, got an array")


def test_deeply_nested_speculative_config(explain):
    run = explain("--speculative-config", "[" * 100_000)
    assert_one_paragraph_error(run, "--speculative-config nests too deeply")


def test_speculative_config_file_that_is_not_utf8(tmp_path, explain):
    spec_file = tmp_path / "spec.json"
    spec_file.write_bytes(b"\xff\xfe{}")
    run = explain("--speculative-config", f"@{spec_file}")
    assert_one_paragraph_error(run, str(spec_file), "is not UTF-8 text")


def test_control_characters_in_a_path_are_escaped_in_the_table() -> None:
    """A folder named with a terminal's escape sequence or a newline must not recolour it or break the rows."""
    from types import SimpleNamespace

    from specsure.config.explain import format_table

    row = SimpleNamespace(value="h/esc\x1b[31mRED\nx", source="user", reason="You set it: h/esc\x1b[31mRED\nx.")
    table = format_table({"model": row}, ["about h/\x1b[0m"])
    assert "\x1b" not in table and "h/esc\\x1b[31mRED\\nx" in table and len(table.splitlines()) == 6


@pytest.mark.parametrize(("argv", "words"), [
    (["explain", "--json", "--dtype", "foo"], "argument --dtype: invalid choice: 'foo'"),
    (["explain", "--json", "--bogus"], "unrecognized arguments: --bogus"),
    (["explain", "--json", "-n", "5"], "-n is llama.cpp's flag"),
    (["explain", "--json", "--speculative-config.method", "a", "--speculative-config.method", "b"], "given twice"),
    (["export", "--json", "--to", "x"], "argument --to: invalid choice: 'x'"),
    (["check-vllm", "--json", "--bogus"], "unrecognized arguments: --bogus"),
])
def test_a_command_line_that_does_not_parse_still_answers_json(capsys, argv: list[str], words: str) -> None:  # noqa: ANN001
    """The docs promise a script reading --json's stdout always gets JSON: usage errors too."""
    from specsure.cli.main import main

    try:
        code = main(argv)
    except SystemExit as stop:
        code = int(stop.code or 0)
    captured = capsys.readouterr()
    answer = json.loads(captured.out)
    assert code == 2 and words in answer["error"] and words in captured.err
    if argv[0] == "explain":
        assert answer["fields"] is None and answer["runnable"] is False


def test_int8_activations_are_explained_and_refused_where_a_run_would_refuse_them(tmp_path, capsys) -> None:  # noqa: ANN001
    # generate and serve take the flag; explain takes it too, and says what a run would do with it
    from specsure.cli.main import main

    target = str(write_checkpoint(tmp_path / "target", llama(layers=4)))
    spec = ["--model", target, "--speculative-config", '{"method": "ngram"}']
    assert main(["explain", *spec, "--dtype", "float32", "--int8-activations"]) == 0
    assert "int8 activations: on. Asked for: at load" in capsys.readouterr().out
    assert main(["explain", *spec, "--dtype", "float32"]) == 0
    assert "int8 activations" not in capsys.readouterr().out  # the table as before without the flag
    assert main(["explain", *spec, "--dtype", "bfloat16", "--int8-activations", "--json"]) == 2
    answer = json.loads(capsys.readouterr().out)
    assert answer["int8_activations"]["value"] is True and answer["runnable"] is False
    assert "needs the model in float32, but the run would load it in bfloat16" in answer["error"]
    assert "--dtype float32" in answer["error"]
