"""MoE physics (cost_model/transformer/moe.py): each formula against an independent computation
or a limit it must reach (top-1 of 1 expert is the dense FFN, all-to-all time ∝ top-k, EP within
a node beats EP across nodes, folding conserves the FLOPs)."""

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from cost_model import Strategy, Training, estimate, simple_cluster
from cost_model.comm import Links
from cost_model.compute import gemm_fwd_bwd_time_s
from cost_model.devices import get_device
from cost_model.errors import InvalidTraining
from cost_model.training import training_from_dict
from cost_model.transformer import moe
from cost_model.transformer.layer_cost import StrategyArrays, layer_costs
from cost_model.transformer.spec import from_hf_config
from cost_model.transformer.stage_cost import device_costs, model_flops_per_step, stage_cost, stage_params

H100 = get_device("H100-SXM5-80GB")
LINKS = Links(intra_GBps=350.0, inter_GBps=44.0, gpus_per_node=8, alpha_s=8e-6)
CONFIGS = Path(__file__).with_name("hf_configs")
QWEN3_MOE = from_hf_config(json.loads((CONFIGS / "qwen3-30b-a3b.json").read_text()))


def _ffn(**kw):
    args = dict(hidden=2048.0, ffn_hidden=768.0, gated=True, num_experts=128.0, top_k=8.0, shared_ffn_hidden=0.0,
                tokens=np.array([4096.0]), tp=1.0, cp=1.0, dp=8.0, ep=8.0, sequence_parallel=np.array([False]),
                device=H100, links=LINKS, dtype="bf16", act_bytes=2.0)
    args.update(kw)
    return moe.moe_ffn_costs(**args)


def test_one_expert_top1_is_the_dense_ffn_plus_a_width1_router():
    T, h, f = 4096.0, 4096.0, 14336.0
    c = _ffn(hidden=h, ffn_hidden=f, num_experts=1.0, top_k=1.0, ep=1.0, dp=1.0, tokens=np.array([T]))
    fc1 = gemm_fwd_bwd_time_s(T, 2 * f, h, H100, "bf16")
    fc2 = gemm_fwd_bwd_time_s(T, h, f, H100, "bf16")
    router_f, router_b = moe.router_time_s(T, h, 1.0, H100, "bf16")
    assert float(c.gemm_fwd_s[0] - router_f) == pytest.approx(float(fc1[0] + fc2[0]), rel=1e-12)
    assert float(c.gemm_bwd_s[0] - router_b) == pytest.approx(float(fc1[1] + fc2[1]), rel=1e-12)
    assert float(c.flops[0]) == pytest.approx(2 * T * 3 * h * f + 2 * T * h, rel=1e-12)
    assert float(c.ep_comm_s[0]) == 0.0 and float(c.load_factor[0]) == 1.0


def test_alltoall_bandwidth_term_scales_with_top_k():
    def bw(k):
        t = moe.dispatch_time_s("alltoall", 4096.0, k, 128.0, 2048.0, 2.0, 16.0, 8.0, LINKS)
        return float(t) - 15 * LINKS.alpha_s

    assert bw(8.0) == pytest.approx(2 * bw(4.0), rel=1e-12) == pytest.approx(8 * bw(1.0), rel=1e-12)


def test_ep_inside_a_node_is_cheaper_than_across_nodes_and_deepep_dedups_the_network():
    inside = float(moe.dispatch_time_s("alltoall", 4096.0, 8.0, 128.0, 2048.0, 2.0, 8.0, 8.0, LINKS))
    across = float(moe.dispatch_time_s("alltoall", 4096.0, 8.0, 128.0, 2048.0, 2.0, 16.0, 8.0, LINKS))
    deepep = float(moe.dispatch_time_s("deepep", 4096.0, 8.0, 128.0, 2048.0, 2.0, 16.0, 8.0, LINKS))
    assert across > 3 * inside
    # 2 nodes, 64 experts each: a token reaches the other node once (P ≈ 1) instead of k/2 = 4 times.
    remote_slots = 4096 * 8 * 2048 * 2 * 0.5 / (LINKS.inter_GBps * 1e9)
    remote_tokens = 4096 * 2048 * 2 * moe.expected_nodes_hit(8.0, 128.0, 2.0) / 2 / (LINKS.inter_GBps * 1e9)
    assert across == pytest.approx(remote_slots + 15 * LINKS.alpha_s, rel=1e-9)
    assert deepep == pytest.approx(float(remote_tokens) + 2 * LINKS.alpha_s, rel=1e-9)
    assert deepep < across / 3


@pytest.mark.parametrize("k,E,nodes", [(8, 128, 2), (8, 256, 8), (1, 64, 4), (4, 16, 4), (8, 8, 1)])
def test_expected_nodes_hit_matches_exact_combinatorics(k, E, nodes):
    per = E // nodes
    exact = nodes * (1 - math.comb(E - per, k) / math.comb(E, k))
    assert float(moe.expected_nodes_hit(k, E, nodes)) == pytest.approx(exact, rel=1e-12)


@pytest.mark.parametrize("slots,ranks", [(512.0, 8), (4096.0, 16), (32768.0, 64)])
def test_dropless_load_factor_against_sampled_routing(slots, ranks):
    rng = np.random.default_rng(0)
    loads = rng.multinomial(int(slots * ranks), [1.0 / ranks] * ranks, size=4000)
    sampled = loads.max(axis=1).mean() / slots
    assert float(moe.dropless_load_factor(slots, ranks)) == pytest.approx(sampled, rel=0.01)
    assert float(moe.dropless_load_factor(slots, 1)) == 1.0
    assert float(moe.expert_load_factor(slots, ranks, capacity_factor=1.25)) == 1.25


def test_grouped_gemm_efficiency_rises_with_tokens_per_expert_and_is_weight_bound_when_few():
    m = np.array([8.0, 64.0, 256.0, 1024.0, 4096.0])
    eff = moe.grouped_gemm_efficiency(m, 1536.0, 2048.0, H100, "bf16")
    assert np.all(np.diff(eff) > 0)
    # 8 tokens: the time is streaming the weights (k·n + m·k + m·n elements) from HBM.
    bytes_ = (8 * 2048 + 2048 * 1536 + 8 * 1536) * 2
    t_mem = bytes_ / (H100.memory_bandwidth_GBps * 1e9 * H100.efficiency.memory_fraction)
    assert eff[0] == pytest.approx(2 * 8 * 1536 * 2048 / t_mem / (H100.bf16_tflops * 1e12), rel=1e-9)


def test_parallel_folding_conserves_expert_flops_and_splits_the_ranks():
    assert float(moe.expert_tensor_parallel(2, 1, 16, 32)) == 1.0  # ep 32 folded over tp 2 × dp 16
    assert float(moe.expert_tensor_parallel(2, 1, 16, 8)) == 2.0  # classic: ETP = TP
    assert float(moe.expert_tensor_parallel(4, 1, 8, 16)) == 2.0  # ep 16 over tp 4 × dp 8: EP × ETP = 32
    assert float(moe.expert_data_parallel(2, 1, 16, 32)) == 1.0
    assert float(moe.expert_data_parallel(2, 1, 16, 8)) == 2.0
    T, k, E, f = 4096.0, 8.0, 128.0, 768.0
    for tp, dp, ep in ((2, 16, 32), (2, 16, 8), (4, 8, 8), (1, 8, 8), (4, 8, 16)):
        etp = float(moe.expert_tensor_parallel(tp, 1, dp, ep))
        M = float(moe.tokens_per_expert(T, k, E, ep, etp, tp))
        assert (E / ep) * M * f / etp == pytest.approx(T * k * f / tp, rel=1e-12)


def test_folding_drops_the_expert_tp_collective_and_a_wide_etp_pays_k_times_the_dense_volume():
    sp = np.array([True])
    classic = _ffn(tp=2.0, dp=16.0, ep=8.0, sequence_parallel=sp)
    folded = _ffn(tp=2.0, dp=16.0, ep=32.0, sequence_parallel=sp)
    assert float(folded.ffn_tp_one_s[0]) == 0.0 < float(classic.ffn_tp_one_s[0])


def test_router_and_permutation_bytes():
    f1, _ = moe.router_time_s(4096.0, 2048.0, 64.0, H100, "bf16")
    f2, _ = moe.router_time_s(4096.0, 2048.0, 128.0, H100, "bf16")
    assert f2 > f1 > 0
    fwd, bwd = moe.permute_bytes(4096.0, 8.0, 4096.0 * 8.0, 2048.0, 2.0, 1.0)
    slots = 4096 * 8 * 2048 * 2
    assert float(fwd) == pytest.approx(2 * slots + (slots + 4096 * 2048 * 2) + 4 * slots, rel=1e-12)
    assert float(bwd) == pytest.approx(float(fwd) + 2 * slots, rel=1e-12)


def _layer(model, training, strategies, links=LINKS):
    return layer_costs(model, training, H100, links, StrategyArrays.from_strategies(strategies))


def test_layer_flops_are_six_times_active_matmul_params_plus_attention():
    tr = Training(global_batch_size=8, sequence_length=4096)
    s = 4096.0
    per_token = QWEN3_MOE.matmul_params_per_token()
    lc = _layer(QWEN3_MOE, tr, [Strategy(dp=8, ep=8)])
    attn = 4 * s * s * QWEN3_MOE.num_heads * QWEN3_MOE.head_dim
    assert float(lc.model_flops[0]) == pytest.approx(3 * (2 * s * per_token + attn), rel=1e-12)
    # the same identity per step (embedding head included), and per token ≈ 6 × active params
    step = model_flops_per_step(QWEN3_MOE, tr) / (8 * s)
    non_attn = step - 3 * 4 * QWEN3_MOE.attention_core_width(s) * QWEN3_MOE.num_layers
    assert non_attn == pytest.approx(6 * (QWEN3_MOE.active_params() - QWEN3_MOE.embedding_params()), rel=0.01)


def test_moe_layer_a2a_grows_when_ep_leaves_the_node():
    tr = Training(global_batch_size=64, sequence_length=4096)
    lc = _layer(QWEN3_MOE, tr, [Strategy(dp=8, ep=8), Strategy(dp=16, ep=16)])
    assert lc.ep_comm_s[1] > 3 * lc.ep_comm_s[0] > 0
    overlap = _layer(QWEN3_MOE, replace(tr, moe_comm_overlap=True), [Strategy(dp=8, ep=8)])
    assert overlap.ep_comm_s[0] < lc.ep_comm_s[0]


def test_moe_vs_equivalent_active_dense_model_is_a_plausible_ratio():
    """128 experts top-8 against a dense model with the same attention and a k·f-wide FFN (the same
    active FFN FLOPs): the extra is routing, permutation, small-M expert GEMMs and the intra-node
    all-to-all, not a multiple."""
    tr = Training(global_batch_size=256, sequence_length=4096)
    cl = simple_cluster("H100-SXM5-80GB", 1)
    m = estimate(QWEN3_MOE, tr, cl, Strategy(dp=8, ep=8, zero_stage=1)).step_time_s
    dense = replace(QWEN3_MOE, num_experts=1, experts_per_token=1, ffn_hidden_size=8 * QWEN3_MOE.ffn_hidden_size, name="dense")
    d = estimate(dense, tr, cl, Strategy(dp=8, zero_stage=1)).step_time_s
    assert 1.1 < m / d < 2.0


def test_expert_state_under_ep_and_the_distributed_optimizer_over_edp():
    tr = Training(global_batch_size=64, sequence_length=4096)
    strategies = [Strategy(dp=8, ep=1, zero_stage=1), Strategy(dp=8, ep=8, zero_stage=1), Strategy(dp=16, ep=8, zero_stage=1)]
    S = StrategyArrays.from_strategies(strategies)
    dc = device_costs(QWEN3_MOE, tr, H100, LINKS, S)
    st = stage_cost(QWEN3_MOE, tr, dc, S, QWEN3_MOE.num_layers, 0, True, True, 8, False)
    experts = QWEN3_MOE.routed_expert_params_per_layer() * QWEN3_MOE.num_layers
    # ep 1 → 8 divides the expert weights by 8; EDP 8 → 1 leaves their Adam state unsharded.
    w_drop = st.weights_bytes[0] - st.weights_bytes[1]
    assert w_drop == pytest.approx(2 * experts * (1 - 1 / 8), rel=1e-9)
    dense, _ = stage_params(QWEN3_MOE, S, QWEN3_MOE.num_layers, True, True)
    dense_drop = 12 * dense[1] * (1 / 8 - 1 / 16)
    assert st.optimizer_state_bytes[1] - st.optimizer_state_bytes[2] == pytest.approx(12 * experts / 8 * (1 - 1 / 2) + dense_drop, rel=1e-9)


def test_training_knobs_are_validated_with_the_field():
    t = training_from_dict({"global_batch_size": 8, "sequence_length": 128, "moe_token_dispatcher": "deepep"})
    assert t.moe_token_dispatcher == "deepep" and t.to_dict()["moe_token_dispatcher"] == "deepep"
    t = training_from_dict({"global_batch_size": 8, "sequence_length": 128, "moe_capacity_factor": 1.5})
    assert t.moe_capacity_factor == 1.5
    assert "cp_comm_type" not in t.to_dict()  # defaults are not written (request hashes stay)
    with pytest.raises(InvalidTraining) as e:
        training_from_dict({"global_batch_size": 8, "sequence_length": 128, "moe_token_dispatcher": "nccl"})
    assert e.value.field == "training.moe_token_dispatcher"
    with pytest.raises(InvalidTraining) as e:
        training_from_dict({"global_batch_size": 8, "sequence_length": 128, "moe_capacity_factor": 0.5})
    assert e.value.field == "training.moe_capacity_factor"


# ---- MLA (DeepSeek-V3) -------------------------------------------------------------------------

DEEPSEEK_V3 = from_hf_config(json.loads((CONFIGS / "deepseek-v3.json").read_text()))


def _mla_shapes(tp, sp, T=4096.0):
    from cost_model.transformer import mla

    m = DEEPSEEK_V3
    return mla.mla_projection_shapes(hidden=m.hidden_size, heads=m.num_heads, q_lora_rank=m.q_lora_rank, kv_lora_rank=m.kv_lora_rank,
                                     nope_dim=m.head_dim, rope_dim=m.qk_rope_head_dim, v_dim=m.v_head_dim, tokens=np.array([T]),
                                     tp=np.array([float(tp)]), sequence_parallel=np.array([sp]))


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_mla_projection_gemms_carry_exactly_the_model_flops_under_sequence_parallelism(tp):
    from cost_model.transformer import mla

    T = 4096.0
    per_gpu = float(mla.mla_projection_flops(_mla_shapes(tp, True, T))[0])
    assert tp * per_gpu == pytest.approx(2 * T * DEEPSEEK_V3.qkv_weights(), rel=1e-12)
    if tp > 1:  # without SP every TP rank repeats the duplicated down-projections
        assert float(mla.mla_projection_flops(_mla_shapes(tp, False, T))[0]) > per_gpu


def test_deepseek_v3_flops_per_token_are_six_times_active_params_plus_attention():
    s = 4096
    tr = Training(global_batch_size=1, sequence_length=s)
    # the main model (its MTP module's FLOPs: test_hf_configs.test_mtp_modules_are_costed_on_the_last_stage)
    m = replace(DEEPSEEK_V3, mtp_layers=0)
    per_token = model_flops_per_step(m, tr) / s
    # MLA attention core: a heads × ((nope + rope) + v)/2 × s keys per query, 4 FLOPs each
    attn = 3 * 4 * m.num_layers * m.num_heads * ((m.head_dim + m.qk_rope_head_dim) + m.v_head_dim) / 2 * s
    assert per_token == pytest.approx(6 * (m.active_params() - m.embedding_params()) + attn, rel=1e-3)


def test_mla_stores_its_latents():
    from cost_model.transformer.layer_cost import activation_bytes

    tr = Training(global_batch_size=1, sequence_length=4096)
    S = StrategyArrays.from_strategies([Strategy(tp=8, dp=8, ep=8, sequence_parallel=True)])
    with_latents, _, _ = activation_bytes(DEEPSEEK_V3, tr, S)
    plain, _, _ = activation_bytes(replace(DEEPSEEK_V3, q_lora_rank=0, kv_lora_rank=0, qk_rope_head_dim=0, v_head_dim=0,
                                        num_kv_heads=DEEPSEEK_V3.num_heads), tr, S)
    assert float(with_latents[0]) > float(plain[0])


def test_zero3_gathers_expert_weights_over_their_edp_replicas_only():
    from cost_model.comm import reduce_scatter_time_s
    from cost_model.transformer.calibration import current
    from helpers.collectives import sharded_step_comm_s

    tr = Training(global_batch_size=64, sequence_length=4096)
    S = StrategyArrays.from_strategies([Strategy(dp=16, ep=8, zero_stage=3)])
    whole_dp = float(sharded_step_comm_s(1e8, 48, tr, S, LINKS)[0])
    edp = moe.expert_data_parallel(S.tp, S.cp, S.dp, S.ep)
    over_edp = float(sharded_step_comm_s(1e8, 48, tr, S, LINKS, ranks=edp, stride=S.ep)[0])
    # 2 replicas 8 ranks apart sit on two nodes: one NIC each (44 GB/s) instead of the 16-rank
    # ring's NVLink + 8 NICs, so fewer bytes but a slower ring
    # ring, bf16 weights gathered twice and the fp32 main gradients reduce-scattered once
    # (layer_cost.gradient_reduce_bytes)
    eff = current().get("sharded_collective_efficiency")

    def one(bytes_per_value):
        t = float(np.ravel(reduce_scatter_time_s(2.0, 1e8 * bytes_per_value, LINKS, 1.0))[0])
        return (t - LINKS.alpha_s) / eff + LINKS.alpha_s

    assert float(edp[0]) == 2.0 and over_edp > whole_dp > 0
    assert over_edp == pytest.approx(48 * (2 * one(2) + one(4)), rel=1e-9)
    assert float(sharded_step_comm_s(1e8, 48, tr, S, LINKS, ranks=np.array([1.0]), stride=S.ep)[0]) == 0.0


def test_dense_first_layers_are_costed_as_dense_ffns_weighted_by_their_count():
    """DeepSeek-V3 (first_k_dense_replace 3 of 61 layers): the average layer is 3/61 of a dense
    layer (its 18432-wide FFN, no router, no all-to-all) and 58/61 of an MoE layer."""
    tr = Training(global_batch_size=8, sequence_length=4096)
    strategies = [Strategy(dp=8, ep=8)]
    mixed = _layer(DEEPSEEK_V3, tr, strategies)
    moe_only = _layer(replace(DEEPSEEK_V3, dense_layer_indices=()), tr, strategies)
    dense_only = _layer(replace(DEEPSEEK_V3, dense_layer_indices=(), num_experts=1, experts_per_token=1, shared_expert_ffn_hidden_size=0,
                                ffn_hidden_size=DEEPSEEK_V3.dense_ffn_hidden_size), tr, strategies)
    for field in ("total_s", "model_flops", "ep_comm_s"):
        want = 3 / 61 * getattr(dense_only, field)[0] + 58 / 61 * getattr(moe_only, field)[0]
        assert float(getattr(mixed, field)[0]) == pytest.approx(float(want), rel=1e-12)
    assert float(dense_only.ep_comm_s[0]) == 0.0 < float(mixed.ep_comm_s[0])


MIXTRAL = training_from_dict({"global_batch_size": 128, "sequence_length": 4096})


def test_a_pinned_expert_tensor_parallelism_overrides_megatron_cores_rule():
    """Strategy.etp (Megatron-Core's --expert-tensor-parallel-size).  Mixtral 8x7B, tp 2, ep 8,
    dp 8 on two 8-GPU nodes: by default ETP = TP = 2, so the EP ranks sit 2 apart and the
    all-to-all spans both nodes; ETP = 1 keeps each EP group inside a node, drops the experts'
    TP all-gather/reduce-scatter of the k·T routed tokens, and holds twice the expert weights a
    GPU (E/(ep·etp) expert shards)."""
    assert moe.expert_tensor_parallel(2.0, 1.0, 8.0, 8.0) == 2.0 and moe.expert_tensor_parallel(2.0, 1.0, 8.0, 8.0, 1.0) == 1.0
    assert moe.expert_data_parallel(2.0, 1.0, 8.0, 8.0, 1.0) == 2.0
    from cost_model.transformer.spec import get_preset

    model, cluster = get_preset("mixtral-8x7b"), simple_cluster("H100-SXM5-80GB", 2)
    layout = Strategy(dp=8, tp=2, ep=8, micro_batch_size=1, zero_stage=1, sequence_parallel=True, recompute="full")
    default, one = (estimate(model, MIXTRAL, cluster, replace(layout, etp=e)) for e in (0, 1))
    assert estimate(model, MIXTRAL, cluster, replace(layout, etp=2)).step_time_s == default.step_time_s
    assert one.breakdown_s["ep_comm"] < 0.5 * default.breakdown_s["ep_comm"]
    assert one.breakdown_s["tp_comm"] < default.breakdown_s["tp_comm"]
    expert_weights = model.routed_expert_params_per_layer() * model.num_layers * 2 / 1e9  # bf16 GB, whole model
    grown = one.stages[0].memory_GB["weights"] - default.stages[0].memory_GB["weights"]
    assert grown == pytest.approx(expert_weights / 8 - expert_weights / 16, rel=0.02)


@pytest.mark.parametrize(
    ("framework", "preset", "layout", "words"),
    [
        ("fsdp", "mixtral-8x7b", {"dp": 16, "ep": 8, "etp": 2, "zero_stage": 3}, "unsplit with expert parallelism (etp=1)"),
        ("fsdp", "mixtral-8x7b", {"dp": 8, "tp": 2, "etp": 1, "zero_stage": 3}, "follows tp"),
        ("deepspeed", "mixtral-8x7b", {"dp": 16, "ep": 8, "etp": 1, "zero_stage": 2}, "follows tp"),
        ("megatron-core", "mixtral-8x7b", {"dp": 8, "tp": 2, "ep": 8, "etp": 4}, "does not divide tp·cp·dp"),
        ("megatron-core", "mixtral-8x7b", {"dp": 8, "tp": 2, "ep": 8, "etp": 3}, "FFN width"),
    ],
)
def test_an_expert_tensor_parallelism_that_cannot_run_names_the_field(framework, preset, layout, words):
    from cost_model.errors import InvalidStrategy
    from cost_model.strategy import strategy_from_dict
    from cost_model.transformer.spec import get_preset

    training = training_from_dict({"global_batch_size": 128, "sequence_length": 4096, "framework": framework})
    with pytest.raises(InvalidStrategy) as e:
        estimate(get_preset(preset), training, simple_cluster("H100-SXM5-80GB", 2), strategy_from_dict(layout))
    assert e.value.field == "strategy.etp" and words in str(e.value)
    assert "etp" not in Strategy(dp=2).to_dict() and Strategy(dp=2, etp=1).to_dict()["etp"] == 1


def test_an_expert_tensor_parallelism_of_a_dense_model_is_a_no_op_with_a_warning():
    """Megatron-LM takes --expert-tensor-parallel-size without experts (its Llama 3 8B FP8 example
    passes it) and uses it for none: costed as the same layout without it, and said so."""
    from cost_model.strategy import strategy_from_dict
    from cost_model.transformer.spec import get_preset

    training = training_from_dict({"global_batch_size": 128, "sequence_length": 4096})
    cluster = simple_cluster("H100-SXM5-80GB", 2)
    asked = estimate(get_preset("llama3-8b"), training, cluster, strategy_from_dict({"dp": 16, "etp": 1}))
    plain = estimate(get_preset("llama3-8b"), training, cluster, strategy_from_dict({"dp": 16}))
    assert (asked.step_time_s, asked.peak_memory_GB) == (plain.step_time_s, plain.peak_memory_GB)
    assert any("etp=1 has no effect on a dense model" in w for w in asked.warnings), asked.warnings


def test_megatron_core_weights_tokens_inside_the_experts_so_its_combine_keeps_no_expert_output():
    """Megatron-Core multiplies each routed token by its router probability in the experts'
    activation (``activation_func_with_probs``): the probabilities' gradient comes from FC1's
    output, already kept, and the combine is a pure permutation.  A combine that weights the
    expert outputs (DeepSpeed's MoE, FSDP trainers') keeps them: T·k·h 16-bit values a layer more."""
    from cost_model.transformer.layer_cost import activation_bytes
    from cost_model.transformer.spec import get_preset

    model = get_preset("mixtral-8x7b")
    S = StrategyArrays.from_strategies([Strategy(dp=8, ep=8, micro_batch_size=1)])
    kept = {fw: float(activation_bytes(model, Training(global_batch_size=64, sequence_length=4096, framework=fw), S)[0][0])
            for fw in ("megatron-core", "megatron-deepspeed", "fsdp")}
    outputs = 4096 * model.experts_per_token * model.hidden_size * 2
    assert kept["megatron-deepspeed"] - kept["megatron-core"] == pytest.approx(outputs)
    assert kept["fsdp"] == pytest.approx(kept["megatron-deepspeed"])
    args = dict(hidden=4096.0, num_experts=8.0, top_k=2.0, shared_ffn_hidden=0.0, gated=True, tokens=4096.0, tp=1.0, cp=1.0, dp=8.0,
                ep=8.0, sequence_parallel=False, act_bytes=2.0, saved_input_bytes=2.0)
    assert float(moe.moe_activation_bytes(**args)) - float(moe.moe_activation_bytes(**args, keeps_expert_outputs=False)) == pytest.approx(outputs)
