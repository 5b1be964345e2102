"""How much memory converting and loading a GGUF takes, tensor by tensor or as before, in fresh processes.

    .venv/bin/python bench/load_memory.py FILE.gguf [--repeats 2]

Each run is its own process: it converts the file into a scratch folder (`convert_gguf`) and loads
that folder as an engine does (`load_model(release_weights=True)`; the C kernels come from the cache,
built before). "before" turns off
both changes of the eleventh session of 2026-12-07: the conversion goes through transformers' reader
(every tensor de-quantised at once, then copied into the model) and the load drops nothing before
aligning and fusing (`early_blocks.drop_matched`). A thread samples the process's anonymous memory
every 10 ms (`RssAnon`: what the process itself holds; the file pages it maps are the kernel's to drop
and are left out) and reports each phase's peak, its seconds, and what stays resident after the load.
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
import json, os, sys, threading, time
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
if sys.argv[2] == "before":
    gguf_conversion.streams = lambda _architecture: False
    loading.drop_matched = lambda *_args: 0
from specsure.models.gguf_cache import convert_gguf
found = {"runtime_mib": anon()}
peak[0] = 0
started = time.perf_counter()
folder = convert_gguf(Path(sys.argv[1]), Path(sys.argv[3]) / "converted")
found["convert_s"], found["convert_peak_mib"] = round(time.perf_counter() - started, 1), peak[0]
peak[0] = anon()
started = time.perf_counter()
model = loading.load_model(str(folder), dtype="float32", release_weights=True)  # its marker names the GGUF
time.sleep(0.05)
found["load_s"], found["load_peak_mib"], found["resident_mib"] = round(time.perf_counter() - started, 1), peak[0], anon()
found["shards"] = len(list(folder.glob("*.safetensors")))
print(json.dumps(found))
'''


def run(gguf: Path, way: str) -> dict[str, float]:
    """One fresh process converting and loading ``gguf`` ``way`` ("now" or "before")."""
    with tempfile.TemporaryDirectory(dir=gguf.parent) as scratch:  # the conversion's folder, removed after
        done = subprocess.run([sys.executable, "-c", CHILD, str(gguf), way, scratch], capture_output=True, text=True,
                              check=False)
    if done.returncode != 0:
        raise SystemExit(f"the {way} run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("gguf", type=Path)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    print("| way | runtime MiB | convert: peak MiB, s | load: peak MiB, s | resident after | shards |")
    print("|---|---|---|---|---|---|")
    for repeat in range(args.repeats):
        for way in (("now", "before") if repeat % 2 == 0 else ("before", "now")):
            f = run(args.gguf.resolve(), way)
            print(f"| {way} | {f['runtime_mib']} | {f['convert_peak_mib']:,}, {f['convert_s']} | "
                  f"{f['load_peak_mib']:,}, {f['load_s']} | {f['resident_mib']:,} | {f['shards']} |", flush=True)


if __name__ == "__main__":
    main()
