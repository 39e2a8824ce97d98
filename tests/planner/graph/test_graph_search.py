"""Op-level sharding search: CP-SAT equals brute force on enumerable graphs; recommender
embedding placement (sharded / replicated / CPU parameter servers); errors."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from cost_model import (
    Strategy,
    Training,
    cluster_from_dict,
    estimate,
    get_preset,
    simple_cluster,
)
from cost_model.errors import InvalidInput, NoFeasiblePlan
from cost_model.graph.evaluate import estimate_graph, evaluate
from cost_model.graph.mesh import mesh_for
from cost_model.graph.parse import graph_from_dict
from cost_model.graph.tables import build_tables
from helpers.graphs import cpu_group, gpt_graph, recommender_graph, synthetic_graph
from planner_service.planner.graph.coarsen import coarsen, cut_candidates
from planner_service.planner.graph.mesh_cpsat import solve_mesh
from planner_service.planner.graph.search import plan_graph

HEADROOM = 0.1


def _tiny(hidden: int = 64, wide: int = 512) -> dict:
    return {
        "name": "tiny",
        "inputs": [{"name": "x", "shape": ["batch", "seq", hidden]}],
        "ops": [
            {"name": "ln", "type": "LayerNorm", "inputs": ["x"], "outputs": ["n"], "params": {"scale": [hidden]}},
            {"name": "up", "type": "MatMul", "inputs": ["n"], "outputs": ["u"], "params": {"weight": [hidden, wide]}},
            {"name": "act", "type": "Relu", "inputs": ["u"], "outputs": ["a"]},
            {"name": "down", "type": "MatMul", "inputs": ["a"], "outputs": ["d"], "params": {"weight": [wide, hidden]}},
            {"name": "res", "type": "Add", "inputs": ["x", "d"], "outputs": ["y"]},
            {"name": "head", "type": "MatMul", "inputs": ["y"], "outputs": ["z"], "params": {"weight": [hidden, 32]}},
        ],
    }


def _fits(tables, ev) -> bool:
    cap = tables.mesh.device.memory_bytes * (1 - HEADROOM)
    ok = all(s.peak_bytes <= cap for s in ev.stages)
    if tables.mesh.cpu is not None:
        ok = ok and ev.cpu_memory_bytes <= tables.mesh.cpu.memory_bytes * (1 - HEADROOM)
    return ok


def brute_force(tables) -> float:
    """Minimum step time over every per-op sharding and every contiguous split of the analysis
    order at chain starts (where the solver may cut), among assignments that fit."""
    g = tables.graph
    n = g.num_ops
    order = tables.analysis.order
    pp = tables.mesh.pp
    cuts = [int(p) for p in np.nonzero(tables.analysis.chain_start)[0] if p > 0]
    best = float("inf")
    ranges = [range(tables.n_choices(i)) for i in range(n)]
    splits = []
    for bounds in itertools.combinations(cuts, pp - 1):
        pos_stage = np.zeros(n, dtype=np.int64)
        for k, b in enumerate(bounds):
            pos_stage[b:] = k + 1
        stage = np.empty(n, dtype=np.int64)
        stage[order] = pos_stage
        splits.append(stage)
    for choice in itertools.product(*ranges):
        for stage in splits:
            ev = evaluate(tables, choice, stage)
            if _fits(tables, ev) and ev.step_time_s < best:
                best = ev.step_time_s
    return best


CASES = [
    # (device memory GB or catalog name, gpus, dp, t, pp, micro_batch, global batch, seq)
    ("A100-SXM4-80GB", 2, 1, 2, 1, 4, 16, 256),
    ("A100-SXM4-80GB", 4, 1, 2, 2, 2, 16, 256),
    ("A100-SXM4-80GB", 4, 2, 2, 1, 2, 16, 128),
    (1.722, 2, 1, 2, 1, 4, 8, 2048),  # memory binds: the fastest assignment does not fit
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-t{c[3]}-pp{c[4]}-dp{c[2]}")
def test_cpsat_equals_brute_force_on_enumerable_graphs(case):
    dev, gpus, dp, t, pp, mbs, gbs, seq = case
    device = dev if isinstance(dev, str) else {"name": "small", "family": "ampere", "memory_GB": dev,
                                               "memory_bandwidth_GBps": 2039, "bf16_tflops": 312}
    cluster = cluster_from_dict({"name": "c", "node_groups": [{"name": "g", "count": 1, "gpus_per_node": gpus, "device": device}]})
    g = graph_from_dict(_tiny() if isinstance(dev, str) else _tiny(256, 2048))
    training = Training(global_batch_size=gbs, sequence_length=seq)
    mesh = mesh_for(training, cluster, dp=dp, t=t, pp=pp, micro_batch=mbs)
    tables = build_tables(g, training, mesh)
    expected = brute_force(tables)
    coarse = coarsen(tables)
    assert coarse.exact
    res = solve_mesh(tables, coarse, cut_candidates(tables), time_limit_s=20.0, headroom_fraction=HEADROOM)
    if expected == float("inf"):
        assert res is None or res.status == "INFEASIBLE"
        return
    assert res is not None and res.status == "OPTIMAL"
    ev = evaluate(tables, res.choice, res.stage_of_op)
    assert _fits(tables, ev)
    assert ev.step_time_s == pytest.approx(expected, rel=1e-6)
    assert res.objective_s == pytest.approx(expected, rel=1e-4)  # integer scaling is fine-grained


def test_memory_binding_case_really_binds():
    """The small-memory case above: the unconstrained optimum does not fit, so the solver had to
    trade time for memory (guards against a vacuous memory constraint in the test above)."""
    dev = {"name": "small", "family": "ampere", "memory_GB": CASES[-1][0], "memory_bandwidth_GBps": 2039, "bf16_tflops": 312}
    cluster = cluster_from_dict({"name": "c", "node_groups": [{"name": "g", "count": 1, "gpus_per_node": 2, "device": dev}]})
    g = graph_from_dict(_tiny(256, 2048))
    training = Training(global_batch_size=8, sequence_length=2048)
    tables = build_tables(g, training, mesh_for(training, cluster, dp=1, t=2, pp=1, micro_batch=4))
    n = g.num_ops
    stage = np.zeros(n, dtype=np.int64)
    results = [evaluate(tables, c, stage) for c in itertools.product(*[range(tables.n_choices(i)) for i in range(n)])]
    fastest = min(results, key=lambda e: e.step_time_s)
    assert not _fits(tables, fastest)
    assert any(_fits(tables, e) for e in results)


def test_plan_graph_result_contract():
    g = graph_from_dict(gpt_graph(layers=2, hidden=256, heads=4, vocab=1024, positions=256))
    cluster = simple_cluster("A100-SXM4-80GB", 1)
    out = plan_graph(g, Training(32, 256), cluster, None, top_k=2, time_limit_s=3).to_dict()
    best = out["best"]
    for key in ("dp", "tp", "pp", "cp", "micro_batch_size", "zero_stage", "op_shardings"):
        assert key in best["strategy"]
    assert set(best["strategy"]["op_shardings"]) == {op.name for op in g.ops}
    assert best["prediction"]["fits"] and best["prediction"]["step_time_s"] > 0
    for field in ("step_time_s", "tokens_per_s", "mfu", "peak_memory_GB", "breakdown_s"):
        assert field in best["prediction"]
    s = best["strategy"]
    assert len(best["ranks"]) == s["dp"] * s["tp"] * s["pp"]
    r0 = best["ranks"][0]
    assert {"rank", "host", "gpu", "node_group", "device", "stage", "dp", "pp", "tp", "cp"} <= set(r0)
    assert sum(len(st["ops"]) for st in best["stages"]) == g.num_ops
    assert {"candidates", "pruned", "solver_status", "wall_time_s"} <= set(out["search"])
    assert out["search"]["solver_status"] in ("OPTIMAL", "FEASIBLE")
    assert len(out["alternatives"]) <= 2
    assert "bottleneck" in out["explanation"]


def test_pinned_gpt_plan_is_within_10_percent_of_the_transformer_path():
    spec = get_preset("gpt3-125m")
    g = graph_from_dict(gpt_graph(spec.num_layers, spec.hidden_size, spec.num_heads, spec.vocab_size, 2048))
    training = Training(global_batch_size=32, sequence_length=2048)
    cluster = simple_cluster("A100-SXM4-80GB", 1)
    pins = {"dp": 2, "tp": 4, "pp": 1, "micro_batch_size": 2}
    out = plan_graph(g, training, cluster, pins, top_k=0, time_limit_s=2).to_dict()
    s = out["best"]["strategy"]
    assert (s["dp"], s["tp"], s["pp"], s["micro_batch_size"]) == (2, 4, 1, 2)
    ref = estimate(spec, training, cluster, Strategy(dp=2, tp=4, micro_batch_size=2, zero_stage=1))
    got = out["best"]["prediction"]["step_time_s"]
    assert got == pytest.approx(ref.step_time_s, rel=0.10)


def _rec_cluster(gpu_nodes: int, gpus_per_node: int, device: str, cpu_nodes: int = 0) -> object:
    groups = [{"name": "gpu", "count": gpu_nodes, "gpus_per_node": gpus_per_node, "device": device}]
    if cpu_nodes:
        groups.append(cpu_group(cpu_nodes))
    return cluster_from_dict({"name": "rec", "node_groups": groups})


def _table_shardings(out) -> dict[str, str]:
    return {k: v for k, v in out["best"]["strategy"]["op_shardings"].items() if k.startswith("table")}


REC_TRAINING = Training(global_batch_size=65536, sequence_length=1)


def test_tables_larger_than_a_device_are_sharded_and_fit():
    g = graph_from_dict(recommender_graph(num_tables=4, rows=40_000_000, dim=128, lookups=8))  # 4 × 10 GB bf16
    table_state_GB = 4 * 40e6 * 128 * 18 / 1e9
    assert table_state_GB > 80  # one table's weights+grads+Adam alone exceeds an 80 GB device
    out = plan_graph(g, REC_TRAINING, _rec_cluster(1, 8, "A100-SXM4-80GB"), None, top_k=1, time_limit_s=10).to_dict()
    tables = _table_shardings(out)
    assert all(v.startswith("shard_embedding") for v in tables.values()), tables
    pred = out["best"]["prediction"]
    assert pred["fits"] and max(pred["peak_memory_GB"]) <= 80 * (1 - HEADROOM)


def test_small_tables_are_replicated_when_that_is_faster():
    g = graph_from_dict(recommender_graph(num_tables=4, rows=10_000, dim=128, lookups=8))
    cluster = _rec_cluster(1, 8, "A100-SXM4-80GB")
    out = plan_graph(g, REC_TRAINING, cluster, None, top_k=1, time_limit_s=10).to_dict()
    tables = _table_shardings(out)
    assert all(v in ("replicate", "split_batch") for v in tables.values()), tables
    s = out["best"]["strategy"]
    strategy = Strategy(dp=s["dp"], tp=s["tp"], pp=s["pp"], micro_batch_size=s["micro_batch_size"], zero_stage=s["zero_stage"])
    best_step = out["best"]["prediction"]["step_time_s"]
    # forcing the same tables to be sharded on a sharding axis is slower
    for sharding in ("shard_embedding_rows_alltoall", "shard_embedding_cols"):
        forced = estimate_graph(g, REC_TRAINING, cluster, Strategy(dp=1, tp=8, micro_batch_size=65536),
                                op_shardings={f"table{i}": sharding for i in range(4)})
        assert forced.step_time_s > best_step
    assert estimate_graph(g, REC_TRAINING, cluster, strategy).step_time_s == pytest.approx(best_step, rel=0.05)


def test_tables_go_to_cpu_parameter_servers_when_gpus_cannot_hold_them():
    g = graph_from_dict(recommender_graph(num_tables=4, rows=40_000_000, dim=128, lookups=8))
    few_gpus = _rec_cluster(1, 4, "A100-SXM4-40GB")
    with pytest.raises(NoFeasiblePlan) as ei:
        plan_graph(g, REC_TRAINING, few_gpus, None, top_k=1, time_limit_s=10)
    assert "GB per GPU" in ei.value.message
    out = plan_graph(g, REC_TRAINING, _rec_cluster(1, 4, "A100-SXM4-40GB", cpu_nodes=8), None, top_k=1, time_limit_s=10).to_dict()
    tables = _table_shardings(out)
    assert set(tables.values()) == {"embedding_on_cpu"}
    best = out["best"]
    assert best["prediction"]["fits"]
    ps = best["parameter_servers"]
    assert len(ps["hosts"]) == 8 and ps["memory_GB"] <= 8 * 512 * (1 - HEADROOM)
    assert ps["time_per_microbatch_s"] > 0


def test_cpu_placement_beats_gpu_only_when_gpu_sharding_is_feasible_but_slower():
    """Two nodes of 8 GPUs can hold the tables sharded, but syncing and updating 20 B dense
    parameters per step costs more than serving the looked-up rows from CPU nodes."""
    g = graph_from_dict(recommender_graph(num_tables=4, rows=40_000_000, dim=128, lookups=8))
    gpu_only = plan_graph(g, REC_TRAINING, _rec_cluster(2, 8, "A100-SXM4-80GB"), None, top_k=0, time_limit_s=3).to_dict()
    hetero = plan_graph(g, REC_TRAINING, _rec_cluster(2, 8, "A100-SXM4-80GB", cpu_nodes=16), None, top_k=0, time_limit_s=3).to_dict()
    assert gpu_only["best"]["prediction"]["fits"]
    t_gpu = gpu_only["best"]["prediction"]["step_time_s"]
    t_het = hetero["best"]["prediction"]["step_time_s"]
    assert set(_table_shardings(hetero).values()) == {"embedding_on_cpu"}
    assert hetero["best"]["prediction"]["fits"]
    assert t_het < t_gpu
    # the time saved is the dense table work: GPU-only spends it in gradient sync and Adam
    gpu_b, het_b = gpu_only["best"]["prediction"]["breakdown_s"], hetero["best"]["prediction"]["breakdown_s"]
    assert gpu_b["optimizer"] + gpu_b["dp_comm_exposed"] > het_b["optimizer"] + het_b["dp_comm_exposed"]


def test_constraints_pin_the_layout_and_bad_pins_are_named():
    g = graph_from_dict(gpt_graph(layers=2, hidden=256, heads=4, vocab=1024, positions=256))
    cluster = simple_cluster("A100-SXM4-80GB", 1)
    out = plan_graph(g, Training(32, 256), cluster, {"tp": 2, "pp": 2}, top_k=0, time_limit_s=3).to_dict()
    assert (out["best"]["strategy"]["tp"], out["best"]["strategy"]["pp"]) == (2, 2)
    with pytest.raises(InvalidInput) as ei:
        plan_graph(g, Training(32, 256), cluster, {"cp": 2}, top_k=0, time_limit_s=2)
    assert ei.value.field == "constraints.cp"
    with pytest.raises(NoFeasiblePlan):
        plan_graph(g, Training(32, 256), cluster, {"tp": 3}, top_k=0, time_limit_s=2)


def test_large_graphs_take_the_coarsened_path_and_still_improve_or_keep_the_greedy_answer():
    g = graph_from_dict(synthetic_graph(600))
    out = plan_graph(g, Training(64, 512), simple_cluster("A100-SXM4-80GB", 1), None, top_k=1, time_limit_s=8).to_dict()
    assert out["best"]["prediction"]["fits"]
    assert out["search"]["operators"] == g.num_ops
    assert out["search"]["coarsened_nodes"] < g.num_ops / 2
    assert out["search"]["exact_reduction"] in (False, None)


def test_the_framework_decides_what_an_operator_graph_may_run():
    """training.framework holds for operator graphs as for transformer layers: DeepSpeed alone has
    no tensor parallelism, FSDP no ZeRO stage 1 — the search keeps to what the framework runs,
    a pin it cannot run is refused naming the pin, and so is such a strategy in an estimate."""
    g = graph_from_dict(gpt_graph(layers=2, hidden=256, heads=4, vocab=1024, positions=256))
    cluster = simple_cluster("A100-SXM4-80GB", 1)
    ds = Training(32, 256, framework="deepspeed")
    out = plan_graph(g, ds, cluster, None, top_k=3, time_limit_s=3).to_dict()
    assert all(p["strategy"]["tp"] == 1 for p in [out["best"], *out["alternatives"]])
    core = plan_graph(g, Training(32, 256), cluster, None, top_k=3, time_limit_s=3).to_dict()
    assert core["search"]["candidates"] > out["search"]["candidates"]  # megatron-core may shard operators
    with pytest.raises(InvalidInput) as ei:
        plan_graph(g, ds, cluster, {"tp": 2}, top_k=0, time_limit_s=2)
    assert ei.value.field == "constraints.tp" and "deepspeed" in str(ei.value)
    fsdp = Training(32, 256, framework="fsdp")
    out = plan_graph(g, fsdp, cluster, None, top_k=3, time_limit_s=3).to_dict()
    assert {p["strategy"]["zero_stage"] for p in [out["best"], *out["alternatives"]]} == {0}
    with pytest.raises(InvalidInput) as ei:
        plan_graph(g, fsdp, cluster, {"zero_stage": 1}, top_k=0, time_limit_s=2)
    assert ei.value.field == "constraints.zero_stage"
    with pytest.raises(InvalidInput) as ei:
        estimate_graph(g, ds, cluster, Strategy(dp=4, tp=2, micro_batch_size=1))
    assert ei.value.field == "strategy.tp"


def test_deepspeeds_gradient_buckets_are_counted_for_operator_graphs_as_for_layers():
    """Under DeepSpeed's ZeRO optimizer (fp32 here, stage 1, no pipeline) every GPU holds two
    reduce buckets of 5e8 fp32 elements (stage_cost.gradient_bucket_bytes): the graph family counts
    them as gradients, outside the fragmentation reserve, and its search fits plans with them.
    (Against Paddle, whose gradients fragment as DeepSpeed's do; Megatron-Core's gradient buffer
    does not fragment at all.)"""
    g = graph_from_dict(gpt_graph(layers=2, hidden=256, heads=4, vocab=1024, positions=256))
    cluster = simple_cluster("A100-SXM4-80GB", 1)
    st = Strategy(dp=8, micro_batch_size=4, zero_stage=1)
    core = estimate_graph(g, Training(32, 256, dtype="fp32", framework="paddle"), cluster, st).stages[0].memory_GB
    ds = estimate_graph(g, Training(32, 256, dtype="fp32", framework="deepspeed"), cluster, st).stages[0].memory_GB
    assert ds["gradients"] - core["gradients"] == pytest.approx(2 * 5e8 * 4 / 1e9)
    assert ds["workspace"] == pytest.approx(core["workspace"]) and ds["weights"] == pytest.approx(core["weights"])
    out = plan_graph(g, Training(32, 256, dtype="fp32", framework="deepspeed"), cluster, None, top_k=0, time_limit_s=3).to_dict()
    best = out["best"]
    assert best["prediction"]["fits"]
    assert best["strategy"]["pp"] > 1 or best["stages"][0]["memory_GB"]["gradients"] >= 4.0


def test_a_paddle_sharding_stage_over_one_rank_is_no_sharding_for_operator_graphs_too():
    """The one normalisation (frameworks.effective_zero_stage) holds for operator graphs as for
    transformer layers: Paddle's stage 2 over a one-rank group with a pipeline is costed as no
    sharding, with the same note, instead of a 422."""
    g = graph_from_dict(gpt_graph(layers=2, hidden=256, heads=4, vocab=1024, positions=256))
    cluster = simple_cluster("A100-SXM4-80GB", 1)
    training = Training(32, 256, framework="paddle")
    asked = estimate_graph(g, training, cluster, Strategy(dp=1, tp=2, pp=2, micro_batch_size=4, zero_stage=2))
    plain = estimate_graph(g, training, cluster, Strategy(dp=1, tp=2, pp=2, micro_batch_size=4, zero_stage=0))
    assert (asked.step_time_s, asked.peak_memory_GB) == (plain.step_time_s, plain.peak_memory_GB)
    assert any("over a sharding group of one rank is no sharding" in w for w in asked.warnings)
