"""Shutting the server down on SIGINT or SIGTERM, as vLLM's --shutdown-timeout does.

uvicorn alone stops accepting connections and then waits, without limit, for every open one to
close, so a 2,000-token generation kept the process alive for minutes; and its "force quit" on a
second Ctrl-C cancelled the request handlers mid-answer, which logged tracebacks and sent plain
500s. Here the first signal refuses new requests and gives the running ones ``grace_s`` seconds
(0, the default, stops them at once, as vLLM's default does); each stopped one is answered with a
503 or a stream's error event and its [DONE], so uvicorn's wait ends at once. With a grace, a second
signal stops the running ones at once and a third is uvicorn's force quit; without one, the second
is.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from types import FrameType

import uvicorn

from specsure.serve.runner import EngineRunner

logger = logging.getLogger("specsure.serve")


class GracefulServer(uvicorn.Server):
    """uvicorn's server, with signals that stop the engine's requests before uvicorn waits for them."""

    def __init__(self, config: uvicorn.Config, runner: EngineRunner, grace_s: float) -> None:
        super().__init__(config)
        self.runner, self.grace_s = runner, grace_s
        self._signals = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list | None = None) -> None:  # type: ignore[override]
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._signals += 1
        loop = self._loop
        if loop is None or loop.is_closed():  # before the loop started, or after it ended: uvicorn's own way
            super().handle_exit(sig, frame)
            return
        name = signal.Signals(sig).name
        # A signal handler may interrupt the loop's thread anywhere, even inside the runner's lock:
        # everything but uvicorn's own flags is done by the loop, after the handler returns.
        if self._signals == 1:
            loop.call_soon_threadsafe(self._first, name)
            super().handle_exit(sig, frame)
        elif self._signals == 2 and self.grace_s > 0:
            loop.call_soon_threadsafe(self._second, name)
            self._captured_signals.append(sig)
        else:
            self.should_exit = True
            self.force_exit = True
            self._captured_signals.append(sig)

    # Logged at WARNING, the level serve shows: uvicorn's "(CTRL+C to force quit)" that follows is
    # not what the next Ctrl-C does here.
    def _first(self, name: str) -> None:
        busy = self.runner.batch()
        if busy.running or busy.waiting:
            logger.warning("%s: refusing new requests; %s (--shutdown-timeout %g); %s", name,
                           f"the running and waiting ones have {self.grace_s:g} s to finish" if self.grace_s > 0
                           else "stopping the running and waiting ones", self.grace_s,
                           "a second signal stops them now, a third quits at once" if self.grace_s > 0
                           else "a second signal quits at once")
        self.runner.shut_down(name, self.grace_s)

    def _second(self, name: str) -> None:
        logger.warning("%s again: stopping the running requests now; a third signal quits at once", name)
        self.runner.stop_now()
