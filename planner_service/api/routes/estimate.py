"""/v1/estimate: the cost model for one strategy."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Depends
from fastapi.responses import JSONResponse

from planner_service.api.deps import get_service
from planner_service.api.schemas import ESTIMATE_EXAMPLES, EstimateCreate
from planner_service.service.plans import PlanService

router = APIRouter(prefix="/v1", tags=["estimate"])


@router.post("/estimate", summary="Predict step time, throughput, MFU and memory for one strategy")
def estimate(
    body: Annotated[EstimateCreate, Body(openapi_examples=ESTIMATE_EXAMPLES)],
    service: PlanService = Depends(get_service),
) -> JSONResponse:
    return JSONResponse(service.estimate(body.model_dump(exclude_unset=True)))
