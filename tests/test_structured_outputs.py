"""Structured outputs in the engine: every method's greedy output equals plain decoding's under the
same constraint and equals a reference that masks the raw model's logits; sampled outputs obey it."""

from __future__ import annotations

import json
import re

import pytest
import torch

from grammar_model import build_byte_level_model
from serving import build_tiny_chat_model
from specsure import SamplingParams, make_engine
from specsure.decode.completion import ParamsError
from specsure.decode.engine import Engine
from specsure.grammar import StructuredOutputs

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "ok": {"type": "boolean"}},
          "required": ["name", "age", "ok"]}
CONSTRAINTS = [{"json": SCHEMA}, {"choice": ["yes", "no", "maybe"]}, {"regex": r"(ab|12)+x?"}, {"json_object": True},
               {"json": SCHEMA, "disable_any_whitespace": True},
               {"grammar": 'root ::= item (", " item)*\nitem ::= "yes" | "no" | [0-9]{1,3}'}]
PROMPT = '{"name": "yes", "age": 12, "ok": true} {"na'


def obeys(constraint: dict, text: str) -> bool:
    if "json" in constraint:
        value = json.loads(text)
        return set(value) == {"name", "age", "ok"} and 0 <= value["age"] <= 99 and len(value["name"]) <= 6
    if "choice" in constraint:
        return text in constraint["choice"]
    if "regex" in constraint:
        return re.fullmatch(constraint["regex"], text) is not None
    if "grammar" in constraint:
        return re.fullmatch(r"(yes|no|[0-9]{1,3})(, (yes|no|[0-9]{1,3}))*", text) is not None
    return isinstance(json.loads(text), dict)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_byte_level_model(tmp_path_factory.mktemp("bytes")))


@pytest.fixture(scope="module")
def engines(model: str) -> list[Engine]:
    specs = [None, {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1},
             {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_branches": 3},
             {"method": "suffix", "num_speculative_tokens": 4},
             {"method": "draft_model", "model": model, "num_speculative_tokens": 3}]
    return [make_engine(model, spec, dtype="float32") for spec in specs]


@pytest.mark.parametrize("constraint", CONSTRAINTS, ids=["json", "choice", "regex", "json_object", "compact json", "gbnf"])
def test_every_method_equals_plain_and_the_text_obeys(engines: list[Engine], constraint: dict) -> None:
    params = SamplingParams(max_tokens=60, structured_outputs=constraint)
    outs = [e.generate([PROMPT, PROMPT[:9]], params) for e in engines]
    for out in outs[1:]:
        assert [c.token_ids for c in out] == [c.token_ids for c in outs[0]]
    for completion in outs[0]:
        if completion.finish_reason == "stop":
            assert obeys(constraint, completion.text), completion.text
            assert completion.token_ids[-1] == 0  # the constraint let EOS end it only once complete
    if "json_object" not in constraint:  # the random model pads JSON with whitespace, but finishes one
        assert any(c.finish_reason == "stop" for c in outs[0])
    assert sum(e.stats.accepted_tokens for e in engines[1:]) > 0  # drafts were verified, not bypassed


def _reference(engine: Engine, prompt: list[int], choices: list[str], steps: int) -> list[int]:
    """Greedy from the raw model, each step's tokens limited by brute force to those that keep the
    text a prefix of a choice, EOS only when it is one."""
    hf, tok, out = engine.target.lm.hf, engine.tokenizer, []
    pieces = [tok.decode([i]) if i not in tok.all_special_ids else None for i in range(len(tok))]
    for _ in range(steps):
        text = tok.decode(out)
        with torch.no_grad():
            logits = hf(torch.tensor([prompt + out])).logits[0, -1].float()
        allowed = [i for i, p in enumerate(pieces) if p and any(c.startswith(text + p) for c in choices)]
        allowed += [0] if text in choices else []
        keep = torch.full_like(logits, float("-inf"))
        keep[allowed] = 0
        out.append(int((logits + keep).argmax()))
        if out[-1] == 0:
            break
    return out


def test_greedy_equals_a_reference_that_masks_the_raw_logits(engines: list[Engine]) -> None:
    choices = ["yes", "no", "maybe", "ab12", "a"]
    for prompt in (PROMPT, "12ab", "no"):
        ids = engines[0].encode(prompt)
        got = engines[0].generate(ids, SamplingParams(max_tokens=10, structured_outputs={"choice": choices}))[0]
        assert got.token_ids == _reference(engines[0], ids, choices, 10)
        assert got.text in choices


def test_sampled_outputs_obey_the_constraint_with_and_without_drafts(engines: list[Engine]) -> None:
    for engine in (engines[0], engines[1], engines[2]):
        for seed in range(4):
            for constraint in CONSTRAINTS[:3]:
                params = SamplingParams(max_tokens=60, temperature=1.0, seed=seed, structured_outputs=constraint)
                completion = engine.generate(PROMPT, params)[0]
                if completion.finish_reason == "stop":
                    assert obeys(constraint, completion.text), completion.text


def test_a_constraint_after_a_marker_leaves_the_text_before_it_free(engines: list[Engine]) -> None:
    # The server's reasoning models: free thinking up to </think>, constrained after. Here the marker
    # is three characters the model writes unconstrained, so that the free part reaches it.
    free = engines[0].generate(PROMPT, SamplingParams(max_tokens=12))[0].text
    marker = free[2:5]
    assert free.find(marker) == 2
    params = SamplingParams(max_tokens=60, structured_outputs=StructuredOutputs(regex=r"(ab|12)+x?", after=marker))
    outs = [e.generate(PROMPT, params)[0] for e in engines]
    for out in outs[1:]:
        assert out.token_ids == outs[0].token_ids
    text = outs[0].text
    assert text.startswith(free[:5]) and outs[0].finish_reason == "stop"
    assert re.fullmatch(r"(ab|12)+x?", text[5:]), text


def test_min_tokens_gives_way_where_the_text_is_complete(engines: list[Engine]) -> None:
    params = SamplingParams(max_tokens=20, min_tokens=10, structured_outputs={"choice": ["yes", "no"]})
    completion = engines[0].generate(PROMPT, params)[0]
    assert completion.text in ("yes", "no") and completion.finish_reason == "stop"


def test_allowed_token_ids_that_leave_the_constraint_nothing_end_the_output(engines: list[Engine]) -> None:
    x = engines[0].encode("x")[-1]
    params = SamplingParams(max_tokens=5, allowed_token_ids=[x], structured_outputs={"choice": ["yes"]})
    completion = engines[0].generate(PROMPT, params)[0]
    assert completion.token_ids == [0] and completion.text == "" and completion.finish_reason == "stop"


def test_streamed_steps_join_to_the_completion(engines: list[Engine]) -> None:
    params = SamplingParams(max_tokens=40, structured_outputs={"json": SCHEMA})
    steps = list(engines[1].generate_stream(PROMPT, params))
    assert [t for s in steps for t in s.token_ids] == steps[-1].completion.token_ids
    assert steps[-1].completion.token_ids == engines[0].generate(PROMPT, params)[0].token_ids


def test_what_cannot_run_is_refused_before_the_first_step(engines: list[Engine],
                                                        tmp_path_factory: pytest.TempPathFactory) -> None:
    with pytest.raises(ParamsError, match="ignore_eos is set and stop_token_ids is empty"):
        engines[0].generate(PROMPT, SamplingParams(ignore_eos=True, structured_outputs={"choice": ["yes"]}))
    out = engines[0].generate(PROMPT, SamplingParams(ignore_eos=True, stop_token_ids=[1],
                                                     structured_outputs={"choice": ["yes"]}))[0]
    assert out.text == "yes" and out.token_ids[-1] == 1
    words = make_engine(str(build_tiny_chat_model(tmp_path_factory.mktemp("words"))), dtype="float32")
    with pytest.raises(ParamsError, match="neither byte-level BPE nor SentencePiece"):
        words.generate([5, 6], SamplingParams(structured_outputs={"choice": ["w5"]}))


def test_generate_takes_structured_outputs_inline_or_from_a_file(model: str, tmp_path, capsys) -> None:
    from specsure.cli.main import main

    spec = tmp_path / "so.json"
    spec.write_text(json.dumps({"choice": ["yes", "no"]}), encoding="utf-8")
    for flag in (f"@{spec}", '{"choice": ["yes", "no"]}'):
        assert main(["generate", "--model", model, "--dtype", "float32", "--structured-outputs", flag, PROMPT]) == 0
        assert capsys.readouterr().out.splitlines()[0] in ("yes", "no")
    for flag, words in (('{"regex": "a(?=b)"}', "structured_outputs.regex"), ("[1]", "must be a JSON object"),
                        ("{", "is not valid JSON"), (f"@{tmp_path / 'none.json'}", "cannot read")):
        assert main(["generate", "--model", model, "--structured-outputs", flag, PROMPT]) == 2
        err = capsys.readouterr().err
        assert words in err and "--structured-outputs" in err and "Traceback" not in err
