"""The FastAPI app: OpenAI-compatible routes over one Engine.

The server is a thin layer: it never resolves configuration (it reads ``engine.resolution``) and
never validates sampling values itself (``SamplingParams`` does). A request is parsed, its prompt
tokenized and fitted to the context, then queued on the ``EngineRunner``, whose thread runs
the engine's scheduler (continuous batching); the event loop stays free for /health, /metrics and for
admitting or refusing the next request.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any, Callable, Mapping, Sequence

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from specsure.config.checkpoint import DEFAULT_MODEL_NAME
from specsure.decode.completion import Completion
from specsure.decode.detokenize import TextDeltas
from specsure.decode.engine import Engine, PromptError
from specsure.sampling import SamplingParams
from specsure.serve.api_key import RequireKey, checked_keys
from specsure.serve.body import parse_json, read_body
from specsure.serve.chat_template import ChatTemplate
from specsure.serve.errors import APIError, RequestError, error_body, not_served
from specsure.serve.metrics import ServeMetrics
from specsure.serve.generation_defaults import check_generation_defaults, with_defaults, within_limit
from specsure.serve.http_metrics import CountRequests, HttpMetrics
from specsure.serve.prompt_ids import check_params, choice_params, encode_prompt, prompt_text
from specsure.serve.protocol import (
    CHAT_FIELDS, COMPLETION_FIELDS, ChatRequest, Delivery, fit_to_context, parse_chat, parse_completion,
)
from specsure.serve.response_background import BackgroundResponses
from specsure.serve.response_items import page
from specsure.serve.response_object import ResponseEvents, ResponseHead, as_messages
from specsure.serve.response_request import FIELDS as RESPONSE_FIELDS
from specsure.serve.response_request import ResponseRequest, in_responses_words, parse_response, truncated
from specsure.serve.response_store import ResponseStore
from specsure.serve.event_stream import EventStream, disconnected, internal_error, without_output
from specsure.serve.responses import ChunkWriter, Echo, Endpoint, chat_body, completion_body, token_text_of
from specsure.serve.runner import ClientGone, EngineRunner
from specsure.serve.info_routes import add_info_routes
from specsure.serve.tokenizer_routes import add_tokenizer_routes
from specsure.serve.reasoning import END, TAIL_TOKENS, ReasoningStream, Thinking, check_reasoning_parser, \
    reasoning_tokens, split_answer, thinks
from specsure.serve.tool_calls import Answer, ToolCall, ToolCallStream, parse_answer
from specsure.serve.tools import Tools

ROUTES = ("GET /v1/models, POST /v1/completions, POST /v1/chat/completions, POST /v1/responses, GET and DELETE "
          "/v1/responses/{id}, GET /v1/responses/{id}/input_items, POST /v1/responses/{id}/cancel, POST /tokenize, "
          "POST /detokenize, "
          "GET /tokenizer_info, GET or HEAD /health, GET /version and GET /metrics")

DEFAULT_MAX_QUEUE = 64
"""Requests that may wait for a place in the running batch before the next is refused with a 503."""


def default_model_name(engine: Engine) -> str:
    """The --model string as given (as vLLM does), or the packaged default model's name."""
    return engine.resolution.target_model or DEFAULT_MODEL_NAME


def create_app(engine: Engine, *, served_model_name: str | Sequence[str] | None = None,
               api_key: str | Sequence[str] | None = None,
               max_queue: int = DEFAULT_MAX_QUEUE, request_timeout: float | None = None,
               threads: int | None = None, chat_template: str | None = None,
               tool_call_parser: str | None = None, reasoning_parser: str | None = None,
               allowed_origins: Sequence[str] = (), log_stats: bool = True,
               generation_defaults: Mapping[str, Any] | None = None,
               model_defaults: Mapping[str, Any] | None = None) -> FastAPI:
    """An OpenAI-compatible app serving ``engine``.

    Args:
        engine: built by ``make_engine``; the app reads its resolution and never re-resolves.
        served_model_name: the name clients send as ``model``, or several (vLLM's --served-model-name
            takes a list): clients may send any of them, and answers, /v1/models' first card and the
            metrics carry the first; default: ``default_model_name``.
        api_key: when set (a key, or several of which any is accepted), every /v1/* and tokenizer request
            needs ``Authorization: Bearer <api_key>``;
            /health and /metrics stay open.
        max_queue: requests that may wait for a place in the running batch (``engine.max_num_seqs``);
            one more is a 503.
        request_timeout: seconds from arrival (queueing included) after which a request is
            stopped and answered with an error (docs/serving.md); None waits as long as it takes.
        threads: torch threads for the engine thread, which runs every forward; None keeps what
            it inherits. Load the model with one thread and pass the count here (as `specsure
            serve` does): see `specsure.serve.runner` for why.
        chat_template: a Jinja chat template that replaces the tokenizer's (vLLM's --chat-template).
        tool_call_parser: the format in which the model writes calls (``hermes``); set, it turns on
            ``tool_choice: auto`` (vLLM's --enable-auto-tool-choice --tool-call-parser).
        reasoning_parser: how the model's thinking is told from its answer (``deepseek_r1``,
            ``qwen3``); set, chat answers carry ``reasoning``, and constraints apply after it.
        allowed_origins: the web origins whose pages may call the server from a browser (CORS,
            vLLM's --allowed-origins; ``"*"`` for any); none by default, as in vLLM 0.33, since a page
            on any site could otherwise use a local model.
        log_stats: log vLLM's periodic throughput and acceptance lines (every $VLLM_LOG_STATS_INTERVAL
            seconds, 10 by default) while requests run; False is vLLM's --disable-log-stats.
        generation_defaults: what a request that leaves a sampling field out (or null) gets, as vLLM's
            --override-generation-config gives it (temperature, top_p, top_k, min_p, the three penalties,
            skip_special_tokens), and max_new_tokens, a chat request's default max_tokens and every
            request's limit. Without it such a request decodes greedily (temperature 0), where vLLM and
            OpenAI sample at 1.0.
        model_defaults: the model's own generation config, as vLLM's --generation-config auto reads it
            (specsure.models.sampling_defaults), under generation_defaults: the same fields, but its
            max_new_tokens is only the default of a chat request, no limit (vLLM 0.33.0).
    """
    if type(max_queue) is not int or max_queue < 0:
        raise ValueError(f"max_queue = {max_queue!r} must be an int >= 0 (0: no request waits).")
    if request_timeout is not None and not request_timeout > 0:
        raise ValueError(f"request_timeout = {request_timeout!r} must be a number of seconds > 0, or None.")
    if threads is not None and (type(threads) is not int or threads < 1):
        raise ValueError(f"threads = {threads!r} must be an int >= 1, or None.")
    override = check_generation_defaults(generation_defaults)
    defaults = {**check_generation_defaults(model_defaults, "the model's generation config"), **override}
    names = [served_model_name] if isinstance(served_model_name, str) else list(served_model_name or ())
    if not all(isinstance(n, str) and n for n in names) or len(set(names)) < len(names):
        raise ValueError(f"served_model_name = {served_model_name!r} must be a name, or a list of distinct names.")
    names = names or [default_model_name(engine)]
    name = names[0]

    def as_served(body: Any) -> Any:
        """The body with another of the served names read as the first, which every answer carries; a
        404 naming every served name for a model that is none of them."""
        model = body.get("model") if isinstance(body, dict) else None
        if model in names[1:]:
            return {**body, "model": name}
        if model is not None and model != name and len(names) > 1:
            raise not_served(model, " or ".join(map(repr, names)))
        return body
    template = ChatTemplate(engine, chat_template, tool_call_parser)
    if reasoning_parser is not None:
        check_reasoning_parser(reasoning_parser, engine.tokenizer, template.text)
    parser = tool_call_parser or "hermes"  # without one, auto is refused and no answer is read with it
    metrics = ServeMetrics(engine, name)
    runner = EngineRunner(engine, metrics, max_queue, request_timeout, threads, log_stats)
    method = engine.speculative_method
    stored = ResponseStore()
    background = BackgroundResponses(runner, stored)
    started = int(time.time())

    # No /docs or /openapi.json: the routes parse bodies themselves, so the schema would say nothing.
    app = FastAPI(title="specsure", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.engine, app.state.metrics, app.state.model_name, app.state.runner = engine, metrics, name, runner
    if api_key is not None:
        app.add_middleware(RequireKey, api_key=checked_keys(api_key))  # checked now: the stack is built later
    # outside the key check, so a 401 is counted too
    app.add_middleware(CountRequests, metrics=HttpMetrics(metrics.registry), routes=app.router.routes)
    if allowed_origins:  # added last, so it runs first: a browser's preflight carries no key
        app.add_middleware(CORSMiddleware, allow_origins=list(allowed_origins), allow_methods=["*"],
                           allow_headers=["*"])

    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.to_body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        message = str(exc.detail)
        if exc.status_code in (404, 405) and message in ("Not Found", "Method Not Allowed"):
            said = "no such route" if exc.status_code == 404 else "that method is not allowed there"
            message = f"{request.method} {request.url.path}: {said}; this server has {ROUTES}."
        return JSONResponse(error_body(message), status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def server_error(_: Request, exc: Exception) -> JSONResponse:
        # No log line here: Starlette raises the exception on after this answer, and the server
        # (uvicorn) logs it with its traceback; logging here too printed every traceback twice.
        return JSONResponse(internal_error(exc), status_code=500)

    add_tokenizer_routes(app, engine, name, template, as_served)

    add_info_routes(app, engine, names, metrics, started)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        # A structured output's schema compiles while parsing (up to about a second): off the event loop.
        raw = await read_body(request)  # parsed in the thread pool: a large body would hold the event loop
        req = await run_in_threadpool(lambda: parse_completion(
            with_defaults(defaults, as_served(parse_json(raw)), COMPLETION_FIELDS), name))
        check_params(engine, req.params)
        names = ["prompt"] if len(req.prompts) == 1 else [f"prompt[{i}]" for i in range(len(req.prompts))]
        cut = req.delivery.truncate_prompt_tokens
        prompts = [await run_in_threadpool(encode_prompt, engine, p, f"the {name}" if len(names) == 1 else name, "prompt",
                                           cut) for p, name in zip(req.prompts, names)]
        # A truncated prompt is echoed as what the model saw: its kept tokens, decoded.
        echoes = [Echo(prompt_text(engine, given if cut is None else ids, ids), ids, req.params.logprobs)
                  for given, ids in zip(req.prompts, prompts)] if req.echo else None
        return await answer(request, "completion", list(zip(prompts, names)), req.params, req.delivery, echoes,
                            req.prompt_only)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        raw = await read_body(request)
        req = await run_in_threadpool(lambda: parse_chat(with_defaults(defaults, as_served(parse_json(raw)), CHAT_FIELDS),
                                                         name, tool_call_parser, template.special_tags))
        prompt, params, thinking = await rendered(req)
        return await answer(request, "chat", [(prompt, "messages")], params, req.delivery, tools=req.tools,
                            thinking=thinking)

    @app.post("/v1/responses")
    async def create_response(request: Request) -> Response:
        raw = await read_body(request)
        req = await run_in_threadpool(lambda: parse_response(
            with_defaults(defaults, as_served(parse_json(raw)), RESPONSE_FIELDS), name, stored.conversation,
                                                             tool_call_parser, template.special_tags))
        chat = req.chat
        if req.truncate:
            chat = replace(chat, messages=await run_in_threadpool(truncated, chat.messages, fits(req)))
        try:
            prompt, params, thinking = await rendered(chat)
        except RequestError as exc:
            raise in_responses_words(exc) from None
        return await answer(request, "response", [(prompt, "input")], params, req.chat.delivery, tools=req.chat.tools,
                            thinking=thinking, response=req)

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str) -> dict[str, Any]:
        return stored.get(response_id).body

    @app.get("/v1/responses/{response_id}/input_items")
    async def list_input_items(response_id: str, request: Request) -> dict[str, Any]:
        query = request.query_params
        return page(stored.get(response_id).input_items, query.get("after"), query.get("limit"), query.get("order"))

    @app.post("/v1/responses/{response_id}/cancel")
    async def cancel_response(response_id: str) -> dict[str, Any]:
        return await background.cancel(response_id)

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str) -> dict[str, Any]:
        await background.stop(response_id)  # a running one first: its job freed, its later states not kept
        stored.delete(response_id)
        return {"id": response_id, "object": "response", "deleted": True}

    async def rendered(req: ChatRequest) -> tuple[list[int], SamplingParams, Thinking | None]:
        """A chat request's prompt, and its sampling and thinking as the reasoning parser reads the prompt."""
        template.check(name)
        check_params(engine, req.params)
        rendered = await run_in_threadpool(template.render, req.messages, req.tools, req.add_generation_prompt,
                                           req.template_kwargs, req.continue_final_message)
        prompt = await run_in_threadpool(encode_prompt, engine, rendered, "the prompt rendered from messages", "messages",
                                         req.delivery.truncate_prompt_tokens)
        params, thinking = req.params, None
        if reasoning_parser is not None:
            # A prefilled reply may have closed its thinking anywhere in it: read all of it then.
            seen = prompt if req.continue_final_message else prompt[-TAIL_TOKENS:]
            tail = engine.tokenizer.decode(seen, skip_special_tokens=False)
            thinking = Thinking(thinks(reasoning_parser, tail, req.template_kwargs), req.include_reasoning,
                                calls_end=reasoning_parser == "qwen3")
            if not thinking.include and params.logprobs is not None:
                # Each token's text names it: the thinking's logprobs would show what the request hid (vLLM's rule).
                params = replace(params, logprobs=None)
            if thinking.starts_inside and params.structured_outputs is not None:
                # The thinking is free; the constraint (or the tool call it enforces) starts after it.
                constraint = await run_in_threadpool(replace, params.structured_outputs, after=END)
                params = replace(params, structured_outputs=constraint)
        return prompt, params, thinking

    async def answer(request: Request, endpoint: Endpoint, prompts: list[tuple[list[int], str]],
                     params: SamplingParams, delivery: Delivery, echoes: list[Echo] | None = None,
                     prompt_only: bool = False, tools: Tools | None = None,
                     thinking: Thinking | None = None, response: ResponseRequest | None = None) -> Response:
        """Generate ``delivery.n`` choices for each (prompt, its name in the body), side by side; each
        choice after its prompt's echo, if ``echoes``; with ``prompt_only``, the echo alone; a chat
        answer split into reasoning and content under ``thinking``; ``response``: the Responses
        request the one answer is for."""
        params = within_limit(defaults, params, delivery.max_tokens_field is not None, endpoint == "completion",
                              override.get("max_new_tokens"))
        each = None if echoes is None else [e for e in echoes for _ in range(delivery.n)]  # one per choice
        context = engine.target.lm.max_context
        # A background response is fed step by step too, so that it shows in_progress after its first step.
        stepwise = delivery.stream or (response is not None and response.background)
        jobs = runner.submit([(prompt, choice_params(fit_to_context(params, len(prompt), context, delivery, name),
                                                     delivery.n)) for prompt, name in prompts], stepwise)
        text = token_text_of(engine.tokenizer, params.skip_special_tokens)
        counted = None if thinking is None else \
            (lambda c: reasoning_tokens(engine.tokenizer, c.token_ids, thinking))  # type: ignore[arg-type]

        def response_body(head: ResponseHead, completion: Completion) -> dict[str, Any]:
            """The finished response object: the answer split into reasoning, content and calls."""
            assert response is not None
            reasoning, content = split_answer(thinking.starts_inside, completion.text or "", thinking.calls_end) \
                if thinking is not None else (None, completion.text)
            calls: list[ToolCall] = []
            if tools is not None and content is not None:
                found = parse_answer(tools, content, completion.finish_reason, parser)
                content, calls = found.content, found.tool_calls
            return head.finished(completion, reasoning if thinking is None or thinking.include else None, content,
                                 calls, text if response.logprobs else None, counted)

        if response is not None and response.background:
            head = ResponseHead(name, method, response.settings)
            return JSONResponse(background.start(head, jobs[0], response, lambda c: response_body(head, c)))
        if delivery.stream:
            deltas = [TextDeltas(engine.tokenizer, params.stop, params.skip_special_tokens)
                      if engine.tokenizer is not None else None
                      for _ in jobs]
            lengths = [len(prompt) for prompt, _ in prompts for _ in range(delivery.n)]  # each choice's prompt
            writer: ChunkWriter | ResponseEvents
            if response is not None:
                thought = None if thinking is None else \
                    (lambda ids: reasoning_tokens(engine.tokenizer, ids, thinking))  # type: ignore[arg-type]
                writer = ResponseEvents(ResponseHead(name, method, response.settings), text,
                                        response.logprobs and params.logprobs is not None, thought,
                                        lambda body: keep(response, body))
            else:
                writer = ChunkWriter(endpoint, name, method, delivery.include_usage, text, len(jobs), delivery.n,
                                     lengths if delivery.continuous_usage else None, counted,
                                     request_id=delivery.request_id)
            calls = [ToolCallStream(tools, parser) for _ in jobs] if tools is not None else None
            # An answer that does not start inside its thinking is all content: nothing to split.
            thoughts = [ReasoningStream(True, thinking.calls_end) for _ in jobs] \
                if thinking is not None and thinking.starts_inside else None
            return EventStream(runner, jobs, writer, deltas, each, prompt_only, calls, thoughts,
                               thinking is None or thinking.include)
        gone = asyncio.ensure_future(disconnected(request.receive))
        try:
            completions = []
            for job in jobs:  # they generate side by side; waiting in order loses nothing
                while (update := await runner.next_update(job, gone)).completion is None:
                    pass
                completions.append(update.completion)
        except ClientGone:
            return Response(status_code=499)  # nginx's "client closed request"; nobody reads it
        finally:
            gone.cancel()
            for job in jobs:
                runner.cancel(job)
        if prompt_only:
            completions = [without_output(c) for c in completions]
        if response is not None:
            body = response_body(ResponseHead(name, method, response.settings), completions[0])
            keep(response, body)
            return JSONResponse(body)
        if endpoint != "completion":
            parts = [split_answer(thinking.starts_inside, c.text or "", thinking.calls_end) if thinking is not None
                     else (None, c.text)
                     for c in completions]
            # An answer that never left its thinking has no content, so no call either.
            answers = None if tools is None else [
                parse_answer(tools, content, c.finish_reason, parser) if content is not None
                else Answer(None, [], c.finish_reason) for (_, content), c in zip(parts, completions)]
            if thinking is not None:
                thoughts = [reasoning if thinking.include else None for reasoning, _ in parts]
                return JSONResponse(chat_body(completions, name, method, text, answers,
                                              [content for _, content in parts], thoughts, counted,
                                              prompt_top=delivery.prompt_logprobs, request_id=delivery.request_id))
            return JSONResponse(chat_body(completions, name, method, text, answers,
                                          prompt_top=delivery.prompt_logprobs, request_id=delivery.request_id))
        return JSONResponse(completion_body(completions, name, method, text, delivery.n, each,
                                            prompt_top=delivery.prompt_logprobs, request_id=delivery.request_id))

    def fits(req: ResponseRequest) -> Callable[[list[dict[str, Any]]], bool]:
        """Whether messages rendered leave the room a response needs in the context: its
        max_output_tokens if it sent one, else one token."""
        context, chat = engine.target.lm.max_context, req.chat
        # Without max_output_tokens, room for an answer of a quarter of the context (or the default, if less).
        need = chat.params.max_tokens if chat.delivery.max_tokens_field else \
            max(1, min(chat.params.max_tokens, (context or 0) // 4))

        def check(messages: list[dict[str, Any]]) -> bool:
            if not context:
                return True
            text = template.render(messages, chat.tools, chat.add_generation_prompt, chat.template_kwargs,
                                   chat.continue_final_message)
            try:
                return len(engine.encode(text)) + need <= context
            except PromptError:  # too long for the context: truncate more
                return False
        return check

    def keep(req: ResponseRequest, body: dict[str, Any]) -> None:
        if req.store:
            stored.put(body, req.conversation + as_messages(body["output"]), req.input_items)

    return app
