"""Observed runs: parsers of what launched jobs print (Megatron-LM, torchtitan, DeepSpeed,
PaddleNLP, PyTorch profiler traces, plain JSON/CSV) and the summary of one observation (warm-up
and outliers dropped, checked against the plan it claims to be a run of)."""

from planner_service.observations.parsers import FORMATS, InvalidObservation, ParsedLog, parse_log
from planner_service.observations.summary import (
    ObservationMismatch,
    check_matches,
    observed_peak_GB,
    plan_facts,
    summarize,
)

__all__ = ["FORMATS", "InvalidObservation", "ObservationMismatch", "ParsedLog", "check_matches", "observed_peak_GB", "parse_log", "plan_facts", "summarize"]
