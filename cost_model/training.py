"""Training settings: batch, sequence, precision, optimizer and framework capabilities."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from cost_model.devices import DTYPES
from cost_model.errors import InvalidTraining
from cost_model.frameworks import (
    ADAM_OPTIMIZERS,
    EIGHT_BIT_ADAM,
    LORA_BASE_DTYPES,
    LORA_MODULES,
    LOSS_KERNELS,
    MUON,
    OFFLOAD_MODULES,
    activation_offloading_violation,
    cp_exchange,
    cp_exchange_rule_violation,
    cpu_offload_violation,
    declared_order,
    dtype_rule_violation,
    eight_bit_adam_violation,
    fp8_param_gather_violation,
    grad_accum_rule_violation,
    hierarchical_cp_violation,
    lora_violation,
    loss_kernel_violation,
    master_weights_violation,
    microbatch_group_setting_violation,
    moe_training_violation,
    muon_violation,
    offload_modules_violation,
    optimizer_in_backward_violation,
    optimizer_offload_violation,
    optimizer_precision_violation,
    pipeline_schedules_violation,
    qlora_violation,
    reference_model_violation,
    submodule_checkpointing_violation,
    tp_comm_overlap_violation,
)

#: ``adamw`` is Adam with decoupled weight decay: the same state (two moments) and traffic, so
#: it is priced as ``adam`` (Megatron's ``--optimizer adam`` is AdamW by default,
#: ``decoupled_weight_decay``); :attr:`Training.adam`.  ``adamw_8bit`` keeps the two moments in
#: 8 bits (:data:`cost_model.frameworks.EIGHT_BIT_ADAM`).  ``muon``: one momentum for the hidden
#: matrices, orthogonalised each step, Adam for the embedding and head
#: (:mod:`cost_model.transformer.muon`; Megatron-Core).
OPTIMIZERS = (*ADAM_OPTIMIZERS, EIGHT_BIT_ADAM, "sgd", MUON)
ATTENTION_IMPLS = ("flash", "unfused")
#: Training frameworks whose behaviour the cost model distinguishes (``training.framework``):
#: Megatron-Core with Transformer Engine (the default), Megatron-DeepSpeed (Megatron-LM's
#: tensor parallelism inside DeepSpeed's pipeline engine and ZeRO optimizer: BLOOM, MT-NLG,
#: GPT-NeoX), DeepSpeed alone (ZeRO without model parallelism), PyTorch FSDP (FSDP1/FSDP2,
#: torchtitan, metaseq) and PaddlePaddle's fleet.
FRAMEWORKS = ("megatron-core", "megatron-deepspeed", "deepspeed", "fsdp", "paddle")
#: MoE token dispatchers (``training.moe_token_dispatcher``; cost_model.transformer.moe).
MOE_DISPATCHERS = ("alltoall", "allgather", "deepep")
#: Context-parallel exchanges (``training.cp_comm_type``; cost_model.transformer.context_parallel).
CP_COMM_TYPES = ("p2p", "allgather", "a2a", "a2a+p2p")
#: Megatron-Core's optimizer-precision choices (``--main-grads-dtype``, ``--main-params-dtype``,
#: ``--exp-avg-dtype``, ``--exp-avg-sq-dtype``; the last three need ``--use-precision-aware-
#: optimizer``), each field's allowed values, its default first.
OPTIMIZER_DTYPES: dict[str, tuple[str, ...]] = {
    "main_grads_dtype": ("fp32", "bf16", "fp16"),
    "main_params_dtype": ("fp32", "fp16"),
    "exp_avg_dtype": ("fp32", "fp16", "bf16", "fp8"),
    "exp_avg_sq_dtype": ("fp32", "fp16", "bf16", "fp8"),
}
#: Gradient-accumulation dtypes of DeepSpeed's engine (``training.grad_accum_dtype``, its
#: ``data_types.grad_accum_dtype``; cost_model.transformer.layer_cost.bf16_optimizer).
GRAD_ACCUM_DTYPES = ("fp32", "bf16")


def pipeline_schedules_at(per_step: int, pp: Any) -> Any:
    """The pipeline schedules a step runs at pipeline depth ``pp`` (elementwise over arrays):
    ``per_step`` (``training.pipeline_schedules_per_step``) where there is a pipeline (pp > 1),
    else 1 — without one the micro-batches run one after another either way.  One rule for the
    cost model (:meth:`Training.pipeline_schedules`) and the launches that write it."""
    if np.ndim(pp):
        return np.where(np.asarray(pp) > 1, per_step, 1)
    return per_step if pp > 1 else 1


@dataclass(frozen=True)
class Training:
    """What is trained and how the framework runs it.

    ``attention``: ``flash`` (fused FlashAttention-style kernel: no s×s score matrix in memory,
    causal blocks skipped) or ``unfused`` (Megatron-LM before 2022: scores materialised, softmax
    and dropout as separate memory-bound kernels).  ``tp_comm_overlap``: the framework overlaps
    tensor-parallel collectives with GEMMs (Megatron-Core ``--tp-comm-overlap``).
    ``grad_reduce_overlap``: DP gradient reduction is bucketed and overlapped with backward
    (PyTorch DDP / Megatron ``--overlap-grad-reduce``).  ``fused_kernels``: the framework fuses
    elementwise work (Megatron/DeepSpeed/Apex: fused scale-mask-softmax, bias-dropout-add, fused
    Adam); ``false`` is plain eager PyTorch (e.g. a Hugging Face model with ``attn_implementation=
    "eager"`` and ``torch.optim.Adam``): every elementwise step is its own operator — a pass over
    memory, a fresh tensor and one framework dispatch each.

    Mixture of experts: ``moe_token_dispatcher`` (``alltoall``: NCCL all-to-all, the default here — what Megatron-Core's MoE guide recommends with
    expert parallelism, its CLI defaulting to ``allgather``; ``allgather``; ``deepep``: DeepEP's node-deduplicated dispatch/combine),
    ``moe_comm_overlap`` (Megatron-Core ``--overlap-moe-expert-parallel-comm``: a micro-batch's
    dispatch/combine runs under another's compute), ``moe_capacity_factor`` (token dropping
    with buffers padded to that many times the mean load; None: dropless).  Context
    parallelism: ``cp_comm_type`` (Megatron-Core ``--cp-comm-type``: ``p2p`` ring, ``allgather``,
    ``a2a`` Ulysses-style, ``a2a+p2p`` hierarchical: an all-to-all over ``cp_a2a_size`` ranks
    inside a ring over the rest), of the exchanges the framework has; omitted, the framework's own
    (:data:`cost_model.frameworks.RULES` ``cp_exchanges``: Megatron-Core's ring, torchtitan's
    all-gather, DeepSpeed-Ulysses' and Paddle's segment-parallel all-to-all).
    ``grad_accum_dtype`` (``deepspeed``, ``megatron-deepspeed`` under bf16): DeepSpeed's
    ``data_types.grad_accum_dtype``; ``fp32`` runs ZeRO stage 1 under its BF16_Optimizer (fp32
    gradient accumulation), omitted or ``bf16`` (DeepSpeed's own default when a config leaves
    ``data_types`` out) under its ZeRO optimizer (bf16 accumulation); at stage 0 DeepSpeed
    ignores it: BF16_Optimizer under its pipeline engine, its FP16 optimizer in bf16 without one
    (:func:`cost_model.transformer.layer_cost.bf16_optimizer`).

    Optimizer precision (``megatron-core``, :data:`OPTIMIZER_DTYPES`; under ``paddle``
    ``main_grads_dtype`` alone, AMP O2's ``master_grad``): ``main_grads_dtype``
    ``bf16`` keeps Megatron's gradient buffer, and reduces it, in bf16 (``--grad-reduce-in-bf16``;
    with the precision-aware optimizer ``--main-grads-dtype bf16``), Paddle's gradients in the
    training dtype (``bf16``, or ``fp16`` in fp16 training: ``master_grad`` off); ``precision_aware_optimizer``
    (``--use-precision-aware-optimizer``: Transformer Engine's FusedAdam keeps the master weights,
    as the 16 low bits beside the bf16 weight by default, and the moments) with
    ``main_params_dtype``, ``exp_avg_dtype`` and ``exp_avg_sq_dtype``
    (:func:`cost_model.transformer.layer_cost.model_state_bytes_per_param`).

    ``master_weights`` (``fsdp`` under bf16; true by default): false is pure bf16 training —
    weights, gradients and the optimizer's moments all in bf16, no fp32 master copy (torchtitan's
    ``training.dtype = "bfloat16"``, torchtune's default, a Hugging Face model loaded in bf16):
    2 + 2 + 4 bytes a parameter under Adam instead of 2 + 4 + 12
    (:func:`cost_model.frameworks.master_weights_violation`).

    ``optimizer_offload_fraction`` (0 to 1; 0 by default): the fraction of the fp32 master
    weights and Adam moments held in host memory, whose update runs on the host CPU — DeepSpeed's
    ZeRO-Offload (``zero_optimization.offload_optimizer.device: cpu``, its ``ratio`` at stage 3),
    Megatron-Core's hybrid optimizer (``--optimizer-cpu-offload --optimizer-offload-fraction``)
    (:func:`cost_model.frameworks.optimizer_offload_violation`,
    :func:`cost_model.transformer.layer_cost.offloaded_optimizer_s`).

    ``cpu_offload`` (``fsdp``, ``deepspeed``, ``megatron-deepspeed``; full sharding): FSDP2's
    ``CPUOffloadPolicy`` (torchtitan's ``training.enable_cpu_offload``), DeepSpeed's ZeRO-3 Offload
    (``offload_param`` and ``offload_optimizer``) — the sharded parameters, gradients and optimizer
    state live in host memory, each all-gather copies its shard to the GPU first, each
    reduce-scatter's output goes back, and the optimizer steps on the CPU
    (:func:`cost_model.transformer.layer_cost.cpu_offload_microbatch_s`).

    ``activation_offloading`` (every framework but ``megatron-deepspeed``; ``FrameworkRules``
    says under which recompute settings and whether inside a pipeline): every layer's saved
    activations (under full recompute, its checkpointed input) copied to pinned host memory on a
    side stream during forward and back during backward — torchtune's
    ``enable_activation_offloading``, TRL's ``activation_offloading``, verl's
    ``enable_activation_offload``, DeepSpeed's ``activation_checkpointing.cpu_checkpointing``
    (without a pipeline), PaddleNLP's ``recompute_offload`` (the full recompute's checkpoints);
    under Megatron-Core its fine-grained activation offloading of the ``offload_modules`` named
    (:func:`cost_model.transformer.layer_cost.activation_offload_s`,
    :func:`cost_model.transformer.layer_cost.offload_module_bytes`).

    ``pipeline_schedules_per_step`` (``fsdp``; default 1): with a pipeline (pp > 1), the step's m
    micro-batches run in that many whole schedules of m/k each — torchtitan's and NeMo
    Automodel's gradient accumulation, ``global_batch_size / (local_batch_size × dp)`` steps,
    each a ``pp_schedule.step`` over ``local_batch_size / pipeline_parallel_microbatch_size``
    micro-batches — so each fills and drains the pipeline (the bubble k times) and holds the
    in-flight micro-batches of an m/k schedule (:func:`cost_model.transformer.stage_cost.
    combine_stages`); k must divide m.  Without a pipeline it changes nothing (warned).

    ``optimizer_in_backward`` (``fsdp``: torchtune's ``optimizer_in_bwd``, torchtitan's
    ``early_step_in_backward``): each parameter stepped in its post-accumulate-grad hook as soon
    as its gradient is reduced, and the gradient freed — no gradient held for the step
    (:func:`cost_model.transformer.stage_cost.stage_cost`); one micro-batch a step, no pipeline,
    no expert parallelism (:func:`cost_model.frameworks.optimizer_in_backward_layout_violation`).

    ``reference_model`` (``fsdp``, ``deepspeed``, ``paddle``): a frozen copy of the model beside the
    trained one, run forward without gradients on every micro-batch — DPO's reference policy (TRL's
    ``ref_model``, torchtune's DPO, PaddleNLP's DPO) — its weights held as the trained ones' (sharded
    under ZeRO-3 / FSDP, else whole), no gradient or optimizer state, its forward priced beside
    the policy's (:func:`cost_model.transformer.stage_cost.stage_cost`).

    ``submodule_checkpointing`` (``fsdp``): under ``recompute: full``, each decoder layer's
    attention, MLP and both norms checkpointed as separate submodules (``checkpoint_wrapper`` on
    ``self_attn``, ``mlp``, ``input_layernorm``, ``post_attention_layernorm``: NeMo-RL's DTensor
    policy, NeMo Automodel's sub-module activation checkpointing) — each keeps its input, four
    hidden-size tensors a layer where a whole-layer checkpoint keeps one, and the backward
    recomputes one submodule at a time (:func:`cost_model.transformer.layer_cost.activation_bytes`);
    under the other recompute settings it changes nothing (warned).

    LoRA (``lora_rank`` > 0; ``megatron-core``, ``deepspeed``, ``fsdp``, ``paddle``: the
    frameworks' own LoRA in :data:`cost_model.frameworks.RULES` ``lora``): every base weight
    frozen, a trainable rank-``lora_rank`` adapter B·A beside each of the ``lora_target_modules``
    of every decoder layer (:data:`cost_model.frameworks.LORA_MODULES`; empty: all four), its
    input through a dropout of ``lora_dropout`` (:mod:`cost_model.transformer.lora`); with
    ``lora_base_dtype`` ``nf4`` (QLoRA; ``fsdp``, ``deepspeed``) the decoder's frozen weights held
    in 4-bit NF4 and dequantised for each GEMM.

    ``loss_kernel`` (``fsdp``, ``deepspeed``, ``megatron-core``; ``FrameworkRules.loss_kernels``): ``liger`` — Liger Kernel's fused linear
    cross-entropy — or ``cce`` — Cut Cross-Entropy — compute the LM head and the loss without
    holding the logits; ``chunked`` (``fsdp``) holds the fp32 log-probabilities alone; ``te``
    (``megatron-core``) and ``compiled`` (``fsdp``: ``torch.compile``'s) the 16-bit logits alone
    (:func:`cost_model.transformer.layer_cost.embedding_head_costs`).

    ``fp8_param_gather`` (``megatron-core``, ``dtype`` ``fp8``): the weights held in FP8 and
    all-gathered so, instead of 16-bit weights with a cached FP8 cast of each.

    ``microbatch_group_size_per_vp_stage`` (``megatron-core``): the interleaved schedule's
    micro-batches per model chunk in a row, its ``--microbatch-group-size-per-virtual-pipeline-
    stage``; 0 (the default): pp, or the smallest group that runs where pp does not divide the
    step's micro-batches (:func:`cost_model.frameworks.interleaved_microbatch_group`; its warm-up:
    :func:`cost_model.schedule.inflight_microbatches`).
    """

    global_batch_size: int
    sequence_length: int
    dtype: str = "bf16"
    optimizer: str = "adam"
    attention: str = "flash"
    tp_comm_overlap: bool = False
    grad_reduce_overlap: bool = True
    total_tokens: float | None = None
    fused_kernels: bool = True
    framework: str = "megatron-core"
    moe_token_dispatcher: str = "alltoall"
    moe_comm_overlap: bool = False
    moe_capacity_factor: float | None = None
    #: None: the framework's own exchange (:func:`cost_model.frameworks.cp_exchange`)
    cp_comm_type: str | None = None
    #: hierarchical context parallelism (``cp_comm_type`` ``a2a+p2p``): the CP ranks of its inner
    #: all-to-all level; the p2p ring runs over cp / cp_a2a_size of them (Megatron-Core's
    #: ``--hierarchical-context-parallel-sizes``)
    cp_a2a_size: int | None = None
    #: DeepSpeed's ``data_types.grad_accum_dtype`` under bf16; None: DeepSpeed's default (bf16)
    grad_accum_dtype: str | None = None
    precision_aware_optimizer: bool = False
    main_grads_dtype: str = "fp32"
    main_params_dtype: str = "fp32"
    exp_avg_dtype: str = "fp32"
    exp_avg_sq_dtype: str = "fp32"
    master_weights: bool = True
    #: the fraction of the optimizer's state and update kept in host memory and run on the CPU
    optimizer_offload_fraction: float = 0.0
    #: the sharded parameters, gradients and optimizer state on the host (FSDP's CPU offload,
    #: DeepSpeed's ZeRO-3 Offload)
    cpu_offload: bool = False
    #: every layer's saved activations in host memory between its forward and its backward
    activation_offloading: bool = False
    #: pipeline schedules a step runs its micro-batches in, each filling and draining the pipeline
    #: (``fsdp``: torchtitan's and NeMo Automodel's gradient accumulation with a pipeline); 1: one
    pipeline_schedules_per_step: int = 1
    #: full recompute checkpoints each layer's attention, MLP and norms as separate submodules
    #: (their inputs kept), not the whole layer (``fsdp``: NeMo Automodel, NeMo-RL's DTensor policy)
    submodule_checkpointing: bool = False
    #: each parameter stepped inside the backward as soon as its gradient is reduced, the gradient
    #: then freed (``fsdp``: torchtune's optimizer_in_bwd); one micro-batch a step
    optimizer_in_backward: bool = False
    #: a frozen copy of the model run forward (no gradients) on every micro-batch: DPO's reference
    #: policy (``fsdp``, ``deepspeed``, ``paddle``)
    reference_model: bool = False
    #: the modules whose saved tensors Megatron-Core's fine-grained activation offloading moves
    #: (``--offload-modules``; :data:`cost_model.frameworks.OFFLOAD_MODULES`); empty: every saved tensor
    offload_modules: tuple[str, ...] = ()
    #: LoRA's rank; 0: full finetuning (every weight trains)
    lora_rank: int = 0
    #: the decoder's linear layers LoRA adapts (:data:`cost_model.frameworks.LORA_MODULES`); empty: all
    lora_target_modules: tuple[str, ...] = ()
    #: the dropout probability on the adapters' input (PEFT's ``lora_dropout``)
    lora_dropout: float = 0.0
    #: QLoRA: the frozen base's decoder weights held in 4-bit NF4 (:data:`LORA_BASE_DTYPES`);
    #: None: in the training dtype
    lora_base_dtype: str | None = None
    #: the cross-entropy kernel (:data:`cost_model.frameworks.LOSS_KERNELS`): ``unfused`` holds the
    #: logits and their fp32 copy for the backward, ``liger`` and ``cce`` never hold them whole,
    #: ``chunked`` the fp32 copy alone, ``te`` the 16-bit logits alone
    loss_kernel: str = "unfused"
    #: FP8 training keeps the weights themselves in FP8 and all-gathers them so (Megatron-Core's
    #: ``--fp8-param-gather``); false: 16-bit weights, each cast to FP8 once a step and the cast
    #: cached (``stage_cost.fp8_weight_cache_bytes_per_param``)
    fp8_param_gather: bool = False
    #: Megatron-Core's ``--microbatch-group-size-per-virtual-pipeline-stage``: the interleaved
    #: schedule's micro-batches per model chunk in a row (:mod:`cost_model.schedule`); 0: pp,
    #: or the smallest group that runs where pp does not divide the micro-batches
    #: (:func:`cost_model.frameworks.interleaved_microbatch_group`)
    microbatch_group_size_per_vp_stage: int = 0

    @property
    def frozen_base(self) -> bool:
        """Whether the model's own weights are frozen (LoRA): no weight gradients, no optimizer
        state for them."""
        return self.lora_rank > 0

    @property
    def lora_modules(self) -> tuple[str, ...]:
        """The layers LoRA adapts: ``lora_target_modules``, all four when empty; () without LoRA."""
        if not self.frozen_base:
            return ()
        return self.lora_target_modules or LORA_MODULES

    @property
    def adam(self) -> bool:
        """Whether the optimizer keeps Adam's two moments (``adam``, ``adamw``, ``adamw_8bit``)."""
        return self.optimizer in ADAM_OPTIMIZERS or self.optimizer == EIGHT_BIT_ADAM

    def pipeline_schedules(self, pp: Any) -> Any:
        """The pipeline schedules a step runs at pipeline depth ``pp`` (:func:`pipeline_schedules_at`)."""
        return pipeline_schedules_at(self.pipeline_schedules_per_step, pp)

    @property
    def muon(self) -> bool:
        """Whether the optimizer is Muon: the decoder's matrices keep one momentum (as SGD's) and
        are orthogonalised each step, the embedding and head Adam's two moments
        (:mod:`cost_model.transformer.muon`)."""
        return self.optimizer == MUON

    @property
    def eight_bit_moments(self) -> bool:
        """Whether Adam's moments are held in 8 bits (``adamw_8bit``)."""
        return self.optimizer == EIGHT_BIT_ADAM

    @property
    def offload_field(self) -> str | None:
        """The first of the request's offloads to the host (``optimizer_offload_fraction``,
        ``cpu_offload``, ``activation_offloading``) by field name, None without offload."""
        if self.optimizer_offload_fraction > 0.0:
            return "optimizer_offload_fraction"
        if self.cpu_offload:
            return "cpu_offload"
        return "activation_offloading" if self.activation_offloading else None

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.sequence_length

    @property
    def cp_exchange(self) -> str:
        """The context-parallel exchange costed: ``cp_comm_type`` when given, else the
        framework's default (:func:`cost_model.frameworks.cp_exchange`)."""
        return cp_exchange(self.framework, self.cp_comm_type)

    def to_dict(self) -> dict[str, Any]:
        return {
            "global_batch_size": self.global_batch_size,
            "sequence_length": self.sequence_length,
            "dtype": self.dtype,
            "optimizer": self.optimizer,
            "attention": self.attention,
            "tp_comm_overlap": self.tp_comm_overlap,
            "grad_reduce_overlap": self.grad_reduce_overlap,
            "fused_kernels": self.fused_kernels,
            "framework": self.framework,
            **({"total_tokens": self.total_tokens} if self.total_tokens is not None else {}),
            **{k: v for k, v in self._optional_fields().items() if v != _OPTIONAL_DEFAULTS[k]},
        }

    def _optional_fields(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in _OPTIONAL_DEFAULTS}


#: The fields a ``training`` object may have: :class:`Training`'s.
TRAINING_FIELDS = frozenset(f.name for f in fields(Training))
#: Settings of the frameworks a request may carry that the cost model does not price, with what
#: they are: refused by name with the reason rather than as unknown (DeepSpeed's parameter
#: offload without its optimizer offload, or to NVMe; the priced offloads are
#: ``optimizer_offload_fraction``, ``cpu_offload`` and ``activation_offloading``).
UNCOSTED_TRAINING_FIELDS: dict[str, str] = {
    "offload_param": "DeepSpeed's ZeRO-Infinity parameter offload (parameters in CPU or NVMe memory)",
}

#: Defaults of the MoE / context-parallel / accumulation knobs (``to_dict`` writes only those that differ).
_OPTIONAL_DEFAULTS: dict[str, Any] = {"moe_token_dispatcher": "alltoall", "moe_comm_overlap": False, "moe_capacity_factor": None, "cp_comm_type": None,
                                     "cp_a2a_size": None, "grad_accum_dtype": None, "precision_aware_optimizer": False, "master_weights": True,
                                     "optimizer_offload_fraction": 0.0, "cpu_offload": False, "activation_offloading": False, "offload_modules": (),
                                     "submodule_checkpointing": False, "optimizer_in_backward": False, "reference_model": False, "pipeline_schedules_per_step": 1,
                                     "lora_rank": 0, "lora_target_modules": (), "lora_dropout": 0.0, "lora_base_dtype": None, "loss_kernel": "unfused",
                                     "fp8_param_gather": False, "microbatch_group_size_per_vp_stage": 0,
                                     **{k: v[0] for k, v in OPTIMIZER_DTYPES.items()}}


def training_from_dict(data: Mapping[str, Any], field_path: str = "training") -> Training:
    """The ``training`` object of a request: each field checked, an unknown one refused by name
    (a field that is neither costed nor refused would be dropped without a word — e.g. DeepSpeed's
    ``offload_optimizer``, which the cost model does not price)."""
    if not isinstance(data, Mapping):
        raise InvalidTraining("must be an object with global_batch_size and sequence_length", field=field_path)
    if "offload_optimizer" in data:  # DeepSpeed's spelling of a costed setting
        raise InvalidTraining("DeepSpeed's offload_optimizer is stated as training.optimizer_offload_fraction: 1 for "
                              "device cpu (its ratio at ZeRO stage 3)", field=f"{field_path}.offload_optimizer")
    uncosted = sorted(str(k) for k in data if k in UNCOSTED_TRAINING_FIELDS)
    if uncosted:
        raise InvalidTraining(f"{UNCOSTED_TRAINING_FIELDS[uncosted[0]]}: the cost model does not price it, so it cannot plan it; "
                              "leave it out to plan the layout with everything in GPU memory", field=f"{field_path}.{uncosted[0]}")
    unknown = sorted(str(k) for k in data if k not in TRAINING_FIELDS)
    if unknown:
        raise InvalidTraining(f"unknown training field{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                              f"allowed: {', '.join(sorted(TRAINING_FIELDS))}", field=f"{field_path}.{unknown[0]}")
    out: dict[str, Any] = {}
    for key, maximum in (("global_batch_size", 100_000_000), ("sequence_length", 10_000_000)):
        val = data.get(key)
        if val is None:
            raise InvalidTraining("is required", field=f"{field_path}.{key}")
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise InvalidTraining(f"must be a positive integer, got {val!r}", field=f"{field_path}.{key}")
        if val > maximum:
            raise InvalidTraining(f"must be at most {maximum}, got {val}", field=f"{field_path}.{key}")
        out[key] = val
    for key, choices in (("dtype", DTYPES), ("optimizer", OPTIMIZERS), ("attention", ATTENTION_IMPLS), ("framework", FRAMEWORKS),
                         ("moe_token_dispatcher", MOE_DISPATCHERS), ("cp_comm_type", CP_COMM_TYPES), ("lora_base_dtype", LORA_BASE_DTYPES),
                         ("loss_kernel", LOSS_KERNELS),
                         ("grad_accum_dtype", GRAD_ACCUM_DTYPES), *OPTIMIZER_DTYPES.items()):
        if key in data:
            if data[key] not in choices:
                raise InvalidTraining(f"must be one of {', '.join(choices)}, got {data[key]!r}", field=f"{field_path}.{key}")
            out[key] = data[key]
    for key in ("tp_comm_overlap", "grad_reduce_overlap", "fused_kernels", "moe_comm_overlap", "precision_aware_optimizer", "master_weights", "cpu_offload",
                "activation_offloading", "fp8_param_gather", "submodule_checkpointing", "optimizer_in_backward", "reference_model"):
        if key in data:
            if not isinstance(data[key], bool):
                raise InvalidTraining("must be true or false", field=f"{field_path}.{key}")
            out[key] = data[key]
    if data.get("total_tokens") is not None:
        val = data["total_tokens"]
        if isinstance(val, bool) or not isinstance(val, (int, float)) or val <= 0:
            raise InvalidTraining(f"must be a positive number, got {val!r}", field=f"{field_path}.total_tokens")
        out["total_tokens"] = float(val)
    if data.get("moe_capacity_factor") is not None:
        val = data["moe_capacity_factor"]
        if isinstance(val, bool) or not isinstance(val, (int, float)) or not 1.0 <= val <= 64.0:
            raise InvalidTraining(f"must be a number from 1 to 64 (times the mean expert load), got {val!r}", field=f"{field_path}.moe_capacity_factor")
        out["moe_capacity_factor"] = float(val)
    if data.get("optimizer_offload_fraction") is not None:
        val = data["optimizer_offload_fraction"]
        if isinstance(val, bool) or not isinstance(val, (int, float)) or not 0.0 <= val <= 1.0:
            raise InvalidTraining(f"must be a number from 0 to 1 (the fraction of the optimizer state in host memory), got {val!r}",
                                  field=f"{field_path}.optimizer_offload_fraction")
        out["optimizer_offload_fraction"] = float(val)
    framework = out.get("framework", "megatron-core")
    why = dtype_rule_violation(framework, out.get("dtype", "bf16"))
    if why is not None:
        raise InvalidTraining(why, field=f"{field_path}.dtype")
    why = cp_exchange_rule_violation(framework, out.get("cp_comm_type"))
    if why is not None:
        raise InvalidTraining(why, field=f"{field_path}.cp_comm_type")
    if data.get("cp_a2a_size") is not None:
        val = data["cp_a2a_size"]
        if isinstance(val, bool) or not isinstance(val, int) or not 2 <= val <= 1024:
            raise InvalidTraining(f"must be an integer from 2 to 1024 (the CP ranks of the all-to-all level), got {val!r}",
                                  field=f"{field_path}.cp_a2a_size")
        out["cp_a2a_size"] = val
    hierarchical = hierarchical_cp_violation(out.get("cp_comm_type"), out.get("cp_a2a_size"))
    if hierarchical is not None:
        raise InvalidTraining(hierarchical[1], field=f"{field_path}.{hierarchical[0]}")
    why = grad_accum_rule_violation(framework, out.get("dtype", "bf16"), out.get("grad_accum_dtype"))
    if why is not None:
        raise InvalidTraining(why, field=f"{field_path}.grad_accum_dtype")
    why = tp_comm_overlap_violation(framework, bool(out.get("tp_comm_overlap", False)))
    if why is not None:
        raise InvalidTraining(why, field=f"{field_path}.tp_comm_overlap")
    precision_why = optimizer_precision_violation(framework, out.get("dtype", "bf16"), out.get("optimizer", "adam"),
                                                  bool(out.get("precision_aware_optimizer", False)),
                                                  {k: out.get(k, v[0]) for k, v in OPTIMIZER_DTYPES.items()})
    if precision_why is not None:
        raise InvalidTraining(precision_why[1], field=f"{field_path}.{precision_why[0]}")
    why = master_weights_violation(framework, out.get("dtype", "bf16"), bool(out.get("master_weights", True)))
    if why is not None:
        raise InvalidTraining(why, field=f"{field_path}.master_weights")
    why = optimizer_offload_violation(framework, out.get("dtype", "bf16"), out.get("optimizer", "adam"),
                                      out.get("optimizer_offload_fraction", 0.0), bool(out.get("precision_aware_optimizer", False)))
    if why is not None:
        raise InvalidTraining(why, field=f"{field_path}.optimizer_offload_fraction")
    why = cpu_offload_violation(framework, out.get("dtype", "bf16"), bool(out.get("cpu_offload", False)),
                                out.get("optimizer_offload_fraction", 0.0), out.get("optimizer", "adam"))
    if why is not None:
        raise InvalidTraining(why, field=f"{field_path}.cpu_offload")
    if "offload_modules" in data:
        mods = data["offload_modules"]
        if not isinstance(mods, (list, tuple)) or not all(isinstance(m, str) for m in mods):
            raise InvalidTraining(f"must be a list of module names ({', '.join(OFFLOAD_MODULES)})", field=f"{field_path}.offload_modules")
        out["offload_modules"] = declared_order(mods, OFFLOAD_MODULES)
    why = offload_modules_violation(framework, bool(out.get("activation_offloading", False)), out.get("offload_modules", ()))
    if why is not None:
        raise InvalidTraining(why, field=f"{field_path}.offload_modules")
    if data.get("lora_rank") is not None:
        val = data["lora_rank"]
        if isinstance(val, bool) or not isinstance(val, int) or not 0 <= val <= 65536:
            raise InvalidTraining(f"must be an integer from 0 (no LoRA) to 65536, got {val!r}", field=f"{field_path}.lora_rank")
        out["lora_rank"] = val
    if "lora_target_modules" in data:
        mods = data["lora_target_modules"]
        if not isinstance(mods, (list, tuple)) or not all(isinstance(m, str) for m in mods):
            raise InvalidTraining(f"must be a list of layer names ({', '.join(LORA_MODULES)})", field=f"{field_path}.lora_target_modules")
        if not mods:
            raise InvalidTraining(f"names no layer: list at least one of {', '.join(LORA_MODULES)}, or leave it out for all four",
                                  field=f"{field_path}.lora_target_modules")
        out["lora_target_modules"] = declared_order(mods, LORA_MODULES)
    if data.get("lora_dropout") is not None:
        val = data["lora_dropout"]
        if isinstance(val, bool) or not isinstance(val, (int, float)) or not 0.0 <= val < 1.0:
            raise InvalidTraining(f"must be a probability from 0 to below 1, got {val!r}", field=f"{field_path}.lora_dropout")
        out["lora_dropout"] = float(val)
    lora_why = lora_violation(framework, out.get("dtype", "bf16"), out.get("lora_rank", 0), out.get("lora_target_modules", ()),
                              out.get("lora_dropout", 0.0))
    if lora_why is not None:
        raise InvalidTraining(lora_why[1], field=f"{field_path}.{lora_why[0]}")
    if data.get("pipeline_schedules_per_step") is not None:
        val = data["pipeline_schedules_per_step"]
        if isinstance(val, bool) or not isinstance(val, int) or not 1 <= val <= 1_000_000:
            raise InvalidTraining(f"must be a positive integer (1: one schedule a step), got {val!r}",
                                  field=f"{field_path}.pipeline_schedules_per_step")
        why = pipeline_schedules_violation(framework, val)
        if why is not None:
            raise InvalidTraining(why, field=f"{field_path}.pipeline_schedules_per_step")
        out["pipeline_schedules_per_step"] = val
    if data.get("microbatch_group_size_per_vp_stage") is not None:
        val = data["microbatch_group_size_per_vp_stage"]
        if isinstance(val, bool) or not isinstance(val, int) or not 0 <= val <= 1_000_000:
            raise InvalidTraining(f"must be an integer of at least 2 (or 0: the framework's choice), got {val!r}",
                                  field=f"{field_path}.microbatch_group_size_per_vp_stage")
        if val == 1:
            raise InvalidTraining("must be at least 2 (an interleaved pipeline has at least 2 stages, and the group at least pp micro-batches)",
                                  field=f"{field_path}.microbatch_group_size_per_vp_stage")
        why = microbatch_group_setting_violation(framework, val)
        if why is not None:
            raise InvalidTraining(why, field=f"{field_path}.microbatch_group_size_per_vp_stage")
        out["microbatch_group_size_per_vp_stage"] = val
    why = loss_kernel_violation(framework, out.get("loss_kernel", "unfused"))
    if why is not None:
        raise InvalidTraining(why, field=f"{field_path}.loss_kernel")
    why = fp8_param_gather_violation(framework, out.get("dtype", "bf16"), bool(out.get("fp8_param_gather", False)),
                                     out.get("optimizer_offload_fraction", 0.0))
    if why is not None:
        raise InvalidTraining(why, field=f"{field_path}.fp8_param_gather")
    why = qlora_violation(framework, out.get("dtype", "bf16"), out.get("lora_rank", 0), out.get("lora_base_dtype"))
    if why is not None:
        raise InvalidTraining(why, field=f"{field_path}.lora_base_dtype")
    why = eight_bit_adam_violation(framework, out.get("optimizer", "adam"), bool(out.get("cpu_offload", False)),
                                   out.get("optimizer_offload_fraction", 0.0))
    if why is not None:
        raise InvalidTraining(why, field=f"{field_path}.optimizer")
    why = muon_violation(framework, out.get("optimizer", "adam"), int(out.get("lora_rank", 0) or 0), out.get("dtype", "bf16"))
    if why is not None:
        raise InvalidTraining(why, field=f"{field_path}.optimizer")
    why = activation_offloading_violation(framework, bool(out.get("activation_offloading", False)))
    if why is not None:
        raise InvalidTraining(why, field=f"{field_path}.activation_offloading")
    why = optimizer_in_backward_violation(framework, bool(out.get("optimizer_in_backward", False)),
                                          bool(out.get("cpu_offload", False)) or out.get("optimizer_offload_fraction", 0.0) > 0.0)
    if why is not None:
        raise InvalidTraining(why, field=f"{field_path}.optimizer_in_backward")
    why = reference_model_violation(framework, bool(out.get("reference_model", False)), int(out.get("lora_rank", 0) or 0))
    if why is not None:
        raise InvalidTraining(why, field=f"{field_path}.reference_model")
    why = submodule_checkpointing_violation(framework, bool(out.get("submodule_checkpointing", False)))
    if why is not None:
        raise InvalidTraining(why, field=f"{field_path}.submodule_checkpointing")
    moe_why = moe_training_violation(framework, out.get("dtype", "bf16"), out.get("moe_token_dispatcher", "alltoall"),
                                     out.get("moe_capacity_factor"), bool(out.get("moe_comm_overlap", False)))
    if moe_why is not None:
        raise InvalidTraining(moe_why[1], field=f"{field_path}.{moe_why[0]}")
    return Training(**out)
