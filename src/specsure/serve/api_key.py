"""The server's API key (``--api-key``): every request to a guarded path must carry it."""

from __future__ import annotations

import hmac

from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from specsure.serve.errors import error_body

GUARDED = ("/v1/", "/tokenize", "/detokenize", "/tokenizer_info")
"""The paths --api-key guards: all but /health, /version and /metrics, as vLLM guards /v1 alone."""


class RequireKey:
    """ASGI middleware: every request to a GUARDED path needs ``Authorization: Bearer <api_key>``, else a 401."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app, self.api_key = app, api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(GUARDED) and not self._authorised(scope):
            reply = JSONResponse(error_body("missing or wrong API key: send the header 'Authorization: Bearer "
                                            "<key>' with the key the server was started with (--api-key or "
                                            "SPECSURE_API_KEY).", code="invalid_api_key"),
                                 status_code=401, headers={"WWW-Authenticate": "Bearer"})
            await reply(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _authorised(self, scope: Scope) -> bool:
        scheme, _, token = Headers(scope=scope).get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self.api_key.encode())
