"""Megatron-Core's ``--recompute-modules`` (``training.recompute_modules``): what each module
frees and what recomputing it costs (layer_cost.selective_module_costs), the default being the
attention core alone, the framework and module checks, the warnings for a module with nothing
to recompute, and the Megatron launch that carries the modules."""

import json
import shlex
from dataclasses import replace
from pathlib import Path

import pytest

from cost_model import Strategy, Training, estimate, simple_cluster
from cost_model.comm import Links
from cost_model.devices import get_device
from cost_model.errors import InvalidTraining
from cost_model.training import training_from_dict
from cost_model.transformer.layer_cost import StrategyArrays, activation_bytes, layer_costs
from cost_model.transformer.spec import from_hf_config, get_preset
from cost_model.transformer.stage_cost import recompute_flops_per_step
from helpers.plans import homogeneous_plan
from planner_service.exporters import LaunchParams, render

CONFIGS = Path(__file__).with_name("hf_configs")
QWEN3_MOE = from_hf_config(json.loads((CONFIGS / "qwen3-30b-a3b.json").read_text()))
DEEPSEEK_V3 = replace(from_hf_config(json.loads((CONFIGS / "deepseek-v3.json").read_text())), mtp_layers=0)
LLAMA = get_preset("llama3-8b")
S = StrategyArrays.from_strategies([Strategy(dp=8, tp=2, pp=2, ep=8, sequence_parallel=True, recompute="selective")])
DENSE_S = StrategyArrays.from_strategies([Strategy(dp=8, tp=2, sequence_parallel=True, recompute="selective")])


def _tr(modules=None, **kw) -> Training:
    return Training(global_batch_size=256, sequence_length=4096, recompute_modules=tuple(modules) if modules else None, **kw)


def _stored(model, modules, s=S) -> float:
    return float(activation_bytes(model, _tr(modules), s)[0][0])


def _layer(model, modules, s=S):
    links = Links.for_group(simple_cluster("H100-SXM5-80GB", 4).node_groups[0])
    return layer_costs(model, _tr(modules), get_device("H100-SXM5-80GB"), links, s)


def test_the_default_is_the_attention_core_alone():
    for model, s in ((QWEN3_MOE, S), (LLAMA, DENSE_S)):
        assert _stored(model, None, s) == _stored(model, ["core_attn"], s)
        assert float(_layer(model, None, s).recompute_s[0]) == float(_layer(model, ["core_attn"], s).recompute_s[0]) == 0.0


def test_each_module_frees_what_it_discards_and_pays_its_forward_again():
    """Qwen3-30B-A3B at tp 2 with SP, 4096 tokens: T = 4096 tokens, k = 8, expert width 768."""
    T, h, k, f, t, eb = 4096.0, 2048.0, 8.0, 768.0, 2.0, 2.0
    base = _stored(QWEN3_MOE, None)
    # moe_act: the experts' FC2 input, T·k·f/t elements
    assert base - _stored(QWEN3_MOE, ["moe_act"]) == pytest.approx(T * k * f / t * eb)
    # layernorm: the MoE layer's own pre-MLP norm output (b·s·h/SP); attention's norm is fused
    assert base - _stored(QWEN3_MOE, ["layernorm"]) == pytest.approx(T * h / t * eb)
    both = base - _stored(QWEN3_MOE, ["moe_act", "layernorm"])
    assert both == pytest.approx(T * k * f / t * eb + T * h / t * eb)
    # moe: the whole MoE FFN's activations, more than moe_act alone
    assert base - _stored(QWEN3_MOE, ["moe"]) > 4 * (base - _stored(QWEN3_MOE, ["moe_act"]))
    rec = {m: _layer(QWEN3_MOE, [m]) for m in ("moe_act", "layernorm", "moe")}
    none = _layer(QWEN3_MOE, None)
    for m, lc in rec.items():
        assert float(lc.recompute_s[0]) > 0.0, m
    # the whole layer runs its forward again: far more than the activation alone, its dispatch
    # and combine again (6 all-to-alls instead of 4) and its FFN's TP collective
    assert float(rec["moe"].recompute_s[0]) > 10 * float(rec["moe_act"].recompute_s[0])
    assert float(rec["moe"].ep_comm_s[0]) == pytest.approx(1.5 * float(none.ep_comm_s[0]), rel=1e-6)
    assert float(rec["moe"].tp_comm_s[0]) > float(none.tp_comm_s[0]) == float(rec["moe_act"].tp_comm_s[0])


def test_mla_up_projection_and_dense_mlp_modules():
    mla_s = StrategyArrays.from_strategies([Strategy(dp=16, tp=2, pp=16, ep=32, sequence_parallel=True, recompute="selective")])
    T, t, eb = 4096.0, 2.0, 2.0
    q = DEEPSEEK_V3.q_size
    freed = _stored(DEEPSEEK_V3, None, mla_s) - _stored(DEEPSEEK_V3, ["mla_up_proj"], mla_s)
    # the expanded Q, K, V the attention core keeps: q/t + 2·kv per token
    kv = DEEPSEEK_V3.num_heads * DEEPSEEK_V3.kv_head_dim / t
    assert freed == pytest.approx(T * (q / t + 2 * kv) * eb)
    assert float(_layer(DEEPSEEK_V3, ["mla_up_proj"], mla_s).recompute_s[0]) > 0.0
    # the dense MLP: its inner activations and FC1's saved input; its forward GEMMs again
    mlp = _layer(LLAMA, ["mlp"], DENSE_S)
    assert _stored(LLAMA, None, DENSE_S) - _stored(LLAMA, ["mlp"], DENSE_S) > 0.4 * _stored(LLAMA, None, DENSE_S)
    assert float(mlp.recompute_s[0]) > 0.2 * float(_layer(LLAMA, None, DENSE_S).forward_compute_s[0])
    assert float(mlp.tp_comm_s[0]) > float(_layer(LLAMA, None, DENSE_S).tp_comm_s[0])


def test_modules_lower_the_peak_of_a_pinned_moe_layout_end_to_end():
    cluster = simple_cluster("H100-SXM5-80GB", 4)
    strategy = Strategy(dp=8, tp=2, pp=2, ep=8, sequence_parallel=True, recompute="selective", zero_stage=1)
    plain = estimate(QWEN3_MOE, _tr(), cluster, strategy)
    lean = estimate(QWEN3_MOE, _tr(["moe_act", "layernorm"]), cluster, strategy)
    whole = estimate(QWEN3_MOE, _tr(["moe"]), cluster, strategy)
    assert whole.peak_memory_GB < lean.peak_memory_GB < plain.peak_memory_GB
    assert plain.step_time_s < lean.step_time_s < whole.step_time_s
    assert not lean.warnings and not plain.warnings


def test_only_megatron_core_has_recompute_modules_and_only_its_modules():
    tr = training_from_dict({"global_batch_size": 8, "sequence_length": 4096, "recompute_modules": ["moe_act", "layernorm"]})
    assert tr.recompute_modules == ("moe_act", "layernorm") and tr.to_dict()["recompute_modules"] == ("moe_act", "layernorm")
    assert "recompute_modules" not in training_from_dict({"global_batch_size": 8, "sequence_length": 4096}).to_dict()
    for body, says in (({"framework": "fsdp", "recompute_modules": ["mlp"]}, "no recompute_modules setting"),
                       ({"recompute_modules": ["attention"]}, "not one of"),
                       ({"recompute_modules": ["mlp", "mlp"]}, "distinct"),
                       ({"recompute_modules": "mlp"}, "list"),
                       ({"recompute_modules": []}, "non-empty")):
        with pytest.raises(InvalidTraining) as err:
            training_from_dict({"global_batch_size": 8, "sequence_length": 4096, **body})
        assert err.value.field == "training.recompute_modules" and says in err.value.message


def test_a_module_with_nothing_to_recompute_is_named_in_the_warnings():
    cluster = simple_cluster("H100-SXM5-80GB", 2)
    est = estimate(LLAMA, _tr(["moe_act", "layernorm"]), cluster, Strategy(dp=8, tp=2, sequence_parallel=True, recompute="selective"))
    assert any("moe_act, layernorm" in w and "no-op" in w for w in est.warnings)
    assert est.peak_memory_GB == estimate(LLAMA, _tr(), cluster, Strategy(dp=8, tp=2, sequence_parallel=True, recompute="selective")).peak_memory_GB
    full = estimate(LLAMA, _tr(["mlp"]), cluster, Strategy(dp=8, tp=2, sequence_parallel=True, recompute="full"))
    assert any("recompute: selective" in w for w in full.warnings)


def test_the_megatron_launch_passes_the_modules_as_separate_words():
    plan = homogeneous_plan()
    plan["training"]["recompute_modules"] = ["core_attn", "mlp"]
    text = render(plan, "megatron", LaunchParams(image="img", command="pretrain_gpt.py", smoke_test=False)).files["megatron_args.sh"]
    words = shlex.split(text[text.index("MEGATRON_ARGS=(") + len("MEGATRON_ARGS=("): text.rindex(")")])
    i = words.index("--recompute-modules")
    assert words[i + 1:i + 3] == ["core_attn", "mlp"] and words[i - 1] == "selective"


def test_recomputed_gemms_count_in_the_hardware_flops():
    """HFU counts the GEMMs the modules run again: the whole MoE FFN's (router, k experts) per
    token and MoE layer; the output-discarding modules add memory-bound passes only."""
    tr = _tr(["moe"])
    per_token = 2 * QWEN3_MOE.experts_per_token * 3 * QWEN3_MOE.hidden_size * QWEN3_MOE.ffn_hidden_size + 2 * QWEN3_MOE.hidden_size * QWEN3_MOE.num_experts
    assert recompute_flops_per_step(QWEN3_MOE, tr, "selective") == pytest.approx(tr.tokens_per_step * QWEN3_MOE.moe_layers * per_token)
    assert recompute_flops_per_step(QWEN3_MOE, _tr(["moe_act", "layernorm"]), "selective") == 0.0
    assert recompute_flops_per_step(QWEN3_MOE, _tr(), "selective") == 0.0


def test_a_pinned_selective_moe_layout_that_does_not_fit_names_the_modules_that_free_more():
    from cost_model.errors import NoFeasiblePlan
    from planner_service.planner import SolverSettings, plan
    from planner_service.planner.request import parse_plan_request

    cfg = json.loads((CONFIGS / "qwen3-30b-a3b.json").read_text())
    body = {"model": {"transformer": cfg}, "training": {"global_batch_size": 64, "sequence_length": 16384},
            "cluster": {"name": "c", "node_groups": [{"name": "g", "count": 1, "gpus_per_node": 8, "device": "A100-SXM4-40GB"}]},
            "constraints": {"recompute": "selective", "tp": 1, "ep": 8}}
    with pytest.raises(NoFeasiblePlan) as err:
        plan(parse_plan_request(body), SolverSettings())
    assert 'training.recompute_modules ["core_attn", "moe_act", "layernorm"]' in err.value.message
    # not where the modules are already given, nor for a dense model, nor under full recompute
    for changed in ({"training": {**body["training"], "recompute_modules": ["moe_act"]}},
                    {"constraints": {"recompute": "full", "tp": 1, "ep": 8}}):
        with pytest.raises(NoFeasiblePlan) as err:
            plan(parse_plan_request({**body, **changed}), SolverSettings())
        assert "recompute_modules" not in err.value.message
