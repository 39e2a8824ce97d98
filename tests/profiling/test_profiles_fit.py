"""Calibration: validation, least-squares fit, application to a device, effect on estimate()."""

from __future__ import annotations

import copy
import json

import pytest

from cost_model import Strategy, Training, estimate, get_preset, simple_cluster
from cost_model.compute import gemm_time_s
from cost_model.devices import get_device
from cost_model.errors import InvalidProfile
from cost_model.profiles import (
    MAX_PROFILE_BYTES,
    apply_profile,
    content_hash,
    fit_profile,
    parse_profile_bytes,
    profile_matches,
    validate_profile,
    with_fit,
)
from helpers.profiles import TRUE_EFF, scale, synthetic_profile, true_device


def test_fit_recovers_the_parameters_it_was_generated_with():
    fit = fit_profile(synthetic_profile())
    e = fit["efficiency"]
    assert e["gemm_max_fraction"] == pytest.approx(TRUE_EFF.gemm_max_fraction, rel=0.03)
    assert e["gemm_half_dim"] == pytest.approx(TRUE_EFF.gemm_half_dim, rel=0.15)
    assert e["gemm_half_k"] == pytest.approx(TRUE_EFF.gemm_half_k, rel=0.15)
    assert e["memory_fraction"] == pytest.approx(TRUE_EFF.memory_fraction, rel=0.03)
    assert e["kernel_overhead_s"] == pytest.approx(TRUE_EFF.kernel_overhead_s, rel=0.2)
    assert e["nvlink_fraction"] == pytest.approx(TRUE_EFF.nvlink_fraction, rel=0.02)
    assert e["collective_latency_s"] == pytest.approx(TRUE_EFF.collective_latency_s, rel=0.05)
    assert fit["quality"]["gemm"]["median_abs_rel_error"] < 0.01
    assert fit["quality"]["memory"]["max_abs_rel_error"] < 0.02
    assert fit["quality"]["collectives"]["max_abs_rel_error"] < 0.02
    assert fit["device_overrides"] == {}


def test_applied_profile_reproduces_the_measured_gemm_times():
    prof = synthetic_profile()
    dev = apply_profile(get_device("A100-SXM4-80GB"), prof)
    truth = true_device()
    assert dev.profile_id and dev.efficiency.source.startswith("profile")
    for m, n, k in ((512, 512, 512), (2048, 8192, 1024), (16384, 4096, 4096)):
        assert float(gemm_time_s(m, n, k, dev, "bf16")) == pytest.approx(float(gemm_time_s(m, n, k, truth, "bf16")), rel=0.03)


def test_secondary_dtype_rate_becomes_a_corrected_peak():
    prof = synthetic_profile(dtypes=("bf16", "fp32"), collectives=False)
    # fp32 GEMMs measured 1.5x slower than the catalog's fp32 peak implies
    for m in prof["measurements"]:
        if m["op"] == "gemm" and m["dtype"] == "fp32":
            scale(m, 1.5)
    fit = fit_profile(prof)
    catalog_fp32 = get_device("A100-SXM4-80GB").fp32_tflops
    assert fit["device_overrides"]["fp32_tflops"] == pytest.approx(catalog_fp32 / 1.5, rel=0.05)
    assert "bf16_tflops" not in fit["device_overrides"]


def test_rates_above_the_catalog_replace_the_catalog_figures():
    # local-cpu's peak is a generic guess: a faster measured CPU raises it (fraction capped at 1)
    prof = synthetic_profile("local-cpu", dtypes=("fp32",), collectives=False, eff=TRUE_EFF.__class__(
        gemm_max_fraction=1.0, gemm_half_dim=16.0, memory_fraction=1.0, nvlink_fraction=1.0, nic_fraction=1.0,
        collective_latency_s=1e-4, kernel_overhead_s=3e-6, gemm_half_k=8.0))
    for m in prof["measurements"]:
        scale(m, 0.5)  # twice the catalog's peak and bandwidth (and half the overhead)
    fit = fit_profile(prof)
    cpu = get_device("local-cpu")
    assert fit["efficiency"]["gemm_max_fraction"] == 1.0
    assert fit["device_overrides"]["fp32_tflops"] == pytest.approx(2 * cpu.fp32_tflops, rel=0.05)
    assert fit["device_overrides"]["memory_bandwidth_GBps"] == pytest.approx(2 * cpu.memory_bandwidth_GBps, rel=0.05)
    assert any("exceeds the catalog" in w for w in fit["warnings"])


def test_disturbed_measurements_are_left_out_but_model_misfits_stay():
    prof = synthetic_profile(collectives=False)
    gemms = [m for m in prof["measurements"] if m["op"] == "gemm"]
    for m in gemms[:4]:
        scale(m, 6.0)  # preempted runs: the runner recorded the contention
        m["host_busy_cores"] = 1.4
    fit = fit_profile(prof)
    assert fit["efficiency"]["gemm_max_fraction"] == pytest.approx(TRUE_EFF.gemm_max_fraction, rel=0.03)
    assert any("left out 4 GEMM" in w for w in fit["warnings"])
    assert fit["quality"]["gemm"]["points"] == len(gemms) - 4
    # the same slow points on a quiet host are data the model must average over
    for m in gemms[:4]:
        m["host_busy_cores"] = 0.0
    fit = fit_profile(prof)
    assert not any("left out" in w for w in fit["warnings"])
    assert fit["quality"]["gemm"]["points"] == len(gemms)


def test_estimate_compute_time_scales_with_measured_gemm_speed():
    """A profile whose GEMMs run 2x faster than the catalog model makes the estimate's compute
    time about 2x smaller for that device; a profile equal to the catalog changes nothing."""
    name = "A100-SXM4-80GB"
    catalog_eff = get_device(name).efficiency
    model = get_preset("gpt3-13b")
    training = Training(global_batch_size=64, sequence_length=2048, dtype="bf16")
    cluster = simple_cluster(name, 1, 8)
    strategy = Strategy(dp=1, tp=8, pp=1, micro_batch_size=1)
    base = estimate(model, training, cluster, strategy)
    same = estimate(model, training, cluster, strategy, profile=synthetic_profile(name, eff=catalog_eff, collectives=False))
    fast = estimate(model, training, cluster, strategy, profile=synthetic_profile(name, eff=catalog_eff, collectives=False, gemm_scale=0.5))
    assert same.breakdown_s["compute"] == pytest.approx(base.breakdown_s["compute"], rel=0.03)
    ratio = fast.breakdown_s["compute"] / base.breakdown_s["compute"]
    assert 0.48 < ratio < 0.58, ratio  # GEMMs and attention halve; elementwise work does not
    assert fast.step_time_s < base.step_time_s
    assert fast.profile_ids and not base.profile_ids
    # everything measured 2x faster (memory-bound ops too): compute time halves
    all_fast = synthetic_profile(name, eff=catalog_eff, collectives=False)
    for m in all_fast["measurements"]:
        scale(m, 0.5)
    half = estimate(model, training, cluster, strategy, profile=all_fast)
    assert half.breakdown_s["compute"] / base.breakdown_s["compute"] == pytest.approx(0.5, rel=0.03)


def test_a_profile_keeps_whether_the_device_overlaps_communication():
    """Whether gradient reduction can hide behind compute is the kind of device's (CPUs share
    their cores with gloo), not something a profile's fit may change."""
    from dataclasses import replace

    cpu = synthetic_profile("local-cpu", dtypes=("fp32",), eff=replace(TRUE_EFF, comm_overlap_fraction=1.0))
    assert apply_profile(get_device("local-cpu"), cpu).efficiency.comm_overlap_fraction == 0.0
    assert apply_profile(get_device("A100-SXM4-80GB"), synthetic_profile()).efficiency.comm_overlap_fraction == 1.0


def test_profile_applies_only_to_its_own_device():
    prof = synthetic_profile()
    assert profile_matches(get_device("a100"), prof)  # alias of A100-SXM4-80GB
    assert not profile_matches(get_device("H100-SXM5-80GB"), prof)
    with pytest.raises(InvalidProfile) as exc:
        apply_profile(get_device("H100-SXM5-80GB"), prof)
    assert exc.value.field == "device.name"


def test_stored_fit_is_used_only_for_the_same_measurements():
    prof = with_fit(synthetic_profile(collectives=False))
    assert prof["fit"]["content_hash"] == content_hash(prof)
    forged = copy.deepcopy(prof)
    forged["fit"]["efficiency"]["gemm_max_fraction"] = 0.01
    dev = apply_profile(get_device("A100-SXM4-80GB"), forged)
    assert dev.efficiency.gemm_max_fraction == 0.01  # same measurements: the stored fit is used
    forged["measurements"][0]["seconds"] *= 1.0001  # edited measurements: refitted
    dev = apply_profile(get_device("A100-SXM4-80GB"), forged)
    assert dev.efficiency.gemm_max_fraction == pytest.approx(TRUE_EFF.gemm_max_fraction, rel=0.03)


@pytest.mark.parametrize(
    "mutate, field, words",
    [
        (lambda p: p.update(schema_version=0), "schema_version", "no longer supported"),
        (lambda p: p.update(schema_version=7), "schema_version", "newer"),
        (lambda p: p.pop("schema_version"), "schema_version", "required"),
        (lambda p: p.update(schema="something-else"), "schema", "expected"),
        (lambda p: p["device"].update(name="TPU-v5"), "device.name", "unknown device"),
        (lambda p: p.pop("device"), "device", "required"),
        (lambda p: p["measurements"][0].update(seconds=-1.0), "measurements[0].seconds", "positive"),
        (lambda p: p["measurements"][0].update(seconds=float("nan")), "measurements[0].seconds", "finite"),
        (lambda p: p["measurements"][0].update(op="conv"), "measurements[0].op", "unknown op"),
        (lambda p: p["measurements"][0]["shape"].update(m=0), "measurements[0].shape.m", "positive integer"),
        (lambda p: p["measurements"][0].update(dtype="int4"), "measurements[0].dtype", "one of"),
        (lambda p: p["measurements"][0]["spread"].update(min_s=1e9), "measurements[0].spread.min_s", ""),
        (lambda p: p.update(measurements=[]), "measurements", "non-empty"),
        (lambda p: p["measurements"][-1].update(group_size=1), "group_size", "at least 2"),
    ],
)
def test_bad_profiles_are_rejected_with_the_field(mutate, field, words):
    prof = synthetic_profile()
    mutate(prof)
    with pytest.raises(InvalidProfile) as exc:
        validate_profile(prof)
    assert exc.value.field.endswith(field)
    assert words in exc.value.message


def test_huge_and_malformed_files_are_rejected():
    with pytest.raises(InvalidProfile) as exc:
        parse_profile_bytes(b" " * (MAX_PROFILE_BYTES + 1))
    assert "limit" in exc.value.message
    with pytest.raises(InvalidProfile) as exc:
        parse_profile_bytes(b"{not json")
    assert "not valid JSON" in exc.value.message
    ok = parse_profile_bytes(json.dumps(synthetic_profile(collectives=False)))
    assert ok["device"]["name"] == "A100-SXM4-80GB"


def test_measured_op_overhead_pins_the_launch_term():
    prof = synthetic_profile(collectives=False)
    prof["measurements"].append({"op": "op_overhead", "backend": "torch", "autograd": False, "ops": 1, "seconds": 7e-6, "repeats": 5})
    fit = fit_profile(prof)
    assert fit["efficiency"]["kernel_overhead_s"] == pytest.approx(7e-6)
    assert fit["rates"]["kernel_overhead_source"] == "op_overhead measurement"
    assert fit["efficiency"]["gemm_max_fraction"] == pytest.approx(TRUE_EFF.gemm_max_fraction, rel=0.03)


def _cpu_elementwise_profile(rng_s: float, exp_s: float, touch_s_per_byte: float) -> tuple[dict, object]:
    """A local-cpu profile generated from the cost model's own functions with known per-element
    costs: plain streaming ops, GELU/softmax (exp-bound), dropout (RNG-bound), at sizes below
    and above the first-touch threshold, plus GEMMs."""
    from dataclasses import replace

    from cost_model.compute import first_touch_s, memory_bound_time_s

    base = get_device("local-cpu")
    dev = replace(base, efficiency=replace(base.efficiency, rng_s_per_element=rng_s, transcendental_s_per_element=exp_s,
                                           first_touch_s_per_byte=touch_s_per_byte))
    ms = []
    for d in (64, 256, 1024):
        for k in (64, 256, 1024):
            ms.append({"op": "gemm", "backend": "torch", "dtype": "fp32", "shape": {"m": d, "n": d, "k": k, "batch": 1},
                       "seconds": float(gemm_time_s(d, d, k, dev, "fp32"))})
    for e in (1 << 14, 1 << 18, 1 << 22, 1 << 24):
        for op, traffic in (("copy", 8), ("add", 12), ("gelu", 8), ("softmax", 8), ("dropout", 9)):
            out = e * 4 * (2 if op == "dropout" else 1)
            t = memory_bound_time_s(traffic * e, dev, rng_elements=e if op == "dropout" else 0.0,
                                    transcendental_elements=e if op in ("gelu", "softmax") else 0.0) + first_touch_s(out, dev)
            ms.append({"op": op, "backend": "torch", "dtype": "fp32", "bytes": traffic * e, "kernels": 1, "output_bytes": out,
                       "shape": {"elements": e, "row": 1024}, "seconds": float(t)})
    prof = {"schema": "planner-profile", "schema_version": 1, "source": "microbenchmark", "device": {"name": "local-cpu", "kind": "cpu"},
            "measurements": ms}
    return prof, dev


def test_fit_recovers_per_element_costs_and_first_touch():
    prof, truth = _cpu_elementwise_profile(rng_s=15e-9, exp_s=1.2e-9, touch_s_per_byte=0.5e-9)
    e = fit_profile(prof)["efficiency"]
    assert e["rng_s_per_element"] == pytest.approx(15e-9, rel=0.05)
    assert e["transcendental_s_per_element"] == pytest.approx(1.2e-9, rel=0.05)
    assert e["first_touch_s_per_byte"] == pytest.approx(0.5e-9, rel=0.1)
    assert e["first_touch_min_bytes"] == truth.efficiency.first_touch_min_bytes
    assert fit_profile(prof)["quality"]["memory"]["median_abs_rel_error"] < 0.05
    # exp that the bytes already explain is memory-bound: no arithmetic term
    cheap, _ = _cpu_elementwise_profile(rng_s=15e-9, exp_s=0.05e-9, touch_s_per_byte=0.0)
    e2 = fit_profile(cheap)["efficiency"]
    assert e2["transcendental_s_per_element"] == 0.0 and e2["first_touch_s_per_byte"] == 0.0


def test_rng_bound_dropout_makes_a_dropout_model_slower_not_a_llama():
    """The measured RNG cost applies where the model draws random numbers: a GPT-style model
    (dropout) gets slower in proportion to its dropout elements; a Llama-style model (no
    dropout) keeps its time."""
    slow_rng, _ = _cpu_elementwise_profile(rng_s=40e-9, exp_s=1.2e-9, touch_s_per_byte=0.5e-9)
    fast_rng, _ = _cpu_elementwise_profile(rng_s=10e-9, exp_s=1.2e-9, touch_s_per_byte=0.5e-9)
    training = Training(global_batch_size=4, sequence_length=256, dtype="fp32", attention="unfused")
    cluster = simple_cluster("local-cpu", 1, 1)
    from cost_model import from_hf_config

    gpt = from_hf_config({"model_type": "gpt2", "n_layer": 2, "n_embd": 256, "n_head": 4, "vocab_size": 4096, "n_positions": 256})
    llama = from_hf_config({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4,
                            "intermediate_size": 688, "vocab_size": 4096, "max_position_embeddings": 256})
    strategy = Strategy(micro_batch_size=4)
    g_slow = estimate(gpt, training, cluster, strategy, profile=slow_rng).step_time_s
    g_fast = estimate(gpt, training, cluster, strategy, profile=fast_rng).step_time_s
    # dropout elements per step: each layer's attention probabilities and two residual branches, plus the embeddings
    b, s, h, a, L = 4, 256, 256, 4, 2
    rng_elements = L * (b * a * s * s + 2 * b * s * h) + b * s * h
    assert g_slow - g_fast == pytest.approx(rng_elements * 30e-9, rel=0.1)
    l_slow = estimate(llama, training, cluster, strategy, profile=slow_rng).step_time_s
    l_fast = estimate(llama, training, cluster, strategy, profile=fast_rng).step_time_s
    assert l_slow == pytest.approx(l_fast, rel=1e-9)
