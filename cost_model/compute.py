"""Compute-time primitives.  Pure functions; every argument may be a numpy array (they
broadcast), so the planner can cost thousands of candidates in one call.

GEMM time model (roofline with shape-dependent efficiency):

    t = max( 2·m·n·k / (P · e_max · σ(m; d½)·σ(n; d½)·σ(k; k½)),  bytes / (B · f_mem) ) · batch + t_launch
    σ(x; x½) = x / (x + x½)

``P`` is the dense peak for the dtype, ``B`` the HBM bandwidth, ``e_max`` the large-GEMM
fraction of peak, ``d_half`` the dimension at which tile/wave quantisation halves throughput
(cuBLAS/CUTLASS tile sizes are 64–256, so small per-GPU matrices after tensor parallelism run
slower).  Constants per device family: :data:`cost_model.devices.FAMILY_EFFICIENCY`; fitted
per device by ``cost_model.profiles``.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import numpy as np

from cost_model.devices import BYTES_PER_ELEMENT, DeviceSpec
from cost_model.units import gbps_to_bytes_per_s, tflops_to_flops

#: A scalar or an array of candidates (every primitive broadcasts).
ArrayOrFloat: TypeAlias = float | np.floating[Any] | np.integer[Any] | np.ndarray


def shape_factor(dim: ArrayOrFloat, half_dim: float) -> np.ndarray:
    """σ(d) = d/(d + d_half): fraction (dimensionless) of the large-GEMM rate reached along one
    dimension; a saturating tile-efficiency model, ``d_half`` fitted per device family."""
    d = np.asarray(dim, dtype=float)
    return d / (d + half_dim)


def gemm_time_s(
    m: ArrayOrFloat, n: ArrayOrFloat, k: ArrayOrFloat, device: DeviceSpec, dtype: str, batch: ArrayOrFloat = 1, fresh_output: bool = True
) -> np.ndarray:
    """Time (s) of ``batch`` independent (m×k)·(k×n) GEMMs on one device.

    FLOPs 2·m·n·k per GEMM; bytes (m·k + k·n + m·n)·element size (each operand read or
    written once).  Source: roofline model (Williams et al. 2009) with a saturating
    tile-efficiency factor per dimension.  ``fresh_output``: the result is a newly allocated
    tensor (:func:`first_touch_s`); false for tiles that stay on chip (fused attention).
    """
    eff = device.efficiency
    m = np.asarray(m, dtype=float)
    n = np.asarray(n, dtype=float)
    k = np.asarray(k, dtype=float)
    flops = 2.0 * m * n * k
    rate = tflops_to_flops(device.peak_tflops(dtype)) * eff.gemm_max_fraction
    rate = rate * shape_factor(m, eff.gemm_half_dim) * shape_factor(n, eff.gemm_half_dim) * shape_factor(k, eff.gemm_half_k)
    bytes_moved = (m * k + k * n + m * n) * BYTES_PER_ELEMENT[dtype]
    t_flops = flops / rate
    t_mem = bytes_moved / (gbps_to_bytes_per_s(device.memory_bandwidth_GBps) * eff.memory_fraction)
    fresh = first_touch_s(m * n * batch * BYTES_PER_ELEMENT[dtype], device) if fresh_output and eff.first_touch_s_per_byte > 0 else 0.0
    t: np.ndarray = np.maximum(t_flops, t_mem) * batch + fresh + eff.kernel_overhead_s
    return t


def gemm_fwd_bwd_time_s(
    m: ArrayOrFloat, n: ArrayOrFloat, k: ArrayOrFloat, device: DeviceSpec, dtype: str, batch: ArrayOrFloat = 1, frozen: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward times (s) of a linear layer Y[m×n] = X[m×k]·W[k×n], by
    :func:`gemm_time_s` (roofline) on each GEMM's own shape.

    Backward is two GEMMs with their own shapes: the input gradient dX = dY·Wᵀ (m×k, reducing
    over n) and the weight gradient dW = Xᵀ·dY (k×n, reducing over the m tokens) — so a
    row-parallel layer with a small k runs its backward faster than twice its forward.
    ``frozen``: W does not train (the base weights of a LoRA run): autograd computes no dW, so
    the backward is dX alone.
    """
    fwd = gemm_time_s(m, n, k, device, dtype, batch)
    bwd = gemm_time_s(m, k, n, device, dtype, batch)
    if not frozen:
        bwd = bwd + gemm_time_s(k, n, m, device, dtype, batch)
    return fwd, bwd


def first_touch_s(tensor_bytes: ArrayOrFloat, device: DeviceSpec, count: ArrayOrFloat = 1) -> np.ndarray | float:
    """Page-fault cost (s) of writing ``count`` freshly allocated tensors of ``tensor_bytes`` each;
    the per-byte cost is fitted from the profile (``cost_model.profiles``).

    Tensors of at least ``first_touch_min_bytes`` get new pages from the OS every time (glibc's
    mmap threshold on CPUs; never on GPUs, whose caching allocators reuse blocks), and the first
    write to each page faults and zero-fills it: ``first_touch_s_per_byte`` per byte.
    """
    eff = device.efficiency
    if eff.first_touch_s_per_byte <= 0.0:  # GPUs: nothing to compute on the planner's hot path
        return 0.0
    b = np.asarray(tensor_bytes, dtype=float)
    return np.where(b >= eff.first_touch_min_bytes, b * eff.first_touch_s_per_byte, 0.0) * count


def memory_bound_time_s(
    bytes_moved: ArrayOrFloat,
    device: DeviceSpec,
    kernels: ArrayOrFloat = 1,
    rng_elements: ArrayOrFloat = 0.0,
    transcendental_elements: ArrayOrFloat = 0.0,
) -> np.ndarray:
    """Time (s) of streaming (elementwise, norm, softmax, optimizer) kernels: bytes over achieved memory
    bandwidth, or the per-element arithmetic when that is slower (random numbers for dropout
    masks, exp/erf/log), plus one launch overhead per kernel.

    ``t = max(bytes / (B · f_mem), n_rng · c_rng + n_exp · c_exp) + kernels · t_launch`` — a
    streaming loop overlaps its loads with its arithmetic, so the slower of the two sets the
    pace (roofline).  The element costs are zero on GPUs (:class:`~cost_model.devices.Efficiency`).
    Fresh large outputs add :func:`first_touch_s`, charged by the caller per tensor.
    """
    eff = device.efficiency
    t_mem = np.asarray(bytes_moved, dtype=float) / (gbps_to_bytes_per_s(device.memory_bandwidth_GBps) * eff.memory_fraction)
    if eff.rng_s_per_element > 0 or eff.transcendental_s_per_element > 0:
        t_alu = np.asarray(rng_elements, dtype=float) * eff.rng_s_per_element + np.asarray(transcendental_elements, dtype=float) * eff.transcendental_s_per_element
        t_mem = np.maximum(t_mem, t_alu)
    return t_mem + kernels * eff.kernel_overhead_s


#: Fraction of GEMM throughput a fused attention kernel keeps while it also does the online
#: softmax (FlashAttention-2 forward reaches ≈ 70–75% of the GEMM rate on A100/H100; Dao 2023).
FLASH_FORWARD_FRACTION = 0.8
#: Backward/forward time ratio of fused attention (FlashAttention-2: five GEMMs instead of two
#: plus recomputing the scores, ≈ 2.5× the forward time; Dao 2023, Fig. 6–7).
FLASH_BACKWARD_RATIO = 2.5


def flash_attention_time_s(
    batch_heads: ArrayOrFloat,
    q_len: ArrayOrFloat,
    kv_len: ArrayOrFloat,
    head_dim: ArrayOrFloat,
    device: DeviceSpec,
    dtype: str,
    causal_fraction: ArrayOrFloat = 0.5,
) -> np.ndarray:
    """Forward time (s) of a fused (FlashAttention-2/3, cuDNN) attention core — the one
    formula both the transformer and the operator-graph cost models use.

    FLOPs 4·q·kv·d per head (QKᵀ and PV) times ``causal_fraction`` (0.5 for a causal mask: the
    kernel skips fully-masked tiles; load-balanced context parallelism keeps it at 0.5 per
    rank).  The kernel keeps an output tile O[q_tile × d] on chip and loops over the key/value
    blocks, so its fixed per-tile cost (load Q, write O, the final rescale) is amortised over
    the kv length — it is costed as the GEMM O = P·V (m = q, n = d, k = kv) rather than as QKᵀ,
    whose reduction is the short head dimension (Dao 2023, FlashAttention-2 §3.1: the outer loop
    over q blocks, the inner over kv blocks).  Rate: that GEMM model times
    :data:`FLASH_FORWARD_FRACTION` (the softmax and the online rescale between the two GEMMs).
    """
    per_gemm = gemm_time_s(q_len, head_dim, kv_len, device, dtype, batch=batch_heads, fresh_output=False)
    t: np.ndarray = 2.0 * per_gemm * np.asarray(causal_fraction, dtype=float) / FLASH_FORWARD_FRACTION
    return t


def attention_flops(
    batch: ArrayOrFloat, heads: ArrayOrFloat, q_len: ArrayOrFloat, kv_len: ArrayOrFloat, head_dim: ArrayOrFloat
) -> np.ndarray:
    """Model FLOPs (FLOP) of one attention core forward (QKᵀ and PV), counting the full q×kv
    square as Narayanan et al. (2021) Eq. 3 and Megatron's MFU formula do."""
    return 4.0 * np.asarray(batch, dtype=float) * heads * q_len * kv_len * head_dim
