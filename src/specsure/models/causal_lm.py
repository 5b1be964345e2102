"""A causal LM with one KV cache that can be rolled back exactly (batch size 1)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel

from specsure.models.errors import ModelLoadError
from specsure.models.kv_cache import RollbackCache
from specsure.models.logits import LogitsTransform, logits_transform
from specsure.models.native import NativeDecoder, project
from specsure.models.token_tree import TokenTree, attention_mask

logger = logging.getLogger(__name__)


@dataclass
class ForwardOutput:
    """What one `CausalLM.forward` call returns, one row per fed token.

    Tensors are created under `torch.inference_mode`; `.clone()` them before using them as
    inputs to autograd (e.g. when distilling a draft head).
    """

    logits: torch.Tensor
    """[n, vocab] float32 next-token logits at each fed position; [m, vocab] for the last m
    positions when the forward was asked for `last_logits=m`."""
    hidden: torch.Tensor | None
    """[n, hidden] last hidden state after the final norm (HF `last_hidden_state`), model
    dtype; None unless `hidden=True`."""
    aux_hidden: torch.Tensor | None
    """[n, len(aux_layers) * hidden] residual-stream inputs of `aux_layers`, concatenated in
    the order given (HF `hidden_states[i]` is the input of layer i); None when no layers were
    asked for."""

    def pick(self, rows: Sequence[int]) -> "ForwardOutput":
        """The given rows, in order (a token tree's accepted path)."""
        index = torch.tensor(list(rows), dtype=torch.long)
        cut = (lambda t: None if t is None else t[index])
        return ForwardOutput(logits=self.logits[index], hidden=cut(self.hidden), aux_hidden=cut(self.aux_hidden))

    def rows(self, n: int) -> "ForwardOutput":
        """The first n rows (for example the committed positions of a verify forward)."""
        if self.logits.shape[0] == n:
            return self
        cut = (lambda t: None if t is None else t[:n])
        return ForwardOutput(logits=self.logits[:n], hidden=cut(self.hidden), aux_hidden=cut(self.aux_hidden))


# Tokens the load-time check runs: enough to see a transform, cheap next to loading the weights.
_CHECK_TOKENS = 4


class CausalLM:
    """A transformers causal LM plus its KV cache, fed incrementally, batch size 1.

    `forward` appends the new tokens at positions `cache_len ..`; `crop` rolls the cache
    back to a prefix. Rolling back and re-feeding gives the same logits as a fresh model fed
    the kept prefix (up to float rounding from different kernel shapes).
    """

    def __init__(self, hf: PreTrainedModel, *, native: bool = True) -> None:
        """Wrap `hf` (a `*ForCausalLM` with a `base_model` and output embeddings).

        `native=True` runs Llama-family decoders through `NativeDecoder` (fused projections,
        no per-module overhead); other architectures, or `native=False`, run transformers' own
        modules. `path` says which one runs, and why.

        Raises:
            TypeError: `hf` has no separate base model or no LM head.
            ModelLoadError: `hf(ids).logits` differ from base model + LM head + the known
                LogitsTransform, so specsure would decode from the wrong distribution.
        """
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
        self.logits_transform: LogitsTransform = logits_transform(text_config)
        self._native, why = NativeDecoder.build(hf) if native else (None, "native=False was asked")
        self.path: str = f"{'native' if self._native else 'transformers'} ({why})"
        """Which forward runs the decoder layers, and why: 'native (...)' or 'transformers (...)'."""
        self._cache = RollbackCache()
        self._cache_len = 0
        self._check_logits()

    def reset(self) -> None:
        """Empty the KV cache (its buffers are kept for the next sequence)."""
        self._cache.clear()
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
        last_logits: int | None = None,
        tree: TokenTree | None = None,
    ) -> ForwardOutput:
        """Run `token_ids` at positions `cache_len ..` and append them to the cache.

        Args:
            token_ids: the new tokens, at least one.
            hidden: also return the post-norm last hidden state.
            aux_layers: layer indices in [0, num_layers) whose residual-stream inputs to return.
            last_logits: compute logits for only the last this many positions (None: all). A
                prefill reads one row; the full-vocabulary head over every prompt row would
                cost more than a decode step.
            tree: the tokens form a token tree (node 0 first): each sits at `cache_len + depth`
                and sees only its ancestors. Afterwards `keep` the accepted path; until then
                the cache holds every node.

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
        ids = torch.tensor(list(token_ids), dtype=torch.long)  # [n]
        aux = None
        if self._native is not None:
            last, entering = self._native.forward(ids, start, self._cache, aux_layers, tree)  # [n, hidden]
            if aux_layers:
                aux = torch.cat(entering, dim=-1)  # [n, len * hidden]
        else:
            # Explicit positions keep RoPE correct whatever the cache reports after a crop.
            offsets = torch.arange(n, dtype=torch.long) if tree is None else tree.depths
            positions = (start + offsets).unsqueeze(0)  # [1, n]
            # transformers takes a 4D boolean mask as given (True = attend) with explicit positions.
            mask = None if tree is None else attention_mask(start, n, tree)[None, None]  # [1, 1, n, start + n]
            # Asking only for the selected layers keeps the hooks from holding every layer's state.
            want = list(aux_layers) if aux_layers else False
            out = self._base(input_ids=ids.unsqueeze(0), position_ids=positions, attention_mask=mask,
                             cache=self._cache, use_cache=True, output_hidden_states=want)
            last = out.last_hidden_state[0]  # [n, hidden]
            if aux_layers:
                states = out.hidden_states
                aux = torch.cat([states[i][0] for i in aux_layers], dim=-1)  # [n, len * hidden]
        self._cache_len = start + n
        rows = last if last_logits is None else last[max(0, n - last_logits):]
        return ForwardOutput(logits=self._logits(rows), hidden=last if hidden else None, aux_hidden=aux)

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

    @torch.inference_mode()
    def keep(self, start: int, offsets: Sequence[int]) -> None:
        """After a tree forward at `start`: keep fed tokens `offsets` (ascending: the accepted
        path) as positions `start ..`, and drop every other node."""
        if not offsets or list(offsets) != sorted(set(offsets)) or start + offsets[-1] >= self._cache_len:
            raise ValueError(f"keep offsets {list(offsets)} must be ascending, distinct and inside the "
                             f"{self._cache_len - start} tokens fed at {start}.")
        self._cache.compact(start, torch.tensor(list(offsets), dtype=torch.long))
        self._cache_len = start + len(offsets)

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """The input embedding of `token_ids` (any shape) -> [..., hidden], model dtype."""
        return self._embed(token_ids)

    def lm_head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Apply the LM head to post-norm hidden states [..., hidden] -> float32 [..., vocab]."""
        return self._logits(hidden)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., hidden] post-norm states -> float32 [..., vocab], as `*ForCausalLM.forward` does."""
        transform = self.logits_transform
        if transform.hidden_divisor != 1.0:
            hidden = hidden / transform.hidden_divisor  # model dtype, as the model divides it
        # The scalar steps run in float32: at most a rounding step away from the model's own
        # half-precision arithmetic, and the verifier works in float32 anyway.
        head = self._head
        if hidden.dim() == 2 and type(head) is torch.nn.Linear:
            logits = project(hidden, head.weight, head.bias).float()  # one row: the faster, bit-identical mv
        else:
            logits = head(hidden).float()
        if transform.multiplier != 1.0:
            logits = logits * transform.multiplier
        if transform.divisor != 1.0:
            logits = logits / transform.divisor
        if transform.softcap is not None:
            logits = torch.tanh(logits / transform.softcap) * transform.softcap
        return logits

    @torch.inference_mode()
    def _check_logits(self) -> None:
        """Refuse a model whose own forward does more around the head than `logits_transform` knows.

        Runs a few tokens without any cache, so the KV cache stays empty. One forward: a hook
        keeps what the base model returned inside `hf`'s own forward.
        """
        ids = torch.arange(1, _CHECK_TOKENS + 1) * (self.vocab_size - 1) // (_CHECK_TOKENS + 1)  # [n]
        ids = ids.unsqueeze(0).to(self.hf.device)  # [1, n], spread over the vocabulary
        base_outputs: list[Any] = []
        hook = self._base.register_forward_hook(lambda _module, _args, out: base_outputs.append(out))
        try:
            expected = self.hf(input_ids=ids, use_cache=False).logits[0].float()  # [n, vocab']
        finally:
            hook.remove()
        base_out = base_outputs[0] if base_outputs else self._base(input_ids=ids, use_cache=False)
        got = self._logits(base_out.last_hidden_state[0])  # [n, vocab]
        name = type(self.hf).__name__
        if got.shape != expected.shape:
            raise ModelLoadError(
                f"{name} returns logits of shape {tuple(expected.shape)} where its base model + LM head "
                f"give {tuple(got.shape)}; specsure cannot decode this architecture faithfully yet."
            )
        # Both paths run the same base model on the same inputs, so they differ only by how the
        # head's scalar steps round: a few units of the model dtype's epsilon, relative to the
        # largest logit. Any real transform (a scale, a cap, a bias) is far larger.
        scale = max(1.0, float(expected.abs().max()))
        tolerance = 8 * torch.finfo(self.dtype).eps * scale
        error = float((got - expected).abs().max())
        if not error <= tolerance:  # also catches NaN
            raise ModelLoadError(
                f"{name}: the logits of its own forward differ from its base model + LM head + "
                f"{self.logits_transform} (max |difference| {error:.3g}, tolerance {tolerance:.3g}); its "
                f"*ForCausalLM.forward transforms the logits in a way specsure does not reproduce, so "
                f"specsure cannot decode this architecture faithfully yet."
            )
