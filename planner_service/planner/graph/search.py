"""Op-level sharding search for operator graphs (Alpa-style intra-operator parallelism) with a
contiguous pipeline split, solved with CP-SAT.

Search space for one graph on one cluster:

* outer, enumerated: the GPU node group, the sharding-axis size ``t`` (powers of two), the
  pipeline depth ``pp``, ``dp = devices/(t·pp)``, the micro-batch size and ZeRO-1 (optimizer
  state sharded over gradient replicas) unless pinned;
* inner, per candidate: every operator's sharding (see :mod:`cost_model.graph.evaluate`) and the
  split of the topological order into ``pp`` contiguous stages, minimising the step time of
  :func:`cost_model.graph.evaluate.evaluate` under per-GPU memory (and CPU memory for tables placed
  on CPU parameter servers).

Tractability: operators are *coarsened* into chains (elementwise / activation / layout ops
follow their producer); a chain's choices are the combinations of its members' choices, with
internal resharding priced in and dominated combinations (no better in any cost term, same
external interface) dropped — an exact reduction.  Stage cuts are allowed between chains, at
most :data:`MAX_SEGMENTS` candidate cut points (low activation traffic, spread evenly by
compute).  Outer candidates are screened with a greedy assignment (iterated conditional modes)
and a dynamic-programming split; the best few are solved exactly with CP-SAT, seeded with the
greedy answer as a hint, under a time limit.  All integer scaling happens in :class:`IntScale`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from ortools.sat.python import cp_model

from cost_model.cluster import Cluster
from cost_model.errors import InvalidInput, NoFeasiblePlan
from cost_model.graph.analysis import analyse
from cost_model.graph.assign import greedy_choices, split_stages
from cost_model.graph.evaluate import GraphEval, evaluate, to_estimate
from cost_model.graph.ir import GraphSpec
from cost_model.graph.mesh import CpuPool, GraphMesh, gpu_groups, inflight
from cost_model.graph.op_cost import graph_op_costs
from cost_model.graph.tables import CostTables, build_tables, for_mesh, p2p_boundary_vector
from cost_model.graph.tables import position_crossing_bytes as _position_crossing
from cost_model.training import Training
from cost_model.transformer.layer_cost import DP_OVERLAP_WINDOW, WORKSPACE_BYTES, dp_overlap_fraction
from cost_model.transformer.layer_cost import FRAGMENTATION_FRACTION as FRACTION

MAX_SEGMENTS = 48
MAX_GROUP_COMBOS = 96
MAX_CPSAT_CANDIDATES = 3
LARGE_MODEL_GROUPS = 300
#: Edge formulations with at most this many (choice, choice) cells use product variables.
MARGINAL_EDGE_CELLS = 40_000
MAX_COMBOS_LARGE = 6


# ---- integer scaling (the one place) -----------------------------------------------------------
@dataclass(frozen=True)
class IntScale:
    """Seconds and bytes → CP-SAT integers.  Times round to the nearest unit (the objective is
    re-evaluated in floating point afterwards); memory rounds *up* and capacities *down*, so an
    integer-feasible plan is feasible in bytes."""

    time_unit_s: float
    mem_unit_b: float
    cpu_mem_unit_b: float = 1.0

    @staticmethod
    def for_problem(reference_step_s: float, capacity_b: float, n_terms: int, cpu_capacity_b: float = 1.0) -> IntScale:
        """Units: 1/1e8 of a reference step time for small models (1/1e6 above 400 choice
        variables, where large coefficients slow the LP), 1/1e6 of a GPU's (and of the CPU
        pool's) memory."""
        resolution = 1e8 if n_terms <= 400 else 1e6
        return IntScale(max(reference_step_s, 1e-9) / resolution, max(capacity_b, 1.0) / 1e6, max(cpu_capacity_b, 1.0) / 1e6)

    def cpu_mem_up(self, b) -> np.ndarray:
        return np.ceil(np.asarray(b, dtype=float) / self.cpu_mem_unit_b - 1e-9).astype(np.int64)

    def cpu_mem_down(self, b: float) -> int:
        return int(math.floor(b / self.cpu_mem_unit_b))

    def t(self, seconds) -> np.ndarray:
        return np.rint(np.asarray(seconds, dtype=float) / self.time_unit_s).astype(np.int64)

    def mem_up(self, b) -> np.ndarray:
        return np.ceil(np.asarray(b, dtype=float) / self.mem_unit_b - 1e-9).astype(np.int64)

    def mem_down(self, b: float) -> int:
        return int(math.floor(b / self.mem_unit_b))


# ---- coarsening -------------------------------------------------------------------------------
@dataclass
class Group:
    """A chain of operators planned as one node; ``combos[a]`` gives each member's choice."""

    members: tuple[int, ...]
    combos: np.ndarray  # [n, len(members)]
    time: np.ndarray  # fwd+bwd+internal comm+internal resharding per micro-batch
    bwd: np.ndarray  # backward compute (DP overlap window)
    sync: np.ndarray
    opt: np.ndarray
    static: np.ndarray
    act: np.ndarray
    cpu_t: np.ndarray
    cpu_mem: np.ndarray
    cpu_opt: np.ndarray

    @property
    def n(self) -> int:
        return len(self.combos)


@dataclass
class Coarse:
    groups: list[Group]
    group_of_op: np.ndarray
    edges: list[tuple[int, int, np.ndarray]]  # (U, V, seconds per micro-batch [nU, nV]), charged to V
    exact: bool  # False when a chain hit MAX_GROUP_COMBOS and was beam-pruned


def _pareto(vecs: np.ndarray) -> list[int]:
    """Indices of rows not dominated (≤ everywhere; exact duplicates keep one)."""
    rows = [tuple(v) for v in vecs.tolist()]
    order = sorted(range(len(rows)), key=lambda i: rows[i])
    keep: list[int] = []
    for i in order:
        v = rows[i]
        if not any(all(a <= b + 1e-15 for a, b in zip(rows[j], v)) for j in keep):
            keep.append(i)
    return keep


EXACT_COARSEN_OPS = 400


def coarsen(tables: CostTables, keep: np.ndarray | None = None, max_per_group: int | None = None,
            exact: bool | None = None, memory: bool = True) -> Coarse:
    """Group chains and enumerate each chain's useful combinations of member choices
    (vectorised over partial combinations).

    Partial combinations are merged by their *interface so far*: the layouts they require of
    external inputs (and their gradients) and the layouts of produced tensors still needed
    later.  With ``exact`` (default for graphs of at most :data:`EXACT_COARSEN_OPS` operators)
    only Pareto-optimal combinations survive per interface (time, data-parallel exposure at
    both ends of the overlap range, optimizer, static and activation memory, CPU terms) — an
    exact reduction.  Otherwise each interface keeps its cheapest combination by a step-time
    proxy and its least-memory one, and ``max_per_group`` keeps at most that many per chain:
    the one matching ``keep`` (e.g. the greedy hint), the least memory, then the cheapest per
    distinct interface; the solver then optimises over what is kept.

    ``memory=False`` leaves memory out of the dominance test: exact for the problem without
    memory constraints (whose optimum, when it fits, is the optimum)."""
    g = tables.graph
    an = tables.analysis
    order = an.order
    n = g.num_ops
    m = tables.mesh.num_microbatches
    if exact is None:
        exact = n <= EXACT_COARSEN_OPS
    cmax = DP_OVERLAP_WINDOW + tables.mesh.pp
    group_of_op = np.empty(n, dtype=np.int64)
    chains: list[list[int]] = []
    for p in range(n):
        if an.chain_start[p]:
            chains.append([])
        chains[-1].append(int(order[p]))
    for gi, mem in enumerate(chains):
        for i in mem:
            group_of_op[i] = gi
    internal_in: dict[int, list[int]] = {}
    external_in: dict[int, list[int]] = {}
    for e, (u, v, name, j) in enumerate(tables.edges):
        (internal_in if group_of_op[u] == group_of_op[v] else external_in).setdefault(v, []).append(e)
    tm = tables.fwd_s + tables.bwd_s + tables.comm_fwd_s + tables.comm_bwd_s
    static = tables.weights_bytes + tables.gradients_bytes + tables.optimizer_state_bytes
    cpu_t = tables.cpu_s + tables.cpu_comm_s
    row_vec = np.stack([tm, tables.bwd_s, tables.sync_s, tables.opt_s, static, tables.activation_bytes, cpu_t,
                        tables.cpu_memory_bytes, tables.cpu_opt_s], axis=1)
    reduced = True
    groups: list[Group] = []
    for mem in chains:
        pos_in = {op: k for k, op in enumerate(mem)}
        live_until: dict[tuple[int, int], int] = {}
        for k, op in enumerate(mem):
            for slot, name in enumerate(g.ops[op].outputs):
                last = -1
                for c in g.consumers.get(name, ()):
                    last = max(last, pos_in[c] if c in pos_in else len(mem))
                if last >= 0:
                    live_until[(op, slot)] = last
        C = np.zeros((1, 0), dtype=np.int64)
        V = np.zeros((1, 9))
        ext = np.zeros(1, dtype=np.int64)
        for k, op in enumerate(mem):
            r0 = int(tables.row_start[op])
            nc = tables.n_choices(op)
            P = len(C)
            C = np.concatenate([np.repeat(C, nc, axis=0), np.tile(np.arange(nc), P)[:, None]], axis=1)
            V = (V[:, None, :] + row_vec[r0:r0 + nc][None, :, :]).reshape(P * nc, 9)
            for e in internal_in.get(op, ()):
                u = tables.edges[e][0]
                E = tables.edge_fwd_s[e] + tables.edge_bwd_s[e]
                V[:, 0] += E[C[:, pos_in[u]], C[:, k]]
            sigs = [tuple((tables.in_l[r0 + c][tables.edges[e][3]], tables.in_g[r0 + c][tables.edges[e][3]])
                          for e in external_in.get(op, ())) for c in range(nc)]
            uniq = {sg: i for i, sg in enumerate(dict.fromkeys(sigs))}
            sig_id = np.array([uniq[sg] for sg in sigs], dtype=np.int64)
            ext = np.repeat(ext, nc) * (len(uniq) + 1) + sig_id[C[:, k]]
            _, ext = np.unique(ext, return_inverse=True)
            ext = ext.ravel().astype(np.int64)
            live = [(o, sl) for (o, sl), until in live_until.items() if pos_in[o] <= k and until > k]
            cols = [ext]
            for o, sl in live:
                ro = int(tables.row_start[o])
                lut = np.array([tables.out_l[ro + c][sl] for c in range(tables.n_choices(o))], dtype=np.int64)
                cols.append(lut[C[:, pos_in[o]]])
            key = np.stack(cols, axis=1)
            _, bucket = np.unique(key, axis=0, return_inverse=True)
            bucket = bucket.ravel()
            proxy = V[:, 0] * m + V[:, 2] + V[:, 3] + V[:, 6] * m
            memv = V[:, 4] + V[:, 5]
            if exact:
                sel: list[int] = []
                order_b = np.argsort(bucket, kind="stable")
                bounds = np.flatnonzero(np.diff(bucket[order_b])) + 1
                for grp in np.split(order_b, bounds):
                    if len(grp) == 1:
                        sel.append(int(grp[0]))
                        continue
                    cols = [V[grp, 0], V[grp, 2], V[grp, 2] - cmax * V[grp, 1], V[grp, 3], V[grp, 6], V[grp, 8]]
                    if memory:
                        cols += [V[grp, 4], V[grp, 5], V[grp, 7]]
                    dv = np.stack(cols, axis=1)
                    sel.extend(int(grp[i]) for i in _pareto(dv))
                idx = np.array(sorted(sel), dtype=np.int64)
            else:
                o1 = np.lexsort((proxy, bucket))
                first = np.ones(len(o1), dtype=bool)
                first[1:] = bucket[o1][1:] != bucket[o1][:-1]
                o2 = np.lexsort((memv, bucket))
                first2 = np.ones(len(o2), dtype=bool)
                first2[1:] = bucket[o2][1:] != bucket[o2][:-1]
                idx = np.unique(np.concatenate([o1[first], o2[first2]]))
                if len(idx) < len(C):
                    reduced = False
            if len(idx) > MAX_GROUP_COMBOS:
                reduced = False
                idx = idx[np.argsort(proxy[idx], kind="stable")[:MAX_GROUP_COMBOS]]
            C, V, ext = C[idx], V[idx], ext[idx]
        if max_per_group is not None and len(C) > max_per_group:
            reduced = False
            C, V = _thin(C, V, ext, mem, tables, keep, max_per_group, m, live_until)
        groups.append(Group(tuple(mem), C, V[:, 0], V[:, 1], V[:, 2], V[:, 3], V[:, 4], V[:, 5], V[:, 6], V[:, 7], V[:, 8]))
    member_index = {op: (gi, k) for gi, gr in enumerate(groups) for k, op in enumerate(gr.members)}
    acc: dict[tuple[int, int], np.ndarray] = {}
    for e, (u, v, _, _) in enumerate(tables.edges):
        U, ku = member_index[u]
        V_, kv = member_index[v]
        if U == V_:
            continue
        E = tables.edge_fwd_s[e] + tables.edge_bwd_s[e]
        M = E[np.ix_(groups[U].combos[:, ku], groups[V_].combos[:, kv])]
        if not M.any():
            continue
        key = (U, V_)
        acc[key] = acc[key] + M if key in acc else M.copy()
    edges = [(U, V_, M) for (U, V_), M in acc.items()]
    return Coarse(groups, group_of_op, edges, reduced and exact)


def _thin(C: np.ndarray, V: np.ndarray, ext: np.ndarray, mem: list[int], tables: CostTables, keep, limit: int, m: int,
          live_until) -> tuple[np.ndarray, np.ndarray]:
    proxy = V[:, 0] * m + V[:, 2] + V[:, 3] + V[:, 6] * m
    chosen: list[int] = []
    if keep is not None:
        want = np.array([int(keep[o]) for o in mem])
        hit = np.flatnonzero((want[None, :] == C).all(axis=1))
        if len(hit):
            chosen.append(int(hit[0]))
    pos_in = {op: k for k, op in enumerate(mem)}
    outs = [(o, sl) for (o, sl), until in live_until.items() if until >= len(mem)]
    cols = [ext]
    for o, sl in outs:
        ro = int(tables.row_start[o])
        lut = np.array([tables.out_l[ro + c][sl] for c in range(tables.n_choices(o))], dtype=np.int64)
        cols.append(lut[C[:, pos_in[o]]])
    _, iface = np.unique(np.stack(cols, axis=1), axis=0, return_inverse=True)
    iface = iface.ravel()
    o1 = np.lexsort((proxy, iface))
    first = np.ones(len(o1), dtype=bool)
    first[1:] = iface[o1][1:] != iface[o1][:-1]
    ranked = sorted(o1[first].tolist(), key=lambda i: proxy[i])
    lowmem = int(np.argmin(V[:, 4] + V[:, 5]))
    for i in [lowmem] + ranked:
        if len(chosen) >= limit:
            break
        if i not in chosen:
            chosen.append(int(i))
    idx = np.array(chosen, dtype=np.int64)
    return C[idx], V[idx]


def group_choice_from_ops(coarse: Coarse, choice: np.ndarray) -> np.ndarray:
    """Index of each group's combination matching per-op choices (nearest when pruned)."""
    out = np.zeros(len(coarse.groups), dtype=np.int64)
    for gi, gr in enumerate(coarse.groups):
        want = choice[list(gr.members)]
        diff = (gr.combos != want[None, :]).sum(axis=1)
        out[gi] = int(np.argmin(diff + 1e-9 * gr.time))
    return out


def ops_from_groups(coarse: Coarse, gchoice: Sequence[int], n_ops: int) -> np.ndarray:
    out = np.zeros(n_ops, dtype=np.int64)
    for gi, gr in enumerate(coarse.groups):
        out[list(gr.members)] = gr.combos[int(gchoice[gi])]
    return out


# ---- cut candidates -----------------------------------------------------------------------------
def cut_candidates(tables: CostTables, coarse: Coarse, choice: np.ndarray | None = None, limit: int = MAX_SEGMENTS) -> list[int]:
    """Positions (in the analysis order) where a stage may start: chain starts; when there are
    more than ``limit``, the one with the least crossing activation traffic in each of
    ``limit`` equal slices of the cumulative compute time."""
    an = tables.analysis
    starts = [int(p) for p in np.nonzero(an.chain_start)[0] if p > 0]
    if len(starts) <= limit:
        return starts
    n = tables.graph.num_ops
    if choice is None:
        choice = np.zeros(n, dtype=np.int64)
    rows = tables.row_start[:-1] + choice
    t = (tables.fwd_s + tables.bwd_s)[rows][an.order]
    cum = np.concatenate([[0.0], np.cumsum(t)])
    total = cum[-1] if cum[-1] > 0 else 1.0
    crossing = _position_crossing(tables)
    chosen: list[int] = []
    sa = np.array(starts)
    frac = cum[sa] / total
    for k in range(1, limit + 1):
        lo, hi = (k - 0.5) / (limit + 1), (k + 0.5) / (limit + 1)
        sel = sa[(frac >= lo) & (frac < hi)]
        if len(sel) == 0:
            continue
        p = int(sel[np.argmin(crossing[sel] + 1e-12 * np.abs(cum[sel] / total - k / (limit + 1)))])
        if p not in chosen:
            chosen.append(p)
    return sorted(chosen)


# ---- CP-SAT ---------------------------------------------------------------------------------------
@dataclass
class SolveResult:
    choice: np.ndarray
    stage_of_op: np.ndarray
    status: str
    objective_s: float | None
    wall_s: float


def solve_mesh(
    tables: CostTables,
    coarse: Coarse,
    cuts: Sequence[int],
    time_limit_s: float,
    headroom_fraction: float = 0.1,
    hint: tuple[np.ndarray, np.ndarray] | None = None,
    workers: int = 2,
    cutoff_s: float | None = None,
) -> SolveResult | None:
    """Optimal op shardings and contiguous stage split for one mesh.

    Variables: ``x[g][a]`` (chain g takes combination a), ``r`` (resharding on a chain-to-chain
    edge, ≥ the matrix entry of the chosen pair), ``z[s][k]`` (segment s runs on stage k;
    stages contiguous and non-empty), ``bnd[s][k]`` (boundary k|k+1 right after segment s) and
    big-M products ``w ≥ value − M·(1 − z)`` for per-stage time, data-parallel exposure,
    optimizer time and memory.  Objective: ``(m−1)·T + Σ stage times + T_cpu + D + O`` — the
    step time of :func:`cost_model.graph.evaluate.evaluate`.  ``cuts`` are positions where a stage
    may start.  A hint (per-op choices, stage of each op) is given for every variable.
    Returns None when nothing is found in time; a result with status INFEASIBLE when proven
    infeasible."""
    t0 = time.perf_counter()
    mesh = tables.mesh
    pp = mesh.pp
    m = mesh.num_microbatches
    an = tables.analysis
    groups = coarse.groups
    G = len(groups)
    gpos = np.array([int(an.position[gr.members[0]]) for gr in groups])
    cutset = np.array(sorted(set(int(c) for c in cuts)), dtype=np.int64)
    raw_seg = np.searchsorted(cutset, gpos, side="right") if len(cutset) else np.zeros(G, dtype=np.int64)
    uniq = sorted(set(int(s) for s in raw_seg))
    remap = {s: i for i, s in enumerate(uniq)}
    seg_of_group = np.array([remap[int(s)] for s in raw_seg], dtype=np.int64)
    nseg = len(uniq)
    if nseg < pp:
        return None
    seg_groups = [[int(g) for g in np.flatnonzero(seg_of_group == s)] for s in range(nseg)]
    seg_start_pos = [int(gpos[sg[0]]) for sg in seg_groups]
    crossing = _position_crossing(tables)
    P2P = np.zeros((nseg, max(pp - 1, 1)))
    if pp > 1:
        sizes = np.array([crossing[seg_start_pos[s + 1]] if s + 1 < nseg else 0.0 for s in range(nseg)])
        for k in range(pp - 1):
            P2P[:, k] = p2p_boundary_vector(tables, sizes, k)

    ref = float(np.sum([gr.time.min() for gr in groups]) * m + 1e-6)
    scale = IntScale.for_problem(ref, mesh.device.memory_bytes, sum(gr.n for gr in groups),
                                 mesh.cpu.memory_bytes if mesh.cpu is not None else 1.0)
    ti = scale.t

    # hint values
    hg = hs = None
    if hint is not None:
        hg = group_choice_from_ops(coarse, hint[0])
        if hint[1] is not None and len(hint[1]):
            hs = np.array([int(hint[1][groups[sg[0]].members[0]]) for sg in seg_groups])
            ok = hs[0] == 0 and hs[-1] == pp - 1 and np.all(np.diff(hs) >= 0) and np.all(np.diff(hs) <= 1)
            if not ok:
                hs = None
        if hs is None:
            hs = np.minimum((np.arange(nseg) * pp) // nseg, pp - 1)
    hints: list[tuple[Any, int]] = []

    model = cp_model.CpModel()
    x = [[model.new_bool_var(f"x{g}_{a}") for a in range(gr.n)] for g, gr in enumerate(groups)]
    for g in range(G):
        model.add_exactly_one(x[g])
        if hg is not None:
            for a in range(groups[g].n):
                hints.append((x[g][a], int(a == hg[g])))

    def lin(g: int, ci: np.ndarray):
        return sum(int(ci[a]) * x[g][a] for a in range(len(ci)) if ci[a] != 0)

    def hval(g: int, ci: np.ndarray) -> int:
        return int(ci[hg[g]]) if hg is not None else 0

    # chain-to-chain resharding, charged to the consumer chain
    marginal = sum(M.size for _, _, M in coarse.edges) <= MARGINAL_EDGE_CELLS
    edge_terms: dict[int, list] = {}
    edge_max: dict[int, int] = {}
    edge_hint: dict[int, int] = {}
    for (U, V, M) in coarse.edges:
        Mi = ti(M)
        if not Mi.any():
            continue
        nu, nv = Mi.shape
        hv = int(Mi[hg[U], hg[V]]) if hg is not None else 0
        if nu == 1:
            expr = sum(int(Mi[0, b]) * x[V][b] for b in range(nv) if Mi[0, b])
        elif nv == 1:
            expr = sum(int(Mi[a, 0]) * x[U][a] for a in range(nu) if Mi[a, 0])
        elif marginal:
            # y[a][b] = x[U][a]·x[V][b] through its marginals (the local-polytope relaxation Alpa
            # uses): a tight LP bound, nu·nv Booleans per edge.
            y = [[model.new_bool_var(f"y{U}_{V}_{a}_{b}") for b in range(nv)] for a in range(nu)]
            for a in range(nu):
                model.add(sum(y[a]) == x[U][a])
            for b in range(nv):
                model.add(sum(y[a][b] for a in range(nu)) == x[V][b])
            if hg is not None:
                for a in range(nu):
                    for b in range(nv):
                        hints.append((y[a][b], int(a == hg[U] and b == hg[V])))
            expr = sum(int(Mi[a, b]) * y[a][b] for a in range(nu) for b in range(nv) if Mi[a, b])
        else:
            r = model.new_int_var(0, int(Mi.max()), f"r{U}_{V}")
            for a in range(nu):
                row = Mi[a]
                if not row.any():
                    continue
                model.add(r >= sum(int(row[b]) * x[V][b] for b in range(nv) if row[b]) - int(row.max()) * (1 - x[U][a]))
            hints.append((r, hv))
            expr = r
        edge_terms.setdefault(V, []).append(expr)
        edge_max[V] = edge_max.get(V, 0) + int(Mi.max())
        edge_hint[V] = edge_hint.get(V, 0) + hv

    t_i = [ti(gr.time) for gr in groups]
    b_i = [ti(gr.bwd) for gr in groups]
    s_i = [ti(gr.sync) for gr in groups]
    o_i = [ti(gr.opt) for gr in groups]
    cpu_i = [ti(gr.cpu_t) for gr in groups]
    copt_i = [ti(gr.cpu_opt) for gr in groups]
    st_i = [scale.mem_up(gr.static * (1 + FRACTION)) for gr in groups]
    ac_i = [scale.mem_up(gr.act * (1 + FRACTION)) for gr in groups]
    cap_total = mesh.device.memory_bytes * (1.0 - headroom_fraction) - WORKSPACE_BYTES
    if cap_total <= 0:
        return SolveResult(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), "INFEASIBLE", None, time.perf_counter() - t0)
    cap_i = scale.mem_down(cap_total)
    window = dp_overlap_fraction(tables.training, mesh.device)

    def seg_lin(s: int, arrs) -> Any:
        return sum(lin(g, arrs[g]) for g in seg_groups[s])

    def seg_hval(s: int, arrs) -> int:
        return sum(hval(g, arrs[g]) for g in seg_groups[s])

    def seg_max(s: int, arrs) -> int:
        return int(sum(int(arrs[g].max()) for g in seg_groups[s]))

    Tseg, Tseg_max, Tseg_h = [], [], []
    for s in range(nseg):
        Tseg.append(seg_lin(s, t_i) + sum(sum(edge_terms.get(g, [])) for g in seg_groups[s]))
        Tseg_max.append(seg_max(s, t_i) + sum(edge_max.get(g, 0) for g in seg_groups[s]))
        Tseg_h.append(seg_hval(s, t_i) + sum(edge_hint.get(g, 0) for g in seg_groups[s]))

    cpu_T = sum(lin(g, cpu_i[g]) for g in range(G) if cpu_i[g].any())
    cpu_T_h = sum(hval(g, cpu_i[g]) for g in range(G))
    cpu_opt = sum(lin(g, copt_i[g]) for g in range(G) if copt_i[g].any())
    cpu_opt_h = sum(hval(g, copt_i[g]) for g in range(G))
    T = model.new_int_var(0, int(sum(Tseg_max)) + int(sum(int(c.max()) for c in cpu_i)) + 1, "T")
    D = model.new_int_var(0, int(sum(int(a.max()) for a in s_i)) + 1, "D")
    O = model.new_int_var(0, int(sum(int(a.max()) for a in o_i)) + int(sum(int(a.max()) for a in copt_i)) + 1, "O")
    if not isinstance(cpu_T, int):
        model.add(cpu_T <= T)
    if not isinstance(cpu_opt, int):
        model.add(cpu_opt <= O)
    pool = mesh.cpu
    cpu_groups = [g for g in range(G) if groups[g].cpu_mem.any()]
    if cpu_groups and pool is not None:
        cm = sum(lin(g, scale.cpu_mem_up(groups[g].cpu_mem)) for g in cpu_groups)
        model.add(cm <= scale.cpu_mem_down(pool.memory_bytes * (1.0 - headroom_fraction)))

    T_h = [0] * pp
    D_h = [0] * pp
    O_h = [0] * pp
    p2p_total = 0
    z = None
    if pp == 1:
        model.add(sum(Tseg) <= T)
        T_h[0] = sum(Tseg_h)
        win_b = [np.rint(window * b_i[g]).astype(np.int64) for g in range(G)]
        model.add(sum(seg_lin(s, s_i) for s in range(nseg)) - sum(lin(g, win_b[g]) for g in range(G)) <= D)
        D_h[0] = sum(seg_hval(s, s_i) for s in range(nseg)) - sum(hval(g, win_b[g]) for g in range(G))
        model.add(sum(seg_lin(s, o_i) for s in range(nseg)) <= O)
        O_h[0] = sum(seg_hval(s, o_i) for s in range(nseg))
        fl = inflight(mesh, 0)
        model.add(sum(seg_lin(s, st_i) for s in range(nseg)) + fl * sum(seg_lin(s, ac_i) for s in range(nseg)) <= cap_i)
    else:
        z = [[model.new_bool_var(f"z{s}_{k}") for k in range(pp)] for s in range(nseg)]
        zh = [[int(hs[s] == k) for k in range(pp)] for s in range(nseg)] if hg is not None else None
        for s in range(nseg):
            model.add_exactly_one(z[s])
            if zh is not None:
                hints.extend((z[s][k], zh[s][k]) for k in range(pp))
        stg = [sum(k * z[s][k] for k in range(1, pp)) for s in range(nseg)]
        model.add(z[0][0] == 1)
        model.add(z[nseg - 1][pp - 1] == 1)
        for s in range(nseg - 1):
            model.add(stg[s + 1] >= stg[s])
            model.add(stg[s + 1] <= stg[s] + 1)
        P2Pi = ti(P2P)
        bnd: list[list[Any]] = [[None] * (pp - 1) for _ in range(nseg)]
        bnd_h = [[0] * (pp - 1) for _ in range(nseg)]
        for s in range(nseg - 1):
            for k in range(pp - 1):
                if not P2Pi[s, k]:
                    continue
                b = model.new_bool_var(f"b{s}_{k}")
                model.add(b >= z[s][k] + z[s + 1][k + 1] - 1)
                bnd[s][k] = b
                if zh is not None:
                    bnd_h[s][k] = int(zh[s][k] and zh[s + 1][k + 1])
                    hints.append((b, bnd_h[s][k]))
        for k in range(pp):
            wts = []
            th = 0
            for s in range(nseg):
                mx = max(Tseg_max[s], 0)
                w = model.new_int_var(0, mx, f"wt{s}_{k}")
                model.add(w >= Tseg[s] - mx * (1 - z[s][k]))
                wts.append(w)
                if zh is not None:
                    hints.append((w, Tseg_h[s] * zh[s][k]))
                    th += Tseg_h[s] * zh[s][k]
            p2p_k = []
            for s in range(nseg - 1):
                if k < pp - 1 and bnd[s][k] is not None:
                    p2p_k.append(int(P2Pi[s, k]) * bnd[s][k])
                    th += int(P2Pi[s, k]) * bnd_h[s][k]
                if k > 0 and bnd[s][k - 1] is not None:
                    p2p_k.append(int(P2Pi[s, k - 1]) * bnd[s][k - 1])
                    th += int(P2Pi[s, k - 1]) * bnd_h[s][k - 1]
            model.add(sum(wts) + sum(p2p_k) <= T)
            T_h[k] = th
            # data-parallel exposure of stage k: sync − (window + k)·backward
            coef = window + k
            wb = [np.rint(coef * b_i[g]).astype(np.int64) for g in range(G)]
            dterms, dh = [], 0
            for s in range(nseg):
                fpos = seg_max(s, s_i)
                if fpos == 0:
                    continue
                fneg = seg_max(s, wb)
                wd = model.new_int_var(-fneg, fpos, f"wd{s}_{k}")
                expr = seg_lin(s, s_i) - seg_lin(s, wb)
                model.add(wd >= expr - (fpos + fneg) * (1 - z[s][k]))
                model.add(wd >= -fneg * z[s][k])
                dterms.append(wd)
                if zh is not None:
                    v = (seg_hval(s, s_i) - seg_hval(s, wb)) if zh[s][k] else 0
                    hints.append((wd, v))
                    dh += v
            if dterms:
                model.add(sum(dterms) <= D)
            D_h[k] = dh
            oterms, oh = [], 0
            for s in range(nseg):
                mx = seg_max(s, o_i)
                if mx == 0:
                    continue
                wo = model.new_int_var(0, mx, f"wo{s}_{k}")
                model.add(wo >= seg_lin(s, o_i) - mx * (1 - z[s][k]))
                oterms.append(wo)
                if zh is not None:
                    v = seg_hval(s, o_i) * zh[s][k]
                    hints.append((wo, v))
                    oh += v
            if oterms:
                model.add(sum(oterms) <= O)
            O_h[k] = oh
            fl = inflight(mesh, k)
            mterms = []
            for s in range(nseg):
                mx = seg_max(s, st_i) + fl * seg_max(s, ac_i)
                if mx == 0:
                    continue
                wm = model.new_int_var(0, mx, f"wm{s}_{k}")
                model.add(wm >= seg_lin(s, st_i) + fl * seg_lin(s, ac_i) - mx * (1 - z[s][k]))
                mterms.append(wm)
                if zh is not None:
                    hints.append((wm, (seg_hval(s, st_i) + fl * seg_hval(s, ac_i)) * zh[s][k]))
            if mterms:
                model.add(sum(mterms) <= cap_i)
        p2p_total = sum(2 * int(P2Pi[s, k]) * bnd[s][k] for s in range(nseg - 1) for k in range(pp - 1) if bnd[s][k] is not None)
    objective = (m - 1) * T + sum(Tseg) + p2p_total + cpu_T + D + O
    model.minimize(objective)
    if cutoff_s is not None:
        # only solutions at least as good as an incumbent step time are of interest: INFEASIBLE
        # then means "cannot beat it" (optimizer kernel launches are a constant outside)
        model.add(objective <= int(math.floor((cutoff_s - 4 * mesh.device.efficiency.kernel_overhead_s) / scale.time_unit_s)))
    if hg is not None:
        hints.append((T, max(max(T_h), cpu_T_h)))
        hints.append((D, max(0, max(D_h))))
        hints.append((O, max(max(O_h), cpu_opt_h)))
        for var, val in hints:
            model.add_hint(var, int(val))

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.05, float(time_limit_s) - (time.perf_counter() - t0))
    solver.parameters.num_workers = max(1, int(workers))
    if G > LARGE_MODEL_GROUPS:
        # Inclusion detection between the many edge constraints dominates presolve time on
        # large graphs and buys little; skip it.
        solver.parameters.presolve_inclusion_work_limit = 0
    status = solver.solve(model)
    name = solver.status_name(status)
    if status == cp_model.INFEASIBLE:
        return SolveResult(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), name, None, time.perf_counter() - t0)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    gch = [next(a for a in range(groups[g].n) if solver.value(x[g][a])) for g in range(G)]
    choice = ops_from_groups(coarse, gch, tables.graph.num_ops)
    stage = np.zeros(tables.graph.num_ops, dtype=np.int64)
    if z is not None:
        for s in range(nseg):
            k = next(kk for kk in range(pp) if solver.value(z[s][kk]))
            for g in seg_groups[s]:
                stage[list(groups[g].members)] = k
    # evaluate() adds the optimizer's kernel launches as a constant
    constant_s = 4 * mesh.device.efficiency.kernel_overhead_s
    return SolveResult(choice, stage, name, solver.objective_value * scale.time_unit_s + constant_s, time.perf_counter() - t0)


# ---- outer search ---------------------------------------------------------------------------------
@dataclass
class Candidate:
    mesh: GraphMesh
    tables: CostTables
    choice: np.ndarray
    stage_of_op: np.ndarray
    ev: GraphEval
    fits: bool
    solver_status: str = "GREEDY"

    @property
    def key(self) -> tuple:
        m = self.mesh
        return (m.group.name, m.t, m.pp, m.dp, m.micro_batch)


def _pow2_upto(n: int) -> list[int]:
    out, v = [], 1
    while v <= n:
        out.append(v)
        v *= 2
    return out


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(math.isqrt(n)) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _pin(constraints: Any, key: str) -> Any:
    if constraints is None:
        return None
    pinned = getattr(constraints, "pinned", None)
    if pinned is None and isinstance(constraints, Mapping):
        pinned = constraints
    return (pinned or {}).get(key)


def _cattr(constraints: Any, key: str, default: Any = None) -> Any:
    if constraints is None:
        return default
    if isinstance(constraints, Mapping):
        return constraints.get(key, default)
    v = getattr(constraints, key, default)
    return default if v is None else v


def enumerate_meshes(graph: GraphSpec, training: Training, cluster: Cluster, constraints: Any = None,
                     n_groups: int | None = None) -> tuple[list[GraphMesh], int, list[str]]:
    """Outer candidates (node group, t, pp, dp, micro-batch, ZeRO) after divisibility, pins and
    limits; returns (meshes, number pruned, notes)."""
    notes: list[str] = []
    B = training.global_batch_size
    allowed = _cattr(constraints, "allowed_device_types")
    max_tp = _cattr(constraints, "max_tp")
    max_pp = _cattr(constraints, "max_pp")
    max_dev = _cattr(constraints, "max_devices")
    pins = {k: _pin(constraints, k) for k in ("dp", "tp", "pp", "micro_batch_size", "zero_stage", "cp", "ep", "vpp", "recompute", "sequence_parallel")}
    for k in ("cp", "ep", "vpp"):
        if pins[k] not in (None, 1):
            raise InvalidInput(f"{k}={pins[k]} cannot be used with an operator graph (only dp, tp, pp, micro_batch_size, zero_stage)",
                               field=f"constraints.{k}")
    if pins["recompute"] not in (None, "none"):
        raise InvalidInput("recompute is not modelled for operator graphs; use 'none'", field="constraints.recompute")
    zero = pins["zero_stage"] if pins["zero_stage"] is not None else 1
    if zero not in (0, 1):
        raise InvalidInput(f"zero_stage={zero}: operator graphs support ZeRO stages 0 and 1", field="constraints.zero_stage")
    pool = CpuPool.from_cluster(cluster)
    meshes: list[GraphMesh] = []
    pruned = 0
    groups = gpu_groups(cluster)
    if allowed:
        groups = [g for g in groups if g.device.name in allowed]
    if not groups:
        raise NoFeasiblePlan("no GPU node group is available (CPU-only clusters cannot train an operator graph here)",
                             field="cluster.node_groups")
    limit_pp = min(graph.num_ops, n_groups or graph.num_ops, 32)
    seen_dev: set[tuple] = set()
    for grp in groups:
        G = cluster.available_gpus(grp.name)
        if max_dev:
            G = min(G, max_dev)
        dev_key = (grp.device.name, G)
        if dev_key in seen_dev:  # identical groups: plan on one of them
            continue
        seen_dev.add(dev_key)
        if training.dtype not in grp.device.supported_dtypes():
            notes.append(f"{grp.name}: {grp.device.name} has no {training.dtype} peak")
            continue
        for t in _pow2_upto(G):
            if max_tp and t > max_tp or pins["tp"] is not None and t != pins["tp"]:
                pruned += 1
                continue
            for pp in _divisors(G // t) if G % t == 0 else []:
                if pp > limit_pp or (max_pp and pp > max_pp) or (pins["pp"] is not None and pp != pins["pp"]):
                    pruned += 1
                    continue
                dp = G // (t * pp)
                if pins["dp"] is not None:
                    if pins["dp"] > dp:
                        pruned += 1
                        continue
                    dp = pins["dp"]
                if B % dp:
                    pruned += 1
                    continue
                per = B // dp
                if pins["micro_batch_size"] is not None:
                    mbs_list = [pins["micro_batch_size"]] if per % pins["micro_batch_size"] == 0 else []
                else:
                    mbs_list = sorted(set([d for d in _pow2_upto(per) if per % d == 0] + [per]))
                for mbs in mbs_list:
                    mc = per // mbs
                    if pp > 1 and mc < pp:
                        pruned += 1
                        continue
                    meshes.append(GraphMesh(grp, t, dp, pp, mbs, mc, zero if dp * t > 1 else 0, pool))
    if pins["tp"] is not None and not meshes:
        notes.append(f"pinned tp={pins['tp']} leaves no layout")
    return meshes, pruned, notes


def state_bytes_lower_bound(training: Training, mesh: GraphMesh) -> float:
    """Fewest model-state bytes one parameter can cost per GPU of a stage: either sharded over
    the t ranks (weights, gradients and optimizer state /t, ZeRO-1 over the dp replicas) or
    replicated along t (ZeRO-1 over all dp·t replicas)."""
    from cost_model.transformer.layer_cost import model_state_bytes_per_param

    def total(shard):
        w, g, o = model_state_bytes_per_param(training, mesh.zero_stage, shard)
        return float(np.asarray(w)) + float(np.asarray(g)) + float(np.asarray(o))

    return min(total(mesh.dp) / mesh.t, total(mesh.dp * mesh.t))


def _memory_lower_bound_ok(graph: GraphSpec, training: Training, mesh: GraphMesh, headroom: float, params_total: float,
                           table_params: float) -> bool:
    """Model state per GPU cannot shrink below :func:`state_bytes_lower_bound` × parameters /
    pp (tables may leave for CPU parameter servers)."""
    movable = table_params if mesh.cpu is not None else 0.0
    need = (params_total - movable) * state_bytes_lower_bound(training, mesh) / mesh.pp + WORKSPACE_BYTES
    return need <= mesh.device.memory_bytes * (1.0 - headroom)


def plan_graph(
    model: GraphSpec,
    training: Training,
    cluster: Cluster,
    constraints: Any = None,
    top_k: int = 3,
    time_limit_s: float = 30.0,
    workers: int = 2,
) -> dict[str, Any]:
    """Plan an operator graph: the best op shardings, stage split, layout and placement.

    Returns ``{"best": {"strategy", "prediction", "stages", "ranks", ...}, "alternatives",
    "search": {"candidates", "pruned", "solver_status", "wall_time_s"}, "explanation"}``;
    raises :class:`NoFeasiblePlan` with what is short when nothing fits."""
    t_start = time.perf_counter()
    deadline = t_start + 0.92 * max(1.0, float(time_limit_s))
    graph = model
    headroom = float(_cattr(constraints, "memory_headroom_fraction", 0.1))
    analysis = analyse(graph)
    n_chains = int(analysis.chain_id.max()) + 1 if graph.num_ops else 0
    meshes, pruned, notes = enumerate_meshes(graph, training, cluster, constraints, n_chains)
    params_total = float(graph.total_params())
    table_params = float(sum(op.param_count for op in graph.ops if op.category in ("embedding",) or (op.category == "gather" and op.params)))
    feasible_meshes = []
    for mesh in meshes:
        if _memory_lower_bound_ok(graph, training, mesh, headroom, params_total, table_params):
            feasible_meshes.append(mesh)
        else:
            pruned += 1
    if not feasible_meshes:
        raise NoFeasiblePlan(_short_message(graph, training, cluster, meshes, headroom), field="cluster")
    # Screen: one table per (group, t, dp, micro_batch, pp-independent) ... tables depend on pp only
    # through inflight counts and p2p, which evaluate() handles; build per mesh but share op costs.
    by_key: dict[tuple, list[GraphMesh]] = {}
    for mesh in feasible_meshes:
        by_key.setdefault((mesh.group.name, mesh.t, mesh.micro_batch), []).append(mesh)
    keys = sorted(by_key, key=lambda k: _key_priority(k, by_key[k], graph, training))
    large = graph.num_ops > EXACT_COARSEN_OPS
    screen_deadline = t_start + (0.35 if large else 0.5) * (deadline - t_start)
    cost_cache: dict[int, Any] = {}
    candidates: list[Candidate] = []
    fallback: list[CostTables] = []
    screened = 0
    for key in keys:
        if candidates and time.perf_counter() > screen_deadline:
            pruned += len(by_key[key])
            continue
        grp_name, t, mbs = key
        if mbs not in cost_cache:
            cost_cache[mbs] = graph_op_costs(graph, mbs, training.sequence_length, training.dtype)
        group_meshes = sorted(by_key[key], key=lambda ms: ms.pp)
        base = build_tables(graph, training, group_meshes[0], analysis, cost_cache[mbs])
        choice = greedy_choices(base)
        mem_choices: list[np.ndarray] = []
        for mesh in group_meshes:
            tables = base if mesh is group_meshes[0] else for_mesh(base, mesh)
            cand = _screen(tables, choice, headroom)
            screened += 1
            for factor in (1.0, 10.0, 100.0):  # trade time for memory, harder each round
                if cand is not None:
                    break
                k = (1.0, 10.0, 100.0).index(factor)
                if len(mem_choices) <= k:
                    mem_choices.append(greedy_choices(tables, memory_weight=factor * _memory_weight(tables)))
                cand = _screen(tables, mem_choices[k], headroom)
            if cand is None:
                pruned += 1
                fallback.append(tables)
                continue
            candidates.append(cand)
    if not candidates:
        # No greedy layout fits: let CP-SAT look for a fitting one on the layouts that shard
        # the most (memory constraints are exact there), within the remaining time.
        fallback.sort(key=lambda tb: (-(tb.mesh.t * tb.mesh.pp), tb.mesh.micro_batch))
        for tables in fallback[:2]:
            remaining = deadline - time.perf_counter()
            if remaining < 0.5:
                break
            hint_choice = greedy_choices(tables, memory_weight=100.0 * _memory_weight(tables))
            coarse = coarsen(tables, keep=hint_choice, max_per_group=MAX_COMBOS_LARGE if large else None)
            res = solve_mesh(tables, coarse, cut_candidates(tables, coarse, hint_choice), remaining / 2, headroom,
                             hint=(hint_choice, None), workers=workers)
            if res is not None and res.status in ("OPTIMAL", "FEASIBLE"):
                ev = evaluate(tables, res.choice, res.stage_of_op)
                if _fits(tables, ev, headroom):
                    candidates.append(Candidate(tables.mesh, tables, res.choice, res.stage_of_op, ev, True, res.status))
                    break
    if not candidates:
        raise NoFeasiblePlan(_short_message(graph, training, cluster, feasible_meshes, headroom, screened=True), field="cluster")
    candidates = _order(candidates)
    # CP-SAT on the best few outer candidates
    statuses: list[str] = []
    refine = candidates[:1 if large else MAX_CPSAT_CANDIDATES]
    coarse_sizes: list[int] = []
    exact_flags: list[bool] = []
    for idx, cand in enumerate(refine):
        remaining = deadline - time.perf_counter()
        if remaining < 0.3:
            statuses.append("NOT_RUN(time)")
            continue
        # the most promising layout gets most of the time; the others only need to show
        # whether they can beat the incumbent (objective cutoff)
        share = remaining * (0.6 if idx == 0 and len(refine) > 1 else 1.0 / (len(refine) - idx)) * 0.95
        incumbent = min(c.ev.step_time_s for c in candidates[: idx + 1]) if idx > 0 else None
        t_c = time.perf_counter()
        coarse = coarsen(cand.tables, keep=cand.choice, max_per_group=MAX_COMBOS_LARGE if large else None)
        coarse_sizes.append(len(coarse.groups))
        exact_flags.append(coarse.exact)
        cuts = cut_candidates(cand.tables, coarse, cand.choice)
        spent = time.perf_counter() - t_c
        res = solve_mesh(cand.tables, coarse, cuts, max(0.1, share - spent), headroom, hint=(cand.choice, cand.stage_of_op),
                         workers=workers, cutoff_s=incumbent)
        if res is None:
            statuses.append("UNKNOWN")
            continue
        statuses.append(res.status if not (incumbent and res.status == "INFEASIBLE") else "CANNOT_BEAT_BEST")
        if res.status == "INFEASIBLE":
            continue
        ev = evaluate(cand.tables, res.choice, res.stage_of_op)
        if _fits(cand.tables, ev, headroom) and ev.step_time_s < cand.ev.step_time_s * (1 - 1e-12):
            candidates[idx] = Candidate(cand.mesh, cand.tables, res.choice, res.stage_of_op, ev, True, res.status)
        else:
            cand.solver_status = res.status
    candidates = _order(candidates)
    best = candidates[0]
    alts = _distinct(candidates[1:], top_k)
    wall = time.perf_counter() - t_start
    result = GraphPlan({
        "best": describe(best, cluster),
        "alternatives": [describe(c, cluster, brief=True) for c in alts],
        "search": {
            "candidates": screened,
            "pruned": pruned,
            "solver_status": best.solver_status if best.solver_status != "GREEDY" else (statuses[0] if statuses else "GREEDY"),
            "solver_statuses": statuses,
            "wall_time_s": wall,
            "operators": graph.num_ops,
            "coarsened_nodes": coarse_sizes[0] if coarse_sizes else n_chains,
            "exact_reduction": all(exact_flags) if exact_flags else None,
        },
        "explanation": explain(best, alts, notes, headroom),
        "warnings": list(to_estimate(best.tables, best.ev).warnings),
    })
    result.device_types = (best.mesh.device.name,)
    result.num_devices = best.mesh.num_devices
    return result


#: Step times within this relative margin count as a tie, broken toward the simpler layout.
TIE_FRACTION = 1e-3


def _order(cands: list[Candidate]) -> list[Candidate]:
    """Fastest first; the winner is the simplest layout (smaller t, then fewer stages, then the
    larger micro-batch) among those within :data:`TIE_FRACTION` of the fastest — sharding
    every operator's batch along t is data parallelism by another name."""
    cands = sorted(cands, key=lambda c: c.ev.step_time_s)
    if not cands:
        return cands
    limit = cands[0].ev.step_time_s * (1 + TIE_FRACTION)
    tied = [c for c in cands if c.ev.step_time_s <= limit]
    best = min(tied, key=lambda c: (c.mesh.t, c.mesh.pp, -c.mesh.micro_batch, c.ev.step_time_s))
    return [best] + [c for c in cands if c is not best]


class GraphPlan(dict):
    """The plan as a plain dict (contract v1 keys), plus what the plan service reads from a
    planner result: ``to_dict()``, ``device_types`` and ``num_devices``."""

    device_types: tuple[str, ...] = ()
    num_devices: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dict(self)


def _screen(tables: CostTables, choice: np.ndarray, headroom: float) -> Candidate | None:
    coarse_cuts = None
    if tables.mesh.pp > 1:
        # restrict cut points for speed: same selection the solver uses
        an = tables.analysis
        starts = np.nonzero(an.chain_start)[0]
        if len(starts) > MAX_SEGMENTS:
            coarse_cuts = cut_candidates(tables, None, choice)  # type: ignore[arg-type]
    stage = split_stages(tables, choice, coarse_cuts, headroom_fraction=headroom)
    if stage is None:
        return None
    ev = evaluate(tables, choice, stage)
    if not _fits(tables, ev, headroom):
        return None
    return Candidate(tables.mesh, tables, choice, stage, ev, True)


def _fits(tables: CostTables, ev: GraphEval, headroom: float) -> bool:
    cap = tables.mesh.device.memory_bytes * (1.0 - headroom)
    if any(s.peak_bytes > cap * (1 + 1e-9) for s in ev.stages):
        return False
    pool = tables.mesh.cpu
    if pool is not None and ev.cpu_memory_bytes > pool.memory_bytes * (1.0 - headroom) * (1 + 1e-9):
        return False
    return True


def _memory_weight(tables: CostTables) -> float:
    """Seconds per byte that make memory matter to the greedy: a step's time over the capacity."""
    rows = tables.row_start[:-1]
    t = float((tables.fwd_s + tables.bwd_s)[rows].sum()) * tables.mesh.num_microbatches
    return 4.0 * max(t, 1e-6) / tables.mesh.device.memory_bytes


def _key_priority(key: tuple, meshes: list[GraphMesh], graph: GraphSpec, training: Training) -> tuple:
    """Screen first the layouts most likely to win: moderate micro-batches (bubble vs GEMM
    efficiency), small sharding degree first for small models."""
    _, t, mbs = key
    m = meshes[0].num_microbatches
    return (abs(math.log2(max(mbs, 1)) - 2.0) + 0.25 * math.log2(t) + (0 if m >= 2 else 0.5),)


def _distinct(cands: list[Candidate], k: int) -> list[Candidate]:
    seen: set[tuple] = set()
    out = []
    for c in cands:
        key = (c.mesh.t, c.mesh.pp, c.mesh.dp, c.mesh.micro_batch, c.mesh.group.name)
        if key in seen:
            continue
        seen.add(key)
        out.append(c)
        if len(out) >= k:
            break
    return out


def _short_message(graph: GraphSpec, training: Training, cluster: Cluster, meshes: list[GraphMesh], headroom: float,
                   screened: bool = False) -> str:
    groups = gpu_groups(cluster)
    if not meshes:
        return "no parallel layout satisfies the constraints (pins, max_tp, max_pp, divisibility of the global batch)"
    params = float(graph.total_params())
    best = min(meshes, key=lambda m: state_bytes_lower_bound(training, m) / m.pp)
    best_split = best.t * best.pp
    need = params * state_bytes_lower_bound(training, best) / best.pp / 1e9 + WORKSPACE_BYTES / 1e9
    cap = max(gr.device.memory_GB for gr in groups) * (1 - headroom)
    cpu = CpuPool.from_cluster(cluster)
    extra = ""
    if cpu is not None:
        extra = f"; the CPU nodes hold {cpu.memory_bytes / 1e9:.0f} GB for embedding tables"
    if screened:
        return (f"no layout fits: model state alone needs about {need:.1f} GB per GPU at the largest model-parallel size "
                f"({best_split}), activations come on top; devices allow {cap:.1f} GB after the {headroom:.0%} headroom{extra}")
    return (f"no strategy fits: needs at least {need:.1f} GB per GPU for weights, gradients and optimizer state at the "
            f"largest model-parallel size allowed ({best_split}); devices have {cap:.1f} GB after the {headroom:.0%} headroom{extra}")


# ---- result description ---------------------------------------------------------------------------
def describe(c: Candidate, cluster: Cluster, brief: bool = False) -> dict[str, Any]:
    mesh = c.mesh
    tables = c.tables
    graph = tables.graph
    est = to_estimate(tables, c.ev)
    names = {op.name: tables.names[int(tables.row_start[i] + c.choice[i])] for i, op in enumerate(graph.ops)}
    stage_ops = [sorted(s.ops, key=lambda i: tables.analysis.position[i]) for s in c.ev.stages]
    strategy = {
        "dp": mesh.dp, "tp": mesh.t, "pp": mesh.pp, "cp": 1, "ep": 1, "vpp": 1, "micro_batch_size": mesh.micro_batch,
        "sequence_parallel": False, "recompute": "none", "zero_stage": mesh.zero_stage,
        "layers_per_stage": [len(o) for o in stage_ops], "node_group": mesh.group.name,
    }
    out: dict[str, Any] = {"strategy": strategy, "prediction": est.to_dict()}
    if brief:
        out["solver_status"] = c.solver_status
        return out
    strategy["op_shardings"] = names
    hosts = [n.hostname for n in cluster.available_nodes(mesh.group.name)]
    gpn = mesh.group.gpus_per_node
    ranks = []
    block = mesh.dp * mesh.t
    for p in range(mesh.pp):
        for d in range(mesh.dp):
            for tt in range(mesh.t):
                r = (p * mesh.dp + d) * mesh.t + tt
                ranks.append({"rank": r, "host": hosts[r // gpn] if r // gpn < len(hosts) else None, "gpu": r % gpn,
                              "node_group": mesh.group.name, "device": mesh.device.name, "stage": p, "dp": d, "pp": p,
                              "tp": tt, "cp": 0})
    stages = []
    for s, ops in zip(est.stages, stage_ops):
        d = s.to_dict()
        stage_ranks = [rk for rk in ranks if rk["stage"] == s.index]
        d.update({
            "first_op": graph.ops[ops[0]].name if ops else None,
            "last_op": graph.ops[ops[-1]].name if ops else None,
            "num_ops": len(ops),
            "hosts": sorted({rk["host"] for rk in stage_ranks if rk["host"]}),
            "gpus": len(stage_ranks),
            "ops": {graph.ops[i].name: names[graph.ops[i].name] for i in ops},
        })
        stages.append(d)
    out["stages"] = stages
    out["ranks"] = ranks
    cpu_ops = [n for n, sh in names.items() if sh == "embedding_on_cpu"]
    if cpu_ops and mesh.cpu is not None:
        out["parameter_servers"] = {
            "hosts": list(mesh.cpu.hostnames), "node_groups": list(mesh.cpu.groups), "device": mesh.cpu.device.name,
            "tables": cpu_ops, "memory_GB": c.ev.cpu_memory_bytes / 1e9,
            "time_per_microbatch_s": c.ev.cpu_stage_s,
        }
    out["solver_status"] = c.solver_status
    del block
    return out


def explain(best: Candidate, alts: list[Candidate], notes: list[str], headroom: float) -> dict[str, Any]:
    ev = best.ev
    tables = best.tables
    cap = tables.mesh.device.memory_GB
    peak = max(s.peak_bytes for s in ev.stages) / 1e9
    counts: dict[str, int] = {}
    for i in range(tables.graph.num_ops):
        nm = tables.names[int(tables.row_start[i] + best.choice[i])]
        counts[nm] = counts.get(nm, 0) + 1
    why = []
    for a in alts:
        delta = a.ev.step_time_s / ev.step_time_s - 1.0
        name = f"tp={a.mesh.t}, pp={a.mesh.pp}, dp={a.mesh.dp}, micro_batch={a.mesh.micro_batch}"
        if abs(delta) < TIE_FRACTION:
            why.append(f"{name}: the same step time (within {TIE_FRACTION:.1%}); the simpler layout was kept")
            continue
        worst = max(a.ev.breakdown_s, key=lambda k: a.ev.breakdown_s[k] - ev.breakdown_s.get(k, 0.0))
        grow = a.ev.breakdown_s[worst] - ev.breakdown_s.get(worst, 0.0)
        why.append(f"{name}: {delta:+.1%} step time ({worst} +{grow * 1e3:.2f} ms)")
    emb = {}
    g = tables.graph
    for i, op in enumerate(g.ops):
        if op.category == "embedding" or (op.category == "gather" and op.params):
            emb[op.name] = {"sharding": tables.names[int(tables.row_start[i] + best.choice[i])],
                            "table_GB": op.param_count * 2 / 1e9}
    share = ev.breakdown_s.get(ev.bottleneck, 0.0) / ev.step_time_s if ev.step_time_s > 0 else 0.0
    top = sorted(counts.items(), key=lambda kv: -kv[1])[:3]
    summary = (f"{ev.bottleneck} is {share:.0%} of the step; dp={best.mesh.dp} tp={best.mesh.t} pp={best.mesh.pp} "
               f"micro-batch {best.mesh.micro_batch}; {tables.graph.num_ops} operators: "
               + ", ".join(f"{n} {k}" for k, n in top))
    if any(v["sharding"] == "embedding_on_cpu" for v in emb.values()):
        summary += "; embedding tables on CPU parameter servers"
    return {
        "summary": summary,
        "bottleneck": ev.bottleneck,
        "memory_headroom_GB": cap * (1 - headroom) - peak,
        "peak_memory_GB": peak,
        "sharding_summary": counts,
        "embeddings": emb,
        "alternatives": why,
        "notes": notes,
    }
