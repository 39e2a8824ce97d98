"""Activation offloading (``training.activation_offloading``): every layer's saved activations
copied to pinned host memory during forward and back during backward (torchtune's
``enable_activation_offloading``, TRL's ``activation_offloading``, verl's
``enable_activation_offload``, DeepSpeed's ``cpu_checkpointing``).  GPU memory falls by all
layers' saved activations but one, the host holds them, and each pass runs at the slower of its
compute and its copies (``layer_cost.activation_offload_s``); what cannot be priced is a 422 naming
the field."""

from __future__ import annotations

import pytest

from cost_model.cluster import simple_cluster
from cost_model.devices import get_device
from cost_model.errors import InvalidStrategy, InvalidTraining
from cost_model.estimate import estimate
from cost_model.strategy import Strategy
from cost_model.training import Training, training_from_dict
from cost_model.transformer.layer_cost import HOST_LINK_FRACTION, activation_offload_s
from cost_model.transformer.spec import get_preset
from helpers.cli_estimate import cli_estimates_then_refuses
from helpers.offload import planned_once_offloaded

FSDP = {"global_batch_size": 64, "sequence_length": 4096, "framework": "fsdp"}
H100 = "H100-SXM5-80GB"


def _pair(recompute: str, framework: str = "fsdp") -> tuple:
    model, cluster = get_preset("llama3-8b"), simple_cluster(H100, 1)
    s = Strategy(dp=8, zero_stage=3, micro_batch_size=2, recompute=recompute)
    return tuple(estimate(model, training_from_dict({**FSDP, "framework": framework, "activation_offloading": off}), cluster, s)
                 for off in (False, True))


def test_each_pass_runs_at_the_slower_of_its_compute_and_its_copies():
    h100 = get_device(H100)
    link = h100.host_link_GBps * 1e9 * HOST_LINK_FRACTION
    copy = 10e9 / link
    assert float(activation_offload_s(10e9, h100, copy + 1.0, copy + 2.0)) == 0.0  # hidden under both passes
    assert float(activation_offload_s(10e9, h100, 0.25 * copy, 0.5 * copy)) == pytest.approx(0.75 * copy + 0.5 * copy)
    assert float(activation_offload_s(10e9, h100, 0.25 * copy, 2.0 * copy)) == pytest.approx(0.75 * copy)


def test_without_recompute_the_activations_leave_the_gpu_and_the_copies_show():
    on_gpu, offloaded = _pair("none")
    a0, a1 = (e.stages[0].memory_GB["activations"] for e in (on_gpu, offloaded))
    host = offloaded.stages[0].host_memory_GB
    # what left the GPU is on the host: every layer's saved activations but one (and the embedding's)
    assert a0 - a1 == pytest.approx(host, rel=0.02) and host > 30 * (a0 - host) / 32 * 0.9
    assert on_gpu.stages[0].host_memory_GB == 0.0 and offloaded.peak_memory_GB[0] < on_gpu.peak_memory_GB[0] - 30
    # a layer's activations outweigh its compute on PCIe: the step pays the copies, in their own term
    assert offloaded.breakdown_s["offload_exposed"] > 0.3 * on_gpu.step_time_s
    assert offloaded.step_time_s == pytest.approx(on_gpu.step_time_s + offloaded.breakdown_s["offload_exposed"], rel=1e-9)
    for key in ("compute", "dp_comm_exposed", "optimizer"):
        assert offloaded.breakdown_s[key] == pytest.approx(on_gpu.breakdown_s[key], rel=1e-9), key
    # per micro-batch, the copies of what the host holds against the stage's passes
    m = offloaded.num_microbatches
    st = offloaded.stages[0]
    expected = float(activation_offload_s(host * 1e9, get_device(H100), st.forward_s, st.backward_s))
    assert offloaded.breakdown_s["offload_exposed"] == pytest.approx(m * expected, rel=0.02)
    note = next(w for w in offloaded.warnings if w.startswith("activation offloading (every layer's saved activations)"))
    assert f"{host:.1f} GB of host memory per GPU" in note and "not calibrated" in note
    # the interval takes in the host's share at half and twice its priced time
    assert offloaded.step_time_s_p90 >= offloaded.step_time_s + offloaded.breakdown_s["offload_exposed"] - 1e-9
    assert offloaded.step_time_s_p10 <= offloaded.step_time_s - offloaded.breakdown_s["offload_exposed"] / 2 + 1e-9


@pytest.mark.parametrize("framework", ["fsdp", "deepspeed"])
def test_under_full_recompute_the_checkpointed_inputs_go_and_their_copies_hide(framework):
    on_gpu, offloaded = _pair("full", framework)
    model = get_preset("llama3-8b")
    # the checkpointed input of every layer but one: 2 sequences x 4096 tokens x hidden, bf16
    per_layer_GB = 2 * 4096 * model.hidden_size * 2 / 1e9
    saved = on_gpu.stages[0].memory_GB["activations"] - offloaded.stages[0].memory_GB["activations"]
    assert saved == pytest.approx((model.num_layers - 1) * per_layer_GB, rel=0.05)
    assert offloaded.stages[0].host_memory_GB == pytest.approx(saved, rel=0.05)
    assert offloaded.breakdown_s["offload_exposed"] == 0.0 and offloaded.step_time_s == pytest.approx(on_gpu.step_time_s, rel=1e-12)


@pytest.mark.parametrize("body, strategy, field, words", [
    ({**FSDP, "framework": "paddle"}, {"dp": 8, "recompute": "selective"}, "strategy.recompute", "recompute_offload"),
    ({**FSDP, "framework": "megatron-deepspeed"}, None, "training.activation_offloading", "torchtune's enable_activation_offloading"),
    (FSDP, {"dp": 4, "pp": 2, "zero_stage": 3}, "strategy.pp", "pp 1"),
])
def test_activation_offloading_that_cannot_be_priced_is_refused_by_field(body, strategy, field, words):
    with pytest.raises((InvalidTraining, InvalidStrategy)) as err:
        t = training_from_dict({**body, "activation_offloading": True})
        estimate(get_preset("llama2-7b"), t, simple_cluster("A100-SXM4-80GB", 1), Strategy(micro_batch_size=1, **strategy))
    assert err.value.field == field and words in err.value.message


def test_paddle_offloads_the_full_recomputes_checkpoints_inside_its_pipeline():
    # PaddleNLP's recompute_offload: every in-flight micro-batch's checkpointed inputs on the host,
    # the GPU keeping the layer being recomputed
    model, cluster = get_preset("llama2-13b"), simple_cluster("A100-SXM4-80GB", 1)
    s = Strategy(dp=2, pp=4, micro_batch_size=1, recompute="full", zero_stage=1)
    on_gpu, offloaded = (estimate(model, training_from_dict({**FSDP, "framework": "paddle", "activation_offloading": off}), cluster, s)
                         for off in (False, True))
    first, last = offloaded.stages[0], offloaded.stages[-1]
    # the first stage holds pp = 4 micro-batches in flight, the last one (both 10 layers, one kept on
    # the GPU; the first stage's embedding output goes too): four to five times the host memory
    assert first.last_layer - first.first_layer == last.last_layer - last.first_layer == 9
    assert 4.0 < first.host_memory_GB / last.host_memory_GB < 5.0
    for a, b in zip(on_gpu.stages, offloaded.stages, strict=True):
        assert a.memory_GB["activations"] - b.memory_GB["activations"] == pytest.approx(b.host_memory_GB, rel=0.05)
    assert offloaded.breakdown_s["offload_exposed"] == 0.0  # a hidden state a layer hides under the recompute


def test_on_a_cpu_device_and_on_an_operator_graph_it_is_refused():
    from cost_model.graph.evaluate import refuse_graph_unpriced

    t = training_from_dict({**FSDP, "global_batch_size": 8, "sequence_length": 512, "activation_offloading": True})
    with pytest.raises(InvalidTraining) as err:
        estimate(get_preset("gpt3-125m"), t, simple_cluster("local-cpu", 1, 2), Strategy(dp=2, micro_batch_size=4))
    assert err.value.field == "training.activation_offloading" and "CPU device" in err.value.message
    with pytest.raises(InvalidTraining) as err:
        refuse_graph_unpriced(t)
    assert err.value.field == "training.activation_offloading"


def test_the_field_round_trips_and_defaults_off():
    assert not Training(8, 512).activation_offloading and "activation_offloading" not in Training(8, 512).to_dict()
    t = training_from_dict({**FSDP, "activation_offloading": True})
    assert t.to_dict()["activation_offloading"] is True and training_from_dict(t.to_dict()) == t
    assert t.offload_field == "activation_offloading"


def test_the_planner_plans_with_activation_offloading_and_suggests_it(client):
    # Llama 3 8B at 32k tokens on 8 H100 with recompute pinned off and no model parallelism:
    # only the host can hold the activations
    req = {"model": {"preset": "llama3-8b"}, "training": {**FSDP, "global_batch_size": 8, "sequence_length": 32768},
           "cluster": {"name": "c", "node_groups": [{"name": "n", "count": 1, "gpus_per_node": 8, "device": H100}]},
           "constraints": {"tp": 1, "cp": 1, "recompute": "none"}}
    plan = planned_once_offloaded(client, req, "activation_offloading",
                                  "training.activation_offloading keeps every layer's saved activations in host memory")
    best = plan["best"]
    assert best["strategy"]["pp"] == 1
    assert best["prediction"]["breakdown_s"]["offload_exposed"] > 0 and best["prediction"]["stages"][0]["host_memory_GB"] > 0
    assert all(alt["strategy"]["pp"] == 1 for alt in plan["alternatives"])
    # torchtitan cannot offload activations: its launch is refused with the trainers that can
    launch = client.get(f"/v1/plans/{plan['id']}/launch", params={"target": "torchtitan"})
    assert launch.status_code == 422 and launch.json()["error"]["field"] == "target"
    assert "enable_activation_offloading" in launch.json()["error"]["message"]
    assert client.get(f"/v1/plans/{plan['id']}/launch", params={"target": "torchrun"}).status_code == 200


def test_the_cli_estimates_with_activation_offloading(cli, tmp_path):
    body = {"model": {"preset": "llama3-8b"}, "training": {**FSDP, "activation_offloading": True},
            "cluster": {"name": "c", "node_groups": [{"name": "n", "count": 1, "gpus_per_node": 8, "device": H100}]},
            "strategy": {"dp": 8, "zero_stage": 3, "micro_batch_size": 2}}
    out = cli_estimates_then_refuses(cli, tmp_path, body, {**body["training"], "framework": "megatron-deepspeed"},
                                     "training.activation_offloading")
    assert out["breakdown_s"]["offload_exposed"] > 0 and out["stages"][0]["host_memory_GB"] > 0


# ---- Megatron-Core's fine-grained activation offloading (training.offload_modules) -------------

QWEN3_MOE = {"model_type": "qwen3_moe", "num_hidden_layers": 48, "hidden_size": 2048, "num_attention_heads": 32,
             "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144, "moe_intermediate_size": 768,
             "vocab_size": 151936, "tie_word_embeddings": False, "num_experts": 128, "num_experts_per_tok": 8,
             "decoder_sparse_step": 1, "mlp_only_layers": []}
MC = {"global_batch_size": 64, "sequence_length": 4096, "framework": "megatron-core"}


def test_megatron_offloads_the_named_modules_saved_tensors():
    from cost_model.transformer.layer_cost import StrategyArrays, offload_module_bytes
    from cost_model.transformer.spec import from_hf_config

    model = from_hf_config(QWEN3_MOE, name="qwen3-30b-a3b")
    S = StrategyArrays.from_strategies([Strategy(dp=8, ep=8, zero_stage=1, micro_batch_size=1, recompute="selective")])
    T, h, eb = 4096.0, 2048.0, 2.0

    def moved(*mods: str) -> float:
        return float(offload_module_bytes(model, training_from_dict({**MC, "activation_offloading": True, "offload_modules": list(mods)}), S)[0])

    # Q (32 heads), K and V (4 heads each) of 128 dims; the QKV projection's input; the pre-MLP norm's input
    assert moved("core_attn") == pytest.approx(T * (32 + 2 * 4) * 128 * eb)
    assert moved("qkv_linear") == pytest.approx(T * h * eb) == moved("mlp_norm")
    assert moved("attn_norm") == 0.0  # a dense-attention layer's input norm is fused into the QKV GEMM
    # the experts' FC1 input is every dispatched token's hidden state, their activation input
    # both halves of the gated FC1 output; with the load imbalance's straggler factor on top
    assert moved("expert_fc1") >= T * 8 * h * eb and moved("moe_act") >= T * 8 * 2 * 768 * eb
    assert moved("expert_fc1", "moe_act") == pytest.approx(moved("expert_fc1") + moved("moe_act"))
    # under FP8 the fused kernel's own 16-bit output is the attention's too (the projection keeps
    # an FP8 copy), unless the attention core's checkpoint discards it (selective, as above)
    fp8 = training_from_dict({**MC, "dtype": "fp8", "activation_offloading": True, "offload_modules": ["core_attn"]})
    none = StrategyArrays.from_strategies([Strategy(dp=8, ep=8, zero_stage=1, micro_batch_size=1)])
    assert float(offload_module_bytes(model, fp8, S)[0]) == pytest.approx(moved("core_attn"))
    assert float(offload_module_bytes(model, fp8, none)[0]) == pytest.approx(moved("core_attn") + T * 32 * 128 * eb)


def test_a_megatron_estimate_offloading_modules_frees_what_the_host_holds():
    from cost_model.transformer.spec import from_hf_config

    model, cluster = from_hf_config(QWEN3_MOE, name="qwen3-30b-a3b"), simple_cluster(H100, 1)
    s = Strategy(dp=8, ep=8, zero_stage=1, micro_batch_size=1, recompute="selective")
    on_gpu = estimate(model, training_from_dict(MC), cluster, s)
    offloaded = estimate(model, training_from_dict({**MC, "activation_offloading": True, "offload_modules": ["expert_fc1", "moe_act"]}),
                         cluster, s)
    saved = on_gpu.stages[0].memory_GB["activations"] - offloaded.stages[0].memory_GB["activations"]
    assert saved == pytest.approx(offloaded.stages[0].host_memory_GB, rel=0.01) and saved > 5.0
    assert any(w.startswith("activation offloading (the saved tensors of expert_fc1, moe_act)") for w in offloaded.warnings)
    assert offloaded.step_time_s >= on_gpu.step_time_s


@pytest.mark.parametrize("body, strategy, field, words", [
    ({**MC, "activation_offloading": True}, None, "training.offload_modules", "name them in offload_modules"),
    ({**MC, "offload_modules": ["core_attn"]}, None, "training.offload_modules", "set activation_offloading: true"),
    ({**MC, "activation_offloading": True, "offload_modules": ["mlp"]}, None, "training.offload_modules", "not one of"),
    ({**MC, "activation_offloading": True, "offload_modules": ["attn_proj"]}, None, "training.offload_modules", "without core_attn"),
    ({**FSDP, "activation_offloading": True, "offload_modules": ["core_attn"]}, None, "training.offload_modules", "--offload-modules"),
    ({**MC, "activation_offloading": True, "offload_modules": "core_attn"}, None, "training.offload_modules", "list of module names"),
    ({**MC, "activation_offloading": True, "offload_modules": ["core_attn"]}, {"dp": 8, "recompute": "full"}, "strategy.recompute",
     "none or selective"),
])
def test_megatron_module_offload_that_cannot_run_is_refused_by_field(body, strategy, field, words):
    with pytest.raises((InvalidTraining, InvalidStrategy)) as err:
        t = training_from_dict(body)
        estimate(get_preset("llama2-7b"), t, simple_cluster("A100-SXM4-80GB", 1), Strategy(micro_batch_size=1, **strategy))
    assert err.value.field == field and words in err.value.message


def test_the_megatron_launch_writes_the_fine_grained_offload_as_megatron_lm_parses_it():
    from helpers.megatron_args import megatron_words, parse_as_megatron
    from helpers.plans import ALL_PLANS

    plan = ALL_PLANS["homogeneous"]()
    plan["training"].update(framework="megatron-core", activation_offloading=True, offload_modules=["core_attn", "attn_proj"])
    plan["best"]["strategy"]["recompute"] = "selective"
    args = parse_as_megatron(megatron_words(plan))
    assert args.fine_grained_activation_offloading and args.offload_modules == ["core_attn", "attn_proj"]
