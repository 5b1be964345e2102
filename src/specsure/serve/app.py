"""The FastAPI app: OpenAI-compatible routes over one Engine.

The server is a thin layer: it never resolves configuration (it reads ``engine.resolution``) and
never validates sampling values itself (``SamplingParams`` does). One engine runs at batch size 1,
so generation is serialised by a lock and runs in a worker thread; the event loop stays free for
/health, /metrics and for queueing the next request.
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
import time
from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from specsure.config.checkpoint import DEFAULT_MODEL_NAME
from specsure.decode.engine import Completion, Engine, ParamsError, PromptError
from specsure.sampling import SamplingParams
from specsure.serve.metrics import ServeMetrics
from specsure.serve.protocol import RequestError, chat_body, completion_body, error_body, parse_chat, parse_completion

logger = logging.getLogger(__name__)


def default_model_name(engine: Engine) -> str:
    """The --model string as given (as vLLM does), or the packaged default model's name."""
    return engine.resolution.target_model or DEFAULT_MODEL_NAME


class EngineRunner:
    """Runs one generation at a time on the engine (batch size 1), counting queue and run in metrics."""

    def __init__(self, engine: Engine, metrics: ServeMetrics) -> None:
        self.engine = engine
        self.metrics = metrics
        self._lock = threading.Lock()

    def complete(self, prompt: str | list[int], params: SamplingParams) -> Completion:
        return self._locked(lambda: self._generate(prompt, params, "the prompt", "prompt"))

    def chat(self, messages: list[dict[str, str]], params: SamplingParams) -> Completion:
        return self._locked(lambda: self._generate(self._render(messages), params,
                                                   "the prompt rendered from messages", "messages"))

    def _locked(self, work: Callable[[], Completion]) -> Completion:
        with self.metrics.queued():
            self._lock.acquire()
        try:
            with self.metrics.generating():
                return work()
        finally:
            self._lock.release()

    def _generate(self, prompt: str | list[int], params: SamplingParams, subject: str, param: str) -> Completion:
        try:
            return self.engine.generate(prompt, params)[0]
        except PromptError as exc:
            # Only prompt problems are the client's; any other error inside the loop is a bug (a 500).
            raise RequestError(f"{subject} {exc.detail}", param) from None

    def _render(self, messages: list[dict[str, str]]) -> list[int]:
        from jinja2 import TemplateError  # transformers renders chat templates with jinja2

        try:
            ids = self.engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                            return_dict=False)
        except TemplateError as exc:
            raise RequestError(f"the model's chat template rejected these messages: {exc}. Fix the messages "
                               "(for example the order of roles), or use POST /v1/completions with a plain "
                               "prompt.", "messages") from None
        return list(ids)


def create_app(engine: Engine, *, served_model_name: str | None = None, api_key: str | None = None) -> FastAPI:
    """An OpenAI-compatible app serving ``engine``.

    Args:
        engine: built by ``make_engine``; the app reads its resolution and never re-resolves.
        served_model_name: the name clients send as ``model``; default: ``default_model_name``.
        api_key: when set, every /v1/* request needs ``Authorization: Bearer <api_key>``;
            /health and /metrics stay open.
    """
    name = served_model_name or default_model_name(engine)
    metrics = ServeMetrics(engine, name)
    runner = EngineRunner(engine, metrics)
    started = int(time.time())
    # No /docs or /openapi.json: the routes parse bodies themselves, so the schema would say nothing.
    app = FastAPI(title="specsure", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.engine, app.state.metrics, app.state.model_name = engine, metrics, name

    @app.middleware("http")
    async def check_api_key(request: Request, call_next):  # noqa: ANN001, ANN202 - starlette's types
        if api_key and request.url.path.startswith("/v1/") and not _authorised(request, api_key):
            return JSONResponse(error_body("missing or wrong API key: send the header 'Authorization: Bearer "
                                           "<key>' with the key the server was started with (--api-key or "
                                           "SPECSURE_API_KEY).", code="invalid_api_key"),
                                status_code=401, headers={"WWW-Authenticate": "Bearer"})
        return await call_next(request)

    @app.exception_handler(RequestError)
    async def bad_request(_: Request, exc: RequestError) -> JSONResponse:
        return JSONResponse(exc.to_body(), status_code=400)

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse(error_body(str(exc.detail)), status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def server_error(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("request failed")
        return JSONResponse(error_body(f"internal server error ({type(exc).__name__}); the server log has the "
                                       "details. This is a specsure bug; please report it.",
                                       kind="internal_server_error"), status_code=500)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        res = engine.resolution
        card = {"id": name, "object": "model", "created": started, "owned_by": "specsure",
                "root": str(res.decisions["target"].value), "max_model_len": engine.target.lm.max_context or None,
                "speculative": {"method": engine.speculative_method, "fields": res.to_dict(),
                                "warnings": list(res.warnings)}}
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions")
    async def completions(request: Request) -> dict[str, Any]:
        req = parse_completion(await _json(request), name)
        _check_params(engine, req.params)
        arrived = time.perf_counter()
        completion = await run_in_threadpool(runner.complete, req.prompt, req.params)
        metrics.observe(completion, time.perf_counter() - arrived)
        return completion_body(completion, name, engine.speculative_method)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> dict[str, Any]:
        req = parse_chat(await _json(request), name)
        tok = engine.tokenizer
        if tok is None or not getattr(tok, "chat_template", None):
            raise RequestError(f"model {name!r} has no chat template (no tokenizer, or one without "
                               "chat_template), so messages cannot be rendered; use POST /v1/completions.",
                               "messages")
        _check_params(engine, req.params)
        arrived = time.perf_counter()
        completion = await run_in_threadpool(runner.chat, req.messages, req.params)
        metrics.observe(completion, time.perf_counter() - arrived)
        return chat_body(completion, name, engine.speculative_method)

    return app


async def _json(request: Request) -> Any:
    raw = await request.body()
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(f"the request body is not valid JSON ({exc}); send a JSON object such as "
                           '{"prompt": "Hello", "max_tokens": 16}.') from None
    except RecursionError:
        raise RequestError("the request body nests too deeply to parse; send a JSON object such as "
                           '{"prompt": "Hello", "max_tokens": 16}.') from None


def _check_params(engine: Engine, params: SamplingParams) -> None:
    try:
        engine.check_params(params)
    except ParamsError as exc:
        raise RequestError(str(exc), exc.field) from None


def _authorised(request: Request, api_key: str) -> bool:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), api_key.encode())
