"""Mixture-of-experts layer physics: expert parallel folding, routing, token movement, experts.

Every function is pure and broadcasts over numpy arrays of candidate strategies (as
:mod:`cost_model.transformer.layer_cost`), returning seconds, bytes or a dimensionless factor
as its name says.  :func:`moe_ffn_costs` assembles them into the FFN part of one MoE decoder
layer; ``layer_cost`` calls it in place of the dense FFN.

Notation: one GPU of a stage holds T = b·s/c tokens of a micro-batch in its tensor-parallel
group (T/t under sequence parallelism), E routed experts of width f, top-k routing, hidden h,
bytes per activation element eb.

Expert-parallel folding (Megatron-Core "MoE parallel folding", Liu et al. 2025, arXiv
2504.14960; Megatron-Core ``--expert-tensor-parallel-size``): the tp·cp·dp ranks of a stage are
regrouped for the expert layers as ETP × EP × EDP (expert tensor, expert and expert data
parallel), ETP fastest.  The attention layers keep TP × CP × DP.  With the classic layout
(``ep`` divides dp·cp) the experts keep ETP = TP; an ``ep`` that needs the TP ranks too
(ep ∤ dp·cp, ep | dp·cp·tp: e.g. ep 32 over tp 2 × dp 16) folds them into EP, leaving
ETP = gcd(tp, tp·cp·dp/ep) (1 in that example).

Sources: Megatron-Core MoE (``megatron/core/transformer/moe``: router, ``token_dispatcher``
alltoall / allgather / flex, ``moe_utils.permute``/``unpermute``, grouped GEMM experts);
DeepSeek-V3 technical report (arXiv 2412.19437) §3.2.2 for node-limited dispatch over
InfiniBand then NVLink (what DeepEP implements); Lepikhin et al. 2021 (GShard) and Fedus et al.
2022 (Switch) for capacity factors.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from cost_model.comm import (
    ArrayOrFloat,
    FloatArray,
    Links,
    allreduce_time_s,
    alltoall_time_s,
    ranks_per_node,
    reduce_scatter_time_s,
)
from cost_model.compute import gemm_fwd_bwd_time_s, gemm_time_s, memory_bound_time_s
from cost_model.devices import DeviceSpec
from cost_model.training import MOE_DISPATCHERS
from cost_model.units import gbps_to_bytes_per_s, tflops_to_flops


def _f(x: ArrayOrFloat) -> FloatArray:
    return np.asarray(x, dtype=float)


# ---- parallel folding ----------------------------------------------------------------------------


def expert_tensor_parallel(tp: ArrayOrFloat, cp: ArrayOrFloat, dp: ArrayOrFloat, ep: ArrayOrFloat, etp: ArrayOrFloat = 0.0) -> FloatArray:
    """ETP, the tensor-parallel size of the experts (dimensionless): ``etp`` where given (> 0:
    Megatron-Core's ``--expert-tensor-parallel-size``, ``Strategy.etp``); else TP when ``ep``
    divides dp·cp (Megatron-Core's default ``expert_tensor_parallel_size =
    tensor_model_parallel_size``), and under parallel folding, when EP also spans TP ranks, the
    EP × ETP group must fit in tp·cp·dp, so ETP = gcd(tp, tp·cp·dp/ep) (Liu et al. 2025 §3:
    ETP·EP·EDP = TP·CP·DP) — e.g. 1 for ep 32 over tp 2 × dp 16, the folding the planner
    accepts (``cost_model.frameworks.ep_group_divisor``)."""
    tp, cp, dp, ep = _f(tp), _f(cp), _f(dp), _f(ep)
    rest = np.maximum(np.round(tp * cp * dp / np.maximum(ep, 1.0)), 1.0).astype(np.int64)
    derived = np.gcd(np.round(tp).astype(np.int64), rest).astype(float)
    pinned = _f(etp)
    out: FloatArray = np.where(pinned > 0, pinned, derived)
    return out


def expert_blocks_tile(tp: ArrayOrFloat, cp: ArrayOrFloat, dp: ArrayOrFloat, ep: ArrayOrFloat, etp: ArrayOrFloat) -> np.ndarray:
    """Whether EP × ETP blocks tile a stage's tp·cp·dp ranks (ETP·EP·EDP = TP·CP·DP, Liu et al.
    2025 §3): the rule a pinned ``etp`` must meet — one predicate for the search space's row mask
    and for the message of :func:`cost_model.strategy.expert_tensor_parallel_violation`."""
    out: np.ndarray = np.asarray(np.mod(_f(tp) * _f(cp) * _f(dp), _f(ep) * _f(etp)) == 0)
    return out


def expert_data_parallel(tp: ArrayOrFloat, cp: ArrayOrFloat, dp: ArrayOrFloat, ep: ArrayOrFloat, etp: ArrayOrFloat = 0.0) -> FloatArray:
    """EDP = tp·cp·dp/(ep·etp): the replicas of each expert shard, over which its gradients are
    reduced and (distributed optimizer / ZeRO) its optimizer state is sharded (dimensionless, ≥ 1)."""
    etp = expert_tensor_parallel(tp, cp, dp, ep, etp)
    out: FloatArray = np.maximum(_f(tp) * _f(cp) * _f(dp) / (np.maximum(_f(ep), 1.0) * etp), 1.0)
    return out


def experts_split_into_replicas(tp: ArrayOrFloat, cp: ArrayOrFloat, dp: ArrayOrFloat, ep: ArrayOrFloat, dp_shard: ArrayOrFloat,
                                etp: ArrayOrFloat = 0.0) -> np.ndarray:
    """Whether the experts' EDP replicas (:func:`expert_data_parallel`) split evenly into the
    dp/dp_shard replica groups of a partial (HSDP) sharding, each group then sharding the
    experts over EDP·dp_shard/dp ranks; true under full sharding (``dp_shard`` 0)."""
    edp = np.round(expert_data_parallel(tp, cp, dp, ep, etp)).astype(np.int64)
    shard = _f(dp_shard)
    replicas = np.where(shard > 0, np.round(_f(dp) / np.maximum(shard, 1.0)), 1.0).astype(np.int64)
    out: np.ndarray = edp % replicas == 0
    return out


# ---- routing statistics --------------------------------------------------------------------------


def dropless_load_factor(slots_per_rank: ArrayOrFloat, ranks: ArrayOrFloat) -> FloatArray:
    """Expected maximum over ``ranks`` EP ranks of the token-slots a rank receives, over the mean
    (dimensionless, ≥ 1), for dropless routing by a balanced router.

    Each of the N = ``slots_per_rank``·n token-slots of the EP group lands on a given rank with
    probability 1/n, so a rank's load is Binomial(N, 1/n): mean μ = ``slots_per_rank``, standard
    deviation σ = √(μ·(1 − 1/n)).  The expected maximum of n such (near-Gaussian) loads is
    μ + σ·z_n with z_n = Φ⁻¹((n − 0.375)/(n + 0.25)), Blom's (1958) approximation of the
    expected largest of n standard normal order statistics (1.42 for 8, 1.77 for 16).  The
    slowest rank — which every rank waits for at the next all-to-all — carries
    1 + z_n·√((1 − 1/n)/μ) times the mean.  This is the sampling floor: a router whose experts
    are unevenly popular only adds to it.  1 for n = 1.
    """
    mu = np.maximum(_f(slots_per_rank), 1.0)
    n = np.maximum(_f(ranks), 1.0)
    z = _expected_max_standard_normal(n)
    out: FloatArray = 1.0 + z * np.sqrt((1.0 - 1.0 / n) / mu)
    return out


def _expected_max_standard_normal(n: FloatArray) -> FloatArray:
    """Blom's approximation Φ⁻¹((n − 0.375)/(n + 0.25)) of E[max of n iid N(0, 1)]; 0 for n = 1."""
    values, index = np.unique(np.asarray(n, dtype=float), return_inverse=True)  # few distinct EP sizes
    z = np.array([_NORMAL.inv_cdf((v - 0.375) / (v + 0.25)) if v > 1 else 0.0 for v in values.ravel()])
    out: FloatArray = z[index].reshape(np.shape(n))
    return out


_NORMAL = NormalDist()


def expert_load_factor(slots_per_rank: ArrayOrFloat, ranks: ArrayOrFloat, capacity_factor: float | None = None) -> FloatArray:
    """Work of the slowest EP rank over the mean (dimensionless).  Dropless (``capacity_factor``
    None, Megatron-Core's default): :func:`dropless_load_factor`.  With a capacity factor C
    (GShard / Switch Transformer: each expert takes at most C·mean tokens and drops the rest, the
    buffers padded to capacity — Megatron-Core ``--moe-expert-capacity-factor`` with
    ``--moe-pad-expert-input-to-capacity``): exactly C."""
    if capacity_factor is not None:
        return np.full(np.broadcast(_f(slots_per_rank), _f(ranks)).shape, float(capacity_factor))
    return dropless_load_factor(slots_per_rank, ranks)


def tokens_per_expert(
    tokens: ArrayOrFloat, top_k: float, num_experts: float, ep: ArrayOrFloat, etp: ArrayOrFloat, tp: ArrayOrFloat
) -> FloatArray:
    """Tokens each local expert GEMM processes per micro-batch (its M dimension), at the mean load.

    The stage's dp·cp tensor-parallel groups hold ``tokens`` (T) each, k slots per token.  The
    EDP = tp·cp·dp/(ep·etp) expert blocks of ep·etp ranks each hold every expert once, so a
    block receives T·k·ep·etp/t slots, spread over E experts:
    M = T·k·ep·etp/(t·E).  Classic layout (etp = t): T·k·ep/E; top_k = E = ep = 1: T.
    """
    out: FloatArray = _f(tokens) * top_k * _f(ep) * _f(etp) / (_f(tp) * num_experts)
    return out


# ---- experts -------------------------------------------------------------------------------------


def grouped_gemm_efficiency(m: ArrayOrFloat, n: ArrayOrFloat, k: ArrayOrFloat, device: DeviceSpec, dtype: str) -> FloatArray:
    """Achieved fraction of the dense peak (dimensionless) of one expert's GEMM [m×k]·[k×n]
    inside a grouped GEMM, as a function of its token count m.

    Roofline (Williams et al. 2009) on the GEMM's own shape: FLOPs 2mnk over bytes
    (mk + kn + mn)·eb gives the arithmetic intensity I = 2mnk / ((mk + kn + mn)·eb); for few
    tokens (m ≪ n, k) I ≈ 2m/eb and the expert is bound by streaming its weights (k·n·eb bytes)
    from HBM.  Above the ridge the tile-quantisation factor σ(m)σ(n)σ(k) of
    :func:`cost_model.compute.gemm_time_s` applies (partial tiles of the last M block).  The
    time model itself is :func:`cost_model.compute.gemm_time_s`; this reports its rate.
    """
    t = gemm_time_s(m, n, k, device, dtype, fresh_output=False) - device.efficiency.kernel_overhead_s
    out: FloatArray = 2.0 * _f(m) * _f(n) * _f(k) / np.maximum(t, 1e-30) / tflops_to_flops(device.peak_tflops(dtype))
    return out


def grouped_gemm_fwd_bwd_s(
    m: ArrayOrFloat, n: ArrayOrFloat, k: ArrayOrFloat, experts: ArrayOrFloat, device: DeviceSpec, dtype: str, frozen: bool = False
) -> tuple[FloatArray, FloatArray]:
    """Forward and backward time (s) of ``experts`` equal GEMMs [m×k]·[k×n] run as one grouped
    GEMM (CUTLASS grouped GEMM / Transformer Engine ``GroupedLinear``: one launch, each expert's
    problem tiled on its own).  Each expert costs the roofline of its own shape
    (:func:`grouped_gemm_efficiency`), so few tokens per expert run at a low rate; backward is
    dX and dW per expert (:func:`cost_model.compute.gemm_fwd_bwd_time_s`; dX alone when ``frozen``)."""
    return gemm_fwd_bwd_time_s(m, n, k, device, dtype, batch=experts, frozen=frozen)


# ---- router, permutation ------------------------------------------------------------------------

#: fp32 bytes of a router logit / probability (Megatron-Core computes the routing softmax and
#: top-k in fp32: ``router.py`` upcasts the logits).
ROUTER_LOGIT_BYTES = 4.0


def router_time_s(tokens: ArrayOrFloat, hidden: float, num_experts: float, device: DeviceSpec, dtype: str,
                  frozen: bool = False) -> tuple[FloatArray, FloatArray]:
    """Forward and backward time (s) of the router of ``tokens`` tokens: the gate GEMM
    [T×h]·[h×E] and the memory-bound routing kernels on the T×E fp32 logits.

    Forward: upcast + softmax (read and write 4 B per logit), top-k (read 4 B), the
    load-balancing loss over the probabilities (read 4 B): 16 B per logit, 3 kernels.  Backward:
    softmax backward (read probabilities and gradient, write the gradient: 12 B) and the
    scatter of the top-k gradients into it (4 B): 16 B per logit, 2 kernels.  Megatron-Core
    ``TopKRouter`` (``moe/router.py``).  ``frozen``: the gate's dX alone (LoRA)."""
    g_fwd, g_bwd = gemm_fwd_bwd_time_s(tokens, num_experts, hidden, device, dtype, frozen=frozen)
    logits = _f(tokens) * num_experts
    fwd = g_fwd + memory_bound_time_s(16.0 * logits, device, kernels=3, transcendental_elements=logits)
    bwd = g_bwd + memory_bound_time_s(16.0 * logits, device, kernels=2)
    return fwd, bwd


def permute_bytes(tokens: ArrayOrFloat, top_k: float, received: ArrayOrFloat, hidden: float, eb: float, sort_received: ArrayOrFloat) -> tuple[FloatArray, FloatArray]:
    """HBM bytes (forward, backward) of moving one layer's tokens to and from the experts.

    Forward: ``permute`` gathers each token once per chosen expert into an expert-ordered buffer
    (read T·k rows, write T·k rows: 2·T·k·h·eb); after the dispatch, the received slots R are
    sorted by local expert (``sort_chunks_by_idxs``: 2·R·h·eb, when the rank holds several
    experts and receives from several ranks: ``sort_received`` 1) and unsorted before the
    combine (2·R·h·eb); ``unpermute`` reads the T·k expert outputs and writes the T
    probability-weighted sums ((T·k + T)·h·eb).  Backward moves the same bytes in reverse, plus
    the probabilities' gradient, which reads the expert outputs and their gradient
    (2·T·k·h·eb).  Megatron-Core ``moe_utils.permute`` / ``unpermute``."""
    T, R, s = _f(tokens), _f(received), _f(sort_received)
    fwd = (2.0 * T * top_k + T * (top_k + 1.0) + 4.0 * s * R) * hidden * eb
    bwd: FloatArray = fwd + 2.0 * T * top_k * hidden * eb
    return fwd, bwd


# ---- dispatch and combine ------------------------------------------------------------------------


def expected_nodes_hit(top_k: float, num_experts: float, nodes: ArrayOrFloat) -> FloatArray:
    """Expected number of distinct nodes among ``nodes`` (equal shares of the experts) that one
    token's k distinct experts fall on (dimensionless): nodes·(1 − C(E − E/nodes, k)/C(E, k))
    (hypergeometric: the chance that none of the k experts is on a given node)."""
    nodes = np.maximum(_f(nodes), 1.0)
    per_node = num_experts / nodes
    k = int(top_k)
    # C(E − e, k)/C(E, k) = Π_{i<k} (E − e − i)/(E − i), 0 when a factor is ≤ 0.
    miss = np.ones_like(nodes)
    for i in range(k):
        miss = miss * np.maximum(num_experts - per_node - i, 0.0) / (num_experts - i)
    out: FloatArray = nodes * (1.0 - miss)
    return out


def deepep_alltoall_time_s(
    slot_bytes: ArrayOrFloat, token_bytes: ArrayOrFloat, top_k: float, num_experts: float, n: ArrayOrFloat, per_node: ArrayOrFloat, links: Links
) -> FloatArray:
    """One DeepEP-style dispatch (or combine) over ``n`` EP ranks, ``per_node`` of them per node
    (s): ``slot_bytes`` = T·k·h·eb this rank sends in total, ``token_bytes`` = T·h·eb.

    DeepSeek-V3 §3.2.2 / DeepEP normal kernels: a token bound for several experts on one remote
    node crosses the network once (RDMA to the GPU of the same local index there), and is then
    forwarded over NVLink to the GPUs holding its experts; the RDMA and NVLink transfers run
    concurrently in one kernel.  Network bytes: T·h·eb × the expected remote nodes hit
    (:func:`expected_nodes_hit` minus the home node's share); NVLink bytes: every slot bound for
    another GPU, (1 − 1/n)·T·k·h·eb.  Time: the slower of the two, plus one latency per hop (2
    across nodes, 1 within).  Within a node it is the NVLink all-to-all with a single launch.
    """
    n = np.maximum(_f(n), 1.0)
    r = np.minimum(np.maximum(_f(per_node), 1.0), n)
    nodes = np.ceil(n / r)
    # Nodes are symmetric: the home node is hit as often as any other, so (nodes − 1)/nodes of
    # the expected nodes hit are remote.
    remote_nodes = expected_nodes_hit(top_k, num_experts, nodes) * (nodes - 1.0) / nodes
    t_net = remote_nodes * _f(token_bytes) / gbps_to_bytes_per_s(links.inter_GBps)
    t_nvl = (1.0 - 1.0 / n) * _f(slot_bytes) / gbps_to_bytes_per_s(links.intra_GBps)
    hops = np.where(nodes > 1, 2.0, 1.0)
    t = np.where(nodes > 1, np.maximum(t_net, t_nvl), t_nvl) + hops * links.alpha_s
    out: FloatArray = np.where(n > 1, t, 0.0)
    return out


def dispatch_time_s(
    dispatcher: str,
    tokens: ArrayOrFloat,
    top_k: float,
    num_experts: float,
    hidden: float,
    eb: float,
    ep: ArrayOrFloat,
    ep_per_node: ArrayOrFloat,
    links: Links,
    load_factor: ArrayOrFloat = 1.0,
) -> FloatArray:
    """One dispatch — or one combine, the same volume back — of ``tokens`` tokens over ``ep``
    ranks (s).  Forward runs a dispatch and a combine, backward their two gradients: 4 per layer.

    * ``alltoall`` (NCCL all-to-all: what Megatron-Core's MoE guide recommends with expert
      parallelism and its MoE recipes set; its CLI defaults to allgather): every (token, expert)
      slot is sent on its own: T·k·h·eb bytes per rank (:func:`cost_model.comm.alltoall_time_s`: the remote
      share over this GPU's NICs, the rest over NVLink), times the straggler ``load_factor`` —
      the slowest receiver sets the pace.
    * ``allgather``: all-gather the T·h tokens of the EP group (and reduce-scatter them back for
      the combine), each rank keeping the ones its experts chose: ep·T·h·eb gathered, independent
      of k (Megatron-Core ``allgather`` dispatcher; cheaper when k·ep is large relative to ep).
    * ``deepep``: :func:`deepep_alltoall_time_s` (node-deduplicated network traffic).
    """
    T = _f(tokens)
    slot_bytes = T * top_k * hidden * eb * _f(load_factor)
    if dispatcher == "allgather":
        n = _f(ep)
        return reduce_scatter_time_s(n, n * T * hidden * eb, links, ep_per_node)
    if dispatcher == "deepep":
        return deepep_alltoall_time_s(slot_bytes, T * hidden * eb * _f(load_factor), top_k, num_experts, ep, ep_per_node, links)
    return alltoall_time_s(ep, slot_bytes, links, ep_per_node)


# ---- one MoE FFN ---------------------------------------------------------------------------------


def local_tokens(tokens: ArrayOrFloat, tp: ArrayOrFloat, sequence_parallel: ArrayOrFloat) -> FloatArray:
    """Tokens a GPU routes and dispatches: T/t under sequence parallelism (or t = 1), else T
    (every TP rank holds the whole micro-batch)."""
    t = _f(tp)
    sp = np.asarray(sequence_parallel, dtype=bool)
    out: FloatArray = _f(tokens) / np.where(sp | (t == 1), t, 1.0)
    return out


def received_slots(local: ArrayOrFloat, top_k: float, load_factor: ArrayOrFloat, etp: ArrayOrFloat, sequence_parallel: ArrayOrFloat) -> FloatArray:
    """Token-slots this GPU's experts process per micro-batch: the T_loc·k it dispatches on
    average, times the straggler load factor, times ETP when the ETP ranks all-gather them
    (sequence parallelism; without it every ETP rank already holds them)."""
    sp = np.asarray(sequence_parallel, dtype=bool)
    out: FloatArray = _f(local) * top_k * _f(load_factor) * np.where(sp, _f(etp), 1.0)
    return out


def moe_activation_bytes(
    *,
    hidden: float,
    num_experts: float,
    top_k: float,
    shared_ffn_hidden: float,
    gated: bool,
    tokens: ArrayOrFloat,
    tp: ArrayOrFloat,
    cp: ArrayOrFloat,
    dp: ArrayOrFloat,
    ep: ArrayOrFloat,
    sequence_parallel: ArrayOrFloat,
    act_bytes: float,
    saved_input_bytes: float,
    capacity_factor: float | None = None,
    etp: ArrayOrFloat = 0.0,
    keeps_expert_outputs: bool = True,
) -> FloatArray:
    """Bytes an MoE FFN stores for backward per micro-batch beyond the dense FFN's terms
    (``layer_cost.activation_bytes`` already counts the layer input and the k experts' hidden
    T·k·f/t): the router's fp32 probabilities (T_loc·E·4, softmax backward), the permuted
    expert input R·h (FC1's saved input, ``saved_input_bytes`` per element: 1 under FP8), the
    expert outputs T_loc·k·h where the combine weights them by the router's probabilities
    (``keeps_expert_outputs``: the probabilities' gradient needs them — DeepSpeed's MoE
    ``combine_weights``, torchtitan's scores applied after the experts), and the shared experts'
    hidden (their activation input(s) and FC2 input, T·f_s/t each).  Megatron-Core weights the
    tokens inside the experts' activation instead (``activation_func_with_probs`` in
    ``moe/experts.py``: the gradient of the probabilities comes from FC1's output, already
    kept), so its combine is a pure permutation that keeps no tensor
    (``FrameworkRules.moe_probs_in_experts``); it keeps the rest for its autograd functions
    (``moe_utils.permute``, ``TopKRouter``)."""
    t = _f(tp)
    T = _f(tokens)
    T_loc = local_tokens(T, t, sequence_parallel)
    etp = expert_tensor_parallel(t, cp, dp, ep, etp)
    lf = expert_load_factor(T_loc * top_k, ep, capacity_factor)
    R = received_slots(T_loc, top_k, lf, etp, sequence_parallel)
    fm = 3.0 if gated else 2.0
    shared = T * shared_ffn_hidden / t * (act_bytes * (fm - 1.0) + saved_input_bytes)
    outputs = T_loc * top_k * hidden * act_bytes if keeps_expert_outputs else 0.0
    out: FloatArray = T_loc * num_experts * ROUTER_LOGIT_BYTES + R * hidden * saved_input_bytes + outputs + shared
    return out


@dataclass(frozen=True, kw_only=True)
class MoeFfnCost:
    """The FFN of one MoE decoder layer, per micro-batch on one GPU (arrays over candidates).

    ``gemm_*``: router, routed experts (grouped) and shared experts; ``elementwise_*``: routing
    kernels and token permutation; ``ffn_tp_one_s``: the FFN's tensor-parallel collectives of
    one pass (forward or backward), replacing the dense FFN's; ``ep_comm_s``: dispatch + combine
    of forward and backward (4 all-to-alls), ``ep_recompute_s``: the two more a recomputed
    forward runs; ``flops``: forward model FLOPs; ``load_factor``: the slowest EP rank's share
    over the mean."""

    gemm_fwd_s: FloatArray
    gemm_bwd_s: FloatArray
    elementwise_fwd_s: FloatArray
    elementwise_bwd_s: FloatArray
    ffn_tp_one_s: FloatArray
    ep_comm_s: FloatArray
    ep_recompute_s: FloatArray
    flops: FloatArray
    load_factor: FloatArray
    #: each local expert's tokens (its GEMMs' M, at the slowest rank's load), the local experts
    #: and the experts' tensor-parallel size — what LoRA's adapters on them are costed over
    expert_tokens: FloatArray
    local_experts: FloatArray
    etp: FloatArray


def moe_ffn_costs(
    *,
    hidden: float,
    ffn_hidden: float,
    gated: bool,
    num_experts: float,
    top_k: float,
    shared_ffn_hidden: float,
    tokens: ArrayOrFloat,
    tp: ArrayOrFloat,
    cp: ArrayOrFloat,
    dp: ArrayOrFloat,
    ep: ArrayOrFloat,
    sequence_parallel: ArrayOrFloat,
    device: DeviceSpec,
    links: Links,
    dtype: str,
    act_bytes: float,
    dispatcher: str = "alltoall",
    capacity_factor: float | None = None,
    ep_per_node: ArrayOrFloat | None = None,
    etp: ArrayOrFloat = 0.0,
    frozen: bool = False,
) -> MoeFfnCost:
    """Cost of one MoE FFN (module docstring; each term's formula in its function).

    Tokens: ``tokens`` = T per tensor-parallel group; the router, the permutation and the
    dispatch work on T_loc = T/t under sequence parallelism (T without it: every TP rank holds
    them all).  Experts: E/ep per EP rank, M = :func:`tokens_per_expert` × load factor tokens
    each, width f/etp.  With ETP > 1 and sequence parallelism the received slots are
    all-gathered over the ETP ranks before the experts and reduce-scattered after (Megatron-Core
    ``MoEAlltoAllTokenDispatcher``), so the FFN's TP collective moves T·k·h instead of the
    dense layer's T·h; with ETP = 1 the experts need none.  Shared experts run tensor-parallel
    on the full T tokens like a dense FFN (one all-gather + reduce-scatter, or all-reduce, of
    T·h per pass).  ``ep_per_node``: EP ranks per node when the ranks are not in Megatron's
    order (a topology's nesting order; default: ep ranks etp apart).  ``etp``: a pinned ETP
    (:func:`expert_tensor_parallel`; 0: the default rule).  ``frozen``: no weight trains (LoRA),
    so every GEMM's backward is its dX alone.
    """
    t, c, d, e = _f(tp), _f(cp), _f(dp), _f(ep)
    sp = np.asarray(sequence_parallel, dtype=bool)
    T = _f(tokens)
    fm = 3.0 if gated else 2.0
    etp = expert_tensor_parallel(t, c, d, e, etp)
    T_loc = local_tokens(T, t, sp)
    lf = expert_load_factor(T_loc * top_k, e, capacity_factor)
    M = tokens_per_expert(T, top_k, num_experts, e, etp, t) * lf
    e_local = num_experts / e
    fc1_f, fc1_b = grouped_gemm_fwd_bwd_s(M, (fm - 1.0) * ffn_hidden / etp, hidden, e_local, device, dtype, frozen=frozen)
    fc2_f, fc2_b = grouped_gemm_fwd_bwd_s(M, hidden, ffn_hidden / etp, e_local, device, dtype, frozen=frozen)
    r_f, r_b = router_time_s(T_loc, hidden, num_experts, device, dtype, frozen=frozen)
    gemm_fwd = fc1_f + fc2_f + r_f
    gemm_bwd = fc1_b + fc2_b + r_b
    # Forward FLOPs at the mean load (model FLOPs: the router and k experts per token).
    flops = 2.0 * T * top_k * fm * hidden * ffn_hidden / t + 2.0 * T_loc * hidden * num_experts
    gpn = links.gpus_per_node
    tp_per_node = np.minimum(t, gpn)
    shared_one: FloatArray = np.zeros_like(T)
    if shared_ffn_hidden:
        s1f, s1b = gemm_fwd_bwd_time_s(T, (fm - 1.0) * shared_ffn_hidden / t, hidden, device, dtype, frozen=frozen)
        s2f, s2b = gemm_fwd_bwd_time_s(T, hidden, shared_ffn_hidden / t, device, dtype, frozen=frozen)
        gemm_fwd, gemm_bwd = gemm_fwd + s1f + s2f, gemm_bwd + s1b + s2b
        flops = flops + 2.0 * T * fm * hidden * shared_ffn_hidden / t
        msg = T * hidden * act_bytes
        shared_one = np.where(sp, 2.0 * reduce_scatter_time_s(t, msg, links, tp_per_node), allreduce_time_s(t, msg, links, tp_per_node))
    received = received_slots(T_loc, top_k, lf, etp, sp)
    sort_received = ((e > 1) & (e_local > 1)).astype(float)
    p_fwd, p_bwd = permute_bytes(T_loc, top_k, received, hidden, act_bytes, sort_received)
    elem_fwd = memory_bound_time_s(p_fwd, device, kernels=2.0 + 2.0 * sort_received)
    elem_bwd = memory_bound_time_s(p_bwd, device, kernels=3.0 + 2.0 * sort_received)
    # ETP all-gather of the received slots (and reduce-scatter after the experts), per pass.
    etp_per_node = np.minimum(etp, gpn)
    etp_one = np.where(sp & (etp > 1), 2.0 * reduce_scatter_time_s(etp, received * hidden * act_bytes, links, etp_per_node), 0.0)
    # Without SP and with TP, the experts' partial sums over the ETP ranks are all-reduced as a
    # dense FFN's are (on the T combined tokens).
    no_sp = np.where(~sp & (etp > 1), allreduce_time_s(etp, T * hidden * act_bytes, links, etp_per_node), 0.0)
    ep_per_node = ranks_per_node(e, etp, gpn) if ep_per_node is None else _f(ep_per_node)
    one = dispatch_time_s(dispatcher, T_loc, top_k, num_experts, hidden, act_bytes, e, ep_per_node, links, lf)
    return MoeFfnCost(
        gemm_fwd_s=gemm_fwd,
        gemm_bwd_s=gemm_bwd,
        elementwise_fwd_s=elem_fwd,
        elementwise_bwd_s=elem_bwd,
        ffn_tp_one_s=shared_one + etp_one + no_sp,
        ep_comm_s=4.0 * one,
        ep_recompute_s=2.0 * one,
        flops=flops,
        load_factor=lf,
        expert_tokens=M,
        local_experts=np.broadcast_to(e_local, np.shape(M)),
        etp=np.broadcast_to(etp, np.shape(M)),
    )


__all__ = [
    "MOE_DISPATCHERS",
    "MoeFfnCost",
    "deepep_alltoall_time_s",
    "dispatch_time_s",
    "dropless_load_factor",
    "expected_nodes_hit",
    "expert_data_parallel",
    "expert_load_factor",
    "expert_tensor_parallel",
    "grouped_gemm_efficiency",
    "grouped_gemm_fwd_bwd_s",
    "local_tokens",
    "moe_activation_bytes",
    "moe_ffn_costs",
    "received_slots",
    "permute_bytes",
    "router_time_s",
    "tokens_per_expert",
]
