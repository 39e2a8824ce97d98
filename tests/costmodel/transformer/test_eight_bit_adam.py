"""The 8-bit AdamW (``training.optimizer`` ``adamw_8bit``: bitsandbytes' AdamW8bit / PagedAdamW8bit,
torchao's AdamW8bit): Adam's two moments quantised blockwise to 8 bits with an fp32 scale per
block.  The optimizer state shrinks from 12 to about 6 bytes a parameter under mixed precision
(4 with its fp32 master), the step moves 22 bytes a parameter instead of 34; frameworks whose
trainers do not run it, and FSDP's state on the host, are a 422 naming the field; DeepSpeed steps
an offloaded 8-bit state on the host when told to keep the client optimizer."""

from __future__ import annotations

import json

import pytest

from cost_model.cluster import simple_cluster
from cost_model.errors import InvalidTraining
from cost_model.estimate import estimate
from cost_model.strategy import Strategy
from cost_model.training import training_from_dict
from cost_model.transformer.layer_cost import (
    EIGHT_BIT_MOMENT_BYTES,
    model_state_bytes_per_param,
    optimizer_bytes_per_param,
)
from cost_model.transformer.spec import get_preset
from helpers.cli_estimate import cli_estimates_then_refuses

FSDP = {"global_batch_size": 64, "sequence_length": 4096, "framework": "fsdp"}
H100 = "H100-SXM5-80GB"


def _tr(**kw) -> object:
    return training_from_dict({**FSDP, **kw})


@pytest.mark.parametrize("extra, master", [({}, 4.0), ({"master_weights": False}, 0.0), ({"dtype": "fp32"}, 0.0)])
def test_the_moments_take_a_byte_each_and_their_block_scales(extra, master):
    _, _, adam = (float(x) for x in model_state_bytes_per_param(_tr(optimizer="adamw", **extra), 0, 1.0, 1))
    _, _, eight = (float(x) for x in model_state_bytes_per_param(_tr(optimizer="adamw_8bit", **extra), 0, 1.0, 1))
    assert eight == pytest.approx(master + 2 * (1 + 4 / 256))
    assert EIGHT_BIT_MOMENT_BYTES == 1.0 + 1.0 / 64.0
    assert adam - eight == pytest.approx((8.0 if master or "dtype" in extra else 4.0) - 2 * EIGHT_BIT_MOMENT_BYTES)


def test_the_step_moves_the_8_bit_moments():
    # master r/w 8, moments r/w 4.06, gradient twice (step and norm) 8, the 16-bit weight 2
    assert optimizer_bytes_per_param(_tr(optimizer="adamw_8bit")) == pytest.approx(22.0 + 4 * 4 / 256)
    assert optimizer_bytes_per_param(_tr(optimizer="adamw")) == 34.0
    assert optimizer_bytes_per_param(_tr(optimizer="adamw_8bit", master_weights=False)) == pytest.approx(12.0 + 4 * 4 / 256)


@pytest.mark.parametrize("framework, zero", [("fsdp", 3), ("fsdp", 0), ("deepspeed", 2)])
def test_an_estimate_with_the_8_bit_adamw_holds_less_and_steps_faster(framework, zero):
    model, cluster = get_preset("llama3-8b"), simple_cluster(H100, 1)
    s = Strategy(dp=8, zero_stage=zero, micro_batch_size=2, recompute="full")
    adam, eight = (estimate(model, _tr(framework=framework, optimizer=o), cluster, s) for o in ("adamw", "adamw_8bit"))
    shard = 8 if zero >= 1 else 1
    saved = adam.stages[0].memory_GB["optimizer_state"] - eight.stages[0].memory_GB["optimizer_state"]
    assert saved == pytest.approx(model.total_params() * (8 - 2 * EIGHT_BIT_MOMENT_BYTES) / shard / 1e9, rel=0.01)
    for key in ("weights", "gradients", "activations"):
        assert eight.stages[0].memory_GB[key] == pytest.approx(adam.stages[0].memory_GB[key], rel=1e-9), key
    assert eight.breakdown_s["optimizer"] < adam.breakdown_s["optimizer"] and eight.step_time_s < adam.step_time_s


@pytest.mark.parametrize("body, field, words", [
    ({**FSDP, "framework": "megatron-core"}, "training.optimizer", "exp_avg_dtype"),
    ({**FSDP, "framework": "paddle"}, "training.optimizer", "adamw_8bit is priced for deepspeed"),
    ({**FSDP, "framework": "megatron-deepspeed"}, "training.optimizer", "adamw_8bit is priced for"),
    ({**FSDP, "cpu_offload": True}, "training.optimizer", "GPU kernels"),
])
def test_the_8_bit_adamw_where_it_cannot_run_is_refused_by_field(body, field, words):
    with pytest.raises(InvalidTraining) as err:
        training_from_dict({**body, "optimizer": "adamw_8bit"})
    assert err.value.field == field and words in err.value.message


def test_deepspeed_steps_an_offloaded_8_bit_state_on_the_host():
    """DeepSpeed keeping the client 8-bit AdamW for its offloaded state (zero_force_ds_cpu_optimizer
    false): the host holds the fp32 master, the 8-bit moments and the fp32 gradient (10 bytes a
    parameter, with DeepSpeed's 16-bit staging copy 12, against Adam's 18) and its update streams
    22 bytes a parameter against CPU Adam's 34 — so the host step is shorter and the GPU memory
    the same."""
    from cost_model.transformer.layer_cost import (
        HOST_ADAM_BYTES_PER_PARAM,
        HOST_ADAMW_8BIT_BYTES_PER_PARAM,
        offloaded_state_bytes_per_param,
    )

    ds = {**FSDP, "framework": "deepspeed", "optimizer_offload_fraction": 1.0}
    adam, eight = _tr(**ds), _tr(**ds, optimizer="adamw_8bit")
    assert offloaded_state_bytes_per_param(adam) == pytest.approx(18.0)
    assert offloaded_state_bytes_per_param(eight) == pytest.approx(10.0 + 2.0 * (EIGHT_BIT_MOMENT_BYTES - 1.0) + 2.0)
    assert abs(HOST_ADAMW_8BIT_BYTES_PER_PARAM - 22.0) < 0.1 and HOST_ADAMW_8BIT_BYTES_PER_PARAM < HOST_ADAM_BYTES_PER_PARAM
    model, cluster = get_preset("llama3-8b"), simple_cluster(H100, 1)
    s = Strategy(dp=8, zero_stage=2, micro_batch_size=1, recompute="full")
    a, e = estimate(model, adam, cluster, s), estimate(model, eight, cluster, s)
    assert e.stages[0].host_memory_GB < a.stages[0].host_memory_GB
    assert e.breakdown_s["optimizer"] < a.breakdown_s["optimizer"]
    assert e.stages[0].peak_memory_GB == pytest.approx(a.stages[0].peak_memory_GB, rel=1e-9)
    # ZeRO-3 Offload of everything takes it too
    estimate(model, _tr(**ds, optimizer="adamw_8bit", cpu_offload=True), cluster, Strategy(dp=8, zero_stage=3, micro_batch_size=1, recompute="full"))


def test_an_operator_graph_refuses_it():
    from cost_model.graph.evaluate import refuse_graph_unpriced

    with pytest.raises(InvalidTraining) as err:
        refuse_graph_unpriced(_tr(optimizer="adamw_8bit"))
    assert err.value.field == "training.optimizer"


def test_the_planner_plans_with_it_and_the_launch_says_how(client):
    # Llama 2 13B replicated (DDP, pure bf16) on 8 H100: AdamW's bf16 moments do not fit beside the
    # replicated weights and gradients, the 8-bit moments do (under full recompute, memory-tight)
    cluster = {"name": "c", "node_groups": [{"name": "n", "count": 1, "gpus_per_node": 8, "device": H100}]}
    req = {"model": {"preset": "llama2-13b"}, "training": {**FSDP, "global_batch_size": 16, "sequence_length": 2048, "master_weights": False},
           "cluster": cluster, "constraints": {"tp": 1, "pp": 1, "cp": 1, "zero_stage": 0}}
    refused = client.post("/v1/plans", json=req)
    assert refused.status_code == 422 and refused.json()["error"]["code"] == "no_feasible_plan", refused.text
    r = client.post("/v1/plans", json={**req, "training": {**req["training"], "optimizer": "adamw_8bit"}})
    assert r.status_code in (200, 201), r.text
    plan = r.json()
    assert plan["training"]["optimizer"] == "adamw_8bit" and plan["best"]["prediction"]["fits"]
    # under DeepSpeed the launch lets ZeRO take it as a client optimizer
    req = {"model": {"preset": "llama3-8b"}, "training": {**FSDP, "framework": "deepspeed", "global_batch_size": 16,
                                                         "sequence_length": 2048, "optimizer": "adamw_8bit"},
           "cluster": cluster, "constraints": {"zero_stage": 1}}
    r = client.post("/v1/plans", json=req)
    assert r.status_code in (200, 201), r.text
    launch = client.get(f"/v1/plans/{r.json()['id']}/launch", params={"target": "deepspeed-config"})
    assert launch.status_code == 200, launch.text
    ds = json.loads(next(v for k, v in launch.json()["files"].items() if k.endswith(".json")))
    assert ds["zero_allow_untested_optimizer"] is True
    assert any("AdamW8bit" in n for n in launch.json()["notes"])


def test_the_cli_estimates_with_it(cli, tmp_path):
    body = {"model": {"preset": "llama3-8b"}, "training": {**FSDP, "optimizer": "adamw_8bit"},
            "cluster": {"name": "c", "node_groups": [{"name": "n", "count": 1, "gpus_per_node": 8, "device": H100}]},
            "strategy": {"dp": 8, "zero_stage": 3, "micro_batch_size": 2, "recompute": "full"}}
    out = cli_estimates_then_refuses(cli, tmp_path, body, {**body["training"], "framework": "megatron-core"}, "training.optimizer")
    assert out["memory_breakdown_GB"][0]["optimizer_state"] < 2.1
