"""Per-layer costs of a transformer under a parallel strategy — vectorised.

Every function takes a :class:`StrategyArrays` (one numpy array per strategy knob, all the same
length) and returns arrays of that length, so the planner costs thousands of candidates in one
call and :func:`cost_model.estimate` costs one (length-1 arrays) through the *same* code.

Notation (DESIGN.md appendix): b micro-batch, s sequence, h hidden, a heads, g KV heads,
d head dim, f FFN hidden, V vocabulary, t tensor-parallel size, c context-parallel size.
Per GPU a layer sees T = b·s/c tokens.

Sources: GEMM shapes of Megatron-LM tensor parallelism (Shoeybi et al. 2019: column-parallel
QKV and FC1, row-parallel projection and FC2; two all-reduces forward, two backward);
activation bytes per layer from Korthikanti et al. 2022 Table 2, generalised term by term to
grouped-query attention, gated FFNs, fused attention and context parallelism (each term's
origin is given where it is computed); model state from Rajbhandari et al. 2020 (ZeRO).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources
from typing import Any

import numpy as np
import numpy.typing as npt

from cost_model.comm import (
    ArrayOrFloat,
    FloatArray,
    Links,
    allreduce_time_s,
    p2p_time_s,
    reduce_scatter_time_s,
)
from cost_model.compute import (
    FLASH_BACKWARD_RATIO,
    attention_flops,
    first_touch_s,
    flash_attention_time_s,
    gemm_fwd_bwd_time_s,
    gemm_time_s,
    memory_bound_time_s,
)
from cost_model.devices import BYTES_PER_ELEMENT, FAMILY_EFFICIENCY, NARROW_DTYPES, DeviceSpec
from cost_model.frameworks import ALL_RECOMPUTE_MODULES, rules_for, runs_deepspeed_engine
from cost_model.strategy import Strategy
from cost_model.topology import (
    Axes,
    alltoall_extra_s,
    dimension_axes,
    expert_axes,
    hierarchical_collective_extra_s,
    members_in,
    nesting_code,
    p2p_extra_s,
    shard_axes,
    split_axes,
    zero_replicas,
    zero_shard_ranks,
)
from cost_model.training import Training
from cost_model.transformer.context_parallel import cp_layer_comm_s
from cost_model.transformer.lora import adapter_costs, base_bytes_per_param, dequantize_s, saved_activation_delta_bytes
from cost_model.transformer.mla import mla_latent_activation_bytes, mla_projection_fwd_bwd_s, mla_projection_shapes
from cost_model.transformer.moe import (
    MoeFfnCost,
    expected_nodes_hit,
    expert_data_parallel,
    expert_load_factor,
    expert_tensor_parallel,
    local_tokens,
    moe_activation_bytes,
    moe_ffn_costs,
    received_slots,
)
from cost_model.transformer.spec import TransformerSpec
from cost_model.units import gbps_to_bytes_per_s

RECOMPUTE_CODE = {"none": 0, "selective": 1, "full": 2}

#: Fixed per-GPU reserve for the CUDA context, cuBLAS/NCCL workspaces (bytes), plus a fraction
#: lost to the caching allocator's fragmentation (reserved − allocated over allocated) of the
#: memory that is allocated and freed during a step: gradients (16-bit ``.grad`` tensors) and
#: activations (with ZeRO-3/FSDP's gathered weights).  The resident weights and the optimizer
#: state are allocated once, into segments of their own size that never return to the cache
#: (DeepSpeed allocates the optimizer state up front for that reason:
#: ``initialize_optimizer_states``), so they do not fragment.  On the 48 measured peaks
#: (``bench/acceptance.py``'s ``fragmentation_bases``) this base fits them with a median |error|
#: of 2.5% and a p90 of 6.7%, against 2.8% and 7.7% with the resident weights counted as
#: fragmenting too, as an earlier version did.
#: PyTorch reports reserved/allocated of 1.1–1.3 on large-model runs: the prior is 0.2; the
#: value in force is fitted by ``bench/acceptance.py --write`` (the one that makes the median
#: log error of the measured device peaks of the public file zero, within
#: :data:`FRAGMENTATION_BOUNDS`) and stored in ``cost_model/data/memory_interval.json``.
WORKSPACE_BYTES = 1.5e9
FRAGMENTATION_PRIOR = 0.2
FRAGMENTATION_BOUNDS = (0.05, 0.4)


@lru_cache(maxsize=1)
def fragmentation_fraction() -> float:
    """The caching allocator's fragmentation fraction in force (module comment above): the
    fitted value of ``cost_model/data/memory_interval.json``, else :data:`FRAGMENTATION_PRIOR`."""
    try:
        doc = json.loads(resources.files("cost_model").joinpath("data/memory_interval.json").read_text())
    except FileNotFoundError:
        return FRAGMENTATION_PRIOR
    lo, hi = FRAGMENTATION_BOUNDS
    return min(hi, max(lo, float(doc.get("fragmentation_fraction", FRAGMENTATION_PRIOR))))

#: With ``Training.tp_comm_overlap`` the TP collectives are pipelined with the GEMMs they feed
#: (Megatron-Core userbuffers): the part that a GEMM of the layer can hide is hidden, at most
#: this fraction of the collective.
TP_OVERLAP_MAX_HIDDEN = 0.8
#: Fraction of one micro-batch's backward compute of a stage during which bucketed DP gradient
#: reduction can run (the first buckets are ready only after the last layers' backward).
DP_OVERLAP_WINDOW = 0.8


def dp_reduction_overlaps(framework: str, grad_reduce_overlap: bool, pp: Any = 1, zero_stage: Any = 0) -> Any:
    """Whether the DP gradient reduction runs overlapped with backward (elementwise over ``pp``
    and ``zero_stage``): as ``grad_reduce_overlap`` (``Training``'s) asks, except where a pipeline
    reduces only after the stage's last backward — DeepSpeed's pipeline engine (pp > 1), which
    turns ``overlap_comm`` off ("Pipeline parallelism does not support overlapped
    communication", ``runtime/engine.py``; what ``ds_config.json`` says), and fully sharded FSDP
    under ``torch.distributed.pipelining`` (:func:`pipelined_fsdp`: ``perform_reduce_grad``)."""
    pipeline_off = np.asarray(pp) > 1 if runs_deepspeed_engine(framework) else _defers_gradient_sync(framework, zero_stage, pp)
    return np.logical_and(grad_reduce_overlap, np.logical_not(pipeline_off))


def dp_overlap_fraction(training: Training, device: DeviceSpec, pp: Any = 1, zero_stage: Any = 0) -> Any:
    """Fraction of a stage's backward pass that hides its DP gradient reduction (elementwise
    over ``pp`` and ``zero_stage``).

    ``DP_OVERLAP_WINDOW`` where the reduction is overlapped with backward
    (:func:`dp_reduction_overlaps`), scaled by the device's ``comm_overlap_fraction``: the
    reduction hides only where it runs beside the compute (GPUs, 1), not where it shares the
    cores that compute (CPUs, 0: the all-reduce adds to the step).  0 without overlap.
    """
    out = np.where(dp_reduction_overlaps(training.framework, training.grad_reduce_overlap, pp, zero_stage), DP_OVERLAP_WINDOW * device.efficiency.comm_overlap_fraction, 0.0)
    return float(out) if out.ndim == 0 else out


@dataclass(frozen=True)
class StrategyArrays:
    """Struct of arrays: the i-th element of every field is one candidate strategy."""

    dp: np.ndarray
    tp: np.ndarray
    pp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    vpp: np.ndarray
    mbs: np.ndarray
    sp: np.ndarray  # bool
    recompute: np.ndarray  # 0 none, 1 selective, 2 full
    zero: np.ndarray
    nest: np.ndarray | None = None  # nesting order code (cost_model.topology.NESTINGS); None: Megatron's
    #: Strategy.recompute_num_layers (full recompute of the first N layers of each model chunk;
    #: 0 every layer); None: every layer for all candidates
    recompute_layers: np.ndarray | None = None
    #: Strategy.dp_shard (ZeRO state sharded over dp_shard·cp ranks, replicated over the rest;
    #: 0 the whole group); None: full sharding for all candidates
    dp_shard: np.ndarray | None = None
    #: Strategy.etp (the experts' tensor-parallel size; 0 Megatron-Core's default rule,
    #: :func:`cost_model.transformer.moe.expert_tensor_parallel`); None: the rule for all
    etp: np.ndarray | None = None
    #: Strategy.recompute_modules as a bitmask over :data:`cost_model.frameworks.ALL_RECOMPUTE_MODULES`
    #: (:func:`recompute_modules_mask`; 0 the default, the attention core); None: 0 for all
    recompute_modules: np.ndarray | None = None
    #: Layers under one checkpoint of a full recompute (Strategy.recompute_method uniform's
    #: recompute_num_layers; 1 every layer its own); None: 1 for all candidates
    recompute_group: np.ndarray | None = None

    @staticmethod
    def from_strategies(strategies: Sequence[Strategy]) -> StrategyArrays:
        def col(fn: Callable[[Strategy], float], dtype: type = float) -> np.ndarray:
            return np.array([fn(s) for s in strategies], dtype=dtype)

        return StrategyArrays(
            dp=col(lambda s: s.dp),
            tp=col(lambda s: s.tp),
            pp=col(lambda s: s.pp),
            cp=col(lambda s: s.cp),
            ep=col(lambda s: s.ep),
            vpp=col(lambda s: s.vpp),
            mbs=col(lambda s: s.micro_batch_size),
            sp=col(lambda s: s.sequence_parallel, bool),
            recompute=col(lambda s: RECOMPUTE_CODE[s.recompute]),
            zero=col(lambda s: s.zero_stage),
            nest=col(lambda s: nesting_code(s.nesting)) if any(s.nesting is not None for s in strategies) else None,
            recompute_layers=col(lambda s: 0 if s.recompute_method == "uniform" else s.recompute_num_layers)
            if any(s.recompute_num_layers and s.recompute_method != "uniform" for s in strategies) else None,
            dp_shard=col(lambda s: s.dp_shard) if any(s.dp_shard for s in strategies) else None,
            etp=col(lambda s: s.etp) if any(s.etp for s in strategies) else None,
            recompute_modules=col(lambda s: recompute_modules_mask(s.recompute_modules))
            if any(s.recompute_modules for s in strategies) else None,
            recompute_group=col(lambda s: s.recompute_num_layers if s.recompute_method == "uniform" else 1)
            if any(s.recompute_method == "uniform" for s in strategies) else None,
        )

    def __len__(self) -> int:
        return len(self.dp)

    @property
    def etp_pin(self) -> np.ndarray | float:
        """The ``etp`` column, or 0 (the default rule for every candidate) when none pins it."""
        return 0.0 if self.etp is None else self.etp

    def take(self, index: npt.ArrayLike) -> StrategyArrays:
        cols: dict[str, Any] = {k: None if getattr(self, k) is None else getattr(self, k)[index] for k in self.__dataclass_fields__}
        return StrategyArrays(**cols)


@dataclass(frozen=True)
class LayerCosts:
    """Costs of ONE decoder layer for ONE micro-batch on one GPU (arrays over candidates).

    Times in seconds.  ``forward_s``/``backward_s`` include the layer's compute and its exposed
    tensor/context/expert-parallel communication; the ``*_comm_s`` fields say how much of them
    is communication, ``recompute_s`` is extra backward work from activation recomputation.
    """

    forward_compute_s: np.ndarray
    backward_compute_s: np.ndarray
    recompute_s: np.ndarray
    tp_comm_s: np.ndarray  # forward + backward (+ recomputed forward), exposed part
    cp_comm_s: np.ndarray
    ep_comm_s: np.ndarray
    activation_bytes: np.ndarray  # stored for backward, per micro-batch (the stage's mean layer)
    full_activation_bytes: np.ndarray  # what a layer holds while it runs (no recompute)
    recompute_working_bytes: np.ndarray  # what recomputing one layer adds while its backward runs
    model_flops: np.ndarray  # forward+backward model FLOPs of this GPU, no recompute
    #: of ``activation_bytes``, what activation offloading moves to the host (0 without it)
    offloaded_activation_bytes: np.ndarray

    @property
    def forward_s(self) -> np.ndarray:
        out: np.ndarray = self.forward_compute_s + 0.5 * (self.tp_comm_s + self.cp_comm_s + self.ep_comm_s)
        return out

    @property
    def total_s(self) -> np.ndarray:
        out: np.ndarray = (
            self.forward_compute_s
            + self.backward_compute_s
            + self.recompute_s
            + self.tp_comm_s
            + self.cp_comm_s
            + self.ep_comm_s
        )
        return out


def _act_bytes(training: Training) -> int:
    """Activation element size: 16-bit for bf16/fp16/fp8 training (fp8 GEMM inputs are cast
    copies; stored activations stay 16-bit), 32-bit for fp32."""
    return 4 if training.dtype == "fp32" else 2


def _dropout(model: TransformerSpec) -> float:
    """1.0 when the model trains with dropout: GPT-style models (biases, learned positions; GPT-2,
    GPT-3, Megatron's GPT) use it on the attention probabilities and both residual branches,
    Llama-style models (no biases) train without it."""
    return 1.0 if model.bias else 0.0


def _kv_local(model: TransformerSpec, tp: ArrayOrFloat) -> FloatArray:
    """K (or V) width per TP rank: KV heads are split when t ≤ g, else replicated (one head).
    MLA: the up-projected heads, at the mean of the key and value head widths."""
    return model.kv_head_dim * np.maximum(model.num_kv_heads / tp, 1.0)


def _qkv_width(model: TransformerSpec, tp: ArrayOrFloat, kv: ArrayOrFloat) -> ArrayOrFloat:
    """Output width per TP rank of the QKV projection GEMM (K = h): its model FLOPs are
    2·T·h·width.  MLA: its weights / h (the same FLOPs; the time of its down- and
    up-projections is costed GEMM by GEMM, :mod:`cost_model.transformer.mla`)."""
    if model.is_mla:
        return model.qkv_weights() / model.hidden_size / tp
    return model.q_size / tp + 2 * kv


def misaligned_device(device: DeviceSpec) -> DeviceSpec:
    """The device for GEMMs with a dimension that is not a multiple of 8 elements (the
    attention BMMs of a head dimension such as 108): its large-GEMM fraction times
    ``misaligned_gemm_fraction`` (``cost_model.transformer.calibration``)."""
    from dataclasses import replace

    from cost_model.transformer.calibration import current

    eff = device.efficiency
    return replace(device, efficiency=replace(eff, gemm_max_fraction=eff.gemm_max_fraction * current().get("misaligned_gemm_fraction")))



def fp8_cast_s(
    T: ArrayOrFloat, h: float, qkv_out: ArrayOrFloat, proj_in: ArrayOrFloat, f_out: ArrayOrFloat, f_in: ArrayOrFloat, device: DeviceSpec
) -> tuple[ArrayOrFloat, ArrayOrFloat]:
    """Forward and backward time (s) of Transformer Engine's FP8 casts in one layer.

    Every FP8 GEMM input is a BF16 tensor cast to FP8 with its amax recorded in the same pass
    (read 2 B, write 1 B per element; TE ``cast_to_fp8`` / ``fp8_quantize``): forward the inputs
    of QKV (T·h), the projection (T·proj_in), FC1 (T·h) and FC2 (T·f_in); backward the output
    gradients of the four GEMMs (T·qkv_out, T·h, T·f_out, T·h), and again the forward inputs
    transposed for the weight-gradient GEMMs (FP8 GEMMs need K-major operands on Hopper).
    Widths are per TP rank (for a plain GPT layer qkv_out = h/t + 2kv, proj_in = h/t).
    Weights are cast once per step and cached over the micro-batches: their memory is
    :func:`cost_model.transformer.stage_cost.fp8_weight_cache_bytes_per_param`, their one pass a
    step (a few ms) not counted.
    """
    fwd_elems = T * (h + proj_in + h + f_in)
    bwd_elems = T * (qkv_out + h + f_out + h) + fwd_elems
    return memory_bound_time_s(3.0 * fwd_elems, device, kernels=4), memory_bound_time_s(3.0 * bwd_elems, device, kernels=8)


#: Bytes one quantisation pass moves per element into NVFP4: read the BF16 tensor (2 B), write
#: 4-bit values and one E4M3 scale per 16-element block (:data:`cost_model.devices.BYTES_PER_ELEMENT`).
NVFP4_QUANTIZE_BYTES = 2.0 + BYTES_PER_ELEMENT["fp4"]


def nvfp4_cast_s(
    T: ArrayOrFloat, h: float, qkv_out: ArrayOrFloat, proj_in: ArrayOrFloat, f_out: ArrayOrFloat, f_in: ArrayOrFloat, device: DeviceSpec
) -> tuple[ArrayOrFloat, ArrayOrFloat]:
    """Forward and backward time (s) of Transformer Engine's NVFP4 quantisation in one layer.

    NVIDIA's NVFP4 training recipe (NVIDIA 2025, "Pretraining Large Language Models with NVFP4",
    arXiv 2509.25149, §4; Transformer Engine ``NVFP4BlockScaling``, driven by Megatron-Bridge's
    ``bf16_with_nvfp4_mixed``: ``fp4="e2m1"``, ``fp4_recipe="nvfp4"``, no FP4 parameter gather)
    runs the fprop, dgrad and wgrad GEMMs of every decoder linear layer in NVFP4 (E2M1 values,
    one E4M3 scale per 16 elements, an FP32 scale per tensor) — the attention core, the
    embedding and the LM head stay BF16 (:func:`cost_model.transformer.stage_cost.device_costs`).
    Each quantisation is one memory-bound pass that reads the BF16 tensor and writes the FP4
    values and scales (:data:`NVFP4_QUANTIZE_BYTES` per element; the amax reduction fused):

    * forward: the inputs of QKV (T·h), the projection (T·proj_in), FC1 (T·h) and FC2 (T·f_in),
      1×16 blocks, round-to-nearest (4 kernels);
    * backward: the output gradients of the four GEMMs (T·qkv_out, T·h, T·f_out, T·h) twice —
      1×16 blocks with stochastic rounding for dgrad, and with a 16×16 random Hadamard transform
      along the token dimension for wgrad — and the forward inputs once more, Hadamard-transformed
      and quantised along the token dimension for wgrad (12 kernels).  The Hadamard transform is
      a 16-point product fused into the quantising kernel (32 FLOP per element against the
      GEMM's 2·K: not a cost of its own); stochastic rounding draws from a counter-based RNG in
      the same pass.

    Against FP8 (:func:`fp8_cast_s`: 3 bytes per element, gradients cast once), the gradients
    pass twice and each pass moves 2.5625 bytes.  Weights are quantised once per step with
    16×16 (2D) blocks, so that the forward and the transposed backward use the same values,
    and cached over the micro-batches (not counted here, as for FP8).
    """
    fwd_elems = T * (h + proj_in + h + f_in)
    grad_elems = T * (qkv_out + h + f_out + h)
    bwd_elems = 2.0 * grad_elems + fwd_elems
    return (memory_bound_time_s(NVFP4_QUANTIZE_BYTES * fwd_elems, device, kernels=4),
            memory_bound_time_s(NVFP4_QUANTIZE_BYTES * bwd_elems, device, kernels=12))


def layer_costs(model: TransformerSpec, training: Training, device: DeviceSpec, links: Links, S: StrategyArrays, bf16_device: DeviceSpec | None = None) -> LayerCosts:
    """Cost one decoder layer per micro-batch for every candidate in ``S``.  Under FP8 the
    attention core runs in BF16 on ``bf16_device`` (the device with its BF16 efficiency).

    A model whose layers differ (dense-first MoE layers, windowed and global attention) is
    costed as the fraction-weighted mean of its uniform variants
    (:meth:`TransformerSpec.layer_variants`): the stage of ``n`` layers costs ``n`` mean layers.
    """
    variants = model.layer_variants()
    frac = recompute_fraction(model, S)
    if len(variants) == 1:
        return _uniform_layer_costs(model, training, device, links, S, bf16_device, frac)
    parts = [(w, _uniform_layer_costs(v, training, device, links, S, bf16_device, frac)) for w, v in variants]
    return LayerCosts(**{f: sum(w * getattr(lc, f) for w, lc in parts) for f in LayerCosts.__dataclass_fields__})


def recompute_fraction(model: TransformerSpec, S: StrategyArrays) -> FloatArray:
    """Fraction of a stage's decoder layers whose forward is recomputed under full recompute:
    1 for every layer; ``N·pp·vpp / L`` for Megatron-Core's block method, which recomputes the
    first N layers of each of the pp·vpp model chunks of L/(pp·vpp) layers (Megatron-Core
    ``transformer_block._checkpointed_forward``: layers past N keep their activations); 0 without
    full recompute.  A stage of n layers then recomputes n·fraction of them — exact for even
    splits, the chunks' mean for uneven ones."""
    full = S.recompute == 2
    if S.recompute_layers is None:
        out: FloatArray = np.where(full, 1.0, 0.0)
        return out
    chunk = model.num_layers / (S.pp * S.vpp)
    part = np.where(S.recompute_layers > 0, np.minimum(1.0, S.recompute_layers / chunk), 1.0)
    out = np.where(full, part, 0.0)
    return out


def uniform_recompute_groups(model: TransformerSpec, S: StrategyArrays) -> tuple[FloatArray | float, FloatArray | float]:
    """Megatron-Core's uniform full recompute over groups of N layers (``S.recompute_group``):
    the largest group's layer count (whose recomputed activations one backward holds at once) and
    the checkpointed inputs kept per layer.  Its loop walks each model chunk of
    c = L/(pp·vpp) layers in steps of N and ends a group at the chunk's end (Megatron-Core
    ``transformer_block._checkpointed_forward``, ``recompute_method == "uniform"``:
    ``chunk_end = min(layer_idx + N, num_layers_per_pipeline_rank)``), so a chunk holds
    ⌈c/N⌉ groups, the largest min(N, c) layers, and keeps ⌈c/N⌉/c inputs per layer — 1/N when
    N divides c, more when the last group is short (c the chunks' mean where the split is uneven).
    Every layer its own checkpoint: (1, 1)."""
    if S.recompute_group is None:
        return 1.0, 1.0
    chunk = model.num_layers / (S.pp * S.vpp)  # the chunks' mean; the largest holds ⌈L/(pp·vpp)⌉
    group = S.recompute_group
    largest = np.minimum(group, np.ceil(chunk))
    per_layer = np.where(group > 1, np.ceil(chunk / group) / chunk, 1.0)
    return largest, per_layer


def _uniform_layer_costs(
    model: TransformerSpec, training: Training, device: DeviceSpec, links: Links, S: StrategyArrays, bf16_device: DeviceSpec | None,
    frac: FloatArray,
) -> LayerCosts:
    """:func:`layer_costs` of a model whose decoder layers are all alike: the GEMMs, the attention
    core and the memory-bound work of one layer on one GPU (each a helper below), recompute, and
    the TP / CP / EP communication.  FP8 / FP4: the linear layers' GEMMs in the narrow format
    plus their casts (:func:`fp8_cast_s`, :func:`nvfp4_cast_s`), the attention core in BF16."""
    dt = training.dtype
    narrow = dt in NARROW_DTYPES
    attn_dt = "bf16" if narrow else dt
    attn_device = bf16_device if (bf16_device is not None and narrow) else device
    g = _LayerGeometry.of(model, training, S)
    moe = _moe_ffn(model, training, device, links, S, g) if model.is_moe else None
    gemm_fwd, gemm_bwd, gemm_flops, qkv_n, ffn_fwd = _layer_gemms(model, dt, device, S, g, moe, frozen=training.frozen_base)
    attn_fwd, attn_bwd, flops_attn = _attention_core(model, training, device, attn_device, attn_dt, S, g)
    elem_fwd, elem_bwd = _layer_elementwise(model, training, device, S, g)
    if moe is not None:
        elem_fwd, elem_bwd = elem_fwd + moe.elementwise_fwd_s, elem_bwd + moe.elementwise_bwd_s
    lora_flops: ArrayOrFloat = 0.0
    if training.frozen_base:  # LoRA's adapters beside the frozen GEMMs (cost_model.transformer.lora)
        lora_fwd, lora_bwd, lora_flops = adapter_costs(model, training, device, g.T, S.tp, g.eb, moe)
        deq = dequantize_s(model, training, device, S.tp, g.eb, moe)  # QLoRA: each GEMM's weight expanded, forward and dX
        elem_fwd, elem_bwd = elem_fwd + lora_fwd + deq, elem_bwd + lora_bwd + deq

    forward_compute = gemm_fwd + attn_fwd + elem_fwd
    backward_compute = gemm_bwd + attn_bwd + elem_bwd
    cast_fwd: ArrayOrFloat = 0.0
    if narrow:
        fm, f, t = model.ffn_matrices, float(model.ffn_hidden_size), S.tp
        k_tok = model.experts_per_token if model.is_moe else 1.0
        cast = fp8_cast_s if dt == "fp8" else nvfp4_cast_s
        cast_fwd, cast_bwd = cast(g.T, g.h, qkv_n, g.o / t, (fm - 1) * f / t * k_tok, f / t * k_tok, device)
        forward_compute = forward_compute + cast_fwd
        backward_compute = backward_compute + cast_bwd

    # ---- recompute ---------------------------------------------------------------------------
    # full: the whole forward again (with its TP collectives) — of the fraction ``frac`` of the
    # layers the block method recomputes (:func:`recompute_fraction`); selective, attention-core
    # (Megatron): the attention core only (Korthikanti 2022 §4.2) — a fused one too where the
    # framework checkpoints it (:func:`checkpoints_attention_core`: Megatron-Core), else with
    # fused attention nothing is redone; selective, op-level (torchtitan, :func:`op_level_recomputed_gemm_flops`):
    # the even-numbered matmuls (with their casts), every memory-bound op, the unfused attention
    # core, and the TP all-gathers that feed them.
    layer_fwd_flops = gemm_flops + flops_attn
    unfused = 1.0 if training.attention == "unfused" else 0.0
    op_level = op_level_selective(model, training)
    module_tp: ArrayOrFloat = 0.0
    module_ep: ArrayOrFloat = 0.0
    module_attn_tp: ArrayOrFloat = 0.0
    if op_level:
        sel_share = op_level_recomputed_gemm_flops(model, g.T, S.tp) / gemm_flops
        selective_s = sel_share * (gemm_fwd + cast_fwd) + elem_fwd + unfused * attn_fwd
    else:
        # the attention core (Megatron's default module) and any other --recompute-modules
        modules_s, module_tp, module_ep, module_attn_tp = selective_module_costs(model, training, device, S, g.T, ffn_fwd, moe,
                                                                                  attn_gemm_fwd_s=gemm_fwd - ffn_fwd)
        core = 1.0 if checkpoints_attention_core(training) else 0.0
        selective_s = recomputes(S, "core_attn") * core * attn_fwd + modules_s
    selective = np.where(S.recompute == 1, 1.0, 0.0)
    recompute_s = np.where(S.recompute == 2, frac * forward_compute, np.where(S.recompute == 1, selective_s, 0.0))

    tp_comm, cp_exposed, ep_comm = _layer_parallel_comm(
        model, training, device, links, S, g, gemm_fwd, attn_fwd, attn_bwd, moe, forward_compute + backward_compute, frac,
        selective_collectives=selective if op_level else 0.0, ffn_collectives=selective * module_tp, ep_recomputes=selective * module_ep,
        attn_collectives=selective * module_attn_tp,
    )

    # ---- activation memory (bytes per layer per micro-batch) -----------------------------------
    act, full_act, working = activation_bytes(model, training, S, frac)
    if training.frozen_base:
        # LoRA: the adapters' saved tensors, less the frozen layers' inputs nothing needs — in the
        # full set, in what a layer stores unless recomputed (torchtitan's op-level selective set
        # is its own), and in a recomputed layer's working set
        delta = saved_activation_delta_bytes(model, training, g.T, S.tp, S.sp, g.eb, moe)
        op_sel = (S.recompute == 1) & op_level
        full_act = full_act + delta
        act = act + np.where(S.recompute == 2, (1.0 - frac) * delta, np.where(op_sel, 0.0, delta))
        working = working + np.where((S.recompute == 2) | op_sel, delta, 0.0)
        if training.lora_base_dtype is not None:  # QLoRA: the widest weight's dequantised copy while its GEMM runs
            working = working + g.h * np.maximum(qkv_n, (model.ffn_matrices - 1) * float(model.ffn_hidden_size) / S.tp) * g.eb
    # activation offloading: every saved tensor, or Megatron-Core's chosen modules' (at most what is saved)
    offloaded: ArrayOrFloat = 0.0
    if training.activation_offloading:
        offloaded = np.minimum(offload_module_bytes(model, training, S), act) if training.offload_modules else act

    # model FLOPs: forward, dX and dW of every GEMM (dX alone for frozen weights: LoRA), the
    # attention core's forward and backward, and the adapters' three passes
    model_flops = 3 * layer_fwd_flops if not training.frozen_base else 2 * gemm_flops + 3 * flops_attn + 3 * lora_flops
    return LayerCosts(
        forward_compute_s=forward_compute,
        backward_compute_s=backward_compute,
        recompute_s=recompute_s,
        tp_comm_s=tp_comm,
        cp_comm_s=cp_exposed,
        ep_comm_s=ep_comm,
        activation_bytes=act,
        full_activation_bytes=full_act,
        recompute_working_bytes=working,
        model_flops=model_flops,
        offloaded_activation_bytes=np.broadcast_to(offloaded, np.shape(act)),
    )


@dataclass(frozen=True, kw_only=True)
class _LayerGeometry:
    """The sizes one layer's cost is written in, on one GPU after tensor/context splitting:
    hidden h, heads a, key/value head dim d, query width q, attention output width o, sequence
    s_seq and the keys each query attends to s (the window on windowed layers), the local
    sequence sc = s_seq/c and tokens per GPU per micro-batch T = b·sc, local key/value width kv,
    bytes per activation element eb."""

    h: float
    a: float
    d: float
    q: float
    o: float
    s_seq: float
    s: float
    sc: np.ndarray
    T: np.ndarray
    kv: np.ndarray
    eb: int

    @staticmethod
    def of(model: TransformerSpec, training: Training, S: StrategyArrays) -> _LayerGeometry:
        s_seq = float(training.sequence_length)
        sc = s_seq / S.cp
        return _LayerGeometry(
            h=float(model.hidden_size),
            a=float(model.num_heads),
            d=float(model.kv_head_dim),
            q=float(model.q_size),
            o=float(model.attn_out_size),
            s_seq=s_seq,
            s=model.attention_span(s_seq),
            sc=sc,
            T=S.mbs * sc,
            kv=_kv_local(model, S.tp),
            eb=_act_bytes(training),
        )


def _mla_shapes(model: TransformerSpec, T: ArrayOrFloat, S: StrategyArrays) -> list[tuple[FloatArray, FloatArray, float]]:
    return mla_projection_shapes(
        hidden=float(model.hidden_size), heads=float(model.num_heads), q_lora_rank=float(model.q_lora_rank),
        kv_lora_rank=float(model.kv_lora_rank), nope_dim=float(model.head_dim), rope_dim=float(model.qk_rope_head_dim),
        v_dim=float(model.v_head_dim), tokens=T, tp=S.tp, sequence_parallel=S.sp,
    )


def _layer_gemms(
    model: TransformerSpec, dt: str, device: DeviceSpec, S: StrategyArrays, g: _LayerGeometry, moe: MoeFfnCost | None = None,
    frozen: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, ArrayOrFloat, np.ndarray]:
    """Forward and backward time (s) of one layer's GEMMs, their forward FLOPs, the local QKV
    width and the FFN's share of the forward time.  Megatron TP (Narayanan et al. 2021 §2.3): QKV column-parallel [T,h]×[h,(q+2kv)/t],
    projection row-parallel [T,o/t]×[o/t,h]; FFN FC1 column-parallel (gate and up fused when
    gated), FC2 row-parallel; an MoE layer's FFN (router, grouped experts, shared experts) is
    ``moe`` (:func:`cost_model.transformer.moe.moe_ffn_costs`).  ``frozen``: the weights do not
    train (LoRA), so the backward is each GEMM's dX alone."""
    h, o, T, t = g.h, g.o, g.T, S.tp
    f = float(model.ffn_hidden_size)
    qkv_n = _qkv_width(model, t, g.kv)
    if model.is_mla:  # down- and up-projections on their own shapes (cost_model.transformer.mla)
        t_qkv, b_qkv = mla_projection_fwd_bwd_s(_mla_shapes(model, T, S), device, dt, frozen=frozen)
    else:
        t_qkv, b_qkv = gemm_fwd_bwd_time_s(T, qkv_n, h, device, dt, frozen=frozen)
    t_proj, b_proj = gemm_fwd_bwd_time_s(T, h, o / t, device, dt, frozen=frozen)
    flops_qkv = 2 * T * h * qkv_n
    flops_proj = 2 * T * h * o / t
    fm = model.ffn_matrices
    if moe is not None:
        return t_qkv + t_proj + moe.gemm_fwd_s, b_qkv + b_proj + moe.gemm_bwd_s, flops_qkv + flops_proj + moe.flops, qkv_n, moe.gemm_fwd_s
    t_fc1, b_fc1 = gemm_fwd_bwd_time_s(T, (fm - 1) * f / t, h, device, dt, frozen=frozen)
    t_fc2, b_fc2 = gemm_fwd_bwd_time_s(T, h, f / t, device, dt, frozen=frozen)
    t_router = b_router = 0.0
    flops_ffn = 2 * T * fm * h * f / t
    gemm_bwd = b_qkv + b_proj + b_fc1 + b_fc2 + b_router
    gemm_fwd = t_qkv + t_proj + t_fc1 + t_fc2 + t_router

    return gemm_fwd, gemm_bwd, flops_qkv + flops_proj + flops_ffn, qkv_n, t_fc1 + t_fc2


def _attention_core(
    model: TransformerSpec,
    training: Training,
    device: DeviceSpec,
    attn_device: DeviceSpec,
    attn_dt: str,
    S: StrategyArrays,
    g: _LayerGeometry,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Forward and backward time (s) of the attention core (scores, softmax, dropout, P·V) and
    its model FLOPs: unfused as batched GEMMs plus memory-bound softmax/dropout passes, fused
    (FlashAttention) by its key/value loop."""
    b, t = S.mbs, S.tp
    a, d, q, sc, s, s_seq, T, kv, eb = g.a, g.d, g.q, g.sc, g.s, g.s_seq, g.T, g.kv, g.eb
    unfused = training.attention == "unfused"
    eager = not training.fused_kernels
    heads_local = a / t
    # Model FLOPs count the full s×s square (Narayanan 2021 Eq. 3 / Megatron MFU convention).
    flops_attn = attention_flops(b, heads_local, sc, s, d)
    if unfused:
        bh = b * heads_local
        if int(d) % 8:
            attn_device = misaligned_device(attn_device)
        t_scores = gemm_time_s(sc, s, d, attn_device, attn_dt, batch=bh)
        t_pv = gemm_time_s(sc, d, s, attn_device, attn_dt, batch=bh)
        elems = bh * sc * s
        drop = _dropout(model)
        # Megatron's fused scale-mask-softmax reads and writes the scores (2·eb, one exp per
        # score), dropout reads them, writes the result and a 1-byte mask (2·eb + 1, one random
        # number per score): 4·eb + 1 bytes per score forward (9 in 16-bit); backward: dropout
        # (eb + 1 read, eb write) and softmax (2·eb read, eb write): 5·eb + 1 (11 in 16-bit).
        # Fresh tensors: probabilities, dropout output and mask forward; two gradients backward.
        if eager:
            t_softmax_fwd, t_softmax_bwd = eager_attention_elementwise_s(elems, eb, drop, device)
            layout_fwd, layout_bwd = _eager_head_layout_s(T * q / t, T * kv, eb, device)
            t_softmax_fwd, t_softmax_bwd = t_softmax_fwd + layout_fwd, t_softmax_bwd + layout_bwd
        else:
            t_softmax_fwd = (
                memory_bound_time_s(2 * eb * elems, device, kernels=1, transcendental_elements=elems)
                + memory_bound_time_s((2 * eb + 1) * elems, device, kernels=1, rng_elements=drop * elems)
                + first_touch_s(elems * eb, device, count=1 + 2 * drop)
            )
            t_softmax_bwd = memory_bound_time_s((5 * eb + 1) * elems, device, kernels=2) + first_touch_s(elems * eb, device, count=2)
        attn_fwd = t_scores + t_pv + t_softmax_fwd
        _, b_scores = gemm_fwd_bwd_time_s(sc, s, d, attn_device, attn_dt, batch=bh)
        _, b_pv = gemm_fwd_bwd_time_s(sc, d, s, attn_device, attn_dt, batch=bh)
        attn_bwd = b_scores + b_pv + t_softmax_bwd
    else:
        # Causal: half the s×s square; a window w keeps 1 − w/(2s) of the s×w band.
        attn_fwd = flash_attention_time_s(b * heads_local, sc, s, d, attn_device, attn_dt, causal_fraction=1.0 - s / (2.0 * s_seq))
        attn_bwd = FLASH_BACKWARD_RATIO * attn_fwd

    return attn_fwd, attn_bwd, flops_attn


@dataclass(frozen=True)
class EagerTraffic:
    """Bytes per element and kernels, forward and backward, that plain eager PyTorch spends on
    one elementwise sub-layer beyond the fused kernel's (read + write once: 2·eb forward, 1.25×
    that backward; :func:`_layer_elementwise`)."""

    fwd_bytes: float
    bwd_bytes: float
    fwd_kernels: int
    bwd_kernels: int


def eager_rmsnorm_traffic(eb: int) -> EagerTraffic:
    """Hugging Face's ``LlamaRMSNorm`` (and every model copying it) in eager PyTorch, per element
    of the normalised tensor beyond a fused RMSNorm.  Forward, one operator each: ``x.to(fp32)``
    (read eb, write 4; none in fp32), ``pow(2)`` (read 4, write 4), ``mean(-1)`` (read 4),
    ``x * rsqrt(var + eps)`` (read 4, write 4; the per-row rsqrt is negligible),
    ``.to(dtype)`` (read 4, write eb; none in fp32), ``weight * x`` (read eb, write eb):
    20 + 2·eb bytes, 4 operators, + 2·(eb + 4) and 2 operators for the casts below fp32.
    Backward, autograd through the same graph: the weight product's two gradients (dx: read eb,
    write eb; dw: product and token sum, read 3·eb, write eb → 6·eb), the rsqrt product's two (dx:
    read 4, write 4; d(rsqrt): product and row sum, read 12, write 4), ``mean``'s expand (write 4),
    ``pow``'s 2·x·g (read 8, write 8 in two operators), the two paths' sum into dx (read 8, write 4):
    60 + 6·eb bytes, 9 operators, + the casts' 2·(eb + 4) and 2 operators below fp32.  The
    fused kernel's 2·eb / 2.5·eb are already counted, so these are the differences."""
    cast = 2 * (eb + 4) if eb < 4 else 0
    casts = 2 if eb < 4 else 0
    return EagerTraffic(fwd_bytes=20 + 2 * eb + cast - 2 * eb, bwd_bytes=60 + 6 * eb + cast - 2.5 * eb,
                        fwd_kernels=3 + casts, bwd_kernels=8 + casts)


def eager_rope_traffic(eb: int) -> EagerTraffic:
    """Hugging Face's ``apply_rotary_pos_emb`` with ``rotate_half`` in eager PyTorch, per element
    of Q and K beyond a fused rotary kernel.  Forward: ``q * cos`` (read eb, write eb),
    ``rotate_half`` — the negated upper half (read and write half the elements: eb) and the
    concatenation (read eb, write eb) —, ``· sin`` (2·eb) and the sum (read 2·eb, write eb):
    10·eb bytes in 5 operators.  Backward: the two products' gradients (2·eb each), the
    negation's (eb), the two half slices' gradients scattered into zero-filled tensors (write
    eb, read and write the halves: 3·eb in all) and the two paths' sum (3·eb): 11·eb in 7
    operators.  Less the fused kernel's 2·eb / 2.5·eb."""
    return EagerTraffic(fwd_bytes=10 * eb - 2 * eb, bwd_bytes=11 * eb - 2.5 * eb, fwd_kernels=4, bwd_kernels=6)


def eager_glu_traffic(eb: int) -> EagerTraffic:
    """A gated FFN's ``act(gate) * up`` in eager PyTorch (Hugging Face's ``LlamaMLP``, torchtitan's
    ``F.silu(w1(x)) * w3(x)``), per element of the FFN hidden beyond one fused kernel (read 2·eb,
    write eb).  Forward: the activation (read eb, write eb) and the product (read 2·eb, write
    eb): 5·eb in 2 operators.  Backward: the product's two gradients (read 2·eb, write eb each)
    and the activation's (read 2·eb, write eb): 9·eb in 3 operators.  Less the fused 3·eb /
    3.75·eb."""
    return EagerTraffic(fwd_bytes=5 * eb - 3 * eb, bwd_bytes=9 * eb - 3.75 * eb, fwd_kernels=1, bwd_kernels=2)


def eager_saved_bytes_per_element(eb: int) -> tuple[float, float]:
    """Bytes per element that autograd keeps for backward from eager PyTorch's RMSNorm and gated
    activation beyond what the fused kernels keep (their inputs, counted in
    :func:`activation_bytes`), as (norm, FFN hidden).  A multiplication keeps each operand the
    other's gradient needs (``MulBackward0``), ``pow`` its input, casts and ``mean`` nothing:

    * ``LlamaRMSNorm`` keeps the fp32 upcast of its input (``pow`` and the rsqrt product share
      it) and the normalised tensor in the training dtype (the weight product), where a fused
      norm keeps its input: 4 + eb − eb = 4 bytes in bf16; in fp32 the upcast is the input
      itself and the normalised copy is the extra: 4 bytes too;
    * ``act(gate) * up`` keeps the activation's output (eb) beside ``up``.

    The ``rotate_half`` rotary embedding keeps nothing more: its products are with ``cos`` and
    ``sin``, which need no gradient, so only those (shared) are kept."""
    return 4.0, float(eb)


def _layer_elementwise(
    model: TransformerSpec, training: Training, device: DeviceSpec, S: StrategyArrays, g: _LayerGeometry
) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward time (s) of one layer's memory-bound work: norms, bias-dropout-add,
    the FFN activation, rotary embedding, eager bias gradients and fresh-tensor first touches.
    Eager PyTorch (``training.fused_kernels`` false) adds what its operator-by-operator RMSNorm,
    rotary embedding and gated activation move beyond the fused kernels (:class:`EagerTraffic`);
    a LayerNorm is one ATen kernel either way."""
    h, q, T, kv, eb, t = g.h, g.q, g.T, g.kv, g.eb, S.tp
    f = float(model.ffn_hidden_size)
    fm = model.ffn_matrices
    eager = not training.fused_kernels
    # Replicated region (norms, dropout, residual adds) runs on T·h elements per TP rank, or
    # T·h/t under sequence parallelism.  Bytes per element forward: the layer's norms (read+write,
    # 2·eb each; per-head Q/K norms over the Q and K elements), 2 fused bias-dropout-add (read
    # 2·eb, write eb, mask 1 when dropout is used).
    rep_elems = T * h / np.where(S.sp, t, 1.0)
    qk_elems = T * (q / t + kv)
    norm_elems = rep_elems * model.norms_per_layer + (qk_elems if model.qk_norm else 0.0)
    drop = _dropout(model)
    norm_bytes_fwd = norm_elems * 2 * eb
    # Two residual branches: fused bias-dropout-add reads 2·eb, writes eb and a 1-byte mask.
    # Eager PyTorch runs bernoulli_ into a mask of the activation dtype (eb), div_ (2·eb),
    # mul (3·eb) and the residual add (3·eb): four operators, 9·eb bytes.
    dropout_bytes_fwd = rep_elems * 2 * ((3 * eb + drop) if not eager else (3 * eb + drop * 6 * eb))
    dropout_kernels = 2 * (1 + 3 * drop) if eager else 2
    # Activation function on the FFN hidden: GELU read+write (2·eb), SwiGLU reads two inputs.
    # Transcendentals per element: GELU x·Φ(x) one erf forward and, backward Φ(x) + x·φ(x), an
    # erf and an exp; SiLU x·σ(x) one exp each way (the backward recomputes σ).
    ffn_hidden_elems = T * f / t * (model.experts_per_token if model.is_moe else 1.0)
    act_bytes_fwd = ffn_hidden_elems * ((3 if model.gated_ffn else 2) * eb)
    act_bwd_transcendentals = ffn_hidden_elems * (1 if model.gated_ffn else 2)
    # Rotary embedding on Q and K (read+write) for RoPE models.
    rope = model.position_embedding == "rope"
    rope_bytes = qk_elems * 2 * eb if rope else 0.0
    # Bias gradients: eager PyTorch reduces each biased linear layer's output gradient over the
    # tokens (``grad_output.sum(0)``), one read of the QKV, projection, FC1 and FC2 outputs'
    # gradients; fused kernels compute it in the weight-gradient GEMM's epilogue (cuBLASLt's
    # BGRAD epilogue, Transformer Engine) or the bias-GELU backward.
    ffn_out = (fm - 1) * f / t * (model.experts_per_token if model.is_moe else 1.0)
    bias_grad_bytes = float(model.bias and eager) * T * (q / t + 2 * kv + h + ffn_out + h) * eb
    norm_kernels = model.norms_per_layer + 2 * int(model.qk_norm)
    elem_fwd = (
        memory_bound_time_s(norm_bytes_fwd + rope_bytes, device, kernels=norm_kernels + int(rope))
        + memory_bound_time_s(dropout_bytes_fwd, device, kernels=dropout_kernels, rng_elements=2 * drop * rep_elems)
        + memory_bound_time_s(act_bytes_fwd, device, kernels=1, transcendental_elements=ffn_hidden_elems)
        + first_touch_s(ffn_hidden_elems * eb, device)
    )
    # Backward of these kernels moves ≈1.25× the forward bytes (norm backward reads x and dy and
    # writes dx; dropout backward reads dy and the mask and writes dx; no random numbers).
    elem_bwd = (
        memory_bound_time_s(1.25 * (norm_bytes_fwd + dropout_bytes_fwd + rope_bytes), device,
                            kernels=norm_kernels + int(rope) + 4)
        + memory_bound_time_s(1.25 * act_bytes_fwd, device, kernels=1, transcendental_elements=act_bwd_transcendentals)
        + first_touch_s(ffn_hidden_elems * eb, device)
        + memory_bound_time_s(bias_grad_bytes, device, kernels=4 * int(model.bias and eager))
    )
    if eager:
        parts = [(norm_elems if model.norm == "rmsnorm" else 0.0, eager_rmsnorm_traffic(eb), norm_kernels),
                 (qk_elems if rope else 0.0, eager_rope_traffic(eb), 2),
                 (ffn_hidden_elems if model.gated_ffn else 0.0, eager_glu_traffic(eb), 1)]
        for elems, traffic, copies in parts:
            on = float(np.any(np.asarray(elems) > 0))
            elem_fwd = elem_fwd + memory_bound_time_s(elems * traffic.fwd_bytes, device, kernels=on * copies * traffic.fwd_kernels)
            elem_bwd = elem_bwd + memory_bound_time_s(elems * traffic.bwd_bytes, device, kernels=on * copies * traffic.bwd_kernels)

    return elem_fwd, elem_bwd


def _layer_parallel_comm(
    model: TransformerSpec,
    training: Training,
    device: DeviceSpec,
    links: Links,
    S: StrategyArrays,
    g: _LayerGeometry,
    gemm_fwd: np.ndarray,
    attn_fwd: np.ndarray,
    attn_bwd: np.ndarray,
    moe: MoeFfnCost | None = None,
    layer_compute: ArrayOrFloat = 0.0,
    frac: ArrayOrFloat = 0.0,
    selective_collectives: ArrayOrFloat = 0.0,
    ffn_collectives: ArrayOrFloat = 0.0,
    ep_recomputes: ArrayOrFloat = 0.0,
    attn_collectives: ArrayOrFloat = 0.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exposed time (s) of one layer's tensor-parallel collectives, context-parallel exchange
    (:func:`cost_model.transformer.context_parallel.cp_layer_comm_s`) and expert-parallel
    dispatch/combine (``moe``; alpha-beta costs of :mod:`cost_model.comm`).
    ``selective_collectives``: TP collectives a selective recompute runs again, in units of
    one all-reduce (op-level: the attention's and the FFN's input all-gathers, 1);
    ``ffn_collectives``: the FFN's collective passes, ``ep_recomputes`` the dispatch/combine
    pairs and ``attn_collectives`` the attention's collective passes that recomputed modules run
    again (:func:`selective_module_costs`)."""
    h, T, kv, eb, sc = g.h, g.T, g.kv, g.eb, g.sc
    t, c, b = S.tp, S.cp, S.mbs
    gpn = links.gpus_per_node
    # Per layer: 2 all-reduces forward and 2 backward of T·h elements (SP: reduce-scatter +
    # all-gather of the same volume), 2 more per recomputed forward (``frac`` of the layers,
    # :func:`recompute_fraction`).  Half of them are
    # the FFN's: an MoE layer's FFN has its own (``moe.ffn_tp_one_s`` per pass).
    tp_per_node = np.minimum(t, gpn)
    msg = T * h * eb
    one_ar = np.where(
        S.sp,
        2 * reduce_scatter_time_s(t, msg, links, tp_per_node),
        allreduce_time_s(t, msg, links, tp_per_node),
    ) + hierarchical_collective_extra_s(links, [(t, 1.0 + 0.0 * t)], msg, 2.0)
    n_collectives = 4 + 2 * np.asarray(frac, dtype=float) + selective_collectives
    tp_comm = n_collectives * one_ar if moe is None else n_collectives / 2 * (one_ar + moe.ffn_tp_one_s)
    tp_comm = tp_comm + np.asarray(ffn_collectives, dtype=float) * (one_ar if moe is None else moe.ffn_tp_one_s)
    tp_comm = tp_comm + np.asarray(attn_collectives, dtype=float) * one_ar
    # Communication hides behind compute only where it runs beside it (GPUs: 1; CPUs: 0).
    overlap = device.efficiency.comm_overlap_fraction
    if training.tp_comm_overlap:
        hideable = TP_OVERLAP_MAX_HIDDEN * tp_comm
        hidden = np.minimum(hideable, (gemm_fwd * 3) * TP_OVERLAP_MAX_HIDDEN)
        tp_comm = tp_comm - overlap * hidden

    # ---- context-parallel exchange ------------------------------------------------------------
    # The ring passes 2·b·sc·kv·eb bytes of K,V per step; a full recompute runs the forward's again.
    # With a topology the levels above the node add their surcharge (cost_model.topology; zero
    # without one); the nesting order decides how many CP ranks share a node.
    cp_axes = dimension_axes(S, "cp")
    kv_block = 2 * b * sc * kv * eb
    qkv_bytes, out_bytes = T * (g.q / t + 2 * kv) * eb, T * g.o / t * eb
    cp_fwd, cp_bwd = cp_layer_comm_s(
        training.cp_exchange, cp=c, tp=t, local_seq=sc, window=g.s, kv_block_bytes=kv_block,
        qkv_bytes=qkv_bytes, out_bytes=out_bytes, links=links,
        attn_fwd_s=attn_fwd, attn_bwd_s=attn_bwd, overlap=overlap,
        per_node=None if S.nest is None else members_in(gpn, cp_axes),
        ring_send_extra_s=(p2p_extra_s(links, cp_axes, kv_block), p2p_extra_s(links, cp_axes, 2 * kv_block)),
        a2a_size=float(training.cp_a2a_size or 1),
    )
    extra_f, extra_b = _cp_topology_extra_s(training.cp_exchange, links, cp_axes, c, kv_block, qkv_bytes, out_bytes)
    cp_fwd, cp_bwd = cp_fwd + extra_f, cp_bwd + extra_b
    cp_exposed = cp_fwd + cp_bwd + frac * cp_fwd

    # ---- expert-parallel dispatch and combine ---------------------------------------------------
    # Forward and backward each run a dispatch and a combine, a full recompute two more; with
    # ``moe_comm_overlap`` they run under the layer compute of another micro-batch.  A topology
    # adds the surcharge of the levels above the node to each of them.
    if moe is not None:
        extra = _ep_topology_extra_s(model, training, links, S, g, moe)
        ep_comm = moe.ep_comm_s + 4.0 * extra + (frac + np.asarray(ep_recomputes, dtype=float)) * (moe.ep_recompute_s + 2.0 * extra)
        if training.moe_comm_overlap:
            ep_comm = np.maximum(0.0, ep_comm - overlap * np.asarray(layer_compute, dtype=float))
    else:
        ep_comm = 0.0 * t

    return tp_comm, cp_exposed, ep_comm


def _expert_axes(S: StrategyArrays) -> tuple[Axes, Axes]:
    """(EP group, expert-data-parallel group) as axes: in Megatron's order EP ranks are etp
    global ranks apart and the EDP replicas ep·etp apart (parallel folding,
    :func:`cost_model.transformer.moe.expert_tensor_parallel`); with a nesting order
    :func:`cost_model.topology.expert_axes`."""
    if S.nest is not None:
        return expert_axes(S)
    etp = expert_tensor_parallel(S.tp, S.cp, S.dp, S.ep, S.etp_pin)
    return [(S.ep, etp)], [(expert_data_parallel(S.tp, S.cp, S.dp, S.ep, S.etp_pin), etp * S.ep)]


def _cp_topology_extra_s(
    comm_type: str, links: Links, axes: Axes, c: np.ndarray,
    kv_block_bytes: ArrayOrFloat, qkv_bytes: ArrayOrFloat, out_bytes: ArrayOrFloat,
) -> tuple[FloatArray, FloatArray]:
    """Seconds (forward, backward) the exposed context-parallel collectives of one layer pay
    beyond :func:`cost_model.transformer.context_parallel.cp_layer_comm_s` because the group
    crosses levels above the node (cost_model.topology; zero without a topology):
    ``allgather`` — the all-gather / reduce-scatter of the c K,V blocks
    (:func:`cost_model.topology.hierarchical_collective_extra_s`, volume factor 1); ``a2a`` —
    its two all-to-alls (:func:`cost_model.topology.alltoall_extra_s`).  Both are exposed, as
    the flat exchange is.  ``p2p`` and ``a2a+p2p``: 0 here — the ring's surcharge is on each
    send, inside ``cp_layer_comm_s`` (``ring_send_extra_s``), hidden behind attention as the send
    is; the all-to-all level of ``a2a+p2p`` is its adjacent ranks, taken as within a node."""
    zero = np.zeros_like(np.asarray(c, dtype=float))
    if comm_type == "allgather":
        one = hierarchical_collective_extra_s(links, axes, c * np.asarray(kv_block_bytes, dtype=float), 1.0)
    elif comm_type == "a2a":
        one = alltoall_extra_s(links, axes, qkv_bytes) + alltoall_extra_s(links, axes, out_bytes)
    else:
        return zero, zero
    out = np.where(c > 1, one, 0.0)
    return out, out


def _ep_topology_extra_s(model: TransformerSpec, training: Training, links: Links, S: StrategyArrays, g: _LayerGeometry, moe: MoeFfnCost) -> FloatArray:
    """Seconds one dispatch (or combine) pays beyond
    :func:`cost_model.transformer.moe.dispatch_time_s` because the EP group crosses levels above
    the node (cost_model.topology; zero without a topology): ``alltoall`` — the T_loc·k·h·eb
    slots (× load factor) this rank sends, :func:`cost_model.topology.alltoall_extra_s`;
    ``allgather`` — the ep·T_loc·h·eb gathered tokens,
    :func:`cost_model.topology.hierarchical_collective_extra_s` (volume factor 1); ``deepep`` —
    the node-deduplicated network bytes, T_loc·h·eb (× load factor) per node hit
    (:func:`cost_model.transformer.moe.expected_nodes_hit`), through ``alltoall_extra_s``."""
    axes = _expert_axes(S)[0]
    t_loc = local_tokens(g.T, S.tp, S.sp)
    k, eb, h = float(model.experts_per_token), g.eb, g.h
    dispatcher = training.moe_token_dispatcher
    if dispatcher == "allgather":
        return hierarchical_collective_extra_s(links, axes, S.ep * t_loc * h * eb, 1.0)
    token_bytes = t_loc * h * eb * moe.load_factor
    if dispatcher == "deepep":
        n = np.maximum(S.ep, 1.0)
        nodes = np.ceil(n / np.minimum(np.maximum(members_in(links.gpus_per_node, axes), 1.0), n))
        return alltoall_extra_s(links, axes, token_bytes * expected_nodes_hit(k, float(model.num_experts), nodes))
    return alltoall_extra_s(links, axes, token_bytes * k)


def _moe_ffn(model: TransformerSpec, training: Training, device: DeviceSpec, links: Links, S: StrategyArrays, g: _LayerGeometry) -> MoeFfnCost:
    """The MoE FFN of one layer (:func:`cost_model.transformer.moe.moe_ffn_costs`)."""
    return moe_ffn_costs(
        hidden=g.h, ffn_hidden=float(model.ffn_hidden_size), gated=model.gated_ffn, num_experts=float(model.num_experts),
        top_k=float(model.experts_per_token), shared_ffn_hidden=float(model.shared_expert_ffn_hidden_size), tokens=g.T,
        tp=S.tp, cp=S.cp, dp=S.dp, ep=S.ep, sequence_parallel=S.sp, device=device, links=links, dtype=training.dtype,
        act_bytes=g.eb, dispatcher=training.moe_token_dispatcher, capacity_factor=training.moe_capacity_factor,
        ep_per_node=None if S.nest is None else members_in(links.gpus_per_node, _expert_axes(S)[0]), etp=S.etp_pin,
        frozen=training.frozen_base,
    )


def _eager_head_layout_s(q_elems: ArrayOrFloat, kv_elems: ArrayOrFloat, eb: int, device: DeviceSpec) -> tuple[ArrayOrFloat, ArrayOrFloat]:
    """Forward and backward time of moving attention's operands between the token-major layout
    of the projections ([b, s, heads, d]) and the head-major layout batched GEMMs need
    ([b, heads, s, d]), in plain PyTorch (``view(...).transpose(1, 2)`` then ``@``).

    Forward: Q, K and V are made contiguous head-major (``bmm`` cannot take the transposed
    view) and the attention output is copied back token-major (``transpose(1, 2).reshape``).
    Backward: the output gradient is copied head-major, the Q, K and V gradients token-major,
    and the fused QKV projection's ``split`` concatenates them into one gradient: five passes.
    Each copy reads and writes every element (2·eb bytes).  Fused kernels read the strided
    layouts directly (none of this).
    """
    qkv = q_elems + 2 * kv_elems
    fwd = memory_bound_time_s(2 * eb * (qkv + q_elems), device, kernels=4)
    bwd = memory_bound_time_s(2 * eb * (2 * qkv + q_elems), device, kernels=5)
    return fwd, bwd


def eager_attention_elementwise_s(elems: ArrayOrFloat, eb: int, drop: float, device: DeviceSpec) -> tuple[ArrayOrFloat, ArrayOrFloat]:
    """Forward and backward time of the score-sized elementwise work of attention written in
    plain PyTorch ops (no fused softmax), per ``elems`` scores.

    Forward: scale (``mul``, 2·eb), ``masked_fill`` out of place (a copy 2·eb, then the fill
    reads the 1-byte mask and writes eb), ``softmax`` (2·eb, one exp per score), and with dropout
    ``bernoulli_`` into a mask of the scores' dtype (eb, one random number per score), ``div_``
    (2·eb) and ``mul`` (3·eb).  Backward: dropout's ``mul`` (3·eb), softmax backward (3·eb),
    the masked fill of the gradient (2·eb + 1) and the scale's ``mul`` (2·eb).  Every result is
    a fresh tensor.  Operator sequence as in PyTorch's eager ``F.softmax``/``F.dropout`` (and
    Hugging Face's ``eager`` attention).
    """
    fwd = (
        memory_bound_time_s(2 * eb * elems, device, kernels=1)
        + memory_bound_time_s((3 * eb + 1) * elems, device, kernels=2)
        + memory_bound_time_s(2 * eb * elems, device, kernels=1, transcendental_elements=elems)
        + memory_bound_time_s(drop * eb * elems, device, kernels=drop, rng_elements=drop * elems)
        + memory_bound_time_s(drop * 5 * eb * elems, device, kernels=2 * drop)
        + first_touch_s(elems * eb, device, count=3 + 2 * drop)
    )
    bwd = memory_bound_time_s((drop * 3 * eb + 3 * eb + 2 * eb + 1 + 2 * eb) * elems, device, kernels=3 + drop) + first_touch_s(elems * eb, device, count=3 + drop)
    return fwd, bwd


def checkpoints_attention_core(training: Training) -> bool:
    """Whether ``recompute: selective`` with the attention core among its modules checkpoints
    the core under ``training``'s attention: an unfused one always, a fused one where the
    framework does (:attr:`cost_model.frameworks.FrameworkRules.checkpoints_fused_attention`:
    Megatron-Core, PaddleNLP) — its forward then runs again in backward."""
    return training.attention == "unfused" or rules_for(training.framework).checkpoints_fused_attention


def saved_gemm_input_bytes(training: Training) -> float:
    """Bytes per element a linear layer keeps of its input for the weight gradient: the 16-bit
    activation's, except under FP8/FP4 where the framework's linear layer keeps the quantised
    input — Transformer Engine's ``Linear`` (``saved_inputmat``, the FP8 cast, or its transpose,
    it made for the GEMM), and torchao's ``Float8Linear`` under torch.compile, whose partitioner
    keeps the forward's cast rather than the input it was cast from.  In eager PyTorch
    (``training.fused_kernels`` false) torchao's float8 saves the 16-bit input
    (``matmul_with_hp_or_float8_args``: ``save_for_backward(input_hp, weight_hp_t)``) and casts it
    again in the backward (``FrameworkRules.fp8_linear``)."""
    eb = float(_act_bytes(training))
    if training.dtype not in NARROW_DTYPES:
        return eb
    if rules_for(training.framework).fp8_linear == "torchao" and not training.fused_kernels:
        return eb
    return float(BYTES_PER_ELEMENT[training.dtype])


def quantised_input_beside_attention_output(training: Training) -> float:
    """1.0 where a fused attention's output is kept twice (else 0.0): the kernel keeps its own
    output O in 16 bits for its backward (FlashAttention's and cuDNN's saved ``out``, beside Q,
    K and V); in 16 bits that is the tensor the output projection keeps as its input, but under
    FP8/FP4 the projection keeps a quantised copy of it (Transformer Engine's ``Linear`` saves
    the input it cast for the weight gradient), so O stays beside it — o/t·eb bytes a token
    (:func:`activation_bytes`)."""
    return 1.0 if training.attention != "unfused" and saved_gemm_input_bytes(training) != _act_bytes(training) else 0.0


def keeps_attention_output(training: Training, S: StrategyArrays) -> FloatArray:
    """Per candidate, 0.0 where a selective recompute of the attention core checkpoints it
    (:func:`checkpoints_attention_core`), so that the kernel's output is not kept (the
    checkpoint keeps Q, K and V), else 1.0."""
    checkpointed = (S.recompute == 1) & (recomputes(S, "core_attn") > 0.0) & checkpoints_attention_core(training)
    out: FloatArray = np.where(checkpointed, 0.0, 1.0)
    return out


def core_attention_recompute_frees(training: Training) -> bool:
    """Whether recomputing the attention core (selective recompute's default module) frees
    memory (:func:`activation_bytes`): the scores of an unfused attention; of a fused one that
    the framework checkpoints (:func:`checkpoints_attention_core`), in FP8/FP4, the 16-bit output
    the kernel keeps beside the projection's quantised copy of it.  In 16 bits a fused
    attention's output is the projection's saved input, kept either way."""
    return training.attention == "unfused" or (quantised_input_beside_attention_output(training) > 0.0 and checkpoints_attention_core(training))


def op_level_selective(model: TransformerSpec, training: Training) -> bool:
    """Whether ``recompute: selective`` is costed as torchtitan's op-level selective activation
    checkpointing (``SelectiveAC``, ``torchtitan/distributed/activation_checkpoint.py``): the
    framework's rule says so (:attr:`cost_model.frameworks.FrameworkRules.selective_recompute`).
    Which outputs it keeps and which matmuls it redoes follow from the layer's matmul sequence
    (:func:`op_level_matmuls`), MLA and MoE layers included."""
    return rules_for(training.framework).selective_recompute == "op-level"


#: Bytes per token and routed expert that torchtitan's op-level policy keeps of the router's
#: ``aten.topk`` (saved "to keep MoE expert assignments stable"): the fp32 score and the int64
#: expert id.
TOPK_SAVED_BYTES = 4.0 + 8.0


def op_level_matmuls(model: TransformerSpec, tp: ArrayOrFloat) -> list[tuple[ArrayOrFloat, ArrayOrFloat]]:
    """The matmuls (``aten.mm`` / ``aten.linear``) one decoder layer of ``model`` (a uniform
    variant, :meth:`TransformerSpec.layer_variants`) runs per token on one TP rank, in
    torchtitan's order, as (input width, output width) — what its op-level policy counts: it
    saves "the output of all compute ops, except every second mm" (the 1st, 3rd, … of each
    layer's forward) and recomputes the rest.

    Attention: Q, K, V, output projection (``wq``, ``wk``, ``wv``, ``wo``); MLA
    (``deepseek_v3/model.py``): ``wq`` — or ``wq_a`` then ``wq_b`` with a query rank —, ``wkv_a``
    (latent and shared rotary key), ``wkv_b`` (keys' no-rotary part and values), ``wo``; the
    down-projections are replicated over TP, the rest split.  FFN: ``w1``, ``w3``, ``w2`` (gated;
    fc1, fc2 otherwise); MoE (``common/moe.py`` ``MoE.forward``): the router's gate, then the
    shared experts' ``w1``, ``w3``, ``w2`` — the routed experts run as ``torch._grouped_mm``,
    which the policy neither counts nor saves (recomputed whole, :func:`op_level_recomputed_gemm_flops`).
    Row-parallel outputs are the h-wide partial sums before their reduction."""
    h, t = float(model.hidden_size), tp
    if model.is_mla:
        a, qk, v = float(model.num_heads), float(model.qk_head_dim), float(model.value_head_dim)
        ql, kl, rope = float(model.q_lora_rank), float(model.kv_lora_rank), float(model.qk_rope_head_dim)
        query: list[tuple[ArrayOrFloat, ArrayOrFloat]] = [(h, ql), (ql, a * qk / t)] if ql else [(h, a * qk / t)]
        attn = [*query, (h, kl + rope), (kl, a * (qk - rope + v) / t), (a * v / t, h)]
    else:
        kv = _kv_local(model, t)
        attn = [(h, model.q_size / t), (h, kv), (h, kv), (model.attn_out_size / t, h)]

    def dense(f: float) -> list[tuple[ArrayOrFloat, ArrayOrFloat]]:
        up: list[tuple[ArrayOrFloat, ArrayOrFloat]] = [(h, f / t), (h, f / t)] if model.gated_ffn else [(h, f / t)]
        return [*up, (f / t, h)]

    if model.is_moe:
        shared = float(model.shared_expert_ffn_hidden_size)
        return [*attn, (h, float(model.num_experts)), *(dense(shared) if shared else [])]
    return [*attn, *dense(float(model.ffn_hidden_size))]


def op_level_saved_width(model: TransformerSpec, tp: ArrayOrFloat) -> ArrayOrFloat:
    """Elements per token of the matmul outputs torchtitan's op-level policy keeps in one layer
    (the odd-numbered ones of :func:`op_level_matmuls`)."""
    return sum((out for _, out in op_level_matmuls(model, tp)[::2]), start=0.0)


def op_level_recomputed_gemm_flops(model: TransformerSpec, T: ArrayOrFloat, tp: ArrayOrFloat) -> FloatArray:
    """Forward FLOPs of the matmuls that torchtitan's op-level policy recomputes in one layer of
    ``T`` tokens: the even-numbered ones of :func:`op_level_matmuls` — for a Llama-style layer
    K, the output projection and w3 (fc2 ungated), 2·T·h·(kv + o/t + f/t) — and an MoE layer's
    routed experts, whose grouped GEMMs it does not save, at the mean load:
    2·T·k·m·h·f/t (m the FFN's matrices; the model-FLOP count of
    :func:`cost_model.transformer.moe.moe_ffn_costs`)."""
    redone = sum((2.0 * i * o for i, o in op_level_matmuls(model, tp)[1::2]), start=0.0)
    if model.is_moe:
        redone = redone + 2.0 * model.experts_per_token * model.ffn_matrices * model.hidden_size * model.ffn_hidden_size / tp
    return np.asarray(T * redone, dtype=float)


def activation_bytes(model: TransformerSpec, training: Training, S: StrategyArrays, frac: ArrayOrFloat | None = None) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Bytes one layer keeps for backward per micro-batch (the mean over a stage's layers), the
    bytes it holds while running, and what recomputing one layer adds during its backward (the
    running set less what the recomputed layer kept).

    Korthikanti et al. 2022 Table 2 term by term (16-bit, per layer, s·b·h units):
    attention block 11·sbh + 5·a·s²·b (QKV input 2, Q 2, K 2, V 2, projection input 2,
    dropout mask 1; scores 2·as²b, softmax-dropout mask as²b, dropout output 2·as²b), MLP 19·sbh
    (FC1 input 2, GELU input 8, FC2 input 8, mask 1), two norms 4·sbh.  Under TP the inner terms
    divide by t; under SP the rest does too.  Generalised here: K and V use the KV width, the
    FFN hidden uses f (×3/2 when gated, ×k for MoE), the s² terms vanish with fused attention and
    with selective recompute, dropout masks vanish without dropout (models without biases), and
    sequences divide by cp, FP8 training saves the linear layers' inputs in FP8 (a fused
    attention's output then kept twice: in 16 bits by the attention, in FP8 by the projection), eager PyTorch
    (``fused_kernels`` false) keeps its RMSNorm's and gated activation's intermediates
    (:func:`eager_saved_bytes_per_element`); an MoE FFN adds
    :func:`cost_model.transformer.moe.moe_activation_bytes`.  Selective recompute under torchtitan
    (:func:`op_level_selective`) keeps what its op-level policy saves instead (computed below).
    Full recompute keeps only the
    layer input (2·sbh, /t under SP) — for the fraction ``frac`` of the layers it recomputes
    (:func:`recompute_fraction`; the others keep everything); Megatron-Core's uniform method over
    groups of g layers (``StrategyArrays.recompute_group``) keeps one such input a group (1/g a
    layer) and, while a group's backward runs, holds the recomputed activations of all g of its
    layers (the working set: g·full less the group's input; Megatron-Core
    ``transformer_block._checkpointed_forward``, ``recompute_method == "uniform"``).  FP4 (NVFP4) saves them as the wgrad operand Transformer
    Engine keeps: the Hadamard-transformed input quantised along the token dimension, 0.5 byte per
    element plus one E4M3 scale per 16 (:data:`cost_model.devices.BYTES_PER_ELEMENT`).
    Checkpointing by submodule (``training.submodule_checkpointing``: ``checkpoint_wrapper`` on
    the attention, the MLP and the norms: NeMo-RL's DTensor policy) keeps each wrapped module's
    input instead — norms_per_layer + 2 of them, 8·sbh for a two-norm layer against a whole-layer
    checkpoint's 2·sbh — and its backward holds one recomputed submodule's insides at a time.
    """
    eb = _act_bytes(training)
    h = float(model.hidden_size)
    a = float(model.num_heads)
    f = float(model.ffn_hidden_size)
    s_seq = float(training.sequence_length)
    s = model.attention_span(s_seq)  # keys per query (the window on windowed layers)
    q, o = float(model.q_size), float(model.attn_out_size)
    t, c, b = S.tp, S.cp, S.mbs
    sc = s_seq / c
    sbh = sc * b * h  # elements
    kv = _kv_local(model, t)
    mask = 1.0 if model.bias else 0.0
    rep = np.where(S.sp, t, 1.0)

    # FP8 (Transformer Engine; torchao under torch.compile): each linear layer saves its FP8-cast
    # input for the weight gradient (1 byte) instead of the 16-bit tensor — the QKV, projection,
    # FC1 and FC2 inputs (saved_gemm_input_bytes).
    gi = saved_gemm_input_bytes(training)
    # Replicated (outside TP regions): QKV input, FC1 input, two dropout masks, two norm inputs.
    replicated = sbh * (gi + gi + 2 * mask + 2 * eb) / rep
    # Inside TP regions: Q, K, V, projection input.
    attn_inner = sc * b * (q / t * eb + 2 * kv * eb + o / t * gi)
    if model.is_mla:  # compressed query/KV latents and the shared rotary key
        attn_inner = attn_inner + mla_latent_activation_bytes(
            q_lora_rank=float(model.q_lora_rank), kv_lora_rank=float(model.kv_lora_rank), rope_dim=float(model.qk_rope_head_dim),
            tokens=sc * b, tp=t, sequence_parallel=S.sp, act_bytes=eb,
        )
    k_experts = model.experts_per_token if model.is_moe else 1.0
    # FFN hidden: the activation's input(s) (2 when gated) and the FC2 input.
    ffn_inner = sc * b * f / t * k_experts * (eb * (2 if model.gated_ffn else 1) + gi)
    # softmax output, dropout output and mask (unfused only; eager dropout keeps its mask in the
    # scores' dtype)
    scores = a * sc * s * b / t * ((2 * eb + mask) if training.fused_kernels else (eb + mask * 2 * eb))
    # without the attention core among the modules, a selective recompute keeps the scores too
    store_scores = (training.attention == "unfused") & ((S.recompute == 0) | ((S.recompute == 1) & (recomputes(S, "core_attn") == 0.0)))
    if model.is_moe:  # router probabilities, permuted tokens, expert outputs, shared experts
        ffn_inner = ffn_inner + moe_activation_bytes(
            hidden=h, num_experts=float(model.num_experts), top_k=float(model.experts_per_token),
            shared_ffn_hidden=float(model.shared_expert_ffn_hidden_size), gated=model.gated_ffn, tokens=sc * b,
            tp=t, cp=c, dp=S.dp, ep=S.ep, sequence_parallel=S.sp, act_bytes=eb, saved_input_bytes=gi,
            capacity_factor=training.moe_capacity_factor, etp=S.etp_pin,
            keeps_expert_outputs=not rules_for(training.framework).moe_probs_in_experts,
        )
    if not training.fused_kernels:
        # eager PyTorch's RMSNorm and gated activation keep more (eager_saved_bytes_per_element)
        norm_b, glu_b = eager_saved_bytes_per_element(int(eb))
        norms = model.norms_per_layer * sbh / rep + (sc * b * (q / t + kv) if model.qk_norm else 0.0)
        replicated = replicated + (norms * norm_b if model.norm == "rmsnorm" else 0.0)
        ffn_inner = ffn_inner + (sc * b * f / t * k_experts * glu_b if model.gated_ffn else 0.0)
    # A fused attention kernel's own 16-bit output, kept beside the projection's quantised copy
    # under FP8/FP4 (quantised_input_beside_attention_output), unless the attention core's
    # checkpoint discards it (keeps_attention_output).
    out_kept = sc * b * o / t * eb * quantised_input_beside_attention_output(training)
    full = replicated + attn_inner + ffn_inner + out_kept + np.where(training.attention == "unfused", scores, 0.0)
    stored = replicated + attn_inner + ffn_inner + out_kept * keeps_attention_output(training, S) + np.where(store_scores, scores, 0.0)
    layer_input = sbh * eb / rep
    if op_level_selective(model, training):
        # torchtitan's op-level selective checkpointing (:func:`op_level_selective`) keeps the
        # layer input, the odd-numbered matmul outputs (:func:`op_level_saved_width`; a
        # Llama-style layer's Q, V, w1 and w2's row-parallel partial sum), the attention output
        # (o/t) with its fp32 log-sum-exp (4 bytes per head), under TP the two reduce-scatter
        # outputs (h/t each, under SP), and in an MoE layer the router's top-k (fp32 scores and
        # int64 expert ids) and, with expert parallelism, both all-to-alls' outputs (the
        # dispatched and the combined tokens, R·h each).  Norms, RoPE, the activation, dropout,
        # the token permutation and the routed experts' grouped GEMMs are recomputed.
        saved_mm = sc * b * op_level_saved_width(model, t) * eb
        attn_out = sc * b * (o / t * eb + a / t * 4.0)
        reduce_scatter = np.where((t > 1) & S.sp, 2.0 * sbh * eb / t, 0.0)
        moe_saved: ArrayOrFloat = 0.0
        if model.is_moe:
            T_loc = local_tokens(sc * b, t, S.sp)
            k_tok = float(model.experts_per_token)
            load = expert_load_factor(T_loc * k_tok, S.ep, training.moe_capacity_factor)
            slots = received_slots(T_loc, k_tok, load, expert_tensor_parallel(t, c, S.dp, S.ep, S.etp_pin), S.sp)
            moe_saved = T_loc * k_tok * TOPK_SAVED_BYTES + np.where(S.ep > 1, 2.0 * slots * h * eb, 0.0)
        stored = np.where(S.recompute == 1, layer_input + saved_mm + attn_out + reduce_scatter + moe_saved, stored)
    else:
        # Megatron-Core's --recompute-modules beyond the attention core (selective_module_costs)
        freed = _selective_freed_bytes(model, S, sbh=sbh / rep, tokens=sc * b, gi=gi, eb=eb, t=t, kv=kv, ffn_inner=ffn_inner,
                                       attn_inner=attn_inner)
        stored = np.where(S.recompute == 1, stored - freed, stored)
    rf = recompute_fraction(model, S) if frac is None else np.asarray(frac, dtype=float)
    largest_group, inputs_per_layer = uniform_recompute_groups(model, S)
    recomputing = largest_group * full - layer_input
    if training.submodule_checkpointing:
        # each checkpointed submodule keeps its input — the norms' (the residual stream), the
        # attention's and the MLP's (the normed states): norms_per_layer + 2 hidden-size tensors
        # a layer — and the backward recomputes one submodule at a time, the larger of the
        # attention's and the MLP's insides (the scores too under unfused attention)
        inputs_per_layer = inputs_per_layer * (model.norms_per_layer + 2.0)
        attention_inside = attn_inner + out_kept + np.where(training.attention == "unfused", scores, 0.0)
        recomputing = np.maximum(attention_inside, ffn_inner)
    working = np.where(S.recompute == 2, recomputing, np.where(S.recompute == 1, full - stored, 0.0))
    stored = np.where(S.recompute == 2, rf * layer_input * inputs_per_layer + (1.0 - rf) * full, stored)
    return stored, full, working


def offload_module_bytes(model: TransformerSpec, training: Training, S: StrategyArrays) -> FloatArray:
    """Bytes per layer and micro-batch that Megatron-Core's fine-grained activation offloading
    moves to the host for ``training.offload_modules`` (each module's saved tensors, in
    :func:`activation_bytes`' terms): ``attn_norm`` the attention's input norm's input and
    ``mlp_norm`` the MLP's pre-norm input, where the norm is a module of its own (MLA's input norm,
    an MoE layer's pre-MLP norm; Transformer Engine fuses a dense layer's norms into the next
    GEMM, whose input is the ``qkv_linear`` / FC1 input); ``qkv_linear`` the QKV projection's
    input; ``core_attn`` Q, K and V (and under FP8/FP4 a fused kernel's own output,
    :func:`quantised_input_beside_attention_output`); ``attn_proj`` the output projection's input; ``expert_fc1`` the
    experts' dispatched tokens (FC1's input); ``moe_act`` the activation function's input (both
    halves when gated).  Source: Megatron-Core ``transformer_layer.py``/``moe/experts.py``
    (``group_prefetch_offload_start`` around each module), docs "Fine-grained Activation Offloading"."""
    mods = set(training.offload_modules)
    eb = _act_bytes(training)
    gi = saved_gemm_input_bytes(training)
    h = float(model.hidden_size)
    t, c, b = S.tp, S.cp, S.mbs
    tokens = float(training.sequence_length) / c * b
    rep = np.where(S.sp, t, 1.0)
    kv = _kv_local(model, t)
    out: FloatArray = np.zeros(np.broadcast(t, c, b, rep).shape)
    if "attn_norm" in mods and model.is_mla:
        out = out + tokens * h * eb / rep
    if "mlp_norm" in mods and model.is_moe:
        out = out + tokens * h * eb / rep
    if "qkv_linear" in mods:
        out = out + tokens * h * gi / rep
    if "core_attn" in mods:  # with, under FP8/FP4, the fused kernel's own output
        kernel_out = float(model.attn_out_size) / t * eb * quantised_input_beside_attention_output(training) * keeps_attention_output(training, S)
        out = out + tokens * (float(model.q_size) / t * eb + 2.0 * kv * eb + kernel_out)
    if "attn_proj" in mods:
        out = out + tokens * float(model.attn_out_size) / t * gi
    if model.is_moe and mods & {"expert_fc1", "moe_act"}:
        k_tok = float(model.experts_per_token)
        T_loc = local_tokens(tokens, t, S.sp)
        load = expert_load_factor(T_loc * k_tok, S.ep, training.moe_capacity_factor)
        etp = expert_tensor_parallel(t, c, S.dp, S.ep, S.etp_pin)
        slots = received_slots(T_loc, k_tok, load, etp, S.sp)
        if "expert_fc1" in mods:
            out = out + slots * h * gi
        if "moe_act" in mods:
            out = out + slots * float(model.ffn_hidden_size) / etp * (2.0 if model.gated_ffn else 1.0) * eb
    return out


def recompute_modules_mask(modules: Sequence[str]) -> int:
    """A module set (``Strategy.recompute_modules``) as a bitmask over
    :data:`cost_model.frameworks.ALL_RECOMPUTE_MODULES` (0: the default, the attention core)."""
    return sum(1 << ALL_RECOMPUTE_MODULES.index(m) for m in modules)


def recompute_modules_of(mask: int) -> tuple[str, ...]:
    """The module set of a :func:`recompute_modules_mask` (empty: the default)."""
    return tuple(m for i, m in enumerate(ALL_RECOMPUTE_MODULES) if (int(mask) >> i) & 1)


def model_recompute_modules(model: TransformerSpec) -> tuple[str, ...]:
    """The recompute modules that have something to recompute in ``model`` under Transformer
    Engine (:func:`selective_module_costs`), in Megatron-Core's order: the attention core and
    the dense MLP (an MoE model's only in its dense layers), ``moe_act``, ``moe`` and
    ``shared_experts`` (MoE), ``mla_up_proj`` (MLA), ``layernorm`` where a norm is a module of
    its own (MoE's pre-MLP norm, MLA's input norm; a dense layer's are fused into the next GEMM);
    then Paddle's ``full_attn``, the attention module every layer has.  Which of them a framework
    names is its rule table's (``FrameworkRules.recompute_modules``)."""
    has = {"core_attn": True, "moe_act": model.is_moe, "layernorm": model.is_moe or model.is_mla, "mla_up_proj": model.is_mla,
           "mlp": not model.is_moe or bool(model.dense_layer_indices), "moe": model.is_moe,
           "shared_experts": model.is_moe and bool(model.shared_expert_ffn_hidden_size), "full_attn": True}
    return tuple(m for m in ALL_RECOMPUTE_MODULES if has[m])


#: The modules that discard their output once consumed and recompute it before backward (a
#: memory-bound pass or two small GEMMs each), against the normal checkpoints of whole
#: submodules (``mlp``, ``moe``, ``shared_experts``), which redo their whole forward.
OUTPUT_DISCARDING_MODULES = ("moe_act", "layernorm", "mla_up_proj")


def lean_recompute_modules(model: TransformerSpec, training: Training) -> tuple[str, ...]:
    """The module set the search offers beside Megatron-Core's default for a model that has
    more to recompute: the output-discarding modules the model has
    (:func:`model_recompute_modules`) — ``moe_act`` and ``layernorm`` (MoE), ``layernorm`` and
    ``mla_up_proj`` (MLA) —, with the attention core where recomputing it frees memory
    (:func:`core_attention_recompute_frees`; else its forward would run again for nothing).
    They free their outputs for a memory-bound pass or two small GEMMs each
    (:func:`selective_module_costs`), where full recompute pays the whole forward; empty for a
    dense model without MLA (its norms are fused: nothing more to discard cheaply).  Under Paddle,
    whose ``recompute_granularity`` takes one module, ``full_attn``: it frees Q, K, V and the
    projection's input for the attention's projections forward again — more than the attention
    core frees, for less time than a full recompute (``bench/physics_cases.py``
    ``paddle_full_attn``)."""
    have = rules_for(training.framework).recompute_modules
    if "full_attn" in have:
        return ("full_attn",)
    chosen = [m for m in model_recompute_modules(model) if m in OUTPUT_DISCARDING_MODULES and m in have]
    if not chosen:
        return ()
    return ("core_attn", *chosen) if core_attention_recompute_frees(training) else tuple(chosen)


def recomputes(S: StrategyArrays, module: str) -> FloatArray:
    """Per candidate, 1.0 where ``recompute: selective`` recomputes Megatron-Core's ``module``
    (``Strategy.recompute_modules``; none given: the attention core alone — which is also what
    the other frameworks' attention-core selective recompute does; torchtitan's op-level policy
    is its own, :func:`op_level_selective`), else 0.0 — whatever the recompute mode.  PaddleNLP's
    ``full_attn`` recomputes the attention core with the rest of its attention module."""
    mask = np.zeros_like(np.asarray(S.tp, dtype=float)) if S.recompute_modules is None else np.asarray(S.recompute_modules, dtype=float)
    bits = mask.astype(np.int64)
    has = (bits >> ALL_RECOMPUTE_MODULES.index(module)) & 1
    if module == "core_attn":
        has = has | ((bits >> ALL_RECOMPUTE_MODULES.index("full_attn")) & 1)
    out: FloatArray = np.where((bits == 0) & (module == "core_attn"), 1.0, has.astype(float))
    return out


def recompute_modules_notes(model: TransformerSpec, modules: Sequence[str]) -> list[str]:
    """A warning for recompute modules that change nothing here: a module this model does not
    have (Megatron-Core runs it as a no-op; :func:`model_recompute_modules`)."""
    has = model_recompute_modules(model)
    idle = [m for m in modules if m not in has]
    if not idle:
        return []
    return [f"recompute_modules {', '.join(idle)}: nothing to recompute in this model (no such module of its own under "
            "Transformer Engine: a dense layer's norms are fused into the next GEMM); costed as a no-op"]


def _selective_freed_bytes(model: TransformerSpec, S: StrategyArrays, *, sbh: ArrayOrFloat, tokens: ArrayOrFloat, gi: float,
                           eb: float, t: ArrayOrFloat, kv: ArrayOrFloat, ffn_inner: ArrayOrFloat, attn_inner: ArrayOrFloat) -> FloatArray:
    """Bytes per layer and micro-batch that the recompute modules other than the attention core
    free (:func:`selective_module_costs` has the derivation); ``sbh`` the layer's hidden-state
    elements on this GPU (after sequence parallelism), ``tokens`` its tokens, ``ffn_inner`` and
    ``attn_inner`` the FFN's and the attention's inner stored bytes (Q, K, V, the projection's
    input; MLA's latents) as :func:`activation_bytes` counts them."""
    norm_out = np.asarray(sbh, dtype=float) * gi
    if S.recompute_modules is None:  # every candidate at the default: nothing beyond the attention core
        return np.zeros_like(norm_out * np.asarray(t, dtype=float))
    f, fm = float(model.ffn_hidden_size), float(model.ffn_matrices)
    T, tp = np.asarray(tokens, dtype=float), np.asarray(t, dtype=float)
    freed: FloatArray = recomputes(S, "layernorm") * (int(model.is_moe) + int(model.is_mla)) * norm_out
    freed = freed + recomputes(S, "full_attn") * np.asarray(attn_inner, dtype=float)
    if model.is_mla:
        freed = freed + recomputes(S, "mla_up_proj") * T * (model.q_size / tp + 2.0 * np.asarray(kv, dtype=float)) * eb
    if model.is_moe:
        whole = recomputes(S, "moe")  # the whole MoE FFN covers its activation and shared experts
        shared = T * float(model.shared_expert_ffn_hidden_size) / tp * (eb * (fm - 1.0) + gi)
        parts = recomputes(S, "moe_act") * T * model.experts_per_token * f / tp * gi + recomputes(S, "shared_experts") * shared
        freed = freed + whole * np.asarray(ffn_inner, dtype=float) + (1.0 - whole) * parts
    else:
        freed = freed + recomputes(S, "mlp") * (np.asarray(ffn_inner, dtype=float) + norm_out)
    return freed


def selective_module_costs(
    model: TransformerSpec, training: Training, device: DeviceSpec, S: StrategyArrays, T: ArrayOrFloat, ffn_fwd_s: ArrayOrFloat,
    moe: MoeFfnCost | None, attn_gemm_fwd_s: ArrayOrFloat = 0.0,
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """Megatron-Core's ``--recompute-modules`` beyond the attention core (``Strategy.
    recompute_modules``; Megatron-Core ``TransformerConfig.recompute_modules``, its
    ``transformer_layer.py``/``moe_layer.py``/``experts.py``) and PaddleNLP's ``full_attn``: per
    layer and micro-batch, the seconds the recomputed forward pieces take in backward, the FFN
    tensor-parallel collective passes they run again (in :func:`_layer_parallel_comm`'s units:
    the dense MLP's one, or the MoE layer's ``ffn_tp_one_s``), the expert dispatch/combine pairs
    they run again, and the attention's tensor-parallel collective passes they run again (one
    all-reduce's, or a reduce-scatter and an all-gather under SP).  What each frees is
    :func:`_selective_freed_bytes` (same terms, in :func:`activation_bytes`):

    * ``layernorm`` — output-discarding checkpoints of the norms that are modules of their own
      under Transformer Engine: an MoE layer's pre-MLP norm (the router and dispatcher read it)
      and MLA's input norm; a dense layer's norms are fused into the next GEMM
      (``TELayerNormColumnParallelLinear``) and are not recomputed.  Frees the norm's output
      (the next GEMM's saved input, b·s·h/SP elements at the saved-input bytes); costs a norm
      forward, one pass reading and writing the hidden state.
    * ``moe_act`` — the experts' activation function, output-discarding: frees the FC2 input
      (T·k·f/t elements); costs the activation forward, a pass over FC1's output.
    * ``mla_up_proj`` — MLA's query and KV up-projections and RoPE, output-discarding: frees the
      expanded Q, K and V the attention core saves; costs the two up-projection GEMMs
      (:func:`cost_model.transformer.mla.mla_projection_shapes`) and a RoPE pass over Q and K.
    * ``mlp`` — the dense MLP, normal checkpointing (its input kept): frees its inner
      activations and FC1's saved input; costs the MLP forward — its GEMMs, activation and its
      tensor-parallel collectives.
    * ``moe`` — the whole MoE layer, normal checkpointing: frees everything the MoE FFN keeps;
      costs its forward — router, permutation, grouped experts, shared experts, its TP
      collectives and a dispatch and combine (``moe.ep_recompute_s``).  It covers ``moe_act``
      and ``shared_experts``.
    * ``shared_experts`` — the shared experts, normal checkpointing: frees their hidden; costs
      their two GEMMs forward.
    * ``full_attn`` (PaddleNLP's ``recompute_granularity``) — the self-attention module, normal
      checkpointing (its normed input kept): frees Q, K, V and the projection's input (MLA's
      latents too); costs the attention's projection GEMMs forward (``attn_gemm_fwd_s``), a RoPE
      pass over Q and K, its TP collective pass; the attention core it contains is the
      ``core_attn`` term (:func:`recomputes`).
    """
    t = np.asarray(S.tp, dtype=float)
    T = np.asarray(T, dtype=float) * np.ones_like(t)
    zero: FloatArray = np.zeros_like(T)
    if S.recompute_modules is None:  # every candidate at the default (the search's usual case): nothing to cost
        return zero, zero, zero, zero
    eb = _act_bytes(training)
    gi = BYTES_PER_ELEMENT[training.dtype] if training.dtype in NARROW_DTYPES else eb
    h, f, fm = float(model.hidden_size), float(model.ffn_hidden_size), float(model.ffn_matrices)
    rep = np.where(S.sp, t, 1.0)
    norms = int(model.is_moe) + int(model.is_mla)
    seconds: FloatArray = recomputes(S, "layernorm") * norms * memory_bound_time_s(T * h / rep * (eb + gi), device, kernels=1) if norms else zero
    tp_passes, ep_pairs = zero, zero
    if model.is_mla:
        shapes = _mla_shapes(model, T, S)
        ups = [shapes[1], shapes[-1]] if model.q_lora_rank else [shapes[-1]]
        up_fwd, _ = mla_projection_fwd_bwd_s(ups, device, training.dtype)
        rope = memory_bound_time_s(T * (model.q_size / t + _kv_local(model, S.tp)) * 2.0 * eb, device, kernels=2)
        seconds = seconds + recomputes(S, "mla_up_proj") * (up_fwd + rope)
    if model.is_moe and moe is not None:
        whole = recomputes(S, "moe")
        act = memory_bound_time_s(T * model.experts_per_token * f / t * ((fm - 1.0) * eb + gi), device, kernels=1)
        parts = recomputes(S, "moe_act") * act
        if model.shared_expert_ffn_hidden_size:
            fs = float(model.shared_expert_ffn_hidden_size)
            s1, _ = gemm_fwd_bwd_time_s(T, (fm - 1.0) * fs / t, h, device, training.dtype)
            s2, _ = gemm_fwd_bwd_time_s(T, h, fs / t, device, training.dtype)
            parts = parts + recomputes(S, "shared_experts") * (s1 + s2)
        seconds = seconds + whole * (moe.gemm_fwd_s + moe.elementwise_fwd_s) + (1.0 - whole) * parts
        tp_passes, ep_pairs = whole, whole
    elif not model.is_moe:
        mlp = recomputes(S, "mlp")
        act = memory_bound_time_s(T * f / t * ((fm - 1.0) * eb + gi), device, kernels=1)
        seconds = seconds + mlp * (np.asarray(ffn_fwd_s, dtype=float) + act)
        tp_passes = mlp
    attn = recomputes(S, "full_attn")
    rope = memory_bound_time_s(T * (model.q_size / t + _kv_local(model, S.tp)) * 2.0 * eb, device, kernels=2)
    seconds = seconds + attn * (np.asarray(attn_gemm_fwd_s, dtype=float) + rope)
    return seconds, tp_passes, ep_pairs, attn


def bf16_optimizer(training: Training, zero_stage: ArrayOrFloat, pp: ArrayOrFloat) -> npt.NDArray[np.bool_]:
    """Whether the stage trains under DeepSpeed's ``BF16_Optimizer`` (``runtime/bf16_optimizer.py``),
    as DeepSpeed 0.19's ``engine._do_optimizer_sanity_check`` picks it under bf16: at ZeRO stage 0
    with a pipeline (pp > 1: its pipeline engine; without one DeepSpeed runs ``DDP_BFLOAT16``, its
    ``FP16_Optimizer`` in bf16 — unpartitioned fp32 master weights and moments, bf16 gradients
    accumulated in ``.grad`` and all-reduced, priced as stage 0 is elsewhere) and at stage 1 when
    asked for fp32 gradient accumulation (``training.grad_accum_dtype`` ``fp32``, which the
    planner's ``ds_config.json`` then writes as ``data_types.grad_accum_dtype``); at stage 1 by
    default (bf16 accumulation: DeepSpeed's own default when a config leaves ``data_types`` out),
    and at 2, it runs its ZeRO optimizer.  BF16_Optimizer keeps a full-size
    fp32 gradient buffer (:func:`model_state_bytes_per_param`), accumulates into it every
    micro-batch (``stage_cost.grad_accumulation_s``), has no IPG gradient buckets
    (``stage_cost.gradient_bucket_bytes``), partitions its fp32 master weights and moments over
    dp even at stage 0 (:func:`optimizer_state_partitioned`) and all-reduces its gradients before
    all-gathering the updated weights (:func:`step_sync_ring_passes`).  With optimizer offload
    (``training.optimizer_offload_fraction``) the engine keeps its ZeRO optimizer at stage 1
    (``_do_optimizer_sanity_check``: BF16_Optimizer only "and not self.zero_cpu_offload()")."""
    z = np.asarray(zero_stage)
    if training.dtype != "bf16" or not runs_deepspeed_engine(training.framework):
        return np.zeros(np.broadcast(z, np.asarray(pp)).shape, dtype=bool)
    offloaded = training.optimizer_offload_fraction > 0.0  # ZeRO-Offload keeps its ZeRO optimizer ("and not self.zero_cpu_offload()")
    out: npt.NDArray[np.bool_] = ((z == 0) & (np.asarray(pp) > 1)) | ((z == 1) & (training.grad_accum_dtype == "fp32") & (not offloaded))
    return out


def pipelined_fsdp(training: Training, zero_stage: ArrayOrFloat, pp: ArrayOrFloat) -> npt.NDArray[np.bool_]:
    """Rows where fully sharded FSDP runs inside a pipeline stage (``fsdp``, ZeRO 3, pp > 1) —
    which torchtitan runs as neither ZeRO-3 nor ZeRO-2 but, across a step's micro-batches, as
    ZeRO-1 with unsharded fp32 gradients:

    * torchtitan's default ``fsdp_reshard_after_forward`` (what the plan's launch writes for
      ZeRO 3) resolves to *never* with a pipeline (``get_fsdp_reshard_after_forward_policy``:
      ``not pp_enabled``), and ``torch.distributed.pipelining`` runs every backward with
      ``set_reshard_after_backward(False)`` and ``set_requires_gradient_sync(False)``
      (``PipelineStage.backward_maybe_with_nosync``), calling the reduction once, after the
      stage's last backward (``perform_reduce_grad``): the stage's weights are gathered once a
      step and stay unsharded (2 B a parameter beside the fp32 shard), and its gradients are
      reduce-scattered once a step;
    * without gradient sync, FSDP2 moves each unsharded gradient into an accumulator in the
      reduce dtype (``FSDPParam.to_accumulated_grad_if_needed``: ``grad.to(reduce_dtype)``, fp32
      under torchtitan's ``mixed_precision_reduce``) and adds every later micro-batch's into it
      (``accumulate_unsharded_grad_if_needed``): 4 B a parameter, unsharded, and a memory-bound
      add per micro-batch (``stage_cost.FSDP_ACCUMULATION_BYTES_PER_PARAM``).

    So the traffic is ZeRO-1's (:func:`step_sync_ring_passes`), not ZeRO-3's per micro-batch, and
    the memory is the distributed optimizer's.  ZeRO 2 with a pipeline stays the Llama 3 paper's
    layout (gradients reduce-scattered with each micro-batch), which torchtitan cannot run: its
    estimate warns (``frameworks.pipeline_gradient_sharding_note``) and its launch says so."""
    return _defers_gradient_sync(training.framework, zero_stage, pp)


def _defers_gradient_sync(framework: str, zero_stage: Any, pp: Any) -> npt.NDArray[np.bool_]:
    """Full sharding inside a pipeline whose schedule turns the per-micro-batch gradient sync off
    until the stage's last backward (``FrameworkRules.sharded_gradients_in_pipeline`` false)."""
    out: npt.NDArray[np.bool_] = (np.asarray(zero_stage) >= 3) & (np.asarray(pp) > 1) & (not rules_for(framework).sharded_gradients_in_pipeline)
    return out


def fsdp_reduces_each_microbatch(training: Training, zero_stage: ArrayOrFloat, pp: ArrayOrFloat) -> npt.NDArray[np.bool_]:
    """Rows where unsharded FSDP (``fsdp``, ZeRO 0) runs without a pipeline: torchtitan applies
    ``fully_shard`` on a (dp_replicate, shard 1) mesh, and its trainer runs each gradient-
    accumulation step's backward with gradient sync on (``Trainer.train_step`` never calls
    ``set_requires_gradient_sync(False)``; only ``torch.distributed.pipelining`` does), so every
    micro-batch's post-backward all-reduces its gradients over the replicas — 2R per
    micro-batch, where DDP under ``no_sync`` (and Megatron-Core) all-reduces once a step
    (``FrameworkRules.reduces_every_backward``)."""
    every = rules_for(training.framework).reduces_every_backward
    out: npt.NDArray[np.bool_] = every & (np.asarray(zero_stage) == 0) & (np.asarray(pp) == 1)
    return out


def fsdp_accumulates_in_fp32(training: Training, zero_stage: ArrayOrFloat, pp: ArrayOrFloat) -> npt.NDArray[np.bool_]:
    """Rows where FSDP2 adds every micro-batch's 16-bit gradients into fp32 buffers of the whole
    stage's parameters (a memory-bound pass per micro-batch, ``stage_cost.FSDP_ACCUMULATION_
    BYTES_PER_PARAM``): full sharding inside a pipeline (:func:`pipelined_fsdp`: unsharded fp32
    accumulators while sync is off) and ZeRO 0, whose one-rank shard is the whole fp32 gradient
    — accumulated under a pipeline's sync-off as the former, else after each micro-batch's
    all-reduce (:func:`fsdp_reduces_each_microbatch`: copied into the fp32 reduce buffer and
    added into the sharded gradient)."""
    out: npt.NDArray[np.bool_] = pipelined_fsdp(training, zero_stage, pp) | (
        rules_for(training.framework).reduces_every_backward & (np.asarray(zero_stage) == 0))
    return out


def fsdp_regathers_each_microbatch(training: Training, zero_stage: ArrayOrFloat, pp: ArrayOrFloat) -> npt.NDArray[np.bool_]:
    """Rows where FSDP's SHARD_GRAD_OP (``fsdp``, ZeRO 2) runs without a pipeline: FSDP2's
    ``reshard_after_forward=False`` keeps a unit's weights from its forward to its backward, but
    the post-backward hook reshards them (``reshard_after_backward`` is true unless a pipeline
    schedule turns it off), so every micro-batch's forward all-gathers the weights again — one
    all-gather and one reduce-scatter per micro-batch, not ZeRO-2's all-gather once a step
    (FSDP1's SHARD_GRAD_OP likewise frees the unsharded parameters after backward).  With a
    pipeline, ZeRO 2 is the Llama 3 paper's layout (weights kept across the micro-batches)
    (``FrameworkRules.reduces_every_backward``)."""
    every = rules_for(training.framework).reduces_every_backward
    out: npt.NDArray[np.bool_] = every & (np.asarray(zero_stage) == 2) & (np.asarray(pp) == 1)
    return out


def optimizer_state_partitioned(training: Training, zero_stage: ArrayOrFloat, pp: ArrayOrFloat) -> npt.NDArray[np.bool_]:
    """Whether the fp32 master weights and optimizer moments are partitioned over the
    data-parallel ranks: ZeRO stage ≥ 1, and DeepSpeed's BF16_Optimizer at any stage
    (:func:`bf16_optimizer`: it partitions them at stage 0 as at stage 1)."""
    out: npt.NDArray[np.bool_] = (np.asarray(zero_stage) >= 1) | bf16_optimizer(training, zero_stage, pp)
    return out


#: Bytes an 8-bit Adam moment takes per parameter (``training.optimizer`` ``adamw_8bit``): its
#: 8-bit code and an fp32 absolute maximum per block of 256 values (torchao's ``AdamW8bit``
#: default ``block_size``; bitsandbytes' blockwise 8-bit state uses larger blocks, so less).
#: Source: Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization" §2; torchao
#: ``optim/subclass_8bit.py``.
EIGHT_BIT_MOMENT_BYTES = 1.0 + 4.0 / 256.0


def adam_moment_bytes(training: Training) -> float:
    """Bytes per parameter of Adam's two moments: fp32 (8), the parameters' bf16 in pure bf16
    training (4), 8-bit blockwise under ``adamw_8bit`` (:data:`EIGHT_BIT_MOMENT_BYTES` each)."""
    if training.eight_bit_moments:
        return 2.0 * EIGHT_BIT_MOMENT_BYTES
    return 4.0 if not training.master_weights else 8.0


def model_state_bytes_per_param(
    training: Training, zero_stage: ArrayOrFloat, shard: ArrayOrFloat, pp: ArrayOrFloat
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Bytes per parameter on one GPU for weights, gradients and optimizer state.

    Mixed precision with Adam (Rajbhandari et al. 2020; Megatron docs): 16-bit weights (2),
    fp32 gradient accumulation (4, as Megatron does), fp32 master weights + momentum +
    variance (12).  fp32 training: weights 4, gradients 4, Adam moments 8.  SGD keeps one
    momentum (4) plus the fp32 master copy under mixed precision.  Pure bf16 training
    (``training.master_weights`` false: torchtitan's ``training.dtype = "bfloat16"``, the
    optimizer's state taking the parameters' dtype): weights 2, gradients 2, Adam moments 4 (SGD 2).  The 8-bit AdamW
    (``adamw_8bit``) holds its moments in :data:`EIGHT_BIT_MOMENT_BYTES` each.  ZeRO divides over ``shard``
    ranks: stage ≥1 the optimizer state, ≥2 the gradients, 3 the weights.

    Megatron-Core's gradient buffer and optimizer state follow its optimizer-precision settings
    (:func:`megatron_optimizer_state_bytes`); Paddle's gradients ``main_grads_dtype`` — fp32
    under AMP O2 with ``master_grad`` (what its launch writes by default), 16-bit without.

    DeepSpeed's ZeRO-1 optimizer (``megatron-deepspeed``, ``deepspeed``: ``stage_1_and_2.py``)
    keeps the gradients in the 16-bit training dtype (2) and an fp32 copy of its own partition
    only (4/shard), where Megatron keeps a full fp32 gradient buffer.  At stages 2 and 3 the
    gradients it holds are partitioned in their accumulation dtype — stage 2's
    ``grads_in_partition`` in the training dtype, stage 3's ``grad_partitions_flat_buffer`` in
    ``data_types.grad_accum_dtype``, by default the training dtype too — (2/shard, 4/shard
    under fp32 accumulation), beside which the step casts an fp32 copy for the optimizer
    (:func:`deepspeed_step_gradient_bytes`, added by ``stage_cost``).  DeepSpeed's BF16_Optimizer
    (:func:`bf16_optimizer`: stage 0 under a pipeline (``pp`` > 1), and 1 with fp32 accumulation) keeps bf16 gradients and a full fp32 buffer (2 + 4)
    and partitions its fp32 master weights and moments over dp at either stage (12/shard).
    """
    mixed = training.dtype != "fp32"
    w = 2.0 if mixed else 4.0
    g = 4.0
    # the fp32 master copy under mixed precision, Adam's moments (:func:`adam_moment_bytes`) or SGD's momentum
    o = (4.0 if mixed else 0.0) + (adam_moment_bytes(training) if training.adam else 4.0)
    if not training.master_weights:  # pure bf16: bf16 gradients and moments, no fp32 master copy
        g, o = 2.0, (adam_moment_bytes(training) if training.adam else 2.0)
    settings = rules_for(training.framework).optimizer_precision  # the framework's optimizer-precision settings
    if "precision_aware_optimizer" in settings:  # Megatron-Core's optimizer (defaults: the above)
        g, o = megatron_optimizer_state_bytes(training)
    elif "main_grads_dtype" in settings and mixed:  # the gradients' dtype alone (Paddle's master_grad)
        g = _stored_bytes(training.main_grads_dtype)
    z = np.asarray(zero_stage)
    shard = np.asarray(shard, dtype=float)
    weights = np.where(z >= 3, w / shard, w)
    grads = np.where(z >= 2, g / shard, g)
    if mixed and runs_deepspeed_engine(training.framework):
        grads = np.where(z == 1, 2.0 + 4.0 / shard, grads)
        # stage 3's buffer in data_types.grad_accum_dtype (engine.get_data_types: the training dtype when unset)
        grads = np.where(z >= 2, np.where(z >= 3, _stored_bytes(training.grad_accum_dtype or training.dtype), w) / shard, grads)
    opt = np.where(optimizer_state_partitioned(training, z, pp), o / shard, o)
    # DeepSpeed's BF16_Optimizer (:func:`bf16_optimizer`): the bf16 gradients (2) are accumulated
    # into a full-size fp32 gradient buffer (4, ``zeros_like(bf16_groups_flat, dtype=float32)``:
    # "fp32 grad accumulation", not partitioned); the fp32 master weights and moments are
    # partitioned over the data-parallel group at stage 0 as at stage 1 (its constructor
    # narrows ``bf16_groups_flat`` into ``real_dp_world_size`` partitions whatever the stage).
    grads = np.where(bf16_optimizer(training, z, pp), 2.0 + 4.0, grads)
    if mixed and training.framework == "fsdp" and training.master_weights:
        # FSDP FULL_SHARD with MixedPrecision: the sharded flat parameter is the fp32 master
        # (4/shard; the 16-bit copy exists only unsharded, for the layers being computed), so
        # the optimizer adds its moments alone (PyTorch FSDP docs, ``MixedPrecision``).
        weights = np.where(z >= 3, 4.0 / shard, weights)
        opt = np.where(z >= 3, (o - 4.0) / shard, opt)
    # FSDP inside a pipeline stage (:func:`pipelined_fsdp`): the unsharded 16-bit weights stay
    # beside the shard (fp32, or bf16 in pure bf16), the gradients accumulate unsharded in fp32
    # (torchtitan's reduce dtype).
    piped = pipelined_fsdp(training, z, pp)
    weights = np.where(piped, w + (4.0 if training.master_weights else w) / shard, weights)
    grads = np.where(piped, 4.0, grads)
    # Optimizer offload (offloaded_state_bytes_per_param): the offloaded fraction of the master
    # weights and moments lives in host memory; DeepSpeed's ZeRO-Offload moves its fp32 gradient
    # partition there too (the bf16 gradients pass through its IPG buckets), Megatron-Core's
    # gradient buffer stays on the GPU.
    f = training.optimizer_offload_fraction
    if f > 0.0:
        opt = opt * (1.0 - f)
        if runs_deepspeed_engine(training.framework):  # stage 1: its fp32 partition; 2-3: the partitioned gradients themselves
            grads = np.where(z >= 2, grads * (1.0 - f), np.where(z >= 1, grads - f * 4.0 / shard, grads))
    if training.cpu_offload:  # FSDP's CPUOffloadPolicy, DeepSpeed's ZeRO-3 Offload: the whole sharded state on the host
        weights, grads, opt = (np.where(z >= 3, 0.0, x) for x in (weights, grads, opt))
    return weights, grads, opt


#: DeepSpeed stage 3's ``sub_group_size`` default: the parameters whose fp32 gradients it
#: materialises at once during the step (DeepSpeed configuration docs; ``stage3.py``
#: ``_prepare_fp32_grad_for_sub_group``, released after each sub-group's update).
DEEPSPEED_SUB_GROUP_SIZE = 1e9


def deepspeed_step_gradient_bytes(training: Training, zero_stage: ArrayOrFloat, params_per_shard: ArrayOrFloat) -> FloatArray:
    """Bytes of the fp32 gradient copy DeepSpeed's ZeRO-2/3 optimizer makes during the step, on one
    GPU holding ``params_per_shard`` trainable parameters of its partition (0 elsewhere).

    Stage 2 (``stage_1_and_2.py`` ``step``): per parameter group, the 16-bit partition flattened
    and cast to fp32 (``single_partition_grad_groups``), freed after the group's update — the
    whole partition for one group, 4 B a parameter.  Stage 3 (``stage3.py``
    ``_prepare_fp32_grad_for_sub_group``): the same per sub-group of at most
    :data:`DEEPSPEED_SUB_GROUP_SIZE` parameters; none under fp32 accumulation, whose buffer is
    already fp32.  The copy is allocated after the backward, whose activations then sit freed in
    the caching allocator's segments: one block of this size does not fit in them, so the
    allocator reserves a segment of its own and the device-level peak (``max_reserved``, what
    the prediction is) holds both — as stage 1's fp32 partition, allocated the same way, reads
    in the measured Megatron-DeepSpeed peaks (``bench/acceptance.py``: the one-phase sum matches
    them; taking the larger phase instead would put the fp16 ZeRO-1 rows 2–3 GB, ~4%, under
    their measured peaks).  (Only under memory pressure does PyTorch release the cached blocks and
    retry, which lets a run whose phases each fit survive: the ``tight`` verdict.)  Optimizer
    offload builds it in host memory (its ``offload_fraction`` of it at stage 3)."""
    z = np.asarray(zero_stage)
    p = np.asarray(params_per_shard, dtype=float)
    mixed = training.dtype != "fp32"
    if not (mixed and runs_deepspeed_engine(training.framework)) or training.cpu_offload:
        return np.zeros(np.broadcast(z, p).shape)
    stage3 = 0.0 if training.grad_accum_dtype == "fp32" else 4.0 * np.minimum(p, DEEPSPEED_SUB_GROUP_SIZE)
    out: FloatArray = np.where(z == 2, 4.0 * p, np.where(z >= 3, stage3, 0.0)) * (1.0 - training.optimizer_offload_fraction)
    return out


#: Bytes per parameter the host keeps for the offloaded optimizer state: the fp32 master
#: weights and Adam's two moments (12) and the fp32 gradients copied out for the update (4);
#: DeepSpeed also pins a 16-bit copy of its partition to copy the updated weights back from
#: (``param_buffer_of_bit16_for_cpu_offload_groups``, 2).  Source: DeepSpeed
#: ``runtime/zero/stage_1_and_2.py`` (``single_partition_of_fp32_groups`` on the CPU with its
#: ``.grad``); Megatron-Core ``optimizer/cpu_offloading/hybrid_optimizer.py`` (fp32 CPU copies
#: of the parameters, pinned CPU gradients, the CPU optimizer's moments).
OFFLOADED_HOST_BYTES_PER_PARAM = 16.0
DEEPSPEED_OFFLOAD_STAGING_BYTES_PER_PARAM = 2.0
#: Bytes the host's Adam update moves per offloaded parameter: DeepSpeed's CPU Adam and
#: PyTorch's fused CPU AdamW (Megatron-Core's ``CPUAdam``, ``fused=True``) read the fp32
#: master, gradient and two moments (16) and write the master and moments (12); the updated
#: weights are then narrowed to 16 bits on the host for the copy back (read 4, write 2): 34.
HOST_ADAM_BYTES_PER_PARAM = 34.0
#: The same for an 8-bit AdamW stepping the host partition as DeepSpeed's client optimizer
#: (torchao's AdamW8bit with ``zero_force_ds_cpu_optimizer: false``): the master and gradient read
#: (8) and the blockwise 8-bit moments read and written (2 × 2 × :data:`EIGHT_BIT_MOMENT_BYTES`),
#: the master written (4), the narrowing to 16 bits (6): ≈ 22.  The (de)quantisation's arithmetic
#: is not counted (host figures are not calibrated, :func:`offloaded_optimizer_s`).
HOST_ADAMW_8BIT_BYTES_PER_PARAM = 8.0 + 4.0 * EIGHT_BIT_MOMENT_BYTES + 4.0 + 6.0
#: Host bytes per offloaded parameter under that 8-bit AdamW: the fp32 master (4), its 8-bit
#: moments (2 × :data:`EIGHT_BIT_MOMENT_BYTES`) and the fp32 gradient (4).
OFFLOADED_HOST_8BIT_BYTES_PER_PARAM = 8.0 + 2.0 * EIGHT_BIT_MOMENT_BYTES


def host_update_bytes_per_param(training: Training) -> float:
    """Bytes the host's optimizer update streams per offloaded parameter: Adam's
    (:data:`HOST_ADAM_BYTES_PER_PARAM`) or the 8-bit AdamW's (:data:`HOST_ADAMW_8BIT_BYTES_PER_PARAM`)."""
    return HOST_ADAMW_8BIT_BYTES_PER_PARAM if training.eight_bit_moments else HOST_ADAM_BYTES_PER_PARAM
#: Bytes per parameter PaddleNLP's ``tensorwise_offload_optimizer`` keeps on the host and copies
#: to the GPU and back at each update: the fp32 master weight and Adam's two moments (the
#: ``adamw_`` op's tensor arguments from the learning rate on; "do not offload parameter and
#: gradient").  Source: PaddleNLP ``trainer/utils/offload_optimizer.py`` (``hack_offload_optimizer``).
TENSORWISE_OFFLOAD_BYTES_PER_PARAM = 12.0
#: Synchronous copies per parameter tensor of a tensor-wise offloaded update: its master and two
#: moments brought to the GPU before the op and sent back after it.
TENSORWISE_COPIES_PER_TENSOR = 6
#: Fraction of a host link's rate that pinned-memory copies reach (CUDA ``bandwidthTest``
#: with pinned buffers: ~25 of 32 GB/s on PCIe Gen4 x16, ~50 of 64 on Gen5).
HOST_LINK_FRACTION = 0.8


def offloaded_state_bytes_per_param(training: Training) -> float:
    """Host memory per (sharded) parameter of this GPU's rank under optimizer offload:
    ``optimizer_offload_fraction`` × (:data:`OFFLOADED_HOST_BYTES_PER_PARAM`, plus DeepSpeed's
    16-bit staging copy); under ``cpu_offload`` the whole fully sharded state — the sharded
    parameter (FSDP's fp32 master, or bf16 in pure bf16; DeepSpeed's 16-bit partition beside its
    fp32 master), its gradient and the moments."""
    if training.cpu_offload:
        w, g, o = (float(x) for x in model_state_bytes_per_param(replace(training, cpu_offload=False), 3, 1.0, 1))
        if runs_deepspeed_engine(training.framework):  # its offloaded optimizer steps from an fp32 gradient partition on the host
            g = 4.0
        return w + g + o
    if rules_for(training.framework).offload_updates_on_gpu:  # the master weights and moments alone (Paddle's)
        return training.optimizer_offload_fraction * TENSORWISE_OFFLOAD_BYTES_PER_PARAM
    extra = DEEPSPEED_OFFLOAD_STAGING_BYTES_PER_PARAM if runs_deepspeed_engine(training.framework) else 0.0
    held = OFFLOADED_HOST_8BIT_BYTES_PER_PARAM if training.eight_bit_moments else OFFLOADED_HOST_BYTES_PER_PARAM
    return training.optimizer_offload_fraction * (held + extra)


def offloaded_optimizer_s(params_per_gpu: ArrayOrFloat, training: Training, device: DeviceSpec, shard: ArrayOrFloat) -> FloatArray:
    """Seconds the host adds to the step for the offloaded fraction ``f`` of this GPU's
    optimizer shard (``P = f · params / shard`` parameters).

    * The update runs on the host CPU, streaming :data:`HOST_ADAM_BYTES_PER_PARAM` per
      parameter through DRAM at this GPU's share of its server's bandwidth
      (``DeviceSpec.host_memory_bandwidth_GBps``: every rank of the node updates at once) and the
      CPU family's streaming fraction (``FAMILY_EFFICIENCY["cpu"].memory_fraction``, as for a
      CPU device): ``t_cpu = 34·P / (B_host · f_mem)``.
    * The gradients cross the host link out (``main_grads_dtype`` bytes under Megatron-Core,
      DeepSpeed's fp32 partition: 4) and the updated 16-bit weights back (2), at
      ``host_link_GBps · HOST_LINK_FRACTION``.
    * Megatron-Core's hybrid optimizer with ``--overlap-cpu-optimizer-d2h-h2d`` (what the
      planner's launch writes; ``FrameworkRules.offload_pipelined``) moves and updates the state
      in pieces, so the slowest of the three paces it: ``max(t_cpu, t_d2h, t_h2d)`` (the link is
      full duplex).  DeepSpeed's ZeRO-Offload copies each gradient partition out during backward
      (``async_inplace_copy_grad_to_fp32_buffer_from_gpu`` on the reduction stream), then
      updates, then copies the weights back: ``t_cpu + t_h2d``.

    Source: Ren et al. 2021, "ZeRO-Offload" §4 (the schedule); DeepSpeed
    ``runtime/zero/stage_1_and_2.py`` (``step``: CPU Adam, then the 16-bit partition copied to
    the GPU); Megatron-Core ``HybridDeviceOptimizer``."""
    P = training.optimizer_offload_fraction * np.asarray(params_per_gpu, dtype=float) / np.asarray(shard, dtype=float)
    link = _host_link_bytes_per_s(device)
    cpu = P * host_update_bytes_per_param(training) / _host_bytes_per_s(device)
    grad_bytes = _stored_bytes(training.main_grads_dtype) if "main_grads_dtype" in rules_for(training.framework).optimizer_precision else 4.0
    d2h = P * grad_bytes / link
    h2d = P * 2.0 / link
    if rules_for(training.framework).offload_pipelined:
        out: FloatArray = np.maximum(np.maximum(cpu, d2h), h2d)
        return out
    serial: FloatArray = cpu + h2d
    return serial


def tensorwise_offload_s(params_per_gpu: ArrayOrFloat, device: DeviceSpec, shard: ArrayOrFloat, tensors_per_gpu: ArrayOrFloat = 0.0) -> FloatArray:
    """Seconds PaddleNLP's ``tensorwise_offload_optimizer`` adds to the GPU's update of its shard
    (``params / shard`` parameters): before each parameter's ``adamw_`` op its master weight and
    moments (:data:`TENSORWISE_OFFLOAD_BYTES_PER_PARAM`) are copied from pinned host memory to
    the GPU, after it back (``reload``, ``offload``: synchronous ``to_device`` copies, one tensor
    at a time, so nothing overlaps): ``2 · 12 · P / link`` at :func:`_host_link_bytes_per_s`, plus
    a launch for each of the :data:`TENSORWISE_COPIES_PER_TENSOR` copies of every parameter
    tensor.  The update itself runs on the GPU as without offload."""
    P = np.asarray(params_per_gpu, dtype=float) / np.asarray(shard, dtype=float)
    copies = 2.0 * TENSORWISE_OFFLOAD_BYTES_PER_PARAM * P / _host_link_bytes_per_s(device)
    out: FloatArray = copies + TENSORWISE_COPIES_PER_TENSOR * np.asarray(tensors_per_gpu, dtype=float) * device.efficiency.kernel_overhead_s
    return out


def zero_offload_accumulation_s(params_per_gpu: ArrayOrFloat, training: Training, device: DeviceSpec, shard: ArrayOrFloat,
                                backward_s: ArrayOrFloat, microbatches: ArrayOrFloat) -> FloatArray:
    """Seconds per micro-batch DeepSpeed's ZeRO-Offload (stages 1–2, ``optimizer_offload_fraction``)
    adds under gradient accumulation beyond the backward it hides in: its ZeRO optimizer keeps the
    accumulated 16-bit gradients of its partition on the host (``accumulated_grads_in_cpu``), so
    every micro-batch but the last copies them out and every one but the first copies them back to
    add the new ones (``async_accumulate_grad_in_cpu_via_gpu``): (m − 1) · 2 copies of
    ``params / shard`` 16-bit values a step over the host link, spread over the m micro-batches'
    backward passes.  Zero with one micro-batch, and elsewhere (Megatron-Core accumulates in its
    GPU buffer; stage 3's offload is not priced here).  Source: DeepSpeed
    ``runtime/zero/stage_1_and_2.py`` (``copy_grads_in_partition``: "Accumulate when there were
    prior backwards in this step ... or more will follow")."""
    m = np.maximum(np.asarray(microbatches, dtype=float), 1.0)
    P = np.asarray(params_per_gpu, dtype=float) / np.asarray(shard, dtype=float)
    per_microbatch = (m - 1.0) * 2.0 * P * param_bytes(training) / _host_link_bytes_per_s(device) / m
    out: FloatArray = np.maximum(per_microbatch - np.asarray(backward_s, dtype=float), 0.0)
    return out


#: Decoder layers whose saved activations stay in GPU memory under activation offloading: the
#: layer the backward starts with (torchtune's ``OffloadActivations`` keeps its last saved
#: tensors in the forward stash, ``max_fwd_stash_size`` 5, and hands them to the backward
#: without a round trip; DeepSpeed's engine ``keep_last_count`` 1) — and, as the backward runs,
#: the one whose tensors were just copied back.
ACTIVATION_OFFLOAD_KEPT_LAYERS = 1.0


def activation_offload_s(offloaded_bytes: ArrayOrFloat, device: DeviceSpec, forward_s: ArrayOrFloat,
                         backward_s: ArrayOrFloat) -> FloatArray:
    """Seconds per micro-batch that activation offloading (``training.activation_offloading``)
    adds beyond the compute its copies run under.

    The saved tensors of every layer (``offloaded_bytes`` a micro-batch: under full recompute the
    checkpointed layer inputs, otherwise everything the layers keep for backward) are copied to
    pinned host memory on a side stream as the forward makes them, and back as the backward asks
    for them.  The forward waits for the copy of the tensor a few saves back before it goes on
    (torchtune's ``pack_tensor``: ``s0.wait_event`` on the forward stash), and the backward waits
    for each tensor it unpacks (``s0.wait_stream(s1)``), so each pass runs at the slower of its
    compute and its copies: ``max(0, t_copy − forward) + max(0, t_copy − backward)`` with
    ``t_copy = offloaded_bytes / (host_link_GBps · HOST_LINK_FRACTION)`` each way (the link is full
    duplex; the backward's copies run under its recompute too).  Copies of other offloads sharing
    the link in the same pass (``cpu_offload``'s gathers) are priced apart, not queued behind these.
    Source: torchtune ``training/_activation_offloading.py``; DeepSpeed
    ``runtime/activation_checkpointing/offload_activations.py``."""
    t_copy = np.asarray(offloaded_bytes, dtype=float) / _host_link_bytes_per_s(device)
    out: FloatArray = np.maximum(t_copy - np.asarray(forward_s, dtype=float), 0.0) + np.maximum(t_copy - np.asarray(backward_s, dtype=float), 0.0)
    return out


def _stored_bytes(dtype: str) -> float:
    """Bytes of one optimizer-precision value (``devices.BYTES_PER_ELEMENT``; fp8: one byte, its
    per-tensor scale negligible)."""
    return float(BYTES_PER_ELEMENT[dtype])


def stores_master_remainders(training: Training) -> bool:
    """Whether Transformer Engine's FusedAdam keeps the fp32 master weights as their 16 low bits
    beside the bf16 weight that holds the high ones (``OptimizerConfig.store_param_remainders``,
    on by default with TE ≥ 2.1): under the precision-aware optimizer, an fp32 master and bf16
    weights (every mixed dtype but fp16)."""
    return training.precision_aware_optimizer and training.main_params_dtype == "fp32" and training.dtype not in ("fp16", "fp32")


def megatron_master_bytes(training: Training) -> float:
    """Bytes per parameter of Megatron-Core's master weights (0 under fp32 training, where the
    weight is its own master).  Without the precision-aware optimizer the distributed
    optimizer's fp32 copy (4).  With it Transformer Engine's FusedAdam keeps them
    (``master_weights=True, master_weight_dtype=main_params_dtype`` — Megatron hands it the
    master weights whenever the FP8 recipe is delayed scaling or none, which every plan here
    runs) and by default (``OptimizerConfig.store_param_remainders``, TE ≥ 2.1) stores only
    the 16 low bits of the fp32 master beside the bf16 weight that holds its high bits: 2;
    an fp16 master is 2 as well; under fp16 training (no bf16 weight to share bits with) 4."""
    if training.dtype == "fp32":
        return 0.0
    if stores_master_remainders(training) or (training.precision_aware_optimizer and training.main_params_dtype == "fp16"):
        return 2.0
    return 4.0


def megatron_optimizer_state_bytes(training: Training) -> tuple[float, float]:
    """(gradient, optimizer-state) bytes per parameter under Megatron-Core, before sharding:
    the gradient buffer in ``main_grads_dtype`` (fp32 by default: bf16 training accumulates and
    reduces in fp32; ``--grad-reduce-in-bf16`` / ``--main-grads-dtype bf16``: 2), and the master
    weights (:func:`megatron_master_bytes`) with Adam's moments in ``exp_avg_dtype`` and
    ``exp_avg_sq_dtype`` (fp32 by default: 12 in all under mixed precision; SGD one momentum).
    Source: Megatron-Core ``OptimizerConfig`` and ``validate_args``; Transformer Engine
    ``FusedAdam`` (``master_weight_dtype``, ``exp_avg_dtype``, ``store_param_remainders``)."""
    g = _stored_bytes(training.main_grads_dtype) if training.dtype != "fp32" else 4.0
    master = megatron_master_bytes(training)
    if training.adam:
        return g, master + _stored_bytes(training.exp_avg_dtype) + _stored_bytes(training.exp_avg_sq_dtype)
    return g, master + 4.0


def sharded_collectives_per_layer(model: TransformerSpec, framework: str) -> int:
    """Collectives of one ZeRO-3 / FSDP fetch of a decoder layer's parameters.

    FSDP (and Megatron-Core's FSDP, PaddlePaddle's sharding stage 3) flatten a wrapped unit's
    parameters into one buffer: one all-gather (and one reduce-scatter) per layer.  DeepSpeed's
    stage 3 (``deepspeed``, ``megatron-deepspeed``) fetches a module's parameters through its
    prefetch bucket (``stage3_prefetch_bucket_size``, 5·10⁷ elements by default): each weight
    matrix (QKV, projection, the FFN's) exceeds the bucket and is gathered on its own, the small
    tensors (biases, norms) share one coalesced gather — so a GPT layer issues 4 + 1.
    """
    if runs_deepspeed_engine(framework):
        return 2 + model.ffn_matrices + (1 if param_tensors_per_layer(model) > 2 + model.ffn_matrices else 0)
    return 1


def sharded_passes_per_microbatch(
    model: TransformerSpec, framework: str, S: StrategyArrays, recomputed_fraction: ArrayOrFloat | None = None
) -> ArrayOrFloat:
    """Passes over a layer's sharded parameters per micro-batch under ZeRO-3 / FSDP: an
    all-gather before forward, another before backward and a gradient reduce-scatter — 3
    (Rajbhandari et al. 2020 §5: 3Ψ) — plus, under DeepSpeed's stage 3 (``deepspeed``,
    ``megatron-deepspeed``) with full recompute, a third all-gather for each recomputed layer.
    DeepSpeed's fetch and release are hooks on every submodule
    (``runtime/zero/parameter_offload.py``: pre-forward fetch, post-forward release): the
    activation checkpoint's recomputed forward, run inside backward, fires them like any forward —
    it gathers the layer's parameters, releases them after the recomputed forward, and the
    layer's backward gathers them once more (DeepSpeed PR 8130 discusses exactly this
    release-after-recompute path).  FSDP wraps the checkpointed block inside its unit
    (torchtitan ``apply_ac`` then ``fully_shard``): the unit's pre-backward unshard precedes the
    recompute and the inner module's forward fires no FSDP hook — 3 passes whatever the recompute.
    Selective recompute re-runs only the core attention, which has no parameters.
    ``recomputed_fraction``: the fraction of the layers recomputed (default
    :func:`recompute_fraction`, worked out only for DeepSpeed); 3.0 itself for the others."""
    if not runs_deepspeed_engine(framework):
        return 3.0
    frac = recompute_fraction(model, S) if recomputed_fraction is None else np.asarray(recomputed_fraction, dtype=float)
    out: FloatArray = 3.0 + np.where(S.recompute == 2, frac, 0.0)
    return out


def sharded_passes_s(
    layer_params_per_gpu: ArrayOrFloat,
    layers: ArrayOrFloat,
    training: Training,
    S: StrategyArrays,
    links: Links,
    collectives_per_layer: int = 1,
    ranks: ArrayOrFloat | None = None,
    stride: ArrayOrFloat | None = None,
    bandwidth_messages: int = 0,
) -> tuple[FloatArray, FloatArray]:
    """(one all-gather pass, the reduce-scatter pass) of ZeRO-3 / FSDP over ``layers`` layers,
    seconds per micro-batch: the gathers in the training dtype, the gradient reduce-scatter at
    :func:`gradient_reduce_bytes` a value.  A micro-batch runs
    :func:`sharded_passes_per_microbatch` of them over each layer's parameters (an
    all-gather before forward, again before backward, a reduce-scatter of its gradients, and
    DeepSpeed's re-gather for a recomputed forward; per micro-batch under gradient accumulation
    since the weights are not kept gathered).  Each is ``collectives_per_layer``
    flat rings over the dp·cp ranks (``reduce_scatter_time_s(..., flat=True)``: n−1 latency
    steps each), at the framework's ``sharded_collective_efficiency`` of the ring bus bandwidth.  Per GPU the
    volume is ≈ the whole model state whatever the dp size, and the latency grows with it — so
    this term does not fall as dp grows.  Under a partial sharding (HSDP, ``Strategy.dp_shard``)
    the rings span the shard group alone — dp_shard·cp ranks, inside a node when it fits there
    (:func:`cost_model.topology.shard_axes`).  ``ranks``/``stride``: another sharding group (an
    MoE's expert weights shard over their EDP replicas, ep·etp global ranks apart).

    ``bandwidth_messages``: how many of the collectives carry the layer's bytes (0: all, evenly).
    DeepSpeed gathers every tensor on its own, but the bytes are in the weight matrices (QKV,
    projection, the FFN's) — biases and norms are a few kB each and cost only their latency —
    so the message size that sets the bus bandwidth (``comm.size_factor``) is the layer's bytes
    over its matrices, not over all its tensors.
    """
    from cost_model.transformer.calibration import sharded_collective_efficiency

    gb = param_bytes(training)
    n = zero_shard_ranks(S) if ranks is None else np.asarray(ranks, dtype=float)
    gpn = links.gpus_per_node
    if ranks is None:
        axes = shard_axes(S)[0]
    else:
        axes = [(n, S.tp if stride is None else np.asarray(stride, dtype=float))] if S.nest is None else split_axes(_expert_axes(S)[1], n)[0]
    per_node = members_in(gpn, axes)
    k = float(collectives_per_layer)
    kb = float(bandwidth_messages) if 0 < bandwidth_messages <= collectives_per_layer else k
    alpha = (np.maximum(n, 1.0) - 1.0) * links.alpha_s

    def one_pass(bytes_per_value: float) -> FloatArray:  # one collective pass over a layer's parameters
        chunk = layer_params_per_gpu * bytes_per_value / kb
        one = reduce_scatter_time_s(n, chunk, links, per_node, flat=True) + hierarchical_collective_extra_s(links, axes, chunk, 1.0)
        bandwidth_part = np.maximum(one - alpha, 0.0) / sharded_collective_efficiency(training.framework)
        t: FloatArray = kb * bandwidth_part + k * alpha
        return t

    gather = one_pass(gb)
    rb = gradient_reduce_bytes(training)
    reduce = gather if rb == gb else one_pass(rb)
    on = layers * (n > 1)
    return on * gather, on * reduce


def deepspeed_gather_copy_out_s(
    layer_params_per_gpu: ArrayOrFloat,
    layers: ArrayOrFloat,
    training: Training,
    S: StrategyArrays,
    device: DeviceSpec,
    collectives_per_layer: int,
    gathers_per_layer: ArrayOrFloat,
) -> FloatArray:
    """Seconds per micro-batch that DeepSpeed's stage-3 gathers spend copying their output out
    of NCCL's buffer (0 for the other frameworks).

    DeepSpeed's stage 3 gathers a parameter into a list of views, one per rank of the dp·cp
    group, of the gathered buffer (``partition_parameters._allgather_param``:
    ``torch.distributed.all_gather(partitions, partitions[rank])`` with
    ``partitions[i] = flat_tensor.narrow(0, partition_size * i, partition_size)``), the
    tensor-list all-gather.  PyTorch's NCCL backend runs that as one ``ncclAllGather`` into a
    flattened copy of the list (``flatten_for_scatter_gather``) and then, on the NCCL stream,
    copies each of the n chunks into its list entry (``outputTensors[i][j].copy_``) before the
    work completes: per gathered tensor, n copy kernels — each small, so bounded by the launch
    cost ``kernel_overhead_s`` — moving the gathered bytes once more through HBM (read and
    write).  ``t = G · L · (k · n · t_launch + 2 · W / (B · f_mem))`` with G gathers of each of
    L layers (:func:`sharded_passes_per_microbatch` − 1: forward, backward, recompute), k
    collectives per layer (:func:`sharded_collectives_per_layer`) and W the layer's gathered
    bytes.  The copies run on the NCCL stream, so they hide behind compute as the collective
    does.  ``all_gather_into_tensor`` (FSDP, Megatron-Core's FSDP) writes in place: no copy.
    """
    if not runs_deepspeed_engine(training.framework):
        return np.zeros(len(S))
    gb = param_bytes(training)
    n = zero_shard_ranks(S)
    per_gather = memory_bound_time_s(2.0 * np.asarray(layer_params_per_gpu, dtype=float) * gb, device,
                                     kernels=float(collectives_per_layer) * n)
    out: FloatArray = np.asarray(gathers_per_layer, dtype=float) * layers * per_gather * (n > 1)
    return out


def sharded_microbatch_exposed_s(
    comm_s: ArrayOrFloat, zero_stage: ArrayOrFloat, forward_s: ArrayOrFloat, backward_s: ArrayOrFloat, overlap: ArrayOrFloat,
    passes: ArrayOrFloat = 3.0, backward_only_s: ArrayOrFloat = 0.0, forward_s_comm: ArrayOrFloat | None = None,
) -> FloatArray:
    """Seconds a micro-batch's ZeRO-2/3 (FSDP) traffic adds to its compute.

    The traffic runs in two phases, each hidden behind that phase's own compute: the forward's
    all-gathers (``forward_s_comm``, as the caller counts them — ZeRO-3's, and FSDP
    SHARD_GRAD_OP's, :func:`fsdp_regathers_each_microbatch`; by default, ZeRO-3's: one of the
    ``passes`` equal collectives per layer) are prefetched a layer ahead under the forward, the
    rest — the recompute's and the backward's all-gathers and the gradient reduce-scatters (all
    of ZeRO-2's per-micro-batch reduce-scatter, and ``backward_only_s``: HSDP's all-reduce of the
    gradient shards across replicas, :func:`replica_sync_s`) — under the backward (with recompute).  Within a phase a layer waits for the
    slower of its compute and its prefetched collectives, so the phase takes ≈ max(compute,
    collectives): ``exposed = Σ_phase max(0, comm_phase − overlap·compute_phase)``
    (Rajbhandari et al. 2021 ZeRO-Infinity §6 "overlap-centric design"; PyTorch FSDP, Zhao et
    al. 2023 §3.3 prefetching).  A step that is communication-bound therefore stays flat as the
    per-GPU batch shrinks — Narayanan et al. 2021 Table 2: ZeRO-3 175B at 768 and 1,536 A100s,
    one global batch, both 66.7 s.

    The hidden part is not free: while a collective runs beside a kernel, NCCL's channels occupy
    SMs and both stream through HBM, so the compute it overlaps slows by
    ``overlap_compute_slowdown`` (a global constant of ``cost_model.transformer.calibration``)
    of the overlapped time (compute–communication interference: Lee et al. 2025,
    "Characterizing compute-communication overlap in GPU-accelerated distributed deep
    learning"; an FSDP-style all-gather's 24 NCCL blocks push an H100 GEMM sized for 132 SMs
    into a second wave, its MFU 80% → 47% — NVIDIA developer forum, "Compute-communication
    overlap causes severe GEMM performance degradation because of tail effect").
    """
    from cost_model.transformer.calibration import overlap_compute_slowdown

    comm = np.asarray(comm_s, dtype=float)
    if forward_s_comm is None:
        comm_f = comm * np.where(np.asarray(zero_stage) >= 3, 1.0 / np.asarray(passes, dtype=float), 0.0)
    else:
        comm_f = np.asarray(forward_s_comm, dtype=float)
    comm_b = comm - comm_f + np.asarray(backward_only_s, dtype=float)
    o = np.asarray(overlap, dtype=float)
    hidden_f = np.minimum(comm_f, o * np.asarray(forward_s, dtype=float))
    hidden_b = np.minimum(comm_b, o * np.asarray(backward_s, dtype=float))
    out: FloatArray = (comm_f - hidden_f) + (comm_b - hidden_b) + overlap_compute_slowdown() * (hidden_f + hidden_b)
    return out


def replica_sync_per_microbatch(framework: str) -> bool:
    """Whether a partially sharded (HSDP) framework all-reduces the gradient shards across its
    replicas with every micro-batch's reduce-scatter (FSDP: the post-backward hook of each
    backward reduces over the shard group and then all-reduces over the replicate group —
    FSDP2 ``fully_shard`` on a 2-D mesh, torchtitan without deferring it) or once per step at
    the gradient-accumulation boundary (Megatron-Core's partial distributed optimizer; Paddle's
    dp group over sharding; the "2-hop" synchronisation of Zhang et al. 2022, MiCS, §3.3)
    (``FrameworkRules.reduces_every_backward``)."""
    return rules_for(framework).reduces_every_backward


def replica_sync_s(
    params_per_gpu: ArrayOrFloat, training: Training, S: StrategyArrays, links: Links, expert_params_per_gpu: ArrayOrFloat = 0.0
) -> FloatArray:
    """Seconds of one all-reduce of this GPU's gradient shards across the replicas of a partial
    (HSDP) sharding: 2·(R−1)/R·(P/n_s)·b/β over the R = dp/dp_shard replicas, each carrying the
    1/n_s shard that the reduce-scatter inside its shard group of n_s ranks left (dense weights
    over dp_shard·cp, experts over EDP/R); the replicas are the outer members of the dp·cp
    group (:func:`cost_model.topology.shard_axes`), so this ring is the one that crosses nodes.
    0 under full sharding (R = 1).  Zhao et al. 2023 (PyTorch FSDP) §3.2.2 hybrid sharding;
    Zhang et al. 2022 (MiCS) §3.3."""
    if S.dp_shard is None:
        return np.zeros(len(S))
    gb = gradient_reduce_bytes(training)
    R = zero_replicas(S)
    gpn = links.gpus_per_node
    shard_n = zero_shard_ranks(S)
    rep = shard_axes(S)[1]
    dense = np.asarray(params_per_gpu, dtype=float) * gb / shard_n
    edp = expert_data_parallel(S.tp, S.cp, S.dp, S.ep, S.etp_pin)
    experts = np.asarray(expert_params_per_gpu, dtype=float) * gb / np.maximum(edp / R, 1.0)
    size = dense + experts
    out: FloatArray = np.where(R > 1, allreduce_time_s(R, size, links, members_in(gpn, rep))
                               + hierarchical_collective_extra_s(links, rep, size, 2.0), 0.0)
    return out


def dp_gradient_comm_s(
    params_per_gpu: ArrayOrFloat, training: Training, S: StrategyArrays, links: Links, expert_params_per_gpu: ArrayOrFloat = 0.0,
    weight_fraction: ArrayOrFloat = 1.0, expert_weight_fraction: float = 1.0,
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """Data-parallel synchronisation: (per-step seconds, per-micro-batch seconds, the HSDP
    replicas' all-reduce within each micro-batch — part of the second, 0 unless FSDP HSDP —, and
    the part of the second that runs in the forward: FSDP SHARD_GRAD_OP's all-gather,
    :func:`fsdp_regathers_each_microbatch`; ZeRO-3's forward gathers are the caller's).

    One reduce-scatter (or all-gather) of the model-state shard R = (n−1)/n·S/β, an all-reduce
    2R (ring; DP groups span dp·cp ranks with TP ranks in between; expert weights sync over
    their EDP = dp·cp·tp/(ep·etp) ranks).  By ZeRO stage (Rajbhandari et al. 2020):

    * 0 — gradients accumulate locally over the micro-batches and are all-reduced once: 2R per
      step — except FSDP without a pipeline (:func:`fsdp_reduces_each_microbatch`), which
      all-reduces every micro-batch's: 2R per micro-batch;
    * 1 — Megatron's distributed optimizer: reduce-scatter of gradients + all-gather of the
      updated weights, once per step: 2R per step;
    * 1 under Muon (``training.optimizer`` ``muon``: Megatron-Core's layer-wise distributed
      optimizer, each rank stepping whole matrices, :mod:`cost_model.transformer.muon`) — the
      gradients all-reduced, then the weights each rank updated all-gathered: 3R per step;
    * 0 or 1 under DeepSpeed's BF16_Optimizer (:func:`bf16_optimizer`) — its pipeline engine
      all-reduces the whole gradient buffer (``_bf16_reduce_grads`` → ``buffered_allreduce_fallback``,
      cast to the engine's bf16 ``communication_data_type``), then the optimizer all-gathers the
      bf16 weights of its partitioned step (``all_gather_dp_groups``): 3R per step;
    * 2 — gradients are kept only as shards, so every micro-batch's gradients are
      reduce-scattered (R per micro-batch) and the weights all-gathered once per step (R) —
      FSDP without a pipeline all-gathers them with every micro-batch's forward
      (:func:`fsdp_regathers_each_microbatch`: 2R per micro-batch);
    * 3 — weights are sharded too: every micro-batch all-gathers them for forward and again for
      backward and reduce-scatters its gradients (3R per micro-batch) — except FSDP inside a
      pipeline stage (:func:`pipelined_fsdp`), which gathers once and reduce-scatters once a step
      (2R per step, as 1).

    The once-per-step passes are :func:`step_sync_ring_passes`'s, shared with the operator-graph path.

    Under a partial sharding (HSDP, ``Strategy.dp_shard``) R is over the shard group
    (dp_shard·cp ranks) and the replicas all-reduce their gradient shards on top
    (:func:`replica_sync_s`), per micro-batch or per step (:func:`replica_sync_per_microbatch`).

    Gradients are reduced at :func:`gradient_reduce_bytes` a value (Megatron-Core's fp32
    main-gradient buffer under bf16), the updated weights all-gathered in the training dtype —
    times ``weight_fraction`` (``expert_weight_fraction`` for the experts') where the weights are
    held narrower (FP8 weights, ``training.fp8_param_gather``).
    """
    gb = param_bytes(training)
    rb = gradient_reduce_bytes(training)
    n = zero_shard_ranks(S)
    axes = shard_axes(S)[0]
    gpn = links.gpus_per_node
    per_node = members_in(gpn, axes)
    # Expert weights sync over their EDP replicas, ep·etp global ranks apart (parallel folding);
    # under HSDP over their share of the shard group.
    n_e = np.maximum(expert_data_parallel(S.tp, S.cp, S.dp, S.ep, S.etp_pin) / zero_replicas(S), 1.0)
    edp_axes = split_axes(_expert_axes(S)[1], n_e)[0]
    per_node_e = members_in(gpn, edp_axes)

    def ring(b: ArrayOrFloat, b_e: ArrayOrFloat) -> FloatArray:  # one reduce-scatter (or all-gather) of the state at b (experts: b_e) bytes a value
        out: FloatArray = reduce_scatter_time_s(n, params_per_gpu * b, links, per_node) + reduce_scatter_time_s(
            n_e, expert_params_per_gpu * b_e, links, per_node_e)
        # Levels above the node (zero without a topology): cost_model.topology.
        return out + hierarchical_collective_extra_s(links, axes, params_per_gpu * b, 1.0) + hierarchical_collective_extra_s(
            links, edp_axes, expert_params_per_gpu * b_e, 1.0)

    rs_g = ring(rb, rb)  # gradients (reduce-scatter; an all-reduce is two)
    narrower = np.any(np.asarray(weight_fraction) != 1.0) or expert_weight_fraction != 1.0
    rs_w = ring(gb * np.asarray(weight_fraction), gb * expert_weight_fraction) if narrower or rb != gb else rs_g  # weights (all-gather)
    sync = replica_sync_s(params_per_gpu, training, S, links, expert_params_per_gpu)
    none = np.zeros_like(sync)
    step_sync, mb_sync = (none, sync) if replica_sync_per_microbatch(training.framework) else (sync, none)
    grad_passes, weight_passes = step_sync_ring_passes(training, S.zero, S.pp)
    # HSDP's replica all-reduce: with ZeRO 1's per-step reduction, and at ZeRO 2-3 once per step
    # unless the framework runs it with every micro-batch (none at stage 0, nothing is sharded;
    # none under DeepSpeed, which has no partial sharding: frameworks.partial_sharding_violation)
    replicas = np.where(S.zero >= 2, step_sync, np.where(S.zero == 1, sync, 0.0))
    # FSDP inside a pipeline stage reduces once a step (pipelined_fsdp), the replicas' all-reduce with it
    piped = pipelined_fsdp(training, S.zero, S.pp)
    replicas = np.where(piped, sync, replicas)
    mb_sync = np.where(piped, 0.0, mb_sync)
    per_step = grad_passes * rs_g + weight_passes * rs_w + replicas
    per_microbatch = np.where(S.zero >= 3, 2.0 * rs_w + rs_g + mb_sync, np.where(S.zero == 2, rs_g + mb_sync, 0.0))
    per_microbatch = np.where(fsdp_reduces_each_microbatch(training, S.zero, S.pp), 2.0 * rs_g, per_microbatch)
    per_microbatch = np.where(piped, 0.0, per_microbatch)
    regather = fsdp_regathers_each_microbatch(training, S.zero, S.pp)
    forward_mb = np.where(regather, rs_w, 0.0)
    return per_step, per_microbatch + forward_mb, mb_sync, forward_mb


def step_sync_ring_passes(training: Training, zero_stage: ArrayOrFloat, pp: ArrayOrFloat) -> tuple[FloatArray, FloatArray]:
    """(gradient, weight) ring passes of the once-per-step data-parallel sync, in reduce-scatter
    (or all-gather) passes R of :func:`dp_gradient_comm_s` (an all-reduce is two):

    * ZeRO 0 — the gradients all-reduced: (2, 0); FSDP without a pipeline all-reduces them with
      every micro-batch instead (:func:`fsdp_reduces_each_microbatch`): (0, 0);
    * 1 — the gradients reduce-scattered, the updated weights all-gathered: (1, 1); Muon's
      layer-wise distributed optimizer all-reduces the gradients instead: (2, 1);
    * DeepSpeed's BF16_Optimizer at 0 (with a pipeline) or 1 (:func:`bf16_optimizer`) — the gradient buffer
      all-reduced, then the weights its partitioned step updated all-gathered: (2, 1);
    * 2 — the weights all-gathered (the gradients go with every micro-batch): (0, 1); FSDP
      without a pipeline gathers them with every micro-batch instead
      (:func:`fsdp_regathers_each_microbatch`): (0, 0);
    * 3 — nothing once per step: (0, 0); FSDP inside a pipeline stage (:func:`pipelined_fsdp`)
      reduce-scatters its accumulated gradients and gathers its weights once a step: (1, 1).

    One rule for the transformer path (:func:`dp_gradient_comm_s`) and the operator-graph path
    (``cost_model.graph.tables.for_mesh``)."""
    z = np.asarray(zero_stage)
    # all-reduce, then gather: DeepSpeed's BF16_Optimizer, Muon's layer-wise distributed optimizer
    reduce_then_gather = bf16_optimizer(training, z, pp) | ((z == 1) & training.muon)
    piped = pipelined_fsdp(training, z, pp)
    regather = fsdp_regathers_each_microbatch(training, z, pp)
    each_mb = fsdp_reduces_each_microbatch(training, z, pp)
    grads: FloatArray = np.where(reduce_then_gather, 2.0,
                                 np.where(piped, 1.0, np.where((z >= 2) | each_mb, 0.0, np.where(z == 1, 1.0, 2.0))))
    weights: FloatArray = np.where((reduce_then_gather | (z == 1) | (z == 2) | piped) & ~regather, 1.0, 0.0)
    return grads, weights


def frozen_weight_bytes_per_param(training: Training, zero_stage: ArrayOrFloat, shard: ArrayOrFloat, decoder: bool = False) -> FloatArray:
    """GPU bytes per frozen parameter (LoRA's base weights, :mod:`cost_model.transformer.lora`):
    the weight in the training dtype (:func:`param_bytes`; a ``decoder`` weight under QLoRA in
    4-bit NF4, :func:`cost_model.transformer.lora.base_bytes_per_param` — the embedding and the
    head stay in the training dtype) and nothing else — no gradient, no master copy, no optimizer
    state — sharded over ``shard`` ranks under ZeRO-3 / FSDP's full sharding (which shards every
    parameter), whole below it (ZeRO-1/2 partition what the optimizer steps: the adapters)."""
    held = base_bytes_per_param(training, param_bytes(training)) if decoder else param_bytes(training)
    out: FloatArray = held / np.where(np.asarray(zero_stage) >= 3, shard, 1.0)
    return out


def param_bytes(training: Training) -> float:
    """Bytes of a 16-bit (or fp32 under fp32 training) weight as the collectives move it."""
    return 4.0 if training.dtype == "fp32" else 2.0


def gradient_reduce_bytes(training: Training) -> float:
    """Bytes per gradient value that data-parallel reductions move.  Megatron-Core under bf16
    (and the FP8/FP4 recipes, whose gradients are bf16) accumulates into an fp32 main-gradient
    buffer and reduces that buffer in fp32: Megatron-LM's ``arguments.py`` sets
    ``accumulate_allreduce_grads_in_fp32`` for bf16 ("bfloat16 requires gradient accumulation
    and all-reduce to be performed in fp32") unless ``--grad-reduce-in-bf16`` — 4.  fp16 runs
    reduce fp16 (2), fp32 runs fp32 (4).  The other frameworks are costed at the 16-bit
    training dtype (2: DeepSpeed's and Paddle's default communication dtype).  FSDP as
    torchtitan 0.3 runs it reduces in fp32 too (``mixed_precision_reduce`` admits only
    ``"float32"``), but costed so the published Llama 3 rows (whose paper also reduce-scatters in
    fp32) come out ~27% slow even refitted: what else their FSDP does to that traffic is not
    modelled, so FSDP stays at 2 until it is."""
    if training.dtype in ("fp32", "fp16"):
        return param_bytes(training)
    if training.framework == "megatron-core":  # its gradient buffer's dtype (main_grads_dtype)
        return _stored_bytes(training.main_grads_dtype)
    return 2.0


#: Operators per parameter tensor of PyTorch's single-tensor (for-loop) ``torch.optim.Adam``:
#: step count, ``lerp_``, ``mul_``, ``addcmul_``, bias corrections, ``sqrt``, ``div_``,
#: ``add_``, ``addcdiv_`` — and its bytes per parameter: lerp (r 8, w 4), mul (r 4, w 4),
#: addcmul (r 8, w 4), sqrt to a fresh tensor (r 4, w 4), div_ (r 4, w 4), add_ (r 4, w 4),
#: addcdiv (r 12, w 4): 72 B/param in fp32.
EAGER_ADAM_OPS_PER_TENSOR = 11
EAGER_ADAM_BYTES_PER_PARAM = 72.0


def optimizer_bytes_per_param(training: Training) -> float:
    """Bytes the optimizer step moves per parameter.

    Fused Adam (mixed precision) reads fp32 master, momentum, variance and gradient (16 B) and
    writes master, momentum, variance and the 16-bit weight (14 B), plus a gradient-norm read
    (4 B): 34 B/param.  SGD: 22 B/param.  fp32 training: the master copy is the weight.
    Unfused (``training.fused_kernels`` false): PyTorch's for-loop Adam,
    :data:`EAGER_ADAM_BYTES_PER_PARAM` (+ 6 B for the 16-bit copy under mixed precision).
    Pure bf16 (``training.master_weights`` false): every tensor at 2 B — Adam reads the weight,
    gradient and two moments and writes the weight and moments, plus the gradient-norm read
    (16 B); SGD 12 B; the for-loop Adam's passes at half their fp32 bytes.
    """
    if training.eight_bit_moments:
        # read and write the master (the weight itself in fp32 or pure bf16 training) and the two
        # 8-bit moments with their block scales, read the gradient twice (step and norm), write
        # the 16-bit weight under mixed precision: 2·4 + 2·2.03 + 2·4 + 2 = 22 (pure bf16: 12)
        weight = 2.0 if not training.master_weights else 4.0
        grad = 2.0 if not training.master_weights else 4.0
        narrow = 2.0 if training.master_weights and training.dtype != "fp32" else 0.0
        return 2.0 * weight + 2.0 * adam_moment_bytes(training) + 2.0 * grad + narrow
    if not training.master_weights:
        if training.adam and not training.fused_kernels:
            return EAGER_ADAM_BYTES_PER_PARAM / 2.0
        return 16.0 if training.adam else 12.0
    if training.adam:
        if not training.fused_kernels:
            return EAGER_ADAM_BYTES_PER_PARAM + (6.0 if training.dtype != "fp32" else 0.0)
        if "precision_aware_optimizer" in rules_for(training.framework).optimizer_precision and training.dtype != "fp32":
            # Megatron-Core's optimizer (model_state_bytes_per_param's rule): read and write the
            # master (its bytes, :func:`megatron_master_bytes`; a 16-bit remainder also reads the
            # bf16 weight that holds its high bits) and the two
            # moments, read the gradient twice (step and norm), write the 16-bit weight:
            # 2·(4 + 4 + 4) + 2·4 + 2 = 34 at the defaults
            remainder = 2.0 if stores_master_remainders(training) else 0.0
            moments = _stored_bytes(training.exp_avg_dtype) + _stored_bytes(training.exp_avg_sq_dtype)
            return 2.0 * (megatron_master_bytes(training) + moments) + 2.0 * _stored_bytes(training.main_grads_dtype) + 2.0 + remainder
        return 34.0 if training.dtype != "fp32" else 32.0
    return 22.0 if training.dtype != "fp32" else 16.0


#: Bytes FSDP's CPU step moves per parameter of its shard: PyTorch's fused CPU AdamW
#: (torchtitan's default ``implementation = "fused"``) reads the fp32 parameter, gradient and
#: moments (16) and writes the parameter and moments (12), after the gradient-norm clipping has
#: read the gradients (4): 32.  Unfused, the for-loop Adam's :data:`EAGER_ADAM_BYTES_PER_PARAM`.
CPU_OFFLOAD_ADAM_BYTES_PER_PARAM = 32.0
#: Bytes per parameter the fp16 loss scaler's unscale adds to FSDP's CPU step: FSDP's
#: ``ShardedGradScaler._foreach_non_finite_check_and_unscale_cpu_`` (torch.distributed.fsdp.
#: sharded_grad_scaler) loops over the host's fp32 gradient shards, and for each runs
#: ``torch.isinf(grad).any()`` and ``torch.isnan(grad).any()`` (a 4-byte read, a 1-byte mask
#: written and read: 6 each) and then ``grad.mul_(inv_scale)`` (read 4, write 4): 20.
FP16_HOST_UNSCALE_BYTES_PER_PARAM = 20.0


def _host_bytes_per_s(device: DeviceSpec) -> float:
    """This GPU's share of its host's DRAM bandwidth as a streaming update reaches it
    (``FAMILY_EFFICIENCY["cpu"].memory_fraction``), bytes/s."""
    return float(gbps_to_bytes_per_s(device.host_memory_bandwidth_GBps) * FAMILY_EFFICIENCY["cpu"].memory_fraction)


def _host_link_bytes_per_s(device: DeviceSpec) -> float:
    """The host link's rate as pinned copies reach it (:data:`HOST_LINK_FRACTION`), bytes/s."""
    return float(gbps_to_bytes_per_s(device.host_link_GBps) * HOST_LINK_FRACTION)


def cpu_offload_step_s(params_per_gpu: ArrayOrFloat, training: Training, device: DeviceSpec, shard: ArrayOrFloat) -> FloatArray:
    """The CPU-offloaded optimizer step (``training.cpu_offload``): the host updates this GPU's
    shard (``params / shard`` parameters) in host memory at :func:`_host_bytes_per_s` —
    FSDP's fused CPU AdamW :data:`CPU_OFFLOAD_ADAM_BYTES_PER_PARAM` each (pure bf16: half;
    unfused: the for-loop Adam's), DeepSpeed's CPU Adam :data:`HOST_ADAM_BYTES_PER_PARAM` (it
    writes the 16-bit partition too); nothing crosses the link at the step (the next all-gathers
    copy the updated shard); under fp16 FSDP's loss scaler first unscales the host's gradients
    (:data:`FP16_HOST_UNSCALE_BYTES_PER_PARAM`).  Source: PyTorch ``CPUOffloadPolicy`` ("the optimizer step runs on CPU with CPU
    optimizer states"); DeepSpeed ``runtime/zero/stage3.py`` with ``offload_param``."""
    if runs_deepspeed_engine(training.framework):  # DeepSpeed's CPU Adam (or a client 8-bit AdamW), narrowing into its 16-bit partition
        per_param = host_update_bytes_per_param(training)
    else:
        per_param = CPU_OFFLOAD_ADAM_BYTES_PER_PARAM if training.fused_kernels else EAGER_ADAM_BYTES_PER_PARAM
        if not training.master_weights:
            per_param /= 2.0
        if training.dtype == "fp16":
            per_param += FP16_HOST_UNSCALE_BYTES_PER_PARAM
    out: FloatArray = np.asarray(params_per_gpu, dtype=float) / np.asarray(shard, dtype=float) * per_param / _host_bytes_per_s(device)
    return out


def cpu_offload_microbatch_s(params_per_gpu: ArrayOrFloat, training: Training, device: DeviceSpec, shard: ArrayOrFloat,
                             compute_s: ArrayOrFloat, microbatches: ArrayOrFloat, frozen_shard_bytes: ArrayOrFloat = 0.0) -> FloatArray:
    """Seconds per micro-batch the CPU offload of the sharded state adds beyond its compute
    (``training.cpu_offload``).

    Every all-gather first copies the unit's shard host-to-device (FSDP2's ``all_gather_inputs``:
    ``sharded_local_tensor.to(device, non_blocking=True)``, the fp32 master, 2 bytes in pure bf16;
    DeepSpeed's fetch copies its 16-bit ``ds_tensor`` into the gather's buffer) — twice a
    micro-batch (before forward, before backward) — and every reduce-scatter's output goes
    device-to-host at :func:`gradient_reduce_bytes`.  The first micro-batch's copies are
    asynchronous into pinned memory and hide behind its compute; from the second on the
    framework adds each reduced gradient to the host's accumulated one (FSDP2's ``foreach_reduce``:
    ``sharded_param.grad._local_tensor += new_sharded_grad``; DeepSpeed accumulates its offloaded
    fp32 gradient partition likewise), so that copy is synchronous and the host's add (read two,
    write one) runs in the backward.  Per micro-batch over a step of ``m``:
    ``max(0, h2d + d2h − compute)`` once, ``max(0, h2d − compute) + d2h + add`` the other m − 1
    times, averaged.  Link at :func:`_host_link_bytes_per_s`, host at :func:`_host_bytes_per_s`.
    Under LoRA ``params_per_gpu`` are the adapters (what is reduced, accumulated and stepped) and
    ``frozen_shard_bytes`` the frozen base's shard as held (4-bit under QLoRA), copied to the GPU
    before each of the two gathers like the adapters' (FSDP's flat parameters hold both; DeepSpeed
    partitions and offloads the frozen parameters as any other)."""
    P = np.asarray(params_per_gpu, dtype=float) / np.asarray(shard, dtype=float)
    # the sharded parameter on the host: FSDP's is the fp32 master (bf16 in pure bf16), DeepSpeed's
    # its 16-bit partition (``ds_tensor``, copied into the gather's flat buffer)
    master = param_bytes(training) if runs_deepspeed_engine(training.framework) else 4.0 if training.master_weights else 2.0
    g = gradient_reduce_bytes(training)
    link = _host_link_bytes_per_s(device)
    h2d = 2.0 * (P * master + np.asarray(frozen_shard_bytes, dtype=float)) / link
    d2h = P * g / link
    add = P * 3.0 * g / _host_bytes_per_s(device)
    compute = np.asarray(compute_s, dtype=float)
    m = np.maximum(np.asarray(microbatches, dtype=float), 1.0)
    first = np.maximum(h2d + d2h - compute, 0.0)
    rest = np.maximum(h2d - compute, 0.0) + d2h + add
    out: FloatArray = (first + (m - 1.0) * rest) / m
    return out


def optimizer_kernels(training: Training, tensors_per_gpu: ArrayOrFloat = 0.0) -> int | FloatArray:
    """Kernels of one optimizer step: a fused multi-tensor step launches a handful (4); PyTorch's
    for-loop Adam launches :data:`EAGER_ADAM_OPS_PER_TENSOR` per parameter tensor; the 8-bit
    AdamW one fused kernel per parameter tensor (bitsandbytes' ``Optimizer8bit.step`` updates
    its parameters one at a time)."""
    if training.eight_bit_moments:
        return np.asarray(tensors_per_gpu, dtype=float)
    if training.fused_kernels or not training.adam:
        return 4
    return EAGER_ADAM_OPS_PER_TENSOR * np.asarray(tensors_per_gpu, dtype=float)


def optimizer_step_s(
    params_per_gpu: ArrayOrFloat,
    training: Training,
    device: DeviceSpec,
    S: StrategyArrays,
    tensors_per_gpu: ArrayOrFloat = 0.0,
    shard: ArrayOrFloat | None = None,
) -> FloatArray:
    """Optimizer update: a memory-bound pass over this GPU's shard of the model state
    (:func:`optimizer_bytes_per_param`, :func:`optimizer_kernels`; ``tensors_per_gpu``: the
    parameter tensors a for-loop optimizer iterates over; ``shard``: the ranks the state is
    sharded over, dp_shard·cp (dp·cp under full sharding) where
    :func:`optimizer_state_partitioned` by default — EDP for expert weights).  Under optimizer
    offload the GPU updates the fraction it keeps and the host the rest
    (:func:`offloaded_optimizer_s`); under ``cpu_offload`` the host updates it all
    (:func:`cpu_offload_step_s`)."""
    if shard is None:
        shard = np.where(optimizer_state_partitioned(training, S.zero, S.pp), zero_shard_ranks(S), 1.0)
    per_param = optimizer_bytes_per_param(training)
    if training.cpu_offload:  # the sharded state on the host: the step runs there alone (cpu_offload_step_s)
        return cpu_offload_step_s(params_per_gpu, training, device, shard)
    f = training.optimizer_offload_fraction
    if f > 0.0 and rules_for(training.framework).offload_updates_on_gpu:  # the state round-trips for a GPU update (Paddle's)
        on_gpu = memory_bound_time_s(params_per_gpu * per_param / shard, device, kernels=optimizer_kernels(training, tensors_per_gpu))
        return on_gpu + tensorwise_offload_s(params_per_gpu, device, shard, tensors_per_gpu)
    on_gpu = memory_bound_time_s(params_per_gpu * (1.0 - f) * per_param / shard, device, kernels=optimizer_kernels(training, tensors_per_gpu))
    if f > 0.0:  # the host's share (offloaded_optimizer_s), after the GPU's
        return on_gpu + offloaded_optimizer_s(params_per_gpu, training, device, shard)
    return on_gpu


def param_tensors_per_layer(model: TransformerSpec) -> int:
    """Parameter tensors of one decoder layer (what a for-loop optimizer iterates over): the
    QKV and output projections, the FFN matrices (per expert, plus the router), two norms;
    biases double the projections' and norms' count."""
    mats = 2 + model.ffn_matrices * (model.num_experts if model.is_moe else 1) + (1 if model.is_moe else 0)
    norms = 2
    return (mats + norms) * (2 if model.bias else 1)


def embedding_head_costs(
    model: TransformerSpec, training: Training, device: DeviceSpec, links: Links, S: StrategyArrays
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray, FloatArray]:
    """Forward+backward time of the vocab-parallel embedding (first stage) and the LM head with
    cross-entropy (last stage) per micro-batch, and their activation bytes.

    Head GEMM [T,h]x[h,V/t] forward, ×2 backward; the loss reads fp32 logits (softmax,
    gradient: ≈ 4 passes of 4 B over T·V/t).  ``training.loss_kernel``: torchtune's
    ``CEWithChunkedOutputLoss`` (``chunked``: the same passes chunk by chunk, its recipes ``del
    logits`` before the backward) holds the fp32 log-probabilities alone, as does its
    ``LinearCrossEntropyLoss`` (the head's GEMM inside the loss, chunk by chunk: each chunk's
    16-bit logits freed once upcast, its log-softmax output kept); Liger Kernel's fused
    linear cross-entropy (``liger``: the same GEMMs and passes, chunk by chunk, all in the
    forward — Hsu et al. 2024, "Liger Kernel", §3.3) holds no logits; Cut Cross-Entropy
    (``cce``: Wijmans et al. 2024, "Cut Your Losses in Large-Vocabulary Language Models") keeps
    the logits in on-chip memory, so no loss pass reaches HBM, and computes them again in the
    backward (one more head GEMM).  Transformer Engine's ``parallel_cross_entropy`` (``te``:
    Megatron-Core's ``--cross-entropy-fusion-impl te``) reads the 16-bit logits once in the
    forward (an online softmax: a max, a sum and the target's logit a token — Milakov &
    Gimelshein 2018; under TP those three all-gathered), then reads them again and writes the
    gradient over them in place, and its backward scales that gradient by the per-token loss
    weights (a read and a write): neither the fp32 copy nor a separate gradient is ever
    allocated (``triton/cross_entropy.py``; a TE version that writes the gradient in the backward
    instead makes one pass fewer).  ``torch.compile``'s cross-entropy (``compiled``: torchtitan's
    ``compile.components`` with ``"loss"``) is one fused kernel each way: AOTAutograd's min-cut
    partitioner saves the cheapest tensors the backward can recompute from — the 16-bit logits
    and each token's row maximum and log-sum-exp in fp32 — not the fp32 upcast or the
    log-probabilities, which are pointwise from them; the forward reads the logits once (one exp
    a logit), the backward reads them and writes their gradient (the softmax recomputed: one exp
    a logit again).  The embedding gathers T·h rows and all-reduces
    (or reduce-scatters under SP) them across TP; its backward scatters gradients into a dense,
    zero-filled [V/t, h] gradient.
    """
    dt = training.dtype
    eb = _act_bytes(training)
    h = float(model.hidden_size)
    V = float(model.vocab_size)
    t, c, b = S.tp, S.cp, S.mbs
    T = b * training.sequence_length / c
    gpn = links.gpus_per_node
    logits = T * V / t
    head_gemm = gemm_time_s(T, V / t, h, device, dt, fresh_output=False)
    loss: ArrayOrFloat
    if training.loss_kernel == "cce":
        # the logits blockwise on chip, computed again in the backward: one more head GEMM, no
        # loss pass through HBM
        loss = head_gemm
    elif training.loss_kernel == "compiled":
        # one fused pass forward over the 16-bit logits, one backward reading them and writing
        # their gradient; fresh tensors: the logits and their gradient
        loss = (memory_bound_time_s(logits * eb, device, kernels=1, transcendental_elements=logits)
                + memory_bound_time_s(logits * 2 * eb, device, kernels=1, transcendental_elements=logits)
                + first_touch_s(logits * eb, device, count=2))
    elif training.loss_kernel == "te":
        # the 16-bit logits read (online softmax), then read and overwritten by their gradient;
        # the backward scales it in place.  The logits are the only fresh tensor.
        loss = (memory_bound_time_s(logits * eb, device, kernels=1, transcendental_elements=logits)
                + memory_bound_time_s(logits * 2 * eb, device, kernels=1, transcendental_elements=logits)
                + memory_bound_time_s(logits * 2 * eb, device, kernels=1)
                + first_touch_s(logits * eb, device, count=1))
    else:
        # Log-softmax forward reads the logits and writes fp32 log-probabilities (one exp per
        # logit); backward writes the zero-filled gradient, reads it and the log-probabilities and
        # writes the logits' gradient (one exp per logit again).  Fresh tensors: logits,
        # log-probabilities, the two gradients.  Liger's and torchtune's chunks run the same
        # passes chunk by chunk.
        loss = (
            memory_bound_time_s(logits * (eb + 4), device, kernels=2, transcendental_elements=logits)
            + memory_bound_time_s(logits * 12, device, kernels=2, transcendental_elements=logits)
            + first_touch_s(logits * eb, device, count=2)
            + first_touch_s(logits * 4, device, count=2)
        )
    # A tied head on the embedding's stage in eager PyTorch: autograd adds the head's and the
    # embedding's gradients of the shared [V/t, h] weight (read two, write one); Megatron
    # accumulates both into the fp32 gradient buffer inside the GEMM (gradient-accumulation fusion).
    tied = model.tie_embeddings and not training.fused_kernels and not training.frozen_base
    tied_accumulate = np.where(S.pp == 1, memory_bound_time_s(3 * V / t * h * eb, device, kernels=1), 0.0) if tied else 0.0
    # frozen (LoRA): the head's backward is its dX alone, and the embedding builds no gradient
    head_passes = 2 if training.frozen_base else 3
    head_s = head_passes * head_gemm + loss + tied_accumulate
    tp_per_node = np.minimum(t, gpn)
    emb_comm = np.where(t > 1, allreduce_time_s(t, T * h * eb, links, tp_per_node), 0.0)
    # Gather, the summed positions (learned) and the backward scatter; GPT-style models also
    # apply dropout to the embedding output (one random number per element).
    drop = _dropout(model)
    emb_dropout = memory_bound_time_s(drop * T * h * (3 * eb + 1), device, kernels=drop, rng_elements=drop * T * h)
    # The embedding's backward builds a dense [V/t, h] gradient: zero-filled, then the T rows
    # scattered into it.
    emb_grad = memory_bound_time_s(V / t * h * eb, device, kernels=1) if not training.frozen_base else 0.0
    emb_passes = 2 if training.frozen_base else 3  # the gather, the positions' sum and (unless frozen) the backward's scatter
    emb_s = memory_bound_time_s(emb_passes * T * h * eb, device, kernels=emb_passes) + emb_grad + emb_dropout + 2 * emb_comm
    head_flops = head_passes * 2 * T * h * V / t
    # Logits (16-bit) and the fp32 copy the loss keeps for backward; Liger's fused linear
    # cross-entropy keeps the head's input gradient it computed in the forward and one chunk of
    # logits with its fp32 gradient at a time (chunks of about T·h/V tokens: T·h·(2 + 4) bytes);
    # Cut Cross-Entropy one fp32 log-sum-exp a token; Transformer Engine's the 16-bit logits and
    # three fp32 numbers a token (max, sum, the target's logit); torch.compile's the 16-bit logits
    # and two fp32 numbers a token (the row maximum and log-sum-exp).
    # torchtune's chunked loss frees the 16-bit logits once each chunk is upcast and keeps the
    # fp32 log-probabilities (log_softmax saves its output).
    head_act = {"unfused": T * V / t * (eb + 4), "chunked": T * V / t * 4.0, "liger": T * h * (eb + 2.0 + 4.0),
                "cce": T * 4.0, "te": T * V / t * eb + T * 12.0, "compiled": T * V / t * eb + T * 8.0}[training.loss_kernel]
    emb_act = T * h * eb / np.where(S.sp, t, 1.0)
    return emb_s, head_s, head_flops, emb_act, head_act


def pp_p2p_s(model: TransformerSpec, training: Training, links: Links, S: StrategyArrays, cross_node: ArrayOrFloat | bool) -> FloatArray:
    """One stage boundary crossing of one micro-batch's activations (b·s/c·h elements; with TP
    Megatron's scatter/gather optimisation sends 1/t per rank and all-gathers over NVLink —
    DeepSpeed's pipeline engine does the same with its partitioned activations,
    ``pipe_partitioned``/``grad_partitioned``)."""
    eb = _act_bytes(training)
    size = S.mbs * training.sequence_length / S.cp * model.hidden_size * eb / S.tp
    gather = np.where(S.tp > 1, reduce_scatter_time_s(S.tp, size * S.tp, links, np.minimum(S.tp, links.gpus_per_node)), 0.0)
    return p2p_time_s(size, links, cross_node) + gather + p2p_extra_s(links, dimension_axes(S, "pp"), size)

