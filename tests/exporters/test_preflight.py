"""Preflight warnings: mixed versions inside communication groups and mixed devices in TP groups."""

from __future__ import annotations

from typing import Any

import pytest

from cost_model.cluster import cluster_from_dict
from helpers.plans import homogeneous_plan, mixed_plan
from planner_service.exporters.preflight import candidate_warnings, preflight_warnings


def _dp_mixed_plan() -> dict[str, Any]:
    plan = homogeneous_plan()
    plan["cluster"]["nodes"][0]["nccl_version"] = "2.19.3"  # node66 differs from node7
    # make node7 and node66 share DP groups: swap hosts of dp replica 1 in stage 0
    for r in plan["best"]["ranks"]:
        if r["pp"] == 0 and r["dp"] == 1:
            r["host"], r["gpu"] = "node66", 4 + r["tp"]
        elif r["pp"] == 1 and r["dp"] == 0:
            r["host"], r["gpu"] = "node7", 4 + r["tp"]
    return plan


def _tp_mixed_plan() -> dict[str, Any]:
    plan = mixed_plan()
    # put tp rank 1 of every stage-0 group on an A100 node
    for r in plan["best"]["ranks"]:
        if r["pp"] == 0 and r["tp"] == 1 and r["dp"] == 0:
            r["host"], r["gpu"], r["device"], r["node_group"] = "node66", 7, "A100-SXM4-80GB", "a100"
    plan["cluster"]["nodes"] = [{k: v for k, v in n.items() if not k.endswith("_version")} for n in plan["cluster"]["nodes"]]
    return plan


def test_consistent_cluster_has_no_warnings():
    assert preflight_warnings(homogeneous_plan()) == []


def test_mixed_versions_across_pipeline_stages_are_named():
    warnings = preflight_warnings(mixed_plan())
    nccl = [w for w in warnings if "NCCL versions" in w]
    assert len(nccl) == 1 and "pipeline" in nccl[0]
    assert "2.18.3 on node66, node100" in nccl[0] and "2.21.5 on node7, node8" in nccl[0]
    assert any("driver versions" in w for w in warnings) and any("CUDA versions" in w for w in warnings)
    assert not any("tensor-parallel" in w for w in warnings)  # TP groups stay inside one node


def test_mixed_versions_inside_a_data_parallel_group():
    warnings = preflight_warnings(_dp_mixed_plan())
    assert any("data-parallel" in w and "node66" in w and "2.19.3" in w for w in warnings)


def test_mixed_devices_inside_a_tp_group():
    warnings = preflight_warnings(_tp_mixed_plan())
    assert len(warnings) == 1 and "tensor-parallel" in warnings[0]
    assert "A100-SXM4-80GB on node66" in warnings[0] and "H100-SXM5-80GB on node7" in warnings[0]


@pytest.mark.parametrize("make", [homogeneous_plan, mixed_plan, _dp_mixed_plan, _tp_mixed_plan])
def test_the_service_entry_gives_the_plan_dict_entry_s_warnings(make):
    """The plan service checks the candidate it built (cluster object, strategy and ranks) and
    stores the warnings; the launch route checks the stored plan dict: the same answer."""
    plan = make()
    cluster = cluster_from_dict(plan["cluster"])
    assert candidate_warnings(cluster, plan["best"]) == preflight_warnings(plan)


def test_a_candidate_without_ranks_has_nothing_to_check():
    plan = mixed_plan()
    assert candidate_warnings(cluster_from_dict(plan["cluster"]), {"strategy": plan["best"]["strategy"]}) == []
