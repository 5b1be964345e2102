"""`specsure serve`: an OpenAI-compatible HTTP server over one engine (docs/serving.md)."""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import re
import socket
import sys
from typing import TYPE_CHECKING, Any

from specsure.cli.common import (
    EXIT_OK, EXIT_USAGE, INT8_HELP, STATS_LOGGER, add_dtype_flag, add_model_flags, add_model_len_flag, api_keys_from,
    int_at_least, parse_speculative_config, products_note,
)

if TYPE_CHECKING:
    from specsure.decode.engine import Engine

DEFAULT_MAX_QUEUE = 64  # specsure.serve.app.DEFAULT_MAX_QUEUE; not imported, so --help needs no fastapi
DEFAULT_MAX_NUM_SEQS = 8  # specsure.decode.scheduler.DEFAULT_MAX_NUM_SEQS; not imported, so --help needs no torch
DEFAULT_MAX_NUM_BATCHED_TOKENS = 256  # specsure.decode.scheduler's, not imported for the same reason

LOOPBACK = ("127.0.0.1", "::1", "localhost")
TOOL_CALL_PARSERS = ("granite", "hermes", "llama3_json", "mistral", "pythonic", "qwen3_coder")  # specsure.serve.tool_calls.PARSERS; not imported, so --help needs no fastapi
REASONING_PARSERS = ("deepseek_r1", "qwen3")  # specsure.serve.reasoning.PARSERS, likewise


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("serve", help="serve the model over an OpenAI-compatible HTTP API")
    add_model_flags(parser)
    add_dtype_flag(parser, "auto: float32 for a GGUF target the float32 kernel reads as blocks (the default model), else bfloat16 where the CPU has fast bf16, else float32")
    parser.add_argument("--int8-activations", action="store_true", help=INT8_HELP)
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default 127.0.0.1: this machine only; 0.0.0.0 exposes it)")
    parser.add_argument("--port", type=int, default=8000, help="port to bind (default 8000; 0 picks a free one)")
    parser.add_argument("--api-key", default=None, nargs="+", metavar="KEY",
                        help="require 'Authorization: Bearer KEY' on /v1/*, any of several keys as vLLM takes them "
                             "(default: $SPECSURE_API_KEY, else vLLM's $VLLM_API_KEY, else none; an empty key is an "
                             "error)")
    parser.add_argument("--served-model-name", default=None, nargs="+", metavar="NAME",
                        help="the model name clients send, or several (any of them is accepted; answers carry the "
                             "first), as vLLM takes them (default: the --model string, or SmolLM2-135M-Instruct)")
    parser.add_argument("--max-num-seqs", type=int, default=DEFAULT_MAX_NUM_SEQS, metavar="N",
                        help=f"requests generating at once, batched into every target forward (default "
                             f"{DEFAULT_MAX_NUM_SEQS}, as vLLM names it)")
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                        help="a request reuses the start of its prompt that an earlier request left in a sequence "
                             "slot's KV cache, and computes only the rest: a conversation's next turn prefills its "
                             "new messages only (default on, as in vLLM)")
    parser.add_argument("--max-num-batched-tokens", type=int, default=DEFAULT_MAX_NUM_BATCHED_TOKENS, metavar="N",
                        help=f"the most prompt tokens one step prefills: a longer prompt is prefilled in parts over "
                             f"several steps while the running requests go on decoding (chunked prefill; default "
                             f"{DEFAULT_MAX_NUM_BATCHED_TOKENS}; 0: every prompt at once)")
    add_model_len_flag(parser)
    parser.add_argument("--max-queue", type=int, default=DEFAULT_MAX_QUEUE, metavar="N",
                        help=f"requests that may wait for a place in the running batch; one more gets a 503 "
                             f"with Retry-After (default {DEFAULT_MAX_QUEUE})")
    parser.add_argument("--request-timeout", type=float, default=None, metavar="SECONDS",
                        help="stop a request this long after it arrived, queueing included, and answer with an "
                             "error: 503 if it never started, else 504 (default: no limit)")
    parser.add_argument("--shutdown-timeout", type=float, default=0.0, metavar="SECONDS",
                        help="on SIGTERM or Ctrl-C, refuse new requests and give the running ones this long to "
                             "finish before they are stopped with a 503 or a stream's error event (default 0: "
                             "stopped at once, as in vLLM); a second signal stops them at once, a third quits")
    parser.add_argument("--threads", type=int_at_least(1), default=None, metavar="N",
                        help="torch CPU threads of the engine thread, which runs every forward (default: torch's "
                             "choice, every core)")
    parser.add_argument("--chat-template", default=None, metavar="FILE|TEMPLATE",
                        help="a Jinja chat template (a file, or the template itself) to render messages with "
                             "instead of the tokenizer's")
    parser.add_argument("--enable-auto-tool-choice", action="store_true",
                        help='allow "tool_choice": "auto" (the default when a request has tools): the model decides '
                             "whether to call, and --tool-call-parser finds its calls")
    parser.add_argument("--tool-call-parser", default=None, choices=TOOL_CALL_PARSERS,
                        help="the format the model writes calls in (hermes: <tool_call>{...}</tool_call>, as "
                             "Qwen2.5 and Hermes models do; llama3_json: a JSON object, as Llama 3.1 and later "
                             "do; pythonic: [f(a=1)], as Llama 3.2's small models do; qwen3_coder: "
                             "<tool_call><function=f><parameter=a>1</parameter></function></tool_call>, as "
                             "Qwen3-Coder and Qwen3.5 do); needs --enable-auto-tool-choice")
    parser.add_argument("--reasoning-parser", default=None, choices=REASONING_PARSERS,
                        help="how a reasoning model's thinking is told from its answer (deepseek_r1, qwen3: "
                             "<think>...</think>): chat answers then carry it as 'reasoning', and structured "
                             "outputs and tool calls are enforced after it")
    parser.add_argument("--allowed-origins", type=_origins, default=[], metavar="JSON",
                        help='web origins whose pages may call the server from a browser (CORS), a JSON list as '
                             'vLLM takes it, e.g. \'["http://localhost:3000"]\' or \'["*"]\'; default none '
                             "(as vLLM 0.33): a page on any site could otherwise use the model")
    parser.add_argument("--override-generation-config", type=_json_object, default=None, metavar="JSON",
                        help="defaults for the sampling fields a request leaves out, as vLLM's flag: "
                             "'{\"temperature\": 1.0}' samples as vLLM and OpenAI do by default (without it, such "
                             "requests decode greedily); keys temperature, top_p, top_k, min_p, repetition_penalty, "
                             "presence_penalty, frequency_penalty, skip_special_tokens, and max_new_tokens (a chat "
                             "request's default max_tokens and every request's limit)")
    parser.add_argument("--generation-config", default="vllm", metavar="auto|vllm|FOLDER",
                        help="where the sampling defaults of requests that leave fields out come from, as vLLM's "
                             "flag: 'vllm' (default here: none, so such requests decode greedily), 'auto' (the "
                             "model's generation_config.json, vLLM's default), or a folder holding a "
                             "generation_config.json; --override-generation-config is applied on top")
    parser.add_argument("--disable-log-stats", action="store_true",
                        help="no periodic throughput and acceptance lines in the log (vLLM's flag; by default every "
                             "$VLLM_LOG_STATS_INTERVAL seconds, 10, while requests run)")
    parser.set_defaults(run=run)


def _origins(text: str) -> list[str]:
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not (isinstance(value, list) and all(isinstance(o, str) and o for o in value)):
        raise argparse.ArgumentTypeError(f"{text!r} is not a JSON list of origins; send e.g. "
                                         '\'["http://localhost:3000"]\', or \'["*"]\' for any origin.')
    # A browser sends its origin as scheme://host[:port], never with a path or a trailing slash.
    odd = [o for o in value if o != "*" and not re.fullmatch(r"[a-z][a-z0-9+.-]*://[^/\s]+", o)]
    if odd:
        raise argparse.ArgumentTypeError(f"{odd[0]!r} is not an origin a browser sends, which is scheme://host[:port] "
                                         "with no path or trailing slash (e.g. http://localhost:3000); no request "
                                         "would ever match it.")
    return value


def run(args: argparse.Namespace) -> int:
    # Checked before the model loads: uvicorn would only fail at bind time, with a traceback.
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port {args.port} is not a TCP port; give 0..65535 (0 picks a free one).")
    if args.max_queue < 0:
        raise ValueError(f"--max-queue {args.max_queue} must be >= 0 (0: a request that finds the running "
                         "batch full gets a 503 at once).")
    if args.max_num_seqs < 1:
        raise ValueError(f"--max-num-seqs {args.max_num_seqs} must be >= 1 (1: one request generates at a time).")
    if args.max_num_batched_tokens < 0:
        raise ValueError(f"--max-num-batched-tokens {args.max_num_batched_tokens} must be >= 0 (0: every prompt "
                         "prefilled in one step).")
    if args.request_timeout is not None and not 0 < args.request_timeout < float("inf"):
        raise ValueError(f"--request-timeout {args.request_timeout:g} must be a number of seconds > 0; omit it "
                         "for no limit.")
    if not 0 <= args.shutdown_timeout < float("inf"):
        raise ValueError(f"--shutdown-timeout {args.shutdown_timeout:g} must be a number of seconds >= 0 (0: running "
                         "requests stop at once on SIGTERM or Ctrl-C).")
    names = args.served_model_name or []
    if twice := sorted({n for n in names if names.count(n) > 1}):
        raise ValueError(f"--served-model-name gives {', '.join(map(repr, twice))} more than once; give each name "
                         "once (the first is the name responses carry, the others are aliases).")
    if "" in names:
        raise ValueError("--served-model-name '' is not a name; give a non-empty one, or leave the flag out to "
                         "serve the model under its path.")
    if args.enable_auto_tool_choice != (args.tool_call_parser is not None):
        raise ValueError("--enable-auto-tool-choice and --tool-call-parser go together: the first allows "
                         'tool_choice "auto", the second says how to find the calls in the text; pass both '
                         "(e.g. --enable-auto-tool-choice --tool-call-parser hermes), or neither.")
    chat_template = _chat_template(args.chat_template) if args.chat_template is not None else None
    try:
        import prometheus_client
        import uvicorn

        from specsure.serve import create_app
    except ModuleNotFoundError as exc:
        print(f"error: specsure serve needs {exc.name!r}; install the serve extra: pip install 'specsure[serve]'",
              file=sys.stderr)
        return EXIT_USAGE
    from specsure.config import resolve
    from specsure.decode.engine import make_engine

    speculative = parse_speculative_config(args.speculative_config)
    api_key = api_keys_from(args.api_key)
    from specsure.serve.generation_defaults import check_generation_defaults

    check_generation_defaults(args.override_generation_config)  # before the model loads
    folder_defaults = _folder_defaults(args.generation_config)
    resolve(speculative, model=args.model, strict=args.strict, dtype=args.dtype).check_runnable()  # errors first
    # Bound before the model loads: a port in use is a clear error at once, not uvicorn's exit after the load.
    sock = _bind(args.host, args.port)
    port = sock.getsockname()[1]  # the one the system picked, for --port 0
    if "*" in args.allowed_origins and not api_key:
        logging.getLogger("specsure.serve").warning(
            "--allowed-origins '[\"*\"]' without an API key: a web page on any site, open in a browser that "
            "reaches this server, can use the model; pass --api-key or list the origins")
    if args.host not in LOOPBACK and not api_key:
        logging.getLogger("specsure.serve").warning(
            "binding %s without an API key: anyone who can reach port %d can use the model; "
            "pass --api-key or set SPECSURE_API_KEY", args.host, port)
    import torch

    # Every forward runs on the engine thread; loading on one thread keeps this one from starting an
    # OpenMP pool of its own, which halved the engine thread's speed (specsure.serve.runner).
    threads = args.threads or torch.get_num_threads()
    torch.set_num_threads(1)
    # Under 'auto' the load's warning that the model's sampling defaults go unapplied would be untrue.
    unapplied = logging.getLogger("specsure.models.sampling_defaults")
    quiet, unapplied.disabled = unapplied.disabled, unapplied.disabled or args.generation_config == "auto"
    try:
        engine = make_engine(args.model, speculative, strict=args.strict, dtype=args.dtype,
                             max_num_seqs=args.max_num_seqs, enable_prefix_caching=args.enable_prefix_caching,
                             max_num_batched_tokens=args.max_num_batched_tokens or None,
                             int8_activations=args.int8_activations, max_model_len=args.max_model_len)
    except BaseException:
        sock.close()
        raise
    finally:
        unapplied.disabled = quiet
    show_stats_lines(not args.disable_log_stats)
    model_defaults, defaults = _sampling_defaults(args, folder_defaults, engine.target.path)
    # This process serves one app, so the process-wide switch is safe; vLLM flips it too.
    prometheus_client.disable_created_metrics()
    app = create_app(engine, served_model_name=args.served_model_name, api_key=api_key or None, max_queue=args.max_queue,
                     request_timeout=args.request_timeout, threads=threads, chat_template=chat_template,
                     tool_call_parser=args.tool_call_parser, reasoning_parser=args.reasoning_parser,
                     allowed_origins=args.allowed_origins, log_stats=not args.disable_log_stats,
                     generation_defaults=defaults, model_defaults=model_defaults)
    chunked = f"{args.max_num_batched_tokens} tokens a step" if args.max_num_batched_tokens else "at once"
    print(f"serving {app.state.model_name!r} (speculative: {engine.resolution.summary()}; running "
          f"{engine.speculative_method or 'plain decoding'}{products_note(engine)}); up to {args.max_num_seqs} "
          f"request{'s' * (args.max_num_seqs != 1)} batched, "
          f"prefix caching {'on' if args.enable_prefix_caching else 'off'}, "
          f"prompts prefilled {chunked}, "
          f"requests without a temperature {_default_sampling({**model_defaults, **defaults}, defaults)}, "
          f"{args.max_queue} more waiting{_settings_note(args, engine, bool(api_key))}; listening on "
          f"{_url(args.host, port)}", file=sys.stderr)
    from specsure.serve.shutdown import GracefulServer

    config = uvicorn.Config(app, host=args.host, port=port, log_level="info")
    GracefulServer(config, app.state.runner, args.shutdown_timeout).run(sockets=[sock])
    return EXIT_OK


def _settings_note(args: argparse.Namespace, engine: "Engine", keyed: bool) -> str:
    """The banner's other settings a client or an operator would ask about: the dtype that runs, and
    whichever of the key, parsers, CORS origins and timeout were set (vLLM logs its non-default
    arguments; these are the ones a request's answer depends on)."""
    parts = [f"dtype {str(engine.target.lm.dtype).removeprefix('torch.')}"]
    if keyed:
        parts.append("an API key required on /v1/*")
    if args.tool_call_parser:  # it comes with --enable-auto-tool-choice, always
        parts.append(f"tool calls read as {args.tool_call_parser}")
    if args.reasoning_parser:
        parts.append(f"reasoning read as {args.reasoning_parser}")
    if args.allowed_origins:
        parts.append(f"CORS for {', '.join(args.allowed_origins)}")
    if args.request_timeout:
        parts.append(f"requests stopped after {args.request_timeout:g} s")
    return "; " + ", ".join(parts)


def _chat_template(value: str) -> str:
    """--chat-template's template: the file's text, or the value itself when it is a template (as vLLM reads it)."""
    if os.path.isfile(value):
        with open(value, encoding="utf-8") as f:
            return f.read()
    if "{{" in value or "{%" in value:
        return value
    raise ValueError(f"--chat-template {value!r} is neither a file nor a Jinja template; give the path of a template "
                     "file (e.g. tool_chat_template.jinja), or the template text itself.")


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _bind(host: str, port: int) -> socket.socket:
    """A listening-ready TCP socket on ``host``:``port``, or a ValueError naming the flags and the fix."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise ValueError(f"--host {host!r} is not an address to bind ({exc.strerror}); give an IP address such "
                         "as 127.0.0.1 or 0.0.0.0.") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a restart need not wait
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        why = "is in use" if exc.errno == errno.EADDRINUSE else f"cannot be bound ({exc.strerror})"
        raise ValueError(f"--host {host} --port {port}: the address {why}; stop what listens there, or give "
                         "another --port (0 picks a free one).") from None
    return sock


def show_stats_lines(shown: bool) -> None:
    """vLLM's periodic throughput and acceptance lines at INFO, shown without -v as vLLM shows them (the CLI's
    other loggers stay at WARNING); not shown with --disable-log-stats."""
    if shown:
        logging.getLogger(STATS_LOGGER).setLevel(logging.INFO)


def _json_object(text: str) -> dict:
    """An argparse type: a JSON object, inline (vLLM's spelling of --override-generation-config)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc}); write e.g. '{{\"temperature\": 1.0}}'") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object such as '{{\"temperature\": 1.0}}', not {text!r}")
    return value


def _folder_defaults(choice: str) -> dict[str, Any] | None:
    """--generation-config FOLDER's defaults, read before the model loads; None for 'auto' and 'vllm'."""
    from specsure.models.sampling_defaults import model_sampling_defaults

    if choice in ("auto", "vllm"):
        return None
    if not os.path.isfile(os.path.join(choice, "generation_config.json")):
        raise ValueError(f"--generation-config {choice!r} is neither 'auto', 'vllm' nor a folder holding a "
                         "generation_config.json; give 'auto' for the model's own, or such a folder.")
    return _checked(model_sampling_defaults(choice), choice)


def _sampling_defaults(args: argparse.Namespace, folder: dict[str, Any] | None,
                       model_folder: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the model's defaults, the overriding ones), as create_app takes them. A --generation-config
    folder's defaults override as the flag's do: vLLM limits every request by their max_new_tokens
    too, where the model's own under 'auto' is only a default."""
    from specsure.models.sampling_defaults import model_sampling_defaults

    base = folder if folder is not None else \
        _checked(model_sampling_defaults(model_folder), model_folder) if args.generation_config == "auto" else {}
    if base:
        logging.getLogger("specsure.serve").warning(
            "the sampling defaults of requests that leave fields out come from %s/generation_config.json "
            "(--generation-config %s): %s", args.generation_config if folder is not None else model_folder,
            args.generation_config, ", ".join(f"{k}={v}" for k, v in base.items()))
    override = args.override_generation_config or {}
    return ({}, {**base, **override}) if folder is not None else (base, dict(override))


def _checked(found: dict[str, Any], folder: str) -> dict[str, Any]:
    from specsure.serve.generation_defaults import check_generation_defaults

    return check_generation_defaults(found, f"{folder}/generation_config.json")


def _default_sampling(defaults: dict[str, Any], limiting: dict[str, Any]) -> str:
    temperature, limit = defaults.get("temperature"), limiting.get("max_new_tokens")
    said = "decode greedily (vLLM's default is 1.0)" if not temperature else f"sample at temperature {temperature}"
    return said if limit is None else f"{said}, every request at most {limit} new tokens"
