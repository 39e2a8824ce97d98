"""Cost-model fidelity against published measured training runs.

For every usable end-to-end row of cost_model/data/published_runs.json: predict the step time
with the published layout (unknown knobs filled by the rules in cost_model/published.py) and
compare with the measured step time derived with the source's own FLOP convention.  Also the
Korthikanti et al. 2022 Table 4 single-layer forward/backward times.

Run: make bench-fidelity   (writes bench/results/fidelity.json)
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cost_model.validation.fidelity import layer_table4, predict_case  # noqa: E402
from cost_model.validation.published import cases  # noqa: E402


def main() -> int:
    rows = []
    for case in cases():
        best, strategy = predict_case(case)
        if best is None:
            rows.append({"id": case.row_id, "error": "no candidate fits"})
            continue
        err = (best.step_time_s - case.measured_step_s) / case.measured_step_s
        rows.append(
            {
                "id": case.row_id,
                "group": case.group,
                "gpus": strategy.num_devices,
                "strategy": strategy.to_dict(),
                "measured_step_s": round(case.measured_step_s, 4),
                "measured_from": case.measured_from,
                "predicted_step_s": round(best.step_time_s, 4),
                "error": round(err, 4),
                "predicted_mfu": round(best.mfu, 4),
                "assumptions": list(case.assumptions),
            }
        )
    errs = [abs(r["error"]) for r in rows if "error" in r and isinstance(r["error"], float)]
    t4 = layer_table4()
    summary = {
        "rows": len(rows),
        "median_abs_error": round(statistics.median(errs), 4),
        "mean_abs_error": round(statistics.fmean(errs), 4),
        "max_abs_error": round(max(errs), 4),
        "rows_over_20pct": sum(e > 0.20 for e in errs),
        "table4_max_abs_error": round(max(max(abs(x["forward_error"]), abs(x["backward_error"])) for x in t4), 4),
    }
    out = {"summary": summary, "rows": rows, "korthikanti_table4": t4}
    res = ROOT / "bench" / "results"
    res.mkdir(parents=True, exist_ok=True)
    (res / "fidelity.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"{'row':44s} {'gpus':>5s} {'tp':>3s} {'pp':>3s} {'mbs':>3s} {'v':>2s} {'rc':>4s} {'measured s':>11s} {'predicted s':>11s} {'error':>7s}")
    for r in rows:
        if "predicted_step_s" not in r:
            print(f"{r['id']:44s} {r['error']}")
            continue
        st = r["strategy"]
        print(
            f"{r['id']:44s} {r['gpus']:5d} {st['tp']:3d} {st['pp']:3d} {st['micro_batch_size']:3d} {st['vpp']:2d} "
            f"{st['recompute'][:4]:>4s} {r['measured_step_s']:11.3f} {r['predicted_step_s']:11.3f} {r['error']*100:6.1f}%"
        )
    print()
    for x in t4:
        print(f"Table 4 {x['config']:32s} fwd {x['forward_ms']:.2f} ms (meas {x['measured_forward_ms']}) {x['forward_error']*100:+.1f}%  "
              f"bwd {x['backward_ms']:.2f} ms (meas {x['measured_backward_ms']}) {x['backward_error']*100:+.1f}%")
    print()
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
