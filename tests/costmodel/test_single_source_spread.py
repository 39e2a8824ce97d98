"""An estimate whose step rests on a constant fitted on one source (DeepSpeed's stage-3
constants: Narayanan et al. 2021 Table 2 alone) carries an interval that spans the step at that
constant's prior — what leave-one-source-out cross-validation predicts any other source's run
with — and says so; one that rests on no such constant keeps the regime's interval."""

import math

import pytest

from cost_model.cluster import cluster_from_dict
from cost_model.estimate import estimate
from cost_model.strategy import Strategy
from cost_model.training import training_from_dict
from cost_model.transformer import calibration as cal
from cost_model.transformer.spec import get_preset

CLUSTER = cluster_from_dict({"name": "c", "node_groups": [{"name": "a", "count": 1, "gpus_per_node": 8, "device": "A100-SXM4-80GB"}]})
MODEL = get_preset("llama2-7b")
DEEPSPEED = training_from_dict({"global_batch_size": 32, "sequence_length": 4096, "framework": "deepspeed"})
STAGE3 = ("sharded_collective_efficiency.megatron-deepspeed", "sharded_compute_efficiency.megatron-deepspeed",
          "sharded_prefetch_overlap.megatron-deepspeed")


def _strategy(zero_stage: int) -> Strategy:
    return Strategy(dp=8, zero_stage=zero_stage, micro_batch_size=4, recompute="full")


def test_a_deepspeed_stage3_step_spans_its_single_source_constants_priors():
    est = estimate(MODEL, DEEPSPEED, CLUSTER, _strategy(3))
    values = dict(cal.current().values)
    assert any(values[n] != cal.PRIORS[n] for n in STAGE3), "the fit moved none of them: nothing to test"
    with cal.using(cal.Constants({**values, **{n: cal.PRIORS[n] for n in STAGE3}})):
        at_priors = estimate(MODEL, DEEPSPEED, CLUSTER, _strategy(3), spread_single_source=False).step_time_s
    assert abs(at_priors / est.step_time_s - 1.0) > 0.05
    assert est.step_time_s_p10 <= min(at_priors, est.step_time_s) + 1e-9
    assert est.step_time_s_p90 >= max(at_priors, est.step_time_s) - 1e-9
    assert at_priors in (pytest.approx(est.step_time_s_p10), pytest.approx(est.step_time_s_p90))
    (note,) = [w for w in est.warnings if "single source" in w]
    assert "Narayanan2021_Table2" in note and all(n in note for n in STAGE3)
    assert f"{at_priors:.3g} s" in note


def test_without_the_spread_the_interval_is_the_regimes_own():
    est = estimate(MODEL, DEEPSPEED, CLUSTER, _strategy(3), spread_single_source=False)
    q = cal.step_interval_log("deepspeed", "ampere", "zero3")
    assert est.step_time_s_p10 == pytest.approx(est.step_time_s / math.exp(q[1]))
    assert not [w for w in est.warnings if "single source" in w]


def test_a_run_no_single_source_constant_prices_keeps_the_regimes_interval():
    """ZeRO-2 under DeepSpeed does not run stage 3's gathers: none of the three prices it."""
    est = estimate(MODEL, DEEPSPEED, CLUSTER, _strategy(2))
    assert est.step_time_s_p10 == estimate(MODEL, DEEPSPEED, CLUSTER, _strategy(2), spread_single_source=False).step_time_s_p10
    assert not [w for w in est.warnings if "single source" in w]


def test_constants_fitted_nowhere_else_are_not_spread_under_cross_validations_own_constants():
    """Cross-validation (and any caller that sets its own constants) carries no single-source
    bookkeeping: its intervals are its own."""
    with cal.using(cal.Constants(dict(cal.current().values))):
        est = estimate(MODEL, DEEPSPEED, CLUSTER, _strategy(3))
    assert not [w for w in est.warnings if "single source" in w]


def test_no_warning_where_the_regimes_interval_already_holds_the_step_at_the_priors():
    """FP8 GEMMs rest on Megatron-Bridge's rows alone, but the fitted value is close enough to its
    prior that the Hopper pipeline regime's interval already holds the step at the prior: the
    interval is the regime's and nothing is said."""
    model = get_preset("llama3-70b")
    training = training_from_dict({"global_batch_size": 128, "sequence_length": 8192, "dtype": "fp8"})
    cluster = cluster_from_dict({"name": "c", "node_groups": [{"name": "h", "count": 8, "gpus_per_node": 8, "device": "H100-SXM5-80GB"}]})
    strategy = Strategy(dp=4, tp=4, pp=4, vpp=5, micro_batch_size=1, sequence_parallel=True, recompute="full")
    spread = cal.single_source_spread(model, training, cluster, strategy)
    assert spread is not None and set(spread[1]) == {"fp8_gemm_efficiency"}
    est = estimate(model, training, cluster, strategy)
    plain = estimate(model, training, cluster, strategy, spread_single_source=False)
    with cal.using(spread[0]):
        at_prior = estimate(model, training, cluster, strategy, spread_single_source=False).step_time_s
    assert abs(at_prior / est.step_time_s - 1.0) > 0.005  # the prior moves the step (fitted 0.91, prior 0.9)
    assert plain.step_time_s_p10 <= at_prior <= plain.step_time_s_p90
    assert (est.step_time_s_p10, est.step_time_s_p90) == (plain.step_time_s_p10, plain.step_time_s_p90)
    assert not [w for w in est.warnings if "single source" in w]
