"""Predictions for published runs (shared by ``bench/fidelity.py``, ``bench/calibrate.py`` and
the tests): per-row records, per-source summaries, the BLOOM sweep ranking."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from cost_model.errors import PlannerError
from cost_model.estimate import estimate
from cost_model.result import Estimate
from cost_model.strategy import Strategy
from cost_model.training import Training
from cost_model.validation.published import PublishedCase, Unplannable, all_rows, gpt_model


def _cost(case: PublishedCase, strategy: Strategy) -> Estimate | None:
    """The estimate of one candidate, or None when it breaks a rule of the cost model."""
    try:
        return estimate(case.model, case.training, case.cluster, strategy, spread_single_source=False)
    except PlannerError:
        return None


def _pool(case: PublishedCase, candidates: Sequence[Strategy] | None) -> list[Strategy]:
    return list(candidates if candidates is not None else case.candidates)


def _least_memory_pool(pool: Sequence[Strategy]) -> list[Strategy]:
    """``pool`` less the block-recompute candidates whose full-recompute twin (every layer
    recomputed) is in it: the twin always needs less memory."""
    present = set(pool)
    return [s for s in pool if not (s.recompute_num_layers and replace(s, recompute_num_layers=0) in present)]


def _valid_estimates(case: PublishedCase, pool: Sequence[Strategy]) -> Iterator[tuple[Estimate, Strategy]]:
    """(estimate, strategy) of every candidate the cost model accepts (a rule it breaks: skipped)."""
    for strategy in pool:
        est = _cost(case, strategy)
        if est is not None:
            yield est, strategy


def predict_case(case: PublishedCase, candidates: Sequence[Strategy] | None = None) -> tuple[Estimate | None, Strategy | None]:
    """The fastest fitting candidate of the published layout (unknown knobs enumerated).

    Fitting is the p10 verdict (``Estimate.fits``), tight candidates included: the row ran, so
    what is measured is the cost model's step time of a layout that fits, not the planner's
    preference for a safe one (``tight_memory``; bench/acceptance.py plans the rows the
    planner's way).

    Block-recompute candidates (the first N layers of each chunk recomputed) are searched, not
    all costed: with N, recompute time grows and stored activations shrink linearly
    (``layer_cost.recompute_fraction``), so of one layout's depths the fitting ones are those
    from some N* up and the fastest of them is N*, found by bisection. A layout's depths are
    skipped when its full-recompute twin does not fit (no depth does), when its no-recompute
    twin fits (faster than any depth) or when that twin, a lower bound on every depth's step
    time, is no faster than the best fitting candidate so far — as the planner's search does
    (``space.block_recompute_candidates``)."""
    pool = _pool(case, candidates)
    costed: dict[Strategy, Estimate | None] = {}
    groups: dict[Strategy, list[Strategy]] = {}
    best: Estimate | None = None
    best_s: Strategy | None = None

    def consider(est: Estimate | None, strategy: Strategy) -> None:
        nonlocal best, best_s
        if est is not None and est.fits and (best is None or est.step_time_s < best.step_time_s):
            best, best_s = est, strategy

    for strategy in pool:
        if strategy.recompute_num_layers:
            groups.setdefault(replace(strategy, recompute_num_layers=0), []).append(strategy)
            continue
        costed[strategy] = _cost(case, strategy)
        consider(costed[strategy], strategy)
    for full, depths in groups.items():
        depths.sort(key=lambda s: s.recompute_num_layers)
        full_est = costed.get(full)
        if full_est is None:  # the twin is not a candidate (or breaks a rule): cost every depth
            for strategy in depths:
                consider(_cost(case, strategy), strategy)
            continue
        if not full_est.fits:
            continue
        lower = costed.get(replace(full, recompute="none"))
        if lower is not None and (lower.fits or (best is not None and lower.step_time_s >= best.step_time_s)):
            continue
        lo, hi, found = 0, len(depths), None
        while lo < hi:
            mid = (lo + hi) // 2
            est = _cost(case, depths[mid])
            if est is not None and est.fits:
                found, hi = (est, depths[mid]), mid
            else:
                lo = mid + 1
        if found is not None:
            consider(*found)
    return best, best_s


def least_memory_candidate(case: PublishedCase, candidates: Sequence[Strategy] | None = None) -> tuple[Estimate | None, Strategy | None]:
    """The valid candidate with the smallest peak memory (ties: the fastest) — what a measured
    run that the cost model predicts not to fit is costed with, so that its step time is still
    compared (the memory miss is reported separately, as a failure to plan)."""
    best: Estimate | None = None
    best_s: Strategy | None = None
    for est, strategy in _valid_estimates(case, _least_memory_pool(_pool(case, candidates))):
        key = (round(max(est.peak_memory_GB), 6), est.step_time_s)
        if best is None or key < (round(max(best.peak_memory_GB), 6), best.step_time_s):
            best, best_s = est, strategy
    return best, best_s


def _why_not(case: PublishedCase) -> str:
    """Why no candidate of a case fits: the smallest memory overshoot, or the first rule."""
    least: Estimate | None = None
    rule = "no candidate is valid"
    for strategy in _least_memory_pool(case.candidates):
        try:
            est = estimate(case.model, case.training, case.cluster, strategy, spread_single_source=False)
        except PlannerError as exc:
            rule = str(exc)
            continue
        if least is None or max(est.peak_memory_GB) < max(least.peak_memory_GB):
            least = est
    if least is None:
        return rule
    return next((w for w in least.warnings if w.startswith("does not fit")), "does not fit")


@dataclass(frozen=True)
class RowResult:
    """One row's prediction: ``error`` = predicted/measured − 1 (None when not predicted)."""

    row_id: str
    group: str
    source: str
    status: str  # measured: "ok" | "OOM"
    framework: str
    device_family: str
    measured_step_s: float | None
    predicted_step_s: float | None
    fits: bool | None  # some candidate fits in memory
    failure: str | None
    strategy: Strategy | None
    estimate: Estimate | None
    assumptions: tuple[str, ...] = ()
    measured_from: str = ""
    measured_tflops: float | None = None
    measured_memory_GB: float | None = None
    section: str | None = None

    @property
    def memory_error(self) -> float | None:
        """Predicted peak (first/last stage, as the BLOOM sweep measured) / measured − 1."""
        if self.estimate is None or self.measured_memory_GB is None:
            return None
        st = self.estimate.stages
        return max(st[0].peak_memory_GB, st[-1].peak_memory_GB) / self.measured_memory_GB - 1.0

    @property
    def error(self) -> float | None:
        if self.predicted_step_s is None or self.measured_step_s is None:
            return None
        return self.predicted_step_s / self.measured_step_s - 1.0

    @property
    def log_error(self) -> float | None:
        if self.predicted_step_s is None or self.measured_step_s is None:
            return None
        return math.log(self.predicted_step_s / self.measured_step_s)


def evaluate_case(case: PublishedCase | Unplannable, candidates: Sequence[Strategy] | None = None) -> RowResult:
    """Predict one row; OOM rows report only whether some candidate fits."""
    if isinstance(case, Unplannable):
        return RowResult(case.row_id, case.group, case.source, "ok", "", "", None, None, None, case.reason, None, None)
    family = case.cluster.node_groups[0].device.family
    est, strat = predict_case(case, candidates)
    fits = est is not None
    failure = None if fits or case.measured_status == "OOM" else _why_not(case)
    if not fits and case.measured_status == "ok":
        # A measured run predicted not to fit: a failure to plan (``failure``), and its step
        # time is still compared at the stated layout's least-memory candidate.
        est, strat = least_memory_candidate(case, candidates)
    return RowResult(
        row_id=case.row_id, group=case.group, source=case.source, status=case.measured_status, framework=case.training.framework,
        device_family=family, measured_step_s=case.measured_step_s, predicted_step_s=est.step_time_s if est is not None else None,
        fits=fits, failure=failure, strategy=strat, estimate=est, assumptions=case.assumptions, measured_from=case.measured_from,
        measured_tflops=case.measured_tflops, measured_memory_GB=case.measured_memory_GB, section=case.section,
    )


def evaluate_all(pinned: dict[str, Strategy] | None = None) -> list[RowResult]:
    """Every end-to-end row (``pinned``: a row id → the one candidate to cost, e.g. the best
    strategy found once, so that a calibration loop does not re-search the unknown knobs)."""
    out = []
    for case in all_rows():
        if pinned is not None and isinstance(case, PublishedCase) and case.row_id in pinned:
            out.append(evaluate_case(case, [pinned[case.row_id]]))
        else:
            out.append(evaluate_case(case))
    return out


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman rank correlation (average ranks for ties)."""

    def ranks(v: Sequence[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2.0
            i = j + 1
        return r

    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    var = math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    return cov / var if var else 0.0


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile ``q`` in [0, 1]."""
    v = sorted(values)
    if not v:
        return float("nan")
    pos = q * (len(v) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def conformal_quantile(values: Sequence[float], q: float) -> float:
    """Finite-sample (split-conformal) quantile ``q`` in (0, 1) of held-out residuals: the
    ⌈(n+1)·q⌉-th smallest for an upper bound, the ⌊(n+1)·q⌋-th for a lower one (clamped to the
    sample).  With n exchangeable residuals a new one falls at or below the ⌈(n+1)·q⌉-th with
    probability ≥ q (Vovk et al. 2005; Lei et al. 2018, "Distribution-free predictive inference
    for regression", §2.2), where the interpolated sample quantile (:func:`quantile`) covers
    less than q on the small regimes (5–20 rows) the intervals are built from."""
    v = sorted(values)
    if not v:
        return float("nan")
    n = len(v)
    pos = q * (n + 1) - 1  # 0-based order statistic
    i = math.ceil(pos) if q > 0.5 else math.floor(pos)
    return v[min(max(i, 0), n - 1)]


def summarise(results: Iterable[RowResult], errors: dict[str, float] | None = None) -> dict[str, Any]:
    """Median/p90 |error| overall and per source, failures, OOM agreement, BLOOM sweep
    Spearman.  ``errors`` (row id → error) overrides the rows' own (cross-validated errors)."""
    results = list(results)

    def err(r: RowResult) -> float | None:
        return errors.get(r.row_id) if errors is not None else r.error

    ok = [r for r in results if r.status == "ok" and err(r) is not None]
    abs_e = [abs(err(r)) for r in ok]  # type: ignore[arg-type]
    by_source: dict[str, Any] = {}
    for src in sorted({r.source for r in results}):
        rows = [r for r in ok if r.source == src]
        if rows:
            e = [x for x in (err(r) for r in rows) if x is not None]
            by_source[src] = {"rows": len(rows), "median_abs_error": round(statistics.median(abs(x) for x in e), 4), "median_error": round(statistics.median(e), 4)}
    failures = [{"id": r.row_id, "group": r.group, "reason": r.failure} for r in results if r.status == "ok" and (r.predicted_step_s is None or r.fits is False)]
    ooms = [r for r in results if r.status == "OOM"]
    sweep = [r for r in ok if r.group == "BLOOM176B_topology_sweep" and r.measured_tflops]
    rho = spearman([r.measured_tflops for r in sweep], [r.measured_tflops / (1 + err(r)) for r in sweep]) if len(sweep) > 2 else None  # type: ignore[operator,misc]
    # The sweep's rows are snapshots across software changes: rank within one section and date
    # (data/SOURCES.md), then average the sections' Spearman weighted by their rows.
    sections: dict[str, list[RowResult]] = {}
    for r in sweep:
        sections.setdefault(r.section or "", []).append(r)
    ranked = [(len(v), spearman([r.measured_tflops for r in v], [r.measured_tflops / (1 + err(r)) for r in v])) for v in sections.values() if len(v) >= 4]  # type: ignore[operator,misc]
    rho_sections = sum(n * x for n, x in ranked) / sum(n for n, _ in ranked) if ranked else None
    # The reachable ceiling for a predictor that sees only the parallel layout: rank each row by
    # the mean measured TFLOP/s of the sweep's rows with its (tp, pp, dp, micro-batch) — the
    # rest of the sweep's spread comes from model shapes (layers, hidden, heads) and dates.
    layouts: dict[tuple[int, int, int, int], list[float]] = {}
    for r in sweep:
        if r.strategy is not None:
            layouts.setdefault((r.strategy.tp, r.strategy.pp, r.strategy.dp, r.strategy.micro_batch_size), []).append(r.measured_tflops)  # type: ignore[arg-type]
    laid = [r for r in sweep if r.strategy is not None]
    rho_ceiling = spearman([r.measured_tflops for r in laid], [statistics.fmean(layouts[(r.strategy.tp, r.strategy.pp, r.strategy.dp, r.strategy.micro_batch_size)]) for r in laid]) if len(laid) > 2 else None  # type: ignore[misc,union-attr]
    measured_fit = [r for r in results if r.status == "ok" and r.fits is not None]
    mem_e = [r.memory_error for r in results if r.memory_error is not None]
    return {
        "rows_predicted": len(ok),
        "median_abs_error": round(statistics.median(abs_e), 4) if abs_e else None,
        "p90_abs_error": round(quantile(abs_e, 0.9), 4) if abs_e else None,
        "mean_abs_error": round(statistics.fmean(abs_e), 4) if abs_e else None,
        "by_source": by_source,
        "failed_to_plan": failures,
        "measured_runs_predicted_to_fit": f"{sum(bool(r.fits) for r in measured_fit)}/{len(measured_fit)}",
        "oom_rows": [{"id": r.row_id, "predicted_fit": bool(r.fits)} for r in ooms],
        "oom_predicted_not_to_fit": f"{sum(not r.fits for r in ooms)}/{len(ooms)}",
        "memory_rows": len(mem_e),
        "memory_median_abs_error": round(statistics.median(abs(x) for x in mem_e), 4) if mem_e else None,
        "memory_median_error": round(statistics.median(mem_e), 4) if mem_e else None,
        "bloom_sweep_rows": len(sweep),
        "bloom_sweep_spearman": round(rho, 4) if rho is not None else None,
        "bloom_sweep_spearman_within_sections": round(rho_sections, 4) if rho_sections is not None else None,
        "bloom_sweep_sections_ranked": sum(n for n, _ in ranked),
        "bloom_sweep_spearman_layout_ceiling": round(rho_ceiling, 4) if rho_ceiling is not None else None,
    }


def layer_table4() -> list[dict[str, Any]]:
    """Korthikanti et al. 2022 Table 4: one 22B layer (tp 8, mbs 4) forward/backward times."""
    from cost_model.cluster import cluster_from_dict
    from cost_model.comm import Links
    from cost_model.transformer.layer_cost import StrategyArrays, layer_costs
    from cost_model.validation.published import load_rows

    out = []
    for row in load_rows():
        if row["kind"] != "single_layer_fwd_bwd_time":
            continue
        p = row["parallel"]
        model = gpt_model(row["model"])
        training = Training(global_batch_size=p["micro_batch_size"], sequence_length=row["model"]["seq_len"], dtype="fp16", attention="unfused")
        cluster = cluster_from_dict({"name": "dgx", "node_groups": [{"name": "g", "count": 1, "gpus_per_node": 8, "device": "A100-SXM4-80GB"}]})
        g = cluster.node_groups[0]
        rc = p["activation_recompute"]
        strategy = Strategy(tp=p["tp"], micro_batch_size=p["micro_batch_size"], sequence_parallel=bool(p["sequence_parallel"]), recompute=rc)
        S = StrategyArrays.from_strategies([strategy])
        lc = layer_costs(model, training, g.device, Links.for_group(g), S)
        n_coll = 4 + (2 if rc == "full" else 0)
        fwd = float(lc.forward_compute_s[0] + 2 * lc.tp_comm_s[0] / n_coll)
        bwd = float(lc.total_s[0]) - fwd
        other = row["measured"]["other"]
        out.append(
            {
                "config": row["id"].split("layer-")[-1],
                "forward_ms": round(fwd * 1e3, 3),
                "backward_ms": round(bwd * 1e3, 3),
                "measured_forward_ms": other["forward_ms"],
                "measured_backward_ms": other["backward_ms"],
                "forward_error": round(fwd * 1e3 / other["forward_ms"] - 1, 4),
                "backward_error": round(bwd * 1e3 / other["backward_ms"] - 1, 4),
            }
        )
    return out



