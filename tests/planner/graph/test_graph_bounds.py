"""Graph search proofs and reproducibility: the per-layout lower bound never exceeds the brute-force
optimum; the whole search (every layout) lands within 1% of the brute-force optimum over every
layout and says so; the bisection split finds the least bottleneck; the same request gives the
same plan; the configured time limit reaches every solver."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
from test_graph_search import CASES, HEADROOM, _fits, _tiny, brute_force

from cost_model import Training, cluster_from_dict
from cost_model.graph.analysis import op_classes
from cost_model.graph.assign import bottleneck_split, greedy_choices
from cost_model.graph.evaluate import evaluate
from cost_model.graph.mesh import inflight, mesh_for
from cost_model.graph.parse import graph_from_dict
from cost_model.graph.tables import build_tables, op_times
from cost_model.transformer.layer_cost import WORKSPACE_BYTES, fragmentation_fraction
from cost_model.transformer.memory import static_for_fragmentation
from helpers.graphs import cpu_group, gpt_graph, recommender_graph, synthetic_graph
from planner_service.planner import SolverSettings
from planner_service.planner.cpsat import SolverParams, configured_solver
from planner_service.planner.graph import mesh_cpsat, search
from planner_service.planner.graph.bound import incoming_edge_min_s, mesh_lower_bound_s, reparametrised_edge_s
from planner_service.planner.graph.coarsen import coarsen, cut_candidates
from planner_service.planner.graph.search import GAP_TARGET, plan_graph
from planner_service.planner.graph.space import enumerate_meshes
from planner_service.planner.request import parse_plan_request

SMALL_DEVICE = {"name": "small", "family": "ampere", "memory_GB": 1.7172, "memory_bandwidth_GBps": 2039, "bf16_tflops": 312}


def _cluster(device: object, gpus: int) -> object:
    return cluster_from_dict({"name": "c", "node_groups": [{"name": "g", "count": 1, "gpus_per_node": gpus, "device": device}]})


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-t{c[3]}-pp{c[4]}-dp{c[2]}")
def test_the_layout_bound_never_exceeds_the_brute_force_optimum(case):
    dev, gpus, dp, t, pp, mbs, gbs, seq = case
    device = dev if isinstance(dev, str) else {**SMALL_DEVICE, "memory_GB": dev}
    g = graph_from_dict(_tiny() if isinstance(dev, str) else _tiny(256, 2048))
    training = Training(global_batch_size=gbs, sequence_length=seq)
    tables = build_tables(g, training, mesh_for(training, _cluster(device, gpus), dp=dp, t=t, pp=pp, micro_batch=mbs))
    optimum = brute_force(tables)
    bound = mesh_lower_bound_s(tables, HEADROOM)
    assert bound <= optimum * (1 + 1e-9)
    assert bound > 0.4 * optimum  # and a useful bound, not 0 (memory binds in the last case: the loosest)


def test_the_pipeline_bound_is_tight_when_every_op_has_one_choice():
    """t = 1: every op has one sharding, so only the split is free; the bound (least bottleneck
    under per-stage memory, least p2p) must sit just under the best split's step time."""
    g = graph_from_dict(gpt_graph(layers=4, hidden=256, heads=4, vocab=1024, positions=256))
    training = Training(global_batch_size=16, sequence_length=256)
    tables = build_tables(g, training, mesh_for(training, _cluster("A100-SXM4-80GB", 2), dp=1, t=1, pp=2, micro_batch=2))
    optimum = brute_force(tables)
    bound = mesh_lower_bound_s(tables, HEADROOM)
    assert optimum * 0.97 <= bound <= optimum * (1 + 1e-9)


def _global_brute_force(g, training, cluster, pins):
    """The best step time over every layout the search may use and every assignment on it."""
    meshes, _, _ = enumerate_meshes(g, training, cluster, pins)
    best = float("inf")
    for mesh in meshes:
        best = min(best, brute_force(build_tables(g, training, mesh)))
    return best, len(meshes)


@pytest.mark.parametrize("device,pins", [
    ("A100-SXM4-80GB", {"micro_batch_size": 2}),
    (SMALL_DEVICE, {"micro_batch_size": 4}),  # memory binds on some layouts
], ids=["roomy", "memory-bound"])
def test_the_search_is_within_1_percent_of_the_optimum_over_every_layout(device, pins):
    g = graph_from_dict(_tiny() if isinstance(device, str) else _tiny(256, 2048))
    training = Training(global_batch_size=8, sequence_length=256 if isinstance(device, str) else 2048)
    cluster = _cluster(device, 4)
    optimum, n_layouts = _global_brute_force(g, training, cluster, pins)
    assert n_layouts >= 3 and np.isfinite(optimum)
    out = plan_graph(g, training, cluster, pins, top_k=0, time_limit_s=20).to_dict()
    found = out["best"]["prediction"]["step_time_s"]
    sr = out["search"]
    assert optimum * (1 - 1e-9) <= found <= optimum * (1 + GAP_TARGET)
    assert sr["lower_bound_s"] <= optimum * (1 + 1e-9)  # the stated bound is a true bound
    assert sr["gap"] == pytest.approx(found / sr["lower_bound_s"] - 1, abs=1e-9)
    assert sr["optimality"] in ("proved_optimal", "within_gap")
    if sr["optimality"] == "proved_optimal":
        assert sr["solver_status"] == "OPTIMAL" and found == pytest.approx(optimum, rel=1e-5)


def test_bisection_split_finds_the_least_bottleneck_under_memory():
    g = graph_from_dict(gpt_graph(layers=3, hidden=256, heads=4, vocab=1024, positions=256))
    training = Training(global_batch_size=32, sequence_length=256)
    tables = build_tables(g, training, mesh_for(training, _cluster("A100-SXM4-80GB", 4), dp=1, t=1, pp=3, micro_batch=2))
    choice = np.zeros(g.num_ops, dtype=np.int64)
    t_op = op_times(tables, choice)
    rows = tables.row_start[:-1] + choice
    static = static_for_fragmentation(tables.weights_bytes, tables.gradients_bytes, tables.optimizer_state_bytes,
                                      tables.training.framework)[rows]
    act = tables.activation_bytes[rows]
    cap = tables.mesh.device.memory_bytes * (1 - HEADROOM)
    order = tables.analysis.order
    cuts = [int(p) for p in np.nonzero(tables.analysis.chain_start)[0] if p > 0]
    best = float("inf")
    for bounds in itertools.combinations(cuts, 2):
        edges = [0, *bounds, g.num_ops]
        stage_t, ok = [], True
        for k in range(3):
            ops = order[edges[k]:edges[k + 1]]
            mem = (static[ops].sum() + inflight(tables.mesh, k) * act[ops].sum()) * (1 + fragmentation_fraction()) + WORKSPACE_BYTES
            ok = ok and mem <= cap
            stage_t.append(t_op[ops].sum())
        if ok:
            best = min(best, max(stage_t))
    stage = bottleneck_split(tables, choice, headroom_fraction=HEADROOM)
    assert stage is not None and sorted(set(stage.tolist())) == [0, 1, 2]
    got = max(t_op[stage == k].sum() for k in range(3))
    assert got == pytest.approx(best, rel=1e-6)
    ev = evaluate(tables, choice, stage)
    assert _fits(tables, ev)


def test_repeated_layers_share_one_structural_class():
    g = graph_from_dict(gpt_graph(layers=4, hidden=256, heads=4, vocab=1024, positions=256))
    cls = op_classes(g)
    idx = {op.name: i for i, op in enumerate(g.ops)}
    assert cls[idx["h0.qkv"]] == cls[idx["h3.qkv"]] and cls[idx["h1.fc2"]] == cls[idx["h2.fc2"]]
    assert cls[idx["h0.qkv"]] != cls[idx["h0.fc1"]]  # different weight shapes
    assert len(set(cls.tolist())) < g.num_ops / 3


def _without_timing(d: dict) -> dict:
    d = dict(d)
    d["search"] = {k: v for k, v in d["search"].items() if k != "wall_time_s"}
    return d


def test_the_same_request_gives_the_same_plan():
    g = graph_from_dict(gpt_graph(layers=2, hidden=256, heads=4, vocab=1024, positions=256))
    cluster = _cluster("A100-SXM4-80GB", 8)
    runs = [_without_timing(plan_graph(g, Training(32, 256), cluster, None, top_k=2, time_limit_s=10).to_dict()) for _ in range(2)]
    assert runs[0] == runs[1]
    assert runs[0]["search"]["stopped_by_clock"] is False


def test_the_configured_time_limit_reaches_the_graph_search(monkeypatch):
    seen = {}

    def fake(model, training, cluster, constraints, top_k, time_limit_s, objective):
        seen["time_limit_s"] = time_limit_s
        raise RuntimeError("stop")

    monkeypatch.setattr(search, "plan_graph", fake)
    body = {"model": {"graph": _tiny()}, "training": {"global_batch_size": 8, "sequence_length": 256},
            "cluster": {"name": "c", "node_groups": [{"name": "g", "count": 1, "gpus_per_node": 2, "device": "A100-SXM4-80GB"}]}}
    with pytest.raises(RuntimeError):
        search.search_graph(parse_plan_request(body), SolverSettings(time_limit_s=0.7))
    assert seen["time_limit_s"] == 0.7  # no separate, larger graph budget


def test_graph_cpsat_runs_are_deterministic_and_stop_at_a_1_percent_gap(monkeypatch):
    captured: list[SolverParams] = []
    real = mesh_cpsat.solve

    def spy(model, params):
        captured.append(params)
        return real(model, params)

    monkeypatch.setattr(mesh_cpsat, "solve", spy)
    g = graph_from_dict(_tiny())
    training = Training(global_batch_size=16, sequence_length=256)
    tables = build_tables(g, training, mesh_for(training, _cluster("A100-SXM4-80GB", 4), dp=1, t=2, pp=2, micro_batch=2))
    res = mesh_cpsat.solve_mesh(tables, coarsen(tables), cut_candidates(tables), time_limit_s=5.0, work_s=2.0)
    assert res is not None and res.bound_s is not None and res.bound_s <= res.objective_s
    (params,) = captured
    assert params.num_workers == 1 and params.random_seed == mesh_cpsat.RANDOM_SEED
    assert params.relative_gap_limit == mesh_cpsat.RELATIVE_GAP_LIMIT == 0.01
    assert params.deterministic_time_s == pytest.approx(2.0 * mesh_cpsat.DETERMINISTIC_TIME_PER_S)
    solver = configured_solver(params)
    assert solver.parameters.max_deterministic_time == pytest.approx(params.deterministic_time_s)
    assert solver.parameters.random_seed == mesh_cpsat.RANDOM_SEED and solver.parameters.num_workers == 1
    assert solver.parameters.relative_gap_limit == pytest.approx(0.01)


@pytest.mark.slow
def test_a_large_graph_search_honours_a_short_time_limit():
    """CPU time (slow): a short configured limit bounds a 5,000-op graph's search (it used to
    run a fixed 30 s budget).  The ±10% figure is measured by bench/graph_bench.py on an idle
    host; here the bound is 2× on the process's CPU time, so a loaded host cannot fail it."""
    g = graph_from_dict(synthetic_graph(5000, hidden=2048))
    cluster = cluster_from_dict({"name": "c", "node_groups": [{"name": "g", "count": 2, "gpus_per_node": 8, "device": "A100-SXM4-80GB"}]})
    t0 = time.process_time()
    out = plan_graph(g, Training(64, 2048), cluster, None, top_k=1, time_limit_s=3.0).to_dict()
    assert time.process_time() - t0 <= 6.0
    assert out["best"]["prediction"]["fits"]
    # a CP-SAT model that cannot be built within its share is not started (it used to overrun
    # the limit by its ~1–2 s build and come back UNKNOWN)
    assert "UNKNOWN" not in out["search"]["solver_statuses"]


def _assignment_time(tables, choice) -> float:
    """Σ over ops of their own time plus every edge's resharding, per micro-batch (s)."""
    rows = tables.row_start[:-1] + np.asarray(choice)
    own = (tables.fwd_s + tables.bwd_s + tables.comm_fwd_s + tables.comm_bwd_s)[rows].sum()
    edges = sum(float(tables.edge_fwd_s[e][choice[u], choice[v]] + tables.edge_bwd_s[e][choice[u], choice[v]])
                for e, (u, v, _, _) in enumerate(tables.edges))
    return float(own) + edges


def test_the_reparametrised_resharding_bounds_every_assignment():
    """Σ_v (own + r)[c_v] ≤ the assignment's own time plus its resharding for *every*
    assignment (the dual decomposition is a bound), so its minimum is under the optimum."""
    g = graph_from_dict(_tiny())
    training = Training(global_batch_size=16, sequence_length=256)
    tables = build_tables(g, training, mesh_for(training, _cluster("A100-SXM4-80GB", 2), dp=1, t=2, pp=1, micro_batch=4))
    own = tables.fwd_s + tables.bwd_s + tables.comm_fwd_s + tables.comm_bwd_s
    r = reparametrised_edge_s(tables, own)
    starts = tables.row_start[:-1]
    best = float("inf")
    for choice in itertools.product(*[range(tables.n_choices(i)) for i in range(g.num_ops)]):
        exact = _assignment_time(tables, choice)
        assert float((own + r)[starts + np.asarray(choice)].sum()) <= exact * (1 + 1e-12)
        best = min(best, exact)
    assert float(np.minimum.reduceat(own + r, starts).sum()) <= best * (1 + 1e-12)


def test_the_reparametrised_resharding_is_tighter_where_cheapest_layouts_disagree():
    """Residual blocks sharded two ways: each operator's cheapest choice with its cheapest
    producer layout (the per-consumer minimum) pairs layouts no assignment can have at once;
    agreeing along the chains bounds the whole graph's time higher, and still under every
    assignment tried (the greedy one and random ones)."""
    g = graph_from_dict(synthetic_graph(60, hidden=512))
    training = Training(global_batch_size=8, sequence_length=1024)
    tables = build_tables(g, training, mesh_for(training, _cluster("A100-SXM4-80GB", 2), dp=1, t=2, pp=1, micro_batch=1))
    own = tables.fwd_s + tables.bwd_s + tables.comm_fwd_s + tables.comm_bwd_s
    r = reparametrised_edge_s(tables, own)
    starts = tables.row_start[:-1]
    agreed = float(np.minimum.reduceat(own + r, starts).sum())
    per_consumer = float(np.minimum.reduceat(own + incoming_edge_min_s(tables), starts).sum())
    assert agreed > per_consumer * 1.01
    rng = np.random.default_rng(0)
    sizes = np.diff(tables.row_start)
    tries = [greedy_choices(tables)] + [rng.integers(0, sizes) for _ in range(200)]
    for choice in tries:
        assert float((own + r)[starts + choice].sum()) <= _assignment_time(tables, choice) * (1 + 1e-12)


@pytest.mark.parametrize("rows,dp,pp,mbs", [(2_000_000, 2, 1, 1024), (2_000_000, 1, 2, 512), (40_000_000, 1, 2, 512)])
def test_the_bound_with_cpu_parameter_servers_never_exceeds_the_brute_force_optimum(rows, dp, pp, mbs):
    """With a table on CPU parameter servers the CPU stage (lookups, transfers, sparse update)
    can be the bottleneck and the optimizer step: the bound mixes it with the GPU stages
    instead of averaging it away, so it stays under the optimum and close to it."""
    g = graph_from_dict(recommender_graph(num_tables=1, rows=rows, dim=128, lookups=8))
    cluster = cluster_from_dict({"name": "c", "node_groups": [
        {"name": "g", "count": 1, "gpus_per_node": 2, "device": "A100-SXM4-80GB"}, cpu_group(2)]})
    training = Training(global_batch_size=4096, sequence_length=1)
    tables = build_tables(g, training, mesh_for(training, cluster, dp=dp, t=1, pp=pp, micro_batch=mbs))
    assert len(tables.cpu_rows)
    optimum = brute_force(tables)
    bound = mesh_lower_bound_s(tables, HEADROOM)
    assert 0.8 * optimum <= bound <= optimum * (1 + 1e-9)
