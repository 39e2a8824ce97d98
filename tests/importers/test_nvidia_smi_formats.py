"""nvidia-smi in every format it prints (samples under tests/importers/samples): ``-q -x`` XML,
``-L``, ``--query-gpu`` CSV and ``topo -m``; devices matched exactly, compute NICs only,
inter-node bandwidth from their count × speed, host names from the input."""

from __future__ import annotations

from pathlib import Path

import pytest

from cost_model import cluster_from_dict
from cost_model.errors import InvalidCluster
from planner_service.importers import catalog_id_for, import_cluster

SAMPLES = Path(__file__).parent / "samples"


def _src(*names: str, prefix: str = "") -> list[tuple[str, str]]:
    return [(n, prefix + (SAMPLES / n).read_text()) for n in names]


def test_xml_and_dgx_topo_give_compute_nics_and_their_bandwidth():
    res = import_cluster("nvidia-smi", _src("dgx-h100-a.xml") + [("dgx-h100-a.topo", "# nic_speed_Gbps: 400\n" + (SAMPLES / "dgx-h100-a.topo").read_text())])
    (group,) = res.cluster["node_groups"]
    assert group["device"] == "H100-SXM5-80GB" and group["gpus_per_node"] == 8 and group["hostnames"] == ["dgx-h100-a"]
    # the 8 GPU-attached (PIX) ports only: mlx5_8/9 reach every GPU through the CPU (storage, management)
    assert group["nccl_ib_hca"] == ",".join(f"mlx5_{i}" for i in range(8))
    assert group["inter_node_bandwidth_GBps"] == 8 * 400 / 8 and group["intra_node_bandwidth_GBps"] == 450.0
    (node,) = res.cluster["nodes"]
    assert node["driver_version"] == "550.54.15" and node["cuda_version"] == "12.4"
    assert res.warnings == ()
    cluster_from_dict(res.cluster)


def test_without_a_nic_speed_the_bandwidth_is_not_guessed():
    res = import_cluster("nvidia-smi", _src("dgx-h100-a.xml", "dgx-h100-a.topo"))
    assert "inter_node_bandwidth_GBps" not in res.cluster["node_groups"][0]
    assert any("nic_speed_Gbps" in w and "8 compute NICs" in w for w in res.warnings)


def test_gpu_list_names_an_h800_node_as_h800():
    res = import_cluster("nvidia-smi", _src("h800-b.list"))
    (group,) = res.cluster["node_groups"]
    assert group["device"] == "H800-SXM5-80GB" and group["gpus_per_node"] == 8 and group["hostnames"] == ["h800-b"]


@pytest.mark.parametrize(
    "sample, device",
    [("nvl-c.csv", "H100-NVL-94GB"), ("a800-d.csv", "A800-SXM4-80GB")],
)
def test_export_and_nvl_variants_are_their_own_devices(sample, device):
    res = import_cluster("nvidia-smi", _src(sample))
    assert res.cluster["node_groups"][0]["device"] == device


@pytest.mark.parametrize(
    "product, mem, expected",
    [
        ("NVIDIA H100 NVL", 95830, "H100-NVL-94GB"),
        ("NVIDIA H800", 81559, "H800-SXM5-80GB"),
        ("NVIDIA A800-SXM4-80GB", 81920, "A800-SXM4-80GB"),
        ("NVIDIA H20", 97871, "H20-96GB"),
        ("NVIDIA L40S", 46068, "L40S-48GB"),
        ("NVIDIA L4", 23034, "L4-24GB"),
        ("NVIDIA A10", 23028, "A10-24GB"),
        ("AMD Instinct MI250X", None, "MI250X"),
        ("AMD Instinct MI300X", 196592, "MI300X"),
        ("NVIDIA-H100-NVL", None, "H100-NVL-94GB"),
    ],
)
def test_every_catalog_device_is_matched_exactly(product, mem, expected):
    assert catalog_id_for(product, mem) == expected


@pytest.mark.parametrize(
    "product, mem, closest",
    [
        ("NVIDIA GH200 480GB", None, "H200-SXM-141GB"),
        ("NVIDIA H800 PCIe", None, "H800-SXM5-80GB"),
        ("NVIDIA H100 80GB HBM3", 97871, None),  # memory disagrees: a variant the catalog lacks
    ],
)
def test_unknown_products_are_refused_with_the_closest_entries(product, mem, closest):
    with pytest.raises(InvalidCluster) as exc:
        catalog_id_for(product, mem, field_path="n1.csv.name")
    assert product in exc.value.message and exc.value.field == "n1.csv.name"
    if closest:
        assert closest in exc.value.message and "inline device spec" in exc.value.message


def test_a_body_without_a_file_name_must_name_its_host():
    text = (SAMPLES / "nvl-c.csv").read_text()
    with pytest.raises(InvalidCluster) as exc:
        import_cluster("nvidia-smi", [("input", text)])
    assert "hostname" in exc.value.message
    res = import_cluster("nvidia-smi", [("input", "# hostname: gpu-17\n" + text)])
    assert res.cluster["nodes"][0]["hostname"] == "gpu-17"


def test_http_import_takes_the_host_from_the_filename_parameter(client):
    body = (SAMPLES / "dgx-h100-a.xml").read_bytes()
    r = client.post("/v1/clusters/import", params={"format": "nvidia-smi"}, content=body)
    assert r.status_code == 422 and "hostname" in r.text
    r = client.post("/v1/clusters/import", params={"format": "nvidia-smi", "filename": "dgx-7"}, content=body)
    assert r.status_code == 200, r.text
    assert r.json()["cluster"]["nodes"][0]["hostname"] == "dgx-7"
