"""Each log parser on its real-format sample (tests/observations/samples), the warm-up and outlier
filter, the plan-match check, and refusals of empty, truncated and unreadable logs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner_service.observations import InvalidObservation, ObservationMismatch, check_matches, parse_log, summarize
from planner_service.observations.parsers import detect_format
from planner_service.observations.summary import mismatches, robust_steps

SAMPLES = Path(__file__).parent / "samples"


def sample(name: str) -> str:
    return (SAMPLES / name).read_text()


#: Megatron facts of the sample's run (GPT 1.3B, tp 2, dp 4, gbs 64, seq 2048).
MEGATRON_FACTS = {"num_layers": 24, "hidden_size": 2048, "num_attention_heads": 16, "seq_length": 2048, "global_batch_size": 64,
                  "micro_batch_size": 2, "tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 1, "data_parallel_size": 4,
                  "world_size": 8, "context_parallel_size": 1, "sequence_parallel": True, "virtual_pipeline_model_parallel_size": 1}


@pytest.mark.parametrize(("name", "fmt"), [
    ("megatron_gpt1.3b_tp2_dp4.log", "megatron"),
    ("torchtitan_llama3_8b.log", "torchtitan"),
    ("torch_profiler_trace.json", "chrome_trace"),
    ("deepspeed_wall_clock_breakdown.log", "deepspeed"),
    ("paddlenlp_trainer.log", "paddle"),
    ("steps.json", "json"),
    ("steps.csv", "csv"),
])
def test_format_is_detected(name, fmt):
    assert detect_format(sample(name)) == fmt


def test_megatron_iterations_memory_and_arguments():
    p = parse_log(sample("megatron_gpt1.3b_tp2_dp4.log"))
    assert p.format == "megatron" and len(p.step_times_s) == 10 and p.steps[0] == 10 and p.steps[-1] == 100
    assert p.step_times_s[0] == pytest.approx(2.8734)  # ms → s
    assert p.tflops_per_device[1] == pytest.approx(88.8)
    assert {m.rank for m in p.memory} == {0, 1}
    m0 = p.memory[0]
    assert m0.max_allocated_GB == pytest.approx(27310.8 * 2**20 / 1e9) and m0.max_reserved_GB == pytest.approx(30722.0 * 2**20 / 1e9)
    assert p.header["num_layers"] == 24 and p.header["hidden_size"] == 2048 and p.header["tensor_model_parallel_size"] == 2
    assert p.header["sequence_parallel"] is True and p.header["virtual_pipeline_model_parallel_size"] is None
    assert mismatches(p.header, MEGATRON_FACTS) == []
    s = summarize(p, MEGATRON_FACTS)
    assert s["warmup_dropped"] == 1 and s["outliers_dropped"] == 1  # the 2.87 s first interval and the 1.70 s one
    assert 1.40 < s["step_time_s"] < 1.46
    assert s["peak_memory_allocated_GB"] == pytest.approx((27310.8 + 11) * 2**20 / 1e9)


def test_torchtitan_tps_memory_and_model_args():
    p = parse_log(sample("torchtitan_llama3_8b.log"))
    assert p.format == "torchtitan" and len(p.tokens_per_s_per_device) == 30 and p.needs_batch
    assert p.tokens_per_s_per_device[0] == 312 and p.mfu and 0.3 < p.mfu[-1] < 0.4
    assert p.header["hidden_size"] == 4096 and p.header["num_layers"] == 32 and p.header["num_query_groups"] == 8
    assert p.header["global_batch_size"] == 8 and p.header["seq_length"] == 8192
    assert p.memory[0].max_reserved_GB == pytest.approx(58.83 * 2**30 / 1e9)
    facts = {"global_batch_size": 8, "seq_length": 8192, "world_size": 8, "hidden_size": 4096, "num_layers": 32}
    s = summarize(p, facts)
    # step = tokens per step / (tokens/s per device · devices) ≈ 65536 / (6120 · 8)
    assert s["step_time_s"] == pytest.approx(8 * 8192 / (6120 * 8), rel=0.02)
    assert s["warmup_dropped"] == 3


def test_chrome_trace_steps_and_phases():
    p = parse_log(sample("torch_profiler_trace.json"))
    doc = json.loads(sample("torch_profiler_trace.json"))
    spans = sorted(e["dur"] for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#"))
    assert sorted(p.step_times_s) == pytest.approx([x * 1e-6 for x in spans])
    assert "gemm" in p.phases_s and p.phases_s["gemm"] > 0
    assert p.phases_s["gemm"] < max(p.step_times_s)


def test_deepspeed_breakdown():
    p = parse_log(sample("deepspeed_wall_clock_breakdown.log"))
    assert len(p.step_times_s) == 15
    assert p.step_times_s[0] == pytest.approx((412.7 + 980.2 + 88.0) / 1e3, rel=1e-3)
    assert {"fwd", "bwd", "step", "fwd_microstep", "bwd_allreduce"} <= set(p.phases_s)
    assert p.memory[0].max_allocated_GB == pytest.approx(19.84 * 2**30 / 1e9)
    s = summarize(p, {"global_batch_size": 32, "seq_length": 2048, "world_size": 8})
    assert 0.55 < s["step_time_s"] < 0.59


def test_paddle_interval_lines():
    p = parse_log(sample("paddlenlp_trainer.log"))
    assert len(p.step_times_s) == 20 and p.steps[0] == 1
    assert p.tokens_per_s_per_device[1] > 8000
    assert p.memory[0].max_reserved_GB == pytest.approx(14.0625 * 2**30 / 1e9)
    s = summarize(p, {"global_batch_size": 32, "seq_length": 4096, "world_size": 8})
    assert s["step_time_s"] == pytest.approx(2.0, rel=0.02) and s["warmup_dropped"] == 2


def test_json_and_csv():
    j = summarize(parse_log(sample("steps.json")), {"global_batch_size": 64, "seq_length": 2048, "world_size": 8})
    assert j["step_time_s"] == pytest.approx(1.2) and j["outliers_dropped"] == 1 and j["peak_memory_reserved_GB"] == 34.0
    assert j["versions"] == {"torch": "2.5.1", "nccl": "2.21.5"}
    c = parse_log(sample("steps.csv"))
    assert c.step_times_s[0] == pytest.approx(2.4) and c.memory[0].max_allocated_GB == 30.1
    assert parse_log("[1.0, 1.1, 1.0, 1.05]").step_times_s == (1.0, 1.1, 1.0, 1.05)


def test_robust_filter():
    f = robust_steps([9.0, 1.0, 1.01, 0.99, 1.02, 1.0, 5.0, 1.0, 0.98, 1.01])
    assert f.warmup_dropped == 1 and f.outliers_dropped == 1 and max(f.kept_s) < 1.1
    # most steps equal (MAD 0): the mean absolute deviation scales the z-score
    assert robust_steps([2.0, 1.0, 1.0, 1.0, 1.0], warmup_steps=0).kept_s == (1.0, 1.0, 1.0, 1.0)
    assert robust_steps([1.0, 1.0, 1.0], warmup_steps=0).kept_s == (1.0, 1.0, 1.0)
    assert robust_steps([3.0, 1.0, 1.0]).warmup_dropped == 0  # fewer than 4 entries: no warm-up guessed
    with pytest.raises(InvalidObservation, match="at least 3"):
        robust_steps([1.0, 1.0])
    with pytest.raises(InvalidObservation, match="warm-up"):
        robust_steps([3.0, 1.0, 1.0, 1.0], warmup_steps=2)


@pytest.mark.parametrize("text", ["", "   \n", "no step lines here\n"])
def test_empty_or_foreign_text_is_refused(text):
    with pytest.raises(InvalidObservation) as e:
        parse_log(text)
    assert e.value.field in ("log", "format")


def test_truncated_logs_are_refused():
    meg = sample("megatron_gpt1.3b_tp2_dp4.log")
    cut = meg[: meg.index("iteration       30/")] + "iteration       30/     200 | consumed samp"
    p = parse_log(cut)  # the cut line is skipped, two intervals remain
    with pytest.raises(InvalidObservation, match="truncated"):
        summarize(p, MEGATRON_FACTS)
    trace = sample("torch_profiler_trace.json")
    with pytest.raises(InvalidObservation, match="truncated"):
        parse_log(trace[: len(trace) // 2])
    with pytest.raises(InvalidObservation, match="truncated"):
        parse_log('{"step_times_s": [1.0, 1.1, ')


def test_a_log_of_another_model_or_layout_is_refused():
    p = parse_log(sample("megatron_gpt1.3b_tp2_dp4.log"))
    other = {**MEGATRON_FACTS, "num_layers": 12, "hidden_size": 768, "tensor_model_parallel_size": 1, "data_parallel_size": 8}
    with pytest.raises(ObservationMismatch) as e:
        check_matches(p, other)
    msg = e.value.message
    assert "num_layers: log 24, plan 12" in msg and "hidden_size: log 2048, plan 768" in msg
    assert "tensor_model_parallel_size: log 2, plan 1" in msg and e.value.field == "log"
    tt = parse_log(sample("torchtitan_llama3_8b.log"))
    with pytest.raises(ObservationMismatch, match="num_layers: log 32, plan 80"):
        check_matches(tt, {"num_layers": 80, "hidden_size": 4096, "global_batch_size": 8, "seq_length": 8192, "world_size": 8})


def test_unknown_format_names_the_field():
    with pytest.raises(InvalidObservation) as e:
        parse_log("x", "nemo")
    assert e.value.field == "format"
