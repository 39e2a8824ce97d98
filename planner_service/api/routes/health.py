"""/healthz (process up), /readyz (database reachable and migrated), /metrics (Prometheus)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from planner_service.api.errors import error_response
from planner_service.storage.db import SchemaNotReady, check_schema

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Liveness")
def healthz() -> dict:
    return {"status": "ok"}


@router.get("/readyz", summary="Readiness: the database answers and its schema is current")
def readyz(request: Request) -> JSONResponse:
    repo = request.app.state.repository
    try:
        repo.ping()
        check_schema(repo.engine)
    except SchemaNotReady as exc:
        return error_response(503, "database_unavailable", str(exc))
    except Exception as exc:  # noqa: BLE001 - any failure to reach the DB means not ready
        return error_response(503, "database_unavailable", f"database unreachable: {type(exc).__name__}")
    return JSONResponse({"status": "ready", "database": repo.engine.dialect.name})


@router.get("/metrics", summary="Prometheus metrics", include_in_schema=True)
def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
