"""specsure train: MTP self-distillation on a tiny target; the written head runs losslessly in the engine."""

from __future__ import annotations

import json
import re
import logging
import warnings
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from specsure import SamplingParams, make_engine
from specsure.cli.main import main
from specsure.cli.train_data import tokens_digest
from specsure.models.loading import load_model
from tiny import build_tiny_llama
from specsure.proposers.head_layer import HeadCache
from specsure.train import MTPTrainSettings, initial_module, save_mtp_head, self_distill, train_mtp
from specsure.train.data import Sample
from specsure.train.resume import clear_point

GREEDY = SamplingParams(max_tokens=32, ignore_eos=True)


@pytest.fixture(autouse=True)
def _sample_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The training sample cache goes to a temporary folder, never the user's ~/.cache."""
    folder = tmp_path_factory.mktemp("xdg")
    monkeypatch.setenv("XDG_CACHE_HOME", str(folder))
    return folder / "specsure" / "train"


def _prompts(count: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 128, (16,), generator=gen).tolist() for _ in range(count)]


def _learnable_target(folder: Path) -> Path:
    """A one-layer target whose next token depends on the current token only (attention output zeroed).

    Its next-next token is then a function of token t+1 that a head can learn from a few hundred
    entries; untied weights keep its greedy text from settling on one repeated token, which would
    let an untrained head score well too. A fully random target's next-next token is not learnable
    from this little data, so it could not show that training works.
    """
    build_tiny_llama(folder, num_layers=1, tie=False, seed=1)
    weights = folder / "model.safetensors"
    tensors = load_file(str(weights))
    tensors["model.layers.0.self_attn.o_proj.weight"].zero_()
    save_file(tensors, str(weights), metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """A tiny target, its self-distillation data, a trained head and the initial head, both written."""
    root = tmp_path_factory.mktemp("train")
    target_dir = _learnable_target(root / "target")
    target = load_model(str(target_dir), dtype="float32")
    samples = self_distill(target, _prompts(40, seed=0), 24)
    result = train_mtp(target, samples, MTPTrainSettings(steps=200, lr=3e-3))
    trained_head = save_mtp_head(result.module, target.lm, root / "head", {"steps": 200})
    initial_head = save_mtp_head(initial_module(target.lm), target.lm, root / "initial", {})
    return target_dir, target, samples, result, trained_head, initial_head


def _engine(target: Path, head: Path | None, k: int = 2):  # noqa: ANN202
    spec = None if head is None else {"method": "mtp", "model": str(head), "num_speculative_tokens": k}
    return make_engine(str(target), spec, dtype="float32")


def test_training_reduces_the_distillation_loss(trained) -> None:  # noqa: ANN001
    _, _, _, result, _, _ = trained
    assert result.after.kl < 0.5 * result.before.kl, (result.before, result.after)
    assert result.after.agreement > result.before.agreement + 0.3, (result.before, result.after)
    assert sum(result.losses[-20:]) < 0.5 * sum(result.losses[:20])
    assert result.heldout_sequences == 4 and result.train_sequences == 36


@pytest.mark.parametrize("k", [1, 3])
def test_the_written_head_loads_as_mtp_and_is_lossless(trained, k: int) -> None:  # noqa: ANN001
    target_dir, _, _, _, head, _ = trained
    config = json.loads((head / "config.json").read_text())
    assert config["architectures"] == ["SpecsureMTPHead"] and (head / "training.json").is_file()
    spec, plain = _engine(target_dir, head, k), _engine(target_dir, None)
    assert spec.speculative_method == "mtp"
    for prompt in _prompts(4, seed=1):
        assert spec.generate(prompt, GREEDY)[0].token_ids == plain.generate(prompt, GREEDY)[0].token_ids
    assert spec.stats.drafts > 0


def test_the_trained_head_is_accepted_more_than_the_initial_one(trained) -> None:  # noqa: ANN001
    target_dir, _, _, _, head, initial = trained
    prompts = _prompts(6, seed=2)  # not the training prompts
    lengths = []
    for folder in (initial, head):
        engine = _engine(target_dir, folder)
        engine.generate(prompts, GREEDY)
        lengths.append(engine.stats.mean_acceptance_length)
    assert lengths[1] > lengths[0] + 0.5, lengths


def test_training_computes_what_the_proposer_computes(trained) -> None:  # noqa: ANN001
    """The trained q at the last entry equals the engine's first draft distribution (the token shift)."""
    target_dir, target, samples, result, head, _ = trained
    sample = samples[0]
    n = sample.hidden.shape[0]
    engine = _engine(target_dir, head, k=1)
    lm, proposer = engine.target.lm, engine.proposer
    tokens = sample.token_ids.tolist()
    lm.reset()
    proposer.reset()
    proposer.observe(tokens[: n - 1], 0, lm.forward(tokens[: n - 1], hidden=True))
    draft = proposer.propose(tokens, 1, SamplingParams(temperature=1.0), torch.Generator().manual_seed(0))
    with torch.no_grad():
        _, q_logits = result.module(sample.hidden[: n - 1], sample.token_ids[1:n], HeadCache())
    torch.testing.assert_close(draft.probs[0], torch.softmax(q_logits[-1], -1), atol=1e-5, rtol=1e-4)


def test_cli_trains_and_replaces_an_earlier_head(tmp_path: Path, capsys, _sample_cache: Path) -> None:
    target = build_tiny_llama(tmp_path / "target")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"category": "t", "prompt_ids": p}) for p in _prompts(6, seed=3)))
    args = ["train", "--model", str(target), "--dtype", "float32", "--out", str(tmp_path / "head"),
            "--prompts", str(prompts), "--steps", "15", "--max-new-tokens", "24", "--no-progress"]
    assert main(args) == 0
    first = capsys.readouterr().out
    generated = _data_record(tmp_path / "head")
    assert "from the cache" not in first and len(list(_sample_cache.glob("*.safetensors"))) == 1
    assert not list(_sample_cache.glob("*.part-*.json"))  # generation's progress goes once the samples are stored
    assert main(args) == 0  # an earlier head in --out is replaced
    out = capsys.readouterr().out
    assert "from the cache" in out  # the second run reuses the samples
    assert _tokens_line(first) == _tokens_line(out)
    assert _data_record(tmp_path / "head")["tokens_sha256"] == generated["tokens_sha256"]
    next(_sample_cache.glob("*.safetensors")).write_bytes(b"not safetensors")
    assert main(args) == 0  # a corrupt cache file is rebuilt, not trusted
    assert "from the cache" not in capsys.readouterr().out
    # Generating again on the same machine makes the same data, and the record says so.
    assert _data_record(tmp_path / "head")["tokens_sha256"] == generated["tokens_sha256"]
    assert "held-out top-1 agreement:" in out and "wrote" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["head", "prompts.jsonl", "target"]  # no temp folders
    training = json.loads((tmp_path / "head" / "training.json").read_text())
    assert training["settings"]["steps"] == 15 and training["data"]["prompts"] == 6
    environment = generated["environment"]
    assert environment["torch"] == torch.__version__ and environment["forward"].startswith(("native", "transformers"))
    assert main([*args, "--expect-data-sha256", generated["tokens_sha256"].upper()]) == 0
    assert "warning" not in capsys.readouterr().err
    other = "0" * 64
    assert main([*args, "--expect-data-sha256", other]) == 0  # a warning, and the head is still written
    err = capsys.readouterr().err
    assert f"tokens_sha256 {generated['tokens_sha256']}, not the {other}" in err and torch.__version__ in err
    # A learning rate far too high leaves the head worse than it began: written, as asked, with a warning.
    assert main([*args, "--lr", "3"]) == 0
    captured = capsys.readouterr()
    before, after = (float(x) / 100 for x in re.search(r"top-1 agreement: ([\d.]+)% \(before training ([\d.]+)%",
                                                       captured.out).group(2, 1))
    assert (after < before) == ("the trained head is worse than before training" in captured.err), captured
    assert after < before


def test_an_interrupted_data_phase_goes_on_from_the_last_finished_chunk(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Generation keeps each finished chunk's continuations; the same run started again after an
    interruption reads them back, generates only the rest, and makes the uninterrupted run's data."""
    from specsure.decode.engine import Engine
    from specsure.train.continuations import ContinuationStore

    target = load_model(str(build_tiny_llama(tmp_path / "target")), dtype="float32")
    prompts = _prompts(20, seed=5)  # batch 2: chunks of 8, 8 and 4 prompts
    expected = self_distill(target, prompts, 12, batch_size=2)
    generate = Engine.generate
    calls: list[int] = []

    def counted(self: Engine, batch, params=None):  # noqa: ANN001, ANN202
        calls.append(len(batch))
        if stop_at is not None and len(calls) == stop_at:
            raise KeyboardInterrupt
        return generate(self, batch, params)

    monkeypatch.setattr(Engine, "generate", counted)
    stop_at: int | None = 2
    with pytest.raises(KeyboardInterrupt):
        self_distill(target, prompts, 12, batch_size=2, store=ContinuationStore(tmp_path / "cache", "k"))
    assert len(list((tmp_path / "cache").glob("k.part-*.json"))) == 1 and calls == [8, 8]
    calls.clear()
    stop_at = None
    store = ContinuationStore(tmp_path / "cache", "k")
    resumed = self_distill(target, prompts, 12, batch_size=2, store=store)
    assert store.resumed == 8 and calls == [8, 4]  # the first chunk was read back, not generated
    assert [s.token_ids.tolist() for s in resumed] == [s.token_ids.tolist() for s in expected]
    assert all(torch.equal(a.hidden, b.hidden) for a, b in zip(resumed, expected))
    # A chunk file that cannot be read, or holds other prompts, is generated again, not trusted.
    parts = (tmp_path / "cache").glob("k.part-*.json")
    first, second = (p for p in parts if len(json.loads(p.read_text())["prompts"]) == 8)  # the last chunk stays
    first.write_text("{not json")
    second.write_text(json.dumps({"format": "specsure-train-continuations-1", "prompts": [[1]], "continuations": [[2]]}))
    calls.clear()
    store = ContinuationStore(tmp_path / "cache", "k")
    again = self_distill(target, prompts, 12, batch_size=2, store=store)
    assert store.resumed == 20 - 16 and sorted(calls) == [8, 8]
    assert [s.token_ids.tolist() for s in again] == [s.token_ids.tolist() for s in expected]
    store.clear()
    assert not list((tmp_path / "cache").glob("k.part-*.json"))


def test_the_cli_says_when_its_data_phase_went_on_from_an_interrupted_run(tmp_path: Path, capsys,  # noqa: ANN001
                                                                         monkeypatch: pytest.MonkeyPatch,
                                                                         _sample_cache: Path) -> None:
    import specsure.train.data as data

    target = build_tiny_llama(tmp_path / "target")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"category": "t", "prompt_ids": p}) for p in _prompts(6, seed=3)))
    args = ["train", "--model", str(target), "--dtype", "float32", "--out", str(tmp_path / "head"),
            "--prompts", str(prompts), "--steps", "2", "--max-new-tokens", "24", "--no-progress"]
    features = data.build_sequences

    def stopped(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt  # Ctrl-C after generation, while the features are recorded

    monkeypatch.setattr(data, "build_sequences", stopped)
    assert main(args) == 130
    said = capsys.readouterr().err
    assert "interrupted: run the same command again" in said and "generation from its last finished chunk" in said
    assert "resume point" not in said  # training had not begun: no resume point to go on from
    assert main([*args, "--no-cache"]) == 130
    assert capsys.readouterr().err.strip().endswith("interrupted")  # nothing kept, nothing promised
    assert len(list(_sample_cache.glob("*.part-*.json"))) == 1
    monkeypatch.setattr(data, "build_sequences", features)
    assert main(args) == 0
    assert "generation went on from an interrupted run: 6 prompts' continuations read back" in capsys.readouterr().out
    assert _data_record(tmp_path / "head")["resumed_prompts"] == 6
    assert not list(_sample_cache.glob("*.part-*.json"))


def _data_record(head: Path) -> dict:
    return json.loads((head / "training.json").read_text())["data"]


def test_the_data_digest_covers_every_token_and_prompt_length() -> None:
    samples = [Sample(torch.tensor(p), torch.zeros(len(p), 2), 1) for p in ([5, 6, 7], [8, 9])]
    digest = tokens_digest(samples)
    assert digest == tokens_digest([Sample(s.token_ids.clone(), s.hidden, 1) for s in samples])
    changed_token = [samples[0], Sample(torch.tensor([8, 10]), samples[1].hidden, 1)]
    changed_prompt = [samples[0], Sample(samples[1].token_ids, samples[1].hidden, 2)]
    moved_boundary = [Sample(torch.tensor([5, 6]), torch.zeros(2, 2), 1), Sample(torch.tensor([7, 8, 9]),
                                                                                 torch.zeros(3, 2), 1)]
    others = {tokens_digest(s) for s in (changed_token, changed_prompt, moved_boundary, samples[::-1])}
    assert digest not in others and len(others) == 4


def _tokens_line(printed: str) -> str:
    return next(line for line in printed.splitlines() if line.startswith("data:")).split(" in ")[0]


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--out", "/nonexistent-parent/head", "does not exist"),
    ("--out", "BUSY", "not a head specsure train wrote (config.json, model.safetensors, training.json"),
    ("--out", "DOWNLOADED", "not a head specsure train wrote"),  # a head's config, but a README too: kept
    ("--out", "BARE", "a downloaded head has no training.json"),  # a head's two files, no record: someone else's
    ("--steps", "0", "--steps 0: training needs"),
    ("--corpus", "", "--corpus '' names no source"),
    ("--max-new-tokens", "-1", "--max-new-tokens -1"),
    ("--prompts", "TEXT", "has no tokenizer files, and the training prompts are text (the first: "),
    ("--corpus", "chat", "has no tokenizer files, and the training prompts are text (the first: template"),
    ("--corpus", "no-such-package-xyz", "'no-such-package-xyz' is not installed"),
    ("--corpus", "chta", "no corpus 'chta': did you mean 'chat'?"),  # never "pip install chta"
    ("--corpus", "chat:0,tqdm", "the weight in 'chat:0' must be a positive integer"),
    ("--data", "text", "--data text teacher-forces the corpus's own text"),
    ("--batch-windows", "0", "--batch-windows 0: must be a positive integer"),
    ("--batch-windows", "2", "only --method eagle3 packs windows"),
    ("--expect-data-sha256", "abc", "--expect-data-sha256 'abc': give the 64 hex digits"),
    ("--out", "/proc/head", "cannot write in its folder '/proc'"),
    ("--out", ".", "give the path of a folder for the head"),
    ("--draft-vocab-size", "100000", "--draft-vocab-size 100000 is larger than the target's vocabulary (128"),
    ("--cache-dir", "TEXT", "is a file; give a folder for the data cache"),
    ("--init-from", "/nonexistent-head", "--init-from '/nonexistent-head' is not a folder"),
])
def test_bad_input_is_a_clear_error(tmp_path: Path, capsys, flag: str, value: str, message: str) -> None:
    target = build_tiny_llama(tmp_path / "target")  # no tokenizer
    (tmp_path / "text.jsonl").write_text(json.dumps({"category": "t", "prompt": "hello"}))
    (tmp_path / "ids.jsonl").write_text(json.dumps({"category": "t", "prompt_ids": [5, 6, 7]}))
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    (tmp_path / "downloaded").mkdir()
    (tmp_path / "downloaded" / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    (tmp_path / "downloaded" / "README.md").write_text("a head from elsewhere")
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    (tmp_path / "bare" / "model.safetensors").write_bytes(b"weights from elsewhere")
    flags = {"--out": str(tmp_path / "head"), "--prompts": str(tmp_path / "ids.jsonl"), "--steps": "5"}
    flags[flag] = {"TEXT": str(tmp_path / "text.jsonl"), "BUSY": str(tmp_path / "busy"),
                   "DOWNLOADED": str(tmp_path / "downloaded"), "BARE": str(tmp_path / "bare")}.get(value, value)
    rc = main(["train", "--model", str(target), "--dtype", "float32", "--no-progress",
               *[part for item in flags.items() for part in item]])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "Traceback" not in err, err
    assert not (tmp_path / "head").exists()
    assert (tmp_path / "busy" / "notes.txt").read_text() == "mine"
    assert (tmp_path / "bare" / "model.safetensors").read_bytes() == b"weights from elsewhere"


def test_two_modules_train_together_and_run_as_a_two_module_head(tmp_path: Path) -> None:
    from specsure.train.mtp import chain_losses

    folder = _learnable_target(tmp_path / "target")
    target = load_model(str(folder), dtype="float32")
    samples = self_distill(target, _prompts(12, seed=4), max_new_tokens=48)
    result = train_mtp(target, samples, MTPTrainSettings(steps=120, lr=3e-3, modules=2))
    assert len(result.modules) == 2 and len(result.after.per_module) == 2
    assert result.after.acceptance_length > result.before.acceptance_length
    sample = samples[0]
    n = sample.hidden.shape[0]
    with torch.no_grad():
        chain = chain_losses(result.modules, target.lm, sample, 0, n - 1)
        # Module 1 as the engine runs it: module 0's outputs and the tokens one further on.
        hidden0, _ = result.modules[0](sample.hidden[: n - 1], sample.token_ids[1:n], HeadCache())
        _, logits1 = result.modules[1](hidden0[: n - 2], sample.token_ids[2:n], HeadCache())
    assert chain[1][0].shape == (n - 2,)
    p = torch.log_softmax(target.lm.lm_head_logits(sample.hidden[2:n]), -1)
    kl = (p.exp() * (p - torch.log_softmax(logits1, -1))).sum(-1)
    torch.testing.assert_close(chain[1][0], kl, atol=1e-5, rtol=1e-5)
    head = save_mtp_head(result.modules, target.lm, tmp_path / "head", {"modules": 2})
    assert json.loads((head / "config.json").read_text())["num_nextn_predict_layers"] == 2
    spec = make_engine(str(folder), {"method": "mtp", "model": str(head), "num_speculative_tokens": 2},
                       dtype="float32")
    assert len(spec.proposer.modules) == 2
    plain = make_engine(str(folder), None, dtype="float32")
    prompts = _prompts(3, seed=9)
    assert [c.token_ids for c in spec.generate(prompts, GREEDY)] == [c.token_ids for c in plain.generate(prompts, GREEDY)]


@pytest.mark.parametrize("modules", [1, 2])
def test_cyclic_steps_are_the_engines_draft_steps(tmp_path: Path, modules: int) -> None:
    """Unrolled past the last module, training computes the engine's later draft steps (cyclic reuse)."""
    from specsure.train.data import Sample
    from specsure.train.mtp import initial_modules, unrolled_logits

    folder = build_tiny_llama(tmp_path / "target", num_layers=2, seed=3)
    target = load_model(str(folder), dtype="float32")
    heads = initial_modules(target.lm, seed=5, count=modules)
    with torch.no_grad():  # a random head drafts poorly; larger residual weights make each step matter
        for module in heads:
            for p in module.block.parameters():
                p.mul_(20.0)
    head = save_mtp_head(heads, target.lm, tmp_path / "head", {})
    k = 5
    engine = make_engine(str(folder), {"method": "mtp", "model": str(head), "num_speculative_tokens": k},
                         dtype="float32")
    lm, proposer = engine.target.lm, engine.proposer
    context = _prompts(1, seed=7)[0] + [11]  # 16 observed positions, then the pending token
    lm.reset()
    proposer.reset()
    proposer.observe(context[:-1], 0, lm.forward(context[:-1], hidden=True))
    draft = proposer.propose(context, k, SamplingParams(temperature=1.0), torch.Generator().manual_seed(0))
    # Teacher-forced along what the engine drafted, the anchor is the last observed position.
    tokens = context + draft.token_ids
    lm.reset()
    sample = Sample(torch.tensor(tokens), lm.forward(tokens, hidden=True).hidden.clone(), len(context))
    lm.reset()
    a = len(context) - 2
    with torch.no_grad():
        # Rows past the anchor exist too: the anchor's steps must not see them.
        steps = unrolled_logits(proposer.modules, sample, 0, len(tokens) - 1, unroll=k)
    assert len(steps) == k
    for s in range(k):
        torch.testing.assert_close(torch.softmax(steps[s][a], -1), draft.probs[s], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_one_module_trained_for_two_steps_learns_its_cyclic_second_step(tmp_path: Path, dtype: str) -> None:
    folder = _learnable_target(tmp_path / "target")
    target = load_model(str(folder), dtype="float32")
    samples = self_distill(target, _prompts(12, seed=4), max_new_tokens=48)
    result = train_mtp(target, samples, MTPTrainSettings(steps=120, lr=3e-3, unroll=2, dtype=dtype), eval_every=60)
    assert all(p.dtype == torch.float32 for p in result.module.parameters())  # autocast keeps float32 weights
    assert len(result.modules) == 1 and len(result.after.per_module) == 2
    assert [s for s, _, _ in result.curve] == [0, 60, 120]
    assert result.after.per_module[1] > result.before.per_module[1]
    assert result.after.acceptance_length > result.before.acceptance_length
    head = save_mtp_head(result.modules, target.lm, tmp_path / "head", {})
    spec = make_engine(str(folder), {"method": "mtp", "model": str(head), "num_speculative_tokens": 2},
                       dtype="float32")
    plain = make_engine(str(folder), None, dtype="float32")
    prompts = _prompts(3, seed=9)
    assert [c.token_ids for c in spec.generate(prompts, GREEDY)] == [c.token_ids for c in plain.generate(prompts, GREEDY)]


def test_an_interrupted_or_diverged_mtp_run_resumes_where_it_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    import specsure.train.mtp as trainer

    folder = _learnable_target(tmp_path / "target")
    target = load_model(str(folder), dtype="float32")
    samples = self_distill(target, _prompts(6, seed=2), max_new_tokens=24)
    settings = MTPTrainSettings(steps=8, lr=3e-3, seq_len=16, unroll=2)
    whole = train_mtp(target, samples, settings)
    real, calls = trainer.chain_losses, [0]

    def failing(stop_at: int, failure):  # noqa: ANN001, ANN202
        def losses(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            if not torch.is_grad_enabled():  # the held-out evaluation, not a training step
                return real(*args, **kwargs)
            calls[0] += 1
            if calls[0] == stop_at:
                if failure is KeyboardInterrupt:
                    raise KeyboardInterrupt
                return [(torch.tensor([float("nan")]), torch.tensor([False]))]
            return real(*args, **kwargs)
        return losses

    point = tmp_path / "resume"
    monkeypatch.setattr(trainer, "chain_losses", failing(7, KeyboardInterrupt))  # Ctrl-C during step 7
    with pytest.raises(KeyboardInterrupt):
        train_mtp(target, samples, settings, resume=point, resume_key="data", checkpoint_every=3)
    assert (point / "resume.safetensors").is_file()
    monkeypatch.setattr(trainer, "chain_losses", real)
    resumed = train_mtp(target, samples, settings, resume=point, resume_key="data", checkpoint_every=3)
    assert resumed.losses == pytest.approx(whole.losses, rel=1e-5)
    for name, tensor in whole.module.state_dict().items():
        if name.startswith(("rotary.", "target.")):
            continue
        torch.testing.assert_close(resumed.module.state_dict()[name], tensor, rtol=1e-5, atol=1e-6)
    # The last step's point stays until the head is written, so a crash in the final evaluation or
    # the write costs no training: the same run again takes no step (any step would raise here).
    calls[0] = 0
    monkeypatch.setattr(trainer, "chain_losses", failing(1, KeyboardInterrupt))
    again = train_mtp(target, samples, settings, resume=point, resume_key="data", checkpoint_every=3)
    assert again.losses == resumed.losses and calls[0] == 0
    clear_point(point)
    assert not point.exists()

    calls[0] = 0
    monkeypatch.setattr(trainer, "chain_losses", failing(5, "nan"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the error alone, no PyTorch warning about the loss's gradient first
        with pytest.raises(FloatingPointError, match="the last good state, from step 4, is kept in .*delete"):
            train_mtp(target, samples, settings, resume=point, resume_key="data", checkpoint_every=2)
    assert (point / "resume.safetensors").is_file()  # the last good point stays
    calls[0] = 0
    monkeypatch.setattr(trainer, "chain_losses", failing(1, "nan"))  # diverging again from that point
    with pytest.raises(FloatingPointError, match=r"began from the resume point of step 4 .* diverged again .*delete"):
        train_mtp(target, samples, replace(settings, lr=1e-4), resume=point, resume_key="data", checkpoint_every=2)
    monkeypatch.setattr(trainer, "chain_losses", real)

    with pytest.raises(ValueError, match=r"--steps 3 is below the step of the resume point in .* \(4\)"):
        train_mtp(target, samples, replace(settings, steps=3), resume=point, resume_key="data", checkpoint_every=2)
    with caplog.at_level(logging.WARNING, logger="specsure.train.resume"):
        train_mtp(target, samples, replace(settings, steps=1), resume=point, resume_key="other", checkpoint_every=2)
    assert "was made by a run with other data or settings" in caplog.text


def test_eagle3_aux_layers_must_ascend(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    """vLLM and SGLang fuse the layers in ascending order; a head trained on another order reads them permuted."""
    target = build_tiny_llama(tmp_path / "target", num_layers=4)
    (tmp_path / "ids.jsonl").write_text(json.dumps({"category": "t", "prompt_ids": [5, 6, 7]}))
    rc = main(["train", "--method", "eagle3", "--model", str(target), "--dtype", "float32", "--no-progress",
               "--aux-layers", "3,1,0", "--prompts", str(tmp_path / "ids.jsonl"), "--out", str(tmp_path / "head")])
    err = capsys.readouterr().err
    assert rc == 2 and "in ascending order" in err and "for example 1,2,3" in err, err


@pytest.mark.slow
def test_teacher_forced_text_is_the_packages_own_text_as_the_answer(default_model_cache: Path, tmp_path: Path,
                                                                    capsys, _sample_cache: Path) -> None:
    from specsure.train.cache import _load
    from specsure.train.corpus import corpus_prompts

    out = tmp_path / "head"
    rc = main(["train", "--method", "eagle3", "--data", "text", "--corpus", "tqdm", "--corpus-prompts", "4",
               "--max-new-tokens", "32", "--steps", "2", "--unroll", "2", "--draft-vocab-size", "64",
               "--no-progress", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    assert json.loads((out / "training.json").read_text())["data"]["kind"] == "text"
    (cached,) = list(_sample_cache.glob("*.safetensors"))
    samples = _load(cached)
    target = load_model(None, dtype="auto")
    pieces = [c.piece for c in corpus_prompts(("tqdm",), 4, 0)]
    assert len(samples) == len(pieces) == 4
    for sample, piece in zip(samples, pieces):
        answer = target.tokenizer.decode(sample.token_ids[sample.prompt_len:].tolist())
        assert answer and piece.startswith(answer.strip()[:40])  # no generation: the answer is the package's text


def test_a_draft_vocabulary_loss_is_the_full_one_restricted_and_trains_a_head_that_runs(tmp_path: Path) -> None:
    """Over every id the draft-vocabulary KL is the full one; over a subset, the training labels
    (normalisers cached per sequence) give the evaluation's KL, and agreement maps draft ids back."""
    from specsure.train.mtp import DraftVocab, chain_losses, initial_modules

    folder = _learnable_target(tmp_path / "target")
    target = load_model(str(folder), dtype="float32")
    lm = target.lm
    samples = self_distill(target, _prompts(12, seed=4), max_new_tokens=48)
    sample, modules = samples[0], initial_modules(lm, seed=3)
    n = sample.hidden.shape[0]
    with torch.no_grad():
        full = chain_losses(modules, lm, sample, 0, n - 1, unroll=2)
        every = chain_losses(modules, lm, sample, 0, n - 1, unroll=2, vocab=DraftVocab.of(lm, torch.arange(lm.vocab_size)))
        for (kl, agree), (kl_v, agree_v) in zip(full, every, strict=True):
            torch.testing.assert_close(kl_v, kl, atol=1e-5, rtol=1e-5)
            assert torch.equal(agree_v, agree)
        ids = torch.arange(0, lm.vocab_size, 2)
        vocab = DraftVocab.of(lm, ids)
        scored = chain_losses(modules, lm, sample, 0, n - 1, unroll=2, vocab=vocab)
        trained = chain_losses(modules, lm, sample, 0, n - 1, unroll=2, agree=False, vocab=vocab)
        for (kl, agree), (kl_t, none) in zip(scored, trained, strict=True):
            torch.testing.assert_close(kl_t, kl, atol=1e-5, rtol=1e-5)
            assert none is None and torch.isfinite(kl).all()  # not a KL: p has less than unit mass here
        # Agreement: the head's best even id against the target's best id over the whole vocabulary.
        _, q = modules[0](sample.hidden[: n - 1], sample.token_ids[1:n], HeadCache())
        target_top = lm.lm_head_logits(sample.hidden[1:n]).argmax(-1)
        assert torch.equal(scored[0][1], ids[q[:, ids].argmax(-1)] == target_top)
    size = lm.vocab_size // 2
    result = train_mtp(target, samples, MTPTrainSettings(steps=120, lr=3e-3, unroll=2, draft_vocab_size=size))
    assert result.draft_ids is not None and result.draft_ids.numel() == size
    assert result.after.acceptance_length > result.before.acceptance_length + 0.3, (result.before, result.after)
    head = save_mtp_head(result.modules, lm, tmp_path / "head", {}, result.draft_ids)
    spec = make_engine(str(folder), {"method": "mtp", "model": str(head), "num_speculative_tokens": 2},
                       dtype="float32")
    plain = make_engine(str(folder), None, dtype="float32")
    prompts = _prompts(3, seed=9)
    assert [c.token_ids for c in spec.generate(prompts, GREEDY)] == [c.token_ids for c in plain.generate(prompts, GREEDY)]
    assert spec.stats.mean_acceptance_length > 1.3


def test_the_sample_cache_key_changes_when_another_model_takes_the_targets_path(tmp_path: Path) -> None:
    """The same path with other weights behind it must not reuse the old model's features."""
    import os
    import shutil

    from specsure.train.cache import cache_key
    from tiny import build_tiny_llama

    target = build_tiny_llama(tmp_path / "target", seed=0)
    key = cache_key(str(target), "float32", [[1, 2, 3]], 8, (0,))
    assert cache_key(str(target), "float32", [[1, 2, 3]], 8, (0,)) == key  # stable while nothing changes
    shutil.rmtree(target)
    build_tiny_llama(target, seed=1, hidden_size=48)
    os.utime(target / "model.safetensors", ns=(1, 1))  # even with an old modification time
    assert cache_key(str(target), "float32", [[1, 2, 3]], 8, (0,)) != key


def test_a_prompt_rows_max_tokens_is_named_as_unread(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    # the bench's per-row field: train's answers are --max-new-tokens long, and it says so, not silently
    target = build_tiny_llama(tmp_path / "target")
    rows = [{"category": "t", "prompt_ids": [5, 6, 7], "max_tokens": 2}, {"category": "t", "prompt_ids": [8, 9, 10]}]
    (tmp_path / "ids.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert main(["train", "--model", str(target), "--dtype", "float32", "--no-progress", "--prompts",
                 str(tmp_path / "ids.jsonl"), "--max-new-tokens", "8", "--steps", "1", "--out", str(tmp_path / "head")]) == 0
    err = capsys.readouterr().err
    assert "note: 1 row(s) of --prompts set max_tokens (first: " in err and "ids.jsonl" in err
    assert "every answer is at most --max-new-tokens (8) tokens" in err


@pytest.mark.parametrize(("before", "after", "said"), [
    ((0.30, 1.0), (0.25, 0.9), "top-1 agreement 25.0%, was 30.0%"),  # fewer right
    ((0.30, 1.0), (0.30, 1.5), "KL 1.500 nats and top-1 agreement 30.0%, was 1.000 and 30.0%"),  # as many, further
    ((0.30, 1.0), (0.35, 1.5), None),  # more right: a better head for drafting, whatever its KL
    ((0.30, 1.0), (0.30, 0.9), None),
])
def test_an_mtp_head_is_called_worse_by_agreement_then_kl(before, after, said, capsys) -> None:  # noqa: ANN001
    from types import SimpleNamespace

    from specsure.cli.train_head import _warn_if_worse_mtp

    figures = [SimpleNamespace(agreement=a, kl=k) for a, k in (before, after)]
    _warn_if_worse_mtp("held-out", "KL", *figures)
    err = capsys.readouterr().err
    assert (said is None and err == "") or (said is not None and said in err and "worse than before" in err), err
