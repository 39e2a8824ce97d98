"""Full recompute by submodule (``training.submodule_checkpointing``, ``fsdp``): NeMo-RL's DTensor
policy and NeMo Automodel's sub-module activation checkpointing wrap each decoder layer's
``self_attn``, ``mlp``, ``input_layernorm`` and ``post_attention_layernorm`` in
``checkpoint_wrapper`` (``apply_submodule_checkpointing``), not the whole layer.  Each wrapped
module keeps its input — the residual stream before and after the attention, the two normed
states — four hidden-size tensors a layer where a whole-layer checkpoint keeps one; the backward
runs the same forward again, one submodule at a time."""

from __future__ import annotations

import pytest

from cost_model.cluster import simple_cluster
from cost_model.errors import InvalidTraining
from cost_model.estimate import estimate
from cost_model.graph.evaluate import refuse_graph_unpriced
from cost_model.strategy import Strategy
from cost_model.training import training_from_dict
from cost_model.transformer.layer_cost import StrategyArrays, activation_bytes
from cost_model.transformer.spec import from_hf_config, get_preset
from helpers.cli_estimate import cli_estimates_then_refuses

H100 = "H100-SXM5-80GB"
CLUSTER = {"name": "c", "node_groups": [{"name": "n", "count": 1, "gpus_per_node": 8, "device": H100}]}
FSDP = {"global_batch_size": 16, "sequence_length": 8192, "framework": "fsdp"}
FULL = Strategy(dp=8, zero_stage=3, micro_batch_size=2, recompute="full")


def _layer(model, strategy: Strategy, **training):
    return activation_bytes(model, training_from_dict({**FSDP, **training}), StrategyArrays.from_strategies([strategy]))


def test_each_wrapped_submodule_keeps_its_input_and_the_backward_recomputes_one_at_a_time():
    model = get_preset("llama3-8b")
    T, h = 2 * 8192, 4096
    (whole, full, working_whole), (sub, full_sub, working_sub) = _layer(model, FULL), _layer(model, FULL, submodule_checkpointing=True)
    assert float(whole[0]) == pytest.approx(T * h * 2)  # the layer input
    assert float(sub[0]) == pytest.approx(4 * T * h * 2)  # two norms' inputs, the attention's and the MLP's
    assert float(full_sub[0]) == pytest.approx(float(full[0]))
    # the larger submodule's insides (the MLP's: gate, up and FC2 input over f = 14336), not the whole layer's
    assert float(working_sub[0]) == pytest.approx(T * 14336 * 2 * 3)
    assert float(working_sub[0]) < float(working_whole[0])
    # a sandwich-norm layer (Gemma 2: four norms) keeps six
    gemma = from_hf_config({"model_type": "gemma2", "num_hidden_layers": 26, "hidden_size": 2304, "num_attention_heads": 8,
                            "num_key_value_heads": 4, "head_dim": 256, "intermediate_size": 9216, "vocab_size": 256000})
    assert float(_layer(gemma, FULL, submodule_checkpointing=True)[0][0]) == pytest.approx(6 * float(_layer(gemma, FULL)[0][0]))
    # without full recompute it changes nothing
    none = Strategy(dp=8, zero_stage=3, micro_batch_size=2, recompute="none")
    assert [float(x[0]) for x in _layer(model, none, submodule_checkpointing=True)] == [float(x[0]) for x in _layer(model, none)]


def test_the_estimate_holds_three_more_inputs_a_layer_for_the_same_step():
    model, cluster = get_preset("llama3-8b"), simple_cluster(H100, 1)
    whole = estimate(model, training_from_dict(FSDP), cluster, FULL)
    sub = estimate(model, training_from_dict({**FSDP, "submodule_checkpointing": True}), cluster, FULL)
    assert sub.step_time_s == pytest.approx(whole.step_time_s)
    extra = sub.stages[0].memory_GB["activations"] - whole.stages[0].memory_GB["activations"]
    three_inputs = 32 * 3 * 2 * 8192 * 4096 * 2 / 1e9
    working = 2 * 8192 * 14336 * 2 * 3 / 1e9  # one recomputed MLP instead of a whole layer
    assert three_inputs - working < extra < three_inputs
    assert not any("submodule" in w for w in sub.warnings)
    none = estimate(model, training_from_dict({**FSDP, "submodule_checkpointing": True}), cluster,
                    Strategy(dp=8, zero_stage=3, micro_batch_size=1, recompute="none"))
    assert any(w.startswith("training.submodule_checkpointing:") and "recompute none" in w for w in none.warnings)


def test_a_framework_whose_full_recompute_wraps_whole_layers_refuses_it_naming_the_field():
    for framework in ("megatron-core", "megatron-deepspeed", "deepspeed", "paddle"):
        with pytest.raises(InvalidTraining) as e:
            training_from_dict({**FSDP, "framework": framework, "submodule_checkpointing": True})
        assert e.value.field == "training.submodule_checkpointing" and "NeMo Automodel" in e.value.message, framework
    with pytest.raises(InvalidTraining) as e:
        training_from_dict({**FSDP, "submodule_checkpointing": "yes"})
    assert e.value.field == "training.submodule_checkpointing"
    with pytest.raises(InvalidTraining) as e:
        refuse_graph_unpriced(training_from_dict({**FSDP, "submodule_checkpointing": True}))
    assert e.value.field == "training.submodule_checkpointing"


def test_the_http_api_plans_with_it_and_the_torchtitan_launch_says_it_keeps_less(client):
    req = {"model": {"preset": "llama3-8b"}, "training": {**FSDP, "submodule_checkpointing": True}, "cluster": CLUSTER,
           "constraints": {"pp": 1, "tp": 1, "recompute": "full", "micro_batch_size": 2}}
    r = client.post("/v1/plans", json=req)
    assert r.status_code in (200, 201), r.text
    plan = r.json()
    assert plan["training"]["submodule_checkpointing"] is True
    whole = client.post("/v1/plans", json={**req, "training": FSDP}).json()
    assert plan["best"]["prediction"]["peak_memory_GB"][0] > whole["best"]["prediction"]["peak_memory_GB"][0]
    launch = client.get(f"/v1/plans/{plan['id']}/launch", params={"target": "torchtitan"})
    assert launch.status_code == 200, launch.text
    assert any("by submodule" in n for n in launch.json()["notes"])
    r = client.post("/v1/plans", json={**req, "training": {**req["training"], "framework": "megatron-core"}})
    assert r.status_code == 422 and r.json()["error"]["field"] == "training.submodule_checkpointing"


def test_the_cli_estimates_with_it(cli, tmp_path):
    body = {"model": {"preset": "llama3-8b"}, "cluster": CLUSTER, "training": {**FSDP, "submodule_checkpointing": True},
            "strategy": {"dp": 8, "zero_stage": 3, "micro_batch_size": 2, "recompute": "full"}}
    out = cli_estimates_then_refuses(cli, tmp_path, body, {**body["training"], "framework": "deepspeed"}, "training.submodule_checkpointing")
    assert out["memory_breakdown_GB"][0]["activations"] > 0
