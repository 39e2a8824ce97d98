"""DPO's frozen reference model (``training.reference_model``): its weights held as the policy's
(sharded under ZeRO-3 / FSDP, whole below), no gradient or optimizer state, and one more forward
of every stage a micro-batch (its own gathers under full sharding); refused by field with LoRA,
under a framework without it and for operator graphs."""

from __future__ import annotations

import pytest

from cost_model.cluster import simple_cluster
from cost_model.errors import InvalidTraining
from cost_model.estimate import estimate
from cost_model.strategy import Strategy
from cost_model.training import training_from_dict
from cost_model.transformer.spec import get_preset
from helpers.cli_estimate import cli_estimates_then_refuses

H100 = "H100-SXM5-80GB"
DPO = {"global_batch_size": 64, "sequence_length": 2048, "framework": "fsdp"}


def _tr(**kw):
    return training_from_dict({**DPO, **kw})


@pytest.mark.parametrize("framework, zero, shard", [("fsdp", 3, 8), ("deepspeed", 2, 1), ("deepspeed", 3, 8), ("paddle", 1, 1)])
def test_the_reference_weights_are_held_as_the_policys_and_nothing_else(framework, zero, shard):
    model, cluster = get_preset("llama3-8b"), simple_cluster(H100, 1)
    s = Strategy(dp=8, zero_stage=zero, micro_batch_size=2, recompute="full")
    plain, dpo = (estimate(model, _tr(framework=framework, reference_model=ref), cluster, s) for ref in (False, True))
    added = dpo.stages[0].memory_GB["weights"] - plain.stages[0].memory_GB["weights"]
    assert added == pytest.approx(model.total_params() * 2 / shard / 1e9, rel=1e-3)
    for key in ("gradients", "optimizer_state", "activations"):
        assert dpo.stages[0].memory_GB[key] == pytest.approx(plain.stages[0].memory_GB[key], rel=1e-9), key


def test_each_micro_batch_runs_one_more_forward():
    """The reference's forward is about a third of the policy's forward and backward (without
    recompute), so the step grows by about that, its compute by the stage's forward."""
    model, cluster = get_preset("llama3-8b"), simple_cluster(H100, 1)
    s = Strategy(dp=8, zero_stage=3, micro_batch_size=2)
    plain, dpo = (estimate(model, _tr(reference_model=ref), cluster, s) for ref in (False, True))
    ratio = dpo.breakdown_s["compute"] / plain.breakdown_s["compute"]
    assert 1.25 < ratio < 1.4
    assert dpo.step_time_s > plain.step_time_s * 1.2
    assert dpo.breakdown_s["dp_comm_exposed"] >= plain.breakdown_s["dp_comm_exposed"]  # its own gathers


@pytest.mark.parametrize("extra, words", [
    ({"framework": "megatron-core"}, "no frozen reference model"),
    ({"lora_rank": 16}, "adapters switched off"),
])
def test_where_it_is_not_priced_it_is_refused_by_field(extra, words):
    with pytest.raises(InvalidTraining) as err:
        _tr(reference_model=True, **extra)
    assert err.value.field == "training.reference_model" and words in err.value.message


def test_an_operator_graph_refuses_it():
    from cost_model.graph.evaluate import refuse_graph_unpriced

    with pytest.raises(InvalidTraining) as err:
        refuse_graph_unpriced(_tr(reference_model=True))
    assert err.value.field == "training.reference_model"


def test_the_planner_plans_with_it(client):
    cluster = {"name": "c", "node_groups": [{"name": "n", "count": 1, "gpus_per_node": 8, "device": H100}]}
    req = {"model": {"preset": "llama3-8b"}, "training": {**DPO, "reference_model": True}, "cluster": cluster}
    r = client.post("/v1/plans", json=req)
    assert r.status_code in (200, 201), r.text
    plan = r.json()
    assert plan["training"]["reference_model"] is True and plan["best"]["prediction"]["fits"]
    plain = client.post("/v1/plans", json={**req, "training": DPO}).json()
    assert plan["best"]["prediction"]["step_time_s"] > plain["best"]["prediction"]["step_time_s"]


def test_the_cli_estimates_with_it(cli, tmp_path):
    body = {"model": {"preset": "llama3-8b"}, "training": {**DPO, "reference_model": True},
            "cluster": {"name": "c", "node_groups": [{"name": "n", "count": 1, "gpus_per_node": 8, "device": H100}]},
            "strategy": {"dp": 8, "zero_stage": 3, "micro_batch_size": 2, "recompute": "full"}}
    out = cli_estimates_then_refuses(cli, tmp_path, body, {**body["training"], "framework": "megatron-core"}, "training.reference_model")
    assert out["memory_breakdown_GB"][0]["weights"] == pytest.approx(6.02, abs=0.05)  # the policy's 4.0 GB (fp32 shards) and the reference's 2.0 (bf16)
