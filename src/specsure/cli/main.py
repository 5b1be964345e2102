"""`specsure` command line: explain / generate / demo / serve / bench / export / check-vllm."""

from __future__ import annotations

import argparse
import importlib
import sys

from specsure.cli.common import guarded, setup_logging

# One module per command, each with add_parser(subparsers) setting `run`.
COMMANDS = ("explain", "generate", "demo", "bench", "export", "check_vllm", "serve")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specsure", description="Speculative decoding where what you "
                                     "configure is what runs.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log INFO lines (effective config, dtype)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"specsure.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"specsure.cli.{name}":
                raise
            continue  # a command still being written; it appears once its module exists
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    setup_logging(args.verbose)
    return guarded(lambda: args.run(args))


if __name__ == "__main__":
    sys.exit(main())
