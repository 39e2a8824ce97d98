"""The FastAPI app factory.  No import-time state: everything hangs off the app it returns."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI
from prometheus_client.core import GaugeMetricFamily
from starlette.middleware.gzip import GZipMiddleware

from planner_service.api.auth import RateLimiter, authenticate
from planner_service.api.errors import install_error_handlers
from planner_service.api.middleware import (
    BodyLimitMiddleware,
    EdgeMiddleware,
    Metrics,
    MetricsMiddleware,
    RequestIdMiddleware,
)
from planner_service.api.plan_cache import PlanBodyCache
from planner_service.api.routes import all_routers
from planner_service.api.schemas import AUTH_RESPONSES
from planner_service.service.executor import SearchExecutor, tune_gc
from planner_service.service.plans import PlanService
from planner_service.service.worker import CallbackSender, JobWorker, WorkerThread, post_callback
from planner_service.settings import ServiceSettings
from planner_service.storage.db import check_schema, make_engine, upgrade
from planner_service.storage.repository import Repository

#: Responses at least this large are gzip-compressed when the client accepts gzip.
GZIP_MIN_BYTES = 256 * 1024

log = logging.getLogger("planner.api")

DESCRIPTION = """\
Plans hybrid-parallel training (data, tensor, pipeline, context, expert parallel; ZeRO;
micro-batching; recompute) of a model on a GPU cluster and stores the plans.

Errors always have the body `{"error": {"code", "message", "field"}}`: `field` is the dotted path
of the offending input (e.g. `cluster.node_groups[0].count`).

Every `/v1` route needs `Authorization: Bearer <key>` (a key from `planner keys create`; 401
without, 403 when the key's role may not, 429 over the tenant's rate limit) unless the server
runs with `PLANNER_AUTH=disabled` (loopback only).  Plans, jobs, clusters, profiles and models
belong to the key's tenant: another tenant's id is a 404.
"""


class _StoredCounts:
    """Prometheus collector: stored plans and jobs by status, read from the database on scrape."""

    def __init__(self, repo: Repository) -> None:
        self.repo = repo

    def collect(self) -> Iterator[GaugeMetricFamily]:
        plans = GaugeMetricFamily("planner_plans_stored", "Plans stored in the database, by status", labels=["status"])
        jobs = GaugeMetricFamily("planner_jobs", "Jobs in the database, by status", labels=["status"])
        try:
            for status, n in sorted(self.repo.count_plans_by_status().items()):
                plans.add_metric([status], n)
            for status, n in sorted(self.repo.count_jobs_by_status().items()):
                jobs.add_metric([status], n)
        except Exception as exc:  # noqa: BLE001 - metrics must not fail because the DB is down
            log.warning("metrics: cannot count plans: %s", exc)
        yield plans
        yield jobs


def create_app(
    settings: ServiceSettings | None = None,
    *,
    plan_fn: Callable[..., Any] | None = None,
    search_size_fn: Callable[..., int | None] | None = None,
    start_worker: bool | None = None,
) -> FastAPI:
    """Build the app.

    ``settings`` default to the environment.  On SQLite (or with ``auto_migrate``) the schema is
    upgraded here; otherwise a schema that is not at the latest revision raises
    :class:`planner_service.storage.db.SchemaNotReady` (``planner serve`` prints it and exits).
    ``plan_fn`` replaces :func:`planner_service.planner.plan` (tests: a slow or failing
    planner).  ``start_worker`` overrides ``settings.run_inline_worker``.
    """
    settings = settings or ServiceSettings()
    engine = make_engine(settings.database_url, settings.db_pool_size, settings.db_max_overflow)
    if settings.migrate_on_start:
        upgrade(engine)
    else:
        check_schema(engine)
    repo = Repository(engine)
    metrics = Metrics()
    metrics.registry.register(_StoredCounts(repo))
    run_worker = settings.run_inline_worker if start_worker is None else start_worker
    holder: dict[str, WorkerThread] = {}

    def wake_worker() -> None:
        if "thread" in holder:
            holder["thread"].wake()

    # Searches run in a bounded pool apart from the request threads (service.executor).
    executor = SearchExecutor(
        workers=settings.search_workers,
        max_inflight=settings.search_max_inflight,
        tenant_max=settings.tenant_max_concurrent_searches,
        retry_after_s=settings.solver_time_limit_s,
        kind="thread" if plan_fn is not None else settings.search_executor,
        gc_freeze=settings.gc_freeze,
        gc_young_threshold=settings.gc_young_threshold,
    )
    service = PlanService(repo, settings, plan_fn=plan_fn, search_size_fn=search_size_fn, on_job_created=wake_worker, executor=executor)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if run_worker:
            started = WorkerThread(JobWorker(repo, service, settings, worker_id=None))
            holder["thread"] = started
            started.start()
        tune_gc(settings.gc_freeze, settings.gc_young_threshold)  # the freeze once per process (tests start many apps)
        try:
            yield
        finally:
            thread = holder.pop("thread", None)
            if thread is not None:
                thread.stop()
            executor.shutdown()
            app.state.observation_callbacks.stop()
            engine.dispose()

    app = FastAPI(
        title="Auto-parallel planner",
        version="1.0.0",
        description=DESCRIPTION,
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.repository = repo
    app.state.service = service
    app.state.metrics = metrics
    app.state.worker_holder = holder
    # plan.suggestion notifications of POST /v1/plans/{id}/observations (the jobs' callback rules)
    app.state.observation_callbacks = CallbackSender(lambda url, payload: post_callback(url, payload, settings))
    app.state.rate_limiter = RateLimiter(settings.rate_limit)
    app.state.executor = executor
    app.state.plan_bodies = PlanBodyCache()
    install_error_handlers(app)
    for router in all_routers():
        if router.prefix.startswith("/v1"):
            app.include_router(router, dependencies=[Depends(authenticate)], responses=AUTH_RESPONSES)
        else:
            app.include_router(router)
    # Added innermost first: the request id wraps everything (every response and log line has
    # it); metrics see every response; the Host, path and query checks run first, then the body
    # limit and the JSON check, all before routing.  Uploads stream through (counted, capped).
    app.add_middleware(
        BodyLimitMiddleware,
        max_bytes=settings.max_body_bytes,
        upload_paths={"/v1/models/onnx": settings.max_upload_bytes},
        raw_paths=frozenset({"/v1/clusters/import"}),
        max_concurrent_uploads=settings.max_concurrent_uploads,
    )
    app.add_middleware(EdgeMiddleware, allowed_hosts=settings.allowed_host_list)
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    app.add_middleware(RequestIdMiddleware)
    # Large bodies (a 98,304-rank plan is ~15 MB of JSON) gzip-compressed for clients that ask
    # (curl --compressed, browsers); level 1: ~10x smaller at a fraction of level 9's time.
    app.add_middleware(GZipMiddleware, minimum_size=GZIP_MIN_BYTES, compresslevel=1)
    return app


def create_app_from_env() -> FastAPI:
    """Factory for ``uvicorn --factory`` (``planner serve --workers N``): settings from the
    environment."""
    return create_app(ServiceSettings())


__all__ = ["create_app", "create_app_from_env"]
