"""OpenAI's error shape for ``specsure serve``: the exceptions its routes raise and the body they become."""

from __future__ import annotations

from typing import Any

from specsure.config.errors import as_json


class APIError(Exception):
    """An answer in OpenAI's error shape with an HTTP status other than 200."""

    def __init__(self, message: str, status: int, *, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        """The request field at fault (OpenAI's ``param``), or None for the body as a whole."""
        self.code = code
        self.kind = kind
        self.headers = headers or {}

    def to_body(self) -> dict[str, Any]:
        return error_body(str(self), self.param, self.code, self.kind)


class RequestError(APIError, ValueError):
    """A client mistake, answered in OpenAI's error shape: a 400, or a 404 for a model not served
    (as OpenAI and vLLM answer ``model_not_found``)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message, 404 if code == "model_not_found" else 400, param=param, code=code)


def not_served(model: Any, served: str, field: bool = True) -> RequestError:
    """The 404 for a ``model`` this server does not serve; ``served``: the names it does, as they are shown;
    ``field``: the name came in the body (False: in the path, GET /v1/models/{id})."""
    fix = "Send that name, or omit the field." if field else "Ask for that name."
    return RequestError(f"model = {shown(model)} is not served here; this server serves {served} (GET /v1/models). "
                        f"{fix}", "model", "model_not_found")


def error_body(message: str, param: str | None = None, code: str | None = None,
               kind: str = "invalid_request_error") -> dict[str, Any]:
    """OpenAI's error object: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def shown(value: Any, limit: int = 80) -> str:
    """``value`` as the client wrote it (JSON: true, null, "text"), cut to ``limit`` characters for error messages."""
    text = as_json(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
