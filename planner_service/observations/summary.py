"""From a parsed log to one observed step time and peak memory, and the check that the log is
of the plan's run.

Warm-up and outliers (robust, documented in the API):

1. The first ``k`` entries are dropped: ``k`` as given (``warmup_steps``), else
   ``max(1, round(0.1·n))`` of ``n`` entries when ``n ≥ 4`` (the first steps compile, allocate,
   fill caches and autotune kernels; Megatron's first log interval contains them), else 0.
2. Of the rest, an entry whose modified z-score ``0.6745·|x − median| / MAD`` exceeds 3.5 is an
   outlier (Iglewicz & Hoaglin 1993: a checkpoint save, an evaluation pass, a straggler host)
   and dropped; the median absolute deviation is not moved by the outliers themselves as a
   standard deviation would be.  When more than half the entries are equal (MAD 0) the mean
   absolute deviation · 1.2533 scales the z-score instead (Iglewicz & Hoaglin's fallback).
3. At least :data:`MIN_STEPS` entries must remain (else the log is truncated: a 422).

The observed step time is the median of what remains; p10/p90 are its spread.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from planner_service.observations.parsers import InvalidObservation, ParsedLog

MIN_STEPS = 3
OUTLIER_Z = 3.5
#: The 0.75 quantile of the standard normal: MAD · 1/0.6745 estimates σ for normal data.
MAD_TO_SIGMA = 0.6745
#: σ / mean absolute deviation for normal data (sqrt(π/2)): the scale when the MAD is 0.
MEANAD_TO_SIGMA = 1.2533141373155001


class ObservationMismatch(InvalidObservation):
    """The log is of another model or layout than the plan's."""

    code = "observation_mismatch"


def plan_facts(model: Any, training: Any, strategy: Any) -> dict[str, Any]:
    """The plan's model, batch and layout in Megatron-LM's argument names (the vocabulary of
    :attr:`ParsedLog.header`)."""
    out: dict[str, Any] = {
        "seq_length": training.sequence_length,
        "global_batch_size": training.global_batch_size,
        "micro_batch_size": strategy.micro_batch_size,
        "local_batch_size": training.global_batch_size // max(1, strategy.dp),
        "tensor_model_parallel_size": strategy.tp,
        "pipeline_model_parallel_size": strategy.pp,
        "context_parallel_size": strategy.cp,
        "data_parallel_size": strategy.dp,
        "world_size": strategy.num_devices,
        "expert_model_parallel_size": strategy.ep,
        "virtual_pipeline_model_parallel_size": strategy.vpp,
        "sequence_parallel": strategy.sequence_parallel,
    }
    for name, attr in (("num_layers", "num_layers"), ("hidden_size", "hidden_size"), ("num_attention_heads", "num_heads"),
                       ("ffn_hidden_size", "ffn_hidden_size"), ("num_experts", "num_experts")):
        if hasattr(model, attr):
            out[name] = getattr(model, attr)
    if hasattr(model, "num_kv_heads") and hasattr(model, "num_heads") and model.num_kv_heads != model.num_heads:
        out["num_query_groups"] = model.num_kv_heads
    return out


#: Facts whose absence in a log means the framework default (Megatron prints None).
_DEFAULT_ONE = {"virtual_pipeline_model_parallel_size", "context_parallel_size", "expert_model_parallel_size", "num_experts"}


def mismatches(header: Mapping[str, Any], facts: Mapping[str, Any]) -> list[str]:
    """``name: log X, plan Y`` for every fact both sides state and disagree on."""
    out = []
    for name in sorted(set(header) & set(facts)):
        logged, planned = header[name], facts[name]
        if logged is None and name in _DEFAULT_ONE:
            logged = 1
        if logged is None or planned is None:
            continue
        if name == "num_experts" and {logged, planned} <= {0, 1}:
            continue
        if isinstance(planned, bool) or isinstance(logged, bool):
            if bool(logged) != bool(planned):
                out.append(f"{name}: log {logged}, plan {planned}")
            continue
        if isinstance(logged, (int, float)) and isinstance(planned, (int, float)):
            if not math.isclose(float(logged), float(planned), rel_tol=1e-9):
                out.append(f"{name}: log {logged:g}, plan {planned:g}")
        elif str(logged) != str(planned):
            out.append(f"{name}: log {logged}, plan {planned}")
    return out


def check_matches(parsed: ParsedLog, facts: Mapping[str, Any]) -> None:
    bad = mismatches(parsed.header, facts)
    if bad:
        raise ObservationMismatch(f"the {parsed.format} log is of another run than the plan: " + "; ".join(bad), field="log")


@dataclass(frozen=True, kw_only=True)
class Filtered:
    kept_s: tuple[float, ...]
    warmup_dropped: int
    outliers_dropped: int


def robust_steps(times: Sequence[float], warmup_steps: int | None = None) -> Filtered:
    """Drop warm-up, then modified-z-score outliers (module docstring)."""
    n = len(times)
    if warmup_steps is not None and (isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0):
        raise InvalidObservation(f"must be a non-negative integer, got {warmup_steps!r}", field="warmup_steps")
    k = warmup_steps if warmup_steps is not None else (max(1, round(0.1 * n)) if n >= 4 else 0)
    rest = [float(t) for t in times[k:] if isinstance(t, (int, float)) and math.isfinite(t) and t > 0]
    if len(rest) < MIN_STEPS:
        raise InvalidObservation(
            f"only {len(rest)} step time(s) after dropping {min(k, n)} warm-up entr{'y' if k == 1 else 'ies'} of {n}; "
            f"at least {MIN_STEPS} are needed (a truncated log?)",
            field="log",
        )
    med = statistics.median(rest)
    mad = statistics.median(abs(t - med) for t in rest)
    if mad > 0:
        kept = [t for t in rest if MAD_TO_SIGMA * abs(t - med) / mad <= OUTLIER_Z]
    else:  # more than half the steps equal: the mean absolute deviation scales the z-score
        mean_ad = statistics.fmean(abs(t - med) for t in rest)
        kept = rest if mean_ad == 0 else [t for t in rest if abs(t - med) / (MEANAD_TO_SIGMA * mean_ad) <= OUTLIER_Z]
    return Filtered(kept_s=tuple(kept), warmup_dropped=min(k, n), outliers_dropped=len(rest) - len(kept))


def _quantile(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def observed_peak_GB(summary: Mapping[str, Any]) -> float | None:
    """An observation summary's peak memory (GB of 10^9 bytes): the reserved peak the prediction
    is of, else the allocated one; None when the log reported neither."""
    peak = summary.get("peak_memory_reserved_GB") or summary.get("peak_memory_allocated_GB")
    return float(peak) if isinstance(peak, (int, float)) and peak > 0 else None


def summarize(parsed: ParsedLog, facts: Mapping[str, Any], warmup_steps: int | None = None) -> dict[str, Any]:
    """The observation's summary: step time (median after warm-up and outliers, p10, p90), the
    steps used and dropped, peak memory (the largest over the ranks reported, allocated and
    reserved), tokens/s, per-phase seconds, TFLOP/s and MFU as the log reported them."""
    tokens_per_step = float(facts["global_batch_size"]) * float(facts["seq_length"])
    devices = int(facts["world_size"])
    if parsed.needs_batch:
        times = [tokens_per_step / (t * devices) for t in parsed.tokens_per_s_per_device if t > 0]
    else:
        times = list(parsed.step_times_s)
    f = robust_steps(times, warmup_steps)
    step = statistics.median(f.kept_s)

    def peak(attr: str) -> float | None:
        vals = [getattr(m, attr) for m in parsed.memory if getattr(m, attr) is not None]
        return max(vals) if vals else None

    def med(xs: Sequence[float]) -> float | None:
        return statistics.median(xs[f.warmup_dropped:] or xs) if xs else None

    return {
        "format": parsed.format,
        "step_time_s": step,
        "step_time_s_p10": _quantile(f.kept_s, 0.1),
        "step_time_s_p90": _quantile(f.kept_s, 0.9),
        "steps_total": len(times),
        "steps_used": len(f.kept_s),
        "warmup_dropped": f.warmup_dropped,
        "outliers_dropped": f.outliers_dropped,
        "tokens_per_s": tokens_per_step / step,
        "peak_memory_allocated_GB": peak("max_allocated_GB") or peak("allocated_GB"),
        "peak_memory_reserved_GB": peak("max_reserved_GB") or peak("reserved_GB"),
        "memory_per_rank": [m.to_dict() for m in parsed.memory],
        "tflops_per_device": med(parsed.tflops_per_device),
        "mfu": med(parsed.mfu),
        "phases_s": dict(parsed.phases_s),
        "versions": dict(parsed.versions),
        "log_facts": dict(parsed.header),
        "notes": list(parsed.notes),
    }


__all__ = ["MIN_STEPS", "ObservationMismatch", "check_matches", "mismatches", "observed_peak_GB", "plan_facts", "robust_steps", "summarize"]
