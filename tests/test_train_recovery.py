"""specsure train after the worst: killed while evaluating or writing the head, killed with SIGKILL
mid-write, and the depth a finished MTP head records."""

from __future__ import annotations

import json
import logging
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specsure.cli.main import main
from specsure.config.resolution import resolve
from specsure.config.training_record import trained_depth
from specsure.train.checkpoint import check_out_dir
from specsure.train.leftovers import stale, tag
from tiny import build_tiny_llama


@pytest.fixture(autouse=True)
def _sample_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg")))


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _train_args(tmp_path: Path, method: str = "mtp") -> list[str]:
    target = build_tiny_llama(tmp_path / "target", num_layers=2)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"category": "t", "prompt_ids": [5 + i, 6, 7, 8]}) for i in range(6)))
    return ["train", "--method", method, "--model", str(target), "--dtype", "float32", "--out",
            str(tmp_path / "head"), "--prompts", str(prompts), "--steps", "6", "--checkpoint-every", "4",
            "--max-new-tokens", "12", "--seq-len", "16", "--no-progress"]


@pytest.mark.parametrize("method", ["mtp", "eagle3"])
def test_a_run_killed_while_writing_its_head_goes_on_without_training_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, capsys, method: str) -> None:  # noqa: ANN001
    import specsure.train.checkpoint as checkpoint

    args = _train_args(tmp_path, method)
    write = checkpoint._swap_into_place

    def killed(*_: object) -> None:
        raise KeyboardInterrupt  # Ctrl-C after the last step, as the head is renamed into place

    monkeypatch.setattr(checkpoint, "_swap_into_place", killed)
    assert main(args) == 130
    assert (tmp_path / ".head.resume" / "resume.safetensors").is_file()  # the finished training is kept
    assert not (tmp_path / "head").exists()
    monkeypatch.setattr(checkpoint, "_swap_into_place", write)
    capsys.readouterr()
    with caplog.at_level(logging.INFO, logger="specsure.train.loop"):
        assert main(args) == 0
    assert "resuming from step 6 of 6" in caplog.text
    assert (tmp_path / "head" / "model.safetensors").is_file()
    assert json.loads((tmp_path / "head" / "training.json").read_text())["settings"]["steps"] == 6
    assert sorted(p.name for p in tmp_path.iterdir()) == ["head", "prompts.jsonl", "target"]  # point cleared


def test_a_killed_writers_leftovers_go_and_the_head_it_was_replacing_comes_back(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    dead = _dead_pid()
    mine = tag().rsplit("-", 1)[0]
    out = tmp_path / "head"
    half = tmp_path / f".head.tmp-{mine}-{dead}-abc"  # a SIGKILL while the new head was written
    earlier = tmp_path / f".head.old-{mine}-{dead}-def"  # ... and between moving the old one aside and renaming
    live = tmp_path / f".head.tmp-{tag()}-ghi"  # this process's own, in flight
    foreign = tmp_path / f".head.tmp-00000000-{dead}-jkl"  # another host's: its writer may still run
    untagged = tmp_path / ".head.tmp-mno"
    for folder in (half, earlier, live, foreign, untagged):
        folder.mkdir()
    (earlier / "config.json").write_text(json.dumps({"architectures": ["SpecsureMTPHead"]}))
    (earlier / "model.safetensors").write_bytes(b"weights")
    (earlier / "training.json").write_text("{}")  # a head this trainer wrote, which it may replace
    with caplog.at_level(logging.WARNING):
        assert check_out_dir(out) == out
    assert (out / "config.json").is_file() and "put back the head" in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([".head.tmp-mno", live.name, foreign.name, "head"])
    # With a head in place, an old copy a killed writer left is only removed.
    earlier.mkdir()
    check_out_dir(out)
    assert not earlier.exists() and (out / "config.json").is_file()
    assert stale(tmp_path / f".resume-{mine}-{dead}-x.tmp", ".resume-")
    assert not stale(tmp_path / f".resume-{tag()}-x.tmp", ".resume-")


def test_a_killed_resume_point_write_is_removed_by_the_next(tmp_path: Path) -> None:
    import torch

    from specsure.train.resume import FILE, clear_point, save_point

    folder = tmp_path / "resume"
    folder.mkdir()
    half = folder / f".resume-{tag().rsplit('-', 1)[0]}-{_dead_pid()}-x.tmp"
    half.write_bytes(b"half")
    module = torch.nn.Linear(2, 2)
    optimiser = torch.optim.AdamW(module.parameters())
    schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda step: 1.0)
    save_point(folder, "k", 1, module, optimiser, schedule, torch.Generator(), {"losses": [], "curve": []})
    assert sorted(p.name for p in folder.iterdir()) == [FILE]
    half.write_bytes(b"half")
    clear_point(folder)
    assert not folder.exists()


def test_an_mtp_head_records_the_draft_steps_it_trained(tmp_path: Path) -> None:
    args = _train_args(tmp_path)
    assert main([*args, "--modules", "2"]) == 0
    record = json.loads((tmp_path / "head" / "training.json").read_text())
    assert record["settings"]["unroll"] == 2 and trained_depth(str(tmp_path / "head")) == 2
    config = json.loads((tmp_path / "head" / "config.json").read_text())
    assert record["settings"]["draft_vocab_size"] == config["draft_vocab_size"] == 128  # what it drafts, not the 8192 asked
    deeper = resolve({"method": "mtp", "model": str(tmp_path / "head"), "num_speculative_tokens": 4},
                     str(tmp_path / "target"))
    assert "trained for 2 draft steps" in deeper.reason("num_speculative_tokens")
    # A record an earlier version wrote, unroll 0 meaning one step per module, reads the same.
    record["settings"]["unroll"] = 0
    (tmp_path / "head" / "training.json").write_text(json.dumps(record))
    assert trained_depth(str(tmp_path / "head")) == 2


def test_an_unwritable_cache_or_an_mtp_flag_on_eagle3_fails_before_any_work(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    args = _train_args(tmp_path)
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the cache folder's parent should be")
    assert main([*args, "--cache-dir", str(blocker / "cache")]) == 2
    err = capsys.readouterr().err
    assert "--cache-dir" in err and "cannot be written" in err and "Traceback" not in err
    for flag in (["--modules", "2"], ["--init", "last_layer"]):
        assert main([*_train_args(tmp_path, "eagle3"), *flag]) == 2
        assert f"{flag[0]} {flag[1]}: only --method mtp takes it" in capsys.readouterr().err


def test_a_second_run_on_the_same_out_is_refused_while_the_first_holds_it(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    from specsure.train.out_lock import hold, lock_path

    args = _train_args(tmp_path)
    out = tmp_path / "head"
    with hold(out):
        assert main(args) == 2
        err = capsys.readouterr().err
        assert f"pid {__import__('os').getpid()}" in err and "another specsure train" in err and "--out" in err
    assert not lock_path(out).exists()  # released and removed
    # A holder killed with SIGKILL holds nothing: the kernel drops its lock.
    code = ("import sys, time; from pathlib import Path; from specsure.train.out_lock import hold\n"
            "with hold(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ValueError, match="another specsure train"):
            with hold(out):
                pass
    finally:
        holder.kill()
        holder.wait()
    assert lock_path(out).exists()  # left by the killed holder, and taken over
    assert main(args) == 0 and not lock_path(out).exists()


def test_what_a_killed_safetensors_write_leaves_is_swept(tmp_path: Path) -> None:
    import torch

    from specsure.train.cache import _store
    from specsure.train.data import Sample
    from specsure.train.resume import FILE, clear_point, save_point

    mine = tag().rsplit("-", 1)[0]
    folder = tmp_path / "resume"
    folder.mkdir()
    half = folder / f".resume-{mine}-{_dead_pid()}-x"  # a SIGKILL inside safetensors' own temporary file
    half.mkdir()
    (half / ".tmpab12cd").write_bytes(b"half of a point")
    module = torch.nn.Linear(2, 2)
    optimiser = torch.optim.AdamW(module.parameters())
    schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda step: 1.0)
    save_point(folder, "k", 1, module, optimiser, schedule, torch.Generator(), {"losses": [], "curve": []})
    assert sorted(p.name for p in folder.iterdir()) == [FILE]
    (folder / ".tmpXY12ab").write_bytes(b"an earlier version's untagged temporary")
    clear_point(folder)
    assert not folder.exists()
    cache = tmp_path / "cache"
    cache.mkdir()
    killed = cache / f".samples-{mine}-{_dead_pid()}-y"
    killed.mkdir()
    (killed / "k.safetensors").write_bytes(b"half")
    live = cache / f".samples-{tag()}-z"  # this process's own: never another's to remove
    live.mkdir()
    sample = Sample(torch.tensor([1, 2, 3]), torch.zeros(3, 4), 1)
    _store(cache, cache / "k.safetensors", [sample])
    assert sorted(p.name for p in cache.iterdir()) == sorted(["k.safetensors", live.name])


def test_weights_that_blow_up_under_a_finite_loss_stop_the_run_before_a_point_is_kept(tmp_path: Path) -> None:
    import torch

    from specsure.train.loop import optimiser_for, run_steps

    def attempt(lr: float) -> object:
        torch.manual_seed(0)
        module = torch.nn.Linear(4, 4)
        params = list(module.parameters())
        optimiser, schedule = optimiser_for(params, lr, 20)
        x = torch.randn(8, 4)
        # tanh keeps the loss finite however large the weights grow
        return run_steps(module, params, optimiser, schedule, torch.Generator(), 20, lr,
                         lambda: torch.tanh(module(x)).mean(), lambda: (), [], resume=tmp_path / "point",
                         resume_key="k", checkpoint_every=5)

    with pytest.raises(FloatingPointError, match=r"weights grew to .* by step 5 .* lower --lr .* train again"):
        attempt(1e13)
    assert not (tmp_path / "point").exists()  # no point was kept as a good one
    # a hundred times the largest starting weight, below 10,000: a collapsed head, not a good one
    with pytest.raises(FloatingPointError, match=r"weights grew to [0-9.]+ by step 5 \(they began at most 0.4"):
        attempt(100)
    trained = attempt(1e-3)
    assert len(trained.losses) == 20 and trained.resumed_from == 0 and trained.seconds > 0


def test_checkpoint_every_0_says_it_passes_over_a_resume_point_and_clears_it(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    from specsure.train.resume import FILE

    args = _train_args(tmp_path)
    point = tmp_path / ".head.resume"
    point.mkdir()
    (point / FILE).write_bytes(b"an earlier run's point")
    assert main([*args, "--checkpoint-every", "0"]) == 0
    assert "--checkpoint-every 0: this run does not go on from the resume point" in capsys.readouterr().err
    assert not point.exists() and (tmp_path / "head" / "model.safetensors").is_file()


def test_a_resumed_run_says_so_and_counts_every_runs_seconds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys) -> None:  # noqa: ANN001
    import specsure.train.loop as loop

    args = _train_args(tmp_path)
    steps = loop.update
    calls = []

    def interrupted(*a: object) -> float:
        calls.append(1)
        if len(calls) == 5:  # Ctrl-C in step 5, after the point of step 4
            raise KeyboardInterrupt
        return steps(*a)

    monkeypatch.setattr(loop, "update", interrupted)
    assert main(args) == 130
    monkeypatch.setattr(loop, "update", steps)
    capsys.readouterr()
    args[args.index("--steps") + 1] = "7"  # it goes on for longer, at another rate: the record keeps both runs
    assert main([*args, "--lr", "1e-3"]) == 0
    out = capsys.readouterr().out
    assert "training: 7 steps in" in out and "3 of them in this run, which went on from the resume point of step 4" in out
    record = json.loads((tmp_path / "head" / "training.json").read_text())
    assert record["resumed_from_step"] == 4 and len(record["losses"]) == 7
    assert record["runs"] == [{"from_step": 0, "lr": 2e-3, "steps": 6}, {"from_step": 4, "lr": 1e-3, "steps": 7}]


def test_small_train_mistakes_name_their_flag_or_file(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    args = _train_args(tmp_path)
    (tmp_path / "nonhead").mkdir()
    assert main([*args, "--init-from", str(tmp_path / "nonhead")]) == 2
    assert "--init-from" in (err := capsys.readouterr().err) and "no config.json there" in err
    assert main([*_train_args(tmp_path, "eagle3"), "--unroll", "17"]) == 2
    assert "--unroll 17: must be an integer from 1 to 16" in capsys.readouterr().err
    bad = tmp_path / "oob.jsonl"
    bad.write_text(json.dumps({"category": "t", "prompt_ids": [5, 999]}) + "\n")
    assert main([*args, "--prompts", str(bad)]) == 2  # --prompts adds to the file _train_args gives
    assert f"{bad}:1: prompt_ids holds token id 999" in capsys.readouterr().err
    # a dangling link as --out: refused before any work (it failed at the rename, after training)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    assert main([*args, "--out", str(tmp_path / "dangling")]) == 2
    assert "which does not exist; remove the link" in capsys.readouterr().err
    for typo in ("0,,1", "0,1,"):  # an empty item is a typo, not a layer left out
        assert main([*_train_args(tmp_path, "eagle3"), f"--aux-layers={typo}"]) == 2
        assert "no empty item" in capsys.readouterr().err


def test_a_nan_weight_after_the_first_is_caught() -> None:
    import torch

    from specsure.train.loop import _largest

    params = [torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.tensor([1.0, float("nan")]))]
    assert math.isnan(_largest(params))


def test_continuations_cut_at_the_context_are_said(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    """--max-new-tokens past what the context leaves: generation stops there, and the run says so."""
    args = _train_args(tmp_path)
    args[args.index("--max-new-tokens") + 1] = "600"  # the tiny target's context is 512
    assert main([*args, "--max-prompts", "1", "--steps", "1", "--no-cache"]) == 0
    assert "note: --max-new-tokens 600: 1 prompt(s) leave less room than that in the target's context of 512" in \
        capsys.readouterr().out


def test_an_out_link_is_followed_and_a_leaked_link_swept(tmp_path: Path) -> None:
    """--out a link to a folder: the head goes into that folder (renaming the link aside left the folder
    stale, and the link behind as .NAME.old-* for good), and the lock is that folder's."""
    from specsure.train.checkpoint import check_out_dir
    from specsure.train.leftovers import _host

    (tmp_path / "heads").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "heads")
    assert check_out_dir(tmp_path / "link") == (tmp_path / "heads").resolve()
    leaked = tmp_path / f".heads.old-{_host()}-999999999-x"  # from a run killed before links were followed
    leaked.symlink_to(tmp_path / "heads")
    check_out_dir(tmp_path / "heads")
    assert not leaked.is_symlink() and (tmp_path / "heads").is_dir()


@pytest.mark.parametrize("damage", ["token", "nan", "rows"])
def test_a_cache_file_that_reads_but_holds_damage_is_built_again(tmp_path: Path, damage: str,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """A file that parses as safetensors but holds an id past the vocabulary, a NaN feature, or features
    of another length trained into a raw error far from the cause (or a NaN blamed on --lr)."""
    import torch

    from specsure.train.cache import cached_samples
    from specsure.train.data import Sample

    good = [Sample(torch.tensor([1, 2, 3]), torch.ones(3, 4), 1, torch.ones(3, 8))]
    assert cached_samples(tmp_path, "k", lambda: good, vocab_size=10)[1] is False
    broken = {"token": Sample(torch.tensor([1, 2, 99]), torch.ones(3, 4), 1),
              "nan": Sample(torch.tensor([1, 2, 3]), torch.ones(3, 4), 1, torch.full((3, 8), float("nan"))),
              "rows": Sample(torch.tensor([1, 2, 3]), torch.ones(2, 4), 1)}[damage]
    (tmp_path / "k.safetensors").unlink()
    cached_samples(tmp_path, "k", lambda: [broken], vocab_size=10)  # stored as it came
    with caplog.at_level(logging.WARNING, logger="specsure.train.cache"):
        samples, hit = cached_samples(tmp_path, "k", lambda: good, vocab_size=10)
    assert not hit and samples is good and "are damaged" in caplog.text and "building them again" in caplog.text
    assert cached_samples(tmp_path, "k", lambda: [], vocab_size=10)[1]  # the rebuilt file reads back


def test_a_prompt_past_the_context_is_named_by_its_line(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    args = _train_args(tmp_path)
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"category": "t", "prompt_ids": [5] * 600}) + "\n")
    assert main([*args, "--prompts", str(long)]) == 2
    err = capsys.readouterr().err
    assert f"{long}:1: the prompt has 600 tokens, but the target's context is 512" in err and "note:" not in err


def test_chat_prompts_for_a_target_without_a_template_leave_out_the_conversations(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    """The derived tasks are conversations: without a chat template they failed after the first round of
    generation, naming a prompt the user never wrote; now they are left out, and a note says so."""
    from words import write_word_tokenizer

    target = write_word_tokenizer(build_tiny_llama(tmp_path / "words", vocab_size=128, num_layers=2), 128)
    code = main(["train", "--model", str(target), "--dtype", "float32", "--out", str(tmp_path / "head"),
                 "--corpus", "chat", "--corpus-prompts", "3", "--max-new-tokens", "24", "--steps", "2",
                 "--no-progress", "--no-cache"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "has no chat template, so its chat prompts go to it as plain text" in err
    record = json.loads((tmp_path / "head" / "training.json").read_text())
    assert record["data"]["prompts"] == 3  # no derived task was added
    held = record["data"]["heldout_sequences"]
    assert record["heldout"]["measured_on"] == ("heldout" if held else
                                                "training sequences (too few prompts to hold any out)")


def test_a_head_file_cut_short_is_named_not_a_traceback(tmp_path: Path) -> None:
    from specsure.config.errors import ConfigError
    from specsure.config.shipped import shipped_head
    from specsure.proposers.head_loading import TensorFile

    whole = Path(str(shipped_head("mtp"))) / "model.safetensors"
    (tmp_path / "model.safetensors").write_bytes(whole.read_bytes()[:5000])
    with pytest.raises(ConfigError, match="model.safetensors cannot be read as safetensors .*damaged or cut short"):
        TensorFile(tmp_path)


def test_a_head_stored_as_integers_is_named_not_a_traceback(tmp_path: Path) -> None:
    """Cast to floats an int8 head would be another head; loading it raised a 50-line RuntimeError."""
    from safetensors.torch import load_file, save_file

    from specsure import make_engine
    from specsure.config.errors import ConfigError
    from specsure.config.shipped import shipped_head

    head = tmp_path / "int8-head"
    shutil.copytree(str(shipped_head("mtp")), head)
    tensors = load_file(str(head / "model.safetensors"))
    name = next(n for n in sorted(tensors) if n.endswith("down_proj.weight"))
    save_file({**tensors, name: (tensors[name] * 10).to(torch.int8)}, str(head / "model.safetensors"))
    with pytest.raises(ConfigError, match="is stored as torch.int8 .integers., and a head's weights are floats"):
        make_engine(None, {"method": "mtp", "model": str(head), "num_speculative_tokens": 1}, dtype="float32")


def test_a_lock_file_planted_as_a_link_is_not_written_through(tmp_path: Path) -> None:
    """In a folder others can write, .NAME.lock linked to a user's file had the run truncate and overwrite it."""
    from specsure.train.out_lock import hold

    victim = tmp_path / "victim.txt"
    victim.write_text("IMPORTANT")
    (tmp_path / ".head.lock").symlink_to(victim)
    with pytest.raises(ValueError, match=r"is a link .* which this run will not write through"):
        with hold(tmp_path / "head"):
            pass
    assert victim.read_text() == "IMPORTANT"
    from specsure.cli.train_head import _point_folder

    (tmp_path / ".other.resume").symlink_to(tmp_path)
    with pytest.raises(ValueError, match=r"resume folder .* is a link"):
        _point_folder(tmp_path / "other")


def test_an_out_under_a_file_says_it_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("hi")
    with pytest.raises(ValueError, match="its parent .*afile' is a file, not a folder"):
        check_out_dir(tmp_path / "afile" / "sub")


def test_init_from_shipped_never_writes_over_the_shipped_head(capsys) -> None:  # noqa: ANN001
    """--out the very head --init-from shipped starts from was let through (the check compared paths only)."""
    from specsure.config.shipped import shipped_head

    folder = shipped_head("mtp")
    assert folder is not None
    before = (Path(folder) / "model.safetensors").read_bytes()
    assert main(["train", "--method", "mtp", "--init-from", "shipped", "--out", folder, "--steps", "1"]) == 2
    assert "is the --init-from head: the run would replace the head it starts from" in capsys.readouterr().err
    assert (Path(folder) / "model.safetensors").read_bytes() == before
