"""/healthz (process up), /readyz (database reachable and migrated), /metrics (Prometheus)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from planner_service.api.errors import error_response
from planner_service.api.schemas import TEXT_BODY, ErrorBody, Health, Ready
from planner_service.storage.db import SchemaNotReady, check_schema

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, summary="Liveness")
def healthz() -> JSONResponse:
    return JSONResponse({"status": "ok"})


@router.get(
    "/readyz",
    response_model=Ready,
    summary="Readiness: the database answers and its schema is current",
    responses={503: {"model": ErrorBody, "description": "The database is unreachable or its schema is not current"}},
)
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


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={200: {"description": "Prometheus text exposition format", "content": TEXT_BODY}},
)
def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
