"""Context parallelism: how the c ranks of a sequence exchange keys and values (vectorised).

A sequence of s tokens is split over c context-parallel ranks, sc = s/c tokens each (Megatron-
Core load-balances causal attention by giving rank i the chunks i and 2c−1−i, so every rank
does the same attention work: half the sc×s rectangle).  Attention needs every key and value
its queries attend to; the exchange (Megatron-Core ``--cp-comm-type``, Transformer Engine's
``attention/context_parallel.py``):

* ``p2p`` — a ring: each rank passes its K,V block to the next rank while it computes attention
  with the block it holds (Liu et al. 2023, Ring Attention; Megatron-Core CP).  Only what the
  block's attention does not cover is exposed.
* ``allgather`` — all-gather the full K,V before attention, reduce-scatter dK,dV after its
  backward (Llama 3 §3.3.2: cheap because GQA keys and values are small), not overlapped.
* ``a2a`` — all-to-all of Q, K, V from sequence-sharded to head-sharded before attention and
  of the output back (DeepSpeed-Ulysses, Jacobs et al. 2023), not overlapped.
* ``a2a+p2p`` — hierarchical: the all-to-all over the inner ``a2a_size`` CP ranks (adjacent, so
  inside a node where tp·a2a_size fits one), then the ring over the c/a2a_size groups, each rank
  holding a2a_size·sc tokens of 1/a2a_size of the heads — a K,V block of the same bytes as the
  plain ring's, c/a2a_size − 1 steps instead of c − 1 (Transformer Engine's
  ``AttnFuncWithCPAndKVP2P`` with ``cp_group_a2a``; Megatron-Core
  ``--hierarchical-context-parallel-sizes``).

Every function is pure and returns seconds; arguments broadcast over candidate arrays.
"""

from __future__ import annotations

import numpy as np

from cost_model.comm import (
    ArrayOrFloat,
    FloatArray,
    Links,
    allgather_time_s,
    alltoall_time_s,
    p2p_time_s,
    ranks_per_node,
)
from cost_model.training import CP_COMM_TYPES


def _f(x: ArrayOrFloat) -> FloatArray:
    return np.asarray(x, dtype=float)


def ring_steps(cp: ArrayOrFloat, local_seq: ArrayOrFloat, window: ArrayOrFloat) -> FloatArray:
    """Remote K,V blocks a rank needs (dimensionless): c − 1 for global attention; with a
    sliding window of w keys only the blocks within w tokens before its own,
    ⌈w/sc⌉ (contiguous chunks), at most c − 1."""
    c = _f(cp)
    need = np.ceil(_f(window) / np.maximum(_f(local_seq), 1.0))
    out: FloatArray = np.maximum(np.minimum(c - 1.0, need), 0.0)
    return out


def ring_exchange_exposed_s(
    kv_block_bytes: ArrayOrFloat,
    steps: ArrayOrFloat,
    links: Links,
    cross_node: ArrayOrFloat | bool,
    attn_fwd_s: ArrayOrFloat,
    attn_bwd_s: ArrayOrFloat,
    overlap: float,
    send_extra_s: tuple[ArrayOrFloat, ArrayOrFloat] = (0.0, 0.0),
) -> tuple[FloatArray, FloatArray]:
    """Exposed forward and backward time (s) of the ring K,V exchange of one layer.

    The attention of a rank covers its own block and ``steps`` received ones, equal work each
    (load-balanced causal chunks): a block costs ``attn/(steps + 1)``.  At each of the ``steps``
    ring steps the rank sends/receives one K,V block (``kv_block_bytes`` = 2·b·sc·kv·eb,
    :func:`cost_model.comm.p2p_time_s`; NICs when the ring crosses nodes) while it computes the
    block it has, so each step exposes max(0, t_comm − overlap·t_block) (Ring Attention's
    overlap condition: the block's compute must cover its transfer; Liu et al. 2023 §3).
    Backward passes K,V and the accumulating dK,dV (twice the bytes) and sends the finished
    dK,dV one last hop home, which nothing hides.  CP = 1 (steps 0): 0; compute-bound: 0 forward.
    ``send_extra_s``: what one forward and one backward send pay beyond the node-level send
    (the levels above the node a ring of another nesting order or a topology crosses,
    ``cost_model.topology.p2p_extra_s``; zero for a flat cluster), hidden like the send itself.
    """
    n = _f(steps)
    comm_f = p2p_time_s(kv_block_bytes, links, cross_node) + _f(send_extra_s[0])
    comm_b = p2p_time_s(2.0 * _f(kv_block_bytes), links, cross_node) + _f(send_extra_s[1])
    block_f = _f(attn_fwd_s) / (n + 1.0)
    block_b = _f(attn_bwd_s) / (n + 1.0)
    fwd = n * np.maximum(0.0, comm_f - overlap * block_f)
    bwd = n * np.maximum(0.0, comm_b - overlap * block_b) + np.where(n > 0, comm_f, 0.0)
    return np.where(n > 0, fwd, 0.0), np.where(n > 0, bwd, 0.0)


def allgather_exchange_s(kv_block_bytes: ArrayOrFloat, cp: ArrayOrFloat, per_node: ArrayOrFloat, links: Links) -> tuple[FloatArray, FloatArray]:
    """Forward and backward time (s) of ``allgather`` CP: all-gather the c K,V blocks
    (gathered size c·``kv_block_bytes``) before attention, reduce-scatter dK,dV after its
    backward; both before/after the kernels that need them, so exposed.  0 for c = 1."""
    c = _f(cp)
    one = allgather_time_s(c, c * _f(kv_block_bytes), links, per_node)
    return one, one


def a2a_exchange_s(qkv_bytes: ArrayOrFloat, out_bytes: ArrayOrFloat, cp: ArrayOrFloat, per_node: ArrayOrFloat, links: Links) -> tuple[FloatArray, FloatArray]:
    """Forward and backward time (s) of ``a2a`` (Ulysses) CP: forward an all-to-all of the
    rank's Q, K, V (``qkv_bytes``) to head-sharded layout and of the attention output
    (``out_bytes``) back; backward the same two with the gradients.  Exposed (the attention
    kernel needs all of it).  0 for c = 1."""
    one = alltoall_time_s(cp, qkv_bytes, links, per_node) + alltoall_time_s(cp, out_bytes, links, per_node)
    return one, one


def cp_layer_comm_s(
    comm_type: str,
    *,
    cp: ArrayOrFloat,
    tp: ArrayOrFloat,
    local_seq: ArrayOrFloat,
    window: float,
    kv_block_bytes: ArrayOrFloat,
    qkv_bytes: ArrayOrFloat,
    out_bytes: ArrayOrFloat,
    links: Links,
    attn_fwd_s: ArrayOrFloat,
    attn_bwd_s: ArrayOrFloat,
    overlap: float,
    per_node: ArrayOrFloat | None = None,
    ring_send_extra_s: tuple[ArrayOrFloat, ArrayOrFloat] = (0.0, 0.0),
    a2a_size: ArrayOrFloat = 1.0,
) -> tuple[FloatArray, FloatArray]:
    """Exposed (forward, backward) seconds of one layer's context-parallel exchange by
    ``comm_type`` (module docstring).  CP ranks are ``tp`` global ranks apart (Megatron order),
    so the group spans nodes when c·t exceeds a node; ``per_node`` overrides the CP ranks per
    node (another nesting order of the parallel dimensions); ``ring_send_extra_s``: the
    ``send_extra_s`` of :func:`ring_exchange_exposed_s` (``p2p`` and the ring of ``a2a+p2p``);
    ``a2a_size``: the all-to-all level of ``a2a+p2p``."""
    if comm_type not in CP_COMM_TYPES:
        raise ValueError(f"cp_comm_type must be one of {CP_COMM_TYPES}, got {comm_type!r}")
    c, t = _f(cp), _f(tp)
    gpn = links.gpus_per_node
    per_node = ranks_per_node(c, t, gpn) if per_node is None else _f(per_node)
    if comm_type == "allgather":
        fwd, bwd = allgather_exchange_s(kv_block_bytes, c, per_node, links)
    elif comm_type == "a2a":
        fwd, bwd = a2a_exchange_s(qkv_bytes, out_bytes, c, per_node, links)
    elif comm_type == "a2a+p2p":
        a = np.minimum(_f(a2a_size), c)
        rings = c / a
        inner, outer = np.minimum(a, per_node), np.maximum(per_node / a, 1.0)
        a2a_f, a2a_b = a2a_exchange_s(qkv_bytes, out_bytes, a, inner, links)
        steps = ring_steps(rings, _f(local_seq) * a, window)
        ring_f, ring_b = ring_exchange_exposed_s(kv_block_bytes, steps, links, rings > outer, attn_fwd_s, attn_bwd_s, overlap, ring_send_extra_s)
        fwd, bwd = np.where(a > 1, a2a_f, 0.0) + ring_f, np.where(a > 1, a2a_b, 0.0) + ring_b
    else:
        steps = ring_steps(c, local_seq, window)
        fwd, bwd = ring_exchange_exposed_s(kv_block_bytes, steps, links, c > per_node, attn_fwd_s, attn_bwd_s, overlap, ring_send_extra_s)
    return np.where(c > 1, fwd, 0.0), np.where(c > 1, bwd, 0.0)
