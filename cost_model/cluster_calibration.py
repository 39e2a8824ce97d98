"""Per-cluster recalibration from observed runs: a few constants, a Gaussian prior, a MAP fit.

The public calibration (``cost_model.transformer.calibration``, fitted to published runs) is
what every cluster starts from.  A cluster's own observed step times then move a few
multipliers of the device-family efficiencies (:class:`cost_model.devices.Efficiency`) — never
anything per model, per plan or per run:

* ``gemm_efficiency.<family>`` — × ``gemm_max_fraction`` (how close this cluster's GEMMs get to
  the peak: clocks, power caps, the library build);
* ``memory_efficiency.<family>`` — × ``memory_fraction`` (elementwise work's share of the
  memory bandwidth);
* ``dispatch_overhead.<family>`` — × ``kernel_overhead_s`` (the fixed cost of one operator:
  launch latency on a GPU, framework dispatch on a CPU);
* ``intra_node_efficiency.<family>`` — × ``nvlink_fraction`` (NVLink / PCIe / shared memory
  collectives inside a node);
* ``fabric_efficiency.<fabric>`` — × ``nic_fraction`` (the inter-node fabric: congestion,
  rails, adaptive routing);
* ``framework_efficiency.<framework>`` — × ``gemm_max_fraction`` of every device the
  framework drives (its kernels beyond the public ``framework_gemm_efficiency``).

On a GPU the fractions stay ≤ 1 (a multiplier is bounded by ``1 / fraction``); a CPU's catalog
peak and bandwidth are generic guesses (``cost_model.devices.local_cpu_spec``), so its
multipliers are not bounded: they absorb the guess.  A constant enters a fit only
when an observation depends on it (the device families its stages ran on, a fabric only across
nodes, intra-node links only with more than one device per node).

**Fit (MAP = regularised least squares in log space).**  With θ the log multipliers, r_i(θ) =
log(predicted_i(θ) / observed_i) for observation i, the posterior under a Gaussian prior
θ ~ N(0, σ_p²·I) (the public calibration: multiplier 1) and Gaussian log-errors of spread σ_o
is maximised by minimising ``Σ r_i(θ)²/σ_o² + Σ θ_j²/σ_p²`` — least squares regularised
toward the public constants, so one observation moves them only as far as it outweighs the
prior.  Minimised as the public calibration is (``cost_model.validation.calibration_fit``): each
observation's log-prediction response to each constant is tabulated once, at the public point,
on the public fit's ``RESPONSE_GRID`` (:func:`response_table`, stored with the observation);
log-responses are taken as additive over constants; coordinate descent over ``SEARCH_GRID``
minimises the objective (with the prior term added) on that surface — a grid scan, because
hidden communication makes the response kinked (a faster link changes nothing, a slower one
exposes it) where a gradient step would stall.  The reported residuals are recomputed by the
cost model itself at the fitted constants.  σ_p = :data:`PRIOR_LOG_SD` (a factor e^0.5 ≈ 1.65
at one σ: the catalog's efficiencies are set per family, a given cluster can sit far off
them); σ_o = the public cross-validated spread of the regime, ``(q90 − q10) / 2.563`` of its
step-time interval (pooled when the regime has none).

The grid optimum is then refined by a few damped Gauss–Newton steps on the cost model itself
(central differences), which drops the additivity assumption: the constants interact (slower
GEMMs hide more of a slow fabric).  The link constants, whose response is kinked, are then
scanned once more on the cost model itself (a few multiples each; the MAP objective decides)
and, when that moved them, refined again.

**Uncertainty.**  Laplace approximation: posterior covariance Σ = (JᵀJ/σ_o² + I/σ_p²)⁻¹, J the
cost model's Jacobian at the fit.  The
residual spread of the cluster is estimated from its own leave-one-out residuals (linearised
at the MAP: r_i / (1 − h_ii), h_ii = J_i Σ J_iᵀ / σ_o², exact for a linear model) shrunk toward
the public spread with :data:`PRIOR_PSEUDO_OBSERVATIONS` pseudo-observations:
s² = (ν₀·σ_o² + Σ r_loo²) / (ν₀ + n).  A new plan's 80% interval is
``step · exp(±1.2816 · sqrt(j Σ jᵀ + s²))`` with j its own sensitivity to the constants: it
shrinks as the cluster's evidence accumulates (Σ → 0, s → the cluster's own residual spread).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from cost_model.cluster import Cluster
from cost_model.devices import Efficiency
from cost_model.strategy import Strategy
from cost_model.training import Training
from cost_model.transformer.calibration import step_interval_log
from cost_model.validation.calibration_fit import RESPONSE_GRID, SEARCH_GRID

#: Prior standard deviation of each log multiplier.
PRIOR_LOG_SD = 0.5
#: Weight (in observations) of the public residual spread in the cluster's residual spread.
PRIOR_PSEUDO_OBSERVATIONS = 2.0
#: The 90th percentile of the standard normal: an 80% central interval is ±Z80 σ.
Z80 = 1.2815515655446004
#: Floor of σ_o: no observation is trusted to better than this log-spread (run-to-run noise).
MIN_OBS_LOG_SD = 0.03
#: Lower bound of every multiplier (a device at 5% of its catalog efficiency is a broken one).
MIN_MULTIPLIER = 0.05
#: Finite-difference step in log space of a new plan's sensitivity.
DIFF_STEP = 0.05

KINDS = ("gemm_efficiency", "memory_efficiency", "dispatch_overhead", "intra_node_efficiency", "fabric_efficiency", "framework_efficiency")


@dataclass(frozen=True, kw_only=True)
class ObservedRun:
    """One observation as the fit sees it: what was planned (the cluster with any profile
    applied, the strategy and the stages' node groups) and the observed median step time."""

    model: Any
    training: Training
    cluster: Cluster
    strategy: Strategy
    stage_groups: tuple[str, ...] | None = None
    observed_step_s: float
    key: str = ""


def constants_for(run: ObservedRun) -> list[str]:
    """The constants ``run``'s prediction depends on (module docstring)."""
    groups = [g for g in run.cluster.node_groups if run.stage_groups is None or g.name in set(run.stage_groups)]
    names: list[str] = []
    for g in groups:
        fam = g.device.family
        names += [f"gemm_efficiency.{fam}", f"memory_efficiency.{fam}", f"dispatch_overhead.{fam}"]
        if g.gpus_per_node > 1 and run.strategy.num_devices > 1:
            names.append(f"intra_node_efficiency.{fam}")
        if run.strategy.num_devices > g.gpus_per_node:
            names.append(f"fabric_efficiency.{g.fabric}")
    names.append(f"framework_efficiency.{run.training.framework}")
    return sorted(set(names))


def _scaled(eff: Efficiency, family: str, fabric: str, framework: str | None, values: Mapping[str, float], cap: float) -> Efficiency:
    def m(name: str) -> float:
        return float(values.get(name, 1.0))

    gemm = m(f"gemm_efficiency.{family}") * (m(f"framework_efficiency.{framework}") if framework else 1.0)
    return replace(
        eff,
        gemm_max_fraction=min(cap, eff.gemm_max_fraction * gemm),
        memory_fraction=min(cap, eff.memory_fraction * m(f"memory_efficiency.{family}")),
        kernel_overhead_s=eff.kernel_overhead_s * m(f"dispatch_overhead.{family}"),
        nvlink_fraction=min(cap, eff.nvlink_fraction * m(f"intra_node_efficiency.{family}")),
        nic_fraction=min(cap, eff.nic_fraction * m(f"fabric_efficiency.{fabric}")),
        source=f"{eff.source}; cluster-calibrated",
    )


def apply_constants(cluster: Cluster, values: Mapping[str, float], framework: str | None = None) -> Cluster:
    """The cluster with every node group's device efficiency scaled by ``values`` (multipliers;
    absent names are 1).  ``framework``: the training's, for ``framework_efficiency``."""
    if not values or all(v == 1.0 for v in values.values()):
        return cluster
    groups = tuple(
        replace(g, device=replace(g.device, efficiency=_scaled(g.device.efficiency, g.device.family, g.fabric, framework, values,
                                                              1.0 if g.device.kind == "gpu" else math.inf)))
        for g in cluster.node_groups
    )
    return replace(cluster, node_groups=groups)


def upper_bound(name: str, run: ObservedRun) -> float:
    """The largest multiplier that keeps the fraction it scales ≤ 1 on ``run``'s devices."""
    kind, _, key = name.partition(".")
    fracs: list[float] = []
    for g in run.cluster.node_groups:
        e = g.device.efficiency
        if g.device.kind != "gpu":
            continue
        if kind in ("gemm_efficiency", "framework_efficiency") and (kind == "framework_efficiency" or g.device.family == key):
            fracs.append(e.gemm_max_fraction)
        elif kind == "memory_efficiency" and g.device.family == key:
            fracs.append(e.memory_fraction)
        elif kind == "intra_node_efficiency" and g.device.family == key:
            fracs.append(e.nvlink_fraction)
        elif kind == "fabric_efficiency" and g.fabric == key:
            fracs.append(e.nic_fraction)
    return 1.0 / max(fracs) if fracs and max(fracs) > 0 else math.inf


StepFn = Callable[[ObservedRun, Mapping[str, float]], float]


def predicted_step_s(run: ObservedRun, values: Mapping[str, float]) -> float:
    """The cost model's step time (s) of ``run``'s plan with the cluster constants ``values``
    (``cost_model.estimate`` of the same strategy on the same stages)."""
    from cost_model.estimate import estimate

    cluster = apply_constants(run.cluster, values, run.training.framework)
    est = estimate(run.model, run.training, cluster, run.strategy, stage_groups=run.stage_groups, spread_single_source=False)
    return float(est.step_time_s)


def obs_log_sd(framework: str, family: str) -> float:
    """σ_o: the public cross-validated log-spread of the regime (module docstring)."""
    q = step_interval_log(framework, family)
    if q is None:
        return 0.15
    return max(MIN_OBS_LOG_SD, (q[1] - q[0]) / (2.0 * Z80))


@dataclass(frozen=True, kw_only=True)
class ClusterFit:
    """The fitted multipliers and what they rest on."""

    values: dict[str, float]
    names: tuple[str, ...]
    log_sd: dict[str, float]
    covariance: tuple[tuple[float, ...], ...]
    residuals: tuple[float, ...]
    loo_residuals: tuple[float, ...]
    prior_residuals: tuple[float, ...]
    residual_log_sd: float
    obs_log_sd: float
    prior_log_sd: float
    iterations: int
    keys: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "constants": dict(self.values),
            "names": list(self.names),
            "log_sd": dict(self.log_sd),
            "covariance": [list(r) for r in self.covariance],
            "residuals": list(self.residuals),
            "loo_residuals": list(self.loo_residuals),
            "prior_residuals": list(self.prior_residuals),
            "residual_log_sd": self.residual_log_sd,
            "obs_log_sd": self.obs_log_sd,
            "prior_log_sd": self.prior_log_sd,
            "iterations": self.iterations,
            "observation_keys": list(self.keys),
        }


def response_table(run: ObservedRun, step: StepFn = predicted_step_s) -> dict[str, Any]:
    """``run``'s log-prediction response to each constant it depends on, tabulated at the public
    point over :data:`RESPONSE_GRID` (multiples of 1; the others at 1) — what the public
    calibration tabulates per published row.  Computed once per observation and stored."""
    base = step(run, {})
    curves: dict[str, list[float]] = {}
    for name in constants_for(run):
        curves[name] = [0.0 if g == 1.0 else math.log(step(run, {name: g}) / base) for g in RESPONSE_GRID]
    return {"base_step_s": base, "grid": list(RESPONSE_GRID), "curves": curves}


_LOG_GRID = np.log(np.array(RESPONSE_GRID))


def _delta(curve: Sequence[float], log_m: float) -> float:
    return float(np.interp(log_m, _LOG_GRID, np.asarray(curve)))


def _model_residuals(r0: np.ndarray, tables: Sequence[Mapping[str, Any]], names: Sequence[str], theta: np.ndarray) -> np.ndarray:
    out = r0.copy()
    for i, t in enumerate(tables):
        for j, n in enumerate(names):
            c = t["curves"].get(n)
            if c is not None:
                out[i] += _delta(c, theta[j])
    return out


def _coordinate_descent(r0: np.ndarray, tables: Sequence[Mapping[str, Any]], names: Sequence[str], theta: np.ndarray, hi: np.ndarray,
                        obs_sd: float, prior_sd: float, passes: int = 4) -> np.ndarray:
    """Minimise the MAP objective over the tabulated (log-additive) response surface, one
    constant at a time over :data:`SEARCH_GRID` (as the public fit does, plus the prior term):
    a grid scan finds an optimum across the kinks of hidden communication that a local
    gradient step cannot see."""
    theta = theta.copy()
    log_search = np.log(np.array(SEARCH_GRID))
    for _ in range(passes):
        for j, n in enumerate(names):
            rows = [i for i, t in enumerate(tables) if n in t["curves"]]
            if not rows:
                continue
            theta[j] = 0.0
            rest = _model_residuals(r0, tables, names, theta)[rows]
            best, best_cost = theta[j], math.inf
            for lg in log_search:
                if lg > hi[j]:
                    continue
                res = rest + np.array([_delta(tables[i]["curves"][n], float(lg)) for i in rows])
                cost = float(res @ res) / obs_sd**2 + float(lg) ** 2 / prior_sd**2
                if cost < best_cost - 1e-15:
                    best, best_cost = float(lg), cost
            theta[j] = best
    return theta


def _residuals(runs: Sequence[ObservedRun], names: Sequence[str], theta: np.ndarray, step: StepFn) -> np.ndarray:
    values = {n: float(math.exp(t)) for n, t in zip(names, theta, strict=True)}
    return np.array([math.log(step(r, values) / r.observed_step_s) for r in runs])


def _jacobian(runs: Sequence[ObservedRun], names: Sequence[str], theta: np.ndarray, r0: np.ndarray, lo: np.ndarray, hi: np.ndarray,
              step: StepFn) -> np.ndarray:
    """∂r_i/∂θ_j of the cost model itself, central differences (one-sided at a bound)."""
    jac = np.zeros((len(runs), len(names)))
    for j in range(len(names)):
        up, down = theta[j] + DIFF_STEP <= hi[j], theta[j] - DIFF_STEP >= lo[j]
        t_up, t_down = theta.copy(), theta.copy()
        t_up[j] += DIFF_STEP if up else 0.0
        t_down[j] -= DIFF_STEP if down else 0.0
        r_up = _residuals(runs, names, t_up, step) if up else r0
        r_down = _residuals(runs, names, t_down, step) if down else r0
        jac[:, j] = (r_up - r_down) / ((t_up[j] - t_down[j]) or 1.0)
    return jac


def _gauss_newton(runs: Sequence[ObservedRun], names: Sequence[str], theta: np.ndarray, lo: np.ndarray, hi: np.ndarray, obs_sd: float,
                  prior_sd: float, step: StepFn, iterations: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Refine θ on the cost model itself (no additivity assumption: the constants interact, e.g.
    slower GEMMs hide more of a slow fabric), damped and within the bounds.  Returns θ, the
    residuals, the Jacobian there and the iterations taken."""
    prec = np.eye(len(names)) / prior_sd**2

    def objective(t: np.ndarray, res: np.ndarray) -> float:
        return float(res @ res / obs_sd**2 + t @ prec @ t)

    r = _residuals(runs, names, theta, step)
    jac = _jacobian(runs, names, theta, r, lo, hi, step)
    done = 0
    for done in range(1, iterations + 1):  # noqa: B007 - the count is returned
        a = jac.T @ jac / obs_sd**2 + prec
        new = np.clip(theta - np.linalg.solve(a, jac.T @ r / obs_sd**2 + prec @ theta), lo, hi)
        cur = objective(theta, r)
        for _ in range(5):  # halve the step until the MAP objective does not rise
            r_new = _residuals(runs, names, new, step)
            if objective(new, r_new) <= cur + 1e-12:
                break
            new = theta + 0.5 * (new - theta)
        else:
            break
        moved = float(np.max(np.abs(new - theta))) if len(names) else 0.0
        theta, r = new, r_new
        jac = _jacobian(runs, names, theta, r, lo, hi, step)
        if moved < 2e-3:
            break
    return theta, r, jac, done


#: Gauss–Newton refinements on the cost model after the tabulated grid search.
REFINE_ITERATIONS = 3
#: Constants whose response is kinked (communication hidden behind compute until a link is slow
#: enough): scanned again on the cost model itself after the refinement.
KINKED_KINDS = ("fabric_efficiency", "intra_node_efficiency")
#: The multiples of the current value that scan visits.
SCAN_MULTIPLES = (0.25, 0.35, 0.5, 0.7, 0.85, 1.2)


def _exact_scan(runs: Sequence[ObservedRun], names: Sequence[str], theta: np.ndarray, r: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                obs_sd: float, prior_sd: float, step: StepFn) -> tuple[np.ndarray, np.ndarray, bool]:
    """One pass over the kinked constants: each at a few multiples of its value, the others
    fixed, on the cost model itself; the best MAP objective wins.  The tabulated surface is
    built at the public point, where a link may look hidden that the fitted (slower) compute
    exposes, or the reverse: a local step cannot cross that kink, a scan can."""
    def objective(t: np.ndarray, res: np.ndarray) -> float:
        return float(res @ res / obs_sd**2 + t @ t / prior_sd**2)

    best = objective(theta, r)
    moved = False
    for j, n in enumerate(names):
        if n.partition(".")[0] not in KINKED_KINDS:
            continue
        for mult in SCAN_MULTIPLES:
            t = theta.copy()
            t[j] = float(np.clip(theta[j] + math.log(mult), lo[j], hi[j]))
            if t[j] == theta[j]:
                continue
            res = _residuals(runs, names, t, step)
            cost = objective(t, res)
            if cost < best - 1e-9:
                best, theta, r, moved = cost, t, res, True
    return theta, r, moved


def fit_cluster(runs: Sequence[ObservedRun], step: StepFn = predicted_step_s, prior_sd: float = PRIOR_LOG_SD,
                obs_sd: float | None = None, tables: Sequence[Mapping[str, Any]] | None = None) -> ClusterFit:
    """MAP fit of the constants ``runs`` depend on (module docstring).  ``tables``: each run's
    stored :func:`response_table` (computed here when absent).  Deterministic."""
    if not runs:
        raise ValueError("no observed runs to fit")
    tables = list(tables) if tables is not None else [response_table(r, step) for r in runs]
    names = sorted({n for t in tables for n in t["curves"]})
    if obs_sd is None:
        obs_sd = obs_log_sd(runs[0].training.framework, runs[0].cluster.node_groups[0].device.family)
    hi = np.array([math.log(min(upper_bound(n, r) for r in runs)) for n in names])
    r0 = np.array([math.log(float(t["base_step_s"]) / r.observed_step_s) for r, t in zip(runs, tables, strict=True)])
    lo = np.full(len(names), math.log(MIN_MULTIPLIER))
    theta = _coordinate_descent(r0, tables, names, np.zeros(len(names)), hi, obs_sd, prior_sd)
    theta, exact, jac, refined = _gauss_newton(runs, names, theta, lo, hi, obs_sd, prior_sd, step, REFINE_ITERATIONS)
    theta, exact, scanned = _exact_scan(runs, names, theta, exact, lo, hi, obs_sd, prior_sd, step)
    if scanned:  # a kink crossed: refine again from there
        theta, exact, jac, more = _gauss_newton(runs, names, theta, lo, hi, obs_sd, prior_sd, step, REFINE_ITERATIONS)
        refined += more
    values = {n: float(math.exp(t)) for n, t in zip(names, theta, strict=True)}
    cov = np.linalg.inv(jac.T @ jac / obs_sd**2 + np.eye(len(names)) / prior_sd**2)
    hat = np.einsum("ij,jk,ik->i", jac, cov, jac) / obs_sd**2
    loo = exact / np.maximum(1e-6, 1.0 - hat)
    n = len(runs)
    s2 = (PRIOR_PSEUDO_OBSERVATIONS * obs_sd**2 + float(loo @ loo)) / (PRIOR_PSEUDO_OBSERVATIONS + n)
    return ClusterFit(
        values={nm: round(v, 6) for nm, v in values.items()},
        names=tuple(names),
        log_sd={nm: round(float(math.sqrt(cov[j, j])), 6) for j, nm in enumerate(names)},
        covariance=tuple(tuple(float(x) for x in row) for row in cov),
        residuals=tuple(float(x) for x in exact),
        loo_residuals=tuple(float(x) for x in loo),
        prior_residuals=tuple(float(x) for x in r0),
        residual_log_sd=float(math.sqrt(s2)),
        obs_log_sd=float(obs_sd),
        prior_log_sd=float(prior_sd),
        iterations=refined,
        keys=tuple(rr.key for rr in runs),
    )


def sensitivity(run: ObservedRun, values: Mapping[str, float], names: Sequence[str], step: StepFn = predicted_step_s) -> np.ndarray:
    """∂ log step / ∂ log multiplier of ``run``'s plan at ``values`` (central differences)."""
    out = np.zeros(len(names))
    for j, n in enumerate(names):
        logs = []
        for sign in (1.0, -1.0):
            v = dict(values)
            v[n] = float(values.get(n, 1.0) * math.exp(sign * DIFF_STEP))
            logs.append(math.log(step(run, v)))
        out[j] = (logs[0] - logs[1]) / (2.0 * DIFF_STEP)
    return out


def predictive_log_sd(fit: Mapping[str, Any], j: np.ndarray) -> float:
    """Log-sd of a new plan's step time under the fitted calibration ``fit`` (a stored
    :meth:`ClusterFit.to_dict`), ``j`` its sensitivity to ``fit['names']``."""
    cov = np.array(fit.get("covariance") or [[0.0]])
    var_params = float(j @ cov @ j) if len(j) and cov.shape == (len(j), len(j)) else 0.0
    return math.sqrt(max(0.0, var_params) + float(fit.get("residual_log_sd", 0.0)) ** 2)


def interval(step_s: float, log_sd: float) -> tuple[float, float]:
    """The 80% interval (p10, p90) of a step time with log-sd ``log_sd``."""
    return step_s * math.exp(-Z80 * log_sd), step_s * math.exp(Z80 * log_sd)


__all__ = [
    "KINDS",
    "PRIOR_LOG_SD",
    "ClusterFit",
    "ObservedRun",
    "apply_constants",
    "constants_for",
    "fit_cluster",
    "interval",
    "predicted_step_s",
    "predictive_log_sd",
    "sensitivity",
]
