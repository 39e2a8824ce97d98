"""Why this plan: the bottleneck term, the memory headroom, and why each alternative lost.

Works on the contract's plan entries (``{"strategy", "prediction", "stages", ...}``) so that the
service can explain again after a replan picks a different candidate as the best.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

from cost_model.strategy import Strategy

KNOBS = ("dp", "tp", "pp", "cp", "ep", "vpp", "micro_batch_size", "sequence_parallel", "recompute", "recompute_num_layers", "recompute_method", "zero_stage", "dp_shard", "nesting")
#: What a stored strategy that omits a knob means (dp_shard, recompute_num_layers: 0).
KNOB_DEFAULTS: dict[str, Any] = {f.name: getattr(Strategy(), f.name) for f in fields(Strategy)}


def _devices(entry: Mapping[str, Any]) -> list[str]:
    return sorted({s["device"] for s in entry.get("stages") or []})


def _knob_diff(best: Mapping[str, Any], alt: Mapping[str, Any]) -> str:
    bs, as_ = best["strategy"], alt["strategy"]

    def knob(s: Mapping[str, Any], k: str) -> Any:  # omitted from a stored strategy: its default
        return s.get(k, KNOB_DEFAULTS.get(k))

    parts = [f"{k}={knob(as_, k)}" for k in KNOBS if knob(as_, k) != knob(bs, k)]
    if _devices(alt) != _devices(best):
        parts.append("on " + "+".join(_devices(alt)))
    return ", ".join(parts) or "different stage split"


def why_alternative_lost(best: Mapping[str, Any], alt: Mapping[str, Any], gpus_per_node: int) -> dict[str, Any]:
    p, a = best["prediction"], alt["prediction"]
    deltas: dict[str, float] = {k: a["breakdown_s"][k] - p["breakdown_s"][k] for k in p["breakdown_s"]}
    worst = max(deltas, key=lambda k: deltas[k])
    base = p["breakdown_s"][worst]
    rel = f"+{deltas[worst] / base * 100:.0f}% {worst}" if base > 1e-9 else f"+{deltas[worst]:.3g} s {worst}"
    if alt["strategy"].get("tp", 1) > gpus_per_node:
        rel = f"tp={alt['strategy']['tp']} crosses nodes: {rel}"
    change = a["step_time_s"] / p["step_time_s"] - 1.0
    diff = _knob_diff(best, alt)
    return {
        "changes": diff,
        "step_time_change_fraction": change,
        "main_term": worst,
        "text": f"{diff}: step {change * 100:+.1f}% ({rel})",
    }


def explain(best: Mapping[str, Any], alternatives: Sequence[Mapping[str, Any]], gpus_per_node: int) -> dict[str, Any]:
    """``alternatives[i]`` of the result is explained by ``explanation["alternatives"][i]``."""
    p = best["prediction"]
    terms = dict(p["breakdown_s"])
    non_compute: dict[str, float] = {k: v for k, v in terms.items() if k != "compute"}
    top_overhead = max(non_compute, key=lambda k: non_compute[k]) if non_compute else None
    stages = p["stages"]
    tight = max(stages, key=lambda s: s["peak_memory_GB"] / s["memory_capacity_GB"])
    summary = (
        f"{p['step_time_s']:.3g} s per step, {p['tokens_per_s']:,.0f} tokens/s, MFU {p['mfu'] * 100:.1f}%; "
        f"{terms['compute'] / p['step_time_s'] * 100:.0f}% compute"
    )
    if top_overhead:
        summary += f", largest overhead {top_overhead} {non_compute[top_overhead] / p['step_time_s'] * 100:.1f}%"
    return {
        "bottleneck": p["bottleneck"],
        "largest_overhead": top_overhead,
        "summary": summary,
        "memory_headroom_GB": round(tight["memory_capacity_GB"] - tight["peak_memory_GB"], 2),
        "tightest_stage": tight["index"],
        "alternatives": [why_alternative_lost(best, a, gpus_per_node)["text"] for a in alternatives],
    }
