"""/v1/profiles: upload (profile or trace), list, fetch; estimates that name a profile_id."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.profiles import synthetic_profile

FIXTURE_TRACE = Path(__file__).parent / "fixtures" / "gpu_trace.json"

LOCAL_CLUSTER = {"name": "local", "node_groups": [{"name": "cpu", "count": 1, "gpus_per_node": 1, "device": "local-cpu"}]}


@pytest.fixture
def make_client(tmp_path):
    from fastapi.testclient import TestClient

    from planner_service.api import create_app
    from planner_service.settings import ServiceSettings

    clients = []

    def make(**kw):
        settings = ServiceSettings(database_url=f"sqlite:///{tmp_path / 'p.db'}", inline_worker=False, **kw)
        c = TestClient(create_app(settings, start_worker=False), raise_server_exceptions=False)
        c.__enter__()
        clients.append(c)
        return c

    yield make
    for c in clients:
        c.__exit__(None, None, None)


@pytest.fixture
def client(make_client):
    return make_client()


def _cpu_profile():
    from cost_model.devices import Efficiency

    eff = Efficiency(gemm_max_fraction=0.8, gemm_half_dim=16.0, memory_fraction=0.9, nvlink_fraction=0.5, nic_fraction=0.5,
                     collective_latency_s=3e-4, kernel_overhead_s=5e-6, gemm_half_k=8.0)
    return synthetic_profile("local-cpu", dtypes=("fp32",), collectives=False, eff=eff)


def test_upload_list_get_and_use_in_an_estimate(client):
    r = client.post("/v1/profiles", json=_cpu_profile())
    assert r.status_code == 201, r.text
    body = r.json()
    pid = body["id"]
    assert body["device"] == "local-cpu" and body["fit"]["efficiency"]["gemm_max_fraction"] == pytest.approx(0.8, rel=0.03)
    assert r.headers["location"] == f"/v1/profiles/{pid}"
    listed = client.get("/v1/profiles").json()["profiles"]
    assert [p["id"] for p in listed] == [pid]
    assert client.get("/v1/profiles", params={"device": "H100-SXM5-80GB"}).json()["profiles"] == []
    one = client.get(f"/v1/profiles/{pid}").json()
    assert one["profile"]["id"] == pid and len(one["profile"]["measurements"]) == body["measurements"]
    est = client.post("/v1/estimate", json={
        "model": {"transformer": {"n_layer": 2, "n_embd": 256, "n_head": 4, "vocab_size": 1024, "n_positions": 128}},
        "training": {"global_batch_size": 4, "sequence_length": 128, "dtype": "fp32"},
        "cluster": LOCAL_CLUSTER,
        "strategy": {"dp": 1, "micro_batch_size": 4},
        "profile_id": pid,
    })
    assert est.status_code == 200, est.text
    assert est.json()["profile_ids"] == [pid]


def test_upload_a_trace(client):
    r = client.post("/v1/profiles", content=FIXTURE_TRACE.read_bytes(), headers={"content-type": "application/json"})
    assert r.status_code == 201, r.text
    assert r.json()["device"] == "H100-SXM5-80GB" and r.json()["source"] == "trace"
    # a CPU trace names no device: ?device= is required
    cpu_trace = {"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 50.0,
                                  "args": {"Input Dims": [[64, 32], [32, 16]], "Input type": ["float", "float"]}}]}
    r = client.post("/v1/profiles", json=cpu_trace)
    assert r.status_code == 422 and r.json()["error"]["field"] == "device"
    r = client.post("/v1/profiles", json=cpu_trace, params={"device": "local-cpu"})
    assert r.status_code == 201, r.text


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda p: p.update(schema_version=0), "schema_version"),
        (lambda p: p["measurements"][0].update(seconds=-0.5), "measurements[0].seconds"),
        (lambda p: p["device"].update(name="Gaudi-3"), "device.name"),
    ],
)
def test_bad_profiles_get_422_with_the_field(client, mutate, field):
    prof = _cpu_profile()
    mutate(prof)
    r = client.post("/v1/profiles", json=prof)
    assert r.status_code == 422
    assert r.json()["error"]["field"] == field and r.json()["error"]["code"] == "invalid_profile"


def test_malformed_huge_and_missing(make_client):
    client = make_client(max_body_bytes=64 * 1024)
    r = client.post("/v1/profiles", content=b"{nope", headers={"content-type": "application/json"})
    assert r.status_code == 422 and "JSON" in r.json()["error"]["message"]
    r = client.post("/v1/profiles", content=json.dumps({"pad": "x" * 100_000}), headers={"content-type": "application/json"})
    assert r.status_code == 413
    r = client.get("/v1/profiles/does-not-exist")
    assert r.status_code == 404
