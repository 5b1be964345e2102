"""Chat prompts that people wrote: the opening turns of the chatterbot-corpus conversations.

specsure's own chat prompts (`chat_prompts`) are templates over topics, and the head learns their
phrasing. `chatterbot-corpus` (PyPI, BSD licence) holds short English conversations a community
wrote over 21 topics, from tech support and coding requests to trivia and small talk: their
first turns are requests in users' own words. Only the prompts are taken; the target writes the
answers, as for every other source. The files are YAML data, read with ``yaml.safe_load``
(nothing is imported or executed), in a fixed order; repeated turns are kept once.
"""

from __future__ import annotations

import importlib.metadata
import random
from pathlib import Path

import yaml

from specsure.train.corpus import CorpusError, CorpusPrompt, licence_of

PACKAGE = "chatterbot-corpus"
"""The name ``--corpus`` takes for these prompts: the distribution they come from."""


def _files() -> list[Path]:
    try:
        files = importlib.metadata.files(PACKAGE) or []
    except importlib.metadata.PackageNotFoundError:
        raise CorpusError(f"corpus package {PACKAGE!r} is not installed; install it (pip install {PACKAGE}) or "
                          "leave it out of --corpus.") from None
    return sorted(Path(str(f.locate())) for f in files if "/data/english/" in f"/{f}" and str(f).endswith(".yml"))


def dialog_prompts(limit: int, seed: int = 0) -> list[CorpusPrompt]:
    """Up to ``limit`` distinct opening turns, a seeded sample.

    Raises:
        CorpusError: the package is not installed or states no licence.
    """
    if limit < 1:
        raise ValueError(f"limit = {limit!r}: ask for at least one prompt.")
    licence = licence_of(PACKAGE)
    seen: set[str] = set()
    out: list[CorpusPrompt] = []
    for path in _files():
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for i, conversation in enumerate(data.get("conversations") or []):
            if not conversation or not isinstance(conversation[0], str):
                continue
            text = " ".join(conversation[0].split())
            if not text or text.lower() in seen:
                continue
            seen.add(text.lower())
            out.append(CorpusPrompt(text[0].upper() + text[1:], PACKAGE, licence, f"{path.name}: conversation {i}"))
    random.Random(seed).shuffle(out)
    return out[:limit]
