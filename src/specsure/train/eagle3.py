"""Distilling an EAGLE-3 head from a target, with training-time test (unrolled draft steps).

The head trained is the proposer's own `Eagle3Module`. Its inputs are the EAGLE-3 ones: the
target's residual-stream inputs of three layers (``aux_layers``, by default 2, N/2 and N-3),
fused by ``fc``, and the embedding of the next token; it predicts over a reduced draft
vocabulary, the ``draft_vocab_size`` tokens most frequent in the training text (``d2t``/``t2d``).

Training-time test. At inference, step 0 reads the target's fused features for every committed
position; step s > 0 has no target feature and feeds back step s-1's output at the previous
position. Here every step runs over the whole window at once, with ground-truth tokens: step s's
entry at position t takes step s-1's output at t-1 and token t+1, and predicts token t+2. It
attends exactly to what the same entry sees at inference: step 0's entries at positions up to
t-s (the committed features) and, for each earlier step i >= 1, the one entry at t-s+i (the
drafts of the same chain). On self-distilled text the ground-truth tokens are the target's own
greedy tokens, so an unrolled step is the draft step that follows accepted drafts, and counting
each anchor's run of correct steps measures the greedy acceptance length.

The label of every step's entry t is the target's distribution at position t+1, restricted to
the draft vocabulary; the loss is the cross-entropy against it (soft labels), step s weighted
0.8**s as in EAGLE-3. The target's embedding and LM head are shared and never trained.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from specsure.models.causal_lm import CausalLM
from specsure.models.loading import LoadedModel
from specsure.proposers.eagle3 import Eagle3Module
from specsure.proposers.head_loading import load_weights
from specsure.train.checkpoint import llama_fields
from specsure.train.data import Sample
from specsure.train.labels import DraftLabels, draft_vocabulary
from specsure.train.loop import autocast, optimiser_for, run_steps
from specsure.train.settings import TrainSettings, check_int
from specsure.train.starting_head import StartingHead
from specsure.train.target_parts import TargetParts
from specsure.train.windows import answer_start, draw_window, split

STEP_WEIGHT = 0.8
"""Loss weight ratio between successive unrolled steps (EAGLE-3's 0.8**s)."""


@dataclass(frozen=True, kw_only=True)
class Eagle3TrainSettings(TrainSettings):
    """How one EAGLE-3 head is distilled."""

    lr: float = 1e-3
    """Peak AdamW learning rate (linear warm-up, then cosine decay to a tenth)."""
    unroll: int = 7
    """Draft steps trained per window (training-time test); 1 trains step 0 only."""
    draft_vocab_size: int = 8192
    """Tokens the head predicts over: the most frequent in the training text."""
    windows: int = 1
    """Windows (each of a random training sequence) packed into one optimiser step."""
    intermediate_size: int | None = None
    """A new head's MLP width; None: the target's ``intermediate_size``, as EAGLE-3 heads usually have."""

    def __post_init__(self) -> None:
        super().__post_init__()
        size = self.intermediate_size
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise ValueError(f"intermediate_size = {size!r}: must be a positive integer, or None for the target's.")
        # as MTP's: each unrolled step is one more head forward and backward a window
        check_int("unroll", self.unroll, 1, 16, " (EAGLE-3 trains 7 steps)")
        check_int("draft_vocab_size", self.draft_vocab_size, 2, 1 << 30, ", e.g. 8192")
        check_int("windows", self.windows, 1, 1 << 20)


@dataclass(frozen=True)
class Eagle3Evaluation:
    """The head against the target's greedy continuations, teacher-forced."""

    loss: float
    """Mean step-0 cross-entropy against the target's distribution over the draft vocabulary, nats."""
    agreement: list[float]
    """Per unrolled step s: share of entries whose argmax equals the target's next token."""
    acceptance_length: float
    """Mean greedy acceptance length for k = unroll drafts: 1 + the run of correct steps per anchor."""
    anchors: int


@dataclass
class Eagle3TrainResult:
    """What `train_eagle3` returns: the trained head and the figures its training.json records."""

    module: Eagle3Module
    """Float32, attached to the target; save with `save_eagle3_head`."""
    aux_layers: tuple[int, ...]
    draft_ids: torch.Tensor
    """[draft_vocab] ascending target ids of the draft vocabulary."""
    losses: list[float]
    before: Eagle3Evaluation
    after: Eagle3Evaluation
    curve: list[tuple[int, float]]
    """(step, held-out acceptance length) measured during training."""
    train_sequences: int
    heldout_sequences: int
    train_s: float
    """Seconds in the optimisation loop, an interrupted earlier run's up to its resume point too."""
    resumed_from: int = 0
    """The step of the resume point training went on from (0: none)."""
    runs: list[dict[str, float]] = field(default_factory=list)
    """Each run's from_step, lr and steps (`loop.Trained.runs`)."""


def default_aux_layers(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's low, middle and high layers: 2, N/2 and N-3. Below 7 layers those repeat or fall out
    of order, so the three around the middle instead (fewer on a target of one or two layers)."""
    layers = (2, num_layers // 2, num_layers - 3)
    if layers[0] < layers[1] < layers[2]:
        return layers
    middle = num_layers // 2
    return tuple(sorted({min(max(i, 0), num_layers - 1) for i in (middle - 1, middle, middle + 1)}))


def initial_module(lm: CausalLM, aux_layers: tuple[int, ...], draft_ids: torch.Tensor, seed: int = 0,
                   intermediate_size: int | None = None) -> Eagle3Module:
    """A float32 head: random midlayer (std initializer_range), ones in every norm, the LM head's rows
    for the draft vocabulary copied from the target's, attached to the target. Its MLP has
    ``intermediate_size`` units (None: the target's)."""
    text = lm.hf.config.get_text_config(decoder=True)
    # A Llama target's own config, as the shipped heads were made; any other family's sizes in a Llama
    # config (its layer class reads fields, such as mlp_bias, that other families' configs lack)
    config = copy.deepcopy(text) if getattr(text, "model_type", None) == "llama" else LlamaConfig(**llama_fields(text))
    config.num_hidden_layers = 1
    if intermediate_size is not None:
        config.intermediate_size = intermediate_size
    config._attn_implementation = "sdpa"
    hidden = lm.hidden_size
    module = Eagle3Module(config, len(aux_layers) * hidden, int(draft_ids.numel()), own_embed=False,
                          own_head=True).float()
    gen = torch.Generator().manual_seed(seed)
    std = float(getattr(config, "initializer_range", 0.02))
    with torch.no_grad():
        for name, param in module.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif name.endswith("bias"):
                param.zero_()
            else:
                param.normal_(0.0, std, generator=gen)
        head = lm.hf.get_output_embeddings().weight  # [V, H]
        module.lm_head.weight.copy_(head[draft_ids].float())
    module.attach(TargetParts(lm), config, draft_ids - torch.arange(draft_ids.numel()))  # type: ignore[arg-type]
    return module


def _attention(attn: torch.nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               past: list[tuple[torch.Tensor, torch.Tensor]], bounds: Sequence[tuple[int, int]],
               step: int) -> tuple[torch.Tensor, tuple]:
    """LlamaAttention's arithmetic over [1, m, D] packed windows with earlier steps' keys and values:
    the projections run on every row at once, the attention inside each window (rows a .. b-1)."""
    m, dim = x.shape[1], attn.head_dim
    q = attn.q_proj(x).view(1, m, -1, dim).transpose(1, 2)  # [1, heads, m, dim]
    k = attn.k_proj(x).view(1, m, -1, dim).transpose(1, 2)
    v = attn.v_proj(x).view(1, m, -1, dim).transpose(1, 2)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    outs = []
    for a, b in bounds:
        keys = torch.cat([pk[:, :, a:b] for pk, _ in past] + [k[:, :, a:b]], dim=2)
        values = torch.cat([pv[:, :, a:b] for _, pv in past] + [v[:, :, a:b]], dim=2)
        outs.append(F.scaled_dot_product_attention(q[:, :, a:b], keys, values, attn_mask=_step_mask(b - a, step),
                                                   scale=attn.scaling, enable_gqa=True))
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
    return attn.o_proj(out.transpose(1, 2).reshape(1, m, -1)), (k, v)


def _step_mask(m: int, s: int) -> torch.Tensor:
    """[m, (s + 1) * m] bool: query t of step s sees step 0 at p <= t - s and step i >= 1 at p = t - s + i."""
    t = torch.arange(m)[:, None]
    p = torch.arange(m)[None, :]
    blocks = [p <= t - s] + [p == t - s + i for i in range(1, s + 1)]
    return torch.cat(blocks, dim=1)


Window = tuple[Sample, int, int, int]
"""(sample, start, end, scored_from): entries start .. end-1 of one sequence, the first scored_from
of them context only; `specsure.train.windows.draw_window` draws one (its width is end - start)."""


def unrolled(module: Eagle3Module, sample: Sample, start: int, end: int, unroll: int,
             scored_from: int = 0) -> list[torch.Tensor]:
    """Each step's draft-vocabulary logits [m - scored_from, Vd] for entries start + scored_from .. end-1
    (step s: rows >= s valid); earlier entries run as context only, without the LM head."""
    return packed_unrolled(module, [(sample, start, end, scored_from)], unroll)[0]


def packed_unrolled(module: Eagle3Module, windows: Sequence[Window],
                    unroll: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """`unrolled` over several windows in one forward: each step's logits for the scored rows of every
    window, concatenated in order, and [rows] long, each row's place among its window's scored rows
    (step s's row is valid where that is >= s).

    One window per step leaves the head's matrices working on a few hundred rows and the
    optimiser running once per window; packing several into one forward, with the attention kept
    inside each window, does the same arithmetic per window in fewer, larger calls.
    """
    layer = module.midlayer
    widths = [end - start for _, start, end, _ in windows]
    bounds = [(a - w, a) for a, w in zip(itertools.accumulate(widths), widths)]
    positions = torch.cat([torch.arange(start, end) for _, start, end, _ in windows]).unsqueeze(0)  # [1, m]
    features = module.features(torch.cat([s.aux[start:end] for s, start, end, _ in windows]))[None]  # [1, m, H]
    cos, sin = module.rotary(features, positions)
    tokens = torch.cat([s.token_ids[start + 1: end + 1] for s, start, end, _ in windows])
    embed = layer.input_layernorm(module.target.embed(tokens)[None].to(features.dtype))
    place = torch.cat([torch.arange(w) - f for w, (_, _, _, f) in zip(widths, windows)])
    # Row numbers, not a boolean mask: a boolean index's backward is a slow accumulate-put on CPU.
    rows = None if all(f == 0 for *_, f in windows) else (place >= 0).nonzero().squeeze(1)
    past: list[tuple[torch.Tensor, torch.Tensor]] = []
    x, outs = features, []
    for s in range(unroll):
        if module.norm_before_residual:
            g = layer.hidden_norm(x)
            residual = g
        else:
            residual, g = x, layer.hidden_norm(x)
        att, kv = _attention(layer.self_attn, torch.cat([embed, g], dim=-1), cos, sin, past, bounds, s)
        h = residual + att
        out = h + layer.mlp(layer.post_attention_layernorm(h))  # [1, m, H]
        kept = out if rows is None else out.index_select(1, rows)
        outs.append(module.lm_head(module.norm(kept))[0].float())
        past.append(kv)
        # The next step's entry at t takes this step's output at t - 1. A window's row 0 gets the
        # previous window's last row (or its own): invalid at every step >= 1, and no valid row sees it.
        x = torch.cat([out[:, :1], out[:, :-1]], dim=1)
    return outs, place if rows is None else place[rows]


def _labels(lm: CausalLM, sample: Sample, start: int, end: int, draft_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The target at positions start+1 .. end: its probabilities over the draft vocabulary, and its argmax."""
    with torch.no_grad():
        logits = lm.lm_head_logits(sample.hidden[start + 1: end + 1])  # [m, V]
        probs = torch.softmax(logits, dim=-1)
    return probs[:, draft_ids], logits.argmax(-1)


def window_loss(module: Eagle3Module, labels: DraftLabels, windows: Sequence[Window], unroll: int) -> torch.Tensor:
    """The weighted soft-label cross-entropy of every unrolled step over some windows, packed.

    Only step s's chains anchored at a window's scored entries (from ``start + scored_from`` on)
    are scored: row r of a window at every step is the chain anchored r entries further on, and
    step s's rows >= s exist. Each step's loss is the mean over all its valid rows.
    """
    # Entry t's label: the target at t + 1.
    p = torch.cat([labels.probs(sample, start + scored + 1, end + 1) for sample, start, end, scored in windows])
    steps, place = packed_unrolled(module, windows, unroll)
    total, weight = 0.0, 0.0
    for s, logits in enumerate(steps):
        valid = (place >= s).float()  # a weight, not an index: the same mean at a fraction of the backward's cost
        if not bool(valid.any()):
            break
        ce = (-(p * torch.log_softmax(logits, dim=-1)).sum(-1) * valid).sum() / valid.sum()
        total, weight = total + STEP_WEIGHT ** s * ce, weight + STEP_WEIGHT ** s
    return total / weight


@torch.no_grad()
def evaluate(module: Eagle3Module, lm: CausalLM, samples: Sequence[Sample], unroll: int, draft_ids: torch.Tensor,
             seq_len: int = 512) -> Eagle3Evaluation:
    """Teacher-forced agreement per step and the greedy acceptance length, on continuation anchors."""
    loss_sum, loss_n, anchors, accepted = 0.0, 0, 0, 0.0
    hits, counts = [0] * unroll, [0] * unroll
    for sample in samples:
        n = sample.token_ids.shape[0]
        for start in range(0, n - 1, seq_len):
            end = min(start + seq_len, n - 1)
            p, target_next = _labels(lm, sample, start, end, draft_ids)
            steps = unrolled(module, sample, start, end, unroll)
            loss_sum += float(-(p * torch.log_softmax(steps[0], -1)).sum(-1).sum())
            loss_n += end - start
            right = [draft_ids[logits.argmax(-1)] == target_next for logits in steps]  # [m] per step
            # Anchor a (a real feature, its next-next token in the continuation): step s's entry is a + s.
            first = answer_start(sample) - start
            for a in range(max(first, 0), end - start):
                run = 0
                while run < unroll and a + run < end - start and bool(right[run][a + run]):
                    run += 1
                accepted += run
                anchors += 1
                for s in range(unroll):
                    if a + s < end - start:
                        hits[s] += int(right[s][a + s])
                        counts[s] += 1
    return Eagle3Evaluation(loss_sum / max(loss_n, 1), [h / max(c, 1) for h, c in zip(hits, counts)],
                            1 + accepted / max(anchors, 1), anchors)


def mlp_width(module: Eagle3Module) -> int:
    """The head's MLP units, as its config.json must state them."""
    return int(module.midlayer.mlp.gate_proj.out_features)


def train_eagle3(target: LoadedModel, samples: Sequence[Sample], settings: Eagle3TrainSettings,
                 aux_layers: tuple[int, ...], *, progress: bool = False, eval_every: int = 0,
                 resume: Path | None = None, resume_key: str = "", checkpoint_every: int = 0,
                 start: StartingHead | None = None) -> Eagle3TrainResult:
    """Distill an EAGLE-3 head from ``samples`` (self-distilled, with ``aux`` features of ``aux_layers``).

    With ``start``, training continues from that head: its weights and draft vocabulary (its aux
    layers must be ``aux_layers``); the "before" evaluation is the starting head's.

    With ``resume``, a resume point is written there every ``checkpoint_every`` steps and after the
    last, and a run finding one made with the same ``resume_key`` continues from it
    (`specsure.train.resume`); once the head is written, `clear_point` removes it.

    Raises:
        ValueError: no sequence has the two tokens an entry needs, or the samples carry no aux features.
        FloatingPointError: the loss stopped being finite; the last resume point is kept.
    """
    lm = target.lm
    usable = [s for s in samples if s.token_ids.shape[0] >= 2]
    if not usable:
        raise ValueError("no training sequence has 2 or more tokens; give longer prompts or more new tokens.")
    if any(s.aux is None for s in usable):
        raise ValueError("EAGLE-3 training needs the target's aux-layer features: build the samples with aux_layers.")
    if not isinstance(settings, Eagle3TrainSettings):
        raise TypeError(f"settings must be Eagle3TrainSettings, not {type(settings).__name__}.")
    if not aux_layers or any(not 0 <= a <= lm.num_layers for a in aux_layers) or \
            any(s.aux.shape[-1] != len(aux_layers) * lm.hidden_size for s in usable):  # type: ignore[union-attr]
        width = usable[0].aux.shape[-1] // lm.hidden_size  # type: ignore[union-attr]
        raise ValueError(f"aux_layers = {list(aux_layers)} must be the {width} layer id(s) in [0, {lm.num_layers}] "
                         "whose features the samples carry (self_distill's aux_layers).")
    train, heldout = split(usable, settings.heldout_fraction, settings.seed)
    measure_set = heldout or train
    if start is not None:
        if tuple(start.aux_layers) != tuple(aux_layers):  # a library caller's samples, not the CLI's
            raise ValueError(f"the samples carry aux layers {list(aux_layers)}, but the starting head {start.path} "
                             f"fuses {list(start.aux_layers)}; build the samples with the starting head's aux layers.")
        draft_ids = start.draft_ids
        module = initial_module(lm, aux_layers, draft_ids, settings.seed, start.intermediate_size)
        load_weights(module, start.tensors, start.path, torch.float32)  # checks names and shapes
        module.requires_grad_(True)  # load_weights readies a module for inference
    else:
        draft_ids = draft_vocabulary(train, lm.vocab_size, settings.draft_vocab_size)
        module = initial_module(lm, aux_layers, draft_ids, settings.seed, settings.intermediate_size)
    before = evaluate(module, lm, measure_set, settings.unroll, draft_ids)
    params = [p for p in module.parameters() if p.requires_grad]
    optimiser, schedule = optimiser_for(params, settings.lr, settings.steps)
    gen = torch.Generator().manual_seed(settings.seed)
    curve: list = [(0, before.acceptance_length)]

    labels = DraftLabels(lm, draft_ids)

    def step_loss() -> torch.Tensor:
        windows = []
        for _ in range(settings.windows):
            sample, start, width, scored = draw_window(train, settings.seq_len, gen, settings.answer_only)
            windows.append((sample, start, start + width, scored))
        with autocast(settings.dtype):
            return window_loss(module, labels, windows, settings.unroll)

    def measure() -> tuple[float]:
        return (evaluate(module, lm, measure_set, settings.unroll, draft_ids).acceptance_length,)

    trained = run_steps(module, params, optimiser, schedule, gen, settings.steps, settings.lr, step_loss, measure,
                        curve, eval_every=eval_every, resume=resume, resume_key=resume_key,
                        checkpoint_every=checkpoint_every, progress=progress)
    after = evaluate(module, lm, measure_set, settings.unroll, draft_ids)
    curve.append((settings.steps, after.acceptance_length))
    return Eagle3TrainResult(module, aux_layers, draft_ids, trained.losses, before, after, curve, len(train),
                             len(heldout), trained.seconds, trained.resumed_from, trained.runs)
