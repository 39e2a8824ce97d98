"""The compute bound that prunes a large space before it is costed (``tables.compute_lower_bound_s``,
``search._Search._within_answer_bound``): it bounds every candidate's step time over all splits
and nesting orders, and pruning with it leaves every answer — the best and its alternatives,
under every tight-memory rule and objective — as the search without it finds them."""

import numpy as np
import pytest

from planner_service.planner import SolverSettings, plan
from planner_service.planner.nesting import expand_nestings
from planner_service.planner.request import parse_plan_request
from planner_service.planner.transformer import search
from planner_service.planner.transformer.search import _kth_layout_objective, normalise_cluster
from planner_service.planner.transformer.space import enumerate_space, layout_keys
from planner_service.planner.transformer.tables import compute_lower_bound_s, even_tables, pool_costs

POD = {"levels": [{"name": "pod", "group_size_nodes": 4, "oversubscription": 4.0}], "rail_optimized": True}


def _body(preset, framework, nodes, device="H100-SXM5-80GB", topology=None, **extra):
    cluster = {"name": "c", "node_groups": [{"name": "g", "count": nodes, "gpus_per_node": 8, "device": device, "price_per_gpu_hour": 2.0}]}
    if topology:
        cluster["topology"] = topology
    return {"model": {"preset": preset}, "training": {"framework": framework, "global_batch_size": 256, "sequence_length": 4096},
            "cluster": cluster, **extra}


@pytest.mark.parametrize(("preset", "framework", "device"), [
    ("llama3-8b", "megatron-core", "H100-SXM5-80GB"),
    ("llama3-8b", "fsdp", "A100-SXM4-80GB"),
    ("llama3-8b", "deepspeed", "A100-SXM4-80GB"),  # ZeRO-3's hooks stretch the compute
    ("gpt3-13b", "megatron-deepspeed", "A100-SXM4-80GB"),
    ("mixtral-8x7b", "megatron-core", "H100-SXM5-80GB"),
    ("mixtral-8x7b", "paddle", "A100-SXM4-80GB"),
])
def test_the_compute_bound_is_below_every_split_and_equal_over_nesting_orders(preset, framework, device):
    req = parse_plan_request(_body(preset, framework, 8, device, topology=POD))
    group = normalise_cluster(req.cluster, None).node_groups[0]
    S = enumerate_space(req.model, req.training, 64, 8, {}, None, None)
    S = expand_nestings(S.take(np.arange(0, len(S), max(1, len(S) // 400))), group)
    pc = pool_costs(req.model, req.training, group, S)
    bound = compute_lower_bound_s(req.model, req.training, pc)
    tables = even_tables(req.model, req.training, pc)
    ev = tables.evaluate(np.inf, search.POINT)
    assert np.all(bound > 0)
    # below the tables' bound over all splits (hence below every split's step time), and strictly
    # below it somewhere (the bound leaves out the collectives, the bubble's excess, the optimizer)
    assert np.all(bound <= ev.lower_bound_s * (1 + 1e-12))
    assert np.all(bound <= ev.step_time_s * (1 + 1e-12))
    assert np.any(bound < 0.99 * ev.lower_bound_s)
    # one value per layout, whichever nesting order its groups are placed in
    keys = layout_keys(S)
    keys[:, 9] = 0  # the nesting order's column
    _, layout = np.unique(keys, axis=0, return_inverse=True)
    layout = layout.reshape(-1)
    assert len(np.unique(S.nest)) > 1
    for k in np.unique(layout):
        rows = bound[layout == k]
        assert np.ptp(rows) <= 1e-12 * rows.max()


def test_kth_layout_objective_counts_each_layout_at_its_best_row():
    shapes = np.array([[1], [1], [2], [3], [3], [4]])
    objective = np.array([5.0, 1.0, 2.0, np.inf, 4.0, np.inf])
    assert _kth_layout_objective(objective, shapes, 1) == 1.0
    assert _kth_layout_objective(objective, shapes, 2) == 2.0
    assert _kth_layout_objective(objective, shapes, 3) == 4.0
    assert _kth_layout_objective(objective, shapes, 4) == np.inf  # layout 4 has no finite objective


def _answers(result):
    return [(e.strategy, e.stage_groups, e.prediction.step_time_s) for e in (result.best, *result.alternatives)]


def _plan_costing(monkeypatch, req, prune):
    """The plan of ``req`` and the rows ``even_tables`` costed for it, with the compute-bound
    pruning on (the minimum and the probe lowered, so that it acts on small spaces) or off."""
    costed = []
    real_tables = search.even_tables
    monkeypatch.setattr(search, "even_tables", lambda model, training, pc: costed.append(len(pc.S)) or real_tables(model, training, pc))
    monkeypatch.setattr(search, "BOUND_MIN_ROWS", 0 if prune else 10**12)
    monkeypatch.setattr(search, "BOUND_PROBE_ROWS", 64)
    result = plan(req, SolverSettings(time_limit_s=30))
    monkeypatch.setattr(search, "even_tables", real_tables)
    return result, sum(costed)


@pytest.mark.parametrize(("preset", "framework", "topology", "extra"), [
    ("llama3-70b", "megatron-core", None, {"top_k": 5}),  # (the probe holds no safe layout: nothing pruned)
    ("llama3-70b", "megatron-core", POD, {"constraints": {"tight_memory": "reject_unlikely"}}),
    ("mixtral-8x7b", "megatron-core", POD, {"objective": "cost", "constraints": {"tight_memory": "by_objective"}, "top_k": 4}),
    ("llama3-8b", "fsdp", POD, {"constraints": {"tight_memory": "reject"}}),
    ("llama3-8b", "fsdp", None, {"top_k": 8}),
    ("gpt3-13b", "deepspeed", None, {}),
])
def test_pruning_by_the_compute_bound_leaves_every_answer_as_it_was(monkeypatch, preset, framework, topology, extra):
    req = parse_plan_request(_body(preset, framework, 8, topology=topology, **extra))
    everything, _ = _plan_costing(monkeypatch, req, prune=False)
    pruned, _ = _plan_costing(monkeypatch, req, prune=True)
    assert _answers(pruned) == _answers(everything)
    assert pruned.search["solver_status"] == everything.search["solver_status"]
    assert pruned.search["pruned"] <= pruned.search["candidates"]


def test_pruning_by_the_compute_bound_costs_a_fraction_of_the_space(monkeypatch):
    req = parse_plan_request(_body("llama3-8b", "fsdp", 8, topology=POD))
    _, all_rows = _plan_costing(monkeypatch, req, prune=False)
    _, rows = _plan_costing(monkeypatch, req, prune=True)
    assert rows < all_rows / 2
