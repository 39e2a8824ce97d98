"""Invariants any physical step-time and memory model keeps, checked on layouts drawn at random
(fixed seed) across the frameworks, devices and real Hugging Face configs the service accepts:

* recomputing more never makes a step faster, and never needs more memory;
* twice the global batch on the same layout takes longer, but no more than twice as long;
* twice the micro-batch at the same global batch never needs less memory;
* an H200 node (an H100's compute with more and faster HBM, the same NVLink and NICs) never
  runs a layout slower than an H100 node, and faster NICs never make a step slower;
* twice the sequence takes longer and needs no less memory;
* a knob that only overlaps communication with compute (``tp_comm_overlap``,
  ``grad_reduce_overlap``, ``moe_comm_overlap``) never makes a step slower;
* offloading to the host (``activation_offloading``, ``cpu_offload``,
  ``optimizer_offload_fraction``) never needs more GPU memory and never makes a step faster;
* a larger MoE capacity factor (more padded slots) never makes a step faster.

A layout the frameworks refuse is skipped; the draw keeps drawing until it has its bases.
(ZeRO stages, sequence parallelism and fused loss kernels are not on this list on purpose:
DeepSpeed's ZeRO optimizer allocates fixed-size buckets that stage 0 does not, torchtitan's
op-level selective recompute saves the reduce-scatter outputs that sequence parallelism adds,
and Liger's fused linear cross-entropy keeps a T·h input gradient that outweighs T·V/t
vocab-parallel logits when the vocabulary per TP rank is small, so each can cost memory.)
"""

from __future__ import annotations

import copy
import itertools
import json
import random
from pathlib import Path
from typing import Any

import pytest

from cost_model.errors import PlannerError
from planner_service.cli.estimate import estimate_body

HF_CONFIGS = Path(__file__).parent / "hf_configs"
CONFIGS = ("llama-3.1-8b", "qwen2.5-72b", "mixtral-8x7b", "gemma-2-27b", "falcon-7b", "qwen3-30b-a3b", "gpt-neox-20b")
PRESETS = ("gpt3-1.3b", "gpt3-13b", "llama2-7b", "llama3-70b")
DEVICES = ("A100-SXM4-80GB", "A800-SXM4-80GB", "H100-SXM5-80GB", "H800-SXM5-80GB", "H200-SXM-141GB", "B200-SXM-192GB")
FRAMEWORKS = ("megatron-core", "megatron-deepspeed", "deepspeed", "fsdp", "paddle")
BASES = 40


def _estimate(body: dict[str, Any]) -> dict[str, Any] | None:
    try:
        return estimate_body(body)
    except PlannerError:
        return None


def _draw(rng: random.Random) -> dict[str, Any]:
    framework = rng.choice(FRAMEWORKS)
    if rng.random() < 0.5:
        name = rng.choice(CONFIGS)
        model: dict[str, Any] = {"transformer": json.loads((HF_CONFIGS / f"{name}.json").read_text())}
    else:
        model = {"preset": rng.choice(PRESETS)}
    nodes = rng.choice((1, 2, 4, 8))
    tp = 1 if framework == "deepspeed" else rng.choice((1, 2, 4, 8))
    pp = rng.choice((1, 1, 2, 4))
    dp = max(1, nodes * 8 // (tp * pp))
    mbs = rng.choice((1, 2))
    strategy = {"tp": tp, "pp": pp, "dp": dp, "micro_batch_size": mbs, "recompute": rng.choice(("none", "selective", "full")),
                "zero_stage": rng.choice((0, 1)) if pp > 1 else rng.choice((1, 2, 3)), "sequence_parallel": tp > 1}
    if framework == "fsdp" and strategy["zero_stage"] == 1:
        strategy["zero_stage"] = 3
    return {"model": model,
            "training": {"global_batch_size": dp * mbs * rng.choice((2, 4, 8)), "sequence_length": rng.choice((2048, 4096)), "framework": framework},
            "cluster": {"node_groups": [{"device": rng.choice(DEVICES), "count": nodes, "gpus_per_node": 8}]},
            "strategy": strategy}


def _bases() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    rng = random.Random(20261207)
    out: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for _ in range(400):
        body = _draw(rng)
        result = _estimate(body)
        if result is not None:
            out.append((body, result))
        if len(out) == BASES:
            return out
    raise AssertionError(f"only {len(out)} of {BASES} random layouts were accepted")


@pytest.fixture(scope="module")
def bases() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return _bases()


def _with(body: dict[str, Any], section: str, **values: Any) -> dict[str, Any]:
    out = copy.deepcopy(body)
    out[section].update(values)
    return out


def _peak(result: dict[str, Any]) -> float:
    return max(result["peak_memory_GB"])


def _label(body: dict[str, Any]) -> str:
    model = body["model"].get("preset") or body["model"]["transformer"].get("model_type")
    return f"{model} {body['training']['framework']} {body['cluster']['node_groups'][0]['device']} {body['strategy']}"


def test_recomputing_more_is_never_faster_and_never_needs_more_memory(bases):
    for body, _ in bases:
        ladder = [_estimate(_with(body, "strategy", recompute=r)) for r in ("none", "selective", "full")]
        kept = [r for r in ladder if r is not None]
        for less, more in itertools.pairwise(kept):
            assert more["step_time_s"] >= less["step_time_s"] * (1 - 1e-6), _label(body)
            assert _peak(more) <= _peak(less) * (1 + 1e-6), _label(body)


def test_twice_the_batch_takes_longer_but_at_most_twice_as_long(bases):
    for body, base in bases:
        doubled = _estimate(_with(body, "training", global_batch_size=2 * body["training"]["global_batch_size"]))
        assert doubled is not None, _label(body)
        ratio = doubled["step_time_s"] / base["step_time_s"]
        assert 1.0 < ratio <= 2.0 + 1e-9, f"{ratio:.3f}: {_label(body)}"


def test_a_larger_micro_batch_never_needs_less_memory(bases):
    for body, base in bases:
        s = body["strategy"]
        if body["training"]["global_batch_size"] % (s["dp"] * s["micro_batch_size"] * 2):
            continue
        larger = _estimate(_with(body, "strategy", micro_batch_size=2 * s["micro_batch_size"]))
        if larger is not None:
            assert _peak(larger) >= _peak(base) * (1 - 1e-6), _label(body)


def test_an_h200_node_is_never_slower_than_an_h100_node(bases):
    for body, _ in bases:
        on = {d: _estimate({**body, "cluster": {"node_groups": [{**body["cluster"]["node_groups"][0], "device": d}]}})
              for d in ("H100-SXM5-80GB", "H200-SXM-141GB")}
        if on["H100-SXM5-80GB"] is not None and on["H200-SXM-141GB"] is not None:
            assert on["H200-SXM-141GB"]["step_time_s"] <= on["H100-SXM5-80GB"]["step_time_s"] * (1 + 1e-6), _label(body)


def test_faster_nics_never_make_a_step_slower(bases):
    for body, _ in bases:
        steps = []
        for nic_GBps in (200.0, 400.0, 800.0):
            group = {**body["cluster"]["node_groups"][0], "inter_node_bandwidth_GBps": nic_GBps}
            result = _estimate({**body, "cluster": {"node_groups": [group]}})
            assert result is not None, _label(body)
            steps.append(result["step_time_s"])
        assert all(b <= a * (1 + 1e-6) for a, b in itertools.pairwise(steps)), f"{steps}: {_label(body)}"


def test_twice_the_sequence_takes_longer_and_needs_no_less_memory(bases):
    for body, base in bases:
        longer = _estimate(_with(body, "training", sequence_length=2 * body["training"]["sequence_length"]))
        if longer is not None:
            assert longer["step_time_s"] > base["step_time_s"], _label(body)
            assert _peak(longer) >= _peak(base) * (1 - 1e-6), _label(body)


@pytest.mark.parametrize("knob", ["tp_comm_overlap", "grad_reduce_overlap", "moe_comm_overlap"])
def test_overlapping_communication_never_makes_a_step_slower(bases, knob):
    compared = 0
    for body, _ in bases:
        off, on = (_estimate(_with(body, "training", **{knob: v})) for v in (False, True))
        if off is not None and on is not None:
            compared += 1
            assert on["step_time_s"] <= off["step_time_s"] * (1 + 1e-6), _label(body)
    assert compared, f"no drawn layout takes {knob}"


@pytest.mark.parametrize("knob, value", [("activation_offloading", True), ("cpu_offload", True), ("optimizer_offload_fraction", 1.0)])
def test_offloading_to_the_host_never_needs_more_gpu_memory_nor_runs_faster(bases, knob, value):
    compared = 0
    for body, base in bases:
        offloaded = _estimate(_with(body, "training", **{knob: value}))
        if offloaded is not None:
            compared += 1
            assert _peak(offloaded) <= _peak(base) * (1 + 1e-6), _label(body)
            assert offloaded["step_time_s"] >= base["step_time_s"] * (1 - 1e-6), _label(body)
    assert compared, f"no drawn layout takes {knob}"


def test_a_larger_capacity_factor_never_makes_an_moe_step_faster(bases):
    compared = 0
    for body, _ in bases:
        tight, padded = (_estimate(_with(body, "training", moe_capacity_factor=f)) for f in (1.0, 2.0))
        if tight is not None and padded is not None:
            compared += 1
            assert padded["step_time_s"] >= tight["step_time_s"] * (1 - 1e-6), _label(body)
    assert compared, "no drawn layout is a mixture of experts"
