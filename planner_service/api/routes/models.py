"""/v1/models: upload an ONNX model (multipart) → a stored model id usable in plan requests as
``{"model": {"model_id": "<id>"}}``; read it back."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, File, Form, Query, UploadFile
from fastapi.responses import JSONResponse

from cost_model.errors import InvalidGraph, InvalidInput
from cost_model.graph.parse import graph_from_dict
from planner_service.api.deps import RepoDep
from planner_service.api.schemas import INVALID_INPUT, ErrorBody, ModelCreated, ModelDetail, ModelList
from planner_service.api.validation import text_problem
from planner_service.importers.onnx import MAX_ONNX_BYTES
from planner_service.importers.onnx_stream import load_onnx_stream

router = APIRouter(prefix="/v1/models", tags=["models"], responses=INVALID_INPUT)


def _summary(graph: dict[str, Any]) -> dict[str, Any]:
    spec = graph_from_dict(graph, field_path="model.onnx")
    return spec.summary()


def _parse_dims(dims: str | None) -> dict[str, int] | None:
    if dims is None or dims == "":
        return None
    try:
        value = json.loads(dims)
    except json.JSONDecodeError:
        raise InvalidInput("must be a JSON object of dimension name → size", field="dims") from None
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v > 0
                                              for k, v in value.items()):
        raise InvalidInput("must be a JSON object of dimension name → positive integer", field="dims")
    return value


@router.post(
    "/onnx",
    status_code=201,
    response_model=ModelCreated,
    summary="Upload an ONNX model; returns its id",
    responses={
        201: {"description": "Stored: id, name, format and a summary (operators, parameters)"},
        413: {"model": ErrorBody, "description": "Upload larger than the body limit"},
        503: {"model": ErrorBody, "description": "Too many uploads at once (PLANNER_MAX_CONCURRENT_UPLOADS); retry after Retry-After seconds",
              "headers": {"Retry-After": {"schema": {"type": "integer"}, "description": "Seconds to wait"}}},
        422: {"model": ErrorBody, "description": "Not an ONNX model, unsupported operators (listed), bad shapes, too many nodes"},
    },
)
def upload_onnx(
    repo: RepoDep,
    file: Annotated[UploadFile, File(description="The .onnx file (weights in external data need not be uploaded: only shapes are read)")],
    name: Annotated[str | None, Form(description="Model name (default: the file name)")] = None,
    dims: Annotated[str | None, Form(description='JSON object binding extra symbolic dimensions, e.g. {"num_experts": 8}')] = None,
) -> JSONResponse:
    if name is not None and (text_problem(name, 200) or not name.strip()):
        raise InvalidInput(f"must be 1-200 characters of text ({text_problem(name, 200) or 'empty'})", field="name")
    if file.filename and text_problem(file.filename, 1000):
        raise InvalidInput(f"the file name {text_problem(file.filename, 1000)}", field="file")
    # The upload is on disk (a spooled temporary file, streamed there by the multipart parser
    # under the body limit): it is read with its weights skipped, never whole into memory.
    if file.size is not None and file.size > MAX_ONNX_BYTES:
        raise InvalidGraph("ONNX uploads over 2 GB must keep their weights as external data", field="file")
    model_name = name or (file.filename or "onnx-model").rsplit("/", 1)[-1].removesuffix(".onnx") or "onnx-model"
    graph = load_onnx_stream(file.file, name=model_name, dims=_parse_dims(dims))
    summary = _summary(graph)
    model_id = repo.save_model(model_name, "onnx", graph)
    body = {"id": model_id, "name": model_name, "format": "onnx", "summary": summary,
            "links": {"self": f"/v1/models/{model_id}"}}
    return JSONResponse(body, status_code=201, headers={"Location": f"/v1/models/{model_id}"})


@router.get(
    "/{model_id}",
    response_model=ModelDetail,
    summary="A stored model: metadata, summary and (optionally) its operator graph",
    responses={404: {"model": ErrorBody, "description": "No such model"}},
)
def get_model(
    model_id: str,
    repo: RepoDep,
    include_graph: Annotated[bool, Query(description="Include the operator graph JSON")] = False,
) -> JSONResponse:
    stored = repo.get_model(model_id)
    out = stored.to_dict(include_graph=include_graph)
    out["summary"] = _summary(stored.graph)
    return JSONResponse(out)


@router.get("", response_model=ModelList, summary="Stored models (newest first)")
def list_models(repo: RepoDep) -> JSONResponse:
    return JSONResponse({"items": [m.to_dict() for m in repo.list_models()]})
