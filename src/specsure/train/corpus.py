"""Training prompts from openly licensed text that installs from PyPI: the docstrings and functions of packages.

Self-distillation needs prompts, not answers: the target writes the answers. Installed Python
packages carry a large amount of openly licensed prose and code (numpy is BSD-3-Clause,
transformers Apache-2.0, jinja2 BSD-3-Clause, tqdm MPL-2.0 and MIT), and they arrive with
``pip install``, so the data needs no download and no benchmark set can leak into it. Each
prompt asks the target to explain, summarise, rewrite or use one docstring or function, which
gives chat-style, code and input-grounded answers alike. The sources are read with ``ast``
(nothing is imported or executed), in a fixed order, and every prompt records its package and
that package's licence as its distribution metadata states it.
"""

from __future__ import annotations

import ast
import difflib
import importlib.metadata
import itertools
import random
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PACKAGES = ("numpy", "transformers", "jinja2", "tqdm")
"""Installed with the engine extra, each under an open licence."""

TEMPLATES_DOC = (
    "Explain in plain words what this Python documentation says:\n\n{text}",
    "Summarize the following text in a few sentences:\n\n{text}",
    "Write a short example that shows how to use `{name}`, based on its documentation:\n\n{text}",
    "Answer briefly: what is `{name}` for, according to this documentation?\n\n{text}",
)
TEMPLATES_CODE = (
    "What does this Python function do? Explain it step by step.\n\n```python\n{text}\n```",
    "Rewrite this Python function with clearer variable names and a docstring:\n\n```python\n{text}\n```",
    "Find a possible bug or an edge case this function does not handle:\n\n```python\n{text}\n```",
    "Add type hints to this function. Keep everything else the same.\n\n```python\n{text}\n```",
    "Rewrite this function so that its local variables have longer, descriptive names. Change nothing "
    "else.\n\n```python\n{text}\n```",
    "Add a short comment above each block of this function that says why it is there.\n\n```python\n{text}\n```",
    "Write two unit tests with pytest for this function.\n\n```python\n{text}\n```",
    "Rename this function to `process` and update any calls to it inside its own body. Keep the rest "
    "unchanged.\n\n```python\n{text}\n```",
)
MAX_CHARS = 1200
"""Longer docstrings and functions are skipped: the prompt should leave room for the answer."""


class CorpusError(ValueError):
    """A package that cannot serve as a source: not installed, or without an open licence stated."""


@dataclass(frozen=True)
class CorpusPrompt:
    text: str
    package: str
    licence: str
    where: str
    """``path:line`` inside the package."""
    piece: str = ""
    """The docstring or function the prompt is about, as the package has it (empty for specsure's own
    prompts): the text that ``--data text`` teacher-forces as the answer."""


def licence_of(package: str) -> str:
    """The licence the package's distribution metadata states (License-Expression, License, or classifiers)."""
    try:
        meta = importlib.metadata.metadata(package)
    except importlib.metadata.PackageNotFoundError:
        near = difflib.get_close_matches(package, [*_SOURCE_NAMES, "numpy", "transformers"], n=1, cutoff=0.6)
        if near:  # a typo of a name it knows: never advise installing whatever was typed
            raise CorpusError(f"no corpus {package!r}: did you mean {near[0]!r}? --corpus takes specsure's own "
                              "prompt sets (chat, math, self) and names of installed packages.") from None
        raise CorpusError(f"corpus package {package!r} is not installed; install it (pip install {package}) or "
                          "leave it out of --corpus.") from None
    stated = meta.get("License-Expression") or ""
    if not stated:
        short = (meta.get("License") or "").strip()
        stated = short if short and len(short) < 60 and "\n" not in short else ""
    if not stated:
        stated = "; ".join(c.removeprefix("License :: ") for c in meta.get_all("Classifier") or []
                           if c.startswith("License ::"))
    if not stated:
        raise CorpusError(f"corpus package {package!r} states no licence in its metadata; specsure only trains on "
                          "text whose open licence it can record. Leave it out of --corpus.")
    return stated


def _sources(package: str) -> list[Path]:
    files = importlib.metadata.files(package) or []
    return sorted(Path(str(f.locate())) for f in files if str(f).endswith(".py") and "/tests/" not in f"/{f}")


_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")


def _segment(lines: list[str], node: ast.AST) -> str | None:
    """``ast.get_source_segment(source, node)`` over the file's lines split once: the stdlib splits the
    whole file again for every node, which made reading transformers' sources take minutes."""
    end, end_col = getattr(node, "end_lineno", None), getattr(node, "end_col_offset", None)
    if end is None or end_col is None:
        return None
    first, last, col = node.lineno - 1, end - 1, node.col_offset
    if first == last:
        return lines[first].encode()[col:end_col].decode()
    head = lines[first].encode()[col:].decode()
    tail = lines[last].encode()[:end_col].decode()
    return "".join([head, *lines[first + 1: last], tail])


def _pieces(path: Path) -> list[tuple[str, str, str, int]]:
    """(kind, name, text, line) for each documented function or class and each short function."""
    try:
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return []
    out = []
    lines = _LINE.findall(source)  # ast's own line split: \r\n, \r and \n, endings kept, no form feed
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) or node.name.startswith("_"):
            continue
        doc = ast.get_docstring(node)
        if doc and doc.count("\n") >= 2 and len(doc) <= MAX_CHARS:
            out.append(("doc", node.name, doc, node.lineno))
        if not isinstance(node, ast.ClassDef):
            code = _segment(lines, node)
            # A method's segment keeps its body's indentation but not its first line's: restore, then dedent.
            code = textwrap.dedent(" " * node.col_offset + code) if code else None
            if code and 3 <= code.count("\n") and len(code) <= MAX_CHARS:
                out.append(("code", node.name, code, node.lineno))
    return out


def corpus_prompts(packages: tuple[str, ...] = DEFAULT_PACKAGES, limit: int = 1000, seed: int = 0,
                   weights: tuple[int, ...] | None = None) -> list[CorpusPrompt]:
    """Up to ``limit`` prompts drawn from the packages (a seeded sample of their pieces), ``weights[i]``
    from package i in every round (default one each); the names ``chat`` and ``math`` stand for
    specsure's own chat prompts and word problems (chat_prompts.py, task_prompts.py), and
    ``chatterbot-corpus`` gives its conversations' opening turns (dialog_prompts.py). ``self`` holds
    places for prompts the target writes (self_prompts.py): their text is empty here, filled in once
    the target is loaded.

    Raises:
        CorpusError: a package is missing or states no licence.
    """
    if limit < 1:
        raise ValueError(f"limit = {limit!r}: ask for at least one prompt.")
    # Imported here: chat_prompts and task_prompts build on this module's CorpusPrompt.
    from specsure.train.chat_prompts import SOURCE as CHAT, chat_prompts
    from specsure.train.dialog_prompts import PACKAGE as DIALOG, dialog_prompts
    from specsure.train.self_prompts import LICENCE as SELF_LICENCE, SOURCE as SELF
    from specsure.train.task_prompts import MATH, math_prompts

    rng = random.Random(seed)
    chosen: list[list[CorpusPrompt]] = []
    for package in packages:
        if package == CHAT:  # specsure's own chat prompts, not a package
            chosen.append(chat_prompts(limit, seed))
            continue
        if package == MATH:
            chosen.append(math_prompts(limit, seed))
            continue
        if package == SELF:  # the target writes these once it is loaded; their count is known now
            chosen.append([CorpusPrompt("", SELF, SELF_LICENCE, f"written by the target, prompt {i}")
                           for i in range(limit)])
            continue
        if package == DIALOG:  # a data package: its conversations' opening turns, not its code
            chosen.append(dialog_prompts(limit, seed))
            continue
        licence = licence_of(package)
        paths = _sources(package)
        rng.shuffle(paths)
        pieces: list[tuple[Path, tuple[str, str, str, int]]] = []
        # Files in a seeded order, parsed only until there is enough to choose from (transformers
        # alone has thousands); at most a few pieces per file, so one long file cannot dominate.
        for path in paths:
            found = _pieces(path)
            rng.shuffle(found)
            pieces += [(path, piece) for piece in found[:4]]
            if len(pieces) >= limit:
                break
        mine = []
        for i, (path, (kind, name, text, line)) in enumerate(pieces):
            templates = TEMPLATES_DOC if kind == "doc" else TEMPLATES_CODE
            mine.append(CorpusPrompt(templates[i % len(templates)].format(text=text, name=name), package, licence,
                                     f"{path.name}:{line}", text))
        chosen.append(mine)
    # Weighted round-robin over the packages, so a small package gives all it has and the rest fill up.
    weights = weights or (1,) * len(chosen)
    if len(weights) != len(chosen) or any(w < 1 for w in weights):
        raise ValueError(f"weights = {weights!r}: give one positive integer per package ({len(chosen)}).")
    rounds = [list(itertools.zip_longest(*[iter(group)] * w)) for group, w in zip(chosen, weights)]
    out = [p for batch in itertools.zip_longest(*rounds, fillvalue=()) for group in batch for p in group
           if p is not None]
    return out[:limit]


def short_sources(prompts: list[CorpusPrompt], packages: tuple[str, ...], weights: tuple[int, ...],
                  limit: int) -> list[tuple[str, int, int]]:
    """(name, prompts given, its share of ``limit``) for each source that ran out short of its share:
    the others filled the rest, so the mix is not what the weights say."""
    counts = {name: 0 for name in packages}
    for p in prompts:
        counts[p.package] = counts.get(p.package, 0) + 1
    total = sum(weights)
    shares = {name: limit * w // total for name, w in zip(packages, weights)}
    # A tenth of slack: the round-robin's last round may end part-way through the sources.
    return [(name, counts[name], shares[name]) for name in packages if counts[name] < 0.9 * shares[name]]


def sources_of(prompts: list[CorpusPrompt]) -> list[dict[str, object]]:
    """What training.json records: each package, its licence, its installed version (a PyPI package's
    prompts are drawn from the files of that version, so another version gives other data) and how
    many prompts it gave."""
    counts: dict[tuple[str, str], int] = {}
    for p in prompts:
        counts[(p.package, p.licence)] = counts.get((p.package, p.licence), 0) + 1
    return [{"source": _SOURCE_NAMES.get(package, f"PyPI package {package} (docstrings and functions of its installed "
                                                  "sources)"),
             "licence": licence, **_version_of(package), "prompts": n} for (package, licence), n in counts.items()]


def _version_of(package: str) -> dict[str, str]:
    """``{"version": ...}`` for an installed distribution; empty for specsure's own prompt sets."""
    if package in ("chat", "math", "self"):
        return {}
    try:
        return {"version": importlib.metadata.version(package)}
    except importlib.metadata.PackageNotFoundError:
        return {}


_SOURCE_NAMES = {
    "chat": "specsure's chat prompts (templates x topics, train/chat_prompts.py)",
    "math": "specsure's word problems (templates with seeded numbers, train/task_prompts.py)",
    "chatterbot-corpus": "PyPI package chatterbot-corpus (the opening turns of its English conversations)",
    "self": "user requests the target wrote itself (its chat template up to a user's turn, sampled; "
            "train/self_prompts.py)",
}
