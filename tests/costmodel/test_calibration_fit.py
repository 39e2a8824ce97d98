"""The calibration fit (cost_model.validation.calibration_fit): responses tabulated one constant
at a time, coordinate descent over them, and the refit around the first fit that catches the
constants acting together."""

import math

import pytest

from cost_model.transformer.calibration import PRIORS
from cost_model.validation.calibration_fit import (
    build_tables,
    evaluate_at,
    fit,
    fit_recentred,
    objective,
    prior_penalty,
)
from cost_model.validation.published import PublishedCase, all_rows


@pytest.fixture(scope="module")
def zero3():
    """Narayanan 2021 Table 2's DeepSpeed ZeRO-3 rows: three DeepSpeed stage-3 constants and
    the kernel constant act on them together."""
    cases = [c for c in all_rows() if isinstance(c, PublishedCase) and "ZeRO-3" in c.row_id]
    assert len(cases) == 6
    prior = {r.row_id: r for r in evaluate_at(dict(PRIORS), cases)}
    return cases, prior, build_tables(cases, prior)


def _squared_log_error(constants, cases):
    return sum(math.log1p(r.error) ** 2 for r in evaluate_at(constants, cases))


def test_tables_centred_on_the_priors_reproduce_the_rows(zero3):
    cases, prior, tables = zero3
    assert tables.center == PRIORS
    for c in cases:
        assert tables.base[c.row_id] == pytest.approx(prior[c.row_id].log_error)


def test_refit_around_the_first_fit_beats_it_on_the_cost_model_itself(zero3):
    cases, prior, tables = zero3
    separable = fit(tables)
    recentred, centred = fit_recentred(tables, cases, prior)
    assert centred.center == {**PRIORS, **separable}
    # judged by the cost model, not by the tables either fit used
    assert _squared_log_error(recentred, cases) < _squared_log_error(separable, cases)
    # at their own centre the tables' objective is the rows' weighted squared log error plus the prior
    informed = {n for r in centred.response.values() for n in r}
    want = sum(b**2 / math.sqrt(len(cases)) for b in centred.base.values()) + sum(prior_penalty(centred.center[n] / PRIORS[n]) for n in informed)
    assert objective(centred, centred.center) == pytest.approx(want)


def test_constants_no_row_informs_keep_the_centre(zero3):
    cases, prior, tables = zero3
    out = fit(tables)
    assert out["fp8_gemm_efficiency"] == PRIORS["fp8_gemm_efficiency"]  # no FP8 row among them
    assert out["fabric_fraction.omnipath"] == PRIORS["fabric_fraction.omnipath"]  # no Omni-Path row either
