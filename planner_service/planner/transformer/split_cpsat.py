"""CP-SAT: the contiguous split of layers into pipeline stages and the assignment of stages to
node groups (pools), with the OR-tools entry ``planner.cpsat``.

Data → variables → constraints → objective → solve → extract, as in the OR-tools samples.

Given, for each pool p and stage index i, affine coefficients of the cost model
(``planner_service.planner.transformer.tables.StageLinear``: stage time, backward time, DP sync time,
optimizer time and peak memory as a + b·n for n layers), choose ``x[i,p]`` (stage i runs on
pool p) and ``n[i,p]`` (its layers) to minimise the cost model's step time

    v·m·T + k·(Σ_i t_i − T) + v·k·E + v·O        (all divided by v; k the pipeline schedules a step, 1 by default)

where T ≥ t_i (bottleneck stage), E ≥ the exposed DP sync of every stage, O ≥ every stage's
optimizer step — exactly ``cost_model.transformer.stage_cost.combine_stages`` — subject to Σ n = L, each
stage ≥ 1 layer and within its pool's memory, each pool hosting at most as many stages as it
has blocks of dp·cp·tp GPUs, and the stages of one pool forming one contiguous block (pools in
any order).  Seconds and bytes are scaled to integers by ``planner.cpsat.IntScale``.

With a single pool (no assignment to choose) the split is found exactly by threshold
enumeration (``split_exact.single_pool_split``, no MIP start-up per candidate); with several
pools every contiguous stage → pool assignment is enumerated and split exactly
(``split_exact.multi_pool_split``).  CP-SAT takes over when an enumeration would exceed its
budget, and ``method="cp-sat"`` forces it; its pool assignment is then split again exactly
for that assignment, so the layers returned never depend on which of several equally good
integer solutions the solver stopped at.

Reproducible: CP-SAT runs with a fixed seed, the interleaved (deterministic) search and a
*deterministic* time limit; the enumerations are deterministic by construction.  Each result
reports the work it took (``work_s``, deterministic seconds) so that the search can spend a
budget of work, not of wall-clock time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cost_model.transformer.calibration import overlap_compute_slowdown
from planner_service.planner.cpsat import CpModel, IntScale, IntVar, SolverParams, solve
from planner_service.planner.transformer.split_exact import (
    MEMORY_UNIT_BYTES,
    SplitBudgetExceeded,
    compose_stages,
    multi_pool_split,
    single_pool_split,
    split_objective_s,
)
from planner_service.planner.transformer.tables import StageLinear

TIME_UNITS = 1e9  # the step time of the hint maps to ~1e9 integer units
#: Deterministic work charged per threshold pair and per stage assignment of the exact
#: enumerations (about their cost in seconds on one current core, measured by
#: bench/reproducibility.py); a budget of work, unlike the clock, gives the same plan on any host.
#: The overlap slowdown (``overlap_compute_slowdown``) enters the integer model as a multiple of 1/1000.
SLOWDOWN_DENOMINATOR = 1000
EXACT_PAIR_WORK_S = 2e-4
EXACT_ASSIGNMENT_WORK_S = 1e-3
#: A CP-SAT solve bounded by deterministic time also gets this many times as much wall-clock
#: time, a guard for a host far slower than the reference (a solve it stops is not reproducible).
WALL_GUARD_FACTOR = 20.0


@dataclass(frozen=True)
class SplitResult:
    layers: tuple[int, ...]
    pools: tuple[int, ...]  # pool index per stage
    status: str
    objective_s: float
    work_s: float = 0.0  # deterministic work spent (s): CP-SAT's deterministic time, or the enumerations'
    #: ``objective_s`` is the cost model's step time in floating point (an exact split), not
    #: CP-SAT's integer-scaled objective.
    exact: bool = False


def solve_split(
    lins: Sequence[StageLinear],
    capacities_bytes: Sequence[float],
    stage_caps: Sequence[int],
    num_layers: int,
    pp: int,
    m: float,
    vpp: int,
    time_limit_s: float,
    num_workers: int,
    hint_layers: Sequence[int] | None = None,
    hint_pools: Sequence[int] | None = None,
    scale_ref_s: float = 1.0,
    method: str = "auto",
    cutoff_s: float = float("inf"),
    schedules: int = 1,
) -> SplitResult | None:
    """Optimal stage split (and pool per stage).  ``lins[p]`` are pool p's coefficients for a
    pp-stage pipeline.  Returns None when no split fits.  ``method``: ``"auto"`` (exact
    enumeration for one pool, CP-SAT otherwise) or ``"cp-sat"``.  ``objective_s`` is the step
    time in seconds (``combine_stages``' formula).  ``cutoff_s``: the exact one-pool enumeration
    also returns None when no split is faster than it (the candidate cannot enter the answers)."""
    if len(lins) == 1 and method == "auto":
        try:
            exact = single_pool_split(lins[0], capacities_bytes[0], num_layers, pp, m, vpp, cutoff_s=cutoff_s, schedules=schedules)
        except SplitBudgetExceeded:
            pass  # CP-SAT below
        else:
            return None if exact is None else SplitResult(exact.layers, (0,) * pp, "OPTIMAL", exact.objective_s,
                                                          exact.pairs * EXACT_PAIR_WORK_S, exact=True)
    elif method == "auto":
        try:
            multi = multi_pool_split(lins, capacities_bytes, stage_caps, num_layers, pp, m, vpp, schedules=schedules)
        except SplitBudgetExceeded:
            pass  # CP-SAT below
        else:
            if multi is None:
                return None
            work_s = multi.pairs * EXACT_PAIR_WORK_S + multi.assignments * EXACT_ASSIGNMENT_WORK_S
            return SplitResult(multi.layers, multi.pools, "OPTIMAL", multi.objective_s, work_s, exact=True)
    split = _SplitModel(lins, num_layers, pp, m, vpp, scale_ref_s, schedules)
    split.add_assignment(stage_caps)
    if not split.add_memory(capacities_bytes):
        return None
    split.add_objective()
    if hint_layers is not None:
        split.add_hint(hint_layers, hint_pools)
    res = split.solve(time_limit_s, num_workers)
    return None if res is None else _resplit(res, lins, capacities_bytes, num_layers, pp, m, vpp, schedules)


def _resplit(
    res: SplitResult, lins: Sequence[StageLinear], capacities_bytes: Sequence[float], num_layers: int, pp: int, m: float, vpp: int,
    schedules: int = 1,
) -> SplitResult:
    """CP-SAT's pool assignment with the exact best split for it (deterministic among equal
    splits, objective in seconds without the integer scaling); CP-SAT's own answer when the
    enumeration is over budget or finds nothing better."""
    try:
        exact = single_pool_split(compose_stages(lins, res.pools), np.array([capacities_bytes[p] for p in res.pools]), num_layers, pp, m, vpp,
                                  schedules=schedules)
    except SplitBudgetExceeded:
        return res
    if exact is None or exact.objective_s > res.objective_s * (1 + 1e-6):
        return res
    return SplitResult(exact.layers, res.pools, res.status, exact.objective_s, res.work_s + exact.pairs * EXACT_PAIR_WORK_S, exact=True)


class _SplitModel:
    """The CP-SAT model of one split problem, built in the samples' order: data and variables
    (``__init__``), constraints (:meth:`add_assignment`, :meth:`add_memory`), objective
    (:meth:`add_objective`), hint, then :meth:`solve` and extract."""

    def __init__(self, lins: Sequence[StageLinear], num_layers: int, pp: int, m: float, vpp: int, scale_ref_s: float,
                 schedules: int = 1) -> None:
        self.lins = lins
        self.P = P = len(lins)
        self.L = L = num_layers
        self.pp = pp
        self.m = m
        self.vpp = vpp
        self.v = max(int(vpp), 1)
        self.k = max(int(schedules), 1)  # pipeline schedules a step: the bubble k times
        self.scale = IntScale.for_reference(scale_ref_s, TIME_UNITS, memory_unit_bytes=MEMORY_UNIT_BYTES)
        self.horizon = self.scale.time_int(1e3 * max(scale_ref_s, 1.0))
        self.model = model = CpModel()
        # Variables: x[i][p] stage i runs on pool p (only with several pools), n[i][p] its layers.
        self.x: list[list[IntVar]] = [[model.new_bool_var(f"x{i}_{p}") for p in range(P)] for i in range(pp)] if P > 1 else []
        self.n: list[list[IntVar]] = [[model.new_int_var(0, L, f"n{i}_{p}") for p in range(P)] for i in range(pp)]

    def _on(self, i: int, p: int) -> IntVar | int:
        return self.x[i][p] if self.P > 1 else 1

    def add_assignment(self, stage_caps: Sequence[int]) -> None:
        """One pool per stage, layers only on the chosen pool, ≥ 1 layer per stage, all layers
        placed, at most ``stage_caps[p]`` stages on pool p, each pool's stages contiguous."""
        model, x, n, P, L, pp = self.model, self.x, self.n, self.P, self.L, self.pp
        for i in range(pp):
            if P > 1:
                model.add_exactly_one(x[i])
                for p in range(P):
                    model.add(n[i][p] <= L * x[i][p])
            model.add(sum(n[i]) >= 1)
        model.add(sum(n[i][p] for i in range(pp) for p in range(P)) == L)
        if P == 1:
            return
        for p in range(P):
            model.add(sum(x[i][p] for i in range(pp)) <= stage_caps[p])
        # The stages of one pool form one contiguous block (pools in any order): pool p's
        # stages are exactly the indices start_p..end_p when it is used.
        for p in range(P):
            k = sum(x[i][p] for i in range(pp))
            used = model.new_bool_var(f"used{p}")
            start = model.new_int_var(0, pp - 1, f"start{p}")
            end = model.new_int_var(0, pp - 1, f"end{p}")
            model.add(k >= 1).only_enforce_if(used)
            model.add(k == 0).only_enforce_if(~used)
            model.add(end - start + 1 == k).only_enforce_if(used)
            for i in range(pp):
                model.add(start <= i).only_enforce_if(x[i][p])
                model.add(end >= i).only_enforce_if(x[i][p])

    def add_memory(self, capacities_bytes: Sequence[float]) -> bool:
        """Memory per stage: a + b·n ≤ capacity on the chosen pool.  False when a single pool
        cannot hold some stage at all (no split fits)."""
        model, x, n, P = self.model, self.x, self.n, self.P
        for i in range(self.pp):
            for p in range(P):
                a_bytes = float(self.lins[p].mem_a[i])
                room = self.scale.memory_down(capacities_bytes[p] - a_bytes) if capacities_bytes[p] >= a_bytes else -1
                bi = int(self.scale.memory_up(self.lins[p].mem_b[i]))  # up: never accept a split the cost model would reject
                if room < 0:
                    if P == 1:
                        return False
                    model.add(x[i][p] == 0)
                elif P > 1:
                    model.add(bi * n[i][p] <= room * x[i][p] if bi > 0 else n[i][p] >= 0)
                elif bi > 0:
                    model.add(bi * n[i][p] <= room)
        return True

    def _cross_vars(self) -> list[IntVar | None]:
        """Pool changes between neighbouring stages (their point-to-point traffic crosses the network)."""
        cross: list[IntVar | None] = []
        for i in range(self.pp):
            if self.P > 1 and i + 1 < self.pp:
                y = self.model.new_bool_var(f"y{i}")
                for p in range(self.P):
                    self.model.add(y >= self.x[i][p] - self.x[i + 1][p])
                cross.append(y)
            else:
                cross.append(None)
        return cross

    def add_objective(self) -> None:
        """(v·m·T + k·(Σ t_i − T) + v·k·E + v·O), integer-scaled: T, E, O the maxima of the stage
        times, exposed DP syncs and optimizer steps, k the pipeline schedules a step (``combine_stages``)."""
        model, n, scale, horizon, v = self.model, self.n, self.scale, self.horizon, self.v
        slowdown = round(overlap_compute_slowdown() * SLOWDOWN_DENOMINATOR)
        cross = self._cross_vars()
        t_vars, e_vars, o_vars = [], [], []
        for i in range(self.pp):
            t_expr: list[Any] = []
            bwd_expr: list[Any] = []
            dp_expr: list[Any] = []
            win_expr: list[Any] = []
            opt_expr: list[Any] = []
            for p in range(self.P):
                lin = self.lins[p]
                on = self._on(i, p)
                t_expr += [scale.time_int(lin.time_a[i]) * on, scale.time_int(lin.time_b[i]) * n[i][p]]
                bwd_expr += [scale.time_int(lin.bwd_a[i]) * on, scale.time_int(lin.bwd_b[i]) * n[i][p]]
                dp_expr += [scale.time_int(lin.dp_a[i]) * on, scale.time_int(lin.dp_b[i]) * n[i][p]]
                win_expr += [scale.time_int(lin.win_a[i]) * on, scale.time_int(lin.win_b[i]) * n[i][p]]
                opt_expr += [scale.time_int(lin.opt_a[i]) * on, scale.time_int(lin.opt_b[i]) * n[i][p]]
                cross_i = cross[i]
                if cross_i is not None and lin.p2p_cross_extra_s[i] > 0:
                    w = model.new_bool_var(f"w{i}_{p}")
                    model.add(w >= self.x[i][p] + cross_i - 1)
                    t_expr.append(scale.time_int(lin.p2p_cross_extra_s[i]) * w)
            t = model.new_int_var(0, horizon, f"t{i}")
            model.add(t == sum(t_expr))
            t_vars.append(t)
            # Exposed DP sync: dp − window − (i/v)·bwd (the drain), floored at 0, plus the
            # slowdown s of the part hidden behind the backward, s·min(dp, window)
            # (cost_model.schedule.exposed_dp_sync_s); multiplied through by v and by the
            # slowdown's denominator to stay integral.
            e = model.new_int_var(0, horizon, f"e{i}")
            dp_var = model.new_int_var(0, horizon, f"dp{i}")
            win_var = model.new_int_var(0, horizon, f"win{i}")
            model.add(dp_var == sum(dp_expr))
            model.add(win_var == sum(win_expr))
            hidden = model.new_int_var(0, horizon, f"hid{i}")
            model.add_min_equality(hidden, [dp_var, win_var])
            model.add(SLOWDOWN_DENOMINATOR * v * e >= SLOWDOWN_DENOMINATOR * (v * (dp_var - win_var) - i * sum(bwd_expr)) + slowdown * v * hidden)
            model.add(SLOWDOWN_DENOMINATOR * e >= slowdown * hidden)
            e_vars.append(e)
            o = model.new_int_var(0, horizon, f"o{i}")
            model.add(o == sum(opt_expr))
            o_vars.append(o)
        t_max = model.new_int_var(0, horizon, "T")
        model.add_max_equality(t_max, t_vars)
        e_max = model.new_int_var(0, horizon, "E")
        model.add_max_equality(e_max, e_vars)
        o_max = model.new_int_var(0, horizon, "O")
        model.add_max_equality(o_max, o_vars)
        m_int = int(round(self.m))
        model.minimize(v * m_int * t_max + self.k * (sum(t_vars) - t_max) + v * self.k * e_max + v * o_max)

    def add_hint(self, hint_layers: Sequence[int], hint_pools: Sequence[int] | None) -> None:
        """The greedy first answer as a hint."""
        for i in range(self.pp):
            for p in range(self.P):
                chosen = (hint_pools[i] if hint_pools is not None else 0) == p
                self.model.add_hint(self.n[i][p], hint_layers[i] if chosen else 0)
                if self.P > 1:
                    self.model.add_hint(self.x[i][p], 1 if chosen else 0)

    def solve(self, time_limit_s: float, num_workers: int) -> SplitResult | None:
        """Solve and extract the layers and pool of each stage; None when nothing fits."""
        # A single pool is a small pure-integer model: one search thread avoids the portfolio start-up.
        # Deterministic: a fixed seed, the interleaved search and a limit on work, not on the clock.
        params = SolverParams(time_limit_s=time_limit_s * WALL_GUARD_FACTOR, num_workers=1 if self.P == 1 else num_workers,
                              deterministic=True, deterministic_time_s=time_limit_s)
        solution = solve(self.model, params)
        if not solution.found:
            return None
        layers, pools = [], []
        for i in range(self.pp):
            for p in range(self.P):
                if self.P == 1 or solution.value(self.x[i][p]):
                    layers.append(solution.value(self.n[i][p]))
                    pools.append(p)
                    break
        if self.P == 1:  # the exact step time of the split, not the integer-scaled objective
            objective_s = split_objective_s(self.lins[0], layers, self.m, self.vpp, self.k)
        else:
            objective_s = solution.objective_value / self.v * self.scale.time_unit_s
        return SplitResult(tuple(layers), tuple(pools), solution.status, objective_s, solution.deterministic_time_s)
