"""vLLM's spellings of the command line: underscores, -sc, keys one by one; and no flag given twice."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from specsure.cli.main import main
from specsure.cli.vllm_argv import normalise
from specsure.config.errors import ConfigError


def test_underscores_become_dashes_before_any_dot_or_equals_sign() -> None:
    assert normalise(["explain", "--speculative_config", "{}", "--max_tokens=a_b"]) == \
        ["explain", "--speculative-config", "{}", "--max-tokens=a_b"]
    assert normalise(["generate", "--", "--not_a_flag"]) == ["generate", "--", "--not_a_flag"]
    assert normalise(["generate", "--snake_case x"]) == ["generate", "--snake_case x"]  # a value: argparse says so
    words = normalise(["explain", "--speculative-config.tree+", "a", "--speculative-config.tree+", "b,c"])
    assert json.loads(words[2]) == {"tree": ["a", "b", "c"]}  # KEY+ appends, as in vLLM
    with pytest.raises(ConfigError, match="needs a value"):
        normalise(["explain", "--speculative-config.method", "--", "x"])


def test_vllms_shorthand_flags_and_a_value_with_a_space_are_read_as_vllm_reads_them() -> None:
    words = normalise(["explain", "--spec-method", "ngram", "--spec_tokens=3", "--spec-model", "/m/a b",
                       "--speculative_config.prompt_lookup_max=/x y"])
    assert json.loads(words[2]) == {"method": "ngram", "num_speculative_tokens": 3, "model": "/m/a b",
                                    "prompt_lookup_max": "/x y"}  # a space after '=' is the value's, as in vLLM
    with pytest.raises(ConfigError, match=r"--spec-tokens 'three': must be an integer, the number of draft tokens"):
        normalise(["explain", "--spec-tokens", "three"])
    # any other word with a space is a value, as argparse reads it: left as written
    assert normalise(["generate", "--", "x"]) == ["generate", "--", "x"]
    assert normalise(["generate", "--batch_size=4 is what?"]) == ["generate", "--batch_size=4 is what?"]


def test_keys_one_by_one_merge_into_one_json_object_as_vllm_reads_them() -> None:
    words = normalise(["explain", "--speculative-config.method", "ngram", "--speculative_config.num_speculative_tokens=3",
                       "-sc.prompt_lookup_max", "4", "--speculative-config.tree+", "a,b"])
    assert words[:2] == ["explain", "--speculative-config"]
    assert json.loads(words[2]) == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4,
                                    "tree": ["a", "b"]}
    # vLLM's shorthands merge with a whole JSON object (create_speculative_config reads both)
    merged = normalise(["explain", "--speculative-config", '{"method": "mtp"}', "--spec-tokens", "2", "--", "x"])
    assert merged[:2] == ["explain", "--speculative-config"] and merged[-2:] == ["--", "x"]
    assert json.loads(merged[2]) == {"method": "mtp", "num_speculative_tokens": 2}
    # sizes as vLLM's human_readable_int reads a dotted value that is not JSON
    sized = normalise(["explain", "--speculative-config.a", "10k", "--speculative-config.b", "1K",
                       "--speculative-config.c", "1.5k", "--speculative-config.d", "1.5K"])
    assert json.loads(sized[2]) == {"a": 10000, "b": 1024, "c": 1500, "d": "1.5K"}


def test_a_whole_json_object_beside_keys_one_by_one_is_refused_as_vllm_would_drop_it() -> None:
    """vLLM's parser appends the dotted keys as a second --speculative-config, and argparse keeps that one."""
    with pytest.raises(ConfigError) as err:
        normalise(["explain", "--speculative-config", '{"method": "ngram", "prompt_lookup_max": 4}',
                   "--speculative-config.num_speculative_tokens", "3"])
    assert ("--speculative-config gives a whole JSON object and --speculative-config.num_speculative_tokens a key one "
            "by one. vLLM 0.33.0 reads the keys given one by one as a second --speculative-config and keeps only that "
            'one, so it would drop {"method": "ngram", "prompt_lookup_max": 4} without a word.') in str(err.value)


@pytest.mark.parametrize(("argv", "words"), [
    (["--speculative-config.method", "ngram", "--speculative-config.method", "suffix"],
     '--speculative-config.method is given twice ("ngram" and "suffix")'),
    (["--speculative-config", '{"method": "ngram"}', "--speculative-config.method", "suffix"],
     "keeps only that one, so it would drop {\"method\": \"ngram\"} without a word"),
    (["-sc", '{"method": "ngram"}', "--spec-method", "suffix"],
     "'method' is given both in -sc (\"ngram\") and by --spec-method (\"suffix\")"),
    (["--spec-method", "ngram", "--speculative-config.method=suffix"],
     '--spec-method and --speculative-config.method both give it ("ngram" and "suffix")'),
    (["--speculative-config.method"], "needs a value"),
    (["--speculative-config.", "x"], "name a key after the dot"),
    (["--speculative-config.a", "1", "--speculative-config.a.b", "2"], "a value of its own as well as keys"),
])
def test_a_key_given_twice_is_an_error_naming_both_values(argv: list[str], words: str) -> None:
    with pytest.raises(ConfigError) as err:
        normalise(["explain", *argv])
    assert words in str(err.value)


def test_the_cli_reads_vllms_spellings_and_refuses_repeats_and_prefixes(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                    "vocab_size": 100, "hidden_size": 64}))
    header = b'{"__metadata__": {}}'
    (target / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    for spelling in (["--speculative_config", '{"method": "ngram"}'], ["-sc", '{"method": "ngram"}'],
                     ["--speculative-config.method", "ngram", "--speculative-config.num_speculative_tokens", "3"]):
        assert main(["explain", "--model", str(target), "--json", *spelling]) == 0
        shown = json.loads(capsys.readouterr().out)
        assert shown["fields"]["method"]["value"] == "ngram" and shown["fields"]["method"]["source"] == "user"
    with pytest.raises(SystemExit) as stop:
        main(["explain", "--model", str(target), "--speculative-config", '{"method": "ngram"}',
              "--speculative-config", '{"method": "suffix"}'])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "--speculative-config is given twice" in err and '"suffix"' in err
    with pytest.raises(SystemExit) as stop:
        main(["explain", "--model", str(target), "--speculative-conf", '{"method": "ngram"}'])
    assert stop.value.code == 2 and "unrecognized arguments: --speculative-conf" in capsys.readouterr().err
    assert main(["explain", "--model", str(target), "--speculative-config.method", "ngram",
                 "--speculative-config.method", "suffix"]) == 2
    assert "is given twice" in capsys.readouterr().err
    # Another flag keeps its last value, as in argparse and vLLM, and says so.
    assert main(["explain", "--model", str(target), "--dtype", "bfloat16", "--dtype", "float32", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["dtype"]["value"] == "float32"
    assert "note: --dtype is given twice; the last, 'float32', is used." in captured.err
    # The same model twice drops nothing (a wrapper and its user agreeing): a note, not an error.
    assert main(["explain", "--model", str(target), "--model", str(target), "--json"]) == 0
    assert f"note: --model is given twice with the same value, {str(target)!r}." in capsys.readouterr().err


def test_a_flag_of_several_values_given_twice_is_not_called_the_same() -> None:
    from specsure.cli.main import build_parser
    from specsure.cli.vllm_argv import repeated_flags

    serve = build_parser(["serve"]).get_default("command_parsers")["serve"]
    error, notes = repeated_flags(serve, ["--served-model-name", "a", "b", "--served-model-name", "a", "c"])
    assert error is None and notes == ["note: --served-model-name is given twice; the last one's values are used."]


def test_vllms_readings_of_a_config_null_and_dashed_keys_and_a_positional_model(capsys) -> None:  # noqa: ANN001
    from specsure.cli.common import parse_speculative_config

    assert parse_speculative_config("null") is None  # off, as vLLM reads it
    assert parse_speculative_config('{"num-speculative-tokens": 3, "method": "ngram"}') == \
        {"num_speculative_tokens": 3, "method": "ngram"}  # vLLM's create_speculative_config reads dashes so
    with pytest.raises(ConfigError, match="gives 'num_speculative_tokens' twice"):
        parse_speculative_config('{"num-speculative-tokens": 3, "num_speculative_tokens": 4}')
    with pytest.raises(SystemExit) as exited:  # argparse's own usage error
        main(["explain", "/models/x"])
    assert exited.value.code == 2
    assert "(the model comes as --model /models/x, not as the first word" in capsys.readouterr().err
    assert main(["explain", "--model", ""]) == 2
    assert "the target model '' (--model) must be a path" in capsys.readouterr().err
