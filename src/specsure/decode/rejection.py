"""The verifier: speculative rejection sampling (Leviathan et al. 2023; Chen et al. 2023).

Vocabulary, used with exactly these meanings in names and docs across specsure:

- *draft* tokens: the k tokens a proposer offers for one step, ``x_0 .. x_{k-1}``.
- *accepted* tokens: the leading draft tokens that pass verification.
- *recovered* token: sampled at the first rejected position i from norm(max(0, p_i - q_i));
  verification stops there.
- *bonus* token: sampled from the target's p_k when all k draft tokens are accepted.
- *output* tokens: the accepted tokens plus the one recovered or bonus token, so a step always
  yields between 1 and k + 1 tokens.

p is the target's distribution and q the draft's, both ``[positions, vocab]`` and both produced
by ``sampling.probs_from_logits`` with the same params. Row i of p is the target's distribution
for the token after the context plus ``x_0 .. x_{i-1}``; p has k + 1 rows because the last row
gives the bonus token. ``q = None`` means each draft token was a point mass (q = 1), as for
ngram and greedy drafters. Accepting x_i with probability min(1, p_i(x)/q_i(x)) and resampling
from the residual on rejection makes each output token distributed exactly as p.

All functions here are pure: randomness comes only from the ``generator`` passed in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from specsure.sampling import argmax_ids, sample


@dataclass(frozen=True)
class Verdict:
    """The result of verifying one step's draft tokens."""

    accepted: int
    """How many leading draft tokens were accepted (0 .. k)."""
    output_ids: list[int]
    """The output tokens: the accepted draft tokens, then the recovered or bonus token;
    ``len(output_ids) == accepted + 1``."""


def verify_greedy(target_logits: torch.Tensor, draft_ids: Sequence[int]) -> Verdict:
    """Accept draft tokens while each equals the target's argmax.

    ``target_logits`` is ``[k + 1, V]`` (logits or probs; only the argmax matters). The last
    output token is the target's argmax at the first mismatch (recovered) or at position k
    (bonus), so the output equals plain greedy decoding.
    """
    k = len(draft_ids)
    _check_rows("target_logits", target_logits, k + 1, k)
    target_ids = argmax_ids(target_logits)  # k + 1 ids
    accepted = 0
    while accepted < k and draft_ids[accepted] == target_ids[accepted]:
        accepted += 1
    return Verdict(accepted, target_ids[: accepted + 1])


def verify_sampled(
    p: torch.Tensor,
    draft_ids: Sequence[int],
    q: torch.Tensor | None,
    generator: torch.Generator | None,
    *,
    uniforms: torch.Tensor | None = None,
) -> Verdict:
    """Speculative rejection sampling, vectorised over draft positions (the fast path).

    p: ``[k + 1, V]`` target probs. q: ``[k, V]`` draft probs, or None for point-mass drafts.
    The accept test uses one uniform per position, drawn up front as ``torch.rand(k)`` from
    ``generator`` unless ``uniforms`` (``[k]``) is given; then the recovered or bonus token is
    drawn from ``generator``. ``verify_sampled_reference`` consumes randomness identically, so
    both return the same Verdict from the same generator state.
    """
    draft, uniforms = _prepare(p, draft_ids, q, generator, uniforms)
    k = draft.numel()
    p_draft = p[:k].gather(1, draft[:, None]).squeeze(1)  # [k]
    if q is None:
        accept = uniforms < p_draft
    else:
        q_draft = q.gather(1, draft[:, None]).squeeze(1)  # [k]
        # u < p/q written without the division: p(x) = 0 always rejects, q(x) = 0 always accepts.
        accept = uniforms * q_draft < p_draft
    flags = accept.tolist()  # one transfer; k is small, so the scan is cheaper in Python
    accepted = flags.index(False) if False in flags else k
    if accepted == k:
        bonus = int(sample(p[k], generator))
        return Verdict(k, [*draft_ids, bonus])
    residual = _residual(p[accepted], None if q is None else q[accepted], draft_ids[accepted])
    recovered = int(sample(residual, generator))
    return Verdict(accepted, [*draft_ids[:accepted], recovered])


def _residual(p_i: torch.Tensor, q_i: torch.Tensor | None, draft_id: int) -> torch.Tensor:
    """Unnormalised max(0, p_i - q_i) (``sample`` normalises); q_i None is a point mass."""
    if q_i is None:
        residual = p_i.clone()
        residual[draft_id] = 0.0
    else:
        residual = (p_i - q_i).clamp_(min=0.0)
    if not residual.sum() > 0:
        # max(0, p - q) is all zero only when p <= q everywhere, i.e. p == q. Then rejection has
        # probability 0: we got here through rounding or an impossible draft (q(x) = 0), so any
        # fallback is measure-zero. p is the natural one (sampling fails on an all-zero row).
        return p_i
    return residual


def verify_sampled_reference(
    p: torch.Tensor,
    draft_ids: Sequence[int],
    q: torch.Tensor | None,
    generator: torch.Generator | None,
    *,
    uniforms: torch.Tensor | None = None,
) -> Verdict:
    """The same rule as ``verify_sampled``, one token at a time, straight from the paper.

    Kept next to the fast path as its specification; tests compare the two.
    """
    _, uniforms = _prepare(p, draft_ids, q, generator, uniforms)
    output_ids: list[int] = []
    for i, x in enumerate(draft_ids):
        p_x = float(p[i, x])
        q_x = 1.0 if q is None else float(q[i, x])
        r = float(uniforms[i])
        if q_x > 0:
            ratio = p_x / q_x
        else:  # an impossible draft; still never accept a token the target rules out
            ratio = math.inf if p_x > 0 else 0.0
        if r < min(1.0, ratio):
            output_ids.append(x)
            continue
        if q is None:
            residual = p[i].clone()
            residual[x] = 0.0
        else:
            residual = torch.clamp(p[i] - q[i], min=0.0)
        if residual.sum() <= 0:
            residual = p[i]  # p == q up to rounding: see _residual
        recovered = int(sample(residual, generator))
        return Verdict(i, output_ids + [recovered])
    bonus = int(sample(p[len(draft_ids)], generator))
    return Verdict(len(draft_ids), output_ids + [bonus])


def _prepare(
    p: torch.Tensor,
    draft_ids: Sequence[int],
    q: torch.Tensor | None,
    generator: torch.Generator | None,
    uniforms: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Check shapes and ids; return the draft ids as a tensor and the accept-test uniforms."""
    k = len(draft_ids)
    _check_rows("p", p, k + 1, k)
    vocab = p.shape[1]
    if q is not None and tuple(q.shape) != (k, vocab):
        raise ValueError(f"q has shape {tuple(q.shape)}; expected [k, V] = [{k}, {vocab}] to match "
                         "p and the draft; pass q=None for point-mass drafts")
    if k and not (0 <= min(draft_ids) and max(draft_ids) < vocab):
        raise ValueError(f"draft ids {list(draft_ids)} fall outside the vocabulary [0, {vocab}); "
                         "the proposer must return ids in the target vocabulary")
    if uniforms is None:
        uniforms = torch.rand(k, generator=generator, device=p.device)
    elif tuple(uniforms.shape) != (k,):
        raise ValueError(f"uniforms has shape {tuple(uniforms.shape)}; expected [{k}], one per draft token")
    return torch.tensor(list(draft_ids), dtype=torch.long, device=p.device), uniforms  # [k], [k]


def _check_rows(name: str, t: torch.Tensor, rows: int, k: int) -> None:
    if t.dim() != 2 or t.shape[0] != rows:
        raise ValueError(f"{name} has shape {tuple(t.shape)}; expected [k + 1, V] with k = {k} draft "
                         f"tokens, i.e. {rows} rows: one per draft token plus one for the bonus token")
