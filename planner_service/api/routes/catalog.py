"""/v1/devices and /v1/presets: the built-in catalogs."""

from __future__ import annotations

from fastapi import APIRouter

from cost_model.devices import catalog
from cost_model.transformer.spec import PRESETS

router = APIRouter(prefix="/v1", tags=["catalog"])


@router.get("/devices", summary="The device catalog (figures with sources)")
def devices() -> dict:
    return {"items": [d.to_dict() for d in catalog().values()]}


@router.get("/presets", summary="The model presets")
def presets() -> dict:
    return {"items": [p.to_dict() for p in PRESETS.values()]}
