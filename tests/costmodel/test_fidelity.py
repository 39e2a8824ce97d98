"""The cost model against published measured runs (the figures in README come from
bench/fidelity.py, which uses the same functions)."""

import statistics

import pytest

from cost_model.validation.fidelity import layer_table4, predict_case
from cost_model.validation.published import cases


@pytest.fixture(scope="module")
def errors():
    out = {}
    for case in cases():
        est, _ = predict_case(case)
        assert est is not None, f"{case.row_id}: no candidate of the published layout fits"
        out[case.row_id] = (est.step_time_s - case.measured_step_s) / case.measured_step_s
    return out


def test_every_usable_row_is_predicted(errors):
    assert len(errors) >= 35


def test_median_error_within_7_percent(errors):
    assert statistics.median(abs(e) for e in errors.values()) <= 0.07


def test_no_row_worse_than_20_percent(errors):
    worst = max(errors, key=lambda k: abs(errors[k]))
    assert abs(errors[worst]) <= 0.20, (worst, errors[worst])


def test_korthikanti_table4_forward_and_backward_within_10_percent():
    rows = layer_table4()
    assert len(rows) == 5
    for r in rows:
        assert abs(r["forward_error"]) <= 0.10, r
        assert abs(r["backward_error"]) <= 0.10, r
