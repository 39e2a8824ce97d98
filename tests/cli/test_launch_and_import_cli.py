"""HTTP routes (/v1/plans/{id}/launch, /v1/clusters) and the CLI (planner launch, planner
cluster import), on a real plan from the planner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers.plans import homogeneous_plan, mixed_plan
from planner_service.exporters import TARGET_FRAMEWORKS, TARGETS

SAMPLES = Path(__file__).resolve().parents[1] / "importers" / "samples"
TWO_NODE = {
    "name": "two-node",
    "node_groups": [{"name": "g0", "count": 2, "gpus_per_node": 8, "device": "A100-SXM4-80GB", "hostnames": ["node7", "node66"],
                     "nccl_socket_ifname": "eth0"}],
}
REQUEST = {"model": {"preset": "gpt3-125m"}, "training": {"global_batch_size": 64, "sequence_length": 2048}, "cluster": TWO_NODE,
           "constraints": {"pp": 2}}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    from fastapi.testclient import TestClient

    from planner_service.api import create_app
    from planner_service.settings import ServiceSettings

    db = tmp_path_factory.mktemp("db") / "planner.db"
    app = create_app(ServiceSettings(database_url=f"sqlite:///{db}"), start_worker=False)
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


@pytest.fixture(scope="module")
def plan(client):
    resp = client.post("/v1/plans", json=REQUEST)
    assert resp.status_code in (200, 201), resp.text
    return resp.json()


#: The plan is searched for megatron-core (the default framework): the targets that launch it.
MEGATRON_TARGETS = [t for t in TARGETS if "megatron-core" in TARGET_FRAMEWORKS.get(t, ("megatron-core",))]


@pytest.mark.parametrize("target", MEGATRON_TARGETS)
def test_launch_route_renders_every_target_for_a_real_plan(client, plan, target):
    resp = client.get(f"/v1/plans/{plan['id']}/launch", params={"target": target, "image": "img:1", "env": ["A=1", "B=x=y"]})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["target"] == target and body["primary"] in body["files"] and isinstance(body["warnings"], list)


@pytest.mark.parametrize("target", [t for t in TARGETS if t not in MEGATRON_TARGETS])
def test_launch_route_refuses_a_target_of_another_framework(client, plan, target):
    assert plan["training"]["framework"] == "megatron-core"
    resp = client.get(f"/v1/plans/{plan['id']}/launch", params={"target": target, "image": "img:1"})
    assert resp.status_code == 422, resp.text
    err = resp.json()["error"]
    assert err["field"] == "target" and "megatron-core" in err["message"] and "re-plan with training.framework" in err["message"]


def test_launch_route_rankmap_equals_plan(client, plan):
    resp = client.get(f"/v1/plans/{plan['id']}/launch", params={"target": "rankmap", "format": "raw"})
    assert resp.status_code == 200
    got = {r["rank"]: (r["host"], r["gpu"]) for r in json.loads(resp.text)["ranks"]}
    assert got == {r["rank"]: (r["host"], r["gpu"]) for r in plan["best"]["ranks"]}
    resp = client.get(f"/v1/plans/{plan['id']}/launch", params={"target": "slurm", "format": "raw", "file": "job.sbatch"})
    assert resp.status_code == 200 and resp.text.startswith("#!/bin/bash")


@pytest.mark.parametrize(
    "params,status,field",
    [
        ({"target": "mpirun"}, 422, "target"),
        ({"target": "volcano"}, 422, "image"),
        ({"target": "torchrun", "env": ["NOEQUALS"]}, 422, "env"),
        ({"target": "torchrun", "job_name": "Bad_Name"}, 422, "job_name"),
        ({"target": "torchrun", "format": "xml"}, 422, "format"),
        ({"target": "torchrun", "format": "raw", "file": "nope"}, 422, "file"),
    ],
)
def test_launch_route_errors(client, plan, params, status, field):
    resp = client.get(f"/v1/plans/{plan['id']}/launch", params=params)
    assert resp.status_code == status, resp.text
    assert resp.json()["error"]["field"] == field


def test_launch_route_unknown_plan(client):
    resp = client.get("/v1/plans/does-not-exist/launch", params={"target": "torchrun"})
    assert resp.status_code == 404


def test_cluster_import_raw_body_and_multipart(client):
    resp = client.post("/v1/clusters/import", params={"format": "k8s-nodes"}, content=(SAMPLES / "k8s_nodes.json").read_bytes())
    assert resp.status_code == 200, resp.text
    assert {n["hostname"] for n in resp.json()["cluster"]["nodes"]} == {"node7", "node8", "node66"}
    assert resp.json()["warnings"]
    files = [("files", (n, (SAMPLES / n).read_bytes(), "text/plain")) for n in ("node7.csv", "node7.topo", "node66.txt")]
    resp = client.post("/v1/clusters/import", params={"format": "nvidia-smi", "name": "lab", "save": "true"}, files=files)
    assert resp.status_code == 200, resp.text
    assert resp.json()["saved"]["name"] == "lab"
    assert client.get("/v1/clusters/lab").json()["cluster"]["name"] == "lab"


@pytest.mark.parametrize(
    "params,content,field",
    [
        ({"format": "paddle"}, b"{not json", "paddle"),
        ({"format": "slurm"}, b"x", "format"),
        ({"format": "k8s-nodes"}, b"", "body"),
        ({"format": "k8s-nodes", "save": "true"}, (SAMPLES / "k8s_nodes.json").read_bytes(), "name"),
    ],
)
def test_cluster_import_errors(client, params, content, field):
    resp = client.post("/v1/clusters/import", params=params, content=content)
    assert resp.status_code == 422, resp.text
    assert resp.json()["error"]["field"] == field


def test_saved_cluster_crud_and_plan_by_name(client):
    resp = client.post("/v1/clusters", json={"name": "small", "cluster": TWO_NODE})
    assert resp.status_code == 201, resp.text
    assert client.post("/v1/clusters", json={"name": "small", "cluster": TWO_NODE}).status_code == 409
    assert any(c["name"] == "small" for c in client.get("/v1/clusters").json()["items"])
    bad = client.put("/v1/clusters/broken", json={"node_groups": [{"name": "g", "count": 0, "device": "A100"}]})
    assert bad.status_code == 422 and bad.json()["error"]["field"].startswith("cluster.node_groups[0]")
    resp = client.post("/v1/plans", json={**REQUEST, "cluster": "small"})
    assert resp.status_code in (200, 201), resp.text
    assert client.delete("/v1/clusters/small").status_code == 204
    assert client.get("/v1/clusters/small").status_code == 404
    assert client.delete("/v1/clusters/small").status_code == 404


# --- CLI ---------------------------------------------------------------------------------------



def test_cli_launch_from_file(cli, tmp_path):
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(mixed_plan()))
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["launch", str(plan_file), "--target", "slurm", "--out", str(out), "--smoke-test"])
    assert res.exit_code == 0, res.output
    assert (out / "job.sbatch").exists() and (out / "nccl_smoke.py").exists()
    assert "NCCL versions" in res.output  # preflight warning for the mixed cluster
    res = CliRunner().invoke(cli, ["launch", str(plan_file), "--target", "rankmap"])
    assert res.exit_code == 0 and json.loads(res.stdout)["world_size"] == 16
    # the rendezvous port, as the HTTP route's master_port
    res = CliRunner().invoke(cli, ["launch", str(plan_file), "--target", "torchrun", "--master-port", "31337"])
    assert res.exit_code == 0 and "--master-port=31337" in res.stdout, res.output


@pytest.mark.parametrize(
    "args",
    [["--target", "mpirun"], ["--target", "volcano"], ["--target", "torchrun", "--env", "X"],
     ["--target", "torchrun", "--master-port", "70000"]],
)
def test_cli_launch_bad_input_exits_2(cli, tmp_path, args):
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(homogeneous_plan()))
    res = CliRunner().invoke(cli, ["launch", str(plan_file), *args])
    assert res.exit_code == 2, res.output


def test_cli_launch_unknown_id_without_server_exits_2(cli, monkeypatch):
    monkeypatch.delenv("PLANNER_SERVER_URL", raising=False)
    res = CliRunner().invoke(cli, ["launch", "abc123", "--target", "torchrun"])
    assert res.exit_code == 2


def test_cli_cluster_import(cli, tmp_path):
    res = CliRunner().invoke(cli, ["cluster", "import", "--format", "nvidia-smi", str(SAMPLES / "node7.csv"), str(SAMPLES / "node7.topo")])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["node_groups"][0]["device"] == "H100-SXM5-80GB"
    bad = tmp_path / "bad.json"
    bad.write_text('{"machines": []}')
    res = CliRunner().invoke(cli, ["cluster", "import", "--format", "paddle", str(bad)])
    assert res.exit_code == 2


def test_real_plan_ranks_land_on_plan_hosts(client, plan, tmp_path):
    from helpers.launch_sim import Sim, plan_mapping

    resp = client.get(f"/v1/plans/{plan['id']}/launch", params={"target": "torchrun"})
    files = resp.json()["files"]
    hosts = sorted({r["host"] for r in plan["best"]["ranks"]})
    assert Sim(tmp_path / "a").per_node_script(files, "launch_torchrun.sh", hosts) == plan_mapping(plan)
    resp = client.get(f"/v1/plans/{plan['id']}/launch", params={"target": "slurm"})
    assert Sim(tmp_path / "b").slurm(resp.json()["files"]) == plan_mapping(plan)
    megatron = client.get(f"/v1/plans/{plan['id']}/launch", params={"target": "megatron", "format": "raw"}).text
    assert "--hidden-size 768" in megatron and "--num-layers 12" in megatron
