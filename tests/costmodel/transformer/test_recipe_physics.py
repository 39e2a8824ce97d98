"""What the shipped framework recipes (tests/planner/transformer/framework_recipes.json) showed
the cost model lacked, term by term: torchtitan's op-level selective checkpointing of MLA and
MoE layers, its expert parallelism folded over tp with the experts whole, Paddle's experts split
over tp without expert parallelism, Megatron-Core's gradient buffer outside the allocator's
fragmentation, and a sharding stage over one rank under PaddleNLP."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from cost_model import Strategy, Training, estimate, simple_cluster
from cost_model.transformer.layer_cost import (
    TOPK_SAVED_BYTES,
    StrategyArrays,
    activation_bytes,
    fragmentation_fraction,
    op_level_matmuls,
    op_level_recomputed_gemm_flops,
    op_level_saved_width,
)
from cost_model.transformer.memory import fragmentation_reserve_GB
from cost_model.transformer.moe import expert_load_factor, received_slots
from cost_model.transformer.spec import from_hf_config, get_preset
from cost_model.transformer.stage_cost import recompute_flops_per_step

#: DeepSeek-V2-Lite's shape (torchtitan's deepseek_v3 "16B" flavor): MLA without a query rank,
#: 64 experts top-6 of width 1408, two shared experts, the first layer dense.
DSV2_LITE = from_hf_config({
    "model_type": "deepseek_v3", "num_hidden_layers": 27, "hidden_size": 2048, "num_attention_heads": 16,
    "num_key_value_heads": 16, "intermediate_size": 10944, "vocab_size": 102400, "tie_word_embeddings": False,
    "n_routed_experts": 64, "num_experts_per_tok": 6, "moe_intermediate_size": 1408, "n_shared_experts": 2,
    "first_k_dense_replace": 1, "q_lora_rank": None, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
    "v_head_dim": 128})
FSDP = Training(global_batch_size=32, sequence_length=4096, framework="fsdp")


def _moe_layer():
    (w, moe), = [(w, v) for w, v in DSV2_LITE.layer_variants() if v.is_moe]
    return moe


def test_torchtitans_policy_counts_the_mla_and_moe_matmuls_in_order():
    """wq (no query rank), wkv_a, wkv_b, wo, the router's gate, the shared experts' w1, w3, w2:
    the 1st, 3rd, 5th and 7th are kept — wq's 16·192, wkv_b's 16·(128+128), the gate's 64
    scores, w3's 2816 — and the routed experts' grouped GEMMs are neither counted nor kept."""
    moe = _moe_layer()
    widths = [out for _, out in op_level_matmuls(moe, 1.0)]
    assert widths == [16 * 192, 512 + 64, 16 * 256, 2048, 64, 2816, 2816, 2048]
    assert op_level_saved_width(moe, 1.0) == 16 * 192 + 16 * 256 + 64 + 2816
    # recomputed: wkv_a, wo, w1, w2 and the routed experts (6 of 3·2048·1408 each) per token
    redone = 2 * (2048 * 576 + 2048 * 2048 + 2048 * 2816 + 2816 * 2048) + 2 * 6 * 3 * 2048 * 1408
    assert float(op_level_recomputed_gemm_flops(moe, 1.0, 1.0)) == pytest.approx(redone, rel=1e-12)
    # a query rank puts wq_a before wq_b
    with_rank = from_hf_config({**{"model_type": "deepseek_v3", "num_hidden_layers": 2, "hidden_size": 2048, "num_attention_heads": 16,
                                   "intermediate_size": 4096, "vocab_size": 1000, "kv_lora_rank": 512, "q_lora_rank": 768,
                                   "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128}})
    assert [out for _, out in op_level_matmuls(with_rank, 1.0)][:2] == [768, 16 * 192]


@pytest.mark.parametrize("ep", [1, 8])
def test_torchtitans_selective_checkpointing_of_an_moe_layer(ep):
    """Kept per token: the layer input, the odd matmul outputs, the attention output and its
    log-sum-exp, the router's top-k and, with expert parallelism, both all-to-alls' outputs —
    between full recompute and none; its backward redoes the routed experts' forward."""
    moe = _moe_layer()
    tokens = 4096.0
    S = StrategyArrays.from_strategies([Strategy(dp=8, ep=ep, micro_batch_size=1, recompute="selective", zero_stage=3)])
    stored = float(activation_bytes(moe, FSDP, S)[0][0])
    slots = received_slots(tokens, 6.0, expert_load_factor(tokens * 6, ep), 1.0, False)
    a2a = 2 * float(slots) * 2048 * 2 if ep > 1 else 0.0
    expect = tokens * (2 * 2048 + 2 * op_level_saved_width(moe, 1.0) + 2 * 16 * 128 + 4 * 16 + 6 * TOPK_SAVED_BYTES) + a2a
    assert stored == pytest.approx(expect, rel=1e-9)
    none = float(activation_bytes(moe, FSDP, StrategyArrays.from_strategies([Strategy(dp=8, ep=ep, zero_stage=3)]))[0][0])
    full = float(activation_bytes(moe, FSDP, StrategyArrays.from_strategies([Strategy(dp=8, ep=ep, recompute="full", zero_stage=3)]))[0][0])
    assert full < stored < 0.75 * none
    extra = recompute_flops_per_step(DSV2_LITE, FSDP, "selective")
    routed = FSDP.global_batch_size * FSDP.sequence_length * 26 * 2 * 6 * 3 * 2048 * 1408
    assert extra > routed  # the grouped GEMMs of every MoE layer, at least


def test_torchtitans_deepseek_16b_recipe_is_no_longer_priced_as_if_it_kept_everything():
    """torchtitan's deepseek_v3_16b (8 GPUs, ep 8, local batch 4 × 4096, selective): before,
    selective under FSDP kept every activation of an MoE or MLA layer, the peak of no recompute
    (136 GB, refused); now it keeps what the policy keeps, and pays the routed experts again."""
    cluster = simple_cluster("H100-SXM5-80GB", 1)
    train = Training(global_batch_size=32, sequence_length=4096, framework="fsdp")
    runs = {rc: estimate(DSV2_LITE, train, cluster, Strategy(dp=8, ep=8, micro_batch_size=4, recompute=rc, zero_stage=3))
            for rc in ("none", "selective", "full")}
    peaks = {rc: max(e.peak_memory_GB) for rc, e in runs.items()}
    assert peaks["full"] < peaks["selective"] < 0.75 * peaks["none"]
    assert runs["none"].step_time_s < runs["selective"].step_time_s < runs["full"].step_time_s
    assert runs["selective"].fits and not runs["none"].fits


def test_torchtitan_folds_expert_parallelism_over_tp_with_the_experts_whole():
    """torchtitan's sparse mesh (dp_replicate, efsdp, ep) takes ep from dp_shard·cp·tp: ep 8 over
    dp 2 · cp 2 · tp 2 runs (its own integration test's layout), each expert whole (etp 1); with
    ep 1 the experts split over tp like the dense FFN."""
    model, cluster = get_preset("mixtral-8x7b"), simple_cluster("H100-SXM5-80GB", 1)
    train = Training(global_batch_size=16, sequence_length=4096, framework="fsdp")
    folded = estimate(model, train, cluster, Strategy(dp=2, cp=2, tp=2, ep=8, micro_batch_size=1, recompute="full", zero_stage=3))
    assert folded.step_time_s > 0 and any("unsplit with expert parallelism (etp=1)" in w for w in folded.warnings)
    split = estimate(model, train, cluster, Strategy(dp=4, tp=2, micro_batch_size=1, recompute="full", zero_stage=3))
    assert not any("etp" in w for w in split.warnings)


def test_paddles_experts_split_over_tp_without_expert_parallelism():
    """PaddleNLP's Mixtral at tensor_parallel_degree 8 without expert parallelism builds each
    expert's w1/w3/w2 as Column/RowParallelLinear: the experts' weights divide by tp as the
    dense ones do (an earlier version held every expert whole on every rank: 8× the weights)."""
    model, cluster = get_preset("mixtral-8x7b"), simple_cluster("H100-SXM5-80GB", 1)
    train = Training(global_batch_size=16, sequence_length=4096, framework="paddle")
    est = estimate(model, train, cluster, Strategy(dp=1, tp=8, micro_batch_size=1, zero_stage=0))
    weights_GB = est.stages[0].memory_GB["weights"]
    assert weights_GB == pytest.approx(model.total_params() * 2 / 8 / 1e9, rel=0.05)
    assert not any("etp" in w for w in est.warnings)


def test_megatron_cores_gradient_buffer_does_not_fragment():
    """Megatron-Core keeps the gradients in one buffer allocated for the run: the fragmentation
    reserve is the fitted fraction of the activations alone; DeepSpeed's per-step .grad tensors
    (Megatron-DeepSpeed, the fit's own BLOOM runs) fragment with them."""
    model, cluster = get_preset("llama2-7b"), simple_cluster("H100-SXM5-80GB", 1)
    s = Strategy(dp=8, micro_batch_size=1, recompute="full", zero_stage=1)
    f = fragmentation_fraction()
    for framework, grads_fragment in (("megatron-core", False), ("megatron-deepspeed", True)):
        est = estimate(model, Training(global_batch_size=64, sequence_length=4096, framework=framework), cluster, s)
        m = est.stages[0].memory_GB
        reserve = fragmentation_reserve_GB(m)
        assert (reserve > f * m["activations"] + 0.5 * f * m["gradients"]) is grads_fragment, (framework, reserve, m)
        assert reserve >= f * m["activations"] * (1 - 1e-9)


def test_a_sharding_stage_over_one_rank_is_no_sharding_under_paddle():
    model, cluster = get_preset("llama2-13b"), simple_cluster("H100-SXM5-80GB", 4)
    train = Training(global_batch_size=32, sequence_length=4096, framework="paddle")
    layout = dict(dp=1, tp=8, pp=4, micro_batch_size=1, recompute="full")
    asked, plain = (estimate(model, train, cluster, Strategy(**layout, zero_stage=z)) for z in (2, 0))
    assert asked.step_time_s == plain.step_time_s and np.allclose(asked.peak_memory_GB, plain.peak_memory_GB)
    assert any("sharding stage 2 over a sharding group of one rank is no sharding" in w for w in asked.warnings)


def test_pure_bf16_training_keeps_no_fp32_master_copy():
    """torchtune's Llama 3.3 70B full fine-tune on 16 H100 trains every tensor in bf16 (torchtitan:
    training.dtype = "bfloat16", "without an extra copy of fp32 weights"): 2 + 2 + 4 bytes a
    parameter of sharded state instead of FSDP's 4 (the fp32 sharded parameter is the master) + 4
    + 8 — it fits where mixed precision does not — and its optimizer step moves 16 bytes a
    parameter instead of 34."""
    from cost_model.errors import InvalidTraining
    from cost_model.training import training_from_dict
    from cost_model.transformer.layer_cost import model_state_bytes_per_param, optimizer_bytes_per_param

    pure = training_from_dict({"global_batch_size": 16, "sequence_length": 4096, "framework": "fsdp", "master_weights": False})
    mixed = training_from_dict({"global_batch_size": 16, "sequence_length": 4096, "framework": "fsdp"})
    assert [float(x) for x in model_state_bytes_per_param(pure, 3, 1.0, 1)] == [2.0, 2.0, 4.0]
    assert [float(x) for x in model_state_bytes_per_param(mixed, 3, 1.0, 1)] == [4.0, 4.0, 8.0]
    assert optimizer_bytes_per_param(pure) == 16.0 < optimizer_bytes_per_param(mixed)
    # PyTorch's for-loop Adam over bf16 tensors: its passes at half their fp32 bytes
    eager = training_from_dict({"global_batch_size": 16, "sequence_length": 4096, "framework": "fsdp", "master_weights": False,
                                "fused_kernels": False})
    assert optimizer_bytes_per_param(eager) == optimizer_bytes_per_param(replace(eager, master_weights=True)) / 2 - 3.0
    assert pure.to_dict()["master_weights"] is False and "master_weights" not in mixed.to_dict()
    model, cluster = get_preset("llama3-70b"), simple_cluster("H100-SXM5-80GB", 2)
    s = Strategy(dp=16, micro_batch_size=1, recompute="full", zero_stage=3)
    lean, full_state = (estimate(model, t, cluster, s) for t in (pure, mixed))
    assert lean.fits and not full_state.fits
    assert lean.stages[0].memory_GB["optimizer_state"] == pytest.approx(full_state.stages[0].memory_GB["optimizer_state"] / 2, rel=1e-9)
    assert lean.breakdown_s["optimizer"] < full_state.breakdown_s["optimizer"]
    for body, words in (({"framework": "megatron-core"}, "keeps fp32 master weights"), ({"framework": "fsdp", "dtype": "fp32"}, "dtype bf16"),
                        ({"framework": "deepspeed"}, "torchtitan's training.dtype")):
        with pytest.raises(InvalidTraining) as err:
            training_from_dict({"global_batch_size": 16, "sequence_length": 4096, "master_weights": False, **body})
        assert err.value.field == "training.master_weights" and words in err.value.message
    with pytest.raises(InvalidTraining) as err:
        training_from_dict({"global_batch_size": 16, "sequence_length": 4096, "framework": "fsdp", "master_weights": "no"})
    assert err.value.field == "training.master_weights"
