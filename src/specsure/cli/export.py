"""`specsure export`: the resolved config as ready-to-paste vLLM or SGLang server arguments."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from specsure.cli.common import EXIT_OK, add_model_flags, parse_speculative_config
from specsure.config import resolve
from specsure.config.deployment import split_deployment, with_deployment
from specsure.config.export import ENGINES, VLLM_TESTED_VERSIONS, export


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "export", help="print vLLM or SGLang arguments that run exactly the resolved config",
        description="Resolve the speculative config, then print server arguments for vLLM "
                    "(--model and --speculative-config JSON with every field explicit) or SGLang "
                    "(--speculative-* flags). A method the engine cannot express is an error. When vLLM "
                    f"(tested: {', '.join(VLLM_TESTED_VERSIONS)}) would silently run another method, it "
                    "warns and proposes a fix; with --strict that is an error.")
    parser.add_argument("--to", required=True, choices=ENGINES, help="the engine to export to")
    add_model_flags(parser)
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(run=run)


def json_error(message: str) -> dict[str, Any]:
    """--json's object on an error: a config error, or a command line that does not parse."""
    return {"error": message}


def run(args: argparse.Namespace) -> int:
    logging.getLogger("specsure.config").setLevel(logging.ERROR)  # the warnings are printed below
    try:
        # vLLM's deployment keys (draft parallelism, quantization, ...) pass through to the engine.
        spec, deployment = split_deployment(parse_speculative_config(args.speculative_config))
        res = resolve(spec, model=args.model, strict=args.strict,
                      dtype=None)  # for another engine: nothing here decides its defaults
        out = with_deployment(export(res, args.to, strict=args.strict), deployment)
    except ValueError as exc:
        if args.json:  # a script reading stdout gets JSON either way
            print(json.dumps(json_error(str(exc)), indent=2))
        raise
    if args.json:
        data = out.to_dict()
        data["resolution_warnings"] = list(res.warnings)
        print(json.dumps(data, indent=2))
        return EXIT_OK
    print(out.command())
    for text in (*res.warnings, *out.warnings):
        print(f"warning: {text}", file=sys.stderr)
    for command in out.workarounds:
        print(f"workaround: {command}", file=sys.stderr)
    return EXIT_OK
