"""The server's API key (``--api-key``): every request to a guarded path must carry it."""

from __future__ import annotations

import hmac
from typing import Sequence

from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from specsure.serve.errors import error_body

GUARDED = ("/v1/", "/tokenize", "/detokenize", "/tokenizer_info")
"""The paths --api-key guards: all but /health, /version and /metrics, as vLLM guards /v1 alone."""


class RequireKey:
    """ASGI middleware: every request to a GUARDED path needs ``Authorization: Bearer <api_key>``, else a 401."""

    def __init__(self, app: ASGIApp, api_key: str | Sequence[str]) -> None:
        self.app = app
        self.api_keys = [api_key] if isinstance(api_key, str) else list(api_key)
        """Any of them opens the door (vLLM's --api-key takes several)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(GUARDED) and not self._authorised(scope):
            reply = JSONResponse(error_body("missing or wrong API key: send the header 'Authorization: Bearer "
                                            "<key>' with the key the server was started with (--api-key or "
                                            "SPECSURE_API_KEY or VLLM_API_KEY).", code="invalid_api_key"),
                                 status_code=401, headers={"WWW-Authenticate": "Bearer"})
            await reply(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _authorised(self, scope: Scope) -> bool:
        scheme, _, token = Headers(scope=scope).get("authorization", "").partition(" ")
        given = token.strip().encode()
        # every key compared, so the time taken does not say which one came close
        matches = [hmac.compare_digest(given, key.encode()) for key in self.api_keys]
        return scheme.lower() == "bearer" and any(matches)
