"""`specsure serve`: an OpenAI-compatible HTTP server over one engine (docs/serving.md)."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from specsure.cli.common import EXIT_OK, EXIT_USAGE, add_model_flags, parse_speculative_config

DEFAULT_MAX_QUEUE = 64  # specsure.serve.app.DEFAULT_MAX_QUEUE; not imported, so --help needs no fastapi
DEFAULT_MAX_NUM_SEQS = 8  # specsure.decode.scheduler.DEFAULT_MAX_NUM_SEQS; not imported, so --help needs no torch

LOOPBACK = ("127.0.0.1", "::1", "localhost")


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("serve", help="serve the model over an OpenAI-compatible HTTP API")
    add_model_flags(parser)
    parser.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                        help="auto: bfloat16 where the CPU has fast bf16, else float32")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default 127.0.0.1: this machine only; 0.0.0.0 exposes it)")
    parser.add_argument("--port", type=int, default=8000, help="port to bind (default 8000; 0 picks a free one)")
    parser.add_argument("--api-key", default=None, metavar="KEY",
                        help="require 'Authorization: Bearer KEY' on /v1/* (default: $SPECSURE_API_KEY, else none)")
    parser.add_argument("--served-model-name", default=None, metavar="NAME",
                        help="the model name clients send (default: the --model string, or SmolLM2-135M-Instruct)")
    parser.add_argument("--max-num-seqs", type=int, default=DEFAULT_MAX_NUM_SEQS, metavar="N",
                        help=f"requests generating at once, batched into every target forward (default "
                             f"{DEFAULT_MAX_NUM_SEQS}, as vLLM names it)")
    parser.add_argument("--max-queue", type=int, default=DEFAULT_MAX_QUEUE, metavar="N",
                        help=f"requests that may wait for a place in the running batch; one more gets a 503 "
                             f"with Retry-After (default {DEFAULT_MAX_QUEUE})")
    parser.add_argument("--request-timeout", type=float, default=None, metavar="SECONDS",
                        help="stop a request this long after it arrived, queueing included, and answer with an "
                             "error: 503 if it never started, else 504 (default: no limit)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    # Checked before the model loads: uvicorn would only fail at bind time, with a traceback.
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port {args.port} is not a TCP port; give 0..65535 (0 picks a free one).")
    if args.max_queue < 0:
        raise ValueError(f"--max-queue {args.max_queue} must be >= 0 (0: a request that finds the running "
                         "batch full gets a 503 at once).")
    if args.max_num_seqs < 1:
        raise ValueError(f"--max-num-seqs {args.max_num_seqs} must be >= 1 (1: one request generates at a time).")
    if args.request_timeout is not None and not 0 < args.request_timeout < float("inf"):
        raise ValueError(f"--request-timeout {args.request_timeout:g} must be a number of seconds > 0; omit it "
                         "for no limit.")
    try:
        import prometheus_client
        import uvicorn

        from specsure.serve import create_app
    except ModuleNotFoundError as exc:
        print(f"error: specsure serve needs {exc.name!r}; install the serve extra: pip install 'specsure[serve]'",
              file=sys.stderr)
        return EXIT_USAGE
    from specsure.decode.engine import make_engine

    api_key = args.api_key or os.environ.get("SPECSURE_API_KEY") or None
    if args.host not in LOOPBACK and not api_key:
        logging.getLogger("specsure.serve").warning(
            "binding %s without an API key: anyone who can reach port %d can use the model; "
            "pass --api-key or set SPECSURE_API_KEY", args.host, args.port)
    import torch

    # Every forward runs on the engine thread; loading on one thread keeps this one from starting an
    # OpenMP pool of its own, which halved the engine thread's speed (specsure.serve.runner).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    engine = make_engine(args.model, parse_speculative_config(args.speculative_config), strict=args.strict,
                         dtype=args.dtype, max_num_seqs=args.max_num_seqs)
    # This process serves one app, so the process-wide switch is safe; vLLM flips it too.
    prometheus_client.disable_created_metrics()
    app = create_app(engine, served_model_name=args.served_model_name, api_key=api_key, max_queue=args.max_queue,
                     request_timeout=args.request_timeout, threads=threads)
    print(f"serving {app.state.model_name!r} (speculative: {engine.resolution.summary()}; running "
          f"{engine.speculative_method or 'plain decoding'}); up to {args.max_num_seqs} requests batched, "
          f"{args.max_queue} more waiting", file=sys.stderr)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")
    return EXIT_OK
