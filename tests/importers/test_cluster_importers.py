"""Cluster importers: real-format samples parse into valid v1 clusters; malformed input is
rejected with the field and the reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cost_model.cluster import cluster_from_dict
from cost_model.errors import InvalidCluster
from planner_service.importers import catalog_id_for, import_cluster

SAMPLES = Path(__file__).parent / "samples"


def _src(*names: str) -> list[tuple[str, str]]:
    return [(n, (SAMPLES / n).read_text()) for n in names]


def test_nvidia_smi_query_and_topo():
    res = import_cluster("nvidia-smi", _src("node7.csv", "node7.topo", "node66.txt"), name="lab")
    c = cluster_from_dict(res.cluster)
    assert c.name == "lab"
    h100 = c.group(next(g["name"] for g in res.cluster["node_groups"] if g["hostnames"] == ["node7"]))
    assert h100.device.name == "H100-SXM5-80GB" and h100.gpus_per_node == 8
    assert h100.intra_node_bandwidth_GBps == 450.0  # NV18 x 25 GB/s
    assert h100.nccl_ib_hca == "mlx5_0,mlx5_1"
    a100 = [g for g in c.node_groups if "node66" in g.hostnames][0]
    assert a100.device.name == "A100-SXM4-80GB" and a100.gpus_per_node == 4 and a100.intra_node_bandwidth_GBps == 300.0
    nodes = {n.hostname: n for n in c.nodes}
    assert nodes["node7"].driver_version == "550.54.15" and nodes["node7"].nccl_version == "2.21.5"
    assert nodes["node66"].cuda_version == "12.2" and nodes["node66"].driver_version == "535.104.05"


def test_nvidia_smi_combined_file_with_markers():
    text = "==> node9.csv <==\n" + (SAMPLES / "node66.txt").read_text() + "\n# hostname: node10\n" + (SAMPLES / "node66.txt").read_text()
    res = import_cluster("nvidia-smi", [("all.txt", text)])
    assert sorted(n["hostname"] for n in res.cluster["nodes"]) == ["node10", "node9"]
    assert res.cluster["node_groups"][0]["count"] == 2


def test_nvidia_smi_pcie_topology_gives_pcie_bandwidth():
    csv = "name, memory.total [MiB], driver_version\nNVIDIA A100 80GB PCIe, 81920 MiB, 535.1\nNVIDIA A100 80GB PCIe, 81920 MiB, 535.1\n"
    topo = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tSYS\t0-31\nGPU1\tSYS\t X \t0-31\n"
    res = import_cluster("nvidia-smi", [("pc1.csv", csv), ("pc1.topo", topo)])
    g = res.cluster["node_groups"][0]
    assert g["device"] == "A100-PCIE-80GB" and g["intra_node_bandwidth_GBps"] == 32.0


@pytest.mark.parametrize(
    "files,field,reason",
    [
        ([("n1.csv", "name, memory.total [MiB]\nNVIDIA Quadro K600, 1024 MiB\n")], "n1.csv.name", "matches no catalog device"),
        ([("n1.csv", "0, NVIDIA H100 80GB HBM3, 81559\n")], "n1.csv", "columns"),
        ([("n1.csv", "name, memory.total [MiB]\nNVIDIA H100 80GB HBM3, lots\n")], "n1.csv", "MiB"),
        ([("n1.csv", "name\nNVIDIA H100 80GB HBM3\nNVIDIA A100-SXM4-80GB\n")], "n1.csv", "mixes GPU models"),
        ([("n1.csv", "name\nNVIDIA H100 80GB HBM3\n"), ("n1.topo", "\tGPU0\tGPU1\nGPU0\t X \tNV18\nGPU1\tNV18\t X \n")], "n1.topo", "CSV has 1"),
        ([("n1.csv", "name\nNVIDIA H100 80GB HBM3\nNVIDIA H100 80GB HBM3\n"), ("n1.topo", "\tGPU0\tGPU1\nGPU0\t X \tQQ\nGPU1\tQQ\t X \n")], "n1.topo", "unknown link code"),
        ([("n1.csv", "name\nNVIDIA A100-SXM4-40GB MIG 1g.5gb\n")], "n1.csv.name", "MIG"),
    ],
)
def test_nvidia_smi_rejects_malformed(files, field, reason):
    with pytest.raises(InvalidCluster) as exc:
        import_cluster("nvidia-smi", files)
    assert exc.value.field == field and reason in exc.value.message


def test_paddle_cluster_json():
    res = import_cluster("paddle", _src("paddle_cluster.json"))
    c = cluster_from_dict(res.cluster)
    groups = {g.hostnames[0]: g for g in c.node_groups}
    assert groups["node7"].device.name == "V100-SXM2-32GB" and groups["node7"].gpus_per_node == 2
    assert groups["node7"].intra_node_bandwidth_GBps == 235.0 and groups["node7"].inter_node_bandwidth_GBps == 12.5
    assert groups["node66"].device.name == "A100-SXM4-40GB" and groups["node66"].intra_node_bandwidth_GBps == 300.0


def _paddle(mutate):
    data = json.loads((SAMPLES / "paddle_cluster.json").read_text())
    mutate(data)
    return [("c.json", json.dumps(data))]


@pytest.mark.parametrize(
    "files,field,reason",
    [
        ([("c.json", "{not json")], "paddle", "not JSON"),
        (_paddle(lambda d: d.pop("machines")), "paddle.machines", "non-empty list"),
        (_paddle(lambda d: d["machines"][0].pop("devices")), "paddle.machines[0].devices", "non-empty list"),
        (_paddle(lambda d: d["machines"][1]["devices"][1].update(global_id=0)), "paddle.machines[1].devices[1].global_id", "used twice"),
        (_paddle(lambda d: d["machines"][0]["links"][0].update(bandwidth="fast")), "paddle.machines[0].links[0].bandwidth", "number"),
        (_paddle(lambda d: d["machines"][0]["links"][0].update(target_global_id=99)), "paddle.machines[0].links[0].target_global_id", "not declared"),
        (_paddle(lambda d: d["machines"][0]["devices"][1].update(model="A100-SXM4-40GB")), "paddle.machines[0].devices", "one GPU model"),
    ],
)
def test_paddle_rejects_malformed(files, field, reason):
    with pytest.raises(InvalidCluster) as exc:
        import_cluster("paddle", files)
    assert exc.value.field == field and reason in exc.value.message


def test_k8s_nodes_with_gfd_labels():
    res = import_cluster("k8s-nodes", _src("k8s_nodes.json"))
    c = cluster_from_dict(res.cluster)
    nodes = {n.hostname: n for n in c.nodes}
    assert set(nodes) == {"node7", "node8", "node66"}
    assert nodes["node8"].available is False  # NotReady
    assert nodes["node7"].driver_version == "550.54.15" and nodes["node7"].cuda_version == "12.4"
    h100 = [g for g in res.cluster["node_groups"] if "node7" in g["hostnames"]][0]
    assert h100["device"] == "H100-SXM5-80GB" and h100["gpus_per_node"] == 8 and h100["gpu_product"] == "NVIDIA-H100-80GB-HBM3"
    assert any("cpu-1" in w for w in res.warnings) and any("MIG" in w for w in res.warnings)


def _k8s(mutate):
    data = json.loads((SAMPLES / "k8s_nodes.json").read_text())
    mutate(data)
    return [("n.json", json.dumps(data))]


@pytest.mark.parametrize(
    "files,field,reason",
    [
        ([("n.json", "[]")], "k8s", "NodeList"),
        (_k8s(lambda d: d["items"][0]["metadata"]["labels"].update({"nvidia.com/gpu.count": "eight"})), "k8s.items[0].metadata.labels", "not an integer"),
        (_k8s(lambda d: d["items"][0]["metadata"]["labels"].update({"nvidia.com/gpu.product": "Quadro-K600"})), "k8s.items[0].metadata.labels[nvidia.com/gpu.product]", "no catalog device"),
        (_k8s(lambda d: d.update(items=[d["items"][3]])), "k8s.items", "no GPU nodes"),
        (_k8s(lambda d: d["items"][1]["metadata"].update(name="node7")), "cluster.nodes", "appears twice"),
    ],
)
def test_k8s_rejects_malformed(files, field, reason):
    with pytest.raises(InvalidCluster) as exc:
        import_cluster("k8s-nodes", files)
    assert exc.value.field == field and reason in exc.value.message


@pytest.mark.parametrize(
    "product,mem,expected",
    [
        ("NVIDIA H100 80GB HBM3", None, "H100-SXM5-80GB"),
        ("NVIDIA-H100-80GB-HBM3", None, "H100-SXM5-80GB"),
        ("NVIDIA H100 PCIe", 81559, "H100-PCIE-80GB"),
        ("NVIDIA A100-SXM4-40GB", None, "A100-SXM4-40GB"),
        ("NVIDIA A100-SXM4-80GB", None, "A100-SXM4-80GB"),
        ("A100-SXM4-40GB", None, "A100-SXM4-40GB"),
        ("NVIDIA A100 80GB PCIe", None, "A100-PCIE-80GB"),
        ("Tesla V100-SXM2-32GB", None, "V100-SXM2-32GB"),
        ("NVIDIA H200", 143771, "H200-SXM-141GB"),
        ("NVIDIA L40S", 46068, "L40S-48GB"),
        ("NVIDIA A10", 23028, "A10-24GB"),
        ("NVIDIA-A100-SXM4-40GB", 40960, "A100-SXM4-40GB"),
    ],
)
def test_product_names_map_to_catalog(product, mem, expected):
    assert catalog_id_for(product, mem) == expected


def test_unknown_format():
    with pytest.raises(InvalidCluster) as exc:
        import_cluster("slurm-conf", [("x", "")])
    assert exc.value.field == "format"
