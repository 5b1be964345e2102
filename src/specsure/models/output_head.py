"""The LM head: post-norm hidden states to float32 logits, as the model's own forward computes them.

The head's weights run on whichever path is fastest for the rows at hand (a GGUF's blocks in the
float32 kernel, on AMX tiles where the CPU has them; the bf16 kernel; few-row products; torch), and
the model's scalar steps after the head (`LogitsTransform`: a hidden divisor, multipliers,
softcapping) follow, so `CausalLM.forward`'s logits are the ones `*ForCausalLM.forward` gives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from specsure.models.fused_layer import meta_weight
from specsure.models.gguf_blocks import A4, A8, INT8_FORMATS, BlockMatrix, matches, q8_blocks
from specsure.models.logits import LogitsTransform
from specsure.models.products import KERNEL_ROWS, project
from specsure.models.row_pieces import PIECE_ROWS

if TYPE_CHECKING:
    from specsure.models.float_kernel import FloatKernel
    from specsure.models.native import NativeDecoder


class OutputHead:
    """A model's output embeddings and the scalar steps after them."""

    def __init__(self, module: torch.nn.Module, transform: LogitsTransform, native: "NativeDecoder | None") -> None:
        self.module = module
        self.transform = transform
        self._native = native
        self.blocks: BlockMatrix | None = None
        """The head's weights as a GGUF's blocks, which the float32 kernel reads (`use_blocks`)."""
        self.tiles: BlockMatrix | None = None
        """``blocks`` packed for AMX tiles (A8), where the CPU has them: what the kernel reads then."""
        self.int8: BlockMatrix | None = None
        """``blocks`` packed for the integer products (R8_0 and the like), in a model loaded with int8
        activations: what the kernel reads then."""

    def use_blocks(self, blocks: BlockMatrix, kernel: "FloatKernel", int8_activations: bool = False) -> bool:
        """Read the head as ``blocks`` where they hold its weights bit for bit, with int8 activations
        where asked and possible; whether it does."""
        head = self.module
        if type(head) is not torch.nn.Linear or head.bias is not None or not matches(blocks, head.weight, kernel):
            return False
        read = kernel.prepared(blocks, int8_activations)
        self.blocks = blocks
        self.tiles = read if read.format in (A4, A8) else None
        self.int8 = read if read.format in INT8_FORMATS else None
        return True

    def release(self, embedding: torch.nn.Module) -> tuple[int, torch.nn.Module]:
        """Drop the head's float32 weight where the kernel reads it as blocks; returns the bytes dropped
        and the input embedding to use from now on. A tied embedding (the same weight) is then looked
        up in the blocks (`BlockEmbedding`, the same bits) if it is a plain one; a scaled one (Gemma's)
        keeps the weight. After it, only the blocks' paths can compute the head (`logits` takes them
        for every float32 row; `draft` gathers their rows)."""
        head, blocks = self.module, self.blocks
        if blocks is None or type(head) is not torch.nn.Linear or head.weight.is_meta:  # none, or dropped already
            return 0, embedding
        weight = head.weight
        if getattr(embedding, "weight", None) is weight:
            kernel = self._native.float_kernel if self._native is not None else None
            if type(embedding) is not torch.nn.Embedding or embedding.max_norm is not None or kernel is None:
                return 0, embedding
            embedding.weight = head.weight = meta_weight(weight)
            return weight.numel() * weight.element_size(), BlockEmbedding(blocks, kernel)
        head.weight = meta_weight(weight)
        return weight.numel() * weight.element_size(), embedding

    def logits(self, hidden: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
               blocks: BlockMatrix | None = None) -> torch.Tensor:
        """[..., hidden] post-norm states -> float32 [..., vocab], as `*ForCausalLM.forward` does: by the
        LM head, or by ``weight`` and ``bias`` (and ``blocks``, the same weights as GGUF blocks)."""
        transform = self.transform
        if transform.hidden_divisor != 1.0:
            hidden = hidden / transform.hidden_divisor  # model dtype, as the model divides it
        # The scalar steps run in float32: at most a rounding step away from the model's own
        # half-precision arithmetic, and the verifier works in float32 anyway.
        head = self.module
        native = self._native
        linear = weight is not None or type(head) is torch.nn.Linear
        streamed = weight is None  # the model's own head, read once a step (float_kernel.c's STREAMED)
        if weight is None and linear:
            weight, bias, blocks = head.weight, head.bias, self.int8 or self.tiles or self.blocks
        in_c = (linear and hidden.dtype == torch.float32 and not hidden.requires_grad
                and not (torch.is_grad_enabled() and weight.requires_grad))
        # A float32 model on the kernel takes every row count in C, whatever the head's format: more
        # rows on torch would take another arithmetic than the decode step's (prompt logprobs, a big batch).
        every_row = in_c and native is not None and native.float_kernel is not None
        if (blocks is not None and bias is None and in_c
                and (hidden.dim() == 2 and hidden.shape[0] <= KERNEL_ROWS or every_row)):
            flat = hidden.reshape(-1, hidden.shape[-1]).contiguous()
            logits = _in_pieces(lambda rows: native.float_kernel.linear_blocks(blocks, rows, streamed=streamed), flat)
            logits = logits.view(*hidden.shape[:-1], blocks.rows)
        elif every_row and weight.dtype == torch.float32:  # a head the kernel does not read as blocks
            flat, weight = hidden.reshape(-1, hidden.shape[-1]).contiguous(), weight.contiguous()
            logits = _in_pieces(lambda rows: native.float_kernel.linear_rows(weight, rows, bias), flat)
            logits = logits.view(*hidden.shape[:-1], weight.shape[0])
        elif (native is not None and native.kernel is not None and hidden.dim() == 2 and linear
                and bias is None and weight.is_contiguous() and hidden.dtype == torch.bfloat16
                and not hidden.requires_grad  # a head in training backpropagates through the LM head
                and hidden.shape[0] <= KERNEL_ROWS):
            logits = native.kernel.linear_rows(weight, hidden.contiguous()).float()
        elif hidden.dim() == 2 and linear:
            logits = project(hidden, weight, bias).float()  # few rows: the faster products
        elif linear:
            logits = torch.nn.functional.linear(hidden, weight, bias).float()
        else:
            logits = head(hidden).float()
        return self.transformed(logits)

    def row_logits(self, hidden: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Only the logits of the vocabulary ids ``rows`` [..., len(rows)]: a trainer's labels over a
        draft vocabulary cost a sixth of the head then."""
        head = self.module
        if type(head) is not torch.nn.Linear:
            return self.logits(hidden)[..., rows]
        if self.transform.hidden_divisor != 1.0:
            hidden = hidden / self.transform.hidden_divisor
        bias = None if head.bias is None else head.bias[rows]
        return self.transformed(torch.nn.functional.linear(hidden, head.weight[rows], bias).float())

    def draft(self, rows: torch.Tensor, int8_activations: bool = False) -> Callable[[torch.Tensor], torch.Tensor]:
        """Logits over the vocabulary ids ``rows`` only: post-norm states [n, hidden] -> float32 [n, len(rows)].

        For a drafter that predicts among a draft vocabulary. The head's rows are gathered once
        here, so each call reads len(rows) / vocab of the head: on a small model the full head is
        most of an MTP draft step's weight reads, and a draft step is bound by them. With
        ``int8_activations`` those rows are packed for the integer products (a third of the float32
        products' time at one row on AVX2): the head's blocks, or Q8_0 blocks of float32 rows.
        """
        head = self.module
        if type(head) is not torch.nn.Linear:
            return lambda hidden: self.logits(hidden)[..., rows]
        weight = head.weight[rows].contiguous()  # [len(rows), hidden]
        bias = None if head.bias is None else head.bias[rows]
        blocks = self.blocks
        # The same rows of the GGUF's blocks: a quarter of the bytes, and the bits of the float32 rows
        # (not of the whole head's logits where that runs on AMX tiles: a draft's numbers decide drafts only).
        if blocks is not None:
            blocks = BlockMatrix(blocks.data[rows].contiguous(), blocks.format, len(rows), blocks.cols, blocks.kind)
        kernel = self._native.float_kernel if self._native is not None else None
        if int8_activations and kernel is not None and weight.dtype == torch.float32:
            if blocks is None:  # Q8_0 of the float32 rows: a draft's arithmetic decides only the drafts
                blocks = q8_blocks(weight)
            blocks = None if blocks is None else kernel.prepared(blocks, True)
        return lambda hidden: self.logits(hidden, weight, bias, blocks)

    def transformed(self, logits: torch.Tensor) -> torch.Tensor:
        """The model's scalar steps after the head (float32 logits in, float32 out)."""
        transform = self.transform
        if transform.multiplier != 1.0:
            logits = logits * transform.multiplier
        if transform.divisor != 1.0:
            logits = logits / transform.divisor
        if transform.softcap is not None:
            cap, flat = transform.softcap, logits.reshape(-1, logits.shape[-1])
            if flat.shape[0] == 1:
                return torch.tanh(logits / cap) * cap
            # Row by row: an elementwise op splits its work (vector loops, a scalar tail) by the whole
            # tensor's size, so over many rows a row's tanh could round by what shares the call.
            logits = torch.stack([torch.tanh(row / cap) * cap for row in flat]).view(logits.shape)
        return logits


def _in_pieces(product: Callable[[torch.Tensor], torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
    """``product`` over ``rows`` in pieces of PIECE_ROWS: the kernel streams every row of x past each
    block of weight rows, so a long prompt's logprobs on a wide model would re-read x from memory
    (each row's bits are its own either way)."""
    if rows.shape[0] <= PIECE_ROWS:
        return product(rows)
    return torch.cat([product(rows[at:at + PIECE_ROWS]) for at in range(0, rows.shape[0], PIECE_ROWS)])


class BlockEmbedding(torch.nn.Module):
    """An input embedding looked up in the tied LM head's blocks: each id's row dequantised, the bits
    of the float32 row (`matches` checked the whole matrix), so the model keeps no float32 copy of it."""

    def __init__(self, blocks: BlockMatrix, kernel: "FloatKernel") -> None:
        super().__init__()
        self.blocks = blocks
        self.kernel = kernel

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        blocks, flat = self.blocks, token_ids.reshape(-1)
        ids = flat.tolist()  # checked here: the kernel reads whatever row it is given
        if ids and not 0 <= min(ids) <= max(ids) < blocks.rows:
            raise IndexError(f"token id {min(ids) if min(ids) < 0 else max(ids)} is out of the embedding's range "
                             f"0..{blocks.rows - 1}")
        return self.kernel.dequantized_rows(blocks, token_ids)
