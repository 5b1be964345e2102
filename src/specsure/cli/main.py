"""`specsure` command line: explain / generate / demo / serve / bench / train / export / check-vllm."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import logging
import sys
from typing import Any, Callable

from specsure.cli.common import EXIT_USAGE, missing_extra_message, missing_modules, setup_logging
from specsure.cli.guard import guarded
from specsure.cli.foreign_flags import foreign_flag_hint
from specsure.cli.vllm_argv import normalise, repeated_flags

# One module per command, each with add_parser(subparsers) setting `run`.
COMMANDS = ("explain", "generate", "demo", "bench", "export", "check_vllm", "serve", "train")
EXTRA_OF: dict[str, str] = {"generate": "engine", "demo": "engine", "bench": "bench", "serve": "serve",
                            "train": "train"}
"""The install extra each engine command needs; the others run on a plain `pip install specsure`."""


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The full parser, or, when argv names a command, one with only that command's module.

    Importing only the chosen command keeps `specsure explain` free of torch: the engine,
    bench and server modules are imported only when they run.
    """
    parser = argparse.ArgumentParser(prog="specsure", description="Speculative decoding where what you "
                                     "configure is what runs.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log INFO lines (effective config, dtype)")
    parser.add_argument("-V", "--version", action="version", version=f"specsure {importlib.metadata.version('specsure')}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = _command_in(argv)
    for name in COMMANDS if chosen is None else (chosen,):
        if unavailable(name) is None:
            importlib.import_module(f"specsure.cli.{name}").add_parser(sub)
        else:
            # Listed all the same, so --help shows every command and what to install for it.
            sub.add_parser(name.replace("_", "-"), help=f"(needs pip install 'specsure[{EXTRA_OF[name]}]')")
    parser.set_defaults(command_parsers=sub.choices)  # each command's parser, by name, for its --help text
    return parser


def unavailable(name: str) -> str | None:
    """Why command ``name`` cannot run here (its install extra is missing), or None."""
    extra = EXTRA_OF.get(name)
    missing = missing_modules(extra) if extra else []
    return missing_extra_message(name.replace("_", "-"), extra, missing) if extra and missing else None


def _command_in(argv: list[str] | None) -> str | None:
    words = [w for w in (sys.argv[1:] if argv is None else argv) if not w.startswith("-")]
    if not words:
        return None
    name = words[0].replace("-", "_")
    return name if name in COMMANDS else None


def _subcommand(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser | None:
    for action in parser._actions:  # argparse keeps a parser's subparsers only here
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            return action.choices[name]
    return None


def _option_strings(parser: argparse.ArgumentParser, words: list[str]) -> set[str]:
    """The flags the command takes, its subcommand's too where one is named (`bench serve`)."""
    flags = set(parser._option_string_actions)
    for word in words:
        if (child := _subcommand(parser, word)) is not None:
            flags |= set(child._option_string_actions)
    return flags


def _json_asked(words: list[str]) -> bool:
    return "--json" in (words[:words.index("--")] if "--" in words else words)


def _usage_error(words: list[str], prefix: str, message: str,
                 shape: Callable[[str], dict[str, Any]] | None = None) -> int:
    """Exit code 2 for a command line that does not parse: the message on stderr and, where the command
    was asked for --json, its documented JSON on stdout, so a script reading it always gets JSON."""
    if shape is None and _json_asked(words) and (chosen := _command_in(words)) is not None \
            and unavailable(chosen) is None:
        shape = getattr(importlib.import_module(f"specsure.cli.{chosen}"), "json_error", None)
    if shape is not None:
        print(json.dumps(shape(message), indent=2))
    print(f"{prefix}: {message}", file=sys.stderr)
    return EXIT_USAGE


def _no_abbreviations(parser: argparse.ArgumentParser) -> None:
    """A prefix of a flag is no flag: `--spec` must not silently mean --speculative-config (vLLM's
    parser does not take prefixes either), nor a mistyped flag bind to another."""
    parser.allow_abbrev = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _no_abbreviations(child)


def _printable_anywhere() -> None:
    """A terminal or pipe that cannot encode a character gets an escape for it, not a crash after the run:
    `PYTHONIOENCODING=latin-1`, a Windows console, an emoji in the answer."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and (getattr(stream, "encoding", "") or "").lower().replace("-", "") != "utf8":
            reconfigure(errors="backslashreplace")


def main(argv: list[str] | None = None) -> int:
    _printable_anywhere()
    given = list(sys.argv[1:] if argv is None else argv)
    try:  # vLLM's spellings: --speculative_config, --speculative-config.method ngram
        words = normalise(given)
    except ValueError as exc:
        return _usage_error(given, "error", str(exc))
    chosen = _command_in(words)
    if chosen is not None and (why := unavailable(chosen)) is not None:
        return _usage_error(words, "error", why)
    parser = build_parser(words)
    _no_abbreviations(parser)
    if chosen is not None:  # before argparse, which would name the flag's value as the error
        name = chosen.replace("_", "-")
        label = f"{name} serve" if name == "bench" and "serve" in words else name
        command_parser = parser.get_default("command_parsers")[name]
        if _json_asked(words) and (shape := getattr(importlib.import_module(f"specsure.cli.{chosen}"),
                                                     "json_error", None)) is not None:
            command_parser.error = lambda message: sys.exit(_usage_error(words, f"{command_parser.prog}: error",
                                                                         message, shape))
        if (hint := foreign_flag_hint(words, label, _option_strings(command_parser, words))) is not None:
            return _usage_error(words, f"specsure {label}: error", hint)
    args, extra = parser.parse_known_args(words)
    command = (args.command_parsers or {}).get(getattr(args, "command", None) or "")
    if command is not None and (mode := getattr(args, "bench_mode", None)):  # `bench serve` has its own usage
        command = _subcommand(command, mode) or command
    if extra:  # the command's own usage names them, not the top-level one
        hint = ""
        if command is not None and "--model" in command._option_string_actions and not extra[0].startswith("-"):
            hint = (f" (the model comes as --model {extra[0]}, not as the first word, as `vllm serve MODEL` "
                    "takes it)")
        elif getattr(args, "command", None) == "export":
            hint = (" (`specsure export` writes the model and speculative flags only; give vLLM's or SGLang's own "
                    "flags to the engine beside them: eval \"vllm serve $(specsure export ...) FLAGS\")")
        (command or parser).error(f"unrecognized arguments: {' '.join(extra)}{hint}")
    if command is not None:
        twice, notes = repeated_flags(command, words)
        if twice is not None:
            command.error(twice)
        for note in notes:
            print(note, file=sys.stderr)
    args.argv = words  # the words as given (vLLM's spellings read as specsure's): which flags came where
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    setup_logging(args.verbose)
    # explain, export and check-vllm mute specsure.config while they run (they print its warnings
    # themselves); a process that calls main() keeps its own level afterwards
    config_logger = logging.getLogger("specsure.config")
    level = config_logger.level
    try:
        return guarded(lambda: args.run(args))
    finally:
        config_logger.setLevel(level)


if __name__ == "__main__":
    sys.exit(main())
