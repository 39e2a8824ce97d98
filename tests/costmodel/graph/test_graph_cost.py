"""Graph cost model: agreement with the transformer path, resharding rules, memory, errors."""

from __future__ import annotations

import pytest

from cost_model import Strategy, Training, estimate, get_preset, simple_cluster
from cost_model.errors import InvalidGraph, InvalidStrategy
from cost_model.graph.assign import greedy_choices, split_stages
from cost_model.graph.evaluate import estimate_graph, evaluate
from cost_model.graph.layouts import ALLGATHER, ALLREDUCE, ALLTOALL, NONE, REDUCE_SCATTER, P, R, S, reshard_kind
from cost_model.graph.mesh import mesh_for
from cost_model.graph.parse import graph_from_dict
from cost_model.graph.tables import build_tables
from cost_model.transformer.layer_cost import fragmentation_fraction
from cost_model.transformer.memory import fragmentation_reserve_GB, interval_GB
from helpers.graphs import gpt_graph, llama_graph, megatron_shardings, recommender_graph

GPT = get_preset("gpt3-1.3b")


@pytest.fixture(scope="module")
def gpt13():
    return graph_from_dict(gpt_graph(GPT.num_layers, GPT.hidden_size, GPT.num_heads, GPT.vocab_size, 2048, name="gpt3-1.3b"))


@pytest.mark.parametrize(
    "strategy",
    [
        Strategy(dp=16, micro_batch_size=1),
        Strategy(dp=4, tp=4, micro_batch_size=2),
        Strategy(dp=2, tp=4, pp=2, micro_batch_size=1),
        Strategy(dp=1, tp=8, pp=2, micro_batch_size=1),
        Strategy(dp=2, tp=2, pp=4, micro_batch_size=2),
    ],
    ids=lambda s: f"dp{s.dp}-tp{s.tp}-pp{s.pp}-mbs{s.micro_batch_size}",
)
def test_gpt_as_an_operator_graph_matches_the_transformer_path_within_10_percent(gpt13, strategy):
    training = Training(global_batch_size=64, sequence_length=2048)
    cluster = simple_cluster("A100-SXM4-80GB", 2)
    ref = estimate(GPT, training, cluster, strategy)
    shard = megatron_shardings(GPT.num_layers) if strategy.tp > 1 else None
    got = estimate_graph(gpt13, training, cluster, strategy, op_shardings=shard)
    assert got.step_time_s == pytest.approx(ref.step_time_s, rel=0.10), (got.breakdown_s, ref.breakdown_s)
    # the same kinds of time show up in the same places
    for key in ("compute", "tp_comm"):
        if ref.breakdown_s[key] > 0.05 * ref.step_time_s:
            assert got.breakdown_s[key] == pytest.approx(ref.breakdown_s[key], rel=0.2), key
    assert got.num_microbatches == ref.num_microbatches
    assert len(got.stages) == strategy.pp
    # the graph has an untied head (+V·h parameters): memory within 15%
    assert max(got.peak_memory_GB) == pytest.approx(max(ref.peak_memory_GB), rel=0.15)
    # its peak carries the interval a transformer stage of the same memory would: the same terms,
    # the same fragmentation reserve (cost_model.transformer.memory), no step interval (uncalibrated)
    peak = max(got.stages, key=lambda st: st.peak_memory_GB)
    assert (got.peak_memory_GB_p10, got.peak_memory_GB_p90) == pytest.approx(
        interval_GB(peak.peak_memory_GB, fragmentation_reserve_GB(peak.memory_GB), training.framework))
    assert got.peak_memory_GB_p10 < peak.peak_memory_GB < got.peak_memory_GB_p90
    assert got.memory_interval_basis == ref.memory_interval_basis == "fragmentation-bounds"
    assert got.step_time_s_p10 is None and got.to_dict()["peak_memory_GB_p10"] == got.peak_memory_GB_p10


def test_estimate_dispatches_operator_graphs(gpt13):
    training = Training(global_batch_size=16, sequence_length=2048)
    cluster = simple_cluster("A100-SXM4-80GB", 1)
    via_estimate = estimate(gpt13, training, cluster, Strategy(dp=8, micro_batch_size=2))
    direct = estimate_graph(gpt13, training, cluster, Strategy(dp=8, micro_batch_size=2))
    assert via_estimate.step_time_s == pytest.approx(direct.step_time_s, rel=1e-12)
    assert via_estimate.fits


def test_megatron_tp_costs_two_allreduces_forward_and_two_backward_per_layer():
    h, s, b, t = 1024, 512, 2, 4
    g = graph_from_dict(gpt_graph(layers=1, hidden=h, heads=16, vocab=1024, positions=s))
    training = Training(global_batch_size=8, sequence_length=s)
    cluster = simple_cluster("A100-SXM4-80GB", 1)
    mesh = mesh_for(training, cluster, dp=1, t=t, pp=1, micro_batch=b)
    tables = build_tables(g, training, mesh)
    shard = megatron_shardings(1)
    choice = [tables.choice_index(i, shard.get(op.name, "replicate")) for i, op in enumerate(g.ops)]
    layer = {op.name: i for i, op in enumerate(g.ops)}
    fwd = bwd = 0.0
    for e, (u, v, _name, _) in enumerate(tables.edges):
        if g.ops[v].name.startswith("h0."):
            fwd += tables.edge_fwd_s[e][choice[u], choice[v]]
            bwd += tables.edge_bwd_s[e][choice[u], choice[v]]
    from cost_model.comm import Links, allreduce_time_s

    one = float(allreduce_time_s(t, b * s * h * 2, Links.for_group(mesh.group), t))
    assert fwd == pytest.approx(2 * one, rel=1e-9)  # proj and FC2 outputs (P → R)
    assert bwd == pytest.approx(2 * one, rel=1e-9)  # QKV and FC1 input gradients (P → R)
    assert layer  # names resolved


def test_reshard_rules():
    assert reshard_kind(R, S(0)) == NONE  # local slice
    assert reshard_kind(S(1), P) == NONE
    assert reshard_kind(S(2), R) == ALLGATHER
    assert reshard_kind(P, R) == ALLREDUCE
    assert reshard_kind(P, S(1)) == REDUCE_SCATTER
    assert reshard_kind(S(0), S(2)) == ALLTOALL


def test_split_layouts_cut_activation_memory_and_time():
    g = graph_from_dict(gpt_graph(layers=2, hidden=512, heads=8, vocab=2048, positions=256))
    training = Training(global_batch_size=32, sequence_length=256)
    cluster = simple_cluster("A100-SXM4-80GB", 1)
    rep = estimate_graph(g, training, cluster, Strategy(dp=1, tp=4, micro_batch_size=4),
                         op_shardings={op.name: "replicate" for op in g.ops})
    best = estimate_graph(g, training, cluster, Strategy(dp=1, tp=4, micro_batch_size=4))
    assert best.step_time_s < rep.step_time_s
    assert best.stages[0].memory_GB["activations"] < rep.stages[0].memory_GB["activations"]


def test_pipeline_split_is_contiguous_balanced_and_respects_memory():
    g = graph_from_dict(gpt_graph(layers=8, hidden=512, heads=8, vocab=2048, positions=256))
    training = Training(global_batch_size=32, sequence_length=256)
    cluster = simple_cluster("A100-SXM4-80GB", 1)
    mesh = mesh_for(training, cluster, dp=2, t=1, pp=4, micro_batch=2)
    tables = build_tables(g, training, mesh)
    choice = greedy_choices(tables)
    stage = split_stages(tables, choice)
    order = tables.analysis.order
    seq = stage[order]
    assert list(seq) == sorted(seq) and set(seq) == {0, 1, 2, 3}
    ev = evaluate(tables, choice, stage)
    times = [s.time_s for s in ev.stages]
    assert max(times) < 1.6 * min(times)
    # step = m·max + Σ − max (+ exposed DP + optimizer), as the transformer path composes it
    m = mesh.num_microbatches
    assert ev.pipeline_s == pytest.approx(m * max(times) + sum(times) - max(times), rel=1e-12)


def test_bad_strategies_and_shardings_name_the_field(gpt13):
    training = Training(global_batch_size=16, sequence_length=2048)
    cluster = simple_cluster("A100-SXM4-80GB", 1)
    with pytest.raises(InvalidStrategy) as ei:
        estimate_graph(gpt13, training, cluster, Strategy(dp=4, cp=2))
    assert ei.value.field == "strategy.cp"
    with pytest.raises(InvalidStrategy) as ei:
        estimate_graph(gpt13, training, cluster, Strategy(dp=16))
    assert "16 devices" in ei.value.message
    with pytest.raises(InvalidGraph) as ei:
        estimate_graph(gpt13, training, cluster, Strategy(dp=2, tp=4), op_shardings={"h0.qkv": "split_heads"})
    assert ei.value.field == "op_shardings.h0.qkv" and "split_weight_cols" in ei.value.message
    with pytest.raises(InvalidGraph):
        estimate_graph(gpt13, training, cluster, Strategy(dp=8), op_shardings={"nope": "replicate"})


def test_embedding_tables_shard_memory_by_the_sharding_degree():
    g = graph_from_dict(recommender_graph(num_tables=2, rows=4_000_000, dim=64))
    training = Training(global_batch_size=4096, sequence_length=1)
    cluster = simple_cluster("A100-SXM4-80GB", 1)
    names = {"table0": "shard_embedding_rows_alltoall", "table1": "shard_embedding_rows_alltoall"}
    sharded = estimate_graph(g, training, cluster, Strategy(dp=1, tp=8, micro_batch_size=4096), op_shardings=names)
    rep = estimate_graph(g, training, cluster, Strategy(dp=1, tp=8, micro_batch_size=4096),
                         op_shardings={"table0": "split_batch", "table1": "split_batch"})
    # fp32 grads (which the allocator fragments), bf16 weights and Adam state (allocated once)
    table_state = 2 * 4_000_000 * 64 * (4 * (1 + fragmentation_fraction()) + 2 + 12)
    assert rep.stages[0].memory_GB["weights"] * 1e9 > 2 * 4_000_000 * 64 * 2 * 0.99
    saved = (rep.stages[0].peak_memory_GB - sharded.stages[0].peak_memory_GB) * 1e9
    assert saved == pytest.approx(table_state * 7 / 8, rel=0.1)


@pytest.mark.parametrize("attention", ["flash", "unfused"])
def test_eager_gpt_graph_matches_the_transformer_path(gpt13, attention):
    """``fused_kernels: false`` (plain PyTorch) on an operator graph: no elementwise chain fuses,
    unfused attention runs each of its ops separately and Adam is the for-loop one — priced as
    the transformer path prices the same model, and slower than fused."""
    cluster = simple_cluster("A100-SXM4-80GB", 2)
    strategy = Strategy(dp=16, micro_batch_size=1)
    fused = Training(global_batch_size=64, sequence_length=2048, attention=attention)
    eager = Training(global_batch_size=64, sequence_length=2048, attention=attention, fused_kernels=False)
    ref = estimate(GPT, eager, cluster, strategy)
    got = estimate_graph(gpt13, eager, cluster, strategy)
    assert got.step_time_s == pytest.approx(ref.step_time_s, rel=0.10), (got.breakdown_s, ref.breakdown_s)
    assert got.breakdown_s["optimizer"] == pytest.approx(ref.breakdown_s["optimizer"], rel=0.10)
    fused_graph = estimate_graph(gpt13, fused, cluster, strategy)
    assert got.breakdown_s["compute"] > fused_graph.breakdown_s["compute"] * 1.01
    assert got.breakdown_s["optimizer"] > 2 * fused_graph.breakdown_s["optimizer"]


def test_eager_llama_graph_prices_its_rmsnorm_as_the_transformer_path_does():
    """A graph's RMSNorm is one operator; eager PyTorch runs it as Hugging Face's LlamaRMSNorm
    does (upcast, pow, mean, scale, downcast, weight) and keeps its fp32 upcast: under
    ``fused_kernels: false`` the graph path adds the transformer path's eager traffic and saved
    bytes (cost_model.transformer.layer_cost.eager_rmsnorm_traffic), so an eager Llama graph costs
    what the transformer path costs the same model, fused or not; and a graph without dropout
    has no attention dropout either."""
    from dataclasses import replace

    from cost_model.transformer.spec import from_hf_config

    layers, h, heads, f, vocab = 24, 2048, 16, 5504, 32000
    graph = graph_from_dict(llama_graph(layers, h, heads, f, vocab))
    spec = replace(from_hf_config({"model_type": "llama", "num_hidden_layers": layers, "hidden_size": h, "num_attention_heads": heads,
                                   "num_key_value_heads": heads, "intermediate_size": f, "vocab_size": vocab,
                                   "max_position_embeddings": 2048, "tie_word_embeddings": False}),
                   position_embedding="none")  # the graph has no rotary operators
    cluster, strategy = simple_cluster("A100-SXM4-80GB", 2), Strategy(dp=16, micro_batch_size=1)
    for fused in (True, False):
        for attention in ("flash", "unfused"):  # unfused: no dropout pass or mask, the graph having no Dropout
            training = Training(64, 2048, fused_kernels=fused, attention=attention)
            ref, got = estimate(spec, training, cluster, strategy), estimate_graph(graph, training, cluster, strategy)
            assert got.step_time_s == pytest.approx(ref.step_time_s, rel=0.04), (fused, attention, got.breakdown_s, ref.breakdown_s)
            assert got.peak_memory_GB[0] == pytest.approx(ref.peak_memory_GB[0], rel=0.03), (fused, attention)


@pytest.mark.parametrize(
    ("framework", "zero", "accum", "pp", "ratio"),
    [
        # Megatron-Core bf16 reduces gradients from its fp32 buffer (4 B) and gathers bf16 weights
        # (2 B): ZeRO-1 is RS(4) + AG(2) = 0.75 of ZeRO-0's all-reduce 2·RS(4)
        ("megatron-core", 1, None, 1, 0.75),
        # DeepSpeed's BF16_Optimizer (stage 0 under a pipeline, or 1 with fp32 accumulation):
        # all-reduce + all-gather = 3 passes at 2 B against the ZeRO optimizer's RS + AG at stage 1
        ("deepspeed", 0, None, 2, 1.5),
        ("deepspeed", 1, "fp32", 1, 1.5),
        # stage 0 without a pipeline (DDP_BFLOAT16): one all-reduce, 2 passes as RS + AG
        ("deepspeed", 0, None, 1, 1.0),
    ],
)
def test_graph_step_sync_follows_the_transformer_paths_ring_passes(gpt13, framework, zero, accum, pp, ratio):
    """The graph path's once-per-step DP sync makes the ring passes the transformer path makes
    (``layer_cost.step_sync_ring_passes``), each at the bytes the framework moves."""
    cluster = simple_cluster("A100-SXM4-80GB", 2)
    training = Training(global_batch_size=64, sequence_length=2048, framework=framework, grad_accum_dtype=accum)
    reference = Training(global_batch_size=64, sequence_length=2048, framework=framework)
    ref_zero = 0 if framework == "megatron-core" else 1  # ZeRO-0 all-reduce / the ZeRO optimizer's RS + AG
    dp = 16 // pp
    sync = build_tables(gpt13, training, mesh_for(training, cluster, dp=dp, t=1, pp=pp, micro_batch=1, zero_stage=zero)).sync_s
    base = build_tables(gpt13, reference, mesh_for(reference, cluster, dp=dp, t=1, pp=pp, micro_batch=1, zero_stage=ref_zero)).sync_s
    weighted = sync > 0
    assert weighted.any()
    assert sync[weighted] == pytest.approx(ratio * base[weighted], rel=1e-9)


@pytest.mark.parametrize(("zero", "grad_bytes"), [(2, 2 + 4), (3, 2 + 4)])
def test_graph_deepspeed_zero23_holds_its_partition_and_the_steps_fp32_copy(gpt13, zero, grad_bytes):
    """A graph under DeepSpeed ZeRO-2/3 holds the gradients as the transformer path does
    (``layer_cost.deepspeed_step_gradient_bytes``): the 16-bit partition and the step's fp32 copy
    of it (1.3B parameters over 16 ranks: below stage 3's sub-group), beside the IPG buckets."""
    from cost_model.graph.mesh import bucket_bytes

    training = Training(global_batch_size=64, sequence_length=2048, framework="deepspeed")
    cluster = simple_cluster("A100-SXM4-80GB", 2)
    est = estimate_graph(gpt13, training, cluster, Strategy(dp=16, micro_batch_size=1, zero_stage=zero))
    mesh = mesh_for(training, cluster, dp=16, t=1, pp=1, micro_batch=1, zero_stage=zero)
    params = float(build_tables(gpt13, training, mesh).params_dev.sum())
    expected = (grad_bytes * params / 16 + bucket_bytes(training, mesh)) / 1e9
    assert est.stages[0].memory_GB["gradients"] == pytest.approx(expected, rel=1e-9)
