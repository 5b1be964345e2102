"""Incremental detokenization: the text of a growing output, handed out only once it is final.

Speculative decoding commits 1 to k + 1 tokens per step, and a step's tokens can end in the middle
of a multi-byte character or of a stop string. ``TextDeltas`` releases text that no later token
can change, so a client that joins the deltas gets exactly the engine's ``Completion.text``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

REPLACEMENT = "\ufffd"
"""What decoding gives for the bytes of a character that has not fully arrived."""
CLEANUP_TAIL = 3
"""Characters held back when the tokenizer cleans up spaces: its rules (" ." -> ".", " n't" ->
"n't") rewrite at most the 3 characters before the text that completes them."""


class TextDeltas:
    """Turns output token ids, as steps commit them, into text deltas that never change afterwards.

    ``push`` decodes the whole output so far, exactly as the engine does, and releases the text
    up to a held-back tail: U+FFFD characters (a multi-byte character whose bytes are still
    arriving), the longest tail that is the start of a stop string, and the last CLEANUP_TAIL
    characters for a tokenizer that cleans up spaces. A step that does not end generation holds
    no whole stop string (the engine would have stopped), so the released text is always before
    the cut. When generation ends, ``finish(completion.text)`` returns the rest.
    """

    def __init__(self, tokenizer: "PreTrainedTokenizerBase", stop: Sequence[str] | None = None,
                 skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._stop = tuple(stop or ())
        self._skip = skip_special_tokens
        self._tail = CLEANUP_TAIL if getattr(tokenizer, "clean_up_tokenization_spaces", False) else 0
        self._ids: list[int] = []
        self.text = ""
        """The text released so far: the deltas joined."""

    def push(self, token_ids: Sequence[int]) -> str:
        """The new final text after these tokens; often '' while a tail is held back."""
        self._ids.extend(token_ids)
        text = self._tokenizer.decode(self._ids, skip_special_tokens=self._skip)
        end = len(text)
        while end and text[end - 1] == REPLACEMENT:
            end -= 1
        end = max(0, end - self._tail)
        end -= self._stop_prefix(text[:end])
        if end <= len(self.text) or not text.startswith(self.text):
            return ""
        delta = text[len(self.text):end]
        self.text += delta
        return delta

    def finish(self, text: str) -> str:
        """The rest of the final text (``Completion.text``) after what was released."""
        if not text.startswith(self.text):
            # A tokenizer whose decoding rewrites earlier text when later tokens arrive, beyond
            # the rules held back for; the released text cannot be taken back.
            logger.warning("streamed text %r is not a prefix of the final text %r; the stream's text differs",
                           self.text[-40:], text[-40:])
            return ""
        delta = text[len(self.text):]
        self.text = text
        return delta

    def _stop_prefix(self, text: str) -> int:
        """The length of the longest tail of ``text`` that a stop string starts with."""
        held = 0
        for stop in self._stop:
            for size in range(min(len(stop) - 1, len(text)), held, -1):
                if text.endswith(stop[:size]):
                    held = size
                    break
        return held
