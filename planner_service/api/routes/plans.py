"""/v1/plans: create (sync, de-duplicated, or as a job), list, get, delete, replan."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Body, Query, Request, Response
from fastapi.responses import JSONResponse

from cost_model.devices import get_device
from cost_model.errors import InvalidInput, UnknownName
from planner_service.api.deps import MetricsDep, RepoDep, ServiceDep
from planner_service.api.middleware import Metrics
from planner_service.api.plan_cache import CACHED_MIN_RANKS, PlanBodyCache, assemble
from planner_service.api.routes.jobs import job_body
from planner_service.api.schemas import (
    BUSY_RESPONSES,
    INVALID_INPUT,
    PLAN_EXAMPLES,
    REPLAN_EXAMPLES,
    ErrorBody,
    Job,
    Plan,
    PlanCreate,
    PlanPage,
    ReplanRequest,
)
from planner_service.service.plans import ClusterChanges, Outcome, RunOptions, plan_to_api
from planner_service.service.worker import check_callback_url
from planner_service.storage.ids import is_request_hash, is_uuid
from planner_service.storage.rank_table import dumps_with_tables
from planner_service.storage.repository import MAX_PAGE, PLAN_SORTS, PlanFilters

router = APIRouter(prefix="/v1/plans", tags=["plans"], responses=INVALID_INPUT)

PLAN_STATUSES = ("optimal", "feasible")


def _respond(outcome: Outcome, metrics: Metrics, created_kind: str) -> Response:
    if outcome.kind == "job":
        job = outcome.job
        assert job is not None
        metrics.jobs_created.inc()
        return JSONResponse(job_body(job), status_code=202, headers={"Location": f"/v1/jobs/{job.id}"})
    plan = outcome.plan
    assert plan is not None
    # a large rank table written from its columns (storage.rank_table): the same JSON, faster
    body = dumps_with_tables(plan_to_api(plan, rank_tables=True))
    if outcome.kind == "created":
        metrics.plans_created.labels(created_kind).inc()
        return Response(body, status_code=201, headers={"Location": f"/v1/plans/{plan.id}"}, media_type="application/json")
    metrics.plans_deduplicated.inc()
    return Response(body, status_code=200, media_type="application/json")


@router.post(
    "",
    status_code=201,
    response_model=Plan,
    summary="Plan a model on a cluster",
    responses={
        200: {"model": Plan, "description": "An identical request was planned before: the stored plan"},
        201: {"description": "The new plan"},
        202: {"model": Job, "description": "Queued as a job (async, or a large search): the job"},
        409: {"model": ErrorBody, "description": "Conflict"},
        413: {"model": ErrorBody, "description": "Body too large"},
        422: {"model": ErrorBody, "description": "Invalid input or no feasible plan; error.field names the field"},
        **BUSY_RESPONSES,
    },
)
def create_plan(
    request: Request,
    body: Annotated[PlanCreate, Body(openapi_examples=PLAN_EXAMPLES)],
    service: ServiceDep,
    metrics: MetricsDep,
) -> Response:
    check_callback_url(body.callback_url, request.app.state.settings)
    # The one parse of the body: the service gets the request, its canonical form and hash.
    prepared = service.prepare(body.model_dump(by_alias=True, exclude_unset=True))
    options = RunOptions(force=body.force, run_async=body.async_, callback_url=body.callback_url)
    outcome = service.create_plan(prepared, options)
    return _respond(outcome, metrics, "forced" if body.force else "plan")


def _utc(ts: datetime | None) -> datetime | None:
    if ts is None:
        return None
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts


@router.get("", response_model=PlanPage, summary="List stored plans (filters, sort, cursor pagination)")
def list_plans(
    repo: RepoDep,
    model: Annotated[str | None, Query(description="Model name (exact)")] = None,
    cluster: Annotated[str | None, Query(description="Cluster name (exact)")] = None,
    device: Annotated[str | None, Query(description="A device type the plan's cluster has (catalog name or alias)")] = None,
    status: Annotated[str | None, Query(description="optimal | feasible")] = None,
    min_tokens_per_s: Annotated[float | None, Query(ge=0, description="Predicted throughput at least this")] = None,
    created_after: Annotated[datetime | None, Query(description="ISO 8601; naive means UTC")] = None,
    created_before: Annotated[datetime | None, Query(description="ISO 8601; naive means UTC")] = None,
    parent_id: Annotated[str | None, Query(description="Replans of this plan")] = None,
    request_hash: Annotated[str | None, Query(description="Plans of this canonical request")] = None,
    sort: Annotated[str, Query(description="One of " + ", ".join(f"{k}, -{k}" for k in PLAN_SORTS) + " ('-' = descending)")] = "-created_at",
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description=f"Page size, at most {MAX_PAGE}")] = 50,
    cursor: Annotated[str | None, Query(description="next_cursor of the previous page")] = None,
) -> JSONResponse:
    for field_name, value in (("model", model), ("cluster", cluster), ("device", device)):
        if value is not None and len(value) > 200:
            raise InvalidInput("must be at most 200 characters", field=field_name)
    if parent_id is not None and not is_uuid(parent_id):
        raise InvalidInput("must be a plan id", field="parent_id")
    if request_hash is not None and not is_request_hash(request_hash):
        raise InvalidInput("must be a request hash (64 lower-case hex digits)", field="request_hash")
    if cursor is not None and len(cursor) > 1000:
        raise InvalidInput("is not a cursor returned by this endpoint (use next_cursor unchanged)", field="cursor")
    if status is not None and status not in PLAN_STATUSES:
        raise InvalidInput(f"must be one of {', '.join(PLAN_STATUSES)}, got {status!r}", field="status")
    if device is not None:
        with contextlib.suppress(UnknownName):  # an inline device's name: match it as given
            device = get_device(device).name
    filters = PlanFilters(
        model=model,
        cluster=cluster,
        device=device,
        status=status,
        min_tokens_per_s=min_tokens_per_s,
        created_after=_utc(created_after),
        created_before=_utc(created_before),
        parent_id=parent_id,
        request_hash=request_hash,
    )
    items, next_cursor = repo.list_plans(filters, sort=sort, limit=limit, cursor=cursor)
    return JSONResponse({"items": [p.to_dict() for p in items], "next_cursor": next_cursor, "limit": limit, "sort": sort})


@router.get("/{plan_id}", response_model=Plan, summary="One stored plan", responses={404: {"model": ErrorBody, "description": "No such plan"}})
def get_plan(request: Request, plan_id: str, repo: RepoDep, service: ServiceDep) -> Response:
    # Stored JSON is plain already: JSONResponse skips FastAPI's recursive jsonable_encoder.
    # A plan with a large rank table: its body kept encoded after the first GET (api.plan_cache).
    cache: PlanBodyCache = request.app.state.plan_bodies
    hit = cache.get(plan_id) if plan_id in cache and repo.plan_readable(plan_id) else None
    if hit is None:
        plan = repo.get_plan(plan_id)
        body = plan_to_api(plan, newest=service.newest_for(plan), rank_tables=True)
        if plan.num_devices <= CACHED_MIN_RANKS:
            return Response(dumps_with_tables({**body, "observed": service.observed().observed_view(plan)}), media_type="application/json")
        sup = body.pop("superseded_by")
        body.pop("observed")
        hit = cache.put(plan, body)
    slim, prefix = hit
    ref = service.newest_for(slim)
    sup = ref[0] if ref is not None and ref[0] != slim.id and ref[1] > slim.revision else None
    return Response(assemble(prefix, sup, service.observed().observed_view(slim)), media_type="application/json")


@router.delete(
    "/{plan_id}",
    status_code=204,
    summary="Delete a stored plan (409 while replans refer to it)",
    responses={404: {"model": ErrorBody, "description": "No such plan"}, 409: {"model": ErrorBody, "description": "Replans refer to it"}},
)
def delete_plan(request: Request, plan_id: str, repo: RepoDep) -> Response:
    repo.delete_plan(plan_id)
    request.app.state.plan_bodies.discard(plan_id)
    return Response(status_code=204)


@router.post(
    "/{plan_id}/replan",
    status_code=201,
    response_model=Plan,
    summary="Re-plan after a cluster change (new plan with parent_id and a diff)",
    responses={
        201: {"description": "The new plan, with diff"},
        202: {"model": Job, "description": "Queued as a job"},
        404: {"model": ErrorBody, "description": "No such plan"},
        422: {"model": ErrorBody, "description": "Invalid change; error.field names it"},
        **BUSY_RESPONSES,
    },
)
def replan(
    request: Request,
    plan_id: str,
    body: Annotated[ReplanRequest, Body(openapi_examples=REPLAN_EXAMPLES)],
    service: ServiceDep,
    metrics: MetricsDep,
) -> Response:
    if not (body.unavailable_nodes or body.added_nodes or body.cluster or body.recalibrated):
        raise InvalidInput("give at least one of unavailable_nodes, added_nodes, cluster, recalibrated", field="body")
    check_callback_url(body.callback_url, request.app.state.settings)
    changes = ClusterChanges(
        unavailable_nodes=tuple(body.unavailable_nodes or ()),
        added_nodes=tuple(n.model_dump() for n in body.added_nodes or ()),
        cluster=body.cluster,
    )
    options = RunOptions(run_async=body.async_, callback_url=body.callback_url)
    overrides = service.observed().recalibrated_overrides(service.repo.get_plan(plan_id)) if body.recalibrated else None
    return _respond(service.replan(plan_id, changes, options, overrides), metrics, "replan")
