"""LoRA on this machine's CPU: the cost model's LoRA physics against a measured step.

The Llama-style case ``L`` of ``bench/cpu_validation.py`` (Hugging Face's eager modelling in
plain PyTorch, fp32) is trained twice on ``local-cpu`` — whole, and as PEFT's LoRA trains it
(rank 16 on q, k, v, o, gate, up and down, every other weight frozen:
``cpu_validation.with_lora``) — alternately, so that both see the host in the same state, and
each is compared with ``cost_model.estimate`` under the profile taken right before
(``training.lora_rank``; framework ``fsdp``, whose trainers put one adapter on each projection).
What a LoRA step saves (the frozen layers' weight-gradient GEMMs, the optimizer's state) and
what it adds (the adapters' small GEMMs and memory-bound passes) are both real work here, so the
measured ratio LoRA / whole is the check that does not depend on the host's drifting speed.

Writes bench/results/lora_cpu.json.  Usage: python bench/lora_cpu.py [--steps 5] [--reuse-profile]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import cpu_validation as cv  # noqa: E402

OUT = ROOT / "bench" / "results" / "lora_cpu.json"
RANK = 16


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=5, help="alternating whole/LoRA measurements")
    ap.add_argument("--reuse-profile", action="store_true")
    args = ap.parse_args(argv)
    from planner_service.profiling.fingerprint import cpu_count, cpu_model

    whole = next(c for c in cv.CASES if c["name"] == "L")
    lora = {**whole, "name": "L-LoRA", "lora_rank": RANK}
    cores = cpu_count()
    cv.PROFILES.mkdir(parents=True, exist_ok=True)
    prof, _ref = cv.take_profile(cores, cv.PROFILES / "lora_cpu.json", args.reuse_profile)
    measured: dict[str, list[float]] = {"whole": [], "lora": []}
    for rnd in range(args.rounds):
        for key, case in (("whole", whole), ("lora", lora)):
            cv.wait_for_quiet()
            m = cv.measure_single(case, cores, 2, args.steps)
            measured[key].append(m["median_s"])
            print(f"round {rnd + 1}: {key} {m['median_s']:.3f} s", flush=True)
    rows = {}
    for key, case in (("whole", whole), ("lora", lora)):
        pred = cv.predict(case, 1, prof, framework="fsdp")
        m = statistics.median(measured[key])
        rows[key] = {"measured_step_s": m, "measured_rounds_s": measured[key], "predicted_step_s": pred["step_time_s"],
                     "error": pred["step_time_s"] / m - 1.0, "predicted_breakdown_s": pred["breakdown_s"]}
    # the ratio of each round's pair, so that the host's drift between rounds cancels
    pair_ratios = [lo / wh for wh, lo in zip(measured["whole"], measured["lora"], strict=True)]
    out = {"case": whole, "lora_rank": RANK, "host": {"cpu": cpu_model(), "cores": cores}, "rows": rows,
           "measured_ratio": statistics.median(pair_ratios), "measured_pair_ratios": pair_ratios,
           "predicted_ratio": rows["lora"]["predicted_step_s"] / rows["whole"]["predicted_step_s"],
           "profile": str((cv.PROFILES / "lora_cpu.json").relative_to(ROOT))}
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    print(f"LoRA / whole step: measured {out['measured_ratio']:.3f}, predicted {out['predicted_ratio']:.3f}; "
          f"errors whole {rows['whole']['error'] * 100:+.1f}%, LoRA {rows['lora']['error'] * 100:+.1f}%")
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
