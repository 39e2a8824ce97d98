"""Optimizer offload (``training.optimizer_offload_fraction``): DeepSpeed's ZeRO-Offload and
Megatron-Core's hybrid optimizer keep the fp32 master weights and Adam's moments in host memory
and update them on the host CPU.  Memory leaves the GPU, the step gains the host's update and the
copies over the host link (``layer_cost.offloaded_optimizer_s``); what a framework cannot run is
a 422 naming the field."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from cost_model.cluster import cluster_from_dict, simple_cluster
from cost_model.devices import FAMILY_EFFICIENCY, get_device
from cost_model.errors import InvalidStrategy, InvalidTraining
from cost_model.estimate import estimate, with_offload_spread
from cost_model.strategy import Strategy
from cost_model.training import Training, training_from_dict
from cost_model.transformer.layer_cost import (
    HOST_ADAM_BYTES_PER_PARAM,
    HOST_LINK_FRACTION,
    bf16_optimizer,
    model_state_bytes_per_param,
    offloaded_optimizer_s,
    offloaded_state_bytes_per_param,
)
from cost_model.transformer.spec import get_preset
from helpers.cli_estimate import cli_estimates_then_refuses
from helpers.offload import planned_once_offloaded

BASE = {"global_batch_size": 64, "sequence_length": 4096}
DS = {**BASE, "framework": "deepspeed"}
MC = {**BASE, "framework": "megatron-core", "precision_aware_optimizer": True}


def _tr(body: dict, fraction: float = 1.0) -> Training:
    return training_from_dict({**body, "optimizer_offload_fraction": fraction})


@pytest.mark.parametrize("zero, kept_grads", [(1, 2.0), (2, 0.0), (3, 0.0)])
def test_deepspeed_offload_moves_the_state_and_its_fp32_gradient_partition_to_the_host(zero, kept_grads):
    shard = 8.0
    w0, g0, o0 = (float(x) for x in model_state_bytes_per_param(training_from_dict(DS), zero, shard, 1))
    w, g, o = (float(x) for x in model_state_bytes_per_param(_tr(DS), zero, shard, 1))
    assert w == w0 and o == 0.0 and o0 == 12.0 / shard
    # stage 1: its fp32 partition leaves (the full 16-bit gradients stay); stages 2-3: the partitioned gradients themselves
    assert g == pytest.approx(g0 - 4.0 / shard if zero == 1 else 0.0) and g == pytest.approx(kept_grads)
    # half the state at stage 3 (DeepSpeed's ratio): half of each
    _, g3, _ = (float(x) for x in model_state_bytes_per_param(training_from_dict(DS), 3, shard, 1))
    _, g_half, o_half = (float(x) for x in model_state_bytes_per_param(_tr(DS, 0.5), 3, shard, 1))
    assert o_half == pytest.approx(o0 / 2) and g_half == pytest.approx(g3 / 2)
    assert offloaded_state_bytes_per_param(_tr(DS)) == 18.0  # 12 state + 4 fp32 gradients + DeepSpeed's 16-bit staging copy


def test_megatron_offload_keeps_its_gradient_buffer_on_the_gpu():
    w0, g0, o0 = (float(x) for x in model_state_bytes_per_param(training_from_dict(MC), 1, 8.0, 1))
    w, g, o = (float(x) for x in model_state_bytes_per_param(_tr(MC, 0.25), 1, 8.0, 1))
    assert (w, g) == (w0, g0) and o == pytest.approx(0.75 * o0)
    assert offloaded_state_bytes_per_param(_tr(MC)) == 16.0


def test_the_host_update_is_priced_from_host_bandwidth_and_the_link():
    a100 = get_device("A100-SXM4-80GB")
    params, shard = 8e9, 8.0
    P = params / shard
    cpu = P * HOST_ADAM_BYTES_PER_PARAM / (a100.host_memory_bandwidth_GBps * 1e9 * FAMILY_EFFICIENCY["cpu"].memory_fraction)
    link = a100.host_link_GBps * 1e9 * HOST_LINK_FRACTION
    # DeepSpeed: the gradients leave during backward; the update, then the 16-bit weights back
    assert float(offloaded_optimizer_s(params, _tr(DS), a100, shard)) == pytest.approx(cpu + 2 * P / link)
    # Megatron-Core pipelines copies and update (--overlap-cpu-optimizer-d2h-h2d): the slowest of the three
    mc = _tr(MC)
    assert float(offloaded_optimizer_s(params, mc, a100, shard)) == pytest.approx(max(cpu, 4 * P / link, 2 * P / link))
    # a host with twice the DRAM bandwidth halves the update; a fraction offloads its share
    fast = replace(a100, host_memory_bandwidth_GBps=2 * a100.host_memory_bandwidth_GBps)
    assert float(offloaded_optimizer_s(params, _tr(DS), fast, shard)) == pytest.approx(cpu / 2 + 2 * P / link)
    assert float(offloaded_optimizer_s(params, _tr(DS, 0.5), a100, shard)) == pytest.approx((cpu + 2 * P / link) / 2)
    assert a100.host_memory_bandwidth_GBps == pytest.approx(409.6 / 8)  # DGX A100: 2 sockets x 8 channels DDR4-3200, 8 GPUs
    assert get_device("H100-SXM5-80GB").host_link_GBps == 64.0 > a100.host_link_GBps


def test_deepspeed_keeps_its_zero_optimizer_when_offloading():
    # engine._do_optimizer_sanity_check: BF16_Optimizer at stage 1 with fp32 accumulation "and not self.zero_cpu_offload()"
    accum = training_from_dict({**DS, "grad_accum_dtype": "fp32"})
    assert bool(bf16_optimizer(accum, 1, 1)) and not bool(bf16_optimizer(replace(accum, optimizer_offload_fraction=1.0), 1, 1))


def test_an_estimate_trades_gpu_memory_for_step_time_and_says_what_the_host_holds():
    model, cluster = get_preset("llama2-13b"), simple_cluster("A100-SXM4-80GB", 1)
    s = Strategy(dp=8, micro_batch_size=1, recompute="full", zero_stage=2)
    on_gpu, offloaded = (estimate(model, t, cluster, s) for t in (training_from_dict(DS), _tr(DS)))
    assert offloaded.stages[0].memory_GB["optimizer_state"] == 0.0 < on_gpu.stages[0].memory_GB["optimizer_state"]
    assert offloaded.peak_memory_GB[0] < on_gpu.peak_memory_GB[0] - 20
    assert offloaded.step_time_s > on_gpu.step_time_s and offloaded.breakdown_s["optimizer"] > 10 * on_gpu.breakdown_s["optimizer"]
    note = next(w for w in offloaded.warnings if w.startswith("optimizer offload"))
    host_GB = 13.0e9 / 8 * 18 / 1e9
    assert f"{host_GB:.0f}." in note or f"{host_GB:.1f}" in note and "not calibrated" in note
    assert not any("offload" in w for w in on_gpu.warnings)
    assert "host_memory_GB" not in on_gpu.stages[0].to_dict() and offloaded.stages[0].to_dict()["host_memory_GB"] == pytest.approx(host_GB, rel=0.01)
    # the host's figures are not calibrated: the interval takes in its update at half and twice the priced time
    opt = offloaded.breakdown_s["optimizer"]
    assert offloaded.step_time_s_p10 <= offloaded.step_time_s - opt / 2 and offloaded.step_time_s_p90 >= offloaded.step_time_s + opt
    assert with_offload_spread(on_gpu, training_from_dict(DS)) is on_gpu
    # a host with less memory than the offloaded state: said so
    small = dict(get_device("A100-SXM4-80GB").to_dict(), name="a100-small-host", host_memory_GB=16.0)
    small.pop("profile_id"), small.pop("source")
    tiny_host = cluster_from_dict({"name": "c", "node_groups": [{"name": "n", "count": 1, "gpus_per_node": 8, "device": small}]})
    assert "runs out of memory" in next(w for w in estimate(model, _tr(DS), tiny_host, s).warnings if w.startswith("optimizer offload"))


@pytest.mark.parametrize("body, words", [
    ({**BASE, "framework": "fsdp"}, "CPUOffloadPolicy"),
    ({**BASE, "framework": "paddle", "optimizer": "sgd"}, "offloads Adam's state"),
    ({**BASE, "framework": "megatron-core"}, "precision_aware_optimizer: true"),
    ({**DS, "dtype": "fp32"}, "mixed-precision"),
    ({**DS, "optimizer": "sgd"}, "CPU Adam"),
])
def test_offload_a_framework_cannot_run_is_refused_by_field(body, words):
    with pytest.raises(InvalidTraining) as err:
        _tr(body)
    assert err.value.field == "training.optimizer_offload_fraction" and words in err.value.message


def test_paddle_keeps_the_state_on_the_host_and_updates_it_on_the_gpu_tensor_by_tensor():
    """PaddleNLP's tensorwise_offload_optimizer: the master weights and moments (12 bytes a
    parameter) live in pinned host memory; each parameter's are copied to the GPU for its adamw_
    op and back, synchronously, so the step is the GPU's update plus both copies over the link."""
    from cost_model.transformer.layer_cost import TENSORWISE_OFFLOAD_BYTES_PER_PARAM, tensorwise_offload_s

    model, cluster = get_preset("llama2-13b"), simple_cluster("A100-SXM4-80GB", 1)
    s = Strategy(dp=8, micro_batch_size=1, recompute="full", zero_stage=1)
    PD = {**BASE, "framework": "paddle"}
    on_gpu, offloaded = estimate(model, training_from_dict(PD), cluster, s), estimate(model, _tr(PD), cluster, s)
    params = model.total_params()
    assert on_gpu.stages[0].memory_GB["optimizer_state"] == pytest.approx(params * 12 / 8 / 1e9, rel=0.01)
    assert offloaded.stages[0].memory_GB["optimizer_state"] == 0.0
    assert offloaded.stages[0].memory_GB["gradients"] == on_gpu.stages[0].memory_GB["gradients"]  # updated on the GPU
    assert offloaded.stages[0].host_memory_GB == pytest.approx(params * TENSORWISE_OFFLOAD_BYTES_PER_PARAM / 8 / 1e9, rel=0.01)
    a100 = get_device("A100-SXM4-80GB")
    link = a100.host_link_GBps * 1e9 * HOST_LINK_FRACTION
    assert float(tensorwise_offload_s(8e9, a100, 8.0)) == pytest.approx(2 * 12 * 1e9 / link)
    added = offloaded.breakdown_s["optimizer"] - on_gpu.breakdown_s["optimizer"]
    assert added == pytest.approx(2 * 12 * params / 8 / link, rel=0.05)
    with pytest.raises(InvalidTraining) as err:
        _tr(PD, 0.5)
    assert err.value.field == "training.optimizer_offload_fraction" and "moves all of the optimizer state" in err.value.message
    with pytest.raises(InvalidStrategy) as err:
        estimate(model, _tr(PD), cluster, Strategy(dp=8, micro_batch_size=1, zero_stage=3))
    assert err.value.field == "strategy.zero_stage"


def test_bad_fractions_and_deepspeeds_own_spelling_are_refused_by_field():
    for bad in (-0.1, 1.5, "all", True):
        with pytest.raises(InvalidTraining) as err:
            training_from_dict({**DS, "optimizer_offload_fraction": bad})
        assert err.value.field == "training.optimizer_offload_fraction"
    with pytest.raises(InvalidTraining) as err:
        training_from_dict({**DS, "offload_optimizer": {"device": "cpu"}})
    assert err.value.field == "training.offload_optimizer" and "optimizer_offload_fraction" in err.value.message
    assert "optimizer_offload_fraction" not in training_from_dict(DS).to_dict()
    assert _tr(DS, 0.5).to_dict()["optimizer_offload_fraction"] == 0.5


@pytest.mark.parametrize("fraction, zero, words", [(1.0, 0, "zero_stage 1/2/3"), (0.5, 2, "zero_stage 3 only")])
def test_the_sharding_stage_must_run_the_offload(fraction, zero, words):
    model, cluster = get_preset("llama2-7b"), simple_cluster("A100-SXM4-80GB", 1)
    with pytest.raises(InvalidStrategy) as err:
        estimate(model, _tr(DS, fraction), cluster, Strategy(dp=8, micro_batch_size=1, zero_stage=zero))
    assert err.value.field == "strategy.zero_stage" and words in err.value.message


def test_a_cpu_device_has_nothing_to_offload():
    with pytest.raises(InvalidTraining) as err:
        estimate(get_preset("gpt3-125m"), _tr(DS), simple_cluster("local-cpu", 1, gpus_per_node=1),
                 Strategy(dp=1, micro_batch_size=1, zero_stage=1))
    assert err.value.field == "training.optimizer_offload_fraction" and "CPU device" in err.value.message


def _plan_request(training: dict) -> dict:
    return {"model": {"preset": "llama2-13b"}, "training": training,
            "cluster": {"name": "c", "node_groups": [{"name": "n", "count": 1, "gpus_per_node": 8, "device": "A100-SXM4-40GB"}]},
            "constraints": {"tp": 1, "pp": 1, "cp": 1, "zero_stage": 2}}


def test_the_planner_finds_a_layout_only_offload_fits(client):
    # Llama 2 13B on 8 A100 40GB under ZeRO-2 without model parallelism: the 16-bit weights (26 GB)
    # and the fp32 partitions do not fit; with ZeRO-Offload they do, and the plan's launch writes
    # the offload
    body = {**DS, "global_batch_size": 16, "sequence_length": 2048}
    refused = client.post("/v1/plans", json=_plan_request(body))
    assert refused.status_code == 422 and refused.json()["error"]["code"] == "no_feasible_plan", refused.text
    # the refusal names the settings that would free the memory
    assert "training.optimizer_offload_fraction keeps the optimizer state in host memory" in refused.json()["error"]["message"]
    r = client.post("/v1/plans", json=_plan_request({**body, "optimizer_offload_fraction": 1.0}))
    assert r.status_code in (200, 201), r.text
    plan = r.json()
    assert plan["training"]["optimizer_offload_fraction"] == 1.0 and plan["best"]["strategy"]["zero_stage"] == 2
    assert any(w.startswith("optimizer offload") for w in plan["best"]["prediction"]["warnings"])
    # the host's share is data, per stage, beside the GPU's peak
    assert plan["best"]["prediction"]["stages"][0]["host_memory_GB"] == pytest.approx(13.0e9 / 8 * 18 / 1e9, rel=0.01)
    launch = client.get(f"/v1/plans/{plan['id']}/launch", params={"target": "deepspeed-config"})
    assert launch.status_code == 200, launch.text
    ds = json.loads(next(v for k, v in launch.json()["files"].items() if k.endswith(".json")))
    assert ds["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": True}


def test_the_cli_estimates_an_offloaded_layout(cli, tmp_path):
    body = {"model": {"preset": "llama2-13b"}, "training": {**MC, "optimizer_offload_fraction": 0.5},
            "cluster": {"name": "c", "node_groups": [{"name": "n", "count": 1, "gpus_per_node": 8, "device": "H100-SXM5-80GB"}]},
            "strategy": {"dp": 8, "zero_stage": 1, "micro_batch_size": 1, "recompute": "full"}}
    out = cli_estimates_then_refuses(cli, tmp_path, body, {**BASE, "framework": "fsdp", "optimizer_offload_fraction": 0.5},
                                     "training.optimizer_offload_fraction")
    assert any(w.startswith("optimizer offload (0.5 of the state)") for w in out["warnings"])
    assert out["stages"][0]["host_memory_GB"] == pytest.approx(13.0e9 / 8 * 16 * 0.5 / 1e9, rel=0.01)


def test_megatron_core_launch_parses_as_megatron_lm_does():
    # the rendered megatron launch of an offloading plan: the hybrid optimizer beside the
    # precision-aware optimizer it needs, through Megatron-LM's declared flags
    from helpers.megatron_args import megatron_words, parse_as_megatron
    from helpers.plans import ALL_PLANS

    plan = ALL_PLANS["homogeneous"]()
    plan["training"].update(framework="megatron-core", precision_aware_optimizer=True, optimizer_offload_fraction=0.5)
    plan["best"]["strategy"]["zero_stage"] = 1
    args = parse_as_megatron(megatron_words(plan))
    assert args.optimizer_cpu_offload and args.use_precision_aware_optimizer and args.overlap_cpu_optimizer_d2h_h2d
    assert float(args.optimizer_offload_fraction) == 0.5


def test_megatron_core_launch_runs_the_hybrid_optimizer():
    from planner_service.exporters.frameworks import megatron_reference, optimizer_offload_args

    args = optimizer_offload_args(_tr(MC, 0.75).to_dict())
    assert args == [("--optimizer-cpu-offload", None), ("--optimizer-offload-fraction", "0.75"), ("--overlap-cpu-optimizer-d2h-h2d", None)]
    assert all(flag in megatron_reference() for flag, _ in args)  # Megatron-LM's own flags
    assert optimizer_offload_args(training_from_dict(MC).to_dict()) == []
    assert np.isfinite(float(offloaded_optimizer_s(1e9, _tr(MC), get_device("GB200-NVL72-186GB"), 1.0)))


# FSDP's CPU offload (training.cpu_offload): FSDP2's CPUOffloadPolicy, the whole sharded state on the host

FSDP = {**BASE, "framework": "fsdp"}


def _fsdp(**kw) -> Training:
    return training_from_dict({**FSDP, "cpu_offload": True, **kw})


def test_fsdp_cpu_offload_takes_the_sharded_state_off_the_gpu():
    w, g, o = (float(x) for x in model_state_bytes_per_param(_fsdp(), 3, 8.0, 1))
    assert (w, g, o) == (0.0, 0.0, 0.0)
    assert sum(float(x) for x in model_state_bytes_per_param(training_from_dict(FSDP), 3, 8.0, 1)) == pytest.approx(16.0 / 8)
    assert offloaded_state_bytes_per_param(_fsdp()) == 16.0  # fp32 master, gradient, two moments
    assert offloaded_state_bytes_per_param(_fsdp(master_weights=False)) == 8.0  # pure bf16: 2 + 2 + 4


def test_fsdp_cpu_offload_copies_every_gather_and_reduce_and_steps_on_the_host():
    from cost_model.transformer.layer_cost import (
        CPU_OFFLOAD_ADAM_BYTES_PER_PARAM,
        cpu_offload_microbatch_s,
        cpu_offload_step_s,
        gradient_reduce_bytes,
    )

    a100, t = get_device("A100-SXM4-80GB"), _fsdp()
    P, shard = 1e9, 8.0
    host = a100.host_memory_bandwidth_GBps * 1e9 * FAMILY_EFFICIENCY["cpu"].memory_fraction
    link = a100.host_link_GBps * 1e9 * HOST_LINK_FRACTION
    assert float(cpu_offload_step_s(P * shard, t, a100, shard)) == pytest.approx(P * CPU_OFFLOAD_ADAM_BYTES_PER_PARAM / host)
    h2d, d2h = 2 * 4 * P / link, gradient_reduce_bytes(t) * P / link
    add = 3 * gradient_reduce_bytes(t) * P / host
    # one micro-batch: the copies hide behind its compute
    assert float(cpu_offload_microbatch_s(P * shard, t, a100, shard, 10.0, 1)) == 0.0
    assert float(cpu_offload_microbatch_s(P * shard, t, a100, shard, 0.0, 1)) == pytest.approx(h2d + d2h)
    # accumulating: each later micro-batch's gradient copy is synchronous and the host adds it
    assert float(cpu_offload_microbatch_s(P * shard, t, a100, shard, 10.0, 4)) == pytest.approx(3 * (d2h + add) / 4)


def test_an_fsdp_cpu_offload_estimate_fits_what_full_sharding_alone_does_not():
    model, cluster = get_preset("llama2-70b"), simple_cluster("H100-SXM5-80GB", 1)
    s = Strategy(dp=8, micro_batch_size=1, recompute="full", zero_stage=3)
    on_gpu, offloaded = (estimate(model, t, cluster, s) for t in (training_from_dict(FSDP), _fsdp()))
    assert not on_gpu.fits and offloaded.fits and offloaded.peak_memory_GB[0] < 30
    # the host copies and adds in their own term, not in the data-parallel traffic
    assert offloaded.step_time_s > on_gpu.step_time_s and offloaded.breakdown_s["offload_exposed"] > 0.0
    assert on_gpu.breakdown_s["offload_exposed"] == 0.0
    assert offloaded.breakdown_s["dp_comm_exposed"] == pytest.approx(on_gpu.breakdown_s["dp_comm_exposed"], rel=1e-9)
    note = next(w for w in offloaded.warnings if w.startswith("CPU offload of the sharded"))
    assert f"{69e9 * 16 / 8 / 1e9:.0f}" in note.split(" GB")[0] and "within the 256 GB per GPU" in note
    host_s = offloaded.breakdown_s["optimizer"] + offloaded.breakdown_s["offload_exposed"]
    assert offloaded.step_time_s_p90 >= offloaded.step_time_s + host_s - 1e-9


@pytest.mark.parametrize("body, strategy, field, words", [
    ({**BASE, "framework": "megatron-core", "cpu_offload": True}, None, "training.cpu_offload", "optimizer_offload_fraction"),
    ({**FSDP, "cpu_offload": True, "dtype": "fp8"}, None, "training.cpu_offload", "bf16, fp16 or fp32"),
    ({**FSDP, "cpu_offload": True}, {"dp": 8, "zero_stage": 2}, "strategy.zero_stage", "zero_stage 3"),
    ({**FSDP, "cpu_offload": True}, {"dp": 4, "pp": 2, "zero_stage": 3}, "strategy.pp", "pp 1"),
    ({**FSDP, "cpu_offload": "yes"}, None, "training.cpu_offload", "true or false"),
])
def test_fsdp_cpu_offload_that_cannot_run_is_refused_by_field(body, strategy, field, words):
    with pytest.raises((InvalidTraining, InvalidStrategy)) as err:
        t = training_from_dict(body)
        estimate(get_preset("llama2-7b"), t, simple_cluster("A100-SXM4-80GB", 1), Strategy(micro_batch_size=1, **strategy))
    assert err.value.field == field and words in err.value.message


def test_the_planner_plans_fsdp_cpu_offload(client):
    # Llama 2 70B on 8 H100 without model parallelism fits only with its sharded state on the host
    req = {"model": {"preset": "llama2-70b"}, "training": {**FSDP, "global_batch_size": 16, "sequence_length": 2048},
           "cluster": {"name": "c", "node_groups": [{"name": "n", "count": 1, "gpus_per_node": 8, "device": "H100-SXM5-80GB"}]},
           "constraints": {"tp": 1, "pp": 1, "cp": 1}}
    plan = planned_once_offloaded(client, req, "cpu_offload", "training.cpu_offload keeps the whole sharded state in host memory")
    assert plan["best"]["strategy"]["zero_stage"] == 3
    assert any(w.startswith("CPU offload of the sharded") for w in plan["best"]["prediction"]["warnings"])
    launch = client.get(f"/v1/plans/{plan['id']}/launch", params={"target": "torchtitan"})
    assert launch.status_code == 200, launch.text
    assert "enable_cpu_offload = true" in next(v for k, v in launch.json()["files"].items() if k.endswith(".toml"))


def test_deepspeed_zero3_offload_is_its_cpu_offload():
    # DeepSpeed's ZeRO-3 Offload (offload_param + offload_optimizer): its 16-bit partitions on the
    # host, fetched for each gather, its CPU Adam over the fp32 state; the launch writes both sections
    from cost_model.transformer.layer_cost import cpu_offload_microbatch_s, cpu_offload_step_s

    t = training_from_dict({**DS, "cpu_offload": True})
    assert [float(x) for x in model_state_bytes_per_param(t, 3, 8.0, 1)] == [0.0, 0.0, 0.0]
    assert offloaded_state_bytes_per_param(t) == 18.0  # 16-bit partition, fp32 gradient, master and moments
    a100 = get_device("A100-SXM4-80GB")
    host = a100.host_memory_bandwidth_GBps * 1e9 * FAMILY_EFFICIENCY["cpu"].memory_fraction
    link = a100.host_link_GBps * 1e9 * HOST_LINK_FRACTION
    assert float(cpu_offload_step_s(8e9, t, a100, 8.0)) == pytest.approx(1e9 * HOST_ADAM_BYTES_PER_PARAM / host)
    assert float(cpu_offload_microbatch_s(8e9, t, a100, 8.0, 0.0, 1)) == pytest.approx((2 * 2 + 2) * 1e9 / link)
    for body, words in (({**DS, "cpu_offload": True, "optimizer": "sgd"}, "CPU Adam"),
                        ({**DS, "cpu_offload": True, "optimizer_offload_fraction": 0.5}, "all of the optimizer state"),
                        ({**DS, "cpu_offload": True, "dtype": "fp32"}, "bf16 or fp16")):
        with pytest.raises(InvalidTraining) as err:
            training_from_dict(body)
        assert err.value.field == "training.cpu_offload" and words in err.value.message
    with pytest.raises(InvalidStrategy) as err:
        estimate(get_preset("llama2-7b"), t, simple_cluster("A100-SXM4-80GB", 1), Strategy(dp=8, micro_batch_size=1, zero_stage=2))
    assert err.value.field == "strategy.zero_stage"



def test_zero_offload_accumulates_its_gradients_on_the_host_under_gradient_accumulation():
    # stage 1-2 ZeRO-Offload keeps the accumulated 16-bit gradients on the host: (m - 1) copies out
    # and (m - 1) back a step, hidden behind the backward passes as far as they last
    from cost_model.transformer.layer_cost import zero_offload_accumulation_s

    a100, t = get_device("A100-SXM4-80GB"), _tr(DS)
    link = a100.host_link_GBps * 1e9 * HOST_LINK_FRACTION
    P = 1e9
    assert float(zero_offload_accumulation_s(8 * P, t, a100, 8.0, 0.0, 1)) == 0.0  # nothing to accumulate
    assert float(zero_offload_accumulation_s(8 * P, t, a100, 8.0, 0.0, 4)) == pytest.approx(3 * 2 * 2 * P / link / 4)
    assert float(zero_offload_accumulation_s(8 * P, t, a100, 8.0, 10.0, 4)) == 0.0  # a long backward hides them
