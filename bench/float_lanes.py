"""The float32 kernel's AVX-512 products against its AVX2 ones on an AVX-512 CPU, interleaved in one
process: forwards of the default model over 1 to 16 rows, then greedy decoding with each method
(every output checked against plain decoding on the same build; the two builds sum in another
order, so their outputs are compared with each other for information only).

    .venv/bin/python bench/float_lanes.py --out bench/amx-float-lanes/quick.md [--per-category 2] [--repeats 2]

Not a test: the measurement behind BENCHMARKS.md's "AVX-512 products in the float32 kernel".
"""

from __future__ import annotations

from interleave import build_arguments, compare_builds, engines_per_build, write_report
from specsure.decode.engine import Engine
from specsure.models import float_kernel as float_kernels

METHODS = ("plain", "ngram", "suffix", "mtp", "eagle3")
BUILDS = ("AVX-512", "AVX2")


def engines(methods: list[str]) -> dict[tuple[str, str], Engine]:
    """Each method on each build (the AMX tiles off in both: they are amx_tiles.py's comparison)."""
    if not float_kernels.wide():
        raise SystemExit("this CPU has no avx512f (or SPECSURE_FLOAT_LANES=8): nothing to compare")
    off = {float_kernels.AMX_ENV: "0"}
    runs = engines_per_build(methods, {"AVX-512": off, "AVX2": {**off, float_kernels.LANES_ENV: "8"}})
    for build in BUILDS:
        assert runs[("plain", build)].target.lm._native.float_kernel.amx is False
    return runs


def main() -> None:
    args = build_arguments(__doc__.splitlines()[0], METHODS, ",")
    runs = engines(args.methods)
    timed, lines = compare_builds("float_lanes.py", runs, BUILDS, args, (1, 2, 3, 4, 8, 16))
    rate = timed.rate
    plain = rate[(args.methods[0], "AVX2")]
    lines += ["| method | AVX-512 tok/s | AVX2 tok/s | AVX-512 / AVX2 | vs plain AVX2 |", "|---|---|---|---|---|"]
    for method in args.methods:
        wide, narrow = rate[(method, "AVX-512")], rate[(method, "AVX2")]
        lines.append(f"| {method} | {wide:.1f} | {narrow:.1f} | {wide / narrow:.2f}x | {wide / plain:.2f}x, "
                     f"{narrow / plain:.2f}x |")
    write_report(args, lines)


if __name__ == "__main__":
    main()
