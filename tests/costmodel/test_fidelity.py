"""The cost model against published measured runs, at the constants stored in
cost_model/data/calibration.json (the README's figures come from bench/fidelity.py, which uses
the same functions and adds the leave-one-source-out cross-validation)."""

import hashlib
import statistics
from pathlib import Path

import pytest

from cost_model.transformer.calibration import PRIORS, stored_document
from cost_model.validation.fidelity import evaluate_all, layer_table4, summarise
from cost_model.validation.published import PublishedCase, all_rows

MEGATRON_LM = ("Narayanan2021_Table1", "Korthikanti2022", "MegatronLM_README_2020", "MegatronLM_README_H100")


@pytest.fixture(scope="module")
def results():
    return evaluate_all()


@pytest.fixture(scope="module")
def summary(results):
    return summarise(results)


def test_every_end_to_end_row_is_read():
    rows = list(all_rows())
    assert len(rows) >= 175  # 187 rows less 5 single-layer rows, 1 without a result
    assert sum(isinstance(r, PublishedCase) for r in rows) >= 155


def test_megatron_lm_rows_stay_within_7_percent_median_and_20_percent_worst(results):
    errs = {r.row_id: r.error for r in results if r.source in MEGATRON_LM and r.error is not None}
    assert len(errs) >= 42
    assert statistics.median(abs(e) for e in errs.values()) <= 0.07
    worst = max(errs, key=lambda k: abs(errs[k]))
    assert abs(errs[worst]) <= 0.20, (worst, errs[worst])


def test_whole_file_in_sample(summary):
    assert summary["rows_predicted"] >= 150
    # issue 13's in-sample target (8%): the fit is regularised toward the priors and weighted
    # per source, so the in-sample figure no longer follows the largest source alone
    assert summary["median_abs_error"] <= 0.08
    assert summary["p90_abs_error"] <= 0.20


def test_every_failure_says_why(summary):
    for f in summary["failed_to_plan"]:
        assert f["reason"], f
    # issue 13: at most 3 usable rows fail to plan (today the two Llama 3 405B 8K rows, whose
    # stated layout without recompute is predicted over 80 GB)
    assert len(summary["failed_to_plan"]) <= 3


def test_bloom_sweep_peaks_within_15_percent(summary):
    assert summary["memory_rows"] >= 40
    assert summary["memory_median_abs_error"] <= 0.15


def test_measured_ooms_and_the_bloom_sweep(summary):
    not_fit, total = (int(x) for x in summary["oom_predicted_not_to_fit"].split("/"))
    assert total == 6 and not_fit >= 5
    # 0.76 before the Omni-Path fraction was bounded to a physical >= 0.5 (it was fitted to 0.22,
    # ranking the sweep through an implausible fabric); issue 13's target is 0.8 (not reached)
    assert summary["bloom_sweep_spearman"] >= 0.6


def test_stored_constants_come_from_this_data_file():
    doc = stored_document()
    data = (Path(__file__).resolve().parents[2] / "cost_model" / "data" / "published_runs.json").read_bytes()
    assert doc["provenance"]["data_sha256"] == hashlib.sha256(data).hexdigest()
    assert set(doc["constants"]) == set(PRIORS)  # global constants only: nothing per row or model


def test_korthikanti_table4_forward_and_backward_within_10_percent():
    rows = layer_table4()
    assert len(rows) == 5
    for r in rows:
        assert abs(r["forward_error"]) <= 0.10, r
        assert abs(r["backward_error"]) <= 0.10, r
