"""Assignments of an operator graph: the sharding of every operator (greedy with iterated
conditional modes, or as named by the caller) and the contiguous pipeline split (dynamic
programming over cut positions, or as named).  The planner's exact search starts from these
and :func:`cost_model.graph.evaluate.estimate_graph` uses them for a single strategy."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from cost_model.errors import InvalidGraph, InvalidStrategy
from cost_model.graph.mesh import fixed_bytes, inflight
from cost_model.graph.tables import CostTables, local_cost, op_times, p2p_boundary_vector, position_crossing_bytes
from cost_model.transformer.layer_cost import fragmentation_fraction
from cost_model.transformer.memory import static_for_fragmentation


def greedy_choices(tables: CostTables, memory_weight: float = 0.0, rounds: int = 3, forbid_cpu: bool = False) -> np.ndarray:
    """Iterated conditional modes: start from each op's cheapest choice, then re-pick every op
    given its neighbours' current choices (edges both ways), a few sweeps.  ``memory_weight``
    (seconds per byte) trades time for memory when the plain greedy does not fit."""
    g = tables.graph
    n = g.num_ops
    own = local_cost(tables)
    m = tables.mesh.num_microbatches
    mem = tables.weights_bytes + tables.gradients_bytes + tables.optimizer_state_bytes + tables.activation_bytes * min(tables.mesh.pp, m)
    own = own + memory_weight * mem
    if forbid_cpu:
        own = np.where(np.array([nm == "embedding_on_cpu" for nm in tables.names]), np.inf, own)
    choice = np.zeros(n, dtype=np.int64)
    for i in range(n):
        r = tables.rows(i)
        choice[i] = int(np.argmin(own[r.start:r.stop]))
    return _icm_with(tables, choice, own, rounds)




def assignment_from_names(tables: CostTables, op_shardings: Mapping[str, str]) -> np.ndarray:
    """Choice indices for named shardings; unnamed ops take the greedy choice given them."""
    g = tables.graph
    index = {op.name: i for i, op in enumerate(g.ops)}
    fixed: dict[int, int] = {}
    for name, sh in op_shardings.items():
        if name not in index:
            raise InvalidGraph(f"op_shardings names unknown operator {name!r}", field=f"op_shardings.{name}")
        k = tables.choice_index(index[name], sh)
        if k is None:
            avail = [tables.names[r] for r in tables.rows(index[name])]
            raise InvalidGraph(f"sharding {sh!r} is not available for {name!r} here; choose one of {', '.join(avail)}",
                               field=f"op_shardings.{name}")
        fixed[index[name]] = k
    choice = greedy_choices(tables)
    if not fixed:
        return choice
    for i, k in fixed.items():
        choice[i] = k
    # re-optimise the free ops around the fixed ones
    big = local_cost(tables).copy()
    for i, k in fixed.items():
        for j, r in enumerate(tables.rows(i)):
            if j != k:
                big[r] = np.inf
    return _icm_with(tables, choice, big)


def _icm_with(tables: CostTables, choice: np.ndarray, own: np.ndarray, rounds: int = 3) -> np.ndarray:
    n = tables.graph.num_ops
    m = tables.mesh.num_microbatches
    in_edges: list[list[int]] = [[] for _ in range(n)]
    out_edges: list[list[int]] = [[] for _ in range(n)]
    for e, (u, v, _, _) in enumerate(tables.edges):
        in_edges[v].append(e)
        out_edges[u].append(e)
    for _ in range(rounds):
        changed = False
        for i in tables.analysis.order:
            r = tables.rows(int(i))
            c = own[r.start:r.stop].copy()
            for e in in_edges[i]:
                u = tables.edges[e][0]
                c += m * (tables.edge_fwd_s[e][choice[u], :] + tables.edge_bwd_s[e][choice[u], :])
            for e in out_edges[i]:
                v = tables.edges[e][1]
                c += m * (tables.edge_fwd_s[e][:, choice[v]] + tables.edge_bwd_s[e][:, choice[v]])
            best = int(np.argmin(c))
            if best != choice[i] and c[best] < c[choice[i]] - 1e-15:
                choice[i] = best
                changed = True
        if not changed:
            break
    return choice


def stage_from_names(tables: CostTables, stages: Sequence[Sequence[str]]) -> np.ndarray:
    """stage_of_op for stages given as lists of operator names; every operator in exactly one
    stage and no tensor flowing to an earlier stage, else :class:`InvalidGraph`."""
    g = tables.graph
    index = {op.name: i for i, op in enumerate(g.ops)}
    if len(stages) != tables.mesh.pp:
        raise InvalidStrategy(f"{len(stages)} stages given for pp={tables.mesh.pp}", field="stages")
    out = np.full(g.num_ops, -1, dtype=np.int64)
    for k, names in enumerate(stages):
        for nm in names:
            if nm not in index:
                raise InvalidGraph(f"stage {k} names unknown operator {nm!r}", field=f"stages[{k}]")
            out[index[nm]] = k
    if (out < 0).any():
        missing = [g.ops[i].name for i in np.nonzero(out < 0)[0][:5]]
        raise InvalidGraph(f"operators in no stage: {', '.join(missing)}", field="stages")
    for name, u in g.producer.items():
        for c in g.consumers.get(name, ()):
            if out[c] < out[u]:
                raise InvalidGraph(f"{g.ops[c].name!r} (stage {out[c]}) consumes {name!r} from a later stage {out[u]}", field="stages")
    return out



def bottleneck_split(tables: CostTables, choice: np.ndarray, headroom_fraction: float = 0.0,
                     bisections: int = 40, with_p2p: bool = False) -> np.ndarray | None:
    """Contiguous split at chain starts with the smallest bottleneck stage time (op times, p2p
    left out) under per-stage memory, over *every* chain start: for a bottleneck T the split
    that makes each stage as long as T and its memory allow (leaving a chain for each later
    stage) is feasible whenever any split is, so T is found by bisection — O(pp · log) per
    step, for graphs where :func:`split_stages` over all cut positions is too slow.  Returns
    stage_of_op, or None when no split fits.

    ``with_p2p``: a stage's time also holds the p2p of its boundaries
    (:func:`p2p_boundary_vector` of the bytes crossing each cut), and each stage ends at the
    last cut that keeps it within T — a heuristic (a later start can cost more p2p, so the
    greedy split is no longer the exact least bottleneck) that steers cuts to where little
    crosses."""
    mesh = tables.mesh
    pp = mesh.pp
    n = tables.graph.num_ops
    if pp == 1:
        return np.zeros(n, dtype=np.int64)
    an = tables.analysis
    chain_of_op = an.chain_id[an.position]
    n_chains = int(an.chain_id.max()) + 1
    if n_chains < pp:
        return None
    rows = tables.row_start[:-1] + choice
    # the optimizer state (allocated once) does not fragment, as in evaluate's peak
    static = static_for_fragmentation(tables.weights_bytes, tables.gradients_bytes, tables.optimizer_state_bytes, tables.training.framework)[rows]
    act = tables.activation_bytes[rows]

    def cum(per_op: np.ndarray) -> np.ndarray:
        out: np.ndarray = np.concatenate([[0.0], np.cumsum(np.bincount(chain_of_op, weights=per_op, minlength=n_chains))])
        return out

    cum_t = cum(op_times(tables, choice))
    cap = (mesh.device.memory_bytes * (1.0 - headroom_fraction) - fixed_bytes(tables.training, mesh)) / (1 + fragmentation_fraction())
    cum_m = [cum(static + inflight(mesh, k) * act) for k in range(pp)]

    # p2p[k][c]: one crossing of boundary k|k+1 cut at chain c's start
    p2p = np.zeros((max(pp - 1, 1), n_chains + 1))
    if with_p2p:
        crossing = position_crossing_bytes(tables)[np.append(np.flatnonzero(an.chain_start), tables.graph.num_ops)]
        p2p = np.array([p2p_boundary_vector(tables, crossing, k) for k in range(pp - 1)])

    def ends(T: float) -> list[int] | None:
        pos, out = 0, []
        for k in range(pp):
            last = n_chains - (pp - 1 - k)  # leave one chain for each later stage
            budget = T - (p2p[k - 1][pos] if k > 0 else 0.0)
            e_t = int(np.searchsorted(cum_t, cum_t[pos] + budget, side="right")) - 1
            e_m = int(np.searchsorted(cum_m[k], cum_m[k][pos] + cap, side="right")) - 1
            end = min(e_t, e_m, last) if k < pp - 1 else n_chains
            if with_p2p and k < pp - 1 and end > pos:  # the last cut whose crossing still fits
                ok = np.flatnonzero(cum_t[pos + 1:end + 1] + p2p[k][pos + 1:end + 1] <= cum_t[pos] + budget)
                end = pos + 1 + int(ok[-1]) if len(ok) else pos
            if end <= pos or (k == pp - 1 and (cum_t[end] - cum_t[pos] > budget or cum_m[k][end] - cum_m[k][pos] > cap)):
                return None
            out.append(end)
            pos = end
        return out

    lo, hi = float(cum_t[-1]) / pp, float(cum_t[-1]) + 2.0 * float(p2p.max())
    best = ends(hi)
    if best is None:
        return None
    for _ in range(bisections):
        mid = 0.5 * (lo + hi)
        got = ends(mid)
        if got is None:
            lo = mid
        else:
            hi, best = mid, got
    stage_of_chain = np.searchsorted(np.array(best), np.arange(n_chains), side="right")
    return np.asarray(stage_of_chain[chain_of_op], dtype=np.int64)


def split_stages(tables: CostTables, choice: np.ndarray, cut_positions: Sequence[int] | None = None,
                 headroom_fraction: float = 0.0) -> np.ndarray | None:
    """Contiguous split of the analysis order into ``pp`` stages minimising the bottleneck stage
    time (op times + boundary p2p) under per-stage memory, by dynamic programming over the
    allowed cut positions (a cut at position p puts order[p:] after it; default: the starts of
    elementwise chains).  Returns stage_of_op, or None when no split fits."""
    mesh = tables.mesh
    pp = mesh.pp
    n = tables.graph.num_ops
    if pp == 1:
        return np.zeros(n, dtype=np.int64)
    order = tables.analysis.order
    ot = op_times(tables, choice)[order]
    rows = tables.row_start[:-1] + choice
    static = static_for_fragmentation(tables.weights_bytes, tables.gradients_bytes, tables.optimizer_state_bytes, tables.training.framework)[rows][order]
    act = tables.activation_bytes[rows][order]
    cum_t = np.concatenate([[0.0], np.cumsum(ot)])
    cum_s = np.concatenate([[0.0], np.cumsum(static)])
    cum_a = np.concatenate([[0.0], np.cumsum(act)])
    allowed = np.nonzero(tables.analysis.chain_start)[0] if cut_positions is None else cut_positions
    cuts = sorted(set(int(c) for c in allowed if 0 < c < n))
    pts = np.array([0] + cuts + [n], dtype=np.int64)
    P = len(pts)
    if pp > P - 1:
        return None
    cap = mesh.device.memory_bytes * (1.0 - headroom_fraction)
    fixed = fixed_bytes(tables.training, mesh)
    crossing = position_crossing_bytes(tables)[pts]
    p2p = np.zeros((pp, P))  # p2p[k, j]: one crossing of boundary k|k+1 placed at pts[j]
    for k in range(pp - 1):
        p2p[k] = p2p_boundary_vector(tables, crossing, k)
    INF = np.inf
    best = np.full((pp, P), INF)
    arg = np.zeros((pp, P), dtype=np.int64)

    def seg_cost(i_idx: np.ndarray, j: int, k: int) -> np.ndarray:
        s_, e_ = pts[i_idx], pts[j]
        fl = inflight(mesh, k)
        mem = (cum_s[e_] - cum_s[s_] + fl * (cum_a[e_] - cum_a[s_])) * (1 + fragmentation_fraction()) + fixed
        tt = cum_t[e_] - cum_t[s_]
        if k > 0:
            tt = tt + p2p[k - 1][i_idx]
        if k < pp - 1:
            tt = tt + p2p[k][j]
        return np.where(mem > cap, INF, tt)

    for j in range(1, P):
        best[0][j] = seg_cost(np.array([0]), j, 0)[0]
    for k in range(1, pp):
        for j in range(k + 1, P):
            i_idx = np.arange(k, j)
            v = np.maximum(best[k - 1][i_idx], seg_cost(i_idx, j, k))
            a = int(np.argmin(v))
            best[k][j] = v[a]
            arg[k][j] = i_idx[a]
    if not np.isfinite(best[pp - 1][P - 1]):
        return None
    ends = [P - 1]
    for k in range(pp - 1, 0, -1):
        ends.append(int(arg[k][ends[-1]]))
    ends = ends[::-1]  # ends[k]: index into pts where stage k ends
    stage_pos = np.zeros(n, dtype=np.int64)
    start = 0
    for k in range(pp):
        e_ = int(pts[ends[k]])
        stage_pos[start:e_] = k
        start = e_
    stage_of_op = np.empty(n, dtype=np.int64)
    stage_of_op[order] = stage_pos
    return stage_of_op
