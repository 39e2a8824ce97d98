"""The elementwise terms of plain eager PyTorch layers (``training.fused_kernels = False``) and
of the activation functions, isolated on devices that differ in one constant."""

from dataclasses import replace

import pytest

from cost_model import Strategy, Training, get_preset
from cost_model.comm import Links
from cost_model.devices import get_device
from cost_model.transformer import layer_cost as tc
from helpers.bench_modules import cpu_validation

LINKS = Links(100.0, 10.0, 8, 1e-5)
BW_GBps = 100.0


def _bandwidth_only_device(**efficiency):
    """local-cpu with every elementwise cost but bytes switched off (no launches, no per-element
    arithmetic, no page faults) unless given."""
    dev = get_device("local-cpu")
    off = {"memory_fraction": 1.0, "kernel_overhead_s": 0.0, "rng_s_per_element": 0.0, "transcendental_s_per_element": 0.0,
           "first_touch_s_per_byte": 0.0}
    eff = replace(dev.efficiency, **{**off, **efficiency})
    return replace(dev, memory_bandwidth_GBps=BW_GBps, efficiency=eff)


def _layer(model, training, device, mbs=2):
    S = tc.StrategyArrays.from_strategies([Strategy(dp=1, micro_batch_size=mbs)])
    return tc.layer_costs(model, training, device, LINKS, S)


@pytest.mark.parametrize("preset, bwd_per_element", [("gpt3-125m", 2), ("llama3-8b", 1)])
def test_activation_backward_pays_its_transcendentals(preset, bwd_per_element):
    """GELU backward Φ(x) + x·φ(x) evaluates an erf and an exp per element, SiLU's recomputes one
    sigmoid: with arithmetic far slower than memory, the FFN activation's backward costs 2 (GELU)
    or 1 (SwiGLU) transcendental per hidden element, its forward 1."""
    model = get_preset(preset)
    training = Training(2, 1024, dtype="fp32")  # fused flash attention: no softmax elementwise
    rate = 1e-6  # s per transcendental: dwarfs every byte term
    slow = _layer(model, training, _bandwidth_only_device(memory_fraction=1e6 / BW_GBps, transcendental_s_per_element=rate))
    fast = _layer(model, training, _bandwidth_only_device(memory_fraction=1e6 / BW_GBps))
    ffn_elements = 2 * 1024 * model.ffn_hidden_size
    assert float(slow.forward_compute_s[0] - fast.forward_compute_s[0]) == pytest.approx(ffn_elements * rate, rel=1e-3)
    assert float(slow.backward_compute_s[0] - fast.backward_compute_s[0]) == pytest.approx(bwd_per_element * ffn_elements * rate, rel=1e-3)


def test_eager_attention_moves_heads_between_layouts(monkeypatch):
    """Eager unfused attention copies Q, K, V head-major and the output back (forward), the
    output gradient head-major, the three gradients token-major and concatenates them for the
    QKV split (backward): 2·eb bytes per element of each pass."""
    model = get_preset("llama3-8b")  # GQA: K and V are narrower than Q
    training = Training(2, 1024, dtype="fp32", attention="unfused", fused_kernels=False)
    device = _bandwidth_only_device()
    with_copies = _layer(model, training, device)
    monkeypatch.setattr(tc, "_eager_head_layout_s", lambda *args: (0.0, 0.0))
    without = _layer(model, training, device)
    T, eb = 2 * 1024, 4
    q, kv = T * model.hidden_size, T * model.num_kv_heads * model.head_dim
    assert float(with_copies.forward_compute_s[0] - without.forward_compute_s[0]) == pytest.approx(2 * eb * (2 * q + 2 * kv) / (BW_GBps * 1e9), rel=1e-9)
    assert float(with_copies.backward_compute_s[0] - without.backward_compute_s[0]) == pytest.approx(2 * eb * (3 * q + 4 * kv) / (BW_GBps * 1e9), rel=1e-9)


def test_eager_biased_layers_reduce_their_bias_gradients_fused_ones_do_not(monkeypatch):
    """Each biased linear layer's bias gradient is a read of its output gradient in eager
    PyTorch; fused kernels fold it into the weight-gradient GEMM.  On a bandwidth-only device
    the difference between a GPT layer with and without biases — dropout kept the same — is
    exactly the four reads in eager mode and zero when fused."""
    gpt = get_preset("gpt3-125m")
    no_bias = replace(gpt, bias=False)
    device = _bandwidth_only_device()
    T, eb, h = 2 * 1024, 4, gpt.hidden_size
    monkeypatch.setattr(tc, "_dropout", lambda model: 1.0)  # same dropout for both: only the biases differ
    for fused, expected in ((False, T * (3 * h + h + gpt.ffn_hidden_size + h) * eb / (BW_GBps * 1e9)), (True, 0.0)):
        training = Training(2, 1024, dtype="fp32", attention="unfused", fused_kernels=fused)
        diff = float(_layer(gpt, training, device).backward_compute_s[0] - _layer(no_bias, training, device).backward_compute_s[0])
        assert diff == pytest.approx(expected, rel=1e-9, abs=1e-15)


def test_embedding_backward_writes_a_dense_gradient_and_eager_tied_heads_add_theirs():
    """The embedding's backward zero-fills a dense [V, h] gradient; with a tied head on the same
    stage eager autograd then adds the two gradients of the shared weight (3 passes), which
    fused frameworks accumulate in the GEMM and pipelines keep on different stages."""
    model = get_preset("gpt3-125m")
    device = _bandwidth_only_device()
    Vh_s = model.vocab_size * model.hidden_size * 4 / (BW_GBps * 1e9)
    T_h_s = 2 * 1024 * model.hidden_size * 4 / (BW_GBps * 1e9)

    def emb_head(fused, pp):
        S = tc.StrategyArrays.from_strategies([Strategy(dp=1, pp=pp, micro_batch_size=2)])
        emb, head, *_ = tc.embedding_head_costs(model, Training(2, 1024, dtype="fp32", fused_kernels=fused), device, LINKS, S)
        return float(emb[0]), float(head[0])

    emb, head = emb_head(True, 1)
    assert emb == pytest.approx(Vh_s + 3 * T_h_s + 2 * 1024 * model.hidden_size * 13 / (BW_GBps * 1e9), rel=1e-9)  # + dropout
    assert emb_head(False, 1)[1] - head == pytest.approx(3 * Vh_s, rel=1e-9)
    assert emb_head(False, 2)[1] == pytest.approx(emb_head(True, 2)[1], rel=1e-12)


def test_for_loop_optimizer_pays_per_parameter_tensor_not_per_position():
    """A learned position table is one parameter tensor whatever its length: a longer table adds
    its bytes to the eager optimizer step, not launches."""
    from cost_model import estimate, simple_cluster

    cluster = simple_cluster("A100-SXM4-80GB", 1, 1)
    training = Training(8, 1024, fused_kernels=False)
    short, long = get_preset("gpt3-125m"), replace(get_preset("gpt3-125m"), learned_positions=8192)
    opt = [estimate(m, training, cluster, Strategy(dp=1, micro_batch_size=1)).breakdown_s["optimizer"] for m in (short, long)]
    device = get_device("A100-SXM4-80GB")
    extra_bytes = (8192 - short.learned_positions) * short.hidden_size * tc.optimizer_bytes_per_param(training)
    assert opt[1] - opt[0] == pytest.approx(extra_bytes / (device.memory_bandwidth_GBps * 1e9 * device.efficiency.memory_fraction), rel=1e-6)


@pytest.mark.parametrize("dtype, eb", [("fp32", 4), ("bf16", 2)])
def test_eager_llama_layer_pays_its_rmsnorm_rotary_and_swiglu_operators(dtype, eb):
    """Hugging Face's eager Llama layer runs RMSNorm as upcast/pow/mean/scale/downcast/weight
    operators, the rotary embedding through rotate_half and SwiGLU as two operators: on a
    bandwidth-only device the eager layer's extra time over the fused one is exactly their bytes
    beyond the fused kernels' (cost_model.transformer.layer_cost.eager_*_traffic), and a
    LayerNorm GPT layer without rotary embedding pays none of it."""
    model = get_preset("llama3-8b")
    device = _bandwidth_only_device()
    T = 2 * 1024
    q_k = T * (model.hidden_size + model.num_kv_heads * model.head_dim)
    norm, rope, glu = tc.eager_rmsnorm_traffic(eb), tc.eager_rope_traffic(eb), tc.eager_glu_traffic(eb)
    layers = {fused: _layer(model, Training(2, 1024, dtype=dtype, fused_kernels=fused), device) for fused in (True, False)}
    elems = ((2 * T * model.hidden_size, norm), (q_k, rope), (T * model.ffn_hidden_size, glu))
    fwd = sum(n * t.fwd_bytes for n, t in elems) / (BW_GBps * 1e9)
    bwd = sum(n * t.bwd_bytes for n, t in elems) / (BW_GBps * 1e9)
    assert float(layers[False].forward_compute_s[0] - layers[True].forward_compute_s[0]) == pytest.approx(fwd, rel=1e-9)
    assert float(layers[False].backward_compute_s[0] - layers[True].backward_compute_s[0]) == pytest.approx(bwd, rel=1e-9)
    # the upcasts exist only below fp32: 20 + 2·eb (+ 2·(eb + 4)) forward bytes per element, less the fused 2·eb
    assert norm.fwd_bytes == 20 + (2 * (eb + 4) if eb < 4 else 0)
    gpt = replace(get_preset("gpt3-125m"), bias=False)  # LayerNorm, GELU, learned positions; no bias reductions
    base = {fused: _layer(gpt, Training(2, 1024, dtype=dtype, attention="flash", fused_kernels=fused), device) for fused in (True, False)}
    assert float(base[False].forward_compute_s[0]) == pytest.approx(float(base[True].forward_compute_s[0]), rel=1e-12)


def test_every_norm_of_the_layer_is_paid():
    """A layer's norms follow the model: one shared norm (Falcon-7B), two (Llama), four sandwich
    norms (Gemma-2), plus per-head Q/K norms (Qwen3) over the query and key elements."""
    device = _bandwidth_only_device()
    llama = get_preset("llama3-8b")
    training = Training(2, 1024, dtype="fp32")
    T, eb = 2 * 1024, 4
    base = float(_layer(llama, training, device).forward_compute_s[0])
    four = float(_layer(replace(llama, norms_per_layer=4), training, device).forward_compute_s[0])
    assert four - base == pytest.approx(2 * T * llama.hidden_size * 2 * eb / (BW_GBps * 1e9), rel=1e-9)
    qk = float(_layer(replace(llama, qk_norm=True), training, device).forward_compute_s[0])
    q_k = T * (llama.hidden_size + llama.num_kv_heads * llama.head_dim)
    assert qk - base == pytest.approx(q_k * 2 * eb / (BW_GBps * 1e9), rel=1e-9)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_eager_llama_activations_are_what_autograd_keeps(dtype, monkeypatch):
    """The activation model of an eager Llama layer (unfused attention, Hugging Face's RMSNorm,
    rotate_half, SwiGLU) against the bytes autograd really keeps: every tensor one forward of
    the layer (bench/cpu_validation.py's case L, in torch on the CPU) saves for backward,
    counted once per storage, parameters and the cos/sin tables aside."""
    torch = pytest.importorskip("torch", reason="needs torch")
    from cost_model.transformer.spec import from_hf_config

    bench = cpu_validation(monkeypatch)
    case = {**next(c for c in bench.CASES if c["name"] == "L"), "layers": 1}
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    model = bench.build_model(case).to(dt)
    block = model.blocks[0]
    idx, _ = bench._batch(case)
    angles = torch.outer(torch.arange(case["seq"], dtype=torch.float32), model.inv_freq)
    cos, sin = (f(torch.cat((angles, angles), dim=-1)).to(dt) for f in (torch.cos, torch.sin))
    saved: dict[int, int] = {}

    def keep(t):
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        block(model.embed(idx).detach().requires_grad_(True), cos, sin)
    fixed = {p.untyped_storage().data_ptr() for p in block.parameters()} | {
        t.untyped_storage().data_ptr() for t in (block.mask, cos, sin)}
    measured = sum(n for ptr, n in saved.items() if ptr not in fixed)
    llama = from_hf_config(bench.hf_config(case))
    S = tc.StrategyArrays.from_strategies([Strategy(dp=1, micro_batch_size=case["micro_batch"])])
    stored = {fused: float(tc.activation_bytes(llama, Training(case["micro_batch"], case["seq"], dtype=dtype, attention="unfused",
                                                                fused_kernels=fused), S)[0][0]) for fused in (False, True)}
    assert stored[False] == pytest.approx(measured, rel=0.005)  # the per-row rsqrt aside
    assert stored[True] < 0.98 * measured  # what the fused kernels keep is not what eager PyTorch keeps
