"""/v1/profiles: upload operator profiles (or PyTorch profiler traces), list and fetch them.

A profile is validated (docs/PROFILE_FORMAT.md), fitted (cost_model.profiles.fit_profile) and
stored with its device; estimates and plans that name its ``profile_id`` are calibrated by it.
A Chrome trace (an object with ``traceEvents``) is converted first; ``?device=NAME`` says which
catalog device it was recorded on (GPU traces name their device themselves).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from cost_model.profiles import fit_profile
from planner_service.api.deps import RepoDep
from planner_service.api.schemas import INVALID_INPUT, ErrorBody, ProfileCreated, ProfileDetail, ProfileList
from planner_service.profiling.trace_import import load_profile_or_trace
from planner_service.storage.repository import StoredProfile

router = APIRouter(prefix="/v1", tags=["profiles"], responses=INVALID_INPUT)

_UPLOAD_DOC = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {"type": "object", "description": "A planner profile (schema_version 1) or a Chrome trace ({traceEvents: [...]})"},
                "examples": {
                    "profile": {
                        "summary": "A minimal profile",
                        "value": {
                            "schema": "planner-profile",
                            "schema_version": 1,
                            "device": {"name": "local-cpu"},
                            "measurements": [
                                {"op": "gemm", "backend": "torch", "dtype": "fp32", "shape": {"m": 1024, "n": 1024, "k": 1024}, "seconds": 0.016, "repeats": 5},
                                {"op": "add", "backend": "torch", "dtype": "fp32", "bytes": 12582912, "kernels": 1, "seconds": 0.0006, "repeats": 5},
                            ],
                        },
                    }
                },
            }
        },
    }
}


def _summary(p: StoredProfile) -> dict[str, Any]:
    body = p.body or {}
    fit = p.fitted or {}
    return {
        "id": p.id,
        "device": p.device,
        "source": body.get("source"),
        "name": body.get("name"),
        "created_at": p.to_dict()["created_at"],
        "measurements": len(body.get("measurements") or []),
        "efficiency": fit.get("efficiency"),
        "device_overrides": fit.get("device_overrides"),
        "quality": fit.get("quality"),
    }


_DEVICE_DOC = "Catalog device a trace was recorded on (e.g. H100-SXM5-80GB, local-cpu)"


@router.post(
    "/profiles",
    status_code=201,
    response_model=ProfileCreated,
    summary="Upload an operator profile or a PyTorch profiler trace",
    openapi_extra=_UPLOAD_DOC,
    responses={422: {"model": ErrorBody, "description": "Not a valid profile or trace; error.field names the part"}},
)
async def upload_profile(
    request: Request,
    repo: RepoDep,
    device: Annotated[str | None, Query(description=_DEVICE_DOC)] = None,
) -> JSONResponse:
    raw = await request.body()

    def store() -> tuple[StoredProfile, dict[str, Any]]:
        # parsing a large trace and the least-squares fit are CPU work: off the event loop
        profile = load_profile_or_trace(raw, device)
        body = {k: v for k, v in profile.items() if k not in ("id", "fit")}
        fit = fit_profile(body)
        profile_id = repo.save_profile(body["device"]["name"], body, fit)
        return repo.get_profile(profile_id), fit

    stored, fit = await run_in_threadpool(store)
    return JSONResponse({**_summary(stored), "fit": fit}, status_code=201, headers={"Location": f"/v1/profiles/{stored.id}"})


@router.get("/profiles", response_model=ProfileList, summary="List stored profiles (newest first)")
def list_profiles(
    repo: RepoDep,
    device: Annotated[str | None, Query(description="Only profiles of this catalog device")] = None,
) -> JSONResponse:
    return JSONResponse({"profiles": [_summary(p) for p in repo.list_profiles(device)]})


@router.get(
    "/profiles/{profile_id}",
    response_model=ProfileDetail,
    summary="One stored profile with its measurements and fit",
    responses={404: {"model": ErrorBody, "description": "No such profile"}},
)
def get_profile(profile_id: str, repo: RepoDep) -> JSONResponse:
    p = repo.get_profile(profile_id)
    return JSONResponse({**_summary(p), "profile": {**p.body, "id": p.id}, "fit": p.fitted})
