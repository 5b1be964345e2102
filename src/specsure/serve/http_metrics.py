"""The HTTP-level Prometheus series vLLM's server exports (through prometheus-fastapi-instrumentator's
defaults): requests by handler, method and status class, their latency, and the body sizes.

Dashboards and alerts on a vLLM fleet read these (a 5xx-rate alert, per-handler latency panels);
without them such an alert never fires on specsure. The names, labels and buckets are the
instrumentator's; like vLLM, the routes about the server itself are left out, and a path that
matches no route is counted under the handler "none".
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, Summary
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

EXCLUDED = ("/metrics", "/health", "/load", "/ping", "/version", "/server_info")
"""The handlers vLLM leaves out of these series."""
HIGHR_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 2.5, 3, 3.5, 4, 4.5, 5, 7.5, 10, 30,
                 60)
LOWR_BUCKETS = (0.1, 0.5, 1)
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
"""Methods named in the labels; any other a client makes up is counted as "other", so no request, keyed or
not, adds a series (h11, uvicorn's parser here, takes any token as a method)."""


class HttpMetrics:
    """The series, in one app's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.total = Counter("http_requests_total", "Total number of requests by method, status and handler.",
                             ("method", "status", "handler"), registry=registry)
        self.in_size = Summary("http_request_size_bytes", "Content length of incoming requests by handler. Only "
                               "value of header is respected. Otherwise ignored.", ("handler",), registry=registry)
        self.out_size = Summary("http_response_size_bytes", "Content length of outgoing responses by handler.",
                                ("handler",), registry=registry)
        self.highr = Histogram("http_request_duration_highr_seconds", "Latency with many buckets but no API specific "
                               "labels. Made for more accurate percentile calculations.", buckets=HIGHR_BUCKETS,
                               registry=registry)
        self.lowr = Histogram("http_request_duration_seconds", "Latency with only few buckets by handler. Made to be "
                              "only used if aggregation by handler is important.", ("method", "handler"),
                              buckets=LOWR_BUCKETS, registry=registry)


class CountRequests:
    """ASGI middleware: each HTTP request to the app, counted and timed once its answer has been sent."""

    def __init__(self, app: ASGIApp, metrics: HttpMetrics, routes: Any) -> None:
        self.app, self.metrics = app, metrics
        self._routes = routes
        """The app's routes, to name a request by its route's template (/v1/models/{model_id:path})."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        handler = self._handler(scope)
        if handler in EXCLUDED:
            await self.app(scope, receive, send)
            return
        started, status, sent = time.perf_counter(), 500, 0

        async def counting(message: Message) -> None:
            nonlocal status, sent
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                sent += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, counting)
        finally:
            elapsed = time.perf_counter() - started
            method = scope["method"] if scope["method"] in METHODS else "other"
            headers = dict(scope.get("headers") or [])
            length = headers.get(b"content-length", b"0")
            m = self.metrics
            m.total.labels(method, f"{str(status)[0]}xx", handler).inc()
            m.in_size.labels(handler).observe(int(length) if length.isdigit() else 0)
            m.out_size.labels(handler).observe(sent)
            m.highr.observe(elapsed)
            m.lowr.labels(method, handler).observe(elapsed)

    def _handler(self, scope: Scope) -> str:
        """The route's template; a route the path matches with another method (a 405) as the instrumentator
        names it; "none" for a path no route has."""
        partial = None
        for route in self._routes:
            match, _ = route.matches(scope)
            if match == Match.FULL:
                return str(route.path)
            if match == Match.PARTIAL and partial is None:
                partial = str(route.path)
        return partial or "none"
