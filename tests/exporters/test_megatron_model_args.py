"""Megatron-LM arguments describe the requested model: rebuilding the parameter count from the
generated flags alone (Megatron's GPTModel shapes, written here from its documented flag
semantics) gives the request's count, for every real config.json of tests/costmodel/transformer/
hf_configs; every flag is one of Megatron's (megatron_arguments.json)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from cost_model import from_hf_config
from helpers.plans import homogeneous_plan
from planner_service.exporters import LaunchParams, render
from planner_service.exporters.frameworks import megatron_reference

CONFIGS = Path(__file__).resolve().parents[1] / "costmodel" / "transformer" / "hf_configs"
NAMES = sorted(p.stem for p in CONFIGS.glob("*.json"))
PARAMS = LaunchParams(image="img", command="pretrain_gpt.py", smoke_test=False)


def megatron_flags(cfg: dict, seq: int = 4096) -> dict[str, str | None]:
    plan = homogeneous_plan()
    layers = from_hf_config(cfg).num_layers
    plan["model"] = {"name": "m", "spec": {"transformer": cfg}}
    plan["training"]["sequence_length"] = seq
    plan["best"]["strategy"]["layers_per_stage"] = [layers // 2, layers - layers // 2]
    plan["best"].pop("stages")
    text = render(plan, "megatron", PARAMS).files["megatron_args.sh"]
    body = text[text.index("MEGATRON_ARGS=(") + len("MEGATRON_ARGS=("): text.rindex(")")]
    words = shlex.split(body)
    flags: dict[str, str | None] = {}
    for i, w in enumerate(words):
        if w.startswith("--"):
            nxt = words[i + 1] if i + 1 < len(words) else None
            flags[w] = nxt if nxt is not None and not nxt.startswith("--") else None
    return flags


def _moe_pattern(expr: str | None, layers: int) -> list[int]:
    if expr is None:
        return [1] * layers
    if "[" not in expr:
        n = int(expr)
        return [1 if i % n == 0 else 0 for i in range(layers)]
    return list(eval(expr, {"__builtins__": {}}))  # Megatron's moe_freq_type evaluates the same expression


def rebuild_params(f: dict[str, str | None], vocab: int) -> int:
    """Parameters of Megatron's GPTModel built from these flags."""
    h, L, a = int(f["--hidden-size"]), int(f["--num-layers"]), int(f["--num-attention-heads"])
    gated = "--swiglu" in f or "--quick-geglu" in f
    bias = "--disable-bias-linear" not in f
    qkv_bias = bias or "--add-qkv-bias" in f
    norm = 2 * h if f.get("--normalization", "LayerNorm") == "LayerNorm" else h

    def mlp(width: int) -> int:
        return (3 if gated else 2) * h * width + (width * (2 if gated else 1) + h if bias else 0)

    if "--multi-latent-attention" in f:
        qk, rope, v = int(f["--qk-head-dim"]), int(f["--qk-pos-emb-head-dim"]), int(f["--v-head-dim"])
        ql, kvl = int(f.get("--q-lora-rank") or 0), int(f["--kv-lora-rank"])
        q = h * ql + ql + ql * a * (qk + rope) if ql else h * a * (qk + rope)
        attn = q + h * (kvl + rope) + kvl + kvl * a * (qk + v) + a * v * h
    else:
        d = int(f.get("--kv-channels") or h // a)
        g = int(f["--num-query-groups"]) if "--group-query-attention" in f else a
        attn = h * (a + 2 * g) * d + a * d * h + ((a + 2 * g) * d if qkv_bias else 0) + (h if bias else 0)
        if "--qk-layernorm" in f:
            attn += 2 * d
    dense_ffn = mlp(int(f["--ffn-hidden-size"]))
    total = 0
    if "--num-experts" in f:
        e = int(f["--num-experts"])
        moe = e * mlp(int(f["--moe-ffn-hidden-size"])) + h * e
        if "--moe-shared-expert-intermediate-size" in f:
            moe += mlp(int(f["--moe-shared-expert-intermediate-size"]))
        for is_moe in _moe_pattern(f.get("--moe-layer-freq"), L):
            total += attn + (moe if is_moe else dense_ffn) + 2 * norm
    else:
        total = L * (attn + dense_ffn + 2 * norm)
    total += vocab * h + norm
    if f.get("--position-embedding-type") == "learned_absolute":
        total += int(f["--max-position-embeddings"]) * h
    if "--untie-embeddings-and-output-weights" in f:
        total += vocab * h
    return total


@pytest.mark.parametrize("name", NAMES)
def test_megatron_flags_rebuild_the_requested_parameter_count(name):
    cfg = json.loads((CONFIGS / f"{name}.json").read_text())
    spec = from_hf_config(cfg)
    flags = megatron_flags(cfg, seq=1024 if spec.position_embedding == "learned" else 4096)
    ref = megatron_reference()
    assert all(flag in ref for flag in flags), [f for f in flags if f not in ref]
    rebuilt = rebuild_params(flags, spec.vocab_size)
    assert rebuilt == pytest.approx(spec.total_params(), rel=0.005), (name, rebuilt, spec.total_params())


def test_megatron_flags_carry_rope_biases_tying_and_moe_shapes():
    load = lambda n: json.loads((CONFIGS / f"{n}.json").read_text())  # noqa: E731
    llama = megatron_flags(load("llama-3.1-8b"))
    assert llama["--rotary-base"] == "500000" and "--use-rope-scaling" in llama and llama["--rope-scaling-factor"] == "8.0"
    assert "--swiglu" in llama and "--untie-embeddings-and-output-weights" in llama and llama["--kv-channels"] == "128"
    qwen = megatron_flags(load("qwen2.5-72b"))
    assert "--add-qkv-bias" in qwen and "--disable-bias-linear" in qwen and qwen["--rotary-base"] == "1000000"
    q3 = megatron_flags(load("qwen3-30b-a3b"))
    assert q3["--moe-ffn-hidden-size"] == "768" and q3["--kv-channels"] == "128" and "--qk-layernorm" in q3
    ds = megatron_flags(load("deepseek-v3"))
    assert "--multi-latent-attention" in ds and ds["--q-lora-rank"] == "1536" and ds["--kv-lora-rank"] == "512"
    assert ds["--moe-layer-freq"] == "([0]*3+[1]*58)" and ds["--moe-shared-expert-intermediate-size"] == "2048"
    assert ds["--ffn-hidden-size"] == "18432" and ds["--mtp-num-layers"] == "1" and ds["--rope-type"] == "yarn"
    gemma = megatron_flags(load("gemma-2-27b"))
    assert "--swiglu" not in gemma and "--untie-embeddings-and-output-weights" not in gemma
    assert gemma["--window-size"] == "(4096,0)" and gemma["--window-attn-skip-freq"] == "2"
    falcon = megatron_flags(load("falcon-7b"))
    assert falcon["--position-embedding-type"] == "rope" and falcon["--num-query-groups"] == "1"
    assert "--untie-embeddings-and-output-weights" not in falcon and "--swiglu" not in falcon


def test_flags_megatron_would_refuse_or_misread_are_written_its_way():
    """MLA without YaRN scaling asks for plain RoPE (MLATransformerConfig defaults to YaRN) and
    turns off the YaRN-only fused kernel; top-1 routing gets the pre-softmax router Megatron
    requires for topk 1; the bf16-only grouped GEMM is written for MoE models."""
    load = lambda n: json.loads((CONFIGS / f"{n}.json").read_text())  # noqa: E731
    plain = {k: v for k, v in load("deepseek-v3").items() if k != "rope_scaling"}
    ds = megatron_flags(plain)
    assert ds["--rope-type"] == "rope" and "--no-rope-fusion" in ds
    assert megatron_flags(load("deepseek-v3"))["--rope-type"] == "yarn" and "--no-rope-fusion" not in megatron_flags(load("deepseek-v3"))
    top1 = megatron_flags({**load("mixtral-8x7b"), "num_experts_per_tok": 1})
    assert "--moe-router-pre-softmax" in top1 and "--moe-grouped-gemm" in top1
    assert "--moe-router-pre-softmax" not in megatron_flags(load("mixtral-8x7b"))
    assert all(k in megatron_reference() for k in {**ds, **top1})


def test_mtp_with_plain_yarn_is_refused_for_the_megatron_launch():
    """Megatron-Core refuses multi-token prediction with YaRN position embeddings (MLA's own
    YaRN aside): the launch is a 422 naming the target, not a file that stops at start-up."""
    from planner_service.exporters.plan_view import InvalidPlan

    load = lambda n: json.loads((CONFIGS / f"{n}.json").read_text())  # noqa: E731
    llama = {**load("llama-3.1-8b"), "num_nextn_predict_layers": 1,
             "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192}}
    with pytest.raises(InvalidPlan) as exc:
        megatron_flags(llama)
    assert exc.value.field == "target" and "multi-token prediction" in str(exc.value)
    assert megatron_flags(load("deepseek-v3"))["--mtp-num-layers"] == "1"  # MLA with YaRN: accepted
