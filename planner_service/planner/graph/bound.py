"""Lower bounds on the step time of one mesh, valid for every per-op sharding and every
contiguous stage split, so that a layout can be dropped with proof and the search can say how
far its answer is from the optimum.

From the step time of :func:`cost_model.graph.evaluate.evaluate` (``pp`` GPU stages, plus a CPU
parameter-server stage when tables live there; ``n`` counts both)::

    step = (m − 1)·max_k T_k + Σ_k T_k + max_k D_k + max_k O_k + c
    max_k T_k ≥ Σ_gpu T_k / pp,     max_k O_k ≥ Σ_gpu O_k / pp,
    max_k D_k ≥ max(0, Σ_k D_k / pp),  D_k ≥ sync_k − (w + pp − 1)·bwd_k

(with the CPU stage, ``max_k T_k ≥ μ·Σ_gpu T_k / pp + (1 − μ)·T_cpu`` for every μ in [0, 1],
a grid :data:`CPU_STAGE_MIXES` of them), so with ``α = (m − 1)·μ/pp + 1`` and per-op terms
``a = α·gpu time + ((m − 1)·(1 − μ) + 1)·cpu time + ν·gpu opt/pp + (1 − ν)·cpu opt`` (the
optimizer step, ``max(max_k O_k, O_cpu)``, mixed alike; μ = ν = 1 without a CPU stage) and
``b = (sync − (w + pp − 1)·bwd)/pp``, ``step − c ≥ Σ a`` and ``step − c ≥ Σ (a + b)``; each sum
is separable over the operators, so its minimum over all assignments is the sum of per-op
minima.  An op's time includes its incoming resharding, bounded below by the cheapest producer
choice for each of its own choices (every edge is charged to its consumer once); the stages'
p2p sends add at least the cheapest crossing of each boundary (:func:`p2p_lower_bound_s`).
Memory enters as a Lagrangian term: for any λ ≥ 0, ``min Σ (a + λ·mem) − λ·pp·capacity`` is a
bound (``mem`` with the least in-flight count; rows that alone exceed a GPU are no choice).
Pipelines also get :func:`_pipeline_bound`: the least bottleneck of a contiguous split under
each stage's own 1F1B memory.  The largest of these bounds is returned.

The terms summed over *every* operator (``Σ a``, the pipeline's ``Σ_k T_k``) may take the
resharding from a tighter source, :func:`reparametrised_edge_s`: a dual (message-passing)
bound of the whole graph's resharding that agrees producers' and consumers' layouts along
chains, where the per-consumer minimum lets each consumer pick its producer's layout alone.
It is valid only for sums over all operators; per-stage terms keep the per-consumer minimum.

Memory per GPU is what :func:`cost_model.graph.evaluate.evaluate` checks: ``(1 + f)·(weights +
gradients + in-flight activations) + optimizer state + workspace`` (the optimizer state,
allocated once, does not fragment: :func:`cost_model.transformer.memory.static_for_fragmentation`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from cost_model.graph.evaluate import _OPTIMIZER_STEP_KERNELS
from cost_model.graph.mesh import fixed_bytes, inflight
from cost_model.graph.tables import CostTables, p2p_boundary_vector, position_crossing_bytes
from cost_model.transformer.layer_cost import dp_overlap_fraction, fragmentation_fraction
from cost_model.transformer.memory import static_for_fragmentation

#: Bisection steps of the pipeline bound's bottleneck (2^-30 of the range).
PIPELINE_BISECTIONS = 30
#: Multipliers of the memory constraint tried per round (log-spaced, then linear around the best).
LAMBDA_GRID = 12
#: Weights μ of the GPU stages' average against the CPU parameter-server stage in the
#: bottleneck bound (module docstring).
CPU_STAGE_MIXES = tuple(float(x) for x in np.linspace(0.0, 1.0, 6))
#: Memory multipliers of the pipeline bound's per-stage test (log-spaced, × a stage's average
#: time per byte of capacity), beside time alone and memory alone.
PIPELINE_LAMBDAS = np.logspace(-1.5, 1.5, 10)


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


def reparametrised_edge_s(tables: CostTables, op_time_s: np.ndarray) -> np.ndarray:
    """Per row, seconds per micro-batch: a share ``r`` of the resharding such that, for every
    assignment ``c``, ``Σ_v (op_time_s + r)[v, c_v] ≤ Σ_v op_time_s[v, c_v] + Σ_e E_e(c_u, c_v)``
    — a lower bound on the whole graph's time, *not* on any one stage's.

    Dual decomposition of the min-sum labelling (Wainwright, Jaakkola & Willsky 2005; Sontag,
    Globerson & Jaakkola 2011, "Introduction to dual decomposition for inference", §1.5): each
    operator v with its incoming edges is one subproblem; a multiplier vector φ_e on the
    producer's choice of every edge e = (u → v) moves cost between u's subproblem (``+φ_e``) and
    v's (``min_a E_e(a, ·) − φ_e(a)``), which leaves the sum's minimum a lower bound for any φ
    (the φ terms cancel on every assignment, and the inner minimum is ≤ the chosen pair).  One
    forward pass in topological order chooses φ: operator u's belief ``B_u = op_time_s[u] +
    Σ_in min_a (E − φ)`` is handed, less its minimum, in equal shares to its consumers
    (``φ_e = −(B_u − min B_u)/outdeg``) — on a chain this is the exact dynamic programme, on a
    fork each branch sees its share of the producer's choice.  ``op_time_s`` is the per-row time
    the sum is taken of (the edges' coefficient in the bound must be the same as its)."""
    n = tables.graph.num_ops
    rs = tables.row_start
    if not bool((np.diff(rs) > 1).any()):
        return incoming_edge_min_s(tables)  # one choice per operator: nothing to agree on
    out_edges: list[list[int]] = [[] for _ in range(n)]
    in_edges: list[list[int]] = [[] for _ in range(n)]
    for e, (u, v, _, _) in enumerate(tables.edges):
        out_edges[u].append(e)
        in_edges[v].append(e)
    phi: list[np.ndarray | None] = [None] * len(tables.edges)  # None: all zero
    col_min: dict[tuple[int, int], np.ndarray] = {}  # edges of repeated layers share their matrices
    edge_s = np.zeros(len(op_time_s))
    for v in tables.analysis.order.tolist():
        r0, r1 = int(rs[v]), int(rs[v + 1])
        inc = np.zeros(r1 - r0)
        for e in in_edges[v]:
            f, b = tables.edge_fwd_s[e], tables.edge_bwd_s[e]
            ph = phi[e]
            if ph is None:
                key = (id(f), id(b))
                if key not in col_min:
                    col_min[key] = (f + b).min(axis=0)
                inc += col_min[key]
            else:
                inc += (f + b - ph[:, None]).min(axis=0)
        outs = out_edges[v]
        if outs and r1 - r0 > 1:
            belief = op_time_s[r0:r1] + inc
            share = (belief - belief.min()) / len(outs)
            for e in outs:
                phi[e] = -share
            edge_s[r0:r1] = inc - share * len(outs)
        else:
            edge_s[r0:r1] = inc
    return edge_s


def mesh_lower_bound_s(tables: CostTables, headroom_fraction: float, edge_min: np.ndarray | None = None,
                       edge_total: np.ndarray | None = None) -> float:
    """A lower bound (seconds) on the step time of any assignment of ``tables.mesh`` that fits
    (module docstring); ``inf`` when some operator has no choice that fits a GPU.  ``edge_min``
    (:func:`incoming_edge_min_s`) and ``edge_total`` (:func:`reparametrised_edge_s` of the GPU
    time) are computed from the tables' edges when not given."""
    mesh = tables.mesh
    m, pp = mesh.num_microbatches, mesh.pp
    n = pp + (1 if mesh.cpu is not None and len(tables.cpu_rows) else 0)
    if edge_min is None:
        edge_min = incoming_edge_min_s(tables)
    own = tables.fwd_s + tables.bwd_s + tables.comm_fwd_s + tables.comm_bwd_s
    if edge_total is None:
        edge_total = reparametrised_edge_s(tables, own) if tables.edges else edge_min
    stage_time = own + edge_min + tables.cpu_s + tables.cpu_comm_s  # valid per stage
    opt = tables.opt_s + tables.cpu_opt_s
    window = dp_overlap_fraction(tables.training, mesh.device, pp)
    b = (tables.sync_s - (window + pp - 1) * tables.bwd_s) / pp
    starts = tables.row_start[:-1]
    fl_min = min(inflight(mesh, k) for k in range(pp))
    state = static_for_fragmentation(tables.weights_bytes, tables.gradients_bytes, tables.optimizer_state_bytes, tables.training.framework)
    mem = (state + fl_min * tables.activation_bytes) * (1 + fragmentation_fraction())
    cap = mesh.device.memory_bytes * (1.0 - headroom_fraction) - fixed_bytes(tables.training, mesh)
    if cap <= 0:
        return math.inf
    mem = np.where(mem > cap * (1 + 1e-9), np.inf, mem)  # a row that alone does not fit is no choice
    if float(np.minimum.reduceat(mem, starts).sum()) > pp * cap * (1 + 1e-9):
        return math.inf
    constant = _OPTIMIZER_STEP_KERNELS * mesh.device.efficiency.kernel_overhead_s
    b_min = p2p_boundary_min_s(tables)
    p2p = 2.0 * float(b_min.sum())  # p2p_lower_bound_s
    cpu_time = tables.cpu_s + tables.cpu_comm_s
    bound = 0.0
    # The bottleneck is at least any mix μ·(the GPU stages' average) + (1 − μ)·(the CPU stage):
    # (m − 1)·max ≥ (m − 1)·(μ·Σ gpu / pp + (1 − μ)·cpu); likewise the optimizer step with ν;
    # μ = ν = 1 without a CPU stage.
    mixes = np.array(CPU_STAGE_MIXES if n > pp else (1.0,))
    mu, nu = (x.ravel() for x in np.meshgrid(mixes, mixes, indexing="ij"))
    c_gpu, c_cpu = 1.0 + (m - 1) * mu / pp, 1.0 + (m - 1) * (1.0 - mu)
    # Both edge sources give a bound on the sum (the per-consumer minimum keeps each row's own
    # time-memory trade, the reparametrisation the agreement along chains): the larger holds.
    for edges_s in (edge_min, edge_total) if edge_total is not edge_min else (edge_min,):
        gpu_time = own + edges_s
        if len(mu) == 1:
            a = gpu_time * c_gpu[0] + cpu_time * c_cpu[0] + tables.opt_s / pp
            bound = max(bound, _lagrangian_bound(a, mem, starts, pp * cap) + c_gpu[0] * p2p,
                        _lagrangian_bound(a + b, mem, starts, pp * cap) + c_gpu[0] * p2p)
            continue
        a_all = (gpu_time[:, None] * c_gpu + cpu_time[:, None] * c_cpu + tables.opt_s[:, None] * (nu / pp)
                 + tables.cpu_opt_s[:, None] * (1.0 - nu))
        values = _lagrangian_bounds(np.concatenate([a_all, a_all + b[:, None]], axis=1), mem, starts, pp * cap)
        bound = max(bound, float((values + np.tile(c_gpu, 2) * p2p).max()))
    if pp > 1:
        # the CPU stage's share is not on a GPU stage
        gpu_total = float(np.minimum.reduceat(own + edge_total, starts).sum())
        o_floor = max(float(np.minimum.reduceat(tables.opt_s, starts).sum()) / pp,
                      float(np.minimum.reduceat(tables.cpu_opt_s, starts).sum()))
        bound = max(bound, _pipeline_bound(tables, own + edge_min, stage_time, opt, state, cap, n, b_min, gpu_total, o_floor))
    return bound + constant


def p2p_boundary_min_s(tables: CostTables) -> np.ndarray:
    """Per boundary k|k+1, the least p2p seconds per micro-batch of one crossing: it sits at
    some chain start, at least the cheapest crossing there."""
    an = tables.analysis
    starts = np.flatnonzero(an.chain_start)
    starts = starts[starts > 0]
    pp = tables.mesh.pp
    if not len(starts) or pp < 2:
        return np.zeros(max(pp - 1, 0))
    crossing = position_crossing_bytes(tables)[starts]
    return np.array([float(p2p_boundary_vector(tables, crossing, k).min()) for k in range(pp - 1)])


def p2p_lower_bound_s(tables: CostTables) -> float:
    """Least p2p seconds per micro-batch summed over the stages: every boundary is paid by both
    its stages, at least its cheapest crossing (:func:`p2p_boundary_min_s`)."""
    return 2.0 * float(p2p_boundary_min_s(tables).sum())


def _pipeline_bound(tables: CostTables, time: np.ndarray, any_time: np.ndarray, opt: np.ndarray, state: np.ndarray,
                    cap: float, n: int, b_min: np.ndarray, gpu_total: float = 0.0, o_floor: float = 0.0) -> float:
    """``(m − 1)·T* + Σ time_min + p2p + O*`` (``p2p``: :func:`p2p_lower_bound_s`, from the
    boundaries' least crossings ``b_min`` of :func:`p2p_boundary_min_s`; ``Σ time_min``
    the larger of the sum of the operators' least times and ``gpu_total``, a bound on the GPU
    stages' whole time): every GPU stage's time is at least the sum of its operators' least
    times (``time``), so the bottleneck is at least ``T*``, the smallest bottleneck of a
    contiguous split (at chain starts) in which every stage k can hold its operators with its
    1F1B in-flight count (``state + inflight(k)·act``) within time T and the capacity.  A stage
    that can, does so for some choice c of its operators, so for every λ ≥ 0
    ``Σ_op min_c (time + λ·mem_k) ≤ T + λ·capacity`` (λ = 0: time alone; λ → ∞: memory alone);
    the test asks this for a grid of λ (:data:`PIPELINE_LAMBDAS`).  Each test only gets harder
    as a stage grows, so for a given T the greedy split (each stage as long as allowed) passes
    whenever any split does, and T* is found by bisection.  T* is also at least any one
    operator's least time on the stage it runs on, GPU or CPU (``any_time``), and the average
    stage's.  The optimizer step O* is at least the average stage's, any one operator's
    least update and ``o_floor`` (the GPU stages' average, or the CPU stage's)."""
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
    total = float(cum_t[-1])
    mem_k = [(state + inflight(mesh, k) * tables.activation_bytes) * (1 + fragmentation_fraction()) for k in range(pp)]
    cum_mem = [per_chain(np.minimum.reduceat(mk, starts)) for mk in mem_k]
    # stage k's time also holds its boundaries' p2p, at least their cheapest crossings
    p2p = 2.0 * float(b_min.sum())
    stage_p2p = np.zeros(pp)
    stage_p2p[:-1] += b_min
    stage_p2p[1:] += b_min
    mix: list[list[tuple[float, np.ndarray]]] = []  # per stage: (λ, prefix sums of min(time + λ·mem))

    def greedy_split(T_all: float) -> list[tuple[int, int]] | None:
        """Each stage as long as the tests allow: its (first, end) chains, None if short."""
        pos, out = 0, []
        for k in range(pp):
            T = T_all - stage_p2p[k]
            end = int(np.searchsorted(cum_t, cum_t[pos] + T * (1 + 1e-12), side="right")) - 1
            end = min(end, int(np.searchsorted(cum_mem[k], cum_mem[k][pos] + cap * (1 + 1e-9), side="right")) - 1)
            for lam, cum in mix[k] if mix else ():
                end = min(end, int(np.searchsorted(cum, cum[pos] + (T + lam * cap) * (1 + 1e-9), side="right")) - 1)
            out.append((pos, max(pos, end)))
            pos = max(pos, end)
            if pos >= n_chains:
                return out
        return None

    def fits(T_all: float) -> bool:
        return greedy_split(T_all) is not None

    def least_bottleneck(lo: float, hi: float) -> tuple[float, float]:
        for _ in range(64):  # the λ tests can fail at T = total, where memory is short
            if fits(hi):
                break
            lo, hi = hi, 2.0 * hi
        for _ in range(PIPELINE_BISECTIONS):
            mid = 0.5 * (lo + hi)
            if fits(mid):
                hi = mid
            else:
                lo = mid
        return lo, hi

    if not fits(math.inf):
        return math.inf  # no split holds the memory
    lo, hi = least_bottleneck(total / pp, max(total, 1e-12))  # time alone and memory alone
    if bool((np.diff(tables.row_start) > 1).any()) and not _fastest_rows_fit(greedy_split(hi), time, mem_k, starts,
                                                                             per_chain, cap):
        # with a choice of sharding, time and memory trade: the λ tests (λ in seconds per byte:
        # an average stage's time per capacity, times the grid); they only make T* larger
        lams = PIPELINE_LAMBDAS * (total / pp) / cap
        mix.extend([(float(lam), per_chain(np.minimum.reduceat(time + lam * mk, starts))) for lam in lams] for mk in mem_k)
        if not fits(hi):
            lo, hi = least_bottleneck(hi, hi)
    per_op_opt = np.minimum.reduceat(opt, starts)
    o_star = max(float(per_op_opt.sum()) / n, float(per_op_opt.max()), o_floor)
    total = max(total, gpu_total)
    t_star = max(lo, (total + p2p) / pp, float(np.minimum.reduceat(any_time, starts).max()))
    return (m - 1) * t_star + total + p2p + o_star


def _fastest_rows_fit(split: list[tuple[int, int]] | None, time: np.ndarray, mem_k: list[np.ndarray], starts: np.ndarray,
                      per_chain: Callable[[np.ndarray], np.ndarray], cap: float) -> bool:
    """Whether every stage of ``split`` holds its operators' fastest rows (the least memory
    among ties) — then every λ test passes on it, and the λ tests cannot raise T*."""
    if split is None:
        return False
    sizes = np.diff(np.append(starts, len(time)))
    fastest = time <= np.repeat(np.minimum.reduceat(time, starts), sizes)
    for k, (first, end) in enumerate(split):
        cum = per_chain(np.minimum.reduceat(np.where(fastest, mem_k[k], np.inf), starts))
        if cum[end] - cum[first] > cap * (1 + 1e-9):
            return False
    return True


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


def _lagrangian_bounds(costs: np.ndarray, mem: np.ndarray, starts: np.ndarray, capacity: float) -> np.ndarray:
    """:func:`_lagrangian_bound` of every column of ``costs`` (rows × G) at once, each over its
    own λ grid (coarse log-spaced, then linear around its best); chunks of columns keep the
    work array small."""
    finite = np.isfinite(mem)
    c = np.where(finite[:, None], costs, np.inf)
    m = np.where(finite, mem, 0.0)
    base = np.minimum.reduceat(c, starts, axis=0).sum(axis=0)
    scale = np.maximum(np.where(np.isfinite(base), base, 0.0), 1e-30) / max(capacity, 1.0)
    grid = np.logspace(-3, 2, LAMBDA_GRID)
    chunk = max(1, int(4e6 // max(len(m) * LAMBDA_GRID, 1)))
    out: np.ndarray = np.array(base, dtype=float)

    def values(cols: slice, lams: np.ndarray) -> np.ndarray:  # lams [g, L]
        tot = np.minimum.reduceat(c[:, cols, None] + m[:, None, None] * lams[None, :, :], starts, axis=0).sum(axis=0)
        result: np.ndarray = tot - lams * capacity
        return result

    for g0 in range(0, c.shape[1], chunk):
        cols = slice(g0, min(g0 + chunk, c.shape[1]))
        coarse = scale[cols, None] * grid[None, :]
        vc = values(cols, coarse)
        k = np.argmax(vc, axis=1)
        lo = coarse[np.arange(len(k)), np.maximum(k - 1, 0)]
        hi = coarse[np.arange(len(k)), np.minimum(k + 1, LAMBDA_GRID - 1)]
        fine = lo[:, None] + (hi - lo)[:, None] * np.linspace(0.0, 1.0, LAMBDA_GRID)[None, :]
        out[cols] = np.maximum(out[cols], np.maximum(vc.max(axis=1), values(cols, fine).max(axis=1)))
    return out


def _least_memory_at_min(c: np.ndarray, m: np.ndarray, starts: np.ndarray) -> float:
    """Σ over ops of the least memory among the op's cheapest rows."""
    sizes = np.diff(np.append(starts, len(c)))
    cmin = np.repeat(np.minimum.reduceat(c, starts), sizes)
    return float(np.minimum.reduceat(np.where(c <= cmin, m, np.inf), starts).sum())
