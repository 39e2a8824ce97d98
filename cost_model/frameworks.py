"""What each training framework can run: one table of rules per ``training.framework``.

The planner's search space (``planner_service.planner.transformer.space``), the strategy
validation of ``estimate`` (:func:`cost_model.strategy.validate_strategy`) and the check of
pinned fields (:func:`pinned_rule_violation`) read these tables and nothing else, so a plan
never proposes a layout its framework cannot launch and a pinned field that the framework
cannot run is refused with the rule that forbids it.  ``docs/frameworks.md`` is the same
table in prose.

Sources, per framework:

* ``megatron-core`` — Megatron-Core (``megatron/core``, 0.9+): interleaved 1F1B
  (``--num-layers-per-virtual-pipeline-stage``), context parallelism (``--context-parallel-size``),
  sequence parallelism (``--sequence-parallel``, a no-op at tp=1), the distributed optimizer
  (ZeRO-1) and Megatron-FSDP (``--data-parallel-sharding-strategy optim_grads`` /
  ``optim_grads_params``: ZeRO-2/3, without a pipeline), MoE parallel folding (Liu et al. 2025,
  "MoE Parallel Folding", arXiv 2504.14960; ``--expert-model-parallel-size``,
  ``--expert-tensor-parallel-size``): the expert-parallel × expert-tensor-parallel groups are
  carved out of the tp × cp × dp ranks of a stage, so ep need not divide dp·cp, only tp·cp·dp;
  FP8 through Transformer Engine (``--fp8-format``, delayed and current scaling, MXFP8);
  partial activation recompute (``--recompute-granularity full --recompute-method block
  --recompute-num-layers N``: the first N decoder layers of every model chunk recomputed, the
  rest keeping their activations).
* ``megatron-deepspeed`` — Megatron-DeepSpeed (BLOOM, MT-NLG): Megatron-LM's tensor and
  sequence parallelism inside DeepSpeed's pipeline engine (``PipelineModule``: plain 1F1B, no
  virtual stages) and ZeRO optimizer; ZeRO-2/3 are not supported with pipeline parallelism
  (DeepSpeed: "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"); context
  parallelism is DeepSpeed-Ulysses (``--ds-sequence-parallel-size``; Jacobs et al. 2023): the
  all-to-all exchange (``a2a``) alone, the heads divisible by its degree, and — DeepSpeed's
  tutorial, ``docs/_tutorials/ds-sequence.md`` — not with Megatron's tensor or pipeline
  parallelism; DeepSpeed-MoE expert parallelism over the data-parallel ranks (ep divides dp);
  no FP8 recipe.
* ``deepspeed`` — DeepSpeed without Megatron: ZeRO stages 0–3 and its pipeline engine, no
  tensor or sequence parallelism, DeepSpeed-Ulysses (``deepspeed.sequence.layer.
  DistributedAttention``) as above, without a pipeline, or — ``cp_comm_type: allgather`` — the
  K/V all-gather of the ``ring-flash-attn`` package's llama3 variant that trainers run on
  DeepSpeed (OpenRLHF's ``--ring_attn_size``, ``--ring_head_stride``; axolotl's
  ``sequence_parallel_degree``), the exchange torchtitan's is; DeepSpeed-MoE as above; no FP8 recipe.
* ``fsdp`` — PyTorch FSDP (FSDP1 ``ShardingStrategy``: NO_SHARD = 0, SHARD_GRAD_OP = 2,
  FULL_SHARD = 3, HYBRID_SHARD = 3 sharded inside a node and replicated across; FSDP2
  ``fully_shard(reshard_after_forward=False)`` = 2, ``True`` = 3; no stage-1-only mode) with
  torchtitan's DTensor tensor parallelism (its TP always shards the norms' sequence: sequence
  parallelism), context parallelism (the K/V all-gather, ``allgather`` — torchtitan 0.3's only
  exchange, its ``context_parallel_rotate_method`` gone; Llama 3 §3.3.2 describes the same) or —
  ``cp_comm_type: a2a`` — the Ulysses all-to-all that FSDP trainers run beside it (verl's FSDP
  trainers: ``ulysses_sequence_parallel_size``, ``FSDPUlyssesShardingManager``; whole heads per
  rank, as for DeepSpeed-Ulysses),
  ``torch.distributed.pipelining`` (Interleaved1F1B: virtual
  stages; FSDP with a pipeline is supported: full sharding gathers once and reduces once a step,
  ``transformer.layer_cost.pipelined_fsdp``) and expert
  parallelism over dp·cp; FP8 through torchao float8 (tensorwise / rowwise scaling);
  ``recompute: selective`` is torchtitan's op-level selective activation checkpointing
  (``[activation_checkpoint] mode = "selective"``, ``selective_ac_option = "op"``,
  ``torchtitan/distributed/activation_checkpoint.py``): per decoder layer it saves the outputs of
  every other ``aten.mm``, of scaled-dot-product attention and of TP's reduce-scatters and
  recomputes the rest — unlike Megatron's selective recompute, which recomputes only the
  attention core.
* ``paddle`` — PaddlePaddle fleet ``hybrid_configs``: ``mp_degree`` (tensor, with
  ``sequence_parallel``), ``pp_degree`` with ``virtual_pp_degree`` (interleaved), ``sep_degree``
  (context: segment parallelism, the all-to-all of DeepSpeed-Ulysses — Paddle's
  ``ContextParallel(backend="all2all")`` docs), ``sharding_degree`` with stages 1–3 (stage 2/3 not with a pipeline), expert
  parallelism as fleet's ``EPHybridCommunicateGroup`` builds it (``ep_over_sharding``: every
  data-parallel rank a sharding rank, no segment parallelism, expert groups of ep consecutive
  ranks of sharding × mp, the experts unsplit); no FP8 recipe in fleet.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cost_model.schedule import interleaved_group_runs, leading_group, round_group, smallest_interleaved_group


@dataclass(frozen=True, kw_only=True)
class FrameworkRules:
    """What one framework can run.  ``zero_stages``: the sharding stages that exist;
    ``sharding_with_pipeline``: whether stage ≥ 2 may be combined with pp > 1;
    ``ep_folding``: expert parallelism may span tp·cp·dp (else it divides dp·cp);
    ``sharding_name``: what the framework calls each stage (for messages and docs)."""

    name: str
    #: what the framework is, for people (the page's hint, :func:`describe`)
    title: str
    tensor_parallel: bool
    sequence_parallel: bool
    context_parallel: bool
    pipeline_parallel: bool
    interleaved_pipeline: bool
    zero_stages: tuple[int, ...]
    sharding_with_pipeline: bool
    expert_parallel: bool
    ep_folding: bool
    fp8: bool
    sharding_name: Mapping[int, str]
    #: full recompute of only some layers of each model chunk (``recompute_num_layers``), and of
    #: groups of layers under one checkpoint (``recompute_method`` uniform): Megatron-Core's
    #: ``--recompute-method``
    block_recompute: bool = False
    #: where the framework is not Megatron-Core, its setting for a full recompute of only some of
    #: the layers (``recompute_num_layers`` N of the L; which N does not change the cost: every
    #: layer is alike), without a pipeline, and why not with one; empty where it has none.
    #: Estimated and pinned only — the search offers partial recompute only under
    #: ``block_recompute`` — and written by the framework's own trainer (the launch notes name it)
    partial_recompute: str = ""
    #: runs DeepSpeed's engine: its ZeRO optimizer's gradient buffers, its stage-3 hooks and
    #: tensor-list gathers, its pipeline engine — the cost terms and fitted constants of
    #: ``cost_model.transformer.calibration`` named ``*.megatron-deepspeed``
    deepspeed_engine: bool = False
    #: the context-parallel exchanges it has (``training.cp_comm_type``), its default first
    cp_exchanges: tuple[str, ...] = ("p2p", "allgather", "a2a", "a2a+p2p")
    #: whether context parallelism combines with tensor / pipeline parallelism
    cp_with_tp: bool = True
    cp_with_pp: bool = True
    #: what ``recompute: selective`` means: ``attention-core`` — Megatron's selective recompute
    #: (Korthikanti et al. 2022 §4.2: the attention core alone; with fused attention see
    #: ``checkpoints_fused_attention``);
    #: ``op-level`` — torchtitan's op-level selective checkpointing (every other matmul output
    #: and the attention output saved, everything else recomputed)
    selective_recompute: str = "attention-core"
    #: its attention-core selective recompute checkpoints the core whichever kernel runs it, a
    #: fused one included — Megatron-Core's ``Attention.forward`` takes
    #: ``_checkpointed_attention_forward`` whenever ``checkpoint_core_attention`` (so a
    #: FlashAttention/cuDNN forward runs again in backward, and the kernel's saved output is not
    #: kept) — and PaddleNLP's ``recompute_granularity: core_attn``, whose attention modules wrap
    #: their attention function, the flash one included, in ``recompute`` (``LlamaAttention``:
    #: ``recompute(self.attn_func, ...)``); else only an unfused core is checkpointed (legacy
    #: Megatron's ``ParallelAttention``, which Megatron-DeepSpeed keeps, runs its flash path
    #: outside the checkpoint)
    checkpoints_fused_attention: bool = False
    #: its tensor parallelism takes more ranks than key/value heads, replicating each head over
    #: tp/g ranks (tp a multiple of the g heads): PaddleNLP's attention selects each rank's heads
    #: by ``kv_indices`` when ``tensor_parallel_degree`` exceeds ``num_key_value_heads``
    replicates_kv_heads: bool = False
    #: why tp must divide the key/value heads where it does not replicate them (the refusal's reason)
    kv_head_split: str = ""
    #: its setting for the interleaved schedule's micro-batch group per virtual stage, where it has
    #: one (Megatron-Core's ``--microbatch-group-size-per-virtual-pipeline-stage``, pp by default);
    #: :func:`interleaved_microbatches_violation` names it
    interleaved_microbatch_group: str = ""
    #: its interleaved schedule runs the m micro-batches in max(1, m // pp) rounds of m/rounds,
    #: which must divide m (PyTorch's ``ScheduleInterleaved1F1B``: the schedule named here);
    #: empty: whole groups of pp, or the setting above (:func:`cost_model.schedule.round_group`)
    interleaved_rounds: str = ""
    #: its interleaved schedule runs a first group of m mod pp + pp micro-batches, then groups of pp,
    #: from m ≥ 2·pp, and every forward first at m = pp (Paddle's: the schedules named here;
    #: :func:`cost_model.schedule.leading_group`)
    interleaved_leading_group: str = ""
    #: whose FP8 linear layers it runs (``transformer-engine``, ``torchao``; empty: no FP8): what a
    #: layer saves of its input for the weight gradient follows (``layer_cost.saved_gemm_input_bytes``)
    fp8_linear: str = ""
    #: the sharding stages at which the ZeRO state may shard over only part of the data-parallel
    #: ranks and replicate across the rest (``dp_shard`` < dp: HSDP), and what the framework
    #: calls it
    partial_sharding_stages: tuple[int, ...] = ()
    partial_sharding_name: str = ""
    #: a sharding stage ≥ 2 over a sharding group of one rank runs as no sharding: Paddle's
    #: ``group_sharded_parallel`` refuses such a group ("Training must be distributed, ranks must
    #: be greater than 1") and PaddleNLP's Trainer, which its configs run under, drops the stage
    #: first ("sharding_parallel_degree=1 means no sharding, please set sharding to empty!",
    #: ``sharding`` cleared): :func:`effective_zero_stage`
    drops_one_rank_sharding: bool = False
    #: the fewest pipeline stages its interleaved schedule runs (Paddle's: more than two,
    #: :func:`interleaved_schedule_violation`)
    min_interleaved_pp: int = 2
    #: Megatron-Core's expert-parallel all-to-all overlap (``training.moe_comm_overlap``) and its
    #: layout rules (:func:`moe_overlap_layout_violation`)
    moe_comm_overlap: bool = False
    #: expert parallelism exists only over a sharding group of every data-parallel rank, with its
    #: expert groups carved from sharding × tp and the experts unsplit: Paddle fleet's
    #: ``EPHybridCommunicateGroup`` (:func:`expert_layout_violation`)
    ep_over_sharding: bool = False
    #: with ep > 1 the experts run whole on their EP ranks (ETP 1), the EP groups taking in the
    #: tensor-parallel ranks: why, in the framework's terms (:func:`required_expert_tensor_parallel`);
    #: empty where the experts follow tp (or Megatron-Core's ``--expert-tensor-parallel-size``)
    unsplit_experts_under_ep: str = ""
    #: with a pipeline, whether its sharding keeps the gradients sharded through the step's
    #: micro-batches (each micro-batch's reduce-scatter).  torchtitan's
    #: ``torch.distributed.pipelining`` turns FSDP's gradient sync off until the stage's last
    #: backward, so there full sharding is costed as it then runs
    #: (``cost_model.transformer.layer_cost.pipelined_fsdp``) and ZeRO 2 — the Llama 3 paper's
    #: layout — is not proposed by the search (a pin is costed with
    #: :func:`pipeline_gradient_sharding_note`'s warning, which its launch repeats)
    sharded_gradients_in_pipeline: bool = True
    #: whether each backward reduces its gradients (and reshards its weights) in per-unit
    #: post-backward hooks unless a pipeline schedule turns them off: FSDP2 under torchtitan,
    #: whose trainer keeps gradient sync on through gradient accumulation
    #: (``Trainer.train_step``; only ``torch.distributed.pipelining`` calls
    #: ``set_requires_gradient_sync(False)``).  Elsewhere the gradients accumulate locally and
    #: the step reduces them once (Megatron-Core, DeepSpeed's engine, Paddle's sharding).
    #: Read by ``transformer.layer_cost``'s per-micro-batch sync rules.
    reduces_every_backward: bool = False
    #: pure 16-bit training without an fp32 master copy (``training.master_weights`` false), in
    #: the framework's terms; empty where it has none
    pure_bf16: str = ""
    #: the gradients live in one buffer allocated once for the run (Megatron-Core's
    #: ``_ParamAndGradBuffer``: ``main_grad`` views into a contiguous ``grad_data``), so the
    #: caching allocator's fragmentation does not touch them, as it does not the resident weights
    #: and optimizer state (``cost_model.transformer.layer_cost.fragmentation_fraction``); elsewhere
    #: ``.grad`` tensors are allocated and freed every step (DeepSpeed's, FSDP's sharded ones)
    persistent_grad_buffer: bool = False
    #: its setting that overlaps tensor-parallel collectives with the GEMMs they feed
    #: (``training.tp_comm_overlap``); empty: none
    tp_comm_overlap: str = ""
    #: the optimizer-precision settings it has (``training.OPTIMIZER_DTYPES`` and
    #: ``precision_aware_optimizer``), each with its own spelling for messages: Megatron-Core
    #: all of them, Paddle the gradients' dtype (AMP O2's ``master_grad``)
    optimizer_precision: Mapping[str, str] = field(default_factory=dict)
    #: its optimizer offload (``training.optimizer_offload_fraction``), in its own terms; empty:
    #: none the cost model prices (:data:`UNPRICED_OFFLOAD` says what the framework has instead)
    optimizer_offload: str = ""
    #: the sharding stages its optimizer offload runs at, and those where a fraction below 1 may
    #: be offloaded (DeepSpeed: ``offload_optimizer.ratio``, "only valid with ZeRO Stage 3")
    offload_stages: tuple[int, ...] = ()
    partial_offload_stages: tuple[int, ...] = ()
    #: its offload moves gradients and parameters in the pieces the host updates, overlapping
    #: the copies with the host's update (Megatron-Core's ``--overlap-cpu-optimizer-d2h-h2d``,
    #: which its launch writes); else the update runs and then the parameters are copied back,
    #: the gradients having been copied out during backward (DeepSpeed's ZeRO-Offload)
    offload_pipelined: bool = False
    #: its offload keeps the state on the host between updates and copies each tensor's to the
    #: GPU for its update and back (PaddleNLP's ``tensorwise_offload_optimizer``); else the host
    #: runs the update (DeepSpeed's CPU Adam, Megatron-Core's hybrid optimizer)
    offload_updates_on_gpu: bool = False
    #: its CPU offload of the sharded parameters, gradients and optimizer state
    #: (``training.cpu_offload``), in its own terms; empty: none
    cpu_offload: str = ""
    #: the 8-bit AdamW its trainers run (``training.optimizer`` ``adamw_8bit``), in their own
    #: terms; empty: none
    eight_bit_adam: str = ""
    #: how that 8-bit AdamW steps an offloaded state on the host, in its own terms; empty: it does not
    eight_bit_adam_offload: str = ""
    #: its Muon optimizer (``training.optimizer`` ``muon``: Newton-Schulz-orthogonalised momentum
    #: for the hidden matrices, Adam for the rest; :mod:`cost_model.transformer.muon`), in its own
    #: terms; empty: none the cost model prices
    muon: str = ""
    #: its offload of the saved activations to the host (``training.activation_offloading``), in
    #: its trainers' own terms; empty: none the cost model prices
    activation_offloading: str = ""
    #: the recompute settings its activation offload runs under (PaddleNLP's offloads the full
    #: recompute's checkpointed inputs), and whether it runs inside a pipeline
    activation_offloading_recompute: tuple[str, ...] = ("none", "selective", "full")
    activation_offloading_with_pipeline: bool = False
    #: the modules its activation offload is told to offload, Megatron-Core's ``--offload-modules``
    #: (``training.offload_modules``, which it needs); empty: it offloads every saved tensor
    offload_modules: tuple[str, ...] = ()
    #: which submodules its selective recompute may recompute, Megatron-Core's
    #: ``--recompute-modules`` (``Strategy.recompute_modules``; empty: only its fixed selective scope)
    recompute_modules: tuple[str, ...] = ()
    #: its setting that takes those modules, where it takes one of them only (PaddleNLP's
    #: ``recompute_granularity``); empty: any set of them (Megatron-Core's list)
    one_recompute_module: str = ""
    #: its gradient accumulation around whole pipeline schedules (``training.
    #: pipeline_schedules_per_step``: each schedule fills and drains the pipeline), in its own
    #: terms; empty: a step's micro-batches run in one schedule
    pipeline_schedules: str = ""
    #: its trainers' checkpointing of each decoder layer's attention, MLP and norms as separate
    #: submodules under full recompute (``training.submodule_checkpointing``), in their own
    #: terms; empty: its full recompute checkpoints whole layers only
    submodule_checkpointing: str = ""
    #: its optimizer step inside the backward, each parameter's as soon as its gradient is
    #: reduced (``training.optimizer_in_backward``), in its trainers' own terms; empty: none
    optimizer_in_backward: str = ""
    #: its trainers' frozen reference model beside the trained one (``training.reference_model``:
    #: DPO's reference policy), in their own terms; empty: none the cost model prices
    reference_model: str = ""
    #: its LoRA finetuning (``training.lora_rank``), in its trainers' own terms; empty: none
    lora: str = ""
    #: its QLoRA: LoRA over a 4-bit NF4 base (``training.lora_base_dtype`` ``nf4``); empty: none
    qlora: str = ""
    #: the loss kernels its trainers run that never hold the whole logits
    #: (``training.loss_kernel``: :data:`LOSS_KERNELS`), each in their own terms
    loss_kernels: tuple[tuple[str, str], ...] = ()
    #: its LoRA puts one adapter on each fused projection (Megatron-Bridge's ``linear_qkv`` and
    #: gated ``linear_fc1``); else one per projection (PEFT's ``q_proj``, ``k_proj``, ``v_proj``,
    #: ``gate_proj``, ``up_proj``; torchtitan's ``wq``, ``wk``, ``wv``, ``w1``, ``w3``)
    lora_fused_projections: bool = False
    #: its way to all-gather the weights in FP8 (``training.fp8_param_gather``), in its own terms;
    #: empty: none.  Where its FP8 linear layers are Transformer Engine's (``fp8_linear``), told
    #: which micro-batch is a step's first (``is_first_microbatch``), without FP8 weights each
    #: 16-bit weight is cast to FP8 once a step and the cast kept for the rest
    #: (``stage_cost.fp8_weight_cache_bytes_per_param``); torchao's casts as it goes
    fp8_param_gather: str = ""
    #: its MoE layers weight each routed token by the router's probability inside the experts'
    #: activation (Megatron-Core's ``activation_func_with_probs``), so the combine keeps no
    #: expert output for the probabilities' gradient (``moe.moe_activation_bytes``)
    moe_probs_in_experts: bool = False


#: Megatron-Core's ``TransformerConfig.recompute_modules`` choices (``--recompute-modules``, with
#: ``--recompute-granularity selective``; default ``core_attn``): the attention core, the MoE
#: experts' activation function, the separate layer norms, MLA's up-projections and RoPE — these
#: three "output-discarding" (the output freed once consumed, recomputed before backward) —,
#: the dense MLP, the whole MoE layer and its shared experts (normal checkpointing: the
#: submodule's input kept, its insides recomputed).
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")

#: PaddleNLP's ``recompute_granularity`` under ``recompute: true``, as ``recompute: selective``
#: with one module: ``core_attn`` (its default scope here: the attention function, the flash one
#: included) or ``full_attn`` — the whole self-attention module, which its decoder layers wrap in
#: ``recompute(self.self_attn, ...)`` (``LlamaDecoderLayer.forward`` and its Qwen, Mixtral and
#: DeepSeek siblings): the Q/K/V and output projections, RoPE and the attention core run again
#: in backward with their tensor-parallel collectives, and only the module's input — the normed
#: hidden state — is kept of the attention.  Its third granularity, ``full``, is ``recompute: full``.
PADDLE_RECOMPUTE_MODULES = ("core_attn", "full_attn")

#: Every recompute module a framework names, in one order (Megatron-Core's, then Paddle's own):
#: the bitmask order of :func:`cost_model.transformer.layer_cost.recompute_modules_mask`.
ALL_RECOMPUTE_MODULES = (*RECOMPUTE_MODULES, "full_attn")


#: Megatron-Core's fine-grained activation offloading modules (``--offload-modules``; Megatron-Core
#: ``TransformerConfig``'s allowed set): the attention's input norm, the QKV projection's input, the
#: attention core's Q, K and V, the output projection's input, the MLP's pre-norm, the experts'
#: FC1 input and their activation function's input — each module's saved tensors offloaded to
#: the host after its forward and reloaded before its backward.
OFFLOAD_MODULES = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act")


#: The decoder's linear layers LoRA adapts (``training.lora_target_modules``), in Megatron-Core's
#: names (Megatron-Bridge's ``LoRA.target_modules``): the attention's input projection
#: (``linear_qkv``; PEFT's ``q_proj``, ``k_proj``, ``v_proj``), its output projection
#: (``linear_proj``; ``o_proj``), the MLP's first layer (``linear_fc1``; ``gate_proj`` and
#: ``up_proj``) and its second (``linear_fc2``; ``down_proj``).  All four is PEFT's
#: ``"all-linear"`` and LLaMA-Factory's ``lora_target: all``, and the default.
LORA_MODULES = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")


def declared_order(modules: Sequence[str], declared: tuple[str, ...]) -> tuple[str, ...]:
    """One spelling of a module set: in ``declared`` order, names that are not modules after
    them, as given (for a violation check to name)."""
    return tuple(m for m in declared if m in modules) + tuple(m for m in modules if m not in declared)


def canonical_recompute_modules(modules: tuple[str, ...]) -> tuple[str, ...]:
    """One spelling of a recompute module set (:func:`declared_order` over
    :data:`ALL_RECOMPUTE_MODULES`), and empty for the default (the attention core alone)."""
    ordered = declared_order(modules, ALL_RECOMPUTE_MODULES)
    return () if ordered == ("core_attn",) else ordered


def recompute_modules_violation(framework: str, modules: tuple[str, ...] | None) -> str | None:
    """Reason when ``recompute_modules`` is given to a framework without that setting or names
    a module it does not have, else None."""
    if not modules:
        return None
    rules = rules_for(framework)
    have = rules.recompute_modules
    if not have:
        return (f"{framework}: no recompute_modules setting (it is Megatron-Core's --recompute-modules and PaddleNLP's "
                "recompute_granularity); its selective recompute is fixed — leave it out")
    unknown = [m for m in modules if m not in have]
    if unknown:
        return f"{unknown[0]!r} is not one of {framework}'s recompute modules: {', '.join(have)}"
    if rules.one_recompute_module and len(modules) > 1:
        return f"{framework}: recompute_modules is {rules.one_recompute_module}, which takes one of {', '.join(have)}: give one"
    return None


#: Megatron-Core's flag for each optimizer-precision field (``training.OPTIMIZER_DTYPES``).
OPTIMIZER_PRECISION_FLAGS = {"precision_aware_optimizer": "--use-precision-aware-optimizer", "main_grads_dtype": "--main-grads-dtype",
                             "main_params_dtype": "--main-params-dtype", "exp_avg_dtype": "--exp-avg-dtype",
                             "exp_avg_sq_dtype": "--exp-avg-sq-dtype"}


#: The optimizers with Adam's two moments in fp32 (``training.OPTIMIZERS``): AdamW differs in its update only.
ADAM_OPTIMIZERS = ("adam", "adamw")
#: AdamW with its two moments quantised blockwise to 8 bits (Dettmers et al. 2022, "8-bit
#: Optimizers via Block-wise Quantization"): bitsandbytes' ``AdamW8bit`` / ``PagedAdamW8bit`` and
#: torchao's ``AdamW8bit`` (Hugging Face ``optim`` ``adamw_bnb_8bit``, ``adamw_8bit``,
#: ``paged_adamw_8bit``, ``adamw_torch_8bit``).
EIGHT_BIT_ADAM = "adamw_8bit"


#: Why the DeepSpeed frameworks shard only over every dp rank: its partial ZeRO-3 (MiCS) is gone.
DEEPSPEED_NO_MICS = ("MiCS, DeepSpeed's ZeRO-3 over part of the dp ranks, was removed (deepspeedai/DeepSpeed issue 8489; "
                     "DeepSpeed 0.19 refuses zero_optimization.mics_shard_size)")


#: Megatron's attention (Megatron-Core's and the legacy one Megatron-DeepSpeed runs) takes each
#: rank's share of the key/value heads as ``divide(num_query_groups, tp)``, which asserts that tp
#: divides them.
MEGATRON_KV_SPLIT = "Megatron's attention divides the query groups over the ranks: divide(num_query_groups, tp)"


RULES: dict[str, FrameworkRules] = {
    "megatron-core": FrameworkRules(
        name="megatron-core", title="Megatron-Core with Transformer Engine", tensor_parallel=True, sequence_parallel=True, context_parallel=True, pipeline_parallel=True,
        interleaved_pipeline=True, zero_stages=(0, 1, 2, 3), sharding_with_pipeline=False, expert_parallel=True,
        ep_folding=True, fp8=True, block_recompute=True, moe_comm_overlap=True, recompute_modules=RECOMPUTE_MODULES,
        kv_head_split=MEGATRON_KV_SPLIT, interleaved_microbatch_group="--microbatch-group-size-per-virtual-pipeline-stage",
        persistent_grad_buffer=True,
        tp_comm_overlap="--tp-comm-overlap (Transformer Engine's userbuffers)",
        optimizer_offload="Megatron-Core's hybrid optimizer (--optimizer-cpu-offload --optimizer-offload-fraction)",
        offload_stages=(1,), partial_offload_stages=(1,), offload_pipelined=True,
        activation_offloading=("Megatron-Core's fine-grained activation offloading (--fine-grained-activation-offloading "
                               "--offload-modules: the chosen modules' saved inputs in host memory)"),
        activation_offloading_recompute=("none", "selective"), activation_offloading_with_pipeline=True, offload_modules=OFFLOAD_MODULES,
        optimizer_precision={k: f"Megatron-Core's {flag}" for k, flag in OPTIMIZER_PRECISION_FLAGS.items()},
        partial_sharding_stages=(1,), partial_sharding_name="--num-distributed-optimizer-instances (partial distributed optimizer)",
        lora="Megatron-Bridge's LoRA (peft=LoRA(target_modules, dim, dropout); one adapter on each fused linear_qkv and linear_fc1)",
        lora_fused_projections=True,
        fp8_param_gather="--fp8-param-gather",
        muon=("TensorParallelMuon, --optimizer muon or, with its layer-wise distributed optimizer, dist_muon: five "
              "Newton-Schulz iterations on each tensor-parallel shard, --muon-scalar-optimizer adam for the embedding and head"),
        moe_probs_in_experts=True,
        checkpoints_fused_attention=True,
        fp8_linear="transformer-engine",
        loss_kernels=(("te", "Transformer Engine's parallel cross-entropy (--cross-entropy-loss-fusion --cross-entropy-fusion-impl te)"),),
        sharding_name={0: "DDP", 1: "distributed optimizer", 2: "Megatron-FSDP optim_grads", 3: "Megatron-FSDP optim_grads_params"},
    ),
    "megatron-deepspeed": FrameworkRules(
        name="megatron-deepspeed", title="Megatron's TP/SP inside DeepSpeed's engine", tensor_parallel=True, sequence_parallel=True, context_parallel=True, pipeline_parallel=True,
        interleaved_pipeline=False, zero_stages=(0, 1, 2, 3), sharding_with_pipeline=False, expert_parallel=True,
        ep_folding=False, fp8=False, deepspeed_engine=True, cp_exchanges=("a2a",), cp_with_tp=False, cp_with_pp=False,
        kv_head_split=MEGATRON_KV_SPLIT,
        optimizer_offload="DeepSpeed's ZeRO-Offload (zero_optimization.offload_optimizer, device cpu)",
        offload_stages=(1, 2, 3), partial_offload_stages=(3,),
        cpu_offload="DeepSpeed's ZeRO-3 Offload (zero_optimization.offload_param and offload_optimizer, device cpu)",
        partial_sharding_name=DEEPSPEED_NO_MICS,
        sharding_name={0: "no ZeRO", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"},
    ),
    "deepspeed": FrameworkRules(
        name="deepspeed", title="DeepSpeed alone", tensor_parallel=False, sequence_parallel=False, context_parallel=True, pipeline_parallel=True,
        interleaved_pipeline=False, zero_stages=(0, 1, 2, 3), sharding_with_pipeline=False, expert_parallel=True,
        ep_folding=False, fp8=False, deepspeed_engine=True, cp_exchanges=("a2a", "allgather", "p2p"), cp_with_pp=False,
        optimizer_offload="DeepSpeed's ZeRO-Offload (zero_optimization.offload_optimizer, device cpu)",
        offload_stages=(1, 2, 3), partial_offload_stages=(3,),
        cpu_offload="DeepSpeed's ZeRO-3 Offload (zero_optimization.offload_param and offload_optimizer, device cpu)",
        activation_offloading=("TRL's activation_offloading on DeepSpeed, DeepSpeed's activation_checkpointing.cpu_checkpointing "
                               "under full recompute"),
        eight_bit_adam=("bitsandbytes' or torchao's AdamW8bit as the client optimizer (Hugging Face optim adamw_bnb_8bit, "
                        "paged_adamw_8bit, adamw_torch_8bit), with zero_allow_untested_optimizer"),
        reference_model=("TRL's DPOTrainer ref_model under DeepSpeed (ZeRO-3 sharded like the policy, else replicated), "
                         "OpenRLHF's DPO reference model"),
        eight_bit_adam_offload=("torchao's AdamW8bit as the client optimizer with zero_force_ds_cpu_optimizer: false (the "
                                "8-bit AdamW steps the offloaded fp32 partition on the host: axolotl's ALST examples)"),
        lora="Hugging Face PEFT's LoraConfig (r, target_modules, lora_dropout) on DeepSpeed (TRL, LLaMA-Factory, axolotl)",
        qlora="bitsandbytes' 4-bit NF4 base (BitsAndBytesConfig load_in_4bit, bnb_4bit_quant_type nf4, double quantisation)",
        loss_kernels=(("liger", "Liger Kernel's fused linear cross-entropy (use_liger_kernel, LLaMA-Factory's enable_liger_kernel, axolotl's liger plugin)"), ("cce", "Apple's Cut Cross-Entropy (axolotl's CutCrossEntropyPlugin, cut_cross_entropy)")),
        partial_sharding_name=DEEPSPEED_NO_MICS,
        sharding_name={0: "no ZeRO", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"},
    ),
    "fsdp": FrameworkRules(
        name="fsdp", title="PyTorch FSDP / torchtitan", tensor_parallel=True, sequence_parallel=True, context_parallel=True, pipeline_parallel=True,
        interleaved_pipeline=True, zero_stages=(0, 2, 3), sharding_with_pipeline=True, expert_parallel=True,
        kv_head_split="torchtitan splits them, never replicates: 'tensor_parallel_degree must divide n_kv_heads'",
        ep_folding=True, fp8=True, fp8_linear="torchao",
        fp8_param_gather=("torchao float8's enable_fsdp_float8_all_gather (torchtitan's float8.enable_fsdp_float8_all_gather with "
                          "precompute_float8_dynamic_scale_for_fsdp: FSDP2 all-gathers the linear weights in FP8, tensorwise scaling)"),
        selective_recompute="op-level", cp_exchanges=("allgather", "a2a"), sharded_gradients_in_pipeline=False,
        interleaved_rounds="torchtitan's Interleaved1F1B (torch.distributed.pipelining.ScheduleInterleaved1F1B)",
        unsplit_experts_under_ep=("torchtitan's sparse mesh (dp_replicate, efsdp, ep) folds ep over dp_shard·cp·tp, each expert "
                                  "whole on its EP rank (Shard(0) on the expert dimension)"),
        reduces_every_backward=True,
        partial_recompute=("fms-fsdp's selective_checkpointing p, the fraction of the blocks checkpointed, evenly spaced "
                           "(policies/ac_handler.py apply_fsdp_checkpointing; p = N/L for N of L layers), which has no "
                           "pipeline; torchtitan 0.3's activation checkpointing is full, op-level selective or a memory budget, "
                           "none of them by layer"),
        pure_bf16="torchtitan's training.dtype = \"bfloat16\" (torchtune's default; a Hugging Face model loaded in bf16)",
        cpu_offload="FSDP2's CPUOffloadPolicy (torchtitan's training.enable_cpu_offload)",
        pipeline_schedules=("torchtitan's and NeMo Automodel's gradient accumulation with a pipeline: "
                            "global_batch_size / (local_batch_size × dp) schedules a step, each over local_batch_size / "
                            "pipeline_parallel_microbatch_size micro-batches"),
        submodule_checkpointing=("NeMo-RL's DTensor policy and NeMo Automodel's sub-module activation checkpointing "
                                 "(apply_submodule_checkpointing, where a model has no checkpointing layers of its own): "
                                 "checkpoint_wrapper on each layer's self_attn, mlp, input_layernorm and post_attention_layernorm"),
        activation_offloading="torchtune's enable_activation_offloading, TRL's activation_offloading, verl's enable_activation_offload",
        reference_model=("TRL's DPOTrainer ref_model (FSDP-wrapped like the policy), torchtune's full_dpo_distributed, "
                         "open-instruct's DPO"),
        optimizer_in_backward=("torchtune's optimizer_in_bwd, torchtitan's optimizer.early_step_in_backward (before 0.3): "
                               "the step in a post-accumulate-grad hook of each parameter"),
        eight_bit_adam=("bitsandbytes' AdamW8bit / PagedAdamW8bit or torchao's AdamW8bit (Hugging Face optim adamw_bnb_8bit, "
                        "paged_adamw_8bit, adamw_torch_8bit; torchtune's bitsandbytes.optim.PagedAdamW8bit)"),
        tp_comm_overlap="torchtitan's async tensor parallelism (compile.enable_async_tensor_parallel, under torch.compile)",
        lora=("Hugging Face PEFT's LoraConfig on FSDP (TRL, LLaMA-Factory, axolotl), torchtune's LoRA recipes, "
              "torchtitan's LoRAConverter"),
        qlora=("bitsandbytes' 4-bit NF4 base with bnb_4bit_quant_storage for FSDP-QLoRA; torchtune's QLoRA recipes "
               "(torchao's NF4Tensor)"),
        loss_kernels=(("chunked", "torchtune's CEWithChunkedOutputLoss and LinearCrossEntropyLoss (its recipes' losses)"),
                      ("compiled", "torch.compile's cross-entropy (torchtitan's compile.components with \"loss\", its default once compile is on)"), ("liger", "Liger Kernel's fused linear cross-entropy (use_liger_kernel, LLaMA-Factory's enable_liger_kernel, axolotl's liger plugin)"), ("cce", "Apple's Cut Cross-Entropy (axolotl's CutCrossEntropyPlugin, cut_cross_entropy)")),
        partial_sharding_stages=(2, 3), partial_sharding_name="HSDP (HYBRID_SHARD; FSDP2 replicate × shard mesh)",
        sharding_name={0: "NO_SHARD", 2: "SHARD_GRAD_OP", 3: "FULL_SHARD / HYBRID_SHARD"},
    ),
    "paddle": FrameworkRules(
        name="paddle", title="PaddlePaddle fleet", tensor_parallel=True, sequence_parallel=True, context_parallel=True, pipeline_parallel=True,
        interleaved_pipeline=True, zero_stages=(0, 1, 2, 3), sharding_with_pipeline=False, expert_parallel=True,
        ep_folding=True, ep_over_sharding=True, unsplit_experts_under_ep="fleet's expert groups take in the tensor-parallel ranks",
        fp8=False, cp_exchanges=("a2a",), drops_one_rank_sharding=True, min_interleaved_pp=3,
        interleaved_leading_group="fleet's PipelineParallelWithInterleave (FthenB at accumulate_steps = pp)",
        partial_sharding_stages=(1, 2, 3), partial_sharding_name="sharding_degree × dp_degree",
        optimizer_precision={"main_grads_dtype": "Paddle's paddle.amp.decorate(master_grad=False)"},
        optimizer_offload=("PaddleNLP's tensorwise_offload_optimizer (the master weights and moments in pinned host memory, "
                           "each tensor's copied to the GPU for its update and back)"),
        offload_stages=(0, 1, 2), offload_updates_on_gpu=True,
        activation_offloading="PaddleNLP's recompute_offload (the full recompute's checkpointed inputs in host memory)",
        activation_offloading_recompute=("full",), activation_offloading_with_pipeline=True,
        lora="PaddleNLP's LoRA (lora: true, lora_rank; LoRAModel)", checkpoints_fused_attention=True,
        recompute_modules=PADDLE_RECOMPUTE_MODULES, one_recompute_module="PaddleNLP's recompute_granularity",
        partial_recompute=("PaddleNLP's no_recompute_layers under recompute_granularity full (the L − N layers it lists keep "
                           "their activations), which its pipeline models refuse ('for pp with full recompute, "
                           "no_recompute_layers is not support')"),
        replicates_kv_heads=True,
        reference_model="PaddleNLP's and ERNIEKit's DPO (reference_free false: a frozen reference model in the same parallel layout)",
        sharding_name={0: "no sharding", 1: "sharding stage1", 2: "sharding stage2", 3: "sharding stage3"},
    ),
}


#: The optimizer offload a framework has that the cost model does not price, and why.
UNPRICED_OFFLOAD = {
    "fsdp": ("FSDP's CPU offload moves the parameters and gradients to the host as well: state it as cpu_offload: true "
             "(CPUOffloadPolicy, torchtitan's training.enable_cpu_offload)"),
}


BLOCK_RECOMPUTE_MISSING = (
    "{framework}: no partial (block) recompute — its full recompute recomputes every layer "
    "(recompute_num_layers needs megatron-core: --recompute-method block; or, without a pipeline, fsdp: fms-fsdp's "
    "selective_checkpointing, or paddle: PaddleNLP's no_recompute_layers)"
)
GROUPED_RECOMPUTE_MISSING = (
    "{framework}: no grouped recompute — its full recompute checkpoints every layer "
    "(recompute_method uniform with recompute_num_layers 2 or more needs megatron-core: --recompute-method uniform)"
)


def recompute_method_violation(framework: str, recompute_num_layers: int, recompute_method: str, pp: int = 1) -> tuple[str, str] | None:
    """(field, reason) when ``framework`` has no full recompute of the kind asked: block depths
    (``recompute_num_layers`` alone) or uniform groups of 2 or more layers
    (``recompute_method`` uniform), or its partial recompute (``FrameworkRules.partial_recompute``,
    a setting without a pipeline) with ``pp`` > 1; None otherwise."""
    rules = rules_for(framework)
    if not recompute_num_layers or rules.block_recompute:
        return None
    if recompute_method == "uniform":
        return "recompute_method", GROUPED_RECOMPUTE_MISSING.format(framework=framework)
    if rules.partial_recompute:
        if pp > 1:
            return "recompute_num_layers", f"{framework}: recompute_num_layers with pp={pp}: its partial recompute runs without a pipeline only — {rules.partial_recompute}"
        return None
    return "recompute_num_layers", BLOCK_RECOMPUTE_MISSING.format(framework=framework)


def rules_for(framework: str) -> FrameworkRules:
    """The rule table of ``framework`` (one of :data:`cost_model.training.FRAMEWORKS`)."""
    return RULES[framework]


def describe(framework: str) -> str:
    """One line, read off the rule table, of what ``framework`` can run (the page's hint under its
    framework select), so the description cannot drift from the rules the search applies."""
    r = rules_for(framework)
    tp = "tp with sequence parallel" if r.tensor_parallel and r.sequence_parallel else ("tp" if r.tensor_parallel else "no tp")
    cp_limits = [w for w, ok in (("tp", r.cp_with_tp), ("pp", r.cp_with_pp)) if not ok]
    cp = f"cp by {'/'.join(r.cp_exchanges)}" + (f" (not with {' or '.join(cp_limits)})" if cp_limits else "") if r.context_parallel else "no cp"
    pp = ("pp with interleaving (vpp)" if r.interleaved_pipeline else "pp without interleaving") if r.pipeline_parallel else "no pp"
    zero = "ZeRO " + ", ".join(f"{z} {r.sharding_name[z]}" for z in r.zero_stages)
    zero += " (2–3 also with pp)" if r.sharding_with_pipeline else " (2–3 without pp)"
    shard = (f"dp_shard at stage {'/'.join(str(z) for z in r.partial_sharding_stages)}: {r.partial_sharding_name}"
             if r.partial_sharding_stages else "no dp_shard")
    ep = ("ep over sharding × tp, experts unsplit" if r.ep_over_sharding else "ep folded into tp·cp·dp" if r.ep_folding
          else "ep over dp·cp") if r.expert_parallel else "no ep"
    extras = [x for x, ok in (("block recompute", r.block_recompute), ("partial recompute without pp", bool(r.partial_recompute))) if ok]
    extras.append("FP8" if r.fp8 else "no FP8")
    offloads = [x for x, ok in (("optimizer state", r.optimizer_offload), ("sharded state", r.cpu_offload),
                                ("activations", r.activation_offloading)) if ok]
    extras.append(f"host offload of the {', '.join(offloads)}" if offloads else "no host offload")
    if r.eight_bit_adam:
        extras.append("8-bit AdamW")
    if r.muon:
        extras.append("Muon")
    extras.append(("LoRA and QLoRA" if r.qlora else "LoRA") + (" (fused projections' adapters)" if r.lora_fused_projections else "")
                  if r.lora else "no LoRA")
    return f"{r.title}: " + "; ".join([tp, cp, pp, zero, shard, ep, *extras]) + "."


def runs_deepspeed_engine(framework: str) -> bool:
    """Whether ``framework`` trains under DeepSpeed's engine (``deepspeed``, ``megatron-deepspeed``)."""
    return rules_for(framework).deepspeed_engine


def ep_group_divisor(framework: str, *, tp: int, dp: int, cp: int) -> int:
    """The rank count that ``ep`` must divide: tp·cp·dp under MoE parallel folding
    (megatron-core), dp·cp elsewhere (experts spread over the data-parallel ranks)."""
    return tp * cp * dp if rules_for(framework).ep_folding else dp * cp



def layout_rule_violation(
    framework: str, *, tp: int, pp: int, vpp: int, cp: int, ep: int, dp: int, zero_stage: int, sequence_parallel: bool,
    recompute_num_layers: int = 0, dp_shard: int = 0, recompute_method: str = "",
) -> tuple[str, str] | None:
    """(strategy field, reason naming the rule) when ``framework`` cannot run the layout."""
    r = rules_for(framework)
    rule = recompute_method_violation(framework, recompute_num_layers, recompute_method, pp=pp)
    if rule is not None:
        return rule
    if tp > 1 and not r.tensor_parallel:
        return "tp", f"{framework}: no tensor parallelism (tp must be 1; use megatron-deepspeed for Megatron's TP under DeepSpeed)"
    if sequence_parallel and tp > 1 and not r.sequence_parallel:
        return "sequence_parallel", f"{framework}: no sequence parallelism"
    why = context_parallel_violation(framework, cp=cp, tp=tp, pp=pp)
    if why is not None:
        return "cp", why
    if pp > 1 and not r.pipeline_parallel:
        return "pp", f"{framework}: no pipeline parallelism"
    if vpp > 1 and not r.interleaved_pipeline:
        return "vpp", f"{framework}: its pipeline engine has no interleaved schedule (DeepSpeed PipelineModule runs plain 1F1B; vpp must be 1)"
    if zero_stage not in r.zero_stages:
        names = ", ".join(f"{z} ({r.sharding_name[z]})" for z in r.zero_stages)
        return "zero_stage", f"{framework}: no zero_stage {zero_stage}; its sharding stages are {names}"
    if zero_stage >= 2 and pp > 1 and not r.sharding_with_pipeline:
        return "zero_stage", (
            f"{framework}: zero_stage={zero_stage} with pp={pp}: gradient/parameter sharding conflicts with pipeline "
            "gradient accumulation (stage ≤ 1 with pipelines; FSDP with a pipeline does: framework fsdp)"
        )
    if ep > 1:
        if not r.expert_parallel:
            return "ep", f"{framework}: no expert parallelism"
        group = ep_group_divisor(framework, tp=tp, dp=dp, cp=cp)
        if group % ep:
            where = (f"tp·cp·dp = {tp}·{cp}·{dp} = {group} (MoE parallel folding: EP×ETP groups are carved from the "
                     "tensor, context and data-parallel ranks)") if r.ep_folding else (
                     f"dp·cp = {dp}·{cp} = {group} (experts are spread over the data-parallel ranks)")
            return "ep", f"ep={ep} must divide {where}"
    expert_why = expert_layout_violation(framework, tp=tp, cp=cp, ep=ep, zero_stage=zero_stage, dp=dp, dp_shard=dp_shard)
    if expert_why is not None:
        return expert_why
    shard_why = partial_sharding_violation(framework, dp=dp, dp_shard=dp_shard, zero_stage=zero_stage)
    if shard_why is not None:
        return "dp_shard", shard_why
    why = interleaved_schedule_violation(framework, pp=pp, vpp=vpp)
    if why is not None:
        return "vpp", why
    return None


#: The frameworks some whole-layout start-up rule concerns beyond the rule table's own
#: (:func:`torchtitan_layout_violation`, :func:`cp_sequence_violation` with tp — torchtitan's
#: both): the search checks its rows against them only there; the table's own rules
#: (``min_interleaved_pp``, ``drops_one_rank_sharding``) it applies to every row's columns.
#: :func:`layout_rule_violation` checks the layout as it runs: its callers pass the
#: :func:`effective_zero_stage`.
WHOLE_LAYOUT_RULE_FRAMEWORKS = frozenset({"fsdp"})


def interleaved_schedule_violation(framework: str, *, pp: int, vpp: int) -> str | None:
    """Reason when the framework's interleaved schedule cannot run ``vpp`` chunks over ``pp``
    stages (its rule table's ``min_interleaved_pp``), else None: Paddle's needs more than two
    stages (``PipelineParallelWithInterleave`` and its FthenB variant: "virtual pipeline must run
    under pp degree > 2")."""
    least = rules_for(framework).min_interleaved_pp
    if vpp > 1 and pp < least:
        return f"{framework}: its interleaved schedule needs pp > {least - 1}; vpp must be 1"
    return None


def interleaved_microbatches_run(framework: str, num_microbatches: Any, pp: Any, group: int = 0) -> np.ndarray:
    """Whether the framework's interleaved schedule over ``pp`` stages runs ``num_microbatches``
    micro-batches a step, elementwise (a framework without a rule of its own: whole groups of pp).
    Megatron-Core takes them in groups of N per virtual stage (``FrameworkRules.
    interleaved_microbatch_group``; ``training.microbatch_group_size_per_vp_stage``, ``group``; 0:
    pp where that runs, else the smallest that does, :func:`interleaved_microbatch_groups`): N in
    [pp, m] leaving a last group of 0 or at least pp (:func:`cost_model.schedule.
    interleaved_group_runs`) — any m ≥ pp runs with some N.  torchtitan's Interleaved1F1B
    (``FrameworkRules.interleaved_rounds``) runs them in max(1, m // pp) rounds that must divide m
    (:func:`cost_model.schedule.round_group`; fewer than pp it runs with dependency bubbles, which
    are not priced).  Paddle's (``FrameworkRules.interleaved_leading_group``) takes m ≥ 2·pp, its
    first group m mod pp + pp, or m = pp (:func:`cost_model.schedule.leading_group`)."""
    m, p = np.asarray(num_microbatches, dtype=np.int64), np.asarray(pp, dtype=np.int64)
    rules = rules_for(framework)
    if rules.interleaved_microbatch_group:
        return np.asarray(interleaved_group_runs(m, p, group) if group else m >= p)
    if rules.interleaved_rounds:
        return np.asarray(round_group(m, p) > 0)
    if rules.interleaved_leading_group:
        return np.asarray(leading_group(m, p) > 0)
    return np.asarray(m % np.maximum(p, 1) == 0)


def interleaved_microbatches_violation(framework: str, *, num_microbatches: int, pp: int, group: int = 0) -> tuple[str, str] | None:
    """(field, reason) where :func:`interleaved_microbatches_run` says the schedule cannot take
    the micro-batches, else None: the field is ``vpp``, or ``microbatch_group_size_per_vp_stage``
    for a group asked for that cannot run."""
    if interleaved_microbatches_run(framework, num_microbatches, pp, group):
        return None
    rules = rules_for(framework)
    m = num_microbatches
    if rules.interleaved_microbatch_group and group:
        why = (f"must be from pp={pp} to the {m} micro-batches a step" if not pp <= group <= m
               else f"leaves a last group of {m % group} micro-batches, fewer than pp={pp} (it must leave 0 or at least pp)")
        return "microbatch_group_size_per_vp_stage", f"{framework}: micro-batch group {group} ({rules.interleaved_microbatch_group}) {why}"
    if rules.interleaved_microbatch_group:
        return "vpp", f"the interleaved schedule needs at least pp={pp} micro-batches a step, got {m}"
    if rules.interleaved_leading_group:
        return "vpp", (f"{framework}: {rules.interleaved_leading_group} needs at least 2·pp={2 * pp} micro-batches a step "
                       f"(accumulate_steps), or exactly pp={pp}; got {m}")
    if rules.interleaved_rounds:
        why = (f"runs {m} micro-batches, fewer than pp={pp}, in one round with dependency bubbles the cost model does not price" if m < pp
               else f"needs the {m} micro-batches to be a multiple of its {m // pp} rounds (max(1, m // pp))")
        return "vpp", f"{framework}: {rules.interleaved_rounds}: {why}"
    return "vpp", f"the interleaved schedule needs the {m} micro-batches to be a multiple of pp={pp}"


def _over_pairs(fn: Any, num_microbatches: np.ndarray, pp: np.ndarray) -> np.ndarray:
    """``fn(m, pp)`` elementwise over two 1-D integer arrays, each distinct pair asked once
    (pp < 2**20: a pipeline stage per GPU of the largest clusters fits many times over)."""
    keys, index = np.unique(num_microbatches * (1 << 20) + pp, return_inverse=True)
    values = np.array([fn(int(k >> 20), int(k & ((1 << 20) - 1))) for k in keys], dtype=np.int64)
    return values[np.asarray(index).ravel()]


def interleaved_microbatch_groups(framework: str, num_microbatches: Any, pp: Any, group: int = 0) -> np.ndarray:
    """The micro-batch group per virtual stage the framework's interleaved schedule runs
    (:mod:`cost_model.schedule`), elementwise: the ``group`` asked for; else pp — Megatron-Core's
    default, torchtitan's round where pp divides m, and Paddle's only group — or, where pp does
    not divide the ``num_microbatches``, Megatron-Core's smallest group that can take them
    (:func:`cost_model.schedule.smallest_interleaved_group`), which its launch writes and which
    holds the fewest activations of those that run, torchtitan's round
    (:func:`cost_model.schedule.round_group`) or Paddle's first group
    (:func:`cost_model.schedule.leading_group`).  Counts the schedule does not run
    (:func:`interleaved_microbatches_run`) get pp."""
    m, p = np.broadcast_arrays(np.asarray(num_microbatches).astype(np.int64), np.asarray(pp).astype(np.int64))
    if group:
        return np.full(m.shape, group, dtype=np.int64)
    rules = rules_for(framework)
    if rules.interleaved_rounds:
        groups = round_group(m, p)
    elif rules.interleaved_leading_group:
        groups = leading_group(m, p)
    else:
        groups = p.copy()
        odd = (m % np.maximum(p, 1) != 0) & (m >= p)
        if rules.interleaved_microbatch_group and odd.any():
            groups[odd] = _over_pairs(smallest_interleaved_group, m[odd], p[odd])
    return np.where(groups > 0, groups, p)


def interleaved_microbatch_group(framework: str, *, num_microbatches: int, pp: int, group: int = 0) -> int:
    """:func:`interleaved_microbatch_groups` of one layout."""
    return int(interleaved_microbatch_groups(framework, num_microbatches, pp, group))


def interleaved_group_sizes(framework: str, *, num_microbatches: int, pp: int, group: int = 0) -> tuple[int, int]:
    """The micro-batch groups the framework's interleaved schedule runs a step's micro-batches in,
    as (first group, each later group; the last holds what is left): the first is
    :func:`interleaved_microbatch_group` (the one the warm-up is priced with); the later ones are
    the same size, except Paddle's, whose leading group takes ``m mod pp`` extra micro-batches
    before groups of pp (:func:`cost_model.schedule.leading_group`)."""
    first = interleaved_microbatch_group(framework, num_microbatches=num_microbatches, pp=pp, group=group)
    later = pp if rules_for(framework).interleaved_leading_group and not group else first
    return first, later


def interleaved_forwards_first(framework: str, num_microbatches: Any, pp: Any) -> Any:
    """Whether the framework's interleaved schedule runs every chunk forward before the first
    backward (elementwise): Paddle's at m = pp (fleet's PipelineParallelWithInterleaveFthenB) —
    Megatron-Core's current schedule and PyTorch's warm up by the group at m = pp too."""
    if not rules_for(framework).interleaved_leading_group:
        return False
    return np.asarray(num_microbatches) == np.asarray(pp)


def microbatch_group_note(framework: str, *, num_microbatches: int, pp: int, vpp: int, group: int = 0) -> str | None:
    """Warning for the micro-batch group of an estimate or plan, else None: one asked for
    without an interleaved schedule (Megatron-Core reads it only there), or a group other than
    pp — its longer warm-up holds (v − 1)·(N − pp) more chunk micro-batches, priced."""
    if vpp <= 1 or pp <= 1:
        return f"microbatch_group_size_per_vp_stage {group} has no effect without an interleaved pipeline (vpp 1)" if group else None
    used = interleaved_microbatch_group(framework, num_microbatches=num_microbatches, pp=pp, group=group)
    if used == pp:
        return None
    rules = rules_for(framework)
    more = (vpp - 1) * (used - pp)
    held = (f"its warm-up holds the activations of {more} more chunk micro-batch{'es' if more > 1 else ''} than groups of pp "
            "would, priced; the step time is the same")
    if rules.interleaved_rounds:
        return (f"{rules.interleaved_rounds} runs the {num_microbatches} micro-batches in {num_microbatches // used} round"
                f"{'s' if num_microbatches // used > 1 else ''} of {used} per virtual stage (pp={pp} does not divide them): {held}")
    if rules.interleaved_leading_group:
        return (f"{rules.interleaved_leading_group} runs the {num_microbatches} micro-batches in a first group of {used} "
                f"(accumulate_steps mod pp + pp), then groups of pp={pp}: {held}")
    why = "as asked" if group else f"{num_microbatches} micro-batches are not a multiple of pp={pp}, which the default group of pp needs"
    return (f"the interleaved schedule takes micro-batches in groups of {used} per virtual stage "
            f"({rules.interleaved_microbatch_group} {used}; {why}): {held}")


def microbatch_group_setting_violation(framework: str, group: int) -> str | None:
    """Reason when ``training.microbatch_group_size_per_vp_stage`` is set for a framework whose
    interleaved schedule has no such setting (all but Megatron-Core: groups of pp), else None."""
    rules = rules_for(framework)
    if group and not rules.interleaved_microbatch_group:
        how = (f"{rules.interleaved_rounds} sets its own rounds of micro-batches (max(1, m // pp) of them)" if rules.interleaved_rounds
               else f"{rules.interleaved_leading_group} sets its own first group (accumulate_steps mod pp + pp), then groups of pp"
               if rules.interleaved_leading_group else "its interleaved schedule takes micro-batches in groups of pp")
        return f"{framework}: {how}, with no setting for another group (Megatron-Core's)"
    return None


def effective_zero_stage(framework: str, zero_stage: Any, shard_ranks: Any) -> Any:
    """The sharding stage ``framework`` runs when asked for ``zero_stage`` over a sharding group of
    ``shard_ranks`` ranks: 0 where it runs a stage ≥ 2 over one rank as no sharding (its rule
    table's ``drops_one_rank_sharding``: Paddle's, under PaddleNLP's Trainer) — accepted, costed
    and launched so, with :func:`one_rank_sharding_note` — else ``zero_stage``.  The one
    normalisation behind the strategy check, the operator-graph estimate (whose search offers stages 0–1 only), and the
    transformer search's rows (arrays there, row by row)."""
    if not rules_for(framework).drops_one_rank_sharding:
        return zero_stage
    dropped = (np.asarray(zero_stage) >= 2) & (np.asarray(shard_ranks) == 1)
    if np.ndim(dropped) == 0:
        return 0 if dropped else zero_stage
    return np.where(dropped, 0, zero_stage)


def dense_etp_note(etp: int) -> str:
    """Warning for an expert tensor parallelism given for a dense model: Megatron-LM accepts
    ``--expert-tensor-parallel-size`` without experts and uses it for none."""
    return f"etp={etp} has no effect on a dense model (no experts to split; Megatron takes the flag and ignores it): costed without it"


def one_rank_sharding_note(framework: str, zero_stage: int) -> str:
    """Warning for a sharding stage that :func:`effective_zero_stage` runs as none."""
    return (f"{framework}: sharding stage {zero_stage} over a sharding group of one rank is no sharding (PaddleNLP's Trainer "
            "drops it: 'sharding_parallel_degree=1 means no sharding'): costed and launched as zero_stage 0")


def partial_sharding_violation(framework: str, *, dp: int | None, dp_shard: int, zero_stage: int | None) -> str | None:
    """Reason when the ZeRO state cannot shard over ``dp_shard`` of the ``dp`` data-parallel
    ranks (replicated over the dp/dp_shard groups: HSDP) under ``framework`` at ``zero_stage``;
    None when it can or ``dp_shard`` is 0 / dp (the whole group, the default).  ``dp`` or
    ``zero_stage`` None (not pinned): the rules that need it are left for the layout.  Where it
    exists: Megatron-Core's partial distributed optimizer (stage 1, ``--num-distributed-
    optimizer-instances``), FSDP's HYBRID_SHARD / FSDP2's 2-D (replicate, shard) mesh (stages
    2–3, torchtitan ``data_parallel_replicate_degree``), Paddle's ``sharding_degree`` beside
    ``dp_degree`` (stages 1–3).  Not DeepSpeed: its MiCS (Zhang et al. 2022, "MiCS: near-linear
    scaling for training gigantic model on public cloud"; ``mics_shard_size``) was removed
    (:data:`DEEPSPEED_NO_MICS`)."""
    if dp_shard == 0 or dp_shard == dp:
        return None
    r = rules_for(framework)
    if not r.partial_sharding_stages:
        why = f": {r.partial_sharding_name}" if r.partial_sharding_name else ""
        return f"{framework}: no partial sharding (the ZeRO state shards over all dp ranks; omit dp_shard){why}"
    if dp is not None and dp % dp_shard:
        return f"dp_shard={dp_shard} must divide dp={dp} (the state shards over dp_shard ranks, replicated dp/dp_shard times)"
    if zero_stage == 0:
        return f"dp_shard={dp_shard} shards the ZeRO state, but zero_stage is 0 (nothing is sharded)"
    if zero_stage is not None and zero_stage not in r.partial_sharding_stages:
        stages = ", ".join(str(z) for z in r.partial_sharding_stages)
        return (f"{framework}: sharding over part of the data-parallel ranks ({r.partial_sharding_name}) exists at zero_stage "
                f"{stages}, not {zero_stage}")
    return None


def dtype_rule_violation(framework: str, dtype: str) -> str | None:
    """Reason when the framework has no recipe for ``dtype`` (FP8, FP4), else None.  FP4
    (NVFP4) training exists only as Transformer Engine's ``NVFP4BlockScaling`` recipe, which
    Megatron-Core drives (``--fp4-format e2m1 --fp4-recipe nvfp4``; Megatron-Bridge
    ``bf16_with_nvfp4_mixed``)."""
    if dtype == "fp8" and not rules_for(framework).fp8:
        return f"{framework}: no FP8 training recipe (FP8 needs megatron-core with Transformer Engine or fsdp with torchao float8)"
    if dtype == "fp4" and framework != "megatron-core":
        return f"{framework}: no FP4 training recipe (NVFP4 training needs megatron-core with Transformer Engine)"
    return None


def pinned_rule_violation(framework: str, pins: Mapping[str, Any]) -> tuple[str, str] | None:
    """(pinned field, reason) when a field pinned in ``constraints`` is one the framework cannot
    run on its own (before any search: a pin is never pruned silently).  Rules that need the
    whole layout (ep against tp·cp·dp) are checked when the unpinned knobs are known."""
    r = rules_for(framework)
    pinned = dict(pins)
    checks: list[tuple[str, bool, str]] = [
        ("tp", pinned.get("tp", 1) > 1 and not r.tensor_parallel, "no tensor parallelism (tp must be 1)"),
        ("pp", pinned.get("pp", 1) > 1 and not r.pipeline_parallel, "no pipeline parallelism"),
        ("vpp", pinned.get("vpp", 1) > 1 and not r.interleaved_pipeline, "its pipeline engine has no interleaved schedule (vpp must be 1)"),
        ("ep", pinned.get("ep", 1) > 1 and not r.expert_parallel, "no expert parallelism"),
        ("sequence_parallel", bool(pinned.get("sequence_parallel")) and not r.sequence_parallel and pinned.get("tp", 1) > 1,
         "no sequence parallelism"),
    ]
    for key, bad, why in checks:
        if bad:
            return key, f"{framework}: {why}"
    cp_why = context_parallel_violation(framework, cp=pinned.get("cp", 1), tp=pinned.get("tp", 1), pp=pinned.get("pp", 1))
    if cp_why is not None:
        return "cp", cp_why
    rule = recompute_method_violation(framework, pinned.get("recompute_num_layers", 0), pinned.get("recompute_method", ""),
                                      pp=pinned.get("pp", 1))
    if rule is not None:
        return rule
    if "zero_stage" in pinned:
        z = pinned["zero_stage"]
        if z not in r.zero_stages:
            names = ", ".join(f"{s} ({r.sharding_name[s]})" for s in r.zero_stages)
            return "zero_stage", f"{framework}: no zero_stage {z}; its sharding stages are {names}"
        # a stage over a pinned one-rank group runs as none; with dp free the search keeps the rows where it does
        one_rank_possible = r.drops_one_rank_sharding and (pinned.get("dp_shard") or pinned.get("dp", 1)) == 1
        if z >= 2 and pinned.get("pp", 1) > 1 and not r.sharding_with_pipeline and not one_rank_possible:
            return "zero_stage", f"{framework}: zero_stage={z} cannot be combined with the pinned pp={pinned['pp']} (sharding stage ≥ 2 conflicts with pipeline gradient accumulation)"
    shard_why = partial_sharding_violation(framework, dp=pinned.get("dp"), dp_shard=pinned.get("dp_shard", 0),
                                           zero_stage=pinned.get("zero_stage"))
    if shard_why is not None:
        return "dp_shard", shard_why
    return expert_layout_violation(framework, tp=pinned.get("tp"), cp=pinned.get("cp"), ep=pinned.get("ep"),
                                   zero_stage=pinned.get("zero_stage"), dp=pinned.get("dp"), dp_shard=pinned.get("dp_shard", 0))


#: Paddle fleet's own words for the expert layout it builds (``EPHybridCommunicateGroup``).
FLEET_MOE_RULE = "fleet's EPHybridCommunicateGroup: 'sep_degree and dp_degree must be 1 in MoE'"


def expert_layout_ok(tp: Any, cp: Any, ep: Any, zero_stage: Any, dp: Any, dp_shard: Any) -> Any:
    """Whether an expert-parallel layout is one Paddle fleet's ``EPHybridCommunicateGroup``
    builds (arrays or ints): no expert parallelism, or every data-parallel rank a sharding rank
    (zero_stage ≥ 1 over all dp: ``dp_degree`` 1), no segment parallelism (``sep_degree`` 1,
    the planner's cp), and ep a multiple of tp dividing tp·dp — its expert groups are ep
    consecutive ranks of sharding × mp, ``moe_sharding_degree`` = dp·tp/ep of them, which must
    divide the sharding degree (``dense_sharding`` = sharding/moe_sharding)."""
    dp_shard = np.asarray(dp_shard)
    whole = (dp_shard == 0) | (dp_shard == dp)
    ok = (np.asarray(cp) == 1) & (np.asarray(zero_stage) >= 1) & whole & (np.mod(ep, tp) == 0) & (np.mod(np.asarray(tp) * dp, ep) == 0)
    return (np.asarray(ep) <= 1) | ok


def expert_layout_violation(framework: str, *, tp: int | None, cp: int | None, ep: int | None, zero_stage: int | None,
                            dp: int | None, dp_shard: int = 0) -> tuple[str, str] | None:
    """(strategy field, reason) when ``framework`` builds its expert groups only over a sharding
    group of every data-parallel rank (``ep_over_sharding``: Paddle fleet) and the layout is
    not one of those (:func:`expert_layout_ok`), else None.  A knob None (not pinned yet) is
    left for the layout."""
    if not rules_for(framework).ep_over_sharding or ep is None or ep <= 1:
        return None
    if cp is not None and cp > 1:
        return "cp", f"{framework}: expert parallelism (ep={ep}) runs without segment parallelism: cp must be 1 ({FLEET_MOE_RULE})"
    if zero_stage == 0 or (dp is not None and dp_shard not in (0, dp)):
        field = "zero_stage" if zero_stage == 0 else "dp_shard"
        return field, (f"{framework}: expert parallelism (ep={ep}) needs every data-parallel rank in the sharding group "
                       f"(zero_stage ≥ 1 over all dp ranks, no dp_shard; {FLEET_MOE_RULE})")
    if tp is not None and ep % tp:
        return "ep", (f"{framework}: ep={ep} must be a multiple of tp={tp}: fleet's expert groups are ep consecutive ranks of "
                      "sharding × mp, whole tensor-parallel groups each (moe_sharding_degree must divide sharding_degree)")
    return None


def context_parallel_violation(framework: str, *, cp: int, tp: int, pp: int, exchange: str | None = None,
                               heads: int | None = None, a2a_size: int | None = None) -> str | None:
    """Reason when ``framework`` cannot run context parallelism of degree ``cp`` beside ``tp``
    and ``pp`` (the framework's rules), or when the ``a2a`` exchange cannot hand every one of the
    tp·cp ranks whole heads (``heads`` given: the model's attention heads), or when the
    ``a2a+p2p`` exchange's all-to-all level (``a2a_size``) does not divide cp or cannot hand its
    tp·a2a_size ranks whole heads; else None.  The one check behind
    :func:`layout_rule_violation`, :func:`pinned_rule_violation`, the strategy validation and the
    search space."""
    if cp <= 1:
        return None
    r = rules_for(framework)
    if not r.context_parallel:
        return f"{framework}: no context parallelism (cp must be 1)"
    if tp > 1 and not r.cp_with_tp:
        return f"{framework}: its sequence parallelism (DeepSpeed-Ulysses) does not combine with tensor parallelism (cp={cp} needs tp=1)"
    if pp > 1 and not r.cp_with_pp:
        return f"{framework}: its sequence parallelism (DeepSpeed-Ulysses) does not combine with pipeline parallelism (cp={cp} needs pp=1)"
    kind = cp_exchange(framework, exchange)
    if heads is not None and kind == "a2a" and heads % (tp * cp):
        return (f"cp={cp}: the all-to-all (Ulysses) exchange hands each rank whole heads, and tp·cp = {tp * cp} does not divide "
                f"the {heads} attention heads")
    if kind == "a2a+p2p" and a2a_size:
        if cp % a2a_size:
            return (f"cp={cp}: hierarchical context parallelism (a2a+p2p) splits cp into its all-to-all level of "
                    f"cp_a2a_size {a2a_size} times a ring, and {a2a_size} does not divide {cp}")
        if heads is not None and heads % (tp * a2a_size):
            return (f"cp={cp}: the all-to-all level of a2a+p2p hands each of its ranks whole heads, and tp·cp_a2a_size = "
                    f"{tp * a2a_size} does not divide the {heads} attention heads")
    return None


def expert_parallel_runs_in(framework: str, dtype: str) -> bool:
    """Whether ``framework`` runs expert parallelism (ep > 1) in ``dtype``: Megatron-LM refuses it
    under fp16 (``validate_args``: "Expert parallelism is not supported with fp16 training.")."""
    return rules_for(framework).expert_parallel and not (dtype == "fp16" and framework == "megatron-core")


def expert_parallel_dtype_violation(framework: str, dtype: str, ep: int) -> str | None:
    """Reason when ``framework`` has expert parallelism but cannot run ``ep`` in ``dtype``
    (:func:`expert_parallel_runs_in`), else None."""
    if ep > 1 and rules_for(framework).expert_parallel and not expert_parallel_runs_in(framework, dtype):
        return f"{framework}: expert parallelism is not supported with {dtype} training (Megatron-LM validate_args); use bf16 or ep=1"
    return None


def moe_training_violation(framework: str, dtype: str, dispatcher: str, capacity_factor: float | None,
                           comm_overlap: bool) -> tuple[str, str] | None:
    """(training field, reason) when the MoE settings are a combination Megatron-Core refuses at
    start-up, else None.  Its DeepEP (flex) dispatcher does not pad expert inputs to a capacity
    ("Flex token dispatcher with deepep backend does not support
    moe_pad_expert_input_to_capacity"), which is how a capacity factor is run and costed here;
    the expert-parallel all-to-all overlap needs the alltoall or flex dispatcher and a 16-bit
    model (``TransformerConfig``: "overlap_moe_expert_parallel_comm is supported with
    alltoall/flex token dispatcher", "... only supported with bf16 or fp16 model")."""
    if framework != "megatron-core":
        return None
    if capacity_factor is not None and dispatcher == "deepep":
        return ("moe_capacity_factor", "megatron-core: its DeepEP dispatcher does not pad expert inputs to a capacity, which a "
                "capacity factor runs and is costed as; use moe_token_dispatcher alltoall with it, or leave it out")
    if comm_overlap and dispatcher == "allgather":
        return "moe_comm_overlap", "megatron-core: the expert-parallel overlap needs the alltoall or deepep dispatcher, not allgather"
    if comm_overlap and dtype == "fp32":
        return "moe_comm_overlap", "megatron-core: the expert-parallel overlap needs a bf16, fp16, fp8 or fp4 model, not fp32"
    return None


def required_expert_tensor_parallel(framework: str, is_moe: bool, linear_bias: bool, ep: int) -> int | None:
    """The experts' tensor parallelism a framework requires of a model at expert parallelism
    ``ep``, else None: Megatron-Core runs biased linear layers in experts only unsplit ("Bias in
    Moe is only supported when ETP==1", ``TransformerConfig``), so an MoE model with linear
    biases (gpt-oss; Megatron's ``--add-bias-linear``, on when the output-projection and MLP
    biases both exist) runs at ETP 1 whatever its TP — Megatron's default ETP is TP.  Where the
    EP groups take in the tensor-parallel ranks, each holding whole experts
    (``unsplit_experts_under_ep``: Paddle fleet's expert groups, torchtitan's sparse mesh), ETP is
    1 with ep > 1; without expert parallelism the experts split over TP like the dense MLP
    (PaddleNLP's ``MixtralMLP``: Column/RowParallelLinear at tensor_parallel_degree > 1;
    torchtitan's ``expert_param_placement_dense``), the default."""
    if not is_moe:
        return None
    if rules_for(framework).unsplit_experts_under_ep:
        return 1 if ep > 1 else None
    return 1 if framework == "megatron-core" and linear_bias else None


def required_expert_tensor_parallel_violation(framework: str, is_moe: bool, linear_bias: bool, etp: int, ep: int) -> str | None:
    """Reason when an asked ``etp`` (0: not asked) is not the one the framework requires of the
    model at expert parallelism ``ep`` (:func:`required_expert_tensor_parallel`), else None."""
    required = required_expert_tensor_parallel(framework, is_moe, linear_bias, ep)
    if required is None or etp in (0, required):
        return None
    return f"{required_etp_reason(framework, required)} only"


def required_etp_reason(framework: str, etp: int) -> str:
    """Why ``framework`` runs the experts at ``etp`` (:func:`required_expert_tensor_parallel`):
    for the refusal of another etp and for the estimate's note where it was not asked."""
    why = rules_for(framework).unsplit_experts_under_ep
    if why:
        return f"{framework} runs the experts unsplit with expert parallelism (etp={etp}): {why}"
    return (f"{framework} runs the experts of a model with linear biases at etp={etp} "
            "(Megatron-Core: 'Bias in Moe is only supported when ETP==1')")


def moe_overlap_layout_violation(framework: str, comm_overlap: bool, *, ep: int, pp: int, vpp: int,
                                 recompute: str) -> tuple[str, str] | None:
    """(strategy field, reason) when Megatron-Core's expert-parallel all-to-all overlap
    (``training.moe_comm_overlap``, ``--overlap-moe-expert-parallel-comm``, written with ep > 1)
    cannot run the layout, else None.  With a pipeline it runs only in the interleaved schedule
    (``TransformerConfig``: "virtual_pipeline_model_parallel_size must be specified when
    pipeline_model_parallel_size > 1"); full recompute it runs only through its own
    per-module path (no recompute method or layer count, dropout 0), which is not what the
    cost model prices as full recompute."""
    if not (comm_overlap and rules_for(framework).moe_comm_overlap) or ep <= 1:
        return None
    if pp > 1 and vpp == 1:
        return "vpp", ("megatron-core: the expert-parallel overlap (moe_comm_overlap) with a pipeline needs the interleaved "
                       "schedule (vpp ≥ 2)")
    if recompute == "full":
        return "recompute", ("megatron-core: the expert-parallel overlap (moe_comm_overlap) takes no full recompute of the "
                             "kind costed here (a recompute method and layer count); use selective or none")
    return None


def cp_sequence_multiple(framework: str, cp: int, tp: int = 1, sequence_parallel: bool = False) -> int:
    """What ``sequence_length`` must be a multiple of for context parallelism ``cp`` (and, under
    torchtitan, sequence parallelism over ``tp``).  Megatron-Core cuts each sequence into 2·cp
    chunks and gives rank i chunks i and 2·cp − 1 − i so that causal attention's work is
    balanced (Megatron-LM ``validate_args``: "seq-length should be a multiple of 2 * context-
    parallel-size"); torchtitan (``fsdp``) balances the same way and also shards the sequence
    over the TP ranks under sequence parallelism ("Training sequence length ... must be
    divisible by" tp·2·cp, its trainer); Ulysses and Paddle's sep cut it into cp parts."""
    if framework == "fsdp":
        return (2 * cp if cp > 1 else 1) * (tp if sequence_parallel and tp > 1 else 1)
    if cp <= 1:
        return 1
    return 2 * cp if framework == "megatron-core" else cp


def cp_sequence_violation(framework: str, cp: int, sequence_length: int, tp: int = 1, sequence_parallel: bool = False) -> str | None:
    """Reason when ``sequence_length`` cannot be split for context parallelism ``cp`` (and
    torchtitan's sequence parallelism over ``tp``), else None."""
    k = cp_sequence_multiple(framework, cp, tp, sequence_parallel)
    if sequence_length % k == 0:
        return None
    if k == cp:
        return f"cp={cp} does not divide sequence_length {sequence_length}"
    how = "2·cp" if k == 2 * cp else ("tp (sequence parallel)" if cp == 1 else "2·cp·tp (sequence parallel)")
    return (f"{framework} cuts each sequence into {how} = {k} chunks (load-balanced causal attention"
            f"{', sharded over the TP ranks' if k != 2 * cp else ''}): sequence_length {sequence_length} is not a multiple of {k}")


def kv_heads_violation(framework: str, tp: int | None, kv_heads: int) -> str | None:
    """Why ``tp`` cannot split ``kv_heads`` key/value heads under ``framework``, else None: a
    framework that replicates heads (``FrameworkRules.replicates_kv_heads``: PaddleNLP) takes tp
    dividing them or a multiple of them; the others split them, so tp must divide them
    (``FrameworkRules.kv_head_split``: Megatron's ``divide(num_query_groups, tp)``, torchtitan's
    check)."""
    if tp is None or tp <= 1 or kv_heads % tp == 0:
        return None
    r = rules_for(framework)
    if not r.replicates_kv_heads:
        return f"{framework}: tp={tp} must divide the {kv_heads} key/value heads ({r.kv_head_split})"
    if tp % kv_heads:
        return (f"tp={tp} neither divides the {kv_heads} key/value heads nor is a multiple of them "
                "(KV heads can only be split or replicated evenly)")
    return None


def torchtitan_layout_violation(framework: str, *, tied_embeddings: bool, tp: int | None = None,
                                pp: int | None = None, vpp: int | None = None, ep: int | None = None, cp: int | None = None,
                                zero_stage: int | None = None, num_microbatches: int | None = None) -> tuple[str, str] | None:
    """(strategy field, reason) when torchtitan — what ``fsdp`` runs TP, PP, CP and EP with —
    refuses the layout at start-up, else None (that tp splits the key/value heads and never
    replicates them is the rule table's, :func:`kv_heads_violation`, checked everywhere); its
    ``torch.distributed.pipelining`` 1F1B needs at least one micro-batch per stage ("Number of
    microbatches must be greater than or equal to the number of stages"); a pipeline cannot
    tie the embedding and the head ("Weight tying is not supported with Pipeline Parallel");
    experts shard over dp_shard·cp·tp, so without data-parallel sharding (ZeRO 0) ep must
    divide cp·tp (``ParallelDims``: efsdp = dp_shard·cp·tp/ep); and its FSDP mesh is
    dp_shard·cp (``ParallelDims.fsdp_enabled`` is ``dp_shard > 1 or cp > 1``: the parameters
    shard over the context-parallel ranks whatever dp_shard is), so with cp > 1 there is no
    unsharded (ZeRO 0) layout — what runs is stage 2/3 over the cp ranks (``dp_shard`` 1 keeps
    the dp ranks as replicas).  A knob given as None is not fixed yet (the pins alone, before the
    search): the rules that need it wait for the whole layout."""
    if framework != "fsdp":
        return None
    if pp is not None and vpp is not None and num_microbatches is not None and pp > 1 and vpp == 1 and num_microbatches < pp:
        return "micro_batch_size", (f"fsdp (torchtitan): its 1F1B schedule needs at least one micro-batch per stage: "
                                    f"{num_microbatches} micro-batches for pp={pp}")
    if pp is not None and pp > 1 and tied_embeddings:
        return "pp", "fsdp (torchtitan): a pipeline cannot tie the embedding and the output head (the model ties them)"
    if cp is not None and cp > 1 and zero_stage == 0:
        return "zero_stage", (f"fsdp (torchtitan): with cp={cp} it shards the parameters over the context-parallel ranks "
                              "(its FSDP mesh is dp_shard·cp), so zero_stage 0 does not run; use zero_stage 2 or 3 "
                              "(dp_shard 1 shards over cp alone and keeps the dp ranks as replicas)")
    if ep is not None and cp is not None and tp is not None and ep > 1 and zero_stage == 0 and (cp * tp) % ep:
        return "zero_stage", (f"fsdp (torchtitan): experts shard over dp_shard·cp·tp; with zero_stage 0 there is no dp_shard, "
                              f"and ep={ep} does not divide cp·tp = {cp * tp}")
    return None


def deepspeed_moe_violation(framework: str, *, is_moe: bool, zero_stage: Any = None, ep: Any = None,
                            cp: Any = None) -> tuple[str, str] | None:
    """(strategy field, reason) when DeepSpeed's engine refuses an MoE model's layout at start-up
    (``DeepSpeedEngine._validate_zero3_moe_compatibility``, DeepSpeed 0.19), else None; a knob
    None is not fixed yet:

    * ``megatron-deepspeed`` builds its MoE layers as DeepSpeed's native ``deepspeed.moe.layer.MoE``
      whatever ep is, which ZeRO stage 3 refuses ("Native DeepSpeed MoE is not supported with
      ZeRO Stage 3");
    * ``deepspeed`` (a Hugging Face model under DeepSpeed's engine) runs expert parallelism as
      AutoEP (the ``expert_parallel`` section the deepspeed-config target writes), which runs
      under ZeRO stage 3 but not beside sequence parallelism ("AutoEP with ZeRO Stage 3 does not
      support sequence parallelism yet": cp, DeepSpeed-Ulysses, must be 1); with ep 1 the
      model's own MoE blocks are plain modules, sharded as any other.

    Vectorised over array knobs for the search (:func:`deepspeed_moe_ok`)."""
    if not is_moe or not rules_for(framework).deepspeed_engine:
        return None
    if framework == "megatron-deepspeed" and zero_stage == 3:
        return "zero_stage", ("megatron-deepspeed: its MoE layers are DeepSpeed's native MoE, which DeepSpeed's engine refuses "
                              "under ZeRO stage 3 ('Native DeepSpeed MoE is not supported with ZeRO Stage 3'); use zero_stage 0-2")
    if framework == "deepspeed" and zero_stage == 3 and ep is not None and ep > 1 and cp is not None and cp > 1:
        return "cp", (f"deepspeed: expert parallelism (ep={ep}) runs as AutoEP, which under ZeRO stage 3 does not run beside "
                      f"sequence parallelism ('AutoEP with ZeRO Stage 3 does not support sequence parallelism yet'): "
                      f"cp={cp} must be 1, or use zero_stage 1-2")
    return None


def deepspeed_moe_ok(framework: str, is_moe: bool, zero_stage: Any, ep: Any, cp: Any) -> Any:
    """Row by row (arrays): whether :func:`deepspeed_moe_violation` lets the layout run."""
    z = np.asarray(zero_stage)
    if not is_moe or not rules_for(framework).deepspeed_engine:
        return np.ones(z.shape, dtype=bool)
    if framework == "megatron-deepspeed":
        return z != 3
    return ~((z == 3) & (np.asarray(ep) > 1) & (np.asarray(cp) > 1))


def cp_exchange(framework: str, cp_comm_type: str | None) -> str:
    """The context-parallel exchange a framework runs: ``cp_comm_type`` when given, else the
    framework's own (the first of its ``cp_exchanges``)."""
    return cp_comm_type or rules_for(framework).cp_exchanges[0]


def hierarchical_cp_violation(cp_comm_type: str | None, cp_a2a_size: int | None) -> tuple[str, str] | None:
    """(training field, reason) when hierarchical context parallelism is half stated, else None:
    ``a2a+p2p`` needs the size of its all-to-all level (Megatron-Core's
    ``--hierarchical-context-parallel-sizes``: "hierarchical_context_parallel_sizes must be set
    when cp_comm_type is a2a+p2p"), and that size means nothing under another exchange."""
    if cp_comm_type == "a2a+p2p" and cp_a2a_size is None:
        return "cp_a2a_size", ("is required with cp_comm_type a2a+p2p: the CP ranks of the all-to-all level (Megatron-Core's "
                               "--hierarchical-context-parallel-sizes A P, A·P = cp)")
    if cp_a2a_size is not None and cp_comm_type != "a2a+p2p":
        return "cp_a2a_size", f"is the all-to-all level of cp_comm_type a2a+p2p, not of {cp_comm_type or 'the framework default'}; leave it out"
    return None


def cp_exchange_rule_violation(framework: str, cp_comm_type: str | None) -> str | None:
    """Reason when the framework has no such context-parallel exchange, else None."""
    exchanges = rules_for(framework).cp_exchanges
    if cp_comm_type is None or cp_comm_type in exchanges:
        return None
    return (f"{framework}: no {cp_comm_type!r} context-parallel exchange; it has {', '.join(exchanges)} "
            "(megatron-core: p2p ring, allgather, a2a, a2a+p2p; fsdp: torchtitan's K/V allgather, verl's Ulysses a2a; deepspeed: "
            "DeepSpeed-Ulysses a2a, ring-flash-attn's K/V allgather or zigzag p2p ring; megatron-deepspeed: Ulysses a2a; paddle's sep_degree: a2a)")


def grad_accum_rule_violation(framework: str, dtype: str, grad_accum_dtype: str | None) -> str | None:
    """Reason when ``grad_accum_dtype`` is given where it means nothing, else None.  It is
    DeepSpeed's ``data_types.grad_accum_dtype`` under bf16: ``fp32`` at ZeRO stage 1 selects
    DeepSpeed's BF16_Optimizer (fp32 accumulation, ``engine._do_optimizer_sanity_check``),
    ``bf16`` its ZeRO optimizer.  Megatron-Core, FSDP and Paddle have no such setting
    (Megatron accumulates bf16 gradients in fp32 main-gradient buffers by itself)."""
    if grad_accum_dtype is None:
        return None
    if not runs_deepspeed_engine(framework):
        return (f"{framework}: no grad_accum_dtype setting (it is DeepSpeed's data_types.grad_accum_dtype, for deepspeed "
                "and megatron-deepspeed); leave it out")
    if dtype != "bf16":
        return f"grad_accum_dtype chooses how bf16 training accumulates its gradients; with {dtype} training leave it out"
    return None


def master_weights_violation(framework: str, dtype: str, master_weights: bool) -> str | None:
    """Reason when ``master_weights: false`` (pure bf16 training) cannot be run, else None: it
    exists where the framework trains every tensor in bf16 (``FrameworkRules.pure_bf16``: FSDP
    trainers — torchtitan's ``training.dtype = "bfloat16"``, "all parameters, gradients, and
    optimizer states in bfloat16, without an extra copy of fp32 weights"), and only under bf16
    training (Megatron-Core, DeepSpeed and Paddle keep fp32 master weights under 16-bit training)."""
    if master_weights:
        return None
    r = rules_for(framework)
    if not r.pure_bf16:
        where = " and ".join(f"{x.name}'s {x.pure_bf16}" for x in RULES.values() if x.pure_bf16)
        return f"{framework}: keeps fp32 master weights under 16-bit training (pure bf16 training is {where}); leave it out"
    if dtype != "bf16":
        return f"master_weights: false is pure bf16 training (dtype bf16); with {dtype} training leave it out"
    return None


def priced_by(setting: str, sep: str = " and ") -> str:
    """The frameworks' own names for a setting the cost model prices (a :class:`FrameworkRules`
    text field such as ``optimizer_offload``), each once, for a refusal to say where it runs."""
    return sep.join(dict.fromkeys(getattr(x, setting) for x in RULES.values() if getattr(x, setting)))


def priced_by_name(setting: str) -> str:
    """Each framework that prices a setting (a :class:`FrameworkRules` text field), with its own
    name for it: "name (its terms)", for a refusal to say where it runs."""
    return " and ".join(f"{x.name} ({getattr(x, setting)})" for x in RULES.values() if getattr(x, setting))


def steps_on_the_host(r: FrameworkRules, optimizer: str) -> bool:
    """Whether the framework's offload steps ``optimizer`` on the host: Adam (CPU Adam, PyTorch's
    CPU AdamW), or the 8-bit AdamW where its trainers keep it as the client optimizer
    (``FrameworkRules.eight_bit_adam_offload``)."""
    return optimizer in ADAM_OPTIMIZERS or (optimizer == EIGHT_BIT_ADAM and bool(r.eight_bit_adam_offload))


def optimizer_offload_violation(framework: str, dtype: str, optimizer: str, fraction: float, precision_aware: bool) -> str | None:
    """Reason when ``training.optimizer_offload_fraction`` > 0 cannot be costed or run, else None.

    It is priced where the framework keeps the optimizer's state and update on the host
    (``FrameworkRules.optimizer_offload``): DeepSpeed's ZeRO-Offload, whose ZeRO optimizer
    accepts DeepSpeed's CPU Adam there (``stage_1_and_2.py``: "ZeRO-Offload ... optimizer type"),
    and Megatron-Core's hybrid optimizer, which "must be used in conjunction with
    --use-precision-aware-optimizer, as the hybrid device optimizer reuses the code path of this
    flag" (Megatron-LM ``validate_args``), itself Adam only.  Both keep fp32 master weights on the
    host: mixed precision only.  The sharding stage is the layout's rule
    (:func:`offload_layout_violation`)."""
    if fraction <= 0.0:
        return None
    r = rules_for(framework)
    if not r.optimizer_offload:
        where = priced_by("optimizer_offload")
        return f"{framework}: {UNPRICED_OFFLOAD.get(framework, 'no optimizer offload')}; optimizer offload is priced for {where}"
    if dtype == "fp32":
        return "optimizer offload keeps the fp32 master weights of mixed-precision training on the host; with fp32 training leave it out"
    if not steps_on_the_host(r, optimizer):
        if r.offload_updates_on_gpu:
            return f"{r.optimizer_offload} offloads Adam's state, got optimizer {optimizer!r}"
        return f"{r.optimizer_offload} updates with Adam on the host (CPU Adam), got optimizer {optimizer!r}"
    if fraction < 1.0 and not r.partial_offload_stages:
        return f"{r.optimizer_offload} moves all of the optimizer state: 1, got {fraction:g}"
    if "precision_aware_optimizer" in r.optimizer_precision and not precision_aware:
        return (f"{framework}: the optimizer cpu offload needs precision_aware_optimizer: true ('must be used in conjunction with "
                "--use-precision-aware-optimizer, as the hybrid device optimizer reuses the code path of this flag')")
    return None


def cpu_offload_violation(framework: str, dtype: str, cpu_offload: bool, optimizer_offload_fraction: float = 0.0,
                          optimizer: str = "adam") -> str | None:
    """Reason when ``training.cpu_offload`` cannot be run or costed, else None: the sharded
    parameters, gradients and optimizer state on the host (``FrameworkRules.cpu_offload``):
    FSDP2's ``CPUOffloadPolicy`` ("offloads parameters, gradients, and optimizer states to CPU")
    and DeepSpeed's ZeRO-3 Offload (``offload_param`` with ``offload_optimizer``, both to the
    CPU); elsewhere the optimizer state alone is offloaded (``optimizer_offload_fraction``).  Priced
    under bf16 and fp16 (and fp32 for FSDP: FSDP1's ``CPUOffload(offload_params=True)`` under an
    fp16 ``MixedPrecision`` unscales the host's gradients with its ``ShardedGradScaler``,
    :func:`cost_model.transformer.layer_cost.cpu_offload_step_s`); DeepSpeed's parameters on the
    host with only part of the optimizer state there is not priced."""
    if not cpu_offload:
        return None
    r = rules_for(framework)
    if not r.cpu_offload:
        where = priced_by("cpu_offload")
        return f"{framework}: no CPU offload of the parameters ({where}); offload its optimizer state with optimizer_offload_fraction"
    dtypes = ("bf16", "fp16") if r.deepspeed_engine else ("bf16", "fp16", "fp32")
    if dtype not in dtypes:
        return f"{r.cpu_offload} is priced under {', '.join(dtypes[:-1])} or {dtypes[-1]} training, got {dtype}"
    if r.deepspeed_engine and not steps_on_the_host(r, optimizer):
        return f"{r.cpu_offload} updates with DeepSpeed's CPU Adam, got optimizer {optimizer!r}"
    if 0.0 < optimizer_offload_fraction < 1.0:
        return (f"{r.cpu_offload} puts all of the optimizer state on the host; leave optimizer_offload_fraction out "
                f"(got {optimizer_offload_fraction:g})")
    return None


#: The 8-bit optimizer state frameworks have instead of an 8-bit AdamW, and where it is priced.
UNPRICED_EIGHT_BIT = {
    "megatron-core": ("Megatron-Core narrows Adam's moments through the precision-aware optimizer instead: "
                      "precision_aware_optimizer with exp_avg_dtype / exp_avg_sq_dtype (fp8, bf16, fp16)"),
}


def eight_bit_adam_violation(framework: str, optimizer: str, cpu_offload: bool, optimizer_offload_fraction: float) -> str | None:
    """Reason when ``training.optimizer`` ``adamw_8bit`` cannot be costed or run, else None.  It is
    priced where the framework's trainers take bitsandbytes' or torchao's 8-bit AdamW
    (``FrameworkRules.eight_bit_adam``: FSDP trainers; DeepSpeed as a client optimizer).  Its
    kernels step the state on the GPU, so it does not run with the state on the host:
    axolotl's FSDP2 offload examples say "8bit optimizers do not work with FSDP2 offload", and
    DeepSpeed's offload steps with its own CPU Adam unless told to keep the client optimizer
    (``FrameworkRules.eight_bit_adam_offload``: ``zero_force_ds_cpu_optimizer: false``, the 8-bit
    AdamW then stepping the host partition, as axolotl's long-sequence examples run it)."""
    if optimizer != EIGHT_BIT_ADAM:
        return None
    r = rules_for(framework)
    if not r.eight_bit_adam:
        return f"{framework}: {UNPRICED_EIGHT_BIT.get(framework, 'no 8-bit AdamW')}; adamw_8bit is priced for {priced_by_name('eight_bit_adam')}"
    if (cpu_offload or optimizer_offload_fraction > 0.0) and not steps_on_the_host(r, optimizer):
        return ("the 8-bit AdamW steps its quantised state with GPU kernels; with the state on the host "
                "(cpu_offload, optimizer_offload_fraction) use adam or adamw")
    return None


#: The Muon optimizer (``training.optimizer``; :mod:`cost_model.transformer.muon`).
MUON = "muon"


def muon_violation(framework: str, optimizer: str, lora_rank: int, dtype: str = "bf16") -> str | None:
    """Reason when ``training.optimizer`` ``muon`` cannot be costed or run, else None.  It is
    priced as Megatron-Core runs it (``FrameworkRules.muon``), for a model whose weights train:
    a LoRA run's adapters are low-rank pairs Muon's recipes do not orthogonalise; not in fp16
    (``get_megatron_muon_optimizer``: "muon with fp16 is not supported").  Its offload is
    refused by ``optimizer_offload_violation`` (Megatron-Core's hybrid CPU optimizer is Adam),
    the precision-aware optimizer by ``optimizer_precision_violation`` (Adam's moments)."""
    if optimizer != MUON:
        return None
    if not rules_for(framework).muon:
        return f"{framework}: no Muon optimizer the cost model prices; muon is priced for {priced_by_name('muon')}"
    if lora_rank:
        return "Muon orthogonalises whole weight matrices' updates; with LoRA (lora_rank) use adam or adamw"
    if dtype == "fp16":
        return "Megatron-Core's Muon runs in bf16 (or fp32), not fp16 with a loss scaler: 'muon with fp16 is not supported'"
    return None


def muon_layout_violation(optimizer: str, zero_stage: int | None, partial: bool = False) -> tuple[str, str] | None:
    """(strategy field, reason) when Muon is asked for in a sharding layout Megatron-Core does not
    run it in, else None (``None`` for a stage not fixed yet): without the distributed optimizer
    (zero_stage 0) or with its layer-wise distributed optimizer (zero_stage 1, ``--optimizer
    dist_muon``: each rank steps whole matrices, over the whole data-parallel group — ``partial``,
    a ``dp_shard`` below dp, has no Muon counterpart of ``--num-distributed-optimizer-instances``);
    Megatron-FSDP's sharded gradients and weights (2, 3) split matrices across ranks."""
    if optimizer != MUON or zero_stage is None:
        return None
    if zero_stage >= 2:
        return "zero_stage", (f"Megatron-Core's Muon steps whole weight matrices: without the distributed optimizer (zero_stage 0) or "
                              f"with its layer-wise distributed optimizer (zero_stage 1), not under Megatron-FSDP's sharded weights "
                              f"(got zero_stage {zero_stage})")
    if partial:
        return "dp_shard", ("Megatron-Core's layer-wise distributed Muon shares the matrices over the whole data-parallel group: leave "
                            "dp_shard out (partial sharding is the Adam distributed optimizer's --num-distributed-optimizer-instances)")
    return None


def offload_modules_violation(framework: str, activation_offloading: bool, modules: tuple[str, ...]) -> str | None:
    """Reason when ``training.offload_modules`` cannot be run, else None: the modules a framework's
    activation offload is told to offload (``FrameworkRules.offload_modules``: Megatron-Core's
    ``--offload-modules``, which its activation offload needs — ``assert self.offload_modules is
    not None and len(self.offload_modules) > 0``), ``attn_proj`` only beside ``core_attn``
    ("attn_proj cannot be set to offload_modules alone without core_attn")."""
    have = rules_for(framework).offload_modules
    if modules and not have:
        return f"{framework}: no offload_modules setting (it is Megatron-Core's --offload-modules); its activation offloading is whole"
    if modules and not activation_offloading:
        return "offload_modules choose what activation_offloading offloads: set activation_offloading: true"
    if have and activation_offloading and not modules:
        return (f"Megatron-Core's fine-grained activation offloading offloads the modules it is given: name them in "
                f"offload_modules ({', '.join(have)})")
    unknown = [m for m in modules if m not in have]
    if unknown:
        return f"{unknown[0]!r} is not one of Megatron-Core's offload modules: {', '.join(have)}"
    if "attn_proj" in modules and "core_attn" not in modules:
        return "attn_proj cannot be offloaded alone without core_attn (Megatron-Core's rule): add core_attn"
    return None


def lora_violation(framework: str, dtype: str, rank: int, modules: tuple[str, ...], dropout: float) -> tuple[str, str] | None:
    """(training field, reason) when a LoRA request cannot be costed, else None.  LoRA (Hu et al.
    2021, "LoRA: Low-Rank Adaptation of Large Language Models") is priced where the framework's
    trainers have it (``FrameworkRules.lora``): the base weights frozen, a rank-``r`` adapter
    B·A beside each targeted linear layer (:mod:`cost_model.transformer.lora`); offloaded to the
    host, the adapters' state goes there, and under ``cpu_offload`` the frozen base's shard too
    (:func:`cost_model.transformer.stage_cost.stage_cost`).  Not priced, so refused by name: LoRA
    under FP8/FP4 (whose casts of the frozen weights' dgrad-only backward the cost model does not
    have)."""
    if rank == 0:
        if modules:
            return "lora_target_modules", "lora_target_modules choose where LoRA's adapters go: set lora_rank"
        if dropout:
            return "lora_dropout", "lora_dropout is the LoRA adapters' input dropout: set lora_rank"
        return None
    r = rules_for(framework)
    if not r.lora:
        return "lora_rank", f"{framework}: no LoRA the cost model prices; LoRA is priced for {priced_by('lora', '; ')}"
    unknown = [m for m in modules if m not in LORA_MODULES]
    if unknown:
        return "lora_target_modules", f"{unknown[0]!r} is not one of the decoder's linear layers: {', '.join(LORA_MODULES)}"
    if dtype in ("fp8", "fp4"):
        return "dtype", f"LoRA is priced in bf16, fp16 and fp32 training, not {dtype}"
    return None


#: The loss kernels (``training.loss_kernel``): ``unfused`` (the default: the logits and the
#: loss's fp32 copy held for the backward), ``chunked`` (torchtune's ``CEWithChunkedOutputLoss``:
#: the logits upcast chunk by chunk and the 16-bit logits freed, the fp32 log-probabilities
#: kept), ``liger`` (Liger Kernel's fused linear cross-entropy: the head's GEMMs and the loss
#: chunk by chunk in the forward), ``cce`` (Cut Cross-Entropy: blockwise in on-chip memory, the
#: logits recomputed in the backward), ``te`` (Transformer Engine's parallel cross-entropy under
#: Megatron-Core: an online softmax over the 16-bit logits, which it keeps, and the gradient
#: written over them in place; Megatron-Core's native fused loss keeps the same fp32
#: softmax as its unfused one and is priced as ``unfused``), ``compiled`` (``torch.compile``'s
#: cross-entropy under FSDP: the upcast and log-softmax fused, the 16-bit logits and two fp32
#: numbers a token kept, the softmax recomputed in the backward).
LOSS_KERNELS = ("unfused", "chunked", "liger", "cce", "te", "compiled")


def loss_kernel_violation(framework: str, kernel: str) -> str | None:
    """Reason when ``training.loss_kernel`` is not one ``framework``'s trainers run, else None
    (``FrameworkRules.loss_kernels``: Liger's and Cut Cross-Entropy's kernels under the Hugging
    Face trainers on FSDP and DeepSpeed, torchtune's chunked loss on FSDP, Transformer Engine's
    parallel cross-entropy under Megatron-Core)."""
    if kernel == "unfused" or kernel in dict(rules_for(framework).loss_kernels):
        return None
    runs = [(x.name, dict(x.loss_kernels)[kernel]) for x in RULES.values() if kernel in dict(x.loss_kernels)]
    where = "; ".join(dict.fromkeys(f"{kernel}: {text}" for _, text in runs))
    return f"{framework}: no {kernel} loss kernel; it runs under {' and '.join(name for name, _ in runs)} ({where})"


def fp8_param_gather_violation(framework: str, dtype: str, fp8_param_gather: bool, optimizer_offload_fraction: float = 0.0) -> str | None:
    """Reason when ``training.fp8_param_gather`` cannot be costed, else None: it needs FP8
    training, under a framework that all-gathers its weights in FP8 (``FrameworkRules.
    fp8_param_gather``: Megatron-Core's ``--fp8-param-gather``, torchao's FSDP2 float8
    all-gather), and not beside
    its optimizer CPU offload (the Megatron-MoE model zoo's launcher leaves the flag out under
    ``--optimizer-cpu-offload``: "Optimizer CPU offload does not support fp8 param gather now")."""
    if not fp8_param_gather:
        return None
    if not rules_for(framework).fp8_param_gather:
        where = "; ".join(f"{r.name}: {r.fp8_param_gather}" for r in RULES.values() if r.fp8_param_gather)
        return f"{framework}: no FP8 weight gather priced; it is priced for {where}"
    if dtype != "fp8":
        return f"FP8 weights need FP8 training (training.dtype fp8), not {dtype}"
    if optimizer_offload_fraction > 0.0:
        return ("FP8 weights are not gathered beside Megatron-Core's optimizer CPU offload ('Optimizer CPU offload does not "
                "support fp8 param gather now'): leave one of them out")
    return None


#: The 4-bit formats a LoRA base may be held in (``training.lora_base_dtype``): NF4, QLoRA's
#: NormalFloat (Dettmers et al. 2023).
LORA_BASE_DTYPES = ("nf4",)


def qlora_violation(framework: str, dtype: str, rank: int, base_dtype: str | None) -> str | None:
    """Reason when ``training.lora_base_dtype`` cannot be costed, else None.  QLoRA (Dettmers et
    al. 2023) holds LoRA's frozen base in 4-bit NF4 and computes in bf16/fp16: priced where the
    framework's trainers run it (``FrameworkRules.qlora``: bitsandbytes under Hugging Face's
    FSDP and DeepSpeed trainers, torchtune's QLoRA recipes)."""
    if base_dtype is None:
        return None
    if not rank:
        return "lora_base_dtype is the dtype LoRA's frozen base is held in: set lora_rank"
    r = rules_for(framework)
    if not r.qlora:
        return f"{framework}: no 4-bit LoRA base the cost model prices; QLoRA is priced for {priced_by('qlora', '; ')}"
    if dtype not in ("bf16", "fp16"):
        return f"QLoRA computes in bf16 or fp16 (bnb_4bit_compute_dtype), not {dtype}"
    return None


def activation_offloading_violation(framework: str, activation_offloading: bool) -> str | None:
    """Reason when ``training.activation_offloading`` cannot be costed, else None.  It is priced
    where the framework has it (``FrameworkRules.activation_offloading``): the FSDP and DeepSpeed
    trainers' offload of every saved activation through PyTorch's saved-tensor hooks (torchtune's
    ``OffloadActivations``, ``training/_activation_offloading.py``: each saved tensor of at least
    1 KB copied to pinned host memory on a side stream, brought back when the backward asks for
    it; TRL's and verl's; DeepSpeed's ``cpu_checkpointing``, the checkpointed inputs), PaddleNLP's
    ``recompute_offload`` and Megatron-Core's fine-grained offload of the modules named
    (:func:`offload_modules_violation`).  The layout rule is :func:`offload_layout_violation`'s."""
    if not activation_offloading:
        return None
    r = rules_for(framework)
    if not r.activation_offloading:
        return f"{framework}: no activation offloading the cost model prices; activation offloading is priced for {priced_by('activation_offloading', '; ')}"
    return None


def pipeline_schedules_violation(framework: str, schedules: int) -> str | None:
    """Reason when ``training.pipeline_schedules_per_step`` > 1 is asked of a framework whose
    pipeline runs a step's micro-batches in one schedule (``FrameworkRules.pipeline_schedules``:
    Megatron-Core's, DeepSpeed's and Paddle's accumulate inside it), else None."""
    if schedules <= 1 or rules_for(framework).pipeline_schedules:
        return None
    return (f"{framework}: its pipeline runs a step's micro-batches in one schedule (gradient accumulation is its micro-batches); "
            f"several schedules a step are priced for {priced_by('pipeline_schedules', '; ')}")


def submodule_checkpointing_violation(framework: str, submodule_checkpointing: bool) -> str | None:
    """Reason when ``training.submodule_checkpointing`` is asked of a framework whose trainers do
    not checkpoint by submodule (``FrameworkRules.submodule_checkpointing``), else None."""
    if not submodule_checkpointing or rules_for(framework).submodule_checkpointing:
        return None
    return (f"{framework}: its full recompute checkpoints whole layers; checkpointing each layer's attention, MLP and "
            f"norms separately is priced for {priced_by('submodule_checkpointing', '; ')}")


def optimizer_in_backward_violation(framework: str, optimizer_in_backward: bool, optimizer_offload: bool = False) -> str | None:
    """Reason when ``training.optimizer_in_backward`` is asked of a framework whose trainers do not
    step inside the backward (``FrameworkRules.optimizer_in_backward``), or beside an offload
    whose optimizer steps on the host, else None."""
    if not optimizer_in_backward:
        return None
    if not rules_for(framework).optimizer_in_backward:
        return f"{framework}: no optimizer step inside the backward; it is priced for {priced_by('optimizer_in_backward', '; ')}"
    if optimizer_offload:
        return "the optimizer steps inside the backward on the GPU; with the state on the host (cpu_offload, optimizer_offload_fraction) leave it out"
    return None


def reference_model_violation(framework: str, reference_model: bool, lora_rank: int) -> str | None:
    """Reason when ``training.reference_model`` cannot be costed, else None: priced where the
    framework's trainers keep a frozen reference copy (``FrameworkRules.reference_model``); not with
    LoRA, whose reference is the frozen base with the adapters switched off (TRL's, PaddleNLP's
    LoRA DPO): no second copy."""
    if not reference_model:
        return None
    if not rules_for(framework).reference_model:
        return f"{framework}: no frozen reference model the cost model prices; it is priced for {priced_by('reference_model', '; ')}"
    if lora_rank:
        return ("with LoRA the reference is the frozen base with its adapters switched off (no second copy): leave "
                "reference_model out, the adapters' forward is what LoRA already prices")
    return None


def optimizer_in_backward_layout_violation(optimizer_in_backward: bool, *, pp: int | None = None, ep: int | None = None,
                                           num_microbatches: int | None = None) -> tuple[str, str] | None:
    """(strategy field, reason) when a layout cannot step inside the backward, else None (``None``
    for a knob not fixed yet): the step runs in each parameter's post-accumulate-grad hook, so
    every backward steps — one micro-batch a step (torchtune: "Gradient accumulation is not
    supported with optimizer in bwd"); torchtitan refuses it with a pipeline or expert
    parallelism ("Optimizers in backward is not supported with Pipeline Parallel / Expert Parallel")."""
    if not optimizer_in_backward:
        return None
    if pp is not None and pp > 1:
        return "pp", f"the optimizer step inside the backward runs without a pipeline (pp 1, got {pp})"
    if ep is not None and ep > 1:
        return "ep", f"the optimizer step inside the backward runs without expert parallelism (ep 1, got {ep})"
    if num_microbatches is not None and num_microbatches > 1:
        return "micro_batch_size", (f"the optimizer steps inside every backward, so a step is one micro-batch: "
                                    f"micro_batch_size = global_batch_size / dp (got {num_microbatches} micro-batches a step)")
    return None


def offload_layout_violation(framework: str, optimizer_offload_fraction: float, cpu_offload: bool,
                             zero_stage: int | None, pp: int | None, activation_offloading: bool = False,
                             recompute: str | None = None) -> tuple[str, str] | None:
    """(strategy field, reason) when the layout cannot run the request's offload to the host, else
    None (``None`` for a knob not fixed yet).

    ``optimizer_offload_fraction`` runs at the sharding stages the framework offloads from
    (``FrameworkRules.offload_stages``, ``partial_offload_stages``): DeepSpeed from its ZeRO
    optimizer (stages 1–3; "ratio ... only valid with ZeRO Stage 3"), Megatron-Core from its
    distributed optimizer (stage 1, as the precision-aware optimizer needs).  ``cpu_offload``
    offloads the *sharded* parameters — full sharding (zero_stage 3: FSDP's FULL_SHARD,
    DeepSpeed's "offload_param ... only valid with stage 3") — and is priced without a pipeline
    (inside one torchtitan keeps unsharded gradients across micro-batches; DeepSpeed's pipeline
    engine runs no stage 3).  ``activation_offloading`` runs under the recompute settings and
    pipelines its framework's offload has (``FrameworkRules.activation_offloading_recompute``,
    ``activation_offloading_with_pipeline``): the trainers that offload every saved activation
    (torchtune, TRL, verl) run no pipeline; PaddleNLP's ``recompute_offload`` offloads the full
    recompute's checkpointed inputs, in its pipeline too."""
    if activation_offloading:
        r = rules_for(framework)
        if pp is not None and pp > 1 and not r.activation_offloading_with_pipeline:
            return "pp", f"{framework}'s activation offloading is priced without a pipeline (pp 1), got pp {pp}"
        if recompute is not None and recompute not in r.activation_offloading_recompute:
            return "recompute", (f"{r.activation_offloading} runs under recompute {' or '.join(r.activation_offloading_recompute)}, "
                                 f"got {recompute}")
    if cpu_offload:
        if zero_stage is not None and zero_stage != 3:
            return "zero_stage", f"cpu_offload offloads the sharded parameters: zero_stage 3 (full sharding), got {zero_stage}"
        if pp is not None and pp > 1:
            return "pp", f"cpu_offload is priced without a pipeline (pp 1), got pp {pp}"
    if optimizer_offload_fraction <= 0.0 or zero_stage is None:
        return None
    r = rules_for(framework)
    if zero_stage not in r.offload_stages:
        return "zero_stage", f"{r.optimizer_offload} runs at zero_stage {'/'.join(map(str, r.offload_stages))}, got {zero_stage}"
    if optimizer_offload_fraction < 1.0 and zero_stage not in r.partial_offload_stages:
        return "zero_stage", (f"{r.optimizer_offload} offloads part of the state ({optimizer_offload_fraction:g}) at zero_stage "
                              f"{'/'.join(map(str, r.partial_offload_stages))} only, got {zero_stage}: offload all of it (1) or change the stage")
    return None


def optimizer_precision_violation(framework: str, dtype: str, optimizer: str, precision_aware: bool,
                                  dtypes: Mapping[str, str]) -> tuple[str, str] | None:
    """(training field, reason) when an optimizer-precision setting is given where Megatron-Core
    would refuse it or where it means nothing, else None.  ``dtypes``: ``main_grads_dtype``,
    ``main_params_dtype``, ``exp_avg_dtype``, ``exp_avg_sq_dtype`` (fp32: the default).

    Which a framework has is its rule table's (``FrameworkRules.optimizer_precision``: all of them
    Megatron-Core's ``OptimizerConfig``, the gradients' Paddle's AMP O2 ``master_grad``).
    Megatron-Core's checks:
    the lowered master weights and moments need the precision-aware optimizer ("exp_avg_dtype
    can only be fp32 when not using precision-aware optimizer"), which needs Adam
    ("--use-precision-aware-optimizer only supported with adam"); a bf16 gradient buffer is bf16
    training's (``validate_args``: under bf16 the gradients accumulate in fp32 unless
    ``--grad-reduce-in-bf16`` or ``--main-grads-dtype bf16``); the distributed-optimizer rule is
    the layout's (:func:`precision_aware_zero_violation`)."""
    given = (["precision_aware_optimizer"] if precision_aware else []) + [k for k, v in dtypes.items() if v != "fp32"]
    missing = [k for k in given if k not in rules_for(framework).optimizer_precision]
    if missing:
        where = " and ".join(r.optimizer_precision[missing[0]] for r in RULES.values() if missing[0] in r.optimizer_precision)
        return missing[0], f"{framework}: no {missing[0]} setting (it is {where}); leave it out"
    if precision_aware and optimizer not in ADAM_OPTIMIZERS:
        return "precision_aware_optimizer", "megatron-core: the precision-aware optimizer runs Adam only (--use-precision-aware-optimizer only supported with adam)"
    # 16-bit gradients are the 16-bit weights' dtype: bf16 under bf16, FP8 and FP4 training (their
    # parameters are bf16), fp16 under fp16 training; fp32 training has none
    grads = dtypes.get("main_grads_dtype", "fp32")
    megatron = "precision_aware_optimizer" in rules_for(framework).optimizer_precision
    wants = "fp16" if dtype == "fp16" else None if dtype == "fp32" else "bf16"
    if grads != "fp32" and megatron and wants != "bf16":
        return "main_grads_dtype", (f"megatron-core: --main-grads-dtype bf16 is bf16 (or FP8/FP4) training's gradient buffer "
                                    f"(fp32 by default; fp16 training keeps fp32 main gradients); with {dtype} training leave it out")
    if grads != "fp32" and grads != wants:
        return "main_grads_dtype", (f"main_grads_dtype {grads} keeps the gradients in the 16-bit weights' dtype, which {dtype} "
                                    f"training {'does not have: leave it out' if wants is None else f'holds in {wants}: give {wants} or leave it out'}")
    for key in ("main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"):
        if dtypes.get(key, "fp32") != "fp32" and not precision_aware:
            return key, (f"{key} {dtypes[key]} needs precision_aware_optimizer: true (Megatron-Core: '{key} can only be fp32 when "
                          "not using precision-aware optimizer')")
    return None


def precision_aware_zero_violation(precision_aware: bool, zero_stage: int | None) -> str | None:
    """Reason when the precision-aware optimizer is asked for beside a sharding stage other than
    Megatron-Core's distributed optimizer (zero_stage 1), else None: "--use-precision-aware-
    optimizer only supported with distributed optimizer" (``OptimizerConfig``); Megatron-FSDP
    (2, 3) keeps its own ``--megatron-fsdp-main-*-dtype``, which the cost model does not price."""
    if not precision_aware or zero_stage is None or zero_stage == 1:
        return None
    return (f"the precision-aware optimizer runs under Megatron-Core's distributed optimizer only (zero_stage 1, got {zero_stage}): "
            "'--use-precision-aware-optimizer only supported with distributed optimizer'")


def fp8_param_gather_zero_violation(fp8_param_gather: bool, zero_stage: int | None) -> str | None:
    """Reason when FP8 weights (``training.fp8_param_gather``) are asked for without a sharded
    optimizer, else None: Megatron-LM's ``validate_args`` — "--fp8-param-gather only supported
    with distributed optimizer, torch fsdp2, megatron fsdp" (zero_stage 1–3); torchao's FP8
    all-gather is FSDP2's (``fully_shard``: zero_stage 2 or 3 under ``fsdp``, whose stages are 0, 2, 3)."""
    if not fp8_param_gather or zero_stage is None or zero_stage >= 1:
        return None
    return (f"FP8 weights are all-gathered by a sharded optimizer only (zero_stage 1-3, got {zero_stage}): Megatron-Core's "
            "distributed optimizer or Megatron-FSDP ('--fp8-param-gather only supported with distributed optimizer, torch fsdp2, "
            "megatron fsdp'), FSDP2's fully_shard under fsdp")


def tp_comm_overlap_violation(framework: str, tp_comm_overlap: bool) -> str | None:
    """Reason when ``training.tp_comm_overlap`` is asked of a framework that has no such overlap
    (``FrameworkRules.tp_comm_overlap``), else None: the plan would price collectives hidden
    behind GEMMs that its launch runs exposed."""
    if not tp_comm_overlap or rules_for(framework).tp_comm_overlap:
        return None
    have = ", ".join(f"{r.name}: {r.tp_comm_overlap}" for r in RULES.values() if r.tp_comm_overlap)
    return f"{framework}: no overlap of tensor-parallel collectives with GEMMs ({have}); leave tp_comm_overlap out"


def tp_comm_overlap_layout_violation(tp_comm_overlap: bool, tp: int | None, sequence_parallel: bool | None) -> str | None:
    """Reason when the tensor-parallel overlap is asked beside tp > 1 without sequence
    parallelism, else None (a knob None: not fixed yet): Megatron-Core refuses it ("Tensor
    parallel communication/GEMM overlap can happen only when sequence parallelism is enabled",
    ``validate_args``); torchtitan's async TP pipelines the sequence-parallel all-gather and
    reduce-scatter with their matmuls."""
    if tp_comm_overlap and tp is not None and tp > 1 and sequence_parallel is False:
        return (f"tp_comm_overlap overlaps the sequence-parallel all-gather and reduce-scatter with their GEMMs: with tp={tp} it "
                "needs sequence_parallel (Megatron-Core: 'Tensor parallel communication/GEMM overlap can happen only when sequence "
                "parallelism is enabled')")
    return None


def sequence_parallel_noop(tp: int, sequence_parallel: bool, framework: str = "megatron-core") -> str | None:
    """Warning for ``sequence_parallel`` at tp=1: Megatron accepts it and does nothing
    (there is no tensor-parallel group to split the sequence over).  A framework without tensor
    parallelism (DeepSpeed) never has one; its own "sequence parallelism", DeepSpeed-Ulysses, is
    context parallelism (``cp``), which the warning points to."""
    if not (sequence_parallel and tp == 1):
        return None
    if not rules_for(framework).tensor_parallel:
        return (f"sequence_parallel has no effect under {framework}: it splits the norms and dropout over the "
                "tensor-parallel group, which it has none of (DeepSpeed-Ulysses sequence parallelism is cp); "
                "costed without it")
    return "sequence_parallel has no effect at tp=1 (Megatron runs it as a no-op); costed without it"


def pipeline_gradient_sharding_note(framework: str, zero_stage: int, pp: int) -> str | None:
    """Warning for ZeRO 2 with a pipeline where the framework's own pipeline schedule cannot
    keep the gradients sharded through the micro-batches (``FrameworkRules.sharded_gradients_in_pipeline``:
    torchtitan's ``torch.distributed.pipelining`` turns FSDP's gradient sync off until the last
    backward): the layout is costed as asked — gradients reduce-scattered with every micro-batch,
    as the Llama 3 paper ran it — and the warning says what the framework's launch will hold."""
    if zero_stage != 2 or pp <= 1 or rules_for(framework).sharded_gradients_in_pipeline:
        return None
    return (f"{framework}: zero_stage 2 with pp={pp} is costed with the gradients reduce-scattered every micro-batch "
            "(the Llama 3 paper's layout); torchtitan's pipeline schedule turns FSDP's gradient sync off until each "
            "stage's last backward, so its job keeps the gradients unsharded in fp32 (4 bytes a parameter more per GPU) "
            "and reduce-scatters them once a step: plan with zero_stage 3 to cost what torchtitan runs")


def grad_reduce_overlap_note(framework: str, grad_reduce_overlap: bool) -> str | None:
    """Warning for ``grad_reduce_overlap: false`` where the framework cannot run the gradient
    reduction after the backward: FSDP reduce-scatters (or all-reduces) each unit's gradients
    from its post-backward hook, on its own stream beside the next unit's backward
    (``FrameworkRules.reduces_every_backward``), with no switch to defer them.  The estimate
    prices the reduction exposed, as asked; the launch will overlap it."""
    if grad_reduce_overlap or not rules_for(framework).reduces_every_backward:
        return None
    return (f"{framework}: grad_reduce_overlap false is costed as asked (the gradient reduction after the backward), but FSDP "
            "reduces each unit's gradients from its post-backward hook beside the next unit's backward and cannot defer them: "
            "its launch overlaps them and will spend less time in data-parallel communication than this estimate")


__all__ = [
    "ADAM_OPTIMIZERS",
    "OPTIMIZER_PRECISION_FLAGS",
    "WHOLE_LAYOUT_RULE_FRAMEWORKS",
    "BLOCK_RECOMPUTE_MISSING",
    "DEEPSPEED_NO_MICS",
    "RULES",
    "FrameworkRules",
    "context_parallel_violation",
    "cp_exchange",
    "cp_sequence_multiple",
    "cp_sequence_violation",
    "cp_exchange_rule_violation",
    "deepspeed_moe_ok",
    "deepspeed_moe_violation",
    "describe",
    "dtype_rule_violation",
    "grad_reduce_overlap_note",
    "expert_parallel_dtype_violation",
    "expert_parallel_runs_in",
    "ep_group_divisor",
    "interleaved_schedule_violation",
    "activation_offloading_violation",
    "OFFLOAD_MODULES",
    "declared_order",
    "offload_modules_violation",
    "EIGHT_BIT_ADAM",
    "eight_bit_adam_violation",
    "MUON",
    "muon_violation",
    "optimizer_in_backward_violation",
    "reference_model_violation",
    "optimizer_in_backward_layout_violation",
    "muon_layout_violation",
    "LORA_MODULES",
    "LORA_BASE_DTYPES",
    "LOSS_KERNELS",
    "fp8_param_gather_violation",
    "hierarchical_cp_violation",
    "fp8_param_gather_zero_violation",
    "recompute_method_violation",
    "loss_kernel_violation",
    "lora_violation",
    "qlora_violation",
    "layout_rule_violation",
    "master_weights_violation",
    "optimizer_offload_violation",
    "cpu_offload_violation",
    "offload_layout_violation",
    "moe_overlap_layout_violation",
    "optimizer_precision_violation",
    "precision_aware_zero_violation",
    "required_etp_reason",
    "required_expert_tensor_parallel",
    "required_expert_tensor_parallel_violation",
    "dense_etp_note",
    "effective_zero_stage",
    "one_rank_sharding_note",
    "interleaved_microbatch_group",
    "interleaved_microbatch_groups",
    "interleaved_microbatches_run",
    "interleaved_forwards_first",
    "microbatch_group_note",
    "microbatch_group_setting_violation",
    "torchtitan_layout_violation",
    "tp_comm_overlap_layout_violation",
    "tp_comm_overlap_violation",
    "moe_training_violation",
    "partial_sharding_violation",
    "pinned_rule_violation",
    "rules_for",
    "pipeline_gradient_sharding_note",
    "pipeline_schedules_violation",
    "sequence_parallel_noop",
    "submodule_checkpointing_violation",
]
