"""Why this plan: the bottleneck term, the memory headroom, and why the main alternatives lost."""

from __future__ import annotations

from typing import Any

from cost_model.cluster import Cluster

KNOBS = ("dp", "tp", "pp", "cp", "ep", "vpp", "micro_batch_size", "sequence_parallel", "recompute", "zero_stage")


def _knob_diff(best, alt) -> str:
    parts = []
    for k in KNOBS:
        a, b = getattr(alt.strategy, k), getattr(best.strategy, k)
        if a != b:
            parts.append(f"{k}={a}")
    if set(alt.stage_groups) != set(best.stage_groups):
        parts.append("on " + "+".join(sorted(set(alt.stage_groups))))
    return ", ".join(parts) or "different stage split"


def explain(best, alternatives, cluster: Cluster) -> dict[str, Any]:
    p = best.prediction
    terms = {k: v for k, v in p.breakdown_s.items()}
    non_compute = {k: v for k, v in terms.items() if k != "compute"}
    top_overhead = max(non_compute, key=non_compute.get) if non_compute else None
    tight = max(p.stages, key=lambda s: s.peak_memory_GB / s.memory_capacity_GB)
    headroom_GB = tight.memory_capacity_GB - tight.peak_memory_GB
    lines = []
    for alt in alternatives:
        a = alt.prediction
        deltas = {k: a.breakdown_s[k] - p.breakdown_s[k] for k in p.breakdown_s}
        worst = max(deltas, key=deltas.get)
        base = p.breakdown_s[worst]
        rel = f"+{deltas[worst] / base * 100:.0f}% {worst}" if base > 1e-9 else f"+{deltas[worst]:.3g} s {worst}"
        why = rel
        if alt.strategy.tp > 1 and any(alt.strategy.tp > g.gpus_per_node for g in cluster.node_groups):
            why = f"tp={alt.strategy.tp} crosses nodes: {rel}"
        lines.append(
            f"{_knob_diff(best, alt)}: step {a.step_time_s / p.step_time_s * 100 - 100:+.1f}% ({why})"
        )
    return {
        "bottleneck": p.bottleneck,
        "largest_overhead": top_overhead,
        "summary": (
            f"{p.step_time_s:.3g} s per step, {p.tokens_per_s:,.0f} tokens/s, MFU {p.mfu * 100:.1f}%; "
            f"{terms['compute'] / p.step_time_s * 100:.0f}% compute"
            + (f", largest overhead {top_overhead} {non_compute[top_overhead] / p.step_time_s * 100:.1f}%" if top_overhead else "")
        ),
        "memory_headroom_GB": round(headroom_GB, 2),
        "tightest_stage": tight.index,
        "alternatives": lines,
    }
