"""Megatron-Core's ``--recompute-modules`` (``Strategy.recompute_modules``): what each module
frees and what recomputing it costs (layer_cost.selective_module_costs), the default being the
attention core alone, the framework and module checks, the warnings for a module with nothing
to recompute, the search's lean module set, and the Megatron launch that carries the modules.
PaddleNLP's ``recompute_granularity`` is the same field with one of its own modules: ``core_attn``
(its default here) or ``full_attn``, the whole self-attention module."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from cost_model import Strategy, Training, estimate, simple_cluster
from cost_model.comm import Links
from cost_model.devices import get_device
from cost_model.errors import InvalidStrategy
from cost_model.strategy import strategy_from_dict, validate_strategy
from cost_model.transformer.layer_cost import StrategyArrays, activation_bytes, layer_costs, lean_recompute_modules
from cost_model.transformer.spec import from_hf_config, get_preset
from cost_model.transformer.stage_cost import recompute_flops_per_step
from helpers.megatron_args import megatron_words, parse_as_megatron
from helpers.plans import homogeneous_plan

CONFIGS = Path(__file__).with_name("hf_configs")
QWEN3_MOE = from_hf_config(json.loads((CONFIGS / "qwen3-30b-a3b.json").read_text()))
DEEPSEEK_V3 = replace(from_hf_config(json.loads((CONFIGS / "deepseek-v3.json").read_text())), mtp_layers=0)
LLAMA = get_preset("llama3-8b")
MOE = Strategy(dp=8, tp=2, pp=2, ep=8, sequence_parallel=True, recompute="selective")
DENSE = Strategy(dp=8, tp=2, sequence_parallel=True, recompute="selective")
TR = Training(global_batch_size=256, sequence_length=4096)


def _S(strategy: Strategy, modules) -> StrategyArrays:
    return StrategyArrays.from_strategies([replace(strategy, recompute_modules=tuple(modules or ()))])


def _stored(model, modules, s=MOE) -> float:
    return float(activation_bytes(model, TR, _S(s, modules))[0][0])


def _layer(model, modules, s=MOE):
    links = Links.for_group(simple_cluster("H100-SXM5-80GB", 4).node_groups[0])
    return layer_costs(model, TR, get_device("H100-SXM5-80GB"), links, _S(s, modules))


def test_the_default_is_the_attention_core_alone():
    for model, s in ((QWEN3_MOE, MOE), (LLAMA, DENSE)):
        assert _stored(model, None, s) == _stored(model, ["core_attn"], s)
        # Megatron-Core checkpoints a fused attention core too: its forward runs again, a part
        # of the layer's
        redone = float(_layer(model, None, s).recompute_s[0])
        assert redone == float(_layer(model, ["core_attn"], s).recompute_s[0])
        assert 0.0 < redone < 0.5 * float(_layer(model, None, replace(s, recompute="none")).forward_compute_s[0])


def test_legacy_megatron_runs_a_fused_attention_outside_its_checkpoint():
    # Megatron-DeepSpeed's ParallelAttention takes its flash path outside checkpoint_core_attention:
    # selective recompute redoes nothing and frees nothing there (an unfused core it does redo)
    links = Links.for_group(simple_cluster("H100-SXM5-80GB", 4).node_groups[0])
    mds = replace(TR, framework="megatron-deepspeed")
    S = StrategyArrays.from_strategies([Strategy(dp=8, tp=2, sequence_parallel=True, recompute="selective")])
    assert float(layer_costs(LLAMA, mds, get_device("H100-SXM5-80GB"), links, S).recompute_s[0]) == 0.0
    unfused = replace(mds, attention="unfused")
    assert float(layer_costs(LLAMA, unfused, get_device("H100-SXM5-80GB"), links, S).recompute_s[0]) > 0.0


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
    mla_s = Strategy(dp=16, tp=2, pp=16, ep=32, sequence_parallel=True, recompute="selective")
    T, t, eb = 4096.0, 2.0, 2.0
    q = DEEPSEEK_V3.q_size
    freed = _stored(DEEPSEEK_V3, None, mla_s) - _stored(DEEPSEEK_V3, ["mla_up_proj"], mla_s)
    # the expanded Q, K, V the attention core keeps: q/t + 2·kv per token
    kv = DEEPSEEK_V3.num_heads * DEEPSEEK_V3.kv_head_dim / t
    assert freed == pytest.approx(T * (q / t + 2 * kv) * eb)
    assert float(_layer(DEEPSEEK_V3, ["mla_up_proj"], mla_s).recompute_s[0]) > 0.0
    # the dense MLP: its inner activations and FC1's saved input; its forward GEMMs again
    mlp = _layer(LLAMA, ["mlp"], DENSE)
    assert _stored(LLAMA, None, DENSE) - _stored(LLAMA, ["mlp"], DENSE) > 0.4 * _stored(LLAMA, None, DENSE)
    assert float(mlp.recompute_s[0]) > 0.2 * float(_layer(LLAMA, None, DENSE).forward_compute_s[0])
    assert float(mlp.tp_comm_s[0]) > float(_layer(LLAMA, None, DENSE).tp_comm_s[0])


def test_modules_lower_the_peak_of_a_pinned_moe_layout_end_to_end():
    cluster = simple_cluster("H100-SXM5-80GB", 4)
    strategy = Strategy(dp=8, tp=2, pp=2, ep=8, sequence_parallel=True, recompute="selective", zero_stage=1)
    none = estimate(QWEN3_MOE, TR, cluster, replace(strategy, recompute="none"))
    plain = estimate(QWEN3_MOE, TR, cluster, strategy)
    lean = estimate(QWEN3_MOE, TR, cluster, replace(strategy, recompute_modules=("moe_act", "layernorm")))
    whole = estimate(QWEN3_MOE, TR, cluster, replace(strategy, recompute_modules=("moe",)))
    assert whole.peak_memory_GB < lean.peak_memory_GB < plain.peak_memory_GB
    assert none.step_time_s < lean.step_time_s < whole.step_time_s
    # the default (the attention core alone) in 16 bits: FlashAttention's forward again, no memory freed
    assert plain.peak_memory_GB == none.peak_memory_GB and plain.step_time_s > none.step_time_s
    assert not lean.warnings and not plain.warnings


def test_megatron_core_and_paddle_have_recompute_modules_each_its_own():
    s = strategy_from_dict({"dp": 8, "recompute": "selective", "recompute_modules": ["layernorm", "moe_act"]})
    assert s.recompute_modules == ("layernorm", "moe_act") and s.to_dict()["recompute_modules"] == ["layernorm", "moe_act"]
    assert "recompute_modules" not in strategy_from_dict({"dp": 8}).to_dict()
    cluster = simple_cluster("H100-SXM5-80GB", 1)
    # one spelling: Megatron-Core's order, and the default alone as none
    assert validate_strategy(QWEN3_MOE, TR, s, cluster.total_gpus).recompute_modules == ("moe_act", "layernorm")
    assert validate_strategy(QWEN3_MOE, TR, replace(s, recompute_modules=("core_attn",)), cluster.total_gpus).recompute_modules == ()
    for body, says in (({"recompute_modules": ["attention"]}, "not a recompute module"),
                       ({"recompute_modules": ["mlp", "mlp"]}, "distinct"),
                       ({"recompute_modules": "mlp"}, "list"),
                       ({"recompute_modules": []}, "non-empty")):
        with pytest.raises(InvalidStrategy) as err:
            validate_strategy(QWEN3_MOE, TR, strategy_from_dict({"dp": 8, "recompute": "selective", **body}), cluster.total_gpus)
        assert err.value.field == "strategy.recompute_modules" and says in err.value.message
    paddle = replace(TR, framework="paddle")
    for tr, strategy, says in ((replace(TR, framework="fsdp"), s, "no recompute_modules setting"),
                               (TR, replace(s, recompute="full"), "recompute: selective"),
                               (TR, replace(s, recompute_modules=("full_attn",)), "not one of megatron-core's recompute modules"),
                               (paddle, s, "not one of paddle's recompute modules: core_attn, full_attn"),
                               (paddle, replace(s, recompute_modules=("core_attn", "full_attn")), "recompute_granularity, which takes one")):
        with pytest.raises(InvalidStrategy) as err:
            validate_strategy(QWEN3_MOE, tr, strategy, cluster.total_gpus)
        assert err.value.field == "strategy.recompute_modules" and says in err.value.message


def test_a_module_with_nothing_to_recompute_is_named_in_the_warnings():
    cluster = simple_cluster("H100-SXM5-80GB", 2)
    est = estimate(LLAMA, TR, cluster, replace(DENSE, recompute_modules=("moe_act", "layernorm")))
    assert any("moe_act, layernorm" in w and "no-op" in w for w in est.warnings)
    assert est.peak_memory_GB == estimate(LLAMA, TR, cluster, DENSE).peak_memory_GB


#: DeepSeek-V2-Lite's shape (MLA without a query LoRA, 64 routed experts of 1408, top 6, 2 shared,
#: its first layer dense): an MoE and MLA model whose lean module set frees ~10% of a peak.
DSV2_LITE = {"model_type": "deepseek_v2", "hidden_size": 2048, "intermediate_size": 10944, "moe_intermediate_size": 1408,
             "num_attention_heads": 16, "num_key_value_heads": 16, "num_hidden_layers": 27, "vocab_size": 102400,
             "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6, "first_k_dense_replace": 1,
             "moe_layer_freq": 1, "kv_lora_rank": 512, "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
             "v_head_dim": 128, "max_position_embeddings": 163840, "tie_word_embeddings": False}


def test_the_search_offers_the_lean_modules_where_the_model_has_them():
    """For an MoE and MLA model under Megatron-Core the search tries selective recompute of
    moe_act, layernorm and mla_up_proj beside none and full (in 16 bits without the attention
    core: recomputing FlashAttention would free nothing; in FP8 with it): on 8 H100 at 7168
    tokens no recompute is tight (p90 over 80 GB), the lean set fits for a few % more time and
    full recompute costs 9% more — the lean set is the answer.  A pinned selective is searched
    at Megatron's default and at that set; pinned modules are kept as given; a dense model
    without MLA gets no modules."""
    from planner_service.planner import SolverSettings, plan
    from planner_service.planner.request import parse_plan_request

    lean = ("moe_act", "layernorm", "mla_up_proj")
    model = from_hf_config(DSV2_LITE)
    assert lean_recompute_modules(model, TR) == lean
    assert lean_recompute_modules(model, replace(TR, dtype="fp8")) == ("core_attn", *lean)
    body = {"model": {"transformer": DSV2_LITE}, "training": {"global_batch_size": 64, "sequence_length": 7168},
            "cluster": {"name": "c", "node_groups": [{"name": "g", "count": 1, "gpus_per_node": 8, "device": "H100-SXM5-80GB"}]},
            "constraints": {"tp": 1, "pp": 1, "cp": 1, "ep": 8, "micro_batch_size": 1, "zero_stage": 1}, "top_k": 3}
    free = plan(parse_plan_request(body), SolverSettings())
    assert (free.best.strategy.recompute, free.best.strategy.recompute_modules) == ("selective", lean), free.best.strategy
    assert not free.best.prediction.tight
    assert {(a.strategy.recompute, a.prediction.tight) for a in free.alternatives} >= {("none", True), ("full", False)}
    pinned = plan(parse_plan_request({**body, "constraints": {**body["constraints"], "recompute": "selective"}}), SolverSettings())
    assert pinned.best.strategy.recompute_modules == lean
    given = plan(parse_plan_request({**body, "constraints": {**body["constraints"], "recompute_modules": ["moe"]}}), SolverSettings())
    assert (given.best.strategy.recompute, given.best.strategy.recompute_modules) == ("selective", ("moe",))
    dense = plan(parse_plan_request({**body, "model": {"preset": "llama3-8b"}, "constraints": {"micro_batch_size": 1}}), SolverSettings())
    assert all(not e.strategy.recompute_modules for e in (dense.best, *dense.alternatives))


def test_the_megatron_launch_passes_the_modules_as_separate_words():
    plan = homogeneous_plan()
    plan["best"]["strategy"]["recompute_modules"] = ["core_attn", "mlp"]
    words = megatron_words(plan)
    i = words.index("--recompute-modules")
    assert words[i + 1:i + 3] == ["core_attn", "mlp"] and words[i - 1] == "selective"
    # the words parse as Megatron-LM's own argument table declares its flags (dest, nargs, type)
    args = parse_as_megatron(words)
    assert args.recompute_modules == ["core_attn", "mlp"] and args.recompute_granularity == "selective"


def test_recomputed_gemms_count_in_the_hardware_flops():
    """HFU counts the GEMMs the modules run again: the whole MoE FFN's (router, k experts) per
    token and MoE layer; the output-discarding modules add memory-bound passes only."""
    per_token = 2 * QWEN3_MOE.experts_per_token * 3 * QWEN3_MOE.hidden_size * QWEN3_MOE.ffn_hidden_size + 2 * QWEN3_MOE.hidden_size * QWEN3_MOE.num_experts
    assert recompute_flops_per_step(QWEN3_MOE, TR, "selective", modules=("moe",)) == pytest.approx(TR.tokens_per_step * QWEN3_MOE.moe_layers * per_token)
    assert recompute_flops_per_step(QWEN3_MOE, TR, "selective", modules=("moe_act", "layernorm")) == 0.0
    # the default module, the attention core, checkpointed by Megatron-Core even when fused: its
    # FLOPs again; Megatron-DeepSpeed runs a fused core outside its checkpoint
    s = TR.sequence_length
    core = TR.global_batch_size * QWEN3_MOE.num_layers * 4 * s * QWEN3_MOE.attention_core_width(s)
    assert recompute_flops_per_step(QWEN3_MOE, TR, "selective") == pytest.approx(core)
    assert recompute_flops_per_step(QWEN3_MOE, replace(TR, framework="megatron-deepspeed"), "selective") == 0.0


def test_pinned_modules_that_leave_memory_on_the_table_are_named_when_nothing_fits():
    from cost_model.errors import NoFeasiblePlan
    from planner_service.planner import SolverSettings, plan
    from planner_service.planner.request import parse_plan_request

    cfg = json.loads((CONFIGS / "qwen3-30b-a3b.json").read_text())
    body = {"model": {"transformer": cfg}, "training": {"global_batch_size": 64, "sequence_length": 16384},
            "cluster": {"name": "c", "node_groups": [{"name": "g", "count": 1, "gpus_per_node": 8, "device": "A100-SXM4-40GB"}]},
            "constraints": {"recompute_modules": ["moe_act"], "tp": 1, "ep": 8}}
    with pytest.raises(NoFeasiblePlan) as err:
        plan(parse_plan_request(body), SolverSettings())
    assert 'constraints.recompute_modules ["moe_act"] leaves layernorm, moe unrecomputed' in err.value.message
    with pytest.raises(NoFeasiblePlan) as err:
        plan(parse_plan_request({**body, "constraints": {"recompute": "full", "tp": 1, "ep": 8}}), SolverSettings())
    assert "recompute_modules" not in err.value.message
    # under Paddle the pinned default (the attention core, kept as no modules) leaves full_attn,
    # and the message names the pin as it was written, not as the empty default set
    paddle = {"model": {"preset": "llama2-13b"}, "training": {"global_batch_size": 64, "sequence_length": 16384, "framework": "paddle"},
              "cluster": body["cluster"], "constraints": {"recompute_modules": ["core_attn"], "tp": 8, "micro_batch_size": 4}}
    with pytest.raises(NoFeasiblePlan) as err:
        plan(parse_plan_request(paddle), SolverSettings())
    assert 'constraints.recompute_modules ["core_attn"] leaves full_attn unrecomputed' in err.value.message


def test_a_pinned_module_that_does_not_exist_is_refused_not_dropped():
    from planner_service.planner import SolverSettings, plan
    from planner_service.planner.request import parse_plan_request

    body = {"model": {"preset": "llama3-8b"}, "training": {"global_batch_size": 64, "sequence_length": 4096},
            "cluster": {"name": "c", "node_groups": [{"name": "g", "count": 1, "gpus_per_node": 8, "device": "H100"}]},
            "constraints": {"recompute_modules": ["core_attn", "attention"]}}
    with pytest.raises(InvalidStrategy) as err:
        plan(parse_plan_request(body), SolverSettings())
    assert err.value.field == "constraints.recompute_modules" and "'attention'" in err.value.message


PADDLE = replace(TR, framework="paddle")


def test_paddles_full_attn_recomputes_the_attention_module_between_the_core_and_the_whole_layer():
    """recompute_granularity full_attn (``recompute(self.self_attn, ...)``): Q, K, V and the
    projection's input freed, the projections' GEMMs, RoPE and the attention's TP collective run
    again — more memory freed and more time than the attention core, less of both than full."""
    s = Strategy(dp=4, tp=2, sequence_parallel=True, recompute="selective")
    core, attn = _stored(LLAMA, (), s), float(activation_bytes(LLAMA, PADDLE, _S(s, ("full_attn",)))[0][0])
    kv_local = LLAMA.num_kv_heads * LLAMA.head_dim / 2
    tokens = TR.sequence_length  # one sequence a micro-batch
    assert float(activation_bytes(LLAMA, PADDLE, _S(s, ()))[0][0]) == pytest.approx(core)
    assert core - attn == pytest.approx(tokens * (LLAMA.q_size / 2 + 2 * kv_local + LLAMA.attn_out_size / 2) * 2)
    cluster = simple_cluster("A800-SXM4-80GB", 1)
    runs = {m: estimate(LLAMA, PADDLE, cluster, replace(s, recompute=r, recompute_modules=mods))
            for m, (r, mods) in {"none": ("none", ()), "core": ("selective", ()), "attn": ("selective", ("full_attn",)),
                                 "full": ("full", ())}.items()}
    peak = {m: max(e.peak_memory_GB) for m, e in runs.items()}
    step = {m: e.step_time_s for m, e in runs.items()}
    assert peak["full"] < peak["attn"] < peak["core"] == peak["none"]
    assert step["none"] < step["core"] < step["attn"] < step["full"]
    assert runs["attn"].breakdown_s["tp_comm"] > runs["core"].breakdown_s["tp_comm"]
    # hardware FLOPs: the attention's projections once more than the attention core's recompute
    projections = TR.global_batch_size * TR.sequence_length * LLAMA.num_layers * 2 * (LLAMA.qkv_weights() + LLAMA.attn_out_size * LLAMA.hidden_size)
    extra = recompute_flops_per_step(LLAMA, PADDLE, "selective", modules=("full_attn",)) - recompute_flops_per_step(LLAMA, PADDLE, "selective")
    assert extra == pytest.approx(projections)
    hw = {m: e.hardware_tflops_per_gpu * e.step_time_s for m, e in runs.items()}
    assert (hw["attn"] - hw["core"]) * 1e12 * 8 == pytest.approx(projections, rel=1e-6)
    # the search offers it under Paddle, beside none and full, as its one lean module
    assert lean_recompute_modules(LLAMA, PADDLE) == ("full_attn",)


def test_a_paddle_plan_pinned_to_full_attn_is_planned_and_its_fleet_launch_names_the_granularity(client):
    body = {"model": {"preset": "llama2-7b"}, "training": {"global_batch_size": 64, "sequence_length": 4096, "framework": "paddle"},
            "cluster": {"name": "c", "node_groups": [{"name": "a", "count": 1, "gpus_per_node": 8, "device": "A800-SXM4-80GB"}]},
            "constraints": {"tp": 4, "dp": 2, "recompute_modules": ["full_attn"]}}
    r = client.post("/v1/plans", json=body)
    assert r.status_code == 201, r.text
    best = r.json()["best"]["strategy"]
    assert (best["recompute"], best["recompute_modules"]) == ("selective", ["full_attn"])
    art = client.get(f"/v1/plans/{r.json()['id']}/launch", params={"target": "paddle-fleet"})
    assert art.status_code == 200, art.text
    assert any("recompute_granularity full_attn" in n for n in art.json()["notes"])
    bad = client.post("/v1/plans", json={**body, "constraints": {"recompute_modules": ["core_attn", "full_attn"]}})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "constraints.recompute_modules"
