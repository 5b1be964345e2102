"""Resident memory of an OpenAI-compatible server after it loaded its model and answered one request.

    .venv/bin/python bench/serve_memory.py -- .venv/bin/specsure serve --port {port}
    .venv/bin/python bench/serve_memory.py -- .venv-llamacpp/llama-server/build/bin/llama-server -m FILE --port {port}
    .venv/bin/python bench/serve_memory.py --completions -- .venv/bin/specsure serve --model FILE --port {port}

Starts the command ({port} is filled with a free port), waits until ``/v1/models`` answers, asks
one chat completion of 64 greedy tokens (``--completions``: a completion of token ids, for a model
with no chat template), then reads the process's VmRSS (resident now) and VmHWM
(the most it held, loading included) from /proc and stops it. Linux only. Not a test: a measurement
for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import time

import httpx


def status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of ``pid`` in MiB."""
    out = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) // 1024
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--completions", action="store_true",
                        help="ask /v1/completions with a prompt of token ids (a model without a chat template)")
    parser.add_argument("command", nargs="+")
    args = parser.parse_args()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [part.replace("{port}", str(port)) for part in args.command]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{command[0]} did not start (exit status {process.poll()})")
            try:
                if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        if args.completions:
            reply = httpx.post(f"{url}/v1/completions", timeout=120, json={
                "model": model, "prompt": [1, 50, 60, 70, 80, 90, 100, 110], "max_tokens": 64, "temperature": 0})
        else:
            reply = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
                "model": model, "messages": [{"role": "user", "content": "Why is the sky blue?"}],
                "max_tokens": 64, "temperature": 0})
        reply.raise_for_status()
        memory = status(process.pid)
        print(f"{os.path.basename(command[0])}: resident {memory['VmRSS']} MiB, at most {memory['VmHWM']} MiB "
              f"({reply.json()['usage']['completion_tokens']} tokens answered)")
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)


if __name__ == "__main__":
    main()
