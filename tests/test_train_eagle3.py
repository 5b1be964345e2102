"""EAGLE-3 training: the unrolled steps are the draft steps the engine runs, the loss falls, the head runs exactly."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from specsure import SamplingParams, make_engine
from specsure.config.errors import ConfigError
from specsure.models.loading import load_model
from specsure.proposers.head_layer import HeadCache
from specsure.train.checkpoint import eagle3_config, eagle3_tensors, save_head
from specsure.train.data import build_sequences
from specsure.train.eagle3 import (Eagle3TrainSettings, default_aux_layers, draft_vocabulary, initial_module,
                                   packed_unrolled, train_eagle3, unrolled, window_loss)
from specsure.train.labels import DraftLabels
from specsure.train.resume import clear_point
from tiny import build_tiny_llama

@pytest.fixture(autouse=True)
def _sample_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg")))


PROMPTS = [[5, 6, 7, 8, 9, 10, 5, 6, 7], [40, 41, 3, 50, 40, 41], [77, 12, 19, 80, 0, 75, 18, 36, 70],
           [11, 12, 13, 14, 11, 12], [90, 91, 92, 93, 94, 95, 90, 91], [20, 30, 40, 50, 20, 30, 40]]


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    folder = build_tiny_llama(tmp_path_factory.mktemp("e3") / "t", vocab_size=96, hidden_size=48, num_layers=6)
    return folder, load_model(str(folder), dtype="float32")


def _samples(loaded, aux):  # noqa: ANN001, ANN202
    engine_out = [list(range(20 + i, 60 + i)) for i in range(len(PROMPTS))]  # any continuation will do here
    return build_sequences(loaded, PROMPTS, engine_out, aux_layers=aux)


def _distilled(folder, loaded, aux, tokens: int):  # noqa: ANN001, ANN202
    """(greedy params, the target's greedy continuations of PROMPTS, their samples)."""
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    continuations = [c.token_ids for c in make_engine(str(folder), None, dtype="float32").generate(PROMPTS, params)]
    return params, continuations, build_sequences(loaded, PROMPTS, continuations, aux_layers=aux)


def test_unrolled_steps_are_the_engines_draft_steps(target) -> None:  # noqa: ANN001
    _, loaded = target
    aux = default_aux_layers(loaded.lm.num_layers)
    sample = _samples(loaded, aux)[0]
    draft_ids = draft_vocabulary([sample], loaded.lm.vocab_size, 64)
    module = initial_module(loaded.lm, aux, draft_ids, seed=1)
    with torch.no_grad():
        steps = unrolled(module, sample, 0, 30, unroll=3)
        # The engine's way: step 0 over the committed features, then one entry per draft step fed
        # with the previous step's output, in the head's own cache.
        a = 12  # anchor: the last committed feature
        cache = HeadCache()
        out0, logits0 = module(module.features(sample.aux[: a + 1]), sample.token_ids[1: a + 2], cache)
        out1, logits1 = module(out0[-1:], sample.token_ids[a + 2: a + 3], cache)
        _, logits2 = module(out1, sample.token_ids[a + 3: a + 4], cache)
    for s, logits in enumerate((logits0[-1], logits1[0], logits2[0])):
        # The module returns target-vocabulary logits; the trainer's are over the draft vocabulary.
        torch.testing.assert_close(steps[s][a + s], logits[draft_ids], atol=1e-4, rtol=1e-4)


def test_packed_windows_are_the_windows_one_at_a_time(target) -> None:  # noqa: ANN001
    _, loaded = target
    aux = default_aux_layers(loaded.lm.num_layers)
    samples = _samples(loaded, aux)
    draft_ids = draft_vocabulary(samples, loaded.lm.vocab_size, 64)
    module = initial_module(loaded.lm, aux, draft_ids, seed=3)
    labels = DraftLabels(loaded.lm, draft_ids)
    windows = [(samples[0], 4, 30, 0), (samples[2], 0, 17, 5), (samples[4], 9, 40, 2)]
    with torch.no_grad():
        packed, place = packed_unrolled(module, windows, 3)
        alone = [unrolled(module, s, start, end, 3, scored) for s, start, end, scored in windows]
        assert place.tolist() == [*range(26), *range(12), *range(29)]
        want = []
        for step in range(3):
            # Rows before a window's step-th scored row take the previous window's last row: never scored.
            valid = place >= step
            torch.testing.assert_close(packed[step][valid], torch.cat([a[step] for a in alone])[valid],
                                       atol=1e-5, rtol=1e-5)
            # The packed loss of a step is the mean over every window's valid rows.
            rows = [-(labels.probs(s, start + scored + 1 + step, end + 1)
                      * torch.log_softmax(a[step][step:], -1)).sum(-1)
                    for (s, start, end, scored), a in zip(windows, alone)]
            want.append(torch.cat(rows).mean())
        weights = [0.8 ** s for s in range(3)]
        expected = sum(w * c for w, c in zip(weights, want)) / sum(weights)
        torch.testing.assert_close(window_loss(module, labels, windows, 3), expected, atol=1e-5, rtol=1e-5)


def test_a_library_caller_gets_value_errors_naming_what_does_not_fit(target) -> None:  # noqa: ANN001
    """aux layers that are not the samples' trained on other features, or failed in torch; settings of
    the other trainer failed on a missing attribute."""
    from specsure.train.mtp import MTPTrainSettings

    _, loaded = target
    aux = default_aux_layers(loaded.lm.num_layers)
    samples = _samples(loaded, aux)
    settings = Eagle3TrainSettings(steps=1, seq_len=16, unroll=2, draft_vocab_size=64)
    for wrong in ((0,), (), (0, 1, loaded.lm.num_layers + 5)):
        with pytest.raises(ValueError, match=r"aux_layers = .* must be the 3 layer id\(s\)"):
            train_eagle3(loaded, samples, settings, wrong)
    with pytest.raises(TypeError, match="settings must be Eagle3TrainSettings, not MTPTrainSettings"):
        train_eagle3(loaded, samples, MTPTrainSettings(), aux)
    for field, value in (("seed", 2**64), ("seed", -1), ("seed", "1"), ("answer_only", "no"),
                         ("heldout_fraction", False)):
        with pytest.raises(ValueError, match=f"{field} = "):
            Eagle3TrainSettings(**{field: value})
    with pytest.raises(TypeError):
        Eagle3TrainSettings(300)  # keyword-only: positions changed meaning when the fields moved


def test_bfloat16_packed_training_lowers_the_loss_and_the_head_runs_exactly(target, tmp_path: Path) -> None:  # noqa: ANN001
    folder, loaded = target
    aux = default_aux_layers(loaded.lm.num_layers)
    params, continuations, samples = _distilled(folder, loaded, aux, 30)
    settings = Eagle3TrainSettings(steps=30, lr=3e-3, seq_len=24, unroll=2, draft_vocab_size=64, windows=3,
                                   dtype="bfloat16", heldout_fraction=0.2)
    result = train_eagle3(loaded, samples, settings, aux)
    assert sum(result.losses[-5:]) / 5 < 0.8 * sum(result.losses[:5]) / 5
    assert all(p.dtype == torch.float32 for p in result.module.parameters())  # autocast keeps float32 weights
    head = tmp_path / "head"
    save_head(head, eagle3_config(loaded.lm, aux, 64, torch.float32),
              eagle3_tensors(result.module, result.draft_ids, loaded.lm.vocab_size, torch.float32), {"method": "eagle3"})
    spec = make_engine(str(folder), {"method": "eagle3", "model": str(head), "num_speculative_tokens": 2},
                       dtype="float32")
    assert [c.token_ids for c in spec.generate(PROMPTS, params)] == continuations and spec.stats.drafts > 0


def test_training_lowers_the_loss_and_the_head_runs_exactly(target, tmp_path: Path) -> None:  # noqa: ANN001
    folder, loaded = target
    aux = default_aux_layers(loaded.lm.num_layers)
    params, continuations, samples = _distilled(folder, loaded, aux, 40)
    settings = Eagle3TrainSettings(steps=40, lr=3e-3, seq_len=32, unroll=3, draft_vocab_size=64, heldout_fraction=0.2)
    result = train_eagle3(loaded, samples, settings, aux, eval_every=20)
    assert sum(result.losses[-5:]) / 5 < 0.8 * sum(result.losses[:5]) / 5
    assert result.after.acceptance_length >= 1.0 and len(result.after.agreement) == 3
    assert [s for s, _ in result.curve] == [0, 20, 40]
    head = tmp_path / "head"
    config = eagle3_config(loaded.lm, aux, 64, torch.float32)
    save_head(head, config, eagle3_tensors(result.module, result.draft_ids, loaded.lm.vocab_size, torch.float32),
              {"method": "eagle3"})
    assert json.loads((head / "config.json").read_text())["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == list(aux)
    spec = make_engine(str(folder), {"method": "eagle3", "model": str(head), "num_speculative_tokens": 3},
                       dtype="float32")
    assert spec.speculative_method == "eagle3" and spec.proposer.aux_layers == aux
    got = [c.token_ids for c in spec.generate(PROMPTS, params)]
    assert got == continuations  # lossless: the trained head changes speed, never the output
    assert spec.stats.drafts > 0


def test_train_cli_writes_an_eagle3_head_that_runs(target, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: ANN001
    from specsure.cli.main import main

    folder, _ = target
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"category": "code", "prompt_ids": p}) + "\n" for p in PROMPTS))
    out = tmp_path / "head"
    for windows in ("1", "2"):  # the second run replaces the first head
        rc = main(["train", "--method", "eagle3", "--model", str(folder), "--dtype", "float32", "--out", str(out),
                   "--prompts", str(prompts), "--max-new-tokens", "16", "--steps", "6", "--unroll", "2",
                   "--draft-vocab-size", "48", "--eval-every", "3", "--no-progress", "--batch-windows", windows])
        printed = capsys.readouterr().out
        assert rc == 0 and "greedy acceptance length at k=2" in printed
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 48
    training = json.loads((out / "training.json").read_text())
    assert [c["step"] for c in training["curve"]] == [0, 3, 6] and training["data"]["sources"]
    assert training["settings"]["unroll"] == 2 and len(training["losses"]) == 6
    assert training["settings"]["batch_windows"] == 2  # the flag reaches the trainer
    spec = make_engine(str(folder), {"method": "eagle3", "model": str(out), "num_speculative_tokens": 2},
                       dtype="float32")
    plain = make_engine(str(folder), None, dtype="float32")
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    assert [c.token_ids for c in spec.generate(PROMPTS, params)] == [c.token_ids for c in plain.generate(PROMPTS, params)]


def test_corpus_prompts_come_from_installed_packages_with_their_licences() -> None:
    from specsure.train.corpus import CorpusError, corpus_prompts, sources_of

    prompts = corpus_prompts(("tqdm", "jinja2"), limit=8, seed=1)
    assert len(prompts) == 8 and {p.package for p in prompts} == {"tqdm", "jinja2"}
    assert all(p.licence and ("```python" in p.text or "documentation" in p.text or "Summarize" in p.text)
               for p in prompts)
    assert corpus_prompts(("tqdm", "jinja2"), limit=8, seed=1) == prompts  # seeded: the same prompts again
    assert sum(s["prompts"] for s in sources_of(prompts)) == 8
    import importlib.metadata  # each package's version, since another version's files give other prompts
    assert {s["version"] for s in sources_of(prompts)} == {importlib.metadata.version(n) for n in ("tqdm", "jinja2")}
    assert "version" not in sources_of(corpus_prompts(("chat",), limit=2))[0]  # specsure's own prompts have none
    with pytest.raises(CorpusError, match="not installed"):
        corpus_prompts(("no-such-package-xyz",), limit=2)


def test_a_source_that_runs_out_is_named_since_the_others_change_the_mix(capsys: pytest.CaptureFixture[str]) -> None:
    from specsure.cli.train_data import training_prompts
    from specsure.train.corpus import corpus_prompts, short_sources

    few = corpus_prompts(("tqdm", "chat"), limit=20, seed=0)
    assert short_sources(few, ("tqdm", "chat"), (1, 1), 20) == []  # both gave their share
    many = corpus_prompts(("tqdm", "chat"), limit=2000, seed=0)
    tqdm = sum(p.package == "tqdm" for p in many)
    assert len(many) == 2000 and tqdm < 900  # tqdm's sources hold fewer pieces; chat filled the rest
    assert short_sources(many, ("tqdm", "chat"), (1, 1), 2000) == [("tqdm", tqdm, 1000)]
    assert short_sources(many, ("tqdm", "chat"), (1, 3), 2000) == ([("tqdm", tqdm, 500)] if tqdm < 450 else [])
    args = argparse.Namespace(data="self-distill", prompts=None, corpus="tqdm,chat", corpus_prompts=2000, seed=0,
                              max_prompts=None)
    assert len(training_prompts(args).rows) == 2000
    assert (f"note: --corpus tqdm gave {tqdm} prompts, short of its share of 1000 of --corpus-prompts 2000"
            in capsys.readouterr().err)


def test_an_interrupted_or_diverged_run_resumes_where_it_stopped(target, tmp_path: Path,  # noqa: ANN001
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import specsure.train.eagle3 as trainer

    _, loaded = target
    aux = default_aux_layers(loaded.lm.num_layers)
    samples = _samples(loaded, aux)
    settings = Eagle3TrainSettings(steps=8, lr=3e-3, seq_len=16, unroll=2, draft_vocab_size=48)
    whole = train_eagle3(loaded, samples, settings, aux)
    real, calls = trainer.window_loss, [0]

    def failing(stop_at: int, failure):  # noqa: ANN001, ANN202
        def loss(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            calls[0] += 1
            if calls[0] == stop_at:
                if failure is KeyboardInterrupt:
                    raise KeyboardInterrupt
                return torch.tensor(float("nan"))
            return real(*args, **kwargs)
        return loss

    point = tmp_path / "resume"
    monkeypatch.setattr(trainer, "window_loss", failing(7, KeyboardInterrupt))  # Ctrl-C during step 7
    with pytest.raises(KeyboardInterrupt):
        train_eagle3(loaded, samples, settings, aux, resume=point, resume_key="data", checkpoint_every=3)
    assert (point / "resume.safetensors").is_file()
    monkeypatch.setattr(trainer, "window_loss", real)
    resumed = train_eagle3(loaded, samples, settings, aux, resume=point, resume_key="data", checkpoint_every=3)
    # From step 6 on, the same windows and the same optimiser state: the same head as one uninterrupted run.
    assert resumed.losses == pytest.approx(whole.losses, rel=1e-5)
    for name, tensor in whole.module.state_dict().items():
        torch.testing.assert_close(resumed.module.state_dict()[name], tensor, rtol=1e-5, atol=1e-6)
    calls[0] = 0  # the last step's point stays until the CLI has written the head: a run again takes no step
    monkeypatch.setattr(trainer, "window_loss", failing(1, KeyboardInterrupt))
    assert train_eagle3(loaded, samples, settings, aux, resume=point, resume_key="data",
                        checkpoint_every=3).losses == resumed.losses
    clear_point(point)
    assert not point.exists()

    calls[0] = 0
    monkeypatch.setattr(trainer, "window_loss", failing(5, "nan"))
    with pytest.raises(FloatingPointError, match="from step 4"):
        train_eagle3(loaded, samples, settings, aux, resume=point, resume_key="data", checkpoint_every=2)
    monkeypatch.setattr(trainer, "window_loss", real)
    lower = train_eagle3(loaded, samples, Eagle3TrainSettings(**{**settings.__dict__, "lr": 1e-3}), aux,
                         resume=point, resume_key="data", checkpoint_every=2)
    assert len(lower.losses) == 8 and all(math.isfinite(v) for v in lower.losses)
    assert train_eagle3(loaded, samples, settings, aux, resume=point, resume_key="other").losses == whole.losses


def _bench_texts() -> set[str]:
    """Every prompt of both bench splits and every turn of their conversations."""
    from specsure.bench.workload import load_builtin

    rows = [row for split in (False, True) for row in load_builtin(heldout=split)]
    return {row.prompt for row in rows if row.prompt} | {text for row in rows for _, text in row.messages or ()}


def test_dialog_prompts_are_the_conversations_opening_turns_with_their_licence() -> None:
    from specsure.train.corpus import corpus_prompts, sources_of
    from specsure.train.dialog_prompts import dialog_prompts

    every = dialog_prompts(5000)
    assert len(every) > 500 and len({p.text.lower() for p in every}) == len(every)  # each turn once
    assert all(p.package == "chatterbot-corpus" and "BSD" in p.licence and p.text == " ".join(p.text.split())
               for p in every)
    assert dialog_prompts(8, seed=1) == dialog_prompts(8, seed=1) != dialog_prompts(8, seed=2)
    mixed = corpus_prompts(("chatterbot-corpus", "chat"), limit=10)
    assert [p.package for p in mixed] == ["chatterbot-corpus", "chat"] * 5
    assert any("chatterbot-corpus" in s["source"] for s in sources_of(mixed))
    bench = _bench_texts()
    assert not {b.lower() for b in bench} & {p.text.lower() for p in every}


def test_chat_prompts_are_distinct_ours_and_not_bench_prompts() -> None:
    from specsure.train.corpus import corpus_prompts, sources_of

    prompts = corpus_prompts(("chat", "tqdm"), limit=40, seed=2)
    chat = [p for p in prompts if p.package == "chat"]
    assert len(prompts) == 40 and len(chat) == 20 and len({p.text for p in chat}) == 20
    assert all(p.licence.startswith("Apache-2.0") and "{" not in p.text for p in chat)
    assert corpus_prompts(("chat",), limit=5, seed=2) == corpus_prompts(("chat",), limit=5, seed=2)
    assert any("chat prompts" in s["source"] for s in sources_of(prompts))
    bench = _bench_texts()
    assert len(bench) > 100  # both splits' prompts and every turn of their conversations
    assert not bench & {p.text for p in corpus_prompts(("chat",), limit=5000)}


def test_a_run_can_continue_a_head_it_keeps_the_heads_vocabulary_and_layers(target, tmp_path: Path,  # noqa: ANN001
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """--init-from starts from the head's own weights: on the same data and seed the continued run's
    "before" is the first run's "after"; its draft vocabulary and aux layers stay; conflicting flags
    and foreign heads are refused with the fix."""
    from specsure.cli.main import main

    folder, _ = target
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"category": "code", "prompt_ids": p}) + "\n" for p in PROMPTS))
    common = ["train", "--method", "eagle3", "--model", str(folder), "--dtype", "float32", "--prompts", str(prompts),
              "--max-new-tokens", "16", "--unroll", "2", "--no-progress", "--checkpoint-every", "0"]
    first, second = tmp_path / "first", tmp_path / "second"
    # 6 = N: the last layer's output, which vLLM collects and the trainer extracts like any other
    assert main([*common, "--out", str(first), "--steps", "6", "--draft-vocab-size", "40", "--aux-layers", "1,3,6"]) == 0
    assert main([*common, "--out", str(second), "--steps", "4", "--init-from", str(first)]) == 0
    capsys.readouterr()
    one, two = (json.loads((f / "training.json").read_text()) for f in (first, second))
    assert two["heldout"]["acceptance_length_before"] == pytest.approx(one["heldout"]["acceptance_length_after"])
    assert two["heldout"]["loss_before"] == pytest.approx(one["heldout"]["loss_after"], rel=1e-5)
    assert two["settings"]["init_from"] == str(first) and two["settings"]["aux_layers"] == [1, 3, 6]
    assert two["continued_from"] == one  # the first run's record travels with the head it became
    config = json.loads((second / "config.json").read_text())
    assert config["draft_vocab_size"] == 40 and config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 6]
    d2t = {f: load_file(str(f / "model.safetensors"))["d2t"] for f in (first, second)}
    assert torch.equal(d2t[first], d2t[second])
    plain = make_engine(str(folder), None, dtype="float32")
    spec = make_engine(str(folder), {"method": "eagle3", "model": str(second), "num_speculative_tokens": 2},
                       dtype="float32")
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    assert [c.token_ids for c in spec.generate(PROMPTS, params)] == [c.token_ids for c in plain.generate(PROMPTS, params)]

    def refused(extra: list[str], message: str, base: list[str] = common) -> None:
        assert main([*base, "--out", str(tmp_path / "x"), "--steps", "1", *extra]) != 0
        assert message in capsys.readouterr().err

    refused(["--init-from", str(first), "--aux-layers", "1,2,3"],
            "--aux-layers 1,2,3: the head --init-from gives was trained on layers [1, 3, 6]")
    refused(["--init-from", str(first), "--draft-vocab-size", "48"],
            "--draft-vocab-size 48: the head --init-from gives drafts among 40 tokens")
    refused(["--init-from", str(first)], "not an MTP head that specsure train wrote", [*common[:2], "mtp", *common[3:]])
    refused(["--init-from", "shipped"], "--init-from shipped names the head shipped for the default model")
    before = (first / "model.safetensors").read_bytes()
    assert main([*common, "--out", str(first), "--steps", "1", "--init-from", str(first)]) == 2
    assert "is the --init-from head: the run would replace the head it starts from" in capsys.readouterr().err
    assert (first / "model.safetensors").read_bytes() == before
    mtp_head = tmp_path / "mtp-head"
    assert main(["train", "--method", "mtp", "--model", str(folder), "--dtype", "float32", "--prompts", str(prompts),
                 "--max-new-tokens", "16", "--steps", "1", "--no-progress", "--checkpoint-every", "0",
                 "--out", str(mtp_head)]) == 0
    capsys.readouterr()
    refused(["--init-from", str(mtp_head)], "is an MTP head (architectures ['SpecsureMTPHead']); continue it with --method mtp")
    from heads import write_eagle3_head

    deep = write_eagle3_head(tmp_path / "deep", folder, draft_vocab=40, layers=2, layer_ids=[1, 3, 6])
    refused(["--init-from", str(deep)], "the head has 2 decoder layers (layers.1.* ...), and this trainer trains "
                                        "EAGLE-3 heads of one")
    # flags the trainer's layer does not have: a continued head would silently compute another function
    from heads import speculators_copy

    residual = write_eagle3_head(tmp_path / "nbr", folder, draft_vocab=40, layer_ids=[1, 3, 6], norm_before_residual=True)
    refused(["--init-from", str(residual)], "the head sets norm_before_residual = true, a variant of the EAGLE-3 layer")
    unset = speculators_copy(first, tmp_path / "spec", drop=("norm_before_residual",))  # vLLM reads absent as true
    refused(["--init-from", str(unset)], "the head sets norm_before_residual = true")
    qwen3 = write_eagle3_head(tmp_path / "qwen3", folder, draft_vocab=40, layer_ids=[1, 3, 6], qwen3=True)
    refused(["--init-from", str(qwen3)], "the head has Qwen3 decoder layers")
    (first / "training.json").write_text("{not json")
    refused(["--init-from", str(first)], f"--init-from {str(first)!r}: its training.json cannot be read")


def test_a_wider_head_states_its_width_runs_exactly_and_continues_at_it(target, tmp_path: Path,  # noqa: ANN001
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """--intermediate-size sizes a new head's MLP; its config.json says so (vLLM and SGLang build the head
    from it), the engine loads and runs it exactly, and a continued run keeps the width."""
    from specsure.cli.main import main

    folder, loaded = target
    target_width = loaded.lm.hf.config.intermediate_size
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"category": "code", "prompt_ids": p}) + "\n" for p in PROMPTS))
    common = ["train", "--method", "eagle3", "--model", str(folder), "--dtype", "float32", "--prompts", str(prompts),
              "--max-new-tokens", "16", "--unroll", "2", "--no-progress", "--checkpoint-every", "0",
              "--draft-vocab-size", "40"]
    wide, more = tmp_path / "wide", tmp_path / "more"
    assert main([*common, "--out", str(wide), "--steps", "3", "--intermediate-size", str(2 * target_width)]) == 0
    assert main([*common[:-2], "--out", str(more), "--steps", "2", "--init-from", str(wide)]) == 0
    capsys.readouterr()
    for head in (wide, more):
        assert json.loads((head / "config.json").read_text())["intermediate_size"] == 2 * target_width
        assert json.loads((head / "training.json").read_text())["settings"]["intermediate_size"] == 2 * target_width
        assert load_file(str(head / "model.safetensors"))["midlayer.mlp.gate_proj.weight"].shape[0] == 2 * target_width
    plain = make_engine(str(folder), None, dtype="float32")
    spec = make_engine(str(folder), {"method": "eagle3", "model": str(more), "num_speculative_tokens": 2},
                       dtype="float32")
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    assert [c.token_ids for c in spec.generate(PROMPTS, params)] == [c.token_ids for c in plain.generate(PROMPTS, params)]

    def refused(extra: list[str], message: str) -> None:
        assert main([*common[:-2], "--out", str(tmp_path / "x"), "--steps", "1", *extra]) != 0
        assert message in capsys.readouterr().err

    refused(["--init-from", str(wide), "--intermediate-size", str(target_width)],
            f"--intermediate-size {target_width}: the head --init-from gives has an MLP of {2 * target_width} units")
    refused(["--intermediate-size", "0"], "--intermediate-size 0: must be a positive integer")
    assert main(["train", "--method", "mtp", "--model", str(folder), "--prompts", str(prompts), "--steps", "1",
                 "--out", str(tmp_path / "m"), "--intermediate-size", "64"]) != 0
    assert "--intermediate-size 64: only --method eagle3 sizes its own MLP" in capsys.readouterr().err


@pytest.mark.parametrize("family", ["gemma3", "gemma3-exact-gelu", "mistral-window", "phi4-mini"])
def test_heads_train_and_run_exactly_on_targets_that_are_not_llama(family: str, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Gemma 3 (one RoPE per layer type, its own layer class) and a windowed Mistral: the EAGLE-3 trainer
    built its Llama layer from the target's config (which lacks mlp_bias, attention_bias) and the MTP
    trainer called Gemma's RotaryEmbedding without a layer type; both crashed. The heads are Llama layers
    on the full-attention RoPE now, and their output equals plain decoding. An exact GELU keeps Gemma 3 on
    transformers' modules, where the MTP proposer crashed on the same rotary module."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, MistralConfig, MistralForCausalLM, Phi3Config, \
        Phi3ForCausalLM

    from specsure.cli.main import main
    from tiny import random_model

    shape = dict(vocab_size=96, hidden_size=48, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if family.startswith("gemma3"):
        model = random_model(Gemma3ForCausalLM, Gemma3TextConfig(
            **shape, head_dim=16, query_pre_attn_scalar=16, sliding_window=6,
            hidden_activation="gelu" if family.endswith("gelu") else "gelu_pytorch_tanh",
            layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]))
        with torch.no_grad():
            model.get_input_embeddings().weight.normal_(0.0, 0.03)  # scaled by sqrt(hidden) on the way in
    elif family == "phi4-mini":  # q|k|v and gate|up fused, RoPE on 3/4 of each head, LongRoPE's factors for them
        model = random_model(Phi3ForCausalLM, Phi3Config(
            **{**shape, "pad_token_id": None, "num_attention_heads": 3, "num_key_value_heads": 1},  # heads of 16
            original_max_position_embeddings=64,
            rope_parameters={"rope_type": "longrope", "rope_theta": 1e4, "partial_rotary_factor": 0.75,
                             "short_factor": [1.0, 1.5, 2.0, 3.0, 5.0, 8.0], "long_factor": [1.0] * 6}))
    else:
        model = random_model(MistralForCausalLM, MistralConfig(**shape, sliding_window=6))
    folder = tmp_path / family
    model.save_pretrained(folder)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"category": "code", "prompt_ids": p}) + "\n" for p in PROMPTS))
    plain = make_engine(str(folder), None, dtype="float32")
    assert ("transformers" if family.endswith("gelu") else "native") in plain.target.lm.path.split(" ")[0]
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    expected = [c.token_ids for c in plain.generate(PROMPTS, params)]
    for method, extra in (("eagle3", ["--draft-vocab-size", "48", "--unroll", "2"]), ("mtp", [])):
        out = tmp_path / f"{method}-head"
        assert main(["train", "--method", method, "--model", str(folder), "--dtype", "float32", "--out", str(out),
                     "--prompts", str(prompts), "--max-new-tokens", "16", "--steps", "4", "--no-progress",
                     "--checkpoint-every", "0", *extra]) == 0, capsys.readouterr().err
        capsys.readouterr()
        spec = make_engine(str(folder), {"method": method, "model": str(out), "num_speculative_tokens": 2},
                           dtype="float32")
        assert [c.token_ids for c in spec.generate(PROMPTS, params)] == expected, method
        assert spec.stats.drafts > 0
    config = json.loads((tmp_path / "eagle3-head" / "config.json").read_text())
    if family.startswith("gemma3"):  # the global base of the full-attention layers, not the sliding layers' 10,000
        assert config["model_type"] == "llama" and config["rope_parameters"] == {"rope_theta": 1e6, "rope_type": "default"}
    if family == "phi4-mini":  # a Llama head turns whole heads: a plain RoPE of the target's base
        assert config["rope_parameters"] == {"rope_theta": 1e4, "rope_type": "default"}
        config["rope_parameters"]["partial_rotary_factor"] = 0.75
        (tmp_path / "eagle3-head" / "config.json").write_text(json.dumps(config))
        with pytest.raises(ConfigError, match="partial_rotary_factor turns 12 of each head's 16 dims"):
            make_engine(str(folder), {"method": "eagle3", "model": str(tmp_path / "eagle3-head"),
                                      "num_speculative_tokens": 2}, dtype="float32")
