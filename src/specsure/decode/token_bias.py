"""logit_bias and allowed_token_ids on the target's logits, for every row a step scores.

Like the penalties (`specsure.decode.penalties`), they change the target's distribution, so they go
on every row the verifier reads, and the draft's q stays as it is: a draft token the target's
rows now rule out is simply rejected, and the output is what plain decoding with the same
params gives. vLLM's order: the allowed ids first, then the bias, then the penalties.
"""

from __future__ import annotations

import torch

from specsure.sampling import SamplingParams


def biased(params: SamplingParams) -> bool:
    """Whether ``params`` asks for a logit bias or a set of allowed tokens."""
    return params.logit_bias is not None or params.allowed_token_ids is not None


class TokenBias:
    """One request's bias and allowed tokens over a vocabulary of ``vocab`` ids (all below it, as
    `Engine.check_params` makes sure)."""

    def __init__(self, params: SamplingParams, vocab: int) -> None:
        pairs = params.logit_bias or ()
        self.ids = torch.tensor([t for t, _ in pairs], dtype=torch.long)  # [b]
        self.values = torch.tensor([v for _, v in pairs], dtype=torch.float32)  # [b]
        self.blocked: torch.Tensor | None = None  # [vocab] bool: the ids allowed_token_ids leaves out
        if params.allowed_token_ids is not None:
            self.blocked = torch.ones(vocab, dtype=torch.bool)
            self.blocked[torch.tensor(params.allowed_token_ids, dtype=torch.long)] = False

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` [n, vocab] with the bias added and the ids not allowed at -inf (a new float32 tensor)."""
        logits = logits.float().clone()
        if self.blocked is not None:
            logits.masked_fill_(self.blocked, float("-inf"))
        if self.ids.numel():
            logits[:, self.ids] += self.values
        return logits
