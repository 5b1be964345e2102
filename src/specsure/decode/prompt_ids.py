"""A prompt as the token ids a request runs: text through the model's tokenizer, ids checked against
its vocabulary and context, and a batch told apart from one prompt of ids; each fault a PromptError
naming the prompt's index."""

from __future__ import annotations

import numbers
from typing import Mapping, Sequence

from transformers import PreTrainedTokenizerBase

from specsure.decode.completion import Prompt, PromptError, PromptTooLong
from specsure.models.loading import LoadedModel


def prompt_ids(prompt: Prompt, index: int, tokenizer: PreTrainedTokenizerBase | None, target: LoadedModel,
               keep_last: int | None = None) -> list[int]:
    """The token ids of ``prompt`` (the ``index``-th of a batch) for ``target``; with ``keep_last``, only
    its last this many (vLLM's truncate_prompt_tokens)."""
    if isinstance(prompt, str):
        if not prompt:
            raise PromptError(index, "is an empty string; give some text or token ids.")
        if tokenizer is None:
            raise PromptError(index, f"is text, but the model at {target.path} has no tokenizer files; "
                                     "pass token ids instead, or add the tokenizer to the model folder.")
        try:
            ids = list(tokenizer(prompt, add_special_tokens=True)["input_ids"])
        except Exception as exc:  # the tokenizer's own failure on this text (a vocabulary without <unk>)
            raise PromptError(index, f"cannot be encoded by the model's tokenizer ({type(exc).__name__}: {exc}); "
                                     "the tokenizer does not cover this text. Pass token ids instead, or load "
                                     "the model with its own tokenizer files.") from exc
    elif isinstance(prompt, (list, tuple)):
        ids = [_token_id(tok, index) for tok in prompt]
    else:  # bytes would pass as a list of ints, and other iterables hide what they hold
        raise PromptError(index, f"is {type(prompt).__name__}; give a string or a list of token ids (ints).")
    if not ids:
        raise PromptError(index, "is empty; give at least one token.")
    vocab = target.lm.vocab_size
    for tok in ids:
        if not 0 <= tok < vocab:
            if isinstance(prompt, str) and tokenizer is not None:  # the tokenizer knows more than the model
                piece = tokenizer.convert_ids_to_tokens(tok)
                raise PromptError(index, f"is text whose token {piece!r} has id {tok}, which the tokenizer holds "
                                         f"but the model's vocabulary [0, {vocab}) does not; remove that text "
                                         "from the prompt.")
            raise PromptError(index, f"holds token id {tok!r}, outside the vocabulary [0, {vocab}).")
    if keep_last is not None:
        ids = ids[-keep_last:]
    limit = target.lm.max_context
    if limit and len(ids) >= limit:
        raise PromptTooLong(index, f"has {len(ids)} tokens, but {target.lm.context_name} is {limit} tokens "
                                   "and generation needs room for at least one more; shorten the prompt.",
                            len(ids), limit)
    return ids


def _token_id(tok: object, index: int) -> int:
    """A token id as an int: numpy and torch integer scalars too, never a bool or a float."""
    if type(tok) is int:  # the common case, without the ABC check's cost on a long prompt
        return tok
    if isinstance(tok, bool) or not isinstance(tok, numbers.Integral):
        raise PromptError(index, f"holds {tok!r} ({type(tok).__name__}), which is not a token id; a token-id prompt "
                                 "is a list of ints.")
    return int(tok)


def as_batch(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    """``generate``'s prompts as a list: one string or list of ids is a batch of one."""
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, Sequence) and prompts and all(isinstance(t, numbers.Integral) and not isinstance(t, bool)
                                                         for t in prompts):
        return [prompts]
    if isinstance(prompts, Sequence) and prompts and not isinstance(prompts, (bytes, bytearray)) and all(
            isinstance(t, (numbers.Number, type(None))) for t in prompts):  # [5.0, 6.0]: one prompt, of no ids
        wrong = next(t for t in prompts if isinstance(t, bool) or not isinstance(t, numbers.Integral))
        raise PromptError(0, f"holds {wrong!r} ({type(wrong).__name__}), which is not a token id; a token-id prompt is "
                             "a list of ints.")
    if isinstance(prompts, Sequence) and any(isinstance(t, (numbers.Number, type(None))) for t in prompts) \
            and not isinstance(prompts, (bytes, bytearray)):  # [1, "a"]: neither one prompt nor a list of them
        raise ValueError(f"prompts mixes token ids with other values ({_shown_types(prompts)}); give one prompt (a "
                         "string or a list of ints) or a list of prompts.")
    if isinstance(prompts, Sequence) and not isinstance(prompts, (bytes, bytearray)):
        if not prompts:
            raise ValueError("prompts is empty; give a string, a list of token ids, or a list of either.")
        return list(prompts)
    hint = " (.tolist() makes one of a tensor or an array)" if hasattr(prompts, "tolist") else ""
    if isinstance(prompts, Mapping) and "input_ids" in prompts:  # apply_chat_template's in transformers 5
        hint = ' (a tokenizer\'s output, such as apply_chat_template returns: pass its ["input_ids"])'
    raise ValueError(f"prompts must be a string, a list of token ids, or a list of either; got "
                     f"{type(prompts).__name__}{hint}.")


def _shown_types(values: Sequence[object]) -> str:
    return ", ".join(sorted({type(v).__name__ for v in values}))
