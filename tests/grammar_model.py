"""A tiny Llama with a byte-level BPE tokenizer, for structured-output tests; test-only code."""

from __future__ import annotations

from pathlib import Path

from tiny import build_tiny_llama

MERGED = ['{"', '":', '",', '"}', ' "', "na", "me", "name", "ag", "age", "tr", "ue", "true", "nu", "ll", "null",
          "12", "34", "ye", "yes", "no", "ma", "yb", "maybe"]
"""Multi-character tokens, so that a token can cross from one part of a JSON text into the next."""


def build_byte_level_model(folder: Path, seed: int = 0, added: tuple[str, ...] = (),
                           special: tuple[str, ...] = ()) -> Path:
    """The tiny Llama over a byte-level BPE vocabulary: every byte, the merges above, EOS; ``added``:
    tokens added as plain text (not special), as Qwen3 adds ``<think>`` and ``</think>``; ``special``:
    tokens added as special ones, as Hermes 3 adds ``<tool_call>``."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    base = sorted(alphabet)
    vocab = {"</s>": 0, "<s>": 1, **{c: i + 2 for i, c in enumerate(base)}}
    merges: list[tuple[str, str]] = []
    for word in MERGED:
        text = _byte_chars(word)
        for split in range(len(text) - 1, 0, -1):
            left, right = text[:split], text[split:]
            if left in vocab and right in vocab:
                merges.append((left, right))
                vocab[text] = len(vocab)
                break
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["</s>", "<s>"])
    tok.add_tokens([AddedToken(text, special=False, normalized=False) for text in added])
    tok.add_special_tokens([AddedToken(text, special=True, normalized=False) for text in special])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    build_tiny_llama(folder, vocab_size=len(vocab) + len(added) + len(special), seed=seed, extra_config={"eos_token_id": 0, "bos_token_id": 1})
    fast.save_pretrained(folder)
    return folder


def _byte_chars(text: str) -> str:
    """``text`` in byte-level BPE's alphabet (one printable character per byte)."""
    from specsure.models.token_bytes import BYTE_LEVEL

    char_of = {b: c for c, b in BYTE_LEVEL.items()}
    return "".join(char_of[b] for b in text.encode("utf-8"))
