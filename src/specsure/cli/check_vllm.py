"""`specsure check-vllm`: ask the installed vLLM what it would run, and compare with specsure."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
import logging
import math
import sys
from typing import Any

from specsure.cli.common import (
    EXIT_FAIL, EXIT_OK, EXIT_USAGE, add_model_flags, missing_modules, parse_speculative_config,
)
from specsure.config import ConfigError, resolve
from specsure.config.deployment import split_deployment, with_deployment
from specsure.config.export import VLLM_TESTED_VERSIONS, export
from specsure.config.schema import KEY_ALIASES
from specsure.config.vllm_overrides import target_path
from specsure.vllm_check import ProbeError, compare, default_vllm_python, run_probe
from specsure.vllm_check.compare import concise


def add_parser(sub: argparse._SubParsersAction) -> None:
    tested = ", ".join(VLLM_TESTED_VERSIONS)
    parser = sub.add_parser(
        "check-vllm", help="check that vLLM would run the method and draft specsure resolved",
        description="Resolve the speculative config with specsure, export it for vLLM, and ask vLLM's own "
                    "config code (EngineArgs.create_speculative_config, in a subprocess run with vLLM's "
                    "Python; specsure never imports vLLM) what it would run. Prints one row per field. "
                    "Exit 0: same method and draft. Exit 1: vLLM would run something else (the cause and "
                    "fix are named). Exit 2: bad config, one specsure itself refuses to run (vLLM's answer is "
                    "still shown), or vLLM missing or failing. "
                    f"Tested with vLLM {tested}; other versions may differ in their detection rules.",
        epilog=f"Tested with vLLM {tested} on CPU, with config.json-only checkpoints.")
    add_model_flags(parser)
    parser.add_argument("--vllm-python", default=None, metavar="PATH",
                        help="Python interpreter of an environment with vLLM installed "
                             "(default: .venv-vllm/bin/python when it exists)")
    parser.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                        help="limit for vLLM's import and config resolution (default: 600)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(run=run)


def json_error(message: str) -> dict[str, Any]:
    """--json's object on an error: a config error, or a command line that does not parse."""
    return {"error": message}


def run(args: argparse.Namespace) -> int:
    try:
        return _check(args)
    except ValueError as exc:
        if args.json:  # a script reading stdout gets JSON either way; stderr has the same error line
            print(json.dumps(json_error(str(exc)), indent=2))
        raise


def _check(args: argparse.Namespace) -> int:
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise ValueError(f"--timeout {args.timeout}: must be a positive number of seconds.")
    speculative = parse_speculative_config(args.speculative_config)
    if speculative is None:
        raise ConfigError("check-vllm needs --speculative-config: with speculation off there is nothing to check.")
    logging.getLogger("specsure.config").setLevel(logging.ERROR)  # shown in the notes instead
    # vLLM's own keys (draft parallelism, quantization, kernels, ...) go to vLLM as export passes them on.
    speculative, deployment = split_deployment(speculative)
    res = resolve(speculative, model=args.model, strict=args.strict, dtype=None)  # what vLLM runs, elsewhere
    try:  # vLLM is still asked (what it would run with this config is the point), but nothing is "OK";
        res.check_runnable(weights=False)  # metadata only: config-only folders are this check's usual input
        refused = ""
    except ConfigError as exc:
        refused = str(exc)
    exported = with_deployment(export(res, "vllm", strict=False), deployment)
    python = args.vllm_python or default_vllm_python()
    if python is None:
        raise ValueError("no vLLM environment found: .venv-vllm/bin/python does not exist. Pass --vllm-python "
                         "PATH (a Python with vLLM installed), or create one: python3 -m venv .venv-vllm && "
                         f".venv-vllm/bin/pip install vllm=={VLLM_TESTED_VERSIONS[-1]}")
    target, notes = target_path(res), list(res.warnings) + list(exported.warnings)
    if target.lower().endswith(".gguf"):
        # vLLM reads a bare .gguf only with a tokenizer repository to fetch its config from, and
        # fails with "Invalid repository ID" here. The folder specsure converted the file into holds
        # the same model in HF layout, so vLLM's detection sees the same checkpoint metadata.
        if missing := missing_modules("engine"):  # converting a GGUF needs torch and gguf
            raise ValueError(f"the target {target} is a GGUF file, which check-vllm asks vLLM about as the folder "
                             f"specsure converts it into, and converting needs the 'engine' extra "
                             f"({', '.join(missing)} not installed). Install it with: pip install 'specsure[engine]', "
                             "or pass --model with a Hugging Face folder.")
        from specsure.models.loading import weights_folder

        gguf, target = target, str(weights_folder(res.target_model))
        notes.append(f"the target {gguf} is a GGUF file; vLLM was asked with the folder specsure converted it "
                     f"into, {target} (same weights, HF layout). Give vLLM that folder as --model, or the .gguf "
                     "with --tokenizer naming its Hugging Face repository.")
    as_written = {KEY_ALIASES.get(k, k): v for k, v in {**speculative, **deployment}.items()}
    cases = [{"model": target, "speculative_config": dict(exported.speculative_config)},
             {"model": target, "speculative_config": as_written}]
    try:
        answer = run_probe(python, cases, timeout=args.timeout)
    except ProbeError as exc:
        raise ValueError(str(exc)) from None
    result, written = answer["results"]
    version = str(answer.get("vllm_version", "?"))
    if "error" in result:
        known = "".join(f" specsure's note: {text}" for text in exported.warnings)
        raise ValueError(f"vLLM {version}'s config code failed on the exported config "
                         f"{json.dumps(dict(exported.speculative_config))}: {concise(result['error'])}.{known}")
    check = replace(compare(res, result, exported=exported.speculative_config, as_written=written,
                            vllm_version=version), refused=refused)
    if version not in VLLM_TESTED_VERSIONS:
        notes.append(f"vLLM {version} is not a tested version ({', '.join(VLLM_TESTED_VERSIONS)}).")
    if answer.get("specsure_plugin") and not check.ok:
        notes.append("specsure's vLLM plugin is installed in that environment: with SPECSURE_VLLM_PLUGIN=enforce "
                     "(the default) vLLM runs specsure's resolution or refuses to start, instead of the above "
                     "(this check runs vLLM with the plugin off).")
    if args.json:
        data = check.to_dict()
        data["specsure_warnings"] = notes
        print(json.dumps(data, indent=2))
    else:
        print(check.table())
        for text in notes:
            print(f"warning: {text}", file=sys.stderr)
    return EXIT_USAGE if refused else EXIT_OK if check.ok else EXIT_FAIL
