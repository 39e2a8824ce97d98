"""Memory formulas pinned to Korthikanti et al. 2022 Table 2 and hand-computed ZeRO bytes."""

from dataclasses import replace

import numpy as np
import pytest

from cost_model import Strategy, Training, estimate, simple_cluster
from cost_model.transformer.layer_cost import (
    WORKSPACE_BYTES,
    StrategyArrays,
    activation_bytes,
    fragmentation_fraction,
    model_state_bytes_per_param,
)
from cost_model.transformer.spec import TransformerSpec

# A GPT layer as in the paper: s=2048, h=6144 (22B row), a=64; 16-bit activations, dropout.
GPT = TransformerSpec("gpt", 1, 6144, 64, 64, 4 * 6144, 51200, bias=True, learned_positions=2048)
S_LEN, B, H, A = 2048, 4, 6144, 64
SBH = S_LEN * B * H
UNFUSED = Training(global_batch_size=4, sequence_length=S_LEN, attention="unfused")


def act(t, sp, rc, training=UNFUSED, model=GPT):
    S = StrategyArrays.from_strategies([Strategy(tp=t, micro_batch_size=B, sequence_parallel=sp, recompute=rc)])
    stored, _, _ = activation_bytes(model, training, S)
    return float(stored[0])


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_no_parallelism_and_tensor_parallel(t):
    # sbh(10 + 24/t + 5as/(ht));  t=1 gives sbh(34 + 5as/h).
    expected = SBH * (10 + 24 / t + 5 * A * S_LEN / (H * t))
    assert act(t, False, "none") == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("t", [2, 4, 8])
def test_tensor_plus_sequence_parallel(t):
    expected = SBH * (34 / t + 5 * A * S_LEN / (H * t))
    assert act(t, True, "none") == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("t", [1, 2, 8])
def test_selective_recompute(t):
    assert act(t, False, "selective") == pytest.approx(SBH * (10 + 24 / t), rel=1e-12)


@pytest.mark.parametrize("t", [2, 8])
def test_selective_plus_sequence_parallel(t):
    assert act(t, True, "selective") == pytest.approx(34 * SBH / t, rel=1e-12)


#: Llama-2 13B's layer (gated FFN, no biases, MHA) for torchtitan's op-level selective checkpointing.
LLAMA = TransformerSpec("llama", 1, 5120, 40, 40, 13824, 32000, gated_ffn=True)


@pytest.mark.parametrize("t", [1, 2, 8])
def test_fsdp_selective_keeps_what_torchtitans_op_level_policy_saves(t):
    # Saved per token (bytes, 16-bit): the layer input 2h/t (SP); the odd-numbered matmuls
    # Q 2h/t, V 2h/t, w1 2f/t and w2's partial sum 2h (K, the output projection and w3 are
    # recomputed); the attention output 2h/t and its fp32 log-sum-exp 4a/t; under TP the two
    # reduce-scatter outputs 2·2h/t.
    h, f, a, tokens = 5120, 13824, 40, 4096 * 2
    flash = Training(global_batch_size=8, sequence_length=4096, attention="flash", framework="fsdp")
    per_token = 2 * h / t + 2 * h / t + 2 * h / t + 2 * f / t + 2 * h + 2 * h / t + 4 * a / t + (4 * h / t if t > 1 else 0)
    S = StrategyArrays.from_strategies([Strategy(tp=t, micro_batch_size=2, sequence_parallel=t > 1, recompute="selective")])
    stored, full, working = activation_bytes(LLAMA, flash, S)
    assert float(stored[0]) == pytest.approx(tokens * per_token, rel=1e-12)
    assert float(working[0]) == pytest.approx(float(full[0] - stored[0]), rel=1e-12)
    # Megatron's selective recompute with fused attention stores what no recompute does
    mc = Training(global_batch_size=8, sequence_length=4096, attention="flash", framework="megatron-core")
    none = StrategyArrays.from_strategies([Strategy(tp=t, micro_batch_size=2, sequence_parallel=t > 1)])
    assert float(activation_bytes(LLAMA, mc, S)[0][0]) == float(activation_bytes(LLAMA, mc, none)[0][0]) == float(full[0])
    # at t = 1 about half of what the layer holds without recompute (15.4·h vs 32.2·h bytes a token)
    if t == 1:
        assert float(stored[0]) / float(full[0]) == pytest.approx(15.4 / 32.2, abs=0.01)


@pytest.mark.parametrize("t, sp", [(1, False), (8, False), (8, True)])
def test_full_recompute_keeps_only_the_layer_input(t, sp):
    assert act(t, sp, "full") == pytest.approx(2 * SBH / (t if sp else 1), rel=1e-12)


def test_fused_attention_drops_the_s_squared_terms():
    flash = Training(global_batch_size=4, sequence_length=S_LEN, attention="flash")
    assert act(8, True, "none", training=flash) == pytest.approx(34 * SBH / 8, rel=1e-12)


@pytest.mark.parametrize(
    "zero, expected",
    [
        # mixed precision Adam: weights 2, fp32 grads 4, optimizer 12 (Megatron: 18 B/param w/o dist-opt)
        (0, (2.0, 4.0, 12.0)),
        (1, (2.0, 4.0, 12.0 / 8)),  # Megatron distributed optimizer: 6 + 12/d
        (2, (2.0, 4.0 / 8, 12.0 / 8)),
        (3, (2.0 / 8, 4.0 / 8, 12.0 / 8)),
    ],
)
def test_zero_stage_state_bytes(zero, expected):
    w, g, o = model_state_bytes_per_param(Training(8, 2048), np.array([zero]), np.array([8.0]), 1)
    assert (float(w[0]), float(g[0]), float(o[0])) == pytest.approx(expected)


def test_zero_stage_bytes_in_estimate_memory_breakdown():
    model = TransformerSpec("m", 8, 2048, 16, 16, 8192, 32000, bias=True, learned_positions=2048)
    cl = simple_cluster("A100-SXM4-80GB", 1)
    tr = Training(global_batch_size=64, sequence_length=2048)
    params = model.total_params()
    for zero, per_param in ((0, 18.0), (1, 6 + 12 / 8), (2, 2 + 16 / 8), (3, 18 / 8)):
        est = estimate(model, tr, cl, Strategy(dp=8, micro_batch_size=1, zero_stage=zero))
        mem = est.stages[0].memory_GB
        state_GB = mem["weights"] + mem["gradients"] + mem["optimizer_state"]
        assert state_GB == pytest.approx(params * per_param / 1e9, rel=1e-9), zero


def test_first_stage_holds_pp_microbatches_under_1f1b():
    model = TransformerSpec("m", 8, 2048, 16, 16, 8192, 32000, bias=True, learned_positions=2048)
    cl = simple_cluster("A100-SXM4-80GB", 1)
    tr = Training(global_batch_size=64, sequence_length=2048)
    est = estimate(model, tr, cl, Strategy(dp=2, pp=4, micro_batch_size=1))
    acts = [s.memory_GB["activations"] for s in est.stages]
    # stage i holds pp - i micro-batches of its 2 layers (plus embedding/head extras at the ends)
    assert acts[1] / acts[2] == pytest.approx(3 / 2, rel=0.02)


def test_fsdp_selective_recomputes_the_even_matmuls_and_the_memory_bound_ops():
    # The extra (hardware − model) FLOPs of op-level selective over those of full recompute: the K
    # projection, the output projection and w3 — 2h + f of the layer's 4h + 3f GEMM width (plus
    # its attention core, which full recompute also redoes): 0.39 / (1 + attention share).
    tr = Training(global_batch_size=16, sequence_length=4096, attention="flash", framework="fsdp")
    cl = simple_cluster("H100-SXM5-80GB", 8)
    model = TransformerSpec("llama", 40, 5120, 40, 40, 13824, 32000, gated_ffn=True)
    runs = {rc: estimate(model, tr, cl, Strategy(dp=8, micro_batch_size=2, zero_stage=3, recompute=rc)) for rc in ("none", "selective", "full")}
    extra = {rc: e.hardware_tflops_per_gpu - e.model_tflops_per_gpu for rc, e in runs.items()}
    assert extra["none"] == pytest.approx(0.0, abs=1e-9)
    share = (extra["selective"] * runs["selective"].step_time_s) / (extra["full"] * runs["full"].step_time_s)
    assert 0.30 < share < (2 * 5120 + 13824) / (4 * 5120 + 3 * 13824)
    assert runs["none"].step_time_s < runs["selective"].step_time_s < runs["full"].step_time_s
    assert max(runs["full"].peak_memory_GB) < max(runs["selective"].peak_memory_GB) < max(runs["none"].peak_memory_GB)


# ---- DeepSpeed's gradient buckets (stage_cost.gradient_bucket_bytes)


@pytest.mark.parametrize(
    "framework, zero, pp, dtype, expected",
    [
        ("deepspeed", 2, 1, "bf16", 2 * 5e8 * 2),  # IPG bucket double-buffered under overlap_comm
        ("deepspeed", 1, 1, "fp16", 2 * 5e8 * 2),  # the ZeRO optimizer runs stage 1 outside bf16
        ("deepspeed", 1, 1, "bf16", 2 * 5e8 * 2),  # DeepSpeed's default at stage 1 under bf16: the ZeRO optimizer
        ("deepspeed", 1, 1, "bf16/fp32", 0.0),  # fp32 accumulation asked for: BF16_Optimizer, no IPG bucket
        ("megatron-deepspeed", 1, 4, "fp16", 0.0),  # the pipeline engine's one comes after the activations are freed
        ("deepspeed", 3, 1, "bf16", 5e8 * 2),  # stage 3: one flat IPG buffer
        ("deepspeed", 3, 1, "fp32", 5e8 * 4),
        ("deepspeed", 0, 1, "bf16", 0.0),
        ("megatron-core", 1, 1, "bf16", 0.0),  # its fp32 gradient buffer is counted as gradients
        ("fsdp", 3, 1, "bf16", 0.0),
        ("paddle", 2, 1, "bf16", 0.0),
    ],
)
def test_deepspeed_reduce_buckets(framework, zero, pp, dtype, expected):
    from cost_model.transformer.stage_cost import gradient_bucket_bytes

    S = StrategyArrays.from_strategies([Strategy(dp=8 // pp, pp=pp, zero_stage=zero)])
    dtype, _, accum = dtype.partition("/")  # "bf16/fp32": bf16 training with training.grad_accum_dtype fp32
    training = Training(64, 2048, dtype=dtype, framework=framework, grad_accum_dtype=accum or None)
    assert float(gradient_bucket_bytes(training, S.zero, S.pp)[0]) == pytest.approx(expected)


def test_without_overlap_comm_deepspeeds_ipg_bucket_is_not_double_buffered():
    """``grad_reduce_overlap: false`` is DeepSpeed's ``overlap_comm: false`` (the planner's
    ds_config.json writes it so): one IPG bucket at stages 1–2, stage 3's flat buffer as before."""
    from cost_model.transformer.stage_cost import gradient_bucket_bytes

    for zero, expected in ((2, 5e8 * 2), (1, 5e8 * 2), (3, 5e8 * 2)):
        S = StrategyArrays.from_strategies([Strategy(dp=8, zero_stage=zero)])
        training = Training(64, 2048, framework="deepspeed", grad_reduce_overlap=False)
        assert float(gradient_bucket_bytes(training, S.zero, S.pp)[0]) == pytest.approx(expected)


def test_deepspeed_zero2_estimate_counts_the_buckets_once_and_does_not_fragment_them():
    model = TransformerSpec("m", 8, 2048, 16, 16, 8192, 32000, bias=True, learned_positions=2048)
    cl = simple_cluster("A100-SXM4-80GB", 1)
    st = Strategy(dp=8, micro_batch_size=1, zero_stage=2)
    ds = estimate(model, Training(64, 2048, framework="deepspeed"), cl, st).stages[0].memory_GB
    params = model.total_params()
    # DeepSpeed's ZeRO-2 keeps 16-bit gradient partitions (2/8 B a parameter) and its step's fp32 copy
    # of them (4/8 B), plus 2 GB of buckets
    assert ds["gradients"] == pytest.approx(params * (2 + 4) / 8 / 1e9 + 2.0, rel=1e-9)
    # the allocator fragments what is reallocated during a step: not the resident weights nor the
    # optimizer state (allocated once), not the buckets
    reallocated_GB = ds["gradients"] - 2.0 + ds["activations"]
    assert ds["workspace"] == pytest.approx(WORKSPACE_BYTES / 1e9 + fragmentation_fraction() * reallocated_GB, rel=1e-9)


@pytest.mark.parametrize("vocab", [128256, 32000])
def test_fsdp_peak_holds_the_larger_of_the_output_unit_and_the_decoder_layers_backward(vocab):
    """FULL_SHARD adds unsharded weights and gradient buffers over NO_SHARD: two decoder
    layers' weights plus one layer's bf16 gradients and fp32 reduce-scatter input (2 + 4 B), or —
    while torchtitan's [norm, output] unit runs its backward — the [V, h] head's weights,
    gradients and reduce-scatter input (2 + 2 + 4 B a parameter) and the prefetched last layer,
    whichever is
    larger.  Llama 3 8B's 128K vocabulary makes its head (525M parameters) the larger; a 32K
    vocabulary (131M) leaves the layers (218M each) the larger."""
    from cost_model.transformer.spec import get_preset

    model = replace(get_preset("llama3-8b"), vocab_size=vocab)
    cluster = simple_cluster("H100-SXM5-80GB", 1)
    tr = Training(global_batch_size=8, sequence_length=8192, attention="flash", framework="fsdp")
    acts = {z: estimate(model, tr, cluster, Strategy(dp=8, zero_stage=z, micro_batch_size=1, recompute="full"))
            .stages[0].memory_GB["activations"] for z in (0, 2, 3)}
    layer = model.decoder_layer_params()
    head = vocab * model.hidden_size
    layers_phase, head_phase = 2 * layer * 2 + layer * (2 + 4), head * (2 + 2 + 4) + layer * 2
    assert acts[3] - acts[0] == pytest.approx(max(layers_phase, head_phase) / 1e9, rel=1e-6)
    assert (head_phase > layers_phase) == (vocab == 128256)
    # SHARD_GRAD_OP's weights are resident: it adds only the largest unit's gradients and
    # reduce-scatter input (2 + 4 B a parameter)
    assert acts[2] - acts[0] == pytest.approx(max(layer, head) * (2 + 4) / 1e9, rel=1e-6)


def test_deepspeed_zero23_gradients_are_partitioned_in_their_accumulation_dtype_beside_the_steps_fp32_copy():
    """DeepSpeed ZeRO-2/3 hold 16-bit gradient partitions (stage 3's buffer in ``grad_accum_dtype``)
    and cast an fp32 copy for the optimizer after the backward — the whole partition at stage 2,
    one sub-group of 1e9 parameters at a time at stage 3, none when the buffer is fp32 already —
    which the device-level peak holds beside the backward's cached blocks."""
    from cost_model.transformer.layer_cost import DEEPSPEED_SUB_GROUP_SIZE, deepspeed_step_gradient_bytes

    bf16, fp32_accum = Training(64, 2048, framework="deepspeed"), Training(64, 2048, framework="deepspeed", grad_accum_dtype="fp32")
    assert [float(x) for x in model_state_bytes_per_param(bf16, np.array([1, 2, 3]), 8.0, 1)[1]] == [2 + 4 / 8, 2 / 8, 2 / 8]
    assert float(model_state_bytes_per_param(fp32_accum, 3, 8.0, 1)[1]) == 4 / 8
    p = 3e9  # parameters of the GPU's partition
    assert float(deepspeed_step_gradient_bytes(bf16, 2, p)) == 4 * p  # the whole partition (one parameter group)
    assert float(deepspeed_step_gradient_bytes(bf16, 3, p)) == 4 * DEEPSPEED_SUB_GROUP_SIZE  # one sub-group at a time
    assert float(deepspeed_step_gradient_bytes(bf16, 3, 0.5e9)) == 4 * 0.5e9
    assert float(deepspeed_step_gradient_bytes(fp32_accum, 3, p)) == 0.0  # its buffer is fp32 already
    assert float(deepspeed_step_gradient_bytes(bf16, 1, p)) == 0.0  # stage 1's fp32 partition is model_state_bytes_per_param's
    assert float(deepspeed_step_gradient_bytes(Training(64, 2048, framework="fsdp"), 3, p)) == 0.0
    assert float(deepspeed_step_gradient_bytes(replace(bf16, optimizer_offload_fraction=1.0), 2, p)) == 0.0  # built on the host

    # in an estimate: a 24-layer 4096-wide model's 0.6e9 parameters a GPU over 8, at stage 3 held in
    # 16 bits with the whole partition's fp32 copy; a larger model's copy is one sub-group
    cl = simple_cluster("A100-SXM4-80GB", 1)
    for layers in (24, 160):
        model = TransformerSpec("m", layers, 4096, 32, 32, 11008, 32000)
        mem = estimate(model, Training(64, 2048, framework="deepspeed"), cl, Strategy(dp=8, micro_batch_size=1, zero_stage=3)).stages[0].memory_GB
        part = model.total_params() / 8
        held = mem["gradients"] - 1.0  # less stage 3's one 0.5e9-element 16-bit bucket
        assert held == pytest.approx((2 * part + 4 * min(part, DEEPSPEED_SUB_GROUP_SIZE)) / 1e9, rel=1e-9)
