"""CP-SAT: the contiguous split of layers into pipeline stages and the assignment of stages to
node groups (pools), with the OR-tools entry ``planner.cpsat``.

Data → variables → constraints → objective → solve → extract, as in the OR-tools samples.

Given, for each pool p and stage index i, affine coefficients of the cost model
(``planner_service.planner.transformer.tables.StageLinear``: stage time, backward time, DP sync time,
optimizer time and peak memory as a + b·n for n layers), choose ``x[i,p]`` (stage i runs on
pool p) and ``n[i,p]`` (its layers) to minimise the cost model's step time

    v·m·T + Σ_i t_i − T + v·E + v·O        (all divided by v)

where T ≥ t_i (bottleneck stage), E ≥ the exposed DP sync of every stage, O ≥ every stage's
optimizer step — exactly ``cost_model.transformer.stage_cost.combine_stages`` — subject to Σ n = L, each
stage ≥ 1 layer and within its pool's memory, each pool hosting at most as many stages as it
has blocks of dp·cp·tp GPUs, and the stages of one pool forming one contiguous block (pools in
any order).  Seconds and bytes are scaled to integers by ``planner.cpsat.IntScale``.

With a single pool (no assignment to choose) the split is found exactly by threshold
enumeration (``split.single_pool_split``, no MIP start-up per candidate); CP-SAT takes over
when that enumeration would exceed its budget, and ``method="cp-sat"`` forces it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner_service.planner.cpsat import CpModel, IntScale, SolverParams, solve
from planner_service.planner.transformer.split_exact import (
    MEMORY_UNIT_BYTES,
    SplitBudgetExceeded,
    single_pool_split,
    split_objective_s,
)
from planner_service.planner.transformer.tables import StageLinear

TIME_UNITS = 1e9  # the step time of the hint maps to ~1e9 integer units


@dataclass(frozen=True)
class SplitResult:
    layers: tuple[int, ...]
    pools: tuple[int, ...]  # pool index per stage
    status: str
    objective_s: float


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
) -> SplitResult | None:
    """Optimal stage split (and pool per stage).  ``lins[p]`` are pool p's coefficients for a
    pp-stage pipeline.  Returns None when no split fits.  ``method``: ``"auto"`` (exact
    enumeration for one pool, CP-SAT otherwise) or ``"cp-sat"``."""
    P = len(lins)
    L = num_layers
    if P == 1 and method == "auto":
        try:
            exact = single_pool_split(lins[0], capacities_bytes[0], L, pp, m, vpp)
        except SplitBudgetExceeded:
            pass  # CP-SAT below
        else:
            return None if exact is None else SplitResult(exact.layers, (0,) * pp, "OPTIMAL", exact.objective_s)
    scale = IntScale.for_reference(scale_ref_s, TIME_UNITS, memory_unit_bytes=MEMORY_UNIT_BYTES)
    model = CpModel()

    # Variables.
    x = [[model.NewBoolVar(f"x{i}_{p}") if P > 1 else None for p in range(P)] for i in range(pp)]
    n = [[model.NewIntVar(0, L, f"n{i}_{p}") for p in range(P)] for i in range(pp)]

    def on(i, p):
        return x[i][p] if P > 1 else 1

    # Constraints: one pool per stage, layers only on the chosen pool, ≥ 1 layer, all layers placed.
    for i in range(pp):
        if P > 1:
            model.AddExactlyOne(x[i])
            for p in range(P):
                model.Add(n[i][p] <= L * x[i][p])
        model.Add(sum(n[i]) >= 1)
    model.Add(sum(n[i][p] for i in range(pp) for p in range(P)) == L)
    if P > 1:
        for p in range(P):
            model.Add(sum(x[i][p] for i in range(pp)) <= stage_caps[p])
        # The stages of one pool form one contiguous block (pools in any order): pool p's
        # stages are exactly the indices start_p..end_p when it is used.
        for p in range(P):
            k = sum(x[i][p] for i in range(pp))
            used = model.NewBoolVar(f"used{p}")
            start = model.NewIntVar(0, pp - 1, f"start{p}")
            end = model.NewIntVar(0, pp - 1, f"end{p}")
            model.Add(k >= 1).OnlyEnforceIf(used)
            model.Add(k == 0).OnlyEnforceIf(used.Not())
            model.Add(end - start + 1 == k).OnlyEnforceIf(used)
            for i in range(pp):
                model.Add(start <= i).OnlyEnforceIf(x[i][p])
                model.Add(end >= i).OnlyEnforceIf(x[i][p])

    # Memory per stage: a + b·n ≤ capacity on the chosen pool.
    for i in range(pp):
        for p in range(P):
            a_bytes = float(lins[p].mem_a[i])
            room = scale.memory_down(capacities_bytes[p] - a_bytes) if capacities_bytes[p] >= a_bytes else -1
            bi = int(scale.memory_up(lins[p].mem_b[i]))  # up: never accept a split the cost model would reject
            if room < 0:
                if P > 1:
                    model.Add(x[i][p] == 0)
                else:
                    return None
            elif P > 1:
                model.Add(bi * n[i][p] <= room * x[i][p] if bi > 0 else n[i][p] >= 0)
            else:
                if bi > 0:
                    model.Add(bi * n[i][p] <= room)

    # Pool changes between neighbouring stages (their point-to-point traffic crosses the network).
    cross = []
    for i in range(pp):
        if P > 1 and i + 1 < pp:
            y = model.NewBoolVar(f"y{i}")
            for p in range(P):
                model.Add(y >= x[i][p] - x[i + 1][p])
            cross.append(y)
        else:
            cross.append(None)

    horizon = scale.time_int(1e3 * max(scale_ref_s, 1.0))
    t_vars, e_vars, o_vars = [], [], []
    v = max(int(vpp), 1)
    for i in range(pp):
        t_expr, bwd_expr, dp_expr, win_expr, opt_expr = [], [], [], [], []
        for p in range(P):
            lin = lins[p]
            t_expr += [scale.time_int(lin.time_a[i]) * on(i, p), scale.time_int(lin.time_b[i]) * n[i][p]]
            bwd_expr += [scale.time_int(lin.bwd_a[i]) * on(i, p), scale.time_int(lin.bwd_b[i]) * n[i][p]]
            dp_expr += [scale.time_int(lin.dp_a[i]) * on(i, p), scale.time_int(lin.dp_b[i]) * n[i][p]]
            win_expr += [scale.time_int(lin.win_a[i]) * on(i, p), scale.time_int(lin.win_b[i]) * n[i][p]]
            opt_expr += [scale.time_int(lin.opt_a[i]) * on(i, p), scale.time_int(lin.opt_b[i]) * n[i][p]]
            if cross[i] is not None and lin.p2p_cross_extra_s[i] > 0:
                w = model.NewBoolVar(f"w{i}_{p}")
                model.Add(w >= x[i][p] + cross[i] - 1)
                t_expr.append(scale.time_int(lin.p2p_cross_extra_s[i]) * w)
        t = model.NewIntVar(0, horizon, f"t{i}")
        model.Add(t == sum(t_expr))
        t_vars.append(t)
        # Exposed DP sync: dp − window − (i/v)·bwd (the drain), floored at 0 (combine_stages);
        # multiplied through by v to stay integral.
        e = model.NewIntVar(0, horizon, f"e{i}")
        model.Add(v * e >= v * (sum(dp_expr) - sum(win_expr)) - i * sum(bwd_expr))
        e_vars.append(e)
        o = model.NewIntVar(0, horizon, f"o{i}")
        model.Add(o == sum(opt_expr))
        o_vars.append(o)
    T = model.NewIntVar(0, horizon, "T")
    model.AddMaxEquality(T, t_vars)
    E = model.NewIntVar(0, horizon, "E")
    model.AddMaxEquality(E, e_vars)
    O = model.NewIntVar(0, horizon, "O")
    model.AddMaxEquality(O, o_vars)
    m_int = int(round(m))
    model.Minimize(v * m_int * T + sum(t_vars) - T + v * E + v * O)

    # Greedy first answer as a hint.
    if hint_layers is not None:
        for i in range(pp):
            for p in range(P):
                chosen = (hint_pools[i] if hint_pools is not None else 0) == p
                model.AddHint(n[i][p], hint_layers[i] if chosen else 0)
                if P > 1:
                    model.AddHint(x[i][p], 1 if chosen else 0)

    # A single pool is a small pure-integer model: one search thread avoids the portfolio start-up.
    solution = solve(model, SolverParams(time_limit_s=time_limit_s, num_workers=1 if P == 1 else num_workers))
    if not solution.found:
        return None
    layers, pools = [], []
    for i in range(pp):
        for p in range(P):
            if P == 1 or solution.value(x[i][p]):
                layers.append(solution.value(n[i][p]))
                pools.append(p)
                break
    if P == 1:  # the exact step time of the split, not the integer-scaled objective
        objective_s = split_objective_s(lins[0], layers, m, vpp)
    else:
        objective_s = solution.objective_value / v * scale.time_unit_s
    return SplitResult(tuple(layers), tuple(pools), solution.status, objective_s)

