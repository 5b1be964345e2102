"""`specsure bench`: the Spec-Bench-style benchmark (the logic lives in specsure.bench)."""

from __future__ import annotations

import argparse

from specsure.bench.cli import add_arguments, run


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("bench", help="benchmark methods against Hugging Face transformers",
                            description="Greedy, batch 1, warm-up, interleaved repeats; tokens/s, speedups, "
                                        "acceptance and output equality per method and category.")
    add_arguments(parser)
    parser.set_defaults(run=run)
