"""Plan search: enumerate → cost (vectorised) → bound → CP-SAT split/assignment → place ranks.

1. Normalise the cluster into *pools*: available nodes of node groups with identical device and
   links merged; ``allowed_device_types`` filters them.
2. For every non-empty subset of pools (one device type alone, or several together): enumerate
   the knob space (``space.enumerate_space``), cost every candidate with the cost model's
   vectorised functions (``tables.even_tables``): exact step time for the near-even split,
   a lower bound over all splits, and exact memory feasibility.  A large one-pool space is
   first bounded from each candidate's compute alone (``tables.compute_lower_bound_s``) and a
   probe of its lowest-bound candidates costed: those bounded above what the probe's safe
   layouts already give are left out uncosted (``_Search._within_answer_bound``).
3. Branch and bound: candidates whose lower bound beats the best exact time so far get an
   optimal stage split (``split_cpsat.solve_split``: exact enumeration for one pool, CP-SAT for the
   split and stage → pool assignment over several).  Stops when no bound can beat the
   incumbent (the answer is then optimal under the cost model) or the time limit is hit.  A
   one-pool split that cannot beat the objective the answers must beat is given up early
   (``split_exact.single_pool_split``'s cutoff).  One-pool candidates carry their exact
   objective from the cost tables; multi-pool ones are estimated at once.
4. The best and top-k alternatives are (re-)checked with ``cost_model.estimate``; place ranks
   (``placement``), explain (``explain``).
5. A memory-tight answer (or a faster tight candidate) starts the same search restricted to
   safe candidates, seeded with the best safe answer and reusing the first search's costed
   candidates (their verdict at the safe capacity is a comparison, not a new costing).  When
   no candidate is safe and the best one's predicted peak is over usable memory (it fits only
   at the interval's low end), the same search restricted to candidates whose predicted peak
   is within it (``tight_memory: reject_unlikely``) gives the best: a layout more likely to
   run than not before one that fits only if the allocator fragments at its least.  When no
   candidate's predicted peak is within it either, the one that needs the least memory
   (``_least_memory_answer``) is the first alternative, named in a warning.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, NoReturn

import numpy as np

from cost_model.cluster import Cluster, Node, NodeGroup
from cost_model.devices import device_matches
from cost_model.errors import InvalidInput, InvalidStrategy, NoFeasiblePlan, PlannerError
from cost_model.estimate import (
    estimate,
    memory_verdict,
    offload_device_check,
    peak_over_usable,
    usable_memory_ratio,
    with_single_source_spread,
)
from cost_model.frameworks import rules_for
from cost_model.result import Estimate
from cost_model.strategy import SPLIT_FLAGS, Strategy, even_split, pipeline_split
from cost_model.topology import node_domains
from cost_model.training import Training
from cost_model.transformer.layer_cost import StrategyArrays, model_recompute_modules
from cost_model.transformer.memory import POINT, MemoryBound, bounds
from cost_model.transformer.spec import TransformerSpec
from cost_model.units import MILLION, S_PER_HOUR, bytes_to_gb, gb_to_bytes
from planner_service.planner.nesting import feasible_then_expand, nesting_comparison, with_nesting
from planner_service.planner.placement import placement_warnings
from planner_service.planner.request import PlanRequest, SearchCancelled, SolverSettings
from planner_service.planner.result import Evaluated, PlanResult
from planner_service.planner.transformer.space import (
    block_recompute_candidates,
    check_pins,
    check_pins_fit,
    enumerate_space,
    layout_keys,
    pin_notes,
    strategy_at,
)
from planner_service.planner.transformer.split_cpsat import WALL_GUARD_FACTOR, solve_split
from planner_service.planner.transformer.tables import (
    EvenTables,
    PoolCosts,
    compute_lower_bound_s,
    even_tables,
    pool_costs,
    pp_cross_node,
    stage_linear,
)
from planner_service.planner.transformer.tables import subset as pool_subset


@dataclass(frozen=True)
class _Candidate:
    """A split found by the search; ``evaluated`` is None until ``estimate`` has run on it."""

    objective: float
    strategy: Strategy
    stage_groups: tuple[str, ...]
    evaluated: Evaluated | None
    #: The queued refinement (subset id, candidate index) that would optimise this
    #: candidate's split; None when its split is already the optimal (or a pinned) one.
    source: tuple[int, int] | None = None


#: Spaces of more single-pool rows than this are pruned by a costed probe before they are
#: costed (``_Search._within_answer_bound``): the probe's rows, at least, and its share of the space.
BOUND_MIN_ROWS = 8192
BOUND_PROBE_ROWS = 2048
BOUND_PROBE_FRACTION = 0.005
#: Distinct layouts beyond the answers' that the probe's threshold keeps.
BOUND_SPARE_LAYOUTS = 8


#: Deterministic work charged for a refinement that finds no split.
INFEASIBLE_WORK_S = 1e-3


# ---- pools -------------------------------------------------------------------------------------


def normalise_cluster(cluster: Cluster, allowed: tuple[str, ...] | None) -> Cluster:
    """Merge node groups with identical device, GPUs per node, links and price into one pool
    (their available nodes, in order) and drop unavailable nodes and disallowed devices."""

    buckets: dict[tuple[Any, ...], list[NodeGroup]] = {}
    for g in cluster.node_groups:
        if allowed and not device_matches(g.device.name, allowed):
            continue
        if not cluster.available_nodes(g.name):
            continue
        key = (g.device, g.gpus_per_node, g.intra_node_bandwidth_GBps, g.inter_node_bandwidth_GBps, g.price_per_gpu_hour)
        buckets.setdefault(key, []).append(g)
    groups: list[NodeGroup] = []
    nodes: list[Node] = []
    domains = dict(zip((n.hostname for n in cluster.nodes), node_domains(cluster.topology, cluster.nodes), strict=True)) if cluster.topology else {}
    for members in buckets.values():
        hosts = [n.hostname for g in members for n in cluster.available_nodes(g.name)]
        name = "+".join(g.name for g in members)
        base = members[0]
        groups.append(replace(base, name=name, count=len(hosts), hostnames=tuple(hosts)))
        for g in members:
            nodes.extend(_in_pool(n, name, domains.get(n.hostname, n.domains)) for n in cluster.available_nodes(g.name))
    if not groups:
        raise NoFeasiblePlan("no available nodes of an allowed device type", field="constraints.allowed_device_types")
    return Cluster(name=cluster.name, node_groups=tuple(groups), nodes=tuple(nodes), topology=cluster.topology)


def _in_pool(n: Node, pool: str, domains: tuple[str, ...]) -> Node:
    """Node ``n`` as a member of ``pool`` with ``domains``: itself when that is what it is (a
    12,288-node cluster built ~0.15 s of copies otherwise)."""
    if n.group == pool and n.domains == domains:
        return n
    return Node(hostname=n.hostname, group=pool, available=n.available, driver_version=n.driver_version, cuda_version=n.cuda_version,
                nccl_version=n.nccl_version, domains=domains)


def transformer_search_size(request: PlanRequest) -> int:
    """Number of candidate strategies the search enumerates (cheap; decides sync vs async)."""
    model = request.model
    assert isinstance(model, TransformerSpec)
    cl = normalise_cluster(request.cluster, request.constraints.allowed_device_types)
    total = 0
    for r in range(1, len(cl.node_groups) + 1):
        for subset in itertools.combinations(cl.node_groups, r):
            gpus = sum(g.gpus_per_node * g.count for g in subset)
            if request.constraints.max_devices:
                gpus = min(gpus, request.constraints.max_devices)
            S = enumerate_space(model, request.training, gpus, min(g.gpus_per_node for g in subset), request.constraints.pinned, request.constraints.max_tp, request.constraints.max_pp)
            total += len(S)
    return total


# ---- objective ---------------------------------------------------------------------------------


def _price_per_gpu_hour(group: NodeGroup) -> float:
    """USD per GPU-hour; ``parse_plan_request`` requires it on every group for objective cost."""
    if group.price_per_gpu_hour is None:
        raise InvalidInput("objective cost needs price_per_gpu_hour on every node group", field="cluster.node_groups")
    return group.price_per_gpu_hour


def _objective_value(objective: str, est: Estimate, cluster: Cluster, stage_groups: tuple[str, ...], strategy: Strategy) -> float:
    """The objective of one estimated candidate: USD per million tokens for ``cost``, else the
    step time in seconds."""
    if objective == "cost":
        block = strategy.dp * strategy.cp * strategy.tp
        dollars_per_s = sum(_price_per_gpu_hour(cluster.group(g)) * block for g in stage_groups) / S_PER_HOUR
        return dollars_per_s / est.tokens_per_s * MILLION  # $ per million tokens
    return est.step_time_s


# ---- the search --------------------------------------------------------------------------------


#: A multi-pool or uneven-split candidate awaiting its optimal split: (lower bound, subset id,
#: pool indices, the pools' cost tables, candidate index, objective factor — None: estimate it).
_Pending = tuple[float, int, tuple[int, ...], list[PoolCosts], int, float | None]


@dataclass(frozen=True)
class _CostedPool:
    """One pool's candidates and their costs, as ``_Search._costed_pool`` computed them at
    ``fit_bound`` (``dropped``: the layouts left out for not fitting, or for a compute bound
    above what the answers must beat: ``_Search._within_answer_bound``)."""

    fit_bound: MemoryBound
    S: StrategyArrays
    dropped: int
    pcs: list[PoolCosts]
    tables: EvenTables | None  # None when there is no candidate
    #: on a topology, the layouts no split of which fits, dropped before their nesting orders
    #: were costed (``nesting.feasible_then_expand``; in Megatron's order), with their costs: the
    #: twins without recompute that make block-recompute variants worth costing
    unfit: PoolCosts | None = None


class _Search:
    """The state of one transformer search: the candidates found (in the order found), the
    incumbent objective, the candidates still to refine, and the counts the result reports."""

    def __init__(self, request: PlanRequest, settings: SolverSettings, cluster: Cluster, pools: list[NodeGroup],
                 memo: dict[int, _CostedPool] | None = None) -> None:
        assert isinstance(request.model, TransformerSpec)
        self.request = request
        self.settings = settings
        self.cluster = cluster
        self.pools = pools
        self.model: TransformerSpec = request.model
        self.training = request.training
        self.cons = request.constraints
        self.headroom = self.cons.headroom()
        # Memory feasibility from the predicted peak's interval (cost_model.transformer.memory):
        # a stage fits when its p10 is within usable memory, safely when its p90 is;
        # ``tight_memory: reject`` keeps safe only, ``reject_unlikely`` those whose predicted
        # peak itself is within usable memory.
        p10, self.safe_bound = bounds(self.training.framework)
        #: the end of the interval a stage must have within usable memory, and its name
        self.fit_bound, self.fit_bound_name = {"reject": (self.safe_bound, "p90"), "reject_unlikely": (POINT, "")}.get(
            self.cons.tight_memory, (p10, "p10"))
        self.pinned_lps = self.cons.pinned.get("layers_per_stage")
        #: pinned embedding/loss split flags (cost_model.strategy.pipeline_split): the split is
        #: fixed by the layout, as a pinned layers_per_stage is, and estimated exactly
        self.pinned_emb, self.pinned_loss = (bool(self.cons.pinned.get(f)) for f in SPLIT_FLAGS)
        self.pinned_flags = self.pinned_emb or self.pinned_loss
        self.fixed_split = bool(self.pinned_lps) or self.pinned_flags
        self.enumerated = 0
        #: rows the space gave over every subset, whether costed here or reused from a memo (0: the
        #: pinned fields leave the request no layout at all, :func:`_raise_pin_at_fault`)
        self.layouts = 0
        self.pruned = 0
        self.refinements = 0
        self.solver_statuses: list[str] = []
        self.candidates: dict[tuple[Any, ...], _Candidate] = {}
        #: the least-memory split of the layouts nothing of which fits: (its fit bound, its
        #: predicted peak (bytes), the device)
        self.closest_shortfall: list[tuple[float, float, str]] = []
        # peaks of the layouts the estimate rejected for memory (the search's tables let them through)
        self.closest_peak: list[tuple[float, str]] = []
        self.pending: list[_Pending] = []
        self.queued: dict[tuple[int, int], _Pending] = {}  # pending by (subset id, candidate index)
        self.refined: set[tuple[int, int]] = set()
        self.work_s = 0.0  # deterministic work spent by the refinements (s)
        self.best_objective = float(np.inf)  # the incumbent: the best exact objective so far
        #: each single-pool subset's costed candidates, by subset id (``_costed_pool``)
        self.memo: dict[int, _CostedPool] = {} if memo is None else memo

    @property
    def usable_fraction(self) -> float:
        """The share of device memory usable: 1 − headroom."""
        return 1.0 - self.headroom

    def seed(self, ev: Evaluated) -> None:
        """Start from an estimated candidate (``search_transformer``'s ``incumbent``): kept as
        found, its split not refined again."""
        self.candidates[(ev.strategy.key(), ev.stage_groups)] = _Candidate(ev.objective, ev.strategy, ev.stage_groups, ev)
        self.best_objective = min(self.best_objective, ev.objective)

    def evaluate(self, strategy: Strategy, stage_groups: tuple[str, ...]) -> Evaluated | None:
        try:
            # the single-source spread of the interval is for the answers (``_spread``)
            est = estimate(self.model, self.training, self.cluster, strategy, stage_groups=stage_groups, spread_single_source=False)
        except PlannerError:
            return None
        fits, tight, memory_warning = memory_verdict(est.stages, self.headroom, self.training.framework)
        if not fits or (tight and self.cons.tight_memory == "reject") or (
                self.cons.tight_memory == "reject_unlikely" and peak_over_usable(est.stages, self.headroom)):
            # what the search reports if nothing fits (the stage furthest over, its device)
            worst = max(est.stages, key=lambda st: st.peak_memory_GB - st.memory_capacity_GB)
            self.closest_peak.append((gb_to_bytes(worst.peak_memory_GB), worst.device))
            return None
        if est.fits != fits or est.tight != tight or self.headroom:
            # The verdict against usable memory (the estimate's is against the whole device).
            kept = tuple(w for w in est.warnings if not w.startswith(("does not fit", "memory tight")))
            est = replace(est, fits=fits, tight=tight, warnings=kept + ((memory_warning,) if memory_warning else ()))
        return Evaluated(strategy=strategy, stage_groups=stage_groups, prediction=est,
                         objective=_objective_value(self.request.objective, est, self.cluster, stage_groups, strategy))

    def record(
        self, strategy: Strategy, stage_groups: tuple[str, ...], objective: float | None = None, source: tuple[int, int] | None = None
    ) -> None:
        """Keep a candidate.  ``objective`` given: the value from the search's cost tables (the
        cost model's step time for this exact split, by the same functions ``estimate`` uses),
        and the candidate is estimated only if it ends up among the answers.  Otherwise it is
        estimated now."""
        key = (strategy.key(), stage_groups)
        if key in self.candidates:
            return
        ev = None
        if objective is None:
            ev = self.evaluate(strategy, stage_groups)
            if ev is None:
                return
            objective = ev.objective
        self.candidates[key] = _Candidate(objective, strategy, stage_groups, ev, source)
        self.best_objective = min(self.best_objective, objective)

    def cost_subset(self, si: int, subset: tuple[int, ...]) -> None:
        """Enumerate and cost the candidates of one subset of pools: one pool records its best
        even splits and queues the uneven ones; several pools queue every candidate by bound."""
        cons = self.cons
        groups = [self.pools[i] for i in subset]
        gpn = min(g.gpus_per_node for g in groups)
        if any(g.gpus_per_node % gpn for g in groups):
            return
        gpus = sum(g.gpus_per_node * g.count for g in groups)
        if cons.max_devices:
            gpus = min(gpus, cons.max_devices)
        S = enumerate_space(self.model, self.training, gpus, gpn, cons.pinned, cons.max_tp, cons.max_pp)
        self.layouts += len(S)
        if len(S) == 0:
            return
        block = S.dp * S.cp * S.tp
        caps = np.stack([np.floor(g.gpus_per_node * g.count / block) for g in groups])
        keep = caps.sum(axis=0) >= S.pp
        if len(groups) > 1 and self.pinned_flags:
            return  # the embedding/loss split flags are searched on one pool only
        if len(groups) > 1:
            # Several pools: every pool hosts ≥ 1 stage (else it is another subset), interleaving
            # needs an even split, and pinned uneven splits are single-pool only.
            keep &= (caps >= 1).all(axis=0) & (S.pp >= len(groups)) & (S.vpp == 1)
        S = S.take(np.nonzero(keep)[0])
        if len(groups) == 1:
            costed, fresh = self._costed_pool(si, groups[0], S)
            if fresh:  # (a reused costing's candidates were counted by the search that costed them)
                self.enumerated += costed.dropped + len(costed.S)
                self.pruned += costed.dropped
            if costed.tables is None:  # no candidate
                return
            S = costed.S
            feasible, bound = self._cost_one_pool(si, subset, groups[0], S, costed.pcs, costed.tables, count=fresh)
            # Block (partial) recompute of the layouts that fit only with full recompute: a
            # second, small pass under its own subset key (queued entries are keyed by it),
            # skipping layouts whose bound without recompute cannot enter the answers.
            unfit, unfit_bound = costed.unfit, None
            if unfit is not None and len(unfit.S):
                # (a bound over every nesting order: a twin in Megatron's order stands for each)
                unfit_bound = compute_lower_bound_s(self.model, self.training, unfit) * _objective_factor(
                    self.request.objective, self.training, unfit.S, groups)
            S2 = block_recompute_candidates(self.model, self.training, S, feasible, cons.pinned, bound, self._answer_threshold(),
                                            unfit.S if unfit is not None else None, unfit_bound)
            if len(S2):
                self.enumerated += len(S2)
                pcs2 = [pool_costs(self.model, self.training, groups[0], S2)]
                self._cost_one_pool(-1 - si, subset, groups[0], S2, pcs2, even_tables(self.model, self.training, pcs2[0]))
            return
        self.enumerated += len(S)
        if len(S) == 0:
            return
        pcs = [pool_costs(self.model, self.training, g, S) for g in groups]
        lbs = _hetero_lower_bounds(self.model, self.training, pcs, S, groups) * _objective_factor(self.request.objective, self.training, S, groups)
        for j in np.argsort(lbs):
            self.pending.append((float(lbs[j]), si, subset, pcs, int(j), None))

    def _costed_pool(self, si: int, g: NodeGroup, S: StrategyArrays) -> tuple[_CostedPool, bool]:
        """One pool's candidates costed (``tables.even_tables``): on a topology every nesting
        order of the layouts some split of which fits at the search's fit bound.  Kept in the
        memo shared with a later search of the same request (the safe search), which reuses them
        when its bound is no looser: the rows that fit it are among these, and the tables'
        verdict at its bound drops the others.  Also returns whether it was costed now."""
        known = self.memo.get(si)
        if known is not None and known.fit_bound.admits_all_of(self.fit_bound):
            return known, False
        if len(S) == 0:
            self.memo[si] = costed = _CostedPool(self.fit_bound, S, 0, [], None)
            return costed, True
        # the rows' per-device costs once: the compute bound, the memory test before the nesting
        # orders, and the tables of the rows as they are all read them
        pc, bounded = self._within_answer_bound(pool_costs(self.model, self.training, g, S))
        S, unfit_rows = feasible_then_expand(self.model, self.training, pc, self.usable_fraction, self.fit_bound)
        unfit = pool_subset(pc, unfit_rows) if unfit_rows is not None else None
        dropped = bounded + (len(unfit_rows) if unfit_rows is not None else 0)
        pcs = [pc if unfit is None else pool_costs(self.model, self.training, g, S)]
        self.memo[si] = costed = _CostedPool(self.fit_bound, S, dropped, pcs, even_tables(self.model, self.training, pcs[0]), unfit)
        return costed, True

    def _within_answer_bound(self, pc: PoolCosts) -> tuple[PoolCosts, int]:
        """The rows of a large space that can still enter the answers, and how many are left out.

        Every row is bounded from its compute alone (``tables.compute_lower_bound_s``, a bound
        over all splits and nesting orders, without a ``stage_cost`` call); the
        :data:`BOUND_PROBE_ROWS` rows of lowest bound (or :data:`BOUND_PROBE_FRACTION` of the
        space) are costed, and the objective of the probe's (top_k + 1 + :data:`BOUND_SPARE_LAYOUTS`)-th
        best distinct layout whose even split is safely within memory (every stage's p90) is the
        threshold: rows bounded above it cannot enter the answers of any search that shares this
        costing — the first search's, the safe one's, the one restricted to predicted peaks
        within memory — because each admits every safe row, so at least top_k + 1 layouts of its
        own are at the threshold or below.  (The spare layouts stand for answers the estimate
        might reject.)  Every row is kept when the split is pinned (its answers are the pinned
        split's, which the even split does not bound from above), the space is small, or the
        probe holds too few safe layouts."""
        S, g = pc.S, pc.group
        if self.fixed_split or len(S) <= BOUND_MIN_ROWS:
            return pc, 0
        factor = _objective_factor(self.request.objective, self.training, S, [g])
        bound = compute_lower_bound_s(self.model, self.training, pc) * factor
        probe = np.argsort(bound, kind="stable")[: max(BOUND_PROBE_ROWS, int(len(S) * BOUND_PROBE_FRACTION))]
        safe = even_tables(self.model, self.training, pool_subset(pc, probe)).evaluate(
            g.device.memory_bytes * self.usable_fraction, self.safe_bound).step_time_s * factor[probe]
        threshold = _kth_layout_objective(safe, layout_keys(S.take(probe)), self.request.top_k + 1 + BOUND_SPARE_LAYOUTS)
        keep = np.nonzero(bound <= threshold * (1.0 + 1e-9))[0]
        return (pc, 0) if len(keep) == len(S) else (pool_subset(pc, keep), len(S) - len(keep))

    def _answer_threshold(self) -> float:
        """The objective a candidate must beat to be among the best and top-k answers so far
        (the (top_k+1)-th best distinct layout's; inf while fewer are recorded).  With tight
        candidates ranked after the safe ones, faster tight ones may keep a slower safe one out
        of the answers here: then the safe search runs (``_pick_answers``' third value)."""
        best: dict[tuple[Any, ...], float] = {}
        for c in self.candidates.values():
            sh = _shape(c.strategy, c.stage_groups)
            best[sh] = min(best.get(sh, np.inf), c.objective)
        ranked = sorted(best.values())
        k = self.request.top_k
        return ranked[k] if len(ranked) > k else float("inf")

    def _cost_one_pool(self, si: int, subset: tuple[int, ...], g: NodeGroup, S: StrategyArrays,
                       pcs: list[PoolCosts], tables: EvenTables, count: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Record and queue the candidates of one pool (``tables``: their costs); returns which
        rows some split of which fits, and each row's lower bound of the objective over all
        splits."""
        ev_even = tables.evaluate(g.device.memory_bytes * self.usable_fraction, self.fit_bound, self.safe_bound)
        feasible = ev_even.feasible
        lb = ev_even.lower_bound_s
        if count:  # (``count`` False: these candidates were counted by the search that costed them)
            self.pruned += int((~feasible).sum())
        if not feasible.any():
            least_bound, least_peak = tables.least_memory(self.fit_bound)
            j = int(np.argmin(least_bound))
            self.closest_shortfall.append((float(least_bound[j]), float(least_peak[j]), g.device.name))
            return feasible, np.full(len(S), np.inf)  # nothing fits: no bound is needed
        # Exact results for the even splits that fit (ranked by the objective).
        factor = _objective_factor(self.request.objective, self.training, S, [g])
        lb = lb * factor
        even_objective = ev_even.step_time_s * factor
        if self.fixed_split:
            # The pinned split, not the even one, is what runs: every candidate some split of
            # which fits is estimated with the pinned split (ordered by its bound).
            even_objective = np.where(feasible, lb, np.inf)
        # Keep only the best even split of each distinct layout, enough of them for the
        # best answer and its top-k alternatives.
        shapes = layout_keys(S)
        if self.fixed_split:
            self._record_fixed(S, g, even_objective)
        else:
            for j in self._best_per_layout(S, even_objective, shapes):
                pp = int(S.pp[j])
                uneven = pp > 1 and int(S.vpp[j]) == 1 and bool(feasible[j])
                self.record(self._even_strategy(S, j), (g.name,) * pp, float(even_objective[j]), (si, j) if uneven else None)
        if self.cons.tight_memory == "rank_after_safe" and ev_even.safe_step_time_s is not None:
            self._record_safe(S, g, ev_even.safe_step_time_s * factor, shapes)
        if self.fixed_split:
            return feasible, lb  # a pinned split has no uneven splits to refine
        for j in map(int, np.nonzero(feasible & (S.vpp == 1) & (S.pp > 1))[0]):
            entry = (float(lb[j]), si, (subset[0],), pcs, int(j), float(factor[j]))
            self.pending.append(entry)
            self.queued[(si, int(j))] = entry
        # An interleaved layout's splits are not refined (its chunks stay near-even): it fits only
        # where its near-even split does, whatever split would in principle (for block recompute,
        # whose variants are made for the layouts that do not fit without recompute).
        return np.where(S.vpp > 1, np.isfinite(ev_even.step_time_s), feasible), lb

    def _record_fixed(self, S: StrategyArrays, g: NodeGroup, bound: np.ndarray) -> None:
        """With the split pinned, each row is estimated with it (the tables costed the even
        split, and give a lower bound of the objective over all splits): rows in bound order
        until the bound reaches the objective the answers must beat (branch and bound over the
        estimates; the best-bound row may be one whose pinned split does not fit), at most
        :data:`FIXED_SPLIT_REJECTIONS` of them rejected by the estimate."""
        rejected = 0
        for j in map(int, np.argsort(bound, kind="stable")):
            if not np.isfinite(bound[j]) or bound[j] >= self._answer_threshold() * (1 - 1e-9) or rejected >= FIXED_SPLIT_REJECTIONS:
                return
            strategy = self._even_strategy(S, j)
            self.record(strategy, (g.name,) * int(S.pp[j]), None)
            rejected += (strategy.key(), (g.name,) * int(S.pp[j])) not in self.candidates

    def _record_safe(self, S: StrategyArrays, g: NodeGroup, safe_objective: np.ndarray, shapes: np.ndarray) -> None:
        """Also keep the best even splits whose every stage is safely within memory (p90), so
        that a tight best has safe alternatives to rank before it."""
        for j in self._best_per_layout(S, safe_objective, shapes):
            known = None if self.fixed_split else float(safe_objective[j])
            self.record(self._even_strategy(S, j), (g.name,) * int(S.pp[j]), known)

    def _best_per_layout(self, S: StrategyArrays, objective: np.ndarray, shapes: np.ndarray) -> Iterator[int]:
        """Rows of the best finite ``objective`` of each distinct layout (``shapes`` row), best
        first, enough for the answer and its top-k alternatives (and up to :data:`TIE_LOOKAHEAD`
        more tied with the last of them).  Nesting orders of one layout
        are adjacent rows: a stable sort keeps Megatron's first among equal objectives (without
        a topology the order is the plain argsort's)."""
        order = np.argsort(objective) if S.nest is None else np.argsort(objective, kind="stable")
        seen: set[tuple[Any, ...]] = set()
        last, ties = np.inf, 0
        for j in map(int, order):
            if not np.isfinite(objective[j]):
                return
            # past the answers, layouts tied with the last one are kept too (``_pick_answers`` breaks the tie)
            if len(seen) > self.request.top_k and (objective[j] > last * (1 + TIE_TOLERANCE) or ties >= TIE_LOOKAHEAD):
                return
            key = tuple(shapes[j])
            if key in seen:
                continue
            ties += len(seen) > self.request.top_k
            seen.add(key)
            last = float(objective[j])
            yield j

    def _even_strategy(self, S: StrategyArrays, j: int) -> Strategy:
        """Row ``j`` with the pinned split (a layers_per_stage or the embedding/loss flags), else the
        even split (none when interleaved)."""
        pp = int(S.pp[j])
        if self.pinned_flags and not self.pinned_lps:  # the flags decide the split
            lps = pipeline_split(self.model.num_layers, pp * int(S.vpp[j]), embedding=self.pinned_emb, loss=self.pinned_loss)
        else:
            lps = self.pinned_lps or even_split(self.model.num_layers, pp)
            if int(S.vpp[j]) > 1 and not self.pinned_lps:
                lps = None
        s = strategy_at(S, j, lps if pp > 1 and lps else None)
        if self.pinned_flags:
            s = replace(s, account_for_embedding_in_pipeline_split=self.pinned_emb, account_for_loss_in_pipeline_split=self.pinned_loss)
        return with_nesting(S, j, s)

    def branch_and_bound(self, progress: Callable[[float], None] | None, should_cancel: Callable[[], bool] | None) -> bool:
        """Refine the queued candidates whose bound beats the incumbent; the solver's budget
        starts here (enumeration and costing are bounded by the space size).  The budget is of
        deterministic work (``SplitResult.work_s``), not of the clock, so the same request
        stops at the same point on any host.  True when every candidate was refined or pruned
        (none left for lack of budget)."""
        settings = self.settings
        wall_guard = time.perf_counter() + settings.time_limit_s * WALL_GUARD_FACTOR
        pending = self.pending
        pending.sort(key=lambda x: x[0])
        for k, entry in enumerate(pending):
            lb = entry[0]
            if should_cancel and should_cancel():
                raise SearchCancelled("the job was cancelled")
            if lb >= self.best_objective * (1 - 1e-9):
                # Bounds only rise down the sorted list and the incumbent only falls: every
                # candidate from here on is pruned.
                self.pruned += len(pending) - k
                break
            if self.work_s >= settings.time_limit_s or self.refinements >= settings.max_refinements or time.perf_counter() > wall_guard:
                return False
            self.refine(entry)
            if progress and pending:
                progress(0.3 + 0.6 * self.refinements / max(len(pending), 1))
        return True

    def refine(self, entry: _Pending, cutoff: bool = True) -> None:
        """The optimal split of one queued candidate, recorded (and its work counted).
        ``cutoff``: give up a one-pool split that cannot beat the answers so far."""
        _lb, si, subset, pcs, j, factor_j = entry
        self.refinements += 1
        self.refined.add((si, j))
        budget_left_s = max(0.0, self.settings.time_limit_s - self.work_s)
        # A split that cannot beat the answers is given up (the answers' own are refined
        # without a cutoff, by refine_answers).
        # One pool only: a multi-pool entry has no objective factor (None), and its split's
        # objective is not exactly the estimate's.
        cutoff_s = self._answer_threshold() / factor_j if cutoff and factor_j else float("inf")
        res = _refine(self.model, self.training, [self.pools[i] for i in subset], pcs, j, self.usable_fraction, self.fit_bound, self.settings,
                      budget_left_s, cutoff_s)
        self.work_s += res.work_s if res is not None else INFEASIBLE_WORK_S
        if res is None:
            return
        self.solver_statuses.append(res.status)
        # An exact split's objective is the cost model's step time (split_exact, the same
        # functions estimate uses): the candidate is estimated only if it is among the answers.
        # CP-SAT's integer-scaled objective, or a multi-pool cost objective: estimate now.
        if factor_j is not None:
            known: float | None = res.objective_s * factor_j
        else:
            known = res.objective_s if res.exact and self.request.objective != "cost" else None
        self.record(res.strategy, res.stage_groups, known)

    def refine_answers(self, k: int) -> None:
        """A candidate is only reported after its own split was optimised: the best and top-k
        candidates still carrying the even split the tables costed (their uneven split left
        for lack of budget, or pruned against a bound) are refined now, until the answers are
        all refined.  At most a few rounds of k + 1 refinements, outside the budget."""
        for _ in range(3):
            todo = []
            seen: set[tuple[Any, ...]] = set()
            for c in sorted(self.candidates.values(), key=lambda c: c.objective):
                sh = _shape(c.strategy, c.stage_groups)
                if sh in seen:
                    continue
                seen.add(sh)
                if c.source is not None and c.source not in self.refined and c.source in self.queued:
                    todo.append(self.queued[c.source])
                if len(seen) > k:
                    break
            if not todo:
                return
            for entry in todo:
                self.refine(entry, cutoff=False)


def _dtype_pools(cluster: Cluster, training: Training) -> tuple[list[NodeGroup], list[str]]:
    """The pools whose device supports the training dtype, and a warning for each left out."""
    pools = [g for g in cluster.node_groups if training.dtype in g.device.supported_dtypes()]
    dtype_warnings = [
        f"{g.device.name} ({g.name}) has no {training.dtype} support: left out"
        for g in cluster.node_groups
        if training.dtype not in g.device.supported_dtypes()
    ]
    if not pools:
        raise NoFeasiblePlan(
            f"no device in the cluster supports {training.dtype}: " + "; ".join(dtype_warnings), field="training.dtype"
        )
    return pools, dtype_warnings


def search_transformer(
    request: PlanRequest,
    settings: SolverSettings,
    progress: Callable[[float], None] | None = None,
    should_cancel: Callable[[], bool] | None = None,
    incumbent: Evaluated | None = None,
    memo: dict[int, _CostedPool] | None = None,
) -> PlanResult:
    """The transformer search over a parsed request (see the module docstring).  ``incumbent``:
    an estimated candidate of this request's space that its memory rule admits, recorded before
    the search starts, so that branch and bound prunes against its objective from the first
    refinement on (the safe search is seeded with the best safe answer of the first).  ``memo``:
    a search of the same request's costed candidates (``_Search._costed_pool``)."""
    t0 = time.perf_counter()
    # Operator profiles are applied to the cluster's devices before planning (the service does
    # it for profile_id; the CLI for --profile), so the search sees calibrated devices.
    cluster = normalise_cluster(request.cluster, request.constraints.allowed_device_types)
    training = request.training
    assert isinstance(request.model, TransformerSpec)
    check_pins(request.model, training, request.constraints.pinned)
    cons = request.constraints
    check_pins_fit(cons.pinned, cluster.total_gpus, cons.max_devices, cons.max_tp, cons.max_pp)
    pools, dtype_warnings = _dtype_pools(cluster, training)
    offload_device_check(training, [g.device for g in pools])
    state = _Search(request, settings, cluster, pools, memo)
    if incumbent is not None:
        state.seed(incumbent)
    subsets = [s for r in range(1, len(pools) + 1) for s in itertools.combinations(range(len(pools)), r)]
    for si, subset in enumerate(subsets):
        state.cost_subset(si, subset)
    if progress:
        progress(0.3)
    complete = state.branch_and_bound(progress, should_cancel)
    state.refine_answers(request.top_k)

    hint = recompute_modules_hint(request.model, training, request.constraints.pinned) + offload_hint(training)
    if not state.candidates:
        if not state.layouts:
            _raise_pin_at_fault(request)
        _raise_infeasible(cluster, state.headroom, state.closest_shortfall, state.fit_bound_name, state.closest_peak, hint)
    picked, incumbent_held, needs_safe_search = _pick_answers(list(state.candidates.values()), state.evaluate, request.top_k,
                                           safe_first=request.constraints.tight_memory == "rank_after_safe")
    if not picked:
        _raise_infeasible(cluster, state.headroom, state.closest_shortfall, state.fit_bound_name, state.closest_peak, hint)
    # The bound pruned against an incumbent that estimate then rejected: not proven optimal.
    complete = complete and incumbent_held
    best, alternatives = picked[0], picked[1:]
    if state.solver_statuses:
        status = "OPTIMAL" if complete and all(s == "OPTIMAL" for s in state.solver_statuses) else "FEASIBLE"
    else:
        status = "OPTIMAL" if complete else "FEASIBLE"
    # Preflight (mixed versions or devices inside a group) is the plan service's, over the ranks it stores.
    search = {
        "candidates": state.enumerated,
        "pruned": state.pruned,
        "refined": state.refinements,
        "solver_status": status,
        "work_s": round(state.work_s, 4),
        "wall_time_s": round(time.perf_counter() - t0, 4),
    }
    # A tight answer faster than the best safe one: that safe one was found by a search whose
    # splits were optimised under the p10 verdict (a candidate's fastest split may be tight
    # where a slower split of it is safe), so the optimal safe plan is searched on its own —
    # as it is when tight candidates crowd the safe ones out of the answers.
    safe, fallback = None, None
    if request.constraints.tight_memory == "rank_after_safe" and (best.prediction.tight or needs_safe_search):
        safe = _restricted_search(request, settings, should_cancel, next((e for e in picked if not e.prediction.tight), None), state.memo)
        if safe is None and peak_over_usable(best.prediction.stages, state.headroom):
            # Nothing is safe and the best fits only at the interval's low end: the best of
            # those whose predicted peak fits comes first, if any does.
            fallback = _restricted_search(request, settings, should_cancel,
                                          next((e for e in picked if not peak_over_usable(e.prediction.stages, state.headroom)), None),
                                          state.memo, level="reject_unlikely")
    first = safe or fallback
    least = None
    if (first is None and request.constraints.tight_memory == "rank_after_safe"
            and peak_over_usable(best.prediction.stages, state.headroom)):
        # Nothing's predicted peak fits (the restricted search found none): the layout that
        # needs the least memory has the best odds of running.  It joins the alternatives, first
        # among them, rather than replacing the best: a run tuned to the edge of memory often
        # fits where the prediction is over it (a measured peak is within ±10–15% of the
        # predicted one), and then the fastest layout is the one that ran.
        least = _least_memory_answer(state)
        least = _spread(state, least) if least is not None else None
        if (least is not None and usable_memory_ratio(least.prediction.stages, state.headroom) < usable_memory_ratio(best.prediction.stages, state.headroom) - 1e-9
                and _shape(least.strategy, least.stage_groups) != _shape(best.strategy, best.stage_groups)):
            others = [e for e in alternatives if _shape(e.strategy, e.stage_groups) != _shape(least.strategy, least.stage_groups)]
            alternatives = [least, *others][: request.top_k]
        else:
            least = None
    if first is None:
        # the answers are this search's own: their intervals spread here (a restricted search's
        # answers were spread by it), so the candidates it replaces are not costed twice
        best = _spread(state, best)
        alternatives = [e if e is least else _spread(state, e) for e in alternatives]
        warnings = dtype_warnings + list(best.prediction.warnings) + placement_warnings(cluster, best.strategy, best.stage_groups)
        warnings += pin_notes(request.model, training, request.constraints.pinned, best.strategy)
        nesting = nesting_comparison(best.strategy, best.stage_groups, cluster, lambda s: _estimate_or_none(state, s, best.stage_groups))
        if least is not None:
            where = "the first alternative" if request.top_k else "ask for alternatives (top_k) to see it"
            warnings.append(
                f"no layout's predicted peak fits usable memory: the one that needs the least "
                f"({max(least.prediction.peak_memory_GB):.1f} GB per GPU against {max(best.prediction.peak_memory_GB):.1f} GB, "
                f"{least.prediction.step_time_s:.4g} s per step) has the best odds of running: {where}")
    else:
        # The optimal safe plan (else the optimal one whose predicted peak fits) first, then
        # its alternatives of the same kind, then the rest.
        shapes = {_shape(e.strategy, e.stage_groups) for e in (first.best, *first.alternatives)}
        if safe is not None:
            rest = [e for e in picked if e.prediction.tight and _shape(e.strategy, e.stage_groups) not in shapes]
        else:
            rest = [e for e in picked if peak_over_usable(e.prediction.stages, state.headroom) and _shape(e.strategy, e.stage_groups) not in shapes]
        # The fastest of the rest stays among the alternatives (flagged), after the first kind.
        keep_rest = min(len(rest), 1 if request.top_k else 0)
        rest = [_spread(state, e) for e in rest[: request.top_k]]
        best, alternatives = first.best, [*first.alternatives[: request.top_k - keep_rest], *rest][: request.top_k]
        # the first plan's own warnings (its placement's among them) and nesting comparison
        warnings, nesting = list(first.warnings), first.nesting
        if rest and safe is not None:
            warnings.append(f"a faster layout ({rest[0].prediction.step_time_s:.4g} s per step) is memory-tight (its p90 peak "
                            "exceeds usable memory): ranked after the safe plans")
        elif rest:
            warnings.append(f"no layout fits safely; a faster one ({rest[0].prediction.step_time_s:.4g} s per step) fits only at the "
                            "low end of its peak's interval (its predicted peak exceeds usable memory): ranked after those "
                            "whose predicted peak fits")
        # The second search re-examines the first one's candidates (its costing reused): only
        # the candidates it costed anew and its refinements add to the counts, not its
        # prunings of candidates already counted (pruned stays at most the candidates).
        search["candidates"] += first.search["candidates"]
        search["refined"] += first.search["refined"]
        search["wall_time_s"] = round(time.perf_counter() - t0, 4)
    if progress:
        progress(1.0)
    return PlanResult(
        best=best,
        alternatives=alternatives,
        search=search,
        warnings=warnings,
        cluster=cluster,
        model=state.model,
        objective=request.objective,
        extra={"total_tokens": training.total_tokens} if training.total_tokens else {},
        nesting=nesting,
    )


#: How many of the layouts with the least memory bound over splits are estimated (their even
#: split) when the least-memory answer is looked for.
LEAST_MEMORY_CANDIDATES = 4


def _least_memory_answer(state: _Search) -> Evaluated | None:
    """The single-pool layout, of those the search costed (every one some split of which fits
    at the p10 verdict), whose predicted peak is the least over usable memory: the
    :data:`LEAST_MEMORY_CANDIDATES` with the lowest least-memory bound over splits
    (``tables.EvenTables``, relative to their pool's memory), each estimated at its even split,
    the lowest of them.  None when none is estimated as fitting."""
    ranked: list[tuple[float, int, StrategyArrays, int]] = []
    for si, costed in state.memo.items():
        if costed.tables is None or not 0 <= si < len(state.pools):
            continue
        ratio = costed.tables.least_memory(POINT)[1] / (state.pools[si].device.memory_bytes * state.usable_fraction)
        for k in np.argsort(ratio, kind="stable")[:LEAST_MEMORY_CANDIDATES]:
            if np.isfinite(ratio[k]):
                ranked.append((float(ratio[k]), si, costed.S, int(k)))
    ranked.sort(key=lambda r: r[0])
    found: list[Evaluated] = []
    for _ratio, si, S, j in ranked[:LEAST_MEMORY_CANDIDATES]:
        ev = state.evaluate(state._even_strategy(S, j), (state.pools[si].name,) * int(S.pp[j]))
        if ev is not None:
            found.append(ev)
    return min(found, key=lambda e: (usable_memory_ratio(e.prediction.stages, state.headroom), e.objective), default=None)


def _spread(state: _Search, ev: Evaluated) -> Evaluated:
    """An answer with its step-time interval spread over the single-source constants' priors
    (``cost_model.estimate.with_single_source_spread``), which the search's estimates skip;
    as it is where the request asks for none (a cluster calibrated by its own runs)."""
    if not state.request.spread_single_source:
        return ev
    return replace(ev, prediction=with_single_source_spread(ev.prediction, state.model, state.training, state.cluster, ev.strategy,
                                                            ev.stage_groups or None))


def _estimate_or_none(state: _Search, strategy: Strategy, stage_groups: tuple[str, ...]) -> Estimate | None:
    ev = state.evaluate(strategy, stage_groups)
    return ev.prediction if ev is not None else None


def _restricted_search(request: PlanRequest, settings: SolverSettings, should_cancel: Callable[[], bool] | None,
                       incumbent: Evaluated | None, memo: dict[int, _CostedPool], level: str = "reject") -> PlanResult | None:
    """The same search restricted to memory-safe candidates (every stage's p90 within usable
    memory), None when none is: run when the best candidate is tight, so that a safe plan ranks
    first and is optimal among the safe ones.  ``incumbent``: the first search's best safe
    answer (its split optimised under the p10 verdict, and safe), which bounds the safe optimum
    from above — the safe search starts from it instead of from its even splits.  ``memo``: the
    first search's costed candidates, reused.  ``level``: the ``tight_memory`` rule of the
    restricted search — ``reject`` (safe), or ``reject_unlikely`` (predicted peak within usable
    memory) when nothing is safe."""
    restricted = replace(request, constraints=replace(request.constraints, tight_memory=level))
    try:
        return search_transformer(restricted, settings, None, should_cancel, incumbent, memo)
    except NoFeasiblePlan:
        return None


def _kth_layout_objective(objective: np.ndarray, shapes: np.ndarray, k: int) -> float:
    """The k-th best finite ``objective`` over distinct layouts (``shapes`` rows: each layout at
    its best row), inf when fewer than k layouts have one."""
    finite = np.nonzero(np.isfinite(objective))[0]
    order = finite[np.argsort(objective[finite], kind="stable")]
    _, first = np.unique(shapes[order], axis=0, return_index=True)
    best = np.sort(objective[order[first]])
    return float(best[k - 1]) if len(best) >= k else float("inf")


def _objective_factor(objective: str, training: Training, S: StrategyArrays, groups: list[NodeGroup]) -> np.ndarray:
    """Objective = step time × factor.  Throughput and time to train: 1.  Cost (USD per
    million tokens): the price per second of the GPUs a candidate uses over the tokens of a
    step — for several pools a lower bound, every GPU at the cheapest pool's price."""
    if objective != "cost":
        return np.ones(len(S))
    cheapest = min(_price_per_gpu_hour(g) for g in groups)
    gpus = S.dp * S.cp * S.tp * S.pp
    factor: np.ndarray = cheapest / S_PER_HOUR * gpus * MILLION / training.tokens_per_step
    return factor


def _hetero_lower_bounds(
    model: TransformerSpec, training: Training, pcs: list[PoolCosts], S: StrategyArrays, groups: list[NodeGroup]
) -> np.ndarray:
    """Bound for multi-pool candidates (vectorised).  With per-layer stage times b_p, stage
    time T ≥ n_i·b_{p(i)}, so L = Σ n_i ≤ T·Σ_i 1/b_{p(i)} ≤ T·(the pp largest 1/b_p the pool
    capacities allow); and Σ t ≥ L·min_p b_p + the cheapest embedding and head.  Pipeline ≥
    (m − 1/v)·T + Σt/v with v = 1."""
    L = model.num_layers
    block = S.dp * S.cp * S.tp
    b = np.stack([pc.dc.layer.total_s for pc in pcs])  # [P, N]
    caps = np.stack([np.floor(g.gpus_per_node * g.count / block) for g in groups])  # [P, N]
    order = np.argsort(b, axis=0)
    inv_sum = np.zeros(len(S))
    left = S.pp.copy()
    for r in range(len(pcs)):
        p = order[r]
        bp = np.take_along_axis(b, p[None, :], 0)[0]
        cp = np.take_along_axis(caps, p[None, :], 0)[0]
        take = np.minimum(cp, left)
        inv_sum += take / bp
        left -= take
    T_lb = L / np.maximum(inv_sum, 1e-30)
    m = training.global_batch_size / (S.dp * S.mbs)
    extras = np.stack([pc.dc.embedding_s + pc.dc.head_s for pc in pcs]).min(axis=0)
    sum_t = L * b.min(axis=0) + extras
    bound: np.ndarray = (m - 1.0) * T_lb + sum_t
    return bound


@dataclass(frozen=True)
class _Refined:
    """One refinement's split (``_refine``)."""

    strategy: Strategy
    stage_groups: tuple[str, ...]
    status: str
    objective_s: float  # the step time of the split
    work_s: float
    exact: bool  # the step time is the cost model's (not CP-SAT's integer-scaled objective)


def _refine(
    model: TransformerSpec,
    training: Training,
    groups: list[NodeGroup],
    pcs: list[PoolCosts],
    j: int,
    usable_fraction: float,
    bound: MemoryBound,
    settings: SolverSettings,
    budget_left_s: float,
    cutoff_s: float = float("inf"),
) -> _Refined | None:
    """Optimal split (and pool assignment) for candidate j (``split_cpsat.solve_split``) with
    every stage's ``bound`` within ``usable_fraction`` of its device's memory; None when no
    split fits, or none beats ``cutoff_s``."""
    S = pcs[0].S
    pp = int(S.pp[j])
    block = int(S.dp[j] * S.cp[j] * S.tp[j])
    lins = []
    for g, pc in zip(groups, pcs, strict=True):
        cross_default = bool(pp_cross_node(S.take(np.array([j])), g.gpus_per_node)[0])
        lins.append(stage_linear(model, training, pc, j, pp, cross_default, bound))
    caps_bytes = [bound.capacity(g.device.memory_bytes * usable_fraction) for g in groups]
    stage_caps = [(g.gpus_per_node * g.count) // block for g in groups]
    m = training.global_batch_size / (S.dp[j] * S.mbs[j])
    per_layer_s = [float(lin.time_b.mean()) for lin in lins]
    hint_pools = _greedy_pools(groups, stage_caps, pp, per_layer_s)
    hint_layers = _proportional_layers(model.num_layers, [per_layer_s[p] for p in hint_pools])
    ref = sum(per_layer_s) / len(lins) * model.num_layers / pp * m + 1e-6
    remaining = max(0.05, min(settings.time_limit_s / 4, budget_left_s))
    res = solve_split(
        lins,
        caps_bytes,
        stage_caps,
        model.num_layers,
        pp,
        m,
        int(S.vpp[j]),
        remaining,
        settings.num_workers,
        hint_layers,
        hint_pools,
        scale_ref_s=ref,
        cutoff_s=cutoff_s,
        schedules=training.pipeline_schedules(pp),
    )
    if res is None:
        return None
    strategy = with_nesting(S, j, strategy_at(S, j, res.layers))
    return _Refined(strategy, tuple(groups[p].name for p in res.pools), res.status, res.objective_s, res.work_s, res.exact)


def _greedy_pools(groups: list[NodeGroup], stage_caps: list[int], pp: int, per_layer_s: list[float]) -> list[int]:
    """Greedy first answer: the fastest pools host as many stages as they can, pools in the
    order given."""
    by_speed = sorted(range(len(groups)), key=lambda p: per_layer_s[p])
    count = [0] * len(groups)
    left = pp
    for p in by_speed:
        count[p] = min(stage_caps[p], left)
        left -= count[p]
    if left > 0:
        count[by_speed[0]] += left
    return [p for p in range(len(groups)) for _ in range(count[p])]


def _proportional_layers(num_layers: int, per_layer_s: list[float]) -> list[int]:
    """Layers per stage proportional to stage speed, ≥ 1 each, summing to the layer count."""
    w = np.array([1.0 / max(t, 1e-12) for t in per_layer_s])
    raw = w / w.sum() * num_layers
    out = np.maximum(1, np.floor(raw)).astype(int)
    while out.sum() < num_layers:
        out[int(np.argmax(raw - out))] += 1
    while out.sum() > num_layers:
        k = int(np.argmax(np.where(out > 1, out - raw, -np.inf)))
        out[k] -= 1
    return [int(v) for v in out]


def _shape(strategy: Strategy, stage_groups: tuple[str, ...]) -> tuple[Any, ...]:
    """The structural knobs that make two candidates different plans (not the split)."""
    s = strategy
    return (s.dp, s.tp, s.pp, s.cp, s.ep, s.vpp, s.micro_batch_size, s.recompute, s.zero_stage, tuple(sorted(set(stage_groups))), s.nesting,
            s.recompute_num_layers, s.dp_shard, s.recompute_modules, s.recompute_method)


#: With a pinned split: how many rows the estimate may reject before the layouts left unanswered
#: are given up (``_Search._record_fixed``).
FIXED_SPLIT_REJECTIONS = 256
#: With tight candidates ranked after safe ones: how many candidates past the first k+1 answers
#: are estimated while looking for safe ones.
SAFE_LOOKAHEAD = 32
#: How many candidates past the first k+1 answers whose objective ties the last answer's are
#: estimated, so that the tie goes to the lower peak memory whatever k is.
TIE_LOOKAHEAD = 8
#: Relative difference of two objectives taken as a tie.
TIE_TOLERANCE = 1e-12


def _pick_answers(
    candidates: list[_Candidate], evaluate: Callable[[Strategy, tuple[str, ...]], Evaluated | None], k: int,
    safe_first: bool = False,
) -> tuple[list[Evaluated], bool, bool]:
    """The best candidate and top-k alternatives that differ from it (and each other) in a
    structural knob, by objective; candidates not yet estimated are estimated here (a
    candidate ``estimate`` rejects is skipped).  ``safe_first``: candidates whose memory is
    tight (p90 over usable memory) rank after every safe one.  Returns (best first, whether the
    lowest objective found survived its estimate, whether the safe answers need the exact safe
    search: an estimated candidate faster than the best safe one — or any, when none is safe —
    is tight (the safe plan was found under the p10 verdict; with k = 0 that candidate is not
    among the answers), or tight candidates leave fewer than k safe answers (the search's
    cutoffs count tight candidates among the answers to beat).  Ties in the objective go to the lower peak
    memory (more headroom), then to the strategy's knobs in a fixed order, never to the order
    the candidates were found in nor to k: up to :data:`TIE_LOOKAHEAD` candidates tied with the
    last answer are estimated before the answers are cut to k + 1."""
    ranked = sorted(candidates, key=lambda c: (c.objective, repr(c.strategy.key()), c.stage_groups))
    seen: set[tuple[Any, ...]] = set()
    out: list[Evaluated] = []
    held = True
    looked = ties = 0
    for i, c in enumerate(ranked):
        sh = _shape(c.strategy, c.stage_groups)
        if sh in seen:
            continue
        ev = c.evaluated if c.evaluated is not None else evaluate(c.strategy, c.stage_groups)
        if ev is None:
            held = held and i > 0
            continue
        seen.add(sh)
        out.append(ev)
        safe = sum(not e.prediction.tight for e in out)
        if len(out) > k:
            looked += 1
            # a candidate tied with the last answer is estimated too (its memory breaks the tie)
            tied = i + 1 < len(ranked) and ranked[i + 1].objective <= c.objective * (1 + TIE_TOLERANCE) and ties < TIE_LOOKAHEAD
            ties += tied
            if (not safe_first or safe > k or looked > SAFE_LOOKAHEAD) and not tied:
                break
    out.sort(key=lambda e: (safe_first and e.prediction.tight, e.objective, max(e.prediction.peak_memory_GB, default=0.0),
                           repr(e.strategy.key()), e.stage_groups))
    safe_ones = [e for e in out if not e.prediction.tight]
    tight_ones = [e for e in out if e.prediction.tight]
    needs_safe_search = bool(tight_ones) and (
        not safe_ones or tight_ones[0].objective < safe_ones[0].objective * (1 - 1e-9) or len(safe_ones) < k)
    if safe_first and safe_ones and tight_ones and k >= 1:
        # The fastest tight candidate stays as the last alternative (flagged), after the safe ones.
        return [*safe_ones[:k], tight_ones[0]], held, needs_safe_search
    return out[: k + 1], held, needs_safe_search


def recompute_modules_hint(model: TransformerSpec, training: Training, pins: Mapping[str, Any]) -> str:
    """What a no-fit answer adds when the pinned recompute modules leave more of this model's
    activations to free (MoE or MLA layers under Megatron-Core): the modules that would, and
    full recompute, which the search tries unless recompute is pinned."""
    pinned = pins.get("recompute_modules")
    if pinned is None or not rules_for(training.framework).recompute_modules:
        return ""
    # what frees more than the pinned set: the modules the model has beyond it, but not a part
    # of the whole MoE layer when that is pinned, nor the dense MLP (a normal checkpoint of its own)
    covered = {"moe_act", "shared_experts"} if "moe" in pinned else set()
    have = rules_for(training.framework).recompute_modules
    more = [m for m in model_recompute_modules(model) if m in have and m not in pinned and m not in covered and m not in ("core_attn", "mlp")]
    if not more:
        return ""
    shown = list(pinned) or ["core_attn"]  # the default alone is kept as an empty set (canonical_recompute_modules)
    return f"; constraints.recompute_modules {json.dumps(shown)} leaves {', '.join(sorted(more))} unrecomputed, which would free more"


def offload_hint(training: Training) -> str:
    """What a no-fit answer adds where the framework can keep state in host memory and the
    request does not yet (``FrameworkRules.optimizer_offload``, ``cpu_offload``,
    ``activation_offloading``): the setting that
    would, priced as docs/frameworks.md says."""
    r = rules_for(training.framework)
    ways = []
    if r.optimizer_offload and training.optimizer_offload_fraction < 1.0 and not training.cpu_offload:
        need = " (with precision_aware_optimizer: true)" if "precision_aware_optimizer" in r.optimizer_precision else ""
        ways.append(f"training.optimizer_offload_fraction{need} keeps the optimizer state in host memory: {r.optimizer_offload}")
    if r.cpu_offload and not training.cpu_offload:
        ways.append(f"training.cpu_offload keeps the whole sharded state in host memory at zero_stage 3: {r.cpu_offload}")
    if r.activation_offloading and not training.activation_offloading:
        what = "the saved tensors of the training.offload_modules named" if r.offload_modules else "every layer's saved activations"
        where = "" if r.activation_offloading_with_pipeline else " without a pipeline"
        ways.append(f"training.activation_offloading keeps {what} in host memory{where}: {r.activation_offloading}")
    return f"; offloading would free GPU memory at the price of step time: {'; or '.join(ways)}" if ways else ""


def _raise_pin_at_fault(request: PlanRequest) -> None:
    """When the pinned fields together leave the search no layout at all (each passed its own
    checks, :func:`~planner_service.planner.transformer.space.check_pins`; the caller knows from
    the rows the space gave, not from the candidates — those the memory rule rejected, e.g. in
    the memory-safe search that follows a tight answer, fail as infeasible, not as a bad pin),
    name the first pinned field whose release gives layouts back — the space re-enumerated
    without it, as :func:`transformer_search_size` counts it — with the pins it conflicts with.
    Returns when no single release helps (the caller's message stands)."""
    pins = dict(request.constraints.pinned)
    for key in pins:
        relaxed = replace(request, constraints=replace(request.constraints, pinned={k: v for k, v in pins.items() if k != key}))
        try:
            found = transformer_search_size(relaxed) > 0
        except PlannerError:
            continue
        if found:
            others = ", ".join(f"{k}={v!r}" for k, v in pins.items() if k != key) or "the model, batch and cluster"
            raise InvalidStrategy(
                f"{key}={pins[key]!r}: no layout of the request holds it together with {others} (without it there are layouts "
                "that divide the model, batch and cluster)", field=f"constraints.{key}")


def _raise_infeasible(cluster: Cluster, headroom: float, shortfalls: list[tuple[float, float, str]], bound_name: str = "",
                      peaks: list[tuple[float, str]] | None = None, hint: str = "") -> NoReturn:
    if not shortfalls and peaks:
        need_bytes, device = min(peaks)
        dev = next(g.device for g in cluster.node_groups if g.device.name == device)
        need_GB = bytes_to_gb(need_bytes)
        raise NoFeasiblePlan(
            f"no strategy fits: the layouts the constraints allow need at least {need_GB:.1f} GB per GPU at their peak stage "
            f"(weights, gradients, optimizer state, in-flight activations and the allocator's reserve); {device} has "
            f"{dev.memory_GB:.0f} GB ({dev.memory_GB * (1 - headroom):.1f} GB usable with {headroom:.0%} headroom){hint}",
            field="cluster",
        )
    if shortfalls:
        # the layout whose tested end of the interval (``bound_name``; the predicted peak where
        # it is none) is the least: the search rejects a stage whose tested end exceeds usable memory
        bound_bytes, need_bytes, device = min(shortfalls)
        dev = next(g.device for g in cluster.node_groups if g.device.name == device)
        usable = dev.memory_GB * (1 - headroom)
        need_GB, bound_GB = bytes_to_gb(need_bytes), bytes_to_gb(bound_bytes)
        digits = 1 if abs(bound_GB - usable) >= 0.1 else 2
        tested = f"{bound_name} {bound_GB:.{digits}f} GB; " if bound_name else ""
        raise NoFeasiblePlan(
            f"no strategy fits: needs at least {need_GB:.{digits}f} GB per GPU ({tested}weights, gradients, "
            f"optimizer state and activations of the least-memory layout and layer split the constraints allow); {device} "
            f"has {dev.memory_GB:.0f} GB ({usable:.{digits}f} GB usable with {headroom:.0%} headroom){hint}",
            field="cluster",
        )
    raise NoFeasiblePlan(
        "no valid strategy: no combination of tp/pp/dp/cp/micro-batch divides the model, batch and cluster "
        "under the constraints (check pinned fields, max_devices and global_batch_size)",
        field="constraints",
    )
