"""LoRA: the frozen model's low-rank adapters, per decoder layer and GPU.

LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", §4.1) freezes every
weight W of the model and trains, beside each targeted linear layer Y = X·W, a rank-r update
Y += s·(drop(X)·A)·B with A [d_in × r] and B [r × d_out] (s = alpha/r, a constant that costs
nothing but its multiply).  What that changes, each priced where the layer's cost is written:

* **No weight gradients for the base.** A frozen W has no dW GEMM (``cost_model.compute.
  gemm_fwd_bwd_time_s(frozen=True)``), no gradient, no master copy, no optimizer state, nothing
  to reduce across data-parallel ranks and nothing for the optimizer to step: the stage's
  state, gradient traffic and update are the adapters' (``stage_cost``).  The frozen weights are
  still gathered by ZeRO-3/FSDP in the forward and again in the backward (dX needs them).
* **The adapters' own work** (:func:`adapter_costs`): two small GEMMs each way, on the shapes
  below, and the memory-bound passes around them — PEFT's ``result + lora_B(lora_A(dropout(x)))
  * scaling`` reads and writes the output twice (multiply, add), the dropout (when
  ``lora_dropout`` > 0) reads the input and writes a copy and a mask, and backward adds the
  adapter's input gradient into the base's.
* **Saved activations** (:func:`saved_activation_delta_bytes`): each adapter keeps its rank-r
  intermediate for B's weight gradient, and with dropout the dropped input and its mask; a
  frozen layer without an adapter keeps nothing for its weight gradient (PyTorch's autograd
  saves a matmul operand only for the gradient that needs it — ``mm``'s ``mat1`` for
  ``mat2``'s; Transformer Engine's linear keeps its input only when the weight trains), so the
  input that only its weight gradient needed is not stored.

Tensor parallelism (torchtitan ``components/lora.py``, PaddleNLP's ``ColumnParallelLoRALinear``
/ ``RowParallelLoRALinear``, Megatron-Bridge's ``ParallelLinearAdapter``): beside a
column-parallel layer (QKV, FC1) A is replicated and B splits its output; beside a row-parallel
one (projection, FC2) A splits its input and B is replicated, its partial output summed by the
base layer's own reduction — no collective of its own.  Megatron-Bridge puts one adapter on the
fused ``linear_qkv`` and gated ``linear_fc1``; PEFT, torchtune, torchtitan and PaddleNLP one on
each projection (``FrameworkRules.lora_fused_projections``).

An MoE layer's ``linear_fc1``/``linear_fc2`` adapters go on its shared experts and on every
routed expert (PEFT's ``all-linear`` wraps each expert's linear layers where they are modules;
Megatron-Bridge's LoRA wraps the grouped expert linears): each expert's adapters run over the
tokens routed to it (:func:`expert_adapters`), split by the experts' own tensor parallelism,
held by its EP rank and synchronised over its expert-data-parallel ranks like the experts.

Not modelled (each small against the layer): the TP all-reduce of the T×r gradient of a
replicated A, the autograd nodes' launch overheads beyond the kernels counted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cost_model.comm import ArrayOrFloat, FloatArray
from cost_model.compute import gemm_fwd_bwd_time_s, memory_bound_time_s
from cost_model.devices import DeviceSpec
from cost_model.frameworks import rules_for
from cost_model.training import Training
from cost_model.transformer.moe import MoeFfnCost
from cost_model.transformer.spec import TransformerSpec

#: Bytes a parameter of a QLoRA base takes (``training.lora_base_dtype`` ``nf4``): a 4-bit NF4
#: code, an absmax scale per 64-value block quantised to 8 bits and one fp32 scale per 256 such
#: blocks (double quantisation: 8/64 + 32/(64·256) = 0.127 bits a parameter; Dettmers et al. 2023,
#: "QLoRA", §3; bitsandbytes' ``bnb_4bit_use_double_quant``, torchao's NF4Tensor: blocks of 64,
#: scalers of 256).
NF4_BYTES_PER_PARAM = 0.5 + (8.0 / 64.0 + 32.0 / (64.0 * 256.0)) / 8.0


def base_bytes_per_param(training: Training, default: float) -> float:
    """Bytes a frozen decoder weight is held in: :data:`NF4_BYTES_PER_PARAM` under QLoRA, else
    ``default`` (the training dtype's)."""
    return NF4_BYTES_PER_PARAM if training.frozen_base and training.lora_base_dtype == "nf4" else default


def dequantize_s(model: TransformerSpec, training: Training, device: DeviceSpec, tp: ArrayOrFloat, act_bytes: float,
                 moe: MoeFfnCost | None = None) -> FloatArray:
    """Seconds one pass (forward, or the backward's dX) of one uniform QLoRA layer spends
    dequantising its 4-bit weights: every frozen linear weight on this GPU is expanded to the
    compute dtype before its GEMM (bitsandbytes' ``dequantize_4bit`` in ``MatMul4Bit``, torchao's
    NF4Tensor ``to(bf16)``) — read :data:`NF4_BYTES_PER_PARAM`, write e bytes a weight, one
    kernel a linear layer and a local routed expert's — and again in backward for dX; a
    recomputed forward dequantises once more.  Weights: the layer's outside the routed experts
    over TP (norms and biases among them, a few kB) and, in an MoE layer (``moe``), its local
    experts' over ETP.  0 without a 4-bit base."""
    if base_bytes_per_param(training, 0.0) == 0.0:
        return np.zeros(np.shape(tp))
    weights = (float(model.decoder_layer_params()) - float(model.routed_expert_params_per_layer())) / np.asarray(tp, dtype=float)
    kernels: ArrayOrFloat = 4.0 + model.ffn_matrices
    if moe is not None:
        weights = weights + moe.local_experts * float(model.expert_params()) / moe.etp
        kernels = kernels + moe.local_experts * model.ffn_matrices
    out: FloatArray = memory_bound_time_s(weights * (NF4_BYTES_PER_PARAM + act_bytes), device, kernels=kernels)
    return out


@dataclass(frozen=True)
class Adapter:
    """One adapter's base layer: input and output widths, and which of them TP splits (a
    column-parallel layer splits its output, a row-parallel one its input, MLA's down-projections
    neither).  ``module``: the :data:`cost_model.frameworks.LORA_MODULES` name it belongs to."""

    module: str
    d_in: float
    d_out: float
    in_split: bool
    out_split: bool

    def widths(self, tp: ArrayOrFloat) -> tuple[ArrayOrFloat, ArrayOrFloat]:
        """The base layer's input and output widths on one TP rank."""
        return (self.d_in / tp if self.in_split else self.d_in), (self.d_out / tp if self.out_split else self.d_out)


def adapters(model: TransformerSpec, training: Training) -> list[Adapter]:
    """The adapters of one uniform decoder layer (a :meth:`TransformerSpec.layer_variants` spec)
    outside its routed experts (:func:`expert_adapters`) for ``training.lora_modules``: separate
    Q, K, V (and gate, up) adapters, or one on each fused projection where the framework fuses
    them; MLA's four input projections; an MoE layer's FFN adapters on its shared experts (none
    without them)."""
    mods = set(training.lora_modules)
    fused = rules_for(training.framework).lora_fused_projections
    h = float(model.hidden_size)
    out: list[Adapter] = []
    if "linear_qkv" in mods:
        if model.is_mla:
            ql, kvl, heads = float(model.q_lora_rank), float(model.kv_lora_rank), float(model.num_heads)
            q_parts = [Adapter("linear_qkv", h, ql, False, False), Adapter("linear_qkv", ql, float(model.q_size), False, True)] if ql else [
                Adapter("linear_qkv", h, float(model.q_size), False, True)]
            out += q_parts + [Adapter("linear_qkv", h, kvl + float(model.qk_rope_head_dim), False, False),
                              Adapter("linear_qkv", kvl, heads * float(model.head_dim + model.v_head_dim), False, True)]
        else:
            q, kv = float(model.q_size), float(model.num_kv_heads * model.head_dim)
            out += [Adapter("linear_qkv", h, q + 2 * kv, False, True)] if fused else [
                Adapter("linear_qkv", h, w, False, True) for w in (q, kv, kv)]
    if "linear_proj" in mods:
        out.append(Adapter("linear_proj", float(model.attn_out_size), h, True, False))
    f = float(model.shared_expert_ffn_hidden_size if model.is_moe else model.ffn_hidden_size)
    if f:
        out += _ffn_adapters(training, h, f, model.ffn_matrices)
    return out


def _ffn_adapters(training: Training, h: float, f: float, ffn_matrices: int) -> list[Adapter]:
    """The FFN's adapters (FC1 column-parallel, FC2 row-parallel) for an FFN of width ``f``."""
    mods = set(training.lora_modules)
    fused = rules_for(training.framework).lora_fused_projections
    inputs = ffn_matrices - 1  # gate and up when gated
    out: list[Adapter] = []
    if "linear_fc1" in mods:
        out += [Adapter("linear_fc1", h, inputs * f, False, True)] if fused else [Adapter("linear_fc1", h, f, False, True) for _ in range(inputs)]
    if "linear_fc2" in mods:
        out.append(Adapter("linear_fc2", f, h, True, False))
    return out


def expert_adapters(model: TransformerSpec, training: Training) -> list[Adapter]:
    """The adapters of ONE routed expert of a uniform MoE layer (none for a dense layer), its
    widths split by the experts' tensor parallelism (``Adapter.widths(etp)``)."""
    if not model.is_moe:
        return []
    return _ffn_adapters(training, float(model.hidden_size), float(model.ffn_hidden_size), model.ffn_matrices)


def expert_adapter_params_per_layer(model: TransformerSpec, training: Training, ep: ArrayOrFloat, etp: ArrayOrFloat) -> FloatArray:
    """Trainable parameters of the average layer's routed-expert adapters on one GPU: the E/ep
    local experts' r·(d_in + d_out) each, split by ETP as the experts are."""
    r = float(training.lora_rank)
    total: FloatArray = np.zeros(np.broadcast(ep, etp).shape)
    for w, v in model.layer_variants():
        for ad in expert_adapters(v, training):
            d_in, d_out = ad.widths(etp)
            total = total + w * v.num_experts / ep * r * (d_in + d_out)
    return total


def expert_adapter_tensors_per_layer(model: TransformerSpec, training: Training, ep: ArrayOrFloat) -> FloatArray:
    """Trainable tensors of the average layer's routed-expert adapters on one GPU (A and B of
    each local expert's adapters)."""
    out: FloatArray = sum((w * v.num_experts / np.asarray(ep, dtype=float) * 2 * len(expert_adapters(v, training))
                           for w, v in model.layer_variants()), np.zeros(np.shape(ep)))
    return out


def adapter_params_per_layer(model: TransformerSpec, training: Training, tp: ArrayOrFloat) -> FloatArray:
    """Trainable parameters of the average decoder layer on one TP rank: r·(d_in + d_out) per
    adapter, each of A and B split where its base layer splits that side (the layer variants
    weighted by their share of the layers)."""
    r = float(training.lora_rank)
    total: FloatArray = np.zeros(np.shape(tp))
    for w, v in model.layer_variants():
        for ad in adapters(v, training):
            d_in, d_out = ad.widths(tp)
            total = total + w * r * (d_in + d_out)
    return total


def adapter_tensors_per_layer(model: TransformerSpec, training: Training) -> float:
    """Trainable tensors of the average decoder layer (A and B of each adapter): what a
    per-tensor optimizer launches kernels for."""
    return float(sum(w * 2 * len(adapters(v, training)) for w, v in model.layer_variants()))


def _adapter_group(ads: list[Adapter], training: Training, device: DeviceSpec, m: FloatArray, batch: ArrayOrFloat, split: ArrayOrFloat,
                   act_bytes: float) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Forward time, backward time and forward FLOPs of ``batch`` alike sets of adapters over
    ``m`` tokens each (:func:`adapter_costs`), their widths split by ``split``."""
    r = float(training.lora_rank)
    drop = 1.0 if training.lora_dropout > 0.0 else 0.0
    fwd: FloatArray = np.zeros(np.broadcast(m, batch, split).shape)
    bwd: FloatArray = np.zeros_like(fwd)
    flops: FloatArray = np.zeros_like(fwd)
    e, tokens = act_bytes, m * batch
    for ad in ads:
        d_in, d_out = ad.widths(split)
        a_f, a_b = gemm_fwd_bwd_time_s(m, r, d_in, device, training.dtype, batch=batch)
        b_f, b_b = gemm_fwd_bwd_time_s(m, d_out, r, device, training.dtype, batch=batch)
        fwd = fwd + a_f + b_f + memory_bound_time_s(5.0 * e * tokens * d_out, device, kernels=2 * batch)
        bwd = bwd + a_b + b_b + memory_bound_time_s(2.0 * e * tokens * d_out + 3.0 * e * tokens * d_in, device, kernels=2 * batch)
        if drop:
            fwd = fwd + memory_bound_time_s((2.0 * e + 1.0) * tokens * d_in, device, kernels=batch, rng_elements=tokens * d_in)
            bwd = bwd + memory_bound_time_s((2.0 * e + 1.0) * tokens * d_in, device, kernels=batch)
        flops = flops + 2.0 * tokens * r * (d_in + d_out)
    return fwd, bwd, flops


def adapter_costs(model: TransformerSpec, training: Training, device: DeviceSpec, tokens: ArrayOrFloat, tp: ArrayOrFloat,
                  act_bytes: float, moe: MoeFfnCost | None = None) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Forward time, backward time (s) and forward FLOPs of one uniform layer's adapters for
    ``tokens`` tokens per GPU (T, after context splitting; the full sequence under SP, as the base
    GEMMs see it), and of an MoE layer's routed experts' adapters (``moe``: each local expert's
    over the tokens routed to it, M at the slowest rank's load, widths split by ETP; one kernel
    per expert for each pass — PEFT loops over the experts).

    Per adapter with local widths d_in, d_out, rank r and element size e: the GEMMs X·A
    [T, r, d_in] and H·B [T, d_out, r], each with its dX and dW in backward
    (:func:`cost_model.compute.gemm_fwd_bwd_time_s`); forward the scaling multiply and the add
    into the base output (5·e·T·d_out bytes, 2 kernels); backward the multiply's gradient
    (2·e·T·d_out, 1 kernel) and the add of the adapter's dX into the base's (3·e·T·d_in, 1 kernel);
    with ``lora_dropout`` > 0 the dropout (read e, write e and a 1-byte mask per input element, one
    random number each) and its backward (2·e + 1 bytes an element)."""
    T = np.asarray(tokens, dtype=float)
    fwd, bwd, flops = _adapter_group(adapters(model, training), training, device, T, 1.0, tp, act_bytes)
    if moe is not None:
        e_f, e_b, e_flops = _adapter_group(expert_adapters(model, training), training, device, moe.expert_tokens, moe.local_experts,
                                           moe.etp, act_bytes)
        fwd, bwd, flops = fwd + e_f, bwd + e_b, flops + e_flops
    return fwd, bwd, flops


def saved_activation_delta_bytes(model: TransformerSpec, training: Training, tokens: ArrayOrFloat, tp: ArrayOrFloat,
                                 sequence_parallel: ArrayOrFloat, act_bytes: float, moe: MoeFfnCost | None = None) -> FloatArray:
    """What LoRA changes in one uniform layer's saved activations per micro-batch (bytes; the
    layer's full set, :func:`cost_model.transformer.layer_cost.activation_bytes`' ``full``):

    + each adapter's intermediate X·A (T·r·e) for B's weight gradient, and with ``lora_dropout``
      the dropped input and its mask (T·d_in·(e + 1)) for A's — for the routed experts' adapters
      over each local expert's M tokens (``moe``);
    − the input of each frozen linear layer without an adapter, which only its weight gradient
      needed: the QKV input T·h (/t under SP), the projection input T·o/t, a dense FFN's FC1
      input T·h (/t under SP) and FC2 input T·f/t (an MoE layer's FFN inputs stay counted).
    """
    r = float(training.lora_rank)
    T = np.asarray(tokens, dtype=float)
    e = act_bytes
    rep = np.where(np.asarray(sequence_parallel, dtype=bool), tp, 1.0)
    drop = 1.0 if training.lora_dropout > 0.0 else 0.0
    out: FloatArray = np.zeros(np.broadcast(T, tp, rep).shape)
    groups: list[tuple[list[Adapter], ArrayOrFloat, ArrayOrFloat]] = [(adapters(model, training), T, tp)]
    if moe is not None:
        groups.append((expert_adapters(model, training), moe.expert_tokens * moe.local_experts, moe.etp))
    for ads, m, split in groups:
        for ad in ads:
            d_in, _ = ad.widths(split)
            out = out + m * r * e + drop * m * d_in * (e + 1.0)
    mods = set(training.lora_modules)
    h = float(model.hidden_size)
    if "linear_qkv" not in mods:
        out = out - T * h * e / rep
    if "linear_proj" not in mods:
        out = out - T * float(model.attn_out_size) / tp * e
    if not model.is_moe:
        if "linear_fc1" not in mods:
            out = out - T * h * e / rep
        if "linear_fc2" not in mods:
            out = out - T * float(model.ffn_hidden_size) / tp * e
    return out


__all__ = ["NF4_BYTES_PER_PARAM", "base_bytes_per_param", "dequantize_s", "Adapter", "adapter_costs", "adapter_params_per_layer", "adapter_tensors_per_layer", "adapters", "expert_adapter_params_per_layer",
           "expert_adapter_tensors_per_layer", "expert_adapters", "saved_activation_delta_bytes"]
