"""/v1/plans/{id}/launch: launch artifacts for a stored plan (planner_service.exporters)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from cost_model.errors import InvalidInput
from planner_service.api.deps import RepoDep
from planner_service.api.schemas import INVALID_INPUT, TEXT_BODY, ErrorBody, LaunchArtifacts
from planner_service.exporters import TARGETS, launch_params, render
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
def launch(
    plan_id: str,
    repo: RepoDep,
    target: Annotated[str, Query(description="One of: " + ", ".join(TARGETS))],
    image: Annotated[str | None, Query(description="Container image (Kubernetes targets)")] = None,
    command: Annotated[str | None, Query(description="Training entry point and arguments (default per target)")] = None,
    job_name: Annotated[str | None, Query(description="Job name (DNS-1123 label)")] = None,
    namespace: Annotated[str, Query(description="Kubernetes namespace")] = "default",
    queue: Annotated[str | None, Query(description="Slurm partition / Volcano or Kueue queue")] = None,
    env: Annotated[list[str] | None, Query(description="Extra environment, KEY=VALUE (repeatable)")] = None,
    smoke_test: Annotated[bool, Query(description="Run an NCCL all-reduce smoke test before training")] = False,
    nccl_debug: Annotated[str, Query(description="NCCL_DEBUG level")] = "WARN",
    master_port: Annotated[int, Query(ge=1, le=65534)] = 29500,
    format: Annotated[str, Query(description="json (all files) or raw (one file as text)")] = "json",
    file: Annotated[str | None, Query(description="With format=raw: which file (default: the primary)")] = None,
) -> Response:
    if format not in ("json", "raw"):
        raise InvalidInput(f"must be json or raw, got {format!r}", field="format")
    plan = plan_to_api(repo.get_plan(plan_id))
    params = launch_params(
        image=image,
        command=command,
        job_name=job_name,
        namespace=namespace,
        queue=queue,
        env=env,
        smoke_test=smoke_test,
        master_port=master_port,
        nccl_debug=nccl_debug,
    )
    artifact = render(plan, target, params)
    if format == "raw":
        name = file or artifact.primary
        if name not in artifact.files:
            raise InvalidInput(f"no file {name!r}; files: {', '.join(artifact.files)}", field="file")
        return PlainTextResponse(artifact.files[name])
    body = artifact.to_dict()
    body["plan_id"] = plan["id"]
    body["warnings"] = preflight_warnings(plan)
    return JSONResponse(body)
