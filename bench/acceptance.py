"""Planner acceptance on published measured runs: does the planner accept what really ran,
and refuse what really ran out of memory?

Every end-to-end row of cost_model/data/published_runs.json (cost_model/validation/published.py
turns a row into a model, training — with its ``framework`` — and cluster, and lists the
layouts its stated knobs allow) is planned with **every knob the row fixes pinned**: each of tp,
pp, dp, cp, ep, micro_batch_size, vpp, sequence_parallel, recompute, zero_stage, dp_shard (0: a stated ZeRO stage shards over every dp rank) and
layers_per_stage whose value the source states (or its documented convention fixes, e.g. no
sequence parallelism before 2022) — the planner fills the rest, as a platform engineer
reproducing the run would ask it to.  Reported:

* acceptance: the fraction of measured runs (``status`` ok) for which the planner returns a plan
  (the rest with the planner's error: a refusal of a configuration that ran);
* measured OOMs: with the OOM layout pinned, the planner must refuse it (no stage's p10 peak
  within memory);
* tight: accepted runs whose plan is flagged ``tight`` (p90 over memory);
* the allocator's fragmentation fraction (``layer_cost.fragmentation_fraction``) fitted to the
  measured peaks: each predicted peak is A + f·B (B the memory that is freed and reallocated
  during a step: weights, gradients, activations; ``layer_cost``), so the f whose median
  log(predicted/measured) is zero is found by bisection within ``FRAGMENTATION_BOUNDS``;
* peak memory: where the source measured it (the BLOOM sweep's "Mem" column, the max of the
  first and last stage GPUs), predicted / measured − 1 of the pinned plan (the prediction is the
  device-level peak, ``max_reserved`` + CUDA context: cost_model/transformer/memory.py), and
  the (q10, q90) of log(predicted/measured) that ``--write`` stores as the memory interval in
  cost_model/data/memory_interval.json.

Rows the catalog cannot express (a device or number format it lacks) are counted apart.

Beside them, the layouts frameworks ship as examples and recipes
(``cost_model/data/framework_recipes.json``, :mod:`cost_model.validation.recipes`: configurations,
no measured figure) are each estimated as stated: accepted (no refusal, predicted to fit, tight
counted apart) or not, against what each entry expects.

Run: make bench-acceptance   (writes bench/results/acceptance.json);
``python bench/acceptance.py --write`` also stores the memory interval.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cost_model.errors import PlannerError  # noqa: E402
from cost_model.transformer.layer_cost import (  # noqa: E402
    FRAGMENTATION_BOUNDS,
    FRAGMENTATION_PRIOR,
    WORKSPACE_BYTES,
    fragmentation_fraction,
)
from cost_model.transformer.memory import as_printed_GB  # noqa: E402
from cost_model.transformer.memory import reload as reload_memory  # noqa: E402
from cost_model.units import bytes_to_gb  # noqa: E402
from cost_model.validation.fidelity import quantile  # noqa: E402
from cost_model.validation.published import PublishedCase, Unplannable, all_rows  # noqa: E402
from cost_model.validation.recipes import load_recipes, recipe_body  # noqa: E402
from planner_service.planner import SolverSettings, plan  # noqa: E402
from planner_service.planner.request import Constraints, PlanRequest, parse_estimate_request  # noqa: E402

OUT = ROOT / "bench" / "results" / "acceptance.json"
INTERVAL = ROOT / "cost_model" / "data" / "memory_interval.json"
SETTINGS = SolverSettings(time_limit_s=10.0, max_refinements=2000)


def plan_row(case: PublishedCase) -> dict[str, Any]:
    pins = case.stated_pins()
    gpus = case.candidates[0].num_devices
    req = PlanRequest(case.model, case.training, case.cluster, Constraints(pinned=pins, max_devices=gpus), top_k=0)
    out: dict[str, Any] = {"id": case.row_id, "group": case.group, "source": case.source, "status": case.measured_status,
                           "framework": case.training.framework, "pinned": {k: (list(v) if isinstance(v, tuple) else v) for k, v in pins.items()}}
    t0 = time.perf_counter()
    try:
        result = plan(req, SETTINGS)
    except PlannerError as exc:
        out.update(accepted=False, error={"code": exc.code, "field": exc.field, "message": str(exc)})
        out["wall_s"] = round(time.perf_counter() - t0, 3)
        return out
    best = result.best
    p = best.prediction
    out.update(accepted=True, tight=p.tight, strategy={k: v for k, v in best.strategy.to_dict().items() if k != "layers_per_stage"},
               step_time_s=round(p.step_time_s, 4), peak_memory_GB=round(max(p.peak_memory_GB), 2),
               peak_memory_GB_p10=round(p.peak_memory_GB_p10 or 0.0, 2), peak_memory_GB_p90=round(p.peak_memory_GB_p90 or 0.0, 2),
               wall_s=round(time.perf_counter() - t0, 3))
    if case.measured_memory_GB is not None:
        st = p.stages
        predicted = max(st[0].peak_memory_GB, st[-1].peak_memory_GB)
        out.update(measured_memory_GB=case.measured_memory_GB, predicted_first_last_GB=round(predicted, 2),
                   memory_error=round(predicted / case.measured_memory_GB - 1.0, 4))
        # the part of that peak that scales with the fragmentation fraction (stage_cost.workspace)
        worst = max((st[0], st[-1]), key=lambda s: s.peak_memory_GB)
        out["fragmenting_GB"] = round((worst.memory_GB["workspace"] - bytes_to_gb(WORKSPACE_BYTES)) / fragmentation_fraction(), 4)
        out["memory_GB"] = {k: round(v, 4) for k, v in worst.memory_GB.items() if k != "workspace"}
    if case.measured_step_s:
        out["measured_step_s"] = round(case.measured_step_s, 4)
        out["step_error"] = round(p.step_time_s / case.measured_step_s - 1.0, 4)
    return out


def summarise(rows: list[dict[str, Any]], unplannable: list[dict[str, Any]]) -> dict[str, Any]:
    ran = [r for r in rows if r["status"] == "ok"]
    ooms = [r for r in rows if r["status"] == "OOM"]
    accepted = [r for r in ran if r["accepted"]]
    mem = [r["memory_error"] for r in rows if r.get("memory_error") is not None]
    logs = [math.log1p(e) for e in mem]
    return {
        "measured_runs": len(ran),
        "accepted": len(accepted),
        "accepted_fraction": round(len(accepted) / len(ran), 4) if ran else None,
        "rejected": [{"id": r["id"], "framework": r["framework"], "pinned": r["pinned"], "error": r["error"]} for r in ran if not r["accepted"]],
        "tight_accepted": [r["id"] for r in accepted if r.get("tight")],
        "measured_ooms": len(ooms),
        "ooms_refused": f"{sum(not r['accepted'] for r in ooms)}/{len(ooms)}",
        "ooms_accepted": [{"id": r["id"], "peak_memory_GB": r.get("peak_memory_GB"), "peak_memory_GB_p10": r.get("peak_memory_GB_p10"), "tight": r.get("tight")} for r in ooms if r["accepted"]],
        "memory_rows": len(mem),
        "memory_frameworks": sorted({r["framework"] for r in rows if r.get("memory_error") is not None}),
        "memory_median_error": round(statistics.median(mem), 4) if mem else None,
        "memory_median_abs_error": round(statistics.median(abs(e) for e in mem), 4) if mem else None,
        "memory_p90_abs_error": round(quantile([abs(e) for e in mem], 0.9), 4) if mem else None,
        "memory_within_10pct": f"{sum(abs(e) <= 0.10 for e in mem)}/{len(mem)}" if mem else None,
        "memory_log_interval": [round(quantile(logs, 0.1), 4), round(quantile(logs, 0.9), 4)] if len(logs) >= 5 else None,
        "peak_memory_quantity": "max_reserved (device-level: allocator reserved + CUDA context, NCCL buffers)",
        "not_plannable": unplannable,
    }


def measure() -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    unplannable: list[dict[str, Any]] = []
    for case in all_rows():
        if isinstance(case, Unplannable):
            unplannable.append({"id": case.row_id, "group": case.group, "reason": case.reason})
            continue
        r = plan_row(case)
        rows.append(r)
        print(f"{r['id']}: {'accepted' if r['accepted'] else 'REFUSED'}{' (tight)' if r.get('tight') else ''}", file=sys.stderr, flush=True)
    return {"summary": summarise(rows, unplannable), "rows": rows}


#: What could fragment (module docstring): the base the cost model uses (stage_cost.workspace)
#: and the alternatives it is compared with, each a function of a row's worst-stage breakdown.
FRAGMENTATION_BASES: dict[str, Callable[[dict[str, Any]], float]] = {
    "gradients+activations (in force)": lambda r: r["fragmenting_GB"],
    "weights+gradients+activations": lambda r: r["fragmenting_GB"] + r["memory_GB"]["weights"],
    "activations": lambda r: r["memory_GB"]["activations"],
    "everything allocated": lambda r: sum(r["memory_GB"].values()),
}


def fit_fragmentation(rows: list[dict[str, Any]], current: float, base: Callable[[dict[str, Any]], float] = FRAGMENTATION_BASES["gradients+activations (in force)"],
                      bounds: tuple[float, float] = FRAGMENTATION_BOUNDS) -> float | None:
    """The fragmentation fraction f whose median log(predicted/measured) peak over the rows with
    a measured peak is zero: each peak is A + f·B with B = ``base`` (by default the
    ``fragmenting_GB`` in force; module docstring), so the median is monotone in f; bisection
    within ``bounds``."""
    pts = _fragmentation_points(rows, current, base)
    if len(pts) < 5:
        return None

    def median_log(f: float) -> float:
        return statistics.median(math.log((a + f * b) / m) for a, b, m in pts)

    lo, hi = bounds
    if median_log(lo) >= 0.0:
        return lo
    if median_log(hi) <= 0.0:
        return hi
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if median_log(mid) < 0.0 else (lo, mid)
    return round(0.5 * (lo + hi), 4)


def _fragmentation_points(rows: list[dict[str, Any]], current: float, base: Callable[[dict[str, Any]], float]) -> list[tuple[float, float, float]]:
    """(peak without its fragmentation reserve, the base that fragments, the measured peak) of
    every row with a measured peak."""
    return [(r["predicted_first_last_GB"] - current * r["fragmenting_GB"], base(r), r["measured_memory_GB"])
            for r in rows if r.get("memory_error") is not None and r.get("fragmenting_GB") is not None]


def fragmentation_bases(rows: list[dict[str, Any]], current: float) -> dict[str, Any]:
    """Each base of :data:`FRAGMENTATION_BASES` with its own fraction fitted (unbounded: what the
    peaks say) and how well it then fits the measured peaks — the evidence for the base in force."""
    out: dict[str, Any] = {}
    for name, base in FRAGMENTATION_BASES.items():
        f = fit_fragmentation(rows, current, base, bounds=(0.0, 3.0))
        if f is None:
            continue
        errs = sorted(abs((a + f * b) / m - 1.0) for a, b, m in _fragmentation_points(rows, current, base))
        # the fraction as a true reserved/allocated − 1 (it carries the GiB the peaks are printed in)
        out[name] = {"fraction": f, "true_reserve": round((1.0 + f) / as_printed_GB(1.0) - 1.0, 4), "median_abs_error": round(statistics.median(errs), 4), "p90_abs_error": round(quantile(errs, 0.9), 4),
                     "within_10pct": f"{sum(e <= 0.10 for e in errs)}/{len(errs)}"}
    return out


def interval_document(summary: dict[str, Any], fragmentation: float) -> dict[str, Any]:
    data = (ROOT / "cost_model" / "data" / "published_runs.json").read_bytes()
    return {
        "log_interval": summary["memory_log_interval"],
        "fragmentation_fraction": fragmentation,
        "fragmentation_prior": FRAGMENTATION_PRIOR,
        "rows": summary["memory_rows"],
        # the frameworks those peaks were measured under: the interval is theirs (memory.interval_basis)
        "frameworks": summary["memory_frameworks"],
        "quantity": "log(predicted / measured) peak memory per GPU, (q10, q90)",
        "measured": "BLOOM176B_topology_sweep 'Mem' column (max memory of the first/last stage GPUs)",
        "written_by": "bench/acceptance.py --write",
        "data_sha256": hashlib.sha256(data).hexdigest(),
        "date": time.strftime("%Y-%m-%d"),
    }


def shipped_recipes() -> dict[str, Any]:
    """Each shipped recipe estimated as stated: its verdict (``fits``, ``tight``, ``does_not_fit``
    or ``refused`` with the error) against what the entry expects."""
    from cost_model.estimate import estimate

    rows = []
    for recipe in load_recipes():
        try:
            req = parse_estimate_request({**recipe_body(recipe), "strategy": recipe["strategy"]})
            est = estimate(req.model, req.training, req.cluster, req.strategy)
            verdict = "does_not_fit" if not est.fits else ("tight" if est.tight else "fits")
            row = {"id": recipe["id"], "framework": recipe["training"]["framework"], "verdict": verdict,
                   "peak_memory_GB": round(max(est.peak_memory_GB), 1), "step_time_s": round(est.step_time_s, 3)}
        except PlannerError as exc:
            row = {"id": recipe["id"], "framework": recipe["training"]["framework"], "verdict": "refused", "error": exc.to_dict()}
        expected = recipe["expect"] == "runs" and row["verdict"] in ("fits", "tight") or recipe["expect"] == row["verdict"]
        rows.append({**row, "expect": recipe["expect"], "as_expected": expected, **({"why": recipe["why"]} if "why" in recipe else {})})
    runs = [r for r in rows if r["expect"] == "runs"]
    return {"recipes": len(rows), "runs": len(runs), "runs_accepted": sum(r["verdict"] in ("fits", "tight") for r in runs),
            "runs_tight": sum(r["verdict"] == "tight" for r in runs), "as_expected": sum(r["as_expected"] for r in rows),
            "frameworks": sorted({r["framework"] for r in rows}),
            "expected_not_to_fit": [{"id": r["id"], "verdict": r["verdict"], "why": r.get("why")} for r in rows if r["expect"] != "runs"],
            "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="store the measured-peak memory interval in cost_model/data/memory_interval.json, then measure again with it")
    args = ap.parse_args()
    out = measure()
    if args.write and out["summary"]["memory_log_interval"]:
        # fit the fragmentation fraction first, then measure the residual interval with it
        f = fit_fragmentation(out["rows"], fragmentation_fraction()) or fragmentation_fraction()
        INTERVAL.write_text(json.dumps(interval_document(out["summary"], f), indent=1, sort_keys=True) + "\n")
        reload_memory()
        out = measure()
        INTERVAL.write_text(json.dumps(interval_document(out["summary"], f), indent=1, sort_keys=True) + "\n")
        reload_memory()
    # each base fitted on the rows as finally measured (the interval document does not carry it)
    out["summary"]["fragmentation_bases"] = fragmentation_bases(out["rows"], fragmentation_fraction())
    out["recipes"] = shipped_recipes()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    s = out["summary"]
    print(json.dumps({k: v for k, v in s.items() if k not in ("rejected", "not_plannable", "ooms_accepted")}, indent=1))
    print(f"accepted {s['accepted']}/{s['measured_runs']} measured runs; OOMs refused {s['ooms_refused']}; "
          f"memory median error {s['memory_median_error']} over {s['memory_rows']} rows; shipped recipes accepted "
          f"{out['recipes']['runs_accepted']}/{out['recipes']['runs']} ({out['recipes']['as_expected']}/{out['recipes']['recipes']} as expected)")


if __name__ == "__main__":
    main()
