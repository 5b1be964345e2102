"""The float32 kernel's Q4 blocks on AMX tiles against its AVX-512 products, interleaved in one
process on an AMX CPU: forwards of the default model over 1 to 16 rows, then greedy decoding with
each method (every output checked against plain decoding on the same build; the two builds sum in
another order, so their outputs are compared with each other for information only). A method may
carry a tree, as ``mtp:[(0,),(1,)]``.

    .venv/bin/python bench/amx_tiles.py --out bench/amx-tiles/quick.md [--per-category 2] [--repeats 2]

Not a test: the measurement behind BENCHMARKS.md's "Q4 blocks on AMX tiles".
"""

from __future__ import annotations

from interleave import build_arguments, compare_builds, engines_per_build, write_report
from specsure.decode.engine import Engine
from specsure.models import float_kernel as float_kernels

METHODS = ("plain", "ngram", "suffix", "mtp", "mtp:[(0,),(1,)]", "eagle3", "eagle3:[(0,),(1,)]")
BUILDS = ("AMX", "AVX-512")


def engines(methods: list[str]) -> dict[tuple[str, str], Engine]:
    """Each method on each build."""
    kernel, why = float_kernels.load()
    if not float_kernels.amx_wanted() or kernel is None or not kernel.amx:
        raise SystemExit(f"no AMX products here ({why}): nothing to compare")
    runs = engines_per_build(methods, {"AMX": {}, "AVX-512": {float_kernels.AMX_ENV: "0"}})
    for build in BUILDS:
        assert (runs[("plain", build)].target.lm.tiled_matrices > 0) == (build == "AMX")
    return runs


def main() -> None:
    args = build_arguments(__doc__.splitlines()[0], METHODS, ";")
    runs = engines(args.methods)
    timed, lines = compare_builds("amx_tiles.py", runs, BUILDS, args, (1, 2, 3, 4, 5, 6, 8, 16))
    rate = timed.rate
    lines += ["| method | AMX tok/s | AVX-512 tok/s | AMX / AVX-512 | vs plain on its build | acceptance length (AMX) |",
              "|---|---|---|---|---|---|"]
    for method in args.methods:
        tiles, products = rate[(method, "AMX")], rate[(method, "AVX-512")]
        key = (method, "AMX")
        accepted = f"{1 + timed.accepted[key] / timed.drafts[key]:.2f}" if timed.drafts[key] else ""
        lines.append(f"| {method} | {tiles:.1f} | {products:.1f} | {tiles / products:.2f}x | "
                     f"{tiles / rate[('plain', 'AMX')]:.2f}x, {products / rate[('plain', 'AVX-512')]:.2f}x | {accepted} |")
    write_report(args, lines)


if __name__ == "__main__":
    main()
