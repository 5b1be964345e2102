"""Task-style training prompts written for specsure: word problems, and tasks built on the target's answers.

Users do not only chat: they ask for sums, summaries, translations, answers from a passage and
follow-up questions in a conversation. A head that never saw the target doing those drafts
poorly there. ``--corpus math`` gives arithmetic word problems (templates with seeded numbers).
With ``chat`` in the corpus, every chat prompt's answer becomes the material of one more prompt
(`derived_prompts`): a second user turn after it, or a request to summarise it, translate a
sentence of it, or answer a question from it. The text in them is the target's own answer, so
the data stays the target's own and nothing comes from a dataset or a benchmark. The team wrote
every template (Apache-2.0, this repository).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from specsure.train.corpus import CorpusPrompt

MATH = "math"
"""The name ``--corpus`` takes for the word problems."""
LICENCE = "Apache-2.0 (written for this repository)"

NAMES = ("Amira", "Ben", "Chen", "Dana", "Emil", "Fatima", "Goran", "Hana", "Ivo", "Jun", "Kofi", "Lena")
ITEMS = ("notebooks", "apples", "tickets", "candles", "mugs", "plants", "pens", "loaves of bread")

WORD_PROBLEMS = (
    "A shop sells {item} for {p} dollars each. How much do {n} {item} cost, and how much change is there "
    "from {big} dollars? Show your working.",
    "A train covers {d} kilometres in {h} hours. What is its average speed, and how far would it go in {m} "
    "hours at that speed? Explain each step.",
    "{name} has {a} stickers, gives {b} to a friend and then buys {c} more. How many stickers does {name} "
    "have now? Show your reasoning.",
    "A rectangular garden is {w} metres wide and {l} metres long. What are its area and its perimeter?",
    "A recipe needs {g} grams of flour for {n} people. How much flour is needed for {m} people? Explain.",
    "What is {pct} percent of {x}? Show how you work it out, then check the answer another way.",
    "A tank holds {v} litres and a pump fills it at {r} litres per minute. How long does filling it take? "
    "Give the answer in minutes and seconds.",
    "{name} earns {p} dollars an hour and works {h} hours a week. How much is that in {m} weeks, before tax?",
    "A class of {x} students is split into groups of {n}. How many full groups are there, and how many "
    "students are left over?",
    "The price of a bicycle rises from {a} to {big} dollars. By what percentage did the price rise? Round "
    "to one decimal place.",
    "{name} reads {r} pages a day. The book has {v} pages. After {n} days, how many pages are left, and how "
    "many more days are needed?",
    "Three friends share a bill of {big} dollars. One pays {b} dollars and the other two split the rest "
    "equally. How much does each of the other two pay?",
)

FOLLOW_UPS = (
    "Can you give me a concrete example?",
    "Could you say that again in fewer words?",
    "What is the most common mistake beginners make here?",
    "How would you explain that to a child?",
    "What should I do first, this week?",
    "Why is that? Can you explain the reasoning?",
    "Thanks! Is there anything I should avoid?",
    "Can you turn that into a short checklist?",
    "That is helpful. What would you do differently on a tight budget?",
    "I tried that and it did not work. What else can I try?",
    "Can you give me one more idea?",
    "How long does that usually take?",
    "Is there a simpler way to do it?",
    "What if I only have ten minutes a day?",
    "Could you put that in a table?",
    "Which of those is the most important?",
    "Can you make it sound more friendly?",
    "Where can I learn more about this?",
    "What are the risks?",
    "Could you write that as a short paragraph instead of a list?",
    "My friend disagrees with you. What would you say to them?",
    "Great. Can you write a short summary I can save?",
    "What would an expert add to that?",
    "Does that also work for children?",
)
SUMMARIES = (
    "Summarize this text in two sentences.\n\n{text}",
    "Give a one-paragraph summary of the passage below.\n\n{text}",
    "What is the main point of the following text? Answer in one or two sentences.\n\n{text}",
)
LANGUAGES = ("French", "Spanish", "German", "Italian", "Portuguese", "Dutch")
TRANSLATION = "Translate this sentence into {language}:\n\n{text}"
QUESTIONS = (
    "What is the first piece of advice or fact the text gives?",
    "Which example does the text mention?",
    "According to the text, why does this matter?",
    "What does the text say someone should do?",
)
PASSAGE_QA = "Answer the question using only the text below.\n\nText:\n{text}\n\nQuestion: {question}"

KINDS = ("follow-up", "summary", "translation", "passage question")
MAX_ANSWER_CHARS = 900
"""A derived prompt keeps at most this much of the answer, cut after a whole sentence."""


def math_prompts(limit: int, seed: int = 0) -> list[CorpusPrompt]:
    """``limit`` distinct word problems: the templates in turn, with seeded numbers."""
    if limit < 1:
        raise ValueError(f"limit = {limit!r}: ask for at least one prompt.")
    rng = random.Random(seed)
    seen: set[str] = set()
    out: list[CorpusPrompt] = []
    while len(out) < limit:
        t = len(out) % len(WORD_PROBLEMS)
        h = rng.randint(2, 9)
        values = {"item": rng.choice(ITEMS), "name": rng.choice(NAMES), "p": rng.randint(2, 40), "n": rng.randint(3, 12),
                  "m": rng.randint(2, 20), "big": rng.randint(60, 500), "d": rng.randint(30, 120) * h, "h": h,
                  "a": rng.randint(20, 90), "b": rng.randint(2, 19), "c": rng.randint(3, 30), "w": rng.randint(3, 40),
                  "l": rng.randint(5, 60), "g": rng.randint(15, 80) * 10, "pct": rng.choice((5, 12, 15, 20, 25, 35, 40)),
                  "x": rng.randint(13, 480), "v": rng.randint(12, 90) * 10, "r": rng.randint(4, 45)}
        text = WORD_PROBLEMS[t].format(**values)
        if text in seen:
            continue
        seen.add(text)
        out.append(CorpusPrompt(text, MATH, LICENCE, f"word problem {t}"))
    return out


def trimmed(answer: str, limit: int = MAX_ANSWER_CHARS) -> str:
    """The answer without a cut-off last sentence, and at most ``limit`` characters (whole sentences)."""
    text = answer.strip()
    # A list marker ("1.", "12.") at the start of a line ends no sentence. Changing this rule changes
    # `make heads`' data: bump cli/train_data.py's DERIVED_VERSION with it.
    ends = [m.end() for m in re.finditer(r"(?<!^\d)(?<!^\d\d)[.!?](?=\s|$)", text, flags=re.M)]
    fitting = [e for e in ends if e <= limit]
    if fitting:
        return text[: fitting[-1]].strip()
    return text[:limit].strip()


def first_sentence(text: str) -> str:
    plain = re.sub(r"[#*_`>]+", "", text)  # markdown marks do not belong in a sentence to translate
    for line in plain.splitlines():
        match = re.match(r"\s*(?:\d+[.)]\s*|-\s*)?(.{20,}?[.!?])(?=\s|$)", line)
        if match:
            return match.group(1).strip()
    return plain.strip()[:200]


def derived_prompts(pairs: Sequence[tuple[str, str]], seed: int = 0) -> list[list[tuple[str, str]]]:
    """One conversation (role, content turns) per (question, answer) pair whose answer has text: the kinds in turn."""
    rng = random.Random(seed)
    out: list[list[tuple[str, str]]] = []
    for i, (question, answer) in enumerate(pairs):
        text = trimmed(answer)
        if len(text) < 40:  # an empty or one-word answer is no material for a task
            continue
        kind = KINDS[i % len(KINDS)]
        if kind == "follow-up":
            out.append([("user", question), ("assistant", text), ("user", rng.choice(FOLLOW_UPS))])
        elif kind == "summary":
            out.append([("user", rng.choice(SUMMARIES).format(text=text))])
        elif kind == "translation":
            out.append([("user", TRANSLATION.format(language=rng.choice(LANGUAGES), text=first_sentence(text)))])
        else:
            out.append([("user", PASSAGE_QA.format(text=text, question=rng.choice(QUESTIONS)))])
    return out
