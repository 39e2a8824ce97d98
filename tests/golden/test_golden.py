"""Predictions and plans pinned across refactors.

``golden.json`` holds the estimates of a fixed set of strategies and the answers of a fixed set of
small plan requests (transformer, heterogeneous and operator-graph), produced by
``python tests/golden/test_golden.py --write``.  A move or a unification must reproduce them
within floating-point noise; a deliberate change of the cost model rewrites the file in the same
commit, so the diff shows every prediction it moved.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from cost_model import Strategy, Training, estimate, get_preset, simple_cluster
from helpers.graphs import gpt_graph
from planner_service.planner import SolverSettings, plan
from planner_service.planner.request import parse_plan_request

GOLDEN = Path(__file__).with_name("golden.json")
REL = 1e-6

ESTIMATES: dict[str, tuple[str, str, int, dict[str, Any], dict[str, Any]]] = {
    "gpt3-175b-a100": ("gpt3-175b", "A100-SXM4-80GB", 128, {"global_batch_size": 1536, "sequence_length": 2048},
                       {"dp": 16, "tp": 8, "pp": 8, "micro_batch_size": 1, "sequence_parallel": True, "recompute": "selective", "zero_stage": 1}),
    "llama3-70b-h100-cp": ("llama3-70b", "H100-SXM5-80GB", 16, {"global_batch_size": 256, "sequence_length": 8192},
                           {"dp": 8, "tp": 4, "pp": 2, "cp": 2, "micro_batch_size": 1, "sequence_parallel": True, "vpp": 2}),
    "gpt3-6.7b-zero3": ("gpt3-6.7b", "A100-SXM4-80GB", 4, {"global_batch_size": 512, "sequence_length": 2048},
                        {"dp": 32, "micro_batch_size": 2, "zero_stage": 3, "recompute": "full"}),
    "mixtral-ep": ("mixtral-8x7b", "H100-SXM5-80GB", 8, {"global_batch_size": 512, "sequence_length": 4096},
                   {"dp": 16, "tp": 2, "pp": 2, "ep": 8, "micro_batch_size": 1, "sequence_parallel": True, "zero_stage": 1}),
}

CLUSTER_MIXED = {
    "name": "mixed",
    "node_groups": [
        {"name": "h100", "count": 2, "gpus_per_node": 8, "device": "H100-SXM5-80GB"},
        {"name": "a100", "count": 2, "gpus_per_node": 8, "device": "A100-SXM4-80GB"},
    ],
}
PLANS: dict[str, dict[str, Any]] = {
    "gpt3-1.3b-one-node": {
        "model": {"preset": "gpt3-1.3b"},
        "training": {"global_batch_size": 64, "sequence_length": 2048},
        "cluster": {"name": "one", "node_groups": [{"name": "g", "count": 1, "gpus_per_node": 8, "device": "A100-SXM4-80GB"}]},
    },
    "llama2-13b-mixed": {
        "model": {"preset": "llama2-13b"},
        "training": {"global_batch_size": 128, "sequence_length": 4096},
        "cluster": CLUSTER_MIXED,
    },
    "gpt-graph": {
        "model": {"graph": gpt_graph(layers=2)},
        "training": {"global_batch_size": 16, "sequence_length": 512},
        "cluster": {"name": "one", "node_groups": [{"name": "g", "count": 1, "gpus_per_node": 8, "device": "A100-SXM4-80GB"}]},
    },
}


def _estimate(key: str) -> dict[str, Any]:
    preset, device, nodes, training, strategy = ESTIMATES[key]
    est = estimate(get_preset(preset), Training(**training), simple_cluster(device, nodes), Strategy(**strategy))
    d = est.to_dict()
    return {k: d[k] for k in ("step_time_s", "mfu", "peak_memory_GB", "breakdown_s", "fits")}


def _plan(key: str) -> dict[str, Any]:
    result = plan(parse_plan_request(PLANS[key]), SolverSettings(time_limit_s=10.0, num_workers=1)).to_dict()
    best = result["best"]
    return {
        "strategy": best["strategy"],
        "step_time_s": best["prediction"]["step_time_s"],
        "peak_memory_GB": best["prediction"]["peak_memory_GB"],
        "stages": [{k: s.get(k) for k in ("first_layer", "last_layer", "device", "forward_s", "backward_s", "peak_memory_GB", "hosts")} for s in best.get("stages", [])],
    }


def compute() -> dict[str, Any]:
    return {"estimates": {k: _estimate(k) for k in ESTIMATES}, "plans": {k: _plan(k) for k in PLANS}}


def _close(a: Any, b: Any, path: str) -> None:
    if isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, rel=REL, abs=1e-12), path
    elif isinstance(a, dict) and isinstance(b, dict):
        assert set(a) == set(b), path
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _close(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


@pytest.mark.parametrize("key", list(ESTIMATES))
def test_estimates_match_golden(key: str) -> None:
    _close(json.loads(json.dumps(_estimate(key))), json.loads(GOLDEN.read_text())["estimates"][key], key)


@pytest.mark.parametrize("key", list(PLANS))
def test_plans_match_golden(key: str) -> None:
    _close(json.loads(json.dumps(_plan(key))), json.loads(GOLDEN.read_text())["plans"][key], key)


if __name__ == "__main__":
    if "--write" in sys.argv:
        GOLDEN.write_text(json.dumps(compute(), indent=1, sort_keys=True) + "\n")
        print(f"wrote {GOLDEN}")
