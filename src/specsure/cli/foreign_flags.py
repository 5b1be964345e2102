"""llama.cpp's and vLLM's flags that specsure spells otherwise or does not have, with what to use.

A user coming from llama.cpp types ``-n 64`` or ``-md draft.gguf`` out of habit; argparse alone
would report the prompt as an unrecognised argument. Each flag here maps to a sentence saying
what specsure takes instead (or why there is nothing to set).
"""

from __future__ import annotations

from typing import Final, Sequence

_MAX = "use --max-tokens N"
_DRAFT = "use --speculative-config '{\"model\": \"DRAFT\"}' (method draft_model)"
_K = "use --speculative-config '{\"num_speculative_tokens\": K, ...}'"
_CONTEXT = ("there is no flag for it: the context is the model's own (config.json max_position_embeddings, or the GGUF's "
            "context_length), and a request's max tokens are lowered to the room it leaves")
_CPU = "there is no flag for it: specsure runs on the CPU"
_ONE_MACHINE = ("there is no flag for it: specsure runs on one machine; `specsure export --to vllm` writes the same config for vLLM "
                "to scale out")

FOREIGN_FLAGS: Final[dict[str, tuple[str, str]]] = {
    # llama.cpp (llama-cli, llama-server, llama-speculative)
    "-n": ("llama.cpp", _MAX), "--n-predict": ("llama.cpp", _MAX), "--predict": ("llama.cpp", _MAX),
    "-m": ("llama.cpp", "use --model PATH"), "-p": ("llama.cpp", "give the prompt as the last argument (PROMPT)"),
    "-c": ("llama.cpp", _CONTEXT), "--ctx-size": ("llama.cpp", _CONTEXT),
    "-md": ("llama.cpp", _DRAFT), "--model-draft": ("llama.cpp", _DRAFT),
    "--draft-max": ("llama.cpp", _K), "--draft": ("llama.cpp", _K), "--draft-n": ("llama.cpp", _K),
    "--draft-min": ("llama.cpp", "there is no flag for it: specsure drafts up to num_speculative_tokens each step"),
    "-t": ("llama.cpp", "use --threads N"), "-s": ("llama.cpp", "use --seed N"),
    "-ngl": ("llama.cpp", _CPU), "--n-gpu-layers": ("llama.cpp", _CPU), "--gpu-layers": ("llama.cpp", _CPU),
    "-ngld": ("llama.cpp", _CPU), "--n-gpu-layers-draft": ("llama.cpp", _CPU),
    "-cnv": ("llama.cpp", "use --chat"), "--conversation": ("llama.cpp", "use --chat"),
    "--repeat-penalty": ("llama.cpp", "use the server's repetition_penalty field, or SamplingParams(repetition_penalty=...)"),
    "--min-p": ("llama.cpp", "use the server's min_p field, or SamplingParams(min_p=...)"),
    "-b": ("llama.cpp", "use --max-num-batched-tokens N (specsure serve)"),
    "--batch-size": ("llama.cpp", "use --max-num-batched-tokens N (specsure serve)"),
    "-np": ("llama.cpp", "use --max-num-seqs N (specsure serve)"), "--parallel": ("llama.cpp", "use --max-num-seqs N (specsure serve)"),
    # vLLM (vllm serve)
    "--max-model-len": ("vLLM", _CONTEXT), "--trust-remote-code": ("vLLM", "there is no flag for it: specsure never runs a "
                                                                           "checkpoint's own code"),
    "--tensor-parallel-size": ("vLLM", _ONE_MACHINE), "-tp": ("vLLM", _ONE_MACHINE),
    "--pipeline-parallel-size": ("vLLM", _ONE_MACHINE), "-pp": ("vLLM", _ONE_MACHINE),
    "--gpu-memory-utilization": ("vLLM", _CPU),
    "--num-speculative-tokens": ("vLLM", _K),
}


def foreign_flag_hint(unknown: Sequence[str], command: str) -> str | None:
    """The sentence for the first of ``unknown`` (words argparse did not take) that is another
    engine's flag, or None."""
    for word in unknown:
        flag = word.split("=", 1)[0]
        if flag in FOREIGN_FLAGS:
            engine, instead = FOREIGN_FLAGS[flag]
            return f"{flag} is {engine}'s flag, not one of `specsure {command}`'s; {instead}."
    return None
