"""What an architecture's `*ForCausalLM.forward` does to the logits around its LM head.

CausalLM runs the base model and the head itself, so these steps are repeated from the model's
own config; `CausalLM` checks at load that nothing else is left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal


_Scaling = Literal["multiply_logits", "divide_logits", "divide_hidden"]

_SCALED_HEADS: dict[str, tuple[str, _Scaling]] = {
    # text-config model_type: (config field, what its *ForCausalLM.forward does with it), as
    # transformers 5 writes them. One field name can mean opposite things (`logits_scaling`
    # divides for Granite, multiplies for HyperCLOVAX), so the family decides, not the name.
    "cohere": ("logit_scale", "multiply_logits"),
    "cohere2": ("logit_scale", "multiply_logits"),
    "cohere2_moe": ("logit_scale", "multiply_logits"),
    "granite": ("logits_scaling", "divide_logits"),
    "granite_swa": ("logits_scaling", "divide_logits"),
    "granitemoe": ("logits_scaling", "divide_logits"),
    "granitemoe_swa": ("logits_scaling", "divide_logits"),
    "granitemoeshared": ("logits_scaling", "divide_logits"),
    "granitemoehybrid": ("logits_scaling", "divide_logits"),
    "hyperclovax": ("logits_scaling", "multiply_logits"),
    "minicpm3": ("logits_scaling", "divide_hidden"),
}


@dataclass(frozen=True)
class LogitsTransform:
    """What an architecture's `*ForCausalLM.forward` does around its LM head.

    CausalLM runs the base model and the head itself (draft heads need the head on their own
    hidden states), so it must repeat these steps, in this order, to decode from the model's
    own distribution. `CausalLM` checks at construction that nothing else is left out.
    """

    hidden_divisor: float = 1.0
    """The post-norm hidden state is divided by this before the head (MiniCPM3)."""
    multiplier: float = 1.0
    """The head's logits are multiplied by this (Cohere's `logit_scale`)."""
    divisor: float = 1.0
    """The head's logits are divided by this (Granite's `logits_scaling`)."""
    softcap: float | None = None
    """Last, logits become `softcap * tanh(logits / softcap)` (Gemma-2's
    `final_logit_softcapping`); None for no capping."""


def logits_transform(text_config: Any) -> LogitsTransform:
    """The LogitsTransform that a transformers text config declares (identity for most)."""
    # Every family that has this field (Gemma 2/3/3n/4, VaultGemma, NanoChat, ...) caps the same way.
    softcap = getattr(text_config, "final_logit_softcapping", None) or None
    scaled = _SCALED_HEADS.get(getattr(text_config, "model_type", ""))
    if scaled is None:
        return LogitsTransform(softcap=softcap)
    field, scaling = scaled
    value = getattr(text_config, field, None)
    value = 1.0 if value is None else float(value)
    if scaling == "multiply_logits":
        return LogitsTransform(multiplier=value, softcap=softcap)
    if scaling == "divide_logits":
        return LogitsTransform(divisor=value, softcap=softcap)
    return LogitsTransform(hidden_divisor=value, softcap=softcap)
