"""Physics cases: what the MoE and long-context terms of the cost model do, one case each.

Not a fidelity measurement (the published file has no MoE rows): each case shows one effect the
cost model must have, with the numbers it predicts, so a reader can check the physics —

* ``moe_ep_sweep``: Qwen3-30B-A3B (128 experts, top-8) on 4 × 8 H100: step time and exposed
  dispatch/combine vs EP, inside a node (ep ≤ 8) and across nodes (ep 16, 32), NCCL all-to-all vs
  DeepEP-style node-deduplicated dispatch, and Megatron-Core's EP overlap;
* ``moe_vs_dense``: the same model against a dense model with its attention and a k·f FFN (the
  same active FLOPs): the ratio of step times;
* ``moe_folding``: Qwen3-235B-A22B's MoE layer with ep 16 folded across tp 2 × dp 8 (ETP 1)
  against the classic ep 8 with ETP = TP 2;
* ``grouped_gemm_efficiency``: the fraction of peak an expert GEMM reaches vs its tokens;
* ``dropless_imbalance``: the slowest EP rank's load over the mean vs EP;
* ``cp_vs_sequence``: Llama-3-70B on 8 × 8 H100 at a fixed 1M tokens per step, sequence 16k–128k,
  with the context parallelism each needs: attention share and exposed ring;
* ``cp_comm_types``: p2p ring vs all-gather vs all-to-all at 128k;
* ``sliding_window``: attention time of a windowed (4k) and a chunked (Llama 4's 8k chunks) vs a
  global layer vs sequence;
* ``mla_flops``: DeepSeek-V3 model FLOPs per token against 6 × active parameters + attention;
* ``planner_searches_ep``: the plan for Qwen3-235B-A22B on 16 × 8 H100 (EP is a searched knob);
* ``selective_recompute_by_framework``: Llama-2 13B under FSDP FULL_SHARD on 8 H100, 2 × 4096
  tokens per micro-batch: no recompute, torchtitan's op-level selective checkpointing and full
  recompute (step and peak), against Megatron's selective recompute with FlashAttention (= none);
* ``selective_recompute_moe_mla``: torchtitan's deepseek_v3_16b recipe (DeepSeek-V2-Lite's MLA
  and 64-expert MoE layers, FSDP on 8 H100, ep 8, 4 × 4096 tokens per GPU): no recompute, its
  op-level selective checkpointing (the routed experts' grouped GEMMs recomputed, both
  all-to-alls' outputs kept) and full recompute — step and peak;
* ``recompute_modules``: Megatron-Core's ``--recompute-modules`` on Qwen3-30B-A3B (tp 2, pp 2,
  ep 8): activations and step for the attention core alone, ``moe_act``, ``layernorm``, both, and
  the whole MoE layer;
* ``paddle_full_attn``: PaddleNLP's ``recompute_granularity`` on Llama-2 13B (tp 4, SP): none,
  ``core_attn``, ``full_attn`` (the whole attention module) and full recompute;
* ``pipeline_schedules``: torchtitan's gradient accumulation around the pipeline — one, 2, 4 and 8
  schedules a step on Llama-3-8B with pp 4: the bubble each fill and drain adds;
* ``submodule_checkpointing``: full recompute by submodule (NeMo-RL's DTensor policy) against whole-layer
  checkpoints and none, Llama-3-8B under FSDP on 8 H100;
* ``fsdp_selective_checkpointing``: fms-fsdp's ``selective_checkpointing`` on Llama-2 13B under
  FSDP on 128 A100: none, a quarter, half, three quarters and all of the blocks;
* ``interleaved_microbatch_groups``: Megatron-Core's interleaved micro-batch group on Llama 3 70B
  (tp 8, pp 4, vpp 5): 32 micro-batches in groups of 4, 8, 16 and 32, and 30 and 34 in the
  smallest group that runs — activations held and step;
* ``hsdp_vs_full_shard``: Llama-3-8B under FSDP ZeRO-3, one 8192-token micro-batch per GPU, on
  4–128 nodes of 8 H100 at a fixed per-GPU batch: full sharding over every dp rank against HSDP
  (sharded within a node, replicated across) — step, exposed DP time and the state each holds;
* ``fsdp_schedules``: Llama 3 70B under FSDP per zero stage and pipeline depth, as torchtitan runs
  them, against Megatron-Core's distributed optimizer;
* ``fsdp_replicate_sync``: unsharded FSDP (ZeRO 0) on 32 H100 with 2 and 16 micro-batches a step:
  an all-reduce per micro-batch without a pipeline, once a step with one, against Megatron-Core's DDP;
* ``optimizer_precision``: Megatron-Core's precision-aware optimizer, bf16 moments and a bf16
  gradient buffer on Qwen3-30B-A3B (16 H100, dp 16, ep 8): model state, peak and step;
* ``eager_vs_fused``: Llama-3-8B under FSDP ZeRO-3 on 8 H100, one 8192-token micro-batch per
  GPU, no recompute: fused kernels against eager PyTorch (``fused_kernels: false``: Hugging
  Face's operator-by-operator RMSNorm, rotate_half and SwiGLU) — step, elementwise share and
  the activations each keeps;
* ``deepspeed_stage3_single_source``: Llama-2 7B under DeepSpeed on 8 A100, ZeRO-2 against
  ZeRO-3: the stage-3 constants rest on one source, so the ZeRO-3 step-time interval spans the
  step at their priors;
* ``optimizer_offload``: Llama-2 13B on 8 A100 40GB (DeepSpeed ZeRO-2) and on 8 H100 80GB
  (Megatron-Core's distributed optimizer, precision-aware, bf16 gradient buffer), and PaddleNLP's
  tensor-wise offload on 8 A100 40GB: the state on the GPU against half and all of it offloaded to the host — peak, host memory per GPU, the optimizer's share of the step,
  and on the A100 the fit that only offload gives;
* ``fsdp_cpu_offload``: Llama-2 70B fully sharded on 8 H100, 1 and 8 micro-batches of 2048
  tokens a step: the sharded state on the GPU against FSDP2's CPU offload (and DeepSpeed's ZeRO-3
  Offload, one micro-batch) — peak, host memory, the host copies' exposed time and the CPU step;
* ``activation_offloading``: Llama-3-8B under FSDP on 8 H100, 4096-token sequences, 2 a
  micro-batch: the saved activations on the GPU against offloaded to the host, without, with
  selective and with full recompute — activations, peak, host memory, the copies' exposed time;
* ``megatron_module_offload``: Qwen3-30B-A3B on 32 H100 (ep 8) under Megatron-Core: its
  fine-grained activation offloading of the experts' FC1 input, of their activation input too,
  and of every module — activations, peak, host memory, the copies' exposed time;
* ``eight_bit_adam``: Llama-3-8B on 8 H100 replicated in pure bf16 (FSDP's NO_SHARD), under
  DeepSpeed ZeRO-2 and FSDP's full sharding: AdamW against the 8-bit AdamW — optimizer state, peak, the optimizer's time;
* ``muon``: Llama-3-8B (tp 4 on 16 H100) and Qwen3-30B-A3B (ep 8 on 32 H100) under Megatron-Core:
  Adam with the distributed optimizer against Muon without it and with its layer-wise distributed
  optimizer — optimizer state, peak, the optimizer's time (the Newton-Schulz iterations) and the
  data-parallel sync;
* ``optimizer_in_backward``: Llama-3.1-70B fully sharded on 8 B200 in pure bf16 (6 x 8192 tokens a GPU,
  full recompute, torch.compile's loss: torchtitan's 70B B200 layout) and Llama-3-8B on 8 H100: the step after the backward against torchtune's
  optimizer in the backward — gradients, peak, step;
* ``dpo_reference``: Llama-3-8B DPO on 8 H100 (2 x 2048-token sequences a micro-batch, full
  recompute) under FSDP's full sharding and DeepSpeed ZeRO-2: without and with the frozen
  reference model — weights, peak, compute, step;
* ``lora``: Llama-3-8B under FSDP's full sharding on 8 H100 (2 × 4096 tokens a micro-batch, no
  recompute), a full finetune against LoRA r 16 on every linear layer, on the QKV projection
  alone and with a 0.05 dropout, Llama-3-70B and Qwen3-30B-A3B (ep 8; every expert adapted, or
  the attention alone) on the same node with full recompute, and Llama-3.1-405B with its base in
  bf16 against QLoRA's NF4 — trainable parameters, state, activations, peak and step;
* ``loss_kernels``: Llama-3-8B under FSDP on 8 H100 at 8,192 tokens a micro-batch: the unfused
  loss against torchtune's chunked loss, Liger's fused linear cross-entropy and Cut
  Cross-Entropy, and under Megatron-Core its own loss against Transformer Engine's parallel
  cross-entropy — activations, peak, step;
* ``fp8_weights``: Llama-3-70B under Megatron-Core on 32 H100, tp 4 · pp 4 · dp 2 in BF16, in FP8
  with the cached casts and with FP8 weights, and dp 32 under Megatron-FSDP — weights, peak, step;
* ``grouped_recompute``: Llama-3-70B under Megatron-Core, tp 8 · pp 4 on 32 H100, full recompute
  with every layer checkpointed, in uniform groups of 2, 4 and 10 layers, and block recompute of
  half of each chunk — activations, peak, step;
* ``memory_interval_state_dominated``: DeepSeek-V3 (its config.json) under FSDP on 16 × 8 A800
  80GB, a layout whose sharded state nearly fills the device: its peak's p10–p90 widens only the
  fragmentation reserve (``memory.MemoryBound``), against the p10 a widening of the whole peak
  would give.

Run: python bench/physics_cases.py   (writes bench/results/physics_cases.json)
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from cost_model import Strategy, Training, estimate, simple_cluster  # noqa: E402
from cost_model.comm import Links  # noqa: E402
from cost_model.devices import get_device  # noqa: E402
from cost_model.frameworks import OFFLOAD_MODULES, interleaved_microbatch_group  # noqa: E402
from cost_model.strategy import strategy_from_dict  # noqa: E402
from cost_model.transformer import moe  # noqa: E402
from cost_model.transformer.calibration import calibrated_device  # noqa: E402
from cost_model.transformer.layer_cost import (  # noqa: E402
    HOST_ADAM_BYTES_PER_PARAM,
    TENSORWISE_OFFLOAD_BYTES_PER_PARAM,
    StrategyArrays,
    layer_costs,
    optimizer_bytes_per_param,
)
from cost_model.transformer.lora import adapter_params_per_layer, expert_adapter_params_per_layer  # noqa: E402
from cost_model.transformer.spec import TransformerSpec, from_hf_config, get_preset  # noqa: E402
from cost_model.transformer.stage_cost import model_flops_per_step  # noqa: E402

CONFIGS = ROOT / "tests" / "costmodel" / "transformer" / "hf_configs"
OUT = ROOT / "bench" / "results" / "physics_cases.json"
H100 = "H100-SXM5-80GB"

#: Qwen3-235B-A22B's config.json shape (Qwen3 model card): 94 layers, h 4096, 64 heads, 4 KV
#: heads of 128, 128 experts of 1536, top-8.
QWEN3_235B = {"model_type": "qwen3_moe", "num_hidden_layers": 94, "hidden_size": 4096, "num_attention_heads": 64,
              "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 12288, "moe_intermediate_size": 1536,
              "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936, "decoder_sparse_step": 1,
              "mlp_only_layers": [], "tie_word_embeddings": False}


def _config(name: str) -> TransformerSpec:
    return from_hf_config(json.loads((CONFIGS / f"{name}.json").read_text()), name=name)


def _row(est: Any, **extra: Any) -> dict[str, Any]:
    d = est.to_dict()
    return {**extra, "step_time_s": round(d["step_time_s"], 4), "mfu": round(d["mfu"], 4), "fits": d["fits"],
            "peak_memory_GB": round(max(d["peak_memory_GB"]), 1),
            "breakdown_s": {k: round(v, 4) for k, v in d["breakdown_s"].items() if v}}


def moe_ep_sweep() -> dict[str, Any]:
    model = _config("qwen3-30b-a3b")
    tr = Training(global_batch_size=256, sequence_length=4096)
    cl = simple_cluster(H100, 4)
    rows = []
    for ep in (4, 8, 16, 32):
        for dispatcher, overlap in (("alltoall", False), ("deepep", False), ("alltoall", True)):
            t = replace(tr, moe_token_dispatcher=dispatcher, moe_comm_overlap=overlap)
            est = estimate(model, t, cl, Strategy(dp=32, ep=ep, zero_stage=1, recompute="selective"))
            rows.append(_row(est, ep=ep, dispatcher=dispatcher, overlap=overlap, ep_within_node=ep <= 8))
    return {"model": model.name, "total_params": model.total_params(), "active_params": model.active_params(),
            "cluster": "4 x 8 H100-SXM5-80GB, dp 32, ZeRO-1", "rows": rows}


def moe_vs_dense() -> dict[str, Any]:
    model = _config("qwen3-30b-a3b")
    dense = replace(model, num_experts=1, experts_per_token=1, ffn_hidden_size=model.experts_per_token * model.ffn_hidden_size,
                    name="dense, same attention, FFN k·f wide")
    tr = Training(global_batch_size=256, sequence_length=4096)
    cl = simple_cluster(H100, 1)
    m = estimate(model, tr, cl, Strategy(dp=8, ep=8, zero_stage=1))
    d = estimate(dense, tr, cl, Strategy(dp=8, zero_stage=1))
    return {"moe": _row(m, model=model.name, active_params=model.active_params()),
            "dense": _row(d, model=dense.name, active_params=dense.active_params()),
            "ratio_moe_over_dense": round(m.step_time_s / d.step_time_s, 3)}


def moe_folding() -> dict[str, Any]:
    model = from_hf_config(QWEN3_235B, name="qwen3-235b-a22b")
    tr = Training(global_batch_size=1024, sequence_length=4096)
    group = simple_cluster(H100, 2).node_groups[0]
    links = Links.for_group(group)
    device = calibrated_device(get_device(H100), "megatron-core", "bf16")
    layouts = {"classic ep8 etp2 (tp2 dp8)": Strategy(tp=2, dp=8, ep=8, sequence_parallel=True),
               "folded ep16 etp1 (tp2 dp8)": Strategy(tp=2, dp=8, ep=16, sequence_parallel=True)}
    S = StrategyArrays.from_strategies(list(layouts.values()))
    lc = layer_costs(model, tr, device, links, S)
    rows = []
    for i, name in enumerate(layouts):
        rows.append({"layout": name, "layer_s": round(float(lc.total_s[i]), 6), "tp_comm_s": round(float(lc.tp_comm_s[i]), 6),
                     "ep_comm_s": round(float(lc.ep_comm_s[i]), 6),
                     "expert_tensor_parallel": float(moe.expert_tensor_parallel(S.tp[i], S.cp[i], S.dp[i], S.ep[i]))})
    return {"model": model.name, "active_params": model.active_params(), "total_params": model.total_params(), "rows": rows}


def grouped_gemm_efficiency() -> dict[str, Any]:
    device = calibrated_device(get_device(H100), "megatron-core", "bf16")
    m = np.array([8, 32, 128, 512, 2048, 8192], dtype=float)
    eff = moe.grouped_gemm_efficiency(m, 2 * 1536, 4096, device, "bf16")
    return {"shape": "[M x 4096] x [4096 x 3072] (Qwen3-235B expert FC1), H100 bf16",
            "rows": [{"tokens_per_expert": int(a), "fraction_of_peak": round(float(b), 4)} for a, b in zip(m, eff, strict=True)]}


def dropless_imbalance() -> dict[str, Any]:
    slots = 4096 * 8  # 4k tokens, top-8
    return {"slots_per_rank": slots,
            "rows": [{"ep": ep, "load_factor": round(float(moe.dropless_load_factor(slots, ep)), 4)} for ep in (1, 8, 16, 64, 256)]}


def cp_vs_sequence() -> dict[str, Any]:
    model = get_preset("llama3-70b")
    cl = simple_cluster(H100, 16)
    rows = []
    for seq, cp in ((16384, 1), (16384, 2), (32768, 2), (32768, 4), (65536, 4), (65536, 8), (131072, 8)):
        tr = Training(global_batch_size=(1 << 21) // seq, sequence_length=seq)
        dp = 128 // (8 * cp * 2)
        est = estimate(model, tr, cl, Strategy(tp=8, pp=2, cp=cp, dp=dp, sequence_parallel=True, recompute="full", zero_stage=1))
        rows.append(_row(est, sequence_length=seq, cp=cp))
    return {"model": model.name, "cluster": "16 x 8 H100, tp 8, pp 2, 2M tokens per step", "rows": rows}


def cp_comm_types() -> dict[str, Any]:
    model = get_preset("llama3-70b")
    cl = simple_cluster(H100, 16)
    rows = []
    for kind, a2a in (("p2p", None), ("allgather", None), ("a2a", None), ("a2a+p2p", 2)):
        tr = Training(global_batch_size=16, sequence_length=131072, cp_comm_type=kind, cp_a2a_size=a2a)
        est = estimate(model, tr, cl, Strategy(tp=8, pp=2, cp=8, dp=1, sequence_parallel=True, recompute="full", zero_stage=1))
        rows.append(_row(est, cp_comm_type=kind if a2a is None else f"{kind} ({a2a} × {8 // a2a})"))
    return {"model": model.name, "sequence_length": 131072, "layout": "tp 8, pp 2, cp 8 on 16 x 8 H100", "rows": rows}


def sliding_window() -> dict[str, Any]:
    base = get_preset("llama3-8b")
    windowed = replace(base, sliding_window=4096, local_attention_layers=base.num_layers, name="llama3-8b, 4k window")
    # Llama 4's chunked attention (8k chunks, each causal within itself) on the same layer
    chunked = replace(base, attention_chunk_size=8192, local_attention_layers=base.num_layers, name="llama3-8b, 8k chunks")
    device = calibrated_device(get_device(H100), "megatron-core", "bf16")
    links = Links.for_group(simple_cluster(H100, 1).node_groups[0])
    rows = []
    for seq in (8192, 32768, 131072):
        tr = Training(global_batch_size=8, sequence_length=seq)
        S = StrategyArrays.from_strategies([Strategy(tp=8, cp=1, sequence_parallel=True)])
        g = float(layer_costs(base, tr, device, links, S).total_s[0])
        w = float(layer_costs(windowed, tr, device, links, S).total_s[0])
        c = float(layer_costs(chunked, tr, device, links, S).total_s[0])
        rows.append({"sequence_length": seq, "global_layer_s": round(g, 6), "windowed_layer_s": round(w, 6), "ratio": round(w / g, 3),
                     "chunked_layer_s": round(c, 6), "chunked_ratio": round(c / g, 3)})
    return {"rows": rows}


def mla_flops() -> dict[str, Any]:
    # the main model: its multi-token-prediction module adds a layer, a projection and a head
    model = replace(_config("deepseek-v3"), mtp_layers=0)
    s = 4096
    tr = Training(global_batch_size=1, sequence_length=s)
    per_token = model_flops_per_step(model, tr) / s
    attention = 3 * 4 * model.attention_core_width(s) * model.num_layers
    six_n = 6 * (model.active_params() - model.embedding_params())
    return {"model": model.name, "total_params": model.total_params(), "active_params": model.active_params(),
            "model_flops_per_token": per_token, "six_times_active_non_embedding": six_n, "attention_flops_per_token": attention,
            "relative_gap_after_attention": round((per_token - attention - six_n) / six_n, 5)}


def planner_searches_ep() -> dict[str, Any]:
    from planner_service.planner import SolverSettings, plan
    from planner_service.planner.request import parse_plan_request

    req = {"model": {"transformer": QWEN3_235B, "name": "qwen3-235b-a22b"}, "training": {"global_batch_size": 1024, "sequence_length": 4096},
           "cluster": {"name": "c", "node_groups": [{"name": "g", "count": 16, "gpus_per_node": 8, "device": H100}]}}
    result = plan(parse_plan_request(req), SolverSettings(time_limit_s=20.0, num_workers=1)).to_dict()
    best = result["best"]
    keep = ("step_time_s", "mfu", "model_params", "active_params")
    return {"model": "qwen3-235b-a22b", "cluster": "16 x 8 H100", "best": {"strategy": best["strategy"], **{k: best["prediction"][k] for k in keep}},
            "alternatives": [{"strategy": a["strategy"], "step_time_s": a["prediction"]["step_time_s"]} for a in result.get("alternatives", [])[:5]]}


def selective_recompute_by_framework() -> dict[str, Any]:
    model = get_preset("llama2-13b")
    cl = simple_cluster(H100, 1)
    rows = []
    for framework, rc in (("fsdp", "none"), ("fsdp", "selective"), ("fsdp", "full"), ("megatron-core", "selective")):
        tr = Training(global_batch_size=64, sequence_length=4096, framework=framework)
        est = estimate(model, tr, cl, Strategy(dp=8, micro_batch_size=2, zero_stage=3, recompute=rc))
        rows.append(_row(est, framework=framework, recompute=rc))
    return {"model": model.name, "layout": "FSDP FULL_SHARD dp 8 on 8 H100, micro-batch 2 x 4096", "rows": rows}


#: DeepSeek-V2-Lite's config.json shape, torchtitan's deepseek_v3 "16B" flavor: MLA without a
#: query rank, 64 experts of 1408 (top-6) beside 2 shared ones, the first layer dense.
DSV2_LITE = {"model_type": "deepseek_v3", "num_hidden_layers": 27, "hidden_size": 2048, "num_attention_heads": 16,
             "num_key_value_heads": 16, "intermediate_size": 10944, "vocab_size": 102400, "tie_word_embeddings": False,
             "n_routed_experts": 64, "num_experts_per_tok": 6, "moe_intermediate_size": 1408, "n_shared_experts": 2,
             "first_k_dense_replace": 1, "q_lora_rank": None, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
             "qk_nope_head_dim": 128, "v_head_dim": 128}


def selective_recompute_moe_mla() -> dict[str, Any]:
    model = from_hf_config(DSV2_LITE, name="deepseek-v2-lite (torchtitan deepseek_v3 16B)")
    tr = Training(global_batch_size=32, sequence_length=4096, framework="fsdp")
    rows = []
    for rc in ("none", "selective", "full"):
        est = estimate(model, tr, simple_cluster(H100, 1), Strategy(dp=8, ep=8, micro_batch_size=4, zero_stage=3, recompute=rc))
        rows.append(_row(est, recompute=rc, activations_GB=round(est.to_dict()["memory_breakdown_GB"][0]["activations"], 1)))
    return {"model": model.name, "layout": "FSDP ZeRO-3 dp 8, ep 8 on 8 H100, 4 x 4096 tokens per GPU", "rows": rows}


def hsdp_vs_full_shard() -> dict[str, Any]:
    model = from_hf_config({"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
                            "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256}, name="llama3-8b")
    rows = []
    for nodes in (4, 16, 64, 128):
        dp = 8 * nodes
        tr = Training(global_batch_size=dp, sequence_length=8192, framework="fsdp")
        for shard in (0, 8):
            est = estimate(model, tr, simple_cluster(H100, nodes), Strategy(dp=dp, zero_stage=3, recompute="selective", dp_shard=shard))
            m = est.to_dict()["memory_breakdown_GB"][0]
            rows.append(_row(est, nodes=nodes, dp=dp, sharding="full" if not shard else f"HSDP {shard}x{dp // shard}",
                             state_GB=round(m["weights"] + m["gradients"] + m["optimizer_state"], 2)))
    return {"model": model.name, "layout": "FSDP ZeRO-3, op-level selective recompute, 1 x 8192 tokens per GPU", "rows": rows}


def fsdp_schedules() -> dict[str, Any]:
    """FSDP as torchtitan runs it, per zero stage and pipeline depth (layer_cost.pipelined_fsdp,
    fsdp_regathers_each_microbatch): Llama 3 70B on 64 H100 at tp 8, 8K tokens, full recompute,
    64 sequences a step — the DP traffic each schedule exposes and the memory it holds."""
    model = get_preset("llama3-70b")
    cl = simple_cluster(H100, 8)
    rows = []
    for framework, zero, pp in (("fsdp", 3, 1), ("fsdp", 2, 1), ("fsdp", 3, 4), ("fsdp", 2, 4), ("megatron-core", 1, 4)):
        tr = Training(global_batch_size=64, sequence_length=8192, framework=framework)
        est = estimate(model, tr, cl, Strategy(tp=8, pp=pp, dp=8 // pp, zero_stage=zero, micro_batch_size=1, recompute="full"))
        m = est.to_dict()["memory_breakdown_GB"][0]
        rows.append(_row(est, framework=framework, zero_stage=zero, pp=pp, dp=8 // pp,
                         state_GB=round(m["weights"] + m["gradients"] + m["optimizer_state"], 2)))
    return {"model": model.name, "layout": "64 H100, tp 8, 8192 tokens, full recompute, 64 sequences a step", "rows": rows}


def fsdp_replicate_sync() -> dict[str, Any]:
    """Unsharded FSDP (ZeRO 0) as torchtitan runs it (layer_cost.fsdp_reduces_each_microbatch):
    an all-reduce with every micro-batch without a pipeline, once a step with one, against
    Megatron-Core's DDP, which all-reduces once a step — Llama 2 7B, tp 2, 32 H100, full
    recompute, 2048-token sequences, 2 and 16 micro-batches a step."""
    model = get_preset("llama2-7b")
    cl = simple_cluster(H100, 4)
    rows = []
    for framework, pp in (("fsdp", 1), ("fsdp", 2), ("megatron-core", 1)):
        for microbatches in (2, 16):
            dp = 16 // pp
            tr = Training(global_batch_size=dp * microbatches, sequence_length=2048, framework=framework)
            est = estimate(model, tr, cl, Strategy(tp=2, pp=pp, dp=dp, zero_stage=0, micro_batch_size=1, recompute="full"))
            rows.append(_row(est, framework=framework, pp=pp, dp=dp, microbatches=microbatches))
    return {"model": model.name, "layout": "32 H100, tp 2, ZeRO 0, 2048 tokens, full recompute", "rows": rows}


def recompute_modules() -> dict[str, Any]:
    """Megatron-Core's --recompute-modules (layer_cost.selective_module_costs): Qwen3-30B-A3B on
    32 H100 at tp 2 (SP), pp 2, ep 8, 4096 tokens, 64 micro-batches — the first stage's
    activations and the step per module set."""
    model = _config("qwen3-30b-a3b")
    cl = simple_cluster(H100, 4)
    rows = []
    for modules in (None, ("moe_act",), ("layernorm",), ("moe_act", "layernorm"), ("moe",)):
        tr = Training(global_batch_size=512, sequence_length=4096)
        est = estimate(model, tr, cl, Strategy(dp=8, tp=2, pp=2, ep=8, sequence_parallel=True, micro_batch_size=1, recompute="selective",
                                               zero_stage=1, recompute_modules=modules or ()))
        rows.append(_row(est, recompute_modules=list(modules or ("core_attn",)),
                         activations_GB=round(est.to_dict()["memory_breakdown_GB"][0]["activations"], 2)))
    return {"model": model.name, "layout": "32 H100, tp 2 (SP), pp 2, ep 8, 4096 tokens, 512 sequences a step", "rows": rows}


def optimizer_precision() -> dict[str, Any]:
    """Megatron-Core's optimizer precision (layer_cost.megatron_optimizer_state_bytes):
    Qwen3-30B-A3B on 16 H100, dp 16, ep 8, distributed optimizer, full recompute — the model
    state, peak and step at the defaults, with the precision-aware optimizer (master weights as
    16-bit remainders), with bf16 moments, with a bf16 gradient buffer too, and with the bf16
    gradient buffer alone."""
    model = _config("qwen3-30b-a3b")
    cl = simple_cluster(H100, 2)
    settings: list[dict[str, Any]] = [
        {}, {"precision_aware_optimizer": True},
        {"precision_aware_optimizer": True, "exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"},
        {"precision_aware_optimizer": True, "exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16", "main_grads_dtype": "bf16"},
        {"main_grads_dtype": "bf16"},
    ]
    rows = []
    for kw in settings:
        tr = Training(global_batch_size=256, sequence_length=4096, **kw)
        est = estimate(model, tr, cl, Strategy(dp=16, ep=8, zero_stage=1, recompute="full"))
        m = est.stages[0].memory_GB
        rows.append(_row(est, settings=kw, gradients_GB=round(m["gradients"], 2), optimizer_state_GB=round(m["optimizer_state"], 2)))
    return {"model": model.name, "layout": "16 H100, dp 16, ep 8, distributed optimizer, full recompute, 4096 tokens", "rows": rows}


def eager_vs_fused() -> dict[str, Any]:
    """Fused kernels against eager PyTorch (layer_cost.eager_*_traffic, eager_saved_bytes_per_element)."""
    model = get_preset("llama3-8b")
    cl = simple_cluster(H100, 1)
    rows = []
    for fused in (True, False):
        tr = Training(global_batch_size=8, sequence_length=8192, framework="fsdp", fused_kernels=fused)
        est = estimate(model, tr, cl, Strategy(dp=8, zero_stage=3, recompute="none"))
        rows.append(_row(est, fused_kernels=fused, activations_GB=round(est.to_dict()["memory_breakdown_GB"][0]["activations"], 1)))
    return {"model": model.name, "layout": "FSDP ZeRO-3 dp 8 on 8 H100, 1 x 8192 tokens per GPU, no recompute", "rows": rows}


def deepspeed_stage3_single_source() -> dict[str, Any]:
    """DeepSpeed ZeRO-2 against ZeRO-3 on one node: the stage-3 constants rest on one source, so
    the ZeRO-3 interval spans the step at their priors (calibration.single_source_spread)."""
    from cost_model.estimate import step_at_single_source_priors

    model = get_preset("llama2-7b")
    cl = simple_cluster("A100-SXM4-80GB", 1)
    tr = Training(global_batch_size=32, sequence_length=4096, framework="deepspeed")
    rows = []
    for zero in (2, 3):
        strategy = Strategy(dp=8, micro_batch_size=4, zero_stage=zero, recompute="full")
        est = estimate(model, tr, cl, strategy)
        at_priors = step_at_single_source_priors(model, tr, cl, strategy)
        rows.append(_row(est, zero_stage=zero, step_time_s_p10=round(est.step_time_s_p10, 4), step_time_s_p90=round(est.step_time_s_p90, 4),
                         single_source_constants=sorted(at_priors[1]) if at_priors else [],
                         step_time_s_at_priors=round(at_priors[0], 4) if at_priors else None))
    return {"model": model.name, "layout": "DeepSpeed dp 8 on 8 A100 80GB, micro-batch 4 x 4096, full recompute", "rows": rows}


def memory_interval_state_dominated() -> dict[str, Any]:
    """The peak's interval of a layout whose optimizer state (allocated once) nearly fills the
    device: the fragmentation range widens the reserve R only, (P + R·(g/f − 1))/e^q
    (cost_model.transformer.memory), not the whole peak P·(1 + g)/(1 + f)/e^q."""
    from cost_model.transformer.layer_cost import fragmentation_fraction
    from cost_model.transformer.memory import (
        UNMEASURED_FRAGMENTATION,
        bounds,
        fitted_convention,
        fragmentation_reserve_GB,
    )

    model = _config("deepseek-v3")
    tr = Training(global_batch_size=1024, sequence_length=4096, framework="fsdp")
    est = estimate(model, tr, simple_cluster("A800-SXM4-80GB", 16),
                   Strategy(dp=8, tp=4, pp=1, cp=4, ep=16, micro_batch_size=1, recompute="full", zero_stage=3))
    stage = max(est.stages, key=lambda st: st.peak_memory_GB)
    m = stage.memory_GB
    p10_end = bounds(tr.framework)[0]
    whole = stage.peak_memory_GB * (1 + fitted_convention(UNMEASURED_FRAGMENTATION[0])) / (1 + fragmentation_fraction()) / np.exp(p10_end.log_shift)
    return {"model": model.name, "layout": "FSDP ZeRO-3 dp 8 tp 4 pp 1 cp 4 ep 16 on 16 x 8 A800 80GB, full recompute",
            "state_GB": round(m["weights"] + m["gradients"] + m["optimizer_state"], 1),
            "reserve_GB": round(fragmentation_reserve_GB(m), 1), "peak_memory_GB": round(stage.peak_memory_GB, 1),
            "peak_memory_GB_p10": round(est.peak_memory_GB_p10, 1), "peak_memory_GB_p90": round(est.peak_memory_GB_p90, 1),
            "p10_whole_peak_widened_GB": round(float(whole), 1), "fits": est.fits, "tight": est.tight}


def optimizer_offload() -> dict[str, Any]:
    """Optimizer offload (layer_cost.offloaded_optimizer_s, offloaded_state_bytes_per_param):
    DeepSpeed's ZeRO-Offload at ZeRO-2 on 8 A100 40GB (whole partition; a fraction needs stage 3)
    and Megatron-Core's hybrid optimizer on 8 H100 (0.5 and 1), PaddleNLP's tensorwise offload at
    sharding stage 2 on 8 A100 40GB, Llama-2 13B, 16 × 2048 tokens a step, full recompute."""
    model = get_preset("llama2-13b")
    rows = []
    for device, framework, zero, extra, fractions in (
            ("A100-SXM4-40GB", "deepspeed", 2, {}, (0.0, 1.0)),
            (H100, "megatron-core", 1, {"precision_aware_optimizer": True, "main_grads_dtype": "bf16"}, (0.0, 0.5, 1.0)),
            ("A100-SXM4-40GB", "paddle", 2, {}, (0.0, 1.0))):
        for f in fractions:
            tr = Training(global_batch_size=16, sequence_length=2048, framework=framework, optimizer_offload_fraction=f, **extra)
            est = estimate(model, tr, simple_cluster(device, 1), Strategy(dp=8, zero_stage=zero, recompute="full"))
            rows.append(_row(est, device=device, framework=framework, zero_stage=zero, offload_fraction=f,
                             optimizer_state_GB=round(est.stages[0].memory_GB["optimizer_state"], 2),
                             optimizer_share_of_step=round(est.breakdown_s["optimizer"] / est.step_time_s, 3),
                             host_memory_GB_per_gpu=round(est.stages[0].host_memory_GB, 1)))
    return {"model": model.name, "layout": "8 GPUs, dp 8, full recompute, 16 x 2048 tokens a step", "rows": rows,
            "host_update_bytes_per_param": HOST_ADAM_BYTES_PER_PARAM,
            "tensorwise_round_trip_bytes_per_param": 2 * TENSORWISE_OFFLOAD_BYTES_PER_PARAM}


def fsdp_cpu_offload() -> dict[str, Any]:
    """FSDP2's CPUOffloadPolicy (training.cpu_offload; layer_cost.cpu_offload_microbatch_s,
    cpu_offload_step_s): Llama-2 70B, ZeRO-3 dp 8 on 8 H100, full recompute, 8 and 64 sequences of
    2048 tokens a step (1 and 8 micro-batches a GPU) under FSDP, 8 under DeepSpeed (ZeRO-3 Offload)."""
    model = get_preset("llama2-70b")
    rows = []
    for framework, gbs in (("fsdp", 8), ("fsdp", 64), ("deepspeed", 8)):
        for off in (False, True):
            tr = Training(global_batch_size=gbs, sequence_length=2048, framework=framework, cpu_offload=off)
            est = estimate(model, tr, simple_cluster(H100, 1), Strategy(dp=8, zero_stage=3, recompute="full"))
            rows.append(_row(est, framework=framework, microbatches=gbs // 8, cpu_offload=off,
                             host_memory_GB_per_gpu=round(est.stages[0].host_memory_GB, 1)))
    return {"model": model.name, "layout": "ZeRO-3 dp 8 on 8 H100, full recompute, 2048 tokens a sequence", "rows": rows}


def activation_offloading() -> dict[str, Any]:
    """Saved activations in host memory (training.activation_offloading; layer_cost.activation_offload_s):
    Llama-3-8B under FSDP ZeRO-3 on 8 H100, 64 sequences of 4096 tokens a step, 2 a micro-batch,
    without, with selective and with full recompute, each on the GPU and offloaded."""
    model = get_preset("llama3-8b")
    rows = []
    for recompute in ("none", "selective", "full"):
        for off in (False, True):
            tr = Training(global_batch_size=64, sequence_length=4096, framework="fsdp", activation_offloading=off)
            est = estimate(model, tr, simple_cluster(H100, 1), Strategy(dp=8, zero_stage=3, micro_batch_size=2, recompute=recompute))
            rows.append(_row(est, recompute=recompute, activation_offloading=off,
                             activations_GB=round(est.stages[0].memory_GB["activations"], 1),
                             host_memory_GB_per_gpu=round(est.stages[0].host_memory_GB, 1)))
    return {"model": model.name, "layout": "FSDP ZeRO-3 dp 8 on 8 H100, 4 micro-batches of 2 x 4096 tokens a GPU", "rows": rows}


def megatron_module_offload() -> dict[str, Any]:
    """Megatron-Core's fine-grained activation offloading (training.offload_modules;
    layer_cost.offload_module_bytes): Qwen3-30B-A3B on 32 H100 (4 nodes), ep 8, dp 32, distributed
    optimizer, selective recompute, 64 sequences of 4096 tokens — no offload against the experts' FC1 input,
    their activation input too, and every module."""
    model = _config("qwen3-30b-a3b")
    rows = []
    for modules in ((), ("expert_fc1",), ("expert_fc1", "moe_act"), OFFLOAD_MODULES):
        tr = Training(global_batch_size=64, sequence_length=4096, framework="megatron-core", activation_offloading=bool(modules),
                      offload_modules=modules)
        est = estimate(model, tr, simple_cluster(H100, 4), Strategy(dp=32, ep=8, zero_stage=1, recompute="selective"))
        rows.append(_row(est, offload_modules=list(modules), activations_GB=round(est.stages[0].memory_GB["activations"], 1),
                         host_memory_GB_per_gpu=round(est.stages[0].host_memory_GB, 1)))
    return {"model": model.name, "layout": "32 H100, ep 8, dp 32, distributed optimizer, selective recompute, 64 x 4096 tokens a step",
            "rows": rows}


def eight_bit_adam() -> dict[str, Any]:
    """The 8-bit AdamW (training.optimizer adamw_8bit; layer_cost.EIGHT_BIT_MOMENT_BYTES): Llama-3-8B
    on 8 H100, 16 sequences of 2048 tokens, full recompute, AdamW against its 8-bit moments under
    FSDP replicated in pure bf16 (DDP, the moments in the parameters' dtype), DeepSpeed ZeRO-2 and
    FSDP's full sharding."""
    model = get_preset("llama3-8b")
    rows = []
    for framework, zero, master in (("fsdp", 0, False), ("deepspeed", 2, True), ("fsdp", 3, True)):
        for optimizer in ("adamw", "adamw_8bit"):
            tr = Training(global_batch_size=16, sequence_length=2048, framework=framework, optimizer=optimizer, master_weights=master)
            est = estimate(model, tr, simple_cluster(H100, 1), Strategy(dp=8, zero_stage=zero, recompute="full"))
            rows.append(_row(est, framework=framework, zero_stage=zero, master_weights=master, optimizer=optimizer,
                             step_bytes_per_param=round(optimizer_bytes_per_param(tr), 2),
                             optimizer_state_GB=round(est.stages[0].memory_GB["optimizer_state"], 2)))
    return {"model": model.name, "layout": "dp 8 on 8 H100, full recompute, 16 x 2048 tokens a step", "rows": rows}


def muon() -> dict[str, Any]:
    """Muon (training.optimizer muon; cost_model.transformer.muon) under Megatron-Core: Adam with the
    distributed optimizer against Muon without it (every rank orthogonalises every matrix of its
    shard) and with its layer-wise distributed optimizer (each rank 1/dp of them; the gradients
    all-reduced, the weights all-gathered)."""
    rows = []
    for name, model, nodes, kw in (("llama3-8b", get_preset("llama3-8b"), 2, {"dp": 4, "tp": 4, "sequence_parallel": True}),
                                   ("qwen3-30b-a3b", _config("qwen3-30b-a3b"), 4, {"dp": 32, "ep": 8})):
        for optimizer, zero in (("adam", 1), ("muon", 0), ("muon", 1)):
            tr = Training(global_batch_size=128, sequence_length=4096, optimizer=optimizer)
            est = estimate(model, tr, simple_cluster(H100, nodes), Strategy(zero_stage=zero, recompute="selective", **kw))
            rows.append(_row(est, model=name, gpus=8 * nodes, optimizer=optimizer, zero_stage=zero,
                             optimizer_state_GB=round(est.stages[0].memory_GB["optimizer_state"], 2)))
    return {"layout": "Megatron-Core, selective recompute, 128 x 4096 tokens a step: Llama-3-8B tp 4 (SP) x dp 4 on 16 H100, "
                      "Qwen3-30B-A3B ep 8 x dp 32 on 32 H100", "rows": rows}


def optimizer_in_backward() -> dict[str, Any]:
    """The optimizer step inside the backward (training.optimizer_in_backward; torchtune's
    optimizer_in_bwd): each parameter stepped as its gradient is reduced, none held for the step —
    one micro-batch a step."""
    rows = []
    for name, device, master, tokens, loss in (("llama3-70b", "B200-SXM-192GB", False, 6, "compiled"), ("llama3-8b", H100, True, 2, "unfused")):
        model = get_preset(name)
        for inside in (False, True):
            tr = Training(global_batch_size=8 * tokens, sequence_length=8192, framework="fsdp", master_weights=master,
                          optimizer_in_backward=inside, loss_kernel=loss)
            est = estimate(model, tr, simple_cluster(device, 1), Strategy(dp=8, zero_stage=3, micro_batch_size=tokens, recompute="full"))
            rows.append(_row(est, model=name, device=device, pure_bf16=not master, optimizer_in_backward=inside,
                             gradients_GB=round(est.stages[0].memory_GB["gradients"], 2)))
    return {"layout": "FSDP full sharding, dp 8, full recompute, one micro-batch of 8192-token sequences a step", "rows": rows}


def dpo_reference() -> dict[str, Any]:
    """DPO's frozen reference model (training.reference_model): its weights held as the policy's
    (sharded under full sharding, whole under ZeRO-2) and one more forward a micro-batch."""
    model = get_preset("llama3-8b")
    rows = []
    for framework, zero in (("fsdp", 3), ("deepspeed", 2)):
        for ref in (False, True):
            tr = Training(global_batch_size=64, sequence_length=2048, framework=framework, reference_model=ref)
            est = estimate(model, tr, simple_cluster(H100, 1), Strategy(dp=8, zero_stage=zero, micro_batch_size=2, recompute="full"))
            rows.append(_row(est, framework=framework, zero_stage=zero, reference_model=ref,
                             weights_GB=round(est.stages[0].memory_GB["weights"], 2)))
    return {"model": model.name, "layout": "dp 8 on 8 H100, 2 x 2048 tokens a micro-batch, full recompute, 64 sequences a step", "rows": rows}


def lora() -> dict[str, Any]:
    """LoRA (cost_model.transformer.lora): the frozen weights' missing weight gradients and state
    against the adapters' own GEMMs, memory-bound passes and saved tensors."""
    rows = []
    cluster = simple_cluster(H100, 1)
    for preset, recompute, cases in (
        ("llama3-8b", "none", (("full finetune", {}), ("LoRA r16, all linear", {"lora_rank": 16}),
                               ("LoRA r16, linear_qkv", {"lora_rank": 16, "lora_target_modules": ("linear_qkv",)}),
                               ("LoRA r16, all linear, dropout 0.05", {"lora_rank": 16, "lora_dropout": 0.05}))),
        ("llama3-70b", "full", (("full finetune", {}), ("LoRA r16, all linear", {"lora_rank": 16}))),
        ("qwen3-30b-a3b", "full", (("full finetune", {}), ("LoRA r16, all linear (every expert's too)", {"lora_rank": 16}),
                                   ("LoRA r16, attention", {"lora_rank": 16, "lora_target_modules": ("linear_qkv", "linear_proj")}))),
        ("llama3-405b", "full", (("LoRA r16, all linear", {"lora_rank": 16}),
                                 ("QLoRA r16, all linear (NF4 base)", {"lora_rank": 16, "lora_base_dtype": "nf4"}),
                                 ("QLoRA r16 with CPU offload", {"lora_rank": 16, "lora_base_dtype": "nf4", "cpu_offload": True}))),
    ):
        model = _config(preset) if preset.startswith("qwen3") else get_preset(preset)
        for label, kw in cases:
            tr = Training(global_batch_size=16, sequence_length=4096, framework="fsdp", **kw)
            ep = 8 if model.is_moe else 1
            mbs = 1 if preset == "llama3-405b" else 2  # the 405B's layer inputs alone take 34 GB at 2 x 4096
            est = estimate(model, tr, cluster, Strategy(dp=8, ep=ep, zero_stage=3, micro_batch_size=mbs, recompute=recompute))
            mem = est.stages[0].memory_GB
            trainable = (float(adapter_params_per_layer(model, tr, 1.0) + expert_adapter_params_per_layer(model, tr, 1.0, 1.0))
                         * model.num_layers if tr.frozen_base else float(model.total_params()))
            rows.append(_row(est, model=model.name, recompute=recompute, micro_batch_size=mbs, case=label, trainable_params=round(trainable),
                             state_GB=round(mem["gradients"] + mem["optimizer_state"], 2),
                             activations_GB=round(mem["activations"], 1),
                             **({"host_GB": round(est.stages[0].host_memory_GB or 0.0, 1)} if tr.cpu_offload else {})))
    return {"layout": "FSDP full sharding, dp 8 (ep 8 for the MoE) on 8 H100, 16 x 4096 tokens a step", "rows": rows}


def loss_kernels() -> dict[str, Any]:
    """The loss kernels (training.loss_kernel; layer_cost.embedding_head_costs): Llama-3-8B under
    FSDP on 8 H100, one 8,192-token sequence a micro-batch, full recompute — the unfused loss
    against torchtune's chunked loss, torch.compile's, Liger's fused linear cross-entropy and Cut Cross-Entropy;
    and under Megatron-Core (distributed optimizer, dp 8, the same micro-batch) its own loss
    against Transformer Engine's parallel cross-entropy."""
    model = get_preset("llama3-8b")
    rows = []
    for framework, zero, kernels in (("fsdp", 3, ("unfused", "chunked", "compiled", "liger", "cce")), ("megatron-core", 1, ("unfused", "te"))):
        for kernel in kernels:
            tr = Training(global_batch_size=16, sequence_length=8192, framework=framework, loss_kernel=kernel)
            est = estimate(model, tr, simple_cluster(H100, 1), Strategy(dp=8, zero_stage=zero, micro_batch_size=1, recompute="full"))
            rows.append(_row(est, framework=framework, loss_kernel=kernel, activations_GB=round(est.stages[0].memory_GB["activations"], 2)))
    return {"model": model.name, "layout": "dp 8 on 8 H100 (FSDP ZeRO-3; Megatron-Core's distributed optimizer), 1 x 8192 tokens a micro-batch, full recompute",
            "rows": rows}


def fp8_weights() -> dict[str, Any]:
    """FP8 weights (training.fp8_param_gather; stage_cost.fp8_weight_cache_bytes_per_param):
    Llama-3-70B under Megatron-Core on 4 × 8 H100 at 4,096 tokens a sequence, full recompute —
    tp 4 · pp 4 · dp 2 with the distributed optimizer in BF16, in FP8 with 16-bit weights and
    their cached FP8 casts, and with FP8 weights; dp 32 under Megatron-FSDP's full sharding, FP8
    with and without FP8 weights; the same under FSDP2 with torchao's float8, without and with its
    FP8 all-gather."""
    model = get_preset("llama3-70b")
    mesh = Strategy(tp=4, pp=4, dp=2, zero_stage=1, micro_batch_size=1, recompute="full", sequence_parallel=True)
    fsdp = Strategy(dp=32, zero_stage=3, micro_batch_size=1, recompute="full")
    rows = []
    for label, dtype, gather, s, framework in (
            ("bf16", "bf16", False, mesh, "megatron-core"), ("fp8, cached casts", "fp8", False, mesh, "megatron-core"),
            ("fp8 weights", "fp8", True, mesh, "megatron-core"), ("Megatron-FSDP fp8", "fp8", False, fsdp, "megatron-core"),
            ("Megatron-FSDP fp8 weights", "fp8", True, fsdp, "megatron-core"), ("FSDP2 torchao fp8", "fp8", False, fsdp, "fsdp"),
            ("FSDP2 torchao fp8, FP8 all-gather", "fp8", True, fsdp, "fsdp")):
        tr = Training(global_batch_size=64, sequence_length=4096, framework=framework, dtype=dtype, fp8_param_gather=gather)
        est = estimate(model, tr, simple_cluster(H100, 4), s)
        mem = est.stages[0].memory_GB
        rows.append(_row(est, case=label, weights_GB=round(mem["weights"], 2), activations_GB=round(mem["activations"], 2)))
    return {"model": model.name, "layout": "32 H100, 64 × 4096 tokens a step, full recompute: Megatron-Core tp 4 · pp 4 · dp 2 with the "
            "distributed optimizer, or dp 32 under Megatron-FSDP or FSDP2", "rows": rows}


def fp8_attention_output() -> dict[str, Any]:
    """A fused attention's output under FP8 (layer_cost.activation_bytes, checkpoints_attention_core):
    Llama-3-8B under Megatron-Core on 8 H100, tp 2 · dp 4 with sequence parallelism and the
    distributed optimizer, 8,192 tokens a sequence — BF16 and FP8, no recompute and selective
    (the attention core).  In BF16 the
    kernel's saved output is the output projection's saved input; in FP8 the projection keeps an
    FP8 copy and the 16-bit output stays beside it, which the attention core's checkpoint drops.
    Either way Megatron-Core runs FlashAttention's forward again."""
    model = get_preset("llama3-8b")
    rows = []
    for dtype in ("bf16", "fp8"):
        for rc in ("none", "selective"):
            tr = Training(global_batch_size=64, sequence_length=8192, framework="megatron-core", dtype=dtype)
            est = estimate(model, tr, simple_cluster(H100, 1), Strategy(tp=2, dp=4, sequence_parallel=True, zero_stage=1, micro_batch_size=1, recompute=rc))
            label = f"{dtype}, {'selective recompute' if rc == 'selective' else 'no recompute'}"
            rows.append(_row(est, case=label, activations_GB=round(est.stages[0].memory_GB["activations"], 2)))
    return {"model": model.name, "layout": "Megatron-Core tp 2 · dp 4 on 8 H100, sequence parallelism, distributed optimizer, 64 × 8192 tokens a step", "rows": rows}


def grouped_recompute() -> dict[str, Any]:
    """Megatron-Core's full recompute by method (Strategy.recompute_method; layer_cost.activation_bytes):
    Llama-3-70B on 4 × 8 H100, tp 8 · pp 4 with the distributed optimizer, 8,192 tokens a
    sequence — every layer its own checkpoint, uniform groups of 2, 4 and 10 layers (one
    checkpoint a group, the group recomputed whole), and block recompute of 10 of each chunk's
    20 layers."""
    model = get_preset("llama3-70b")
    tr = Training(global_batch_size=64, sequence_length=8192, framework="megatron-core")
    base = {"tp": 8, "pp": 4, "dp": 1, "zero_stage": 1, "micro_batch_size": 1, "recompute": "full", "sequence_parallel": True}
    rows = []
    for label, extra in (("every layer", {}), ("uniform, groups of 2", {"recompute_method": "uniform", "recompute_num_layers": 2}),
                         ("uniform, groups of 4", {"recompute_method": "uniform", "recompute_num_layers": 4}),
                         ("uniform, groups of 10", {"recompute_method": "uniform", "recompute_num_layers": 10}),
                         ("block, 10 of 20 layers", {"recompute_num_layers": 10})):
        est = estimate(model, tr, simple_cluster(H100, 4), strategy_from_dict({**base, **extra}))
        rows.append(_row(est, case=label, activations_GB=round(est.stages[0].memory_GB["activations"], 2)))
    return {"model": model.name, "layout": "Megatron-Core tp 8 · pp 4 on 32 H100, 64 × 8192 tokens a step, full recompute", "rows": rows}


def submodule_checkpointing() -> dict[str, Any]:
    """Full recompute by submodule (training.submodule_checkpointing; layer_cost.activation_bytes):
    Llama-3-8B under FSDP on 8 H100, two 8,192-token sequences a micro-batch — no recompute,
    whole layers checkpointed (torchtitan) and each layer's attention, MLP and norms checkpointed
    apart (NeMo-RL's DTensor policy): four saved inputs a layer instead of one, the same step."""
    model = get_preset("llama3-8b")
    rows = []
    for label, recompute, sub in (("none", "none", False), ("whole layers", "full", False), ("by submodule", "full", True)):
        tr = Training(global_batch_size=16, sequence_length=8192, framework="fsdp", submodule_checkpointing=sub)
        est = estimate(model, tr, simple_cluster(H100, 1), Strategy(dp=8, zero_stage=3, micro_batch_size=2, recompute=recompute))
        rows.append(_row(est, case=label, activations_GB=round(est.stages[0].memory_GB["activations"], 2)))
    return {"model": model.name, "layout": "FSDP full sharding, dp 8 on 8 H100, 2 × 8192 tokens a micro-batch", "rows": rows}


def pipeline_schedules() -> dict[str, Any]:
    """Several pipeline schedules a step (training.pipeline_schedules_per_step; stage_cost.combine_stages):
    Llama-3-8B under torchtitan-style FSDP with pp 4 · dp 2 on 8 H100, 64 sequences of 4,096 tokens
    in 32 micro-batches of 1 a data-parallel rank — one schedule, or gradient accumulation over
    2, 4 and 8 schedules: the bubble and the exposed gradient sync grow with each schedule, the
    memory does not."""
    model = get_preset("llama3-8b")
    rows = []
    for k in (1, 2, 4, 8):
        tr = Training(global_batch_size=64, sequence_length=4096, framework="fsdp", pipeline_schedules_per_step=k)
        est = estimate(model, tr, simple_cluster(H100, 1), Strategy(dp=2, pp=4, zero_stage=3, micro_batch_size=1, recompute="full"))
        rows.append(_row(est, case=f"{k} schedule{'s' if k > 1 else ''} of {32 // k}", activations_GB=round(est.stages[0].memory_GB["activations"], 2),
                         bubble_s=round(est.breakdown_s["bubble"], 3)))
    return {"model": model.name, "layout": "FSDP, pp 4 · dp 2 on 8 H100, 32 micro-batches of 1 × 4096 tokens a rank, full recompute", "rows": rows}


def paddle_full_attn() -> dict[str, Any]:
    """PaddleNLP's recompute_granularity (Strategy.recompute_modules under paddle;
    layer_cost.selective_module_costs): Llama-2 13B on 8 A800, tp 4 with sequence parallelism,
    dp 2, 4096 tokens — no recompute, core_attn, full_attn (the whole attention module) and full."""
    model = get_preset("llama2-13b")
    tr = Training(global_batch_size=64, sequence_length=4096, framework="paddle")
    base = {"tp": 4, "dp": 2, "zero_stage": 1, "micro_batch_size": 1, "sequence_parallel": True}
    rows = []
    for label, extra in (("none", {"recompute": "none"}), ("core_attn", {"recompute": "selective"}),
                         ("full_attn", {"recompute": "selective", "recompute_modules": ["full_attn"]}), ("full", {"recompute": "full"})):
        est = estimate(model, tr, simple_cluster("A800-SXM4-80GB", 1), strategy_from_dict({**base, **extra}))
        rows.append(_row(est, case=label, activations_GB=round(est.stages[0].memory_GB["activations"], 2)))
    return {"model": model.name, "layout": "Paddle tp 4 (SP) · dp 2 on 8 A800, sharding stage 1, 64 × 4096 tokens a step", "rows": rows}


def fsdp_selective_checkpointing() -> dict[str, Any]:
    """fms-fsdp's selective_checkpointing p (recompute_num_layers N = p·L under fsdp;
    layer_cost.recompute_fraction): Llama-2 13B under FSDP full sharding on 16 × 8 A100, two
    4096-token sequences per GPU — no checkpointing, a quarter, half and three quarters of the 40
    blocks, and every block."""
    model = get_preset("llama2-13b")
    tr = Training(global_batch_size=256, sequence_length=4096, framework="fsdp")
    base = {"dp": 128, "zero_stage": 3, "micro_batch_size": 2}
    rows = []
    for label, extra in (("none", {"recompute": "none"}), ("p = 1/4", {"recompute": "full", "recompute_num_layers": 10}),
                         ("p = 1/2", {"recompute": "full", "recompute_num_layers": 20}),
                         ("p = 3/4", {"recompute": "full", "recompute_num_layers": 30}), ("p = 1", {"recompute": "full"})):
        est = estimate(model, tr, simple_cluster("A100-SXM4-80GB", 16), strategy_from_dict({**base, **extra}))
        rows.append(_row(est, case=label, activations_GB=round(est.stages[0].memory_GB["activations"], 2)))
    return {"model": model.name, "layout": "FSDP FULL_SHARD on 128 A100, 2 × 4096 tokens a GPU", "rows": rows}


def interleaved_microbatch_groups() -> dict[str, Any]:
    """Megatron-Core's interleaved micro-batch group (training.microbatch_group_size_per_vp_stage;
    schedule.inflight_microbatches): Llama-3-70B on 4 × 8 H100, tp 8 · pp 4 · vpp 5 with
    sequence parallelism and selective recompute, 4096 tokens a sequence — 32 sequences in groups
    of 4 (Megatron-Core's default, pp), 8, 16 and 32, and 30 and 34 sequences, which pp does not
    divide, in the smallest group that runs."""
    model = get_preset("llama3-70b")
    base = {"tp": 8, "pp": 4, "vpp": 5, "dp": 1, "micro_batch_size": 1, "sequence_parallel": True, "recompute": "selective"}
    rows = []
    for batch, group in ((32, 0), (32, 8), (32, 16), (32, 32), (30, 0), (34, 0)):
        tr = Training(global_batch_size=batch, sequence_length=4096, framework="megatron-core", microbatch_group_size_per_vp_stage=group)
        est = estimate(model, tr, simple_cluster(H100, 4), strategy_from_dict(base))
        used = interleaved_microbatch_group("megatron-core", num_microbatches=batch, pp=4, group=group)
        rows.append(_row(est, case=f"{batch} micro-batches, groups of {used}" + ("" if group else " (chosen)"),
                         activations_GB=round(est.stages[0].memory_GB["activations"], 2),
                         step_per_microbatch_s=round(est.step_time_s / batch, 4)))
    return {"model": model.name, "layout": "Megatron-Core tp 8 · pp 4 · vpp 5 (SP, selective recompute) on 32 H100, 4096-token sequences",
            "rows": rows}


CASES = {f.__name__: f for f in (moe_ep_sweep, moe_vs_dense, moe_folding, grouped_gemm_efficiency, dropless_imbalance,
                                  cp_vs_sequence, cp_comm_types, sliding_window, mla_flops, planner_searches_ep,
                                  selective_recompute_by_framework, selective_recompute_moe_mla, recompute_modules, hsdp_vs_full_shard, fsdp_schedules, fsdp_replicate_sync,
                                  optimizer_precision, eager_vs_fused, optimizer_offload, fsdp_cpu_offload, activation_offloading, megatron_module_offload, eight_bit_adam, muon, optimizer_in_backward, dpo_reference, lora, loss_kernels, fp8_weights, fp8_attention_output, grouped_recompute,
                                  paddle_full_attn, submodule_checkpointing, pipeline_schedules, fsdp_selective_checkpointing, interleaved_microbatch_groups, deepspeed_stage3_single_source,
                                  memory_interval_state_dominated)}


def main() -> None:
    results = {name: fn() for name, fn in CASES.items()}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(results, indent=1, default=float) + "\n")
    print(json.dumps({k: v for k, v in results.items() if k in ("moe_vs_dense", "mla_flops")}, indent=1, default=float))
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
