"""Cost-model fidelity against published measured training runs.

Every end-to-end row of cost_model/data/published_runs.json (cost_model/validation/published.py
says how each source's row becomes a request and which FLOP convention gives its measured step):
predict the step time with the published layout (unknown knobs: the fastest that fits) and
compare.  Reported, per source and overall:

* in-sample error — at the constants stored in cost_model/data/calibration.json (fitted on all
  rows by bench/calibrate.py);
* leave-one-source-out cross-validated error — each source predicted at constants fitted
  without it (the README's headline);
* the same at the priors (nothing fitted);
* rows that fail to plan, with the reason; measured OOMs predicted to fit or not; measured runs
  predicted not to fit; the BLOOM topology sweep's Spearman rank correlation of TFLOP/s;
  coverage of the p10–p90 step-time intervals (cross-validated);
* Korthikanti et al. 2022 Table 4 single-layer forward/backward times.

Run: make bench-fidelity   (writes bench/results/fidelity.json and the README section);
``python bench/fidelity.py --calibrate`` refits and stores the constants first (as
bench/calibrate.py does) in the same run.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(ROOT / "bench"))

from cost_model.transformer.calibration import reload, stored_document  # noqa: E402
from cost_model.validation.calibration_fit import evaluate_at, interval_coverage, run  # noqa: E402
from cost_model.validation.fidelity import layer_table4, summarise  # noqa: E402


def _row(r, cv: dict[str, float], prior: dict) -> dict:
    st = r.strategy
    out = {
        "id": r.row_id,
        "group": r.group,
        "source": r.source,
        "status": r.status,
        "framework": r.framework,
        "measured_step_s": round(r.measured_step_s, 4) if r.measured_step_s else None,
        "measured_from": r.measured_from,
        "predicted_step_s": round(r.predicted_step_s, 4) if r.predicted_step_s else None,
        "error": round(r.error, 4) if r.error is not None else None,
        "cv_error": round(cv[r.row_id], 4) if r.row_id in cv else None,
        "prior_error": round(prior[r.row_id].error, 4) if r.row_id in prior and prior[r.row_id].error is not None else None,
        "predicted_fit": r.fits,
        "failure": r.failure,
        "assumptions": list(r.assumptions),
    }
    if st is not None:
        out["strategy"] = {k: v for k, v in st.to_dict().items() if k != "layers_per_stage"}
        out["gpus"] = st.num_devices
    if r.estimate is not None:
        out["step_time_s_p10"] = r.estimate.step_time_s_p10
        out["step_time_s_p90"] = r.estimate.step_time_s_p90
    return out


def measure(calibrate: bool = False) -> dict:
    """Everything the report needs; ``calibrate``: also store the constants fitted in this run
    (what ``bench/calibrate.py`` writes) before the in-sample pass."""
    cal = run(progress=lambda m: print(m, file=sys.stderr, flush=True))
    if calibrate:
        from calibrate import OUT, document

        OUT.write_text(json.dumps(document(cal), indent=1, sort_keys=True) + "\n")
        reload()
    doc = stored_document()
    stored = doc.get("constants") or cal.constants
    intervals = {k: tuple(v) for k, v in doc.get("step_time_log_interval", {}).items()} or cal.intervals
    print("evaluating at the stored constants", file=sys.stderr, flush=True)
    insample = evaluate_at(stored, cal.cases, intervals=intervals)
    prior = {r.row_id: r for r in cal.prior_results}
    t4 = layer_table4()
    coverage = interval_coverage(insample, cal.cv_errors)
    return {
        "summary": {
            "cross_validated": summarise(insample, errors=cal.cv_errors),
            "in_sample": summarise(insample),
            "priors": summarise(cal.prior_results),
            "interval_coverage_cv": round(coverage, 4) if coverage is not None else None,
            "table4_max_abs_error": round(max(max(abs(x["forward_error"]), abs(x["backward_error"])) for x in t4), 4),
        },
        "constants": stored,
        "fitted_now": cal.constants,
        "cv_constants": cal.cv_constants,
        "rows": [_row(r, cal.cv_errors, prior) for r in insample],
        "korthikanti_table4": t4,
    }


def _pct(x) -> str:
    return "–" if x is None else f"{x * 100:.1f}%"


def readme_section(d: dict) -> str:
    """The README's fidelity section from a fidelity.json document."""
    sm = d["summary"]
    cv, ins, pri = sm["cross_validated"], sm["in_sample"], sm["priors"]
    out = [
        f"**Leave-one-source-out cross-validated: median |step error| {_pct(cv['median_abs_error'])}, p90 {_pct(cv['p90_abs_error'])} "
        f"over {cv['rows_predicted']} measured runs** (in-sample {_pct(ins['median_abs_error'])}, p90 {_pct(ins['p90_abs_error'])}; "
        f"with nothing fitted {_pct(pri['median_abs_error'])}, p90 {_pct(pri['p90_abs_error'])}). "
        f"{len(ins['failed_to_plan'])} rows fail to plan; measured OOMs predicted not to fit: {ins['oom_predicted_not_to_fit']}; "
        f"measured runs predicted to fit: {ins['measured_runs_predicted_to_fit']}; BLOOM sweep Spearman (TFLOP/s): "
        f"{ins['bloom_sweep_spearman']} in-sample, {cv['bloom_sweep_spearman']} cross-validated over the whole sweep, "
        f"{ins.get('bloom_sweep_spearman_within_sections')} in-sample / {cv.get('bloom_sweep_spearman_within_sections')} cross-validated "
        f"within its sections (one software state and date each, as SOURCES.md advises; {ins.get('bloom_sweep_sections_ranked')} rows); "
        f"p10–p90 step-time interval coverage, each source against intervals built from the other sources' "
        f"cross-validated residuals: {_pct(sm['interval_coverage_cv'])}; "
        f"peak memory against the BLOOM sweep's {ins['memory_rows']} measured peaks: median |error| {_pct(ins['memory_median_abs_error'])} "
        f"(median {ins['memory_median_error'] * 100:+.1f}%; the prediction is the allocator's reserved peak plus CUDA context).",
        "",
        "| source | rows | CV median \\|error\\| | CV median error | in-sample median \\|error\\| | nothing fitted |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for src, c in cv["by_source"].items():
        i = ins["by_source"].get(src, {})
        p = pri["by_source"].get(src, {})
        out.append(f"| {src} | {c['rows']} | {_pct(c['median_abs_error'])} | {c['median_error'] * 100:+.1f}% | {_pct(i.get('median_abs_error'))} | {_pct(p.get('median_abs_error'))} |")
    out += ["", "Constants (`cost_model/data/calibration.json`, fitted by `bench/calibrate.py`):", ""]
    out += [f"`{k}` = {v}" + ("" if i == len(d["constants"]) - 1 else ",") for i, (k, v) in enumerate(sorted(d["constants"].items()))]
    out += ["", "Rows that fail to plan:", ""]
    for f in ins["failed_to_plan"]:
        out.append(f"* {f['id']}: {f['reason']}")
    out += ["", f"Korthikanti et al. 2022 Table 4 (one 22B layer, tp 8, micro-batch 4), worst {_pct(sm['table4_max_abs_error'])}:", "",
            "| Table 4 configuration | forward predicted / measured (ms) | backward predicted / measured (ms) |", "|---|---|---|"]
    for x in d["korthikanti_table4"]:
        out.append(
            f"| {x['config'].replace('_', ' ')} | {x['forward_ms']:.2f} / {x['measured_forward_ms']} ({x['forward_error'] * 100:+.1f}%) "
            f"| {x['backward_ms']:.2f} / {x['measured_backward_ms']} ({x['backward_error'] * 100:+.1f}%) |"
        )
    out += ["", "<details><summary>Every row</summary>", "",
            "| run | framework | GPUs | tp·pp·dp·cp (mbs, vpp, recompute, zero) | measured step (s) | predicted (s) | error | CV error |",
            "|---|---|---:|---|---:|---:|---:|---:|"]
    for r in d["rows"]:
        s = r.get("strategy")
        if s is None:
            what = "OOM measured, predicted not to fit" if r["status"] == "OOM" else f"fails to plan: {r['failure']}"
            out.append(f"| {r['id']} | {r['framework']} | | {what} | | | | |")
            continue
        meas = f"{r['measured_step_s']:.3f}" if r["measured_step_s"] else "OOM"
        err = f"{r['error'] * 100:+.1f}%" if r["error"] is not None else ("predicted to fit" if r["status"] == "OOM" else "")
        cve = f"{r['cv_error'] * 100:+.1f}%" if r["cv_error"] is not None else ""
        out.append(
            f"| {r['id']} | {r['framework']} | {r['gpus']} | {s['tp']}·{s['pp']}·{s['dp']}·{s['cp']} ({s['micro_batch_size']}, {s['vpp']}, {s['recompute']}, {s['zero_stage']}) "
            f"| {meas} | {r['predicted_step_s']:.3f} | {err} | {cve} |"
        )
    out += ["", "</details>"]
    return "\n".join(out)


def write_readme(d: dict) -> None:
    readme = ROOT / "README.md"
    text = readme.read_text()
    pattern = re.compile(r"(<!-- bench:fidelity -->\n).*?(<!-- /bench:fidelity -->)", re.S)
    readme.write_text(pattern.sub(lambda m: m.group(1) + readme_section(d) + "\n" + m.group(2), text))


def main(argv: list[str]) -> int:
    d = measure(calibrate="--calibrate" in argv)
    res = ROOT / "bench" / "results"
    res.mkdir(parents=True, exist_ok=True)
    (res / "fidelity.json").write_text(json.dumps(d, indent=1) + "\n")
    write_readme(d)
    print(json.dumps(d["summary"]["cross_validated"]["by_source"], indent=1))
    for key in ("cross_validated", "in_sample", "priors"):
        s = d["summary"][key]
        print(f"{key}: median {_pct(s['median_abs_error'])} p90 {_pct(s['p90_abs_error'])} rows {s['rows_predicted']} "
              f"failed {len(s['failed_to_plan'])} OOM-not-fit {s['oom_predicted_not_to_fit']} fit {s['measured_runs_predicted_to_fit']} "
              f"spearman {s['bloom_sweep_spearman']}")
    print("interval coverage (CV):", d["summary"]["interval_coverage_cv"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
