"""The README's benchmark commands are too slow for the suite, but the requests they send are
checked here: every case of ``bench/plan_speed.py`` (``make bench-plan``) is a plan request the
service accepts — its ``target_s`` is the benchmark's own and is not sent (the warm-up once sent
it, and the command stopped on a 422 before timing anything)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from planner_service.planner.request import parse_plan_request

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _plan_speed():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("bench_plan_speed", BENCH / "plan_speed.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


PLAN_SPEED = _plan_speed()


@pytest.mark.parametrize("name", [*PLAN_SPEED.CASES, *PLAN_SPEED.FRONTIER])
def test_every_plan_speed_case_is_a_request_the_service_takes(name):
    case = {**PLAN_SPEED.CASES, **PLAN_SPEED.FRONTIER}[name]
    body = PLAN_SPEED.request_body(case)
    assert "target_s" not in body and case["target_s"] > 0
    parse_plan_request(body)
