"""`specsure explain`: every decision of the resolution, before anything loads."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from specsure.cli.common import (
    EXIT_OK, EXIT_USAGE, INT8_HELP, add_dtype_flag, add_model_flags, parse_speculative_config,
)
from specsure.cli.guard import one_line
from specsure.config import ConfigError, resolve
from specsure.config.dtype_choice import run_dtype


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("explain", help="show the effective speculative config, field by field, and why",
                            description="Resolve the speculative config against the checkpoints' metadata "
                                        "(no weights load) and show each field's value, source and reason.")
    add_model_flags(parser)
    add_dtype_flag(parser, "the dtype the run would load in (default auto); a shipped head's default tree depends on it")
    parser.add_argument("--int8-activations", action="store_true",
                        help=f"as generate and serve take it ({INT8_HELP}); explain says whether a run could have "
                             "them, and which matrices is the load's to decide")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(run=run)


def _int8_reason(asked: bool, dtype: str) -> str:
    """Why the run's products would (not) take int8 activations, short of loading anything."""
    if not asked:
        return "Not asked for (--int8-activations): the target's products are the dtype's own."
    if dtype != "float32":
        return f"Asked for, but they need float32 and the run would load in {dtype}."
    return ("Asked for: at load, the target's GGUF matrices that the float32 kernel reads as blocks take them (the "
            "load log counts them), and a target with none is an error then; drafts take them too.")


def json_error(message: str) -> dict[str, Any]:
    """--json's object when nothing resolved: a config error, or a command line that does not parse."""
    return {"fields": None, "warnings": [], "dtype": None, "int8_activations": None, "runnable": False,
            "error": message}


def run(args: argparse.Namespace) -> int:
    # The table lists the warnings itself; logging them too would print each twice.
    logging.getLogger("specsure.config").setLevel(logging.ERROR)
    try:
        res = resolve(parse_speculative_config(args.speculative_config), model=args.model, strict=args.strict,
                      dtype=args.dtype)
    except ValueError as exc:
        if args.json:  # a script reading stdout gets the documented shape, not nothing
            print(json.dumps(json_error(str(exc)), indent=2))
        raise
    problem = None
    try:
        res.check_runnable()
    except ConfigError as exc:
        problem = str(exc)
    dtype, why = run_dtype(res.target, args.dtype)
    int8 = _int8_reason(args.int8_activations, dtype)
    if args.int8_activations and dtype != "float32" and problem is None:  # as load_model refuses it
        problem = (f"int8_activations needs the model in float32, but the run would load it in {dtype} ({why.rstrip('.')}); "
                   "pass --dtype float32, or drop --int8-activations.")
    if args.json:
        print(json.dumps({"fields": res.to_dict(), "warnings": list(res.warnings), "dtype": {"value": dtype, "reason": why},
                          "int8_activations": {"value": args.int8_activations, "reason": int8},
                          "runnable": problem is None, "error": problem}, indent=2))
    else:
        print(res.explain())
        if problem is None:  # the dtype a run would load in; this config starts no run
            print(f"dtype: {dtype}. {why}")
            if args.int8_activations:
                print(f"int8 activations: on. {int8}")
    if problem:
        # Same shape as every other user error: one `error:` paragraph on stderr, exit 2.
        print(f"error: cannot run: {one_line(problem)}", file=sys.stderr)
    return EXIT_USAGE if problem else EXIT_OK
