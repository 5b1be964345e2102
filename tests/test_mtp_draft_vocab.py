"""An MTP head with a draft vocabulary: the engine drafts among those tokens only, and stays exact."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from specsure import SamplingParams, make_engine
from specsure.config import ConfigError
from specsure.models.loading import load_model
from specsure.proposers.head_layer import DraftRow, ascends
from specsure.sampling import argmax_ids
from specsure.train import MTPTrainSettings, save_mtp_head, self_distill, train_mtp
from specsure.train.data import Sample, select_layers
from tiny import build_tiny_llama

GREEDY = SamplingParams(max_tokens=32, ignore_eos=True)


def _prompts(count: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 128, (16,), generator=gen).tolist() for _ in range(count)]


@pytest.fixture(scope="module")
def heads(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """A tiny target and one trained module written twice: with a 48-token draft vocabulary and without."""
    root = tmp_path_factory.mktemp("draft-vocab")
    target_dir = build_tiny_llama(root / "target", tie=False, seed=3)
    target = load_model(str(target_dir), dtype="float32")
    samples = self_distill(target, _prompts(24, seed=0), 24)
    result = train_mtp(target, samples, MTPTrainSettings(steps=60, lr=3e-3, draft_vocab_size=48))
    assert result.draft_ids is not None and result.draft_ids.shape == (48,)
    limited = save_mtp_head(result.module, target.lm, root / "limited", {}, result.draft_ids)
    full = save_mtp_head(result.module, target.lm, root / "full", {})
    return target_dir, result.draft_ids, limited, full


def _engine(target: Path, head: Path | None, k: int = 2):  # noqa: ANN202
    spec = None if head is None else {"method": "mtp", "model": str(head), "num_speculative_tokens": k}
    return make_engine(str(target), spec, dtype="float32")


def test_the_head_records_its_draft_vocabulary(heads) -> None:  # noqa: ANN001
    _, draft_ids, limited, full = heads
    config = json.loads((limited / "config.json").read_text())
    assert config["draft_vocab_size"] == 48 and "draft_vocab_size" not in json.loads((full / "config.json").read_text())
    tensors = load_file(str(limited / "model.safetensors"))
    assert torch.equal(torch.arange(48) + tensors["d2t"], draft_ids)
    assert int(tensors["t2d"].sum()) == 48 and bool(tensors["t2d"][draft_ids].all())
    assert bool((draft_ids[1:] > draft_ids[:-1]).all())  # ascending, as d2t's offsets assume


@pytest.mark.parametrize("k", [1, 3])
def test_drafts_come_from_the_draft_vocabulary_and_the_output_equals_plain(heads, k: int) -> None:  # noqa: ANN001
    target_dir, draft_ids, limited, _ = heads
    spec, plain = _engine(target_dir, limited, k), _engine(target_dir, None)
    allowed = set(draft_ids.tolist())
    proposed: list[int] = []
    original = spec.proposer.propose

    def spy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        draft = original(*args, **kwargs)
        proposed.extend(draft.token_ids)
        return draft

    spec.proposer.propose = spy
    for prompt in _prompts(4, seed=1):
        assert spec.generate(prompt, GREEDY)[0].token_ids == plain.generate(prompt, GREEDY)[0].token_ids
    assert proposed and set(proposed) <= allowed
    assert spec.stats.accepted_tokens > 0


def test_sampled_drafts_carry_zero_probability_outside_the_draft_vocabulary(heads) -> None:  # noqa: ANN001
    target_dir, draft_ids, limited, _ = heads
    spec = _engine(target_dir, limited, k=2)
    lm, proposer = spec.target.lm, spec.proposer
    tokens = _prompts(1, seed=5)[0]
    lm.reset()
    proposer.reset()
    proposer.observe(tokens[:-1], 0, lm.forward(tokens[:-1], hidden=True))
    draft = proposer.propose(tokens, 2, SamplingParams(temperature=1.0), torch.Generator().manual_seed(0))
    outside = torch.ones(lm.vocab_size, dtype=torch.bool)
    outside[draft_ids] = False
    assert draft.probs is not None and draft.probs.shape == (2, lm.vocab_size)
    assert float(draft.probs[:, outside].abs().max()) == 0.0
    torch.testing.assert_close(draft.probs.sum(-1), torch.ones(2))


def test_the_draft_vocabulary_logits_are_the_lm_heads_rows(heads) -> None:  # noqa: ANN001
    target_dir, draft_ids, _, _ = heads
    lm = load_model(str(target_dir), dtype="float32").lm
    hidden = torch.randn(3, lm.hidden_size, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(lm.draft_head(draft_ids)(hidden), lm.lm_head_logits(hidden)[:, draft_ids])


def test_a_draft_vocabulary_that_does_not_fit_the_target_is_refused(heads, tmp_path: Path) -> None:  # noqa: ANN001
    target_dir, _, limited, _ = heads
    broken = tmp_path / "broken"
    broken.mkdir()
    config = json.loads((limited / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "draft_vocab_size": 40}))
    tensors = load_file(str(limited / "model.safetensors"))
    save_file(tensors, str(broken / "model.safetensors"))
    with pytest.raises(ConfigError, match="d2t shape"):
        _engine(target_dir, broken)
    tensors["d2t"] = torch.full((48,), 500, dtype=torch.long)
    (broken / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(broken / "model.safetensors"))
    with pytest.raises(ConfigError, match="d2t maps draft ids outside"):
        _engine(target_dir, broken)


def _draft_ids(seed: int, ascending: bool) -> tuple[torch.Generator, torch.Tensor]:
    """A seeded generator and 12 distinct target ids of a 50-token vocabulary, ascending or shuffled."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randperm(50, generator=generator)[:12]
    return generator, ids.sort().values if ascending else ids


@pytest.mark.parametrize("ascending", [True, False])
def test_a_draft_row_picks_the_token_its_widened_row_would(ascending: bool) -> None:
    # A greedy chain reads the draft-vocabulary row alone: the same token as the widened row's
    # argmax, ties to the lowest target id and a NaN first, whatever order the head's ids come in.
    generator, ids = _draft_ids(0, ascending)
    for case in range(40):
        logits = torch.randint(0, 3, (12,), generator=generator).float()  # many ties
        if case % 5 == 0:
            logits[torch.randint(0, 12, (2,), generator=generator)] = float("nan")
        row = DraftRow(logits, ids, vocab_size=50, ascending=ascends(ids))
        assert row.ascending == ascending
        assert row.argmax() == argmax_ids(row.widened())[0], (case, logits, ids)


@pytest.mark.parametrize("ascending", [True, False])
def test_a_draft_rows_ranked_ids_are_its_widened_rows_top_k(ascending: bool) -> None:
    # A token tree ranks a node's children from the draft-vocabulary row: the widened row's top k as
    # argmax ranks it (NaNs first, equal logits by ascending target id, also where the cut splits
    # them), and past the draft vocabulary the ids outside it.
    generator, ids = _draft_ids(1, ascending)
    for case in range(60):
        distinct = case % 3 == 0
        logits = (torch.randn(12, generator=generator) if distinct
                  else torch.randint(0, 3, (12,), generator=generator).float())  # many ties
        if case % 3 == 2:
            logits[torch.randint(0, 12, (3,), generator=generator)] = float("nan")
        if case % 4 == 1 and not distinct:  # -inf logits: a few ids are ranked by repeated argmax, masking with -inf
            logits[torch.randint(0, 12, (10,), generator=generator)] = float("-inf")
        row = DraftRow(logits, ids, vocab_size=50, ascending=ascends(ids))
        widened = row.widened()
        ranking = sorted(ids.tolist(), key=lambda i: (not math.isnan(widened[i]), -widened[i].nan_to_num(0.0).item(),
                                                      i))
        for k in (1, 2, 3, 4, 5, 12):
            assert row.top(k) == ranking[:k], (case, k, logits, ids)
        assert row.top(1) == [row.argmax()] == [argmax_ids(widened)[0]]
        if distinct:
            assert row.top(5) == widened.topk(5).indices.tolist()
    outside = [i for i in range(50) if i not in set(ids.tolist())]
    assert DraftRow(torch.randn(12, generator=generator), ids, vocab_size=50).top(15)[12:] == outside[:3]


def test_select_layers_picks_the_wanted_layers_in_order() -> None:
    n, hidden = 5, 4
    aux = torch.arange(n * 3 * hidden, dtype=torch.float32).view(n, 3 * hidden)  # layers 2, 7, 9 side by side
    sample = Sample(torch.zeros(n, dtype=torch.long), torch.zeros(n, hidden), 2, aux)
    (picked,) = select_layers([sample], (2, 7, 9), (9, 2))
    assert torch.equal(picked.aux, torch.cat([aux[:, 2 * hidden:], aux[:, :hidden]], dim=1))
    assert select_layers([sample], (2, 7, 9), (2, 7, 9))[0] is sample


@pytest.mark.parametrize(("flags", "says"), [
    (["--method", "mtp", "--aux-layers", "2,5"], "only --method eagle3 fuses aux layers"),
    (["--method", "mtp", "--draft-vocab-size", "-1"], "--draft-vocab-size -1"),
    (["--method", "mtp", "--draft-vocab-size", "1"], "--draft-vocab-size 1"),
])
def test_train_flags_that_cannot_apply_are_refused(flags: list[str], says: str, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from specsure.cli.main import main

    assert main(["train", *flags, "--out", str(tmp_path / "head")]) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "head").exists()


@pytest.mark.parametrize("layers", ["0,3", "1,1", "a,b"])
def test_aux_layers_outside_the_target_are_refused(layers: str, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from specsure.cli.main import main

    target = build_tiny_llama(tmp_path / "target")  # 2 layers: indices 0, 1 and 2 (the last output)
    args = ["train", "--method", "eagle3", "--model", str(target), "--dtype", "float32", "--aux-layers", layers,
            "--out", str(tmp_path / "head")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"--aux-layers {layers!r}" in err and "for example" in err
