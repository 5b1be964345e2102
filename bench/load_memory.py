"""How much memory converting and loading a GGUF takes, tensor by tensor or as before, in fresh processes.

    .venv/bin/python bench/load_memory.py FILE.gguf [--repeats 2]

Each way runs three fresh processes: one converts the file into a scratch folder (`convert_gguf`),
one loads that folder as an engine does (`load_model(release_weights=True)`: every later use of the
file), and one does both (its first use). The C kernels come from the cache, built before. "before" turns off
both changes of the eleventh session of 2026-12-07: the conversion goes through transformers' reader
(every tensor de-quantised at once, then copied into the model) and the load drops nothing before
aligning and fusing (`early_blocks.drop_matched`). A thread samples the process's anonymous memory
every 10 ms (`RssAnon`: what the process itself holds, its runtime of about 250 MiB included; the
file pages it maps are the kernel's to drop and are left out) and reports each process's peak, its
seconds, and what stays resident after a load.
The two ways alternate run by run. Not a test: a measurement for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r'''
import json, sys, threading, time
from pathlib import Path
peak = [0]
def anon():
    with open("/proc/self/status") as fh:
        return int(fh.read().split("RssAnon:")[1].split()[0]) // 1024
def watch():
    while True:
        peak[0] = max(peak[0], anon())
        time.sleep(0.01)
threading.Thread(target=watch, daemon=True).start()
from specsure.models import gguf_conversion, loading
from specsure.models.gguf_cache import convert_gguf
gguf, way, folder, phase = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]) / "converted", sys.argv[4]
if way == "before":
    gguf_conversion.streams = lambda _architecture: False
    loading.drop_matched = lambda *_args: 0
found = {"runtime_mib": anon()}
started = time.perf_counter()
if phase in ("convert", "both"):
    convert_gguf(gguf, folder)
    found["shards"] = len(list(folder.glob("*.safetensors")))
    model = None
if phase != "convert":
    model = loading.load_model(str(folder), dtype="float32", release_weights=True)  # its marker names the GGUF
found["s"] = round(time.perf_counter() - started, 1)
time.sleep(0.05)
found["peak_mib"], found["resident_mib"] = peak[0], anon()
print(json.dumps(found))
'''


def run(gguf: Path, way: str) -> dict[str, dict[str, float]]:
    """Converting ``gguf`` ``way`` ("now" or "before") in one fresh process, then loading the result in
    another, and converting and loading in one (a file's first use): each phase's figures."""
    found = {}
    with tempfile.TemporaryDirectory(dir=gguf.parent) as scratch:  # the conversions' folders, removed after
        for phase in ("convert", "load"):
            found[phase] = _child(gguf, way, scratch, phase)
    with tempfile.TemporaryDirectory(dir=gguf.parent) as scratch:
        found["first use"] = _child(gguf, way, scratch, "both")
    return found


def _child(gguf: Path, way: str, scratch: str, phase: str) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", CHILD, str(gguf), way, scratch, phase], capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the {way} {phase} run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("gguf", type=Path)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    print("| way | convert: peak MiB, s | load: peak MiB, s, resident after | both in one process: peak MiB, s | "
          "shards |")
    print("|---|---|---|---|---|")
    for repeat in range(args.repeats):
        for way in (("now", "before") if repeat % 2 == 0 else ("before", "now")):
            f = run(args.gguf.resolve(), way)
            c, lo, b = f["convert"], f["load"], f["first use"]
            print(f"| {way} | {c['peak_mib']:,}, {c['s']} | {lo['peak_mib']:,}, {lo['s']}, {lo['resident_mib']:,} | "
                  f"{b['peak_mib']:,}, {b['s']} | {c['shards']} |", flush=True)


if __name__ == "__main__":
    main()
