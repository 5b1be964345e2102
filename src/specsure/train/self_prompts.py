"""Chat prompts the target writes itself: its chat template up to a user's turn, then sampled.

An instruction-tuned model has learned what users ask as well as what to answer. Fed only the
template's header of a user turn (the system turn and ``<|im_start|>user`` on the default model),
it writes a user's request, in the wording and on the topics of the conversations it was tuned on
(the Magpie paper's observation). Those are the requests a head for this target will draft
after, with no dataset to download or license: the text is the target's own, as its answers are.
``--corpus self`` selects them beside package names.

Sampling makes them varied; a few come out unusable (cut off at the length limit, a handful of
words, a repeat), and those are dropped and more are sampled. Each request has its own seed,
numbered from the run's ``--seed``, so the same run writes the same prompts on one machine.
The sampled texts are cached by what they depend on: the data phase's cache key comes
from the prompts' tokens, so without this a second run would sample them again to find its key.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm import tqdm

from specsure.train.corpus import CorpusError

if TYPE_CHECKING:
    from specsure.models.loading import LoadedModel

SOURCE = "self"
"""The name ``--corpus`` takes for these prompts."""
LICENCE = "the target's own text (the target model's licence applies)"
TEMPERATURE = 1.0
TOP_P = 0.95
"""Nucleus sampling: the default model's far tail writes word salad in other languages, which no user asks."""
MAX_TOKENS = 96
"""A request longer than this is cut off, and dropped."""
MIN_WORDS = 3
ROUNDS = 4
"""Sampling rounds before giving up on filling the count (each asks for what is still missing and a quarter more)."""
VERSION = 1
"""Bumped when the sampling or the filter changes, so cached prompts made the old way are not reused."""


def user_turn_prefix(target: LoadedModel) -> list[int]:
    """The token ids of the chat template up to where a user's text begins (the default system turn
    included, as every prompt the target answers has it).

    Raises:
        CorpusError: the target has no tokenizer or no chat template.
    """
    tokenizer = target.tokenizer
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise CorpusError(f"--corpus {SOURCE}: the target at {target.path} has no chat template, so it cannot be "
                          "asked to write a user's turn; leave 'self' out of --corpus, or use a chat model.")
    marker = "\x00specsure-user-text\x00"
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False,
                                             add_generation_prompt=False)
    prefix = rendered[: rendered.index(marker)]
    return list(tokenizer(prefix, add_special_tokens=False)["input_ids"])


def usable(text: str, finished: bool) -> bool:
    """A request worth answering: ended by the model (not cut off), at least ``MIN_WORDS`` words."""
    return finished and len(text.split()) >= MIN_WORDS


def sample_prompts(target: LoadedModel, count: int, seed: int, *, batch_size: int = 32,
                   progress: bool = False) -> list[str]:
    """Up to ``count`` distinct user requests the target writes (fewer only when ``ROUNDS`` of sampling
    leave it short).

    Raises:
        CorpusError: the target has no chat template.
    """
    from specsure.config import resolve
    from specsure.decode.engine import Engine
    from specsure.sampling import SamplingParams

    prefix = user_turn_prefix(target)
    engine = Engine(resolve(None, model=target.path), target, None, max_num_seqs=batch_size)
    out: list[str] = []
    seen: set[str] = set()
    drawn = 0
    chunk = 4 * batch_size
    with tqdm(total=count, desc="writing prompts", unit="prompt", disable=not progress) as bar:
        for _ in range(ROUNDS):
            wanted = count - len(out)
            if wanted <= 0:
                break
            asked = wanted + wanted // 4 + 1
            for i in range(0, asked, chunk):
                n = min(chunk, asked - i)
                # One seed per request: requests with one seed and one prompt would all sample alike.
                params = [SamplingParams(max_tokens=MAX_TOKENS, temperature=TEMPERATURE, top_p=TOP_P,
                                         seed=seed * 1_000_003 + drawn + j) for j in range(n)]
                drawn += n
                for done in engine.generate([list(prefix)] * n, params):
                    ids = list(done.token_ids)
                    finished = done.finish_reason == "stop" and bool(ids) and ids[-1] in target.eos_token_ids
                    # The end-of-turn token is no part of the request (decoding skips it only when the
                    # tokenizer calls it special).
                    text = target.tokenizer.decode(ids[:-1] if finished else ids, skip_special_tokens=True).strip()
                    key = " ".join(text.lower().split())
                    if len(out) < count and usable(text, finished) and key not in seen:
                        seen.add(key)
                        out.append(text)
                        bar.update(1)
    target.lm.reset()
    return out


def cached_prompts(target: LoadedModel, count: int, seed: int, folder: Path | None, *, batch_size: int = 32,
                   progress: bool = False) -> list[str]:
    """`sample_prompts`, read from ``folder`` when an earlier run wrote the same ones (None: no cache)."""
    dtype = str(target.lm.dtype).removeprefix("torch.")
    # The prefix too: a chat template edited in place writes other requests from the same folder.
    fields = {"version": VERSION, "target": str(target.path), "prefix": user_turn_prefix(target), "dtype": dtype,
              "count": count, "seed": seed,
              "temperature": TEMPERATURE, "top_p": TOP_P, "max_tokens": MAX_TOKENS, "batch": batch_size}
    key = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:32]
    path = folder / f"self-prompts-{key}.json" if folder is not None else None
    if path is not None and path.is_file():
        try:
            stored = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(stored, list) and all(isinstance(t, str) for t in stored):
                return stored
        except (OSError, ValueError):
            pass  # unreadable: sample them again and write it anew
    texts = sample_prompts(target, count, seed, batch_size=batch_size, progress=progress)
    if len(texts) < count:
        print(f"note: --corpus {SOURCE}: the target wrote {len(texts)} usable prompts of the {count} asked for in "
              f"{ROUNDS} rounds of sampling; training uses those.", file=sys.stderr)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(texts, ensure_ascii=False), encoding="utf-8")
        os.replace(tmp, path)  # atomic: a reader never sees half a file
    return texts
