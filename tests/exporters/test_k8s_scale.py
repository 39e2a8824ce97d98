"""A 16,384-GPU plan's Kubernetes manifests stay under the 256 KiB that ``kubectl apply``
stores per object in its last-applied-configuration annotation: the ConfigMap carries the
same small scripts for any plan size and a gzipped one-line-per-host table."""

from __future__ import annotations

import base64
import gzip
import json

import pytest
import yaml

from helpers.plans import _ranks, homogeneous_plan
from planner_service.exporters import LaunchParams, render

LIMIT_BYTES = 256 * 1024
K8S_TARGETS = ["kubernetes-pytorchjob", "kubernetes-paddlejob", "volcano", "kubeflow-trainjob"]


def big_plan(nodes: int = 2048, gpn: int = 8, tp: int = 8, pp: int = 16) -> dict:
    dp = nodes * gpn // (tp * pp)
    hosts = [f"gpu-node-{i:05d}" for i in range(nodes)]
    per_stage = nodes // pp

    def place(pp_i, dp_i, cp_i, tp_i):
        local = dp_i * tp + tp_i
        return hosts[pp_i * per_stage + local // gpn], local % gpn, "h100", "H100-SXM5-80GB"

    plan = homogeneous_plan()
    plan["cluster"]["node_groups"][0].update(count=nodes, hostnames=hosts)
    plan["cluster"]["nodes"] = [{"hostname": h, "group": "h100", "available": True} for h in hosts]
    plan["best"]["strategy"].update(dp=dp, tp=tp, pp=pp, layers_per_stage=[2] * pp)
    plan["best"].pop("stages")
    plan["model"]["spec"] = dict(plan["model"]["spec"], num_hidden_layers=2 * pp)
    plan["best"]["ranks"] = _ranks(dp, tp, pp, 1, place)
    return plan


@pytest.fixture(scope="module")
def plan_16k():
    return big_plan()


@pytest.mark.parametrize("target", K8S_TARGETS)
def test_every_object_fits_kubectl_apply_at_16384_gpus(plan_16k, target):
    art = render(plan_16k, target, LaunchParams(image="img", command="train.py"))
    docs = list(yaml.safe_load_all(art.files[art.primary]))
    for doc in docs:
        assert len(json.dumps(doc, separators=(",", ":"))) < LIMIT_BYTES, (doc["kind"], len(json.dumps(doc)))
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    rows = gzip.decompress(base64.b64decode(cm["binaryData"]["plan_nodes.tsv.gz"])).decode().splitlines()
    assert len(rows) == 2048 and rows[0].split("\t")[:3] == ["gpu-node-00000", "0", "8"]
    assert "omitted" in cm["metadata"]["annotations"]["planner.dev/job-rankmap"]
    assert "rankmap.json" in art.files  # the full map still ships with the artifact
