"""A causal LM with one KV cache that can be rolled back exactly (batch size 1)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from specsure.models.kv_cache import RollbackCache

logger = logging.getLogger(__name__)


@dataclass
class ForwardOutput:
    """What one `CausalLM.forward` call returns, one row per fed token.

    Tensors are created under `torch.inference_mode`; `.clone()` them before using them as
    inputs to autograd (e.g. when distilling a draft head).
    """

    logits: torch.Tensor
    """[n, vocab] float32 next-token logits at each fed position."""
    hidden: torch.Tensor | None
    """[n, hidden] last hidden state after the final norm (HF `last_hidden_state`), model
    dtype; None unless `hidden=True`."""
    aux_hidden: torch.Tensor | None
    """[n, len(aux_layers) * hidden] residual-stream inputs of `aux_layers`, concatenated in
    the order given (HF `hidden_states[i]` is the input of layer i); None when no layers were
    asked for."""


class CausalLM:
    """A transformers causal LM plus its KV cache, fed incrementally, batch size 1.

    `forward` appends the new tokens at positions `cache_len ..`; `crop` rolls the cache
    back to a prefix. Rolling back and re-feeding gives the same logits as a fresh model fed
    the kept prefix (up to float rounding from different kernel shapes).
    """

    def __init__(self, hf: PreTrainedModel) -> None:
        """Wrap `hf` (a `*ForCausalLM` with a `base_model` and output embeddings)."""
        self.hf = hf.eval()
        # The target is never trained here; frozen weights also let draft heads backprop
        # through `lm_head_logits` / `embed` without touching the target.
        self.hf.requires_grad_(False)
        self.config = hf.config
        text_config = hf.config.get_text_config(decoder=True)
        self.vocab_size: int = int(text_config.vocab_size)
        self.hidden_size: int = int(text_config.hidden_size)
        self.num_layers: int = int(text_config.num_hidden_layers)
        self.max_context: int = int(getattr(text_config, "max_position_embeddings", 0) or 0)
        self.dtype: torch.dtype = hf.dtype
        self._base = hf.base_model
        if self._base is hf:
            raise TypeError(f"{type(hf).__name__} has no separate base model; expected a *ForCausalLM.")
        head = hf.get_output_embeddings()
        if head is None:
            raise TypeError(f"{type(hf).__name__} has no output embeddings (LM head).")
        self._head: torch.nn.Module = head
        self._embed: torch.nn.Module = hf.get_input_embeddings()
        self._softcap: float | None = getattr(text_config, "final_logit_softcapping", None)
        self._cache = RollbackCache()
        self._cache_len = 0

    def reset(self) -> None:
        """Empty the KV cache."""
        self._cache = RollbackCache()
        self._cache_len = 0

    @property
    def cache_len(self) -> int:
        """Number of positions held in the KV cache."""
        return self._cache_len

    @torch.inference_mode()
    def forward(
        self,
        token_ids: Sequence[int],
        *,
        hidden: bool = False,
        aux_layers: tuple[int, ...] = (),
    ) -> ForwardOutput:
        """Run `token_ids` at positions `cache_len ..` and append them to the cache.

        Args:
            token_ids: the new tokens, at least one.
            hidden: also return the post-norm last hidden state.
            aux_layers: layer indices in [0, num_layers) whose residual-stream inputs to return.

        Raises:
            ValueError: no tokens, an aux layer out of range, or the context would exceed
                `max_context`.
        """
        n = len(token_ids)
        if n == 0:
            raise ValueError("forward needs at least one token id.")
        start = self._cache_len
        if self.max_context and start + n > self.max_context:
            raise ValueError(
                f"context of {start + n} tokens exceeds the model's max_position_embeddings "
                f"({self.max_context}); shorten the prompt or lower max_tokens."
            )
        for layer in aux_layers:
            if not 0 <= layer < self.num_layers:
                raise ValueError(f"aux layer {layer} is out of range [0, {self.num_layers}).")
        ids = torch.tensor([list(token_ids)], dtype=torch.long)  # [1, n]
        # Explicit positions keep RoPE correct whatever the cache reports after a crop.
        positions = torch.arange(start, start + n, dtype=torch.long).unsqueeze(0)  # [1, n]
        # Asking only for the selected layers keeps the hooks from holding every layer's state.
        want = list(aux_layers) if aux_layers else False
        out = self._base(
            input_ids=ids,
            position_ids=positions,
            cache=self._cache,
            use_cache=True,
            output_hidden_states=want,
        )
        self._cache_len = start + n
        last = out.last_hidden_state[0]  # [n, hidden]
        aux = None
        if aux_layers:
            states = out.hidden_states
            aux = torch.cat([states[i][0] for i in aux_layers], dim=-1)  # [n, len * hidden]
        return ForwardOutput(logits=self._logits(last), hidden=last if hidden else None, aux_hidden=aux)

    def crop(self, length: int) -> None:
        """Keep only the first `length` cached positions (exact rollback).

        Raises:
            ValueError: `length` is negative or longer than the cache.
        """
        if not 0 <= length <= self._cache_len:
            raise ValueError(f"crop length {length} is outside [0, {self._cache_len}] (the cache length).")
        if length == self._cache_len:
            return
        if length == 0:
            self.reset()
            return
        # transformers 5.x: Cache.crop takes minus the number of tokens to drop and rejects a
        # positive argument (the old "final length" meaning is gone); RollbackCache follows it.
        self._cache.crop(length - self._cache_len)
        self._cache_len = length
        assert self._cache.get_seq_length() == length, "KV cache length out of sync after crop"

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """The input embedding of `token_ids` (any shape) -> [..., hidden], model dtype."""
        return self._embed(token_ids)

    def lm_head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Apply the LM head to post-norm hidden states [..., hidden] -> float32 [..., vocab]."""
        return self._logits(hidden)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self._head(hidden).float()
        if self._softcap:
            # Models such as Gemma-2 squash logits in their *ForCausalLM.forward, which we bypass.
            logits = torch.tanh(logits / self._softcap) * self._softcap
        return logits
