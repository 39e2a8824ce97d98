"""FP4 (NVFP4) training: Blackwell's FP4 peaks in the catalog, the decoder's linear layers in
NVFP4 with their quantisation passes, attention and the head in BF16, FP4-saved activations,
the dtype through the request (4xx naming the field), and the published NVFP4 rows."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from cost_model import Strategy, Training, estimate, get_preset, simple_cluster
from cost_model.devices import BYTES_PER_ELEMENT, get_device
from cost_model.errors import InvalidCluster, InvalidTraining
from cost_model.topology import links_for_group
from cost_model.training import training_from_dict
from cost_model.transformer.layer_cost import StrategyArrays, activation_bytes, fp8_cast_s, nvfp4_cast_s
from cost_model.transformer.stage_cost import device_costs
from cost_model.validation.fidelity import evaluate_case
from cost_model.validation.published import PublishedCase, all_rows


@pytest.mark.parametrize(("name", "ratio"), [("B200-SXM-192GB", 2), ("GB200-NVL72-186GB", 2), ("GB300-NVL72-288GB", 3)])
def test_blackwell_fp4_peaks(name, ratio):
    dev = get_device(name)
    assert dev.peak_tflops("fp4") == ratio * dev.peak_tflops("fp8")  # Blackwell Ultra: 15 PF FP4 against 5 PF FP8
    assert "fp4" in dev.supported_dtypes()


def test_nvfp4_element_is_half_a_byte_plus_a_scale_per_16():
    assert BYTES_PER_ELEMENT["fp4"] == pytest.approx(0.5 + 1 / 16)


def _setup(dtype, recompute="none"):
    model = get_preset("llama3-70b")
    training = Training(global_batch_size=64, sequence_length=8192, dtype=dtype, tp_comm_overlap=True)
    s = Strategy(tp=2, pp=4, dp=8, micro_batch_size=1, sequence_parallel=True, recompute=recompute, zero_stage=1)
    return model, training, s


def test_fp4_is_faster_than_fp8_but_less_than_twice_on_gb200():
    cluster = simple_cluster("GB200-NVL72-186GB", 1, gpus_per_node=64)
    steps = {}
    for dt in ("bf16", "fp8", "fp4"):
        model, training, s = _setup(dt)
        steps[dt] = estimate(model, training, cluster, s).step_time_s
    assert steps["fp4"] < steps["fp8"] < steps["bf16"]
    # the GEMM peak doubles, but attention, the head and the elementwise work stay 16-bit and
    # the gradients are quantised twice
    assert steps["fp8"] / steps["fp4"] < 1.6


def test_attention_core_and_head_stay_bf16_under_fp4():
    model, training, s = _setup("fp4")
    dev = get_device("GB200-NVL72-186GB")
    cluster = simple_cluster("GB200-NVL72-186GB", 1, gpus_per_node=64)
    links = links_for_group(cluster.node_groups[0])
    S = StrategyArrays.from_strategies([s])
    costs = {dt: device_costs(model, replace(training, dtype=dt), dev, links, S) for dt in ("bf16", "fp8", "fp4")}
    assert np.allclose(costs["fp4"].head_s, costs["bf16"].head_s)
    assert np.allclose(costs["fp4"].embedding_s, costs["fp8"].embedding_s)
    assert (costs["fp4"].layer.forward_compute_s < costs["fp8"].layer.forward_compute_s).all()


def test_nvfp4_quantises_gradients_twice_and_moves_fewer_bytes_per_pass():
    dev = get_device("GB200-NVL72-186GB")
    T, h = 8192.0, 8192.0
    args = (T, h, 1.25 * h, h, 2 * 3.5 * h, 3.5 * h, dev)
    f8_fwd, f8_bwd = fp8_cast_s(*args)
    f4_fwd, f4_bwd = nvfp4_cast_s(*args)
    assert f4_fwd < f8_fwd  # 2.5625 against 3 bytes per element, same four tensors
    assert f4_bwd > f8_bwd  # dgrad (stochastic rounding) and wgrad (Hadamard) copies of each gradient
    assert f4_fwd == pytest.approx(f8_fwd * 2.5625 / 3.0, rel=0.05)


def test_fp4_saves_the_linear_inputs_in_fp4():
    model, training, s = _setup("fp4")
    S = StrategyArrays.from_strategies([s])
    stored = {dt: float(activation_bytes(model, replace(training, dtype=dt), S)[0][0]) for dt in ("bf16", "fp8", "fp4")}
    assert stored["fp4"] < stored["fp8"] < stored["bf16"]


def test_fp4_needs_a_device_with_an_fp4_peak_and_megatron_core():
    model, training, s = _setup("fp4")
    with pytest.raises(InvalidCluster) as err:
        estimate(model, training, simple_cluster("H100-SXM5-80GB", 8), s)
    assert err.value.field == "training.dtype"
    with pytest.raises(InvalidTraining) as err2:
        training_from_dict({"global_batch_size": 8, "sequence_length": 1024, "dtype": "fp4", "framework": "fsdp"})
    assert err2.value.field == "training.dtype"
    assert training_from_dict({"global_batch_size": 8, "sequence_length": 1024, "dtype": "fp4"}).dtype == "fp4"


def test_the_estimate_route_takes_fp4_and_names_a_bad_dtype(client):
    body = {
        "model": {"preset": "llama2-7b"},
        "training": {"global_batch_size": 16, "sequence_length": 2048, "dtype": "fp4"},
        "cluster": {"name": "c", "node_groups": [{"name": "g", "count": 1, "gpus_per_node": 8, "device": "B200-SXM-192GB"}]},
        "strategy": {"dp": 8, "micro_batch_size": 1},
    }
    ok = client.post("/v1/estimate", json=body)
    assert ok.status_code == 200, ok.text
    for bad_dtype, device in (("nvfp4", "B200-SXM-192GB"), ("fp4", "H100-SXM5-80GB")):
        bad = {**body, "training": {**body["training"], "dtype": bad_dtype},
               "cluster": {**body["cluster"], "node_groups": [{**body["cluster"]["node_groups"][0], "device": device}]}}
        r = client.post("/v1/estimate", json=bad)
        assert r.status_code == 422, r.text
        assert r.json()["error"]["field"] == "training.dtype"


def test_the_published_nvfp4_rows_plan():
    rows = [c for c in all_rows() if "NVFP4" in c.row_id]
    assert len(rows) == 4
    for case in rows:
        assert isinstance(case, PublishedCase) and case.training.dtype == "fp4", case
        result = evaluate_case(case)
        assert result.failure is None and result.fits, (case.row_id, result.failure)
        assert abs(result.error) < 0.35, (case.row_id, result.error)


def test_fp4_holds_the_quantised_weight_copies_besides_the_bf16_weights():
    """Transformer Engine caches a row-major and a transposed NVFP4 copy of each decoder linear
    weight over the micro-batches (2 × 0.5625 bytes per parameter) on top of the BF16 weight."""
    from cost_model.transformer.stage_cost import FP4_WEIGHT_CACHE_BYTES
    from cost_model.units import bytes_to_gb

    cluster = simple_cluster("GB200-NVL72-186GB", 1, gpus_per_node=64)
    model, training, s = _setup("fp8")
    w16 = estimate(model, replace(training, dtype="bf16"), cluster, s).stages[1].memory_GB["weights"]
    w4 = estimate(model, replace(training, dtype="fp4"), cluster, s).stages[1].memory_GB["weights"]
    layers = model.num_layers // s.pp
    expected_extra_GB = bytes_to_gb(layers * model.decoder_layer_params() / s.tp * FP4_WEIGHT_CACHE_BYTES)
    assert w4 - w16 == pytest.approx(expected_extra_GB, rel=0.02)
    # FP8 weights (--fp8-param-gather, off in Megatron-Bridge's NVFP4 recipe) replace the 16-bit ones
    w8 = estimate(model, replace(training, fp8_param_gather=True), cluster, s).stages[1].memory_GB["weights"]
    assert w8 == pytest.approx(w16)
