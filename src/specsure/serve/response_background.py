"""Responses run with ``"background": true``: answered at once, generated on, kept in the store.

The first answer is the response ``queued``; ``GET /v1/responses/{id}`` then shows it ``in_progress``
once the engine has run its first step, and ``completed`` or ``incomplete`` (with its output),
``failed`` (with the error: the request timeout, an engine failure) or ``cancelled`` at the end.
``POST /v1/responses/{id}/cancel`` stops one that is still running, as a client that goes away
stops a request in the foreground, and returns one that has ended as it ended; ``DELETE`` stops it
before it forgets it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from specsure.decode.completion import Completion
from specsure.serve.errors import APIError, RequestError
from specsure.serve.response_object import ResponseHead, as_messages
from specsure.serve.response_request import ResponseRequest
from specsure.serve.response_store import ResponseStore
from specsure.serve.runner import ClientGone, EngineRunner, Job

logger = logging.getLogger(__name__)


class BackgroundResponses:
    """The background responses of one server: each a task that waits on its job and stores its state."""

    def __init__(self, runner: EngineRunner, store: ResponseStore) -> None:
        self._runner, self._store = runner, store
        self._running: dict[str, tuple[asyncio.Future[None], asyncio.Future[None]]] = {}
        """Each running response's stop signal and task, by id."""

    def start(self, head: ResponseHead, job: Job, req: ResponseRequest,
              finish: Callable[[Completion], dict[str, Any]]) -> dict[str, Any]:
        """Store ``head``'s response as queued, run ``job`` on in the background, and return the queued
        object; ``finish`` makes the final object from the completion."""
        queued = head.body("queued", [])
        self._store.put(queued, req.conversation, req.input_items)
        stop: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._running[head.id] = (stop, asyncio.ensure_future(self._run(head, job, req, finish, stop)))
        return queued

    async def _run(self, head: ResponseHead, job: Job, req: ResponseRequest,
                   finish: Callable[[Completion], dict[str, Any]], stop: asyncio.Future[None]) -> None:
        try:
            update = await self._runner.next_update(job, stop)
            self._store.put(head.body("in_progress", []), req.conversation, req.input_items)
            while update.completion is None:
                update = await self._runner.next_update(job, stop)
            body = finish(update.completion)
            self._store.put(body, req.conversation + as_messages(body["output"]), req.input_items)
        except ClientGone:  # the cancel route's stop signal
            self._store.put(head.body("cancelled", []), req.conversation, req.input_items)
        except Exception as exc:  # the request timeout (an APIError) or the engine's own failure
            if not isinstance(exc, APIError):
                logger.error("background response %s failed", head.id, exc_info=exc)
            message = str(exc) if isinstance(exc, APIError) else "the engine failed; the server's log has the cause"
            error = {"code": "server_error", "message": message}  # one of the codes the client's types know
            self._store.put(head.body("failed", [], error=error), req.conversation, req.input_items)
        finally:
            self._runner.cancel(job)
            self._running.pop(head.id, None)

    async def cancel(self, response_id: str) -> dict[str, Any]:
        """Stop a running background response and return its stored object, now ``cancelled``; one
        that has already ended is returned as it ended (a cancel may cross its finish). A 404 for an
        unknown id, a 400 for a response not made in the background."""
        await self.stop(response_id)
        body = self._store.get(response_id).body
        if not body.get("background"):
            raise RequestError(f"response {response_id!r} was not created with \"background\": true; only a "
                               "background response can be cancelled.", code="response_not_background")
        return body

    async def stop(self, response_id: str) -> None:
        """Stop that response if it runs, and wait until its task has stored its last state."""
        running = self._running.get(response_id)
        if running is None:
            return
        stop, task = running
        if not stop.done():
            stop.set_result(None)
        await task

    def running(self, response_id: str) -> bool:
        """Whether that response still runs (a later ``previous_response_id`` must wait for it)."""
        return response_id in self._running
