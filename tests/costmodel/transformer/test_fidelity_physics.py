"""The physics added for fidelity beyond the Megatron-LM runs (issue 13): framework,
ZeRO-3/FSDP collectives, message size and fabric, FP8, intervals — one test per formula."""

from dataclasses import replace

import numpy as np
import pytest

from cost_model import Strategy, Training, estimate, simple_cluster
from cost_model.comm import Links, allreduce_time_s, size_factor
from cost_model.errors import InvalidStrategy, InvalidTraining
from cost_model.result import StageEstimate
from cost_model.training import training_from_dict
from cost_model.transformer.calibration import PRIORS, Constants, calibrated_device, prediction_intervals, using
from cost_model.transformer.layer_cost import (
    StrategyArrays,
    activation_bytes,
    core_attention_recompute_frees,
    deepspeed_gather_copy_out_s,
    sharded_collectives_per_layer,
    sharded_microbatch_exposed_s,
    sharded_passes_per_microbatch,
)
from cost_model.transformer.spec import get_preset
from helpers.collectives import sharded_step_comm_s

GPT3 = get_preset("gpt3-175b")


def test_framework_is_parsed_and_part_of_the_request():
    t = training_from_dict({"global_batch_size": 8, "sequence_length": 2048, "framework": "megatron-deepspeed"})
    assert t.framework == "megatron-deepspeed" and t.to_dict()["framework"] == "megatron-deepspeed"
    assert training_from_dict({"global_batch_size": 8, "sequence_length": 2048}).to_dict()["framework"] == "megatron-core"
    with pytest.raises(InvalidTraining) as exc:
        training_from_dict({"global_batch_size": 8, "sequence_length": 2048, "framework": "jax"})
    assert exc.value.field == "training.framework"


@pytest.mark.parametrize(
    ("framework", "strategy", "field"),
    [
        ("megatron-deepspeed", Strategy(dp=2, tp=2, pp=2, vpp=2, micro_batch_size=1), "strategy.vpp"),
        ("deepspeed", Strategy(dp=2, tp=1, pp=2, cp=4, micro_batch_size=1), "strategy.cp"),  # Ulysses: no pipeline
        ("megatron-deepspeed", Strategy(dp=2, tp=2, cp=2, micro_batch_size=1), "strategy.cp"),  # nor Megatron's TP
        ("deepspeed", Strategy(dp=1, tp=1, cp=64, micro_batch_size=1), "strategy.cp"),  # a2a: 32 heads over 64 ranks
        ("deepspeed", Strategy(dp=4, tp=2, micro_batch_size=1), "strategy.tp"),
        ("fsdp", Strategy(dp=8, micro_batch_size=1, zero_stage=1), "strategy.zero_stage"),
    ],
)
def test_framework_rules_name_the_field(framework, strategy, field):
    training = Training(global_batch_size=64, sequence_length=2048, framework=framework)
    with pytest.raises(InvalidStrategy) as exc:
        estimate(get_preset("gpt3-1.3b"), training, simple_cluster("A100-SXM4-80GB", 1), strategy)
    assert exc.value.field == field


def test_fsdp_runs_gradient_sharding_with_a_pipeline_megatron_does_not():
    model = get_preset("llama2-7b")  # untied: torchtitan's pipeline cannot tie embedding and head
    s = Strategy(dp=4, pp=2, micro_batch_size=1, zero_stage=2)
    est = estimate(model, Training(global_batch_size=64, sequence_length=2048, framework="fsdp"), simple_cluster("A100-SXM4-80GB", 1), s)
    assert est.step_time_s > 0
    with pytest.raises(InvalidStrategy):
        estimate(model, Training(global_batch_size=64, sequence_length=2048), simple_cluster("A100-SXM4-80GB", 1), s)


def _links(nodes_fabric="infiniband"):
    c = simple_cluster("A100-SXM4-80GB", 4, fabric=nodes_fabric)
    return Links.for_group(c.node_groups[0])


def test_zero3_exposed_traffic_does_not_fall_with_dp():
    """Per GPU a ZeRO-3 micro-batch moves ≈ 3× the whole layer state whatever dp is, and the
    n−1 ring steps of every gather add latency as dp grows."""
    links = _links()
    layer = GPT3.decoder_layer_params()
    t = Training(global_batch_size=1536, sequence_length=2048, framework="deepspeed")
    times = []
    for dp in (384, 768, 1536):
        S = StrategyArrays.from_strategies([Strategy(dp=dp, zero_stage=3)])
        times.append(float(sharded_step_comm_s(layer, 96, t, S, links, sharded_collectives_per_layer(GPT3, "deepspeed"))[0]))
    assert times[0] <= times[1] <= times[2]
    # bandwidth floor: three passes over 2 bytes per parameter at the ring bus bandwidth
    assert times[0] > 3 * 96 * layer * 2 / (links.intra_GBps * 1e9)


def test_deepspeed_gathers_per_tensor_fsdp_per_unit():
    assert sharded_collectives_per_layer(GPT3, "deepspeed") == 5  # 4 matrices + 1 coalesced bucket of biases and norms
    assert sharded_collectives_per_layer(GPT3, "fsdp") == 1


def test_deepspeed_tensor_list_gather_copies_out_once_per_rank_fsdp_gathers_in_place():
    """DeepSpeed's stage 3 gathers into a list of per-rank views: PyTorch copies NCCL's flat
    output into each, n launch-bound copies per gathered tensor plus the bytes once more
    through HBM — a cost that grows with the dp size; FSDP's in-place gather has none."""
    from cost_model.devices import get_device

    dev = get_device("A100-SXM4-80GB")
    layer = GPT3.decoder_layer_params()
    t = Training(global_batch_size=1536, sequence_length=2048, framework="deepspeed")
    S = StrategyArrays.from_strategies([Strategy(dp=dp, zero_stage=3) for dp in (1, 384, 768, 1536)])
    out = deepspeed_gather_copy_out_s(layer, 96, t, S, dev, 5, 3.0)
    assert out[0] == 0.0  # nothing gathered
    eff = dev.efficiency
    hbm = 2 * layer * 2 / (dev.memory_bandwidth_GBps * 1e9 * eff.memory_fraction)
    for n, got in zip((384, 768, 1536), out[1:], strict=True):
        assert got == pytest.approx(3 * 96 * (5 * n * eff.kernel_overhead_s + hbm))
    assert out[3] - out[2] == pytest.approx(2 * (out[2] - out[1]))  # linear in n
    assert not deepspeed_gather_copy_out_s(layer, 96, replace(t, framework="fsdp"), S, dev, 1, 2.0).any()


def test_deepspeed_stage3_gathers_again_for_a_recomputed_forward_fsdp_does_not():
    """DeepSpeed's per-submodule fetch/release hooks fire in the activation checkpoint's
    recomputed forward: 3 all-gathers + 1 reduce-scatter per recomputed layer; FSDP's unit is
    unsharded once for backward (recompute inside it), selective recompute re-runs no weights."""
    model = get_preset("gpt3-1.3b")  # 24 layers: the block method's first 12 are half of them
    S = StrategyArrays.from_strategies(
        [Strategy(dp=8, zero_stage=3, recompute=r) for r in ("none", "selective", "full")]
        + [Strategy(dp=8, zero_stage=3, recompute="full", recompute_num_layers=12)]
    )
    assert list(sharded_passes_per_microbatch(model, "deepspeed", S)) == [3.0, 3.0, 4.0, 3.5]
    assert list(sharded_passes_per_microbatch(model, "megatron-deepspeed", S)) == [3.0, 3.0, 4.0, 3.5]
    assert list(np.broadcast_to(sharded_passes_per_microbatch(model, "fsdp", S), 4)) == [3.0, 3.0, 3.0, 3.0]
    links = _links()
    t = Training(global_batch_size=64, sequence_length=2048, framework="deepspeed")
    one = StrategyArrays.from_strategies([Strategy(dp=32, zero_stage=3)])
    layer = GPT3.decoder_layer_params()
    three = float(sharded_step_comm_s(layer, 96, t, one, links, 5, bandwidth_messages=4)[0])
    four = float(sharded_step_comm_s(layer, 96, t, one, links, 5, bandwidth_messages=4, passes=4.0)[0])
    assert four == pytest.approx(4.0 / 3.0 * three)
    # the extra gather runs in the backward phase: the forward still hides one pass of four
    with using(Constants({**PRIORS, "overlap_compute_slowdown": 0.0})):
        assert float(sharded_microbatch_exposed_s(4.0, 3, 0.0, 100.0, 1.0, passes=4.0)) == pytest.approx(1.0)


def test_deepspeed_zero3_with_full_recompute_pays_the_regather_in_the_step():
    """Without overlap the exposed traffic is all of it: under DeepSpeed full recompute moves
    4 passes over the decoder layers where selective moves 3 (the embedding and head units, not
    checkpointed, 3 either way); under FSDP both move 3."""
    model = get_preset("gpt3-1.3b")
    cluster = simple_cluster("A100-SXM4-80GB", 4)

    def dp_exposed(framework, recompute):
        t = Training(global_batch_size=32, sequence_length=2048, framework=framework, grad_reduce_overlap=False)
        s = Strategy(dp=32, micro_batch_size=1, zero_stage=3, recompute=recompute)
        return estimate(model, t, cluster, s).breakdown_s["dp_comm_exposed"]

    # the difference is one more gather of every decoder layer: its collectives and its copy-out
    from cost_model.devices import get_device
    from cost_model.transformer.stage_cost import stage_params

    S = StrategyArrays.from_strategies([Strategy(dp=32, micro_batch_size=1, zero_stage=3)])
    dense, experts = stage_params(model, S, model.num_layers, True, True)
    per_unit = (dense + experts) / (model.num_layers + 2)
    t = Training(global_batch_size=32, sequence_length=2048, framework="deepspeed", grad_reduce_overlap=False)
    k = sharded_collectives_per_layer(model, "deepspeed")
    one_gather = sharded_step_comm_s(per_unit, model.num_layers, t, S, Links.for_group(cluster.node_groups[0]), k,
                                     bandwidth_messages=k - 1, passes=1.0) + deepspeed_gather_copy_out_s(
        per_unit, model.num_layers, t, S, get_device("A100-SXM4-80GB"), k, 1.0)
    extra = dp_exposed("deepspeed", "full") - dp_exposed("deepspeed", "selective")
    assert extra == pytest.approx(float(one_gather[0]), rel=1e-3)
    assert dp_exposed("fsdp", "full") == pytest.approx(dp_exposed("fsdp", "selective"), rel=1e-6)


def test_zero3_step_flat_in_dp_at_fixed_global_batch_once_communication_bound():
    """Narayanan 2021 Table 2: ZeRO-3 at fixed global batch — doubling dp halves the compute
    per GPU but not the gathers, so the step falls far less than 2×."""
    t = Training(global_batch_size=1536, sequence_length=2048, framework="deepspeed", attention="unfused", dtype="fp16")
    steps = []
    for dp, mbs in ((768, 2), (1536, 1)):
        c = simple_cluster("A100-SXM4-80GB", dp // 8)
        steps.append(estimate(GPT3, t, c, Strategy(dp=dp, micro_batch_size=mbs, zero_stage=3, recompute="full")).step_time_s)
    assert steps[1] > 0.7 * steps[0]


def test_sharded_traffic_hides_phase_by_phase_and_slows_what_it_overlaps():
    """ZeRO-3: a third of a micro-batch's traffic (the forward gathers) hides under the
    forward, the rest under the backward; the hidden part costs ``overlap_compute_slowdown``
    of itself; communication-bound, the micro-batch takes ≈ its traffic whatever its compute."""
    with using(Constants({**PRIORS, "overlap_compute_slowdown": 0.0})):
        # compute-bound in both phases: nothing exposed
        assert float(sharded_microbatch_exposed_s(3.0, 3, 2.0, 4.0, 1.0)) == pytest.approx(0.0)
        # forward exposed by 1 − 0.5, backward hidden: the phases do not pool their windows
        assert float(sharded_microbatch_exposed_s(3.0, 3, 0.5, 10.0, 1.0)) == pytest.approx(0.5)
        # communication-bound: compute + exposed = the traffic, whatever the compute
        for fwd in (0.2, 0.4):
            assert fwd + 2 * fwd + float(sharded_microbatch_exposed_s(6.0, 3, fwd, 2 * fwd, 1.0)) == pytest.approx(6.0)
        # ZeRO-2: the per-micro-batch reduce-scatter runs under the backward alone
        assert float(sharded_microbatch_exposed_s(3.0, 2, 10.0, 1.0, 1.0)) == pytest.approx(2.0)
    with using(Constants({**PRIORS, "overlap_compute_slowdown": 0.2})):
        assert float(sharded_microbatch_exposed_s(3.0, 3, 2.0, 4.0, 1.0)) == pytest.approx(0.2 * 3.0)


def test_bus_bandwidth_grows_with_message_size():
    assert size_factor(1e3, 512e3) < size_factor(1e6, 512e3) < size_factor(1e9, 512e3) < 1.0
    links = _links()
    small, large = 1e5, 1e9
    per_byte = [float(allreduce_time_s(32, s, links, 8)) / s for s in (small, large)]
    assert per_byte[0] > 2 * per_byte[1]


def test_fabric_fraction_scales_the_nics():
    ib, opa = _links("infiniband"), _links("omnipath")
    assert opa.inter_GBps == pytest.approx(ib.inter_GBps * PRIORS["fabric_fraction.omnipath"]) or opa.inter_GBps < ib.inter_GBps
    assert opa.intra_GBps == ib.intra_GBps


def test_framework_kernel_efficiency_slows_gemms():
    dev = simple_cluster("A100-SXM4-80GB", 1).node_groups[0].device
    with using(Constants({**PRIORS, "framework_gemm_efficiency.megatron-deepspeed": 0.8})):
        slow = calibrated_device(dev, "megatron-deepspeed", "bf16")
        same = calibrated_device(dev, "megatron-core", "bf16")
    assert slow.efficiency.gemm_max_fraction == pytest.approx(0.8 * dev.efficiency.gemm_max_fraction)
    assert same.efficiency.gemm_max_fraction == dev.efficiency.gemm_max_fraction


def test_fp8_speeds_up_llama_on_h100_by_less_than_the_peak_ratio():
    model = get_preset("llama3-8b")
    c = simple_cluster("H100-SXM5-80GB", 1)
    s = Strategy(dp=8, micro_batch_size=1, zero_stage=1)
    bf16 = estimate(model, Training(global_batch_size=64, sequence_length=8192), c, s).step_time_s
    fp8 = estimate(model, Training(global_batch_size=64, sequence_length=8192, dtype="fp8"), c, s).step_time_s
    assert 1.1 < bf16 / fp8 < 1.9  # attention, casts and elementwise work stay at 16-bit speed


def test_fp8_saves_linear_inputs_in_one_byte():
    model = get_preset("llama3-8b")
    S = StrategyArrays.from_strategies([Strategy(micro_batch_size=1)])
    t = Training(global_batch_size=1, sequence_length=4096)
    bf16 = float(activation_bytes(model, t, S)[0][0])
    fp8 = float(activation_bytes(model, replace(t, dtype="fp8"), S)[0][0])
    assert 0.6 * bf16 < fp8 < bf16


def test_torchao_float8_in_eager_pytorch_saves_the_16_bit_inputs():
    # torchao's Float8Linear saves input_hp (and casts it again in the backward); under
    # torch.compile the partitioner keeps the forward's FP8 cast instead, as Transformer Engine does
    model = get_preset("llama3-8b")
    S = StrategyArrays.from_strategies([Strategy(micro_batch_size=1, zero_stage=3)])
    eager = Training(global_batch_size=1, sequence_length=4096, framework="fsdp", fused_kernels=False)
    assert float(activation_bytes(model, replace(eager, dtype="fp8"), S)[0][0]) == pytest.approx(float(activation_bytes(model, eager, S)[0][0]))
    compiled = replace(eager, fused_kernels=True)
    assert float(activation_bytes(model, replace(compiled, dtype="fp8"), S)[0][0]) < float(activation_bytes(model, compiled, S)[0][0])


def test_fp8_keeps_a_fused_attentions_output_beside_the_projections_fp8_copy():
    # Llama-3-8B, one token: the projection's saved input is its FP8 copy (1 B × q width), and the
    # fused attention's own 16-bit output stays too — unless a selective recompute of the
    # attention core discards it; in 16 bits the two are one tensor, and that recompute frees nothing.
    model = get_preset("llama3-8b")
    t = Training(global_batch_size=1, sequence_length=1)
    none, sel = (StrategyArrays.from_strategies([Strategy(micro_batch_size=1, recompute=r)]) for r in ("none", "selective"))
    q = model.q_size
    fp8 = replace(t, dtype="fp8")
    assert float(activation_bytes(model, fp8, none)[0][0]) - float(activation_bytes(model, fp8, sel)[0][0]) == pytest.approx(2.0 * q)
    assert float(activation_bytes(model, t, none)[0][0]) == pytest.approx(float(activation_bytes(model, t, sel)[0][0]))
    # the running set holds it either way; the search tries selective recompute where it frees something
    assert float(activation_bytes(model, fp8, sel)[1][0]) == pytest.approx(float(activation_bytes(model, fp8, none)[1][0]))
    assert core_attention_recompute_frees(fp8) and core_attention_recompute_frees(replace(t, attention="unfused"))
    assert not core_attention_recompute_frees(t)


def test_estimate_carries_intervals_around_the_point():
    est = estimate(get_preset("gpt3-1.3b"), Training(global_batch_size=64, sequence_length=2048), simple_cluster("A100-SXM4-80GB", 1), Strategy(dp=8, micro_batch_size=2))
    d = est.to_dict()
    assert d["peak_memory_GB_p10"] < max(est.peak_memory_GB) < d["peak_memory_GB_p90"]
    if d["step_time_s_p10"] is not None:
        assert d["step_time_s_p10"] <= d["step_time_s_p90"]
        assert d["interval_regime"]


def _stage(peak_GB: float) -> StageEstimate:
    """A one-stage result peaking at ``peak_GB`` (a fifth of it the fragmentation reserve)."""
    return StageEstimate(index=0, first_layer=0, last_layer=0, device="d", node_group="g", has_embedding=True, has_head=True,
                         forward_s=1.0, backward_s=2.0, peak_memory_GB=peak_GB, memory_capacity_GB=80.0,
                         memory_GB={"weights": 0.6 * peak_GB, "workspace": 1.5 + 0.2 * peak_GB})


def test_interval_bounds_are_the_swapped_error_quantiles():
    with using(Constants(dict(PRIORS), {"*": (-0.1, 0.2)})):
        iv = prediction_intervals("megatron-core", "ampere", 10.0, _stage(50.0))
    assert iv["step_time_s_p10"] == pytest.approx(10.0 / np.exp(0.2))
    assert iv["step_time_s_p90"] == pytest.approx(10.0 / np.exp(-0.1))
    assert iv["interval_regime"] == "*"


def test_deepspeed_pipeline_engine_pays_a_fixed_cost_per_checkpointed_layer_and_microbatch():
    model = get_preset("gpt3-1.3b")  # 24 layers
    c = simple_cluster("A100-SXM4-80GB", 1)

    def extra(pp: int, **knobs: object) -> float:
        s = Strategy(dp=8 // (2 * pp), tp=2, pp=pp, micro_batch_size=1, zero_stage=1, **knobs)
        core = estimate(model, Training(global_batch_size=64, sequence_length=2048), c, s)
        mds = estimate(model, Training(global_batch_size=64, sequence_length=2048, framework="megatron-deepspeed"), c, s)
        return float(mds.breakdown_s["pp_comm"] - core.breakdown_s["pp_comm"])

    with using(Constants({**PRIORS, "pipeline_layer_overhead_s.megatron-deepspeed": 0.004})):
        # pp 2: 32 micro-batches through the bottleneck stage of 12 layers, each layer 4 ms more;
        # pp 4: 64 micro-batches (dp 1) through 6 layers — the same per-step total, spread thinner
        assert extra(2, recompute="full") == pytest.approx(32 * 12 * 0.004, rel=1e-6)
        assert extra(4, recompute="full") == pytest.approx(64 * 6 * 0.004, rel=1e-6)
        # the cost is the checkpoint's: selective checkpoints every layer's attention core;
        # without recompute no layer is checkpointed
        assert extra(2, recompute="selective") == pytest.approx(32 * 12 * 0.004, rel=1e-6)
        assert extra(2, recompute="none") == 0.0


def test_deepspeed_stage3_hooks_stretch_compute_only_under_zero3():
    model = get_preset("gpt3-1.3b")
    c = simple_cluster("A100-SXM4-80GB", 1)
    out = {}
    with using(Constants({**PRIORS, "sharded_compute_efficiency.megatron-deepspeed": 0.8})):
        for fw in ("deepspeed", "fsdp"):
            for zero in (2, 3):
                s = Strategy(dp=8, micro_batch_size=1, zero_stage=zero)
                e = estimate(model, Training(global_batch_size=64, sequence_length=2048, framework=fw), c, s)
                out[fw, zero] = e.breakdown_s["compute"]
    with using(Constants(dict(PRIORS))):
        base = {zero: estimate(model, Training(global_batch_size=64, sequence_length=2048, framework="deepspeed"), c,
                               Strategy(dp=8, micro_batch_size=1, zero_stage=zero)).breakdown_s["compute"] for zero in (2, 3)}
    assert out["deepspeed", 3] == pytest.approx(base[3] / 0.8, rel=1e-6)  # the hooks: 1/0.8 of the compute time
    assert out["deepspeed", 2] == pytest.approx(base[2], rel=1e-6)  # no stage-3 hooks at ZeRO-2
    assert out["fsdp", 3] == pytest.approx(out["fsdp", 2], rel=1e-6)  # FSDP's flat units: no per-module hooks


def test_misaligned_head_dim_runs_the_attention_gemms_slower():
    from cost_model.comm import Links
    from cost_model.transformer.layer_cost import layer_costs
    from cost_model.transformer.spec import TransformerSpec

    c = simple_cluster("A100-SXM4-80GB", 1)
    t = Training(global_batch_size=1, sequence_length=2048, attention="unfused")
    S = StrategyArrays.from_strategies([Strategy(micro_batch_size=1)])
    links = Links.for_group(c.node_groups[0])
    per_flop = []
    for heads in (128, 123):  # head dim 108 (misaligned) vs 112 at h = 13824 / 13776
        h = heads * (108 if heads == 128 else 112)
        m = TransformerSpec("x", 1, h, heads, heads, 4 * h, 50000, bias=True)
        lc = layer_costs(m, t, c.node_groups[0].device, links, S)
        per_flop.append(float(lc.forward_compute_s[0] / lc.model_flops[0]))
    assert per_flop[0] > 1.05 * per_flop[1]


def test_deepspeed_caps_the_gathered_parameters_fsdp_holds_two_units():
    c = simple_cluster("A100-SXM4-80GB", 8)
    s = Strategy(dp=64, micro_batch_size=1, zero_stage=3, recompute="full")
    mem = {}
    for fw in ("deepspeed", "fsdp"):
        est = estimate(GPT3, Training(global_batch_size=64, sequence_length=2048, framework=fw), c, s)
        mem[fw] = est.stages[0].memory_GB["activations"]
    # two gathered 1.8B-parameter layers (7.2 GB) vs stage3_max_live_parameters = 1e9 (2 GB);
    # FSDP also holds one layer's unsharded bf16 gradients and their fp32 reduce-scatter input
    # (2 + 4 B a parameter) in backward, DeepSpeed reduces its gradients through the buckets
    layer = GPT3.decoder_layer_params()
    assert mem["fsdp"] - mem["deepspeed"] == pytest.approx(((2 * layer - 1e9) * 2 + layer * (2 + 4)) / 1e9, rel=1e-6)


def test_deepspeed_engine_accumulates_gradients_in_a_pass_per_microbatch():
    """AccumulateGrad: 6 bytes per parameter per micro-batch through HBM in 16-bit training (the
    ZeRO optimizer's fp16 path); bf16 at stage ≤ 1 runs BF16_Optimizer, which also zeroes the
    bf16 gradients and adds them into its fp32 buffer through a 4-byte cast: 26 bytes and three
    kernels per tensor.  Megatron-Core fuses the accumulation into the wgrad GEMM (0)."""
    from cost_model.transformer.stage_cost import (
        BF16_OPTIMIZER_ACCUMULATION_BYTES_PER_PARAM,
        GRAD_ACCUMULATION_BYTES_PER_PARAM,
        grad_accumulation_s,
    )

    dev = simple_cluster("A100-SXM4-80GB", 1).node_groups[0].device
    S = StrategyArrays.from_strategies([Strategy(tp=4, pp=12, dp=8, zero_stage=1)])
    params = 3.7e9  # BLOOM-176B over tp·pp = 48
    rate = dev.memory_bandwidth_GBps * 1e9 * dev.efficiency.memory_fraction
    launch = dev.efficiency.kernel_overhead_s
    fp16 = Training(global_batch_size=2048, sequence_length=2048, framework="megatron-deepspeed", dtype="fp16")
    ds = float(grad_accumulation_s(params, fp16, dev, S, 72)[0])
    assert ds == pytest.approx(params * GRAD_ACCUMULATION_BYTES_PER_PARAM["fp16"] / rate + 72 * launch, rel=1e-6)  # one add per tensor
    bf16 = replace(fp16, dtype="bf16", grad_accum_dtype="fp32")
    assert BF16_OPTIMIZER_ACCUMULATION_BYTES_PER_PARAM == 26.0
    assert float(grad_accumulation_s(params, bf16, dev, S, 72)[0]) == pytest.approx(params * 26.0 / rate + 3 * 72 * launch, rel=1e-6)
    S2 = StrategyArrays.from_strategies([Strategy(dp=8, zero_stage=2)])  # the ZeRO optimizer again
    assert float(grad_accumulation_s(params, bf16, dev, S2, 72)[0]) == pytest.approx(ds, rel=1e-6)
    # bf16 accumulation at stage 1 (DeepSpeed's own default without data_types) is its ZeRO optimizer
    assert float(grad_accumulation_s(params, replace(bf16, grad_accum_dtype="bf16"), dev, S, 72)[0]) == pytest.approx(ds, rel=1e-6)
    assert float(grad_accumulation_s(params, replace(bf16, grad_accum_dtype=None), dev, S, 72)[0]) == pytest.approx(ds, rel=1e-6)
    assert float(grad_accumulation_s(params, replace(bf16, framework="megatron-core"), dev, S, 72)[0]) == 0.0
    S3 = StrategyArrays.from_strategies([Strategy(dp=384, zero_stage=3)])
    assert float(grad_accumulation_s(params, replace(bf16, framework="deepspeed"), dev, S3, 72)[0]) == 0.0
    # the step's breakdown reports it as compute (work on the compute stream), not as a bubble
    c = simple_cluster("A100-SXM4-80GB", 1)
    gpt = get_preset("gpt3-1.3b")
    s = Strategy(dp=8, micro_batch_size=1, zero_stage=1, recompute="full")
    est = {fw: estimate(gpt, Training(global_batch_size=64, sequence_length=2048, framework=fw), c, s) for fw in ("megatron-deepspeed", "megatron-core")}
    assert est["megatron-deepspeed"].breakdown_s["bubble"] == 0.0
    assert est["megatron-deepspeed"].breakdown_s["compute"] > est["megatron-core"].breakdown_s["compute"]


def test_bf16_optimizer_accumulation_is_the_measured_bf16_vs_fp16_gap_of_the_bloom_sweep():
    """BLOOM's sweep ran two layouts first without, then with the BF16 optimizer (rows 068/071 and
    069/070, tp 4 pp 12 dp 8, micro-batch 2, 128 micro-batches): +5.8 s and +5.6 s a step.  The
    extra 20 bytes per parameter per micro-batch of BF16_Optimizer over the 4.1 B parameters of the
    slowest stage (9 of the 106 layers of 1.8 B, over tp 4) predict that gap: 6.5 s, within 20%."""
    from cost_model.transformer.stage_cost import grad_accumulation_s

    dev = simple_cluster("A100-SXM4-80GB", 1).node_groups[0].device
    S = StrategyArrays.from_strategies([Strategy(tp=4, pp=12, dp=8, zero_stage=1)])
    params = 9 * 12 * 12288**2 / 4
    t = Training(global_batch_size=2048, sequence_length=2048, framework="megatron-deepspeed", grad_accum_dtype="fp32")
    gap = 128 * float(grad_accumulation_s(params, t, dev, S, 100)[0] - grad_accumulation_s(params, replace(t, dtype="fp16", grad_accum_dtype=None), dev, S, 100)[0])
    assert gap == pytest.approx((118.79 - 112.69 + 116.54 - 110.96) / 2, rel=0.2)


def test_bf16_optimizer_partitions_its_fp32_state_at_stage_0_as_at_stage_1():
    """BF16_Optimizer narrows its flat bf16 groups into dp partitions whatever the ZeRO stage, so
    a DeepSpeed pipeline run at ZERO_STAGE=0 (BLOOM's setting) holds 12/dp bytes of fp32 master
    weights and moments per parameter, not 12; fp16 at stage 0 (DeepSpeed's FP16 optimizer),
    bf16 at stage 0 without a pipeline (its DDP_BFLOAT16: the FP16 optimizer in bf16) and
    Megatron-Core at stage 0 keep them whole."""
    from cost_model.transformer.layer_cost import model_state_bytes_per_param, optimizer_state_partitioned

    def states(framework: str, dtype: str, zero: int, accum: str | None = None, pp: int = 2) -> tuple[float, float, float]:
        t = Training(global_batch_size=64, sequence_length=2048, framework=framework, dtype=dtype, grad_accum_dtype=accum)
        w, g, o = model_state_bytes_per_param(t, zero, 8.0, pp)
        return float(w), float(g), float(o)

    assert states("megatron-deepspeed", "bf16", 0) == states("megatron-deepspeed", "bf16", 1, "fp32") == (2.0, 6.0, 1.5)
    assert states("deepspeed", "bf16", 0) == states("deepspeed", "bf16", 1, "fp32", pp=1) == (2.0, 6.0, 1.5)
    # DeepSpeed's default at stage 1, its ZeRO optimizer: bf16 gradients and its fp32 partition
    assert states("deepspeed", "bf16", 1) == states("deepspeed", "bf16", 1, "bf16") == (2.0, 2.0 + 4.0 / 8, 1.5)
    assert states("megatron-deepspeed", "fp16", 0)[2] == states("megatron-core", "bf16", 0)[2] == 12.0
    # without a pipeline, stage 0 under bf16 is DDP_BFLOAT16: whole fp32 state, as fp16's
    assert states("deepspeed", "bf16", 0, pp=1) == states("deepspeed", "fp16", 0, pp=1) == (2.0, 4.0, 12.0)
    ds = Training(global_batch_size=64, sequence_length=2048, framework="deepspeed")
    assert optimizer_state_partitioned(ds, np.array([0, 1, 2, 3]), 2).tolist() == [True, True, True, True]
    assert optimizer_state_partitioned(ds, np.array([0, 1, 2, 3]), 1).tolist() == [False, True, True, True]
    assert optimizer_state_partitioned(replace(ds, dtype="fp16"), np.array([0, 1]), 2).tolist() == [False, True]
    # and so does the whole estimate: stage 0 and stage 1 are the same run under BF16_Optimizer
    c = simple_cluster("A100-SXM4-80GB", 8)
    t = Training(global_batch_size=256, sequence_length=2048, framework="megatron-deepspeed", grad_accum_dtype="fp32")
    z0, z1 = (estimate(GPT3, t, c, Strategy(tp=8, pp=4, dp=2, micro_batch_size=1, recompute="full", zero_stage=z)) for z in (0, 1))
    assert z0.step_time_s == pytest.approx(z1.step_time_s, rel=1e-9)
    assert [s.peak_memory_GB for s in z0.stages] == pytest.approx([s.peak_memory_GB for s in z1.stages], rel=1e-9)


def test_bf16_optimizer_all_reduces_gradients_then_gathers_weights():
    """BF16_Optimizer's engine all-reduces the whole gradient buffer (cast to bf16) and the
    optimizer all-gathers the updated bf16 weights: 3 rings a step at stage 0 (under a pipeline)
    or 1, where DeepSpeed's fp16 path all-reduces (2 rings, stage 0) or its ZeRO-1 optimizer
    reduce-scatters and gathers (2 rings); bf16 at stage 0 without a pipeline runs the fp16 path
    (DDP_BFLOAT16)."""
    from cost_model.transformer.layer_cost import dp_gradient_comm_s

    links = Links.for_group(simple_cluster("A100-SXM4-80GB", 8).node_groups[0])
    S = StrategyArrays.from_strategies([Strategy(dp=32, pp=2, zero_stage=0), Strategy(dp=32, pp=2, zero_stage=1),
                                        Strategy(dp=32, zero_stage=0)])
    t = Training(global_batch_size=64, sequence_length=2048, framework="megatron-deepspeed", grad_accum_dtype="fp32")
    bf16 = dp_gradient_comm_s(5e9, t, S, links)[0]
    fp16 = dp_gradient_comm_s(5e9, replace(t, dtype="fp16", grad_accum_dtype=None), S, links)[0]
    assert float(bf16[0]) == pytest.approx(float(bf16[1]), rel=1e-9)
    assert float(bf16[0] / fp16[0]) == pytest.approx(1.5, rel=1e-6)
    assert float(bf16[1] / fp16[1]) == pytest.approx(1.5, rel=1e-6)
    assert float(bf16[2]) == pytest.approx(float(fp16[2]), rel=1e-9)


def test_deepspeed_gather_bandwidth_is_set_by_the_weight_matrices_not_every_tensor():
    """5 gathers per GPT layer, but the 4 matrices carry the bytes: equal 1/5 messages would
    put each ring step below NCCL's half-bandwidth chunk at dp = 1536."""
    links = _links()
    layer = GPT3.decoder_layer_params()
    t = Training(global_batch_size=1536, sequence_length=2048, framework="deepspeed")
    S = StrategyArrays.from_strategies([Strategy(dp=1536, zero_stage=3)])
    even = float(sharded_step_comm_s(layer, 96, t, S, links, 12)[0])
    by_matrix = float(sharded_step_comm_s(layer, 96, t, S, links, 12, bandwidth_messages=4)[0])
    assert by_matrix < 0.85 * even
    assert by_matrix > float(sharded_step_comm_s(layer, 96, t, S, links, 4)[0])  # 8 more latency-only gathers
    assert float(sharded_step_comm_s(layer, 96, t, S, links, 5, bandwidth_messages=4)[0]) < by_matrix


def test_a_measured_run_predicted_not_to_fit_is_a_failure_but_still_costed():
    from cost_model.cluster import cluster_from_dict
    from cost_model.validation.fidelity import evaluate_case, summarise
    from cost_model.validation.published import PublishedCase

    model = get_preset("gpt3-1.3b")
    small = {"name": "tiny", "memory_GB": 4, "memory_bandwidth_GBps": 2000, "bf16_tflops": 300, "family": "ampere"}
    cluster = cluster_from_dict({"name": "c", "node_groups": [{"name": "g", "count": 1, "gpus_per_node": 8, "device": small}]})
    t = Training(global_batch_size=64, sequence_length=2048)
    case = PublishedCase("r", "G", "S", model, t, cluster, (Strategy(dp=8, micro_batch_size=1), Strategy(dp=8, micro_batch_size=2)), 10.0, "ok", "iteration_time_s", ())
    r = evaluate_case(case)
    assert r.fits is False and r.predicted_step_s is not None and r.strategy.micro_batch_size == 1  # least memory
    assert "fit" in (r.failure or "")
    assert summarise([r])["failed_to_plan"][0]["id"] == "r"


def test_stated_interleaving_keeps_only_interleaved_depths():
    from cost_model.validation.published import all_rows

    llama = [c for c in all_rows() if c.row_id.startswith("llama3-405b")]
    assert llama and all(s.vpp > 1 for c in llama for s in c.candidates)


def test_interval_regime_falls_back_from_parallel_mix_to_framework_and_family_to_pooled():
    from cost_model.transformer.calibration import parallel_mix

    iv = {"*": (-0.3, 0.3), "megatron-core/ampere": (-0.1, 0.1), "megatron-core/ampere/pp": (-0.05, 0.02)}
    with using(Constants(dict(PRIORS), iv)):
        pp = prediction_intervals("megatron-core", "ampere", 10.0, _stage(50.0), parallel_mix(4, 1))
        dp = prediction_intervals("megatron-core", "ampere", 10.0, _stage(50.0), parallel_mix(1, 1))
        other = prediction_intervals("fsdp", "hopper", 10.0, _stage(50.0), parallel_mix(1, 3))
    assert (pp["interval_regime"], dp["interval_regime"], other["interval_regime"]) == ("megatron-core/ampere/pp", "megatron-core/ampere", "*")
    assert pp["step_time_s_p90"] == pytest.approx(10.0 / np.exp(-0.05))


def test_megatron_reduces_bf16_gradients_from_its_fp32_main_grad_buffer():
    """Megatron-Core under bf16 reduces its fp32 main gradients (4 B a value: twice fp16's
    bytes) and all-gathers its weights in bf16; the others are costed at the 16-bit dtype."""
    from cost_model.transformer.layer_cost import dp_gradient_comm_s, gradient_reduce_bytes

    def tr(framework, dtype):
        return Training(global_batch_size=64, sequence_length=2048, framework=framework, dtype=dtype)

    assert gradient_reduce_bytes(tr("megatron-core", "bf16")) == 4.0 == gradient_reduce_bytes(tr("megatron-core", "fp8"))
    assert gradient_reduce_bytes(tr("megatron-core", "fp16")) == 2.0
    assert gradient_reduce_bytes(tr("deepspeed", "bf16")) == 2.0 == gradient_reduce_bytes(tr("paddle", "bf16"))
    assert gradient_reduce_bytes(tr("fsdp", "bf16")) == 2.0 == gradient_reduce_bytes(tr("megatron-core", "fp16"))
    links = Links.for_group(simple_cluster("A100-SXM4-80GB", 8).node_groups[0])
    S = StrategyArrays.from_strategies([Strategy(dp=64, zero_stage=0), Strategy(dp=64, zero_stage=1)])
    bf16 = dp_gradient_comm_s(5e9, tr("megatron-core", "bf16"), S, links)[0]
    fp16 = dp_gradient_comm_s(5e9, tr("megatron-core", "fp16"), S, links)[0]
    assert float(bf16[0] / fp16[0]) == pytest.approx(2.0, rel=0.05)  # all-reduce of fp32 vs fp16 gradients
    assert float(bf16[1] / fp16[1]) == pytest.approx(1.5, rel=0.05)  # fp32 reduce-scatter + bf16 all-gather


def test_zero3_reduce_scatters_wider_gradients_than_it_gathers_weights():
    """Under Megatron-Core's FSDP (ZeRO-3) the per-layer reduce-scatter moves fp32 main
    gradients, the two all-gathers bf16 weights: 2 gathers + 1 double-width reduce-scatter."""
    tr = Training(global_batch_size=64, sequence_length=2048, framework="megatron-core")
    links = Links.for_group(simple_cluster("H100-SXM5-80GB", 4).node_groups[0])
    S = StrategyArrays.from_strategies([Strategy(dp=32, zero_stage=3)])
    layer = 4e8
    full = float(sharded_step_comm_s(layer, 32, tr, S, links)[0])
    gather = float(sharded_step_comm_s(layer, 32, tr, S, links, passes=1.0, reduce_scatter=False)[0])
    fp16 = float(sharded_step_comm_s(layer, 32, replace(tr, dtype="fp16"), S, links)[0])
    assert full == pytest.approx(4 * gather, rel=0.05)  # 2 gathers + a reduce-scatter of twice the bytes
    assert fp16 == pytest.approx(3 * gather, rel=0.05)
