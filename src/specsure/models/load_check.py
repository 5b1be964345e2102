"""The load-time checks that a wrapped model decodes what its own forward does, or is refused.

`CausalLM` runs the decoder and the LM head apart and keeps its own KV cache, so two things a
checkpoint's architecture could do differently would go unnoticed: transform the logits after the
head in a way `logits_transform` does not know, or keep a state beyond the key/value cache
(recurrent or convolutional layers). Each runs a few tokens once at load time and raises
ModelLoadError naming the model, rather than decoding from a wrong distribution without a word.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from specsure.models.errors import ModelLoadError

if TYPE_CHECKING:
    from specsure.models.causal_lm import CausalLM

# Tokens each check runs: enough to see a transform, cheap next to loading the weights.
_CHECK_TOKENS = 4


@torch.inference_mode()
def check_cache(lm: CausalLM) -> None:
    """Refuse a model whose layers keep a state that the rollback KV cache does not hold (recurrent,
    convolutional or linear-attention layers: Mamba, RWKV, hybrids). Its steps after the first would
    fail, or run without that state and decode from the wrong distribution without a word.

    A few tokens fed in steps over the cache (one, then two rows at once, as a verify step or a
    prompt prefilled in parts feeds them, then one) must give the logits they get when all of them
    run together.
    """
    ids = (torch.arange(1, _CHECK_TOKENS + 1) * (lm.vocab_size - 1) // (_CHECK_TOKENS + 1)).tolist()
    name = f"{type(lm.hf).__name__} (model_type {lm.config.model_type!r})"
    try:
        whole = lm.forward(ids).logits[1:]
        lm.reset()
        lm.forward(ids[:1], last_logits=1)
        stepped = torch.cat([lm.forward(ids[1:3]).logits, lm.forward(ids[3:]).logits])
    except Exception as exc:  # whatever the architecture's own code raises: the reason goes in the message
        raise ModelLoadError(
            f"{name}: a decode or verify step with specsure's KV cache fails ({type(exc).__name__}: {exc}). "
            "specsure runs models whose layers are all attention layers with a key/value cache, fed one or "
            "several new tokens at a time; recurrent, convolutional or linear-attention layers (Mamba, RWKV, "
            "hybrids) keep a state it cannot roll back, and a configuration the architecture's own code cannot "
            "run over a cache (a DeepSeek-V3 with fewer kv heads than heads) fails there too."
        ) from exc
    finally:  # a new cache: the check leaves no layer buffers behind, as if it never ran
        lm.drop_cache()
    # Attention over a cache may sum in another order than over the whole sequence: some slack in
    # float32. In bfloat16 every attention model measured was bit-exact here, and RWKV 58 units off.
    if gap := _beyond_rounding(stepped, whole, lm.dtype, units=16, floor=1e-4):
        error, tolerance = gap
        if getattr(lm.config.get_text_config(decoder=True), "use_bidirectional_attention", False):
            raise ModelLoadError(
                f"{name}: its config sets use_bidirectional_attention, so each token attends to the tokens after "
                f"it too (an encoder's attention: max |difference| {error:.3g} between decoding a token after the "
                "others and with them). specsure decodes causal language models; set it to false only if the "
                "checkpoint was trained causally.")
        raise ModelLoadError(
            f"{name}: a token decoded after the others gets other logits than with them in one forward "
            f"(max |difference| {error:.3g}, tolerance {tolerance:.3g}), so its layers keep a state beyond "
            "specsure's key/value cache. specsure runs models whose layers are all attention layers with a "
            "key/value cache; recurrent, convolutional or linear-attention layers (Mamba, RWKV, hybrids) "
            "are not supported."
        )


@torch.inference_mode()
def check_logits(lm: CausalLM) -> None:
    """Refuse a model whose own forward does more around the head than `logits_transform` knows.

    Runs a few tokens without any cache, so the KV cache stays empty. One forward: a hook
    keeps what the base model returned inside `hf`'s own forward.
    """
    ids = torch.arange(1, _CHECK_TOKENS + 1) * (lm.vocab_size - 1) // (_CHECK_TOKENS + 1)  # [n]
    ids = ids.unsqueeze(0).to(lm.hf.device)  # [1, n], spread over the vocabulary
    base_outputs: list[Any] = []
    hook = lm.hf.base_model.register_forward_hook(lambda _module, _args, out: base_outputs.append(out))
    # Layer matrices dropped for a GGUF's blocks before fusing (early_blocks.py) leave transformers' layers
    # nothing to run: its base model then answers with a fixed hidden state, and what its forward does
    # around the head is checked on that.
    layers_dropped = any(p.is_meta for p in lm.hf.base_model.parameters())
    if layers_dropped:
        lm.hf.base_model.forward = _fixed_hidden(lm, ids.shape[1])
    try:
        expected = lm.hf(input_ids=ids, use_cache=False).logits[0].float()  # [n, vocab']
    except Exception as exc:  # the architecture's own code on its own config: the reason goes in the message
        raise ModelLoadError(
            f"{type(lm.hf).__name__} (model_type {lm.config.model_type!r}): its own forward fails on "
            f"{_CHECK_TOKENS} tokens ({type(exc).__name__}: {exc}), so transformers cannot run this configuration "
            "either; check config.json's sizes (head counts, head dimensions) against the weights."
        ) from exc
    finally:
        hook.remove()
        if layers_dropped:
            del lm.hf.base_model.forward  # the class's own again
    base_out = base_outputs[0] if base_outputs else lm.hf.base_model(input_ids=ids, use_cache=False)
    got = lm.lm_head_logits(base_out.last_hidden_state[0])  # [n, vocab]
    name = type(lm.hf).__name__
    if got.shape != expected.shape:
        raise ModelLoadError(
            f"{name} returns logits of shape {tuple(expected.shape)} where its base model + LM head "
            f"give {tuple(got.shape)}; specsure cannot decode this architecture faithfully yet."
        )
    # Both paths run the same base model on the same inputs, so they differ only by how the
    # head's product and scalar steps round: a few units of the model dtype's epsilon, relative
    # to the largest logit; in float32 the few-row product sums in another order than
    # F.linear (`products.project`), up to about 1e-6 of it. Any real transform (a scale, a cap,
    # a bias) is far larger.
    if gap := _beyond_rounding(got, expected, lm.dtype, units=8, floor=1e-5):
        error, tolerance = gap
        raise ModelLoadError(
            f"{name}: the logits of its own forward differ from its base model + LM head + "
            f"{lm.logits_transform} (max |difference| {error:.3g}, tolerance {tolerance:.3g}); its "
            f"*ForCausalLM.forward transforms the logits in a way specsure does not reproduce, so "
            f"specsure cannot decode this architecture faithfully yet."
        )


def _fixed_hidden(lm: CausalLM, tokens: int) -> Any:
    """A base model's forward that returns the same hidden state for ``tokens`` positions whatever it is
    given: unit-variance rows (as a final norm leaves them), from a fixed seed."""
    from transformers.modeling_outputs import BaseModelOutputWithPast

    hidden = torch.randn(1, tokens, lm.hidden_size, generator=torch.Generator().manual_seed(0)).to(lm.dtype)
    return lambda *_args, **_kwargs: BaseModelOutputWithPast(last_hidden_state=hidden)


def _beyond_rounding(got: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, *, units: int,
                     floor: float) -> tuple[float, float] | None:
    """(max |difference|, tolerance) when two logit tensors differ by more than ``units`` of the dtype's
    epsilon (at least ``floor``) relative to the largest logit; None when they agree. NaN disagrees."""
    tolerance = max(units * torch.finfo(dtype).eps, floor) * max(1.0, float(expected.abs().max()))
    error = float((got - expected).abs().max())
    return None if error <= tolerance else (error, tolerance)
