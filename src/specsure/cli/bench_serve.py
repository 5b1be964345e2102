"""`specsure bench serve`: throughput and latency of running servers at concurrency 1, 2, 4, 8 and 16."""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys

from specsure.bench.workload import CATEGORIES, WorkloadError, load_builtin, load_workload, select
from specsure.cli.common import writable_folder

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_CONCURRENCY = "1,2,4,8,16"


def add_parser(modes: argparse._SubParsersAction) -> None:
    parser = modes.add_parser(
        "serve", help="load running OpenAI-compatible servers at several concurrencies (like vllm bench serve)",
        description="Streams greedy requests of a fixed length (ignore_eos) at each concurrency; reports aggregate "
                    "output tokens/s, requests/s, time to first token and inter-token latency (p50, p99). Several "
                    "--url servers run level by level, interleaved.")
    parser.add_argument("--url", action="append", default=None, metavar="[LABEL=]URL",
                        help=f"a running server's base URL, optionally labelled (plain=http://127.0.0.1:8001); "
                             f"repeatable (default {DEFAULT_URL})")
    parser.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    parser.add_argument("--endpoint", default="chat", choices=("chat", "completions"),
                        help="chat: /v1/chat/completions with the prompt as one user turn (default); "
                             "completions: /v1/completions with the prompt text")
    parser.add_argument("--concurrency", default=DEFAULT_CONCURRENCY,
                        help=f"comma list of concurrency levels (default {DEFAULT_CONCURRENCY})")
    parser.add_argument("--num-prompts", type=int, default=None, metavar="N",
                        help="requests per level (default: 2 x concurrency, at least 8)")
    parser.add_argument("--max-tokens", type=int, default=128, help="output tokens per request (default 128)")
    parser.add_argument("--categories", default=None,
                        help=f"built-in prompt categories to cycle through (default: all of {', '.join(CATEGORIES)})")
    parser.add_argument("--workload", action="append", default=None, metavar="FILE.jsonl",
                        help="your own prompts instead (bench/README.md schema; text prompts only); repeatable")
    parser.add_argument("--warmup", type=int, default=1, help="untimed requests per server first (default 1)")
    parser.add_argument("--out", default="bench/serve", help="output folder (default bench/serve)")
    parser.set_defaults(run=run)


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
    return levels


def _prompts(args: argparse.Namespace) -> list[str]:
    categories = [c.strip() for c in args.categories.split(",") if c.strip()] if args.categories else None
    rows = [p for path in args.workload for p in load_workload(path)] if args.workload else load_builtin(
        categories or CATEGORIES)
    texts = []
    for row in select(rows, categories, None):
        if row.prompt is not None:
            texts.append(row.prompt)
        elif row.messages is not None:
            texts.append(row.messages[-1][1])
    if not texts:
        raise WorkloadError("no text prompts to send (token-id prompts cannot go through the chat endpoint); "
                            "check --categories or --workload.")
    return texts


def run(args: argparse.Namespace) -> int:
    from specsure.bench.load import LoadError

    try:
        return _run(args)
    except (LoadError, ValueError) as err:
        print(f"specsure bench serve: error: {err}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    from specsure.bench.load import render_markdown, run as run_load, to_json
    from specsure.bench.plots import plot_load

    servers = _servers(args.url)
    levels = _levels(args.concurrency)
    for flag, value in (("--num-prompts", args.num_prompts), ("--max-tokens", args.max_tokens)):
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be a positive integer, got {value}.")
    if args.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {args.warmup}.")
    prompts = _prompts(args)
    requests = [args.num_prompts or max(8, 2 * c) for c in levels]
    endpoint = "chat/completions" if args.endpoint == "chat" else "completions"
    out = writable_folder("--out", args.out)
    print(f"{len(servers)} server(s) x concurrency {levels}, {args.max_tokens} tokens per request, "
          f"/v1/{endpoint}", flush=True)

    def progress(level) -> None:  # noqa: ANN001 - a Level
        print(f"  {level.label:<12} c={level.concurrency:<3} {level.tokens_per_s:8.1f} tok/s  "
              f"{level.requests_per_s:6.2f} req/s  TTFT p50 {1e3 * level.ttft_p50_s:6.0f} ms  "
              f"ITL p99 {1e3 * level.itl_p99_s:6.0f} ms  failed {level.failed}", flush=True)

    results = run_load(servers, endpoint, prompts, levels, requests, args.max_tokens, args.api_key, args.warmup,
                       progress)
    settings = {"servers": {s.label: s.url for s in servers}, "endpoint": endpoint, "concurrency": levels,
                "requests": requests, "max_tokens": args.max_tokens, "warmup": args.warmup,
                "command": shlex.join(["specsure", *sys.argv[1:]]) if sys.argv[1:3] == ["bench", "serve"] else "",
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    (out / "serve.json").write_text(json.dumps(to_json(results, settings), indent=2) + "\n", encoding="utf-8")
    table = render_markdown(results)
    (out / "serve.md").write_text(table, encoding="utf-8")
    plot_load(results, out / "serve.png")
    print("\n" + table + f"\nwrote {out}/serve.json, serve.md, serve.png")
    return 1 if any(level.failed for level in results) else 0
