import pytest

from cost_model import (
    Strategy,
    Training,
    cluster_from_dict,
    estimate,
    get_preset,
    simple_cluster,
)
from cost_model.result import BREAKDOWN_KEYS

TR = Training(global_batch_size=512, sequence_length=2048)


def test_contract_fields_and_breakdown_sum_to_step_time():
    est = estimate(get_preset("gpt3-6.7b"), TR, simple_cluster("A100-SXM4-80GB", 4), Strategy(dp=8, tp=4, micro_batch_size=2, sequence_parallel=True))
    d = est.to_dict()
    for key in ("step_time_s", "tokens_per_s", "samples_per_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu", "fits", "peak_memory_GB", "breakdown_s"):
        assert key in d
    assert set(d["breakdown_s"]) == set(BREAKDOWN_KEYS)
    assert sum(d["breakdown_s"].values()) == pytest.approx(est.step_time_s, rel=1e-9)
    assert est.tokens_per_s == pytest.approx(512 * 2048 / est.step_time_s)
    assert 0.2 < est.mfu < 0.8


def test_hardware_flops_include_recompute_and_model_flops_do_not():
    model, cl = get_preset("gpt3-6.7b"), simple_cluster("A100-SXM4-80GB", 4)
    none = estimate(model, TR, cl, Strategy(dp=8, tp=4, micro_batch_size=2, sequence_parallel=True))
    full = estimate(model, TR, cl, Strategy(dp=8, tp=4, micro_batch_size=2, sequence_parallel=True, recompute="full"))
    assert none.hardware_tflops_per_gpu == pytest.approx(none.model_tflops_per_gpu)
    assert full.hardware_tflops_per_gpu > full.model_tflops_per_gpu * 1.25
    assert full.step_time_s > none.step_time_s and full.breakdown_s["recompute"] > 0
    assert max(full.peak_memory_GB) < max(none.peak_memory_GB)


def test_tp_group_spanning_nodes_pays_the_network():
    model = get_preset("gpt3-13b")
    inside = estimate(model, TR, simple_cluster("A100-SXM4-80GB", 4), Strategy(dp=4, tp=8, micro_batch_size=1, sequence_parallel=True))
    across = estimate(model, TR, simple_cluster("A100-SXM4-80GB", 8, gpus_per_node=4), Strategy(dp=4, tp=8, micro_batch_size=1, sequence_parallel=True))
    # 4 NICs of 25 GB/s per node instead of NVLink: the bandwidth term grows ~2.7x
    assert across.breakdown_s["tp_comm"] > 1.5 * inside.breakdown_s["tp_comm"]
    assert across.step_time_s > inside.step_time_s
    assert any("spans nodes" in w for w in across.warnings)


def test_bubble_shrinks_with_more_microbatches_and_interleaving():
    model, cl = get_preset("gpt3-13b"), simple_cluster("A100-SXM4-80GB", 2)
    few = estimate(model, Training(32, 2048), cl, Strategy(dp=2, tp=2, pp=4, micro_batch_size=2))
    many = estimate(model, Training(256, 2048), cl, Strategy(dp=2, tp=2, pp=4, micro_batch_size=2))
    inter = estimate(model, Training(256, 2048), cl, Strategy(dp=2, tp=2, pp=4, vpp=2, micro_batch_size=2))
    frac = lambda e: e.breakdown_s["bubble"] / e.step_time_s  # noqa: E731
    assert frac(few) > frac(many) > frac(inter)
    # (p-1)/(m) with m = 256/(2*2) = 64: about 3/67 of the pipeline time
    assert frac(many) == pytest.approx(3 / 67, rel=0.25)


def test_more_devices_more_throughput_and_faster_devices_faster():
    model = get_preset("llama3-8b")
    tr = Training(256, 4096)
    a = estimate(model, tr, simple_cluster("A100-SXM4-80GB", 2), Strategy(dp=8, tp=2, micro_batch_size=1, sequence_parallel=True))
    b = estimate(model, tr, simple_cluster("A100-SXM4-80GB", 4), Strategy(dp=16, tp=2, micro_batch_size=1, sequence_parallel=True))
    h = estimate(model, tr, simple_cluster("H100-SXM5-80GB", 2), Strategy(dp=8, tp=2, micro_batch_size=1, sequence_parallel=True))
    assert b.tokens_per_s > 1.7 * a.tokens_per_s
    assert h.tokens_per_s > 2 * a.tokens_per_s


def test_context_and_expert_parallel_costs_appear():
    tr = Training(64, 32768)
    cp = estimate(get_preset("llama3-8b"), tr, simple_cluster("H100-SXM5-80GB", 2), Strategy(dp=2, tp=2, cp=4, micro_batch_size=1, sequence_parallel=True, recompute="full", zero_stage=1))
    assert cp.breakdown_s["cp_comm"] >= 0 and cp.fits
    moe = estimate(get_preset("mixtral-8x7b"), Training(256, 4096), simple_cluster("H100-SXM5-80GB", 4), Strategy(dp=8, tp=4, ep=8, micro_batch_size=1, sequence_parallel=True, zero_stage=1))
    assert moe.breakdown_s["ep_comm"] > 0


def test_heterogeneous_default_layout_and_stage_groups():
    cl = cluster_from_dict({"name": "mix", "node_groups": [
        {"name": "h", "count": 1, "gpus_per_node": 8, "device": "H100-SXM5-80GB"},
        {"name": "a", "count": 1, "gpus_per_node": 8, "device": "A100-SXM4-80GB"}]})
    model = get_preset("llama3-8b")
    tr = Training(64, 4096)
    s = Strategy(dp=2, tp=4, pp=2, micro_batch_size=1, sequence_parallel=True, layers_per_stage=(20, 12))
    est = estimate(model, tr, cl, s)
    assert [st.device for st in est.stages] == ["H100-SXM5-80GB", "A100-SXM4-80GB"]
    swapped = estimate(model, tr, cl, s, stage_groups=("a", "h"))
    assert [st.device for st in swapped.stages] == ["A100-SXM4-80GB", "H100-SXM5-80GB"]
    assert swapped.step_time_s > est.step_time_s  # 20 layers on the slower device


def test_unavailable_nodes_reduce_devices():
    cl = cluster_from_dict({"name": "c", "node_groups": [{"name": "g", "count": 2, "device": "A100-SXM4-80GB"}],
                            "nodes": [{"hostname": "g-1", "available": False}]})
    assert cl.total_gpus == 8
    with pytest.raises(Exception) as e:
        estimate(get_preset("gpt3-1.3b"), TR, cl, Strategy(dp=16))
    assert "8 available" in str(e.value)


def test_does_not_fit_is_reported():
    est = estimate(get_preset("llama3-70b"), Training(64, 4096), simple_cluster("A100-SXM4-40GB", 1), Strategy(dp=8, micro_batch_size=1))
    assert not est.fits and any("does not fit" in w for w in est.warnings)


def test_every_catalog_device_and_family_constant_is_usable():
    from dataclasses import fields

    from cost_model import catalog
    from cost_model.devices import FAMILY_EFFICIENCY

    # The per-element terms are zero where the device's memory traffic hides them (GPUs) or
    # where only a profile can tell (CPUs), and CPUs hide no communication behind compute;
    # everything else is a positive figure.
    may_be_zero = {"rng_s_per_element", "transcendental_s_per_element", "first_touch_s_per_byte", "comm_overlap_fraction"}
    for name, eff in FAMILY_EFFICIENCY.items():
        assert 0.0 <= eff.comm_overlap_fraction <= 1.0, name
        for f in fields(eff):
            if f.name != "source":
                value = getattr(eff, f.name)
                assert isinstance(value, float) and (value >= 0 if f.name in may_be_zero else value > 0), (name, f.name)
    model = get_preset("gpt3-125m")
    for name, dev in catalog().items():
        dtype = "bf16" if "bf16" in dev.supported_dtypes() else dev.supported_dtypes()[0]
        est = estimate(model, Training(8, 1024, dtype=dtype), simple_cluster(dev, 1, gpus_per_node=1), Strategy(micro_batch_size=1))
        assert est.step_time_s > 0, name


def test_unfused_kernels_cost_the_extra_passes_where_they_run():
    """``fused_kernels=False`` (plain eager PyTorch) adds the elementwise passes of unfused
    attention, eager dropout and the for-loop Adam — and nothing to GEMMs: a Llama-style model
    (no dropout) with flash attention differs in its optimizer step and in the operators of its
    eager RMSNorm, rotary embedding and SwiGLU (priced one by one in
    tests/costmodel/transformer/test_eager_terms.py), a few percent of its compute."""
    cluster = simple_cluster("A100-SXM4-80GB", 1, 8)
    strategy = Strategy(dp=8, micro_batch_size=1)
    gpt = get_preset("gpt3-1.3b")
    fused = estimate(gpt, Training(64, 2048, attention="unfused"), cluster, strategy)
    eager = estimate(gpt, Training(64, 2048, attention="unfused", fused_kernels=False), cluster, strategy)
    assert eager.breakdown_s["compute"] > fused.breakdown_s["compute"] * 1.02
    assert eager.breakdown_s["optimizer"] > fused.breakdown_s["optimizer"] * 1.5
    llama = get_preset("llama3-8b")
    f2 = estimate(llama, Training(64, 2048), cluster, strategy)
    e2 = estimate(llama, Training(64, 2048, fused_kernels=False), cluster, strategy)
    assert 1.02 < e2.breakdown_s["compute"] / f2.breakdown_s["compute"] < 1.25
    # 72 B/param (+6 for the 16-bit copy) against fused Adam's 34 B/param, same bandwidth
    opt_ratio = e2.breakdown_s["optimizer"] / f2.breakdown_s["optimizer"]
    assert opt_ratio == pytest.approx(78 / 34, rel=0.05)


def test_gradient_allreduce_hides_behind_backward_on_gpus_but_not_on_cpus():
    """DDP overlaps the bucketed all-reduce with backward.  On GPUs NCCL runs beside the compute
    kernels, so most of it hides; on a CPU gloo reduces on the cores that compute, so all of it
    adds to the step (``Efficiency.comm_overlap_fraction`` 0)."""
    model = get_preset("gpt3-125m")
    on, off = Training(16, 1024), Training(16, 1024, grad_reduce_overlap=False)
    strategy = Strategy(dp=2, micro_batch_size=8)

    gpu = simple_cluster("A100-SXM4-80GB", 1, 2)
    gpu_on, gpu_off = estimate(model, on, gpu, strategy), estimate(model, off, gpu, strategy)
    assert gpu_off.breakdown_s["dp_comm_exposed"] > 0
    assert gpu_on.breakdown_s["dp_comm_exposed"] < 0.5 * gpu_off.breakdown_s["dp_comm_exposed"]

    cpu = simple_cluster("local-cpu", 1, 2)
    cpu_on, cpu_off = estimate(model, on, cpu, strategy), estimate(model, off, cpu, strategy)
    assert cpu_on.breakdown_s["dp_comm_exposed"] > 0
    assert cpu_on.breakdown_s["dp_comm_exposed"] == pytest.approx(cpu_off.breakdown_s["dp_comm_exposed"], rel=1e-12)
    assert cpu_on.step_time_s == pytest.approx(cpu_off.step_time_s, rel=1e-12)


def test_context_parallel_ring_hides_behind_attention_on_gpus_but_not_on_cpus():
    """The K/V ring of context parallelism overlaps the attention blocks it feeds where the
    transfer runs beside the compute (GPUs); on a device without that (CPUs) it is all exposed."""
    from dataclasses import replace

    from cost_model.comm import Links, p2p_time_s
    from cost_model.devices import get_device
    from cost_model.transformer.layer_cost import StrategyArrays, layer_costs

    model = get_preset("llama3-8b")
    training = Training(2, 8192)
    S = StrategyArrays.from_strategies([Strategy(dp=1, cp=2, micro_batch_size=1)])
    gpu = get_device("A100-SXM4-80GB")
    no_overlap = replace(gpu, efficiency=replace(gpu.efficiency, comm_overlap_fraction=0.0))
    slow = Links(1.0, 1.0, 8, 1e-5)  # a slow link, so the ring outlasts attention
    kv_chunk_bytes = 2 * 4096 * model.num_kv_heads * model.head_dim * 2  # K and V, half the sequence, bf16
    ring_fwd_s = float(p2p_time_s(kv_chunk_bytes, slow, False))
    # forward one pass around the ring (c − 1 = 1 step); backward K,V with dK,dV (twice the
    # bytes) per step, then the finished dK,dV's hop home (context_parallel.ring_exchange_exposed_s)
    exposed = 2 * ring_fwd_s + float(p2p_time_s(2 * kv_chunk_bytes, slow, False))
    assert float(layer_costs(model, training, no_overlap, slow, S).cp_comm_s[0]) == pytest.approx(exposed, rel=1e-9)
    assert 0 < float(layer_costs(model, training, gpu, slow, S).cp_comm_s[0]) < exposed
