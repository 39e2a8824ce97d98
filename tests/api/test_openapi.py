"""OpenAPI documents every success body, and the bodies the routes send match what it documents.

The routes answer with the dicts they build (``JSONResponse``), so the response models only
describe them; the second test is what keeps the description true: it sends real requests and
validates each body against the schema OpenAPI gives for that operation and status.
"""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from helpers.graphs import mlp_onnx
from helpers.profiles import synthetic_profile
from helpers.requests import TWO_NODE_CLUSTER, small_request

HTTP_METHODS = ("get", "put", "post", "delete", "patch", "head", "options")
#: Success statuses that carry no body by definition.
NO_BODY = {"204", "304"}


def _operations(spec: dict[str, Any]):
    for path, item in spec["paths"].items():
        for method, op in item.items():
            if method in HTTP_METHODS:
                yield path, method, op


def test_every_success_response_of_every_operation_has_a_schema(client):
    spec = client.app.openapi()
    missing = []
    successes = 0
    for path, method, op in _operations(spec):
        for status, response in op["responses"].items():
            if not status.startswith("2"):
                continue
            successes += 1
            content = response.get("content") or {}
            if status in NO_BODY:
                if content:
                    missing.append(f"{method.upper()} {path} {status}: a no-content status documents a body")
                continue
            if not content:
                missing.append(f"{method.upper()} {path} {status}: no content")
            for media_type, body in content.items():
                schema = body.get("schema") or {}
                if media_type == "application/json" and "$ref" not in schema:
                    missing.append(f"{method.upper()} {path} {status}: JSON body without a named schema ({schema})")
                elif not schema:
                    missing.append(f"{method.upper()} {path} {status} {media_type}: no schema")
    assert not missing, "\n".join(missing)
    assert successes >= 29  # every operation of the API is walked (web page routes are not in the schema)


def test_error_responses_document_the_error_body(client):
    """Every documented error has the API's error body (``{"error": {code, message, field}}``),
    request validation errors included (api.errors turns them into it)."""
    spec = client.app.openapi()
    assert "HTTPValidationError" not in spec["components"]["schemas"]
    for path, method, op in _operations(spec):
        for status, response in op["responses"].items():
            if status[0] in "45":
                schema = (response.get("content") or {}).get("application/json", {}).get("schema", {})
                assert schema.get("$ref") == "#/components/schemas/ErrorBody", (method, path, status, schema)


class Checker:
    """Validates response bodies against the schema OpenAPI documents for their operation."""

    def __init__(self, client) -> None:
        self.client = client
        self.spec = client.app.openapi()
        self.checked: set[tuple[str, str, str]] = set()

    def __call__(self, resp, method: str, template: str, status: int) -> dict[str, Any]:
        assert resp.status_code == status, resp.text
        op = self.spec["paths"][template][method]
        schema = op["responses"][str(status)]["content"]["application/json"]["schema"]
        body = resp.json()
        jsonschema.Draft202012Validator({**schema, "components": self.spec["components"]}).validate(body)
        self.checked.add((method, template, str(status)))
        return body


@pytest.fixture(scope="module")
def onnx_bytes(tmp_path_factory) -> bytes:
    pytest.importorskip("onnx")
    path = mlp_onnx(str(tmp_path_factory.mktemp("m") / "mlp.onnx"), layers=2, width=64)
    with open(path, "rb") as fh:
        return fh.read()


def test_bodies_match_their_documented_schemas(client, onnx_bytes):
    check = Checker(client)
    check(client.get("/healthz"), "get", "/healthz", 200)
    check(client.get("/readyz"), "get", "/readyz", 200)
    check(client.get("/v1/devices"), "get", "/v1/devices", 200)
    check(client.get("/v1/presets"), "get", "/v1/presets", 200)
    body = small_request()
    check(client.post("/v1/estimate", json={**{k: body[k] for k in ("model", "training", "cluster")}, "strategy": {"dp": 8}}),
          "post", "/v1/estimate", 200)

    plan = check(client.post("/v1/plans", json=body), "post", "/v1/plans", 201)
    check(client.post("/v1/plans", json=body), "post", "/v1/plans", 200)
    check(client.get(f"/v1/plans/{plan['id']}"), "get", "/v1/plans/{plan_id}", 200)
    check(client.get("/v1/plans"), "get", "/v1/plans", 200)
    check(client.get(f"/v1/plans/{plan['id']}/launch", params={"target": "torchrun"}), "get", "/v1/plans/{plan_id}/launch", 200)
    job = check(client.post("/v1/plans", json={**body, "top_k": 1, "async": True}), "post", "/v1/plans", 202)
    check(client.get(f"/v1/jobs/{job['id']}"), "get", "/v1/jobs/{job_id}", 200)

    two = check(client.post("/v1/plans", json=small_request(cluster=TWO_NODE_CLUSTER)), "post", "/v1/plans", 201)
    child = check(client.post(f"/v1/plans/{two['id']}/replan", json={"unavailable_nodes": ["node-1"]}),
                  "post", "/v1/plans/{plan_id}/replan", 201)
    assert child["diff"] and child["parent_id"] == two["id"]
    check(client.post(f"/v1/plans/{two['id']}/replan", json={"unavailable_nodes": ["node-1"], "async": True}),
          "post", "/v1/plans/{plan_id}/replan", 202)
    graph = check(client.post("/v1/models/onnx", files={"file": ("mlp.onnx", onnx_bytes, "application/octet-stream")}),
                  "post", "/v1/models/onnx", 201)
    check(client.get(f"/v1/models/{graph['id']}", params={"include_graph": True}), "get", "/v1/models/{model_id}", 200)
    check(client.get("/v1/models"), "get", "/v1/models", 200)
    graph_plan = check(client.post("/v1/plans", json={**body, "model": {"model_id": graph["id"]}}), "post", "/v1/plans", 201)
    assert graph_plan["best"]["ranks"]

    check(client.post("/v1/clusters", json={"name": "lab", "cluster": TWO_NODE_CLUSTER}), "post", "/v1/clusters", 201)
    check(client.put("/v1/clusters/lab", json=TWO_NODE_CLUSTER), "put", "/v1/clusters/{name}", 200)
    check(client.get("/v1/clusters/lab"), "get", "/v1/clusters/{name}", 200)
    check(client.get("/v1/clusters"), "get", "/v1/clusters", 200)
    nodes = {"items": [{"metadata": {"name": "node-a", "labels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.count": "8"}},
                        "status": {"capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "8"}}}]}
    check(client.post("/v1/clusters/import", params={"format": "k8s-nodes", "name": "k8s", "save": "true"}, json=nodes),
          "post", "/v1/clusters/import", 200)

    profile = check(client.post("/v1/profiles", json=synthetic_profile(collectives=False)), "post", "/v1/profiles", 201)
    check(client.get(f"/v1/profiles/{profile['id']}"), "get", "/v1/profiles/{profile_id}", 200)
    check(client.get("/v1/profiles"), "get", "/v1/profiles", 200)
    steps = '{"step_times_s": [3.0, 1.0, 1.01, 0.99, 1.0, 1.02]}'
    check(client.post(f"/v1/plans/{plan['id']}/observations", json={"log": steps}), "post", "/v1/plans/{plan_id}/observations", 201)
    check(client.get(f"/v1/plans/{plan['id']}/observations"), "get", "/v1/plans/{plan_id}/observations", 200)
    check(client.get(f"/v1/plans/{plan['id']}"), "get", "/v1/plans/{plan_id}", 200)  # now with "observed"
    check(client.get(f"/v1/plans/{plan['id']}/suggestion"), "get", "/v1/plans/{plan_id}/suggestion", 200)
    check(client.get("/v1/clusters/one-node/calibration"), "get", "/v1/clusters/{name}/calibration", 200)
    # cancel last: the job may have finished already (409), which has the error body
    cancel = client.delete(f"/v1/jobs/{job['id']}")
    if cancel.status_code == 200:
        check(cancel, "delete", "/v1/jobs/{job_id}", 200)

    documented = {(m, p, s) for p, m, op in _operations(check.spec) for s in op["responses"]
                  if s.startswith("2") and s not in NO_BODY and "application/json" in (op["responses"][s].get("content") or {})}
    assert documented - check.checked <= {("delete", "/v1/jobs/{job_id}", "200")}, documented - check.checked
