"""Observed runs: POST/GET /v1/plans/{id}/observations, GET /v1/plans/{id}/suggestion and
GET /v1/clusters/{name}/calibration (``service.observed``)."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Body, Request
from fastapi.responses import JSONResponse

from planner_service.api.deps import ServiceDep
from planner_service.api.schemas import (
    BUSY_RESPONSES,
    INVALID_INPUT,
    ClusterCalibration,
    ErrorBody,
    Observation,
    ObservationCreate,
    ObservationList,
    PlanSuggestion,
)
from planner_service.service.worker import check_callback_url

router = APIRouter(prefix="/v1", tags=["observations"], responses=INVALID_INPUT)
log = logging.getLogger("planner.api.observations")

_NOT_FOUND = {404: {"model": ErrorBody, "description": "No such plan (or cluster calibration) in the key's tenant"}}

OBSERVATION_EXAMPLES = {
    "json": {"summary": "Step times as JSON", "value": {"log": '{"step_times_s": [3.1, 1.21, 1.19, 1.2, 1.22, 1.2]}', "format": "json"}},
    "csv": {"summary": "A CSV of step times with peak memory (format detected)",
            "value": {"log": "step,step_time_ms,max_allocated_GB,max_reserved_GB\n1,3120,9.1,12.0\n2,1212,10.4,12.0\n3,1208,10.4,12.0\n"
                             "4,1215,10.4,12.0\n5,1210,10.4,12.0\n", "warmup_steps": 1}},
}


@router.post(
    "/plans/{plan_id}/observations",
    status_code=201,
    response_model=Observation,
    summary="Record what a launched run of the plan measured; recalibrates the plan's cluster",
    responses={**_NOT_FOUND, 422: {"model": ErrorBody, "description": "Empty, truncated or unreadable log, or a log of another model or layout; "
                                                                      "error.field names it and the message says what differs"}},
)
def create_observation(
    request: Request,
    plan_id: str,
    body: Annotated[ObservationCreate, Body(openapi_examples=OBSERVATION_EXAMPLES)],
    service: ServiceDep,
) -> JSONResponse:
    check_callback_url(body.callback_url, request.app.state.settings)
    observed = service.observed()
    out = observed.record(plan_id, body.log, body.format, body.warmup_steps)
    if body.callback_url:
        suggestion = observed.suggestion(plan_id)
        out["suggestion"] = {"suggest": suggestion["suggest"], "reason": suggestion["reason"]}
        if suggestion["suggest"]:
            request.app.state.observation_callbacks.submit(body.callback_url, {"event": "plan.suggestion", "plan_id": plan_id, "suggestion": suggestion})
    return JSONResponse(out, status_code=201, headers={"Location": f"/v1/plans/{plan_id}/observations"})


@router.get("/plans/{plan_id}/observations", response_model=ObservationList, summary="The plan's observed runs", responses=_NOT_FOUND)
def list_observations(plan_id: str, service: ServiceDep) -> JSONResponse:
    return JSONResponse({"items": service.observed().list_for_plan(plan_id)})


@router.get(
    "/plans/{plan_id}/suggestion",
    response_model=PlanSuggestion,
    summary="A better plan when the cluster's recalibration or the observed memory calls for one (plans, stores nothing)",
    responses={**_NOT_FOUND, **BUSY_RESPONSES},
)
def plan_suggestion(plan_id: str, service: ServiceDep) -> JSONResponse:
    return JSONResponse(service.observed().suggestion(plan_id))


@router.get(
    "/clusters/{name}/calibration",
    response_model=ClusterCalibration,
    summary="The cluster's calibration from observed runs: constants, history, residuals",
    responses=_NOT_FOUND,
)
def cluster_calibration(name: str, service: ServiceDep) -> JSONResponse:
    return JSONResponse(service.observed().calibration_view(name))
