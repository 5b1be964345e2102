"""The llama-server baselines against a stand-in server: its command line, requests, timing and counters.

The real llama-server runs in `tests/llamacpp` (it needs `make llama-server`); here a small Python
HTTP server answers as llama-server does, so the runner's own logic is checked everywhere.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from specsure.bench.generation import Generation
from specsure.bench.llamacpp.baselines import LlamaCppSetup, add_llama_servers
from specsure.bench.llamacpp.runner import LlamaCppError
from specsure.bench.llamacpp.server import LlamaServer, build_llama_servers

STAND_IN = '''#!{python}
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
args = sys.argv[1:]
log = open({log!r}, "a")
log.write(json.dumps({{"argv": args}}) + "\\n"); log.flush()
{before}
lookup = "--spec-type" in args
done = 0
class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def answer(self, body, kind="application/json"):
        data = body.encode()
        self.send_response(200); self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data))); self.end_headers(); self.wfile.write(data)
    def do_GET(self):
        if self.path == "/health":
            self.answer('{{"status": "ok"}}')
        elif self.path == "/metrics":
            lines = ["# HELP llamacpp:spec_decode_num_drafts_total steps"]
            for name, per in (("drafts", 3), ("draft_tokens", 12), ("accepted_tokens", 5)):
                lines.append(f"llamacpp:spec_decode_num_{{name}}_total {{float(per * done * lookup)}}")
            if lookup and done:
                for position, per in enumerate((3, 2)):
                    lines.append(f'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{{{position="{{position}}"}}}} {{per * done}}')
            self.answer("\\n".join(lines) + "\\n", "text/plain")
    def do_POST(self):
        global done
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        log.write(json.dumps({{"request": body}}) + "\\n"); log.flush()
        done += 1
        self.answer(json.dumps({{"tokens": [7, 8, 9, 2], "timings": {{"prompt_ms": 12.5, "predicted_ms": 30.0}}}}))
HTTPServer(("127.0.0.1", int(args[args.index("--port") + 1])), Handler).serve_forever()
'''


def stand_in(tmp_path: Path, before: str = "") -> tuple[str, Path]:
    log = tmp_path / "calls.jsonl"
    binary = tmp_path / "llama-server"
    binary.write_text(STAND_IN.format(python=sys.executable, log=str(log), before=before))
    binary.chmod(0o755)
    return str(binary), log


def test_each_configuration_is_a_server_on_the_file_with_its_flags_and_greedy_requests(tmp_path):
    binary, log = stand_in(tmp_path)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    runners = build_llama_servers(["llama-server", "llama-server-lookup"], binary=binary, source=gguf,
                                  k=4, lookup_n=3, n_threads=2, n_ctx=300, eos_ids=frozenset({2}))
    try:
        plain, lookup = runners
        assert (plain.plain, lookup.plain, plain.speculative, lookup.speculative) == (None, "llama-server", False, True)
        assert plain.generate([1, 2, 3], 16) == Generation((7, 8, 9), 0.0425)  # the EOS dropped; the server's own ms
        assert lookup.generate([4, 5], 8) == Generation((7, 8, 9), 0.0425, drafts=3, draft_tokens=12, accepted_tokens=5,
                                                        accepted_per_position=(3, 2))
        assert lookup.generate([4, 5], 8).accepted_per_position == (3, 2)  # counted from the counters before it
    finally:
        for runner in runners:
            runner.server.close()
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    argvs = [c["argv"] for c in calls if "argv" in c]
    for argv in argvs:
        assert argv[argv.index("-m") + 1] == str(gguf) and argv[argv.index("-c") + 1] == "300"
        assert argv[argv.index("-t") + 1] == argv[argv.index("-tb") + 1] == "2" and argv[argv.index("-np") + 1] == "1"
    assert "--spec-type" not in argvs[0]
    assert argvs[1][argvs[1].index("--spec-type"):][:6] == ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n",
                                                          "3", "--spec-ngram-simple-size-m", "4"]
    requests = [c["request"] for c in calls if "request" in c]
    assert requests[0] == {"prompt": [1, 2, 3], "n_predict": 16, "temperature": 0.0, "cache_prompt": False,
                           "return_tokens": True}
    assert " ".join(argvs[1]) in " ".join(runners[1].server.command)


def test_a_missing_binary_names_the_make_target(tmp_path):
    with pytest.raises(LlamaCppError, match="make llama-server"):
        LlamaServer(str(tmp_path / "nowhere"), tmp_path / "m.gguf", [], 1, 64)


def test_a_server_that_dies_at_start_is_named_with_its_output(tmp_path):
    binary, _ = stand_in(tmp_path, before='print("error: failed to load model", flush=True); sys.exit(1)')
    with pytest.raises(LlamaCppError, match=r"(?s)exited starting \(exit 1\).*failed to load model"):
        LlamaServer(binary, tmp_path / "m.gguf", [], 1, 64)


def test_a_server_that_dies_between_requests_is_named_not_a_traceback(tmp_path):
    binary, _ = stand_in(tmp_path)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    (runner,) = build_llama_servers(["llama-server-lookup"], binary=binary, source=gguf, k=4, lookup_n=2,
                                    n_threads=1, n_ctx=64, eos_ids=frozenset())
    try:
        runner.server._process.kill()
        with pytest.raises(LlamaCppError, match="exited reporting its counters"):
            runner.generate([1, 2], 4)
    finally:
        runner.server.close()


def test_a_target_that_is_not_gguf_skips_the_servers_with_the_reason(tmp_path):
    binary, _ = stand_in(tmp_path)
    setup = LlamaCppSetup()
    add_llama_servers(setup, ["llama-server", "llama-server-lookup"], binary=binary, model=str(tmp_path), k=4,
                      lookup_n=2, n_threads=1, n_ctx=64, eos_ids=frozenset())
    assert [name for name, _ in setup.skipped] == ["llama-server", "llama-server-lookup"]
    assert all("GGUF" in reason for _, reason in setup.skipped) and setup.runners == []


@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")
def test_no_server_outlives_a_bench_that_is_killed(tmp_path):
    # The server runs in a session of its own (a Ctrl-C reaches the bench alone), so only the
    # parent-death signal stops it when the bench dies without cleaning up: a kill, `timeout`.
    import os
    import signal
    import subprocess
    import time

    binary, _ = stand_in(tmp_path)
    pid_file = tmp_path / "server.pid"
    parent = subprocess.Popen([sys.executable, "-c", f"""
import pathlib, time
from specsure.bench.llamacpp.server import LlamaServer
server = LlamaServer({binary!r}, pathlib.Path({str(tmp_path / "m.gguf")!r}), [], 1, 64)
pathlib.Path({str(pid_file)!r}).write_text(str(server._process.pid))
time.sleep(60)
"""])
    try:
        deadline = time.monotonic() + 30
        while not pid_file.exists() or not pid_file.read_text():
            assert parent.poll() is None and time.monotonic() < deadline, "the stand-in server did not start"
            time.sleep(0.1)
        server_pid = int(pid_file.read_text())
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(server_pid, 0)
            except ProcessLookupError:
                return
            # reaped by init once it exits; a zombie still answers kill(0), so read its state
            state = Path(f"/proc/{server_pid}/stat").read_text().split(")")[-1].split()[0] \
                if Path(f"/proc/{server_pid}/stat").exists() else "X"
            if state in ("Z", "X"):
                return
            time.sleep(0.1)
        os.kill(server_pid, signal.SIGKILL)
        pytest.fail("the server outlived its killed parent")
    finally:
        if parent.poll() is None:
            parent.kill()
