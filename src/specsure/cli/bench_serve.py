"""`specsure bench serve`: throughput and latency of running servers at concurrency 1, 2, 4, 8 and 16."""

from __future__ import annotations

import argparse
import datetime
import json
import math
import shlex
import sys
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specsure.bench.workload import CATEGORIES, Prompt, WorkloadError, category_list, load_builtin, load_workloads, select
from specsure.cli.common import EXIT_FAIL, EXIT_OK, EXIT_USAGE, api_key_from, writable_folder
from specsure.cli.guard import results_run

if TYPE_CHECKING:
    from specsure.bench.load import Level, Request

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_CONCURRENCY = "1,2,4,8,16"
SHOWN_ERRORS = 5
"""Distinct errors printed per level; serve.json and serve.md keep them all."""


def add_parser(modes: argparse._SubParsersAction) -> None:
    parser = modes.add_parser(
        "serve", help="load running OpenAI-compatible servers at several concurrencies (like vllm bench serve)",
        description="Streams greedy requests of a fixed length (ignore_eos) at each concurrency; reports aggregate "
                    "output tokens/s, requests/s, time to first token and inter-token latency (p50, p99). Several "
                    "--url servers run level by level, interleaved.")
    parser.add_argument("--url", action="append", default=None, metavar="[LABEL=]URL",
                        help=f"a running server's base URL, optionally labelled (plain=http://127.0.0.1:8001); "
                             f"repeatable (default {DEFAULT_URL})")
    parser.add_argument("--api-key", default=None, metavar="KEY",
                        help="sent as 'Authorization: Bearer KEY' (default: $SPECSURE_API_KEY, else none)")
    parser.add_argument("--endpoint", default="chat", choices=("chat", "completions"),
                        help="chat: /v1/chat/completions, a prompt as one user turn and a conversation whole "
                             "(default); completions: /v1/completions with the prompt text or token ids")
    parser.add_argument("--concurrency", default=DEFAULT_CONCURRENCY,
                        help=f"comma list of concurrency levels (default {DEFAULT_CONCURRENCY})")
    parser.add_argument("--num-prompts", type=int, default=None, metavar="N",
                        help="requests per level (default: 2 x concurrency, at least 8)")
    parser.add_argument("--max-tokens", type=int, default=128,
                        help="output tokens per request, unless its workload row sets max_tokens (default 128)")
    parser.add_argument("--categories", default=None,
                        help=f"built-in prompt categories to cycle through (default: all of {', '.join(CATEGORIES)})")
    parser.add_argument("--workload", action="append", default=None, metavar="FILE.jsonl",
                        help="your own prompts instead (bench/README.md schema; rows the endpoint cannot take "
                             "are skipped with a warning); repeatable")
    parser.add_argument("--warmup", type=int, default=1, help="untimed requests per server first (default 1)")
    parser.add_argument("--pause", type=float, default=2.0, metavar="SECONDS",
                        help="seconds between two servers' runs of a level, so the one before has gone idle "
                             "(default 2; with several --url)")
    parser.add_argument("--out", default="bench/serve", help="output folder (default bench/serve)")
    parser.set_defaults(run=run)


def _no_bench_flags(words: list[str]) -> None:
    """`specsure bench`'s own options given before `serve` would be dropped without a word: refuse them."""
    if "bench" not in words:
        return
    start = words.index("bench")
    if "serve" not in words[start:]:
        return
    flags = [w for w in words[start + 1:words.index("serve", start)] if w.startswith("-")]
    if flags:
        raise ValueError(f"{', '.join(flags)}: options of `specsure bench`, given before `serve`, which `specsure "
                         "bench serve` does not read; give its own options after `serve` (specsure bench serve "
                         "--help), or drop these.")


def _servers(urls: list[str] | None):
    from specsure.bench.load import Server

    servers = []
    for i, text in enumerate(urls or [DEFAULT_URL]):
        label, sep, url = text.partition("=")
        if not sep:
            label, url = f"server{i + 1}" if urls and len(urls) > 1 else "server", text
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"--url {text!r}: the URL must start with http:// or https:// (for example "
                             f"{DEFAULT_URL}), optionally after a label and '='.")
        if sep and not label.strip():
            raise ValueError(f"--url {text!r}: the label before '=' is empty; give LABEL=URL, or the URL alone.")
        try:
            parts = urllib.parse.urlsplit(url)
            port = parts.port  # raises for a port outside 0..65535
        except ValueError as err:
            raise ValueError(f"--url {text!r}: {err}; give a URL such as {DEFAULT_URL}.") from None
        if not parts.hostname or port == 0:
            raise ValueError(f"--url {text!r} names no host and port to reach; give a URL such as {DEFAULT_URL}.")
        servers.append(Server(label.strip(), url.rstrip("/").removesuffix("/v1")))
    labels = [s.label for s in servers]
    if len(set(labels)) != len(labels):
        raise ValueError(f"--url labels {labels} repeat; give each server its own LABEL=URL.")
    return servers


def _levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        levels = []
    if not levels or any(c < 1 for c in levels):
        raise ValueError(f"--concurrency {text!r} must be a comma list of integers >= 1, such as {DEFAULT_CONCURRENCY}.")
    if len(set(levels)) < len(levels):  # a level twice would be two rows of one name, each compared with the other
        twice = sorted({c for c in levels if levels.count(c) > 1})
        raise ValueError(f"--concurrency {text!r} gives {', '.join(map(str, twice))} twice; give each level once "
                         "(--num-prompts sets how many requests each runs).")
    return levels


def _prompts(args: argparse.Namespace, endpoint: str) -> list[Request]:
    categories = category_list(args.categories)
    rows = load_workloads(args.workload) if args.workload else load_builtin(
        categories or CATEGORIES)
    if args.workload and categories and (unknown := sorted(set(categories) - {r.category for r in rows})):
        raise WorkloadError(f"--categories {args.categories}: no prompt of the --workload files has category "
                            f"{', '.join(map(repr, unknown))}; they have {sorted({r.category for r in rows})}.")
    requests, skipped = [], []
    for row in select(rows, categories, None):
        request = _request(row, endpoint == "chat/completions")
        if request is None:
            skipped.append(row)
        else:
            requests.append(request)
    if skipped:
        # Warned, not refused: the built-in workloads mix conversations and plain prompts.
        print(f"warning: {_skip_reason(endpoint, skipped)}", file=sys.stderr)
    if not requests:
        raise WorkloadError(f"no prompts that /v1/{endpoint} can take; check --categories, --workload or --endpoint.")
    return requests


def _request(row: Prompt, chat: bool) -> Request | None:
    """The row as the endpoint takes it, or None: the chat endpoint applies the server's chat template and
    takes no token ids; the completions endpoint sends text or token ids as they are, with no template."""
    from specsure.bench.load import Request

    if row.messages is not None:
        return Request(messages=row.messages, max_tokens=row.max_tokens) if chat else None
    if row.prompt_ids is not None:
        return None if chat else Request(prompt=row.prompt_ids, max_tokens=row.max_tokens)
    if chat:
        return Request(messages=(("user", row.prompt),), max_tokens=row.max_tokens)
    return Request(prompt=row.prompt, max_tokens=row.max_tokens)


def _skip_reason(endpoint: str, skipped: list[Prompt]) -> str:
    where = f"{len(skipped)} row(s), the first at {skipped[0].source}"
    if endpoint == "chat/completions":
        return (f"/v1/{endpoint} takes no token ids: skipping {where} (prompt_ids); send them with "
                "--endpoint completions")
    return f"/v1/{endpoint} applies no chat template: skipping {where} (messages); send them with --endpoint chat"


def run(args: argparse.Namespace) -> int:
    from specsure.bench.load import LoadError

    try:
        with results_run(args.out):
            return _run(args)
    except (LoadError, ValueError) as err:
        print(f"specsure bench serve: error: {err}", file=sys.stderr)
        return EXIT_USAGE


def _run(args: argparse.Namespace) -> int:
    from specsure.bench.load import LoadInterrupted, run as run_load

    _no_bench_flags(getattr(args, "argv", []))
    servers = _servers(args.url)
    levels = _levels(args.concurrency)
    for flag, value in (("--num-prompts", args.num_prompts), ("--max-tokens", args.max_tokens)):
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be a positive integer, got {value}.")
    if args.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {args.warmup}.")
    if not 0 <= args.pause < math.inf:
        raise ValueError(f"--pause must be a finite number of seconds >= 0, got {args.pause}.")
    endpoint = "chat/completions" if args.endpoint == "chat" else "completions"
    prompts = _prompts(args, endpoint)
    requests = [args.num_prompts or max(8, 2 * c) for c in levels]
    out = writable_folder("--out", args.out)
    if (out / "serve.json").exists():
        print(f"note: {out} holds an earlier run's results; this run's replace them when it ends", flush=True)
    own = sum(p.max_tokens is not None for p in prompts)
    print(f"{len(servers)} server(s) x concurrency {levels}, {args.max_tokens} tokens per request"
          f"{f' ({own} of {len(prompts)} prompts set their own)' if own else ''}, /v1/{endpoint}", flush=True)
    api_key = api_key_from(args.api_key)  # as specsure serve reads it
    stopped = None
    try:
        results = run_load(servers, endpoint, prompts, levels, requests, args.max_tokens, api_key, args.warmup,
                           _progress, args.pause)
    except LoadInterrupted as stop:
        if not stop.levels:
            raise
        results = stop.levels
        stopped = (f"stopped by Ctrl-C after {stop.done} of {stop.total} concurrency levels; these results hold "
                   "the levels every server finished")
    settings = {"servers": {s.label: _shown_url(s.url) for s in servers}, "endpoint": endpoint,
                "concurrency": levels, "requests": requests, "max_tokens": args.max_tokens, "warmup": args.warmup,
                "pause_s": args.pause, "command": _shown_command(getattr(args, "argv", None) or sys.argv[1:]),
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    if stopped is not None:
        settings["interrupted"] = stopped
    _write(out, results, settings)
    if stopped is not None:
        print(f"interrupted: {stopped}.", file=sys.stderr)
        return 130
    failed, sent = sum(level.failed for level in results), sum(level.requests for level in results)
    if failed:
        others = "no request succeeded, so there are no figures" if failed == sent else "the figures count only the others"
        print(f"specsure bench serve: {failed} of {sent} requests failed ({others}); their errors are listed above and "
              f"in {out}/serve.md", file=sys.stderr)
    return EXIT_FAIL if failed else EXIT_OK


def _shown_command(argv: list[str]) -> str:
    """The command line for serve.json, its API key and any URL password left out: the results
    folder sits in a repository by default, and gets committed and shared. ``argv``: the words as
    main read them (vLLM's ``--api_key`` already spelled ``--api-key``)."""
    if argv[:2] != ["bench", "serve"]:
        return ""
    words, hide = [], False
    for word in argv:
        flag, eq, value = word.partition("=")
        if hide:
            words.append("***")
            hide = False
        elif word == "--api-key":
            words.append(word)
            hide = True
        elif eq and flag == "--api-key":
            words.append("--api-key=***")
        elif eq and flag == "--url":
            words.append(f"--url={_shown_url(value)}")
        else:
            words.append(_shown_url(word))
    return shlex.join(["specsure", *words])


def _shown_url(text: str) -> str:
    """``text`` with the password of a URL in it (``http://user:secret@host``) replaced by ***."""
    label, sep, url = text.partition("=")  # LABEL=URL, as --url takes it
    if not sep or "://" in label or "://" not in url:
        label, sep, url = "", "", text
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return text
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return label + sep + urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def _write(out: Path, results: list[Level], settings: dict[str, Any]) -> None:
    from specsure.bench.load import render_markdown, to_json
    from specsure.bench.plots import plot_load

    # allow_nan=False: serve.json stays strict JSON, which jq and JavaScript can read.
    (out / "serve.json").write_text(json.dumps(to_json(results, settings), indent=2, allow_nan=False) + "\n",
                                    encoding="utf-8")
    table = render_markdown(results)
    if settings.get("interrupted"):
        table = f"**Partial results:** {settings['interrupted']}.\n\n" + table
    (out / "serve.md").write_text(table, encoding="utf-8")
    plot_load(results, out / "serve.png")
    print("\n" + table + f"\nwrote {out}/serve.json, serve.md, serve.png")


def _progress(level: Level) -> None:
    """A level's line as soon as it is measured; its distinct errors (the first few) on stderr."""
    from specsure.bench.load import error_lines, ms

    print(f"  {level.label:<12} c={level.concurrency:<3} {level.tokens_per_s:8.1f} tok/s  "
          f"{level.requests_per_s:6.2f} req/s  TTFT p50 {ms(level.ttft_p50_s):>6} ms  "
          f"ITL p99 {ms(level.itl_p99_s):>6} ms  failed {level.failed}", flush=True)
    lines = error_lines(level)
    for line in lines[:SHOWN_ERRORS]:
        print(f"    {level.label} c={level.concurrency} failed: {line}", file=sys.stderr, flush=True)
    if len(lines) > SHOWN_ERRORS:
        print(f"    ... and {len(lines) - SHOWN_ERRORS} more distinct errors (serve.md)", file=sys.stderr, flush=True)
