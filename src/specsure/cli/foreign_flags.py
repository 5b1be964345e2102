"""llama.cpp's and vLLM's flags that specsure spells otherwise or does not have, with what to use.

A user coming from llama.cpp types ``-n 64`` or ``-md draft.gguf`` out of habit; argparse alone
would report the prompt as an unrecognised argument, or a positional's invalid choice. None of
these words is a specsure option, so the command line is read for them before argparse runs, and
each gets a sentence saying what the command at hand takes instead (or why there is nothing to set).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Final, Sequence


@dataclass(frozen=True)
class Foreign:
    """Another engine's flag: whose it is, and the specsure flag (or request field) that does its job."""

    engine: str
    flag: str | None = None
    """The specsure flag that does the same, where a command has it (``--max-tokens``)."""
    usage: str = ""
    """How to write that flag (``--max-tokens N``)."""
    field: str | None = None
    """The request field that does the same on the server (``max_tokens``)."""
    otherwise: str = ""
    """Why there is nothing to set, for a flag with no specsure counterpart."""


_CONTEXT = ("the context is the model's own (config.json max_position_embeddings, or the GGUF's context_length), "
            "and a request's max tokens are lowered to the room it leaves; `specsure serve` and `specsure generate` "
            "cap it with --max-model-len N")
_CPU = "specsure runs on the CPU"
_ONE_MACHINE = ("specsure runs on one machine; `specsure export --to vllm` writes the same config for vLLM to "
                "scale out")
_QUANTISED = ("the weights run as their file holds them: a GGUF file's Q4_0 to Q8_0 and K-quant blocks are read as "
              "they are (pass the .gguf as --model), and --int8-activations multiplies them as llama.cpp does")
_K = "num_speculative_tokens goes in --speculative-config '{\"num_speculative_tokens\": K, ...}'"
_DRAFT = "the draft goes in --speculative-config '{\"model\": \"DRAFT\"}' (method draft_model)"

_MAX = Foreign("llama.cpp", "--max-tokens", "--max-tokens N", "max_tokens")
_PROMPT = Foreign("llama.cpp", otherwise="the prompt is the last argument (PROMPT) of `specsure generate` (- reads it "
                                         "from standard input), and a request's own field on the server")
_THREADS = Foreign("llama.cpp", "--threads", "--threads N")
_CHAT = Foreign("llama.cpp", "--chat", "--chat", otherwise="chat requests go to /v1/chat/completions")
_BATCH = Foreign("llama.cpp", "--max-num-batched-tokens", "--max-num-batched-tokens N")
_STOP = Foreign("llama.cpp", "--stop", "--stop TEXT", "stop")
_GRAMMAR = Foreign("llama.cpp", "--structured-outputs", "--structured-outputs '{\"grammar\": \"root ::= ...\"}' "
                   "(or {\"json\": SCHEMA})", "structured_outputs")
_SYSTEM = Foreign("llama.cpp", otherwise="a system prompt is a chat request's first message (role \"system\") on "
                                         "the server; `specsure generate --chat` sends PROMPT as the user's message")
_LOCAL = Foreign("llama.cpp", otherwise="specsure reads local files only: download the model and pass its path "
                                        "to --model")
_SEQS = Foreign("llama.cpp", "--max-num-seqs", "--max-num-seqs N")
FOREIGN_FLAGS: Final[dict[str, Foreign]] = {
    # llama.cpp (llama-cli, llama-server, llama-speculative)
    "-n": _MAX, "--n-predict": _MAX, "--predict": _MAX,
    "-m": Foreign("llama.cpp", "--model", "--model PATH"),
    "-p": _PROMPT, "--prompt": _PROMPT,
    "-f": Foreign("llama.cpp", otherwise="give - as PROMPT and the file on standard input: specsure generate - < FILE"),
    "--file": Foreign("llama.cpp", otherwise="give - as PROMPT and the file on standard input: "
                                             "specsure generate - < FILE"),
    "--temp": Foreign("llama.cpp", "--temperature", "--temperature T", "temperature"),
    "-c": Foreign("llama.cpp", "--max-model-len", "--max-model-len N", otherwise=_CONTEXT),
    "--ctx-size": Foreign("llama.cpp", "--max-model-len", "--max-model-len N", otherwise=_CONTEXT),
    "-md": Foreign("llama.cpp", otherwise=_DRAFT), "--model-draft": Foreign("llama.cpp", otherwise=_DRAFT),
    "--draft-max": Foreign("llama.cpp", otherwise=_K), "--draft-n": Foreign("llama.cpp", otherwise=_K),
    "--draft-min": Foreign("llama.cpp", otherwise="specsure drafts up to num_speculative_tokens each step"),
    "-t": _THREADS, "-s": Foreign("llama.cpp", "--seed", "--seed N", "seed"),
    "-ngl": Foreign("llama.cpp", otherwise=_CPU), "--n-gpu-layers": Foreign("llama.cpp", otherwise=_CPU),
    "--gpu-layers": Foreign("llama.cpp", otherwise=_CPU), "-ngld": Foreign("llama.cpp", otherwise=_CPU),
    "--n-gpu-layers-draft": Foreign("llama.cpp", otherwise=_CPU),
    "-cnv": _CHAT, "--conversation": _CHAT,
    "--repeat-penalty": Foreign("llama.cpp", "--repetition-penalty", "--repetition-penalty P", "repetition_penalty"),
    "--min-p": Foreign("llama.cpp", "--min-p", "--min-p P", "min_p"),
    "-b": _BATCH, "--batch-size": _BATCH, "-np": _SEQS, "--parallel": _SEQS,
    "--draft": Foreign("llama.cpp", otherwise=_K),
    "-r": _STOP, "--reverse-prompt": _STOP,
    "--grammar": _GRAMMAR, "--grammar-file": _GRAMMAR, "-j": _GRAMMAR, "--json-schema": _GRAMMAR,
    "-sys": _SYSTEM, "--system-prompt": _SYSTEM,
    "--jinja": Foreign("llama.cpp", otherwise="specsure always renders the model's own chat template with Jinja "
                                              "(--chat in `specsure generate`; the chat endpoint when serving)"),
    "-no-cnv": Foreign("llama.cpp", otherwise="`specsure generate` answers one prompt and exits; it has no "
                                              "conversation mode"),
    "-st": Foreign("llama.cpp", otherwise="`specsure generate` answers one prompt and exits"),
    "--single-turn": Foreign("llama.cpp", otherwise="`specsure generate` answers one prompt and exits"),
    "-e": Foreign("llama.cpp", otherwise="the prompt is taken as written; a shell's $'...' writes escapes"),
    "--escape": Foreign("llama.cpp", otherwise="the prompt is taken as written; a shell's $'...' writes escapes"),
    "-fa": Foreign("llama.cpp", otherwise=_CPU), "--flash-attn": Foreign("llama.cpp", otherwise=_CPU),
    "-hf": _LOCAL, "--hf-repo": _LOCAL, "-hfd": _LOCAL, "--hf-repo-draft": _LOCAL,
    "--chat-template": Foreign("llama.cpp", "--chat-template", "--chat-template TEMPLATE",
                               otherwise="`specsure generate --chat` renders the model's own template; "
                                         "`specsure serve --chat-template` replaces it"),
    # vLLM (vllm serve)
    "--max-model-len": Foreign("vLLM", "--max-model-len", "--max-model-len N", otherwise=_CONTEXT),
    "--trust-remote-code": Foreign("vLLM", otherwise="specsure never runs a checkpoint's own code"),
    "--tensor-parallel-size": Foreign("vLLM", otherwise=_ONE_MACHINE), "-tp": Foreign("vLLM", otherwise=_ONE_MACHINE),
    "--pipeline-parallel-size": Foreign("vLLM", otherwise=_ONE_MACHINE),
    "-pp": Foreign("vLLM", otherwise=_ONE_MACHINE), "--gpu-memory-utilization": Foreign("vLLM", otherwise=_CPU),
    "--num-speculative-tokens": Foreign("vLLM", otherwise=_K),
    "--tokenizer": Foreign("vLLM", otherwise="the tokenizer is the model's own (its folder's tokenizer files, or the "
                                             "GGUF's vocabulary)"),
    "--served-model-name": Foreign("vLLM", "--served-model-name", "--served-model-name NAME",
                                   otherwise="`specsure serve --served-model-name` names the served model"),
    "--quantization": Foreign("vLLM", otherwise=_QUANTISED), "-q": Foreign("vLLM", otherwise=_QUANTISED),
    "--load-format": Foreign("vLLM", otherwise="weights load from safetensors or a GGUF file, never from pickle"),
    "--kv-cache-dtype": Foreign("vLLM", otherwise="the KV cache is kept in the model's dtype (--dtype)"),
    "--enforce-eager": Foreign("vLLM", otherwise=f"{_CPU}, with no CUDA graphs to turn off"),
    "--device": Foreign("vLLM", otherwise=_CPU),
    "--seed": Foreign("vLLM", "--seed", "--seed N", "seed"),
    "--enable-chunked-prefill": Foreign("vLLM", "--max-num-batched-tokens", "--max-num-batched-tokens N",
                                        otherwise="`specsure serve --max-num-batched-tokens N` prefills long prompts "
                                                  "in pieces of N tokens between decode steps"),
    "--download-dir": _LOCAL,
}


def foreign_flag_hint(argv: Sequence[str], command: str, command_flags: Collection[str]) -> str | None:
    """The sentence for the first word of ``argv`` (before a ``--``) that is another engine's flag, or
    None. ``command_flags``: the option strings the command itself takes."""
    for word in argv:
        if word == "--":
            return None
        flag = word.split("=", 1)[0]
        if flag not in FOREIGN_FLAGS:
            continue
        if flag in command_flags:  # spelled alike in both engines (--min-p): the command's own
            continue
        foreign = FOREIGN_FLAGS[flag]
        if command == "export" and foreign.engine == "vLLM":
            return (f"{flag} is vLLM's own flag; `specsure export` writes the model and speculative flags only. "
                    f"Give it to vLLM beside them: eval \"vllm serve $(specsure export ...) {flag} ...\".")
        if foreign.flag in command_flags:
            instead = f"use {foreign.usage}"
        elif foreign.field is not None and command.startswith("serve"):
            instead = f"send {foreign.field} in each request"
        elif foreign.field is not None:
            instead = f"`specsure {command}` has no such flag: set {foreign.field} in a request to `specsure serve`, " \
                      f"or SamplingParams({foreign.field}=...) in Python"
        elif foreign.otherwise:
            instead = f"there is no flag for it: {foreign.otherwise}"
        else:
            instead = f"`specsure {command}` has no such flag"
        return f"{flag} is {foreign.engine}'s flag, not one of `specsure {command}`'s; {instead}."
    return None

