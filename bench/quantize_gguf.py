"""Quantise a GGUF file with llama.cpp's own quantiser (llama-cpp-python's `llama_model_quantize`),
as `llama-quantize` would: the way a user's Q4_K_M file is made. Runs under the Python that
`make llama-cpp` builds, not specsure's:

    .venv-llamacpp/bin/python bench/quantize_gguf.py SOURCE.gguf OUT.gguf Q4_K_M

The source is best an F32 or F16 file: `specsure bench --baselines llama.cpp --dtype float32` writes
one of the default model to ~/.cache/specsure/llamacpp/. Not a test: how BENCHMARKS.md's Q4_K_M
figures got their file.
"""

from __future__ import annotations

import argparse
import ctypes

import llama_cpp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source")
    parser.add_argument("out")
    parser.add_argument("type", help="a llama.cpp file type: Q4_K_M, Q5_K_M, Q6_K, Q8_0, Q4_0, ...")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{args.type.upper()}", None)
    if ftype is None:
        raise SystemExit(f"type {args.type!r}: llama-cpp-python has no LLAMA_FTYPE_MOSTLY_{args.type.upper()}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = args.threads
    if llama_cpp.llama_model_quantize(args.source.encode(), args.out.encode(), ctypes.byref(params)) != 0:
        raise SystemExit(f"llama.cpp could not quantise {args.source}")


if __name__ == "__main__":
    main()
