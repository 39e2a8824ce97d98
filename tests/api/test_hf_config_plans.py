"""A real config.json through the HTTP API: the plan carries the model's name, total and
active parameters and the config's uncosted fields as warnings; an architecture the cost
model cannot represent is a 422 naming model_type."""

from __future__ import annotations

import json
from pathlib import Path

CONFIGS = Path(__file__).resolve().parents[1] / "costmodel" / "transformer" / "hf_configs"
CLUSTER = {
    "name": "two-h100",
    "node_groups": [{"name": "g0", "count": 2, "gpus_per_node": 8, "device": "H100-SXM5-80GB", "hostnames": ["h0", "h1"]}],
}


def test_moe_config_plans_with_active_params_name_and_warnings(client):
    cfg = {**json.loads((CONFIGS / "qwen3-30b-a3b.json").read_text()), "brand_new_knob": 1}
    body = {"model": {"transformer": cfg}, "training": {"global_batch_size": 64, "sequence_length": 4096}, "cluster": CLUSTER}
    r = client.post("/v1/plans", json=body)
    assert r.status_code == 201, r.text
    plan = r.json()
    assert plan["model"]["name"] == "qwen3_moe 30.5B"
    assert abs(plan["model"]["params"] - 30.53e9) < 0.01e9
    assert abs(plan["model"]["active_params"] - 3.35e9) < 0.01e9
    assert any("brand_new_knob" in w for w in plan["warnings"])


def test_state_space_config_is_a_422_naming_model_type(client):
    cfg = {"model_type": "mamba", "hidden_size": 2560, "num_hidden_layers": 64, "state_size": 16, "vocab_size": 50280,
           "num_attention_heads": 32}
    body = {"model": {"transformer": cfg}, "training": {"global_batch_size": 64, "sequence_length": 4096}, "cluster": CLUSTER}
    r = client.post("/v1/plans", json=body)
    assert r.status_code == 422
    err = r.json()["error"] if "error" in r.json() else r.json()
    assert "mamba" in json.dumps(err) and "supported" in json.dumps(err)


def test_neox_config_plans_as_its_own_family_with_no_warnings(client):
    """GPT-NeoX-20B's config.json (model_type gpt_neox) used to be costed as a Llama-style gated
    FFN with a warning; it plans as NeoX: 20.55B parameters, nothing uncosted."""
    cfg = json.loads((CONFIGS / "gpt-neox-20b.json").read_text())
    body = {"model": {"transformer": cfg}, "training": {"global_batch_size": 64, "sequence_length": 2048, "framework": "megatron-deepspeed"},
            "cluster": CLUSTER, "top_k": 0}
    r = client.post("/v1/plans", json=body)
    assert r.status_code == 201, r.text
    plan = r.json()
    assert plan["model"]["name"] == "gpt_neox 20.6B" and plan["model"]["params"] == 20554567680
    assert not any("gpt_neox" in w for w in plan["warnings"])


def test_ernie_moe_config_plans_under_paddle_as_moe(client):
    """ERNIE 4.5's MoE names (moe_num_experts, moe_k, ...) are read: a Paddle plan of
    ERNIE-4.5-21B-A3B is an MoE plan with its active parameters, not a dense 21B model."""
    cfg = json.loads((CONFIGS / "ernie-4.5-21b-a3b.json").read_text())
    body = {"model": {"transformer": cfg}, "training": {"global_batch_size": 64, "sequence_length": 4096, "framework": "paddle"},
            "cluster": CLUSTER, "constraints": {"ep": 8}, "top_k": 0}
    r = client.post("/v1/plans", json=body)
    assert r.status_code == 201, r.text
    plan = r.json()
    assert plan["model"]["name"] == "ernie4_5_moe 21.8B" and 3.0e9 < plan["model"]["active_params"] < 4.0e9
    assert plan["best"]["strategy"]["ep"] == 8 and plan["warnings"] == []


def test_mtp_module_is_costed_and_launched_as_megatron_runs_it(client):
    """A DeepSeek-style config with num_nextn_predict_layers plans with the MTP module costed
    (slower than the same model without it) and the Megatron launch trains it
    (--mtp-num-layers; the layout places it on the last stage); a launch with no MTP setting
    says so in its notes."""
    base = {**json.loads((CONFIGS / "deepseek-v3.json").read_text()), "num_hidden_layers": 8, "n_routed_experts": 16,
            "first_k_dense_replace": 1}
    base.pop("quantization_config", None)
    training = {"global_batch_size": 32, "sequence_length": 4096, "framework": "megatron-core"}
    constraints = {"tp": 1, "pp": 2, "ep": 8, "micro_batch_size": 1, "recompute": "full", "zero_stage": 1, "layers_per_stage": [5, 3]}
    steps = {}
    for mtp in (1, None):
        body = {"model": {"transformer": {**base, "num_nextn_predict_layers": mtp}}, "training": training, "cluster": CLUSTER,
                "constraints": constraints, "top_k": 0}
        r = client.post("/v1/plans", json=body)
        assert r.status_code == 201, r.text
        steps[mtp] = r.json()
    with_mtp, without = steps[1], steps[None]
    assert with_mtp["model"]["mtp_params"] > 0 and "mtp_params" not in without["model"]
    assert with_mtp["best"]["prediction"]["step_time_s"] > without["best"]["prediction"]["step_time_s"]
    last_with, last_without = with_mtp["best"]["prediction"]["peak_memory_GB"][-1], without["best"]["prediction"]["peak_memory_GB"][-1]
    assert last_with > last_without
    art = client.get(f"/v1/plans/{with_mtp['id']}/launch?target=megatron&format=json").json()
    args = art["files"][art["primary"]]
    assert "--mtp-num-layers 1" in args and "tttmL" in args  # the last chunk: 3 decoder layers, MTP, loss
    body = {"model": {"transformer": {**base, "num_nextn_predict_layers": 1}}, "cluster": CLUSTER, "top_k": 0,
            "training": {**training, "framework": "fsdp"}, "constraints": {"tp": 1, "pp": 1, "ep": 8, "zero_stage": 3}}
    r = client.post("/v1/plans", json=body)
    assert r.status_code == 201, r.text
    art = client.get(f"/v1/plans/{r.json()['id']}/launch?target=torchtitan&format=json")
    assert art.status_code == 200, art.text
    assert any("multi-token-prediction" in n for n in art.json()["notes"])


def test_mpt_plans_under_fsdp_and_llama_4_launches_with_its_chunked_attention_named(client):
    """LLM Foundry's MPT (nested attn_config/ffn_config) plans under fsdp as its own family with
    nothing uncosted; a Llama 4 plan is costed with chunked attention, which Megatron-LM cannot
    express, and its Megatron launch says so."""
    mpt = json.loads((CONFIGS / "mpt-7b.json").read_text())
    body = {"model": {"transformer": mpt}, "cluster": CLUSTER, "top_k": 0,
            "training": {"global_batch_size": 64, "sequence_length": 2048, "framework": "fsdp"}, "constraints": {"zero_stage": 3}}
    r = client.post("/v1/plans", json=body)
    assert r.status_code == 201, r.text
    assert r.json()["model"]["name"] == "mpt 6.6B" and not any("mpt" in w for w in r.json()["warnings"])
    scout = {**json.loads((CONFIGS / "llama-4-maverick-text.json").read_text()), "interleave_moe_layer_step": 1,
             "num_local_experts": 16, "num_hidden_layers": 8}
    steps = {}
    for chunk in (8192, None):
        body = {"model": {"transformer": {**scout, "attention_chunk_size": chunk}}, "cluster": CLUSTER, "top_k": 0,
                "training": {"global_batch_size": 16, "sequence_length": 65536, "framework": "megatron-core"},
                "constraints": {"tp": 8, "cp": 2, "pp": 1, "ep": 8, "micro_batch_size": 1, "recompute": "full"}}
        r = client.post("/v1/plans", json=body)
        assert r.status_code == 201, r.text
        steps[chunk] = r.json()
    assert steps[8192]["best"]["prediction"]["step_time_s"] < steps[None]["best"]["prediction"]["step_time_s"]
    notes = client.get(f"/v1/plans/{steps[8192]['id']}/launch?target=megatron&format=json").json()["notes"]
    assert any("chunked attention" in n and "no Megatron-LM flag" in n for n in notes)


def test_megatron_recompute_modules_are_costed_stored_and_launched(client):
    """constraints.recompute_modules (Megatron-Core's --recompute-modules) plans a pinned MoE
    layout with less activation memory than the default selective recompute, is the plan's
    strategy and reaches the Megatron launch; another framework's request is a 422 naming it."""
    cfg = json.loads((CONFIGS / "qwen3-30b-a3b.json").read_text())
    constraints = {"tp": 2, "pp": 2, "ep": 8, "micro_batch_size": 1, "recompute": "selective", "sequence_parallel": True}
    peaks = {}
    for modules in (["core_attn"], ["moe_act", "layernorm"]):
        body = {"model": {"transformer": cfg}, "training": {"global_batch_size": 64, "sequence_length": 4096}, "cluster": CLUSTER,
                "constraints": {**constraints, "recompute_modules": modules}, "top_k": 0}
        r = client.post("/v1/plans", json=body)
        assert r.status_code == 201, r.text
        peaks[len(modules)] = (r.json()["best"]["prediction"]["peak_memory_GB"][0], r.json())
    assert peaks[2][0] < peaks[1][0]
    plan = peaks[2][1]
    assert plan["best"]["strategy"]["recompute_modules"] == ["moe_act", "layernorm"]
    assert "recompute_modules" not in peaks[1][1]["best"]["strategy"]  # Megatron's default, written only when set
    args = client.get(f"/v1/plans/{plan['id']}/launch?target=megatron&format=json").json()
    assert "--recompute-modules moe_act layernorm" in args["files"]["megatron_args.sh"]
    body = {"model": {"preset": "llama3-8b"}, "cluster": CLUSTER, "constraints": {"recompute_modules": ["mlp"]},
            "training": {"global_batch_size": 64, "sequence_length": 4096, "framework": "fsdp"}}
    r = client.post("/v1/plans", json=body)
    assert r.status_code == 422 and "constraints.recompute_modules" in r.text
