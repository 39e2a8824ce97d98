"""/v1/jobs/{id}: status, progress and result of a planning job; DELETE cancels."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from planner_service.api.deps import RepoDep
from planner_service.api.schemas import INVALID_INPUT, ErrorBody, Job, Responses
from planner_service.storage.repository import StoredJob

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=INVALID_INPUT)

_NOT_FOUND: Responses = {404: {"model": ErrorBody, "description": "No such job"}}


def job_body(job: StoredJob) -> dict[str, Any]:
    """The job JSON: the stored job and its links (self, and the plan once there is one)."""
    body = {**job.to_dict(), "links": {"self": f"/v1/jobs/{job.id}"}}
    if job.plan_id:
        body["links"]["plan"] = f"/v1/plans/{job.plan_id}"
    return body


@router.get(
    "/{job_id}",
    response_model=Job,
    summary="A job: status (queued|running|succeeded|failed|cancelled), progress, plan_id",
    responses=_NOT_FOUND,
)
def get_job(job_id: str, repo: RepoDep) -> JSONResponse:
    return JSONResponse(job_body(repo.get_job(job_id)))


@router.delete(
    "/{job_id}",
    response_model=Job,
    summary="Cancel a job (409 if it already ended)",
    responses={**_NOT_FOUND, 409: {"model": ErrorBody, "description": "The job already ended"}},
)
def cancel_job(job_id: str, repo: RepoDep) -> JSONResponse:
    return JSONResponse(job_body(repo.cancel_job(job_id)))
