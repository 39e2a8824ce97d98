"""A cluster's ``device`` by any name a platform engineer writes for it: the catalog id, the
short name (``H800``, ``A800``, ``a100-40gb``) or the product name nvidia-smi prints (``NVIDIA
H100 80GB HBM3``) — one table (``cost_model.devices.PRODUCT_NAMES``) for the request fields and
the cluster importers, resolved to the catalog id everywhere the request is echoed."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cost_model.devices import PRODUCT_NAMES, catalog, get_device
from cost_model.errors import UnknownName
from planner_service.importers import catalog_id_for

NAMES = [
    ("H800", "H800-SXM5-80GB"),
    ("NVIDIA H800", "H800-SXM5-80GB"),
    ("A800", "A800-SXM4-80GB"),
    ("NVIDIA A800-SXM4-80GB", "A800-SXM4-80GB"),
    ("NVIDIA H100 80GB HBM3", "H100-SXM5-80GB"),
    ("h100", "H100-SXM5-80GB"),
    ("NVIDIA H100 PCIe", "H100-PCIE-80GB"),
    ("a100-40gb", "A100-SXM4-40GB"),
    ("A100 80GB", "A100-SXM4-80GB"),
    ("NVIDIA H200", "H200-SXM-141GB"),
    ("H200-SXM5-141GB", "H200-SXM-141GB"),
    ("H20", "H20-96GB"),
    ("AMD Instinct MI300X", "MI300X"),
    ("h800-sxm5-80gb", "H800-SXM5-80GB"),
]


@pytest.mark.parametrize(("name", "catalog_id"), NAMES)
def test_a_device_by_any_of_its_names_is_the_catalog_entry(name, catalog_id):
    assert get_device(name).name == catalog_id
    assert catalog_id_for(name) == catalog_id  # the importers read the same table


def test_every_product_name_maps_to_a_catalog_entry_and_variants_stay_apart():
    assert set(PRODUCT_NAMES.values()) <= set(catalog())
    # export variants and other form factors are their own entries, never their sibling's
    assert get_device("H800").name != get_device("H100").name
    assert get_device("A800").name != get_device("A100").name
    assert get_device("H100 PCIe").name != get_device("H100").name


def test_an_unknown_device_names_the_closest_entries():
    with pytest.raises(UnknownName) as err:
        get_device("H810", "cluster.node_groups[0].device")
    assert err.value.field == "cluster.node_groups[0].device"
    assert "closest catalog entries: " in err.value.message and "H800-SXM5-80GB" in err.value.message


def _cluster(device: str, count: int = 1) -> dict:
    return {"name": "c", "node_groups": [{"name": "g", "count": count, "gpus_per_node": 8, "device": device}]}


EST = {
    "model": {"preset": "llama3-8b"},
    "training": {"global_batch_size": 16, "sequence_length": 4096, "framework": "fsdp"},
    "strategy": {"dp": 8, "micro_batch_size": 1, "zero_stage": 3, "recompute": "full"},
}


def test_http_estimate_and_plan_take_a_product_name_and_answer_the_catalog_id(client):
    by_name = client.post("/v1/estimate", json={**EST, "cluster": _cluster("NVIDIA H800")})
    assert by_name.status_code == 200, by_name.text
    by_id = client.post("/v1/estimate", json={**EST, "cluster": _cluster("H800-SXM5-80GB")}).json()
    assert by_name.json()["step_time_s"] == by_id["step_time_s"]
    assert {s["device"] for s in by_name.json()["stages"]} == {"H800-SXM5-80GB"}

    mixed = {"name": "m", "node_groups": [{"name": "h", "count": 1, "gpus_per_node": 8, "device": "H800"},
                                          {"name": "a", "count": 1, "gpus_per_node": 8, "device": "A800"}]}
    plan = client.post("/v1/plans", json={"model": EST["model"], "training": EST["training"], "cluster": mixed,
                                          "constraints": {"allowed_device_types": ["a800"]}, "top_k": 0})
    assert plan.status_code == 201, plan.text
    body = plan.json()
    assert body["summary"]["device_types"] == ["A800-SXM4-80GB"]
    assert body["constraints"]["allowed_device_types"] == ["A800-SXM4-80GB"]
    assert {g["device"] if isinstance(g["device"], str) else g["device"]["name"] for g in body["cluster"]["node_groups"]} == {
        "H800-SXM5-80GB", "A800-SXM4-80GB"}


def test_http_unknown_device_is_a_422_naming_the_field(client):
    res = client.post("/v1/estimate", json={**EST, "cluster": _cluster("H810")})
    assert res.status_code == 422
    err = res.json()["error"]
    assert err["field"] == "cluster.node_groups[0].device" and "H800-SXM5-80GB" in err["message"]



def test_cli_estimate_takes_a_product_name(cli, tmp_path):
    (tmp_path / "est.json").write_text(json.dumps({**EST, "cluster": _cluster("NVIDIA A800-SXM4-80GB")}))
    res = CliRunner().invoke(cli, ["estimate", str(tmp_path / "est.json"), "--json"])
    assert res.exit_code == 0, res.output
    assert {s["device"] for s in json.loads(res.stdout)["stages"]} == {"A800-SXM4-80GB"}
    (tmp_path / "bad.json").write_text(json.dumps({**EST, "cluster": _cluster("H810")}))
    bad = CliRunner().invoke(cli, ["estimate", str(tmp_path / "bad.json")])
    assert bad.exit_code == 2 and "closest catalog entries: H800-SXM5-80GB" in " ".join(bad.output.split())


def test_allowed_device_types_admits_an_inline_device_by_its_own_name(client):
    inline = {"name": "lab-gpu", "memory_GB": 80, "memory_bandwidth_GBps": 2000, "bf16_tflops": 300}
    mixed = {"name": "m", "node_groups": [{"name": "x", "count": 1, "gpus_per_node": 8, "device": inline},
                                          {"name": "h", "count": 1, "gpus_per_node": 8, "device": "NVIDIA H100 80GB HBM3"}]}
    for allowed, device in ((["lab-gpu"], "lab-gpu"), (["h100"], "H100-SXM5-80GB")):
        r = client.post("/v1/plans", json={"model": EST["model"], "training": EST["training"], "cluster": mixed,
                                           "constraints": {"allowed_device_types": allowed}, "top_k": 0})
        assert r.status_code == 201, r.text
        assert r.json()["summary"]["device_types"] == [device]
