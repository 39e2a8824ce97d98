"""FSDP's traffic and memory as torchtitan and ``torch.distributed.pipelining`` run them: full
sharding inside a pipeline stage (gathered once and reduce-scattered once a step, gradients
accumulated unsharded in fp32), SHARD_GRAD_OP without a pipeline (weights re-gathered with
every micro-batch), and what the search and the torchtitan launch make of them."""

import numpy as np
import pytest

from cost_model import Strategy, Training, estimate, simple_cluster
from cost_model.comm import Links
from cost_model.transformer.layer_cost import (
    StrategyArrays,
    dp_gradient_comm_s,
    fsdp_accumulates_in_fp32,
    fsdp_reduces_each_microbatch,
    fsdp_regathers_each_microbatch,
    model_state_bytes_per_param,
    pipelined_fsdp,
    step_sync_ring_passes,
)
from cost_model.transformer.spec import get_preset

FSDP = Training(global_batch_size=64, sequence_length=8192, framework="fsdp")
MEGATRON = Training(global_batch_size=64, sequence_length=8192)


def _S(**kw) -> StrategyArrays:
    return StrategyArrays.from_strategies([Strategy(**kw)])


def test_only_full_sharding_inside_a_pipeline_stage_runs_as_pipelined_fsdp():
    assert pipelined_fsdp(FSDP, 3, 4) and not pipelined_fsdp(FSDP, 3, 1) and not pipelined_fsdp(FSDP, 2, 4)
    assert not pipelined_fsdp(MEGATRON, 3, 4)
    assert fsdp_regathers_each_microbatch(FSDP, 2, 1) and not fsdp_regathers_each_microbatch(FSDP, 2, 4)
    assert not fsdp_regathers_each_microbatch(FSDP, 3, 1) and not fsdp_regathers_each_microbatch(MEGATRON, 2, 1)


def test_pipelined_fsdp_holds_unsharded_weights_and_fp32_gradient_accumulators():
    """reshard_after_forward resolves to never with a pipeline and the schedule keeps the weights
    after backward: 2 B unsharded beside the 4/8 B fp32 shard; no gradient sync until the last
    backward: 4 B fp32 accumulators, unsharded; Adam's moments sharded (8/8)."""
    w, g, o = model_state_bytes_per_param(FSDP, np.array([3, 3]), np.array([8.0, 8.0]), np.array([4, 1]))
    assert (float(w[0]), float(g[0]), float(o[0])) == pytest.approx((2.0 + 4.0 / 8, 4.0, 8.0 / 8))
    assert (float(w[1]), float(g[1]), float(o[1])) == pytest.approx((4.0 / 8, 4.0 / 8, 8.0 / 8))  # FULL_SHARD without a pipeline


def test_pipelined_fsdp_syncs_once_a_step_and_shard_grad_op_gathers_every_microbatch():
    links = Links.for_group(simple_cluster("H100-SXM5-80GB", 4).node_groups[0])
    params = 2e9
    piped = dp_gradient_comm_s(params, FSDP, _S(dp=8, pp=4, zero_stage=3), links)
    zero1 = dp_gradient_comm_s(params, MEGATRON, _S(dp=8, pp=4, zero_stage=1), links)
    # one reduce-scatter and one all-gather a step, as the distributed optimizer (whose gradients
    # are reduced in fp32 where FSDP's traffic is costed at 2 B: layer_cost.gradient_reduce_bytes)
    assert float(piped[1][0]) == 0.0 and float(piped[3][0]) == 0.0
    assert [float(x[0]) for x in step_sync_ring_passes(FSDP, np.array([3]), np.array([4]))] == [1.0, 1.0]
    assert float(piped[0][0]) == pytest.approx(float(dp_gradient_comm_s(params, FSDP, _S(dp=8, pp=4, zero_stage=2), links)[0][0])
                                               + float(dp_gradient_comm_s(params, FSDP, _S(dp=8, pp=4, zero_stage=2), links)[1][0]))
    assert float(zero1[0][0]) > float(piped[0][0])
    # SHARD_GRAD_OP without a pipeline: nothing once a step, an all-gather (in the forward) and a
    # reduce-scatter with every micro-batch
    sgo = dp_gradient_comm_s(params, FSDP, _S(dp=8, zero_stage=2), links)
    assert [float(x[0]) for x in step_sync_ring_passes(FSDP, np.array([2]), np.array([1]))] == [0.0, 0.0]
    assert float(sgo[0][0]) == 0.0 and float(sgo[1][0]) == pytest.approx(2 * float(sgo[3][0]))


def test_pipelined_fsdp_trades_memory_for_traffic_against_per_microbatch_full_sharding():
    """Llama 3 70B, tp 8, pp 4, dp 2 on 64 H100 under torchtitan: the stage's state grows by the
    unsharded weights (2 B) and the fp32 accumulators (4 − 4/2 B) a parameter; the per-micro-batch
    gathers are gone; each micro-batch adds its gradients into the accumulators (compute)."""
    model = get_preset("llama3-70b")
    cluster = simple_cluster("H100-SXM5-80GB", 8)
    s = Strategy(tp=8, pp=4, dp=2, zero_stage=3, micro_batch_size=1, recompute="full")
    est = estimate(model, FSDP, cluster, s)
    mem = est.stages[0].memory_GB
    stage_params = (mem["weights"] / (2 + 4 / 2)) * 1e9
    assert mem["gradients"] == pytest.approx(4 * stage_params / 1e9, rel=1e-6)
    assert mem["optimizer_state"] == pytest.approx(8 / 2 * stage_params / 1e9, rel=1e-6)
    # the same layout under Megatron-Core's distributed optimizer moves the same step-sync traffic
    # with the same state bytes (2 + 4 + 12/2 against 2 + 4/2 + 4 + 8/2)
    dist_opt = estimate(model, MEGATRON, cluster, Strategy(tp=8, pp=4, dp=2, zero_stage=1, micro_batch_size=1, recompute="full"))
    m1 = dist_opt.stages[0].memory_GB
    assert mem["weights"] + mem["gradients"] + mem["optimizer_state"] == pytest.approx(
        m1["weights"] + m1["gradients"] + m1["optimizer_state"], rel=0.02)
    # against the same layout without a pipeline's schedule (pp 1, dp 8): far less exposed sync
    flat = estimate(model, FSDP, cluster, Strategy(tp=8, pp=1, dp=8, zero_stage=3, micro_batch_size=1, recompute="full"))
    assert est.breakdown_s["dp_comm_exposed"] < 0.25 * flat.breakdown_s["dp_comm_exposed"]


def test_shard_grad_op_without_a_pipeline_pays_a_gather_every_microbatch():
    model = get_preset("llama3-8b")
    cluster = simple_cluster("H100-SXM5-80GB", 1)
    one = estimate(model, Training(global_batch_size=8, sequence_length=8192, framework="fsdp"), cluster,
                   Strategy(dp=8, zero_stage=2, micro_batch_size=1, recompute="full"))
    four = estimate(model, Training(global_batch_size=32, sequence_length=8192, framework="fsdp"), cluster,
                    Strategy(dp=8, zero_stage=2, micro_batch_size=1, recompute="full"))
    # per micro-batch everything repeats: four micro-batches cost four times one, to within the
    # optimizer step that runs once
    per_mb = one.step_time_s - one.breakdown_s["optimizer"]
    assert four.step_time_s - four.breakdown_s["optimizer"] == pytest.approx(4 * per_mb, rel=1e-6)


def test_unsharded_fsdp_all_reduces_every_microbatch_without_a_pipeline():
    """torchtitan's ZeRO 0 is fully_shard over a (replicate, shard 1) mesh and its trainer keeps
    gradient sync on through gradient accumulation: every micro-batch all-reduces (2R), where
    Megatron-Core's DDP all-reduces once a step.  With a pipeline the sync is deferred to the
    step; either way each micro-batch adds its gradients into the whole fp32 gradient."""
    links = Links.for_group(simple_cluster("H100-SXM5-80GB", 4).node_groups[0])
    params = 2e9
    assert fsdp_reduces_each_microbatch(FSDP, 0, 1) and not fsdp_reduces_each_microbatch(FSDP, 0, 4)
    assert not fsdp_reduces_each_microbatch(MEGATRON, 0, 1) and not fsdp_reduces_each_microbatch(FSDP, 3, 1)
    assert fsdp_accumulates_in_fp32(FSDP, 0, 1) and fsdp_accumulates_in_fp32(FSDP, 0, 4) and fsdp_accumulates_in_fp32(FSDP, 3, 4)
    assert not fsdp_accumulates_in_fp32(FSDP, 3, 1) and not fsdp_accumulates_in_fp32(MEGATRON, 0, 4)
    each = dp_gradient_comm_s(params, FSDP, _S(dp=32), links)
    ddp = dp_gradient_comm_s(params, MEGATRON, _S(dp=32), links)
    assert float(each[0][0]) == 0.0 and float(each[3][0]) == 0.0
    assert float(ddp[0][0]) > 0.0 and float(ddp[1][0]) == 0.0
    # with a pipeline the same all-reduce runs once a step
    piped = dp_gradient_comm_s(params, FSDP, _S(dp=32, pp=4), links)
    assert float(piped[1][0]) == 0.0 and float(piped[0][0]) == pytest.approx(float(each[1][0]))
    # end to end: a DDP-style torchtitan step with 8 micro-batches moves 8 all-reduces, where
    # Megatron-Core's moves one whatever the accumulation
    model = get_preset("llama2-7b")
    cluster = simple_cluster("H100-SXM5-80GB", 32)
    s = Strategy(dp=16, tp=2, micro_batch_size=1, recompute="full")
    exposed = {}
    for fw in ("fsdp", "megatron-core"):
        for gbs in (16, 128):
            est = estimate(model, Training(global_batch_size=gbs, sequence_length=2048, framework=fw), cluster, s)
            exposed[fw, gbs] = est.breakdown_s["dp_comm_exposed"]
    assert exposed["fsdp", 128] > 4 * exposed["fsdp", 16] > 0
    assert exposed["megatron-core", 128] == pytest.approx(exposed["megatron-core", 16], rel=0.05)
