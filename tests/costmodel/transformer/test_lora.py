"""LoRA (``training.lora_rank``, ``lora_target_modules``, ``lora_dropout``): the model's weights
frozen, a rank-r adapter beside each targeted linear layer (``cost_model.transformer.lora``).
The frozen GEMMs lose their weight-gradient half, the state, gradient traffic and optimizer step
become the adapters', the adapters add their own small GEMMs and memory-bound passes, and the
frozen layers without an adapter stop storing the input only their weight gradient needed; what
cannot be priced is a 422 naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cost_model.cluster import simple_cluster
from cost_model.compute import gemm_fwd_bwd_time_s, gemm_time_s
from cost_model.devices import get_device
from cost_model.errors import InvalidTraining
from cost_model.estimate import estimate
from cost_model.graph.evaluate import refuse_graph_unpriced
from cost_model.strategy import Strategy
from cost_model.training import training_from_dict
from cost_model.transformer.lora import (
    NF4_BYTES_PER_PARAM,
    adapter_params_per_layer,
    adapter_tensors_per_layer,
    expert_adapter_params_per_layer,
    expert_adapter_tensors_per_layer,
)
from cost_model.transformer.spec import from_hf_config, get_preset
from helpers.bench_modules import cpu_validation
from helpers.cli_estimate import cli_estimates_then_refuses

FSDP = {"global_batch_size": 64, "sequence_length": 4096, "framework": "fsdp"}
H100 = "H100-SXM5-80GB"
CLUSTER = {"name": "c", "node_groups": [{"name": "n", "count": 1, "gpus_per_node": 8, "device": H100}]}


def _tr(**kw) -> object:
    return training_from_dict({**FSDP, **kw})


def test_a_frozen_weight_has_no_weight_gradient_gemm():
    dev = get_device(H100)
    fwd, full = gemm_fwd_bwd_time_s(8192, 4096, 4096, dev, "bf16")
    f2, frozen = gemm_fwd_bwd_time_s(8192, 4096, 4096, dev, "bf16", frozen=True)
    assert f2 == fwd
    assert frozen == pytest.approx(gemm_time_s(8192, 4096, 4096, dev, "bf16"))  # dX = dY·Wᵀ alone
    assert full - frozen == pytest.approx(gemm_time_s(4096, 4096, 8192, dev, "bf16"))


def test_the_adapters_of_llama_3_8b_are_peft_s_count():
    # PEFT's print_trainable_parameters for Llama-3-8B, r=16, target_modules "all-linear":
    # 41,943,040 trainable parameters (q, k, v, o, gate, up, down: r·(d_in + d_out) each)
    model = get_preset("llama3-8b")
    assert float(adapter_params_per_layer(model, _tr(lora_rank=16), 1.0)) * model.num_layers == 41_943_040
    assert adapter_tensors_per_layer(model, _tr(lora_rank=16)) == 14
    # Megatron-Bridge's fused projections: one adapter on linear_qkv and one on linear_fc1
    fused = float(adapter_params_per_layer(model, _tr(lora_rank=16, framework="megatron-core"), 1.0))
    assert fused == 16 * ((4096 + 6144) + (4096 + 4096) + (4096 + 2 * 14336) + (14336 + 4096))
    # under TP A splits beside a row-parallel layer and B beside a column-parallel one
    qkv = _tr(lora_rank=16, framework="megatron-core", lora_target_modules=["linear_qkv"])
    assert float(adapter_params_per_layer(model, qkv, 4.0)) == 16 * (4096 + 6144 / 4)


def test_every_routed_expert_gets_its_adapters_held_as_the_experts_are():
    # Qwen3-30B-A3B: 128 experts of width 768, hidden 2048, gated — PEFT's all-linear wraps each
    # expert's gate, up and down projections; ep 8 holds 16 experts a GPU, etp splits them
    cfg = json.loads((Path(__file__).parent / "hf_configs" / "qwen3-30b-a3b.json").read_text())
    model = from_hf_config(cfg, "qwen3-30b-a3b")
    tr = _tr(lora_rank=16)
    assert float(expert_adapter_params_per_layer(model, tr, 8.0, 1.0)) == 16 * 3 * 16 * (2048 + 768)
    assert float(expert_adapter_params_per_layer(model, tr, 8.0, 2.0)) == 16 * 3 * 16 * (2048 + 768 / 2)
    assert float(expert_adapter_tensors_per_layer(model, tr, 8.0)) == 16 * 3 * 2
    # attention adapters alone leave the experts frozen and without state
    qkv = _tr(lora_rank=16, lora_target_modules=["linear_qkv", "linear_proj"])
    assert float(expert_adapter_params_per_layer(model, qkv, 8.0, 1.0)) == 0.0
    cluster = simple_cluster(H100, 4)
    s = Strategy(dp=32, ep=8, zero_stage=3, micro_batch_size=1, recompute="full")
    every, attn = (estimate(model, t, cluster, s).stages[0].memory_GB for t in (tr, qkv))
    # the experts' adapters: 48 layers of 16 local experts' gradients and moments (4 + 8 bytes; FSDP's
    # fp32 sharded parameter is counted with the weights), sharded over the experts' 4 data-parallel
    # replicas under ZeRO-3
    expert_state = 48 * 16 * 3 * 16 * (2048 + 768) * (4 + 8) / 4 / 1e9
    assert (every["optimizer_state"] + every["gradients"]) - (attn["optimizer_state"] + attn["gradients"]) == pytest.approx(expert_state, rel=0.02)


@pytest.mark.parametrize("framework, zero", [("fsdp", 3), ("fsdp", 0), ("deepspeed", 2), ("megatron-core", 1), ("paddle", 1)])
def test_the_state_is_the_adapters_and_the_step_is_faster(framework, zero):
    model, cluster = get_preset("llama3-8b"), simple_cluster(H100, 1)
    # without recompute (a recomputed forward re-runs the adapters' memory-bound passes, which
    # can cost more than the frozen weights' dW saves)
    s = Strategy(dp=8, zero_stage=zero, micro_batch_size=2, recompute="none")
    full, lora = (estimate(model, _tr(framework=framework, **kw), cluster, s) for kw in ({}, {"lora_rank": 16}))
    m_full, m_lora = full.stages[0].memory_GB, lora.stages[0].memory_GB
    shard = 8 if zero >= 3 else 1
    # the frozen weights in bf16, sharded only under full sharding, beside the adapters' own state
    assert m_lora["weights"] == pytest.approx(model.total_params() * 2 / shard / 1e9, rel=0.02)
    assert m_lora["optimizer_state"] < 0.6 < m_full["optimizer_state"]
    assert m_lora["gradients"] < m_full["gradients"]
    assert lora.breakdown_s["compute"] < full.breakdown_s["compute"]
    assert lora.step_time_s < full.step_time_s and lora.peak_memory_GB[0] < full.peak_memory_GB[0]
    assert lora.breakdown_s["optimizer"] < full.breakdown_s["optimizer"] / 50
    # model FLOPs: the frozen GEMMs' forward and dX, no dW
    assert lora.model_tflops_per_gpu * lora.step_time_s < 0.72 * full.model_tflops_per_gpu * full.step_time_s


def test_layers_without_an_adapter_store_less_and_dropout_stores_its_copies():
    model, cluster = get_preset("llama3-8b"), simple_cluster(H100, 1)
    s = Strategy(dp=8, zero_stage=3, micro_batch_size=1, recompute="none")
    T, h, f = 4096, 4096, 14336
    acts = {name: estimate(model, _tr(lora_rank=16, **kw), cluster, s).stages[0].memory_GB["activations"]
            for name, kw in (("all", {}), ("qkv", {"lora_target_modules": ["linear_qkv"]}), ("drop", {"lora_dropout": 0.05}))}
    # without adapters, o_proj, the gate/up input and down_proj's input are stored for nothing (bf16,
    # per layer); the 14 adapters' r-wide intermediates with them
    unsaved = T * (h + h + f) * 2 * model.num_layers / 1e9
    assert acts["all"] - acts["qkv"] == pytest.approx(unsaved + T * 16 * 2 * 4 * model.num_layers / 1e9, rel=0.01)
    # PEFT's dropout keeps each adapter's own dropped input and mask (3 bytes an element)
    d_in = 3 * h + h + 2 * h + f
    assert acts["drop"] - acts["all"] == pytest.approx(T * d_in * 3 * model.num_layers / 1e9, rel=0.01)


def test_full_recompute_stores_only_the_layer_input_with_lora_too():
    model, cluster = get_preset("llama3-8b"), simple_cluster(H100, 1)
    s = Strategy(dp=8, zero_stage=3, micro_batch_size=1, recompute="full")
    lora, drop = (estimate(model, _tr(**kw), cluster, s).stages[0].memory_GB["activations"]
                  for kw in ({"lora_rank": 16}, {"lora_rank": 16, "lora_dropout": 0.1}))
    # the stored checkpoints are the layer inputs either way: the dropout's copies are held by the
    # one layer being recomputed
    T, h, f = 4096, 4096, 14336
    assert drop - lora == pytest.approx(T * (3 * h + h + 2 * h + f) * 3 / 1e9, rel=0.01)


@pytest.mark.parametrize("body, field, needle", [
    ({**FSDP, "framework": "megatron-deepspeed", "lora_rank": 8}, "training.lora_rank", "LoRA is priced for"),
    ({**FSDP, "lora_rank": -1}, "training.lora_rank", "from 0"),
    ({**FSDP, "lora_rank": True}, "training.lora_rank", "from 0"),
    ({**FSDP, "lora_target_modules": ["linear_qkv"]}, "training.lora_target_modules", "set lora_rank"),
    ({**FSDP, "lora_dropout": 0.1}, "training.lora_dropout", "set lora_rank"),
    ({**FSDP, "lora_rank": 8, "lora_dropout": 1.0}, "training.lora_dropout", "probability"),
    ({**FSDP, "lora_rank": 8, "lora_target_modules": ["q_proj"]}, "training.lora_target_modules", "linear_qkv"),
    ({**FSDP, "lora_rank": 8, "lora_target_modules": []}, "training.lora_target_modules", "at least one"),
    ({**FSDP, "lora_rank": 8, "dtype": "fp8"}, "training.dtype", "not fp8"),
])
def test_what_cannot_be_priced_is_refused_by_name(body, field, needle):
    with pytest.raises(InvalidTraining) as err:
        training_from_dict(body)
    assert err.value.field == field and needle in str(err.value), str(err.value)


@pytest.mark.parametrize("framework", ["fsdp", "deepspeed"])
@pytest.mark.parametrize("base", [None, "nf4"])
def test_offloaded_to_the_host_the_frozen_shard_and_the_adapters_state_leave_the_gpu(framework, base):
    """FSDP's CPU offload and DeepSpeed's ZeRO-3 Offload under (Q)LoRA (LLaMA-Factory's FSDP-QLoRA
    example, its ds_z3_offload config with LoRA): the frozen base's shard, as held (4-bit under
    QLoRA), and the adapters' state live on the host; the GPU holds neither, and each micro-batch
    copies the frozen shard in before its two gathers — so the copies grow with the base, not with
    the adapters."""
    model, cluster = get_preset("llama3-8b"), simple_cluster(H100, 1)
    s = Strategy(dp=8, zero_stage=3, micro_batch_size=1, recompute="full")
    kw = {"framework": framework, "global_batch_size": 16, "sequence_length": 2048, "lora_rank": 8, **({"lora_base_dtype": base} if base else {})}
    on_gpu, offloaded = (estimate(model, _tr(**kw, cpu_offload=off), cluster, s) for off in (False, True))
    m_gpu, m_off = on_gpu.stages[0].memory_GB, offloaded.stages[0].memory_GB
    assert m_off["weights"] == m_off["optimizer_state"] == 0.0
    # the GPU's gradient memory: the framework's communication buckets alone (DeepSpeed's), as offloaded without LoRA
    full = estimate(model, _tr(framework=framework, global_batch_size=16, sequence_length=2048, cpu_offload=True), cluster, s)
    assert m_off["gradients"] == full.stages[0].memory_GB["gradients"]
    adapters = 32 * adapter_params_per_layer(model, _tr(**kw), 1) / 8
    # the host: the GPU's frozen weights and the adapters' whole state (their weights, gradients, moments)
    assert offloaded.stages[0].host_memory_GB == pytest.approx(
        m_gpu["weights"] - adapters * 2 / 1e9 + adapters * (16 if framework == "fsdp" else 18) / 1e9, rel=0.02)
    # the frozen shard crosses the host link twice a micro-batch (128 GB/s · 0.8 on this server's link)
    link = get_device(H100).host_link_GBps * 1e9 * 0.8
    copies = 2 * m_gpu["weights"] * 1e9 / link
    assert offloaded.breakdown_s["offload_exposed"] >= 0.9 * 2 * max(copies - offloaded.stages[0].forward_s - offloaded.stages[0].backward_s, 0.0)
    assert offloaded.peak_memory_GB[0] < on_gpu.peak_memory_GB[0] - m_gpu["weights"] + 0.1


def test_optimizer_offload_with_lora_moves_the_adapters_state_alone():
    """DeepSpeed's ZeRO-Offload (LLaMA-Factory's ds_z2_offload config) under LoRA: the host holds the
    adapters' fp32 master, moments, gradient and 16-bit staging copy (18 B each), the frozen base
    stays on the GPU."""
    model, cluster = get_preset("llama3-8b"), simple_cluster(H100, 1)
    s = Strategy(dp=8, zero_stage=2, micro_batch_size=1, recompute="full")
    kw = {"framework": "deepspeed", "global_batch_size": 16, "sequence_length": 2048, "lora_rank": 8}
    on_gpu, offloaded = (estimate(model, _tr(**kw, optimizer_offload_fraction=f), cluster, s) for f in (0.0, 1.0))
    adapters = 32 * adapter_params_per_layer(model, _tr(**kw), 1)
    assert offloaded.stages[0].host_memory_GB == pytest.approx(adapters / 8 * 18 / 1e9, rel=0.02)
    assert offloaded.stages[0].memory_GB["weights"] == on_gpu.stages[0].memory_GB["weights"]
    assert offloaded.stages[0].memory_GB["optimizer_state"] == 0.0 < on_gpu.stages[0].memory_GB["optimizer_state"]


def test_fsdp_cpu_offload_under_fp16_unscales_on_the_host():
    """FSDP1's CPU offload under an fp16 MixedPrecision (accelerate's fsdp_offload_params with
    mixed_precision fp16): priced, its host step adding the ShardedGradScaler's unscale pass."""
    model, cluster = get_preset("llama3-8b"), simple_cluster(H100, 1)
    s = Strategy(dp=8, zero_stage=3, micro_batch_size=1, recompute="full")
    bf16, fp16 = (estimate(model, _tr(global_batch_size=16, sequence_length=2048, cpu_offload=True, dtype=dt), cluster, s)
                  for dt in ("bf16", "fp16"))
    assert fp16.breakdown_s["optimizer"] == pytest.approx(bf16.breakdown_s["optimizer"] * (32 + 20) / 32, rel=1e-6)


def test_an_operator_graph_refuses_it():
    with pytest.raises(InvalidTraining) as err:
        refuse_graph_unpriced(_tr(lora_rank=8))
    assert err.value.field == "training.lora_rank"


def test_the_planner_fits_a_70b_lora_where_a_full_finetune_does_not(client):
    req = {"model": {"preset": "llama3-70b"}, "training": {**FSDP, "global_batch_size": 16, "sequence_length": 2048},
           "cluster": CLUSTER, "constraints": {"zero_stage": 3, "pp": 1}}
    refused = client.post("/v1/plans", json=req)
    assert refused.status_code == 422 and refused.json()["error"]["code"] == "no_feasible_plan", refused.text
    r = client.post("/v1/plans", json={**req, "training": {**req["training"], "lora_rank": 16}})
    assert r.status_code in (200, 201), r.text
    plan = r.json()
    assert plan["training"]["lora_rank"] == 16 and plan["best"]["prediction"]["fits"]
    # torchtitan's command line would train every weight: refused, with where its LoRA is
    launch = client.get(f"/v1/plans/{plan['id']}/launch", params={"target": "torchtitan"})
    assert launch.status_code == 422 and launch.json()["error"]["field"] == "target", launch.text
    assert "LoRAConverter" in launch.json()["error"]["message"]


def _lora_plan(client, framework: str, **extra) -> dict:
    req = {"model": {"preset": "llama3-8b"}, "training": {**FSDP, "framework": framework, "global_batch_size": 16, "lora_rank": 8, **extra},
           "cluster": CLUSTER, "constraints": {"tp": 1, "pp": 1}}
    r = client.post("/v1/plans", json=req)
    assert r.status_code in (200, 201), r.text
    return r.json()


def test_megatron_lm_s_launch_is_refused_and_deepspeed_s_says_where_the_adapters_go(client):
    plan = _lora_plan(client, "megatron-core")
    launch = client.get(f"/v1/plans/{plan['id']}/launch", params={"target": "megatron"})
    assert launch.status_code == 422 and launch.json()["error"]["field"] == "target", launch.text
    assert "Megatron-Bridge" in launch.json()["error"]["message"]
    plan = _lora_plan(client, "deepspeed")
    launch = client.get(f"/v1/plans/{plan['id']}/launch", params={"target": "deepspeed-config"})
    assert launch.status_code == 200, launch.text
    assert any("get_peft_model" in n and "'q_proj'" in n for n in launch.json()["notes"])


def test_the_paddle_launch_says_how_to_turn_it_on(client):
    plan = _lora_plan(client, "paddle", lora_target_modules=["linear_qkv", "linear_proj"])
    assert plan["training"]["lora_target_modules"] == ["linear_qkv", "linear_proj"]
    launch = client.get(f"/v1/plans/{plan['id']}/launch", params={"target": "paddle-fleet"})
    assert launch.status_code == 200, launch.text
    assert any("lora_rank" in n and "rank 8" in n for n in launch.json()["notes"])


def test_the_cli_estimates_with_it(cli, tmp_path):
    body = {"model": {"preset": "llama3-8b"}, "training": {**FSDP, "lora_rank": 16},
            "cluster": CLUSTER, "strategy": {"dp": 8, "zero_stage": 3, "micro_batch_size": 2, "recompute": "full"}}
    out = cli_estimates_then_refuses(cli, tmp_path, body, {**body["training"], "framework": "megatron-deepspeed"}, "training.lora_rank")
    assert out["memory_breakdown_GB"][0]["optimizer_state"] < 0.1


# ---- QLoRA: the frozen base in 4-bit NF4 (training.lora_base_dtype) ---------------------------------


def test_nf4_is_half_a_byte_and_its_double_quantised_scales():
    # QLoRA §3: 4 bits a value plus 0.127 bits of double-quantised scales (8 bits per 64, 32 per 64·256)
    assert abs(NF4_BYTES_PER_PARAM * 8 - 4.127) < 1e-3


def test_a_qlora_base_holds_its_decoder_in_nf4_and_dequantises_each_pass():
    model, cluster = get_preset("llama3-70b"), simple_cluster(H100, 1)
    s = Strategy(dp=8, zero_stage=3, micro_batch_size=1, recompute="full")
    lora, qlora = (estimate(model, _tr(global_batch_size=16, sequence_length=2048, lora_rank=16, **kw), cluster, s)
                   for kw in ({}, {"lora_base_dtype": "nf4"}))
    decoder = model.decoder_params()
    rest = model.total_params() - decoder  # the embedding and the head stay in bf16
    held = (decoder * NF4_BYTES_PER_PARAM + rest * 2) / 8
    assert qlora.stages[0].memory_GB["weights"] - lora.stages[0].memory_GB["weights"] == pytest.approx(
        (held - model.total_params() * 2 / 8) / 1e9, rel=0.01)
    # the dequantisation runs in the forward, its recompute and the backward: the step is slower
    assert qlora.breakdown_s["compute"] > lora.breakdown_s["compute"] and qlora.breakdown_s["recompute"] > lora.breakdown_s["recompute"]
    # the ZeRO-3 gathers move the 4-bit storage
    assert qlora.breakdown_s["dp_comm_exposed"] <= lora.breakdown_s["dp_comm_exposed"]


@pytest.mark.parametrize("body, needle", [
    ({**FSDP, "lora_base_dtype": "nf4"}, "set lora_rank"),
    ({**FSDP, "framework": "megatron-core", "lora_rank": 8, "lora_base_dtype": "nf4"}, "QLoRA is priced for"),
    ({**FSDP, "framework": "paddle", "lora_rank": 8, "lora_base_dtype": "nf4"}, "QLoRA is priced for"),
    ({**FSDP, "lora_rank": 8, "lora_base_dtype": "int4"}, "must be one of nf4"),
    ({**FSDP, "lora_rank": 8, "lora_base_dtype": "nf4", "dtype": "fp32"}, "not fp32"),
])
def test_a_qlora_base_that_cannot_be_priced_is_refused(body, needle):
    with pytest.raises(InvalidTraining) as err:
        training_from_dict(body)
    assert err.value.field == "training.lora_base_dtype" and needle in str(err.value), str(err.value)


def test_the_planner_fits_405b_qlora_on_one_node_as_torchtune_runs_it(client):
    # torchtune's 405B_qlora recipe: 8 GPUs, every linear layer adapted at rank 16, full recompute
    req = {"model": {"preset": "llama3-405b"}, "training": {**FSDP, "global_batch_size": 16, "sequence_length": 2048, "lora_rank": 16},
           "cluster": CLUSTER, "constraints": {"zero_stage": 3, "pp": 1, "tp": 1}}
    refused = client.post("/v1/plans", json=req)
    assert refused.status_code == 422 and refused.json()["error"]["code"] == "no_feasible_plan", refused.text
    r = client.post("/v1/plans", json={**req, "training": {**req["training"], "lora_base_dtype": "nf4"}})
    assert r.status_code in (200, 201), r.text
    assert r.json()["training"]["lora_base_dtype"] == "nf4" and r.json()["best"]["prediction"]["fits"]
    plan = _lora_plan(client, "deepspeed", lora_base_dtype="nf4")
    launch = client.get(f"/v1/plans/{plan['id']}/launch", params={"target": "deepspeed-config"})
    assert any("bnb_4bit_quant_type='nf4'" in n for n in launch.json()["notes"])


def test_pytorch_keeps_no_input_for_a_frozen_linear_layer():
    """The saved-activation rule :func:`cost_model.transformer.lora.saved_activation_delta_bytes`
    relies on, checked on PyTorch itself: autograd saves a linear layer's input for its weight
    gradient only, so a frozen layer keeps none (the weight it saves is the parameter itself)."""
    torch = pytest.importorskip("torch")

    def saved(module, x) -> list[int]:
        ptrs: list[int] = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: ptrs.append(t.data_ptr()) or t, lambda t: t):
            module(x)
        return ptrs

    x = torch.randn(8, 16, requires_grad=True)
    for trains in (True, False):
        layer = torch.nn.Linear(16, 32, bias=False)
        layer.weight.requires_grad_(trains)
        assert (x.data_ptr() in saved(layer, x)) is trains


def test_the_cpu_bench_s_lora_model_trains_the_adapters_the_cost_model_counts(monkeypatch):
    """bench/lora_cpu.py measures case L as PEFT's LoRA trains it (bench/cpu_validation.py's
    ``with_lora``): its trainable parameters are exactly the adapters the cost model prices for
    that model, and nothing else trains."""
    torch = pytest.importorskip("torch")
    bench = cpu_validation(monkeypatch)
    case = {**next(c for c in bench.CASES if c["name"] == "L"), "lora_rank": 16}
    model = bench.build_model(case)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    spec_model = from_hf_config(bench.hf_config(case), "case-L")
    priced = float(adapter_params_per_layer(spec_model, _tr(lora_rank=16), 1.0)) * spec_model.num_layers
    assert trainable == priced and all(("lora_" in n) == p.requires_grad for n, p in model.named_parameters())
    assert isinstance(model.blocks[0].q.lora_A, torch.nn.Linear)


def test_fsdp_qlora_with_cpu_offload_plans_through_the_api(client):
    """LLaMA-Factory's FSDP-QLoRA example (Llama 3 8B, NF4 base, LoRA rank 8 on every linear layer,
    fp16, accelerate's fsdp_offload_params on 2 GPUs): planned, nothing of the model's state left
    on the GPU, the host's share named in the plan's warnings; and the same as a ZeRO-3 Offload
    plan, whose ds_config holds both offload sections."""
    cluster = {"name": "c", "node_groups": [{"name": "n", "count": 1, "gpus_per_node": 2, "device": H100}]}
    training = {**FSDP, "global_batch_size": 16, "sequence_length": 1024, "dtype": "fp16", "lora_rank": 8, "lora_base_dtype": "nf4",
                "cpu_offload": True}
    r = client.post("/v1/plans", json={"model": {"preset": "llama3-8b"}, "training": training, "cluster": cluster,
                                       "constraints": {"zero_stage": 3, "recompute": "full"}})
    assert r.status_code in (200, 201), r.text
    best = r.json()["best"]
    assert best["prediction"]["fits"] and best["strategy"]["zero_stage"] == 3
    # the host holds the frozen 4-bit shard and the adapters' state: ~3 GB a GPU of Llama 3 8B's
    assert 2.5 < best["prediction"]["stages"][0]["host_memory_GB"] < 3.5
    assert any("CPU offload of the sharded parameters" in w for w in r.json()["warnings"] + best["prediction"].get("warnings", []))
    ds = client.post("/v1/plans", json={"model": {"preset": "llama3-8b"}, "training": {**training, "framework": "deepspeed", "dtype": "bf16"},
                                        "cluster": cluster, "constraints": {"zero_stage": 3}})
    assert ds.status_code in (200, 201), ds.text
    cfg = json.loads(client.get(f"/v1/plans/{ds.json()['id']}/launch", params={"target": "deepspeed-config"}).json()["files"]["ds_config.json"])
    assert cfg["zero_optimization"]["offload_param"]["device"] == "cpu" == cfg["zero_optimization"]["offload_optimizer"]["device"]
