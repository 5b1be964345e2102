"""Self-distillation data: the target's own greedy continuations and its features along them.

A head learns what the target actually says, so the training text is the target's greedy
continuation of each prompt. Generation runs batched (left-padded) through transformers'
``generate``: padding may change a near-tied argmax here and there, which does not matter,
because the labels are never these tokens but the target's distribution recomputed on the final
sequence. That recomputation is one unpadded `CausalLM.forward` per sequence, the same call the
engine makes, so the features are the ones the head sees at inference.

Only the post-norm last hidden states are stored ([n, H] per sequence, a few MB in all). The
soft labels (the target's softmax over the whole vocabulary) are recomputed from them with the
LM head when a batch is drawn: storing them would take n x vocab floats per sequence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tqdm import tqdm

from specsure.models.loading import LoadedModel

@dataclass(frozen=True)
class Sample:
    """One prompt plus the target's greedy continuation, with the target's features along it."""

    token_ids: torch.Tensor
    """[n] long: prompt then continuation (the continuation ends at the first EOS, kept)."""
    hidden: torch.Tensor
    """[n, H] the target's last hidden state after its final norm at each position (model dtype,
    an ordinary tensor: cloned out of inference mode, so autograd may take it as input)."""
    prompt_len: int
    """Tokens of the prompt; positions >= prompt_len hold the continuation."""
    aux: torch.Tensor | None = None
    """[n, len(aux_layers) * H] the residual-stream inputs of the asked-for layers (EAGLE-3's
    features), concatenated; None unless ``aux_layers`` were given."""


def greedy_continuations(target: LoadedModel, prompts: Sequence[Sequence[int]], max_new_tokens: int, *,
                         batch_size: int = 8, progress: bool = False) -> list[list[int]]:
    """The target's greedy continuation of each prompt (at most ``max_new_tokens``, cut after EOS)."""
    hf, eos = target.lm.hf, list(target.eos_token_ids)
    pad = eos[0] if eos else 0
    batches = [prompts[i: i + batch_size] for i in range(0, len(prompts), batch_size)]
    out: list[list[int]] = []
    for batch in tqdm(batches, desc="generating", unit="batch", disable=not progress):
        width = max(len(p) for p in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)  # [b, width], left-padded
        mask = torch.zeros_like(ids)
        for row, prompt in enumerate(batch):
            ids[row, width - len(prompt):] = torch.tensor(list(prompt), dtype=torch.long)
            mask[row, width - len(prompt):] = 1
        with torch.inference_mode():
            generated = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                                    min_new_tokens=1, do_sample=False, pad_token_id=pad,
                                    eos_token_id=eos or None)[:, width:]  # [b, <= max_new_tokens]
        for row in generated.tolist():
            out.append(_cut_after_eos(row, eos))
    return out


def _cut_after_eos(tokens: list[int], eos: Sequence[int]) -> list[int]:
    for i, tok in enumerate(tokens):
        if tok in eos:
            return tokens[: i + 1]
    return tokens


def build_sequences(target: LoadedModel, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]],
                    *, aux_layers: tuple[int, ...] = (), progress: bool = False) -> list[Sample]:
    """Run each prompt + continuation through the target once and keep its hidden states (and the
    inputs of ``aux_layers``)."""
    lm = target.lm
    limit = lm.max_context or None
    seqs = []
    for prompt, cont in tqdm(list(zip(prompts, continuations)), desc="features", unit="seq", disable=not progress):
        tokens = [*prompt, *cont][:limit]
        lm.reset()
        out = lm.forward(tokens, hidden=True, aux_layers=aux_layers)
        assert out.hidden is not None
        aux = out.aux_hidden.clone() if out.aux_hidden is not None else None
        seqs.append(Sample(torch.tensor(tokens, dtype=torch.long), out.hidden.clone(), len(prompt), aux))
    lm.reset()
    return seqs


def self_distill(target: LoadedModel, prompts: Sequence[Sequence[int]], max_new_tokens: int, *,
                 aux_layers: tuple[int, ...] = (), batch_size: int = 8, progress: bool = False) -> list[Sample]:
    """Greedy continuations, then the target's features along prompt + continuation."""
    continuations = greedy_continuations(target, prompts, max_new_tokens, batch_size=batch_size, progress=progress)
    return build_sequences(target, prompts, continuations, aux_layers=aux_layers, progress=progress)
