"""A draft head's own KV cache, and running transformer blocks on it with explicit positions.

A head's entry t sits at position t, so an entry's cache index is its position. Rolling back
to a prefix is therefore a crop; nothing else carries state between entries.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol, Union

import numpy as np
import torch
import torch.nn.functional as F

from specsure.models.kernel import SegmentStruct
from specsure.models.kv_cache import RollbackCache
from specsure.models.products import KERNEL_ROWS, project

if TYPE_CHECKING:
    from specsure.models.float_kernel import AnyKernel
    from specsure.models.gguf_blocks import BlockMatrix


class HeadCache:
    """One head module's KV cache (batch size 1) with exact rollback by crop.

    The keys and values live in the same RollbackCache the target uses (preallocated buffers,
    O(1) crop); this adds the positions and causal mask of the next entries. Under autograd
    (training), use a fresh HeadCache for each forward, as RollbackCache requires.
    """

    def __init__(self) -> None:
        self.kv = RollbackCache()
        self.length = 0
        """Entries held; the next entry's position, unless a token tree's layout says otherwise."""
        self._layout: tuple[torch.Tensor, torch.Tensor] | None = None

    def lay_out(self, positions: list[int], allowed: torch.Tensor) -> None:
        """Give the next call's entries (one per ``positions`` item) these positions and this
        attention ([n, length + n] bool, True where an entry may look), instead of the next ones in
        a chain: a token tree's nodes of one depth share a position and see only their ancestors.
        `advance` drops it; the C kernel does not run while it is set (its attention is causal)."""
        assert allowed.shape == (len(positions), self.length + len(positions)), "one mask row per entry"
        self._layout = (torch.tensor(positions, dtype=torch.long).unsqueeze(0), allowed)

    @property
    def laid_out(self) -> bool:
        return self._layout is not None

    def advance(self, n: int) -> None:
        """The call wrote n entries."""
        self.length += n
        self._layout = None

    def crop(self, keep: int) -> None:
        """Keep only the first ``keep`` entries (the buffers stay allocated, even for 0)."""
        assert 0 <= keep <= self.length, f"crop to {keep} outside [0, {self.length}]"
        self._layout = None  # a layout is for the very next call; a rollback ends any left unused
        if keep == self.length:
            return
        self.kv.crop(keep - self.length)  # transformers 5.x: minus the number of entries to drop
        self.length = keep

    def positions(self, n: int) -> torch.Tensor:
        """[1, n] positions of the next n entries."""
        if self._layout is not None:
            return self._layout[0]
        return torch.arange(self.length, self.length + n, dtype=torch.long).unsqueeze(0)

    def mask(self, n: int, dtype: torch.dtype) -> torch.Tensor | None:
        """Additive mask [1, 1, n, length + n] for n new entries: causal, or the laid-out tree's;
        None for one entry of a chain.

        SDPA's own ``is_causal`` aligns the triangle top-left, which is wrong once the cache holds
        earlier entries, so several new entries always get an explicit mask.
        """
        past = self.length
        if self._layout is not None:
            allowed = self._layout[1]
        elif n == 1:
            return None
        else:
            allowed = torch.arange(past + n)[None, :] <= (past + torch.arange(n))[:, None]  # [n, past + n]
        mask = torch.zeros(n, past + n, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
        return mask[None, None]


Rotary = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


FEW = 4
"""Up to this many ids `DraftRow.top` ranks by repeated argmax rather than by a sort."""


@dataclass(frozen=True)
class DraftRow:
    """The last entry's logits over a head's draft vocabulary, with the target id of each.

    A greedy chain reads only its argmax, so the target-vocabulary row (-inf outside the draft
    vocabulary) is made only when asked: on the default model that row is 49,152 floats, and
    making it cost about a tenth of an MTP draft step.
    """

    logits: torch.Tensor
    """[Vd] float32."""
    ids: torch.Tensor
    """[Vd] target ids (distinct; the shipped heads' ascend, but a head's d2t need not)."""
    vocab_size: int
    ascending: bool = False
    """Whether ``ids`` ascend (`ascends`, known once per head): then the first maximum is the one
    with the lowest target id, and `argmax` is one pass (the other passes cost about 0.05 ms a step
    on the default model, reading a row that the other thread wrote)."""

    def widened(self) -> torch.Tensor:
        """The target-vocabulary row [V]: -inf outside the draft vocabulary."""
        return widen(self.logits[None], self.ids, self.vocab_size)[0]

    def argmax(self) -> int:
        """The widened row's argmax as `argmax_ids` takes it: the maximum with the lowest target id,
        a NaN counting as the maximum. (A row all -inf gives the draft vocabulary's lowest id; the
        widened row's argmax would be id 0, a token outside it.)"""
        row = self.logits.detach().numpy()
        first = int(row.argmax())  # numpy's: the first maximum, a NaN counting as the maximum
        if self.ascending:
            return int(self.ids[first])
        best = row[first]
        tied = np.isnan(row) if np.isnan(best) else row == best
        return int(self.ids.numpy()[tied].min())

    def top(self, k: int) -> list[int]:
        """The target ids of the k highest logits, best first, as `argmax` ranks them: NaNs first,
        equal logits by ascending target id (so ``top(1)`` is ``[argmax()]``). A tree's ranked
        children, without the widened row (its top-k over 49,152 floats cost about a fifth of an MTP
        draft step). Past the draft vocabulary's size, the ids outside it follow, lowest first."""
        if self.ascending and k <= FEW and k <= self.logits.shape[0]:
            few = self._first_few(k)
            if few is not None:
                return few
        return self._ranked(k)

    def _first_few(self, k: int) -> list[int] | None:
        """`top` for a few ids that ascend: k passes of numpy's argmax (the first maximum, a NaN counting
        as one, so the lowest id among equals), each masking its pick; about 5 us for a two-node tree's
        children where `_ranked`'s topk and sort took 60. None where only -inf is left to rank."""
        row = self.logits.detach().numpy().copy()
        picked: list[int] = []
        for _ in range(k):
            first = int(row.argmax())
            if row[first] == -np.inf:  # a masked pick and a -inf logit would tie: `_ranked` orders them
                return None
            picked.append(int(self.ids[first]))
            row[first] = -np.inf
        return picked

    def _ranked(self, k: int) -> list[int]:
        logits = self.logits
        width = min(k, logits.shape[0])
        cut = logits.topk(width).values[-1]  # torch ranks a NaN highest too
        nan = torch.isnan(logits)
        if torch.isnan(cut):  # only NaNs are chosen: the lowest ids among them
            chosen = nan.nonzero().flatten()
        else:  # everything above the cut, then the lowest ids among the logits equal to it
            above = ((logits > cut) | nan).nonzero().flatten()
            tied = (logits == cut).nonzero().flatten()
            chosen = torch.cat([above, tied[self.ids[tied].argsort()][: width - above.numel()]])
        ranked = sorted((not math.isnan(v), -v if v == v else 0.0, int(i))
                        for v, i in zip(logits[chosen].tolist(), self.ids[chosen].tolist()))
        out = [i for _, _, i in ranked][:width]
        if k > width:  # the widened row's -inf entries: ids outside the draft vocabulary, lowest first
            inside = set(self.ids.tolist())
            out += [i for i in range(self.vocab_size) if i not in inside][: k - width]
        return out


def ascends(ids: torch.Tensor | None) -> bool:
    """Whether a draft vocabulary's target ids ascend (`DraftRow.ascending`)."""
    return ids is not None and bool((ids[1:] > ids[:-1]).all())


def widen(logits: torch.Tensor, ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Draft-vocabulary logits [n, Vd] as target-vocabulary ones [n, V]: -inf at every other id."""
    full = logits.new_full((logits.shape[0], vocab_size), float("-inf"))
    full[:, ids] = logits
    return full


Logits = Union[torch.Tensor, DraftRow]
"""What a module gives for its entries: [n, V] target-vocabulary logits, or a `DraftRow` for the
last entry alone."""


def widened(row: Logits) -> torch.Tensor:
    """A [V] target-vocabulary row, from a `DraftRow` or a [V] row."""
    return row.widened() if isinstance(row, DraftRow) else row


def top_ids(row: Logits, k: int) -> list[int]:
    """The target ids of a [V] row's (or a `DraftRow`'s) k highest logits, best first."""
    return row.top(k) if isinstance(row, DraftRow) else row.topk(k).indices.tolist()


def last_row(logits: Logits) -> Logits:
    """The last entry's row of a module's logits."""
    return logits if isinstance(logits, DraftRow) else logits[-1]


class HeadModule(Protocol):
    """One draft module: entries (feature, token) in, (output hidden, target-vocab logits) out."""

    def __call__(self, features: torch.Tensor, token_ids: torch.Tensor, cache: HeadCache,
                 last: bool = False) -> tuple[torch.Tensor, Logits]:
        """features [n, H] and token_ids [n] for the next n entries -> hidden [n, H], logits [n, V].

        Appends the n entries to ``cache``. ``hidden`` is what a later draft step feeds back as
        its feature; ``logits`` are float32 over the target's vocabulary, for the last entry only
        ([1, V]) with ``last``: drafting reads no other row, and the LM head over a prompt's every
        row would cost more than the draft step itself. With ``last``, a head with a draft
        vocabulary gives a `DraftRow` instead.
        """
        ...


def run_blocks(blocks: torch.nn.ModuleList | list[torch.nn.Module], x: torch.Tensor, cache: HeadCache,
               rotary: Rotary) -> torch.Tensor:
    """Run decoder blocks over [1, n, H] with the cache's positions; advance the cache by n."""
    n = x.shape[1]
    positions = cache.positions(n)
    position_embeddings = rotary(x, positions)
    mask = cache.mask(n, x.dtype)
    for block in blocks:
        x = block(x, attention_mask=mask, position_ids=positions, cache=cache.kv, use_cache=True,
                  position_embeddings=position_embeddings)
    cache.advance(n)
    return x


def attend(attention: torch.nn.Module, x: torch.Tensor, cache: HeadCache, rotary: Rotary,
           reference: torch.Tensor) -> torch.Tensor:
    """One attention call over [1, n, D] (D may differ from the hidden size, as in EAGLE-3).

    ``reference`` ([1, n, H]) gives the rotary embedding its dtype. Advances the cache by n.
    """
    n = x.shape[1]
    positions = cache.positions(n)
    out, _ = attention(hidden_states=x, position_embeddings=rotary(reference, positions),
                       attention_mask=cache.mask(n, reference.dtype), cache=cache.kv, position_ids=positions)
    cache.advance(n)
    return out


def kernel_ready(cache: HeadCache, rows: int) -> bool:
    """Whether the C kernel may write the next ``rows`` entries of ``cache``'s one layer: outside
    autograd, a few rows, and a layer the first (prompt) call has already sized on torch."""
    layers = cache.kv.layers
    return (rows <= KERNEL_ROWS and not torch.is_grad_enabled() and bool(layers) and layers[0].is_initialized
            and not cache.laid_out)


def kernel_segment(cache: HeadCache, rows: int) -> ctypes.Array:
    """The kernel's Segment for the next ``rows`` entries of ``cache``'s one layer (room is made);
    `commit_rows` declares them written."""
    start, layer = cache.length, cache.kv.layers[0]
    keys, values = layer.reserve(start + rows)
    return (SegmentStruct * 1)(SegmentStruct(keys.data_ptr(), values.data_ptr(), keys.shape[-2], start, rows, None))


def commit_rows(cache: HeadCache, rows: int) -> None:
    cache.kv.layers[0].set_length(cache.length + rows)
    cache.advance(rows)


def use_cache_slots(blocks: list[torch.nn.Module]) -> None:
    """Number the blocks' attention 0.. so each module's cache holds only its own layers."""
    for i, block in enumerate(blocks):
        block.self_attn.layer_idx = i


class RowLinear(torch.nn.Linear):
    """An nn.Linear whose inference products over a few rows take the faster path: float32 rows
    through `products.project` (as the target's), bf16 rows on the C kernel where there is one.

    A draft step is one row (a head's catch-up after a verify a few). In float32 ``F.linear`` over
    one row runs on one core on an AVX2 CPU: `project` made the shipped EAGLE-3 head's one-row step
    5.0 -> 4.1 ms and a 3-row one 6.4 -> 4.5 ms there. In bf16 oneDNN's matmul costs about 0.3 ms a
    product on 2 cores and the kernel's a fraction of it. Training (autograd) keeps ``F.linear``.
    A draft head's numerics never reach the output: the target's verification decides every token.
    """

    kernel: "AnyKernel | None" = None
    blocks: "BlockMatrix | None" = None
    """The weight as Q8_0 blocks, read instead on the float32 kernel (head_blocks.py)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if torch.is_grad_enabled() or not self.weight.is_contiguous() or rows > KERNEL_ROWS:
            return F.linear(x, self.weight, self.bias)
        flat = x.reshape(rows, self.in_features)
        if self.blocks is not None and x.dtype == torch.float32 and self.kernel is not None:
            out = self.kernel.linear_blocks(self.blocks, flat.contiguous(), self.bias)  # type: ignore[union-attr]
            return out.view(*x.shape[:-1], self.out_features)
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            return project(flat, self.weight, self.bias).view(*x.shape[:-1], self.out_features)
        kernel = self.kernel
        if (kernel is None or kernel.dtype != torch.bfloat16 or x.dtype != torch.bfloat16
                or self.weight.dtype != torch.bfloat16):
            return F.linear(x, self.weight, self.bias)
        out = kernel.linear_rows(self.weight, flat.contiguous())
        if self.bias is not None:
            out = out + self.bias
        return out.view(*x.shape[:-1], self.out_features)


def use_row_kernel(module: torch.nn.Module, kernel: "AnyKernel | None") -> int:
    """Turn every nn.Linear of a loaded head into a `RowLinear` on ``kernel`` (None: no C kernel, the
    float32 path still applies); returns how many."""
    count = 0
    for sub in module.modules():
        if type(sub) is torch.nn.Linear:
            sub.__class__ = RowLinear
            sub.kernel = kernel
            count += 1
    return count
