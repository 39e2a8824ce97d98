"""/v1/plans/{id}/launch: launch artifacts for a stored plan (planner_service.exporters)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from cost_model.errors import InvalidInput
from planner_service.api.deps import RepoDep
from planner_service.api.schemas import INVALID_INPUT, TEXT_BODY, ErrorBody, LaunchArtifacts, LaunchQuery
from planner_service.exporters import launch_params_from, render
from planner_service.exporters.preflight import preflight_warnings
from planner_service.service.plans import plan_to_api

router = APIRouter(prefix="/v1/plans", tags=["launch"], responses=INVALID_INPUT)


@router.get(
    "/{plan_id}/launch",
    summary="Launch artifacts for a plan (scheduler job, launcher commands, framework config)",
    response_model=LaunchArtifacts,
    responses={
        200: {
            "description": "{target, primary, files: {name: text}, notes, warnings}; with format=raw the primary file (or ?file=) as text",
            "content": TEXT_BODY,
        },
        404: {"model": ErrorBody, "description": "No plan with this id"},
        422: {"model": ErrorBody, "description": "Unknown target or bad parameter; error.field names it"},
    },
)
def launch(plan_id: str, repo: RepoDep, query: Annotated[LaunchQuery, Query()]) -> Response:
    if query.format not in ("json", "raw"):
        raise InvalidInput(f"must be json or raw, got {query.format!r}", field="format")
    plan = plan_to_api(repo.get_plan(plan_id))
    artifact = render(plan, query.target, launch_params_from(query.model_dump()))
    if query.format == "raw":
        name = query.file or artifact.primary
        if name not in artifact.files:
            raise InvalidInput(f"no file {name!r}; files: {', '.join(artifact.files)}", field="file")
        return PlainTextResponse(artifact.files[name])
    body = artifact.to_dict()
    body["plan_id"] = plan["id"]
    body["warnings"] = preflight_warnings(plan)
    return JSONResponse(body)
