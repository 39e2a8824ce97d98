"""Coarsening: operators planned in chains, and the positions where a pipeline stage may start.

A chain (``cost_model.graph.analysis.analyse``: a head operator and the elementwise / activation /
layout operators that follow it) is planned as one node.  Its choices are the combinations of
its members' choices, with the resharding inside the chain priced in; combinations are merged by
their *interface so far* (the layouts they require of external inputs and their gradients, and
the layouts of produced tensors still needed later) and, per interface, dominated combinations
(no better in any cost term) are dropped — an exact reduction.  Large graphs keep fewer
combinations (cheapest and least-memory per interface), and the solver optimises over what is
kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from cost_model.graph.ir import GraphSpec
from cost_model.graph.tables import CostTables, position_crossing_bytes
from cost_model.transformer.layer_cost import DP_OVERLAP_WINDOW
from cost_model.transformer.memory import static_for_fragmentation

Array = npt.NDArray[Any]

#: Stage cuts are allowed at this many positions at most.
MAX_SEGMENTS = 48
#: Combinations one chain keeps at most (beyond, the cheapest by a step-time proxy).
MAX_GROUP_COMBOS = 96
#: Graphs of at most this many operators are coarsened exactly (Pareto sets per interface).
EXACT_COARSEN_OPS = 400

# Columns of the per-combination cost vector.
_TIME, _BWD, _SYNC, _OPT, _STATIC, _ACT, _CPU_T, _CPU_MEM, _CPU_OPT = range(9)
_N_TERMS = 9


@dataclass(frozen=True, kw_only=True)
class Group:
    """A chain of operators planned as one node; ``combos[a]`` gives each member's choice.  Per
    combination: seconds per micro-batch (``time_s``: forward + backward + collectives inside
    the ops + resharding inside the chain), data-parallel sync, optimizer and CPU terms, and
    bytes per GPU."""

    members: tuple[int, ...]
    combos: Array  # [n, len(members)]
    time_s: Array
    bwd_s: Array  # backward compute (the DP overlap window)
    sync_s: Array
    opt_s: Array
    static_bytes: Array  # weights, gradients, optimizer state
    act_bytes: Array  # saved activations per micro-batch
    cpu_s: Array
    cpu_mem_bytes: Array
    cpu_opt_s: Array

    @property
    def n(self) -> int:
        return len(self.combos)


@dataclass(frozen=True, kw_only=True)
class Coarse:
    groups: list[Group]
    group_of_op: Array
    edges: list[tuple[int, int, Array]]  # (U, V, seconds per micro-batch [nU, nV]), charged to V
    exact: bool  # False when a chain was pruned (beam, thinning or the combination limit)


def _pareto(vecs: Array) -> list[int]:
    """Indices of rows not dominated (≤ everywhere; exact duplicates keep one)."""
    rows = [tuple(v) for v in vecs.tolist()]
    order = sorted(range(len(rows)), key=lambda i: rows[i])
    keep: list[int] = []
    for i in order:
        v = rows[i]
        if not any(all(a <= b + 1e-15 for a, b in zip(rows[j], v, strict=True)) for j in keep):
            keep.append(i)
    return keep


def _first_per_bucket(order: Array, bucket: Array) -> Array:
    """Mask over ``order``: the first entry of each bucket."""
    first = np.ones(len(order), dtype=bool)
    first[1:] = bucket[order][1:] != bucket[order][:-1]
    return first


@dataclass(frozen=True, kw_only=True)
class _Setup:
    """What every chain's enumeration reads."""

    tables: CostTables
    internal_in: dict[int, list[int]]  # op -> edges from inside its chain
    external_in: dict[int, list[int]]  # op -> edges from other chains
    row_vec: Array  # [rows, 9] cost terms per row
    num_microbatches: int
    overlap_span: float  # DP overlap window + pp (stages)
    exact: bool
    memory: bool


def _chains(tables: CostTables) -> tuple[list[list[int]], Array]:
    an = tables.analysis
    chains: list[list[int]] = []
    for p in range(tables.graph.num_ops):
        if an.chain_start[p]:
            chains.append([])
        chains[-1].append(int(an.order[p]))
    group_of_op = np.empty(tables.graph.num_ops, dtype=np.int64)
    for gi, mem in enumerate(chains):
        for i in mem:
            group_of_op[i] = gi
    return chains, group_of_op


def _setup(tables: CostTables, group_of_op: Array, exact: bool, memory: bool) -> _Setup:
    internal_in: dict[int, list[int]] = {}
    external_in: dict[int, list[int]] = {}
    for e, (u, v, _name, _slot) in enumerate(tables.edges):
        (internal_in if group_of_op[u] == group_of_op[v] else external_in).setdefault(v, []).append(e)
    tm = tables.fwd_s + tables.bwd_s + tables.comm_fwd_s + tables.comm_bwd_s
    static = static_for_fragmentation(tables.weights_bytes, tables.gradients_bytes, tables.optimizer_state_bytes, tables.training.framework)
    cpu_t = tables.cpu_s + tables.cpu_comm_s
    row_vec = np.stack([tm, tables.bwd_s, tables.sync_s, tables.opt_s, static, tables.activation_bytes, cpu_t,
                        tables.cpu_memory_bytes, tables.cpu_opt_s], axis=1)
    return _Setup(tables=tables, internal_in=internal_in, external_in=external_in, row_vec=row_vec,
                  num_microbatches=tables.mesh.num_microbatches, overlap_span=DP_OVERLAP_WINDOW + tables.mesh.pp,
                  exact=exact, memory=memory)


def _live_until(graph: GraphSpec, mem: list[int]) -> dict[tuple[int, int], int]:
    """(op, output slot) → the last chain position that reads it (``len(mem)``: read outside)."""
    pos_in = {op: k for k, op in enumerate(mem)}
    out: dict[tuple[int, int], int] = {}
    for op in mem:
        for slot, name in enumerate(graph.ops[op].outputs):
            last = -1
            for c in graph.consumers.get(name, ()):
                last = max(last, pos_in[c] if c in pos_in else len(mem))
            if last >= 0:
                out[(op, slot)] = last
    return out


def _output_layouts(tables: CostTables, C: Array, pos_in: dict[int, int], outs: list[tuple[int, int]]) -> list[Array]:
    """Per (op, slot) of ``outs``: the layout code each combination gives that output."""
    cols = []
    for o, sl in outs:
        ro = int(tables.row_start[o])
        lut = np.array([tables.out_l[ro + c][sl] for c in range(tables.n_choices(o))], dtype=np.int64)
        cols.append(lut[C[:, pos_in[o]]])
    return cols


def _extend(s: _Setup, C: Array, V: Array, ext: Array, k: int, op: int, pos_in: dict[int, int]) -> tuple[Array, Array, Array]:
    """Every partial combination × every choice of member ``k`` (op ``op``): the member's costs
    and the resharding from inside the chain added, the external-input signature extended."""
    tables = s.tables
    r0 = int(tables.row_start[op])
    nc = tables.n_choices(op)
    P = len(C)
    C = np.concatenate([np.repeat(C, nc, axis=0), np.tile(np.arange(nc), P)[:, None]], axis=1)
    V = (V[:, None, :] + s.row_vec[r0:r0 + nc][None, :, :]).reshape(P * nc, _N_TERMS)
    for e in s.internal_in.get(op, ()):
        u = tables.edges[e][0]
        E = tables.edge_fwd_s[e] + tables.edge_bwd_s[e]
        V[:, _TIME] += E[C[:, pos_in[u]], C[:, k]]
    sigs = [tuple((tables.in_l[r0 + c][tables.edges[e][3]], tables.in_g[r0 + c][tables.edges[e][3]])
                  for e in s.external_in.get(op, ())) for c in range(nc)]
    uniq = {sg: i for i, sg in enumerate(dict.fromkeys(sigs))}
    sig_id = np.array([uniq[sg] for sg in sigs], dtype=np.int64)
    ext = np.repeat(ext, nc) * (len(uniq) + 1) + sig_id[C[:, k]]
    _, ext = np.unique(ext, return_inverse=True)
    return C, V, ext.ravel().astype(np.int64)


def _keep_pareto(s: _Setup, V: Array, bucket: Array) -> Array:
    """Per interface bucket, the combinations no other beats in every cost term (exact)."""
    sel: list[int] = []
    order_b = np.argsort(bucket, kind="stable")
    bounds = np.flatnonzero(np.diff(bucket[order_b])) + 1
    for grp in np.split(order_b, bounds):
        if len(grp) == 1:
            sel.append(int(grp[0]))
            continue
        cols = [V[grp, _TIME], V[grp, _SYNC], V[grp, _SYNC] - s.overlap_span * V[grp, _BWD], V[grp, _OPT],
                V[grp, _CPU_T], V[grp, _CPU_OPT]]
        if s.memory:
            cols += [V[grp, _STATIC], V[grp, _ACT], V[grp, _CPU_MEM]]
        sel.extend(int(grp[i]) for i in _pareto(np.stack(cols, axis=1)))
    return np.array(sorted(sel), dtype=np.int64)


def _keep_cheapest(V: Array, bucket: Array, proxy: Array) -> Array:
    """Per interface bucket, the cheapest combination by the step-time proxy and the one with
    the least memory."""
    o1 = np.lexsort((proxy, bucket))
    o2 = np.lexsort((V[:, _STATIC] + V[:, _ACT], bucket))
    return np.unique(np.concatenate([o1[_first_per_bucket(o1, bucket)], o2[_first_per_bucket(o2, bucket)]]))


def _proxy(V: Array, m: int) -> Array:
    """Step-time proxy of a combination: m micro-batches of its time, sync, optimizer, CPU."""
    result: Array = V[:, _TIME] * m + V[:, _SYNC] + V[:, _OPT] + V[:, _CPU_T] * m
    return result


def _chain_combos(s: _Setup, mem: list[int], keep: Array | None, max_per_group: int | None) -> tuple[Group, bool]:
    """The useful combinations of one chain; the flag is False when some were pruned."""
    tables = s.tables
    m = s.num_microbatches
    pos_in = {op: k for k, op in enumerate(mem)}
    live_until = _live_until(tables.graph, mem)
    reduced = True
    C: Array = np.zeros((1, 0), dtype=np.int64)
    V: Array = np.zeros((1, _N_TERMS))
    ext: Array = np.zeros(1, dtype=np.int64)
    for k, op in enumerate(mem):
        C, V, ext = _extend(s, C, V, ext, k, op, pos_in)
        live = [(o, sl) for (o, sl), until in live_until.items() if pos_in[o] <= k and until > k]
        _, bucket = np.unique(np.stack([ext, *_output_layouts(tables, C, pos_in, live)], axis=1), axis=0, return_inverse=True)
        bucket = bucket.ravel()
        proxy = _proxy(V, m)
        if s.exact:
            idx = _keep_pareto(s, V, bucket)
        else:
            idx = _keep_cheapest(V, bucket, proxy)
            reduced = reduced and len(idx) == len(C)
        if len(idx) > MAX_GROUP_COMBOS:
            reduced = False
            idx = idx[np.argsort(proxy[idx], kind="stable")[:MAX_GROUP_COMBOS]]
        C, V, ext = C[idx], V[idx], ext[idx]
    if max_per_group is not None and len(C) > max_per_group:
        reduced = False
        C, V = _thin(C, V, ext, mem, tables, keep, max_per_group, m, live_until)
    group = Group(members=tuple(mem), combos=C, time_s=V[:, _TIME], bwd_s=V[:, _BWD], sync_s=V[:, _SYNC],
                  opt_s=V[:, _OPT], static_bytes=V[:, _STATIC], act_bytes=V[:, _ACT], cpu_s=V[:, _CPU_T],
                  cpu_mem_bytes=V[:, _CPU_MEM], cpu_opt_s=V[:, _CPU_OPT])
    return group, reduced


def _chain_edges(tables: CostTables, groups: list[Group]) -> list[tuple[int, int, Array]]:
    """Resharding seconds between chains, summed per (producer chain, consumer chain)."""
    member_index = {op: (gi, k) for gi, gr in enumerate(groups) for k, op in enumerate(gr.members)}
    acc: dict[tuple[int, int], Array] = {}
    for e, (u, v, _, _) in enumerate(tables.edges):
        U, ku = member_index[u]
        W, kv = member_index[v]
        if U == W:
            continue
        E = tables.edge_fwd_s[e] + tables.edge_bwd_s[e]
        M = E[np.ix_(groups[U].combos[:, ku], groups[W].combos[:, kv])]
        if not M.any():
            continue
        key = (U, W)
        acc[key] = acc[key] + M if key in acc else M.copy()
    return [(U, W, M) for (U, W), M in acc.items()]


def coarsen(tables: CostTables, keep: Array | None = None, max_per_group: int | None = None,
            exact: bool | None = None, memory: bool = True) -> Coarse:
    """Group chains and enumerate each chain's useful combinations of member choices
    (vectorised over partial combinations).

    With ``exact`` (default for graphs of at most :data:`EXACT_COARSEN_OPS` operators) only
    Pareto-optimal combinations survive per interface (time, data-parallel exposure at both ends
    of the overlap range, optimizer, static and activation memory, CPU terms) — an exact
    reduction.  Otherwise each interface keeps its cheapest combination by a step-time proxy and
    its least-memory one, and ``max_per_group`` keeps at most that many per chain: the one
    matching ``keep`` (e.g. the greedy hint), the least memory, then the cheapest per distinct
    interface.

    ``memory=False`` leaves memory out of the dominance test: exact for the problem without
    memory constraints (whose optimum, when it fits, is the optimum)."""
    if exact is None:
        exact = tables.graph.num_ops <= EXACT_COARSEN_OPS
    chains, group_of_op = _chains(tables)
    s = _setup(tables, group_of_op, exact, memory)
    groups: list[Group] = []
    reduced = True
    for mem in chains:
        group, ok = _chain_combos(s, mem, keep, max_per_group)
        groups.append(group)
        reduced = reduced and ok
    return Coarse(groups=groups, group_of_op=group_of_op, edges=_chain_edges(tables, groups), exact=reduced and exact)


def _thin(C: Array, V: Array, ext: Array, mem: list[int], tables: CostTables, keep: Array | None, limit: int, m: int,
          live_until: dict[tuple[int, int], int]) -> tuple[Array, Array]:
    """At most ``limit`` combinations: the one ``keep`` asks for, the least memory, then the
    cheapest of each distinct external interface."""
    proxy = _proxy(V, m)
    chosen: list[int] = []
    if keep is not None:
        want = np.array([int(keep[o]) for o in mem])
        hit = np.flatnonzero((want[None, :] == C).all(axis=1))
        if len(hit):
            chosen.append(int(hit[0]))
    pos_in = {op: k for k, op in enumerate(mem)}
    outs = [(o, sl) for (o, sl), until in live_until.items() if until >= len(mem)]
    _, iface = np.unique(np.stack([ext, *_output_layouts(tables, C, pos_in, outs)], axis=1), axis=0, return_inverse=True)
    iface = iface.ravel()
    o1 = np.lexsort((proxy, iface))
    ranked = sorted(o1[_first_per_bucket(o1, iface)].tolist(), key=lambda i: proxy[i])
    lowmem = int(np.argmin(V[:, _STATIC] + V[:, _ACT]))
    for i in [lowmem, *ranked]:
        if len(chosen) >= limit:
            break
        if i not in chosen:
            chosen.append(int(i))
    idx = np.array(chosen, dtype=np.int64)
    return C[idx], V[idx]


def group_choice_from_ops(coarse: Coarse, choice: Array) -> Array:
    """Index of each group's combination matching per-op choices (nearest when pruned)."""
    out = np.zeros(len(coarse.groups), dtype=np.int64)
    for gi, gr in enumerate(coarse.groups):
        want = choice[list(gr.members)]
        diff = (gr.combos != want[None, :]).sum(axis=1)
        out[gi] = int(np.argmin(diff + 1e-9 * gr.time_s))
    return out


def ops_from_groups(coarse: Coarse, gchoice: Sequence[int], n_ops: int) -> Array:
    """Per-op choices from one combination index per group."""
    out = np.zeros(n_ops, dtype=np.int64)
    for gi, gr in enumerate(coarse.groups):
        out[list(gr.members)] = gr.combos[int(gchoice[gi])]
    return out


def cut_candidates(tables: CostTables, choice: Array | None = None, limit: int = MAX_SEGMENTS) -> list[int]:
    """Positions (in the analysis order) where a stage may start: chain starts; when there are
    more than ``limit``, the one with the least crossing activation traffic in each of
    ``limit`` equal slices of the cumulative compute time (of ``choice``, else each op's first
    choice)."""
    an = tables.analysis
    starts = [int(p) for p in np.nonzero(an.chain_start)[0] if p > 0]
    if len(starts) <= limit:
        return starts
    if choice is None:
        choice = np.zeros(tables.graph.num_ops, dtype=np.int64)
    rows = tables.row_start[:-1] + choice
    t = (tables.fwd_s + tables.bwd_s)[rows][an.order]
    cum = np.concatenate([[0.0], np.cumsum(t)])
    total = cum[-1] if cum[-1] > 0 else 1.0
    crossing = position_crossing_bytes(tables)
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
