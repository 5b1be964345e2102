"""Distilling one MTP module (the SpecsureMTPHead format) from a target that has none.

The module trained is the proposer's own `MTPModule`, run through the same forward the engine
runs, so training and inference cannot drift apart. The timeline is the proposer's token shift:
entry t takes (h_t, token_{t+1}) at position t, where h_t is the target's post-norm last hidden
state, and its logits predict token t+2. The label of entry t is the target's own distribution
at position t+1 (p = softmax of the target's logits there), and the loss is KL(p || q): soft
labels carry more signal per token than the greedy token alone, and their argmax is the token
the target says next.

With a draft vocabulary (``draft_vocab_size``, as `make heads` trains), q and the loss run over
those tokens only, as EAGLE-3's do: the engine drafts among them and nothing else, and the LM
head behind q, forward and backward at every unrolled step, was most of a training step (49,152
rows against 8,192 on the default model). p is then the target's full softmax restricted to the
draft tokens (`specsure.train.labels.DraftVocab`), and agreement compares q's top draft token
with the target's top token over the whole vocabulary, which is what the engine accepts. The
reported "KL" is then sum over the draft tokens of p (log p - log q): p's mass there is below 1,
so it is not a divergence and can dip below 0; its gradient is the cross-entropy's.

Initialisation (``init``). In both, ``eh_proj`` is [0 | I] (the module starts from the
normalised h_t; the embedding half learns from zero) and every norm is ones, so with the
residual branches near zero the module starts as the target's own next-token prediction,
rescaled. ``"random"`` (the default) draws the block's matrices with std ``initializer_range``.
``"last_layer"`` copies the target's last decoder layer with its two output projections
(``o_proj``, ``down_proj``) zeroed: copied as they are, the layer receives a unit-RMS input
instead of the deep residual stream it was trained on, and the warm start is worse than chance
(KL 18 nats, 0% agreement on SmolLM2-135M). On SmolLM2-135M with the default data, ``random``
reached 27% held-out agreement where ``last_layer`` reached 25% (docs/training.md). The LM head
and the embedding are the target's and are never trained or written.

The module trains in float32 whatever the target's dtype; the engine casts it to the target's
dtype when it loads the folder.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal

import torch

from specsure.models.causal_lm import CausalLM
from specsure.models.loading import LoadedModel
from specsure.models.rotary_table import RotaryTable
from specsure.proposers.mtp import MTPModule
from specsure.train.data import Sample
from specsure.train.labels import DraftVocab, draft_vocabulary
from specsure.train.loop import autocast, optimiser_for, run_steps
from specsure.train.settings import TrainSettings, check_int
from specsure.train.starting_head import StartingMTPHead, load_module_weights
from specsure.train.target_parts import TargetParts
from specsure.train.windows import answer_start, draw_window, split


INITS = ("random", "last_layer")


@dataclass(frozen=True, kw_only=True)
class MTPTrainSettings(TrainSettings):
    """How one MTP module is distilled."""

    init: Literal["random", "last_layer"] = "random"
    """How the block starts (module docstring)."""
    modules: int = 1
    """MTP modules trained together (``num_nextn_predict_layers``): module i predicts token t+i+2
    from module i-1's output, as DeepSeek-V3's do, so k = modules draft tokens each have their own."""
    unroll: int = 0
    """Draft steps trained; beyond ``modules`` they reuse the modules cyclically as the engine does
    (`chain_losses`). 0 (or anything <= modules) trains one step per module."""
    draft_vocab_size: int = 0
    """Tokens the engine drafts among: the most frequent in the training text (0: the whole vocabulary).
    The loss and the figures then run over these tokens too (module docstring); a draft step reads
    only their rows of the LM head, the bulk of its weights on a small model."""

    def __post_init__(self) -> None:
        if isinstance(self.draft_vocab_size, bool) or not isinstance(self.draft_vocab_size, int) \
                or self.draft_vocab_size < 0 or self.draft_vocab_size == 1:
            # One token would make every draft the same guess; EAGLE-3's settings refuse it too.
            raise ValueError(f"draft_vocab_size = {self.draft_vocab_size!r}: must be 0 (the whole vocabulary) or at "
                             "least 2 tokens, e.g. 8192.")
        super().__post_init__()
        if self.init not in INITS:
            raise ValueError(f"init = {self.init!r}: must be one of {', '.join(INITS)}.")
        check_int("modules", self.modules, 1, 8)
        check_int("unroll", self.unroll, 0, 16, " (0: one step per module)")


@dataclass(frozen=True)
class Evaluation:
    """The head against the target on some sequences."""

    kl: float
    """Mean KL(p || q) per entry, nats (0 = the head reproduces the target's next-next distribution)."""
    agreement: float
    """Top-1 agreement: share of continuation entries whose argmax q equals argmax p, the greedy
    acceptance rate of a first draft token."""
    entries: int
    """Continuation entries the agreement counts."""
    per_module: tuple[float, ...] = ()
    """Draft step s's top-1 agreement (its token t+s+2), teacher-forced: module s, or a module reused
    cyclically past the last; step 0's is ``agreement``."""
    acceptance_length: float = 1.0
    """Greedy acceptance length with k = the draft steps evaluated: 1 + each anchor's run of right steps."""


@dataclass
class MTPTrainResult:
    """A trained module and what training measured."""

    module: MTPModule
    """Module 0: float32, attached to the target; save all with `save_mtp_head(result.modules, ...)`."""
    losses: list[float]
    """Training loss (KL) per step."""
    before: Evaluation
    """On the held-out sequences, at the warm start."""
    after: Evaluation
    """On the held-out sequences, after training."""
    train_sequences: int
    heldout_sequences: int
    """0 when there were too few sequences to hold any out; then `before`/`after` are on the training set."""
    train_s: float
    """Seconds in the optimisation loop, an interrupted earlier run's up to its resume point too."""
    modules: list[MTPModule] | None = None
    """Every module, in order (module 0 first)."""
    curve: list[tuple[int, float, float]] = field(default_factory=list)
    """(step, held-out first-step agreement, held-out acceptance length) at the start, every
    ``eval_every`` steps and at the end."""
    draft_ids: torch.Tensor | None = None
    """[draft_vocab_size] ascending target ids the head drafts among; None for the whole vocabulary."""
    resumed_from: int = 0
    """The step of the resume point training went on from (0: none)."""
    runs: list[dict[str, float]] = field(default_factory=list)
    """Each run's from_step, lr and steps (`loop.Trained.runs`)."""


def initial_modules(lm: CausalLM, init: str = "random", seed: int = 0, count: int = 1) -> list[MTPModule]:
    """``count`` starting modules, module i seeded with seed + i."""
    return [initial_module(lm, init, seed + i) for i in range(count)]


def initial_module(lm: CausalLM, init: str = "random", seed: int = 0) -> MTPModule:
    """The starting module (module docstring), float32, attached to the target."""
    base = lm.hf.base_model
    block_config = copy.deepcopy(lm.hf.config.get_text_config(decoder=True))
    hidden = lm.hidden_size
    module = MTPModule(base, block_config, own_embed=False, own_head=False).float()
    gen = torch.Generator().manual_seed(seed)
    std = float(getattr(block_config, "initializer_range", 0.02))
    with torch.no_grad():
        if init == "last_layer":
            module.block.load_state_dict(base.layers[len(base.layers) - 1].state_dict())
            module.block.self_attn.o_proj.weight.zero_()
            module.block.mlp.down_proj.weight.zero_()
        else:
            for name, param in module.block.named_parameters():
                if name.endswith("norm.weight"):
                    param.fill_(1.0)
                elif name.endswith("bias"):
                    param.zero_()
                else:
                    param.normal_(0.0, std, generator=gen)
        module.eh_proj.weight.copy_(torch.cat([torch.zeros(hidden, hidden), torch.eye(hidden)], dim=1))
        for norm in (module.enorm, module.hnorm, module.shared_head.norm):
            norm.weight.fill_(1.0)
    module.attach(TargetParts(lm), lm.rotary_table or RotaryTable(base.rotary_emb))  # type: ignore[arg-type]
    return module


def chain_losses(modules: Sequence[MTPModule], lm: CausalLM, sample: Sample, start: int, end: int,
                 unroll: int = 0, scored_from: int = 0, agree: bool = True,
                 vocab: DraftVocab | None = None) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """(KL [m_s], agree [m_s]) of each draft step s (`unrolled_logits`) over the anchors whose label exists.

    Step s of anchor a predicts token a+s+2; its label is the target's distribution at a+s+1. Only
    anchors from ``start + scored_from`` on are scored (row 0 of each result is that anchor): the
    earlier ones are context, and neither head nor target computes logits for them. Without
    ``agree`` (a training step, which needs only the loss) the agreements are None. With ``vocab``,
    q and the KL run over the draft vocabulary (module docstring).
    """
    n = sample.token_ids.shape[0]
    first = start + scored_from + 1  # step 0's first label; step s's labels are the same rows s further on
    steps = unrolled_logits(modules, sample, start, end, unroll, scored_from, None if vocab is None else vocab.logits)
    stop = min(n, end + len(steps))  # one label row set serves every step: the steps' labels overlap but for s rows
    with torch.no_grad():
        p_top = None
        if vocab is None or agree:
            p_logits = lm.lm_head_logits(sample.hidden[first:stop])
            log_p = torch.log_softmax(p_logits, dim=-1)
            p_top = p_logits.argmax(-1) if agree else None
            if vocab is not None:
                log_p = log_p[:, vocab.ids]
            p = log_p.exp()
        else:  # a training step: the draft rows only, normalised over the whole vocabulary once per sequence
            p = vocab.labels.probs(sample, first, stop)
        entropy = torch.xlogy(p, p) if vocab is not None else p * log_p  # 0 log 0 = 0 where p underflows
        entropy = entropy.sum(-1)  # KL = sum p log p - sum p log q; the first term is the head's floor
    out = []
    for s, q_logits in enumerate(steps):
        valid = min(end - start, n - 1 - start - s) - scored_from  # scored rows whose label a+s+1 exists
        if valid <= 0:
            break
        log_q = torch.log_softmax(q_logits[:valid], dim=-1)
        kl = entropy[s: s + valid] - (p[s: s + valid] * log_q).sum(-1)
        top = q_logits[:valid].argmax(-1)
        if vocab is not None:
            top = vocab.ids[top]
        out.append((kl, top == p_top[s: s + valid] if p_top is not None else None))
    return out


def unrolled_logits(modules: Sequence[MTPModule], sample: Sample, start: int, end: int,
                    unroll: int = 0, scored_from: int = 0,
                    head: Callable[[torch.Tensor], torch.Tensor] | None = None) -> list[torch.Tensor]:
    """Each draft step's target-vocabulary logits [m - scored_from, V] for anchors start + scored_from ..
    end-1 (the earlier anchors run as context only), laid out as the engine drafts; with ``head``,
    that head's logits instead (`DraftVocab.logits`).

    Row r is the anchor a = start + r: the last committed entry, whose step s predicts token a+s+2.
    Steps s < len(modules) are the DeepSeek-V3 chain: module s's entry at a takes module s-1's
    output at a and token a+s+1. With ``unroll`` > len(modules), the steps beyond reuse module
    j = s % M cyclically, as `HeadChainProposer` does: each appends one entry to module j's cache,
    at position a + 1 + (the cyclic entries module j already made for this anchor), fed with step
    s-1's output; it attends to module j's own chain entries at positions <= a and its earlier
    cyclic entries for the same anchor, nothing else. Rows past the sequence's end use a clamped
    token and must not be scored.
    """
    from transformers import DynamicCache

    m, count, n = end - start, len(modules), sample.token_ids.shape[0]
    rows = torch.arange(m)
    kvs = [DynamicCache() for _ in modules]
    made = [0] * count  # cyclic entries in module j's cache (per anchor)
    out: list[torch.Tensor] = []
    x = sample.hidden[start:end]
    for s in range(max(unroll, count)):
        j = s % count
        ids = sample.token_ids[(rows + start + s + 1).clamp(max=n - 1)]  # token a+s+1
        if s < count:
            positions = rows + start
            allowed = rows[None, :] <= rows[:, None]  # the chain entries at positions <= a
        else:
            positions = rows + start + 1 + made[j]
            same = rows[None, :] == rows[:, None]
            allowed = torch.cat([rows[None, :] <= rows[:, None]] + [same] * (made[j] + 1), dim=1)
            made[j] += 1
        dtype = modules[j].eh_proj.weight.dtype
        mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)[None, None]
        x, logits = modules[j].entries(x, ids, positions[None], mask, kvs[j], first_row=scored_from, head=head)
        out.append(logits)
    return out


@torch.no_grad()
def evaluate(module: MTPModule | Sequence[MTPModule], lm: CausalLM, samples: Sequence[Sample],
             unroll: int = 0, vocab: DraftVocab | None = None) -> Evaluation:
    """Mean KL over module 0's entries; top-1 agreement per draft step and the greedy acceptance length
    at k = max(unroll, modules), over entries whose label predicts a continuation token; with ``vocab``,
    as the head drafts among those tokens (`chain_losses`)."""
    modules = [module] if isinstance(module, MTPModule) else list(module)
    steps = max(unroll, len(modules))
    kl_sum, kl_n, anchors, accepted = 0.0, 0, 0, 0
    hits, counts = [0] * steps, [0] * steps
    for sample in samples:
        n = sample.hidden.shape[0]
        if n < 2:
            continue
        chain = chain_losses(modules, lm, sample, 0, n - 1, unroll, vocab=vocab)
        kl_sum, kl_n = kl_sum + float(chain[0][0].sum()), kl_n + chain[0][0].shape[0]
        first = answer_start(sample)
        for i, (_, agree) in enumerate(chain):
            hits[i] += int(agree[first:].sum())
            counts[i] += max(agree.shape[0] - first, 0)
        for a in range(first, chain[0][1].shape[0]):
            run = 0
            while run < len(chain) and a < chain[run][1].shape[0] and bool(chain[run][1][a]):
                run += 1
            accepted += run
            anchors += 1
    per_module = tuple(h / max(c, 1) for h, c in zip(hits, counts))
    return Evaluation(kl_sum / max(kl_n, 1), per_module[0], counts[0], per_module, 1 + accepted / max(anchors, 1))


def train_mtp(target: LoadedModel, samples: Sequence[Sample], settings: MTPTrainSettings, *,
              progress: bool = False, eval_every: int = 0, resume: Path | None = None, resume_key: str = "",
              checkpoint_every: int = 0, start: StartingMTPHead | None = None) -> MTPTrainResult:
    """Distill MTP modules from ``samples`` (see `specsure.train.data.self_distill`); with ``eval_every``,
    measure the held-out sequences every that many steps (the result's ``curve``). ``resume``,
    ``resume_key`` and ``checkpoint_every``: resume points, as `specsure.train.loop.run_steps` keeps them.

    With ``start``, training continues from that head: its modules (as many as ``settings.modules``)
    and its draft vocabulary (``settings.draft_vocab_size`` must be its size); the "before"
    evaluation is the starting head's. ``settings.init`` then plays no part.

    Raises:
        ValueError: no sequence has the two tokens an entry needs.
        FloatingPointError: the loss stopped being finite; the last resume point is kept.
    """
    if not isinstance(settings, MTPTrainSettings):
        raise TypeError(f"settings must be MTPTrainSettings, not {type(settings).__name__}.")
    lm = target.lm
    usable = [s for s in samples if s.hidden.shape[0] >= 2]
    if not usable:
        raise ValueError("no training sequence has 2 or more tokens; give longer prompts or more new tokens.")
    train, heldout = split(usable, settings.heldout_fraction, settings.seed)
    measure_set = heldout or train
    modules = initial_modules(lm, settings.init, settings.seed, settings.modules)
    if start is not None:
        if len(start.modules) != settings.modules or start.draft_vocab_size != settings.draft_vocab_size:
            raise ValueError(f"the settings ask for {settings.modules} module(s) and a draft vocabulary of "
                             f"{settings.draft_vocab_size}, but the starting head {start.path} has {len(start.modules)} "
                             f"and {start.draft_vocab_size}; give the settings the starting head's.")
        for module, tensors in zip(modules, start.modules):
            load_module_weights(module, tensors, start.path)
        draft_ids = start.draft_ids
    elif settings.draft_vocab_size:
        draft_ids = draft_vocabulary(train, lm.vocab_size, settings.draft_vocab_size)
    else:
        draft_ids = None
    vocab = None if draft_ids is None else DraftVocab.of(lm, draft_ids)
    before = evaluate(modules, lm, measure_set, settings.unroll, vocab)
    params = [p for module in modules for p in module.parameters() if p.requires_grad]
    optimiser, schedule = optimiser_for(params, settings.lr, settings.steps)
    gen = torch.Generator().manual_seed(settings.seed)
    curve: list = [(0, before.agreement, before.acceptance_length)]

    def step_loss() -> torch.Tensor:
        sample, start, width, scored = draw_window(train, settings.seq_len, gen, settings.answer_only)
        with autocast(settings.dtype):
            chain = chain_losses(modules, lm, sample, start, start + width, settings.unroll, scored, agree=False,
                                 vocab=vocab)
            return torch.stack([kl.mean() for kl, _ in chain]).mean()

    def measure() -> tuple[float, float]:
        now = evaluate(modules, lm, measure_set, settings.unroll, vocab)
        return now.agreement, now.acceptance_length

    trained = run_steps(torch.nn.ModuleList(modules), params, optimiser, schedule, gen, settings.steps, settings.lr,
                        step_loss, measure, curve, eval_every=eval_every, resume=resume, resume_key=resume_key,
                        checkpoint_every=checkpoint_every, progress=progress)
    after = evaluate(modules, lm, measure_set, settings.unroll, vocab)
    curve.append((settings.steps, after.agreement, after.acceptance_length))
    return MTPTrainResult(modules[0], trained.losses, before, after, len(train), len(heldout), trained.seconds,
                          modules, curve, draft_ids, trained.resumed_from, trained.runs)
