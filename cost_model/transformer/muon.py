"""Muon: the orthogonalised-momentum optimizer's step, as Megatron-Core runs it.

Muon (Jordan et al. 2024, "Muon: An optimizer for hidden layers in neural networks"; Liu et al.
2025, "Muon is Scalable for LLM Training" — Moonlight, and Kimi K2's pretraining) keeps one
momentum buffer per weight matrix and replaces each matrix's update by the momentum's nearest
semi-orthogonal matrix, computed by a few Newton-Schulz iterations; the parameters that are not
hidden matrices (embedding, output head, norms, biases) are stepped by a scalar optimizer, Adam
by default.

Megatron-Core (``--optimizer muon``: ``megatron/core/optimizer/muon.py``, ``TensorParallelMuon``
over NVIDIA's ``emerging_optimizers``) at its defaults:

* ``--muon-num-ns-steps`` 5 quintic iterations, ``--muon-fp32-matmul-prec medium`` (the fp32
  momentum's matmuls at the 16-bit tensor-core rate), ``--muon-tp-mode blockwise`` — each
  tensor-parallel rank orthogonalises its own shard of a matrix, no communication —, and
  ``--muon-split-qkv`` on: the fused QKV weight is orthogonalised as its Q, K and V parts;
* ``--muon-scalar-optimizer adam`` for the rest;
* without the distributed optimizer (Megatron-Bridge's Muon recipes turn it off) every
  data-parallel rank holds the whole state of its model shard and orthogonalises every matrix
  of it; with it (``--use-distributed-optimizer``: its ``LayerWiseDistributedOptimizer``) each
  rank owns whole matrices, 1/dp of them, steps those and all-gathers the updated weights after
  the gradients are all-reduced (``layer_cost.step_sync_ring_passes``).

Memory (``layer_cost.model_state_bytes_per_param``): the fp32 master copy and one fp32 momentum
— 8 B a parameter where Adam keeps 12 — for the decoder's matrices; the scalar optimizer's Adam
state for the embedding and head (``stage_cost``).  The Newton-Schulz temporaries (the matrix,
its Gram matrix and that squared, one matrix at a time) are not counted.
"""

from __future__ import annotations

import numpy as np

from cost_model.comm import ArrayOrFloat, FloatArray
from cost_model.compute import gemm_time_s
from cost_model.devices import DeviceSpec
from cost_model.transformer.layer_cost import StrategyArrays
from cost_model.transformer.mla import mla_projection_shapes
from cost_model.transformer.moe import expert_tensor_parallel
from cost_model.transformer.spec import TransformerSpec

#: Megatron-Core's default Newton-Schulz iterations a step (``--muon-num-ns-steps``).
MUON_NS_STEPS = 5
#: The dtype the iterations' matmuls run at: ``--muon-fp32-matmul-prec medium`` (PyTorch's
#: ``set_float32_matmul_precision("medium")``: fp32 matmuls on the bf16 tensor cores).
MUON_MATMUL_DTYPE = "bf16"

#: One weight matrix as orthogonalised on one GPU: (rows, columns, how many of that shape the
#: average decoder layer holds there, whether it is a routed expert's — stepped over the experts'
#: data-parallel ranks).
Matrix = tuple[FloatArray, FloatArray, FloatArray, bool]


def newton_schulz_s(rows: ArrayOrFloat, cols: ArrayOrFloat, device: DeviceSpec, count: ArrayOrFloat = 1.0,
                    steps: int = MUON_NS_STEPS) -> FloatArray:
    """Time (s) of orthogonalising ``count`` rows×cols matrices by ``steps`` quintic Newton-Schulz
    iterations (Jordan et al. 2024; ``emerging_optimizers`` ``newton_schulz``): with X the matrix
    oriented m×n, m = min(rows, cols) ≤ n, each iteration is three GEMMs —
    A = X·Xᵀ (m×m, reducing over n), B = b·A + c·A·A (m×m over m), X ← a·X + B·X (m×n over m) —
    4·m²·n + 2·m³ FLOPs, each GEMM timed on its own shape (:func:`cost_model.compute.gemm_time_s`)."""
    r = np.asarray(rows, dtype=float)
    c = np.asarray(cols, dtype=float)
    m, n = np.minimum(r, c), np.maximum(r, c)
    one = (gemm_time_s(m, m, n, device, MUON_MATMUL_DTYPE) + gemm_time_s(m, m, m, device, MUON_MATMUL_DTYPE)
           + gemm_time_s(m, n, m, device, MUON_MATMUL_DTYPE))
    out: FloatArray = steps * one * np.asarray(count, dtype=float)
    return out


def layer_matrices(model: TransformerSpec, S: StrategyArrays) -> list[Matrix]:
    """The weight matrices of the model's average decoder layer on one GPU, each as its
    tensor-parallel shard (blockwise mode): Q, K and V apart (``--muon-split-qkv``; K and V heads
    replicated when TP exceeds them), MLA's down- and up-projections
    (:func:`cost_model.transformer.mla.mla_projection_shapes`), the output projection, the FFN's
    fused input matrix (gate and up together, Megatron's ``linear_fc1``) and its output matrix;
    an MoE layer's router, its shared experts (split over TP) and its routed experts on this
    GPU, E/EP of them, each split over ETP; a dense-first model's layers weighted by their share."""
    t = np.asarray(S.tp, dtype=float)
    h = float(model.hidden_size)
    fm = float(model.ffn_matrices)
    one = np.ones_like(t)
    out: list[Matrix] = []
    if model.is_mla:
        for _, n, k in mla_projection_shapes(
            hidden=h, heads=float(model.num_heads), q_lora_rank=float(model.q_lora_rank), kv_lora_rank=float(model.kv_lora_rank),
            nope_dim=float(model.head_dim), rope_dim=float(model.qk_rope_head_dim), v_dim=float(model.v_head_dim),
            tokens=1.0, tp=t, sequence_parallel=False,
        ):
            out.append((np.asarray(n, dtype=float) * one, np.asarray(k, dtype=float) * one, one, False))
    else:
        kv = model.head_dim * np.maximum(model.num_kv_heads / t, 1.0)
        out.append((model.q_size / t, h * one, one, False))
        out.append((kv, h * one, 2.0 * one, False))
    out.append((h * one, model.attn_out_size / t, one, False))

    def ffn(width: ArrayOrFloat, count: ArrayOrFloat, expert: bool = False) -> list[Matrix]:
        w = np.asarray(width, dtype=float) * one
        c = np.asarray(count, dtype=float) * one
        return [((fm - 1.0) * w, h * one, c, expert), (h * one, w, c, expert)]

    if not model.is_moe:
        return out + ffn(float(model.ffn_hidden_size) / t, 1.0)
    moe_share = model.moe_layers / model.num_layers
    dense_share = 1.0 - moe_share
    if dense_share:
        out += ffn(float(model.dense_ffn_hidden_size or model.ffn_hidden_size) / t, dense_share)
    out.append((float(model.num_experts) * one, h * one, moe_share * one, False))
    if model.shared_expert_ffn_hidden_size:
        out += ffn(float(model.shared_expert_ffn_hidden_size) / t, moe_share)
    etp = expert_tensor_parallel(t, S.cp, S.dp, S.ep, S.etp_pin)
    out += ffn(float(model.ffn_hidden_size) / etp, moe_share * model.num_experts / np.asarray(S.ep, dtype=float), expert=True)
    return out


def orthogonalize_s(model: TransformerSpec, S: StrategyArrays, device: DeviceSpec, num_layers: ArrayOrFloat,
                    owners: ArrayOrFloat, expert_owners: ArrayOrFloat) -> FloatArray:
    """Time (s) of one step's Newton-Schulz orthogonalisations on one GPU of a stage holding
    ``num_layers`` decoder layers: every matrix of its shard (:func:`layer_matrices`,
    :func:`newton_schulz_s`), shared among ``owners`` ranks (the routed experts' among
    ``expert_owners``) — 1 without the distributed optimizer (each data-parallel rank
    orthogonalises all of them), the data-parallel group (dp·cp; the experts' EDP) with
    Megatron-Core's layer-wise distributed optimizer (each rank its own whole matrices)."""
    dense: FloatArray = np.zeros_like(np.asarray(S.tp, dtype=float))
    experts: FloatArray = np.zeros_like(dense)
    for rows, cols, count, expert in layer_matrices(model, S):
        t = newton_schulz_s(rows, cols, device, count)
        if expert:
            experts = experts + t
        else:
            dense = dense + t
    out: FloatArray = np.asarray(num_layers, dtype=float) * (dense / np.asarray(owners, dtype=float)
                                                            + experts / np.asarray(expert_owners, dtype=float))
    return out
