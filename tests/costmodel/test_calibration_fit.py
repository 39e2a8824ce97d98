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
    regime_intervals,
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


def test_regime_intervals_are_signed_per_regime_and_symmetric_when_pooled():
    """A regime with rows of two sources gets its own signed (q10, q90); the pooled fallback —
    for a regime whose bias is unknown in sign — is ± the 80% bound, across sources, of each
    source's 80% bound of |log(1 + error)|."""
    from cost_model.strategy import Strategy
    from cost_model.validation.fidelity import RowResult, conformal_quantile

    def row(i: int, source: str, framework: str, error: float) -> RowResult:
        return RowResult(row_id=f"r{i}", group=source, source=source, status="ok", framework=framework, device_family="ampere",
                         measured_step_s=1.0, predicted_step_s=1.0 + error, fits=True, failure=None,
                         strategy=Strategy(dp=8), estimate=None)

    errors = [-0.2, -0.15, -0.1, -0.08, -0.05, -0.04, 0.01, 0.02, 0.03, 0.05]  # biased low
    rows = [row(i, "A" if i % 2 else "B", "megatron-core", e) for i, e in enumerate(errors)] + [row(99, "C", "fsdp", 0.3)]
    errs = {r.row_id: r.predicted_step_s - 1.0 for r in rows}
    iv = regime_intervals(rows, errs)
    own = [math.log1p(e) for e in errors]
    assert iv["megatron-core/ampere"] == (round(conformal_quantile(own, 0.1), 4), round(conformal_quantile(own, 0.9), 4))
    assert "fsdp/ampere" not in iv  # one source, one row: falls back to the pooled interval
    per_source = [conformal_quantile([abs(math.log1p(errs[r.row_id])) for r in rows if r.source == s], 0.8) for s in "ABC"]
    q = round(conformal_quantile(per_source, 0.8), 4)
    lo, hi = iv["megatron-core/ampere"]
    assert iv["*"] == (-q, q) and q > 0 and hi < -lo  # the regime keeps its low bias; the pooled does not


def test_the_pooled_fallback_is_bounded_over_sources_not_set_by_the_largest():
    """A new regime is a new group: one source with many tight rows does not narrow its
    interval below what the other sources' errors say (pooling rows, it would: 50 rows at ±1%
    against two sources at 15%)."""
    from cost_model.strategy import Strategy
    from cost_model.validation.fidelity import RowResult, conformal_quantile

    def row(i: int, source: str, error: float) -> RowResult:
        return RowResult(row_id=f"r{i}", group=source, source=source, status="ok", framework="megatron-core", device_family="ampere",
                         measured_step_s=1.0, predicted_step_s=1.0 + error, fits=True, failure=None,
                         strategy=Strategy(dp=8), estimate=None)

    rows = [row(i, "big", 0.01 if i % 2 else -0.01) for i in range(50)] + [row(100, "B", 0.15), row(101, "C", -0.15)]
    errs = {r.row_id: r.predicted_step_s - 1.0 for r in rows}
    lo, hi = regime_intervals(rows, errs)["*"]
    assert hi == -lo == round(abs(math.log1p(-0.15)), 4)
    pooled_rows = conformal_quantile([abs(math.log1p(e)) for e in errs.values()], 0.8)
    assert pooled_rows < 0.02 < hi


# ---- constants one source informs: the estimate's interval spans their priors ----------------

def test_the_stored_single_source_constants_are_what_the_calibration_writes():
    """calibration.json's ``single_source_constants`` is the fit's own bookkeeping
    (``informing_sources``), not a hand-kept list: DeepSpeed's stage-3 trio rests on Narayanan
    et al. 2021's ZeRO-3 runs alone, the kernel constant of DeepSpeed's engine on four sources."""
    from cost_model.transformer.calibration import stored_document
    from cost_model.validation.calibration_fit import informing_sources

    informed = informing_sources(list(all_rows()))
    stored = stored_document()["single_source_constants"]
    assert stored == {n: s[0] for n, s in informed.items() if len(s) == 1}
    for name in ("sharded_compute_efficiency.megatron-deepspeed", "sharded_collective_efficiency.megatron-deepspeed",
                 "sharded_prefetch_overlap.megatron-deepspeed"):
        assert stored[name] == "Narayanan2021_Table2"
    assert len(informed["framework_gemm_efficiency.megatron-deepspeed"]) > 1
    assert "framework_gemm_efficiency.megatron-deepspeed" not in stored
