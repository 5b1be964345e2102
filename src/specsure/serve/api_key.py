"""The server's API key (``--api-key``): every request to a guarded path must carry it."""

from __future__ import annotations

import hashlib
import hmac
from typing import Sequence

from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from specsure.serve.errors import error_body

GUARDED = ("/v1/", "/tokenize", "/detokenize", "/tokenizer_info")
"""The paths --api-key guards: all but /health, /version and /metrics, as vLLM guards /v1 alone."""


def checked_keys(api_key: str | Sequence[str]) -> list[str]:
    """The keys as a list; ValueError for none, or for a key that is not a non-empty string without
    surrounding spaces (an empty one would let an empty Bearer token in). No key is shown."""
    keys = [api_key] if isinstance(api_key, str) else list(api_key)
    if not keys or not all(isinstance(k, str) and k and k == k.strip() for k in keys):
        raise ValueError(f"api_key: {len(keys)} key(s) given; every key must be a non-empty string without "
                         "surrounding spaces, and at least one is needed (None serves without a key).")
    return keys


class RequireKey:
    """ASGI middleware: every request to a GUARDED path needs ``Authorization: Bearer <api_key>``, else a 401."""

    def __init__(self, app: ASGIApp, api_key: str | Sequence[str]) -> None:
        self.app = app
        keys = checked_keys(api_key)
        # Digests, all of one length: compare_digest then takes the same time whatever key a token is near.
        self._digests = [hashlib.sha256(k.encode()).digest() for k in keys]
        """Any of the keys opens the door (vLLM's --api-key takes several)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # OPTIONS runs no route (a browser's preflight carries no key; vLLM lets it through too)
        if (scope["type"] == "http" and scope["method"] != "OPTIONS" and scope["path"].startswith(GUARDED)
                and not self._authorised(scope)):
            reply = JSONResponse(error_body("missing or wrong API key: send the header 'Authorization: Bearer "
                                            "<key>' with the key the server was started with (--api-key or "
                                            "SPECSURE_API_KEY or VLLM_API_KEY).", code="invalid_api_key"),
                                 status_code=401, headers={"WWW-Authenticate": "Bearer"})
            await reply(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _authorised(self, scope: Scope) -> bool:
        scheme, _, token = Headers(scope=scope).get("authorization", "").partition(" ")
        given = hashlib.sha256(token.strip().encode()).digest()
        matches = [hmac.compare_digest(given, key) for key in self._digests]  # every key, so no early return says which
        return scheme.lower() == "bearer" and bool(token.strip()) and any(matches)
