"""/v1/plans: create (sync, de-duplicated, or as a job), list, get, delete, replan."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated
from urllib.parse import urlsplit

from fastapi import APIRouter, Body, Depends, Query, Response
from fastapi.responses import JSONResponse

from cost_model.devices import get_device
from cost_model.errors import InvalidInput, UnknownName
from planner_service.api.deps import get_metrics, get_repository, get_service
from planner_service.api.middleware import Metrics
from planner_service.api.schemas import (
    PLAN_EXAMPLES,
    REPLAN_EXAMPLES,
    PlanCreate,
    ReplanRequest,
)
from planner_service.service.plans import Outcome, PlanService, plan_to_api
from planner_service.storage.repository import (
    MAX_PAGE,
    PLAN_SORTS,
    PlanFilters,
    Repository,
)

router = APIRouter(prefix="/v1/plans", tags=["plans"])

PLAN_STATUSES = ("optimal", "feasible")


def _check_callback_url(url: str | None) -> None:
    if url is None:
        return
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InvalidInput(f"must be an absolute http(s) URL, got {url!r}", field="callback_url")


def _respond(outcome: Outcome, metrics: Metrics, created_kind: str) -> JSONResponse:
    if outcome.kind == "job":
        job = outcome.job
        metrics.jobs_created.inc()
        body = {**job.to_dict(), "links": {"self": f"/v1/jobs/{job.id}"}}
        return JSONResponse(body, status_code=202, headers={"Location": f"/v1/jobs/{job.id}"})
    plan = outcome.plan
    if outcome.kind == "created":
        metrics.plans_created.labels(created_kind).inc()
        return JSONResponse(plan_to_api(plan), status_code=201, headers={"Location": f"/v1/plans/{plan.id}"})
    metrics.plans_deduplicated.inc()
    return JSONResponse(plan_to_api(plan), status_code=200)


@router.post(
    "",
    status_code=201,
    summary="Plan a model on a cluster",
    responses={
        200: {"description": "An identical request was planned before: the stored plan"},
        201: {"description": "The new plan"},
        202: {"description": "Queued as a job (async, or a large search): the job"},
        409: {"description": "Conflict"},
        413: {"description": "Body too large"},
        422: {"description": "Invalid input or no feasible plan; error.field names the field"},
    },
)
def create_plan(
    body: Annotated[PlanCreate, Body(openapi_examples=PLAN_EXAMPLES)],
    service: PlanService = Depends(get_service),
    metrics: Metrics = Depends(get_metrics),
) -> JSONResponse:
    raw = body.model_dump(by_alias=True, exclude_unset=True)
    _check_callback_url(raw.get("callback_url"))
    outcome = service.create_plan(raw)
    return _respond(outcome, metrics, "forced" if raw.get("force") else "plan")


def _utc(ts: datetime | None) -> datetime | None:
    if ts is None:
        return None
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts


@router.get("", summary="List stored plans (filters, sort, cursor pagination)")
def list_plans(
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
    repo: Repository = Depends(get_repository),
) -> JSONResponse:
    if status is not None and status not in PLAN_STATUSES:
        raise InvalidInput(f"must be one of {', '.join(PLAN_STATUSES)}, got {status!r}", field="status")
    if device is not None:
        try:
            device = get_device(device).name
        except UnknownName:
            pass  # an inline device's name: match it as given
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


@router.get("/{plan_id}", summary="One stored plan")
def get_plan(plan_id: str, repo: Repository = Depends(get_repository)) -> JSONResponse:
    # Stored JSON is plain already: JSONResponse skips FastAPI's recursive jsonable_encoder.
    return JSONResponse(plan_to_api(repo.get_plan(plan_id)))


@router.delete("/{plan_id}", status_code=204, summary="Delete a stored plan (409 while replans refer to it)")
def delete_plan(plan_id: str, repo: Repository = Depends(get_repository)) -> Response:
    repo.delete_plan(plan_id)
    return Response(status_code=204)


@router.post(
    "/{plan_id}/replan",
    status_code=201,
    summary="Re-plan after a cluster change (new plan with parent_id and a diff)",
    responses={201: {"description": "The new plan, with diff"}, 202: {"description": "Queued as a job"}, 404: {"description": "No such plan"}},
)
def replan(
    plan_id: str,
    body: Annotated[ReplanRequest, Body(openapi_examples=REPLAN_EXAMPLES)],
    service: PlanService = Depends(get_service),
    metrics: Metrics = Depends(get_metrics),
) -> JSONResponse:
    raw = body.model_dump(by_alias=True, exclude_unset=True)
    if not any(raw.get(k) for k in ("unavailable_nodes", "added_nodes", "cluster")):
        raise InvalidInput("give at least one of unavailable_nodes, added_nodes, cluster", field="body")
    _check_callback_url(raw.get("callback_url"))
    return _respond(service.replan(plan_id, raw), metrics, "replan")
