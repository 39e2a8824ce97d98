"""The example and recipe configurations frameworks ship (``cost_model/data/framework_recipes.json``: torchtitan's
registry and benchmark layouts, Megatron-LM's examples, the Megatron-MoE model zoo, NeMo's
performance tables, Megatron-Bridge's recipes, PaddleNLP's configs, DeepSpeed-Chat, LLaMA-Factory,
Megatron-DeepSpeed (its Ulysses examples too), LLM Foundry, torchtune (pure bf16), axolotl, accelerate, verl's FSDP SFT
trainer with Ulysses, OpenRLHF's DeepSpeed SFT (ring attention among them), Pai-Megatron-Patch,
NeMo-Framework-Launcher's A100 examples, NeMo 2's recipes, TRL's 1M-token context-parallel SFT, open-r1,
ERNIEKit, BigScience's BLOOM-176B layout, NeMo-RL's and verl's trainers, PaddleFormers, the alignment-handbook, FastChat, Stanford
Alpaca, llama-recipes, OLMo and OLMo-core, GPT-NeoX, fms-fsdp, TinyLlama, NeMo Automodel, Qwen's finetuning scripts, XTuner, LitGPT,
Megatron-DeepSpeed's MoE examples, Megatron-Bridge's Qwen3-MoE and Kimi K2 presets, open-instruct, OpenRLHF,
and the offloading layouts of DeepSpeedExamples, ms-swift,
slime and axolotl's gpt-oss examples) are real configurations: the planner must accept
each as its framework runs it — estimate it without a refusal and predict it to fit (tight is
kept) — except where the recipe relies on what the cost model does not price (the entry says
why).  Layouts only: no measured figure of any source enters here."""

from __future__ import annotations

import pytest

from cost_model.estimate import estimate
from cost_model.frameworks import RULES
from cost_model.validation.recipes import load_recipes, recipe_body
from planner_service.planner import SolverSettings, plan
from planner_service.planner.request import parse_estimate_request, parse_plan_request

RECIPES = load_recipes()


@pytest.mark.parametrize("recipe", RECIPES, ids=[r["id"] for r in RECIPES])
def test_a_shipped_recipe_is_accepted_as_its_framework_runs_it(recipe):
    req = parse_estimate_request({**recipe_body(recipe), "strategy": recipe["strategy"]})
    est = estimate(req.model, req.training, req.cluster, req.strategy)
    assert est.step_time_s > 0 and est.num_devices == recipe["gpus"]
    if recipe["expect"] == "runs":
        assert est.fits, (recipe["id"], max(est.peak_memory_GB), est.peak_memory_GB_p10, est.warnings)
    else:
        assert not est.fits, (recipe["id"], recipe["why"])


def test_the_recipes_cover_every_framework_and_say_where_they_come_from():
    assert {r["training"]["framework"] for r in RECIPES} == {"megatron-core", "megatron-deepspeed", "deepspeed", "fsdp", "paddle"}
    assert all(r["source"] and (r["expect"] == "runs" or r.get("why")) for r in RECIPES)
    assert sum(r["expect"] == "runs" for r in RECIPES) >= 70
    # offload to the host is among them: every kind (optimizer state alone, the whole sharded state,
    # the saved activations), each only where its framework has it (the rule table), under every
    # framework the trainers of which ship offloading examples
    kinds = {"optimizer_offload_fraction": "optimizer_offload", "cpu_offload": "cpu_offload", "activation_offloading": "activation_offloading"}
    offloading = {(r["training"]["framework"], k) for r in RECIPES if r["expect"] == "runs" for k in kinds if r["training"].get(k)}
    has = {(name, k) for name, rule in RULES.items() for k, setting in kinds.items() if getattr(rule, setting)}
    assert offloading <= has and {k for _, k in offloading} == set(kinds)
    assert {f for f, _ in offloading} >= {"megatron-core", "deepspeed", "fsdp", "paddle"}
    # and LoRA (torchtune's distributed LoRA recipes), over a 4-bit base too (its 405B QLoRA)
    assert any(r["training"].get("lora_rank") for r in RECIPES if r["expect"] == "runs")
    assert any(r["training"].get("lora_base_dtype") == "nf4" for r in RECIPES if r["expect"] == "runs")


@pytest.mark.parametrize("rid", ["paddle-llama2-70b-sft-tp8-pp4-n4c32", "megatron_zoo_qwen3_235b_a22b_h100",
                                 "titan_test_dsv3_debug_fsdp2_tp2_cp2_ep8"])
def test_a_recipes_stated_knobs_pinned_plan_as_the_recipe_runs(rid):
    """As a platform engineer asks: the recipe's stated knobs pinned, the rest searched — a
    sharding stage over one rank (PaddleNLP drops it), an interleaved pipeline whose chunks are
    uneven (Megatron's layout flags), expert parallelism folded over tp (torchtitan's sparse
    mesh) each come back as a plan, not a refusal."""
    recipe = next(r for r in RECIPES if r["id"] == rid)
    stated = ("tp", "pp", "vpp", "cp", "ep", "zero_stage", "micro_batch_size", "account_for_embedding_in_pipeline_split",
              "account_for_loss_in_pipeline_split")
    pins = {k: v for k, v in recipe["strategy"].items() if k in stated}
    res = plan(parse_plan_request({**recipe_body(recipe), "constraints": pins}), SolverSettings(time_limit_s=30))
    assert all(getattr(res.best.strategy, k) == v for k, v in pins.items() if k != "zero_stage"), res.best.strategy
    assert res.best.prediction.fits


@pytest.mark.parametrize("recipe", [r for r in RECIPES if r["expect"] == "runs"], ids=[r["id"] for r in RECIPES if r["expect"] == "runs"])
def test_a_recipes_whole_strategy_pinned_plans_to_that_strategy(recipe):
    """Every field of the recipe's strategy pinned, the plan keeps each — except a sharding stage
    over one rank, which PaddleNLP drops, and a dense model's etp, which Megatron ignores (the
    plan warns of both), and a dp_shard of the whole data-parallel group, the default (0).  Regression: a pinned layer split with
    the loss counted as a pipeline layer (the Megatron-MoE zoo's DeepSeek-V3 on 1,024 H100s: 61
    layers + the loss over 32 uneven chunks) was refused as not filling the chunks evenly, which
    only an unpinned split must."""
    pins = dict(recipe["strategy"])
    res = plan(parse_plan_request({**recipe_body(recipe), "constraints": pins}), SolverSettings(time_limit_s=30))
    best = res.best.strategy
    for key, value in pins.items():
        got = getattr(best, key)
        if key == "zero_stage" and got != value:
            assert any("sharding group of one rank" in w for w in res.warnings), res.warnings
            continue
        if key == "dp_shard" and value == best.dp:  # sharding over the whole data-parallel group: the default, 0
            assert got in (0, value), got
            continue
        if key == "etp" and got != value:  # a dense model's etp: a no-op, dropped with a warning
            assert any("etp" in w for w in res.warnings), res.warnings
            continue
        want = sorted(value) if key == "recompute_modules" else list(value) if isinstance(value, list) else value
        have = sorted(got) if key == "recompute_modules" else list(got) if isinstance(got, tuple) else got
        assert have == want, (key, value, got)


@pytest.mark.parametrize("rid", ["megatron_zoo_deepseek_v3_h100_1024gpu", "megatron_zoo_qwen3_235b_a22b_h100"])
def test_interleaving_is_searched_where_the_chunks_cannot_be_even(rid):
    """DeepSeek-V3's 61 layers (a prime) and Qwen3-235B's 94 split evenly over no pp·vpp ≥ 4, and
    Megatron-Core's EP overlap (``moe_comm_overlap``) needs the interleaved schedule with a
    pipeline: with only the zoo's tp and pp pinned, the search must offer near-even model chunks
    (Megatron-Core's --pipeline-model-parallel-layout), as the estimate costs a pinned vpp's.
    Regression: both were refused as needing 258 GB and 101 GB a GPU (expert parallelism
    dropped with the interleaving)."""
    recipe = next(r for r in RECIPES if r["id"] == rid)
    res = plan(parse_plan_request({**recipe_body(recipe), "constraints": {"tp": 2, "pp": 8}}), SolverSettings(time_limit_s=30))
    best = res.best.strategy
    assert (best.tp, best.pp) == (2, 8) and best.vpp > 1 and best.ep > 1 and res.best.prediction.fits
    layers = recipe["model"]["num_hidden_layers"]
    assert layers % (best.pp * best.vpp)  # the chunks are near-even
    # the plan's strategy estimated alone is the plan's prediction
    est = estimate(*(lambda r: (r.model, r.training, r.cluster, r.strategy))(parse_estimate_request(
        {**recipe_body(recipe), "strategy": {k: v for k, v in best.to_dict().items() if v is not None}})))
    assert est.step_time_s == pytest.approx(res.best.prediction.step_time_s, rel=1e-9)


def test_a_near_even_interleaved_plan_launches_with_megatrons_layout(client):
    """Through the HTTP API: the plan with near-even chunks (DeepSeek-V3, tp 2 and pp 8 pinned)
    launches on Megatron-LM with --pipeline-model-parallel-layout, one entry per model chunk."""
    recipe = next(r for r in RECIPES if r["id"] == "megatron_zoo_deepseek_v3_h100_1024gpu")
    resp = client.post("/v1/plans", json={**recipe_body(recipe), "constraints": {"tp": 2, "pp": 8}})
    assert resp.status_code in (200, 201), resp.text
    s = resp.json()["best"]["strategy"]
    args = client.get(f"/v1/plans/{resp.json()['id']}/launch", params={"target": "megatron"}).json()["files"]["megatron_args.sh"]
    words = args.split()
    chunks = words[words.index("--pipeline-model-parallel-layout") + 1].strip("\"'").split("|")
    assert len(chunks) == s["pp"] * s["vpp"] and sum(c.count("t") for c in chunks) == 61
    assert max(c.count("t") for c in chunks) - min(c.count("t") for c in chunks) == 1
