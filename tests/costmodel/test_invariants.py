"""Physics the cost model must keep whatever its constants: on seeded random layouts (five
frameworks, dense and MoE models, H100 and A100), more recompute never holds more memory nor
runs faster, a larger micro-batch never holds less, a longer sequence or a larger batch never
runs faster, a batch twice as large at most doubles the step (plus the bubble it amortises),
more sharding never holds more (where the framework's stage adds no buffers of its own: not
DeepSpeed's ZeRO optimizer, whose fp32 partition can outweigh what one rank shards, nor FSDP's
ZeRO 2 inside a pipeline, the Llama 3 paper's layout that torchtitan cannot run), and every
interval brackets its point."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from cost_model import Strategy, Training, estimate, from_hf_config, get_preset, simple_cluster
from cost_model.errors import PlannerError
from cost_model.frameworks import rules_for

CONFIGS = Path(__file__).parent / "transformer" / "hf_configs"
MODELS = {
    "llama3-8b": get_preset("llama3-8b"),
    "llama2-13b": get_preset("llama2-13b"),
    "mixtral-8x7b": get_preset("mixtral-8x7b"),
    "qwen3-30b-a3b": from_hf_config(json.loads((CONFIGS / "qwen3-30b-a3b.json").read_text())),
    "gemma-2-27b": from_hf_config(json.loads((CONFIGS / "gemma-2-27b.json").read_text())),
}
FRAMEWORKS = ("megatron-core", "megatron-deepspeed", "deepspeed", "fsdp", "paddle")
ORDER = ("none", "selective", "full")
#: tolerances: relative, plus an absolute floor for memory (GB)
REL, ABS_GB = 0.005, 0.05


def _est(model, training, cluster, strategy):
    try:
        return estimate(model, training, cluster, strategy, spread_single_source=False)
    except PlannerError:
        return None


def _peak(e) -> float:
    return max(e.peak_memory_GB)


def _cases(n: int):
    rng = random.Random(20261206)
    for _ in range(n):
        name = rng.choice(list(MODELS))
        model, framework = MODELS[name], rng.choice(FRAMEWORKS)
        rules = rules_for(framework)
        nodes = rng.choice([1, 2, 4])
        tp = rng.choice([1, 2, 4, 8] if rules.tensor_parallel else [1])
        pp = rng.choice([1, 2, 4])
        if tp * pp > nodes * 8:
            continue
        dp = nodes * 8 // (tp * pp)
        ep = rng.choice([e for e in (1, 2, 4, 8) if (dp * tp) % e == 0 and model.num_experts % e == 0]) if model.is_moe else 1
        mbs = rng.choice([1, 2])
        training = Training(dp * mbs * rng.choice([1, 4, 16]), rng.choice([2048, 4096]), framework=framework)
        strategy = Strategy(dp=dp, tp=tp, pp=pp, ep=ep, micro_batch_size=mbs, sequence_parallel=tp > 1 and rules.sequence_parallel,
                            recompute=rng.choice(ORDER), zero_stage=rng.choice(rules.zero_stages))
        cluster = simple_cluster(rng.choice(["H100-SXM5-80GB", "A100-SXM4-80GB"]), nodes)
        base = _est(model, training, cluster, strategy)
        if base is not None:
            yield f"{name} {framework} {strategy}", model, training, cluster, strategy, base


CASES = list(_cases(300))


def test_enough_layouts_are_costed():
    assert len(CASES) >= 100, len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c[0][:60] for c in CASES])
def test_the_physics_moves_the_right_way(case):
    tag, model, training, cluster, s, base = case
    # intervals bracket their points
    assert base.step_time_s_p10 <= base.step_time_s <= base.step_time_s_p90
    assert base.peak_memory_GB_p10 <= _peak(base) + 1e-6 and _peak(base) <= base.peak_memory_GB_p90 + 1e-6
    # more recompute: no more memory, no less time
    if s.recompute != "full":
        more = _est(model, training, cluster, replace(s, recompute=ORDER[ORDER.index(s.recompute) + 1]))
        if more is not None:
            assert _peak(more) <= _peak(base) * (1 + REL) + ABS_GB, tag
            assert more.step_time_s >= base.step_time_s * (1 - REL), tag
    # a larger micro-batch (same batch): no less memory
    if (training.global_batch_size // s.dp) % (2 * s.micro_batch_size) == 0:
        bigger = _est(model, training, cluster, replace(s, micro_batch_size=2 * s.micro_batch_size))
        if bigger is not None:
            assert _peak(bigger) >= _peak(base) * (1 - REL) - ABS_GB, tag
    # twice the batch: between once and twice the step (the bubble is amortised, not added)
    double = _est(model, replace(training, global_batch_size=2 * training.global_batch_size), cluster, s)
    if double is not None:
        assert 1.0 <= double.step_time_s / base.step_time_s <= 2.05, tag
    # twice the sequence: slower, no less memory
    longer = _est(model, replace(training, sequence_length=2 * training.sequence_length), cluster, s)
    if longer is not None:
        assert longer.step_time_s > base.step_time_s and _peak(longer) >= _peak(base) - ABS_GB, tag
    # one stage more sharding: no more memory, where the stage adds no buffers of its own
    stages = rules_for(training.framework).zero_stages
    nxt = [z for z in stages if z > s.zero_stage]
    deepspeed_buffers = rules_for(training.framework).deepspeed_engine
    pipelined_zero2 = training.framework == "fsdp" and s.pp > 1 and nxt[:1] == [3]
    if nxt and s.dp > 1 and s.zero_stage >= 1 and not deepspeed_buffers and not pipelined_zero2:
        sharded = _est(model, training, cluster, replace(s, zero_stage=nxt[0]))
        if sharded is not None:
            assert _peak(sharded) <= _peak(base) * (1 + REL) + ABS_GB, tag
