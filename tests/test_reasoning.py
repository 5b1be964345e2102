"""The thinking split from the answer: whole, and streamed at every split point alike; and whether an
answer starts inside its thinking, from the prompt's end and the request's switch."""

from __future__ import annotations

import pytest

from specsure.grammar import StructuredOutputs
from specsure.grammar.automaton import DEAD, ByteDFA
from specsure.grammar.spec import GrammarError, compiled
from specsure.serve.reasoning import ReasoningStream, split_answer, thinks

CASES = [
    ("plan</think>\n\nAnswer.", ("plan", "\n\nAnswer.")),
    ("<think>plan</think>Answer.", ("plan", "Answer.")),
    ("\n<think>\nplan\n</think>\n\nA", ("\nplan\n", "\n\nA")),
    ("</think>Answer.", ("", "Answer.")),
    ("plan</think>", ("plan", None)),
    ("still thinking </thi", ("still thinking </thi", None)),
    ("<thi", ("<thi", None)),
    ("a </ b </th c</think>d</think>e", ("a </ b </th c", "d</think>e")),
    ("", ("", None)),
    ("<think>", ("", None)),
    ("x<think>y</think>z", ("x<think>y", "z")),
]


@pytest.mark.parametrize("text, parts", CASES)
def test_an_answer_splits_alike_whole_and_streamed_at_every_point(text: str, parts: tuple) -> None:
    assert split_answer(True, text) == parts
    for cut in range(len(text) + 1):
        for second in range(cut, len(text) + 1):
            stream = ReasoningStream(True)
            pieces = [stream.push(text[:cut]), stream.push(text[cut:second]), stream.push(text[second:]),
                      stream.finish()]
            reasoning, content = "".join(p[0] for p in pieces), "".join(p[1] for p in pieces)
            assert (reasoning, content or None) == parts, (cut, second)


CALL_CASES = [
    ("plan <tool_call>\n<function=f>\n</function>\n</tool_call>",
     ("plan ", "<tool_call>\n<function=f>\n</function>\n</tool_call>")),
    ("a <tool_call> is a tag</think>ok", ("a <tool_call> is a tag", "ok")),  # no <function= after it
    ("x</think>y<tool_call><function=f>", ("x", "y<tool_call><function=f>")),
    ("mention <tool_call> then <tool_call> <function=g></function>",
     ("mention <tool_call> then ", "<tool_call> <function=g></function>")),
    ("cut <tool_call>\n<func", ("cut <tool_call>\n<func", None)),
]


@pytest.mark.parametrize("text, parts", CALL_CASES)
def test_qwen3_thinking_ends_at_a_tagged_call_too(text: str, parts: tuple) -> None:
    assert split_answer(True, text, calls_end=True) == parts
    for cut in range(len(text) + 1):
        stream = ReasoningStream(True, calls_end=True)
        pieces = [stream.push(text[:cut]), stream.push(text[cut:]), stream.finish()]
        assert ("".join(p[0] for p in pieces) or None, "".join(p[1] for p in pieces) or None) == parts, cut
    if "</think>" not in text:  # deepseek_r1 reads only </think>
        assert split_answer(True, text) == (text, None)


def test_a_tag_arriving_in_pieces_is_held_back_then_released() -> None:
    stream = ReasoningStream(True)
    assert stream.push("plan </th") == ("plan ", "")
    assert stream.push("ink") == ("", "")
    assert stream.push(">Yes") == ("", "Yes")
    assert stream.push(" more </think>") == ("", " more </think>")
    stream = ReasoningStream(True)
    assert stream.push("so </tag>") == ("so </tag>", "")


def test_an_answer_outside_the_thinking_is_content_unchanged() -> None:
    assert split_answer(False, "") == (None, "")
    assert split_answer(False, "plan</think>A") == (None, "plan</think>A")
    assert ReasoningStream(False).push("<think>") == ("", "<think>")


@pytest.mark.parametrize("parser, tail, variables, expected", [
    (None, "<think>\n", None, False),
    ("deepseek_r1", "<|Assistant|><think>\n", None, True),
    ("deepseek_r1", "<|im_start|>assistant\n", None, True),
    ("qwen3", "<|im_start|>assistant\n<think>\n\n</think>\n\n", None, False),
    ("deepseek_r1", "<|im_start|>assistant\n<think>\n\n</think>\n\n", None, False),
    ("qwen3", "<|im_start|>assistant\n", {"enable_thinking": False}, False),
    ("deepseek_r1", "<|im_start|>assistant\n", {"enable_thinking": False}, True),
    ("qwen3", "</think>old turn<|im_start|>assistant\n<think>", {"enable_thinking": True}, True),
    ("deepseek_r1", "<think>\nplan</think>\n\nThe answer so far", None, False),  # a prefilled reply past it
])
def test_whether_an_answer_starts_inside_its_thinking(parser: str | None, tail: str, variables: dict | None,
                                                      expected: bool) -> None:
    assert thinks(parser, tail, variables) is expected


def run(spec: StructuredOutputs, text: str) -> str:
    dfa, state = ByteDFA(compiled(spec)), None
    state = dfa.start
    for byte in text.encode():
        dfa.build(state)
        state = int(dfa.table[state, byte])
        if state == DEAD:
            return "refused"
    return "complete" if dfa.accepting[state] else "open"


@pytest.mark.parametrize("text, verdict", [
    ("", "complete"), ("any thing </thi", "complete"), ("é</think>", "open"), ("x</think>aab", "complete"),
    ("x</think>c", "refused"), ("x</t</think>b", "complete"), ("<</think>ab", "complete"),
    ("x</think>b</think>", "refused"),
])
def test_a_constraint_after_a_marker_starts_at_its_first_occurrence(text: str, verdict: str) -> None:
    assert run(StructuredOutputs(regex="a*b", after="</think>"), text) == verdict


def test_the_marker_is_the_servers_not_a_clients() -> None:
    with pytest.raises(GrammarError, match="after: is not a field specsure implements"):
        StructuredOutputs.from_dict({"regex": "a", "after": "</think>"})
    with pytest.raises(GrammarError, match="non-empty text"):
        StructuredOutputs(regex="a", after="")
