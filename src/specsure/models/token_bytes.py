"""Each token's bytes, for constraints on the output text (structured outputs).

A token is a byte string, not always whole characters, and tokenizers spell bytes in their own
ways: byte-level BPE (GPT-2, Llama 3, Qwen, SmolLM) maps every byte to a printable character;
SentencePiece (Llama 2, Mistral, Gemma) writes a space as "▁" and a byte it has no piece for as
``<0xNN>``. Special and added control tokens hold no text.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def _byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE's character for each byte, inverted: printable Latin-1 bytes stand for
    themselves, the other 68 bytes for the characters from U+0100 on, in byte order."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: b for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = 0x100 + extra
            extra += 1
    return {chr(c): b for b, c in chars.items()}


BYTE_LEVEL = _byte_level_alphabet()


class TokenizerKindError(ValueError):
    """A tokenizer whose tokens' bytes specsure cannot read."""


def decoder_kind(tokenizer: "PreTrainedTokenizerBase") -> str:
    """'byte_level' or 'sentencepiece', read from the fast tokenizer's decoder."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise TokenizerKindError(f"the tokenizer ({type(tokenizer).__name__}) has no tokenizer.json, so the bytes "
                                 "of its tokens are unknown; structured outputs need a fast tokenizer")
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    parts = decoder.get("decoders", [decoder]) if decoder.get("type") == "Sequence" else [decoder]
    types = {p.get("type") for p in parts}
    if "ByteLevel" in types:
        return "byte_level"
    if "ByteFallback" in types or "Metaspace" in types or any(
            p.get("type") == "Replace" and p.get("pattern", {}).get("String") == "▁" for p in parts):
        return "sentencepiece"
    raise TokenizerKindError(f"the tokenizer's decoder ({', '.join(sorted(str(t) for t in types)) or 'none'}) is "
                             "neither byte-level BPE nor SentencePiece, so the bytes of its tokens are unknown; "
                             "structured outputs cannot run with it")


def token_bytes(tokenizer: "PreTrainedTokenizerBase", vocab_size: int) -> list[bytes | None]:
    """The bytes of every id below ``vocab_size`` (the model's, which may pad the tokenizer's); None for
    special tokens and ids the tokenizer lacks."""
    kind = decoder_kind(tokenizer)
    special = set(tokenizer.all_special_ids)
    added = {tok.content: i for i, tok in getattr(tokenizer, "added_tokens_decoder", {}).items()
             if getattr(tok, "special", True)}
    special |= set(added.values())
    count = min(len(tokenizer), vocab_size)
    pieces = tokenizer.convert_ids_to_tokens(list(range(count)))
    out: list[bytes | None] = []
    for i, piece in enumerate(pieces):
        if i in special or piece is None:
            out.append(None)
        elif kind == "byte_level":
            try:
                out.append(bytes(BYTE_LEVEL[c] for c in piece))
            except KeyError:  # an added token of plain text
                out.append(piece.encode("utf-8"))
        elif len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            out.append(bytes([int(piece[3:5], 16)]))
        else:
            out.append(piece.replace("▁", " ").encode("utf-8"))
    return out + [None] * (vocab_size - count)
