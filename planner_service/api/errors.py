"""Typed errors → HTTP, in one place.

Every error response has the body ``{"error": {"code", "message", "field"}}``.

=====================================================  ======
planner_service.storage.errors.NotFound (unknown id)      404
planner_service.storage.errors.Conflict                409
cost_model.errors.InvalidInput and subclasses            422
  (InvalidModel, InvalidCluster, InvalidTraining, InvalidStrategy, InvalidProfile,
  InvalidGraph, UnknownName — an unknown name *in the body*)
cost_model.errors.NoFeasiblePlan                         422
other PlannerError                                       422
request validation (malformed JSON, wrong types, unknown fields, bad query)  422
JSON parser limits (not UTF-8, depth, huge numbers, NUL)  422  field ``body`` or the path
no / unknown API key                                     401  (see api.auth)
a role that may not                                      403
over the tenant's rate limit                             429  with Retry-After
over the tenant's concurrency quota (storage.errors.Busy) 429  with Retry-After
server's search or upload capacity full (Busy)           503  with Retry-After
Host header not allowed                                  400  (see api.middleware)
body larger than the limit                               413  (see api.middleware)
unknown route / method                                   404 / 405
a value the database cannot hold (sqlalchemy DataError)  422  (a safety net behind the edge checks)
database unreachable / schema not migrated               503
anything else (a bug)                                    500, logged on one line, no traceback in the body
=====================================================  ======
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError, DBAPIError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from cost_model.errors import NoFeasiblePlan, PlannerError
from planner_service.planner.request import unknown_field_message
from planner_service.storage.db import SchemaNotReady
from planner_service.storage.errors import Busy, Conflict, NotFound

log = logging.getLogger("planner.api")

_STATUS_CODES = {
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
    429: "rate_limited",
}
_STATUS_FIELDS = {401: "Authorization"}


def error_body(code: str, message: str, field: str | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "field": field}}


def error_response(status: int, code: str, message: str, field: str | None = None, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(code, message, field), status_code=status, headers=headers)


def status_for(exc: PlannerError) -> int:
    if isinstance(exc, NotFound):
        return 404
    if isinstance(exc, Conflict):
        return 409
    if isinstance(exc, NoFeasiblePlan):
        return 422
    return 422  # InvalidInput and every subclass, UnknownName included


def field_from_loc(loc: Sequence[Any]) -> str | None:
    """('body', 'cluster', 'node_groups', 0, 'count') → 'cluster.node_groups[0].count'."""
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += ("." if out else "") + str(p)
    if not out:
        return "body" if loc and loc[0] == "body" else None
    return out


def _validation_message(err: dict[str, Any]) -> tuple[str, str]:
    kind = err.get("type", "")
    msg = err.get("msg", "is invalid")
    if kind == "json_invalid":
        ctx = err.get("ctx") or {}
        return "invalid_json", f"the body is not valid JSON ({ctx.get('error', msg)})"
    loc = tuple(err.get("loc") or ())
    if loc == ("body",) and kind == "missing":
        return "invalid_input", "a JSON object body is required (Content-Type: application/json)"
    if loc == ("body",) and kind in ("model_attributes_type", "dict_type", "model_type"):
        return "invalid_input", "the request body must be a JSON object"
    if kind == "missing":
        return "invalid_input", "is required"
    if kind == "extra_forbidden":
        return "invalid_input", "is not a known field"
    if "input" in err and kind not in ("missing",):
        shown = repr(err["input"])
        if len(shown) > 80:
            shown = shown[:77] + "..."
        return "invalid_input", f"{msg[0].lower() + msg[1:] if msg else 'is invalid'} (got {shown})"
    return "invalid_input", msg


#: The request bodies whose top-level fields ``planner_service.planner.request`` names: path → a plan's.
_REQUEST_BODIES = {"/v1/plans": True, "/v1/estimate": False}


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(PlannerError)
    async def _planner_error(_request: Request, exc: PlannerError) -> JSONResponse:
        return error_response(status_for(exc), exc.code, exc.message, exc.field)

    @app.exception_handler(Busy)
    async def _busy(_request: Request, exc: Busy) -> JSONResponse:
        retry = str(max(1, int(round(exc.retry_after_s))))
        return error_response(exc.status, exc.code, exc.message, exc.field, headers={"Retry-After": retry})

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        if not errors:
            return error_response(422, "invalid_input", "the request is invalid", "body")
        first = errors[0]
        loc = tuple(first.get("loc") or ())
        code, message = _validation_message(first)
        if first.get("type") == "extra_forbidden" and len(loc) == 2 and loc[0] == "body" and _request.url.path in _REQUEST_BODIES:
            # a top-level field of a plan or estimate request: told what the parser tells the CLI
            message = unknown_field_message(str(loc[1]), plan=_REQUEST_BODIES[_request.url.path])
        field = "body" if code == "invalid_json" else field_from_loc(loc)
        if len(errors) > 1:
            message += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
        return error_response(422, code, message, field)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _STATUS_CODES.get(exc.status_code, "http_error")
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404 and message == "Not Found":
            message = f"no such endpoint: {_request.method} {_request.url.path} (see /docs)"
        elif exc.status_code == 405:
            message = f"{_request.method} is not allowed on {_request.url.path}"
        return error_response(exc.status_code, code, message, _STATUS_FIELDS.get(exc.status_code), headers=getattr(exc, "headers", None))

    @app.exception_handler(SchemaNotReady)
    async def _schema(_request: Request, exc: SchemaNotReady) -> JSONResponse:
        return error_response(503, "database_unavailable", str(exc), None)

    # Database errors are logged on one line with the driver's error class only: never the
    # statement's parameters (request values) nor a traceback at error level.
    @app.exception_handler(OperationalError)
    async def _db_down(request: Request, exc: OperationalError) -> JSONResponse:
        log.error("database unavailable on %s %s: %s", request.method, request.url.path, type(exc.orig).__name__)
        log.debug("database error detail", exc_info=exc)
        return error_response(503, "database_unavailable", "the database is unreachable or busy; retry later", None)

    @app.exception_handler(DataError)
    async def _db_data(request: Request, exc: DataError) -> JSONResponse:
        log.warning("database refused a value on %s %s: %s", request.method, request.url.path, type(exc.orig).__name__)
        return error_response(422, "invalid_input", "a value in the request cannot be stored (out of range or not storable text)", "body")

    @app.exception_handler(DBAPIError)
    async def _db_error(request: Request, exc: DBAPIError) -> JSONResponse:
        log.error("database error on %s %s: %s", request.method, request.url.path, type(exc.orig).__name__)
        log.debug("database error detail", exc_info=exc)
        return error_response(500, "internal_error", "internal database error", None)

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        log.error("unhandled error on %s %s: %s", request.method, request.url.path, type(exc).__name__)
        log.debug("unhandled error detail", exc_info=exc)
        return error_response(500, "internal_error", f"internal error ({type(exc).__name__}); see the server log", None)


__all__ = ["error_body", "error_response", "field_from_loc", "install_error_handlers", "status_for"]
