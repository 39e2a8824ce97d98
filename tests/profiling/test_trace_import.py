"""PyTorch profiler Chrome-trace import."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from cost_model.errors import InvalidProfile
from cost_model.profiles import fit_profile, validate_profile
from planner_service.profiling.trace_import import (
    import_trace,
    load_profile_or_trace,
    parse_trace_bytes,
)

FIXTURE = Path(__file__).parent / "fixtures" / "gpu_trace.json"


def _find(profile, op, **match):
    out = []
    for m in profile["measurements"]:
        if m["op"] != op:
            continue
        if all((m.get("shape") or {}).get(k, m.get(k)) == v for k, v in match.items()):
            out.append(m)
    assert len(out) == 1, (op, match, out)
    return out[0]


def test_gpu_trace_fixture_kernel_times_are_recovered():
    doc = json.loads(FIXTURE.read_text())
    prof = validate_profile(import_trace(doc))  # device inferred from deviceProperties
    assert prof["device"]["name"] == "H100-SXM5-80GB"
    # aten::mm launched a GEMM kernel plus a split-K reduction, twice: (210+15) and (231+14) µs
    mm = _find(prof, "gemm", m=4096, n=2048, k=1024)
    assert mm["dtype"] == "bf16" and mm["repeats"] == 2
    assert mm["seconds"] == pytest.approx(statistics.median([225e-6, 245e-6]))
    assert mm["spread"]["min_s"] == pytest.approx(225e-6) and mm["spread"]["max_s"] == pytest.approx(245e-6)
    addmm = _find(prof, "gemm", m=2048, n=4096, k=1024)
    assert addmm["seconds"] == pytest.approx(230e-6)
    ar = _find(prof, "allreduce")
    assert ar["group_size"] == 8 and ar["bytes"] == 1048576 * 2 and ar["backend"] == "nccl"
    assert ar["seconds"] == pytest.approx(88.5e-6)
    ln = _find(prof, "layernorm")
    x_bytes = 8 * 512 * 1024 * 2
    assert ln["bytes"] == 2 * x_bytes + 2 * 1024 * 2 and ln["seconds"] == pytest.approx(40e-6)
    attn = _find(prof, "attention")
    assert attn["shape"] == {"batch_heads": 128, "q_len": 512, "kv_len": 512, "head_dim": 64}
    assert attn["seconds"] == pytest.approx(300e-6)
    assert prof["trace"]["unmatched_kernels"] == 1  # the fill kernel nobody asked for
    fit = fit_profile(prof)
    assert fit["device"] == "H100-SXM5-80GB" and fit["rates"]["gemm_tflops"]["bf16"] > 0


def test_cpu_trace_needs_a_device_and_shapes():
    doc = {"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5.0, "args": {}}]}
    with pytest.raises(InvalidProfile) as exc:
        import_trace(doc)
    assert exc.value.field == "device"
    with pytest.raises(InvalidProfile) as exc:
        import_trace(doc, device="local-cpu")
    assert "record_shapes" in exc.value.message
    with pytest.raises(InvalidProfile) as exc:
        import_trace({"traceEvents": []}, device="TPU-v5")
    assert exc.value.field == "device"
    with pytest.raises(InvalidProfile) as exc:
        parse_trace_bytes(b"[1, 2", device="local-cpu")
    assert "not valid JSON" in exc.value.message
    with pytest.raises(InvalidProfile) as exc:
        parse_trace_bytes(b" " * 100, device="local-cpu", max_bytes=10)
    assert "limit" in exc.value.message


def test_upload_helper_tells_traces_and_profiles_apart():
    prof = load_profile_or_trace(FIXTURE.read_bytes())
    assert prof["source"] == "trace"
    again = load_profile_or_trace(json.dumps(prof), device="H100-SXM5-80GB")
    assert again["measurements"] == prof["measurements"]
    with pytest.raises(InvalidProfile) as exc:
        load_profile_or_trace(json.dumps(prof), device="A100-SXM4-80GB")
    assert exc.value.field == "device"


def test_torch_cpu_trace_round_trip(tmp_path):
    """A real torch.profiler trace of known matmuls: the importer returns each shape with the
    median of the durations the trace recorded for it."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    shapes = [(64, 96, 32), (128, 64, 48)]
    mats = [(torch.randn(m, k), torch.randn(k, n)) for m, n, k in shapes]
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(3):
            for a, b in mats:
                torch.mm(a, b)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    raw = json.loads(path.read_text())
    imported = validate_profile(parse_trace_bytes(path.read_bytes(), device="local-cpu"))
    for (m, n, k) in shapes:
        durs = [e["dur"] * 1e-6 for e in raw["traceEvents"]
                if e.get("ph") == "X" and e.get("name") == "aten::mm" and e.get("args", {}).get("Input Dims") == [[m, k], [k, n]]]
        got = _find(imported, "gemm", m=m, n=n, k=k)
        assert got["repeats"] == len(durs) == 3
        assert got["seconds"] == pytest.approx(statistics.median(durs))
        assert got["dtype"] == "fp32"
