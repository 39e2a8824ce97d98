"""HTTP: POST /v1/models/onnx (multipart) → stored id; GET /v1/models/{id}; plans from it."""

from __future__ import annotations

import json

import pytest

from helpers.graphs import gpt_graph, mlp_onnx


@pytest.fixture
def client(tmp_path):
    from fastapi.testclient import TestClient

    from planner_service.api import create_app
    from planner_service.settings import ServiceSettings

    settings = ServiceSettings(database_url=f"sqlite:///{tmp_path / 'planner.db'}", auto_migrate=True, solver_time_limit_s=3.0)
    app = create_app(settings, start_worker=False)
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


@pytest.fixture(scope="module")
def small_onnx(tmp_path_factory) -> bytes:
    path = mlp_onnx(str(tmp_path_factory.mktemp("m") / "mlp.onnx"), layers=3, width=128)
    with open(path, "rb") as fh:
        return fh.read()


CLUSTER = {"name": "one-node", "node_groups": [{"name": "g0", "count": 1, "gpus_per_node": 8, "device": "A100-SXM4-80GB"}]}


def test_upload_get_and_plan_an_onnx_model(client, small_onnx):
    r = client.post("/v1/models/onnx", files={"file": ("mlp.onnx", small_onnx, "application/octet-stream")})
    assert r.status_code == 201, r.text
    body = r.json()
    model_id = body["id"]
    assert body["name"] == "mlp" and body["format"] == "onnx"
    assert body["summary"]["num_ops"] > 0 and body["summary"]["params"] == 784 * 128 + 128 + 128 * 128 + 128 + 128 * 10 + 10
    assert r.headers["location"] == f"/v1/models/{model_id}"

    got = client.get(f"/v1/models/{model_id}")
    assert got.status_code == 200 and got.json()["id"] == model_id and "graph" not in got.json()
    full = client.get(f"/v1/models/{model_id}", params={"include_graph": True}).json()
    assert full["graph"]["inputs"][0]["shape"][0] == "batch"
    assert any(m["id"] == model_id for m in client.get("/v1/models").json()["items"])

    plan = client.post("/v1/plans", json={"model": {"model_id": model_id},
                                          "training": {"global_batch_size": 1024, "sequence_length": 1}, "cluster": CLUSTER})
    assert plan.status_code in (200, 201), plan.text
    best = plan.json()["best"]
    assert best["prediction"]["fits"]
    shardings = {k: v for st in best["stages"] for k, v in st["ops"].items()}
    assert set(shardings) == {op["name"] for op in full["graph"]["ops"]}


def test_json_graph_plans_through_the_api(client):
    plan = client.post("/v1/plans", json={"model": {"graph": gpt_graph(layers=2, hidden=128, heads=4, vocab=512, positions=128)},
                                          "training": {"global_batch_size": 32, "sequence_length": 128}, "cluster": CLUSTER})
    assert plan.status_code in (200, 201), plan.text
    assert plan.json()["best"]["strategy"]["op_shardings"]


def test_a_graph_plan_keeps_to_its_framework_over_http(client):
    body = {"model": {"graph": gpt_graph(layers=2, hidden=128, heads=4, vocab=512, positions=128)},
            "training": {"global_batch_size": 32, "sequence_length": 128, "framework": "deepspeed"}, "cluster": CLUSTER}
    plan = client.post("/v1/plans", json=body)
    assert plan.status_code in (200, 201), plan.text
    assert plan.json()["best"]["strategy"]["tp"] == 1  # DeepSpeed alone shards no operator
    pinned = client.post("/v1/plans", json={**body, "constraints": {"tp": 2}})
    assert pinned.status_code == 422
    err = pinned.json()["error"]
    assert err["field"] == "constraints.tp" and "deepspeed" in err["message"]


@pytest.mark.parametrize(
    "payload,field",
    [
        (b"not an onnx file at all", "model.onnx"),
        (b"", "model.onnx"),
    ],
)
def test_bad_uploads_are_422_with_a_field(client, payload, field):
    r = client.post("/v1/models/onnx", files={"file": ("x.onnx", payload, "application/octet-stream")})
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["field"] == field and err["message"]


def test_bad_dims_and_unknown_ids(client, small_onnx):
    r = client.post("/v1/models/onnx", files={"file": ("m.onnx", small_onnx)}, data={"dims": "{not json"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "dims"
    assert client.get("/v1/models/does-not-exist").status_code == 404
    plan = client.post("/v1/plans", json={"model": {"model_id": "nope"}, "training": {"global_batch_size": 8, "sequence_length": 1},
                                          "cluster": CLUSTER})
    assert plan.status_code == 422 and plan.json()["error"]["field"] == "model.model_id"


def test_malformed_graph_bodies_are_422(client):
    g = gpt_graph(layers=1, hidden=64, heads=2, vocab=100, positions=16)
    g["ops"][5]["inputs"] = ["missing"]
    r = client.post("/v1/plans", json={"model": {"graph": g}, "training": {"global_batch_size": 8, "sequence_length": 16},
                                       "cluster": CLUSTER})
    assert r.status_code == 422
    err = r.json()["error"]
    assert "dangling" in err["message"] and err["field"].startswith("model.graph.ops[5]")
    json.dumps(err)


FOUR = {
    "mlp": ({"global_batch_size": 4096, "sequence_length": 1}, 8),
    "resnet": ({"global_batch_size": 512, "sequence_length": 1}, 8),
    "gpt": ({"global_batch_size": 64, "sequence_length": 256}, 8),
    "rec": ({"global_batch_size": 65536, "sequence_length": 1}, 8),
}


@pytest.fixture(scope="module")
def four_onnx(tmp_path_factory):
    from helpers.graphs import four_onnx_models

    return four_onnx_models(str(tmp_path_factory.mktemp("four")))


@pytest.mark.parametrize("kind", list(FOUR))
def test_the_four_onnx_models_plan_through_the_api_and_the_cli(client, four_onnx, kind, tmp_path):
    import subprocess
    import sys

    training, _ = FOUR[kind]
    with open(four_onnx[kind], "rb") as fh:
        up = client.post("/v1/models/onnx", files={"file": (f"{kind}.onnx", fh.read(), "application/octet-stream")})
    assert up.status_code == 201, up.text
    r = client.post("/v1/plans", json={"model": {"model_id": up.json()["id"]}, "training": training, "cluster": CLUSTER})
    assert r.status_code in (200, 201), r.text
    assert r.json()["best"]["prediction"]["fits"]

    req = tmp_path / "req.json"
    req.write_text(json.dumps({"training": training, "cluster": CLUSTER}))
    cli = subprocess.run(
        [sys.executable, "-m", "planner_service.cli.main", "plan", str(req), "--onnx", four_onnx[kind], "--json", "--time-limit", "3"],
        capture_output=True, text=True, timeout=300,
    )
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout)["best"]["prediction"]["fits"]
