"""The one logits -> probabilities transform, and drawing a token.

The verifier is lossless only when the target's p and the draft's q come from the *same*
transform, so ``probs_from_logits`` is the only place temperature, min-p, top-k and top-p are applied.
"""

from __future__ import annotations

import torch

from specsure.sampling.params import SamplingParams


def probs_from_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Turn logits ``[..., V]`` into the sampling distribution ``[..., V]`` (float32).

    Order: temperature, then min-p, then top-k, then top-p, then renormalise; the same transform must feed
    both the target's p and the draft's q. Greedy params give a one-hot at the argmax (the
    temperature -> 0 limit), so the verifier's sampled rule reduces to argmax equality.
    Top-k keeps exactly k tokens (ties broken by ``torch.topk``). Top-p keeps the smallest
    prefix of the sorted distribution whose mass is >= top_p, so the top token always stays.
    """
    logits = logits.float()
    if params.greedy:
        index = logits.argmax(dim=-1, keepdim=True)
        return torch.zeros_like(logits).scatter_(-1, index, 1.0)
    logits = logits / params.temperature
    if params.min_p > 0:
        probs = torch.softmax(logits, dim=-1)
        floor = params.min_p * probs.max(dim=-1, keepdim=True).values
        logits = logits.masked_fill(probs < floor, float("-inf"))  # the top token is never below its own floor
    vocab = logits.shape[-1]
    if 0 < params.top_k < vocab:
        # topk returns the survivors already sorted, so top-p never sorts the full vocabulary.
        values, index = torch.topk(logits, params.top_k, dim=-1)  # [..., top_k]
        kept = _nucleus(torch.softmax(values, dim=-1), params.top_p)
        return torch.zeros_like(logits).scatter_(-1, index, kept)
    probs = torch.softmax(logits, dim=-1)
    if params.top_p >= 1.0:
        return probs
    sorted_probs, index = probs.sort(dim=-1, descending=True)
    return torch.zeros_like(probs).scatter_(-1, index, _nucleus(sorted_probs, params.top_p))


def _nucleus(sorted_probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Top-p on probabilities sorted in descending order; returns them renormalised."""
    if top_p >= 1.0:
        return sorted_probs
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    cut = mass_before >= top_p
    cut[..., 0] = False  # a top_p below float32's smallest number compares as 0, which would cut every token
    kept = sorted_probs.masked_fill(cut, 0.0)
    return kept / kept.sum(dim=-1, keepdim=True)


def draw(logits: torch.Tensor, params: SamplingParams,
         generator: torch.Generator | None) -> tuple[int, torch.Tensor | None]:
    """One token from a ``[V]`` row of logits, and the distribution it came from.

    Greedy params give the argmax and None (a point mass, as the verifier reads ``q = None``);
    otherwise a sample from ``probs_from_logits`` and that ``[V]`` row. The engine picks target
    tokens with it and every drafter its draft tokens, so p and q are always made the same way.
    """
    if params.greedy:
        return argmax_ids(logits)[0], None
    probs = probs_from_logits(logits[None], params)[0]  # [V]
    return int(sample(probs, generator)), probs


def argmax_ids(logits: torch.Tensor) -> list[int]:
    """Each row's argmax: ``[V]`` -> one id, ``[n, V]`` -> n ids; the first maximum wins (a NaN
    counts as the maximum), as with ``torch.argmax``.

    Float rows on the CPU go through numpy, whose argmax is vectorised where torch's CPU reduction
    is not: over the default model's 49,152 logits about 4 us a row against 55 us on one core, and
    a speculative step takes it over every row it verifies.
    """
    if logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.float64):
        return logits.detach().numpy().argmax(-1).reshape(-1).tolist()
    return logits.argmax(-1).reshape(-1).tolist()


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Draw one token id per row of ``probs`` (``[V]`` -> ``[]``, ``[n, V]`` -> ``[n]``), int64.

    ``probs`` need not be normalised. Pass a seeded generator for reproducible output; None uses
    torch's global generator.
    """
    ids = torch.multinomial(probs, 1, generator=generator)  # [1] or [n, 1]
    return ids.squeeze(-1)
