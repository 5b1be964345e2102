"""`specsure generate`: one completion, then the effective config and the acceptance figures."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from specsure.cli.common import (
    EXIT_OK, INT8_HELP, add_dtype_flag, add_model_flags, add_model_len_flag, int_at_least, parse_speculative_config,
    products_note, seed_value,
)

if TYPE_CHECKING:
    from specsure.decode.engine import Completion, Engine
    from specsure.grammar import StructuredOutputs
    from specsure.sampling import SamplingParams


DEFAULT_MAX_TOKENS = 128


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("generate", help="generate a completion with speculative decoding")
    add_model_flags(parser)
    add_sampling_flags(parser)
    parser.add_argument("--chat", action="store_true", help="wrap PROMPT in the model's chat template")
    add_model_len_flag(parser)
    parser.add_argument("--structured-outputs", default=None, metavar="JSON",
                        help='constrain the output, as vLLM\'s structured_outputs: {"json": SCHEMA}, {"regex": "..."}, '
                             '{"choice": [...]}, {"grammar": "root ::= ..."} (GBNF) or {"json_object": true}; inline JSON '
                             'or @file.json')
    parser.add_argument("--threads", type=int_at_least(1), default=None, metavar="N",
                        help="torch CPU threads (default: torch's choice, every core)")
    parser.add_argument("--stop", action="append", default=None, metavar="TEXT",
                        help="end the answer before TEXT (repeatable), as a request's stop")
    parser.add_argument("--ignore-eos", action="store_true",
                        help="go on past the end-of-sequence token to --max-tokens, as a request's ignore_eos")
    parser.add_argument("prompt", metavar="PROMPT", help="the prompt text; - reads it from standard input")
    parser.set_defaults(run=run)


def add_sampling_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-tokens", type=int_at_least(1), default=None,
                        help=f"tokens to generate (default {DEFAULT_MAX_TOKENS}, or what the context has room for; "
                             "a larger value than the room is an error)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass, in (0, 1]")
    parser.add_argument("--top-k", type=int_at_least(-1), default=0,
                        help="keep the k most likely tokens; 0 or -1 (vLLM's spelling) = off")
    parser.add_argument("--min-p", type=float, default=0.0,
                        help="drop tokens less likely than P times the most likely one, in [0, 1]; 0 = off (default)")
    parser.add_argument("--presence-penalty", type=float, default=0.0,
                        help="subtract from the logit of every token the answer holds, in [-2, 2]; 0 = off")
    parser.add_argument("--frequency-penalty", type=float, default=0.0,
                        help="subtract from a token's logit once per time the answer holds it, in [-2, 2]; 0 = off")
    parser.add_argument("--repetition-penalty", type=float, default=1.0,
                        help="divide positive logits (multiply negative ones) of tokens in the prompt or the answer; "
                             "above 0; 1 = off (default; llama.cpp's --repeat-penalty)")
    parser.add_argument("--min-tokens", type=int_at_least(0), default=0,
                        help="tokens to generate before EOS or a --stop string may end the answer")
    parser.add_argument("--logprobs", type=int_at_least(0), default=None, metavar="N",
                        help="print each answer token's log-probability under the model, with its N most likely "
                             "alternatives, to standard error")
    parser.add_argument("--seed", type=seed_value, default=None, help="seed for sampling")
    add_dtype_flag(parser, "auto: float32 for a GGUF target the float32 kernel reads as blocks (the default model), else bfloat16 where the CPU has fast bf16, else float32")
    parser.add_argument("--int8-activations", action="store_true", help=INT8_HELP)


def render_prompt(engine: "Engine", prompt: str, chat: bool,
                  why: str = "--chat needs a tokenizer with a chat template, and this model has none; drop --chat."
                  ) -> str | list[int]:
    """The prompt as the engine takes it; --chat applies the tokenizer's chat template (``why``: the
    error when the model has none)."""
    if engine.tokenizer is None:  # the engine's own error offers token ids, which a command line cannot pass
        raise ValueError(f"the model at {engine.target.path} has no tokenizer files, so it cannot read the text "
                         "prompt; add its tokenizer (tokenizer.json, tokenizer_config.json) to the model folder, or "
                         "pass token ids from Python (specsure.make_engine(...).generate([[1, 2, 3]])).")
    if not chat:
        return prompt
    tok = engine.tokenizer
    if tok is None or not getattr(tok, "chat_template", None):
        raise ValueError(why)
    from jinja2 import TemplateError  # transformers renders chat templates with jinja2

    try:
        return list(tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                            tokenize=True, return_dict=False))
    except (TemplateError, TypeError, ArithmeticError) as exc:  # the template's own failure, not the prompt's
        raise ValueError(f"the model's chat template (at {engine.target.path}) failed on a one-message chat: "
                         f"{type(exc).__name__}: {exc}. Drop --chat and write the prompt in the model's format "
                         "yourself, or fix the template.") from None


def parse_structured_outputs(text: str | None) -> "StructuredOutputs | None":
    """--structured-outputs: vLLM's structured_outputs object, inline or @file.json."""
    from specsure.grammar import GrammarError, StructuredOutputs

    if text is None:
        return None
    source = "--structured-outputs"
    if text.startswith("@"):
        path = Path(text[1:]).expanduser()
        try:
            text = path.read_text(encoding="utf-8-sig")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"--structured-outputs {text!r}: cannot read {path} as UTF-8 text ({exc}).") from None
        source = f"--structured-outputs file {path}"
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"{source} is not valid JSON ({exc}). Example: --structured-outputs "
                         '\'{"choice": ["yes", "no"]}\'') from None
    if not isinstance(value, dict):
        raise ValueError(f"{source} must be a JSON object such as {{\"json\": {{\"type\": \"object\"}}}}, not "
                         f"{text.strip()[:40]!r}.")
    try:
        return StructuredOutputs.from_dict(value)
    except GrammarError as exc:
        raise ValueError(f"{source}: {exc}.") from None


def fit_max_tokens(asked: int | None, prompt_tokens: int, context: int | None,
                   default: int = DEFAULT_MAX_TOKENS, context_name: str = "the model's context",
                   min_tokens: int = 0) -> int:
    """--max-tokens within the room the prompt leaves in the context: the default is lowered to the
    room; a value the user gave that does not fit, or a --min-tokens over the lowered default, is an
    error naming the room (as the server's 400)."""
    room = context - prompt_tokens if context else None
    if asked is None:
        if room is not None and min_tokens > min(default, room):
            raise ValueError(f"--min-tokens {min_tokens} does not fit: {context_name} is {context} tokens and the "
                             f"prompt takes {prompt_tokens}, so at most {room} more fit. Pass --min-tokens {room} "
                             "or less, or shorten the prompt.")
        return default if room is None else min(default, room)
    if room is not None and asked > room:
        raise ValueError(f"--max-tokens {asked} does not fit: {context_name} is {context} tokens and the prompt "
                         f"takes {prompt_tokens}, so at most {room} more fit. Pass --max-tokens {room} or less, or "
                         "shorten the prompt.")
    return asked


def print_effective(engine: "Engine", stream: TextIO | None = None) -> None:
    """One line per field with its value and source."""
    res = engine.resolution
    out = stream or sys.stdout
    print(f"effective config (running: {engine.speculative_method or 'plain decoding'}, dtype "
          f"{str(engine.target.lm.dtype).removeprefix('torch.')}{products_note(engine)}):", file=out)
    width = max(len(name) for name in res.decisions)
    for name, decision in res.decisions.items():
        value = "-" if decision.value is None else decision.value  # as `specsure explain` shows an unset field
        print(f"  {name:<{width}} {value!s:<30} [{decision.source}]", file=out)
    for warning in res.warnings:
        print(f"  warning: {warning}", file=out)


def print_stats(completion: "Completion", stream: TextIO | None = None) -> None:
    s, out = completion.stats, stream or sys.stdout
    print(f"tokens: {s.generated_tokens} in {s.elapsed_s:.2f} s ({s.tokens_per_s:.1f} tok/s), "
          f"finish: {completion.finish_reason}", file=out)
    if s.drafts:
        rates = ", ".join(f"{r:.2f}" for r in s.per_position_acceptance_rate)
        print(f"mean acceptance length: {s.mean_acceptance_length:.2f} (drafts {s.drafts}, drafted "
              f"{s.draft_tokens}, accepted {s.accepted_tokens}); per-position acceptance: {rates}", file=out)


def run(args: argparse.Namespace) -> int:
    from specsure.decode.engine import make_engine
    structured = parse_structured_outputs(args.structured_outputs)
    sampling_params(args, structured, args.max_tokens or max(1, args.min_tokens))  # bad flags fail before the load
    shaping = (("--top-p", args.top_p != 1.0), ("--top-k", args.top_k not in (0, -1)), ("--min-p", args.min_p != 0),
               ("--seed", args.seed is not None))
    if args.temperature == 0 and (unused := [flag for flag, given in shaping if given]):
        # greedy decoding reads none of them: say so rather than drop them
        print(f"warning: {', '.join(unused)} shape sampling only, and --temperature 0 (the default) decodes greedily; "
              "give --temperature above 0 to sample.", file=sys.stderr)
    if args.prompt == "-":  # the usual spelling for standard input: a long or multi-line prompt, or a pipe
        text = sys.stdin.read()
        args.prompt = text[:-1] if text.endswith("\n") else text  # `echo X |` means the prompt X, as typed
    if not args.prompt:
        raise ValueError("PROMPT is empty; give some text to continue, for example specsure generate \"Hello\".")
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    engine = make_engine(args.model, parse_speculative_config(args.speculative_config), strict=args.strict,
                         dtype=args.dtype, seed=args.seed, int8_activations=args.int8_activations,
                         max_model_len=args.max_model_len)
    from specsure.decode.completion import PromptError

    try:
        prompt = engine.encode(render_prompt(engine, args.prompt, args.chat))
    except PromptError as exc:  # one prompt here: "the prompt", not "prompt 0"
        raise ValueError(f"the prompt {exc.detail}") from None
    lm = engine.target.lm
    max_tokens = fit_max_tokens(args.max_tokens, len(prompt), lm.max_context, context_name=lm.context_name,
                                min_tokens=args.min_tokens)
    completion = engine.generate(prompt, sampling_params(args, structured, max_tokens))[0]
    # The completion alone on stdout, as llama.cpp and vLLM's tools keep it: `$(specsure generate ...)`
    # and `> out.txt` capture the answer; what ran and how fast goes to stderr.
    print(completion.text)
    print_effective(engine, sys.stderr)
    print_stats(completion, sys.stderr)
    if completion.logprobs is not None:
        print_logprobs(engine, completion, sys.stderr)
    return EXIT_OK


def sampling_params(args: argparse.Namespace, structured: "StructuredOutputs | None",
                    max_tokens: int) -> "SamplingParams":
    """The flags as SamplingParams; an error names the flag the user typed."""
    from specsure.sampling import SamplingError, SamplingParams

    try:
        return SamplingParams(max_tokens=max_tokens, temperature=args.temperature,
                              top_p=args.top_p, top_k=args.top_k, min_p=args.min_p, seed=args.seed,
                              presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty,
                              repetition_penalty=args.repetition_penalty, min_tokens=args.min_tokens,
                              logprobs=args.logprobs, structured_outputs=structured, stop=args.stop,
                              ignore_eos=args.ignore_eos)
    except SamplingError as err:  # its message names the Python field; the user typed a flag
        raise ValueError(f"--{err.field.replace('_', '-')}: {str(err).split(' = ', 1)[-1]}") from None


def print_logprobs(engine: "Engine", completion: "Completion", stream: TextIO) -> None:
    """One line per answer token: its text, its log-probability, and the alternatives asked for."""
    def shown(token: int) -> str:
        return repr(engine.tokenizer.decode([token])) if engine.tokenizer is not None else str(token)

    print("logprobs (token, log-probability, most likely alternatives):", file=stream)
    for token, entry in zip(completion.token_ids, completion.logprobs or []):
        alternatives = ", ".join(f"{shown(t)} {lp:.4f}" for t, lp in entry.top)
        print(f"  {shown(token)} {entry.logprob:.4f}" + (f"  [{alternatives}]" if alternatives else ""), file=stream)
