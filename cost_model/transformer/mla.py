"""Multi-head latent attention (DeepSeek-V2/V3) projections and their stored activations.

MLA (DeepSeek-V2, arXiv 2405.04434 §2.1; DeepSeek-V3, arXiv 2412.19437 §2.1.1) replaces the
Q, K, V projections by low-rank ones: the query is compressed to ``q_lora_rank`` (c_Q = x·W_DQ)
and expanded to a heads of (nope + rope) width (W_UQ); keys and values share one compressed
latent c_KV of ``kv_lora_rank`` plus a shared rotary key of ``qk_rope_head_dim`` (x·W_DKV),
expanded per head to the no-position key part and the value (W_UKV).  Training materialises the
expanded K and V (the absorbed form is an inference optimisation).

Megatron-Core's ``MLASelfAttention`` (``transformer/multi_latent_attention.py``) keeps the two
down-projections *duplicated* on every tensor-parallel rank (they are narrow) and splits the
up-projections column-wise over the heads; under sequence parallelism the down-projections run
on the rank's T/t tokens.  Pure functions; arguments broadcast over candidate arrays.
"""

from __future__ import annotations

import numpy as np

from cost_model.comm import ArrayOrFloat, FloatArray
from cost_model.compute import gemm_fwd_bwd_time_s
from cost_model.devices import DeviceSpec


def mla_projection_shapes(
    *, hidden: float, heads: float, q_lora_rank: float, kv_lora_rank: float, nope_dim: float, rope_dim: float, v_dim: float,
    tokens: ArrayOrFloat, tp: ArrayOrFloat, sequence_parallel: ArrayOrFloat,
) -> list[tuple[FloatArray, FloatArray, float]]:
    """The (m, n, k) of MLA's input-projection GEMMs on one GPU: query down [T_loc × h]·[h ×
    q_lora] and up [T × q_lora]·[q_lora × a(nope+rope)/t] (or one [T × h]·[h × a(nope+rope)/t]
    when ``q_lora_rank`` is 0: DeepSeek-V2-Lite), KV down [T_loc × h]·[h × (kv_lora + rope)], KV
    up [T × kv_lora]·[kv_lora × a(nope + v)/t]; T_loc = T/t under sequence parallelism, else T."""
    t = np.asarray(tp, dtype=float)
    T = np.asarray(tokens, dtype=float)
    sp = np.asarray(sequence_parallel, dtype=bool)
    T_loc = T / np.where(sp, t, 1.0)
    qk = nope_dim + rope_dim
    shapes: list[tuple[FloatArray, FloatArray, float]] = []
    if q_lora_rank:
        shapes.append((T_loc, np.full_like(t, q_lora_rank), hidden))
        shapes.append((T, heads * qk / t, q_lora_rank))
    else:
        shapes.append((T, heads * qk / t, hidden))
    shapes.append((T_loc, np.full_like(t, kv_lora_rank + rope_dim), hidden))
    shapes.append((T, heads * (nope_dim + v_dim) / t, kv_lora_rank))
    return shapes


def mla_projection_fwd_bwd_s(shapes: list[tuple[FloatArray, FloatArray, float]], device: DeviceSpec, dtype: str,
                             frozen: bool = False) -> tuple[FloatArray, FloatArray]:
    """Forward and backward time (s) of the MLA input projections (:func:`mla_projection_shapes`),
    each GEMM on its own shape (:func:`cost_model.compute.gemm_fwd_bwd_time_s`; ``frozen``: dX
    alone): the narrow reduction of the KV up-projection (k = kv_lora_rank, 512 in DeepSeek-V3)
    runs below the large-GEMM rate."""
    fwd: FloatArray = np.zeros_like(shapes[0][0])
    bwd: FloatArray = np.zeros_like(shapes[0][0])
    for m, n, k in shapes:
        f, b = gemm_fwd_bwd_time_s(m, n, k, device, dtype, frozen=frozen)
        fwd, bwd = fwd + f, bwd + b
    return fwd, bwd


def mla_projection_flops(shapes: list[tuple[FloatArray, FloatArray, float]]) -> FloatArray:
    """Forward FLOPs of those GEMMs on one GPU (2mnk each; the duplicated down-projections of a
    non-sequence-parallel TP group count on every rank)."""
    out: FloatArray = sum((2.0 * m * n * k for m, n, k in shapes), np.zeros_like(shapes[0][0]))
    return out


def mla_latent_activation_bytes(
    *, q_lora_rank: float, kv_lora_rank: float, rope_dim: float, tokens: ArrayOrFloat, tp: ArrayOrFloat,
    sequence_parallel: ArrayOrFloat, act_bytes: float,
) -> FloatArray:
    """Bytes MLA stores per layer per micro-batch beyond the expanded Q, K, V: the compressed
    query and KV latents, each saved twice — as its RMSNorm's input and as the up-projection's
    input — and the shared rotary key: T·(2·q_lora + 2·kv_lora + rope)·eb, on every TP rank
    (the latents are not split over heads; T/t of them under sequence parallelism, gathered
    before the up-projections, whose saved input is the gathered T)."""
    t = np.asarray(tp, dtype=float)
    T = np.asarray(tokens, dtype=float)
    sp = np.asarray(sequence_parallel, dtype=bool)
    T_loc = T / np.where(sp, t, 1.0)
    out: FloatArray = (T_loc * (q_lora_rank + kv_lora_rank) + T * (q_lora_rank + kv_lora_rank + rope_dim)) * act_bytes
    return out
