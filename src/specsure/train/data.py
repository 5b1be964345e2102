"""Self-distillation data: the target's own greedy continuations and its features along them.

A head learns what the target actually says, so the training text is the target's greedy
continuation of each prompt. Generation runs on specsure's own engine, plain decoding,
``batch_size`` sequences per forward through the scheduler (on the C kernel where it runs, about
three times transformers' batched ``generate`` on 2 cores at 8 sequences). Batching may change a near-tied
argmax here and there in bf16, which does not matter: the labels are never these tokens but the
target's distribution recomputed on the final sequence. That recomputation is one
`CausalLM.forward` per sequence, the same call the engine makes, so the features are the ones
the head sees at inference.

Only the post-norm last hidden states are stored ([n, H] per sequence, a few MB in all). The
soft labels (the target's softmax over the whole vocabulary) are recomputed from them with the
LM head when a batch is drawn: storing them would take n x vocab floats per sequence.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from tqdm import tqdm

from specsure.config import resolve
from specsure.decode.engine import Engine
from specsure.models.loading import LoadedModel
from specsure.sampling import SamplingParams
from specsure.train.continuations import ContinuationStore

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


DISTILL_BATCH = 32
"""Sequences per forward when generating. On 2 cores (64 chat prompts, 128 new tokens, bf16) 8 gave
264 tokens/s, 16 gave 364, 32 gave 453 and 64 gave 475: past 32 the gain is small and the KV caches grow."""


def greedy_continuations(target: LoadedModel, prompts: Sequence[Sequence[int]], max_new_tokens: int, *,
                         batch_size: int = DISTILL_BATCH, progress: bool = False,
                         store: ContinuationStore | None = None) -> list[list[int]]:
    """The target's greedy continuation of each prompt (at most ``max_new_tokens``, cut after EOS).

    With ``store``, each chunk's continuations are kept as it finishes, and chunks an earlier,
    interrupted run finished are read back instead of generated.
    """
    engine = Engine(resolve(None, model=target.path), target, None, max_num_seqs=batch_size)
    params = SamplingParams(max_tokens=max_new_tokens, temperature=0.0)
    chunk = 4 * batch_size  # enough to keep the batch full, few enough for a live progress bar
    out: list[list[int]] = []
    with tqdm(total=len(prompts), desc="generating", unit="prompt", disable=not progress) as bar:
        for i in range(0, len(prompts), chunk):
            batch = [list(p) for p in prompts[i: i + chunk]]
            done = store.get(batch) if store is not None else None
            if done is None:
                done = [c.token_ids for c in engine.generate(batch, params)]
                if store is not None:
                    store.put(batch, done)
            out.extend(done)
            bar.update(len(batch))
    target.lm.reset()
    return out


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
        # One logits row: the labels come from the hidden states later, and the whole LM head over
        # every row would be a fifth of this pass.
        out = lm.forward(tokens, hidden=True, aux_layers=aux_layers, last_logits=1)
        assert out.hidden is not None
        aux = out.aux_hidden.clone() if out.aux_hidden is not None else None
        seqs.append(Sample(torch.tensor(tokens, dtype=torch.long), out.hidden.clone(), len(prompt), aux))
    lm.reset()
    return seqs


FollowUp = Callable[[Sequence[Sequence[int]]], list[list[int]]]
"""Given the first round's continuations, the token ids of further prompts built on them."""


def self_distill(target: LoadedModel, prompts: Sequence[Sequence[int]], max_new_tokens: int, *,
                 aux_layers: tuple[int, ...] = (), batch_size: int = DISTILL_BATCH, progress: bool = False,
                 follow_up: FollowUp | None = None, store: ContinuationStore | None = None) -> list[Sample]:
    """Greedy continuations, then the target's features along prompt + continuation.

    With ``follow_up``, a second round answers the prompts it builds from the first round's
    answers (a second turn, a summary of the answer, ...); its samples follow the first round's.
    ``store`` keeps generation's progress (`greedy_continuations`).
    """
    prompts = [list(p) for p in prompts]
    continuations = greedy_continuations(target, prompts, max_new_tokens, batch_size=batch_size, progress=progress,
                                         store=store)
    if follow_up is not None:
        more = follow_up(continuations)
        if more:
            continuations += greedy_continuations(target, more, max_new_tokens, batch_size=batch_size,
                                                  progress=progress, store=store)
            prompts += more
    return build_sequences(target, prompts, continuations, aux_layers=aux_layers, progress=progress)


def select_layers(samples: Sequence[Sample], recorded: tuple[int, ...], wanted: tuple[int, ...]) -> list[Sample]:
    """The samples with ``aux`` cut down to the ``wanted`` layers, in that order, from the ``recorded`` ones.

    The data phase records more layers than one head fuses, so one cached data set serves heads
    of different layer choices; this picks one head's columns.
    """
    if tuple(wanted) == tuple(recorded):
        return list(samples)
    missing = [i for i in wanted if i not in recorded]
    assert not missing, f"layers {missing} were not recorded (recorded: {recorded})"
    index = torch.tensor([recorded.index(i) for i in wanted])
    out = []
    for sample in samples:
        if sample.aux is None:
            out.append(sample)
            continue
        blocks = sample.aux.view(sample.aux.shape[0], len(recorded), -1)  # [n, recorded, H]
        picked = blocks.index_select(1, index).reshape(sample.aux.shape[0], -1)  # [n, len(wanted) * H]
        out.append(Sample(sample.token_ids, sample.hidden, sample.prompt_len, picked))
    return out
