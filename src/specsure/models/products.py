"""The products of a few rows by a weight matrix, the fastest way this machine has for each dtype.

Every native forward, the LM head and the draft heads' linears call `project`: float32 rows on
the float32 C kernel (or padded `weight @ x.T` without it), one bf16 row through ``torch.mv``,
anything else through ``F.linear``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specsure.models import float_kernel as float_kernels

KERNEL_ROWS = 64
"""bf16 forwards over at most this many rows (decode, verify, a batch of them) run through the C kernel,
longer ones on torch (float32 forwards all run in C since 2026-12-07: native.py says why); and the
most rows a float32 product here sends to the kernel's `linear_rows`."""

PADDED_ROWS = {1: 2, 3: 4, 7: 8, 12: 16, 13: 16, 14: 16, 15: 16}
"""float32 row counts that `project` rounds up, repeating the last row. On an AVX2 CPU a product
over one row ran on one core, and some counts took a slower blocking; the padded products cost
less. The default model's whole forward at ~200 cached tokens (2 threads): one row 50 ms against
65 through ``mv``, three rows 55 against 79 unpadded, thirteen 113 against 153; 5, 6, 9-11 and 20
rows were slower padded."""


def project(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` for [n, in] rows: a few float32 rows on the float32 C kernel (float_kernel.c:
    the weights streamed once, each row's bits independent of the others) or, without it, as
    ``weight @ x.T``; one bf16 row through ``torch.mv``; anything else through ``F.linear``.

    In bf16 an ``F.linear`` over one row costs as much as over nine, while ``mv`` reads the weights
    at about 1.3x the speed and gives bit-identical results (its row equals row i of the batched
    product), so decode steps get faster without changing a single logit.

    In float32, ``F.linear`` over a few rows (x @ W.T) costs up to twice a one-row step on an AVX2
    CPU, where ``weight @ x.T`` streams the weight once. Its input must be row-major and its output
    is made so: the product's own output is a transposed view, and ``weight @ x.T`` over such a view
    took 2.5 times as long, which was every product of a layer after the first (the default
    model's 4-row forward 69 -> 53 ms on 2 threads, interleaved). A few row counts are padded
    (`PADDED_ROWS`), one row among them. Past ``KERNEL_ROWS`` rows (a prefill) F.linear's
    blocked product is the faster one.
    """
    n = x.shape[0]
    if x.dtype == torch.float32 and n <= KERNEL_ROWS:
        fast = _float_kernel(x, weight, bias)
        if fast is not None:
            return fast.linear_rows(weight, x.contiguous(), bias)
        padded = PADDED_ROWS.get(n, n)
        rows = x.contiguous() if padded == n else torch.cat([x, x[-1:].expand(padded - n, -1)])
        out = torch.mm(weight, rows.t())[:, :n].t().contiguous()  # [n, out], row-major for the next product
    elif n == 1:
        out = torch.mv(weight, x[0]).unsqueeze(0)  # [1, out]
    else:
        return F.linear(x, weight, bias)
    return out if bias is None else out + bias


def _float_kernel(x: torch.Tensor, weight: torch.Tensor,
                  bias: torch.Tensor | None) -> float_kernels.FloatKernel | None:
    """The float32 C kernel where this product may run on it: loaded, contiguous float32 weights,
    and no gradient wanted (training keeps torch's products); else None."""
    kernel = float_kernels.load()[0]
    if kernel is None or weight.dtype != torch.float32 or not weight.is_contiguous():
        return None
    if bias is not None and (bias.dtype != torch.float32 or not bias.is_contiguous()):
        return None
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                    or (bias is not None and bias.requires_grad)):
        return None
    return kernel
