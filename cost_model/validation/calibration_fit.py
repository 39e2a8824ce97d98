"""Least-squares fit of the global constants (``cost_model.transformer.calibration``) to the
published runs, in log space, and leave-one-source-out cross-validation.

Objective: Σ_rows log(predicted/measured)² over every measured row (status ``ok``) that plans.
The prediction's response to each constant is tabulated per row — the row's best layout at the
priors, costed at a grid of values of that constant with the others at their priors — and
log-predictions are taken as additive over constants (each constant touches a different part
of the step: a framework's kernels, a fabric, the sharded collectives, FP8 GEMMs, one device
family).  Coordinate descent on a fine log grid minimises the objective over that response
surface; the reported errors are then recomputed by the cost model itself at the fitted
constants, with the full search over each row's unknown knobs.

Cross-validation: for each source, fit on every other source, then predict the held-out
source's rows at those constants.  A constant that only the held-out source informs falls
back to its prior.  Deterministic: no random numbers, fixed grids and row order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from cost_model.transformer.calibration import PRIORS, Constants, using
from cost_model.validation.fidelity import RowResult, evaluate_case, quantile
from cost_model.validation.published import PublishedCase, Unplannable, all_rows

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
    "framework_gemm_efficiency.megatron-deepspeed": 1.0,
    "framework_gemm_efficiency.fsdp": 1.0,
    "framework_gemm_efficiency.paddle": 1.0,
    "fp8_gemm_efficiency": 1.0,
    "misaligned_gemm_fraction": 1.0,
    "sharded_prefetch_overlap.megatron-deepspeed": 1.0,
}


def affects(name: str, case: PublishedCase) -> bool:
    """Whether constant ``name`` can change the prediction of ``case``."""
    fw = case.training.framework
    group = case.cluster.node_groups[0]
    if name == "framework_gemm_efficiency.megatron-deepspeed":
        return fw in ("megatron-deepspeed", "deepspeed")
    if name.startswith("framework_gemm_efficiency."):
        return fw == name.split(".", 1)[1]
    if name.startswith("fabric_fraction."):
        return group.fabric == name.split(".", 1)[1] and case.cluster.total_gpus > group.gpus_per_node
    if name == "sharded_collective_efficiency":
        return any(s.zero_stage >= 3 for s in case.candidates)
    if name == "fp8_gemm_efficiency":
        return case.training.dtype == "fp8"
    if name.startswith("family_gemm_efficiency."):
        return group.device.family == name.split(".", 1)[1]
    if name == "pipeline_microbatch_overhead_s.megatron-deepspeed":
        return fw in ("megatron-deepspeed", "deepspeed") and any(s.pp > 1 for s in case.candidates)
    if name == "sharded_prefetch_overlap.megatron-deepspeed":
        return fw in ("megatron-deepspeed", "deepspeed") and any(s.zero_stage >= 3 for s in case.candidates)
    if name == "misaligned_gemm_fraction":
        return case.training.attention == "unfused" and case.model.head_dim % 8 != 0
    return False


@dataclass(frozen=True)
class Tables:
    """Per row: log(pred/measured) at the priors and, per constant it depends on, the
    log-prediction change over :data:`RESPONSE_GRID`."""

    base: dict[str, float]
    response: dict[str, dict[str, np.ndarray]]
    source: dict[str, str]


def build_tables(cases: Sequence[PublishedCase], base_results: dict[str, RowResult], names: Sequence[str] = tuple(PRIORS)) -> Tables:
    base: dict[str, float] = {}
    response: dict[str, dict[str, np.ndarray]] = {}
    source: dict[str, str] = {}
    for case in cases:
        r = base_results.get(case.row_id)
        if r is None or r.log_error is None or r.strategy is None:
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
                with using(Constants({**PRIORS, name: PRIORS[name] * g})):
                    rr = evaluate_case(case, [r.strategy])
                curve.append(math.log(rr.predicted_step_s / r.predicted_step_s) if rr.predicted_step_s and r.predicted_step_s else 0.0)
            response.setdefault(case.row_id, {})[name] = np.array(curve)
    return Tables(base, response, source)


def _delta(curve: np.ndarray, multiple: float) -> float:
    return float(np.interp(math.log(multiple), np.log(RESPONSE_GRID), curve))


def fit(tables: Tables, exclude_source: str | None = None, passes: int = 4) -> dict[str, float]:
    """Constants minimising Σ log-error² over the rows not of ``exclude_source``; constants no
    remaining row depends on keep their priors."""
    rows = [r for r in tables.base if tables.source[r] != exclude_source]
    names = sorted({n for r in rows for n in tables.response.get(r, {})})
    mult = dict.fromkeys(names, 1.0)

    def residual(r: str) -> float:
        return tables.base[r] + sum(_delta(c, mult[n]) for n, c in tables.response.get(r, {}).items())

    for _ in range(passes):
        for name in names:
            touched = [r for r in rows if name in tables.response.get(r, {})]
            best, best_cost = mult[name], math.inf
            for g in SEARCH_GRID:
                if PRIORS[name] * g > UPPER_BOUND.get(name, math.inf):
                    continue
                mult[name] = g
                cost = sum(residual(r) ** 2 for r in touched)
                if cost < best_cost - 1e-15:
                    best, best_cost = g, cost
            mult[name] = best
    return {**PRIORS, **{n: round(PRIORS[n] * mult[n], 4) for n in names}}


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


def cross_validate(tables: Tables, cases: Sequence[PublishedCase | Unplannable]) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """Leave-one-source-out: (row id → CV error, source → the constants fitted without it)."""
    errors: dict[str, float] = {}
    fitted: dict[str, dict[str, float]] = {}
    by_source: dict[str, list[PublishedCase | Unplannable]] = {}
    for c in cases:
        if isinstance(c, PublishedCase) and c.measured_status == "ok":
            by_source.setdefault(c.source, []).append(c)
    for src, held in sorted(by_source.items()):
        constants = fit(tables, exclude_source=src)
        fitted[src] = constants
        for r in evaluate_at(constants, held):
            if r.error is not None:
                errors[r.row_id] = r.error
    return errors, fitted


def regime_intervals(results: Sequence[RowResult], errors: dict[str, float], min_rows: int = 5) -> dict[str, tuple[float, float]]:
    """(q10, q90) of log(1 + CV error) per regime (framework/device family) with at least
    ``min_rows`` rows, plus the pooled ``*``."""
    from cost_model.transformer.calibration import POOLED, regime

    logs: dict[str, list[float]] = {}
    for r in results:
        if r.row_id in errors:
            logs.setdefault(regime(r.framework, r.device_family), []).append(math.log1p(errors[r.row_id]))
    pooled = [x for v in logs.values() for x in v]
    out = {k: (round(quantile(v, 0.1), 4), round(quantile(v, 0.9), 4)) for k, v in sorted(logs.items()) if len(v) >= min_rows}
    if pooled:
        out[POOLED] = (round(quantile(pooled, 0.1), 4), round(quantile(pooled, 0.9), 4))
    return out


def interval_coverage(results: Sequence[RowResult], errors: dict[str, float]) -> float | None:
    """Cross-validated coverage: each source's rows against the p10–p90 interval computed from
    the *other* sources' CV residuals."""
    from cost_model.transformer.calibration import POOLED, regime

    inside = total = 0
    sources = sorted({r.source for r in results if r.row_id in errors})
    for src in sources:
        others = [r for r in results if r.source != src]
        iv = regime_intervals(others, errors)
        for r in results:
            if r.source != src or r.row_id not in errors:
                continue
            q = iv.get(regime(r.framework, r.device_family)) or iv.get(POOLED)
            if q is None:
                continue
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
    ok_cases = [c for c in cases if isinstance(c, PublishedCase) and c.measured_status == "ok"]
    say("tabulating each row's response to each constant")
    tables = build_tables(ok_cases, {r.row_id: r for r in prior})
    constants = fit(tables)
    mult = {n: constants[n] / PRIORS[n] for n in PRIORS}
    objective = sum((tables.base[r] + sum(_delta(c, mult[n]) for n, c in tables.response.get(r, {}).items())) ** 2 for r in tables.base)
    say("leave-one-source-out cross-validation")
    cv_errors, cv_constants = cross_validate(tables, cases)
    intervals = regime_intervals(prior, cv_errors)
    return CalibrationRun(cases, prior, tables, constants, objective, cv_errors, cv_constants, intervals)
