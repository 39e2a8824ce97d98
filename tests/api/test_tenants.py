"""Tenants and API keys over every /v1 route: without a key 401, a reader may not write (403),
tenant B never sees, changes or deletes tenant A's plans, jobs, clusters, profiles and models
(404, never 403), de-duplication is per tenant, an admin reads across tenants; the rate limit
answers 429 with Retry-After and the Host check 400."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.graphs import mlp_onnx
from helpers.profiles import synthetic_profile
from helpers.requests import SMALL_CLUSTER, small_request
from planner_service.settings import ServiceSettings


def _keys(client) -> dict[str, dict[str, str]]:
    repo = client.app.state.repository
    out = {}
    for who, tenant, role in (("a", "team-a", "member"), ("b", "team-b", "member"), ("reader", "team-a", "reader"), ("admin", "ops", "admin")):
        key, _ = repo.create_api_key(tenant, role)
        out[who] = {"Authorization": f"Bearer {key}"}
    return out


@pytest.fixture
def auth_client(make_client):
    return make_client(auth="enabled", start_worker=True, solver_time_limit_s=2.0)


def test_every_v1_route_needs_a_key(auth_client):
    spec = auth_client.get("/openapi.json").json()
    assert "HTTPBearer" in spec["components"]["securitySchemes"]
    for path, methods in spec["paths"].items():
        if not path.startswith("/v1"):
            continue
        url = path.replace("{plan_id}", "00000000-0000-0000-0000-000000000000").replace("{job_id}", "00000000-0000-0000-0000-000000000000")
        url = url.replace("{profile_id}", "00000000-0000-0000-0000-000000000000").replace("{model_id}", "00000000-0000-0000-0000-000000000000")
        url = url.replace("{name}", "x")
        for method in methods:
            r = auth_client.request(method.upper(), url)
            assert r.status_code == 401, (method, path, r.status_code)
            assert r.headers["www-authenticate"] == "Bearer"
            assert r.json()["error"]["field"] == "Authorization"
            assert set(methods[method]["responses"]) >= {"401", "403", "429"}, (method, path)
    assert auth_client.get("/v1/plans", headers={"Authorization": "Bearer plk_0123456789abcdef_wrong"}).status_code == 401
    assert auth_client.get("/healthz").status_code == 200  # health stays open


def test_roles_and_revocation(auth_client):
    keys = _keys(auth_client)
    assert auth_client.get("/v1/plans", headers=keys["reader"]).status_code == 200
    r = auth_client.post("/v1/plans", json=small_request(), headers=keys["reader"])
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
    assert auth_client.put("/v1/clusters/c1", json=SMALL_CLUSTER, headers=keys["reader"]).status_code == 403
    estimate = {**small_request(), "strategy": {"dp": 8, "micro_batch_size": 2}}
    assert auth_client.post("/v1/estimate", json=estimate, headers=keys["reader"]).status_code == 200
    repo = auth_client.app.state.repository
    key, record = repo.create_api_key("team-a", "member")
    assert auth_client.get("/v1/plans", headers={"Authorization": f"Bearer {key}"}).status_code == 200
    repo.revoke_api_key(record.id)
    assert auth_client.get("/v1/plans", headers={"Authorization": f"Bearer {key}"}).status_code == 401
    assert key not in str([k.to_dict() for k in repo.list_api_keys()])


def _wait_job(client, job_id, headers):
    import time

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}", headers=headers).json()
        if job["status"] in ("succeeded", "failed", "cancelled"):
            return job
        time.sleep(0.05)
    raise AssertionError("job did not finish")


def test_tenant_b_never_sees_changes_or_deletes_tenant_a(auth_client, tmp_path):
    c, keys = auth_client, _keys(auth_client)
    a, b, admin = keys["a"], keys["b"], keys["admin"]
    # A's resources: a saved cluster, a profile, a model, a plan, a replan, a job.
    assert c.put("/v1/clusters/c1", json=SMALL_CLUSTER, headers=a).status_code == 200
    profile = c.post("/v1/profiles", json=synthetic_profile(), headers=a)
    assert profile.status_code == 201, profile.text
    profile_id = profile.json()["id"]
    onnx = Path(mlp_onnx(str(tmp_path / "m.onnx"), layers=2, width=64)).read_bytes()
    model = c.post("/v1/models/onnx", files={"file": ("m.onnx", onnx, "application/octet-stream")}, headers=a)
    assert model.status_code == 201, model.text
    model_id = model.json()["id"]
    plan = c.post("/v1/plans", json=small_request(cluster="c1"), headers=a)
    assert plan.status_code == 201, plan.text
    plan_id = plan.json()["id"]
    job = c.post("/v1/plans", json=small_request(**{"async": True, "training": {"global_batch_size": 32, "sequence_length": 2048}}), headers=a)
    assert job.status_code == 202
    job_id = job.json()["id"]
    _wait_job(c, job_id, a)
    replan = c.post(f"/v1/plans/{plan_id}/replan", json={"unavailable_nodes": [], "cluster": {**SMALL_CLUSTER, "name": "one-node"}}, headers=a)
    assert replan.status_code in (201, 422), replan.text

    # B: every read by id is a 404, every list is empty, every change of A's ids a 404.
    for url in (f"/v1/plans/{plan_id}", f"/v1/jobs/{job_id}", "/v1/clusters/c1", f"/v1/profiles/{profile_id}", f"/v1/models/{model_id}",
                f"/v1/plans/{plan_id}/launch?target=torchrun"):
        r = c.get(url, headers=b)
        assert r.status_code == 404, (url, r.status_code)
        assert c.get(url, headers=a).status_code == 200, url
    assert c.get("/v1/plans", headers=b).json()["items"] == []
    assert c.get("/v1/clusters", headers=b).json()["items"] == []
    assert c.get("/v1/profiles", headers=b).json()["profiles"] == []
    assert c.get("/v1/models", headers=b).json()["items"] == []
    assert c.delete(f"/v1/plans/{plan_id}", headers=b).status_code == 404
    assert c.delete(f"/v1/jobs/{job_id}", headers=b).status_code == 404
    assert c.delete("/v1/clusters/c1", headers=b).status_code == 404
    assert c.post(f"/v1/plans/{plan_id}/replan", json={"unavailable_nodes": ["node-0"]}, headers=b).status_code == 404
    # B's references to A's cluster, profile and model do not resolve.
    assert c.post("/v1/plans", json=small_request(cluster="c1"), headers=b).json()["error"]["field"] == "cluster"
    assert c.post("/v1/plans", json=small_request(profile_id=profile_id), headers=b).json()["error"]["field"] == "profile_id"
    r = c.post("/v1/plans", json=small_request(model={"model_id": model_id}), headers=b)
    assert r.status_code == 422 and r.json()["error"]["field"] == "model.model_id"
    # B's own cluster of the same name does not replace A's.
    other = {**SMALL_CLUSTER, "node_groups": [{**SMALL_CLUSTER["node_groups"][0], "gpus_per_node": 4}]}
    assert c.put("/v1/clusters/c1", json=other, headers=b).status_code == 200
    assert c.get("/v1/clusters/c1", headers=a).json()["cluster"]["node_groups"][0]["gpus_per_node"] == 8
    # De-duplication is per tenant: the same request is a new plan for B.
    mine = c.post("/v1/plans", json=small_request(cluster="c1"), headers=a)
    assert mine.status_code == 200 and mine.json()["id"] == plan_id
    theirs = c.post("/v1/plans", json=small_request(), headers=b)
    assert theirs.status_code == 201 and theirs.json()["id"] != plan_id
    # An admin reads across tenants, but writes only its own.
    assert c.get(f"/v1/plans/{plan_id}", headers=admin).status_code == 200
    assert c.get(f"/v1/jobs/{job_id}", headers=admin).status_code == 200
    assert {p["id"] for p in c.get("/v1/plans", headers=admin).json()["items"]} >= {plan_id, theirs.json()["id"]}
    assert c.delete(f"/v1/plans/{theirs.json()['id']}", headers=admin).status_code == 404
    # A still has everything.
    assert c.get(f"/v1/plans/{plan_id}", headers=a).status_code == 200


def test_rate_limit_is_per_tenant_with_retry_after(make_client):
    c = make_client(auth="enabled", start_worker=False, rate_limit="3/minute")
    keys = _keys(c)
    for _ in range(3):
        assert c.get("/v1/devices", headers=keys["a"]).status_code == 200
    r = c.get("/v1/devices", headers=keys["a"])
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
    assert r.json()["error"]["code"] == "rate_limited"
    assert c.get("/v1/devices", headers=keys["b"]).status_code == 200  # another tenant is not held


def test_host_header_is_checked(make_client):
    c = make_client(start_worker=False, allowed_hosts="planner.example.org")
    r = c.get("/healthz")
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_host"
    assert c.get("/healthz", headers={"Host": "planner.example.org"}).status_code == 200
    assert c.get("/healthz", headers={"Host": "planner.example.org:8000"}).status_code == 200


def test_disabled_auth_only_on_loopback():
    s = ServiceSettings(auth="disabled")
    for host in ("127.0.0.1", "::1", "localhost"):
        s.check_bind(host)
    for host in ("0.0.0.0", "10.0.0.5", "::", "planner.example.org"):
        with pytest.raises(ValueError, match="loopback"):
            s.check_bind(host)
    ServiceSettings(auth="enabled").check_bind("0.0.0.0")
