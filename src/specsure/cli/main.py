"""`specsure` command line: explain / generate / demo / serve / bench / train / export / check-vllm."""

from __future__ import annotations

import argparse
import importlib
import sys

from specsure.cli.common import guarded, setup_logging

# One module per command, each with add_parser(subparsers) setting `run`.
COMMANDS = ("explain", "generate", "demo", "bench", "export", "check_vllm", "serve", "train")


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The full parser, or, when argv names a command, one with only that command's module.

    Importing only the chosen command keeps `specsure explain` free of torch: the engine,
    bench and server modules are imported only when they run.
    """
    parser = argparse.ArgumentParser(prog="specsure", description="Speculative decoding where what you "
                                     "configure is what runs.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log INFO lines (effective config, dtype)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = _command_in(argv)
    for name in COMMANDS if chosen is None else (chosen,):
        importlib.import_module(f"specsure.cli.{name}").add_parser(sub)
    return parser


def _command_in(argv: list[str] | None) -> str | None:
    words = [w for w in (sys.argv[1:] if argv is None else argv) if not w.startswith("-")]
    if not words:
        return None
    name = words[0].replace("-", "_")
    return name if name in COMMANDS else None


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    setup_logging(args.verbose)
    return guarded(lambda: args.run(args))


if __name__ == "__main__":
    sys.exit(main())
