"""ASGI middleware: request id (``X-Request-ID``), Host header check, edge checks of paths,
queries and JSON bodies (422), request body size limit (413), the concurrent upload cap (503)
and Prometheus request metrics."""

from __future__ import annotations

import json
import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from planner_service.api.errors import error_body
from planner_service.api.logs import REQUEST_ID, request_id_from
from planner_service.api.validation import BadBody, bad_path, bad_query_field, check_json_body

_BODY_METHODS = {"POST", "PUT", "PATCH", "DELETE"}


async def _send_json(send: Any, status: int, body: dict[str, Any], headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    raw = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode()), (b"connection", b"close"),
                        *headers],
        }
    )
    await send({"type": "http.response.body", "body": raw})


class RequestIdMiddleware:
    """The request id: the client's ``X-Request-ID`` when it is a plain token, else a new one;
    set in :data:`planner_service.api.logs.REQUEST_ID` for every log line of the request and
    returned in the response's ``X-Request-ID``."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = None
        for name, value in scope.get("headers", []):
            if name == b"x-request-id":
                given = value.decode("latin-1")
                break
        rid = request_id_from(given)
        token = REQUEST_ID.set(rid)

        async def send_with_id(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (b"x-request-id", rid.encode())]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            REQUEST_ID.reset(token)


class BodyLimitMiddleware:
    """Rejects bodies over ``max_bytes`` with 413 before any route sees them.

    A declared ``Content-Length`` over the limit is refused without reading.  A JSON body is
    read (chunked ones included) up to the limit and replayed to the app, so a body that grows
    past the limit is refused too.  An upload (``upload_paths``) is never held in memory: it
    streams through to the route's multipart parser (which spools it to a temporary file) while
    its bytes are counted, and the moment they pass the limit the client gets 413 and the app a
    disconnect.  At most ``max_concurrent_uploads`` uploads are received at once; one more is
    503 with ``Retry-After`` before a byte of it is read.
    """

    #: Retry-After of a refused upload: about the time a large upload takes on a local network.
    UPLOAD_RETRY_AFTER_S = 5

    def __init__(self, app: Any, max_bytes: int, upload_paths: dict[str, int] | None = None, raw_paths: frozenset[str] = frozenset(),
                 max_concurrent_uploads: int = 4) -> None:
        self.app = app
        self.default_max_bytes = max_bytes
        #: Path → its own limit (file uploads such as ONNX models are larger than JSON bodies).
        self.upload_paths = dict(upload_paths or {})
        #: Paths whose body is not JSON (uploads, imported text files): not checked as JSON here.
        self.raw_paths = frozenset(raw_paths) | frozenset(self.upload_paths)
        self.max_concurrent_uploads = max_concurrent_uploads
        #: Uploads being received now (one event loop per app: no lock needed).
        self.uploads_in_progress = 0

    def _json_problem(self, scope: dict[str, Any], body: bytes) -> BadBody | None:
        """Every non-empty, non-multipart body of a JSON route is checked once, before routing:
        UTF-8, depth, number range, NUL and lone surrogates (see api.validation)."""
        if not body or scope.get("path", "") in self.raw_paths:
            return None
        for name, value in scope.get("headers", []):
            if name == b"content-type" and value.split(b";")[0].strip().lower() in (b"multipart/form-data", b"application/octet-stream"):
                return None
        try:
            check_json_body(body)
        except BadBody as exc:
            return exc
        return None

    def _too_large(self, limit: int) -> dict[str, Any]:
        return error_body("payload_too_large", f"the request body exceeds the limit of {limit} bytes", "body")

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        limit = self.upload_paths.get(scope.get("path", ""), self.default_max_bytes)
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > limit:
                    await _send_json(send, 413, self._too_large(limit))
                    return
        if scope.get("path", "") in self.upload_paths:
            await self._stream_upload(scope, receive, send, limit)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await _send_json(send, 413, self._too_large(limit))
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        problem = self._json_problem(scope, body)
        if problem is not None:
            await _send_json(send, 422, error_body("invalid_json", problem.message, problem.field))
            return
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            message: dict[str, Any] = await receive()
            return message

        await self.app(scope, replay, send)

    async def _stream_upload(self, scope: dict[str, Any], receive: Any, send: Any, limit: int) -> None:
        if self.uploads_in_progress >= self.max_concurrent_uploads:
            retry = str(self.UPLOAD_RETRY_AFTER_S)
            await _send_json(send, 503, error_body("upload_capacity", f"{self.uploads_in_progress} uploads are being received, the limit "
                                                   f"(PLANNER_MAX_CONCURRENT_UPLOADS); retry after {retry} s", "file"),
                             headers=((b"retry-after", retry.encode()),))
            return
        self.uploads_in_progress += 1
        size = 0
        refused = False

        async def counted() -> dict[str, Any]:
            nonlocal size, refused
            if refused:
                return {"type": "http.disconnect"}
            message: dict[str, Any] = await receive()
            if message["type"] == "http.request":
                size += len(message.get("body", b""))
                if size > limit:
                    refused = True
                    await _send_json(send, 413, self._too_large(limit))
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: dict[str, Any]) -> None:
            if not refused:  # after the 413 the app's own answer (to the disconnect) is dropped
                await send(message)

        try:
            await self.app(scope, counted, guarded_send)
        finally:
            self.uploads_in_progress -= 1


class EdgeMiddleware:
    """Before routing: the Host header against ``allowed_hosts`` (DNS rebinding; ``*`` allows
    any), then the path and query string (NUL, lone surrogates, control characters, length).

    A bad Host is 400 ``invalid_host``; a path no route can hold is 404; a bad query parameter is
    422 naming it.
    """

    def __init__(self, app: Any, allowed_hosts: tuple[str, ...]) -> None:
        self.app = app
        self.allow_any = "*" in allowed_hosts
        self.allowed = {h.lower() for h in allowed_hosts}

    def _host_ok(self, scope: dict[str, Any]) -> bool:
        if self.allow_any:
            return True
        host = ""
        for name, value in scope.get("headers", []):
            if name == b"host":
                host = value.decode("latin-1").lower()
                break
        if host.startswith("["):
            host = host.split("]")[0] + "]"
        else:
            host = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
        return host in self.allowed or host.strip("[]") in self.allowed

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if not self._host_ok(scope):
            await _send_json(send, 400, error_body("invalid_host", "the Host header names no host this server answers for (PLANNER_ALLOWED_HOSTS)", "Host"))
            return
        if bad_path(scope.get("path", "")):
            await _send_json(send, 404, error_body("not_found", "no such resource (the path holds characters no id or name has)", "path"))
            return
        bad = bad_query_field(scope.get("query_string", b""))
        if bad is not None:
            await _send_json(send, 422, error_body("invalid_input", bad[1], bad[0]))
            return
        await self.app(scope, receive, send)


class Metrics:
    """The app's own Prometheus registry (no process-global state)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "planner_http_requests_total", "HTTP requests by route template, method and status", ("method", "route", "status"), registry=self.registry
        )
        self.latency = Histogram(
            "planner_http_request_duration_seconds",
            "HTTP request latency by route template and method",
            ("method", "route"),
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
            registry=self.registry,
        )
        self.plans_created = Counter(
            "planner_plans_created_total", "Plans stored by this process, by kind (plan, forced, replan, job)", ("kind",), registry=self.registry
        )
        self.plans_deduplicated = Counter(
            "planner_plan_requests_deduplicated_total", "Plan requests answered with an existing plan", registry=self.registry
        )
        self.jobs_created = Counter("planner_jobs_created_total", "Jobs enqueued by this process", registry=self.registry)


class MetricsMiddleware:
    def __init__(self, app: Any, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = {"code": 500}

        async def send_wrapper(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            method = scope.get("method", "")
            self.metrics.requests.labels(method, template, str(status["code"])).inc()
            self.metrics.latency.labels(method, template).observe(time.perf_counter() - start)


__all__ = ["BodyLimitMiddleware", "EdgeMiddleware", "Metrics", "MetricsMiddleware", "RequestIdMiddleware"]
