"""/v1/devices and /v1/presets: the built-in catalogs."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from cost_model.devices import catalog
from cost_model.transformer.spec import PRESETS
from planner_service.api.schemas import DeviceList, PresetList

router = APIRouter(prefix="/v1", tags=["catalog"])


@router.get("/devices", response_model=DeviceList, summary="The device catalog (figures with sources)")
def devices() -> JSONResponse:
    return JSONResponse({"items": [d.to_dict() for d in catalog().values()]})


@router.get("/presets", response_model=PresetList, summary="The model presets")
def presets() -> JSONResponse:
    return JSONResponse({"items": [p.to_dict() for p in PRESETS.values()]})
