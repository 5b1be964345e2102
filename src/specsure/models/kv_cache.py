"""A KV cache built for speculative decoding: cheap appends and O(1) exact rollback.

transformers' DynamicLayer appends with `torch.cat`, copying the whole cache of every layer
on every step (O(context) per token), and a crop leaves a view that the next `cat` copies
again. Here each layer writes into a preallocated buffer that doubles when full, so an
append copies only the new tokens and a crop just moves the end marker; positions past the
marker are overwritten by the next append, which is what makes the rollback exact.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

# Initial positions per layer; small enough to cost nothing for short prompts.
_MIN_CAPACITY = 256


def _buffer_view(buffer: str) -> property:
    """A property reading as the first ``_length`` positions of the named buffer (None before it
    exists); assigning None is accepted and ignored, anything else refused."""

    def read(layer: "GrowableLayer") -> torch.Tensor | None:
        tensor = getattr(layer, buffer, None)
        return None if tensor is None else tensor[..., : layer._length, :]

    def write(layer: "GrowableLayer", value: torch.Tensor | None) -> None:
        if value is not None:
            raise AttributeError(f"GrowableLayer's {buffer} is read through views; write through update or reserve.")

    return property(read, write)


class GrowableLayer(DynamicLayer):
    """One full-attention layer: `keys` / `values` are views `[batch, heads, len, head_dim]`
    into buffers `[batch, heads, capacity, head_dim]`."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self._length = 0
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self._allocate(key_states, value_states, max(_MIN_CAPACITY, key_states.shape[-2]))
        self.is_initialized = True

    def _allocate(self, key_states: torch.Tensor, value_states: torch.Tensor, capacity: int) -> None:
        *lead, _, key_dim = key_states.shape
        value_dim = value_states.shape[-1]
        key_buffer = key_states.new_empty((*lead, capacity, key_dim))
        value_buffer = value_states.new_empty((*lead, capacity, value_dim))
        if self._key_buffer is not None and self._value_buffer is not None:
            key_buffer[..., : self._length, :].copy_(self._key_buffer[..., : self._length, :])
            value_buffer[..., : self._length, :].copy_(self._value_buffer[..., : self._length, :])
        self._key_buffer, self._value_buffer = key_buffer, value_buffer

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append `[batch, heads, n, head_dim]` states; return views over the whole cache."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        assert self._key_buffer is not None and self._value_buffer is not None
        start, end = self._length, self._length + key_states.shape[-2]
        capacity = self._key_buffer.shape[-2]
        if end > capacity:
            # Doubling keeps appends amortised O(new tokens).
            self._allocate(key_states, value_states, max(2 * capacity, end))
        self._key_buffer[..., start:end, :].copy_(key_states)
        self._value_buffer[..., start:end, :].copy_(value_states)
        self._set_length(end)
        return self.keys, self.values

    def reserve(self, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Make room for positions up to ``end`` (an initialized layer) and return the whole
        key and value buffers, for a kernel that writes into them; `set_length` then commits."""
        assert self._key_buffer is not None and self._value_buffer is not None
        if end > self._key_buffer.shape[-2]:
            self._allocate(self._key_buffer, self._value_buffer, max(2 * self._key_buffer.shape[-2], end))
        return self._key_buffer, self._value_buffer

    def set_length(self, length: int) -> None:
        """Declare the first ``length`` positions valid (after a kernel wrote them through `reserve`)."""
        self._set_length(length)

    def _set_length(self, length: int) -> None:
        assert self._key_buffer is not None and self._value_buffer is not None
        self._length = length

    # `keys` and `values` are views made when read: a C forward moves the end marker of every
    # layer on every step and reads no view, and making two views per layer cost ~0.7 ms of a
    # 30 ms speculative step. transformers assigns None to them (init, reset); nothing else may.
    keys = _buffer_view("_key_buffer")
    values = _buffer_view("_value_buffer")

    def get_seq_length(self) -> int:
        return self._length

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last `-tokens_to_remove` positions (transformers 5.x sign convention)."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes minus the number of tokens to drop, got {tokens_to_remove}.")
        if tokens_to_remove == 0 or not self.is_initialized:
            return
        self._set_length(max(0, self._length + tokens_to_remove))

    def compact(self, start: int, offsets: torch.Tensor) -> None:
        """Keep positions ``start + offsets`` (ascending) as ``start ..``; drop everything after ``start``.

        A token tree's accepted path is scattered through the block a verify forward appended;
        this moves it into place, so the cache reads as if only the path had been fed.
        """
        assert self._key_buffer is not None and self._value_buffer is not None
        kept = start + offsets  # [m]; indexing copies before the write, so overlap is safe
        end = start + offsets.numel()
        self._key_buffer[..., start:end, :] = self._key_buffer[..., kept, :]
        self._value_buffer[..., start:end, :] = self._value_buffer[..., kept, :]
        self._set_length(end)

    def reset(self) -> None:
        self._key_buffer = self._value_buffer = None
        self._length = 0
        self.is_initialized = False

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("each sequence has a cache of its own (CausalLM.fork); beam search is not supported.")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise NotImplementedError("each sequence has a cache of its own (CausalLM.fork); beam search is not supported.")


class RollbackCache(DynamicCache):
    """A DynamicCache whose layers are `GrowableLayer`s, one per decoder layer, made lazily.

    It subclasses DynamicCache so model code that checks for a dynamic cache accepts it.
    Every layer keeps full attention history (no sliding-window eviction), which is what
    lets `crop` roll back exactly for every architecture.

    Under autograd, give each forward a fresh cache: appends write in place into buffers that
    earlier attention calls saved for backward.
    """

    def __init__(self) -> None:
        Cache.__init__(self, layer_class_to_replicate=GrowableLayer)

    def compact(self, start: int, offsets: torch.Tensor) -> None:
        """`GrowableLayer.compact` on every layer: keep positions ``start + offsets`` as ``start ..``."""
        for layer in self.layers:
            layer.compact(start, offsets)

    def clear(self) -> None:
        """Drop every cached position but keep the buffers, so the next sequence reuses them
        (transformers' `reset` frees them instead)."""
        for layer in self.layers:
            layer.crop(-layer.get_seq_length())
