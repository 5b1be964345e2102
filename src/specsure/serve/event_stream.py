"""A streamed answer (chat, completion or response): server-sent events fed by the engine thread as steps are verified."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Any

from fastapi.responses import JSONResponse
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from specsure.decode.completion import Completion, TokenLogprob
from specsure.decode.detokenize import TextDeltas
from specsure.decode.engine import StepUpdate
from specsure.decode.metrics import SpecStats
from specsure.serve.errors import APIError, error_body
from specsure.serve.response_object import ResponseEvents
from specsure.serve.responses import ChunkWriter, Echo
from specsure.serve.runner import ClientGone, EngineRunner, Job
from specsure.serve.reasoning import ReasoningStream
from specsure.serve.tool_calls import ToolCallStream

logger = logging.getLogger(__name__)


class EventStream(Response):
    """A streamed answer: server-sent events fed by the engine thread, one per step with new text.

    The headers wait for the first choice's first step, so an error before it (the timeout
    passing in the queue) still gets its HTTP status; later errors are an ``error`` event, then
    ``[DONE]``. A client that disconnects cancels every choice, and the engine drops them before
    its next step.
    """

    media_type = "text/event-stream"

    def __init__(self, runner: EngineRunner, jobs: list[Job], writer: ChunkWriter | ResponseEvents,
                 texts: list[TextDeltas | None], echoes: list[Echo] | None = None, prompt_only: bool = False,
                 calls: list[ToolCallStream] | None = None, thoughts: list[ReasoningStream] | None = None,
                 include_reasoning: bool = True) -> None:
        self.status_code, self.background = 200, None
        self.init_headers({"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._runner, self._jobs, self._writer, self._texts = runner, jobs, writer, texts
        self._ids: list[list[int]] = [[] for _ in jobs]  # token ids not yet in a chunk: their text is held back
        self._logprobs: list[list[TokenLogprob]] = [[] for _ in jobs]
        self._completions: list[Completion | None] = [None] * len(jobs)
        self._prompt_only = prompt_only
        self._calls = calls
        """Each chat choice's text split into content and tool calls, when the request offers tools."""
        self._thoughts, self._include_reasoning = thoughts, include_reasoning
        """Each chat choice's text split into reasoning and content, when it starts inside the thinking."""
        self._echoes: list[Echo | None] = list(echoes) if echoes is not None else [None] * len(jobs)
        """Each choice's prompt to send before its first output (echo), until it is sent."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gone = asyncio.ensure_future(disconnected(receive))
        self._send = send
        try:
            try:
                update = await self._runner.next_update(self._jobs[0], gone)
            except APIError as exc:
                await JSONResponse(exc.to_body(), exc.status, headers=exc.headers)(scope, receive, send)
                return
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            await self._chunk(self._writer.start())
            await self._chunk(await self._events(update, gone))
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except ClientGone:
            pass
        finally:
            gone.cancel()
            for job in self._jobs:
                self._runner.cancel(job)

    async def _events(self, first: StepUpdate, gone: asyncio.Future[None]) -> bytes:
        """Send a chunk per step with new text, for whichever choice has one; return the last events."""
        await self._chunk(self._step(0, first))
        waiting: dict[asyncio.Future[StepUpdate], int] = {}
        for i, job in enumerate(self._jobs):
            if self._completions[i] is None:
                waiting[asyncio.ensure_future(self._runner.next_update(job, gone))] = i
        try:
            while waiting:
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                for future in done:
                    i = waiting.pop(future)
                    events = self._step(i, future.result())
                    if self._completions[i] is None:
                        waiting[asyncio.ensure_future(self._runner.next_update(self._jobs[i], gone))] = i
                    await self._chunk(events)
        except APIError as exc:
            return self._writer.failed(exc.to_body())
        except ClientGone:
            raise
        except Exception as exc:
            logger.exception("streamed request failed")
            return self._writer.failed(internal_error(exc))
        finally:
            for future in waiting:
                future.cancel()
        return self._writer.end([c for c in self._completions if c is not None])

    def _step(self, i: int, update: StepUpdate) -> bytes:
        """Choice i's events for one update: a delta once text is final, or its finish chunk."""
        echo, self._echoes[i] = self._echoes[i], None
        if echo is None:
            return self._delta(i, update)
        assert isinstance(self._writer, ChunkWriter)  # only completions echo
        head = self._writer.echo(i, echo, update.prompt_logprobs)
        return head + self._delta(i, update)

    def _delta(self, i: int, update: StepUpdate) -> bytes:
        if self._prompt_only:  # the one token generated is not part of the answer
            if update.completion is None:
                return b""
            completion = self._completions[i] = without_output(update.completion)
            return self._writer.finish(i, completion, "", [], [] if completion.logprobs is not None else None)
        ids, logprobs, text = self._ids[i], self._logprobs[i], self._texts[i]
        ids += update.token_ids
        logprobs += update.logprobs or []
        calls = self._calls[i] if self._calls is not None else None
        if update.completion is None:
            delta = text.push(update.token_ids) if text is not None else None
            if not delta and text is not None:
                return b""
            pieces = self._pieces(i, delta or "", final=False)
            if pieces is not None and not pieces:
                return b""  # inside a call, or a tag still arriving: its tokens' logprobs wait with it
            self._ids[i], self._logprobs[i] = [], []
            return self._writer.delta(i, delta, ids, logprobs or None, pieces)
        completion = self._completions[i] = update.completion
        rest = text.finish(completion.text) if text is not None else None
        pieces = self._pieces(i, rest or "", final=True)
        reason = calls.finish_reason(completion.finish_reason) if calls is not None else None
        return self._writer.finish(i, completion, rest, ids, logprobs or None, pieces, reason)

    def _pieces(self, i: int, text: str, final: bool) -> list[dict[str, Any]] | None:
        """Choice i's chat deltas for ``text``: its reasoning, then its content or calls; None when the
        text is only content (no tools, no reasoning parser)."""
        thought = self._thoughts[i] if self._thoughts is not None else None
        calls = self._calls[i] if self._calls is not None else None
        if thought is None and calls is None:
            return None
        reasoning, content = ("", text) if thought is None else thought.push(text)
        if final and thought is not None:
            more, rest = thought.finish()
            reasoning, content = reasoning + more, content + rest
        out: list[dict[str, Any]] = [{"reasoning": reasoning}] if reasoning and self._include_reasoning else []
        # A named call opens with its first text: an answer still thinking (or that never stops) has none.
        if calls is not None and (content or (final and (calls.named is None or thought is None))):
            out += calls.deltas(content, final=final)
        elif calls is None and content:
            out.append({"content": content})
        return out

    async def _chunk(self, events: bytes) -> None:
        if events:
            await self._send({"type": "http.response.body", "body": events, "more_body": True})


def internal_error(exc: Exception) -> dict[str, Any]:
    """The 500 body: the exception's type only; the traceback goes to the server log."""
    return error_body(f"internal server error ({type(exc).__name__}); the server log has the details. This is a "
                      "specsure bug; please report it.", kind="internal_server_error")


async def disconnected(receive: Receive) -> None:
    """Returns once the client has gone (the body was read before, so nothing else arrives)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def without_output(completion: Completion) -> Completion:
    """A choice of an echo with max_tokens 0: its prompt alone, the token generated with it left out
    (of its figures too: nothing was generated for the client, and no step drafted)."""
    return replace(completion, text="" if completion.text is not None else None, token_ids=[], finish_reason="length", stop_reason=None,
                   logprobs=[] if completion.logprobs is not None else None,
                   stats=SpecStats(elapsed_s=completion.stats.elapsed_s))
