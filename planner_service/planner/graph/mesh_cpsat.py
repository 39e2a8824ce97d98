"""CP-SAT for one mesh: every chain's combination and the contiguous stage split, exactly.

The model, in the order of the OR-tools samples (data → variables → constraints → objective →
solve → extract), one method each in :class:`MeshSolver`:

* data (:func:`mesh_data`): chains grouped into *segments* between the allowed cut points,
  every cost term scaled to integers with one :class:`planner_service.planner.cpsat.IntScale`;
* variables: ``x[g][a]`` (chain g takes combination a); per chain-to-chain edge either product
  Booleans ``y[a][b]`` (the local-polytope relaxation Alpa uses: a tight LP bound) or one bound
  ``r`` (≥ the matrix entry of the chosen pair); ``z[s][k]`` (segment s runs on stage k),
  ``bnd[s][k]`` (stage boundary k|k+1 right after segment s); big-M products ``w ≥ value −
  M·(1 − z)`` for per-stage time, data-parallel exposure, optimizer time and memory; the
  bottleneck ``T``, the exposed data-parallel sync ``D`` and the optimizer step ``O``;
* objective: ``(m−1)·T + Σ stage times + p2p + T_cpu + D + O`` — the step time of
  :func:`cost_model.graph.evaluate.evaluate` (the optimizer's kernel launches are a constant
  added back on extraction).

A hint (per-op choices, stage of each op) sets every variable.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from cost_model.graph.mesh import fixed_bytes, inflight
from cost_model.graph.tables import CostTables, p2p_boundary_vector, position_crossing_bytes
from cost_model.transformer.layer_cost import dp_overlap_fraction, fragmentation_fraction
from planner_service.planner.cpsat import CpModel, IntScale, Solution, SolverParams, solve
from planner_service.planner.graph.coarsen import Coarse, group_choice_from_ops, ops_from_groups

Array = npt.NDArray[Any]
Expr = Any  # a CP-SAT linear expression (or a plain int when every coefficient is 0)

#: Above this many chains, presolve's inclusion detection costs more than it buys.
LARGE_MODEL_GROUPS = 300
#: Edge formulations with at most this many (choice, choice) cells use product variables.
MARGINAL_EDGE_CELLS = 40_000
#: Time units per reference step: fine for small models, coarser above this many choices
#: (large coefficients slow the LP).
FINE_TIME_RESOLUTION, COARSE_TIME_RESOLUTION, FINE_TIME_MAX_TERMS = 1e8, 1e6, 400
#: Memory units per GPU (and per CPU pool).
MEMORY_RESOLUTION = 1e6


#: CP-SAT stops once its answer is proved within this fraction of the model's optimum.
RELATIVE_GAP_LIMIT = 0.01
#: Fixed CP-SAT seed: the same model gives the same answer.
RANDOM_SEED = 7
#: Deterministic-time units per second of budget: a solve stops on CP-SAT's own work count
#: (the same point on every run) well before its wall-clock cap on an unloaded host.
DETERMINISTIC_TIME_PER_S = 0.5


@dataclass(frozen=True)
class SolveResult:
    """``bound_s``: a proved lower bound (s) on the step time of every assignment this model
    allows (the integer rounding of its time coefficients taken off; memory is rounded against
    the plan, by at most a millionth of a GPU per term); with a cutoff and status INFEASIBLE,
    the cutoff itself.  It bounds the mesh's problem only when the coarsening was exact and
    every chain start was a possible cut."""

    choice: Array
    stage_of_op: Array
    status: str
    objective_s: float | None
    wall_s: float
    bound_s: float | None = None


def problem_scale(reference_step_s: float, capacity_bytes: float, n_terms: int, cpu_capacity_bytes: float = 1.0) -> IntScale:
    """Units: 1/1e8 of a reference step time for small models (1/1e6 above 400 choice
    variables), 1/1e6 of a GPU's (and of the CPU pool's) memory."""
    resolution = FINE_TIME_RESOLUTION if n_terms <= FINE_TIME_MAX_TERMS else COARSE_TIME_RESOLUTION
    return IntScale(time_unit_s=max(reference_step_s, 1e-9) / resolution,
                    memory_unit_bytes=max(capacity_bytes, 1.0) / MEMORY_RESOLUTION,
                    cpu_memory_unit_bytes=max(cpu_capacity_bytes, 1.0) / MEMORY_RESOLUTION)


@dataclass(frozen=True, kw_only=True)
class EdgeData:
    """Resharding between two chains in time units, charged to the consumer ``V``."""

    U: int
    V: int
    cost: Array  # [nU, nV] int
    form: str  # "row" (nU = 1), "col" (nV = 1), "marginal" (product Booleans) or "bound" (one r)


@dataclass(frozen=True, kw_only=True)
class MeshData:
    """Everything the model reads, in integers."""

    pp: int
    m: int
    num_groups: int
    group_sizes: list[int]
    seg_groups: list[list[int]]  # chains of each segment
    scale: IntScale
    time: list[Array]  # per chain: time per micro-batch
    bwd: list[Array]
    sync: list[Array]
    opt: list[Array]
    cpu_time: list[Array]
    cpu_opt: list[Array]
    static: list[Array]  # memory units (fragmentation included)
    act: list[Array]
    window_bwd: list[list[Array]]  # per stage k: rint((window + k)·bwd) per chain
    edges: list[EdgeData]
    p2p: Array  # [segments, pp − 1] time units of a stage boundary after segment s
    capacity: int  # GPU memory units for state + in-flight activations
    cpu_memory: list[tuple[int, Array]]  # (chain, CPU memory units) for chains that use it
    cpu_capacity: int | None
    inflight: list[int]  # per stage
    cutoff: int | None  # objective bound (time units) when only better answers matter
    constant_s: float  # added to the objective on extraction
    hint_groups: Array | None  # combination per chain
    hint_stages: Array | None  # stage per segment

    @property
    def nseg(self) -> int:
        return len(self.seg_groups)

    def seg_max(self, s: int, arrs: Sequence[Array]) -> int:
        return int(sum(int(arrs[g].max()) for g in self.seg_groups[s]))

    def edge_max(self, V: int) -> int:
        return sum(int(e.cost.max()) for e in self.edges if e.V == V)

    def time_max(self, s: int) -> int:
        """Largest time of segment s (its chains' and their incoming resharding)."""
        return self.seg_max(s, self.time) + sum(self.edge_max(g) for g in self.seg_groups[s])


def _segments(tables: CostTables, coarse: Coarse, cuts: Sequence[int]) -> tuple[list[list[int]], list[int]]:
    """Chains grouped between cut points: the chains of each segment and its first position."""
    an = tables.analysis
    G = len(coarse.groups)
    gpos = np.array([int(an.position[gr.members[0]]) for gr in coarse.groups])
    cutset = np.array(sorted(set(int(c) for c in cuts)), dtype=np.int64)
    raw_seg = np.searchsorted(cutset, gpos, side="right") if len(cutset) else np.zeros(G, dtype=np.int64)
    uniq = sorted(set(int(s) for s in raw_seg))
    remap = {s: i for i, s in enumerate(uniq)}
    seg_of_group = np.array([remap[int(s)] for s in raw_seg], dtype=np.int64)
    seg_groups = [[int(g) for g in np.flatnonzero(seg_of_group == s)] for s in range(len(uniq))]
    return seg_groups, [int(gpos[sg[0]]) for sg in seg_groups]


def _p2p_seconds(tables: CostTables, seg_start_pos: list[int]) -> Array:
    pp = tables.mesh.pp
    nseg = len(seg_start_pos)
    P2P = np.zeros((nseg, max(pp - 1, 1)))
    if pp > 1:
        crossing = position_crossing_bytes(tables)
        sizes = np.array([crossing[seg_start_pos[s + 1]] if s + 1 < nseg else 0.0 for s in range(nseg)])
        for k in range(pp - 1):
            P2P[:, k] = p2p_boundary_vector(tables, sizes, k)
    return P2P


def _edge_data(coarse: Coarse, scale: IntScale) -> list[EdgeData]:
    marginal = sum(M.size for _, _, M in coarse.edges) <= MARGINAL_EDGE_CELLS
    out = []
    for (U, V, M) in coarse.edges:
        Mi = scale.time(M)
        if not Mi.any():
            continue
        nu, nv = Mi.shape
        form = "row" if nu == 1 else "col" if nv == 1 else "marginal" if marginal else "bound"
        out.append(EdgeData(U=U, V=V, cost=Mi, form=form))
    return out


def _hint_values(coarse: Coarse, seg_groups: list[list[int]], pp: int,
                 hint: tuple[Array, Array | None] | None) -> tuple[Array | None, Array | None]:
    """Combination per chain and stage per segment of the hint (stages evenly by segment when
    the hint has none or they are not a contiguous split)."""
    if hint is None:
        return None, None
    groups = coarse.groups
    nseg = len(seg_groups)
    hg = group_choice_from_ops(coarse, hint[0])
    hs = None
    if hint[1] is not None and len(hint[1]):
        hs = np.array([int(hint[1][groups[sg[0]].members[0]]) for sg in seg_groups])
        ok = hs[0] == 0 and hs[-1] == pp - 1 and np.all(np.diff(hs) >= 0) and np.all(np.diff(hs) <= 1)
        if not ok:
            hs = None
    if hs is None:
        hs = np.minimum((np.arange(nseg) * pp) // nseg, pp - 1)
    return hg, hs


def mesh_data(tables: CostTables, coarse: Coarse, cuts: Sequence[int], headroom_fraction: float = 0.1,
              hint: tuple[Array, Array | None] | None = None, cutoff_s: float | None = None) -> MeshData | None:
    """The integer data of the model; None when there are fewer segments than stages."""
    mesh = tables.mesh
    pp = mesh.pp
    m = mesh.num_microbatches
    groups = coarse.groups
    seg_groups, seg_start_pos = _segments(tables, coarse, cuts)
    if len(seg_groups) < pp:
        return None
    P2P = _p2p_seconds(tables, seg_start_pos)
    ref = float(np.sum([gr.time_s.min() for gr in groups]) * m + 1e-6)
    scale = problem_scale(ref, mesh.device.memory_bytes, sum(gr.n for gr in groups),
                          mesh.cpu.memory_bytes if mesh.cpu is not None else 1.0)
    ti = scale.time
    b_i = [ti(gr.bwd_s) for gr in groups]
    window = dp_overlap_fraction(tables.training, mesh.device, mesh.pp)
    cap_total = mesh.device.memory_bytes * (1.0 - headroom_fraction) - fixed_bytes(tables.training, mesh)
    pool = mesh.cpu
    cpu_memory = [(g, scale.cpu_memory_up(groups[g].cpu_mem_bytes)) for g in range(len(groups)) if groups[g].cpu_mem_bytes.any()]
    constant_s = 4 * mesh.device.efficiency.kernel_overhead_s  # evaluate() adds the optimizer's kernel launches
    cutoff = None
    if cutoff_s is not None:
        cutoff = int(math.floor((cutoff_s - constant_s) / scale.time_unit_s))
    hg, hs = _hint_values(coarse, seg_groups, pp, hint)
    return MeshData(
        pp=pp, m=m, num_groups=len(groups), group_sizes=[gr.n for gr in groups], seg_groups=seg_groups, scale=scale,
        time=[ti(gr.time_s) for gr in groups], bwd=b_i, sync=[ti(gr.sync_s) for gr in groups],
        opt=[ti(gr.opt_s) for gr in groups], cpu_time=[ti(gr.cpu_s) for gr in groups],
        cpu_opt=[ti(gr.cpu_opt_s) for gr in groups],
        static=[scale.memory_up(gr.static_bytes * (1 + fragmentation_fraction())) for gr in groups],
        act=[scale.memory_up(gr.act_bytes * (1 + fragmentation_fraction())) for gr in groups],
        window_bwd=[[np.rint((window + k) * b).astype(np.int64) for b in b_i] for k in range(pp)],
        edges=_edge_data(coarse, scale), p2p=ti(P2P),
        capacity=scale.memory_down(cap_total) if cap_total > 0 else -1,
        cpu_memory=cpu_memory if pool is not None else [],
        cpu_capacity=scale.cpu_memory_down(pool.memory_bytes * (1.0 - headroom_fraction)) if pool is not None else None,
        inflight=[inflight(mesh, k) for k in range(pp)], cutoff=cutoff, constant_s=constant_s,
        hint_groups=hg, hint_stages=hs,
    )


@dataclass(kw_only=True)
class _Vars:
    """The model's variables (created in one pass, in a fixed order)."""

    x: list[list[Any]]
    y: dict[int, list[list[Any]]]  # edge index -> product Booleans
    r: dict[int, Any]  # edge index -> bound
    bottleneck: Any  # T: the slowest stage's time per micro-batch
    dp_exposed: Any  # D: the exposed data-parallel sync
    optimizer: Any  # O: the optimizer step
    z: list[list[Any]] | None = None
    bnd: list[list[Any]] = field(default_factory=list)
    wt: list[list[Any]] = field(default_factory=list)  # [stage][segment]
    wd: list[list[tuple[int, Any]]] = field(default_factory=list)  # [stage] (segment, var)
    wo: list[list[tuple[int, Any]]] = field(default_factory=list)
    wm: list[list[tuple[int, Any]]] = field(default_factory=list)


class MeshSolver:
    """The CP-SAT model of one mesh (see the module docstring), built and solved once."""

    def __init__(self, data: MeshData, coarse: Coarse, n_ops: int) -> None:
        self.d = data
        self.coarse = coarse
        self.n_ops = n_ops
        self.model = CpModel()
        self.v = self._variables()
        self._seg_times: list[Expr] | None = None

    # ---- expressions ---------------------------------------------------------------------
    def lin(self, g: int, ci: Array) -> Expr:
        x = self.v.x
        return sum(int(ci[a]) * x[g][a] for a in range(len(ci)) if ci[a] != 0)

    def seg_lin(self, s: int, arrs: Sequence[Array]) -> Expr:
        return sum(self.lin(g, arrs[g]) for g in self.d.seg_groups[s])

    def edge_expr(self, i: int, e: EdgeData) -> Expr:
        x, Mi = self.v.x, e.cost
        nu, nv = Mi.shape
        if e.form == "row":
            return sum(int(Mi[0, b]) * x[e.V][b] for b in range(nv) if Mi[0, b])
        if e.form == "col":
            return sum(int(Mi[a, 0]) * x[e.U][a] for a in range(nu) if Mi[a, 0])
        if e.form == "marginal":
            y = self.v.y[i]
            return sum(int(Mi[a, b]) * y[a][b] for a in range(nu) for b in range(nv) if Mi[a, b])
        return self.v.r[i]

    def seg_time(self, s: int) -> Expr:
        """Time of segment s: its chains and the resharding into them (built once)."""
        if self._seg_times is None:
            into: dict[int, list[Expr]] = {}
            for i, e in enumerate(self.d.edges):
                into.setdefault(e.V, []).append(self.edge_expr(i, e))
            self._seg_times = [self.seg_lin(k, self.d.time) + sum(sum(into.get(g, [])) for g in self.d.seg_groups[k])
                               for k in range(self.d.nseg)]
        return self._seg_times[s]

    def cpu_time(self) -> Expr:
        return sum(self.lin(g, self.d.cpu_time[g]) for g in range(self.d.num_groups) if self.d.cpu_time[g].any())

    def cpu_opt(self) -> Expr:
        return sum(self.lin(g, self.d.cpu_opt[g]) for g in range(self.d.num_groups) if self.d.cpu_opt[g].any())

    def p2p_total(self) -> Expr:
        d, bnd = self.d, self.v.bnd
        return sum(2 * int(d.p2p[s, k]) * bnd[s][k] for s in range(d.nseg - 1) for k in range(d.pp - 1) if bnd[s][k] is not None)

    # ---- variables -----------------------------------------------------------------------
    def _variables(self) -> _Vars:
        d, model = self.d, self.model
        x = [[model.new_bool_var(f"x{g}_{a}") for a in range(n)] for g, n in enumerate(d.group_sizes)]
        y: dict[int, list[list[Any]]] = {}
        r: dict[int, Any] = {}
        for i, e in enumerate(d.edges):
            nu, nv = e.cost.shape
            if e.form == "marginal":
                y[i] = [[model.new_bool_var(f"y{e.U}_{e.V}_{a}_{b}") for b in range(nv)] for a in range(nu)]
            elif e.form == "bound":
                r[i] = model.new_int_var(0, int(e.cost.max()), f"r{e.U}_{e.V}")
        bottleneck = model.new_int_var(0, int(sum(d.time_max(s) for s in range(d.nseg))) + int(sum(int(c.max()) for c in d.cpu_time)) + 1, "T")
        dp_exposed = model.new_int_var(0, int(sum(int(a.max()) for a in d.sync)) + 1, "D")
        optimizer = model.new_int_var(0, int(sum(int(a.max()) for a in d.opt)) + int(sum(int(a.max()) for a in d.cpu_opt)) + 1, "O")
        v = _Vars(x=x, y=y, r=r, bottleneck=bottleneck, dp_exposed=dp_exposed, optimizer=optimizer)
        if d.pp > 1:
            self._stage_variables(v)
        return v

    def _stage_variables(self, v: _Vars) -> None:
        d, model = self.d, self.model
        nseg, pp = d.nseg, d.pp
        v.z = [[model.new_bool_var(f"z{s}_{k}") for k in range(pp)] for s in range(nseg)]
        v.bnd = [[model.new_bool_var(f"b{s}_{k}") if s < nseg - 1 and d.p2p[s, k] else None for k in range(pp - 1)]
                 for s in range(nseg)]
        for k in range(pp):
            v.wt.append([model.new_int_var(0, max(d.time_max(s), 0), f"wt{s}_{k}") for s in range(nseg)])
            wd = []
            for s in range(nseg):
                fpos = d.seg_max(s, d.sync)
                if fpos:
                    fneg = d.seg_max(s, d.window_bwd[k])
                    wd.append((s, model.new_int_var(-fneg, fpos, f"wd{s}_{k}")))
            v.wd.append(wd)
            v.wo.append([(s, model.new_int_var(0, d.seg_max(s, d.opt), f"wo{s}_{k}"))
                         for s in range(nseg) if d.seg_max(s, d.opt)])
            fl = d.inflight[k]
            v.wm.append([(s, model.new_int_var(0, d.seg_max(s, d.static) + fl * d.seg_max(s, d.act), f"wm{s}_{k}"))
                         for s in range(nseg) if d.seg_max(s, d.static) + fl * d.seg_max(s, d.act)])

    # ---- constraints ---------------------------------------------------------------------
    def _constraints(self) -> None:
        d, model, v = self.d, self.model, self.v
        for g in range(d.num_groups):
            model.add_exactly_one(v.x[g])
        for i, e in enumerate(d.edges):
            self._edge_constraints(i, e)
        cpu_T, cpu_opt = self.cpu_time(), self.cpu_opt()
        if not isinstance(cpu_T, int):
            model.add(cpu_T <= v.bottleneck)
        if not isinstance(cpu_opt, int):
            model.add(cpu_opt <= v.optimizer)
        if d.cpu_memory and d.cpu_capacity is not None:
            model.add(sum(self.lin(g, units) for g, units in d.cpu_memory) <= d.cpu_capacity)
        if d.pp == 1:
            self._single_stage_constraints()
        else:
            self._split_constraints()
            for k in range(d.pp):
                self._stage_constraints(k)

    def _edge_constraints(self, i: int, e: EdgeData) -> None:
        model, x = self.model, self.v.x
        nu, nv = e.cost.shape
        if e.form == "marginal":
            y = self.v.y[i]
            for a in range(nu):
                model.add(sum(y[a]) == x[e.U][a])
            for b in range(nv):
                model.add(sum(y[a][b] for a in range(nu)) == x[e.V][b])
        elif e.form == "bound":
            for a in range(nu):
                row = e.cost[a]
                if row.any():
                    model.add(self.v.r[i] >= sum(int(row[b]) * x[e.V][b] for b in range(nv) if row[b])
                              - int(row.max()) * (1 - x[e.U][a]))

    def _single_stage_constraints(self) -> None:
        d, model, v = self.d, self.model, self.v
        segs = range(d.nseg)
        model.add(sum(self.seg_time(s) for s in segs) <= v.bottleneck)
        model.add(sum(self.seg_lin(s, d.sync) for s in segs) - sum(self.lin(g, d.window_bwd[0][g]) for g in range(d.num_groups)) <= v.dp_exposed)
        model.add(sum(self.seg_lin(s, d.opt) for s in segs) <= v.optimizer)
        fl = d.inflight[0]
        model.add(sum(self.seg_lin(s, d.static) for s in segs) + fl * sum(self.seg_lin(s, d.act) for s in segs) <= d.capacity)

    def _split_constraints(self) -> None:
        """Every segment on one stage; stages contiguous, in order, none empty; boundaries."""
        d, model, v = self.d, self.model, self.v
        z = v.z
        assert z is not None
        nseg, pp = d.nseg, d.pp
        for s in range(nseg):
            model.add_exactly_one(z[s])
        stg = [sum(k * z[s][k] for k in range(1, pp)) for s in range(nseg)]
        model.add(z[0][0] == 1)
        model.add(z[nseg - 1][pp - 1] == 1)
        for s in range(nseg - 1):
            model.add(stg[s + 1] >= stg[s])
            model.add(stg[s + 1] <= stg[s] + 1)
        for s in range(nseg - 1):
            for k in range(pp - 1):
                if v.bnd[s][k] is not None:
                    model.add(v.bnd[s][k] >= z[s][k] + z[s + 1][k + 1] - 1)

    def _stage_constraints(self, k: int) -> None:
        """Stage k's time (its segments and boundaries) ≤ T, its data-parallel exposure (sync −
        (window + k)·backward) ≤ D, its optimizer ≤ O and its memory ≤ the capacity."""
        d, model, v = self.d, self.model, self.v
        z = v.z
        assert z is not None
        nseg, pp = d.nseg, d.pp
        for s in range(nseg):
            model.add(v.wt[k][s] >= self.seg_time(s) - max(d.time_max(s), 0) * (1 - z[s][k]))
        p2p_k = []
        for s in range(nseg - 1):
            if k < pp - 1 and v.bnd[s][k] is not None:
                p2p_k.append(int(d.p2p[s, k]) * v.bnd[s][k])
            if k > 0 and v.bnd[s][k - 1] is not None:
                p2p_k.append(int(d.p2p[s, k - 1]) * v.bnd[s][k - 1])
        model.add(sum(v.wt[k]) + sum(p2p_k) <= v.bottleneck)
        wb = d.window_bwd[k]
        for s, wd in v.wd[k]:
            fpos, fneg = d.seg_max(s, d.sync), d.seg_max(s, wb)
            model.add(wd >= self.seg_lin(s, d.sync) - self.seg_lin(s, wb) - (fpos + fneg) * (1 - z[s][k]))
            model.add(wd >= -fneg * z[s][k])
        if v.wd[k]:
            model.add(sum(w for _, w in v.wd[k]) <= v.dp_exposed)
        for s, wo in v.wo[k]:
            model.add(wo >= self.seg_lin(s, d.opt) - d.seg_max(s, d.opt) * (1 - z[s][k]))
        if v.wo[k]:
            model.add(sum(w for _, w in v.wo[k]) <= v.optimizer)
        fl = d.inflight[k]
        for s, wm in v.wm[k]:
            mx = d.seg_max(s, d.static) + fl * d.seg_max(s, d.act)
            model.add(wm >= self.seg_lin(s, d.static) + fl * self.seg_lin(s, d.act) - mx * (1 - z[s][k]))
        if v.wm[k]:
            model.add(sum(w for _, w in v.wm[k]) <= d.capacity)

    # ---- objective -----------------------------------------------------------------------
    def _objective(self) -> None:
        d, v = self.d, self.v
        objective = ((d.m - 1) * v.bottleneck + sum(self.seg_time(s) for s in range(d.nseg)) + self.p2p_total()
                     + self.cpu_time() + v.dp_exposed + v.optimizer)
        self.model.minimize(objective)
        if d.cutoff is not None:
            # only solutions at least as good as an incumbent step time are of interest:
            # INFEASIBLE then means "cannot beat it"
            self.model.add(objective <= d.cutoff)

    # ---- hint ----------------------------------------------------------------------------
    def _hints(self) -> list[tuple[Any, int]]:
        """Every variable's value in the hinted assignment (same order as the variables)."""
        d, v = self.d, self.v
        hg, hs = d.hint_groups, d.hint_stages
        assert hg is not None and hs is not None
        out: list[tuple[Any, int]] = []
        for g in range(d.num_groups):
            out += [(v.x[g][a], int(a == hg[g])) for a in range(d.group_sizes[g])]
        for i, e in enumerate(d.edges):
            nu, nv = e.cost.shape
            if e.form == "marginal":
                out += [(v.y[i][a][b], int(a == hg[e.U] and b == hg[e.V])) for a in range(nu) for b in range(nv)]
            elif e.form == "bound":
                out.append((v.r[i], int(e.cost[hg[e.U], hg[e.V]])))
        T_h, D_h, O_h = self._stage_hints(out, hg, hs)
        cpu_T_h = sum(int(d.cpu_time[g][hg[g]]) for g in range(d.num_groups))
        cpu_opt_h = sum(int(d.cpu_opt[g][hg[g]]) for g in range(d.num_groups))
        out += [(v.bottleneck, max(max(T_h), cpu_T_h)), (v.dp_exposed, max(0, max(D_h))), (v.optimizer, max(max(O_h), cpu_opt_h))]
        return out

    def _stage_hints(self, out: list[tuple[Any, int]], hg: Array, hs: Array) -> tuple[list[int], list[int], list[int]]:
        """Hints of the stage variables (appended to ``out``) and each stage's hinted time,
        data-parallel exposure and optimizer time."""
        d, v = self.d, self.v
        nseg, pp = d.nseg, d.pp

        def hval(s: int, arrs: Sequence[Array]) -> int:
            return sum(int(arrs[g][hg[g]]) for g in d.seg_groups[s])

        seg_t = [hval(s, d.time) + sum(int(e.cost[hg[e.U], hg[e.V]]) for e in d.edges if e.V in d.seg_groups[s])
                 for s in range(nseg)]
        if pp == 1:
            groups = range(d.num_groups)
            d_h = sum(hval(s, d.sync) for s in range(nseg)) - sum(int(d.window_bwd[0][g][hg[g]]) for g in groups)
            return [sum(seg_t)], [d_h], [sum(hval(s, d.opt) for s in range(nseg))]
        assert v.z is not None
        zh = [[int(hs[s] == k) for k in range(pp)] for s in range(nseg)]
        out += [(v.z[s][k], zh[s][k]) for s in range(nseg) for k in range(pp)]
        bnd_h = [[int(zh[s][k] and zh[s + 1][k + 1]) if s < nseg - 1 else 0 for k in range(pp - 1)] for s in range(nseg)]
        out += [(v.bnd[s][k], bnd_h[s][k]) for s in range(nseg) for k in range(pp - 1) if v.bnd[s][k] is not None]
        T_h, D_h, O_h = [], [], []
        for k in range(pp):
            out += [(v.wt[k][s], seg_t[s] * zh[s][k]) for s in range(nseg)]
            th = sum(seg_t[s] * zh[s][k] for s in range(nseg))
            for s in range(nseg - 1):
                if k < pp - 1 and v.bnd[s][k] is not None:
                    th += int(d.p2p[s, k]) * bnd_h[s][k]
                if k > 0 and v.bnd[s][k - 1] is not None:
                    th += int(d.p2p[s, k - 1]) * bnd_h[s][k - 1]
            T_h.append(th)
            wd_h = [(hval(s, d.sync) - hval(s, d.window_bwd[k])) if zh[s][k] else 0 for s, _ in v.wd[k]]
            out += [(w, h) for (_, w), h in zip(v.wd[k], wd_h, strict=True)]
            D_h.append(sum(wd_h))
            wo_h = [hval(s, d.opt) * zh[s][k] for s, _ in v.wo[k]]
            out += [(w, h) for (_, w), h in zip(v.wo[k], wo_h, strict=True)]
            O_h.append(sum(wo_h))
            fl = d.inflight[k]
            out += [(w, (hval(s, d.static) + fl * hval(s, d.act)) * zh[s][k]) for s, w in v.wm[k]]
        return T_h, D_h, O_h

    # ---- solve and extract ---------------------------------------------------------------
    def solve(self, deadline_s: float, budget_s: float | None = None) -> Solution:
        """Constraints, objective and hint, then solve until ``deadline_s`` (``perf_counter``)
        or ``budget_s`` × :data:`DETERMINISTIC_TIME_PER_S` units of deterministic time (fixed
        seed, one worker: the same model stops at the same answer)."""
        self._constraints()
        self._objective()
        if self.d.hint_groups is not None:
            for var, val in self._hints():
                self.model.add_hint(var, int(val))
        wall = deadline_s - time.perf_counter()
        det = DETERMINISTIC_TIME_PER_S * (budget_s if budget_s is not None else wall)
        # one worker: single-threaded CP-SAT with a fixed seed and a deterministic-time limit
        # gives the same answer every run (its interleaved multi-worker mode aborted on some of
        # these models)
        params = SolverParams(time_limit_s=wall, num_workers=1,
                              deterministic_time_s=det, relative_gap_limit=RELATIVE_GAP_LIMIT, random_seed=RANDOM_SEED,
                              skip_inclusion_presolve=self.d.num_groups > LARGE_MODEL_GROUPS)
        return solve(self.model, params)

    def rounding_slack_s(self) -> float:
        """Seconds the integer rounding of the objective's coefficients can shift it by (half a
        unit per term of one assignment, times the micro-batches for the bottleneck)."""
        d = self.d
        terms = d.num_groups + len(d.edges) + d.nseg * max(d.pp - 1, 0) + 3
        return 0.5 * d.scale.time_unit_s * terms * (d.m + 1)

    def extract(self, solution: Solution) -> tuple[Array, Array, float]:
        """Per-op choices, the stage of every op and the step time (s) of a found solution."""
        d, v, groups = self.d, self.v, self.coarse.groups
        gch = [next(a for a in range(d.group_sizes[g]) if solution.value(v.x[g][a])) for g in range(d.num_groups)]
        choice = ops_from_groups(self.coarse, gch, self.n_ops)
        stage = np.zeros(self.n_ops, dtype=np.int64)
        if v.z is not None:
            for s in range(d.nseg):
                k = next(kk for kk in range(d.pp) if solution.value(v.z[s][kk]))
                for g in d.seg_groups[s]:
                    stage[list(groups[g].members)] = k
        return choice, stage, solution.objective_value * d.scale.time_unit_s + d.constant_s


def solve_mesh(
    tables: CostTables,
    coarse: Coarse,
    cuts: Sequence[int],
    time_limit_s: float,
    headroom_fraction: float = 0.1,
    hint: tuple[Array, Array | None] | None = None,
    cutoff_s: float | None = None,
    work_s: float | None = None,
) -> SolveResult | None:
    """Optimal op shardings and contiguous stage split for one mesh (:class:`MeshSolver`).
    ``cuts`` are positions where a stage may start; ``cutoff_s`` asks only for step times at
    least as good; ``work_s`` sets the deterministic-time budget (default: the time limit), so
    that the caller's plan, not the clock, decides where the solve stops.  Returns None when
    nothing is found in time; a result with status INFEASIBLE
    when proven infeasible (or, with a cutoff, unable to beat it)."""
    t0 = time.perf_counter()
    empty = np.zeros(0, dtype=np.int64)
    data = mesh_data(tables, coarse, cuts, headroom_fraction, hint, cutoff_s)
    if data is None:
        return None
    if data.capacity < 0:
        return SolveResult(empty, empty, "INFEASIBLE", None, time.perf_counter() - t0, math.inf)
    solver = MeshSolver(data, coarse, tables.graph.num_ops)
    solution = solver.solve(t0 + float(time_limit_s), budget_s=float(time_limit_s if work_s is None else work_s))
    if solution.infeasible:
        bound = math.inf if cutoff_s is None else cutoff_s - solver.rounding_slack_s()
        return SolveResult(empty, empty, solution.status, None, time.perf_counter() - t0, bound)
    bound_s = solution.best_bound * data.scale.time_unit_s + data.constant_s - solver.rounding_slack_s()
    if not solution.found:
        return None
    choice, stage, objective_s = solver.extract(solution)
    return SolveResult(choice, stage, solution.status, objective_s, time.perf_counter() - t0, bound_s)
