"""/v1/jobs/{id}: status, progress and result of a planning job; DELETE cancels."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from planner_service.api.deps import get_repository
from planner_service.storage.repository import Repository

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


def _job_body(job) -> dict:
    body = {**job.to_dict(), "links": {"self": f"/v1/jobs/{job.id}"}}
    if job.plan_id:
        body["links"]["plan"] = f"/v1/plans/{job.plan_id}"
    return body


@router.get("/{job_id}", summary="A job: status (queued|running|succeeded|failed|cancelled), progress, plan_id")
def get_job(job_id: str, repo: Repository = Depends(get_repository)) -> dict:
    return _job_body(repo.get_job(job_id))


@router.delete("/{job_id}", summary="Cancel a job (409 if it already ended)")
def cancel_job(job_id: str, repo: Repository = Depends(get_repository)) -> dict:
    return _job_body(repo.cancel_job(job_id))
