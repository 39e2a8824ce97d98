"""Op-level sharding search for operator graphs (Alpa-style intra-operator parallelism) with a
contiguous pipeline split, solved with CP-SAT.

Search space for one graph on one cluster:

* outer, enumerated (:mod:`.space`): the GPU node group, the sharding-axis size ``t``, the
  pipeline depth ``pp``, ``dp``, the micro-batch size and ZeRO-1 unless pinned;
* inner, per candidate: every operator's sharding (see :mod:`cost_model.graph.layouts`) and the
  split of the topological order into ``pp`` contiguous stages, minimising the step time of
  :func:`cost_model.graph.evaluate.evaluate` under per-GPU memory (and CPU memory for tables placed
  on CPU parameter servers).

Tractability: operators are coarsened into chains (:mod:`.coarsen`, an exact reduction on graphs
of up to :data:`.coarsen.EXACT_COARSEN_OPS` operators); stage cuts are allowed between chains, at
most :data:`.coarsen.MAX_SEGMENTS` cut points.  Outer candidates are screened with a greedy
assignment (iterated conditional modes) and a dynamic-programming split; the best few are solved
exactly with CP-SAT (:mod:`.mesh_cpsat`), seeded with the greedy answer as a hint, under a time
limit.  The answer is a :class:`planner_service.planner.result.PlanResult` like the transformer
search's (:mod:`.describe` turns candidates into its entries).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from cost_model.cluster import Cluster
from cost_model.errors import NoFeasiblePlan
from cost_model.graph.analysis import analyse
from cost_model.graph.assign import bottleneck_split, greedy_choices, split_stages
from cost_model.graph.evaluate import GraphEval, refuse_graph_unpriced
from cost_model.graph.ir import GraphSpec
from cost_model.graph.mesh import GraphMesh
from cost_model.graph.op_cost import OpCost, graph_op_costs
from cost_model.graph.tables import CostTables, build_tables, for_mesh, saved_tensors, with_edges
from cost_model.training import Training
from planner_service.planner.graph.bound import incoming_edge_min_s, mesh_lower_bound_s, reparametrised_edge_s
from planner_service.planner.graph.coarsen import EXACT_COARSEN_OPS, MAX_SEGMENTS, Coarse, coarsen, cut_candidates
from planner_service.planner.graph.describe import to_evaluated
from planner_service.planner.graph.mesh_cpsat import solve_mesh
from planner_service.planner.graph.space import (
    Array,
    MeshCandidate,
    as_constraints,
    enumerate_meshes,
    evaluate_assignment,
    infeasible_message,
    memory_lower_bound_ok,
    table_params,
)
from planner_service.planner.request import Constraints, PlanRequest, SolverSettings
from planner_service.planner.result import PlanResult

#: Outer candidates refined with CP-SAT (one on large graphs).
MAX_CPSAT_CANDIDATES = 3
#: Combinations per chain kept on large graphs.
MAX_COMBOS_LARGE = 6
#: Step times within this relative margin count as a tie, broken toward the simpler layout.
TIE_FRACTION = 1e-3
#: The search stops improving once its answer is proved within this fraction of the optimum.
GAP_TARGET = 0.01
#: A gap this small (float noise between a bound and an evaluation: sums in another order,
#: the all-reduce of t·dp ranks vs dp ranks) counts as proved optimal.
OPTIMAL_GAP = 1e-5
#: Exact solves the gap-closing pass (small graphs) runs at most.
MAX_GAP_SOLVES = 32
#: Share of the time limit the whole search uses (the rest is the answer's description).
SEARCH_SHARE = 0.92
#: Share of the search time spent bounding and screening outer candidates (small graphs,
#: large graphs); bounding alone stops at :data:`BOUND_SHARE`.  The shares are spent as *work*
#: (operators + table rows processed, at :data:`BOUND_WORK_PER_S` and
#: :data:`SCREEN_WORK_PER_S` per second of the limit — what one core of the 2-core development
#: machine does), not read off the clock, so that the same request visits the same layouts and
#: gives the same plan however loaded the host; the wall-clock limit stays the hard cap.
SCREEN_SHARE, SCREEN_SHARE_LARGE = 0.5, 0.6
BOUND_SHARE = 0.45
BOUND_WORK_PER_S, SCREEN_WORK_PER_S = 250_000.0, 60_000.0
#: Seconds building one mesh's CP-SAT model takes per coarse group (its data, constraints and
#: objective, before the solver's clock starts: ≈ 0.5 ms per group on one core of the 2-core
#: development machine, 2,055 groups of a 5,000-op graph in 1.1 s).  A solve whose model
#: would take its whole planned share, or the time left, to build is not started: it would
#: overrun the limit and return nothing.
MODEL_BUILD_S_PER_GROUP = 5e-4
#: Memory weights (× the step time per byte of capacity) the greedy tries when the plain greedy
#: does not fit: trade time for memory, harder each round.
MEMORY_FACTORS = (1.0, 10.0, 100.0)


@dataclass
class _Bounded:
    """One mesh, its tables and what is proved about it: ``bound`` ≤ the step time of every
    assignment on it that fits (the relaxation of :mod:`.bound`, raised by an exact CP-SAT
    solve); ``inf`` when nothing fits."""

    mesh: GraphMesh
    tables: CostTables
    key: tuple[str, int, int]
    bound: float


@dataclass
class _Search:
    """One search's inputs and running tallies."""

    graph: GraphSpec
    training: Training
    cluster: Cluster
    headroom: float
    t_start: float
    deadline: float
    large: bool
    time_limit_s: float = 0.0
    pruned: int = 0
    screened: int = 0
    bounded_out: int = 0
    unbounded: int = 0
    work_bound: float = 0.0
    work_screen: float = 0.0
    clock_stopped: bool = False  # the wall-clock cap, not a work budget, ended a phase
    statuses: list[str] = field(default_factory=list)
    coarse_sizes: list[int] = field(default_factory=list)
    exact_flags: list[bool] = field(default_factory=list)

    @property
    def max_per_group(self) -> int | None:
        return MAX_COMBOS_LARGE if self.large else None

    def budget(self, share: float, rate: float) -> float:
        """Work units a phase may spend: ``share`` of the search's time at ``rate`` per second."""
        return share * SEARCH_SHARE * self.time_limit_s * rate

    def past_deadline(self) -> bool:
        if time.perf_counter() > self.deadline:
            self.clock_stopped = True
            return True
        return False


def search_graph(request: PlanRequest, settings: SolverSettings) -> PlanResult:
    """The graph search over a parsed request (see the module docstring), within the configured
    solver time limit."""
    return plan_graph(request.model, request.training, request.cluster, request.constraints, request.top_k,
                      settings.time_limit_s, request.objective)


def plan_graph(
    model: GraphSpec,
    training: Training,
    cluster: Cluster,
    constraints: Constraints | Mapping[str, Any] | None = None,
    top_k: int = 3,
    time_limit_s: float = 30.0,
    objective: str = "throughput",
) -> PlanResult:
    """Plan an operator graph: the best op shardings, stage split, layout and placement, and up
    to ``top_k`` alternatives of other layouts; raises :class:`NoFeasiblePlan` with what is
    short when nothing fits.  ``search`` states the proved lower bound on the step time over
    every layout and the answer's gap to it."""
    t_start = time.perf_counter()
    refuse_graph_unpriced(training)
    cons = as_constraints(constraints)
    graph = model
    s = _Search(graph=graph, training=training, cluster=cluster, headroom=cons.headroom(graph=True),
                t_start=t_start, deadline=t_start + SEARCH_SHARE * float(time_limit_s),
                large=graph.num_ops > EXACT_COARSEN_OPS, time_limit_s=float(time_limit_s))
    analysis = analyse(graph)
    n_chains = int(analysis.chain_id.max()) + 1 if graph.num_ops else 0
    meshes, s.pruned, notes = enumerate_meshes(graph, training, cluster, cons, n_chains)
    params_total, movable = float(graph.total_params()), table_params(graph)
    feasible = [m for m in meshes if memory_lower_bound_ok(training, m, s.headroom, params_total, movable)]
    s.pruned += len(meshes) - len(feasible)
    if not feasible:
        raise NoFeasiblePlan(infeasible_message(graph, training, cluster, meshes, s.headroom), field="cluster")
    bounded = _bound_all(s, feasible, analysis)
    candidates, fallback = _screen_all(s, bounded)
    if not candidates:
        candidates = _fit_with_cpsat(s, fallback)
    if not candidates:
        raise NoFeasiblePlan(infeasible_message(graph, training, cluster, feasible, s.headroom, screened=True), field="cluster")
    candidates = _refine(s, _order(candidates), bounded)
    if not s.large:
        candidates = _close_gap(s, candidates, bounded)
    best = candidates[0]
    alts = _distinct(candidates[1:], top_k)
    lower = _lower_bound(s, bounded)
    gap = best.ev.step_time_s / lower - 1.0 if lower > 0 else None
    proved = gap is not None and gap <= OPTIMAL_GAP
    search = {
        "candidates": s.screened,
        "pruned": s.pruned,
        "solver_status": "OPTIMAL" if proved else "FEASIBLE",
        "solver_statuses": s.statuses,
        "wall_time_s": time.perf_counter() - t_start,
        "operators": graph.num_ops,
        "coarsened_nodes": s.coarse_sizes[0] if s.coarse_sizes else n_chains,
        "exact_reduction": all(s.exact_flags) if s.exact_flags else None,
        "layouts": len(feasible),
        "layouts_ruled_out_by_bound": s.bounded_out,
        "lower_bound_s": lower if lower > 0 else None,
        "gap": None if gap is None else max(0.0, gap),
        "optimality": "proved_optimal" if proved else ("within_gap" if gap is not None and gap <= GAP_TARGET else "unproven"),
        "stopped_by_clock": s.clock_stopped,
    }
    entry = to_evaluated(best)
    return PlanResult(
        best=entry,
        alternatives=[to_evaluated(c) for c in alts],
        search=search,
        warnings=list(entry.prediction.warnings),
        cluster=cluster,
        model=graph,
        # the graph search minimises the step time: throughput (and time to train) exactly
        objective=objective if objective == "time_to_train" and training.total_tokens else "throughput",
        extra={"total_tokens": training.total_tokens} if training.total_tokens else {},
        notes=notes,
    )


def _bound_all(s: _Search, feasible: list[GraphMesh], analysis: Any) -> list[_Bounded]:
    """Tables and the relaxation bound of every layout (one table build per (group, t,
    micro-batch), shared by its pipeline depths), in the order the screening visits them: by
    bound, ties toward the simpler layout.  Layouts the time limit leaves unbounded get bound 0
    (nothing proved) and no screening."""
    by_key: dict[tuple[str, int, int], list[GraphMesh]] = {}
    for mesh in feasible:
        by_key.setdefault((mesh.group.name, mesh.t, mesh.micro_batch), []).append(mesh)
    keys = sorted(by_key, key=lambda k: (_key_priority(k, by_key[k]), k))
    cost_cache: dict[int, tuple[list[OpCost], dict[str, tuple[int, ...]]]] = {}
    saved = saved_tensors(s.graph)
    out: list[_Bounded] = []
    for key in keys:
        if out and (s.work_bound > s.budget(BOUND_SHARE, BOUND_WORK_PER_S) or s.past_deadline()):
            s.unbounded += len(by_key[key])
            continue
        mbs = key[2]
        if mbs not in cost_cache:
            shapes = s.graph.bind(mbs, s.training.sequence_length)
            costs = graph_op_costs(s.graph, mbs, s.training.sequence_length, s.training.dtype, analysis.op_class, shapes)
            cost_cache[mbs] = (costs, shapes)
        group_meshes = sorted(by_key[key], key=lambda ms: ms.pp)
        costs, shapes = cost_cache[mbs]
        base = build_tables(s.graph, s.training, group_meshes[0], analysis, costs, edges=False, shapes=shapes, saved=saved)
        s.work_bound += s.graph.num_ops + len(base.fwd_s)
        for mesh in group_meshes:
            tables = base if mesh is group_meshes[0] else for_mesh(base, mesh)
            out.append(_Bounded(mesh=mesh, tables=tables, key=key, bound=mesh_lower_bound_s(tables, s.headroom)))
    out.sort(key=lambda b: (b.bound, _simplicity(b.mesh)))
    return out


def _simplicity(mesh: GraphMesh) -> tuple[int, int, int, str]:
    return (mesh.t, mesh.pp, -mesh.micro_batch, mesh.group.name)


def _lower_bound(s: _Search, bounded: list[_Bounded]) -> float:
    """The proved lower bound on the step time over every layout (0 when the time limit left a
    layout unbounded)."""
    if s.unbounded or not bounded:
        return 0.0
    return min(b.bound for b in bounded)


def _screen_all(s: _Search, bounded: list[_Bounded]) -> tuple[list[MeshCandidate], list[CostTables]]:
    """Greedy answers on the layouts in bound order until no unscreened layout can beat (or tie)
    the best answer or the screening time is up; one greedy choice per (group, t, micro-batch),
    shared by its pipeline depths.  Returns the candidates that fit and the tables of layouts
    where no greedy answer fits."""
    screen_budget = s.budget(SCREEN_SHARE_LARGE if s.large else SCREEN_SHARE, SCREEN_WORK_PER_S)
    choices: dict[tuple[str, int, int], Array] = {}
    mem_choices: dict[tuple[str, int, int], list[Array]] = {}
    full: dict[tuple[str, int, int], tuple[CostTables, Array]] = {}  # tables with edges, their edge minima
    agreed: dict[tuple[str, int, int], Array] = {}  # reparametrised_edge_s
    candidates: list[MeshCandidate] = []
    fallback: list[CostTables] = []
    incumbent = math.inf
    for b in bounded:
        if not math.isfinite(b.bound) or b.bound >= incumbent * (1 + TIE_FRACTION):
            s.pruned += 1
            s.bounded_out += 1
            continue
        if candidates and (s.work_screen > screen_budget or s.past_deadline()):
            s.pruned += 1
            continue
        s.work_screen += s.graph.num_ops + len(b.tables.fwd_s)
        if b.key not in full:
            with_e = with_edges(b.tables)
            full[b.key] = (with_e, incoming_edge_min_s(with_e))
        base, edge_min = full[b.key]
        tables = b.tables = base if base.mesh is b.mesh else for_mesh(base, b.mesh)
        # tighter with the resharding: the per-consumer minima, then (only where that leaves
        # room under the best answer beyond float noise: not for the batch-split layouts that
        # tie with data parallelism) the whole graph's agreement along chains, once per table build
        b.bound = max(b.bound, mesh_lower_bound_s(tables, s.headroom, edge_min, edge_min))
        if b.bound < incumbent * (1 - OPTIMAL_GAP):
            if b.key not in agreed:
                own = base.fwd_s + base.bwd_s + base.comm_fwd_s + base.comm_bwd_s
                multi = bool((np.diff(base.row_start) > 1).any())  # else nothing to agree on
                agreed[b.key] = reparametrised_edge_s(base, own) if multi else edge_min
            if agreed[b.key] is not edge_min:
                b.bound = max(b.bound, mesh_lower_bound_s(tables, s.headroom, edge_min, agreed[b.key]))
        if b.bound >= incumbent * (1 + TIE_FRACTION):
            s.pruned += 1
            s.bounded_out += 1
            continue
        if b.key not in choices:
            choices[b.key] = greedy_choices(tables)
        cand = _screen(tables, choices[b.key], s.headroom)
        s.screened += 1
        mem = mem_choices.setdefault(b.key, [])
        for k, factor in enumerate(MEMORY_FACTORS):
            if cand is not None:
                break
            if len(mem) <= k:
                mem.append(greedy_choices(tables, memory_weight=factor * _memory_weight(tables)))
            cand = _screen(tables, mem[k], s.headroom)
        if cand is None:
            s.pruned += 1
            fallback.append(tables)
            continue
        candidates.append(cand)
        incumbent = min(incumbent, cand.ev.step_time_s)
    return candidates, fallback


def _fit_with_cpsat(s: _Search, fallback: list[CostTables]) -> list[MeshCandidate]:
    """No greedy layout fits: let CP-SAT look for a fitting one on the layouts that shard the
    most (memory constraints are exact there), within the remaining time."""
    fallback = sorted(fallback, key=lambda tb: (-(tb.mesh.t * tb.mesh.pp), tb.mesh.micro_batch))
    for tables in fallback[:2]:
        remaining = s.deadline - time.perf_counter()
        if remaining < 0.5:
            s.clock_stopped = True
            break
        planned = s.time_limit_s * SEARCH_SHARE * (1 - SCREEN_SHARE) / 2
        hint_choice = greedy_choices(tables, memory_weight=MEMORY_FACTORS[-1] * _memory_weight(tables))
        coarse = coarsen(tables, keep=hint_choice, max_per_group=s.max_per_group)
        if not _buildable(s, coarse, planned, s.deadline - time.perf_counter()):
            break
        res = solve_mesh(tables, coarse, cut_candidates(tables, hint_choice), min(planned, remaining / 2), s.headroom,
                         hint=(hint_choice, None), work_s=planned)
        if res is not None and res.status in ("OPTIMAL", "FEASIBLE"):
            ev = evaluate_assignment(tables, res.choice, res.stage_of_op)
            if _fits(tables, ev, s.headroom):
                return [MeshCandidate(mesh=tables.mesh, tables=tables, choice=res.choice, stage_of_op=res.stage_of_op, ev=ev,
                                      solver_status=res.status)]
    return []


def _buildable(s: _Search, coarse: Coarse, planned_s: float, remaining_s: float) -> bool:
    """Whether a solve's CP-SAT model can be built within its planned share (work, so the same
    request decides alike on any host) and the time left (the clock: a cap); when the clock
    says no, the search records that the clock stopped it."""
    build_s = len(coarse.groups) * MODEL_BUILD_S_PER_GROUP
    if build_s >= remaining_s:
        s.clock_stopped = True
        return False
    return build_s < planned_s


def _refine(s: _Search, candidates: list[MeshCandidate], bounded: list[_Bounded]) -> list[MeshCandidate]:
    """CP-SAT on the best few outer candidates (the best one on large graphs) whose layout's
    bound leaves room for an answer more than :data:`GAP_TARGET` better; the most promising gets
    most of the time, the others only need to show whether they can beat the incumbent
    (objective cutoff).  An exact model's proved bound raises the layout's bound.  Stops as soon
    as the best answer is within :data:`GAP_TARGET` of the lower bound over every layout.
    Returns the candidates, fastest first."""
    by_key = {(b.mesh.group.name, b.mesh.t, b.mesh.pp, b.mesh.dp, b.mesh.micro_batch): b for b in bounded}
    limit = 1 if s.large else MAX_CPSAT_CANDIDATES
    refine = candidates[:limit]
    for idx, cand in enumerate(refine):
        best_s = min(c.ev.step_time_s for c in candidates)
        lower = _lower_bound(s, bounded)
        if lower > 0 and best_s <= lower * (1 + GAP_TARGET):
            break
        info = by_key.get(cand.key)
        if info is not None and min(best_s, cand.ev.step_time_s) <= info.bound * (1 + GAP_TARGET):
            continue  # this layout cannot give an answer more than the target better
        remaining = s.deadline - time.perf_counter()
        if remaining < 0.3:
            s.clock_stopped = True
            s.statuses.append("NOT_RUN(time)")
            continue
        # the solve's work budget follows from the time limit (deterministic), the clock only caps it
        planned = s.time_limit_s * SEARCH_SHARE * (1 - SCREEN_SHARE) * (0.6 if idx == 0 and len(refine) > 1 else 0.4 / max(len(refine) - 1, 1))
        share = min(planned, remaining * 0.95)
        incumbent = best_s if idx > 0 else None
        t_c = time.perf_counter()
        coarse = coarsen(cand.tables, keep=cand.choice, max_per_group=s.max_per_group)
        s.coarse_sizes.append(len(coarse.groups))
        s.exact_flags.append(coarse.exact)
        cuts = cut_candidates(cand.tables, cand.choice)
        all_cuts = cand.mesh.pp == 1 or len(cuts) == int(np.count_nonzero(cand.tables.analysis.chain_start[1:]))
        spent = time.perf_counter() - t_c
        if not _buildable(s, coarse, planned, remaining - spent):
            s.statuses.append("NOT_RUN(time)")
            continue
        res = solve_mesh(cand.tables, coarse, cuts, max(0.1, share - spent), s.headroom, hint=(cand.choice, cand.stage_of_op),
                         cutoff_s=incumbent, work_s=planned)
        if res is None:
            s.statuses.append("UNKNOWN")
            continue
        s.statuses.append(res.status if not (incumbent and res.status == "INFEASIBLE") else "CANNOT_BEAT_BEST")
        if info is not None and coarse.exact and all_cuts and res.bound_s is not None:
            info.bound = max(info.bound, res.bound_s)
        if res.status == "INFEASIBLE":
            continue
        ev = evaluate_assignment(cand.tables, res.choice, res.stage_of_op)
        if _fits(cand.tables, ev, s.headroom) and ev.step_time_s < cand.ev.step_time_s * (1 - 1e-12):
            candidates[idx] = replace(cand, choice=res.choice, stage_of_op=res.stage_of_op, ev=ev, solver_status=res.status)
        else:
            candidates[idx] = replace(cand, solver_status=res.status)
    return _order(candidates)


def _close_gap(s: _Search, candidates: list[MeshCandidate], bounded: list[_Bounded]) -> list[MeshCandidate]:
    """While the answer is not within :data:`GAP_TARGET` of the lower bound, solve the layouts
    that hold the bound down (lowest bound first; ones the greedy could not fit or did not
    reach included) exactly, asking only for answers better than the incumbent: INFEASIBLE
    proves the layout cannot beat it (its bound rises to the incumbent), a solution becomes a
    candidate.  Only where the coarsening is exact and every chain start may be cut, so the
    proof covers the layout; each solve's work budget follows from the time limit, and at most
    :data:`MAX_GAP_SOLVES` run."""
    refined = {c.key for c in candidates if c.solver_status != "GREEDY"}
    solves = 0
    for b in sorted(bounded, key=lambda x: (x.bound, _simplicity(x.mesh))):
        if solves >= MAX_GAP_SOLVES:
            break
        best_s = min(c.ev.step_time_s for c in candidates)
        lower = _lower_bound(s, bounded)
        if lower <= 0 or best_s <= lower * (1 + GAP_TARGET):
            break
        key = (b.mesh.group.name, b.mesh.t, b.mesh.pp, b.mesh.dp, b.mesh.micro_batch)
        if key in refined or not math.isfinite(b.bound) or b.bound * (1 + GAP_TARGET) >= best_s:
            continue
        remaining = s.deadline - time.perf_counter()
        if remaining < 0.3:
            s.clock_stopped = True
            break
        tables = b.tables = with_edges(b.tables)
        coarse = coarsen(tables)
        cuts = cut_candidates(tables)
        all_cuts = b.mesh.pp == 1 or len(cuts) == int(np.count_nonzero(tables.analysis.chain_start[1:]))
        if not (coarse.exact and all_cuts):
            continue
        planned = s.time_limit_s * SEARCH_SHARE * (1 - SCREEN_SHARE) * 0.2
        solves += 1
        res = solve_mesh(tables, coarse, cuts, min(planned, remaining * 0.95), s.headroom, cutoff_s=best_s, work_s=planned)
        if res is None:
            s.statuses.append("UNKNOWN")
            continue
        s.statuses.append("CANNOT_BEAT_BEST" if res.status == "INFEASIBLE" else res.status)
        if res.bound_s is not None and res.status in ("OPTIMAL", "INFEASIBLE"):
            b.bound = max(b.bound, res.bound_s)
        if res.status in ("OPTIMAL", "FEASIBLE"):
            ev = evaluate_assignment(tables, res.choice, res.stage_of_op)
            if _fits(tables, ev, s.headroom):
                candidates.append(MeshCandidate(mesh=tables.mesh, tables=tables, choice=res.choice, stage_of_op=res.stage_of_op,
                                                ev=ev, solver_status=res.status))
    return _order(candidates)


def _order(cands: list[MeshCandidate]) -> list[MeshCandidate]:
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


def _screen(tables: CostTables, choice: Array, headroom: float) -> MeshCandidate | None:
    """The greedy choice with its best split, if it fits.  On graphs with more chain starts
    than :data:`MAX_SEGMENTS` the exact split runs over a selection of cut points; the
    bisection split over every chain start (:func:`bottleneck_split`, without and with the
    boundaries' p2p) competes with it."""
    splits = []
    if tables.mesh.pp > 1 and len(np.nonzero(tables.analysis.chain_start)[0]) > MAX_SEGMENTS:
        splits.append(split_stages(tables, choice, cut_candidates(tables, choice), headroom_fraction=headroom))
        splits.append(bottleneck_split(tables, choice, headroom_fraction=headroom))
        splits.append(bottleneck_split(tables, choice, headroom_fraction=headroom, with_p2p=True))
    else:
        splits.append(split_stages(tables, choice, None, headroom_fraction=headroom))
    best: MeshCandidate | None = None
    for stage in splits:
        if stage is None:
            continue
        ev = evaluate_assignment(tables, choice, stage)
        if _fits(tables, ev, headroom) and (best is None or ev.step_time_s < best.ev.step_time_s):
            best = MeshCandidate(mesh=tables.mesh, tables=tables, choice=choice, stage_of_op=stage, ev=ev)
    return best


def _fits(tables: CostTables, ev: GraphEval, headroom: float) -> bool:
    cap = tables.mesh.device.memory_bytes * (1.0 - headroom)
    if any(st.peak_bytes > cap * (1 + 1e-9) for st in ev.stages):
        return False
    pool = tables.mesh.cpu
    return not (pool is not None and ev.cpu_memory_bytes > pool.memory_bytes * (1.0 - headroom) * (1 + 1e-9))


def _memory_weight(tables: CostTables) -> float:
    """Seconds per byte that make memory matter to the greedy: a step's time over the capacity."""
    rows = tables.row_start[:-1]
    t = float((tables.fwd_s + tables.bwd_s)[rows].sum()) * tables.mesh.num_microbatches
    return 4.0 * max(t, 1e-6) / tables.mesh.device.memory_bytes


def _key_priority(key: tuple[str, int, int], meshes: list[GraphMesh]) -> float:
    """Screen first the layouts most likely to win: moderate micro-batches (bubble vs GEMM
    efficiency), small sharding degree first for small models."""
    _, t, mbs = key
    m = meshes[0].num_microbatches
    return abs(math.log2(max(mbs, 1)) - 2.0) + 0.25 * math.log2(t) + (0 if m >= 2 else 0.5)


def _distinct(cands: list[MeshCandidate], k: int) -> list[MeshCandidate]:
    """Up to ``k`` candidates of distinct layouts, in order."""
    seen: set[tuple[int, int, int, int, str]] = set()
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
