"""vLLM's tokenizer routes: POST /tokenize, POST /detokenize and GET /tokenizer_info, at the server's root.

lm-evaluation-harness's `local-completions` looks for /tokenizer_info and /tokenize and then
tokenizes through the server (its "remote" tokenizer backend), so an evaluation needs no copy of
the model's tokenizer on the client: the packaged GGUF model has no Hugging Face name to fetch
one by. The bodies are vLLM's: /tokenize takes a ``prompt`` (or chat ``messages``) and answers
``tokens``, ``count`` and ``max_model_len``; /detokenize takes ``tokens`` and answers ``prompt``.
"""

from __future__ import annotations

from typing import Any, Callable

from fastapi import FastAPI, Request
from starlette.concurrency import run_in_threadpool

from specsure.config.errors import json_type
from specsure.decode.engine import Engine
from specsure.serve.body import flag, parse_json, read_body
from specsure.serve.chat_template import ChatTemplate, parse_template_kwargs, template_flags
from specsure.serve.errors import RequestError, not_served, shown
from specsure.serve.messages import parse_messages
from specsure.serve.tools import parse_tools

TOKENIZE_FIELDS = ("model", "prompt", "messages", "tools", "add_special_tokens", "add_generation_prompt",
                   "continue_final_message", "chat_template_kwargs", "return_token_strs")
DETOKENIZE_FIELDS = ("model", "tokens")


def add_tokenizer_routes(app: FastAPI, engine: Engine, model_name: str, template: ChatTemplate,
                         as_served: Callable[[Any], Any] = lambda body: body) -> None:
    """Register the three routes on ``app`` for ``engine``'s tokenizer; messages render with ``template``,
    as the chat endpoint renders them; ``as_served`` reads another served name as ``model_name``."""

    # The work runs in the thread pool, as the generation routes' parsing does: on the event loop, a
    # 15 MiB prompt held every route, /health included, for seconds.
    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        raw = await read_body(request)
        return await run_in_threadpool(tokenized, raw)

    def tokenized(raw: bytes) -> dict[str, Any]:
        body = _fields(as_served(parse_json(raw)), TOKENIZE_FIELDS, "POST /tokenize", model_name)
        tokenizer = _tokenizer(engine, model_name)
        special = flag(body, "add_special_tokens", True)
        for key in ("tools", "chat_template_kwargs"):
            if body.get(key) is not None and body.get("messages") is None:
                raise RequestError(f"{key} go to the chat template, so they go with messages; send messages, or drop "
                                   f"{key}.", key)
        if (body.get("prompt") is None) == (body.get("messages") is None):
            raise RequestError('send either "prompt" (a string) or "messages" (a chat), e.g. {"prompt": "Hello"}.',
                               "prompt")
        if body.get("messages") is not None:
            messages = parse_messages(body["messages"], answered=False)  # as the chat endpoint reads them
            if not template.text:
                raise RequestError(f"model {model_name!r} has no chat template; send a prompt instead.", "messages")
            tools = parse_tools({"tools": body.get("tools"), "tool_choice": "none"}, None)  # rendered, not called
            opens, continues = template_flags(body)
            ids = template.render(messages, tools, add_generation_prompt=opens, continue_final_message=continues,
                                  variables=parse_template_kwargs(body.get("chat_template_kwargs")))
        else:
            prompt = body["prompt"]
            if not isinstance(prompt, str):
                raise RequestError(f"prompt = {shown(prompt)} is a JSON {json_type(prompt)}; send a string.", "prompt")
            ids = tokenizer(prompt, add_special_tokens=special)["input_ids"]
        tokens = [int(t) for t in ids]
        # vLLM's: each token as the tokenizer spells it (byte-level BPE's "Ġ" for a space), on request.
        strs = tokenizer.convert_ids_to_tokens(tokens) if flag(body, "return_token_strs", False) else None
        return {"count": len(tokens), "max_model_len": engine.target.lm.max_context, "tokens": tokens,
                "token_strs": strs}

    @app.post("/detokenize")
    async def detokenize(request: Request) -> dict[str, Any]:
        raw = await read_body(request)
        return await run_in_threadpool(detokenized, raw)

    def detokenized(raw: bytes) -> dict[str, Any]:
        body = _fields(as_served(parse_json(raw)), DETOKENIZE_FIELDS, "POST /detokenize", model_name)
        tokenizer = _tokenizer(engine, model_name)
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
            raise RequestError(f"tokens = {shown(tokens)} must be a list of token ids (integers), e.g. [9906, 11].",
                               "tokens")
        vocab = engine.target.lm.vocab_size
        outside = [t for t in tokens if not 0 <= t < vocab]
        if outside:
            raise RequestError(f"tokens holds {outside[0]}, outside the model's vocabulary [0, {vocab}).", "tokens")
        return {"prompt": tokenizer.decode(tokens)}

    @app.get("/tokenizer_info")
    async def tokenizer_info() -> dict[str, Any]:
        tokenizer = _tokenizer(engine, model_name)
        info: dict[str, Any] = {"tokenizer_class": type(tokenizer).__name__,
                                "model_max_length": engine.target.lm.max_context,
                                "chat_template": template.shown}
        for key in ("eos_token", "bos_token", "pad_token", "unk_token"):
            value = getattr(tokenizer, key, None)
            info[key] = value if isinstance(value, str) else None
        return info


def _fields(body: Any, allowed: tuple[str, ...], route: str, model_name: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object with the fields of {route}, got "
                           f"{json_type(body)} {shown(body)}.")
    unknown = [k for k in body if k not in allowed]
    if unknown:
        raise RequestError(f"unknown field {unknown[0]!r} in the body of {route}. Fields: {', '.join(allowed)}.",
                           unknown[0], "unknown_field")
    model = body.get("model")
    if model is not None and model != model_name:
        raise not_served(model, repr(model_name))
    return body


def _tokenizer(engine: Engine, model_name: str) -> Any:
    if engine.tokenizer is None:
        raise RequestError(f"model {model_name!r} has no tokenizer files, so it cannot tokenize; send token ids to "
                           "POST /v1/completions instead.", "model")
    return engine.tokenizer
