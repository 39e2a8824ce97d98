"""The per-cluster MAP fit (cost_model.cluster_calibration): it recovers constants the world
really has, one observation moves them only part of the way (the prior), intervals shrink as
observations accumulate, bounds hold, and applying constants scales exactly the fractions named."""

from __future__ import annotations

import math

import pytest

from cost_model import Strategy, Training, cluster_from_dict, from_hf_config
from cost_model.cluster_calibration import (
    ObservedRun,
    apply_constants,
    constants_for,
    fit_cluster,
    predicted_step_s,
)

CPU = cluster_from_dict({"name": "host", "node_groups": [{"name": "cpu", "count": 1, "gpus_per_node": 1, "device": "local-cpu"}]})
A100x2 = cluster_from_dict({"name": "two", "node_groups": [{"name": "g", "count": 2, "gpus_per_node": 8, "device": "A100-SXM4-80GB"}]})


def _cpu_run(layers: int, hidden: int, seq: int, mb: int, observed: float = 1.0) -> ObservedRun:
    model = from_hf_config({"n_layer": layers, "n_embd": hidden, "n_head": max(1, hidden // 64), "vocab_size": 8192, "n_positions": seq,
                            "model_type": "gpt2"}, name=f"m{layers}x{hidden}")
    training = Training(global_batch_size=mb, sequence_length=seq, dtype="fp32", attention="unfused", fused_kernels=False, grad_reduce_overlap=False)
    return ObservedRun(model=model, training=training, cluster=CPU, strategy=Strategy(micro_batch_size=mb), observed_step_s=observed)


SHAPES = [(4, 256, 256, 8), (2, 768, 512, 2), (6, 128, 128, 4), (4, 512, 128, 8), (3, 384, 256, 4), (8, 256, 128, 8)]
TRUTH = {"gemm_efficiency.cpu": 2.0, "memory_efficiency.cpu": 1.5}


def _observed(truth):
    out = []
    for s in SHAPES:
        run = _cpu_run(*s)
        out.append(ObservedRun(**{**run.__dict__, "observed_step_s": predicted_step_s(run, truth)}))
    return out


def test_apply_constants_scales_the_named_fractions_only():
    c = apply_constants(A100x2, {"gemm_efficiency.ampere": 0.5, "fabric_efficiency.infiniband": 0.5, "gemm_efficiency.hopper": 0.1})
    e0, e1 = A100x2.node_groups[0].device.efficiency, c.node_groups[0].device.efficiency
    assert e1.gemm_max_fraction == pytest.approx(e0.gemm_max_fraction * 0.5)
    assert e1.nic_fraction == pytest.approx(e0.nic_fraction * 0.5)
    assert e1.memory_fraction == e0.memory_fraction and e1.nvlink_fraction == e0.nvlink_fraction
    # a GPU's fractions stay <= 1; a CPU's guessed peak may be exceeded
    assert apply_constants(A100x2, {"gemm_efficiency.ampere": 5.0}).node_groups[0].device.efficiency.gemm_max_fraction == 1.0
    assert apply_constants(CPU, {"gemm_efficiency.cpu": 5.0}).node_groups[0].device.efficiency.gemm_max_fraction > 1.0
    assert apply_constants(A100x2, {}) is A100x2


def test_constants_depend_on_what_the_run_uses():
    single = ObservedRun(model=_cpu_run(2, 128, 128, 2).model, training=Training(global_batch_size=8, sequence_length=128),
                         cluster=A100x2, strategy=Strategy(dp=8, micro_batch_size=1), observed_step_s=1.0)
    names = constants_for(single)
    assert "intra_node_efficiency.ampere" in names and "fabric_efficiency.infiniband" not in names
    across = ObservedRun(**{**single.__dict__, "strategy": Strategy(dp=16, micro_batch_size=1), "training": Training(global_batch_size=16, sequence_length=128)})
    assert "fabric_efficiency.infiniband" in constants_for(across)
    assert constants_for(_cpu_run(2, 128, 128, 2)) == ["dispatch_overhead.cpu", "framework_efficiency.megatron-core", "gemm_efficiency.cpu", "memory_efficiency.cpu"]


def test_fit_recovers_the_truth_and_the_prior_tempers_one_observation():
    runs = _observed(TRUTH)
    full = fit_cluster(runs)
    for r in runs:  # every observation explained (to within what the prior holds back)
        assert abs(math.log(predicted_step_s(r, full.values) / r.observed_step_s)) < 0.05
    assert max(abs(x) for x in full.prior_residuals) > 0.3  # the catalog alone was far off
    one = fit_cluster(runs[:1])
    moved = abs(one.residuals[0])
    assert 0 < moved < abs(one.prior_residuals[0])  # part of the way, not all (the prior)
    # more evidence: smaller posterior spread of the GEMM constant and a smaller residual spread
    assert full.log_sd["gemm_efficiency.cpu"] < one.log_sd["gemm_efficiency.cpu"]
    assert full.residual_log_sd < one.residual_log_sd


def test_no_observation_is_an_error():
    with pytest.raises(ValueError):
        fit_cluster([])
