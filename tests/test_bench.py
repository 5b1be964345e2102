"""specsure bench: workload schema, result arithmetic, and a tiny-model end-to-end run."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from specsure.cli.main import main
from specsure.bench.report import render_markdown
from specsure.bench.results import ALL, BenchResults, first_divergence, prompt_result, summarize
from specsure.bench.runners import Generation
from specsure.bench.workload import CATEGORIES, WorkloadError, load_builtin, load_workload, load_workloads, select

# --- workload files ------------------------------------------------------------------------


def _write(tmp_path: Path, *rows: object) -> Path:
    path = tmp_path / "mine.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def test_workload_reads_all_three_prompt_forms(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        {"category": "qa", "prompt": "What is 2 + 2?", "max_tokens": 8, "id": "q1"},
        "",
        {"category": "chat", "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]},
        {"category": "ids", "prompt_ids": [5, 6, 7]},
    )
    prompts = load_workload(path)
    assert [p.id for p in prompts] == ["q1", "mine-3", "mine-4"]
    assert prompts[0].max_tokens == 8 and prompts[0].prompt == "What is 2 + 2?"
    assert prompts[1].messages == (("user", "Hi"), ("assistant", "Hello!"), ("user", "Bye"))
    assert prompts[2].prompt_ids == (5, 6, 7) and prompts[2].max_tokens is None


@pytest.mark.parametrize(
    ("row", "field", "words"),
    [
        ({"category": "qa", "promt": "x"}, "promt", "did you mean 'prompt'"),
        ({"prompt": "x"}, "category", "non-empty string, but the row has none"),
        ({"category": None, "prompt": "x"}, "category", "non-empty string, got null"),
        ({"category": " qa ", "prompt": "x"}, "category", 'has spaces around it; write "qa"'),
        ({"category": "qa", "prompt": "x", "id": None}, "id", "got null"),
        ({"category": "qa", "prompt": "x", "id": " "}, "id", "without spaces around it"),
        ({"category": "qa", "prompt": "x", "messages": [{"role": "user", "content": "y"}]}, None, "exactly one of"),
        ({"category": "qa"}, None, "exactly one of"),
        ({"category": "qa", "prompt": "  "}, "prompt", "non-empty"),
        ({"category": "qa", "prompt": "x", "max_tokens": 0}, "max_tokens", "positive integer"),
        ({"category": "qa", "prompt": "x", "max_tokens": "64"}, "max_tokens", 'positive integer, got "64"'),
        ({"category": "qa", "prompt": "x", "max_tokens": True}, "max_tokens", "positive integer, got true"),
        ({"category": "qa", "prompt_ids": [1, -2]}, "prompt_ids", "non-negative"),
        ({"category": "chat", "messages": [{"role": "robot", "content": "y"}]}, "messages[0].role", 'got "robot"'),
        ({"category": "chat", "messages": [{"role": "user", "text": "y"}]}, "messages[0]", "'role' and 'content'"),
        ({"category": "chat", "messages": [{"role": "user", "content": "y"}, {"role": "assistant", "content": "z"}]}, "messages", "last turn"),
        (["not", "an", "object"], None, "expected a JSON object, got an array"),
    ],
)
def test_workload_errors_name_file_line_and_field(tmp_path: Path, row: object, field: str | None, words: str) -> None:
    path = _write(tmp_path, {"category": "qa", "prompt": "fine"}, row)
    with pytest.raises(WorkloadError) as err:
        load_workload(path)
    message = str(err.value)
    assert f"{path}:2" in message
    if field is not None:
        assert f"field {field!r}" in message
    assert words in message


def test_workload_rejects_bad_json_duplicates_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match=r"mine\.jsonl:1: not valid JSON"):
        load_workload(_write(tmp_path, '{"category": "qa", "prompt": }'))
    with pytest.raises(WorkloadError, match=r"mine\.jsonl:2: field 'id': \"a\" is already used at .*mine\.jsonl:1"):
        load_workload(_write(tmp_path, {"category": "qa", "prompt": "x", "id": "a"}, {"category": "qa", "prompt": "y", "id": "a"}))
    with pytest.raises(WorkloadError, match="no prompts"):
        load_workload(_write(tmp_path, ""))
    with pytest.raises(WorkloadError, match="cannot read"):
        load_workload(tmp_path / "missing.jsonl")
    bom = tmp_path / "bom.jsonl"  # as Windows editors save UTF-8
    bom.write_bytes(b"\xef\xbb\xbf" + json.dumps({"category": "qa", "prompt": "x"}).encode() + b"\n")
    assert [p.prompt for p in load_workload(bom)] == ["x"]


def test_messages_without_a_chat_template_are_refused_not_flattened(tmp_path: Path) -> None:
    from specsure.bench.workload import encode

    class Plain:  # a tokenizer without a chat template
        chat_template = None

        def encode(self, text: str) -> list[int]:
            return [len(text)]

    chat, = load_workload(_write(tmp_path, {"category": "c", "messages": [{"role": "user", "content": "hi"}]}))
    with pytest.raises(WorkloadError, match=r"gives 'messages', but the model's tokenizer has no chat template"):
        encode(chat, Plain())
    text, = load_workload(_write(tmp_path, {"category": "c", "prompt": "hi"}))
    assert encode(text, Plain()) == (2,)  # a prompt is encoded as-is, as documented


def test_workload_files_of_one_name_keep_their_default_ids_apart(tmp_path: Path) -> None:
    """Two chat.jsonl files (say, two teams' prompts): ids from their folders, not a clash on chat-1."""
    first, second = tmp_path / "team-a" / "chat.jsonl", tmp_path / "team-b" / "chat.jsonl"
    for path in (first, second):
        path.parent.mkdir()
        path.write_text(json.dumps({"category": "chat", "prompt": path.parent.name}) + "\n")
    assert [(p.id, p.prompt) for p in load_workloads([first, second])] == [("team-a/chat-1", "team-a"),
                                                                          ("team-b/chat-1", "team-b")]
    assert [p.id for p in load_workloads([first])] == ["chat-1"]  # one file: ids as before
    with pytest.raises(WorkloadError, match=r'"chat-1" is already used at .*unique across the files'):
        load_workloads([first, first])
    assert len(load_workloads([first, first], unique=False)) == 2  # training: a file twice weighs it twice
    # folders of one name under two parents, and two files that differ only in their suffix
    deeper, suffixed = tmp_path / "x" / "team-a" / "chat.jsonl", tmp_path / "team-b" / "chat.json"
    deeper.parent.mkdir(parents=True)
    for path in (deeper, suffixed):
        path.write_text(json.dumps({"category": "chat", "prompt": "p"}) + "\n")
    assert [p.id for p in load_workloads([first, deeper, second, suffixed])] == [
        f"{tmp_path.name}/team-a/chat-1", "x/team-a/chat-1", "team-b/chat.jsonl-1", "team-b/chat.json-1"]


def test_builtin_workloads_cover_every_category_with_a_heldout_split() -> None:
    main_split = load_builtin()
    heldout = load_builtin(heldout=True)
    for category in CATEGORIES:
        assert sum(p.category == category for p in main_split) >= 8, category
        assert sum(p.category == category for p in heldout) >= 2, category
    assert not {p.id for p in main_split} & {p.id for p in heldout}
    assert not {p.prompt for p in main_split if p.prompt} & {p.prompt for p in heldout if p.prompt}
    # Multi-turn chat carries earlier assistant turns; grounded categories carry their input.
    assert all(p.messages and any(r == "assistant" for r, _ in p.messages) for p in main_split if p.category == "chat")
    assert all(p.prompt and "```" in p.prompt for p in main_split if p.category == "code")
    assert all(p.prompt and len(p.prompt) > 300 for p in main_split if p.category in ("summarization", "qa"))
    assert [p.category for p in select(main_split, ["qa", "code"], 2)] == ["qa", "qa", "code", "code"]


def test_builtin_rejects_unknown_category() -> None:
    with pytest.raises(WorkloadError, match="unknown categories"):
        load_builtin(["poetry"])


# --- result arithmetic ---------------------------------------------------------------------


def test_first_divergence() -> None:
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 9, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2


def test_summary_uses_medians_ratios_and_vllm_acceptance() -> None:
    def gen(ids: tuple[int, ...], s: float, **kw: object) -> Generation:
        return Generation(ids, s, **kw)

    plain_runs = [gen((1, 2, 3, 4), s) for s in (2.0, 1.0, 9.0)]  # median 2.0 s
    ngram_runs = [gen((1, 2, 3, 4), s, drafts=2, draft_tokens=6, accepted_tokens=3, accepted_per_position=(2, 1, 0)) for s in (1.0, 0.5, 1.0)]
    hf_runs = [gen((1, 2, 7, 7), 4.0)]
    prompts = [
        prompt_result("plain", "p", "qa", 5, plain_runs, None),
        prompt_result("ngram", "p", "qa", 5, ngram_runs, (1, 2, 3, 4)),
        prompt_result("hf", "p", "qa", 5, hf_runs, (1, 2, 3, 4)),
    ]
    res = summarize({}, [("plain", "specsure", False), ("ngram", "specsure", True), ("hf", "transformers", False)], [], prompts, "plain")
    plain, ngram, hf = (res.row(c, ALL) for c in ("plain", "ngram", "hf"))
    assert plain.tokens_per_s == pytest.approx(2.0) and plain.speedup_vs_hf == pytest.approx(2.0)
    assert ngram.speedup_vs_plain == pytest.approx(2.0) and ngram.speedup_vs_hf == pytest.approx(4.0)
    assert ngram.mean_acceptance_length == pytest.approx(2.5)  # 1 + 3 / 2
    assert ngram.per_position_acceptance == pytest.approx([1.0, 0.5, 0.0])
    assert ngram.outputs_equal is True and ngram.exact_match_rate == 1.0
    assert hf.outputs_equal is False and hf.mismatches == [{"prompt_id": "p", "first_divergence": 2}]
    assert plain.exact_match_rate is None and plain.mean_acceptance_length is None
    assert [r.category for r in res.mismatched] == ["qa"]
    assert BenchResults.from_dict(json.loads(json.dumps(res.to_dict()))) == res



def test_each_row_reports_the_quartiles_of_its_per_prompt_ratios_to_plain() -> None:
    def result(config: str, prompt: str, category: str, seconds: float):
        return prompt_result(config, prompt, category, 5, [Generation((1, 2, 3, 4), seconds)],
                             None if config == "plain" else (1, 2, 3, 4))

    # ngram is 1x, 2x, 3x and 5x plain on four prompts; the row's ratio pools the times (8 / 2.98).
    prompts = [result("plain", f"p{i}", "qa" if i < 2 else "code", 1.0) for i in range(4)]
    prompts += [result("ngram", f"p{i}", "qa" if i < 2 else "code", 1.0 / r) for i, r in enumerate((1, 2, 3, 5))]
    res = summarize({}, [("plain", "specsure", False), ("ngram", "specsure", True)], [], prompts, "plain")
    assert res.row("ngram", ALL).prompt_speedups == pytest.approx([1.75, 2.5, 3.5])
    assert res.row("ngram", "qa").prompt_speedups == pytest.approx([1.25, 1.5, 1.75])
    assert res.row("plain", ALL).prompt_speedups is None
    cells = _md_tables(render_markdown(res))[(ALL, "ngram")]
    assert cells["per prompt vs plain (quartiles)"] == "1.75 / 2.50 / 3.50" and cells["new tokens"] == "16"


def test_a_row_that_drafted_nothing_shows_no_acceptance_length() -> None:
    """1.00 would read as 'drafted, none accepted'; nothing was drafted (ngram found no match)."""
    runs = [Generation((1, 2, 3), 1.0, drafts=0, draft_tokens=0, accepted_tokens=0, accepted_per_position=(0, 0))]
    prompts = [prompt_result("plain", "p", "qa", 5, [Generation((1, 2, 3), 1.0)], None),
               prompt_result("ngram", "p", "qa", 5, runs, (1, 2, 3))]
    res = summarize({}, [("plain", "specsure", False), ("ngram", "specsure", True)], [], prompts, "plain")
    assert res.row("ngram", ALL).mean_acceptance_length is None
    assert "| ngram |" in render_markdown(res)


def test_a_category_holding_a_pipe_keeps_its_table_cell() -> None:
    prompts = [prompt_result("plain", "p", "c|d", 5, [Generation((1, 2, 3), 1.0)], None)]
    report = render_markdown(summarize({}, [("plain", "specsure", False)], [], prompts, "plain"))
    lines = report.splitlines()
    row = next(line for line in lines if line.startswith("| c\\|d | plain |"))
    header = lines[lines.index(row) - 2]
    assert header.startswith("| category |") and row.replace("\\|", "").count("|") == header.count("|")


def test_repeats_that_differ_are_reported() -> None:
    runs = [Generation((1, 2, 3), 1.0), Generation((1, 2, 4), 1.0)]
    prompts = [prompt_result("plain", "p", "qa", 5, [Generation((1, 2, 3), 1.0)] * 2, None),
               prompt_result("ngram", "p", "qa", 5, runs, (1, 2, 3))]
    res = summarize({}, [("plain", "specsure", False), ("ngram", "specsure", True)], [], prompts, "plain")
    report = render_markdown(res)
    assert "## Repeats that differed" in report and "- **ngram** on p" in report and "**plain** on p" not in report


# --- end to end on a tiny model ------------------------------------------------------------


def _md_tables(text: str) -> dict[tuple[str, str], dict[str, str]]:
    """{(category, config): {column: cell}} from the two tables of results.md."""
    cells: dict[tuple[str, str], dict[str, str]] = {}
    header: list[str] = []
    for line in text.splitlines():
        if not line.startswith("|"):
            header = []
            continue
        parts = [c.strip() for c in line.strip("|").split("|")]
        if not header:
            header = parts
        elif not parts[0].startswith("---"):
            row = dict(zip(header, parts))
            cells[(row.get("category", ALL), row["config"])] = row
    return cells


def _fmt_ratio(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _record_drawings(monkeypatch: pytest.MonkeyPatch) -> dict[str, dict[str, Any]]:
    """{file name: what its figure plots} for every figure saved from now on, read from the artists."""
    from matplotlib.figure import Figure

    drawn: dict[str, dict[str, Any]] = {}
    savefig = Figure.savefig

    def record(fig: Figure, fname: Any, *args: Any, **kwargs: Any) -> None:
        savefig(fig, fname, *args, **kwargs)  # draws the figure, so tick labels are final
        (ax,) = fig.axes
        drawn[Path(fname).name] = {
            "ticks": [t.get_text() for t in ax.get_xticklabels()],
            "bars": {c.get_label(): [r.get_height() for r in c] for c in ax.containers},
            "lines": {line.get_label(): (list(line.get_xdata()), list(line.get_ydata()))
                      for line in ax.get_lines() if not line.get_label().startswith("_")},
        }

    monkeypatch.setattr(Figure, "savefig", record)
    return drawn


def test_tiny_end_to_end_outputs_agree(tiny_llama: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    rnd = random.Random(0)
    rows = []
    for category in ("summarization", "code"):
        for i in range(2):
            base = [rnd.randrange(3, 128) for _ in range(10)]
            rows.append({"id": f"{category}-{i}", "category": category, "prompt_ids": base + base + base[:4]})
    workload = _write(tmp_path, *rows)
    out = tmp_path / "out"
    k = 3
    drawn = _record_drawings(monkeypatch)
    code = main([
        "bench", "--model", str(tiny_llama), "--workload", str(workload), "--dtype", "float32",
        "--methods", "ngram,draft_model,eagle", "--baselines", "hf,hf-prompt-lookup,hf-assisted",
        "--draft-model", str(tiny_llama), "-k", str(k), "--max-tokens", "16", "--repeats", "2", "--out", str(out),
    ])
    printed = capsys.readouterr().out
    assert code == 0
    assert "skip eagle: no --eagle-head given" in printed

    data = json.loads((out / "results.json").read_text())
    res = BenchResults.from_dict(data)
    configs = ["plain", "ngram", "draft_model", "hf", "hf-prompt-lookup", "hf-assisted"]
    assert [c["name"] for c in res.configs] == configs
    assert res.skipped == [{"name": "eagle", "reason": "no --eagle-head given"}]
    assert res.meta["dtype"] == "float32" and res.meta["repeats"] == 2
    assert res.meta["forward"].startswith("native (fused q|k|v")  # which forward ran, as the model says
    assert "- forward: native (fused q|k|v" in (out / "results.md").read_text()

    # Every configuration x category has the figures the issue asks for.
    for config in configs:
        for category in ["summarization", "code", ALL]:
            row = res.row(config, category)
            assert row is not None and row.tokens_per_s > 0
            assert row.speedup_vs_plain is not None and row.speedup_vs_hf is not None
            # float32: every other configuration must reproduce plain greedy decoding exactly;
            # plain is the reference, the one configuration not compared.
            if config == "plain":
                assert row.outputs_equal is None and row.exact_match_rate is None
            else:
                assert row.outputs_equal is True and row.exact_match_rate == 1.0, (config, category, row.mismatches)
    assert res.row("plain").speedup_vs_plain == pytest.approx(1.0)
    assert res.row("draft_model").mean_acceptance_length > 1 + 0.5 * k  # draft = target accepts nearly all
    assert all(p.deterministic and len(p.seconds) == 2 for p in res.prompts)

    # results.md shows the same numbers as results.json.
    md = _md_tables((out / "results.md").read_text())
    for row in res.summary:
        cells = md[(row.category, row.config)]
        assert cells["tok/s"] == f"{row.tokens_per_s:.2f}"
        assert cells["vs plain"] == _fmt_ratio(row.speedup_vs_plain)
        assert cells["vs HF"] == _fmt_ratio(row.speedup_vs_hf)
        expected_len = "-" if row.mean_acceptance_length is None else f"{row.mean_acceptance_length:.2f}"
        assert cells["mean acc. len"] == expected_len

    # The PNGs plot the same numbers: bar heights and line points, read from the figures' artists.
    for name in ("speedup.png", "acceptance.png"):
        assert (out / name).read_bytes().startswith(b"\x89PNG\r\n\x1a\n"), name
    speedup, acceptance = drawn["speedup.png"], drawn["acceptance.png"]
    categories = ["summarization", "code", ALL]
    assert speedup["ticks"] == categories
    assert list(speedup["bars"]) == configs
    for config in configs:
        expected = [res.row(config, c).speedup_vs_plain for c in categories]
        assert speedup["bars"][config] == pytest.approx(expected), config
    assert set(acceptance["lines"]) == {"ngram", "draft_model"}
    for config, (positions, rates) in acceptance["lines"].items():
        assert positions == list(range(1, k + 1))
        assert rates == pytest.approx(res.row(config).per_position_acceptance), config


# --- suffix decoding in the bench ---------------------------------------------------------------

def test_repeated_edit_prompts_are_successive_edits_of_one_file() -> None:
    import difflib
    import re

    for heldout in (False, True):
        prompts = load_builtin(["repeated_edit"], heldout=heldout)
        files = [re.search(r"current version of (\S+):", p.prompt).group(1) for p in prompts]
        codes = [p.prompt.split("```python\n")[1].split("```")[0] for p in prompts]
        assert len(set(files)) < len(files)  # each file is edited again and again
        for file_a, file_b, code_a, code_b in zip(files, files[1:], codes, codes[1:]):
            if file_a == file_b:  # the next prompt holds the file with the previous edit applied
                same = difflib.SequenceMatcher(None, code_a, code_b, autojunk=False).ratio()
                assert code_a != code_b and same > 0.85
            compile(code_b, file_b, "exec")


def test_suffix_config_passes_only_the_suffix_keys_given() -> None:
    from specsure.bench.configs import METHODS, Settings, speculative_config

    assert "suffix" in METHODS
    settings = Settings(model=None, dtype="float32", num_speculative_tokens=8, prompt_lookup_max=4,
                        suffix_decoding_min_token_prob=0.2)
    assert speculative_config("suffix", settings) == {"method": "suffix", "num_speculative_tokens": 8,
                                                      "suffix_decoding_min_token_prob": 0.2}
    assert "suffix_decoding_min_token_prob" not in speculative_config("ngram", settings)


def test_each_timed_pass_starts_without_earlier_passes_history(tiny_llama: Path) -> None:
    from specsure import SamplingParams, make_engine
    from specsure.bench.harness import Item, run_interleaved
    from specsure.bench.runners import SpecsureRunner
    from specsure.bench.workload import Prompt

    engine = make_engine(str(tiny_llama), {"method": "suffix", "num_speculative_tokens": 4}, dtype="float32")
    items = [Item(Prompt(f"p{i}", "repeated_edit", prompt_ids=ids), ids, 24)
             for i, ids in enumerate(((5, 9, 14, 5, 9), (60, 61, 62, 63)))]
    runs = run_interleaved([SpecsureRunner("suffix", engine)], items, repeats=3)
    for item in items:
        passes = runs[("suffix", item.prompt.id)]
        # Every pass drafts from the same history (the prompts before it in this pass), so the
        # counters repeat; a pass that saw its own earlier answer would accept far more.
        assert len({(g.drafts, g.accepted_tokens) for g in passes}) == 1, passes
        assert len({g.token_ids for g in passes}) == 1
    # Without the clearing, the second run of a prompt drafts from its first run's answer.
    again = engine.generate([list(items[1].prompt_ids)], SamplingParams(max_tokens=24))[0]
    assert again.stats.accepted_tokens > runs[("suffix", "p1")][0].accepted_tokens


def test_batched_run_reports_throughput_and_agreement_with_batch_one(tiny_llama: Path, tmp_path: Path) -> None:
    rnd = random.Random(1)
    rows = []
    for i in range(5):
        base = [rnd.randrange(3, 128) for _ in range(6 + i)]
        rows.append({"id": f"code-{i}", "category": "code", "prompt_ids": base * 2 + base[:3], "max_tokens": 10 + i})
    out = tmp_path / "out"
    code = main(["bench", "--model", str(tiny_llama), "--workload", str(_write(tmp_path, *rows)), "--dtype", "float32",
                 "--methods", "ngram", "--baselines", "none", "-k", "3", "--repeats", "2", "--batched", "3",
                 "--out", str(out)])
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    ran = {c["name"]: c.get("speculative_config") for c in results["configs"]}  # what each row ran
    assert ran["plain"] is None and ran["ngram"]["method"] == "ngram" and ran["ngram"]["num_speculative_tokens"] == 3
    batched = results["meta"]["batched"]
    assert set(batched) == {"plain", "ngram"}
    for name, figures in batched.items():  # float32: batching changes no output
        assert figures["exact_match_rate"] == 1.0 and figures["mismatches"] == [] and figures["prompts"] == 5
        assert figures["max_num_seqs"] == 3 and figures["tokens_per_s"] > 0 and figures["speedup_vs_batch1"] > 0
        # "vs batch 1" is against the batch-1 table's median times (two repeats: their mean, not the slower).
        records = [p for p in results["prompts"] if p["config"] == name]
        batched_s = sum(p["new_tokens"] for p in records) / figures["tokens_per_s"]
        serial_s = sum(p["median_seconds"] for p in records)
        assert figures["speedup_vs_batch1"] == pytest.approx(serial_s / batched_s, rel=1e-9)
    assert "## Batched: every prompt at once, 3 sequences at a time" in (out / "results.md").read_text()


def test_results_name_the_commit_and_say_when_the_package_differs_from_it(tmp_path: Path) -> None:
    """A figure made with a head or module not yet committed must not claim the commit's code made it."""
    import subprocess

    from specsure.cli.bench_record import git_commit as _git_commit

    package = tmp_path / "src" / "specsure"
    package.mkdir(parents=True)
    (package / "head.txt").write_text("one")
    (tmp_path / "notes.txt").write_text("outside the package")

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "first")
    short = git("rev-parse", "--short", "HEAD")
    assert _git_commit(package) == short
    (tmp_path / "notes.txt").write_text("changed, but not the package")
    (package / "new.txt").write_text("untracked files are not the code that ran")
    assert _git_commit(package) == short
    (package / "head.txt").write_text("two")
    assert _git_commit(package) == f"{short} with uncommitted changes"
    assert _git_commit(tmp_path.parent) == "unknown"  # not a checkout


@pytest.mark.parametrize(("flags", "words"), [
    (["-k", "100", "--methods", "ngram"], "--num-speculative-tokens: num_speculative_tokens = 100 is out of range"),
    (["--suffix-max-spec-factor", "nan", "--methods", "suffix"], "--suffix-max-spec-factor:"),
    (["--token-tree", "[(0,", "--methods", "mtp-tree"], "--token-tree:"),
    (["--token-tree", "[(0,", "--methods", "eagle3-tree", "--eagle3-head", "/a/head"], "(method 'eagle3-tree')"),
    (["--token-tree", "[(0,", "--methods", "ngram"], "--token-tree:"),  # malformed, though no row selected reads it
    (["--methods", "mtp", "--mtp-head", "/no/such/head"], "--mtp-head '/no/such/head' (the mtp row): model (the draft"),
    (["--methods", "draft_model", "--draft-model", "/no/such/draft"], "--draft-model '/no/such/draft' (the draft_model"),
    (["--threads", "0"], "argument --threads: 0 must be at least 1"),
    (["--methods", "ngram", "--mtp-head", "/no/such/head"], "--mtp-head is given, but no selected row uses it"),
    (["--methods", "ngram", "--token-tree", "[(0,), (1,)]"], "--token-tree is given, but no selected row uses it"),
    (["--methods", ""], "--methods '' names nothing"),  # not a quiet run of plain decoding alone
    (["--methods", "plain,,ngram"], "--methods 'plain,,ngram' has an empty item"),
    (["--categories", ""], "--categories '' names nothing"),  # not every category
    (["--baselines", " , "], "or 'none' for no baseline"),
    (["--batched", "-1"], "argument --batched: -1 must be at least 0"),
    (["--out", "GOOD"], "cannot write results there"),
    (["--heldout"], "--heldout chooses the built-in held-out split"),
    (["--workload", "GOOD"], "is already used at"),
    (["--workload", "ALL"], "has category 'all'"),
    (["--methods", "eagle3"], "every method --methods asked for besides plain would be skipped (eagle3: no "),
    (["--methods", "plain", "--baselines", "llama.cpp", "--llama-cpp-python", "/no/such/python"],
     "every baseline --baselines asked for would be skipped (llama.cpp: "),
    (["--workload", "OOV"], "holds token id 999, outside the target's vocabulary [0, 128)"),
    (["--max-tokens", "600"], "exceed the model's context of 512 tokens"),
])
def test_bad_bench_input_is_one_error_before_any_timing(tiny_llama: Path, tmp_path: Path, capsys, flags: list[str],
                                                       words: str) -> None:
    """A value out of range is an error (exit 2), never a skipped row in a run that exits 0."""
    files = {}
    for name, row in (("GOOD", {"id": "a", "category": "code", "prompt_ids": [5, 6, 7]}),
                      ("ALL", {"id": "b", "category": "all", "prompt_ids": [5, 6]}),
                      ("OOV", {"id": "c", "category": "x", "prompt_ids": [5, 999]})):
        (tmp_path / name).mkdir()
        files[name] = str(_write(tmp_path / name, row))
    argv = ["bench", "--model", str(tiny_llama), "--dtype", "float32", "--baselines", "none", "--repeats", "1",
            "--warmup", "0", "--out", str(tmp_path / "out"), "--workload", files["GOOD"],
            *[files.get(f, f) for f in flags]]
    argv += [] if "--max-tokens" in flags else ["--max-tokens", "4"]
    try:
        code = main(argv)
    except SystemExit as stop:  # argparse's own refusal
        code = int(stop.code or 0)
    err = capsys.readouterr().err
    assert code == 2 and words in err and "Traceback" not in err, err
    assert "--out" in flags or not (tmp_path / "out").exists()  # no empty results folder left behind


def test_a_reader_that_leaves_early_loses_no_results(tiny_llama: Path, tmp_path: Path) -> None:
    """`specsure bench ... | head -1`: the run goes on quietly and writes its files, exit 0."""
    workload = _write(tmp_path, {"id": "a", "category": "code", "prompt_ids": [5, 6, 7, 5, 6]})
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "specsure", "bench", "--model", str(tiny_llama), "--workload",
                             str(workload), "--dtype", "float32", "--methods", "ngram", "--baselines", "none",
                             "--repeats", "1", "--warmup", "0", "--max-tokens", "4", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline()  # what head -1 reads before it leaves
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.wait(timeout=300)
    assert proc.returncode == 0 and "Traceback" not in err, err
    assert json.loads((out / "results.json").read_text())["meta"]["prompts"] == 1


def test_an_assisted_draft_of_another_vocabulary_is_skipped_with_why(tiny_llama: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from tiny import build_tiny_llama

    draft = build_tiny_llama(tmp_path / "draft64", vocab_size=64)
    rows = [{"id": "code-0", "category": "code", "prompt_ids": [5, 6, 7, 5, 6, 7], "max_tokens": 4}]
    out = tmp_path / "out"
    code = main(["bench", "--model", str(tiny_llama), "--workload", str(_write(tmp_path, *rows)), "--dtype", "float32",
                 "--methods", "plain", "--baselines", "hf,hf-assisted", "--draft-model", str(draft), "--repeats", "1",
                 "--warmup", "0", "--out", str(out)])
    assert code == 0  # the run goes on, as for a draft_model that make_engine refuses
    assert "skip hf-assisted: the draft" in capsys.readouterr().out
    results = json.loads((out / "results.json").read_text())
    assert [s["name"] for s in results["skipped"]] == ["hf-assisted"]
    assert {c["name"] for c in results["configs"]} == {"plain", "hf"}


def test_a_workload_that_is_not_utf8_names_its_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "latin.jsonl"
    path.write_bytes(b'{"id": "a", "category": "chat", "prompt": "ok"}\n{"id": "b", "prompt": "caf\xe9"}\n')
    with pytest.raises(WorkloadError, match=rf"{path}:2: not UTF-8 text \(byte 0xe9\)"):
        load_workload(path)


def test_a_category_no_workload_prompt_has_is_an_error(tiny_llama: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    rows = [{"id": "code-0", "category": "code", "prompt_ids": [5, 6, 7], "max_tokens": 2}]
    code = main(["bench", "--model", str(tiny_llama), "--workload", str(_write(tmp_path, *rows)),
                 "--categories", "code,cdoe", "--out", str(tmp_path / "out")])
    assert code == 2 and "--categories code,cdoe: no prompt of the --workload files has category 'cdoe'" in \
        capsys.readouterr().err


@pytest.mark.parametrize("stop_at", [1, 4])
def test_ctrl_c_keeps_the_prompts_every_configuration_finished(tiny_llama: Path, tmp_path: Path, capsys,
                                                               monkeypatch: pytest.MonkeyPatch, stop_at: int) -> None:
    """Ctrl-C in a long run writes what it measured, marked partial, and exits 130; before any prompt, nothing."""
    from specsure.bench import runners

    workload = _write(tmp_path, *({"id": f"p{i}", "category": "code", "prompt_ids": [5, 6, 7, 5, 6]} for i in range(3)))
    calls = []
    real = runners.SpecsureRunner.generate

    def generate(self, prompt_ids, max_tokens):  # type: ignore[no-untyped-def]
        calls.append(self.name)
        if len(calls) == stop_at:
            raise KeyboardInterrupt
        return real(self, prompt_ids, max_tokens)

    monkeypatch.setattr(runners.SpecsureRunner, "generate", generate)
    out = tmp_path / "out"
    code = main(["bench", "--model", str(tiny_llama), "--workload", str(workload), "--dtype", "float32",
                 "--methods", "plain,ngram", "--baselines", "none", "--repeats", "2", "--warmup", "0",
                 "--max-tokens", "4", "--out", str(out)])
    captured = capsys.readouterr()
    err = captured.err
    assert code == 130 and "Traceback" not in err, err
    assert "note: --warmup 0: each configuration's first timed run" in captured.out  # 2 repeats: said
    if stop_at == 1:  # nothing finished: nothing written, and no empty folder
        assert not out.exists()
        return
    results = json.loads((out / "results.json").read_text())
    assert "2 of 3 prompts" not in results["meta"]["interrupted"]
    assert "the 1 of 3 prompts" in results["meta"]["interrupted"] and "after 3 of 12 runs" in results["meta"]["interrupted"]
    assert "finished, 1 of the 2 repeats each" in results["meta"]["interrupted"]
    assert {p["prompt_id"] for p in results["prompts"]} == {"p0"}
    assert all(len(p["seconds"]) == 1 for p in results["prompts"])  # one repeat each, cut evenly
    assert "Partial results" in (out / "results.md").read_text()
    assert "interrupted:" in err



def test_ctrl_c_in_the_batched_pass_keeps_the_whole_batch_1_results(tiny_llama: Path, tmp_path: Path, capsys,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from specsure.cli import bench

    def stop(*_args, **_kwargs):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "run_batched", stop)
    workload = _write(tmp_path, *({"id": f"p{i}", "category": "code", "prompt_ids": [5, 6, 7, 5, 6]} for i in range(2)))
    out = tmp_path / "out"
    code = main(["bench", "--model", str(tiny_llama), "--workload", str(workload), "--dtype", "float32",
                 "--methods", "plain,ngram", "--baselines", "none", "--repeats", "1", "--warmup", "0",
                 "--max-tokens", "4", "--batched", "2", "--out", str(out)])
    assert code == 130, capsys.readouterr().err
    results = json.loads((out / "results.json").read_text())
    assert "in the batched pass; the batch-1 results are whole" in results["meta"]["interrupted"]
    assert "batched" not in results["meta"] and len(results["prompts"]) == 4


def test_a_share_never_rounds_to_whole_unless_it_is() -> None:
    from specsure.bench.report import share

    assert [share(r) for r in (1.0, 0.995, 0.9999, 0.5, 0.004, 0.0)] == ["100%", "99.5%", ">99.9%", "50%", "0.4%", "0%"]


def test_a_busy_machine_is_said_before_the_timings(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from specsure.cli.bench_record import other_load as _other_load

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (2.7, 2.0, 1.0))
    assert "load average is 2.7 on 2 cores" in (_other_load(2) or "")
    monkeypatch.setattr(os, "getloadavg", lambda: (0.2, 0.2, 0.2))
    assert _other_load(2) is None


@pytest.mark.parametrize(("lo", "hi", "expected"), [(None, None, (2, 5)), (None, 3, (3, 3)), (3, None, (3, 3)),
                                                     (1, 4, (1, 4))])
def test_the_prompt_lookup_baselines_match_the_ngrams_specsures_ngram_runs_with(lo, hi, expected):
    from specsure.bench.configs import Settings, build_transformers, lookup_max
    from specsure.config import resolve
    from specsure.config.lookup import lookup_range

    settings = Settings(model=None, dtype="float32", num_speculative_tokens=4, prompt_lookup_min=lo, prompt_lookup_max=hi)
    spec = {"method": "ngram", **({"prompt_lookup_min": lo} if lo else {}), **({"prompt_lookup_max": hi} if hi else {})}
    ran = resolve(spec).config
    assert lookup_range(lo, hi) == expected == (ran.prompt_lookup_min, ran.prompt_lookup_max)
    assert lookup_max(settings) == expected[1]
    runners, skipped = build_transformers(["hf-prompt-lookup"], settings, object(), frozenset(), None)
    assert skipped == []
    expected = expected[1]
    assert runners[0].generate_kwargs == {"prompt_lookup_num_tokens": 4, "max_matching_ngram_size": expected}


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6])
def test_interleaving_puts_each_configuration_at_every_position_and_after_every_other(n):
    from specsure.bench.harness import balanced_order

    cycle = n if n % 2 == 0 else 2 * n
    orders = [balanced_order(n, t) for t in range(cycle)]
    assert all(sorted(order) == list(range(n)) for order in orders)
    for position in range(n):
        assert sorted(order[position] for order in orders) == sorted(list(range(n)) * (cycle // n))
    follows = [(a, b) for order in orders for a, b in zip(order, order[1:])]
    pairs = [(a, b) for a in range(n) for b in range(n) if a != b]
    assert sorted(follows) == sorted(pairs * (cycle // n))


@pytest.mark.parametrize("n", range(3, 10))
def test_no_configuration_runs_twice_in_a_row_across_prompts(n):
    from specsure.bench.harness import balanced_order

    cycle = n if n % 2 == 0 else 2 * n
    flat = [c for t in range(2 * cycle) for c in balanced_order(n, t)]  # two cycles: the wrap counts too
    assert all(a != b for a, b in zip(flat, flat[1:]))
