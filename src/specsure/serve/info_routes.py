"""The server's routes about itself: /health (and /ping), /version, /metrics and the model cards of /v1/models.

The cards are vLLM's (id, object, created, owned_by, root, parent, max_model_len, permission), plus
``speculative``: the effective config with each field's source, so a client can see what runs.
"""

from __future__ import annotations

import uuid
from typing import Any, Sequence

from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST

import specsure
from specsure.decode.engine import Engine
from specsure.serve.errors import not_served
from specsure.serve.metrics import ServeMetrics


def add_info_routes(app: FastAPI, engine: Engine, names: Sequence[str], metrics: ServeMetrics, started: int) -> None:
    """Register the routes on ``app``; ``names``: the served model names, the first the one answers carry;
    ``started``: when the server started (Unix seconds), each card's ``created``."""

    @app.api_route("/health", methods=["GET", "HEAD"])  # uptime checkers and load balancers probe with HEAD too
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.api_route("/ping", methods=["GET", "POST", "HEAD"])  # vLLM's health route for SageMaker, which POSTs too
    async def ping() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/version")  # vLLM's route, which monitoring probes; the version is specsure's
    async def version() -> dict[str, str]:
        return {"version": specsure.__version__}

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card(engine, shown, started) for shown in names]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:  # the client's models.retrieve
        if model_id not in names:
            raise not_served(model_id, " or ".join(map(repr, names)), field=False)
        return model_card(engine, model_id, started)


def model_card(engine: Engine, shown: str, started: int) -> dict[str, Any]:
    """The card of the model served as ``shown``."""
    res = engine.resolution
    return {"id": shown, "object": "model", "created": started, "owned_by": "specsure",
            "root": str(res.decisions["target"].value), "parent": None,
            "max_model_len": engine.target.lm.max_context or None, "permission": [_permission(started)],
            "speculative": {"method": engine.speculative_method, "fields": res.to_dict(),
                            "warnings": list(res.warnings)}}


def _permission(created: int) -> dict[str, Any]:
    """vLLM's ModelPermission at its values: sampling, logprobs and viewing allowed, nothing else."""
    return {"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission", "created": created,
            "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
            "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False, "organization": "*",
            "group": None, "is_blocking": False}
