"""Lower bounds on the step time of one mesh, valid for every per-op sharding and every
contiguous stage split, so that a layout can be dropped with proof and the search can say how
far its answer is from the optimum.

From the step time of :func:`cost_model.graph.evaluate.evaluate` (``pp`` GPU stages, plus a CPU
parameter-server stage when tables live there; ``n`` counts both)::

    step = (m − 1)·max_k T_k + Σ_k T_k + max_k D_k + max_k O_k + c
    max_k T_k ≥ Σ_gpu T_k / pp,     max_k O_k ≥ Σ_k O_k / n,
    max_k D_k ≥ max(0, Σ_k D_k / pp),  D_k ≥ sync_k − (w + pp − 1)·bwd_k

(or ``max_k T_k ≥ Σ_all T_k / n`` with the CPU stage), so with ``α = (m − 1)/pp + 1`` and
per-op terms ``a = α·gpu time + cpu time + opt/n`` (or ``((m − 1)/n + 1)·time + opt/n``) and
``b = (sync − (w + pp − 1)·bwd)/pp``, ``step − c ≥ Σ a`` and ``step − c ≥ Σ (a + b)``; each sum
is separable over the operators, so its minimum over all assignments is the sum of per-op
minima.  An op's time includes its incoming resharding, bounded below by the cheapest producer
choice for each of its own choices (every edge is charged to its consumer once); the stages'
p2p sends add at least the cheapest crossing of each boundary (:func:`p2p_lower_bound_s`).
Memory enters as a Lagrangian term: for any λ ≥ 0, ``min Σ (a + λ·mem) − λ·pp·capacity`` is a
bound (``mem`` with the least in-flight count; rows that alone exceed a GPU are no choice).
Pipelines also get :func:`_pipeline_bound`: the least bottleneck of a contiguous split under
each stage's own 1F1B memory.  The largest of these bounds is returned.
"""

from __future__ import annotations

import math

import numpy as np

from cost_model.graph.evaluate import _OPTIMIZER_STEP_KERNELS
from cost_model.graph.mesh import inflight
from cost_model.graph.tables import CostTables, p2p_boundary_vector, position_crossing_bytes
from cost_model.transformer.layer_cost import FRAGMENTATION_FRACTION, WORKSPACE_BYTES, dp_overlap_fraction

#: Bisection steps of the pipeline bound's bottleneck (2^-30 of the range).
PIPELINE_BISECTIONS = 30
#: Multipliers of the memory constraint tried per round (log-spaced, then linear around the best).
LAMBDA_GRID = 12


def incoming_edge_min_s(tables: CostTables) -> np.ndarray:
    """Per row, seconds per micro-batch: the least resharding into it over its producers' choices."""
    out = np.zeros(len(tables.fwd_s))
    memo: dict[tuple[int, int], np.ndarray | None] = {}  # edges of repeated layers share their matrices
    for e, (_u, v, _, _) in enumerate(tables.edges):
        f, b = tables.edge_fwd_s[e], tables.edge_bwd_s[e]
        key = (id(f), id(b))
        if key not in memo:
            E = f + b
            memo[key] = E.min(axis=0) if E.size and E.any() else None
        col = memo[key]
        if col is not None:
            r0 = int(tables.row_start[v])
            out[r0:r0 + len(col)] += col
    return out


def mesh_lower_bound_s(tables: CostTables, headroom_fraction: float, edge_min: np.ndarray | None = None) -> float:
    """A lower bound (seconds) on the step time of any assignment of ``tables.mesh`` that fits
    (module docstring); ``inf`` when some operator has no choice that fits a GPU."""
    mesh = tables.mesh
    m, pp = mesh.num_microbatches, mesh.pp
    n = pp + (1 if mesh.cpu is not None and len(tables.cpu_rows) else 0)
    alpha = (m - 1) / pp + 1.0
    if edge_min is None:
        edge_min = incoming_edge_min_s(tables)
    time = tables.fwd_s + tables.bwd_s + tables.comm_fwd_s + tables.comm_bwd_s + edge_min + tables.cpu_s + tables.cpu_comm_s
    opt = tables.opt_s + tables.cpu_opt_s
    window = dp_overlap_fraction(tables.training, mesh.device)
    # the CPU parameter-server stage is one more pipeline stage, but the bottleneck is at least
    # the GPU stages' average: (m − 1)·max ≥ (m − 1)·Σ gpu / pp, and the CPU time counts once
    cpu_time = tables.cpu_s + tables.cpu_comm_s
    a = alpha * (time - cpu_time) + cpu_time + opt / n
    b = (tables.sync_s - (window + pp - 1) * tables.bwd_s) / pp
    starts = tables.row_start[:-1]
    fl_min = min(inflight(mesh, k) for k in range(pp))
    state = tables.weights_bytes + tables.gradients_bytes + tables.optimizer_state_bytes
    mem = (state + fl_min * tables.activation_bytes) * (1 + FRAGMENTATION_FRACTION)
    cap = mesh.device.memory_bytes * (1.0 - headroom_fraction) - WORKSPACE_BYTES
    if cap <= 0:
        return math.inf
    mem = np.where(mem > cap * (1 + 1e-9), np.inf, mem)  # a row that alone does not fit is no choice
    if float(np.minimum.reduceat(mem, starts).sum()) > pp * cap * (1 + 1e-9):
        return math.inf
    constant = _OPTIMIZER_STEP_KERNELS * mesh.device.efficiency.kernel_overhead_s
    p2p = p2p_lower_bound_s(tables) if pp > 1 else 0.0
    bound = max(_lagrangian_bound(a, mem, starts, pp * cap), _lagrangian_bound(a + b, mem, starts, pp * cap)) + alpha * p2p
    if n > pp:  # or the bottleneck is at least the average over all n stages, the CPU one included
        alpha_n = (m - 1) / n + 1.0
        a_n = alpha_n * time + opt / n
        bound = max(bound, max(_lagrangian_bound(a_n, mem, starts, pp * cap),
                               _lagrangian_bound(a_n + b, mem, starts, pp * cap)) + alpha_n * p2p)
    if pp > 1:
        gpu_time = time - tables.cpu_s - tables.cpu_comm_s  # the CPU stage's share is not on a GPU stage
        bound = max(bound, _pipeline_bound(tables, gpu_time, time, opt, state, cap, n, p2p))
    return bound + constant


def p2p_lower_bound_s(tables: CostTables) -> float:
    """Least p2p seconds per micro-batch summed over the stages: every boundary k|k+1 sits at
    some chain start and is paid by both its stages, at least the cheapest crossing there."""
    an = tables.analysis
    starts = np.flatnonzero(an.chain_start)
    starts = starts[starts > 0]
    if not len(starts):
        return 0.0
    crossing = position_crossing_bytes(tables)[starts]
    return float(sum(2.0 * float(p2p_boundary_vector(tables, crossing, k).min()) for k in range(tables.mesh.pp - 1)))


def _pipeline_bound(tables: CostTables, time: np.ndarray, any_time: np.ndarray, opt: np.ndarray, state: np.ndarray,
                    cap: float, n: int, p2p: float) -> float:
    """``(m − 1)·T* + Σ time_min + p2p + O*`` (``p2p``: :func:`p2p_lower_bound_s`): every GPU stage's time is at least the sum of its
    operators' least times (``time``), so the bottleneck is at least ``T*``, the smallest
    bottleneck of a contiguous split (at chain starts) of those least times in which every
    stage k also holds its operators' least memory with its 1F1B in-flight count (``state +
    inflight(k)·act``) — and at least any one operator's least time on the stage it runs on,
    GPU or CPU (``any_time``).  For a given T the greedy split (each stage as long as allowed)
    is feasible whenever any split is, so T* is found by bisection.  The optimizer step O* is at
    least the average stage's and any one operator's least update."""
    mesh = tables.mesh
    m, pp = mesh.num_microbatches, mesh.pp
    starts = tables.row_start[:-1]
    an = tables.analysis
    chain_of_op = an.chain_id[an.position]  # op -> chain (chains are contiguous in the order)
    n_chains = int(an.chain_id.max()) + 1

    def per_chain(per_op: np.ndarray) -> np.ndarray:
        cum: np.ndarray = np.concatenate([[0.0], np.cumsum(np.bincount(chain_of_op, weights=per_op, minlength=n_chains))])
        return cum

    t_op = np.minimum.reduceat(time, starts)
    cum_t = per_chain(t_op)
    cum_mem = [per_chain(np.minimum.reduceat((state + inflight(mesh, k) * tables.activation_bytes) * (1 + FRAGMENTATION_FRACTION),
                                             starts)) for k in range(pp)]

    def fits(T: float) -> bool:
        pos = 0
        for k in range(pp):
            end_t = int(np.searchsorted(cum_t, cum_t[pos] + T * (1 + 1e-12), side="right")) - 1
            end_m = int(np.searchsorted(cum_mem[k], cum_mem[k][pos] + cap * (1 + 1e-9), side="right")) - 1
            pos = max(pos, min(end_t, end_m))
            if pos >= n_chains:
                return True
        return False

    total = float(cum_t[-1])
    lo, hi = total / pp, total
    if not fits(hi):
        return math.inf
    for _ in range(PIPELINE_BISECTIONS):
        mid = 0.5 * (lo + hi)
        if fits(mid):
            hi = mid
        else:
            lo = mid
    per_op_opt = np.minimum.reduceat(opt, starts)
    o_star = max(float(per_op_opt.sum()) / n, float(per_op_opt.max()))
    t_star = max(lo, (total + p2p) / pp, float(np.minimum.reduceat(any_time, starts).max()))
    return (m - 1) * t_star + total + p2p + o_star


def _lagrangian_bound(cost: np.ndarray, mem: np.ndarray, starts: np.ndarray, capacity: float) -> float:
    """``max_λ≥0 Σ_op min_c (cost + λ·mem) − λ·capacity`` over a grid of λ (each value is a lower
    bound on ``min Σ cost`` subject to ``Σ mem ≤ capacity``; λ = 0 is the plain bound)."""
    finite = np.isfinite(mem)
    c = np.where(finite, cost, np.inf)
    m = np.where(finite, mem, 0.0)
    sizes = np.diff(np.append(starts, len(c)))
    single = np.repeat(sizes == 1, sizes)  # ops with one choice: linear in λ, summed once
    c1, m1 = float(c[single].sum()), float(m[single].sum())
    multi_starts = np.flatnonzero(np.repeat(sizes > 1, sizes)[starts])
    cm, mm = c[~single], m[~single]
    sub_starts = np.concatenate([[0], np.cumsum(sizes[multi_starts])[:-1]]).astype(np.int64) if len(multi_starts) else None

    def values(lams: np.ndarray) -> np.ndarray:
        out: np.ndarray = c1 + lams * (m1 - capacity)
        if sub_starts is not None:
            out = out + np.minimum.reduceat(cm[:, None] + mm[:, None] * lams[None, :], sub_starts, axis=0).sum(axis=0)
        return out

    base = float(values(np.zeros(1))[0])
    if sub_starts is None or m1 + _least_memory_at_min(cm, mm, sub_starts) <= capacity:
        return base  # a cheapest assignment fits: λ = 0 is the best multiplier
    scale = base / max(capacity, 1.0)
    # a coarse log grid, then a finer one around its best (the dual is concave in λ)
    coarse = scale * np.logspace(-3, 2, LAMBDA_GRID)
    vc = values(coarse)
    k = int(np.argmax(vc))
    fine = np.linspace(coarse[max(k - 1, 0)], coarse[min(k + 1, len(coarse) - 1)], LAMBDA_GRID)
    return float(max(base, float(vc.max()), float(values(fine).max())))


def _least_memory_at_min(c: np.ndarray, m: np.ndarray, starts: np.ndarray) -> float:
    """Σ over ops of the least memory among the op's cheapest rows."""
    sizes = np.diff(np.append(starts, len(c)))
    cmin = np.repeat(np.minimum.reduceat(c, starts), sizes)
    return float(np.minimum.reduceat(np.where(c <= cmin, m, np.inf), starts).sum())
