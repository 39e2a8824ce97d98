"""Least-squares fit of the global constants (``cost_model.transformer.calibration``) to the
published runs, in log space, and leave-one-source-out cross-validation.

Objective: Σ_rows w·log(predicted/measured)² over every measured row (status ``ok``) that
plans, each row weighted 1/√(its source's rows) (:func:`source_weights`), plus a log-space
Gaussian prior on each constant (:func:`prior_penalty`), within physical bounds
(:data:`LOWER_BOUND`, :data:`UPPER_BOUND`).
The prediction's response to each constant is tabulated per row — the row's best layout at the
priors, costed at a grid of values of that constant with the others at their priors — and
log-predictions are taken as additive over constants (each constant touches a different part
of the step: a framework's kernels, a fabric, the sharded collectives, FP8 GEMMs, one device
family).  Coordinate descent on a fine log grid minimises the objective over that response
surface; then the responses are tabulated again around the fitted constants and the fit
repeated (:func:`fit_recentred`), because a few constants do act together (DeepSpeed's
stage-3 prefetch overlap only matters once its collectives are slow enough to be exposed,
which responses taken one at a time at the priors cannot see); the reported errors are then recomputed by the cost model itself at the fitted
constants, with the full search over each row's unknown knobs.

Cross-validation: for each source, fit (and re-tabulate, and refit) on every other source,
then predict the held-out source's rows at those constants.  A constant that only the held-out source informs falls
back to its prior.  Deterministic: no random numbers, fixed grids and row order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from cost_model.transformer.calibration import PRIORS, Constants, constant_applies, using
from cost_model.validation.fidelity import RowResult, conformal_quantile, evaluate_case
from cost_model.validation.published import PublishedCase, Unplannable, all_rows, measured

#: Grid (multiples of the prior) at which each row's response to a constant is tabulated.
RESPONSE_GRID = (0.15, 0.25, 0.4, 0.6, 0.8, 1.0, 1.25, 1.6, 2.5)
#: Search grid (multiples of the prior) of the coordinate descent.
SEARCH_GRID = tuple(float(x) for x in np.exp(np.linspace(math.log(0.15), math.log(2.5), 241)))
#: Physical bounds: a fraction of a link or of a peak cannot exceed 1; no framework's kernels
#: beat Megatron-Core with Transformer Engine (the reference, 1); FP8 GEMMs cannot reach a
#: larger fraction of their doubled peak than BF16 GEMMs of theirs.
UPPER_BOUND = {
    "fabric_fraction.omnipath": 1.0,
    "fabric_fraction.roce": 1.0,
    "sharded_collective_efficiency": 1.0,
    "sharded_collective_efficiency.megatron-deepspeed": 1.0,
    "framework_gemm_efficiency.megatron-deepspeed": 1.0,
    "framework_gemm_efficiency.fsdp": 1.0,
    "framework_gemm_efficiency.paddle": 1.0,
    "fp8_gemm_efficiency": 1.0,
    "misaligned_gemm_fraction": 1.0,
    "sharded_prefetch_overlap.megatron-deepspeed": 1.0,
    "sharded_compute_efficiency.megatron-deepspeed": 1.0,
    "overlap_compute_slowdown": 0.6,
}
#: Physical floors (the plausible prior bounds of ``cost_model.transformer.calibration``): a
#: fabric's NCCL rate is at least half of InfiniBand's (Omni-Path 100 Gb/s HFIs reach
#: 9–11 GB/s of their 12.5 in OSU/NCCL benchmarks); a framework's kernels keep at least 60% of
#: Megatron-Core's large-GEMM rate (the same cuBLAS GEMMs, only fusion and dispatch differ); FP8
#: GEMMs keep at
#: least 60% of their relative BF16 fraction (cuBLASLt FP8 benchmarks on H100: ~1.3–1.45 PF of
#: 1.98 against ~0.7 of 0.99 in BF16); DeepSpeed's stage-3 hooks leave a layer at least half
#: its compute rate.
LOWER_BOUND = {
    "fabric_fraction.omnipath": 0.5,
    "fabric_fraction.roce": 0.5,
    "framework_gemm_efficiency.megatron-deepspeed": 0.6,
    "framework_gemm_efficiency.fsdp": 0.6,
    "framework_gemm_efficiency.paddle": 0.6,
    "sharded_compute_efficiency.megatron-deepspeed": 0.5,
    "fp8_gemm_efficiency": 0.6,
    "overlap_compute_slowdown": 0.02,
}


def affects(name: str, case: PublishedCase) -> bool:
    """Whether constant ``name`` can change the prediction of ``case`` (any of its candidates)."""
    return constant_applies(name, case.model, case.training, case.cluster, case.candidates)


def informing_sources(cases: Sequence[PublishedCase | Unplannable]) -> dict[str, list[str]]:
    """The sources whose measured rows each constant of :data:`PRIORS` can move (:func:`affects`):
    what the fit learns that constant from.  A constant with a single source falls back to its
    prior when that source is held out, so a run of any other source is predicted at the prior
    in cross-validation (``cost_model.transformer.calibration.single_source_spread``)."""
    out: dict[str, set[str]] = {name: set() for name in PRIORS}
    for case in measured(cases):
        for name in PRIORS:
            if affects(name, case):
                out[name].add(case.source)
    return {name: sorted(srcs) for name, srcs in sorted(out.items())}


@dataclass(frozen=True)
class Tables:
    """Per row: log(pred/measured) at the ``center`` constants and, per constant it depends on,
    the log-prediction change when that constant alone is scaled over :data:`RESPONSE_GRID`."""

    base: dict[str, float]
    response: dict[str, dict[str, np.ndarray]]
    source: dict[str, str]
    center: dict[str, float] = field(default_factory=lambda: dict(PRIORS))


def build_tables(cases: Sequence[PublishedCase], base_results: dict[str, RowResult], names: Sequence[str] = tuple(PRIORS),
                 center: dict[str, float] | None = None) -> Tables:
    """Each row's response to each constant it depends on, one at a time, around ``center``
    (default: the priors), at the strategy ``base_results`` found for the row."""
    at = dict(PRIORS) if center is None else {**PRIORS, **center}
    base: dict[str, float] = {}
    response: dict[str, dict[str, np.ndarray]] = {}
    source: dict[str, str] = {}
    for case in cases:
        r = base_results.get(case.row_id)
        if r is None or r.strategy is None:
            continue
        strategy = r.strategy
        if center is not None:  # the row at the centre, on the same strategy
            with using(Constants(at)):
                r = evaluate_case(case, [strategy])
        if r.log_error is None or not r.predicted_step_s:
            continue
        base[case.row_id] = r.log_error
        source[case.row_id] = case.source
        for name in names:
            if not affects(name, case):
                continue
            curve = []
            for g in RESPONSE_GRID:
                if g == 1.0:
                    curve.append(0.0)
                    continue
                with using(Constants({**at, name: at[name] * g})):
                    rr = evaluate_case(case, [strategy])
                curve.append(math.log(rr.predicted_step_s / r.predicted_step_s) if rr.predicted_step_s and r.predicted_step_s else 0.0)
            response.setdefault(case.row_id, {})[name] = np.array(curve)
    return Tables(base, response, source, at)


def _delta(curve: np.ndarray, multiple: float) -> float:
    return float(np.interp(math.log(multiple), np.log(RESPONSE_GRID), curve))


#: The prior of every constant as a Gaussian in log space (maximum a posteriori instead of plain
#: least squares): σ = log 1.5 — a constant is a priori within ×/÷ 1.5 of its documented value —
#: weighted as :data:`PRIOR_PSEUDO_ROWS` rows, so that a constant only a few rows inform stays
#: near its physics, and many rows can still move it.
PRIOR_LOG_SIGMA = math.log(1.5)
PRIOR_PSEUDO_ROWS = 2.0
#: A typical row's |log error| (the scale that turns the prior into pseudo-rows' squared error).
ROW_LOG_SIGMA = 0.1


def prior_penalty(multiple: float) -> float:
    """The prior's share of the objective for a constant at ``multiple`` × its prior:
    ``PRIOR_PSEUDO_ROWS · ROW_LOG_SIGMA² · (log multiple / PRIOR_LOG_SIGMA)²``."""
    return PRIOR_PSEUDO_ROWS * ROW_LOG_SIGMA**2 * (math.log(multiple) / PRIOR_LOG_SIGMA) ** 2


def source_weights(tables: Tables, rows: Sequence[str]) -> dict[str, float]:
    """Row weights 1/√(rows of its source): a source's pull on a shared constant grows with the
    square root of its rows, so one large sweep (BLOOM's 90 rows, one cluster and code base)
    does not outvote every other framework's few."""
    counts: dict[str, int] = {}
    for r in rows:
        counts[tables.source[r]] = counts.get(tables.source[r], 0) + 1
    return {r: 1.0 / math.sqrt(counts[tables.source[r]]) for r in rows}


def fit(tables: Tables, exclude_source: str | None = None, passes: int = 4) -> dict[str, float]:
    """Constants minimising Σ w·log-error² (:func:`source_weights`) over the rows not of
    ``exclude_source`` plus the log-space prior penalty (:data:`PRIOR_LOG_SIGMA`), within the
    physical bounds; constants no remaining row depends on keep the tables' centre.  The
    tables give each constant's effect on its own (coordinate descent over
    :data:`SEARCH_GRID` multiples of the centre); :func:`fit_recentred` accounts for the
    constants' interplay."""
    rows = [r for r in tables.base if tables.source[r] != exclude_source]
    names = sorted({n for r in rows for n in tables.response.get(r, {})})
    mult = dict.fromkeys(names, 1.0)
    weight = source_weights(tables, rows)
    c0 = tables.center

    def residual(r: str) -> float:
        return tables.base[r] + sum(_delta(c, mult[n]) for n, c in tables.response.get(r, {}).items())

    for _ in range(passes):
        for name in names:
            touched = [r for r in rows if name in tables.response.get(r, {})]
            best, best_cost = mult[name], math.inf
            for g in SEARCH_GRID:
                value = c0[name] * g
                if not LOWER_BOUND.get(name, 0.0) <= value <= UPPER_BOUND.get(name, math.inf):
                    continue
                mult[name] = g
                cost = sum(weight[r] * residual(r) ** 2 for r in touched) + prior_penalty(value / PRIORS[name])
                if cost < best_cost - 1e-15:
                    best, best_cost = g, cost
            mult[name] = best
    return {**c0, **{n: round(c0[n] * mult[n], 4) for n in names}}


def objective(tables: Tables, constants: dict[str, float]) -> float:
    """The fitted objective (weighted squared log errors plus the prior penalty) at
    ``constants``, through the tables."""
    mult = {n: constants[n] / tables.center[n] for n in tables.center}
    w = source_weights(tables, list(tables.base))
    names = {n for r in tables.base for n in tables.response.get(r, {})}
    out = sum(w[r] * (tables.base[r] + sum(_delta(c, mult[n]) for n, c in tables.response.get(r, {}).items())) ** 2 for r in tables.base)
    return out + sum(prior_penalty(constants[n] / PRIORS[n]) for n in names)


#: Times the responses are re-tabulated around the latest fit and the constants refitted.
RECENTRE_ITERATIONS = 1


def fit_recentred(tables: Tables, cases: Sequence[PublishedCase], base_results: dict[str, RowResult],
                  exclude_source: str | None = None) -> tuple[dict[str, float], Tables]:
    """:func:`fit` on the tables at the priors, then, :data:`RECENTRE_ITERATIONS` times, the
    responses tabulated again around that fit (on the rows the fit may use, the same
    strategies) and refitted.  One-at-a-time responses at the priors miss how constants act
    together — DeepSpeed's stage-3 prefetch overlap matters only once its collectives are slow
    enough to be exposed — so a fit that moves several far from their priors is refined where
    it landed.  (Leave-one-source-out re-tabulates without the held-out source: its rows never
    choose the centre.)"""
    constants = fit(tables, exclude_source)
    train = [c for c in cases if c.source != exclude_source]
    for _ in range(RECENTRE_ITERATIONS):
        tables = build_tables(train, base_results, center=constants)
        constants = fit(tables, exclude_source)
    return constants, tables


def evaluate_at(constants: dict[str, float], cases: Sequence[PublishedCase | Unplannable], progress: Callable[[str], None] | None = None,
                intervals: dict[str, tuple[float, float]] | None = None) -> list[RowResult]:
    """The cost model's own predictions (full search over unknown knobs) at ``constants``
    (and step-time ``intervals``, for the estimates' p10/p90)."""
    out = []
    with using(Constants(constants, intervals or {})):
        for case in cases:
            out.append(evaluate_case(case))
            if progress:
                progress(case.row_id)
    return out


def cross_validate(tables: Tables, cases: Sequence[PublishedCase | Unplannable],
                   base_results: dict[str, RowResult]) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """Leave-one-source-out: (row id → CV error, source → the constants fitted without it,
    :func:`fit_recentred` on the other sources' rows)."""
    errors: dict[str, float] = {}
    fitted: dict[str, dict[str, float]] = {}
    by_source: dict[str, list[PublishedCase]] = {}
    for c in measured(cases):
        by_source.setdefault(c.source, []).append(c)
    ok = [c for group in by_source.values() for c in group]
    for src, held in sorted(by_source.items()):
        constants, _ = fit_recentred(tables, ok, base_results, exclude_source=src)
        fitted[src] = constants
        for r in evaluate_at(constants, held):
            if r.error is not None:
                errors[r.row_id] = r.error
    return errors, fitted


def _mix(r: RowResult) -> str | None:
    from cost_model.transformer.calibration import parallel_mix

    return parallel_mix(r.strategy.pp, r.strategy.zero_stage) if r.strategy is not None else None


def regime_intervals(results: Sequence[RowResult], errors: dict[str, float], min_rows: int = 5) -> dict[str, tuple[float, float]]:
    """(q10, q90) of log(1 + CV error) per regime with at least ``min_rows`` rows from two or
    more sources: framework ×
    device family × parallel mix (:func:`cost_model.transformer.calibration.parallel_mix`),
    framework × device family, and the pooled ``*`` (an estimate takes the most specific)."""
    from cost_model.transformer.calibration import POOLED, regime

    logs: dict[str, list[float]] = {}
    srcs: dict[str, set[str]] = {}
    by_source: dict[str, list[float]] = {}
    for r in results:
        if r.row_id in errors:
            x = math.log1p(errors[r.row_id])
            by_source.setdefault(r.source, []).append(abs(x))
            mix = _mix(r)
            for key in (regime(r.framework, r.device_family),) + ((regime(r.framework, r.device_family, mix),) if mix else ()):
                logs.setdefault(key, []).append(x)
                srcs.setdefault(key, set()).add(r.source)
    # A regime's interval needs rows of at least two sources: one source's residuals share its
    # bias (one cluster, one code base, one FLOP convention) and would give an interval too
    # narrow for a run of another; such regimes fall back to the coarser ones.
    # Finite-sample order statistics (split conformal), not the interpolated sample quantile:
    # a regime of n rows covers a new row with probability >= 0.8 only with these.
    out = {k: (round(conformal_quantile(v, 0.1), 4), round(conformal_quantile(v, 0.9), 4))
           for k, v in sorted(logs.items()) if len(v) >= min_rows and len(srcs[k]) >= 2}
    if by_source:
        out[POOLED] = pooled_interval(by_source)
    return out


def pooled_interval(abs_log_errors_by_source: dict[str, list[float]]) -> tuple[float, float]:
    """The fallback interval of a regime without rows of its own: ``(−q, q)`` of log(1 + error).

    Such a regime is a new group — a framework, device family or code base the residuals have
    not seen — whose bias is unknown in sign and size, so rows are not exchangeable with it but
    sources are.  The bound is therefore taken over sources, not pooled rows (where the sources
    with most rows — BLOOM's 87, Megatron-Bridge's 25 — would set it alone): each source's
    split-conformal 80% bound of the score |log(1 + error)| (Lei et al. 2018, §2.1), then the
    split-conformal 80% bound of those bounds across sources — the "double conformal" set for
    a new group of a two-layer hierarchy (Dunn, Wasserman & Ramdas 2022, JASA, §4).  It is
    symmetric: the residuals' signs are those of the sources' biases (most of the file's
    sources run too fast under the model, BLOOM too slow).  Pooling the rows instead, as a
    first version did, gave ±10.6% once the Megatron-Bridge rows were predicted better, and
    BLOOM's rows, checked against the other sources' fallback, fell to 57 of 87 inside."""
    per_source = [conformal_quantile(v, 0.8) for _, v in sorted(abs_log_errors_by_source.items())]
    q = round(conformal_quantile(per_source, 0.8), 4)
    return -q, q


def interval_coverage(results: Sequence[RowResult], errors: dict[str, float]) -> float | None:
    """Cross-validated coverage: each source's rows against the p10–p90 interval computed from
    the *other* sources' CV residuals (the regime an estimate would use)."""
    from cost_model.transformer.calibration import regime_key

    inside = total = 0
    sources = sorted({r.source for r in results if r.row_id in errors})
    for src in sources:
        others = [r for r in results if r.source != src]
        iv = regime_intervals(others, errors)
        for r in results:
            if r.source != src or r.row_id not in errors:
                continue
            key = regime_key(iv, r.framework, r.device_family, _mix(r))
            if key is None:
                continue
            q = iv[key]
            total += 1
            inside += q[0] <= math.log1p(errors[r.row_id]) <= q[1]
    return inside / total if total else None


def published_cases() -> list[PublishedCase | Unplannable]:
    return list(all_rows())


@dataclass(frozen=True)
class CalibrationRun:
    """Everything one calibration computes (``bench/calibrate.py``, ``bench/fidelity.py``)."""

    cases: list[PublishedCase | Unplannable]
    prior_results: list[RowResult]
    tables: Tables
    constants: dict[str, float]
    objective: float
    cv_errors: dict[str, float]
    cv_constants: dict[str, dict[str, float]]
    intervals: dict[str, tuple[float, float]]


def run(progress: Callable[[str], None] | None = None) -> CalibrationRun:
    """Evaluate at the priors, tabulate, fit on every source, cross-validate."""
    cases = published_cases()
    say = progress or (lambda _msg: None)
    say("evaluating every row at the priors")
    prior = evaluate_at(dict(PRIORS), cases)
    ok_cases = measured(cases)
    say("tabulating each row's response to each constant")
    base_results = {r.row_id: r for r in prior}
    tables = build_tables(ok_cases, base_results)
    say("fitting, then re-tabulating around the fit and refitting")
    constants, centred = fit_recentred(tables, ok_cases, base_results)
    obj = objective(centred, constants)
    say("leave-one-source-out cross-validation (each fold re-tabulated without its source)")
    cv_errors, cv_constants = cross_validate(tables, cases, base_results)
    intervals = regime_intervals(prior, cv_errors)
    return CalibrationRun(cases, prior, tables, constants, obj, cv_errors, cv_constants, intervals)
