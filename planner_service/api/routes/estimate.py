"""/v1/estimate: the cost model for one strategy."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body
from fastapi.responses import JSONResponse

from planner_service.api.deps import ServiceDep
from planner_service.api.schemas import ESTIMATE_EXAMPLES, INVALID_INPUT, ErrorBody, EstimateCreate, Prediction

router = APIRouter(prefix="/v1", tags=["estimate"], responses=INVALID_INPUT)


@router.post(
    "/estimate",
    response_model=Prediction,
    summary="Predict step time, throughput, MFU and memory for one strategy",
    responses={422: {"model": ErrorBody, "description": "Invalid input or an impossible strategy; error.field names the knob"}},
)
def estimate(
    body: Annotated[EstimateCreate, Body(openapi_examples=ESTIMATE_EXAMPLES)],
    service: ServiceDep,
) -> JSONResponse:
    return JSONResponse(service.estimate(body.model_dump(exclude_unset=True)))
