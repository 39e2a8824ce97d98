"""FP8 training's weights under Megatron-Core: Transformer Engine casts each 16-bit weight to FP8
at a step's first micro-batch and keeps the cast (with its transpose on Hopper) for the rest,
2 bytes a decoder linear weight beside the 16-bit one; with ``training.fp8_param_gather``
(``--fp8-param-gather``) the weight is the FP8 tensor, held in as many bytes as the 16-bit one it
replaces, and the distributed optimizer all-gathers it in one byte instead of two.  torchao's
float8 under FSDP casts as it goes and keeps no copy."""

from __future__ import annotations

import numpy as np
import pytest

from cost_model.cluster import simple_cluster
from cost_model.comm import Links
from cost_model.errors import InvalidStrategy, InvalidTraining
from cost_model.estimate import estimate
from cost_model.graph.evaluate import refuse_graph_unpriced
from cost_model.strategy import Strategy
from cost_model.training import training_from_dict
from cost_model.transformer.layer_cost import StrategyArrays, dp_gradient_comm_s
from cost_model.transformer.spec import get_preset
from cost_model.transformer.stage_cost import dense_layer_params
from helpers.cli_estimate import cli_estimates_then_refuses

MC = {"global_batch_size": 64, "sequence_length": 4096, "framework": "megatron-core"}
H100 = "H100-SXM5-80GB"


def _weights_GB(dtype: str, device: str = H100, framework: str = "megatron-core", zero: int = 1, **kw) -> float:
    model = get_preset("llama3-8b")
    training = training_from_dict({**MC, "framework": framework, "dtype": dtype, **kw})
    est = estimate(model, training, simple_cluster(device, 1), Strategy(dp=4, tp=2, zero_stage=zero, micro_batch_size=1, recompute="full",
                                                                      sequence_parallel=True))
    return est.stages[0].memory_GB["weights"]


def test_megatron_keeps_an_fp8_cast_and_its_transpose_of_every_decoder_weight():
    model = get_preset("llama3-8b")
    linear = model.num_layers * dense_layer_params(model) / 2  # the decoder's weights on one of tp 2
    assert _weights_GB("fp8") - _weights_GB("bf16") == pytest.approx(linear * 2.0 / 1e9, rel=1e-6)
    # Blackwell's MXFP8: both copies carry an E8M0 scale a 32 values
    assert _weights_GB("fp8", "B200") - _weights_GB("bf16", "B200") == pytest.approx(linear * 2.0 * (1 + 1 / 32) / 1e9, rel=1e-6)
    # FP8 weights replace the 16-bit ones: no cast kept beside them
    assert _weights_GB("fp8", fp8_param_gather=True) == pytest.approx(_weights_GB("bf16"))


def test_fsdp_float8_keeps_no_cast():
    assert _weights_GB("fp8", framework="fsdp", zero=2) == pytest.approx(_weights_GB("bf16", framework="fsdp", zero=2))
    # nor with its FP8 all-gather: the shard stays as it was, cast before each gather
    assert _weights_GB("fp8", framework="fsdp", zero=2, fp8_param_gather=True) == pytest.approx(_weights_GB("bf16", framework="fsdp", zero=2))


def test_fsdp_float8_all_gather_moves_and_holds_the_gathered_decoder_weights_in_one_byte():
    """torchao's enable_fsdp_float8_all_gather (torchtitan's float8 with
    precompute_float8_dynamic_scale_for_fsdp): FSDP2 casts each shard of a linear weight to FP8
    and all-gathers that, so the gathered layers held in the forward and backward take one byte a
    decoder weight instead of two, and the gathers move half the bytes; the sharded weights, the
    compute and the embedding's and head's gathers are unchanged."""
    model, cluster = get_preset("llama3-70b"), simple_cluster(H100, 8)
    fsdp = {**MC, "framework": "fsdp", "dtype": "fp8", "global_batch_size": 64}
    s = Strategy(dp=64, zero_stage=3, micro_batch_size=1, recompute="full")
    off, on = (estimate(model, training_from_dict({**fsdp, "fp8_param_gather": g}), cluster, s) for g in (False, True))
    assert on.stages[0].memory_GB["weights"] == pytest.approx(off.stages[0].memory_GB["weights"])
    assert on.stages[0].memory_GB["activations"] < off.stages[0].memory_GB["activations"]  # the gathered layers in 8 bits
    assert on.breakdown_s["compute"] == pytest.approx(off.breakdown_s["compute"])
    assert on.step_time_s < off.step_time_s
    # without sharding there is no gather to run in FP8
    with pytest.raises(InvalidStrategy) as err:
        estimate(model, training_from_dict({**fsdp, "fp8_param_gather": True}), cluster, Strategy(dp=64, zero_stage=0, micro_batch_size=1))
    assert err.value.field.endswith("zero_stage") and "fully_shard" in str(err.value)


def test_fp8_weights_halve_the_distributed_optimizers_weight_gather():
    training = training_from_dict({**MC, "dtype": "fp8", "fp8_param_gather": True})
    S = StrategyArrays.from_strategies([Strategy(dp=64, zero_stage=1, micro_batch_size=1)])
    links = Links(450.0, 50.0, 8, 5e-6)
    params = 8e9
    full = dp_gradient_comm_s(params, training, S, links)[0][0]
    half = dp_gradient_comm_s(params, training, S, links, weight_fraction=0.5)[0][0]
    # a step moves each value twice: the fp32 gradient (4 bytes) and the updated weight (2; FP8: 1)
    weight_gather = full * 2.0 / (4.0 + 2.0)
    assert full - half == pytest.approx(weight_gather / 2.0, rel=0.05)
    # and so does the estimate's exposed DP time, which is all that changes
    model, cluster = get_preset("llama3-8b"), simple_cluster(H100, 8)
    s = Strategy(dp=64, zero_stage=1, micro_batch_size=1, recompute="full")
    off, on = (estimate(model, training_from_dict({**MC, "global_batch_size": 128, "dtype": "fp8", "fp8_param_gather": g}), cluster, s)
               for g in (False, True))
    assert on.breakdown_s["compute"] == off.breakdown_s["compute"]
    assert on.breakdown_s["dp_comm_exposed"] <= off.breakdown_s["dp_comm_exposed"]
    assert on.step_time_s <= off.step_time_s


def test_megatron_fsdp_gathers_fp8_weights_in_one_byte():
    model, cluster = get_preset("llama3-8b"), simple_cluster(H100, 1)
    s = Strategy(dp=8, zero_stage=3, micro_batch_size=1, recompute="full")
    off, on = (estimate(model, training_from_dict({**MC, "dtype": "fp8", "fp8_param_gather": g}), cluster, s) for g in (False, True))
    assert on.stages[0].memory_GB["activations"] < off.stages[0].memory_GB["activations"]  # the gathered layers in 8 bits
    assert on.step_time_s <= off.step_time_s


@pytest.mark.parametrize("body, field, needle", [
    ({**MC, "framework": "deepspeed", "fp8_param_gather": True}, "training.fp8_param_gather", "megatron-core: --fp8-param-gather"),
    ({**MC, "dtype": "bf16", "fp8_param_gather": True}, "training.fp8_param_gather", "need FP8 training"),
    ({**MC, "dtype": "fp8", "fp8_param_gather": True, "optimizer_offload_fraction": 1.0, "precision_aware_optimizer": True},
     "training.fp8_param_gather", "optimizer CPU offload"),
    ({**MC, "dtype": "fp8", "fp8_param_gather": "yes"}, "training.fp8_param_gather", "true or false"),
])
def test_what_cannot_hold_fp8_weights_is_refused(body, field, needle):
    with pytest.raises(InvalidTraining) as err:
        training_from_dict(body)
    assert err.value.field == field and needle in str(err.value), str(err.value)


def test_fp8_weights_need_a_sharded_optimizer():
    model, cluster = get_preset("llama3-8b"), simple_cluster(H100, 1)
    training = training_from_dict({**MC, "dtype": "fp8", "fp8_param_gather": True})
    with pytest.raises(InvalidStrategy) as err:
        estimate(model, training, cluster, Strategy(dp=8, zero_stage=0, micro_batch_size=1, recompute="full"))
    assert err.value.field.endswith("zero_stage") and "distributed optimizer" in str(err.value)
    with pytest.raises(InvalidTraining) as graph_err:
        refuse_graph_unpriced(training)
    assert graph_err.value.field == "training.fp8_param_gather"


def test_planned_launched_and_refused_through_the_api(client):
    req = {"model": {"preset": "llama3-8b"}, "cluster": {"name": "c", "node_groups": [{"name": "n", "count": 1, "gpus_per_node": 8, "device": H100}]},
           "training": {**MC, "dtype": "fp8", "fp8_param_gather": True}, "constraints": {"pp": 1}}
    r = client.post("/v1/plans", json=req)
    assert r.status_code in (200, 201), r.text
    plan = r.json()
    assert plan["training"]["fp8_param_gather"] is True and plan["best"]["strategy"]["zero_stage"] >= 1
    args = client.get(f"/v1/plans/{plan['id']}/launch", params={"target": "megatron"}).json()["files"]["megatron_args.sh"]
    assert "--fp8-param-gather\n" in args
    pinned = client.post("/v1/plans", json={**req, "constraints": {"pp": 1, "zero_stage": 0}})
    assert pinned.status_code == 422 and pinned.json()["error"]["field"] == "constraints.zero_stage"
    plain = client.post("/v1/plans", json={**req, "training": {**MC, "dtype": "fp8"}})
    args = client.get(f"/v1/plans/{plain.json()['id']}/launch", params={"target": "megatron"}).json()["files"]["megatron_args.sh"]
    assert "--fp8-param-gather" not in args
    mem = [p["prediction"]["memory_breakdown_GB"][0]["weights"] for p in (plan["best"], plain.json()["best"])]
    assert np.isfinite(mem).all()


def test_the_cli_estimates_with_it(cli, tmp_path):
    body = {"model": {"preset": "llama3-8b"}, "training": {**MC, "dtype": "fp8", "fp8_param_gather": True},
            "cluster": {"name": "c", "node_groups": [{"name": "n", "count": 1, "gpus_per_node": 8, "device": H100}]},
            "strategy": {"dp": 4, "tp": 2, "zero_stage": 1, "micro_batch_size": 1, "recompute": "full", "sequence_parallel": True}}
    out = cli_estimates_then_refuses(cli, tmp_path, body, {**body["training"], "framework": "deepspeed", "dtype": "bf16"}, "training.fp8_param_gather")
    assert out["memory_breakdown_GB"][0]["weights"] == pytest.approx(_weights_GB("bf16"))


def test_an_fsdp_plan_gathers_in_fp8_and_its_torchtitan_launch_says_how(client):
    req = {"model": {"preset": "llama3-8b"}, "cluster": {"name": "c", "node_groups": [{"name": "n", "count": 1, "gpus_per_node": 8, "device": H100}]},
           "training": {**MC, "framework": "fsdp", "dtype": "fp8", "fp8_param_gather": True}, "constraints": {"pp": 1}}
    r = client.post("/v1/plans", json=req)
    assert r.status_code in (200, 201), r.text
    plan = r.json()
    assert plan["training"]["fp8_param_gather"] is True and plan["best"]["strategy"]["zero_stage"] in (2, 3)
    notes = client.get(f"/v1/plans/{plan['id']}/launch", params={"target": "torchtitan"}).json()["notes"]
    assert any("enable_fsdp_float8_all_gather" in n for n in notes)
