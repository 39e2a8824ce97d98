"""Exact stage split for a pipeline on one device pool, without a MIP solver.

With one pool every stage's quantities are affine in its layer count n_i (``StageLinear``), and
the cost model's step time (``cost_model.transformer.stage_cost.combine_stages``) is

    F(n) = (m − 1/w)·T + k·E + O + Σ_i t_i(n_i)/w,
    T = max_i t_i(n_i),  E = max(0, max_i e_i(n_i)),  O = max_i o_i(n_i),

for a step of k pipeline schedules (``training.pipeline_schedules_per_step``; k = 1, w = v for one),
each ending in its own data-parallel sync, w = v/k,

with t_i the stage time per micro-batch, e_i(n) = max(0, dp_i(n) − (window + i/v)·bwd_i(n)) +
s·min(dp_i(n), window·bwd_i(n)) the DP gradient sync a stage leaves exposed (with the slowdown
of the part hidden behind its backward, ``cost_model.schedule``) and o_i its optimizer step.
t_i and o_i are affine, and e_i is quasi-convex: where its first term is positive,
dp > window·bwd so its second is s·window·bwd and e_i is affine; elsewhere it is
s·min(dp, window·bwd), non-decreasing (dp and bwd grow with n).  So "value ≤ X" keeps an
interval of layer counts per stage.

Threshold enumeration: at an optimal split n*, (T, O, E) take values from the finite tables
t_i(n), o_i(n), e_i(n).  For thresholds (X_T, X_O, X_E) the stages' allowed layer counts are
intervals [lo_i, hi_i] (memory included); the cheapest Σ_i c_i·n_i with Σ n_i = L over them is a
greedy fill (lowest c_i first; stages whose c_i agree to 1e-9 share their layers as evenly as
the intervals allow, so among equally fast splits the most level one is returned).  The split
found for the thresholds of n* costs at most F(n*), so the minimum over all threshold triples
is optimal (to that 1e-9).  Thresholds are visited in
ascending order with lower bounds ((m − 1/v)·X_T + X_O + X_E + the cheapest linear part), so
only a few triples are examined; the E dimension is vectorised.

Memory uses the same integer rule as the CP-SAT model (``solver.solve_split``: kilobytes, room
floored, per-layer bytes rounded up), so both solvers see the same feasible splits; a test
checks they reach the same objective on random instances.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields

import numpy as np

from cost_model.schedule import exposed_dp_sync_each_s
from cost_model.transformer.calibration import overlap_compute_slowdown
from planner_service.planner.transformer.tables import StageLinear

MEMORY_UNIT_BYTES = 1e3
#: (X_T, X_O) threshold pairs examined before giving up (the caller then uses CP-SAT).
DEFAULT_MAX_PAIRS = 4000
#: Stage → pool assignments the multi-pool enumeration examines before giving up (CP-SAT then).
DEFAULT_MAX_ASSIGNMENTS = 512


class SplitBudgetExceeded(Exception):
    """The enumeration would examine more than its budget of threshold pairs."""


@dataclass(frozen=True)
class ExactSplit:
    layers: tuple[int, ...]
    objective_s: float  # F(layers): the cost model's step time for this split
    #: Threshold pairs examined (the search's deterministic measure of the work done).
    pairs: int = 0


@dataclass(frozen=True)
class MultiPoolSplit:
    """The optimal split over several pools: the layers and the pool of each stage."""

    layers: tuple[int, ...]
    pools: tuple[int, ...]
    objective_s: float
    pairs: int  # threshold pairs examined over every assignment
    assignments: int  # stage → pool assignments examined


def max_layers_in_memory(
    mem_a_bytes: np.ndarray, mem_b_bytes: np.ndarray, capacity_bytes: float | np.ndarray, num_layers: int
) -> np.ndarray:
    """Most layers each stage can hold, by the CP-SAT model's integer rule; −1 when even the
    stage's fixed memory does not fit.  ``capacity_bytes``: one device's, or one per stage."""
    caps_units = np.broadcast_to(np.asarray(capacity_bytes, dtype=float), np.shape(mem_a_bytes)) / MEMORY_UNIT_BYTES
    out = np.empty(len(mem_a_bytes), dtype=np.int64)
    for i, (a_bytes, b_bytes) in enumerate(zip(mem_a_bytes, mem_b_bytes, strict=True)):
        cap_units = float(caps_units[i])
        a = a_bytes / MEMORY_UNIT_BYTES
        b = b_bytes / MEMORY_UNIT_BYTES
        if cap_units < a:
            out[i] = -1
            continue
        room = int(cap_units - a)
        bi = int(-(-b // 1))
        out[i] = num_layers if bi <= 0 else min(num_layers, room // bi)
    return out


def split_objective_s(lin: StageLinear, layers: Sequence[int] | np.ndarray, m: float, vpp: int, schedules: int = 1) -> float:
    """F(layers) for one pool: the step time ``combine_stages`` gives for this split."""
    n = np.asarray(layers, dtype=float)
    v = max(int(vpp), 1)
    k = max(int(schedules), 1)
    w = v / k  # the bubble's divisor
    t = lin.time_a + lin.time_b * n
    drain = np.arange(len(n)) / v
    e = exposed_dp_sync_each_s(lin.dp_a + lin.dp_b * n, lin.win_a + lin.win_b * n, drain * (lin.bwd_a + lin.bwd_b * n), overlap_compute_slowdown())
    o = lin.opt_a + lin.opt_b * n
    return float((m - 1.0 / w) * t.max() + k * e.max() + o.max() + t.sum() / w)


def _interval(mask: np.ndarray, num_layers: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lo, hi, non-empty) of the allowed layer counts along the last axis."""
    any_ = np.asarray(mask.any(axis=-1))
    lo = np.argmax(mask, axis=-1)
    hi = num_layers - np.argmax(mask[..., ::-1], axis=-1)
    return lo, hi, any_


def _cost_groups(c: np.ndarray) -> list[np.ndarray]:
    """Stage indices grouped by per-layer cost, cheapest group first; costs within 1e-9
    (relative) are one group (they differ only by rounding: every middle stage runs the same
    layers)."""
    order = np.argsort(c, kind="stable")
    groups: list[list[int]] = []
    for i in order:
        if groups and abs(c[i] - c[groups[-1][0]]) <= 1e-9 * max(abs(c[i]), 1e-30):
            groups[-1].append(int(i))
        else:
            groups.append([int(i)])
    return [np.array(sorted(g)) for g in groups]


def _water_fill(lo: np.ndarray, hi: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Layers n in [lo, hi] summing to ``target`` (≤ Σhi), as level as they can be: n_i =
    clip(λ, lo_i, hi_i) for the highest integer level λ that does not overshoot, then one more
    layer each to the first stages at level λ still below hi.  Vectorised over leading axes."""
    low = np.zeros(target.shape, dtype=np.int64)
    high = np.full(target.shape, int(hi.max()) if hi.size else 0, dtype=np.int64)
    while (low < high).any():  # largest λ with Σ clip(λ, lo, hi) ≤ target
        mid = (low + high + 1) // 2
        fits = np.clip(mid[..., None], lo, hi).sum(axis=-1) <= target
        low = np.where(fits, mid, low)
        high = np.where(fits, high, mid - 1)
    n = np.clip(low[..., None], lo, hi)
    short = target - n.sum(axis=-1)  # fewer than the stages at level λ below their hi
    can = (n == low[..., None]) & (n < hi)
    bump = can & (np.cumsum(can, axis=-1) <= short[..., None])
    filled: np.ndarray = n + bump
    return filled


def _fill(lo: np.ndarray, hi: np.ndarray, groups: list[np.ndarray], num_layers: int) -> np.ndarray:
    """The cheapest Σ c_i·n_i with Σ n_i = L and lo ≤ n ≤ hi: every stage gets lo, the rest goes
    to the cheapest group first, levelled within a group.  Vectorised over leading axes;
    assumes Σlo ≤ L ≤ Σhi."""
    n = lo.copy()
    left = num_layers - lo.sum(axis=-1)
    for g in groups:
        lo_g, hi_g = lo[..., g], hi[..., g]
        add = np.minimum(left, (hi_g - lo_g).sum(axis=-1))
        n[..., g] = _water_fill(lo_g, hi_g, lo_g.sum(axis=-1) + add)
        left = left - add
    return n


def single_pool_split(
    lin: StageLinear,
    capacity_bytes: float | np.ndarray,
    num_layers: int,
    pp: int,
    m: float,
    vpp: int,
    max_pairs: int = DEFAULT_MAX_PAIRS,
    cutoff_s: float = np.inf,
    schedules: int = 1,
) -> ExactSplit | None:
    """Optimal split of ``num_layers`` layers over ``pp`` stages of one pool (≥ 1 layer each,
    each within memory; ``capacity_bytes`` one value or one per stage).  None when no split
    fits, or none is faster than ``cutoff_s``.  Raises :class:`SplitBudgetExceeded` when the
    enumeration would exceed ``max_pairs`` threshold pairs.  Among equally fast splits the
    first in the thresholds' ascending order is kept (ties never depend on anything but the
    coefficients)."""
    L = int(num_layers)
    v = max(int(vpp), 1)
    k_sched = max(int(schedules), 1)  # schedules a step, each with its own DP sync (E counts k times)
    w = v / k_sched  # the bubble's divisor (v for one schedule a step)
    if pp > L:
        return None
    hi_mem = max_layers_in_memory(lin.mem_a, lin.mem_b, capacity_bytes, L)
    if (hi_mem < 1).any() or hi_mem.sum() < L:
        return None

    n = np.arange(L + 1, dtype=float)
    valid = (n[None, :] >= 1) & (n[None, :] <= hi_mem[:, None])  # [pp, L+1]
    t = lin.time_a[:, None] + lin.time_b[:, None] * n
    drain = np.arange(pp, dtype=float)[:, None] / v
    win = lin.win_a[:, None] + lin.win_b[:, None] * n
    e = exposed_dp_sync_each_s(lin.dp_a[:, None] + lin.dp_b[:, None] * n, win, drain * (lin.bwd_a[:, None] + lin.bwd_b[:, None] * n), overlap_compute_slowdown())
    o = lin.opt_a[:, None] + lin.opt_b[:, None] * n
    c = lin.time_b / w  # linear part Σ c_i·n_i (+ Σ time_a / w)
    groups = _cost_groups(c)
    c_T = m - 1.0 / w
    const = float(lin.time_a.sum()) / w

    def lin_min(lo: np.ndarray, hi: np.ndarray) -> float:
        return float((c * _fill(lo, hi, groups, L)).sum())

    def floor_of(g: np.ndarray, mask: np.ndarray) -> float:
        """max_i min_n g_i(n) over the allowed n: a lower bound of max_i g_i(n_i)."""
        return float(np.where(mask, g, np.inf).min(axis=1).max())

    lo0, hi0, _ = _interval(valid, L)
    bound_rest = floor_of(o, valid) + k_sched * floor_of(e, valid) + const + lin_min(lo0, hi0)

    def box(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
        lo, hi, ok = _interval(mask, L)
        return lo, hi, bool(ok.all()) and bool(lo.sum() <= L <= hi.sum())

    # Feasibility only grows with X_T: bisect for the first feasible bottleneck value.
    T_values = np.unique(t[valid])
    first, last = 0, len(T_values) - 1
    while first < last:
        mid = (first + last) // 2
        if box(valid & (t <= T_values[mid]))[2]:
            last = mid
        else:
            first = mid + 1
    best_F = float(cutoff_s)
    best_n: np.ndarray | None = None
    pairs = 0
    for X_T in T_values[first:]:
        if c_T * X_T + bound_rest >= best_F:
            break
        mask_T = valid & (t <= X_T)
        lo_T, hi_T, ok_T = box(mask_T)
        if not ok_T:
            continue
        lin_T = lin_min(lo_T, hi_T)
        floor_E_T = k_sched * floor_of(e, mask_T)
        for X_O in np.unique(o[mask_T]):
            if c_T * X_T + X_O + floor_E_T + const + lin_T >= best_F:
                break
            pairs += 1
            if pairs > max_pairs:
                raise SplitBudgetExceeded(f"more than {max_pairs} threshold pairs")
            mask_TO = mask_T & (o <= X_O)
            if not box(mask_TO)[2]:
                continue
            X_E = np.unique(e[mask_TO])  # [k]
            mask = mask_TO[None] & (e[None] <= X_E[:, None, None])  # [k, pp, L+1]
            lo, hi, ok = _interval(mask, L)
            feasible = ok.all(axis=1) & (lo.sum(axis=1) <= L) & (hi.sum(axis=1) >= L)
            if not feasible.any():
                continue
            k = np.nonzero(feasible)[0]
            layers = _fill(lo[k], hi[k], groups, L)
            total = k_sched * X_E[k] + (c * layers).sum(axis=1)
            cand = layers[int(np.argmin(total))]
            F = split_objective_s(lin, cand, m, v, schedules)
            if best_F > F:
                best_F, best_n = F, cand
    if best_n is None:
        return None
    return ExactSplit(tuple(int(x) for x in best_n), best_F, pairs)


def compose_stages(lins: Sequence[StageLinear], pools: Sequence[int]) -> StageLinear:
    """One pipeline's coefficients when stage i runs on pool ``pools[i]``: row i of that pool's
    ``StageLinear``, plus its cross-pool point-to-point extra when the next stage is on another
    pool (the term the CP-SAT model adds through its ``w`` variables)."""
    rows = np.asarray(pools, dtype=np.int64)
    idx = np.arange(len(rows))
    cols = {f.name: np.stack([getattr(lin, f.name) for lin in lins])[rows, idx] for f in fields(StageLinear)}
    crosses = np.append(rows[1:] != rows[:-1], False)
    cols["time_a"] = cols["time_a"] + np.where(crosses, cols["p2p_cross_extra_s"], 0.0)
    return StageLinear(**cols)


def assignment_lower_bound_s(lin: StageLinear, num_layers: int, m: float, vpp: int, schedules: int = 1) -> float:
    """A lower bound of F over every split of one fixed assignment (s).  Each stage holds
    n_i ≥ 1 layers with t_i = a_i + b_i·n_i ≤ T, so L = Σ n_i ≤ Σ (T − a_i)/b_i, i.e.
    T ≥ (L + Σ a_i/b_i) / Σ 1/b_i, and T ≥ a_i + b_i; Σ t_i ≥ Σ a_i + L·min b_i;
    O ≥ max_i o_i(1); E ≥ 0.  −∞ when a per-layer time is not positive (no bound)."""
    a, b = lin.time_a, lin.time_b
    if not (b > 0).all():
        return -np.inf
    w = max(int(vpp), 1) / max(int(schedules), 1)
    T = max(float((num_layers + (a / b).sum()) / (1.0 / b).sum()), float((a + b).max()))
    sum_t = float(a.sum() + num_layers * b.min())
    return (m - 1.0 / w) * T + sum_t / w + float((lin.opt_a + np.maximum(lin.opt_b, 0.0)).max())


def stage_assignments(stage_caps: Sequence[int], pp: int) -> Iterator[tuple[int, ...]]:
    """Every assignment of ``pp`` stages to pools in which each used pool hosts one contiguous
    block of at most ``stage_caps[p]`` stages (pools in any order): the CP-SAT model's
    feasible x.  A fixed order: by the number of pools used, their order, then block sizes."""
    P = len(stage_caps)

    def blocks(order: tuple[int, ...], left: int) -> Iterator[tuple[int, ...]]:
        p, rest = order[0], order[1:]
        if not rest:
            if 1 <= left <= stage_caps[p]:
                yield (left,)
            return
        for size in range(1, min(stage_caps[p], left - len(rest)) + 1):
            for tail in blocks(rest, left - size):
                yield (size, *tail)

    for r in range(1, P + 1):
        for order in itertools.permutations(range(P), r):
            for sizes in blocks(order, pp):
                yield tuple(p for p, size in zip(order, sizes, strict=True) for _ in range(size))


def multi_pool_split(
    lins: Sequence[StageLinear],
    capacities_bytes: Sequence[float],
    stage_caps: Sequence[int],
    num_layers: int,
    pp: int,
    m: float,
    vpp: int,
    max_assignments: int = DEFAULT_MAX_ASSIGNMENTS,
    schedules: int = 1,
) -> MultiPoolSplit | None:
    """Optimal split and stage → pool assignment over several pools, exactly: for each
    assignment (:func:`stage_assignments`) the stages' coefficients are fixed
    (:func:`compose_stages`), so :func:`single_pool_split` finds that assignment's best split;
    the best over assignments (the first in their fixed order among equals) is the optimum of
    the CP-SAT model in ``split_cpsat`` without its integer scaling.  None when nothing fits.
    Raises :class:`SplitBudgetExceeded` past ``max_assignments`` assignments or a split's
    pair budget."""
    every = list(itertools.islice(stage_assignments(stage_caps, pp), max_assignments + 1))
    if len(every) > max_assignments:
        raise SplitBudgetExceeded(f"more than {max_assignments} stage assignments")
    caps = np.asarray(capacities_bytes, dtype=float)
    composed = [(pools, compose_stages(lins, pools)) for pools in every]
    bounds = np.array([assignment_lower_bound_s(lin, num_layers, m, vpp, schedules) for _, lin in composed])
    best: MultiPoolSplit | None = None
    pairs = assignments = 0
    # Most promising first (ties in the fixed order), so the incumbent prunes the rest early.
    for k in np.argsort(bounds, kind="stable"):
        if best is not None and bounds[k] >= best.objective_s:
            break
        pools, lin = composed[int(k)]
        assignments += 1
        cutoff = best.objective_s if best is not None else np.inf
        res = single_pool_split(lin, caps[list(pools)], num_layers, pp, m, vpp, cutoff_s=cutoff, schedules=schedules)
        if res is None:
            continue
        pairs += res.pairs
        best = MultiPoolSplit(res.layers, pools, res.objective_s, 0, 0)
    if best is None:
        return None
    return MultiPoolSplit(best.layers, best.pools, best.objective_s, pairs, assignments)
