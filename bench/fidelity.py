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
import statistics
import sys
from dataclasses import replace
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


def _cell(value: object) -> str:
    """A physics case's figure as the README shows it (a dict by its keys, read back from JSON
    or not: ``384: 89.76, 768: 52.71``)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_cell(v)}" for k, v in value.items()) + "}"
    return str(value)


def physics_cases() -> list[dict]:
    """One benchmark case per physics item of issue 13, each showing the effect the formula
    has (the unit tests pin the formulas; these are the figures the README quotes)."""
    from cost_model import Strategy, Training, estimate, simple_cluster
    from cost_model.comm import Links, allreduce_time_s
    from cost_model.devices import get_device
    from cost_model.transformer.layer_cost import (
        StrategyArrays,
        deepspeed_gather_copy_out_s,
        sharded_collectives_per_layer,
    )
    from cost_model.transformer.spec import get_preset

    out: list[dict] = []
    gpt3 = get_preset("gpt3-175b")
    t = Training(global_batch_size=1536, sequence_length=2048, framework="deepspeed", attention="unfused", dtype="fp16")
    steps = {}
    for dp, mbs in ((384, 4), (768, 2), (1536, 1)):
        est = estimate(gpt3, t, simple_cluster("A100-SXM4-80GB", dp // 8), Strategy(dp=dp, micro_batch_size=mbs, zero_stage=3, recompute="full"))
        steps[dp] = round(est.step_time_s, 2)
    out.append({"physics": "ZeRO-3 per-micro-batch gathers: GPT-3 175B, DeepSpeed ZeRO-3, A100, global batch 1536, step (s) by dp",
                "result": steps, "measured (Narayanan 2021 Table 2)": {384: 81.6, 768: 66.7, 1536: 66.7}})
    traffic = {}
    tn = replace(t, grad_reduce_overlap=False)  # no overlap: the exposed traffic is all of it
    for recompute in ("selective", "full"):
        est = estimate(gpt3, tn, simple_cluster("A100-SXM4-80GB", 96), Strategy(dp=768, micro_batch_size=2, zero_stage=3, recompute=recompute))
        traffic[recompute] = round(est.breakdown_s["dp_comm_exposed"], 2)
    out.append({"physics": "DeepSpeed stage-3 hooks re-gather a recomputed layer's weights: GPT-3 175B, ZeRO-3 dp 768, ZeRO traffic per step (s) by recompute",
                "result": traffic})
    S = StrategyArrays.from_strategies([Strategy(dp=dp, micro_batch_size=1, zero_stage=3, recompute="full") for dp in (384, 768, 1536)])
    copy_out = deepspeed_gather_copy_out_s(gpt3.decoder_layer_params(), gpt3.num_layers, t, S, get_device("A100-SXM4-80GB"),
                                           sharded_collectives_per_layer(gpt3, "deepspeed"), 3.0)
    out.append({"physics": "DeepSpeed stage-3 tensor-list gathers copy NCCL's output out per rank: GPT-3 175B, A100, full recompute, copy-out seconds per micro-batch by dp",
                "result": {dp: round(float(v), 2) for dp, v in zip((384, 768, 1536), copy_out, strict=True)}})
    llama8 = get_preset("llama3-8b")
    c = simple_cluster("H100-SXM5-80GB", 1)
    s = Strategy(dp=8, micro_batch_size=1, zero_stage=1)
    bf16 = estimate(llama8, Training(global_batch_size=64, sequence_length=8192), c, s).step_time_s
    fp8 = estimate(llama8, Training(global_batch_size=64, sequence_length=8192, dtype="fp8"), c, s).step_time_s
    out.append({"physics": "FP8 (Transformer Engine: linear GEMMs in FP8, attention/head BF16, casts): Llama 3 8B on 8 H100, BF16/FP8 step ratio",
                "result": round(bf16 / fp8, 3), "peak ratio": 2.0})
    ib = Links.for_group(simple_cluster("A100-SXM4-80GB", 8).node_groups[0])
    opa = Links.for_group(simple_cluster("A100-SXM4-80GB", 8, fabric="omnipath", inter_node_bandwidth_GBps=50.0).node_groups[0])
    busbw = {}
    for size in (1e6, 16e6, 256e6, 4e9):
        tt = float(allreduce_time_s(64, size, ib, 8))
        busbw[f"{size / 1e6:g} MB"] = round(2 * 63 / 64 * size / tt / 1e9, 1)
    out.append({"physics": "Message-size-dependent bus bandwidth: ring all-reduce over 64 A100 (8 nodes, 8x200 Gb/s HDR IB), bus GB/s by size",
                "result": busbw})
    tt_ib = float(allreduce_time_s(64, 1e9, ib, 8))
    tt_opa = float(allreduce_time_s(64, 1e9, opa, 8))
    out.append({"physics": "Fabric: 1 GB all-reduce over 8 nodes, Omni-Path 4x100 Gb/s (Jean Zay) vs HDR InfiniBand 8x200 Gb/s, time ratio",
                "result": round(tt_opa / tt_ib, 2)})
    gpt13 = get_preset("gpt3-1.3b")
    c2 = simple_cluster("A100-SXM4-80GB", 2)
    tr = Training(global_batch_size=256, sequence_length=2048, attention="unfused", grad_reduce_overlap=False)
    for recompute, what in (("none", "no recompute: the per-layer checkpoint cost not paid"), ("full", "full recompute: every layer checkpointed")):
        s2 = Strategy(dp=4, tp=2, pp=2, micro_batch_size=1, zero_stage=1, recompute=recompute)
        core = estimate(gpt13, tr, c2, s2).step_time_s
        mds = estimate(gpt13, replace(tr, framework="megatron-deepspeed"), c2, s2).step_time_s
        out.append({"physics": "DeepSpeed pipeline engine (per-micro-batch gradient accumulation pass, per-layer engine overhead, no interleaving, era "
                               f"kernels) vs Megatron-Core: GPT 1.3B tp2 pp2 dp4, 64 micro-batches, {what}, step ratio",
                    "result": round(mds / core, 3)})
    # GPT-3 175B: 96 heads, each its own key/value head, so Megatron-Core splits them 16 ways
    # (Llama 3 70B's 8 KV heads would not: kv_heads_violation)
    gpt175 = get_preset("gpt3-175b")
    t175 = Training(global_batch_size=64, sequence_length=8192)
    s16 = Strategy(tp=16, dp=4, micro_batch_size=1, sequence_parallel=True)
    rack = estimate(gpt175, t175, simple_cluster("GB200-NVL72-186GB", 1, gpus_per_node=64), s16)
    hgx = estimate(gpt175, t175, simple_cluster("B200-SXM-192GB", 8), s16)
    out.append({"physics": "NVL72: GPT-3 175B tp16 inside one GB200 NVL72 rack vs across 8-GPU HGX B200 nodes, TP communication (s per step)",
                "result": {"GB200 NVL72": round(rack.breakdown_s["tp_comm"], 2), "HGX B200": round(hgx.breakdown_s["tp_comm"], 2)}})
    hsdp = {}
    for nodes in (4, 128):
        th = Training(global_batch_size=8 * nodes, sequence_length=8192, framework="fsdp")
        for shard, name in ((0, "full"), (8, "HSDP")):
            est = estimate(llama8, th, simple_cluster("H100-SXM5-80GB", nodes), Strategy(dp=8 * nodes, zero_stage=3, recompute="selective", dp_shard=shard))
            hsdp[f"{nodes * 8} GPUs {name}"] = round(est.step_time_s, 3)
    out.append({"physics": "HSDP (FSDP sharded within a node, replicated across) vs full sharding: Llama 3 8B, ZeRO-3, 8192 tokens per GPU, H100, step (s)",
                "result": hsdp})
    llama13 = get_preset("llama2-13b")
    memory = {}
    for framework, zero in (("fsdp", 3), ("deepspeed", 3), ("deepspeed", 2), ("megatron-core", 1)):
        tm = Training(global_batch_size=64, sequence_length=4096, framework=framework)
        est = estimate(llama13, tm, simple_cluster("A100-SXM4-80GB", 1), Strategy(dp=8, micro_batch_size=1, zero_stage=zero, recompute="full"))
        m = est.stages[0].memory_GB
        memory[f"{framework} ZeRO-{zero}"] = {
            "state": round(m["weights"] + m["gradients"] + m["optimizer_state"], 1),
            "activations incl. gathered layers": round(m["activations"], 1),
            "allocator reserve + context": round(m["workspace"], 1),
            "peak (p10-p90)": f"{est.peak_memory_GB[0]:.1f} ({est.peak_memory_GB_p10:.1f}-{est.peak_memory_GB_p90:.1f})",
        }
    out.append({"physics": "Memory as the allocator sees it: Llama 2 13B on 8 A100 80GB, 4096 tokens, full recompute, GB per GPU by framework "
                           "(state after sharding incl. DeepSpeed's gradient buckets; the gathered layers of ZeRO-3; fragmentation reserve, CUDA context, NCCL)",
                "result": memory})
    return out


def peer_comparison(results) -> dict | None:
    """The same rows (same layout as ours) through llm-analysis, when it is installed."""
    import peer_llm_analysis as peer

    from cost_model.validation.published import cases as measured_cases

    if not peer.available():
        return None
    cases = {c.row_id: c for c in measured_cases()}
    ours, theirs = [], []
    for r in results:
        c = cases.get(r.row_id)
        if c is None or r.strategy is None or r.error is None:
            continue
        p = peer.predict_step_s(c, r.strategy)
        if p is None:
            continue
        theirs.append(abs(p / c.measured_step_s - 1))
        ours.append(abs(r.error))
    return {
        "llm_analysis_version": peer.version(),
        "flops_efficiency": peer.FLOPS_EFFICIENCY,
        "rows": len(theirs),
        "llm_analysis_median_abs_error": round(statistics.median(theirs), 4) if theirs else None,
        "ours_in_sample_median_abs_error_same_rows": round(statistics.median(ours), 4) if ours else None,
    }


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
    print("llm-analysis on the same rows", file=sys.stderr, flush=True)
    peer = peer_comparison(insample)
    if peer is not None:
        cv_same = [abs(cal.cv_errors[r.row_id]) for r in insample if r.row_id in cal.cv_errors]
        peer["ours_cross_validated_median_abs_error_all_rows"] = round(statistics.median(cv_same), 4) if cv_same else None
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
        "llm_analysis": peer,
        "physics_cases": physics_cases(),
    }


def _recompute(s: dict) -> str:
    """``full`` / ``none`` / ``selective``, or ``full N/chunk`` for block recompute of N layers."""
    n = s.get("recompute_num_layers")
    return f"{s['recompute']} {n}/chunk" if n else s["recompute"]


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
        f"{len(ins['failed_to_plan'])} {'row fails' if len(ins['failed_to_plan']) == 1 else 'rows fail'} to plan; measured OOMs predicted not to fit: {ins['oom_predicted_not_to_fit']}; "
        f"measured runs predicted to fit: {ins['measured_runs_predicted_to_fit']}; BLOOM sweep Spearman (TFLOP/s): "
        f"{ins['bloom_sweep_spearman']} in-sample, {cv['bloom_sweep_spearman']} cross-validated over the whole sweep, "
        f"{ins.get('bloom_sweep_spearman_within_sections')} in-sample / {cv.get('bloom_sweep_spearman_within_sections')} cross-validated "
        f"within its sections (one software state and date each, as SOURCES.md advises; {ins.get('bloom_sweep_sections_ranked')} rows; "
        f"ranking each row by the mean measured TFLOP/s of its (tp, pp, dp, micro-batch) reaches only "
        f"{ins.get('bloom_sweep_spearman_layout_ceiling')}, the ceiling for a prediction that sees the layout alone); "
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
    peer = d.get("llm_analysis")
    out.append("")
    if peer:
        out.append(
            f"**Peer on identical inputs:** llm-analysis {peer['llm_analysis_version']} (the `bench` extra; flops_efficiency "
            f"{peer['flops_efficiency']}, its documented Megatron-LM figure; same model shapes, catalog figures and layouts) on the "
            f"{peer['rows']} rows it accepts: median |step error| {_pct(peer['llm_analysis_median_abs_error'])}, against ours "
            f"{_pct(peer['ours_in_sample_median_abs_error_same_rows'])} in-sample on the same rows "
            "(llm-analysis rejects FFN widths that are not a multiple of the hidden size, e.g. Llama 3 405B's 3.25·h)."
        )
    else:
        out.append("llm-analysis is not installed (`pip install -e '.[bench]'`): no peer comparison in this run.")
    out += ["", "One case per physics item (`physics_cases` in `bench/results/fidelity.json`):", "", "| physics | result |", "|---|---|"]
    for case in d.get("physics_cases", []):
        extra = "; ".join(f"{k}: {_cell(v)}" for k, v in case.items() if k not in ("physics", "result"))
        out.append(f"| {case['physics']} | {_cell(case['result'])}{' (' + extra + ')' if extra else ''} |")
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
        if r["status"] == "ok" and r["predicted_fit"] is False:
            err += " (predicted not to fit)"
        cve = f"{r['cv_error'] * 100:+.1f}%" if r["cv_error"] is not None else ""
        out.append(
            f"| {r['id']} | {r['framework']} | {r['gpus']} | {s['tp']}·{s['pp']}·{s['dp']}·{s['cp']} ({s['micro_batch_size']}, {s['vpp']}, {_recompute(s)}, {s['zero_stage']}) "
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
