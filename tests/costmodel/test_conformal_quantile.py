"""The step-time intervals' quantiles are finite-sample (split-conformal) order statistics."""

import random

from cost_model.validation.fidelity import conformal_quantile, quantile


def test_order_statistics_of_a_small_sample():
    v = [float(i) for i in range(1, 10)]  # n = 9: (n+1)·0.9 = 9 → the largest, (n+1)·0.1 = 1 → the smallest
    assert conformal_quantile(v, 0.9) == 9.0
    assert conformal_quantile(v, 0.1) == 1.0
    # wider than the interpolated sample quantile
    assert quantile(v, 0.9) < 9.0 and quantile(v, 0.1) > 1.0


def test_clamped_to_the_sample_and_empty_is_nan():
    assert conformal_quantile([1.0, 2.0, 3.0], 0.9) == 3.0
    assert conformal_quantile([1.0, 2.0, 3.0], 0.1) == 1.0
    x = conformal_quantile([], 0.9)
    assert x != x


def test_coverage_of_a_new_draw_is_at_least_nominal():
    rng = random.Random(7)
    inside = trials = 0
    for _ in range(4000):
        sample = [rng.gauss(0.0, 1.0) for _ in range(8)]
        lo, hi = conformal_quantile(sample, 0.1), conformal_quantile(sample, 0.9)
        inside += lo <= rng.gauss(0.0, 1.0) <= hi
        trials += 1
    # n = 8: the sample's minimum and maximum (clamped) → coverage 7/9 ≈ 0.78;
    # the interpolated quantiles of 8 draws cover ≈ 0.64
    assert inside / trials >= 0.74
