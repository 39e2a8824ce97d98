"""One result contract for both planners: the graph search answers with the transformer search's
PlanResult (entries with strategy, prediction, stages and ranks; the same explanation keys);
both model specs are ModelSpecs; OR-tools is imported in one module; integer scaling rounds
the safe way."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from cost_model import get_preset
from cost_model.graph.parse import graph_from_dict
from cost_model.spec import ModelSpec
from helpers.graphs import gpt_graph
from planner_service.planner import PlanResult, SolverSettings, plan
from planner_service.planner.cpsat import IntScale
from planner_service.planner.graph.describe import GraphEvaluated
from planner_service.planner.request import parse_plan_request

ROOT = Path(__file__).resolve().parents[3]
CLUSTER = {"name": "one", "node_groups": [{"name": "g", "count": 1, "gpus_per_node": 8, "device": "A100-SXM4-80GB"}]}
ENTRY_KEYS = {"strategy", "prediction", "stages", "ranks"}
EXPLANATION_KEYS = {"bottleneck", "largest_overhead", "summary", "memory_headroom_GB", "tightest_stage", "alternatives", "notes"}


def _plan(model: dict, training: dict) -> PlanResult:
    body = {"model": model, "training": training, "cluster": CLUSTER, "top_k": 2}
    return plan(parse_plan_request(body), SolverSettings(time_limit_s=3.0, num_workers=1))


@pytest.fixture(scope="module")
def graph_result() -> PlanResult:
    return _plan({"graph": gpt_graph(layers=2, hidden=256, heads=4, vocab=1024, positions=256)},
                 {"global_batch_size": 32, "sequence_length": 256})


@pytest.fixture(scope="module")
def transformer_result() -> PlanResult:
    return _plan({"preset": "gpt3-125m"}, {"global_batch_size": 32, "sequence_length": 1024})


def test_the_graph_search_returns_the_one_result_type(graph_result: PlanResult) -> None:
    assert isinstance(graph_result, PlanResult)
    assert isinstance(graph_result.best, GraphEvaluated)
    assert graph_result.alternatives, "a small graph on 8 GPUs has other layouts"
    assert graph_result.device_types == ("A100-SXM4-80GB",)
    assert graph_result.num_devices == graph_result.best.strategy.num_devices


def test_graph_and_transformer_plans_have_the_same_entry_and_explanation_shape(graph_result, transformer_result) -> None:
    for result in (graph_result, transformer_result):
        d = result.to_dict()
        for entry in [d["best"], *d["alternatives"]]:
            assert set(entry) >= ENTRY_KEYS
            s = entry["strategy"]
            assert len(entry["ranks"]) == s["dp"] * s["tp"] * s["pp"] * s["cp"]
            assert len(entry["stages"]) == s["pp"]
            assert all({"hosts", "num_gpus", "device", "forward_s", "peak_memory_GB"} <= set(st) for st in entry["stages"])
        assert set(d["explanation"]) >= EXPLANATION_KEYS
        assert len(d["explanation"]["alternatives"]) == len(d["alternatives"])
        assert {"candidates", "pruned", "solver_status", "wall_time_s"} <= set(d["search"])
        assert d["objective_value"]["name"] == "throughput"
        assert result.entry_ranks(1) == d["alternatives"][0]["ranks"]


def test_graph_alternatives_keep_their_op_shardings_and_the_explanation_its_graph_details(graph_result) -> None:
    d = graph_result.to_dict(alternative_ranks=False)
    for alt in d["alternatives"]:
        assert "ranks" not in alt
        ops = {name for st in alt["stages"] for name in st["ops"]}
        assert ops == set(alt["strategy"]["op_shardings"])
        assert sum(st["num_ops"] for st in alt["stages"]) == sum(alt["strategy"]["layers_per_stage"])
    ex = d["explanation"]
    assert sum(ex["sharding_summary"].values()) == len(d["best"]["strategy"]["op_shardings"])
    assert ex["peak_memory_GB"] == max(d["best"]["prediction"]["peak_memory_GB"])


def test_both_model_families_are_model_specs() -> None:
    graph = graph_from_dict(gpt_graph(layers=1, hidden=64, heads=2, vocab=100, positions=16))
    spec = get_preset("mixtral-8x7b")
    for model in (graph, spec):
        assert isinstance(model, ModelSpec)
        assert model.name and model.total_params() >= model.active_params() > 0
    assert graph.active_params() == graph.total_params()
    assert spec.active_params() < spec.total_params()


def test_only_the_cpsat_module_imports_ortools() -> None:
    importers = []
    for path in sorted((ROOT / "planner_service").rglob("*.py")) + sorted((ROOT / "cost_model").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n.split(".")[0] == "ortools" for n in names):
                importers.append(path.relative_to(ROOT).as_posix())
    assert importers == ["planner_service/planner/cpsat.py"]


def test_int_scale_rounds_needs_up_and_capacities_down() -> None:
    scale = IntScale.for_reference(2.0, 1e6, memory_unit_bytes=1e3)
    assert scale.time_unit_s == pytest.approx(2e-6)
    assert scale.time_int(3.2e-6) == 2 and list(scale.time(np.array([0.9e-6, 5.4e-6]))) == [0, 3]  # to the nearest
    assert list(scale.memory_up(np.array([1000.0, 1000.5, 1.0]))) == [1, 2, 1]
    assert scale.memory_down(1999.0) == 1


def test_simple_cluster_plans_place_every_rank_once(graph_result) -> None:
    ranks = graph_result.to_dict()["best"]["ranks"]
    places = {(r["host"], r["gpu"]) for r in ranks}
    assert len(places) == len(ranks) == graph_result.num_devices


def test_the_service_stores_and_replans_a_graph_plan_like_a_transformer_plan(make_client) -> None:
    client = make_client(start_worker=False, solver_time_limit_s=2.0)
    two_nodes = {"name": "two", "node_groups": [{"name": "g0", "count": 2, "gpus_per_node": 8, "device": "A100-SXM4-80GB",
                                                 "hostnames": ["node-0", "node-1"]}]}
    body = {"model": {"graph": gpt_graph(layers=2, hidden=128, heads=4, vocab=512, positions=128), "name": "tiny-gpt"},
            "training": {"global_batch_size": 32, "sequence_length": 128}, "cluster": two_nodes, "top_k": 2}
    r = client.post("/v1/plans", json=body)
    assert r.status_code == 201, r.text
    parent = r.json()
    assert parent["model"]["name"] == "tiny-gpt" and parent["model"]["params"] > 0
    assert parent["summary"]["num_devices"] == len(parent["best"]["ranks"])
    assert parent["summary"]["step_time_s"] == parent["best"]["prediction"]["step_time_s"]
    assert all("ranks" in a and "stages" in a for a in parent["alternatives"])
    child = client.post(f"/v1/plans/{parent['id']}/replan", json={"unavailable_nodes": ["node-1"]})
    assert child.status_code == 201, child.text
    c = child.json()
    assert {rk["host"] for rk in c["best"]["ranks"]} == {"node-0"}
    assert c["best"]["strategy"]["op_shardings"] and c["diff"]["parent_id"] == parent["id"]
    for alt in c["alternatives"]:
        assert len(alt["ranks"]) == alt["prediction"]["num_devices"]
    assert set(c["explanation"]) >= EXPLANATION_KEYS | {"sharding_summary"}
