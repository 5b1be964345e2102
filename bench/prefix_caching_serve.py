"""Several multi-turn chats at once through two running servers, one with prefix caching and one
without (docs/serving.md, "Continuous batching").

Each turn of every conversation is sent to both servers: all conversations' turn t go to one
server at once (streamed chat completions, greedy), then to the other, the order alternating by
turn; each conversation has its own system message (a part of specsure's docs/configuration.md),
and its answers are appended as the server with caching gave them (both servers must give the
same). Reported: the median time to first token per turn on each server, and the cached tokens.

    specsure serve --port 8301 --max-num-seqs 4 --no-enable-prefix-caching &
    specsure serve --port 8302 --max-num-seqs 4 &
    .venv/bin/python bench/prefix_caching_serve.py --off http://127.0.0.1:8301 --on http://127.0.0.1:8302
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

QUESTIONS = ("What is this part about?", "Which setting matters most here?", "Give one example.",
             "What would go wrong without it?")


def _ask(url: str, messages: list[dict], max_tokens: int) -> tuple[float, str, int]:
    """(time to first token, the answer, cached prompt tokens) of one streamed greedy chat request."""
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    start, first, text, cached = time.perf_counter(), None, "", 0
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as reply:
        for line in reply.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            for choice in chunk["choices"]:
                if choice["delta"].get("content"):
                    first = first or time.perf_counter() - start
                    text += choice["delta"]["content"]
            if chunk.get("usage"):
                cached = chunk["usage"]["prompt_tokens_details"]["cached_tokens"]
    return first or time.perf_counter() - start, text, cached


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--off", required=True, help="the server without prefix caching")
    parser.add_argument("--on", required=True, help="the server with prefix caching")
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--system-chars", type=int, default=2000)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--pause", type=float, default=2.0, help="seconds between the two servers' turns")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    doc = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text()
    talks = [[{"role": "system", "content": "Answer about this text.\n\n"
               + doc[i * args.system_chars: (i + 1) * args.system_chars]}] for i in range(args.conversations)]
    rows = []
    with ThreadPoolExecutor(args.conversations) as pool:
        for turn, question in enumerate(QUESTIONS):
            for talk in talks:
                talk.append({"role": "user", "content": question})
            order = ("off", "on") if turn % 2 == 0 else ("on", "off")
            got = {}
            for which in order:
                url = args.off if which == "off" else args.on
                got[which] = list(pool.map(lambda t: _ask(url, t, args.max_tokens), talks))
                time.sleep(args.pause)  # the other server's idle threads stop spinning first
            for i, talk in enumerate(talks):
                assert got["off"][i][1] == got["on"][i][1], f"turn {turn}, conversation {i}: the answers differ"
                talk.append({"role": "assistant", "content": got["on"][i][1]})
            row = {"turn": turn, **{f"ttft_{w}": statistics.median(r[0] for r in got[w]) for w in got},
                   "cached": [r[2] for r in got["on"]]}
            rows.append(row)
            print(f"turn {turn + 1}: first token off {row['ttft_off']:.3f} s, on {row['ttft_on']:.3f} s "
                  f"({row['ttft_off'] / row['ttft_on']:.2f}x); cached tokens {row['cached']}", flush=True)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "serve.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                         "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
