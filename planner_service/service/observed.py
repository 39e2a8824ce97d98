"""Observed runs flow back: record an observation of a plan, recalibrate its cluster, say
whether a better plan exists now.

* :meth:`ObservationService.record` — parse the log (``planner_service.observations``), refuse a
  log of another model or layout (422 naming what differs), store the observation beside the
  plan's prediction (the plan itself is never changed) and recalibrate the cluster.
* :meth:`ObservationService.recalibrate` — every observation of the cluster (this tenant's) is
  re-costed by the cost model and :func:`cost_model.cluster_calibration.fit_cluster` fits the
  cluster's constants with the public calibration as the prior; the result is stored as the
  cluster's next calibration version, with its residuals and leave-one-out cross-validation.
* :meth:`ObservationService.suggestion` — the plan re-costed at the latest calibration and the
  planner's best plan under it: offered when it is better by more than the interval, or when
  the observed memory says the plan is tight (then planned with more headroom).

The cluster key is the plan's cluster name (a saved cluster's name, or an inline cluster's
``name``): plans on the same named cluster share its calibration.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from cost_model.cluster_calibration import (
    Z80,
    ObservedRun,
    apply_constants,
    fit_cluster,
    interval,
    predicted_step_s,
    predictive_log_sd,
    response_table,
    sensitivity,
)
from cost_model.errors import InvalidInput, NoFeasiblePlan, PlannerError
from cost_model.strategy import strategy_from_dict
from cost_model.transformer.memory import as_printed_GB
from planner_service.observations import check_matches, observed_peak_GB, parse_log, plan_facts, summarize
from planner_service.planner.request import PlanRequest
from planner_service.storage.observations import ObservationStore, StoredCalibration, StoredObservation
from planner_service.storage.repository import StoredPlan

log = logging.getLogger("planner.observed")

#: Observed peak memory (reserved, else allocated) at or above this fraction of the device's
#: memory makes a plan "tight": one more fragmentation spike or a longer sequence OOMs it.
MEMORY_TIGHT_FRACTION = 0.95
#: The memory use a re-plan for a tight plan aims at (fraction of the device's memory).
MEMORY_TARGET_FRACTION = 0.88
#: Most headroom a re-plan asks for (the planner's own limit is < 0.9).
MAX_HEADROOM = 0.85


def cluster_key(plan: StoredPlan) -> str:
    return plan.cluster_name


def plan_calibration(plan: StoredPlan) -> dict[str, Any]:
    """The calibration a stored plan was costed with (version 0: the public one)."""
    c = plan.result.get("calibration")
    return dict(c) if isinstance(c, Mapping) else {"cluster": plan.cluster_name, "version": 0, "source": "public"}


def _best(plan: StoredPlan) -> Mapping[str, Any]:
    best = plan.result.get("best")
    if not isinstance(best, Mapping) or not isinstance(best.get("strategy"), Mapping):
        raise InvalidInput("the plan has no best candidate to compare with", field="plan_id")
    return best


def _predicted(plan: StoredPlan) -> dict[str, Any]:
    p = _best(plan).get("prediction") or {}
    peaks = p.get("peak_memory_GB") or []
    peak = max(peaks) if isinstance(peaks, list) and peaks else None
    mem_p90 = p.get("peak_memory_GB_p90")
    if isinstance(mem_p90, list):
        mem_p90 = max(mem_p90) if mem_p90 else None
    return {
        "step_time_s": p.get("step_time_s"),
        "step_time_s_p10": p.get("step_time_s_p10"),
        "step_time_s_p90": p.get("step_time_s_p90"),
        "peak_memory_GB": peak,
        "peak_memory_GB_p90": mem_p90,
        "tokens_per_s": p.get("tokens_per_s"),
        "calibration_version": plan_calibration(plan).get("version", 0),
    }


def _memory_capacity_GB(plan: StoredPlan) -> float | None:
    caps = [s.get("memory_capacity_GB") for s in _best(plan).get("stages") or [] if isinstance(s, Mapping)]
    caps = [c for c in caps if isinstance(c, (int, float))]
    return min(caps) if caps else None


class ObservationService:
    """Observations and calibrations of one tenant (the plan service's repository view)."""

    def __init__(self, plans: Any) -> None:
        self.plans = plans  # PlanService (typed loosely: service.plans imports this module)
        self.store = ObservationStore(plans.repo)

    # ---------------------------------------------------------------- what a plan was
    def _request(self, canonical: Mapping[str, Any]) -> PlanRequest:
        req: PlanRequest = self.plans.with_profile(self.plans.parse(canonical))
        return req

    def _run(self, basis: Mapping[str, Any], observed_step_s: float, key: str = "") -> ObservedRun:
        req = self._request(basis["request"])
        groups = basis.get("stage_groups")
        return ObservedRun(model=req.model, training=req.training, cluster=req.cluster, strategy=strategy_from_dict(basis["strategy"]),
                           stage_groups=tuple(groups) if groups else None, observed_step_s=observed_step_s, key=key)

    @staticmethod
    def _basis(plan: StoredPlan) -> dict[str, Any]:
        best = _best(plan)
        groups = [s.get("node_group") for s in best.get("stages") or [] if isinstance(s, Mapping)]
        return {"request": plan.request, "strategy": dict(best["strategy"]),
                "stage_groups": groups if groups and all(isinstance(g, str) for g in groups) else None}

    # ---------------------------------------------------------------- record
    def record(self, plan_id: str, log_text: str, fmt: str = "auto", warmup_steps: int | None = None) -> dict[str, Any]:
        """Parse, check against the plan, store, recalibrate.  Returns the observation with the
        calibration it produced."""
        plan = self.plans.repo.get_plan(plan_id)
        basis = self._basis(plan)
        req = self._request(plan.request)
        strategy = strategy_from_dict(basis["strategy"])
        facts = plan_facts(req.model, req.training, strategy)
        parsed = parse_log(log_text, fmt)
        check_matches(parsed, facts)
        summary = summarize(parsed, facts, warmup_steps)
        # the fit's input, tabulated once: this run's response to each cluster constant
        basis["response"] = response_table(self._run(basis, summary["step_time_s"]))
        predicted = _predicted(plan)
        if isinstance(predicted.get("step_time_s"), (int, float)):
            summary["step_error_fraction"] = (predicted["step_time_s"] - summary["step_time_s"]) / summary["step_time_s"]
        obs = self.store.add(plan_id=plan.id, cluster_key=cluster_key(plan), format=parsed.format, step_time_s=summary["step_time_s"],
                             summary=summary, predicted=predicted, basis=basis, calibration_version=int(predicted["calibration_version"] or 0))
        calibration = self.recalibrate(cluster_key(plan))
        return {**obs.to_dict(), "calibration": self.calibration_brief(calibration)}

    def list_for_plan(self, plan_id: str) -> list[dict[str, Any]]:
        self.plans.repo.get_plan(plan_id)  # 404 for an unknown (or another tenant's) plan
        return [o.to_dict() for o in self.store.for_plan(plan_id)]

    # ---------------------------------------------------------------- recalibrate
    def recalibrate(self, key: str) -> StoredCalibration | None:
        """Fit the cluster's constants to all its observations and store the next version
        (None when no observation of it can be re-costed)."""
        observations = self.store.for_cluster(key)
        runs, used, tables = [], [], []
        for o in observations:
            try:
                run = self._run(o.basis, o.step_time_s, key=o.id)
                tables.append(o.basis.get("response") or response_table(run))
                runs.append(run)
                used.append(o)
            except (PlannerError, KeyError, TypeError, ValueError) as exc:  # a plan whose request no longer parses (a deleted model)
                log.warning("observation %s not used in the calibration of %s: %s", o.id, key, exc)
        if not runs:
            return None
        prev = self.store.latest_calibration(key)
        fit = fit_cluster(runs, tables=tables)
        doc = fit.to_dict()
        per_obs = []
        for o, r, rl, r0 in zip(used, fit.residuals, fit.loo_residuals, fit.prior_residuals, strict=True):
            per_obs.append({"observation_id": o.id, "plan_id": o.plan_id, "created_at": o.to_dict()["created_at"], "observed_step_s": o.step_time_s,
                            "predicted_step_s": o.step_time_s * math.exp(r), "predicted_public_step_s": o.step_time_s * math.exp(r0),
                            "predicted_at_observation_s": o.predicted.get("step_time_s"), "calibration_version_at_observation": o.calibration_version,
                            "log_residual": r, "loo_log_residual": rl, "public_log_residual": r0})
        loo = [abs(math.expm1(x)) for x in fit.loo_residuals]
        public = [abs(math.expm1(x)) for x in fit.prior_residuals]
        inside = sum(abs(x) <= Z80 * fit.residual_log_sd for x in fit.loo_residuals)
        doc.update({
            "n_observations": len(runs),
            "observations": per_obs,
            "cross_validation": {
                "method": "leave-one-out, linearised at the MAP (r_i / (1 - h_ii))",
                "median_abs_step_error": statistics.median(loo),
                "median_abs_step_error_public": statistics.median(public),
                "interval_coverage": inside / len(runs),
            },
            "prior": "the public calibration (cost_model/data/calibration.json): every multiplier 1, log-sd " + f"{fit.prior_log_sd:g}",
            "method": "MAP in log space (regularised least squares), Gauss-Newton; cost_model/cluster_calibration.py",
            "previous_version": prev.version if prev else 0,
        })
        return self.store.add_calibration(key, fit.values, doc)

    @staticmethod
    def calibration_brief(c: StoredCalibration | None) -> dict[str, Any] | None:
        if c is None:
            return None
        cv = c.fit.get("cross_validation") or {}
        return {"cluster": c.cluster_key, "version": c.version, "constants": c.constants, "n_observations": c.fit.get("n_observations"),
                "residual_log_sd": c.fit.get("residual_log_sd"), "median_abs_step_error_cv": cv.get("median_abs_step_error")}

    def calibration_view(self, key: str) -> dict[str, Any]:
        """GET /v1/clusters/{name}/calibration: the latest constants, every version's, and the
        residuals of every observation at the latest fit."""
        history = self.store.calibrations(key)
        if not history:
            raise_unknown(key)
        latest = history[-1]
        return {
            "cluster": key,
            "version": latest.version,
            "constants": latest.constants,
            "log_sd": latest.fit.get("log_sd", {}),
            "residual_log_sd": latest.fit.get("residual_log_sd"),
            "n_observations": latest.fit.get("n_observations"),
            "cross_validation": latest.fit.get("cross_validation", {}),
            "prior": latest.fit.get("prior"),
            "method": latest.fit.get("method"),
            "residuals": latest.fit.get("observations", []),
            "history": [{"version": c.version, "created_at": c.to_dict()["created_at"], "constants": c.constants,
                         "n_observations": c.fit.get("n_observations"), "residual_log_sd": c.fit.get("residual_log_sd"),
                         "median_abs_step_error_cv": (c.fit.get("cross_validation") or {}).get("median_abs_step_error")} for c in history],
        }

    # ---------------------------------------------------------------- the plan page
    def observed_view(self, plan: StoredPlan) -> dict[str, Any] | None:
        """The ``observed`` block of GET /v1/plans/{id}: the latest observation beside the
        prediction and its interval (None when the plan has none)."""
        obs = self.store.for_plan(plan.id)
        if not obs:
            return None
        last: StoredObservation = obs[-1]
        s = last.summary
        p = _predicted(plan)
        step = s["step_time_s"]
        lo, hi = p.get("step_time_s_p10"), p.get("step_time_s_p90")
        peak = observed_peak_GB(s)
        return {
            "observations": len(obs),
            "latest_observation_id": last.id,
            "format": last.format,
            "step_time_s": step,
            "step_time_s_p10": s.get("step_time_s_p10"),
            "step_time_s_p90": s.get("step_time_s_p90"),
            "peak_memory_allocated_GB": s.get("peak_memory_allocated_GB"),
            "peak_memory_reserved_GB": s.get("peak_memory_reserved_GB"),
            # the peak (reserved, else allocated) in the units predictions are in (as printed, binary)
            "peak_memory_as_printed_GB": as_printed_GB(peak) if peak is not None else None,
            "tokens_per_s": s.get("tokens_per_s"),
            "predicted_step_time_s": p.get("step_time_s"),
            "predicted_step_time_s_p10": lo,
            "predicted_step_time_s_p90": hi,
            "predicted_peak_memory_GB": p.get("peak_memory_GB"),
            "step_error_fraction": (p["step_time_s"] - step) / step if isinstance(p.get("step_time_s"), (int, float)) else None,
            "within_interval": bool(lo <= step <= hi) if isinstance(lo, (int, float)) and isinstance(hi, (int, float)) else None,
            "history": [{"id": o.id, "created_at": o.to_dict()["created_at"], "step_time_s": o.step_time_s,
                         "predicted_step_time_s": o.predicted.get("step_time_s"), "calibration_version": o.calibration_version} for o in obs],
        }

    # ---------------------------------------------------------------- apply to planning
    def calibration_for(self, key: str, version: int | None = None) -> StoredCalibration | None:
        if version is not None:
            return self.store.calibration(key, version) if version > 0 else None
        return self.store.latest_calibration(key)

    # ---------------------------------------------------------------- suggestion
    def memory_pressure(self, plan: StoredPlan) -> dict[str, Any] | None:
        """Observed peak vs the device's memory and vs the prediction (None without memory)."""
        obs = self.store.for_plan(plan.id)
        peaks = [x for x in (observed_peak_GB(o.summary) for o in obs) if x is not None]
        cap = _memory_capacity_GB(plan)
        if not peaks or not cap:
            return None
        peak = max(peaks)
        # the device's memory and the prediction are in the units the allocator prints (binary):
        # compare the observed bytes in them, not in GB of 10^9 (memory.as_printed_GB)
        printed = as_printed_GB(peak)
        predicted = _predicted(plan).get("peak_memory_GB")
        return {"observed_peak_GB": peak, "observed_peak_as_printed_GB": printed, "capacity_GB": cap, "fraction": printed / cap,
                "predicted_peak_GB": predicted, "observed_over_predicted": printed / predicted if predicted else None,
                "tight": printed / cap >= MEMORY_TIGHT_FRACTION}

    def recalibrated_overrides(self, plan: StoredPlan) -> dict[str, Any]:
        """Request changes a re-plan at the latest calibration makes: more memory headroom when
        the observed memory says the plan is tight (so that predicted · observed/predicted stays
        under MEMORY_TARGET_FRACTION of the device)."""
        mem = self.memory_pressure(plan)
        if not mem or not mem["tight"] or not mem.get("observed_over_predicted"):
            return {}
        constraints = dict(plan.request.get("constraints") or {})
        h = float(constraints.get("memory_headroom_fraction") or 0.1)
        want = 1.0 - MEMORY_TARGET_FRACTION / max(1.0, float(mem["observed_over_predicted"]))
        constraints["memory_headroom_fraction"] = round(min(MAX_HEADROOM, max(h + 0.05, want)), 4)
        return {"constraints": constraints}

    def suggestion(self, plan_id: str) -> dict[str, Any]:
        """GET /v1/plans/{id}/suggestion (module docstring).  Plans, stores nothing."""
        plan = self.plans.repo.get_plan(plan_id)
        key = cluster_key(plan)
        used = plan_calibration(plan)
        latest = self.store.latest_calibration(key)
        mem = self.memory_pressure(plan)
        out: dict[str, Any] = {"plan_id": plan.id, "cluster": key, "plan_calibration_version": used.get("version", 0),
                               "latest_calibration_version": latest.version if latest else 0, "memory": mem,
                               "suggest": False, "reason": None, "current": None, "suggested": None}
        newer = latest is not None and latest.version != used.get("version", 0)
        if not newer and not (mem and mem["tight"]):
            out["reason"] = f"no calibration of cluster {key!r} newer than the plan's (version {used.get('version', 0)}) and its memory is not tight"
            return out
        # the plan's own layout at the latest calibration
        basis = self._basis(plan)
        run = self._run(basis, 1.0)
        values = latest.constants if latest else {}
        now_s = predicted_step_s(run, values)
        sd = predictive_log_sd(latest.fit, sensitivity(run, values, latest.fit.get("names", []))) if latest else 0.0
        lo, hi = interval(now_s, sd)
        out["current"] = {"strategy": basis["strategy"], "step_time_s": now_s, "step_time_s_p10": lo, "step_time_s_p90": hi,
                          "step_time_s_at_plan": _predicted(plan).get("step_time_s")}
        overrides = self.recalibrated_overrides(plan)
        prepared = self.plans.prepare({**plan.request, **overrides})
        try:
            result = self.plans.search_now(prepared.request)
        except (NoFeasiblePlan, InvalidInput) as exc:  # e.g. nothing fits with the headroom a tight plan needs
            out["reason"] = f"no plan at the latest calibration{' with more memory headroom' if overrides else ''}: {exc.message}"
            return out
        best = result.best
        new_s = float(best.prediction.step_time_s)
        new_strategy = best.strategy.to_dict()
        improvement = (now_s - new_s) / now_s
        band = 1.0 - math.exp(-Z80 * sd)
        out["suggested"] = {"strategy": new_strategy, "step_time_s": new_s, "improvement_fraction": improvement,
                            "interval_fraction": band, "request_changes": overrides,
                            "calibration_version": latest.version if latest else 0}
        same = {k: v for k, v in new_strategy.items() if k != "layers_per_stage"} == {k: v for k, v in basis["strategy"].items() if k != "layers_per_stage"}
        if mem and mem["tight"] and not same:
            out.update(suggest=True, reason=f"observed peak memory {mem['observed_peak_as_printed_GB']:.1f} GiB as the allocator prints it "
                                            f"({mem['observed_peak_GB']:.1f} GB) is {mem['fraction']:.0%} of the device's "
                                            f"{mem['capacity_GB']:.0f} GB; a layout with memory headroom "
                                            f"{overrides.get('constraints', {}).get('memory_headroom_fraction')} fits with room")
        elif not same and improvement > band:
            out.update(suggest=True, reason=f"at calibration version {latest.version if latest else 0} another layout is {improvement:.1%} faster "
                                            f"than the plan's, more than its interval ({band:.1%})")
        else:
            out["reason"] = ("the plan's layout is still the best at the latest calibration" if same else
                             f"another layout is {improvement:.1%} faster, within the interval ({band:.1%})")
        return out


def raise_unknown(key: str) -> None:
    from planner_service.storage.errors import NotFound

    raise NotFound(f"cluster {key!r} has no calibration yet: post observations of one of its plans (POST /v1/plans/{{id}}/observations)", field="name")


def calibrated_request(req: PlanRequest, calibration: StoredCalibration | None) -> PlanRequest:
    """``req`` with its cluster's devices scaled by ``calibration``'s constants; its answers'
    step-time intervals are then the cluster fit's (``calibrated_interval``), not the public
    regime's spread over the single-source constants."""
    if calibration is None:
        return req
    return replace(req, cluster=apply_constants(req.cluster, calibration.constants, req.training.framework), spread_single_source=False)


def calibrated_interval(req: PlanRequest, calibration: StoredCalibration, strategy: Any, stage_groups: tuple[str, ...] | None,
                        step_s: float) -> tuple[float, float, float]:
    """(p10, p90, log-sd) of a calibrated plan's step time (``req`` already calibrated: the
    sensitivity is taken around its constants by re-costing at perturbed multipliers)."""
    base = ObservedRun(model=req.model, training=req.training, cluster=req.cluster, strategy=strategy, stage_groups=stage_groups, observed_step_s=step_s)
    names = calibration.fit.get("names", [])
    j = sensitivity(base, {}, names)
    sd = predictive_log_sd(calibration.fit, j)
    lo, hi = interval(step_s, sd)
    return lo, hi, sd


__all__ = ["MEMORY_TIGHT_FRACTION", "ObservationService", "calibrated_interval", "calibrated_request", "cluster_key", "plan_calibration"]
