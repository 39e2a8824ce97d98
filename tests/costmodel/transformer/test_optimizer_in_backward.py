"""The optimizer step inside the backward (``training.optimizer_in_backward``, ``fsdp``: torchtune's
``optimizer_in_bwd``): each parameter stepped in its post-accumulate-grad hook and its gradient
freed, so no gradient is held for the step; one micro-batch a step, no pipeline, no expert
parallelism; refused by field elsewhere."""

from __future__ import annotations

import pytest

from cost_model.cluster import simple_cluster
from cost_model.errors import InvalidStrategy, InvalidTraining
from cost_model.estimate import estimate
from cost_model.strategy import Strategy
from cost_model.training import training_from_dict
from cost_model.transformer.spec import get_preset
from helpers.cli_estimate import cli_estimates_then_refuses

H100 = "H100-SXM5-80GB"
FSDP = {"global_batch_size": 16, "sequence_length": 4096, "framework": "fsdp"}


def _tr(**kw):
    return training_from_dict({**FSDP, **kw})


@pytest.mark.parametrize("zero", [0, 2, 3])
def test_no_gradient_is_held_for_the_step_and_the_rest_is_unchanged(zero):
    model, cluster = get_preset("llama3-8b"), simple_cluster(H100, 1)
    s = Strategy(dp=8, zero_stage=zero, micro_batch_size=2, recompute="full")
    after, inside = (estimate(model, _tr(optimizer_in_backward=flag), cluster, s) for flag in (False, True))
    assert after.stages[0].memory_GB["gradients"] > 1.0 and inside.stages[0].memory_GB["gradients"] == 0.0
    for key in ("weights", "optimizer_state", "activations"):
        assert inside.stages[0].memory_GB[key] == pytest.approx(after.stages[0].memory_GB[key], rel=1e-9), key
    assert inside.stages[0].peak_memory_GB < after.stages[0].peak_memory_GB - after.stages[0].memory_GB["gradients"] + 1e-6
    assert inside.step_time_s == pytest.approx(after.step_time_s, rel=1e-9)


@pytest.mark.parametrize("strategy, field", [
    ({"dp": 8, "zero_stage": 3, "micro_batch_size": 1}, "strategy.micro_batch_size"),  # 2 micro-batches a step
    ({"dp": 4, "pp": 2, "zero_stage": 3, "micro_batch_size": 4}, "strategy.pp"),
])
def test_a_layout_that_accumulates_or_pipelines_is_refused(strategy, field):
    with pytest.raises(InvalidStrategy) as err:
        estimate(get_preset("llama3-8b"), _tr(optimizer_in_backward=True), simple_cluster(H100, 1), Strategy(recompute="full", **strategy))
    assert err.value.field == field


@pytest.mark.parametrize("extra, words", [
    ({"framework": "megatron-core"}, "priced for torchtune's optimizer_in_bwd"),
    ({"cpu_offload": True}, "on the host"),
])
def test_where_it_cannot_run_it_is_refused_by_field(extra, words):
    with pytest.raises(InvalidTraining) as err:
        _tr(optimizer_in_backward=True, **extra)
    assert err.value.field == "training.optimizer_in_backward" and words in err.value.message


def test_an_operator_graph_refuses_it():
    from cost_model.graph.evaluate import refuse_graph_unpriced

    with pytest.raises(InvalidTraining) as err:
        refuse_graph_unpriced(_tr(optimizer_in_backward=True))
    assert err.value.field == "training.optimizer_in_backward"


def test_the_planner_keeps_to_one_micro_batch_a_step_and_torchtitan_refuses_the_launch(client):
    cluster = {"name": "c", "node_groups": [{"name": "n", "count": 1, "gpus_per_node": 8, "device": H100}]}
    req = {"model": {"preset": "llama3-8b"}, "training": {**FSDP, "optimizer_in_backward": True}, "cluster": cluster}
    r = client.post("/v1/plans", json=req)
    assert r.status_code in (200, 201), r.text
    plan = r.json()
    best = plan["best"]["strategy"]
    assert plan["training"]["optimizer_in_backward"] is True
    assert best["pp"] == 1 and best["dp"] * best["micro_batch_size"] == FSDP["global_batch_size"]
    assert plan["best"]["prediction"]["memory_breakdown_GB"][0]["gradients"] == 0.0
    launch = client.get(f"/v1/plans/{plan['id']}/launch", params={"target": "torchtitan"})
    assert launch.status_code == 422 and "optimizer_in_bwd" in launch.json()["error"]["message"], launch.text
    assert client.get(f"/v1/plans/{plan['id']}/launch", params={"target": "torchrun"}).status_code == 200
    refused = client.post("/v1/plans", json={**req, "constraints": {"pp": 2}})
    assert refused.status_code == 422 and refused.json()["error"]["field"] == "constraints.pp", refused.text


def test_the_cli_estimates_with_it(cli, tmp_path):
    body = {"model": {"preset": "llama3-8b"}, "training": {**FSDP, "optimizer_in_backward": True},
            "cluster": {"name": "c", "node_groups": [{"name": "n", "count": 1, "gpus_per_node": 8, "device": H100}]},
            "strategy": {"dp": 8, "zero_stage": 3, "micro_batch_size": 2, "recompute": "full"}}
    out = cli_estimates_then_refuses(cli, tmp_path, body, {**body["training"], "framework": "deepspeed"}, "training.optimizer_in_backward")
    assert out["memory_breakdown_GB"][0]["gradients"] == 0.0
