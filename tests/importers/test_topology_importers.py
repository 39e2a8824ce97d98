"""Topology importers: Slurm topology.conf (tree and block plugins) and Kubernetes network-topology
labels → the cluster's ``topology`` levels and each node's ``domains``."""

import json
from pathlib import Path

import pytest

from cost_model.cluster import cluster_from_dict
from cost_model.errors import InvalidCluster
from planner_service.importers import import_cluster
from planner_service.importers.topology import NO_BANDWIDTH_WARNING, expand_hostlist

SAMPLES = Path(__file__).parent / "samples"


def _src(*names):
    return [(n, (SAMPLES / n).read_text()) for n in names]


def test_hostlist_expressions_expand_like_slurm():
    assert expand_hostlist("gpu[00-02,07,9]") == ["gpu00", "gpu01", "gpu02", "gpu07", "gpu9"]  # padding per range
    assert expand_hostlist("r[1-2]n[1-2],login") == ["r1n1", "r1n2", "r2n1", "r2n2", "login"]
    with pytest.raises(InvalidCluster):
        expand_hostlist("gpu[3-1]")


def test_slurm_tree_plugin_gives_leaf_and_spine_levels():
    res = import_cluster("slurm-topology", _src("slurm_topology_tree.conf", "slurm_cluster.json"))
    topo = res.cluster["topology"]
    # the core switch holds every node: no boundary, dropped
    assert [lv["name"] for lv in topo["levels"]] == ["leaf", "spine"]
    assert [lv["group_size_nodes"] for lv in topo["levels"]] == [4, 8]
    nodes = {n["hostname"]: n for n in res.cluster["nodes"]}
    assert nodes["gpu09"]["domains"] == ["leaf2", "spine1"]  # the uneven spine
    assert nodes["gpu05"]["available"] is False and nodes["gpu05"]["domains"] == ["leaf1", "spine0"]
    assert NO_BANDWIDTH_WARNING in res.warnings
    c = cluster_from_dict(res.cluster)
    assert c.topology is not None and c.nodes[9].domains == ("leaf2", "spine1")


def test_slurm_block_plugin_aggregates_block_sizes():
    res = import_cluster("slurm-topology", _src("slurm_cluster.json", "slurm_topology_block.conf"))  # either order
    levels = res.cluster["topology"]["levels"]
    assert [(lv["name"], lv["group_size_nodes"]) for lv in levels] == [("block", 4), ("block8", 8)]
    nodes = {n["hostname"]: n["domains"] for n in res.cluster["nodes"]}
    assert nodes["gpu04"] == ["b1", "block8-0"] and nodes["gpu08"] == ["b2", "block8-1"]


def test_slurm_topology_needs_the_cluster_and_valid_lines():
    with pytest.raises(InvalidCluster) as e:
        import_cluster("slurm-topology", _src("slurm_topology_tree.conf"))
    assert e.value.field == "files"
    with pytest.raises(InvalidCluster) as e:
        import_cluster("slurm-topology", [("t.conf", "SwitchName=s0 Nodes\n"), *_src("slurm_cluster.json")])
    assert e.value.field == "topology.conf"


def test_k8s_network_topology_labels_become_levels():
    res = import_cluster("k8s-nodes", _src("k8s_nodes_topology.json"))
    topo = res.cluster["topology"]
    # EKS layers bottom-up; layer-1 (one node set for all) and the zone family are not used
    assert [(lv["name"], lv["group_size_nodes"]) for lv in topo["levels"]] == [("layer-3", 2), ("layer-2", 4)]
    nodes = {n["hostname"]: n["domains"] for n in res.cluster["nodes"]}
    assert nodes["h100-5"] == ["nn-bot2", "nn-mid1"]
    assert cluster_from_dict(res.cluster).topology is not None


def test_k8s_without_topology_labels_is_flat():
    res = import_cluster("k8s-nodes", _src("k8s_nodes.json"))
    assert "topology" not in res.cluster


def test_gke_and_topograph_label_families():
    data = json.loads((SAMPLES / "k8s_nodes_topology.json").read_text())
    for k, item in enumerate(data["items"]):
        labels = item["metadata"]["labels"]
        for key in [x for x in labels if x.startswith("topology.k8s.aws/")]:
            del labels[key]
        labels["cloud.google.com/gce-topology-block"] = f"blk{k // 3}"
        labels["cloud.google.com/gce-topology-subblock"] = f"sub{k // 3}-{k % 3 // 2}"
    res = import_cluster("k8s-nodes", [("n.json", json.dumps(data))])
    assert [lv["name"] for lv in res.cluster["topology"]["levels"]] == ["subblock", "block"]
    for item in data["items"]:
        labels = item["metadata"]["labels"]
        for key in [x for x in labels if x.startswith("cloud.google.com/")]:
            del labels[key]
        labels["network.topology.nvidia.com/leaf"] = "s" + item["metadata"]["name"][-1]
        labels["network.topology.nvidia.com/spine"] = "sp0"
    res = import_cluster("k8s-nodes", [("n.json", json.dumps(data))])
    assert [(lv["name"], lv["group_size_nodes"]) for lv in res.cluster["topology"]["levels"]] == [("leaf", 1)]
