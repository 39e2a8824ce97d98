"""Training-framework configurations: Megatron-LM arguments, DeepSpeed config JSON, Paddle Fleet
hybrid/pipeline configs, torchtitan TOML.  Each comes with the launcher that starts it on the
plan's hosts (torchrun, DeepSpeed, Paddle's launcher), so one artifact launches the plan.

Uneven stages are emitted natively (docs/integration.md §4, §7.2): Megatron's
``--pipeline-model-parallel-layout``, Paddle's ``seg_method`` boundary list, torchtitan's
``module_fqns_per_model_part``; DeepSpeed has no upstream per-stage list, so its layer
boundaries go to ``pipeline_partition.json`` for a ``PipelineModule`` partition override.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from functools import lru_cache
from importlib import resources
from typing import Any

from cost_model.frameworks import (
    ADAM_OPTIMIZERS,
    EIGHT_BIT_ADAM,
    MUON,
    OPTIMIZER_PRECISION_FLAGS,
    cp_exchange,
    expert_layout_ok,
    pipeline_gradient_sharding_note,
    rules_for,
    runs_deepspeed_engine,
)
from cost_model.training import OPTIMIZER_DTYPES, OPTIMIZERS
from cost_model.transformer.layer_cost import dp_reduction_overlaps
from cost_model.transformer.moe import expert_tensor_parallel
from cost_model.transformer.spec import TransformerSpec
from planner_service.exporters.common import Artifact, LaunchParams, framework_env, q
from planner_service.exporters.launchers import (
    render_deepspeed,
    render_paddle_launch,
    render_torchrun,
)
from planner_service.exporters.plan_view import InvalidPlan, PlanView

DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp8": "bfloat16", "fp4": "bfloat16"}


@lru_cache(maxsize=1)
def megatron_reference() -> Mapping[str, Mapping[str, Any]]:
    """Megatron-LM's option names, types and choices (planner_service/reference)."""
    text = resources.files("planner_service").joinpath("reference/megatron_arguments.json").read_text()
    return json.loads(text)["arguments"]


def megatron_layout(chunks: tuple[int, ...], mtp_layers: int = 0) -> str:
    """``--pipeline-model-parallel-layout``: one entry per model chunk, ``|``-separated, with
    ``E`` (embedding) in the first chunk, ``t`` per decoder layer and, in the last, ``m`` per
    multi-token-prediction layer (``--mtp-num-layers``; where the cost model runs them) and
    ``L`` (loss)."""
    parts = []
    for k, n in enumerate(chunks):
        last = k == len(chunks) - 1
        part = ("E" if k == 0 else "") + "t" * n + ("m" * mtp_layers + "L" if last else "")
        parts.append(part)
    return "|".join(parts)


def mtp_notes(view: PlanView) -> list[str]:
    """For a launch that has no multi-token-prediction setting (DeepSpeed, Paddle Fleet,
    torchtitan; Megatron's is ``--mtp-num-layers``): the plan costs the model's MTP modules, so
    say that the launch leaves them to the model code."""
    m = view.transformer
    if m is None or not m.mtp_layers:
        return []
    return [f"the plan costs {m.mtp_layers} multi-token-prediction module(s) on the last stage (model.mtp_params); this launch "
            "has no setting for them: the model code must build and train them, or plan without num_nextn_predict_layers"]


#: The request's ``cp_comm_type`` as Megatron-Core passes it to Transformer Engine, which names
#: the K/V all-gather exchange ``all_gather`` (``TransformerConfig.cp_comm_type``; anything else
#: is "Unsupported communication type" at the first forward).
MEGATRON_CP_COMM_TYPES = {"allgather": "all_gather"}


def moe_cp_args(view: PlanView) -> list[tuple[str, str | None]]:
    """The MoE and context-parallel flags the plan was costed with (``training``'s
    ``moe_token_dispatcher``, ``moe_comm_overlap``, ``moe_capacity_factor``, ``cp_comm_type`` with
    hierarchical CP's ``--hierarchical-context-parallel-sizes`` from ``cp_a2a_size``),
    and ``--expert-tensor-parallel-size`` when the experts' tensor parallelism differs from TP:
    pinned (``strategy.etp``), or EP folded across the TP ranks (ep ∤ dp·cp: ETP = gcd(tp,
    tp·cp·dp/ep), cost_model.transformer.moe.expert_tensor_parallel).  The dispatcher is always written:
    Megatron-LM's default is ``allgather``, the cost model's ``alltoall``."""
    out: list[tuple[str, str | None]] = []
    tr = view.training
    if view.ep > 1:
        dispatcher = tr.get("moe_token_dispatcher", "alltoall")
        out.append(("--moe-token-dispatcher-type", "flex" if dispatcher == "deepep" else str(dispatcher)))
        if dispatcher == "deepep":
            out.append(("--moe-enable-deepep", None))
        if tr.get("moe_comm_overlap"):
            out.append(("--overlap-moe-expert-parallel-comm", None))
        if tr.get("moe_capacity_factor") is not None:
            out += [("--moe-expert-capacity-factor", str(tr["moe_capacity_factor"])), ("--moe-pad-expert-input-to-capacity", None)]
    pinned = int(view.s("etp", 0))
    if view.ep > 1 or pinned:
        etp = int(expert_tensor_parallel(view.tp, view.cp, view.dp, view.ep, pinned))
        if etp != view.tp:
            out.append(("--expert-tensor-parallel-size", str(etp)))
    if view.cp > 1 and tr.get("framework", "megatron-core") == "megatron-core":  # Megatron-DeepSpeed's CP is Ulysses
        exchange = cp_exchange("megatron-core", tr.get("cp_comm_type"))
        if exchange != "p2p":  # Megatron's default
            out.append(("--cp-comm-type", MEGATRON_CP_COMM_TYPES.get(exchange, exchange)))
        if exchange == "a2a+p2p":  # the all-to-all level, then the ring's
            a2a = int(tr["cp_a2a_size"])
            out.append(("--hierarchical-context-parallel-sizes", f"{a2a} {view.cp // a2a}"))
    return out


def ulysses_notes(view: PlanView) -> list[str]:
    """How a DeepSpeed-engine launch runs the plan's context parallelism: DeepSpeed-Ulysses, or
    under ``deepspeed`` with ``cp_comm_type: allgather`` ring-flash-attn's K/V all-gather, with
    ``p2p`` its zigzag ring (:mod:`cost_model.frameworks`) — any degree a trainer or model-code
    setting, not a ds_config or Megatron-LM flag."""
    if view.cp <= 1:
        return []
    exchange = cp_exchange(str(view.training.get("framework", "deepspeed")), view.training.get("cp_comm_type"))
    if exchange == "allgather":
        return [f"cp={view.cp} all-gathers K/V over groups of {view.cp} consecutive ranks (the ring-flash-attn package's llama3 "
                f"variant: OpenRLHF --ring_attn_size {view.cp}, axolotl sequence_parallel_degree: {view.cp}), as costed; "
                f"batch sizes count the {view.dp} data-parallel ranks"]
    if exchange == "p2p":
        return [f"cp={view.cp} passes K/V round a ring of {view.cp} consecutive ranks, each block's send overlapped with the "
                "attention on the one before (the ring-flash-attn package's zigzag_ring_flash_attn: EasyContext's "
                f"--parallel_mode zigzag_ring_attn, 360-LLaMA-Factory's sequence_parallel_size {view.cp} in zigzag-ring mode), as "
                f"costed; batch sizes count the {view.dp} data-parallel ranks"]
    return [f"cp={view.cp} is DeepSpeed-Ulysses sequence parallelism over groups of {view.cp} consecutive ranks "
            f"(Megatron-DeepSpeed: --ds-sequence-parallel-size {view.cp}; otherwise deepspeed.sequence.layer.DistributedAttention "
            f"over such a group); batch sizes count the {view.dp} data-parallel ranks"]


def optimizer_precision_args(training: Mapping[str, Any]) -> list[tuple[str, str | None]]:
    """Megatron-Core's flags for the plan's optimizer precision (``training.OPTIMIZER_DTYPES``,
    priced by ``layer_cost.megatron_optimizer_state_bytes``): the precision-aware optimizer with
    each lowered dtype; a bf16 gradient buffer without it is ``--grad-reduce-in-bf16`` (Megatron
    refuses ``--main-grads-dtype`` outside the precision-aware optimizer)."""
    aware = bool(training.get("precision_aware_optimizer", False))
    out: list[tuple[str, str | None]] = [(OPTIMIZER_PRECISION_FLAGS["precision_aware_optimizer"], None)] if aware else []
    for key, choices in OPTIMIZER_DTYPES.items():
        value = training.get(key, choices[0])
        if value == choices[0]:
            continue
        if aware:
            out.append((OPTIMIZER_PRECISION_FLAGS[key], str(value)))
        elif key == "main_grads_dtype":
            out.append(("--grad-reduce-in-bf16", None))
    return out


def optimizer_offload_args(training: Mapping[str, Any]) -> list[tuple[str, str | None]]:
    """Megatron-Core's hybrid optimizer for the plan's ``training.optimizer_offload_fraction``
    (priced by ``layer_cost.offloaded_optimizer_s`` with the copies overlapping the host's
    update, ``--overlap-cpu-optimizer-d2h-h2d``); the precision-aware optimizer it needs comes
    from :func:`optimizer_precision_args`."""
    fraction = float(training.get("optimizer_offload_fraction", 0.0) or 0.0)
    if fraction <= 0.0:
        return []
    return [("--optimizer-cpu-offload", None), ("--optimizer-offload-fraction", f"{fraction:g}"),
            ("--overlap-cpu-optimizer-d2h-h2d", None)]


#: Hugging Face PEFT's ``target_modules`` for each of :data:`cost_model.frameworks.LORA_MODULES`
#: (the Llama / Qwen / Mistral projection names; PaddleNLP's are the same).
PEFT_TARGET_MODULES = {"linear_qkv": ("q_proj", "k_proj", "v_proj"), "linear_proj": ("o_proj",),
                       "linear_fc1": ("gate_proj", "up_proj"), "linear_fc2": ("down_proj",)}


def lora_note(view: PlanView, where: str) -> list[str]:
    """The note that a LoRA plan's adapters are the trainer's to build (``where``: the trainer's
    own LoRA setting), with the rank, layers and dropout the plan priced; none without LoRA."""
    rank = int(view.training.get("lora_rank", 0) or 0)
    if not rank:
        return []
    modules = view.training.get("lora_target_modules") or list(PEFT_TARGET_MODULES)
    names = [n for m in modules for n in PEFT_TARGET_MODULES.get(m, (m,))]
    dropout = float(view.training.get("lora_dropout", 0.0) or 0.0)
    base = ("; the frozen base in 4-bit NF4 (QLoRA): load it with BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type='nf4', "
            "bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype and bnb_4bit_quant_storage the training dtype)"
            if view.training.get("lora_base_dtype") == "nf4" else "")
    return [f"the plan trains LoRA adapters of rank {rank} on {', '.join(modules)} (PEFT target_modules {names}), lora_dropout "
            f"{dropout:g}, every other weight frozen: {where}{base}"]


def refuse_lora(view: PlanView, target: str, how: str) -> None:
    """A launch that would train every weight of a plan priced for LoRA is refused (it needs the
    optimizer state and gradients the plan left out)."""
    if int(view.training.get("lora_rank", 0) or 0):
        raise InvalidPlan(f"{target} has no LoRA setting these arguments can carry: the plan priced frozen weights with LoRA adapters "
                          f"(training.lora_rank), which this launch would train whole; {how}", field="target")


def megatron_args(view: PlanView) -> tuple[list[tuple[str, str | None]], list[str]]:
    """(flag, value) pairs in Megatron-LM's own option names, and notes."""
    refuse_lora(view, "Megatron-LM's pretrain_gpt.py", "run it with Megatron-Bridge's finetuning recipe, peft=LoRA(target_modules, "
                "dim, dropout) with the plan's parallel sizes")
    chunks = view.require_layers("megatron")
    notes: list[str] = []
    args: list[tuple[str, str | None]] = [
        ("--tensor-model-parallel-size", str(view.tp)),
        ("--pipeline-model-parallel-size", str(view.pp)),
    ]
    if view.training.get("framework") == "megatron-deepspeed":  # Megatron-LM's CP is not Megatron-DeepSpeed's
        notes += ulysses_notes(view)
    else:
        args.append(("--context-parallel-size", str(view.cp)))
    if view.ep > 1:
        args.append(("--expert-model-parallel-size", str(view.ep)))
        if view.tp > 1 and not view.s("sequence_parallel", False):
            notes.append("Megatron requires --sequence-parallel when TP is combined with EP; added")
    if view.tp > 1 and (view.s("sequence_parallel", False) or view.ep > 1):
        args.append(("--sequence-parallel", None))
    args += moe_cp_args(view)
    args += [
        ("--micro-batch-size", str(view.micro_batch_size)),
        ("--global-batch-size", str(view.global_batch_size)),
    ]
    seq = view.training.get("sequence_length")
    if isinstance(seq, int):
        args.append(("--seq-length", str(seq)))
        max_pos = view.transformer.max_position_embeddings if view.transformer is not None else 0
        args.append(("--max-position-embeddings", str(max(seq, max_pos))))
    args.append(("--num-layers", str(sum(chunks))))
    if view.transformer is not None:
        model_args, model_notes = megatron_model_args(view.transformer)
        args += model_args
        notes += model_notes
    else:
        notes.append("the plan's model has no transformer shape: add its Megatron model arguments by hand")
    dtype = view.training.get("dtype", "bf16")
    if view.transformer is not None and view.transformer.is_moe:
        if dtype in ("fp16", "fp32"):
            notes.append(f"Megatron's grouped GEMM for the experts is bf16-only: under {dtype} the experts run one GEMM "
                         "each (--moe-grouped-gemm left out), which the plan's step time does not price")
        else:
            args.append(("--moe-grouped-gemm", None))
    if dtype == "bf16":
        args.append(("--bf16", None))
    elif dtype == "fp16":
        args.append(("--fp16", None))
    elif dtype == "fp8":
        args += [("--bf16", None), ("--fp8-format", "hybrid")]
        if view.training.get("fp8_param_gather") is True:  # the weights held and all-gathered in FP8, as priced
            args.append(("--fp8-param-gather", None))
    elif dtype == "fp4":  # Transformer Engine NVFP4BlockScaling (Megatron-Bridge bf16_with_nvfp4_mixed)
        args += [("--bf16", None), ("--fp4-format", "e2m1"), ("--fp4-recipe", "nvfp4")]
    optimizer = view.training.get("optimizer")
    if optimizer == EIGHT_BIT_ADAM:
        notes.append("Megatron-LM has no 8-bit AdamW (its narrow moments are the precision-aware optimizer's --exp-avg-dtype and "
                     "--exp-avg-sq-dtype): --optimizer adam is written and the 8-bit state the plan priced is not")
        args.append(("--optimizer", "adam"))
    elif optimizer == MUON:  # zero_stage 1: its layer-wise distributed optimizer, not --use-distributed-optimizer
        args.append(("--optimizer", "dist_muon" if int(view.s("zero_stage", 0)) == 1 else "muon"))
    elif optimizer in OPTIMIZERS:  # Megatron's adam is AdamW (decoupled weight decay by default)
        args.append(("--optimizer", "adam" if optimizer in ADAM_OPTIMIZERS else optimizer))
    args += optimizer_precision_args(view.training)
    zero = int(view.s("zero_stage", 0))
    deepspeed_engine = runs_deepspeed_engine(view.training.get("framework", "megatron-core"))
    if not deepspeed_engine:
        args += optimizer_offload_args(view.training)
        modules = view.training.get("offload_modules") or []
        if view.training.get("activation_offloading") is True and modules:
            # Megatron-Core's fine-grained activation offloading as priced (layer_cost.offload_module_bytes)
            args += [("--fine-grained-activation-offloading", None), ("--offload-modules", " ".join(modules))]
    elif float(view.training.get("optimizer_offload_fraction", 0.0) or 0.0) > 0.0 or view.training.get("cpu_offload") is True:
        notes.append("the optimizer offload is DeepSpeed's (ds_config.json's zero_optimization.offload_optimizer): add "
                     "Megatron-DeepSpeed's --cpu-optimizer so that it builds DeepSpeed's CPU Adam")
    if deepspeed_engine:
        # Megatron-DeepSpeed: sharding and its overlap are DeepSpeed's engine's (ds_config.json), not
        # Megatron-LM's distributed optimizer, Megatron-FSDP or DDP overlap flags
        notes.append(f"ZeRO stage {zero} and the gradient-reduction overlap are DeepSpeed's: add --deepspeed "
                     f"--deepspeed_config ds_config.json (the deepspeed-config target) and Megatron-DeepSpeed's --zero-stage {zero}")
        if view.training.get("attention", "flash") == "flash":
            notes.append("the plan priced FlashAttention, which Megatron-DeepSpeed runs only when asked (--use-flash-attn-v2; "
                         "its default attention materialises the scores)")
    elif zero == 1 and optimizer != MUON:  # Muon's is --optimizer dist_muon ('muon with dist optimizer is not supported')
        args.append(("--use-distributed-optimizer", None))
        if view.dp_replicas > 1:  # partial distributed optimizer: sharded inside each instance
            args.append(("--num-distributed-optimizer-instances", str(view.dp_replicas)))
    elif zero in (2, 3):
        args += [
            ("--use-megatron-fsdp", None),
            ("--data-parallel-sharding-strategy", "optim_grads" if zero == 2 else "optim_grads_params"),
            # validate_args: "Megatron FSDP only supports fsdp_dtensor checkpoint format"
            ("--ckpt-format", "fsdp_dtensor"),
        ]
        notes.append(f"ZeRO stage {zero} maps to Megatron-FSDP; check your Megatron-LM version supports it with pp={view.pp}")
    if view.dp * view.cp > 1 and view.training.get("grad_reduce_overlap", True) and not deepspeed_engine:
        # the once-a-step sync hidden as priced (layer_cost.dp_overlap_fraction): the gradient
        # reduction behind the backward and, with the distributed optimizer, the updated
        # weights' all-gather behind the next forward
        args.append(("--overlap-grad-reduce", None))
        if zero == 1:
            args.append(("--overlap-param-gather", None))
    if view.training.get("tp_comm_overlap") and view.tp > 1:  # the TP collectives priced hidden behind their GEMMs
        args.append(("--tp-comm-overlap", None))
    if view.training.get("attention") == "unfused" and view.training.get("framework", "megatron-core") == "megatron-core":
        # the score matrix materialised, as priced: Megatron-Core's own attention, not Transformer Engine's fused kernels
        args.append(("--attention-backend", "local"))
    if view.training.get("loss_kernel") == "te":  # the loss as priced: Transformer Engine's, over the 16-bit logits it keeps
        args += [("--cross-entropy-loss-fusion", None), ("--cross-entropy-fusion-impl", "te")]
    recompute = view.s("recompute", "none")
    depth = int(view.s("recompute_num_layers", 0))
    if recompute == "full" and depth and view.s("recompute_method", "") == "uniform":
        # uniform: one checkpoint per group of `depth` layers, each group recomputed whole
        args += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"), ("--recompute-num-layers", str(depth))]
    elif recompute == "full" and depth:
        # block: the first `depth` layers of every model chunk recomputed, the rest keep theirs
        args += [("--recompute-granularity", "full"), ("--recompute-method", "block"), ("--recompute-num-layers", str(depth))]
    elif recompute == "full":
        args += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"), ("--recompute-num-layers", "1")]
    elif recompute == "selective":
        args.append(("--recompute-granularity", "selective"))
        modules = view.s("recompute_modules", None)
        if modules:  # the modules the plan was costed with (Megatron's default: core_attn)
            args.append(("--recompute-modules", " ".join(modules)))
    uniform = len(set(chunks)) == 1
    ref = megatron_reference()
    if view.pp > 1 or view.vpp > 1:
        if uniform and view.vpp > 1:
            args.append(("--num-virtual-stages-per-pipeline-rank", str(view.vpp)))
        elif not uniform:
            if "--pipeline-model-parallel-layout" in ref:
                mtp = view.transformer.mtp_layers if view.transformer is not None else 0
                args.append(("--pipeline-model-parallel-layout", megatron_layout(chunks, mtp)))
                notes.append("uneven stages: --pipeline-model-parallel-layout " + megatron_layout(chunks, mtp))
            else:  # pragma: no cover - older reference without the layout flag
                middle = chunks[1:-1]
                if view.vpp > 1 or len(set(middle)) > 1:
                    raise InvalidPlan("this Megatron-LM version cannot express the stage split", field="target")
                args += [
                    ("--decoder-first-pipeline-num-layers", str(chunks[0])),
                    ("--decoder-last-pipeline-num-layers", str(chunks[-1])),
                ]
        if view.vpp > 1 and view.microbatch_group != view.pp:  # the group the plan's warm-up was costed with
            args.append(("--microbatch-group-size-per-virtual-pipeline-stage", str(view.microbatch_group)))
    validate_megatron_args(args)
    return args, notes


def _moe_layer_freq(m: TransformerSpec) -> str:
    """``--moe-layer-freq`` as Megatron's pattern expression: 1 per MoE layer, 0 per dense one
    (``([0]*3+[1]*58)`` for DeepSeek-V3's three dense-first layers)."""
    dense = set(m.dense_layer_indices)
    pattern = [0 if i in dense else 1 for i in range(m.num_layers)]
    k = len(dense)
    if pattern == [0] * k + [1] * (m.num_layers - k):
        return f"([0]*{k}+[1]*{m.num_layers - k})"
    return "[" + ",".join(map(str, pattern)) + "]"


def _megatron_attention_args(m: TransformerSpec) -> tuple[list[tuple[str, str | None]], list[str]]:
    args: list[tuple[str, str | None]] = []
    notes: list[str] = []
    if m.is_mla:
        args += [("--multi-latent-attention", None), ("--kv-lora-rank", str(m.kv_lora_rank)),
                 ("--qk-head-dim", str(m.head_dim)), ("--qk-pos-emb-head-dim", str(m.qk_rope_head_dim)),
                 ("--v-head-dim", str(m.v_head_dim))]
        if m.q_lora_rank:
            args.append(("--q-lora-rank", str(m.q_lora_rank)))
    else:
        args.append(("--kv-channels", str(m.head_dim)))
        if m.num_kv_heads < m.num_heads:
            args += [("--group-query-attention", None), ("--num-query-groups", str(m.num_kv_heads))]
    if m.qk_norm:
        args.append(("--qk-layernorm", None))
    if m.sliding_window:
        args.append(("--window-size", f"({m.sliding_window},0)"))
        global_layers = m.num_layers - m.local_attention_layers
        if global_layers > 0:
            args.append(("--window-attn-skip-freq", str(max(1, m.num_layers // global_layers))))
    if m.attention_chunk_size:
        notes.append(f"chunked attention ({m.attention_chunk_size}-token chunks on {m.local_attention_layers} of "
                     f"{m.num_layers} layers, Llama 4) has no Megatron-LM flag: this launch attends over the whole "
                     "sequence on those layers, which the plan costs chunked")
    return args, notes


def _megatron_position_args(m: TransformerSpec) -> tuple[list[tuple[str, str | None]], list[str]]:
    if m.position_embedding == "learned":
        return [("--position-embedding-type", "learned_absolute")], []
    if m.position_embedding == "alibi":
        return [("--position-embedding-type", "none")], ["ALiBi has no Megatron-LM flag: the model uses ALiBi biases in attention"]
    args: list[tuple[str, str | None]] = []
    notes: list[str] = []
    scaling = dict(m.rope_scaling)
    kind = scaling.get("rope_type") or scaling.get("type")
    args.append(("--position-embedding-type", "yarn" if kind == "yarn" and not m.is_mla else "rope"))
    if m.rope_theta:
        args.append(("--rotary-base", str(int(m.rope_theta))))
    if kind == "llama3":
        args += [("--use-rope-scaling", None), ("--rope-scaling-factor", str(float(scaling.get("factor", 8.0))))]
    elif kind == "yarn":
        if m.is_mla:
            args.append(("--rope-type", "yarn"))
        args.append(("--rotary-scaling-factor", str(float(scaling.get("factor", 1.0)))))
        for key, flag in (("original_max_position_embeddings", "--yarn-original-max-position-embeddings"),
                          ("mscale", "--mscale"), ("mscale_all_dim", "--mscale-all-dim"),
                          ("beta_fast", "--yarn-beta-fast"), ("beta_slow", "--yarn-beta-slow")):
            if key in scaling:
                value = scaling[key]
                args.append((flag, str(int(value)) if flag.endswith("embeddings") else str(float(value))))
    elif kind:
        notes.append(f"RoPE scaling {kind!r} ({scaling}) has no Megatron-LM flag: apply it in the model provider")
    if m.is_mla and kind != "yarn":
        # MLATransformerConfig defaults to rope_type "yarn" (scaling factor 40): plain RoPE must be
        # asked for, and its fused kernel is YaRN-only for MLA ("apply_rope_fusion for MLA only
        # works with YARN RoPE")
        args += [("--rope-type", "rope"), ("--no-rope-fusion", None)]
    return args, notes


def megatron_model_args(m: TransformerSpec) -> tuple[list[tuple[str, str | None]], list[str]]:
    """The model shape in Megatron-LM's flags: sizes, attention (GQA groups, head dim as
    ``--kv-channels``, MLA, QK norm, windows), positions (RoPE base and scaling), biases,
    normalisation, activation, tying and MoE (routed/shared experts, layer pattern), MTP.
    What Megatron cannot express is returned as notes."""
    dense_ffn = m.dense_ffn_hidden_size or m.ffn_hidden_size
    args: list[tuple[str, str | None]] = [
        ("--hidden-size", str(m.hidden_size)),
        ("--ffn-hidden-size", str(dense_ffn)),
        ("--num-attention-heads", str(m.num_heads)),
    ]
    attn_args, notes = _megatron_attention_args(m)
    args += attn_args
    pos_args, pos_notes = _megatron_position_args(m)
    args += pos_args
    notes += pos_notes
    args.append(("--normalization", "RMSNorm" if m.norm == "rmsnorm" else "LayerNorm"))
    if m.gated_ffn:
        if m.activation == "silu":
            args.append(("--swiglu", None))
        else:
            args.append(("--quick-geglu", None))
            notes.append(f"gated {m.activation} FFN: Megatron's CLI has only --swiglu and --quick-geglu; "
                         f"--quick-geglu keeps the shape, set activation_func to {m.activation} in the model provider")
    if not (m.has_qkv_bias or m.has_out_bias or m.has_mlp_bias):
        args.append(("--disable-bias-linear", None))
    elif not (m.has_out_bias and m.has_mlp_bias):
        args.append(("--disable-bias-linear", None))
        if m.has_qkv_bias:
            args.append(("--add-qkv-bias", None))
        if m.has_out_bias or m.has_mlp_bias:
            notes.append("the output-projection/MLP biases without the others have no Megatron-LM flag")
    if not m.tie_embeddings:
        args.append(("--untie-embeddings-and-output-weights", None))
    if m.head_bias:
        notes.append("the LM head's bias has no Megatron-LM flag")
    if m.norms_per_layer != 2:
        notes.append(f"{m.norms_per_layer} norms per layer ({'parallel attention/MLP' if m.norms_per_layer == 1 else 'sandwich norms'}) "
                     "have no Megatron-LM flag: Megatron builds 2")
    if m.is_moe:
        args += [("--num-experts", str(m.num_experts)), ("--moe-router-topk", str(m.experts_per_token)),
                 ("--moe-ffn-hidden-size", str(m.ffn_hidden_size))]
        if m.shared_expert_ffn_hidden_size:
            args.append(("--moe-shared-expert-intermediate-size", str(m.shared_expert_ffn_hidden_size)))
        if m.dense_layer_indices:
            args.append(("--moe-layer-freq", _moe_layer_freq(m)))
        if m.experts_per_token == 1:  # TransformerConfig: "Please use --moe-router-pre-softmax when topk is 1."
            args.append(("--moe-router-pre-softmax", None))
    if m.mtp_layers:
        if ("--position-embedding-type", "yarn") in args:
            # TransformerConfig: "Multi-Token Prediction (MTP) is not supported with yarn position embedding type."
            raise InvalidPlan("Megatron-LM runs multi-token prediction only without YaRN position embeddings (MLA's YaRN "
                              "aside): this model has both; launch it with another target or plan it without "
                              "num_nextn_predict_layers", field="target")
        args.append(("--mtp-num-layers", str(m.mtp_layers)))
    return args, notes


def megatron_words(flag: str, value: str | None) -> list[str]:
    """The command-line words of one flag's value: none for a flag-only option, one per value
    for a flag of several (``nargs`` "+", e.g. ``--recompute-modules``, given space-separated)."""
    if value is None:
        return []
    return value.split() if megatron_reference().get(flag, {}).get("nargs") == "+" else [value]


def megatron_choices(info: Mapping[str, Any]) -> list[str]:
    """The words a Megatron-LM flag accepts: its choices, an enum's by member name (its table
    lists ``AttnBackend.flash``; the parser takes ``flash``, ``type=lambda x: AttnBackend[x]``)."""
    choices = [str(c) for c in info.get("choices") or ()]
    if info.get("type") == "enum_type_handler":
        return [c.split(".", 1)[-1] for c in choices]
    return choices


def validate_megatron_args(args: list[tuple[str, str | None]]) -> None:
    """Every flag must be one of Megatron-LM's; flag-only options take no value; choices hold."""
    ref = megatron_reference()
    for flag, value in args:
        info = ref.get(flag)
        if info is None:
            raise InvalidPlan(f"{flag} is not a Megatron-LM argument", field="target")
        if info.get("flag_only") and value is not None:
            raise InvalidPlan(f"{flag} takes no value", field="target")
        if not info.get("flag_only") and value is None:
            raise InvalidPlan(f"{flag} needs a value", field="target")
        choices = megatron_choices(info)
        if value is not None and choices and any(v not in choices for v in megatron_words(flag, value)):
            raise InvalidPlan(f"{flag} {value} is not one of {choices}", field="target")
        if info.get("type") == "int":
            for word in megatron_words(flag, value):
                int(word)


def render_megatron(view: PlanView, params: LaunchParams) -> Artifact:
    args, notes = megatron_args(view)
    notes = notes + [f"{k}={v} exported on every node (unless set in env): Megatron-LM requires it with tensor/context "
                     "parallelism before Blackwell" for k, v in framework_env(view).items()]
    lines = [
        "# Megatron-LM arguments for plan " + view.plan_id + " (generated by the auto-parallel planner).",
        "# Source this file and pass \"${MEGATRON_ARGS[@]}\" to pretrain_gpt.py, plus data/tokenizer arguments.",
        "# shellcheck disable=SC2034",
        "MEGATRON_ARGS=(",
    ]
    for flag, value in args:
        lines.append(f"  {flag}" + "".join(f" {q(w)}" for w in megatron_words(flag, value)))
    lines.append(")")
    args_text = "\n".join(lines) + "\n"
    params = params.with_default_command("pretrain_gpt.py")
    launch = render_torchrun(
        view,
        params,
        preamble=["# shellcheck source=/dev/null", 'source "$PLAN_DIR/megatron_args.sh"'],
        entry=params.command_words + ['"${MEGATRON_ARGS[@]}"'],
    )
    launch_files, launch_notes = _torchrun_as(launch, "launch_megatron.sh")
    files = {"megatron_args.sh": args_text, **launch_files}
    notes = notes + ["Megatron builds groups in tp-cp-ep-dp-pp order, the plan's rank order", *launch_notes]
    return Artifact("megatron", files, "megatron_args.sh", tuple(notes))


def _layer_boundaries(chunks: tuple[int, ...]) -> list[int]:
    """Boundaries over the layer list [embedding, decoder 0..L-1, head]: chunk k holds items
    ``[b_k, b_{k+1})``; the embedding goes with the first chunk, the head with the last."""
    bounds = [0]
    acc = 1
    for n in chunks[:-1]:
        acc += n
        bounds.append(acc)
    bounds.append(sum(chunks) + 2)
    return bounds


def deepspeed_config(view: PlanView) -> tuple[dict[str, Any], list[str]]:
    """``ds_config.json``: batch sizes over the data-parallel ranks (world ÷ tp·pp, DeepSpeed's
    mpu view), ZeRO, precision, activation checkpointing and the pipeline stages.  Context
    parallelism is DeepSpeed-Ulysses, set up by the model code (:func:`ulysses_notes`)."""
    notes: list[str] = ulysses_notes(view)
    dp = view.dp
    mbs = view.micro_batch_size
    gas = view.num_microbatches
    if mbs * gas * dp != view.global_batch_size:
        notes.append(
            f"global batch {view.global_batch_size} is not micro-batch {mbs} x accumulation x dp {dp}; using {mbs * gas * dp}"
        )
    cfg: dict[str, Any] = {
        "train_batch_size": mbs * gas * dp,
        "train_micro_batch_size_per_gpu": mbs,
        "gradient_accumulation_steps": gas,
        "gradient_clipping": 1.0,
        "steps_per_print": 10,
        "wall_clock_breakdown": False,
    }
    zero = int(view.s("zero_stage", 0))
    # overlap_comm: the gradient reduction (and stage 3's fetches) overlapped with compute, as
    # costed (training.grad_reduce_overlap, default true; stage_cost.gradient_bucket_bytes) —
    # off under the pipeline engine, which turns it off itself (layer_cost.dp_reduction_overlaps)
    overlap = bool(dp_reduction_overlaps(view.training.get("framework", "megatron-core"),
                                         bool(view.training.get("grad_reduce_overlap", True)), view.pp))
    if zero > 1 and view.pp > 1:
        # runtime/pipe/engine.py: "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism" —
        # refused for a plan made for DeepSpeed's engine, noted for one rendered from another framework's
        if runs_deepspeed_engine(view.training.get("framework", "megatron-core")):
            raise InvalidPlan(f"DeepSpeed's pipeline engine runs ZeRO stage 0-1 only; the plan has stage {zero} with pp={view.pp}",
                              field="target")
        notes.append("DeepSpeed's pipeline engine supports ZeRO stage 0-1 only; the plan asks for stage " + str(zero))
    cfg["zero_optimization"] = {"stage": zero, "overlap_comm": zero > 0 and overlap, "contiguous_gradients": zero > 0}
    if view.training.get("optimizer") == EIGHT_BIT_ADAM:
        # the 8-bit AdamW as priced (layer_cost.EIGHT_BIT_MOMENT_BYTES) is a client optimizer, which
        # DeepSpeed's ZeRO takes only when allowed ("You are using an untested ZeRO Optimizer")
        if zero > 0:
            cfg["zero_allow_untested_optimizer"] = True
        notes.append("the plan's optimizer is an 8-bit AdamW: pass bitsandbytes' AdamW8bit (or torchao's AdamW8bit) to "
                     "deepspeed.initialize as the client optimizer (Hugging Face: optim adamw_bnb_8bit)")
    offload = 1.0 if view.training.get("cpu_offload") is True else float(view.training.get("optimizer_offload_fraction", 0.0) or 0.0)
    if view.training.get("cpu_offload") is True:
        # ZeRO-3 Offload as priced (layer_cost.cpu_offload_microbatch_s, cpu_offload_step_s): the
        # 16-bit parameter partitions in pinned host memory, fetched for each gather
        cfg["zero_optimization"]["offload_param"] = {"device": "cpu", "pin_memory": True}
    if offload > 0.0:
        # ZeRO-Offload as priced (layer_cost.offloaded_optimizer_s): the optimizer state in pinned
        # host memory, ``ratio`` of it at stage 3 ("only valid with ZeRO Stage 3")
        cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True, **({"ratio": offload} if offload < 1.0 else {})}
        if view.training.get("optimizer") == EIGHT_BIT_ADAM:
            # the 8-bit AdamW steps the host partition as the client optimizer (layer_cost.HOST_ADAMW_8BIT_BYTES_PER_PARAM)
            cfg["zero_force_ds_cpu_optimizer"] = False
            notes.append("the offloaded state is stepped on the host by the client 8-bit AdamW (torchao's AdamW8bit; Hugging Face "
                         "optim adamw_torch_8bit), which zero_force_ds_cpu_optimizer: false lets DeepSpeed keep")
        else:
            notes.append("ZeRO-Offload updates with DeepSpeed's CPU Adam: let DeepSpeed build it (an optimizer section in "
                         "ds_config.json, or Megatron-DeepSpeed's --cpu-optimizer) or pass deepspeed.ops.adam.DeepSpeedCPUAdam")
    dtype = view.training.get("dtype", "bf16")
    if dtype in ("bf16", "fp8"):
        cfg["bf16"] = {"enabled": True}
        accum = view.training.get("grad_accum_dtype")
        if zero == 1 and accum:
            # At stage 1 DeepSpeed picks its BF16_Optimizer (fp32 accumulation) when asked for fp32
            # accumulation, its ZeRO optimizer otherwise (its default): the optimizer the plan
            # priced (layer_cost.bf16_optimizer, from training.grad_accum_dtype).
            cfg["data_types"] = {"grad_accum_dtype": accum}
        elif accum:
            notes.append(f"grad_accum_dtype {accum} is not written: DeepSpeed takes it at ZeRO stage 1 only (stage 0 runs "
                         "BF16_Optimizer, fp32 accumulation, under its pipeline engine and its FP16 optimizer in bf16 without "
                         "one; stages 2-3 their ZeRO optimizer), as the plan priced")
    elif dtype == "fp16":
        cfg["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    offload_activations = view.training.get("activation_offloading") is True
    if offload_activations and view.s("recompute", "none") != "full":
        notes.append("the plan offloads every layer's saved activations (training.activation_offloading) without full recompute: "
                     "DeepSpeed's cpu_checkpointing offloads only checkpointed inputs, so turn on the trainer's own offload "
                     "(TRL's activation_offloading, torchtune's enable_activation_offloading)")
    elif offload_activations:
        notes.append("activation_checkpointing.cpu_checkpointing offloads the checkpointed inputs where the model checkpoints "
                     "through deepspeed.checkpointing (Megatron-DeepSpeed); a Hugging Face model checkpoints through its own "
                     "gradient checkpointing, so turn on TRL's activation_offloading there")
    if view.s("recompute", "none") != "none":
        cfg["activation_checkpointing"] = {
            # each checkpoint whole on every tensor-parallel rank, as priced (layer_cost.activation_bytes
            # splits a layer's input over tp under sequence parallelism only): partitioned checkpoints
            # would hold 1/tp of it and all-gather it before each recompute, which the plan does not price
            "partition_activations": False,
            # the checkpointed inputs in host memory under full recompute, as priced
            # (layer_cost.activation_offload_s); it acts where the model checkpoints through
            # deepspeed.checkpointing (Megatron-DeepSpeed), a Hugging Face model through TRL's offload
            "cpu_checkpointing": offload_activations and view.s("recompute", "none") == "full",
            "contiguous_memory_optimization": False,
            "number_checkpoints": None,
        }
    if view.pp > 1:
        cfg["pipeline"] = {"stages": view.pp, "partition": "parameters"}
    if view.tp > 1:
        notes.append(f"tp={view.tp} is set by the model code (e.g. Megatron-DeepSpeed --tensor-model-parallel-size)")
    if view.ep > 1:
        expert_parallel, ep_notes = autoep_section(view)
        if expert_parallel is not None:
            cfg["expert_parallel"] = expert_parallel
        notes += ep_notes
    kernel = view.training.get("loss_kernel", "unfused")
    if kernel != "unfused":
        notes.append(f"the plan's LM head and loss run {dict(rules_for('deepspeed').loss_kernels)[kernel]}: turn it on in the "
                     "training script (ds_config.json has no loss setting); without it the logits take the memory the plan left out")
    notes += lora_note(view, "wrap the model with peft.get_peft_model(model, LoraConfig(r, target_modules, lora_dropout)) before "
                             "deepspeed.initialize (ds_config.json has no LoRA setting; DeepSpeed steps the adapters alone)")
    return cfg, notes


#: DeepSpeed 0.19's AutoEP presets by Hugging Face ``model_type``
#: (``deepspeed.module_inject.auto_ep_presets``: each preset's ``hf_model_types``; the suite
#: checks this table against the installed registry).
AUTOEP_PRESETS = {"mixtral": "mixtral", "qwen3_moe": "qwen3_moe", "qwen2_moe": "qwen3_moe",
                  "deepseek_v2": "deepseek_v2", "deepseek_v3": "deepseek_v3"}


def autoep_section(view: PlanView) -> tuple[dict[str, Any] | None, list[str]]:
    """How a DeepSpeed-engine launch runs the plan's expert parallelism: under ``deepspeed`` (a
    Hugging Face model) DeepSpeed's AutoEP, the ``expert_parallel`` section of ds_config —
    ``autoep_size`` ep, experts whole (ETP 1), its preset for the model's ``model_type`` where
    DeepSpeed has one (:data:`AUTOEP_PRESETS`; else its detection, with the patterns to set
    named); under ``megatron-deepspeed`` the model's own ``deepspeed.moe.layer.MoE``, sized by a
    model-code flag, not a ds_config key."""
    if view.training.get("framework") == "megatron-deepspeed":
        return None, [f"ep={view.ep} is set by the model code (Megatron-DeepSpeed --moe-expert-parallel-size {view.ep}: DeepSpeed's "
                      "native MoE layers), not by ds_config"]
    section: dict[str, Any] = {"enabled": True, "autoep_size": view.ep, "expert_tensor_parallel_size": 1}
    model_type = view.transformer.model_type if view.transformer is not None else ""
    preset = AUTOEP_PRESETS.get(model_type)
    if preset is not None:
        section["preset_model"] = preset
        return section, [f"ep={view.ep}: DeepSpeed AutoEP replaces the model's MoE blocks (preset {preset}; DeepSpeed's presets "
                         "need transformers ≥ 5)"]
    return section, [f"ep={view.ep}: DeepSpeed AutoEP has no preset for model_type {model_type or '(none)'!r}; it tries its presets' "
                     "patterns, else set expert_parallel.moe_layer_pattern, expert_pattern and router_pattern to the model's "
                     "MoE block, experts and router"]


def render_deepspeed_config(view: PlanView, params: LaunchParams) -> Artifact:
    cfg, notes = deepspeed_config(view)
    files: dict[str, str] = {"ds_config.json": json.dumps(cfg, indent=2) + "\n"}
    if view.pp > 1:
        chunks = view.require_layers("deepspeed-config")
        if view.vpp > 1:
            notes.append("DeepSpeed has no interleaved pipeline; chunks are merged per stage")
        stages = view.stage_layers or chunks
        files["pipeline_partition.json"] = json.dumps(
            {
                "num_stages": view.pp,
                "layer_list": "embedding, decoder layers, head",
                "layers_per_stage": list(stages),
                "parts": _layer_boundaries(tuple(stages)),
                "usage": "PipelineModule: set self.parts to 'parts' in a _partition_layers override "
                "(upstream partition_method has no explicit per-stage list)",
            },
            indent=2,
        ) + "\n"
    launch = render_deepspeed(view, params, extra_entry_args=["--deepspeed_config", "ds_config.json"])
    files.update(launch.files)
    return Artifact("deepspeed-config", files, "ds_config.json", tuple(notes + mtp_notes(view) + list(launch.notes)))


FLEET_ORDER = ["pp", "dp", "sharding", "sep", "mp"]  # the sharding group inside dp: HSDP shards within, replicates across
#: With expert parallelism: Paddle 3's EPHybridCommunicateGroup takes the expert topology
#: (pipe, moe_sharding, expert) and the dense one (data, pipe, moe_sharding, dense_sharding, sep,
#: model) from this order; the expert groups are then ep consecutive ranks, as the plan's.
FLEET_EP_ORDER = ["dp", "pp", "moe_sharding", "ep", "sharding", "sep", "cp", "mp"]


def fleet_expert_axes(view: PlanView) -> dict[str, int] | None:
    """The hybrid degrees that make Paddle 3's fleet build the plan's expert groups, else None
    where its expert axis cannot: fleet's ``EPHybridCommunicateGroup`` requires dp_degree and
    sep_degree 1 (every data-parallel rank a sharding rank) and carves the expert groups of
    ``ep_degree`` consecutive ranks out of sharding × mp (``moe_sharding_degree`` =
    sharding·mp/ep), each expert whole on its rank — the layout the planner costs and searches
    for Paddle (``cost_model.frameworks.expert_layout_ok``: cp 1, the optimizer state sharded
    over every dp rank, ep a multiple of tp dividing tp·dp, etp 1).  A plan stored before that
    rule, outside it, gets none (and a note)."""
    zero = int(view.s("zero_stage", 0))
    if view.ep <= 1 or not expert_layout_ok(view.tp, view.cp, view.ep, zero, view.dp, view.dp_shard):
        return None
    return {"dp_degree": 1, "sharding_degree": view.dp, "ep_degree": view.ep, "moe_sharding_degree": view.dp * view.tp // view.ep}


def fleet_config(view: PlanView) -> dict[str, Any]:
    chunks = view.require_layers("paddle-fleet")
    zero = int(view.s("zero_stage", 0))
    hybrid: dict[str, Any] = {
        "dp_degree": view.dp_replicas if zero > 0 else view.dp,
        "mp_degree": view.tp,
        "pp_degree": view.pp,
        "sharding_degree": view.dp_shard if zero > 0 else 1,
        "sep_degree": view.cp,
        "order": FLEET_ORDER,
    }
    expert_axes = fleet_expert_axes(view)
    if expert_axes is not None:
        hybrid.update(expert_axes, order=FLEET_EP_ORDER)
    recompute = view.s("recompute", "none")
    dtype = view.training.get("dtype", "bf16")
    return {
        "hybrid_configs": hybrid,
        "pipeline_configs": {"accumulate_steps": view.num_microbatches, "micro_batch_size": view.micro_batch_size,
                             "schedule_mode": "1F1B"},
        "seg_method": _layer_boundaries(chunks),
        "seg_layer_list": "embedding, decoder layers, head (PipelineLayer layers in this order)",
        "num_virtual_pipeline_stages": view.vpp,
        "layers_per_stage": list(view.stage_layers or ()),
        "sharding_stage": zero,
        "recompute": recompute,
        # PipelineLayer recompute_interval: every layer (full); selective has no fleet switch (a launch note names
        # PaddleNLP's recompute_granularity core_attn).
        "recompute_interval": 1 if recompute == "full" else 0,
        "sequence_parallel": bool(view.s("sequence_parallel", False)),
        "amp_dtype": DTYPE_NAMES.get(dtype, "bfloat16"),
        "amp_level": "O0" if dtype == "fp32" else "O2",
        # fp32 gradients after backward (paddle.amp.decorate master_grad), as the plan priced them:
        # training.main_grads_dtype fp32 (the default), 16-bit ones with bf16
        "master_grad": dtype != "fp32" and view.training.get("main_grads_dtype", "fp32") == "fp32",
    }


FLEET_INIT = '''"""Apply the plan's Paddle Fleet strategy (fleet_strategy.json): hybrid degrees and order,
pipeline micro-batching and schedule, sharding stage, recompute and AMP (with fp32 or 16-bit
gradients: master_grad).  Generated by the
auto-parallel planner.

    from fleet_init import init_fleet, wrap, auto_cast
    cfg = init_fleet()                      # reads $PLANNER_FLEET_STRATEGY or ./fleet_strategy.json
    model = PipelineLayer(layers=[embedding, *decoders, head], num_stages=cfg["hybrid_configs"]["pp_degree"],
                          seg_method=cfg["seg_method"], recompute_interval=cfg["recompute_interval"],
                          num_virtual_pipeline_stages=cfg["num_virtual_pipeline_stages"] or None, ...)
    model, optimizer, scaler = wrap(cfg, model, optimizer)
    with auto_cast(cfg):
        loss = model(batch)
"""
import json
import os


def load_config(path=None):
    path = path or os.environ.get("PLANNER_FLEET_STRATEGY") or os.path.join(os.path.dirname(__file__), "fleet_strategy.json")
    with open(path) as fh:
        return json.load(fh)


def build_strategy(cfg):
    """DistributedStrategy with the plan's hybrid degrees, pipeline configs, recompute and AMP."""
    from paddle.distributed import fleet

    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = dict(cfg["hybrid_configs"])
    strategy.pipeline_configs = dict(cfg["pipeline_configs"])
    if cfg["recompute"] != "none":
        strategy.recompute = True
    if cfg["amp_level"] != "O0":
        strategy.amp = True
        fp16 = cfg["amp_dtype"] == "float16"
        strategy.amp_configs = {"use_pure_fp16": fp16 and cfg["amp_level"] == "O2", "use_dynamic_loss_scaling": fp16}
    return strategy


def init_fleet(path=None):
    from paddle.distributed import fleet

    cfg = load_config(path)
    fleet.init(is_collective=True, strategy=build_strategy(cfg))
    return cfg


def wrap(cfg, model, optimizer, scaler=None):
    """AMP decoration at the plan's level and dtype, then the sharding stage: 1 through fleet's
    sharding optimizer (hybrid sharding_degree), 2 and 3 through group_sharded_parallel
    (levels os_g and p_g_os) over the sharding group."""
    import paddle
    from paddle.distributed import fleet

    if cfg["amp_level"] == "O2":
        model, optimizer = paddle.amp.decorate(models=model, optimizers=optimizer, level="O2", dtype=cfg["amp_dtype"],
                                               master_grad=cfg.get("master_grad", False))
    if cfg["amp_dtype"] == "float16" and scaler is None:
        scaler = paddle.amp.GradScaler(init_loss_scaling=2.0 ** 16)
    stage = cfg["sharding_stage"]
    if stage >= 2:
        from paddle.distributed.sharding import group_sharded_parallel

        group = fleet.get_hybrid_communicate_group().get_sharding_parallel_group()
        model, optimizer, scaler = group_sharded_parallel(
            model, optimizer, level="os_g" if stage == 2 else "p_g_os", scaler=scaler, group=group
        )
    else:
        model = fleet.distributed_model(model)
        optimizer = fleet.distributed_optimizer(optimizer)
        if scaler is not None:
            scaler = fleet.distributed_scaler(scaler)
    return model, optimizer, scaler


def auto_cast(cfg):
    import paddle

    return paddle.amp.auto_cast(enable=cfg["amp_level"] != "O0", level=cfg["amp_level"] if cfg["amp_level"] != "O0" else "O1",
                                dtype=cfg["amp_dtype"] if cfg["amp_level"] != "O0" else "float16")
'''


def render_paddle_fleet(view: PlanView, params: LaunchParams) -> Artifact:
    cfg = fleet_config(view)
    params = params.with_default_command("train.py")
    env = dict(params.env)
    env.setdefault("PLANNER_FLEET_STRATEGY", "fleet_strategy.json")
    launch = render_paddle_launch(view, replace(params, env=env))
    files = {"fleet_strategy.json": json.dumps(cfg, indent=2) + "\n", "fleet_init.py": FLEET_INIT, **launch.files}
    notes = [
        "hybrid_configs.order is outermost-first and matches the plan's rank order (pp, dp, cp, tp)",
        "seg_method lists boundaries over [embedding, decoder layers..., head]",
        *mtp_notes(view),
        *launch.notes,
    ]
    if view.cp > 1:
        notes.append("context parallelism maps to sep_degree (Paddle's segment parallelism: the all-to-all exchange the plan costs)")
    hybrid = cfg["hybrid_configs"]
    if "ep_degree" in hybrid:  # fleet_expert_axes wrote them
        notes.append(f"expert parallelism {view.ep}: fleet's expert axes (ep_degree {hybrid['ep_degree']}, moe_sharding_degree "
                     f"{hybrid['moe_sharding_degree']}, every dp rank a sharding rank); take the MoE layers' group from "
                     "fleet.get_hybrid_communicate_group().get_expert_parallel_group()")
    elif view.ep > 1:
        notes.append(f"expert parallelism {view.ep}: Paddle 3's fleet builds expert groups only with dp_degree 1 and sep_degree 1, "
                     "carving them out of sharding × mp (ep a multiple of tp), which is not this plan's layout (cp > 1, replicas, "
                     "zero_stage 0 or an ep that does not take in whole tensor-parallel groups; re-plan it: the planner now keeps "
                     "Paddle's expert layouts to those), so no expert axes are written")
    # the offloads the plan priced are PaddleNLP Trainer settings, not fleet strategy fields
    if float(view.training.get("optimizer_offload_fraction", 0.0) or 0.0) > 0.0:
        notes.append("the plan keeps the optimizer state in host memory tensor-wise (layer_cost.tensorwise_offload_s): set "
                     "PaddleNLP's tensorwise_offload_optimizer: true (outside its Trainer, "
                     "paddlenlp.trainer.utils.offload_optimizer.hack_offload_optimizer() before building the optimizer)")
    depth = int(view.s("recompute_num_layers", 0) or 0)
    layers = view.transformer.num_layers if view.transformer is not None else 0
    if view.s("recompute", "none") == "full" and depth and layers:
        kept = list(range(depth, layers))
        notes.append(f"the plan recomputes {depth} of the {layers} layers (strategy.recompute_num_layers; the others keep their "
                     "activations), which fleet's strategy has no switch for: set PaddleNLP's recompute: true, "
                     f"recompute_granularity full and no_recompute_layers {kept} (any {len(kept)} of the layers cost the same)")
    if view.s("recompute", "none") == "selective" and "full_attn" in (view.s("recompute_modules", None) or ()):
        notes.append("the plan recomputes each layer's whole self-attention module (recompute_modules full_attn, costed with its "
                     "projections, RoPE, attention core and tensor-parallel collectives run again in backward), which fleet's "
                     "strategy has no switch for: set PaddleNLP's recompute: true with recompute_granularity full_attn")
    elif view.s("recompute", "none") == "selective":
        notes.append("the plan recomputes the attention core (selective recompute, costed with its attention forward run again in "
                     "backward), which fleet's strategy has no switch for: set PaddleNLP's recompute: true with "
                     "recompute_granularity core_attn (or wrap the attention function in paddle.distributed.fleet.utils.recompute)")
    if view.training.get("activation_offloading") is True:
        notes.append("the plan keeps the full recompute's checkpointed inputs in host memory: set PaddleNLP's recompute_offload: "
                     "true with recompute_granularity full")
    notes += lora_note(view, "set PaddleNLP's lora: true and lora_rank (its LoRAConfig target_modules and lora_dropout for the rest)")
    zero = int(view.s("zero_stage", 0))
    if zero >= 2 and (view.tp > 1 or view.cp > 1 or view.dp_replicas > 1):
        notes.append(f"sharding stage {zero} with tensor/segment parallelism or replicas: fleet_init.wrap shards through "
                     "group_sharded_parallel, which applies no TP/segment wrapper and no replica all-reduce; run this layout "
                     "with PaddleNLP's Trainer (sharding with tensor_parallel_degree / sep_parallel_degree) instead")
    return Artifact("paddle-fleet", files, "fleet_strategy.json", tuple(notes))


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(type(value))


def to_toml(sections: Mapping[str, Mapping[str, Any]], header: str = "") -> str:
    lines = [header] if header else []
    for name, body in sections.items():
        lines.append(f"[{name}]")
        for key, value in body.items():
            if value is None:
                continue
            lines.append(f"{key} = {_toml_value(value)}")
        lines.append("")
    return "\n".join(lines)


#: torchtitan's registered models and flavors (torchtitan/models/*/__init__.py, e.g.
#: ``llama3_configs``, ``qwen3_configs``, ``deepseekv3_configs`` of torchtitan 0.3.0) by the
#: shape they build: (layers, hidden, heads, kv heads, FFN or per-expert width, experts) →
#: (model, flavor, the config_registry function of the Python-config era or None).
TORCHTITAN_FLAVORS: dict[tuple[int, int, int, int, int, int], tuple[str, str, str | None]] = {
    (32, 4096, 32, 8, 14336, 1): ("llama3", "8B", "llama3_8b"),
    (80, 8192, 64, 8, 28672, 1): ("llama3", "70B", "llama3_70b"),
    (126, 16384, 128, 8, 53248, 1): ("llama3", "405B", "llama3_405b"),
    (27, 2048, 16, 16, 1408, 64): ("deepseek_v3", "16B", "deepseek_v3_16b"),
    (60, 5120, 128, 128, 1536, 160): ("deepseek_v3", "236B", None),
    (61, 7168, 128, 128, 2048, 256): ("deepseek_v3", "671B", "deepseek_v3_671b"),
    (28, 1024, 16, 8, 3072, 1): ("qwen3", "0.6B", "qwen3_0_6b"),
    (28, 2048, 16, 8, 6144, 1): ("qwen3", "1.7B", "qwen3_1_7b"),
    (36, 2560, 32, 8, 9728, 1): ("qwen3", "4B", None),
    (36, 4096, 32, 8, 12288, 1): ("qwen3", "8B", None),
    (40, 5120, 40, 8, 17408, 1): ("qwen3", "14B", "qwen3_14b"),
    (64, 5120, 64, 8, 25600, 1): ("qwen3", "32B", "qwen3_32b"),
    (48, 2048, 32, 4, 768, 128): ("qwen3", "30B-A3B", "qwen3_30b_a3b"),
    (94, 4096, 64, 4, 1536, 128): ("qwen3", "235B-A22B", None),
}


def torchtitan_model(m: TransformerSpec | None) -> tuple[dict[str, Any], str | None, list[str]]:
    """The ``[model]`` section: a registered name and flavor when the plan's model is one, else
    the ``custom`` flavor of torchtitan's llama3 model registered by ``torchtitan_flavor.py``
    (imported through ``[experimental] custom_import``).  Returns (section, module text, notes)."""
    if m is None:
        return {"name": "llama3", "flavor": "custom"}, None, ["the plan's model has no shape: register a torchtitan flavor for it"]
    key = (m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads, m.ffn_hidden_size, m.num_experts)
    if key in TORCHTITAN_FLAVORS:
        name, flavor, _ = TORCHTITAN_FLAVORS[key]
        return {"name": name, "flavor": flavor}, None, []
    notes = []
    if not m.gated_ffn or m.activation != "silu" or m.is_moe or m.is_mla or m.has_qkv_bias or m.norm != "rmsnorm":
        notes.append("torchtitan's llama3 model is a SwiGLU/RMSNorm decoder without biases or experts: "
                     f"{m.name} differs, so the custom flavor only approximates it; register a model for it")
    base = 4 * m.hidden_size
    base = int(2 * base / 3)
    module = "\n".join([
        f'"""Registers torchtitan flavor "custom" (llama3 model) for plan model {m.name}; generated by the planner."""',
        "from torchtitan.models.llama3 import llama3_configs",
        "from torchtitan.models.llama3.model.args import TransformerModelArgs",
        "",
        "llama3_configs[\"custom\"] = TransformerModelArgs(",
        f"    dim={m.hidden_size},",
        f"    n_layers={m.num_layers},",
        f"    n_heads={m.num_heads},",
        f"    n_kv_heads={m.num_kv_heads},",
        f"    vocab_size={m.vocab_size},",
        f"    multiple_of={m.ffn_hidden_size},  # with the multiplier below: FFN width exactly {m.ffn_hidden_size}",
        f"    ffn_dim_multiplier={m.ffn_hidden_size / base!r},",
        f"    rope_theta={m.rope_theta or 10000.0!r},",
        ")",
        "",
    ])
    notes.append("[model] flavor \"custom\" is registered by torchtitan_flavor.py ([experimental] custom_import; "
                 "keep it on PYTHONPATH); TOML-era torchtitan (model args as dataclass instances): with Python configs "
                 "(torchtitan >= 0.3) add a config_registry function for this model instead")
    return {"name": "llama3", "flavor": "custom"}, module, notes


def torchtitan_sections(view: PlanView) -> dict[str, dict[str, Any]]:
    chunks = view.require_layers("torchtitan")
    zero = int(view.s("zero_stage", 0))
    parts: list[list[str]] = []
    layer = 0
    for k, n in enumerate(chunks):
        names = ["tok_embeddings"] if k == 0 else []
        names += [f"layers.{layer + i}" for i in range(n)]
        layer += n
        if k == len(chunks) - 1:
            names += ["norm", "output"]
        parts.append(names)
    parallelism: dict[str, Any] = {
        "data_parallel_replicate_degree": view.dp if zero == 0 else view.dp_replicas,
        "data_parallel_shard_degree": 1 if zero == 0 else view.dp_shard,
        "fsdp_reshard_after_forward": "never" if zero in (1, 2) else "default",
        "tensor_parallel_degree": view.tp,
        "enable_sequence_parallel": bool(view.s("sequence_parallel", False)) if view.tp > 1 else None,
        "pipeline_parallel_degree": view.pp,
        "context_parallel_degree": view.cp,
        "expert_parallel_degree": view.ep,
    }
    if view.pp > 1:
        parallelism["pipeline_parallel_schedule"] = "Interleaved1F1B" if view.vpp > 1 else "1F1B"
        parallelism["pipeline_parallel_microbatch_size"] = view.micro_batch_size
        parallelism["module_fqns_per_model_part"] = parts
    # with a pipeline each gradient-accumulation step runs one schedule over local_batch_size sequences:
    # the plan's pipeline schedules a step
    local = view.global_batch_size // view.dp // view.pipeline_schedules if view.pp > 1 else view.micro_batch_size
    training = {
        "local_batch_size": local,
        "global_batch_size": view.global_batch_size,
        "seq_len": view.training.get("sequence_length"),
        "mixed_precision_param": DTYPE_NAMES.get(view.training.get("dtype", "bf16"), "bfloat16"),
    }
    if view.training.get("master_weights") is False:
        # pure bf16, as priced: "all parameters, gradients, and optimizer states in bfloat16, without an extra copy of fp32 weights"
        training["dtype"] = "bfloat16"
    if view.training.get("cpu_offload") is True:
        # FSDP2's CPUOffloadPolicy, as priced (layer_cost.cpu_offload_microbatch_s, cpu_offload_step_s)
        training["enable_cpu_offload"] = True
    recompute = view.s("recompute", "none")
    ac = {"mode": recompute, "selective_ac_option": "op" if recompute == "selective" else None}
    sections: dict[str, Any] = {
        "job": {"description": f"plan {view.plan_id}: {view.model_name}"},
        "model": torchtitan_model(view.transformer)[0],
        "training": training,
        "parallelism": parallelism,
        "activation_checkpoint": ac,
    }
    if view.training.get("tp_comm_overlap") and view.tp > 1:
        # async tensor parallelism, the TP overlap the plan priced: torchtitan runs it under torch.compile only
        sections["compile"] = {"enable": True, "enable_async_tensor_parallel": True}
    if view.training.get("loss_kernel") == "compiled":
        # the compiled cross-entropy the plan priced (layer_cost.embedding_head_costs)
        sections["compile"] = {**sections.get("compile", {"enable": True}), "components": ["model", "loss"]}
    return sections


#: Module names torchtitan 0.3's decoder spells differently from the TOML era's.
TORCHTITAN_RENAMED = {"output": "lm_head"}


def torchtitan_cli_args(sections: Mapping[str, Mapping[str, Any]], registered: tuple[str, str, str | None] | None) -> list[str]:
    """The same settings as torchtitan >= 0.3 command-line words (its tyro parser): ``--module``/
    ``--config`` when a registered config builds the model, ``--section.key value``, booleans as
    ``--section.key`` / ``--section.no-key``, a list of strings as one comma-separated word (the
    model parts' list of lists as one such word a part), and the activation
    checkpoint mode as the ``activation-checkpoint:<mode>`` subcommand (last)."""
    args: list[str] = []
    if registered and registered[2]:
        args += ["--module", registered[0], "--config", registered[2]]
    for section in ("training", "parallelism", "compile"):
        for key, value in sections.get(section, {}).items():
            if value is None:
                continue
            name = key.replace("_", "-")
            if isinstance(value, bool):
                args.append(f"--{section}.{name}" if value else f"--{section}.no-{name}")
            elif key == "module_fqns_per_model_part":
                # a list of lists: one word a model part. torchtitan 0.3 names the output projection
                # lm_head (the TOML era's "output"): a name its split does not know is dropped, and
                # the last stage would have no head
                args += [f"--{section}.{name}", *(",".join(TORCHTITAN_RENAMED.get(m, m) for m in part) for part in value)]
            elif isinstance(value, list):  # torchtitan's list[str] options take one comma-separated word
                args += [f"--{section}.{name}", ",".join(str(v) for v in value)]
            else:
                args += [f"--{section}.{name}", str(value)]
    par = sections["parallelism"]
    if par.get("pipeline_parallel_degree", 1) > 1 or par.get("expert_parallel_degree", 1) > 1:
        # torchtitan 0.3: "CUDA graphs do not support pipeline parallelism yet", and only expert-parallel
        # dispatchers without CPU synchronisation (not the registered configs' all-to-all)
        args.append("--training.disable-cuda-graphs")
    args.append(f"activation-checkpoint:{sections['activation_checkpoint']['mode']}")
    return args


def _torchrun_as(launch: Artifact, script: str) -> tuple[dict[str, str], list[str]]:
    """A torchrun launch's files and notes with its script named ``script`` — the notes tell the
    user which file to run on every node, so they must name the file that is written."""
    files = {(script if k == launch.primary else k): v for k, v in launch.files.items()}
    return files, [n.replace(launch.primary, script) for n in launch.notes]


def render_torchtitan(view: PlanView, params: LaunchParams) -> Artifact:
    sections = torchtitan_sections(view)
    _, flavor_module, model_notes = torchtitan_model(view.transformer)
    if flavor_module is not None:
        sections["experimental"] = {"custom_import": "torchtitan_flavor"}
    toml_sections = dict(sections)
    if "compile" in toml_sections:  # the TOML era kept the async-TP switch under [parallelism]
        toml_sections["compile"] = {k: v for k, v in sections["compile"].items() if k != "enable_async_tensor_parallel"}
        if sections["compile"].get("enable_async_tensor_parallel"):
            toml_sections["parallelism"] = {**sections["parallelism"], "enable_async_tensor_parallel": True}
    toml_text = to_toml(toml_sections, f"# torchtitan config for plan {view.plan_id} (TOML era, before torchtitan PR #2386)")
    m = view.transformer
    registered = TORCHTITAN_FLAVORS.get((m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads, m.ffn_hidden_size, m.num_experts)) if m else None
    overrides = torchtitan_cli_args(sections, registered)
    if not (registered and registered[2]):
        model_notes = [*model_notes, "torchtitan >= 0.3 (Python configs): no config_registry function builds this model; "
                       "pass --module/--config of one you register before these arguments"]
    if view.training.get("loss_kernel", "unfused") not in ("unfused", "compiled"):
        raise InvalidPlan("torchtitan's loss is its own cross-entropy over the whole logits (compiled or not): the plan priced a loss "
                          "kernel that never holds them (training.loss_kernel), which this launch would; use the torchrun target with a "
                          "trainer that runs it (Liger Kernel, Cut Cross-Entropy)", field="target")
    refuse_lora(view, "torchtitan's command line", "torchtitan's LoRA is a LoRAConverter in a registered config function's "
                "model converters (components/lora.py): register one with the plan's rank and target modules, or use the "
                "torchrun target with a PEFT trainer")
    depth = int(view.s("recompute_num_layers", 0) or 0)
    layers = view.transformer.num_layers if view.transformer is not None else 0
    if depth and layers:
        # such a plan has no pipeline (recompute_method_violation: fsdp's partial recompute runs without one)
        raise InvalidPlan(f"torchtitan's activation checkpointing has no setting for recomputing {depth} of the {layers} layers "
                          "(strategy.recompute_num_layers; its modes are full, op-level selective and a memory budget): this "
                          "launch would recompute all of them or none; launch it with the torchrun target and a trainer that "
                          f"checkpoints {depth} of the {layers} blocks (fms-fsdp's selective_checkpointing {depth}/{layers})",
                          field="target")
    if view.cp > 1 and cp_exchange("fsdp", view.training.get("cp_comm_type")) != "allgather":
        raise InvalidPlan(f"torchtitan's context parallelism all-gathers K/V: the plan priced cp={view.cp} as the Ulysses "
                          "all-to-all (training.cp_comm_type a2a), which this launch would not run; launch it with the torchrun "
                          f"target and a trainer that runs Ulysses under FSDP (verl's ulysses_sequence_parallel_size={view.cp}), "
                          "or plan with the allgather exchange", field="target")
    if view.training.get("activation_offloading") is True:
        raise InvalidPlan("torchtitan has no activation offloading (its memory settings are activation checkpointing and "
                          "enable_cpu_offload): the plan priced every layer's saved activations in host memory, which this launch "
                          "would keep on the GPU; launch it with the torchrun target and a trainer that offloads them (torchtune's "
                          "enable_activation_offloading, TRL's activation_offloading, verl's enable_activation_offload)",
                          field="target")
    if view.training.get("optimizer_in_backward") is True:
        raise InvalidPlan("torchtitan 0.3 has no optimizer step inside the backward (its optimizer.early_step_in_backward was "
                          "removed): the plan priced no gradient held for the step, which this launch would hold; launch it with "
                          "the torchrun target and torchtune's optimizer_in_bwd", field="target")
    if view.training.get("optimizer") in ("sgd", EIGHT_BIT_ADAM):
        what = ("SGD (priced with one momentum buffer)" if view.training.get("optimizer") == "sgd"
                else "8-bit AdamW (priced with 8-bit moments)")
        raise InvalidPlan(f"torchtitan's optimizers are Adam, AdamW and Muon (components.optimizer): the plan's {what} "
                          "does not launch with it; use the torchrun target with your own trainer", field="target")
    if sections["training"]["mixed_precision_param"] not in ("bfloat16", "float32"):
        raise InvalidPlan(f"torchtitan's mixed precision takes bfloat16 or float32 parameters only, not the plan's "
                          f"{view.training.get('dtype')}: plan it in bf16 for this target", field="target")
    if view.training.get("submodule_checkpointing") and view.s("recompute", "none") == "full":
        model_notes.append("the plan priced full recompute by submodule (training.submodule_checkpointing: the attention, MLP and "
                           "norms checkpointed separately, as NeMo-RL's DTensor policy does); torchtitan's full activation checkpointing "
                           "wraps whole blocks, so this launch keeps less activation memory than the plan says")
    if view.training.get("attention") == "unfused":
        model_notes.append("the plan priced unfused attention (the score matrix materialised); torchtitan's models run fused "
                           "scaled-dot-product attention, so this launch needs less memory and time than the plan says")
    if view.training.get("dtype") in ("fp8", "fp4"):
        gather = (" with enable_fsdp_float8_all_gather and precompute_float8_dynamic_scale_for_fsdp (the FP8 weight all-gather "
                  "the plan priced, training.fp8_param_gather)" if view.training.get("fp8_param_gather") is True else "")
        model_notes.append("torchtitan >= 0.3 turns FP8 on in a config function (a Float8LinearConverter in the Trainer "
                           f"config's converters, as its llama3_debugmodel_float8 does{gather}): these arguments alone train in bf16, "
                           "so register one for this model, as the plan's step time assumes FP8 GEMMs")
    params = params.with_default_command("-m torchtitan.train")
    # the launch runs the installed torchtitan (>= 0.3): its command-line configuration, not the TOML
    launch = render_torchrun(view, params, entry=params.command_words + [q(w) for w in overrides])
    launch_files, launch_notes = _torchrun_as(launch, "launch_torchtitan.sh")
    files = {
        "torchtitan.toml": toml_text,
        "torchtitan_overrides.txt": "# torchtitan >= 0.3 (Python configs, after PR #2386): python -m torchtitan.train $(cat this file)\n"
        + " ".join(q(w) for w in overrides) + "\n",
        **launch_files,
    }
    if flavor_module is not None:
        files["torchtitan_flavor.py"] = flavor_module
    notes = ["torchtitan's mesh order (pp, dp, cp, tp) matches the plan's rank order", *model_notes, *mtp_notes(view), *launch_notes]
    zero2_pipeline = pipeline_gradient_sharding_note(view.training.get("framework", "fsdp"), int(view.s("zero_stage", 0)), view.pp)
    if zero2_pipeline:  # the plan's own warning: this launch (reshard_after_forward=never) runs what it describes
        notes.append(zero2_pipeline)
    return Artifact("torchtitan", files, "torchtitan.toml", tuple(notes))
