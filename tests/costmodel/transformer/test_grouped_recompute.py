"""Megatron-Core's uniform recompute over groups of N layers (``recompute_method: "uniform"``
with ``recompute_num_layers`` N): one checkpointed input a group, the group recomputed whole in
its backward — every layer's forward runs twice, as under the plain full recompute, but the
stored activations fall to 1/N and the working set grows to N layers'."""

from __future__ import annotations

import numpy as np
import pytest

from cost_model.cluster import simple_cluster
from cost_model.errors import InvalidStrategy
from cost_model.estimate import estimate
from cost_model.strategy import Strategy, strategy_from_dict
from cost_model.training import Training
from cost_model.transformer.layer_cost import StrategyArrays, activation_bytes
from cost_model.transformer.spec import get_preset
from helpers.cli_estimate import cli_estimates_then_refuses

MC = Training(global_batch_size=64, sequence_length=8192, framework="megatron-core")
BASE = {"tp": 8, "pp": 4, "dp": 1, "zero_stage": 1, "micro_batch_size": 1, "recompute": "full", "sequence_parallel": True}
CLUSTER = {"name": "c", "node_groups": [{"name": "n", "count": 4, "gpus_per_node": 8, "device": "H100-SXM5-80GB"}]}


def _strategy(**kw) -> Strategy:
    return strategy_from_dict({**BASE, **kw})


def test_a_group_keeps_one_input_and_recomputes_all_its_layers_at_once():
    model = get_preset("llama3-70b")
    S = StrategyArrays.from_strategies([_strategy(), _strategy(recompute_method="uniform", recompute_num_layers=4)])
    none = StrategyArrays.from_strategies([_strategy(recompute="none")])
    stored, _, working = activation_bytes(model, MC, S)
    full_layer = activation_bytes(model, MC, none)[1][0]
    layer_input = stored[0]  # every layer its own checkpoint: its input alone
    assert stored[1] == pytest.approx(layer_input / 4)
    assert working[0] == pytest.approx(full_layer - layer_input)
    assert working[1] == pytest.approx(4 * full_layer - layer_input)


def test_a_group_stops_at_its_model_chunks_end():
    """Megatron-Core walks each chunk in steps of N and ends a group at the chunk's end: 20-layer
    chunks (llama3-70b, pp 4) in groups of 8 are 8, 8 and 4 layers — three inputs kept per 20
    layers, at most 8 recomputed at once; under vpp 2 (10-layer chunks) a group of 16 is the chunk."""
    model = get_preset("llama3-70b")
    none = StrategyArrays.from_strategies([_strategy(recompute="none")])
    full_layer = activation_bytes(model, MC, none)[1][0]
    S = StrategyArrays.from_strategies([_strategy(), _strategy(recompute_method="uniform", recompute_num_layers=8),
                                        _strategy(recompute_method="uniform", recompute_num_layers=16, vpp=2),
                                        _strategy(recompute_method="uniform", recompute_num_layers=10, vpp=2)])
    stored, _, working = activation_bytes(model, MC, S)
    layer_input = stored[0]
    assert stored[1] == pytest.approx(layer_input * 3 / 20)
    assert working[1] == pytest.approx(8 * full_layer - layer_input)
    assert (stored[2], working[2]) == pytest.approx((stored[3], working[3]))
    assert working[2] == pytest.approx(10 * full_layer - layer_input)


def test_a_group_up_to_a_pipeline_stage_is_taken_under_interleaving():
    model, cluster = get_preset("llama3-70b"), simple_cluster("H100-SXM5-80GB", 4)
    training = Training(global_batch_size=64, sequence_length=8192, framework="megatron-core")
    chunk, stage = (estimate(model, training, cluster, _strategy(recompute_method="uniform", recompute_num_layers=n, vpp=2)) for n in (10, 20))
    assert chunk.stages[0].memory_GB == stage.stages[0].memory_GB and chunk.step_time_s == stage.step_time_s


def test_it_costs_the_full_recomputes_time_and_less_memory_over_a_deep_pipeline():
    model, cluster = get_preset("llama3-70b"), simple_cluster("H100-SXM5-80GB", 4)
    plain, grouped = (estimate(model, MC, cluster, s) for s in (_strategy(), _strategy(recompute_method="uniform", recompute_num_layers=2)))
    assert grouped.step_time_s == plain.step_time_s and grouped.breakdown_s["recompute"] == plain.breakdown_s["recompute"]
    assert grouped.stages[0].memory_GB["activations"] < plain.stages[0].memory_GB["activations"]


@pytest.mark.parametrize("body, method, layers", [
    ({"recompute_method": "uniform", "recompute_num_layers": 1}, "", 0),  # groups of one layer: the plain full recompute
    ({"recompute_method": "uniform"}, "", 0),
    ({"recompute_method": "block", "recompute_num_layers": 3}, "", 3),  # what recompute_num_layers alone means
    ({"recompute_method": "uniform", "recompute_num_layers": 3}, "uniform", 3),
])
def test_one_spelling_of_each_method(body, method, layers):
    s = _strategy(**body)
    assert (s.recompute_method, s.recompute_num_layers) == (method, layers)
    assert ("recompute_method" in s.to_dict()) == bool(method)


@pytest.mark.parametrize("body, framework, field, needle", [
    ({"recompute_method": "block"}, "megatron-core", "strategy.recompute_num_layers", "give recompute_num_layers"),
    ({"recompute_method": "uniform", "recompute_num_layers": 2, "recompute": "selective"}, "megatron-core", "strategy.recompute_method",
     "groups the layers a full recompute checkpoints"),
    ({"recompute_method": "uniform", "recompute_num_layers": 40}, "megatron-core", "strategy.recompute_num_layers", "to the 20 layers of a pipeline stage"),
    ({"recompute_method": "uniform", "recompute_num_layers": 2, "tp": 1, "pp": 1, "dp": 32, "zero_stage": 3, "sequence_parallel": False},
     "fsdp", "strategy.recompute_method", "fsdp: no grouped recompute"),
    ({"recompute_method": "sometimes"}, "megatron-core", "strategy.recompute_method", "must be one of block, uniform"),
])
def test_what_cannot_run_is_refused_by_name(body, framework, field, needle):
    model, cluster = get_preset("llama3-70b"), simple_cluster("H100-SXM5-80GB", 4)
    training = Training(global_batch_size=64, sequence_length=8192, framework=framework)
    with pytest.raises(InvalidStrategy) as err:
        estimate(model, training, cluster, strategy_from_dict({**BASE, **body}))
    assert err.value.field == field and needle in str(err.value), str(err.value)


def test_pinned_planned_launched_and_refused_through_the_api(client):
    req = {"model": {"preset": "llama3-70b"}, "cluster": CLUSTER,
           "training": {"global_batch_size": 64, "sequence_length": 8192, "framework": "megatron-core"},
           "constraints": {"tp": 8, "pp": 4, "recompute_method": "uniform", "recompute_num_layers": 2}}
    r = client.post("/v1/plans", json=req)
    assert r.status_code in (200, 201), r.text
    best = r.json()["best"]["strategy"]
    assert (best["recompute"], best["recompute_method"], best["recompute_num_layers"]) == ("full", "uniform", 2)
    args = client.get(f"/v1/plans/{r.json()['id']}/launch", params={"target": "megatron"}).json()["files"]["megatron_args.sh"]
    assert "--recompute-method uniform\n  --recompute-num-layers 2\n" in args
    for constraints, field in (({"recompute": "selective", "recompute_method": "uniform", "recompute_num_layers": 2}, "constraints.recompute_method"),
                               ({"tp": 1, "pp": 1, "recompute_method": "uniform", "recompute_num_layers": 2}, "constraints.recompute_method")):
        training = {**req["training"], "framework": "deepspeed"} if "tp" in constraints else req["training"]
        bad = client.post("/v1/plans", json={**req, "training": training, "constraints": constraints})
        assert bad.status_code == 422 and bad.json()["error"]["field"] == field, bad.text
    # a pinned depth the pinned pipeline's stages or chunks cannot hold, named before the search
    for constraints, needle in (({"tp": 8, "pp": 4, "recompute_method": "uniform", "recompute_num_layers": 24}, "at most the 20 layers of a pipeline stage"),
                                ({"tp": 8, "pp": 4, "vpp": 2, "recompute_num_layers": 21}, "at most the 20 layers of a pipeline stage")):
        bad = client.post("/v1/plans", json={**req, "constraints": constraints})
        assert bad.status_code == 422 and bad.json()["error"]["field"] == "constraints.recompute_num_layers", bad.text
        assert needle in bad.json()["error"]["message"]
    # a block depth that covers each model chunk's layers is what Megatron-Core runs as full recompute of every layer
    whole = client.post("/v1/plans", json={**req, "constraints": {"tp": 8, "pp": 4, "vpp": 2, "recompute_num_layers": 10}})
    assert whole.status_code in (200, 201), whole.text
    assert whole.json()["best"]["strategy"]["recompute"] == "full"
    assert any("covers every layer of each model chunk" in w for w in whole.json()["best"]["prediction"]["warnings"])
    # unpinned pp: the search keeps the layouts whose stages hold the pinned group
    free = client.post("/v1/plans", json={**req, "constraints": {"tp": 8, "recompute_method": "uniform", "recompute_num_layers": 24}})
    assert free.status_code in (200, 201), free.text
    assert 80 // free.json()["best"]["strategy"]["pp"] >= 24
    # groups of one layer are the plain full recompute: nothing of the method stored
    plain = client.post("/v1/plans", json={**req, "constraints": {"tp": 8, "pp": 4, "recompute_method": "uniform", "recompute_num_layers": 1}})
    assert plain.status_code in (200, 201), plain.text
    s = plain.json()["best"]["strategy"]
    assert s["recompute"] == "full" and "recompute_method" not in s and "recompute_num_layers" not in s


def test_the_cli_estimates_with_it(cli, tmp_path):
    body = {"model": {"preset": "llama3-70b"}, "cluster": CLUSTER,
            "training": {"global_batch_size": 64, "sequence_length": 8192, "framework": "megatron-core"},
            "strategy": {**BASE, "recompute_method": "uniform", "recompute_num_layers": 2}}
    out = cli_estimates_then_refuses(cli, tmp_path, body, {**body["training"], "framework": "megatron-deepspeed"}, "recompute_method")
    assert np.isfinite(out["step_time_s"])
