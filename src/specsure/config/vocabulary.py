"""Whether a draft and a target share a tokenizer though their embeddings differ in size.

config.json's ``vocab_size`` counts embedding rows, and models pad them to a round number: the
Qwen2.5 family shares one tokenizer of 151,665 tokens, with 151,936 rows in the 0.5B model and
152,064 in the 7B. Such a pair drafts exactly: the rows past the tokenizer are never a token's.
What decides it is the tokenizer, so this reads both folders' tokenizer.json (standard library
only, as everything in specsure.config), and the engine checks the loaded tokenizers again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Collection, Mapping

from specsure.config.gguf_header import GGUFHeaderError, read_gguf_tokens

if TYPE_CHECKING:
    from specsure.config.checkpoint import CheckpointInfo

TOKENIZER_FILE = "tokenizer.json"
GGUF_KINDS = ("gguf", "default")
"""CheckpointInfo kinds that are a GGUF file (the packaged default model is one)."""


@dataclass(frozen=True)
class SharedTokenizer:
    """The outcome of comparing two checkpoints' tokenizers."""

    size: int | None
    """The shared tokenizer's size (its largest id + 1), or None when they are not shown to be the same."""
    why: str
    """How it was decided, for a message: what matched, or what differed or was missing."""
    differs: bool = False
    """True when both were read and map some token to other ids (not merely unknown)."""
    ordinary: bool = True
    """With ``differs``: whether an ordinary token differs, not only tokens added to the vocabulary
    (special and chat tokens, which models of one family name differently in their reserved slots)."""


def compare_checkpoints(target: "CheckpointInfo", draft: "CheckpointInfo") -> SharedTokenizer:
    """Compare two checkpoints' tokenizers where they are of one kind: two folders' tokenizer.json,
    or two GGUF files' token lists (a GGUF file's tokens are spelled as llama.cpp stores them, so a
    GGUF file and a folder are not compared)."""
    if target.kind == "hf_dir" and draft.kind == "hf_dir":
        return compare_folders(target.path, draft.path)
    if target.kind in GGUF_KINDS and draft.kind in GGUF_KINDS:
        return compare_gguf_files(target.path, draft.path)
    return SharedTokenizer(None, "a GGUF file's tokenizer is compared only with another GGUF file's")


def compare_gguf_files(target: str, draft: str) -> SharedTokenizer:
    """Compare the token lists (``tokenizer.ggml.tokens``) of two GGUF files."""
    found = []
    for role, path in (("target", target), ("draft", draft)):
        try:
            tokens = read_gguf_tokens(str(Path(path).expanduser()))
        except (OSError, GGUFHeaderError):
            tokens = None
        if tokens is None:
            return SharedTokenizer(None, f"the {role}'s GGUF file lists no tokens to compare")
        found.append({token: i for i, token in reversed(list(enumerate(tokens)))})  # a repeated token: its first id
    return compare_vocabs(found[0], found[1], "their GGUF token lists")


def compare_folders(target: str, draft: str) -> SharedTokenizer:
    """Compare the tokenizer.json files in two checkpoint folders (a GGUF file has none here)."""
    found, added = [], set()
    for role, folder in (("target", target), ("draft", draft)):
        path = Path(folder).expanduser() / TOKENIZER_FILE
        if not path.is_file():
            return SharedTokenizer(None, f"the {role} has no {TOKENIZER_FILE} to compare")
        read = _read_vocab(path)
        if read is None:
            return SharedTokenizer(None, f"the {role}'s {path} is not a tokenizer.json that lists its vocabulary")
        found.append(read[0])
        added |= read[1]
    return compare_vocabs(found[0], found[1], f"their {TOKENIZER_FILE} files", added)


def compare_vocabs(target: Mapping[str, int], draft: Mapping[str, int], what: str,
                   added: Collection[str] = ()) -> SharedTokenizer:
    """Compare two token -> id maps (the loaded tokenizers' ``get_vocab()``, or tokenizer.json's);
    ``added``: the tokens either adds to its model's vocabulary, whose differences are not ordinary."""
    if target != draft:
        differing = [t for t in target if draft.get(t) != target[t]] + [t for t in draft if t not in target]
        ordinary = [t for t in differing if t not in added]
        token = (ordinary or differing)[0]
        ids = [f"id {m[token]}" if token in m else "absent" for m in (target, draft)]
        return SharedTokenizer(None, f"{what} differ (token {token!r}: {ids[0]} in the target's, {ids[1]} in "
                                     "the draft's)", differs=True, ordinary=bool(ordinary))
    size = max(target.values(), default=-1) + 1
    return SharedTokenizer(size, f"{what} are the same ({len(target)} tokens, ids below {size})")


def _read_vocab(path: Path) -> tuple[dict[str, int], set[str]] | None:
    """(token -> id: the model's vocabulary (a map for BPE and WordPiece, a list of (piece, score) for
    Unigram) and the added tokens; the added tokens' texts), or None for a file that does not hold one."""
    try:
        data: Any = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return None
    model = data.get("model") if isinstance(data, dict) else None
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if isinstance(vocab, dict):
        out = {str(k): v for k, v in vocab.items() if isinstance(v, int)}
    elif isinstance(vocab, list):
        out = {str(item[0]): i for i, item in enumerate(vocab) if isinstance(item, list) and item}
    else:
        return None
    added_texts = set()
    for added in data.get("added_tokens") or ():
        if isinstance(added, dict) and isinstance(added.get("id"), int) and isinstance(added.get("content"), str):
            out[added["content"]] = added["id"]
            added_texts.add(added["content"])
    return out, added_texts


def other_tokenizer(target: "CheckpointInfo", draft: "CheckpointInfo | None") -> str:
    """A warning for a draft whose tokenizer.json gives some of its added (special) tokens other ids
    than the target's though the vocabulary sizes agree: it runs (the output is the target's), and drafts
    of those tokens are not accepted. Ordinary tokens that differ are check_runnable's error."""
    if draft is None or target.vocab_size != draft.vocab_size:
        return ""  # other sizes are check_runnable's, with the same comparison
    found = compare_checkpoints(target, draft)
    if not found.differs or found.ordinary:
        return ""
    return (f"the draft {draft.path!r} has the target's ({target.path!r}) vocab_size and ordinary tokens, but "
            f"{found.why}: drafts of such special tokens mean other ones, and are not accepted (the output stays "
            "the target's).")
