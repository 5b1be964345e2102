"""A word-level tokenizer for the tiny test models: token id i is the word "w{i}"; test-only code."""

from __future__ import annotations

from pathlib import Path


def write_word_tokenizer(folder: str | Path, vocab_size: int) -> Path:
    """Save tokenizer.json + tokenizer_config.json into ``folder`` (a tiny model of ``vocab_size``).

    Words are split on whitespace and decoded joined by single spaces, so the text of ids
    [5, 17] is "w5 w17". No special tokens: decoding drops nothing.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab_size)}, unk_token="w0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=words).save_pretrained(folder)
    return Path(folder)
