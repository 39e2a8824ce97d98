"""/v1/clusters: import clusters from formats users have, and saved named clusters that plan
requests can reference by name (``"cluster": "my-cluster"``)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Request, Response
from fastapi.responses import JSONResponse
from starlette.datastructures import UploadFile

from cost_model.cluster import cluster_from_dict
from cost_model.errors import InvalidCluster, InvalidInput
from planner_service.api.deps import RepoDep
from planner_service.api.schemas import INVALID_INPUT, ClusterImport, ClusterList, ErrorBody, Responses, SavedCluster
from planner_service.importers import FORMATS, import_cluster

router = APIRouter(prefix="/v1/clusters", tags=["clusters"], responses=INVALID_INPUT)

_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def _check_name(name: str) -> str:
    if not name or len(name) > 100 or not set(name) <= _NAME_CHARS:
        raise InvalidInput("must be 1-100 characters of letters, digits, '.', '_', '-'", field="name")
    return name


def _validated(body: Any, name: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise InvalidCluster("must be a cluster object {name, node_groups, nodes?}", field="cluster")
    named: dict[str, Any] = {**body, "name": name}
    cluster_from_dict(named)
    return named


async def _sources(request: Request, filename: str) -> list[tuple[str, str]]:
    ctype = request.headers.get("content-type", "")
    if ctype.startswith("multipart/form-data"):
        form = await request.form()
        out = []
        for key, value in form.multi_items():
            if isinstance(value, UploadFile):
                data = await value.read()
                name = value.filename or key
            else:
                data, name = str(value).encode(), key
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidInput(f"file {name[:100]!r} is not UTF-8 text", field="files") from None
            if "\x00" in text or "\x00" in name:
                raise InvalidInput(f"file {name[:100]!r} contains a NUL character", field="files")
            out.append((name, text))
        return out
    data = await request.body()
    if not data.strip():
        raise InvalidInput("send the file as the request body or as multipart 'files'", field="body")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput("is not UTF-8 text", field="body") from None
    if "\x00" in text:
        raise InvalidInput("contains a NUL character", field="body")
    return [(filename, text)]


@router.post(
    "/import",
    summary="Import a cluster: paddle (auto-parallel cluster JSON), nvidia-smi (query CSV + topo -m per node), k8s-nodes (kubectl get nodes -o json; network-topology labels), slurm-topology (topology.conf + cluster JSON)",
    response_model=ClusterImport,
    responses={
        200: {"description": "{cluster, warnings}; saved too when ?save=true (needs ?name=)"},
        409: {"model": ErrorBody, "description": "save=true and the name exists (add replace=true)"},
        422: {"model": ErrorBody, "description": "Malformed input: error.field names the part, error.message the reason"},
    },
)
async def import_route(
    request: Request,
    repo: RepoDep,
    format: Annotated[str, Query(description="One of: " + ", ".join(FORMATS))],
    name: Annotated[str | None, Query(description="Cluster name")] = None,
    filename: Annotated[str, Query(description="Name of a raw-body file (nvidia-smi: the host name)")] = "input",
    save: bool = False,
    replace: bool = False,
) -> JSONResponse:
    if format not in FORMATS:
        raise InvalidInput(f"unknown format {format!r}; one of {', '.join(FORMATS)}", field="format")
    if name is not None:
        _check_name(name)
    if save and not name:
        raise InvalidInput("is required with save=true", field="name")
    result = import_cluster(format, await _sources(request, filename), name=name)
    body = result.to_dict()
    if save and name:
        stored = repo.save_cluster(name, result.cluster, replace=replace)
        body["saved"] = stored.to_dict()
    return JSONResponse(body)


_NOT_FOUND: Responses = {404: {"model": ErrorBody, "description": "No saved cluster with this name"}}
_INVALID: Responses = {422: {"model": ErrorBody, "description": "Not a valid cluster; error.field names the part"}}


@router.get("", response_model=ClusterList, summary="Saved clusters")
def list_clusters(repo: RepoDep) -> JSONResponse:
    return JSONResponse({"items": [c.to_dict() for c in repo.list_clusters()]})


@router.post(
    "",
    status_code=201,
    response_model=SavedCluster,
    summary="Save a named cluster ({name, cluster} or a cluster object with a name)",
    responses={409: {"model": ErrorBody, "description": "The name exists (PUT replaces)"}, **_INVALID},
)
def create_cluster(repo: RepoDep, body: Annotated[dict[str, Any], Body()]) -> JSONResponse:
    if isinstance(body.get("cluster"), dict):
        name, cluster = body.get("name") or body["cluster"].get("name"), body["cluster"]
    else:
        name, cluster = body.get("name"), body
    if not isinstance(name, str):
        raise InvalidInput("is required", field="name")
    stored = repo.save_cluster(_check_name(name), _validated(cluster, name))
    return JSONResponse(stored.to_dict(), status_code=201, headers={"Location": f"/v1/clusters/{name}"})


@router.get("/{name}", response_model=SavedCluster, summary="One saved cluster", responses=_NOT_FOUND)
def get_cluster(name: str, repo: RepoDep) -> JSONResponse:
    return JSONResponse(repo.get_cluster(name).to_dict())


@router.put("/{name}", response_model=SavedCluster, summary="Create or replace a saved cluster", responses=_INVALID)
def put_cluster(name: str, repo: RepoDep, body: Annotated[dict[str, Any], Body()]) -> JSONResponse:
    cluster = body["cluster"] if isinstance(body.get("cluster"), dict) else body
    return JSONResponse(repo.save_cluster(_check_name(name), _validated(cluster, name), replace=True).to_dict())


@router.delete("/{name}", status_code=204, summary="Delete a saved cluster", responses=_NOT_FOUND)
def delete_cluster(name: str, repo: RepoDep) -> Response:
    repo.delete_cluster(name)
    return Response(status_code=204)
