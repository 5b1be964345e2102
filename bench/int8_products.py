"""The float32 kernel's products over the default model's blocks, float32 against int8 activations.

    .venv/bin/python bench/int8_products.py [--model q4_0.gguf] [--repeats 9]

For a layer matrix (layer 0's gate|up, the widest) and the LM head (Q8_0), each read as the GGUF's
blocks, times `linear_blocks` over 1, 2, 3, 4 and 9 rows of x with exact float32 products and with
int8 activations (`--int8-activations`), the two alternating, median of the repeats, 2 threads.
Also the relative error of the int8 products against the float32 ones, and greedy decoding (an
8-token prompt, 64 tokens, one model of each mode, alternating, median of 5). Not a test: a
measurement for BENCHMARKS.md ("Int8 activations").
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specsure.models import gguf_blocks
from specsure.models.loading import load_model

ROWS = (1, 2, 3, 4, 9)
CALLS = 20  # products per timing, so one timing is a few milliseconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a GGUF file (default: the packaged default model)")
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(2)
    lm = load_model(args.model, dtype="float32").lm
    native = lm._native
    kernel = native.float_kernel if native is not None else None
    layer = next((m for m in native._blocks if m.rows > m.cols), None) if kernel is not None else None
    if layer is None or lm.head.blocks is None:
        raise SystemExit(f"the model's weights are not read as blocks here ({lm.path})")
    print(lm.path)
    print("| matrix | rows | float32 (us) | int8 (us) | float32 / int8 | relative error |\n|---|---|---|---|---|---|")
    for name, matrix in ((f"layer ({layer.kind}, {layer.rows} x {layer.cols})", layer),
                         (f"LM head ({lm.head.blocks.kind}, {lm.head.blocks.rows} x {lm.head.blocks.cols})",
                          lm.head.blocks)):
        tagged = kernel.prepared(matrix, True)  # what a model with int8 activations reads
        if tagged is matrix:
            print(f"| {name} | - | - | - | no integer products for this format | - |")
            continue
        for rows in ROWS:
            x = torch.randn(rows, matrix.cols)
            times: dict[str, list[float]] = {"float32": [], "int8": []}
            for _ in range(args.repeats):
                for way, m in (("float32", matrix), ("int8", tagged)):
                    started = time.perf_counter()
                    for _ in range(CALLS):
                        kernel.linear_blocks(m, x)
                    times[way].append((time.perf_counter() - started) / CALLS * 1e6)
            exact, rounded = kernel.linear_blocks(matrix, x), kernel.linear_blocks(tagged, x)
            error = float((rounded - exact).norm() / exact.norm())
            a, b = statistics.median(times["float32"]), statistics.median(times["int8"])
            print(f"| {name} | {rows} | {a:.0f} | {b:.0f} | {a / b:.2f}x | {error:.4f} |")
    decode(args.model, lm)


def decode(model: str | None, exact: "object") -> None:
    """Greedy decoding in each mode, alternating: ms a token."""
    models = {"float32": exact, "int8": load_model(model, dtype="float32", int8_activations=True).lm}
    prompt = [1, 9690, 198, 2683, 359, 253, 5356, 5646]
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(6):
        for name, lm in models.items():
            lm.crop(0)
            token = int(lm.forward(prompt, last_logits=1).logits[-1].argmax())
            started = time.perf_counter()
            for _ in range(64):
                token = int(lm.forward([token]).logits[0].argmax())
            times[name].append((time.perf_counter() - started) / 64 * 1000)
    a, b = (statistics.median(times[name][1:]) for name in models)  # the first round warms up
    print(f"greedy decoding: float32 {a:.2f} ms a token, int8 {b:.2f} ms ({a / b:.2f}x)")


if __name__ == "__main__":
    main()
