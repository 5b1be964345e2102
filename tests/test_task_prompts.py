"""specsure's own task prompts: word problems, and tasks built on the target's chat answers."""

from __future__ import annotations

from specsure.bench.workload import load_builtin
from specsure.train.corpus import corpus_prompts, sources_of
from specsure.train.task_prompts import KINDS, derived_prompts, first_sentence, math_prompts, trimmed


def _bench_texts() -> set[str]:
    rows = [row for split in (False, True) for row in load_builtin(heldout=split)]
    return {row.prompt for row in rows if row.prompt} | {c for row in rows for _, c in (row.messages or ())}


def test_word_problems_are_distinct_seeded_ours_and_not_bench_prompts() -> None:
    problems = math_prompts(300, seed=1)
    texts = [p.text for p in problems]
    assert len(set(texts)) == 300 and all("{" not in t for t in texts)
    assert texts == [p.text for p in math_prompts(300, seed=1)] != [p.text for p in math_prompts(300, seed=2)]
    assert all(p.package == "math" and p.licence.startswith("Apache-2.0") for p in problems)
    assert not _bench_texts() & set(texts)
    mixed = corpus_prompts(("math", "chat"), limit=10, seed=0)
    assert {p.package for p in mixed} == {"math", "chat"}
    assert any("word problems" in s["source"] for s in sources_of(mixed))
    weighted = corpus_prompts(("math", "chat"), limit=12, seed=0, weights=(1, 3))
    assert [p.package for p in weighted[:8]] == ["math", "chat", "chat", "chat"] * 2
    assert [p.text for p in weighted if p.package == "chat"] == [p.text for p in corpus_prompts(("chat",), 9, 0)]
    assert corpus_prompts(("math", "chat"), limit=10, seed=0, weights=(1, 1)) == mixed  # weight 1: the plain mix


def test_answers_become_follow_ups_summaries_translations_and_passage_questions() -> None:
    answer = ("Bees make honey from nectar. **First**, they collect it from flowers.\n\n1. Then they store it "
              "in the hive, where it thick")
    pairs = [(f"Tell me about bees ({i})", answer) for i in range(8)] + [("Short?", "Yes.")]
    made = derived_prompts(pairs, seed=0)
    assert len(made) == 8  # the one-word answer is no material
    follow_up = made[0]
    assert [r for r, _ in follow_up] == ["user", "assistant", "user"] and follow_up[0][1] == pairs[0][0]
    assert follow_up[1][1].endswith("in the hive, where it thick") is False  # the cut-off sentence is dropped
    assert "they collect it from flowers." in made[1][0][1] and "where it thick" not in made[1][0][1]
    assert "summar" in made[1][0][1].lower() or "main point" in made[1][0][1]
    assert made[2][0][1].startswith("Translate this sentence into ")
    assert made[2][0][1].endswith("Bees make honey from nectar.")
    assert "Question:" in made[3][0][1] and len(KINDS) == 4
    assert not _bench_texts() & {c for turns in made for _, c in turns}


def test_trimming_keeps_whole_sentences() -> None:
    assert trimmed("One. Two three. Four fi") == "One. Two three."
    assert trimmed("Steps:\n1. Mix it well.\n2. Bake") == "Steps:\n1. Mix it well."
    assert trimmed("No end at all") == "No end at all"
    assert len(trimmed("Word. " * 400)) <= 900
    assert first_sentence("## Title\n- **Cats** purr when they are happy. More.") == "Cats purr when they are happy."



def test_source_segments_equal_the_stdlib_ones() -> None:
    """corpus.py splits a file's lines once; every segment must still be ast.get_source_segment's."""
    import ast
    from pathlib import Path

    from specsure.train import corpus

    sources = ["def f():\r\n    return 1\r\n", "x = 1\rdef g(a):\r    '''\u00e9t\u00e9'''\r    return a\r",
               "def h(): pass", "\x0cdef k():\n    return '\u00e9\x0c'\n", "class C:\n    def m(self):\n        return 2"]
    sources += [Path(corpus.__file__).read_text(encoding="utf-8"), Path(ast.__file__).read_text(encoding="utf-8")]
    checked = 0
    for source in sources:
        lines = corpus._LINE.findall(source)
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                assert corpus._segment(lines, node) == ast.get_source_segment(source, node)
                checked += 1
    assert checked > 50
