"""Stage-level assembly: per-stage time and memory, pipeline schedule, data-parallel sync.

Shared by :func:`cost_model.estimate` (one strategy, any stage layout, heterogeneous devices)
and the planner (thousands of candidates, vectorised).  Both call :func:`stage_cost` for each
stage and :func:`combine_stages` for the step, so a plan's prediction is exactly what
``estimate`` returns for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from cost_model.comm import ArrayOrFloat, FloatArray, Links
from cost_model.devices import BYTES_PER_ELEMENT, NARROW_DTYPES, DeviceSpec
from cost_model.frameworks import (
    interleaved_forwards_first,
    interleaved_microbatch_groups,
    rules_for,
    runs_deepspeed_engine,
)
from cost_model.schedule import exposed_dp_sync_s, inflight_microbatches, pipeline_time_s
from cost_model.topology import zero_replicas, zero_shard_ranks
from cost_model.training import Training
from cost_model.transformer.calibration import (
    calibrated_device,
    overlap_compute_slowdown,
    pipeline_layer_overhead_s,
    sharded_compute_efficiency,
    sharded_prefetch_overlap,
)
from cost_model.transformer.layer_cost import (
    ACTIVATION_OFFLOAD_KEPT_LAYERS,
    RECOMPUTE_CODE,
    WORKSPACE_BYTES,
    LayerCosts,
    StrategyArrays,
    activation_offload_s,
    bf16_optimizer,
    checkpoints_attention_core,
    cpu_offload_microbatch_s,
    deepspeed_gather_copy_out_s,
    deepspeed_step_gradient_bytes,
    dp_gradient_comm_s,
    dp_overlap_fraction,
    embedding_head_costs,
    fragmentation_fraction,
    frozen_weight_bytes_per_param,
    fsdp_accumulates_in_fp32,
    layer_costs,
    model_state_bytes_per_param,
    offloaded_state_bytes_per_param,
    op_level_recomputed_gemm_flops,
    op_level_selective,
    optimizer_state_partitioned,
    optimizer_step_s,
    param_bytes,
    param_tensors_per_layer,
    pipelined_fsdp,
    pp_p2p_s,
    sharded_collectives_per_layer,
    sharded_microbatch_exposed_s,
    sharded_passes_per_microbatch,
    sharded_passes_s,
    zero_offload_accumulation_s,
)
from cost_model.transformer.lora import (
    adapter_params_per_layer,
    adapter_tensors_per_layer,
    base_bytes_per_param,
    expert_adapter_params_per_layer,
    expert_adapter_tensors_per_layer,
)
from cost_model.transformer.memory import churned_gradients
from cost_model.transformer.moe import expert_data_parallel, expert_tensor_parallel
from cost_model.transformer.muon import orthogonalize_s
from cost_model.transformer.spec import TransformerSpec


def dense_layer_params(model: TransformerSpec) -> float:
    """Parameters of the average decoder layer outside the routed experts (attention, norms,
    router, shared experts, dense FFNs of dense layers)."""
    return float(model.decoder_layer_params()) - float(model.routed_expert_params_per_layer())

#: DeepSpeed ZeRO-3's ``stage3_max_live_parameters`` default: the most gathered parameters it
#: keeps resident at once (DeepSpeed configuration docs).
DEEPSPEED_MAX_LIVE_PARAMETERS = 1e9

#: DeepSpeed's ``zero_optimization.reduce_bucket_size`` default (elements): the size of the
#: buffer its ZeRO optimizers copy gradients into on their way to the reduction (DeepSpeed
#: configuration docs; ``runtime/zero/config.py``).  The planner's ``ds_config.json`` leaves it
#: at the default and sets ``contiguous_gradients`` and ``overlap_comm``.
DEEPSPEED_REDUCE_BUCKET_SIZE = 5e8


def gradient_bucket_bytes(training: Training, zero_stage: ArrayOrFloat, pp: ArrayOrFloat) -> FloatArray:
    """Bytes of DeepSpeed's gradient buckets at the backward's peak, beyond the gradient memory
    of :func:`model_state_bytes_per_param`.  They keep one size for the whole run, so they do
    not fragment the caching allocator.

    * DeepSpeed's ZeRO optimizer (``runtime/zero/stage_1_and_2.py``; the engine uses it for
      stages 1–2 except where ``BF16_Optimizer`` runs, :func:`bf16_optimizer`) with
      ``contiguous_gradients`` allocates, before every backward, an IPG bucket of
      ``reduce_bucket_size`` elements in the training dtype, and a second one under
      ``overlap_comm`` (double-buffering; the planner's ``ds_config.json`` sets it from
      ``training.grad_reduce_overlap``), held until the optimizer step releases them
      (``_release_ipg_buffers``): 2·B·b, B·b without the overlap.  Under the pipeline engine (``pp`` > 1) its one bucket
      is made by ``reduce_gradients(pipeline_parallel=True)`` at the gradient-accumulation
      boundary, after the last backward has freed the activations, and released by the step
      that follows: nothing at the peak.
    * DeepSpeed's stage 3 (``runtime/zero/stage3.py``) allocates one IPG flat buffer of
      ``reduce_bucket_size`` elements once, at initialisation: B·b.

    B = :data:`DEEPSPEED_REDUCE_BUCKET_SIZE`, b = :func:`param_bytes`.  Other frameworks add
    nothing here: Megatron-Core's fp32 gradient buffer is counted as gradients; FSDP's
    unsharded gradients of the unit in backward (and its reduce-scatter input) are not counted
    (docs/frameworks.md says why)."""
    z = np.asarray(zero_stage)
    if not runs_deepspeed_engine(training.framework):
        return np.zeros(np.shape(z), dtype=float)
    zero_optimizer = ((z == 1) | (z == 2)) & ~bf16_optimizer(training, z, pp)
    ipg = 2.0 if training.grad_reduce_overlap else 1.0
    buffers = np.where(zero_optimizer, np.where(np.asarray(pp) > 1, 0.0, ipg), np.where(z >= 3, 1.0, 0.0))
    out: FloatArray = buffers * DEEPSPEED_REDUCE_BUCKET_SIZE * param_bytes(training)
    return out


#: Bytes per parameter per micro-batch that a DeepSpeed-engine framework's gradient
#: accumulation streams through HBM outside the weight-gradient GEMM (:func:`grad_accumulation_s`):
#: autograd's ``AccumulateGrad`` adds each micro-batch's new gradient into ``.grad`` in place
#: (read 2 + 2, write 2 bytes in 16-bit training; 4 + 4 + 4 in fp32), which DeepSpeed's ZeRO-1/2
#: optimizers reduce at the step (GPT-NeoX, MT-NLG).  Megatron-Core: 0
#: (``gradient_accumulation_fusion`` accumulates into the fp32 ``main_grad`` inside the wgrad
#: GEMM); FSDP / ZeRO-3: 0 (gradients are reduce-scattered per micro-batch).
GRAD_ACCUMULATION_BYTES_PER_PARAM = {"bf16": 6.0, "fp16": 6.0, "fp8": 6.0, "fp4": 6.0, "fp32": 12.0}
#: Bytes per parameter per micro-batch of DeepSpeed's ``BF16_Optimizer``
#: (:func:`cost_model.transformer.layer_cost.bf16_optimizer`), which keeps the accumulated gradient in fp32 outside ``.grad``: before each
#: backward ``clear_lp_grads`` zeroes the bf16 gradients (write 2), autograd adds into them
#: (read 2 + 2, write 2), and after it ``update_hp_grads`` adds them into the fp32 buffer,
#: ``hp_grad.add_(lp.grad.to(float32))`` (the cast reads 2 and writes a 4-byte temporary, the add
#: reads 4 + 4 and writes 4): 26 bytes.  Source: DeepSpeed ``runtime/bf16_optimizer.py``
#: (``_update_hp_grad``, ``clear_lp_grads``), ``runtime/pipe/engine.py`` (``_exec_backward_pass``
#: calls both around every micro-batch's backward), checked against DeepSpeed 0.19.8.
BF16_OPTIMIZER_ACCUMULATION_BYTES_PER_PARAM = 2.0 + 6.0 + 18.0
#: Kernels per parameter tensor per micro-batch: ``AccumulateGrad``'s add; under BF16_Optimizer
#: also the cast and the fp32 add of ``update_hp_grads``' per-parameter loop (the zeroing is one
#: ``_foreach_zero_`` over the group, not counted per tensor).
BF16_OPTIMIZER_KERNELS_PER_TENSOR = 3.0


#: Bytes per decoder linear-layer parameter that FP4 training holds besides the BF16 weight: the
#: NVFP4 copies Transformer Engine quantises once per step and caches over the micro-batches
#: (Megatron-Core passes ``is_first_microbatch``), one in the row-major layout for the forward
#: GEMM and one transposed for dgrad (Blackwell's FP4 MMA takes K-major operands only; the 16×16
#: 2D block scaling makes the two hold the same values), 0.5625 bytes each.  Megatron-Bridge's
#: NVFP4 recipe keeps BF16 parameters (``fp8_param_gather=False``), so the copies add to them.
#: Source: Transformer Engine ``NVFP4BlockScaling`` (2D weight quantisation), NVIDIA 2025 NVFP4
#: pretraining paper (arXiv 2509.25149) §4.  The FP8 path's: :func:`fp8_weight_cache_bytes_per_param`.
FP4_WEIGHT_CACHE_BYTES = 2.0 * BYTES_PER_ELEMENT["fp4"]
#: Bytes a decoder weight moves in a gather when it is held in FP8 (``training.fp8_param_gather``:
#: Megatron-Core's ``--fp8-param-gather``, "perform the param all-gather in fp8").
FP8_GATHER_BYTES_PER_PARAM = BYTES_PER_ELEMENT["fp8"]


def fp8_weight_cache_bytes_per_param(training: Training, device: DeviceSpec) -> float:
    """Bytes per decoder linear-layer weight of the FP8 casts Transformer Engine keeps over a
    step's micro-batches beside the 16-bit weight (``FrameworkRules.fp8_param_gather``:
    Megatron-Core's TE layers get ``is_first_microbatch`` — the weight is cast at a step's first
    micro-batch, the cast reused for the rest; ``disable_parameter_transpose_cache`` turns the
    reuse off).  On Hopper (and earlier) an FP8 weight and its transpose, one byte each (its FP8
    tensor-core GEMMs take K-major operands only, so dgrad needs the transposed copy); on
    Blackwell the MXFP8 recipe's row-wise and column-wise copies, each with an E8M0 scale per 32
    values: 2·(1 + 1/32).  0 without FP8, under FP8 weights (``training.fp8_param_gather``: the
    weight is the FP8 tensor, its transpose cached beside it — 2 bytes, as the 16-bit weight it
    replaces) and where the framework casts as it goes (torchao's float8 under FSDP, whose FP8
    all-gather casts each shard before gathering it and keeps the sharded weight as it was).
    Source: Transformer Engine ``module/base.py`` (``get_weight_workspace``, the ``weight``
    workspace cache keyed on ``is_first_microbatch``), Megatron-Core
    ``extensions/transformer_engine.py`` (``TELinear.forward``)."""
    if training.dtype != "fp8" or training.fp8_param_gather or rules_for(training.framework).fp8_linear != "transformer-engine":
        return 0.0
    scale = 1.0 / 32.0 if device.family == "blackwell" else 0.0
    return 2.0 * (BYTES_PER_ELEMENT["fp8"] + scale)


def decoder_gather_fraction(training: Training) -> float:
    """Bytes a decoder weight moves in a gather (and a gathered layer holds) over the training
    dtype's (:func:`~cost_model.transformer.layer_cost.param_bytes`): QLoRA's 4-bit NF4 storage
    (:func:`~cost_model.transformer.lora.base_bytes_per_param`), FP8 weights
    (:data:`FP8_GATHER_BYTES_PER_PARAM`), else 1."""
    held = FP8_GATHER_BYTES_PER_PARAM if training.fp8_param_gather else base_bytes_per_param(training, param_bytes(training))
    return held / param_bytes(training)


#: Bytes per parameter FSDP's unsharded fp32 gradient accumulation moves per micro-batch inside
#: a pipeline stage: ``unsharded_accumulated_grad += unsharded_param.grad`` reads 4 + 2 and writes
#: 4 (FSDP2 ``FSDPParam.accumulate_unsharded_grad_if_needed``; the first micro-batch's upcast
#: ``grad.to(reduce_dtype)`` moves 2 + 4, counted as the others).
FSDP_ACCUMULATION_BYTES_PER_PARAM = 10.0


def grad_accumulation_s(params_per_gpu: ArrayOrFloat, training: Training, device: DeviceSpec, S: StrategyArrays, tensors: ArrayOrFloat) -> FloatArray:
    """Seconds per micro-batch of the gradient-accumulation pass a DeepSpeed-engine framework
    runs after each backward: a memory-bound stream over the GPU's parameters
    (:data:`GRAD_ACCUMULATION_BYTES_PER_PARAM`, one in-place add kernel per parameter tensor; in
    DeepSpeed's ``BF16_Optimizer``, :func:`~cost_model.transformer.layer_cost.bf16_optimizer`, and its fp32 accumulation,
    :data:`BF16_OPTIMIZER_ACCUMULATION_BYTES_PER_PARAM` and
    :data:`BF16_OPTIMIZER_KERNELS_PER_TENSOR`) — zero for Megatron-Core (fused into the wgrad
    GEMM) and for ZeRO-3/FSDP (reduce-scattered), except where FSDP2 adds each micro-batch's
    16-bit gradients into fp32 buffers of the whole stage
    (:func:`~cost_model.transformer.layer_cost.fsdp_accumulates_in_fp32`: full sharding inside a
    pipeline stage, and ZeRO 0; :data:`FSDP_ACCUMULATION_BYTES_PER_PARAM`, one add per parameter
    tensor).

    Source: PyTorch ``torch/csrc/autograd/functions/accumulate_grad.h`` (in-place
    ``variable_grad += new_grad``), DeepSpeed ``runtime/engine.py`` (gradients accumulate in
    ``.grad`` between ``is_gradient_accumulation_boundary`` steps); roofline time as
    :func:`cost_model.compute.memory_bound_time_s`."""
    from cost_model.compute import memory_bound_time_s

    if training.framework == "fsdp":
        fsdp_t = memory_bound_time_s(np.asarray(params_per_gpu, dtype=float) * FSDP_ACCUMULATION_BYTES_PER_PARAM, device, kernels=tensors)
        fsdp_out: FloatArray = np.where(fsdp_accumulates_in_fp32(training, S.zero, S.pp), fsdp_t, 0.0)
        return fsdp_out
    if not runs_deepspeed_engine(training.framework):
        return np.zeros_like(np.asarray(S.tp, dtype=float))
    bf16_opt = bf16_optimizer(training, S.zero, S.pp)
    per_param = np.where(bf16_opt, BF16_OPTIMIZER_ACCUMULATION_BYTES_PER_PARAM, GRAD_ACCUMULATION_BYTES_PER_PARAM.get(training.dtype, 6.0))
    kernels = np.asarray(tensors, dtype=float) * np.where(bf16_opt, BF16_OPTIMIZER_KERNELS_PER_TENSOR, 1.0)
    t = memory_bound_time_s(np.asarray(params_per_gpu, dtype=float) * per_param, device, kernels=kernels)
    out: FloatArray = np.where(S.zero >= 3, 0.0, t)
    return out


@dataclass(frozen=True)
class DeviceCosts:
    """Everything per device type that does not depend on the stage split."""

    device: DeviceSpec
    links: Links
    layer: LayerCosts
    embedding_s: np.ndarray
    head_s: np.ndarray
    head_flops: np.ndarray
    embedding_act_bytes: np.ndarray
    head_act_bytes: np.ndarray
    #: one multi-token-prediction module beyond its decoder layer (:func:`mtp_extra_s`); 0 without MTP
    mtp_s: np.ndarray | float = 0.0


def device_costs(model: TransformerSpec, training: Training, device: DeviceSpec, links: Links, S: StrategyArrays) -> DeviceCosts:
    """Per-device-type costs, with the device as ``training.framework`` drives it
    (:func:`cost_model.transformer.calibration.calibrated_device`).  Under FP8 and FP4 the
    attention core, the embedding and the LM head stay in BF16 (Transformer Engine's FP8 and
    NVFP4 recipes cover the linear layers of the decoder; Megatron-Core keeps the output layer
    in BF16)."""
    gemm_device = calibrated_device(device, training.framework, training.dtype)
    lc = layer_costs(model, training, gemm_device, links, S, bf16_device=calibrated_device(device, training.framework, "bf16"))
    head_training = replace(training, dtype="bf16") if training.dtype in NARROW_DTYPES else training
    head_device = calibrated_device(device, training.framework, head_training.dtype)
    emb_s, head_s, head_flops, emb_act, head_act = embedding_head_costs(model, head_training, head_device, links, S)
    mtp_s = mtp_extra_s(model, training, gemm_device, S, head_s) if model.mtp_layers else 0.0
    return DeviceCosts(gemm_device, links, lc, emb_s, head_s, head_flops, emb_act, head_act, mtp_s)


@dataclass(frozen=True)
class StageCost:
    """One stage, arrays over candidates.  Times per micro-batch; memory per GPU in bytes."""

    forward_s: np.ndarray
    backward_s: np.ndarray
    compute_s: np.ndarray
    recompute_s: np.ndarray
    tp_comm_s: np.ndarray
    cp_comm_s: np.ndarray
    ep_comm_s: np.ndarray
    pp_comm_s: np.ndarray
    dp_microbatch_s: np.ndarray  # ZeRO 2/3 sync per micro-batch not hidden by its compute
    offload_microbatch_s: np.ndarray  # host copies (and host adds) per micro-batch not hidden by its compute
    dp_comm_s: np.ndarray  # per-step DP sync (hidden partly behind the last backward)
    dp_window_s: np.ndarray  # the part of the last backward that DP sync can hide behind
    optimizer_s: np.ndarray
    weights_bytes: np.ndarray
    gradients_bytes: np.ndarray
    optimizer_state_bytes: np.ndarray
    activations_bytes: np.ndarray
    workspace_bytes: np.ndarray
    #: host memory of this GPU's offloaded state and activations (not in the GPU's peak)
    host_state_bytes: np.ndarray

    @property
    def time_s(self) -> np.ndarray:
        """Time of one micro-batch through this stage (forward + backward + p2p + exposed
        per-micro-batch ZeRO 2/3 traffic + exposed host copies of offloading)."""
        out: np.ndarray = self.forward_s + self.backward_s + self.pp_comm_s + self.dp_microbatch_s + self.offload_microbatch_s
        return out

    @property
    def peak_memory_bytes(self) -> np.ndarray:
        out: np.ndarray = self.weights_bytes + self.gradients_bytes + self.optimizer_state_bytes + self.activations_bytes + self.workspace_bytes
        return out

    @property
    def fragmentation_reserve_bytes(self) -> np.ndarray:
        """The allocator's fragmentation reserve within the workspace (what the memory interval of
        a framework without measured peaks widens: :mod:`cost_model.transformer.memory`)."""
        out: np.ndarray = self.workspace_bytes - WORKSPACE_BYTES
        return out


def stage_params(
    model: TransformerSpec, S: StrategyArrays, num_layers: ArrayOrFloat, has_embedding: bool, has_head: bool
) -> tuple[FloatArray, FloatArray]:
    """(dense, expert) parameters held by one GPU of a stage.

    Dense layer weights divide over TP; experts over EP and ETP (the experts' tensor-parallel
    size, :func:`cost_model.transformer.moe.expert_tensor_parallel`).  The first stage holds the
    (vocab-parallel) embedding, the last the final norm and the head — a tied head still needs
    its own copy when the embedding lives on another stage (Megatron keeps both and
    all-reduces their gradients) — and the multi-token-prediction modules (Megatron-Core puts
    them after the decoder, on the last stage; their routed experts shard over EP like the decoder's).
    """
    t = S.tp
    expert_total = model.routed_expert_params_per_layer()  # of the average layer (dense-first layers have none)
    dense_layer = dense_layer_params(model)
    dense = num_layers * dense_layer / t
    experts = num_layers * expert_total / (S.ep * expert_tensor_parallel(t, S.cp, S.dp, S.ep, S.etp_pin))
    if has_embedding:
        dense = dense + model.embedding_params() / t
    if has_head:
        head: ArrayOrFloat = model.head_params()
        if model.tie_embeddings:
            head = head + np.where(S.pp > 1, model.vocab_size * model.hidden_size, 0.0)
        mtp_experts = model.mtp_routed_expert_params()
        dense = dense + (head + model.mtp_params() - mtp_experts) / t
        experts = experts + mtp_experts / (S.ep * expert_tensor_parallel(t, S.cp, S.dp, S.ep, S.etp_pin))
    return dense, experts


#: Bytes per parameter of FSDP's reduce-scatter input: fp32.  FSDP2 allocates it in the reduce
#: dtype (``foreach_reduce``: ``reduce_scatter_comm.allocate(..., dtype=reduce_dtype)``) and
#: torchtitan 0.3 admits only ``mixed_precision_reduce = "float32"``; Composer's FSDP1 default
#: mixed precision also reduces in fp32.  The memory is counted at what is allocated; the
#: reduce-scatter's time stays costed at 2 B (``layer_cost.gradient_reduce_bytes`` says why).
FSDP_REDUCE_SCATTER_INPUT_BYTES = 4.0


def fsdp_unsharded_bytes(model: TransformerSpec, training: Training, S: StrategyArrays, live: ArrayOrFloat, has_head: bool) -> FloatArray:
    """Bytes FSDP holds unsharded beyond the sharded state and the stored activations, at the
    stage's peak, by schedule (``live``: the parameters of two decoder layers, the current and
    the prefetched unit; the head is the [V/t, h] output projection, on the last stage):

    * FULL_SHARD (ZeRO 3): a decoder layer's backward holds the two gathered layers (param bytes),
      the layer's unsharded gradients and the fp32 reduce-scatter input they are copied into
      before they are freed (FSDP2 ``_fsdp_collectives.foreach_reduce``:
      ``reduce_scatter_comm.allocate`` of the padded input, ``foreach_reduce_scatter_copy_in``,
      then ``unsharded_grads.clear()``; :data:`FSDP_REDUCE_SCATTER_INPUT_BYTES`).  On the last
      stage the output unit's backward may hold more: torchtitan wraps the final norm and the
      output projection (with a tied embedding) as one unit not resharded after forward
      (``apply_fsdp_to_decoder``: ``reshard_after_forward_policy == "always"`` only) that
      prefetches the last layer for backward (``set_modules_to_backward_prefetch``), so at the
      start of backward, beside every stored activation and the logits, it holds the gathered
      head, its gradient and reduce-scatter input, and one gathered layer.  The peak holds the
      larger phase: for a 128K vocabulary the head's (Llama 3 8B: 525M head parameters against
      218M a layer, 4.6 GB against 2.2 GB in bf16).  The embedding unit gathers in forward, when
      few activations are stored, and in backward after most are freed, so it sets no peak.
    * SHARD_GRAD_OP (ZeRO 2; its weights are resident, counted as weights): the largest unit's
      gradients and reduce-scatter input.
    * Inside a pipeline stage (:func:`~cost_model.transformer.layer_cost.pipelined_fsdp`; weights
      and fp32 gradient accumulators resident): the largest unit's fresh 16-bit gradients before
      they are added into the accumulators.
    * NO_SHARD: nothing.
    """
    pb = param_bytes(training)
    rs = FSDP_REDUCE_SCATTER_INPUT_BYTES
    grad = 0.0 if training.frozen_base else 1.0  # LoRA: frozen weights have no unsharded gradients (the adapters' are not counted)
    layer = 0.5 * live
    head: ArrayOrFloat = model.vocab_size * model.hidden_size / S.tp if has_head else 0.0
    unit = np.maximum(layer, head)
    full_shard = np.maximum(2.0 * layer * pb + grad * layer * (pb + rs), head * (pb + grad * (pb + rs)) + layer * pb)
    out: FloatArray = np.where(pipelined_fsdp(training, S.zero, S.pp), grad * unit * pb,
                               np.where(S.zero >= 3, full_shard, np.where(S.zero == 2, grad * unit * (pb + rs), 0.0)))
    return out


def compute_stretch(training: Training, S: StrategyArrays) -> ArrayOrFloat:
    """The factor DeepSpeed's stage-3 hooks stretch every module's compute by, per candidate
    (1 / :func:`~cost_model.transformer.calibration.sharded_compute_efficiency` under ZeRO-3 on
    the DeepSpeed engine; 1 elsewhere)."""
    hooks = sharded_compute_efficiency(training.framework)
    return np.where(S.zero >= 3, 1.0 / hooks, 1.0) if hooks != 1.0 else 1.0


def stage_cost(
    model: TransformerSpec,
    training: Training,
    dc: DeviceCosts,
    S: StrategyArrays,
    num_layers: ArrayOrFloat,
    stage_index: ArrayOrFloat,
    has_embedding: bool,
    has_head: bool,
    m: ArrayOrFloat,
    cross_node_p2p: ArrayOrFloat | bool,
) -> StageCost:
    """Cost of one pipeline stage holding ``num_layers`` decoder layers.

    The last stage also runs the model's multi-token-prediction modules (DeepSeek-V3 §2.2,
    Megatron-Core ``--mtp-num-layers``, which the Megatron launch sets from the config): per
    module one more decoder layer of the model's kind (costed as its mean layer: time,
    collectives, stored activations, ZeRO-3 unit), a [T, 2h]×[2h, h/t] projection and a second
    output head and loss over the shared vocabulary (:func:`mtp_extra_s`)."""
    lc = dc.layer
    n_decoder = np.asarray(num_layers, dtype=float)
    mtp = float(model.mtp_layers) if has_head else 0.0
    n = n_decoder + mtp
    stretch = compute_stretch(training, S)
    fwd = n * lc.forward_compute_s * stretch
    bwd = n * lc.backward_compute_s * stretch
    extra: ArrayOrFloat = 0.0
    if has_embedding:
        extra = extra + dc.embedding_s
    if has_head:
        extra = extra + dc.head_s
        extra = extra + mtp * dc.mtp_s
    extra = extra * stretch
    compute = fwd + bwd + extra
    if training.reference_model:  # DPO's frozen reference: one more forward of the stage a micro-batch, no backward
        compute = compute + fwd + extra / 3.0
    recompute = n * lc.recompute_s * stretch
    tp = n * lc.tp_comm_s
    cp = n * lc.cp_comm_s
    ep = n * lc.ep_comm_s
    comm = tp + cp + ep
    forward_s = (fwd + extra / 3.0 + comm / 2.0) * (2.0 if training.reference_model else 1.0)
    backward_s = bwd + 2.0 * extra / 3.0 + recompute + comm / 2.0
    pp_comm = np.where(S.pp > 1, 2.0 * S.vpp * pp_p2p_s(model, training, dc.links, S, cross_node_p2p), 0.0)
    # DeepSpeed's pipeline engine: a fixed cost per layer it checkpoints, per micro-batch (every
    # layer under full recompute, which it runs for every layer, and under selective recompute,
    # whose attention core goes through the same checkpoint function; none without recompute)
    engine_s = pipeline_layer_overhead_s(training.framework)
    if engine_s:
        checkpointed = np.where(S.recompute == RECOMPUTE_CODE["none"], 0.0, 1.0)
        pp_comm = pp_comm + np.where(S.pp > 1, engine_s * n_decoder * checkpointed, 0.0)

    dense, experts = stage_params(model, S, n_decoder, has_embedding, has_head)
    decoder_dense = n_decoder * dense_layer_params(model) / S.tp  # of ``dense``, the decoder layers' (the rest: embedding, head)
    etp = expert_tensor_parallel(S.tp, S.cp, S.dp, S.ep, S.etp_pin)
    # ZeRO shards over dp·cp (dp_shard·cp under HSDP), experts over their EDP replicas (their
    # share of each HSDP replica group)
    shard_dense = zero_shard_ranks(S)
    shard_exp = np.maximum(expert_data_parallel(S.tp, S.cp, S.dp, S.ep, S.etp_pin) / zero_replicas(S), 1.0)
    w_d, g_d, o_d = model_state_bytes_per_param(training, S.zero, shard_dense, S.pp)
    w_e, g_e, o_e = model_state_bytes_per_param(training, S.zero, shard_exp, S.pp)
    # LoRA (cost_model.transformer.lora): the model's weights frozen in the training dtype,
    # sharded under ZeRO-3 like any weight; gradients, master weights and optimizer state are
    # the adapters' (the routed experts' held and synchronised as the experts are)
    trainable, trainable_experts = dense, experts
    frozen: ArrayOrFloat = 0.0  # bytes of the frozen base weights this GPU holds (LoRA)
    frozen_host: ArrayOrFloat = 0.0  # bytes of this GPU's frozen shard kept on the host (LoRA under cpu_offload)
    if training.frozen_base:
        trainable = n_decoder * adapter_params_per_layer(model, training, S.tp)
        trainable_experts = n_decoder * expert_adapter_params_per_layer(model, training, S.ep, etp)
        # under QLoRA the decoder's weights in 4 bits, the embedding and head in the training dtype
        frozen = ((dense - decoder_dense) * frozen_weight_bytes_per_param(training, S.zero, shard_dense)
                  + decoder_dense * frozen_weight_bytes_per_param(training, S.zero, shard_dense, decoder=True)
                  + experts * frozen_weight_bytes_per_param(training, S.zero, shard_exp, decoder=True))
        if training.cpu_offload:  # full sharding only (model_state_bytes_per_param): the shard on the host, none on the GPU
            frozen_host = np.where(S.zero >= 3, frozen, 0.0)
            frozen = np.where(S.zero >= 3, 0.0, frozen)
        weights = frozen + trainable * w_d + trainable_experts * w_e
    else:
        weights = dense * w_d + experts * w_e
    if training.reference_model:  # DPO's frozen reference: its weights as the policy's are held, nothing else
        weights = weights + (dense * frozen_weight_bytes_per_param(training, S.zero, shard_dense)
                             + experts * frozen_weight_bytes_per_param(training, S.zero, shard_exp))
    if training.dtype == "fp4":  # the decoder's linear weights also held quantised (FP4_WEIGHT_CACHE_BYTES)
        weights = weights + (decoder_dense + experts) * FP4_WEIGHT_CACHE_BYTES
    fp8_cache = fp8_weight_cache_bytes_per_param(training, dc.device)
    if fp8_cache:  # FP8 casts cached over the step beside whole 16-bit weights (Megatron-FSDP's sharded ones: not counted)
        weights = weights + np.where(S.zero >= 3, 0.0, (decoder_dense + experts) * fp8_cache)
    grads = trainable * g_d + trainable_experts * g_e
    if training.optimizer_in_backward:  # each parameter stepped in its post-accumulate-grad hook, its gradient then freed
        grads = np.zeros_like(np.asarray(grads, dtype=float))
    opt = trainable * o_d + trainable_experts * o_e
    scalar_params: ArrayOrFloat = 0.0
    if training.muon:
        # the embedding and head (the rest of ``dense`` beside the decoder's and the MTP modules'
        # matrices): Muon's scalar optimizer (Adam) steps them and keeps their Adam state
        mtp_dense = (model.mtp_params() - model.mtp_routed_expert_params()) / S.tp if has_head else 0.0
        scalar_params = dense - decoder_dense - mtp_dense
        scalar_training = replace(training, optimizer="adam")
        opt = opt + scalar_params * (model_state_bytes_per_param(scalar_training, S.zero, shard_dense, S.pp)[2] - o_d)
    # offload to the host (layer_cost.offloaded_state_bytes_per_param): the host's share of the
    # (partitioned) state; the expert weights counted as dense ones of the same shard, for the copies
    # (LoRA: the adapters' state; under cpu_offload the frozen base's shard goes to the host too)
    offloading = training.optimizer_offload_fraction > 0.0 or training.cpu_offload
    host_state: ArrayOrFloat = 0.0
    offload_mb: ArrayOrFloat = 0.0
    if offloading:
        partitioned = optimizer_state_partitioned(training, S.zero, S.pp)
        host_state = offloaded_state_bytes_per_param(training) * (trainable / np.where(partitioned, shard_dense, 1.0)
                                                                  + trainable_experts / np.where(partitioned, shard_exp, 1.0))
        # the trainable parameters whose state moves, the experts' counted as dense ones of the same shard
        moved_params = trainable + trainable_experts * shard_dense / shard_exp
        host_state = host_state + frozen_host
    if runs_deepspeed_engine(training.framework):
        # DeepSpeed ZeRO-2/3's fp32 gradient copy of the step, reserved beside the backward's
        # cached blocks (layer_cost.deepspeed_step_gradient_bytes)
        grads = grads + deepspeed_step_gradient_bytes(training, S.zero, trainable / shard_dense + trainable_experts / shard_exp)
    buckets = gradient_bucket_bytes(training, S.zero, S.pp)
    grads = grads + buckets
    # the interleaved schedule's micro-batch group (cost_model.schedule): its warm-up holds more
    # (asked of the interleaved rows alone: a 1F1B row's count stands in as pp, which needs no search)
    # (several schedules a step, training.pipeline_schedules_per_step: each holds what an m/k schedule does)
    m_sched = np.asarray(m, dtype=float) / training.pipeline_schedules(S.pp)
    group = interleaved_microbatch_groups(training.framework, np.where(S.vpp > 1, m_sched, S.pp), S.pp, training.microbatch_group_size_per_vp_stage)
    inflight = inflight_microbatches(stage_index, S.pp, m_sched, S.vpp, group, interleaved_forwards_first(training.framework, m_sched, S.pp))
    embedding_act = dc.embedding_act_bytes if has_embedding else 0.0
    acts = (n * lc.activation_bytes + embedding_act) * inflight
    if training.activation_offloading:
        # what the offload moves (every saved tensor, the embedding's among them, or Megatron-Core's
        # chosen modules': lc.offloaded_activation_bytes) of every in-flight micro-batch leaves for
        # pinned host memory but for the layer the backward works on
        kept = np.minimum(n, ACTIVATION_OFFLOAD_KEPT_LAYERS) * lc.offloaded_activation_bytes
        moved = n * lc.offloaded_activation_bytes + (0.0 if training.offload_modules else embedding_act)
        host_state = host_state + moved * inflight - kept
        offload_mb = offload_mb + activation_offload_s(moved - kept, dc.device, forward_s, backward_s)
        acts = acts - moved * inflight + kept
    # Working set of the layer being (re)computed in backward.
    acts = acts + lc.recompute_working_bytes
    if has_head:  # the logits each output head (the model's, the MTP modules') keeps for backward
        acts = acts + dc.head_act_bytes * (1.0 + mtp)
    # ZeRO-3 gathers a layer's full weights ahead of use (current + prefetched); DeepSpeed's
    # stage 3 caps the gathered parameters at stage3_max_live_parameters (default 1e9); FSDP's
    # unsharded buffers by schedule: fsdp_unsharded_bytes.
    live = 2.0 * (dense_layer_params(model) / S.tp + model.routed_expert_params_per_layer() / (S.ep * etp))
    # QLoRA gathers and holds its layers' 4-bit storage, FP8 weights their 8-bit: counted as that many 16-bit values
    quantised = decoder_gather_fraction(training)
    if runs_deepspeed_engine(training.framework):
        live = np.minimum(live, DEEPSPEED_MAX_LIVE_PARAMETERS)
    if training.framework == "fsdp":
        acts = acts + fsdp_unsharded_bytes(model, training, S, live * quantised, has_head)
    else:
        acts = acts + np.where(S.zero >= 3, live * quantised * param_bytes(training), 0.0)
    # The allocator's fragmentation of what is freed and reallocated during a step: gradients
    # and activations (gathered weights among them), not the resident weights nor the optimizer
    # state, allocated once, nor DeepSpeed's fixed-size gradient buckets, nor a framework's
    # persistent gradient buffer (FrameworkRules.persistent_grad_buffer: Megatron-Core's):
    # layer_cost.fragmentation_fraction.
    workspace = WORKSPACE_BYTES + fragmentation_fraction() * (churned_gradients(grads - buckets, training.framework) + acts)

    # the updated weights all-gathered as the decoder holds them (FP8 weights: 1 byte), the embedding and head in 16 bits
    gather_fraction = 1.0 - (1.0 - quantised) * decoder_dense / np.maximum(trainable, 1.0) if training.fp8_param_gather else 1.0
    dp_comm, dp_mb, mb_sync, dp_mb_forward = dp_gradient_comm_s(
        trainable, training, S, dc.links, trainable_experts,
        weight_fraction=gather_fraction, expert_weight_fraction=quantised if training.fp8_param_gather else 1.0)
    # ZeRO-3's per-micro-batch gathers and reduce-scatters, except FSDP inside a pipeline stage,
    # which gathers and reduces once a step (pipelined_fsdp: dp_gradient_comm_s's per-step term)
    per_microbatch_sharding = (S.zero >= 3) & ~pipelined_fsdp(training, S.zero, S.pp)
    # ZeRO-3 / FSDP: per-layer parameter gathers and gradient reduce-scatters (the layers and the
    # embedding/head as one more unit each), replacing the whole-stage estimate.
    units = n + float(has_embedding) + float(has_head)
    per_unit = sharded_collectives_per_layer(model, training.framework)
    matrices = 2 + model.ffn_matrices if per_unit > 1 else 1  # the tensors that carry the bytes
    # DeepSpeed's re-gather for a recomputed forward: decoder layers only, spread over the units
    layer_passes = sharded_passes_per_microbatch(model, training.framework, S)
    passes = layer_passes if isinstance(layer_passes, float) else 3.0 + (layer_passes - 3.0) * n / np.maximum(units, 1.0)

    # one all-gather pass and the reduce-scatter pass of the stage's units (experts over their
    # EDP replicas), each a micro-batch's worth: layer_cost.sharded_passes_s
    gathered = dense if model.is_moe else dense + experts
    if quantised != 1.0:  # QLoRA, FP8 weights: the decoder's weights move as they are held
        gathered = gathered - (1.0 - quantised) * (decoder_dense + (0.0 if model.is_moe else experts))
    gather, reduce = sharded_passes_s(gathered / np.maximum(units, 1.0), units, training, S, dc.links, per_unit, bandwidth_messages=matrices)
    if training.frozen_base:  # LoRA: the frozen weights are gathered, the adapters' gradients alone reduced
        _, reduce = sharded_passes_s(trainable / np.maximum(units, 1.0), units, training, S, dc.links, per_unit, bandwidth_messages=matrices)
    sharded = (passes - 1.0) * gather + reduce
    if model.is_moe:  # the experts' passes over their EDP replicas, ep·etp global ranks apart
        def expert_passes(params: ArrayOrFloat) -> tuple[FloatArray, FloatArray]:
            return sharded_passes_s(params / np.maximum(n, 1.0), n, training, S, dc.links, per_unit, ranks=shard_exp, stride=S.ep * etp,
                                    bandwidth_messages=matrices)

        g_e, r_e = expert_passes(experts * quantised)
        gather = gather + g_e
        if training.frozen_base:  # the experts' adapters' gradients alone reduced
            r_e = expert_passes(trainable_experts)[1]
        sharded = sharded + (layer_passes - 1.0) * g_e + r_e
    # DeepSpeed's tensor-list gathers copy their output out per rank (0 elsewhere), each pass
    copy_out = deepspeed_gather_copy_out_s((gathered + (experts * quantised if model.is_moe else 0.0)) / np.maximum(units, 1.0), units,
                                           training, S, dc.device, per_unit, 1.0)
    sharded = sharded + (np.asarray(passes) - 1.0) * copy_out
    # the forward's share: one all-gather pass (with its copies); DPO's reference gathers its own weights too
    forward_gathers = gather + copy_out
    if training.reference_model:
        sharded = sharded + forward_gathers
        forward_gathers = 2.0 * forward_gathers
    # HSDP under FSDP: the replicas' all-reduce of the gradient shards runs with every
    # micro-batch's reduce-scatter, in the backward (mb_sync, layer_cost.replica_sync_per_microbatch;
    # dp_gradient_comm_s has it in ZeRO-2's per-micro-batch term, the stage-3 gathers here not)
    dp_mb = np.where(per_microbatch_sharding, sharded, dp_mb)
    # ZeRO 2/3 traffic of a micro-batch is prefetched/bucketed under that micro-batch's compute,
    # phase by phase (layer_cost.sharded_microbatch_exposed_s).
    overlap = dp_overlap_fraction(training, dc.device, S.pp, S.zero)
    overlap_mb = overlap * np.where(S.zero >= 3, sharded_prefetch_overlap(training.framework), 1.0)
    dp_mb_exposed = sharded_microbatch_exposed_s(dp_mb, S.zero, forward_s, backward_s, overlap_mb, passes,
                                                 backward_only_s=np.where(S.zero >= 3, mb_sync, 0.0),
                                                 forward_s_comm=np.where(per_microbatch_sharding, forward_gathers, dp_mb_forward))
    if training.optimizer_offload_fraction > 0.0 and runs_deepspeed_engine(training.framework):
        # ZeRO-Offload's accumulated gradients on the host (stages 1-2, the state partitioned over
        # dp·cp): copied out and back with each micro-batch
        offload_mb = offload_mb + np.where((S.zero == 1) | (S.zero == 2), zero_offload_accumulation_s(
            moved_params, training, dc.device, shard_dense, backward_s, m), 0.0)
    if training.cpu_offload:  # the sharded state on the host: each gather's and reduce's host copies (full sharding only)
        offload_mb = offload_mb + np.where(S.zero >= 3, cpu_offload_microbatch_s(
            moved_params, training, dc.device, shard_dense, forward_s + backward_s, m, frozen_shard_bytes=frozen_host), 0.0)
    # parameter tensors of the stage: its layers, the embedding (and learned positions), the
    # final norm and an untied head (only a for-loop optimizer pays per tensor)
    tensors = n * param_tensors_per_layer(model) + (1 + int(model.learned_positions > 0) if has_embedding else 0) + (
        (2 if model.bias else 1) + (0 if model.tie_embeddings else 1) if has_head else 0)
    expert_tensors: ArrayOrFloat = 0.0
    if training.frozen_base:  # LoRA: the adapters' A and B alone are stepped and accumulated
        tensors = n_decoder * adapter_tensors_per_layer(model, training)
        expert_tensors = n_decoder * expert_adapter_tensors_per_layer(model, training, S.ep)
    stepped = trainable - scalar_params  # by the optimizer asked for (Muon: the matrices)
    optimizer = optimizer_step_s(stepped + trainable_experts, training, dc.device, S, tensors)
    if model.is_moe:  # the experts' optimizer state is sharded over EDP, not dp·cp
        optimizer = optimizer_step_s(stepped, training, dc.device, S, tensors) + optimizer_step_s(
            trainable_experts, training, dc.device, S, expert_tensors,
            shard=np.where(optimizer_state_partitioned(training, S.zero, S.pp), shard_exp, 1.0))
    if training.muon:  # the embedding and head stepped by Adam; the matrices' Newton-Schulz iterations (transformer.muon)
        optimizer = optimizer + optimizer_step_s(scalar_params, scalar_training, dc.device, S) + orthogonalize_s(
            model, S, dc.device, n, np.where(S.zero == 1, shard_dense, 1.0), np.where(S.zero == 1, shard_exp, 1.0))
    # DeepSpeed's engine accumulates each micro-batch's gradients in a separate pass after its
    # backward, on the compute stream (reported as compute, like the layers' other memory-bound work).
    accumulate = grad_accumulation_s(trainable + trainable_experts, training, dc.device, S, tensors + expert_tensors)
    backward_s = backward_s + accumulate
    compute = compute + accumulate
    return StageCost(
        forward_s=forward_s,
        backward_s=backward_s,
        compute_s=compute,
        recompute_s=recompute,
        tp_comm_s=tp,
        cp_comm_s=cp,
        ep_comm_s=ep,
        pp_comm_s=pp_comm,
        dp_microbatch_s=dp_mb_exposed,
        offload_microbatch_s=offload_mb + np.zeros_like(dp_mb_exposed),
        dp_comm_s=dp_comm,
        dp_window_s=overlap * backward_s,
        optimizer_s=optimizer,
        weights_bytes=weights,
        gradients_bytes=grads,
        optimizer_state_bytes=opt,
        activations_bytes=acts,
        workspace_bytes=workspace,
        host_state_bytes=np.broadcast_to(host_state, np.shape(opt)),
    )


@dataclass(frozen=True)
class StepCost:
    step_time_s: np.ndarray
    pipeline_s: np.ndarray
    bottleneck_index: np.ndarray
    dp_exposed_s: np.ndarray
    optimizer_s: np.ndarray
    breakdown_s: dict[str, np.ndarray]


def stack_stages(stages: list[StageCost]) -> StageCost:
    """One StageCost whose fields are [stages, candidates] arrays."""
    import dataclasses

    n = np.broadcast_shapes(*[np.shape(st.time_s) for st in stages])
    return StageCost(
        **{
            f.name: np.stack([np.broadcast_to(getattr(st, f.name), n) for st in stages])
            for f in dataclasses.fields(StageCost)
        }
    )


def combine_stages(stages: list[StageCost] | StageCost, S: StrategyArrays, m: ArrayOrFloat, schedules: ArrayOrFloat = 1) -> StepCost:
    """Step time of a 1F1B (optionally interleaved) pipeline over the given stages.

    With per-micro-batch stage times t_i, m micro-batches and v virtual stages per device:
    ``m·max_i t_i + (Σ t_i − max_i t_i)/v`` — for equal stages ``t·m·(1 + (p−1)/(m·v))``,
    the bubble fraction (p−1)/(m·v) of Narayanan et al. 2021 (:mod:`cost_model.schedule`).
    A step of k whole schedules of m/k micro-batches (``schedules``, per candidate:
    ``Training.pipeline_schedules``) fills and drains the pipeline k times:
    ``m·max_i t_i + k·(Σ t_i − max_i t_i)/v`` — the formula with v/k — and syncs its data-parallel
    gradients after each (k times the exposed sync below).  Then the DP gradient sync not
    hidden behind the last micro-batch's backward (``dp_window_s``: none on a device whose
    reduction shares its compute cores) nor behind the pipeline drain for later stages (the
    stage's own device is idle then, whatever kind it is), plus what the part hidden behind
    the backward slows that backward (``overlap_compute_slowdown``), then the optimizer step
    of the slowest stage.  ``stages`` is a list of per-stage costs or one stacked cost with
    [stages, candidates] arrays.
    """
    st = stages if isinstance(stages, StageCost) else stack_stages(stages)
    m = np.asarray(m, dtype=float)
    k = np.asarray(schedules, dtype=float)
    pipeline, bottleneck = pipeline_time_s(st.time_s, m, S.vpp / k)  # time_s: [stages, candidates]
    # each schedule ends in its own data-parallel sync (FSDP2 inside a pipeline stage gathers at a
    # schedule's first forward and reduce-scatters at its last backward)
    dp_exposed = k * exposed_dp_sync_s(st.dp_comm_s, st.dp_window_s, st.backward_s, S.vpp, overlap_compute_slowdown())
    optimizer = st.optimizer_s.max(axis=0)
    step = pipeline + dp_exposed + optimizer

    # Breakdown along the critical path: the bottleneck stage's components × m, the remaining
    # pipeline time is the bubble.
    def pick(arr: np.ndarray) -> np.ndarray:
        out: np.ndarray = np.take_along_axis(arr, bottleneck[None, ...], axis=0)[0]
        return out

    compute = m * pick(st.compute_s)
    recompute = m * pick(st.recompute_s)
    tp_c = m * pick(st.tp_comm_s)
    cp_c = m * pick(st.cp_comm_s)
    ep_c = m * pick(st.ep_comm_s)
    pp_c = m * pick(st.pp_comm_s)
    dp_mb = m * pick(st.dp_microbatch_s)
    offload = m * pick(st.offload_microbatch_s)
    bubble = pipeline - (compute + recompute + tp_c + cp_c + ep_c + pp_c + dp_mb + offload)
    breakdown = {
        "compute": compute,
        "recompute": recompute,
        "tp_comm": tp_c,
        "cp_comm": cp_c,
        "ep_comm": ep_c,
        "pp_comm": pp_c,
        "dp_comm_exposed": dp_exposed + dp_mb,
        "offload_exposed": offload,
        # Floating-point residue of the subtraction is not a bubble.
        "bubble": np.where(bubble > 1e-9 * pipeline, bubble, 0.0),
        "optimizer": optimizer,
    }
    return StepCost(step, pipeline, bottleneck, dp_exposed, optimizer, breakdown)


def mtp_extra_s(model: TransformerSpec, training: Training, device: DeviceSpec, S: StrategyArrays, head_s: ArrayOrFloat) -> FloatArray:
    """Seconds per micro-batch of one multi-token-prediction module beyond its decoder layer:
    the projection of the concatenated [T, 2h] normed hidden state and embedding to h
    (Megatron-Core's column-parallel ``eh_proj``: forward and two backward GEMMs) and its own
    output head and loss (the shared head's GEMMs and cross-entropy again, ``head_s``)."""
    from cost_model.compute import gemm_time_s

    h = float(model.hidden_size)
    tokens = S.mbs * training.sequence_length / S.cp
    out: FloatArray = 3.0 * gemm_time_s(tokens, h / S.tp, 2.0 * h, device, training.dtype) + head_s
    return out


def _layer_forward_flops(model: TransformerSpec, s: float) -> float:
    """Forward FLOPs of the average decoder layer for one sequence: every GEMM weight a token
    multiplies and the attention core's heads × width × keys (TransformerSpec: head_dim, MLA,
    dense-first layers, windows)."""
    return 2 * s * model.matmul_params_per_token() + 4 * s * model.attention_core_width(s)


def model_flops_per_step(model: TransformerSpec, training: Training) -> float:
    """Model FLOPs of one training step (forward + backward = 3× forward, no recompute),
    counting every GEMM (GQA, gated FFN, top-k experts, router) and the full s×s attention
    square, as Narayanan et al. 2021 Eq. 3 and Megatron-LM's MFU do.  For GPT shapes this
    is exactly 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)).  Multi-token-prediction modules count
    as Megatron-LM's FLOP formula counts them: a decoder layer, the [2h, h] projection and an
    output head each.  LoRA (frozen weights, :mod:`cost_model.transformer.lora`): a frozen GEMM
    runs its forward and its dX (2× forward), the attention core its forward and backward (3×),
    the adapters' GEMMs all three (3× their 2·r·(d_in + d_out) a token)."""
    s = float(training.sequence_length)
    h = float(model.hidden_size)
    layer_fwd = _layer_forward_flops(model, s)
    head_fwd = 2 * s * h * model.vocab_size
    mtp_fwd = model.mtp_layers * (layer_fwd + 2 * s * 2 * h * h + head_fwd)
    if training.frozen_base:
        attn_fwd = 4 * s * model.attention_core_width(s)
        layer = 2.0 * (layer_fwd - attn_fwd) + 3.0 * attn_fwd + 3.0 * _adapter_forward_flops(model, training, s)
        return training.global_batch_size * (model.num_layers * layer + 2.0 * (head_fwd + mtp_fwd))
    return 3.0 * training.global_batch_size * (model.num_layers * layer_fwd + head_fwd + mtp_fwd)


def _adapter_forward_flops(model: TransformerSpec, training: Training, s: float) -> float:
    """Forward FLOPs of the average layer's LoRA adapters for one sequence: 2·r·(d_in + d_out) a
    token each — their whole parameter count (at tp 1) twice, and each routed token's k experts'
    adapters."""
    if not training.frozen_base:
        return 0.0
    one_expert = float(expert_adapter_params_per_layer(model, training, float(model.num_experts), 1.0))
    return 2 * s * (float(adapter_params_per_layer(model, training, 1.0)) + model.experts_per_token * one_expert)


def recompute_flops_per_step(model: TransformerSpec, training: Training, recompute: str, fraction: float = 1.0,
                             modules: Sequence[str] = ()) -> float:
    """Extra forward FLOPs executed by activation recomputation (hardware FLOPs − model FLOPs);
    ``fraction``: of the layers a full recompute recomputes
    (:func:`cost_model.transformer.layer_cost.recompute_fraction`).  Selective: the attention core
    where it is checkpointed (:func:`~cost_model.transformer.layer_cost.checkpoints_attention_core`:
    unfused, or fused under Megatron-Core); under torchtitan's op-level policy also the matmuls it recomputes
    (:func:`cost_model.transformer.layer_cost.op_level_recomputed_gemm_flops`); under Megatron-Core
    the GEMMs of its recompute ``modules`` (``Strategy.recompute_modules``; empty: the attention
    core alone)."""
    if recompute == "none":
        return 0.0
    s = float(training.sequence_length)
    if recompute == "full":  # every decoder layer's forward again (the MTP modules' included), with LoRA's adapters
        return fraction * training.global_batch_size * (model.num_layers + model.mtp_layers) * (
            _layer_forward_flops(model, s) + _adapter_forward_flops(model, training, s))
    tokens = float(training.global_batch_size) * s
    chosen = frozenset(modules or ("core_attn",))
    redone_core = checkpoints_attention_core(training) and ("core_attn" in chosen or "full_attn" in chosen or op_level_selective(model, training))
    core = training.global_batch_size * model.num_layers * 4 * s * model.attention_core_width(s) if redone_core else 0.0
    if op_level_selective(model, training):  # torchtitan: the even-numbered matmuls (and routed experts) of every layer
        return core + model.num_layers * sum(w * float(op_level_recomputed_gemm_flops(v, tokens, 1.0)) for w, v in model.layer_variants())
    return core + tokens * _module_recompute_flops_per_token(model, chosen)


def _module_recompute_flops_per_token(model: TransformerSpec, modules: frozenset[str]) -> float:
    """Forward GEMM FLOPs per token that Megatron-Core's recompute modules run again, summed over
    the layers (:func:`cost_model.transformer.layer_cost.selective_module_costs`): the dense
    MLP (``mlp``), the whole MoE FFN — router, k experts, shared experts — (``moe``), the shared
    experts alone (``shared_experts``), MLA's up-projections (``mla_up_proj``) and, for PaddleNLP's
    ``full_attn``, the attention's projections (its QKV — or MLA's down- and up-projections — and
    output weights); the norms and activations are memory-bound passes without GEMM FLOPs."""
    h, fm = float(model.hidden_size), float(model.ffn_matrices)
    dense_layers = float(len(model.dense_layer_indices)) if model.is_moe else float(model.num_layers)
    moe_layers = float(model.moe_layers) if model.is_moe else 0.0
    shared = 2.0 * fm * h * float(model.shared_expert_ffn_hidden_size)
    out = 0.0
    if "mlp" in modules:
        out += dense_layers * 2.0 * fm * h * float(model.dense_ffn_hidden_size or model.ffn_hidden_size)
    if "moe" in modules:
        out += moe_layers * (2.0 * model.experts_per_token * fm * h * model.ffn_hidden_size + 2.0 * h * model.num_experts + shared)
    elif "shared_experts" in modules:
        out += moe_layers * shared
    if "mla_up_proj" in modules and model.is_mla:
        a = float(model.num_heads)
        q_up = model.q_lora_rank * a * (model.head_dim + model.qk_rope_head_dim) if model.q_lora_rank else 0.0
        out += model.num_layers * 2.0 * (q_up + model.kv_lora_rank * a * (model.head_dim + model.v_head_dim))
    if "full_attn" in modules:
        out += model.num_layers * 2.0 * (model.qkv_weights() + model.attn_out_size * h)
    return out
