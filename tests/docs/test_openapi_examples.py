"""Every request example on the OpenAPI page (/docs) is a request that succeeds, in the order a
reader would try them: estimates, plans (after saving the cluster the saved-cluster example
names), the profile upload, and the replan examples on a plan of the cluster whose hosts they
name."""

from __future__ import annotations

from fastapi.testclient import TestClient

from planner_service.api import create_app
from planner_service.api.schemas import EXAMPLE_CLUSTER
from planner_service.settings import ServiceSettings


def examples(schema: dict, method: str, path: str) -> dict[str, dict]:
    content = schema["paths"][path][method]["requestBody"]["content"]["application/json"]
    return {name: ex["value"] for name, ex in content["examples"].items()}


def test_every_openapi_request_example_succeeds(tmp_path):
    settings = ServiceSettings(database_url=f"sqlite:///{tmp_path / 'examples.db'}")
    with TestClient(create_app(settings, start_worker=False)) as client:
        schema = client.get("/openapi.json").json()
        body_paths = sorted((m, p) for p, ops in schema["paths"].items() for m, op in ops.items() if "examples" in str(op.get("requestBody", {})))
        assert body_paths == [("post", "/v1/estimate"), ("post", "/v1/plans"), ("post", "/v1/plans/{plan_id}/observations"),
                              ("post", "/v1/plans/{plan_id}/replan"), ("post", "/v1/profiles")]

        for name, body in examples(schema, "post", "/v1/estimate").items():
            r = client.post("/v1/estimate", json=body)
            assert r.status_code == 200, (name, r.text)
            assert r.json()["fits"] is True, name

        assert client.put(f"/v1/clusters/{EXAMPLE_CLUSTER['name']}", json=EXAMPLE_CLUSTER).status_code == 200
        plans = {}
        for name, body in examples(schema, "post", "/v1/plans").items():
            r = client.post("/v1/plans", json=body)
            assert r.status_code in (200, 201, 202), (name, r.text)
            plans[name] = r.json()

        for name, body in examples(schema, "post", "/v1/profiles").items():
            r = client.post("/v1/profiles", json=body)
            assert r.status_code == 201, (name, r.text)

        replans = examples(schema, "post", "/v1/plans/{plan_id}/replan")
        named = {h for body in replans.values() for h in body.get("unavailable_nodes", [])}
        parent = next(p for p in plans.values() if "best" in p and named <= {h for g in p["cluster"]["node_groups"] for h in g.get("hostnames", [])})
        for name, body in replans.items():
            r = client.post(f"/v1/plans/{parent['id']}/replan", json=body)
            assert r.status_code in (200, 201, 202), (name, r.text)

        for name, body in examples(schema, "post", "/v1/plans/{plan_id}/observations").items():
            r = client.post(f"/v1/plans/{parent['id']}/observations", json=body)
            assert r.status_code == 201, (name, r.text)
