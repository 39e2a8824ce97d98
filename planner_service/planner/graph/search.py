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
from cost_model.graph.assign import greedy_choices, split_stages
from cost_model.graph.evaluate import GraphEval
from cost_model.graph.ir import GraphSpec
from cost_model.graph.mesh import GraphMesh
from cost_model.graph.op_cost import OpCost, graph_op_costs
from cost_model.graph.tables import CostTables, build_tables, for_mesh
from cost_model.training import Training
from planner_service.planner.graph.coarsen import EXACT_COARSEN_OPS, MAX_SEGMENTS, coarsen, cut_candidates
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
#: Share of the time limit the whole search uses (the rest is the answer's description).
SEARCH_SHARE = 0.92
#: Share of the search time spent screening outer candidates (small graphs, large graphs).
SCREEN_SHARE, SCREEN_SHARE_LARGE = 0.5, 0.35
#: Memory weights (× the step time per byte of capacity) the greedy tries when the plain greedy
#: does not fit: trade time for memory, harder each round.
MEMORY_FACTORS = (1.0, 10.0, 100.0)


@dataclass
class _Search:
    """One search's inputs and running tallies."""

    graph: GraphSpec
    training: Training
    cluster: Cluster
    headroom: float
    workers: int
    t_start: float
    deadline: float
    large: bool
    pruned: int = 0
    screened: int = 0
    statuses: list[str] = field(default_factory=list)
    coarse_sizes: list[int] = field(default_factory=list)
    exact_flags: list[bool] = field(default_factory=list)

    @property
    def max_per_group(self) -> int | None:
        return MAX_COMBOS_LARGE if self.large else None


def search_graph(request: PlanRequest, settings: SolverSettings) -> PlanResult:
    """The graph search over a parsed request (see the module docstring)."""
    return plan_graph(request.model, request.training, request.cluster, request.constraints, request.top_k,
                      max(settings.time_limit_s, settings.graph_time_limit_s), settings.num_workers, request.objective)


def plan_graph(
    model: GraphSpec,
    training: Training,
    cluster: Cluster,
    constraints: Constraints | Mapping[str, Any] | None = None,
    top_k: int = 3,
    time_limit_s: float = 30.0,
    workers: int = 2,
    objective: str = "throughput",
) -> PlanResult:
    """Plan an operator graph: the best op shardings, stage split, layout and placement, and up
    to ``top_k`` alternatives of other layouts; raises :class:`NoFeasiblePlan` with what is
    short when nothing fits."""
    t_start = time.perf_counter()
    cons = as_constraints(constraints)
    graph = model
    s = _Search(graph=graph, training=training, cluster=cluster, headroom=cons.headroom(graph=True), workers=workers,
                t_start=t_start, deadline=t_start + SEARCH_SHARE * max(1.0, float(time_limit_s)),
                large=graph.num_ops > EXACT_COARSEN_OPS)
    analysis = analyse(graph)
    n_chains = int(analysis.chain_id.max()) + 1 if graph.num_ops else 0
    meshes, s.pruned, notes = enumerate_meshes(graph, training, cluster, cons, n_chains)
    params_total, movable = float(graph.total_params()), table_params(graph)
    feasible = [m for m in meshes if memory_lower_bound_ok(training, m, s.headroom, params_total, movable)]
    s.pruned += len(meshes) - len(feasible)
    if not feasible:
        raise NoFeasiblePlan(infeasible_message(graph, training, cluster, meshes, s.headroom), field="cluster")
    candidates, fallback = _screen_all(s, feasible, analysis)
    if not candidates:
        candidates = _fit_with_cpsat(s, fallback)
    if not candidates:
        raise NoFeasiblePlan(infeasible_message(graph, training, cluster, feasible, s.headroom, screened=True), field="cluster")
    candidates = _refine(s, _order(candidates))
    best = candidates[0]
    alts = _distinct(candidates[1:], top_k)
    search = {
        "candidates": s.screened,
        "pruned": s.pruned,
        "solver_status": best.solver_status if best.solver_status != "GREEDY" else (s.statuses[0] if s.statuses else "GREEDY"),
        "solver_statuses": s.statuses,
        "wall_time_s": time.perf_counter() - t_start,
        "operators": graph.num_ops,
        "coarsened_nodes": s.coarse_sizes[0] if s.coarse_sizes else n_chains,
        "exact_reduction": all(s.exact_flags) if s.exact_flags else None,
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


def _screen_all(s: _Search, feasible: list[GraphMesh], analysis: Any) -> tuple[list[MeshCandidate], list[CostTables]]:
    """Greedy answers on every layout, most promising first, until the screening time is up;
    one table build per (group, t, micro-batch), shared by its pipeline depths.  Returns the
    candidates that fit and the tables of layouts where no greedy answer fits."""
    by_key: dict[tuple[str, int, int], list[GraphMesh]] = {}
    for mesh in feasible:
        by_key.setdefault((mesh.group.name, mesh.t, mesh.micro_batch), []).append(mesh)
    keys = sorted(by_key, key=lambda k: _key_priority(k, by_key[k]))
    screen_deadline = s.t_start + (SCREEN_SHARE_LARGE if s.large else SCREEN_SHARE) * (s.deadline - s.t_start)
    cost_cache: dict[int, list[OpCost]] = {}
    candidates: list[MeshCandidate] = []
    fallback: list[CostTables] = []
    for key in keys:
        if candidates and time.perf_counter() > screen_deadline:
            s.pruned += len(by_key[key])
            continue
        mbs = key[2]
        if mbs not in cost_cache:
            cost_cache[mbs] = graph_op_costs(s.graph, mbs, s.training.sequence_length, s.training.dtype)
        group_meshes = sorted(by_key[key], key=lambda ms: ms.pp)
        base = build_tables(s.graph, s.training, group_meshes[0], analysis, cost_cache[mbs])
        choice = greedy_choices(base)
        mem_choices: list[Array] = []
        for mesh in group_meshes:
            tables = base if mesh is group_meshes[0] else for_mesh(base, mesh)
            cand = _screen(tables, choice, s.headroom)
            s.screened += 1
            for k, factor in enumerate(MEMORY_FACTORS):
                if cand is not None:
                    break
                if len(mem_choices) <= k:
                    mem_choices.append(greedy_choices(tables, memory_weight=factor * _memory_weight(tables)))
                cand = _screen(tables, mem_choices[k], s.headroom)
            if cand is None:
                s.pruned += 1
                fallback.append(tables)
                continue
            candidates.append(cand)
    return candidates, fallback


def _fit_with_cpsat(s: _Search, fallback: list[CostTables]) -> list[MeshCandidate]:
    """No greedy layout fits: let CP-SAT look for a fitting one on the layouts that shard the
    most (memory constraints are exact there), within the remaining time."""
    fallback = sorted(fallback, key=lambda tb: (-(tb.mesh.t * tb.mesh.pp), tb.mesh.micro_batch))
    for tables in fallback[:2]:
        remaining = s.deadline - time.perf_counter()
        if remaining < 0.5:
            break
        hint_choice = greedy_choices(tables, memory_weight=MEMORY_FACTORS[-1] * _memory_weight(tables))
        coarse = coarsen(tables, keep=hint_choice, max_per_group=s.max_per_group)
        res = solve_mesh(tables, coarse, cut_candidates(tables, hint_choice), remaining / 2, s.headroom,
                         hint=(hint_choice, None), workers=s.workers)
        if res is not None and res.status in ("OPTIMAL", "FEASIBLE"):
            ev = evaluate_assignment(tables, res.choice, res.stage_of_op)
            if _fits(tables, ev, s.headroom):
                return [MeshCandidate(mesh=tables.mesh, tables=tables, choice=res.choice, stage_of_op=res.stage_of_op, ev=ev,
                                      solver_status=res.status)]
    return []


def _refine(s: _Search, candidates: list[MeshCandidate]) -> list[MeshCandidate]:
    """CP-SAT on the best few outer candidates (the best one on large graphs); the most
    promising gets most of the time, the others only need to show whether they can beat the
    incumbent (objective cutoff).  Returns the candidates, fastest first."""
    refine = candidates[:1 if s.large else MAX_CPSAT_CANDIDATES]
    for idx, cand in enumerate(refine):
        remaining = s.deadline - time.perf_counter()
        if remaining < 0.3:
            s.statuses.append("NOT_RUN(time)")
            continue
        share = remaining * (0.6 if idx == 0 and len(refine) > 1 else 1.0 / (len(refine) - idx)) * 0.95
        incumbent = min(c.ev.step_time_s for c in candidates[: idx + 1]) if idx > 0 else None
        t_c = time.perf_counter()
        coarse = coarsen(cand.tables, keep=cand.choice, max_per_group=s.max_per_group)
        s.coarse_sizes.append(len(coarse.groups))
        s.exact_flags.append(coarse.exact)
        cuts = cut_candidates(cand.tables, cand.choice)
        spent = time.perf_counter() - t_c
        res = solve_mesh(cand.tables, coarse, cuts, max(0.1, share - spent), s.headroom, hint=(cand.choice, cand.stage_of_op),
                         workers=s.workers, cutoff_s=incumbent)
        if res is None:
            s.statuses.append("UNKNOWN")
            continue
        s.statuses.append(res.status if not (incumbent and res.status == "INFEASIBLE") else "CANNOT_BEAT_BEST")
        if res.status == "INFEASIBLE":
            continue
        ev = evaluate_assignment(cand.tables, res.choice, res.stage_of_op)
        if _fits(cand.tables, ev, s.headroom) and ev.step_time_s < cand.ev.step_time_s * (1 - 1e-12):
            candidates[idx] = replace(cand, choice=res.choice, stage_of_op=res.stage_of_op, ev=ev, solver_status=res.status)
        else:
            candidates[idx] = replace(cand, solver_status=res.status)
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
    """The greedy choice with its best split, if it fits."""
    cuts = None
    if tables.mesh.pp > 1 and len(np.nonzero(tables.analysis.chain_start)[0]) > MAX_SEGMENTS:
        cuts = cut_candidates(tables, choice)  # restrict cut points for speed: the solver's selection
    stage = split_stages(tables, choice, cuts, headroom_fraction=headroom)
    if stage is None:
        return None
    ev = evaluate_assignment(tables, choice, stage)
    if not _fits(tables, ev, headroom):
        return None
    return MeshCandidate(mesh=tables.mesh, tables=tables, choice=choice, stage_of_op=stage, ev=ev)


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
