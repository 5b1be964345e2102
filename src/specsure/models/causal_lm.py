"""A causal LM with a KV cache that can be rolled back exactly; views with their own caches batch together."""

from __future__ import annotations

import copy
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from specsure.models.float_kernel import AnyKernel
from specsure.models.decoder_family import context_length
from specsure.models.errors import ModelLoadError
from specsure.models.kv_cache import RollbackCache
from specsure.models.load_check import check_cache, check_logits
from specsure.models.forward_output import ForwardOutput
from specsure.models.gguf_blocks import PACKING_NAMES, FileBlocks
from specsure.models.logits import LogitsTransform, logits_transform
from specsure.models.native import NativeDecoder
from specsure.models.segment import Segment
from specsure.models.output_head import OutputHead
from specsure.models.rotary_table import RotaryTable, tabled_if_varying
from specsure.models.token_tree import TokenTree, layer_masks
from specsure.models.transformers_model import align_weights, final_norm, final_stream

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Call:
    """One sequence's part of `CausalLM.forward_batch`: which view (whose cache) and what it feeds."""

    lm: "CausalLM"
    token_ids: Sequence[int]
    tree: TokenTree | None = None
    last_logits: int | None = None


class CausalLM:
    """A transformers causal LM plus its KV cache, fed incrementally.

    `forward` appends the new tokens at positions `cache_len ..`; `crop` rolls the cache
    back to a prefix. Rolling back and re-feeding gives the same logits as a fresh model fed
    the kept prefix (up to float rounding from different kernel shapes). `fork` makes a view
    with a cache of its own (the same weights), and `forward_batch` runs several views' new
    tokens in one pass over the weights: that is how concurrent sequences share a step.
    """

    def __init__(self, hf: PreTrainedModel, *, native: bool = True) -> None:
        """Wrap `hf` (a `*ForCausalLM` with a `base_model` and output embeddings).

        `native=True` runs Llama-family decoders through `NativeDecoder` (fused projections,
        no per-module overhead); other architectures, or `native=False`, run transformers' own
        modules. `path` says which one runs, and why.

        Raises:
            ModelLoadError: `hf` has no separate base model or no LM head; `hf(ids).logits` differ
                from base model + LM head + the known LogitsTransform, so specsure would decode from
                the wrong distribution; or its layers keep a state beyond the KV cache.
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
        self.model_context: int = context_length(text_config)
        """The model's own context (0: no limit); `max_context` is it unless `limit_context` lowered it."""
        self.max_context: int = self.model_context
        self.dtype: torch.dtype = hf.dtype
        self._base = hf.base_model
        if self._base is hf:
            raise ModelLoadError(f"{type(hf).__name__} (model_type {hf.config.model_type!r}) does not expose its decoder "
                                 "as a base model (transformers' base_model is the model itself), which specsure needs "
                                 "to run the decoder and the LM head apart; this architecture is not supported yet.")
        head = hf.get_output_embeddings()
        if head is None:
            raise ModelLoadError(f"{type(hf).__name__} (model_type {hf.config.model_type!r}) has no output embeddings "
                                 "(LM head); this architecture is not supported yet.")
        self._embed: torch.nn.Module = hf.get_input_embeddings()
        if self.dtype == torch.float32:
            align_weights(hf)
        self._native, why = NativeDecoder.build(hf) if native else (None, "native=False was asked")
        if self._native is None and tabled_if_varying(self._base):
            why += "; its varying RoPE turns each position by its own, from a table"
        self.head = OutputHead(head, logits_transform(text_config), self._native)
        """The LM head and the scalar steps after it."""
        self.path: str = f"{'native' if self._native else 'transformers'} ({why})"
        """Which forward runs the decoder layers, and why: 'native (...)' or 'transformers (...)'."""
        self._cache = RollbackCache()
        self._cache_len = 0
        self._ids: list[int] = []  # the token at each cached position (a tree's nodes until `keep`)
        self.blocks_used: dict[str, int] = {}
        """GGUF type -> how many of the weight matrices the float32 kernel reads as blocks (`use_blocks`)."""
        check_logits(self)
        if self._native is None:
            check_cache(self)

    def use_blocks(self, blocks: FileBlocks, int8_activations: bool = False) -> dict[str, int]:
        """Have the float32 kernel read ``blocks``' matrices (a GGUF file's, gguf_blocks.py) where they
        hold this model's weights bit for bit, the LM head's too; returns how many of each GGUF type."""
        native = self._native
        if native is None or native.float_kernel is None:
            return {}
        used = native.use_blocks(blocks, int8_activations)
        if blocks.lm_head is not None and self.head.use_blocks(blocks.lm_head, native.float_kernel, int8_activations):
            used[blocks.lm_head.kind] = used.get(blocks.lm_head.kind, 0) + 1
        self.blocks_used = used
        return used

    def release_block_weights(self) -> int:
        """Drop the float32 matrices the kernel reads as blocks: the layers' (`NativeDecoder.release_weights`)
        and the LM head's, with a tied embedding (`OutputHead.release`); returns the bytes dropped.
        ``hf``'s own forward cannot run after it; specsure's never needs it."""
        if self._native is None or not self.blocks_used:
            return 0
        dropped, self._embed = self.head.release(self._embed)
        self._native.embed = self._embed
        return dropped + self._native.release_weights()

    @property
    def tiled_matrices(self) -> int:
        """How many of the weight matrices `use_blocks` gave the kernel run on AMX tiles (float_kernel.c's A4
        and A8), the LM head included."""
        return (0 if self._native is None else self._native.tiled_matrices) + (self.head.tiles is not None)

    @property
    def int8_matrices(self) -> int:
        """How many of the weight matrices `use_blocks` gave the kernel's int8-activation products, the LM head included."""
        return sum(self.int8_packings.values())

    @property
    def int8_packings(self) -> Counter[str]:
        """`int8_matrices` by packing (gguf_blocks.PACKING_NAMES), the LM head included."""
        head = Counter([PACKING_NAMES[self.head.int8.format]] if self.head.int8 is not None else [])
        return head + (Counter() if self._native is None else self._native.int8_packings)

    @property
    def rotary_table(self) -> RotaryTable | None:
        """The native decoder's rotary cos and sin (None on transformers' path), which heads share."""
        return self._native.rotary if self._native is not None else None

    @property
    def logits_transform(self) -> LogitsTransform:
        """The model's scalar steps after the LM head (`models/logits.py`)."""
        return self.head.transform

    def reset(self) -> None:
        """Empty the KV cache (its buffers are kept for the next sequence)."""
        self._cache.clear()
        self._cache_len = 0
        self._ids = []

    def drop_cache(self) -> None:
        """Empty the KV cache and free its buffers, as if nothing had run yet."""
        self._cache, self._cache_len, self._ids = RollbackCache(), 0, []

    @property
    def row_kernel(self) -> "AnyKernel | None":
        """The C kernel the draft heads may run their few rows on (the bf16 or the float32 one, as the
        target runs), or None."""
        if self._native is None:
            return None
        return self._native.kernel or self._native.float_kernel

    @property
    def cache_len(self) -> int:
        """Number of positions held in the KV cache."""
        return self._cache_len

    @property
    def cached_ids(self) -> Sequence[int]:
        """The token id at each cached position: what a later prompt may share (prefix caching)."""
        return self._ids

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
            aux_layers: layer indices in [0, num_layers] whose residual-stream inputs to return
                (num_layers: the last layer's output, before the final norm).
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
        self._check_call(n, aux_layers)
        start = self._cache_len
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
            # transformers takes a 4D boolean mask as given (True = attend) with explicit positions, and
            # then applies no sliding window of its own: a tree's mask carries the window itself.
            mask = None if tree is None else layer_masks(self.config, self.dtype, start, n, tree)
            # Asking only for the selected layers keeps the hooks from holding every layer's state.
            want = [i for i in aux_layers if i < self.num_layers] or False
            with final_stream(self._base, self.num_layers, self.num_layers in aux_layers) as stream:
                out = self._base(input_ids=ids.unsqueeze(0), position_ids=positions, attention_mask=mask,
                                 cache=self._cache, use_cache=True, output_hidden_states=want)
            last = out.last_hidden_state[0]  # [n, hidden]
            if aux_layers:
                # transformers' hidden_states[N] is the normed output; id N is the stream before the norm.
                states = {**{i: out.hidden_states[i] for i in aux_layers if i < self.num_layers}, **stream}
                aux = torch.cat([states[i][0] for i in aux_layers], dim=-1)  # [n, len * hidden]
        self._cache_len = start + n
        self._ids[start:] = [int(t) for t in token_ids]
        rows = last if last_logits is None else last[max(0, n - last_logits):]
        return ForwardOutput(logits=self.head.logits(rows), hidden=last if hidden else None, aux_hidden=aux)

    @property
    def reads_last_output(self) -> bool:
        """Whether aux id N (the last layer's output before the final norm) can be read: always on the
        native path, on transformers' modules where the final norm is one `final_norm` finds."""
        return self._native is not None or final_norm(self._base) is not None

    def limit_context(self, tokens: int) -> None:
        """Run at most ``tokens`` positions (vLLM's max_model_len): a server's bound on what one request
        may hold in memory. More than the model's own context is refused, as vLLM refuses it."""
        own = self.model_context
        if own and tokens > own:
            raise ValueError(f"max_model_len = {tokens} exceeds the model's context of {own} tokens (from its "
                             "config, as vLLM derives it): positions past it were never trained; give at most "
                             f"{own}, or leave it out for the whole context.")
        self.max_context = tokens

    @property
    def context_name(self) -> str:
        """What sets max_context, for messages."""
        return "the model's context" if self.max_context == self.model_context else "the context max_model_len sets"

    def _context_origin(self) -> str:
        if self.max_context == self.model_context:
            return " (its config's max_position_embeddings or like key, as vLLM derives max_model_len)"
        own = f"at most {self.model_context}" if self.model_context else "any length"
        return f" (the model's own takes {own}: raise max_model_len, --max-model-len, for more)"

    def _check_call(self, n: int, aux_layers: tuple[int, ...]) -> None:
        if n == 0:
            raise ValueError("forward needs at least one token id.")
        if self.max_context and self._cache_len + n > self.max_context:
            raise ValueError(
                f"context of {self._cache_len + n} tokens exceeds {self.context_name} of {self.max_context} "
                f"tokens{self._context_origin()}; shorten the prompt or lower max_tokens."
            )
        for layer in aux_layers:
            if not 0 <= layer <= self.num_layers:
                raise ValueError(f"aux layer {layer} is out of range [0, {self.num_layers}].")

    def fork(self) -> "CausalLM":
        """A view of the same model (weights shared, nothing copied) with an empty cache of its own."""
        view = copy.copy(self)
        view._cache = RollbackCache()
        view._cache_len, view._ids = 0, []
        return view

    @torch.inference_mode()
    def copy_cache(self, source: "CausalLM") -> None:
        """Make this view's cache a copy of ``source``'s (a view of the same model): one prefill, two sequences."""
        if source.hf is not self.hf:
            raise ValueError("copy_cache: the source must be a fork() of the same model.")
        self.reset()
        for i, layer in enumerate(source._cache.layers):
            if layer.get_seq_length():
                self._cache.update(layer.keys, layer.values, i)
        self._cache_len, self._ids = source._cache_len, list(source._ids)

    @torch.inference_mode()
    def forward_batch(self, calls: Sequence[Call], *, hidden: bool = False,
                      aux_layers: tuple[int, ...] = ()) -> list[ForwardOutput]:
        """`forward` for several views of this model at once: one output per call, in order.

        Each call appends to its own view's cache, at its own positions, with its own tree and
        `last_logits`, exactly as `forward` would; the products over the weights (the LM head
        included) run once over every call's rows. On the transformers path the calls run one
        after another, with the same results.

        Raises:
            ValueError: a call's view is not of this model, two calls share a view, or a call
                fails `forward`'s own checks (nothing has run then).
        """
        if len({id(c.lm) for c in calls}) != len(calls):
            raise ValueError("forward_batch: two calls name the same view; each sequence needs its own fork().")
        for call in calls:
            if call.lm.hf is not self.hf:
                raise ValueError("forward_batch: every call's view must be a fork() of this model.")
            call.lm._check_call(len(call.token_ids), aux_layers)
        if self._native is None or len(calls) == 1:
            return [c.lm.forward(c.token_ids, hidden=hidden, aux_layers=aux_layers, last_logits=c.last_logits,
                                 tree=c.tree) for c in calls]
        ids = torch.tensor([t for c in calls for t in c.token_ids], dtype=torch.long)  # [T]
        segments = [Segment(c.lm._cache_len, len(c.token_ids), c.lm._cache, c.tree) for c in calls]
        last, entering = self._native.forward_segments(ids, segments, aux_layers)  # [T, hidden]
        aux = torch.cat(entering, dim=-1) if aux_layers else None  # [T, len * hidden]
        spans, wanted, end = [], [], 0
        for call in calls:
            n = len(call.token_ids)
            call.lm._ids[call.lm._cache_len:] = [int(t) for t in call.token_ids]
            call.lm._cache_len += n
            spans.append((end, end + n))
            first = end if call.last_logits is None else max(end, end + n - call.last_logits)
            wanted.append((first, end + n))
            end += n
        # The LM head reads the biggest matrix of a small model: one product for every row read.
        rows = torch.cat([last[a:b] for a, b in wanted])
        logits = self.head.logits(rows)  # [sum of rows read, vocab]
        outputs, at = [], 0
        for (a, b), (first, stop) in zip(spans, wanted):
            outputs.append(ForwardOutput(logits=logits[at: at + stop - first], hidden=last[a:b] if hidden else None,
                                         aux_hidden=None if aux is None else aux[a:b]))
            at += stop - first
        return outputs

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
        del self._ids[length:]
        assert self._cache.get_seq_length() == length, "KV cache length out of sync after crop"

    @torch.inference_mode()
    def keep(self, start: int, offsets: Sequence[int]) -> None:
        """After a tree forward at `start`: keep fed tokens `offsets` (ascending: the accepted
        path) as positions `start ..`, and drop every other node."""
        if not offsets or list(offsets) != sorted(set(offsets)) or start + offsets[-1] >= self._cache_len:
            raise ValueError(f"keep offsets {list(offsets)} must be ascending, distinct and inside the "
                             f"{self._cache_len - start} tokens fed at {start}.")
        if offsets[-1] == len(offsets) - 1:  # the path is the first nodes fed, already in place
            self.crop(start + len(offsets))
            return
        self._cache.compact(start, torch.tensor(list(offsets), dtype=torch.long))
        self._cache_len = start + len(offsets)
        self._ids[start:] = [self._ids[start + o] for o in offsets]

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """The input embedding of `token_ids` (any shape) -> [..., hidden], model dtype."""
        return self._embed(token_ids)

    def lm_head_logits(self, hidden: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Apply the LM head to post-norm hidden states [..., hidden] -> float32 [..., vocab].

        With ``rows`` (vocabulary ids), only those logits [..., len(rows)]: a trainer's labels over
        a draft vocabulary cost a sixth of the head then.
        """
        return self.head.logits(hidden) if rows is None else self.head.row_logits(hidden, rows)

    def draft_head(self, rows: torch.Tensor, int8_activations: bool = False) -> Callable[[torch.Tensor], torch.Tensor]:
        """Logits over the vocabulary ids ``rows`` only (`OutputHead.draft`), for a drafter that
        predicts among a draft vocabulary."""
        return self.head.draft(rows, int8_activations)
