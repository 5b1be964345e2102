"""The target's embedding and LM head, as a float32 head being trained calls them."""

from __future__ import annotations

import torch

from specsure.models.causal_lm import CausalLM


class TargetParts:
    """The target's embedding and LM head as `MTPModule` and `Eagle3Module` call them, for a float32 module on any target.

    The LM head runs in the target's dtype (as at inference); autograd carries the gradient back
    to the float32 module through the cast.
    """

    def __init__(self, lm: CausalLM) -> None:
        self.lm = lm
        self.vocab_size = lm.vocab_size

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.lm.embed(token_ids)

    def lm_head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm.lm_head_logits(hidden.to(self.lm.dtype))
