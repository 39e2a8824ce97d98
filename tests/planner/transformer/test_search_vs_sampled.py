"""The plan is no slower than any layout the framework can run: on requests too large to
enumerate (test_optimality does those), seeded random strategies — every knob the strategy has,
each framework's rules deciding what runs — are estimated, and none that fits safely beats the
plan's best.  A search space that leaves out a layout the framework runs (as it once left out
ZeRO stage 0 under DeepSpeed's engine, whose ZeRO optimizer can hold more) fails here."""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from cost_model import Strategy, Training, estimate, from_hf_config, get_preset, simple_cluster
from cost_model.errors import PlannerError
from cost_model.frameworks import rules_for
from planner_service.planner import SolverSettings, plan
from planner_service.planner.request import PlanRequest

CONFIGS = Path(__file__).parents[2] / "costmodel" / "transformer" / "hf_configs"

#: (model, framework, device, nodes, global batch, sequence): dense and MoE under each framework
REQUESTS = [
    ("gemma-2-27b", "megatron-deepspeed", "H100-SXM5-80GB", 1, 8, 2048),
    ("llama2-70b", "megatron-core", "H100-SXM5-80GB", 4, 64, 4096),
    ("qwen3-30b-a3b", "megatron-core", "A100-SXM4-80GB", 2, 64, 4096),
    ("llama3-8b", "fsdp", "H100-SXM5-80GB", 2, 64, 8192),
    ("mixtral-8x7b", "deepspeed", "H100-SXM5-80GB", 4, 128, 2048),
    ("qwen3-30b-a3b", "paddle", "A100-SXM4-80GB", 2, 128, 2048),
    ("gpt3-1.3b", "deepspeed", "A100-SXM4-80GB", 1, 64, 2048),
]


def _model(name: str):
    path = CONFIGS / f"{name}.json"
    return from_hf_config(json.loads(path.read_text())) if path.exists() else get_preset(name)


def _layouts(model, framework: str, gpus: int, batch: int):
    """Every combination of the knobs' usual values whose sizes divide the GPUs and the batch
    (whether the framework runs it is ``estimate``'s to say)."""
    rules = rules_for(framework)
    eps = [e for e in (1, 2, 4, 8) if model.num_experts % e == 0] if model.is_moe else [1]
    for tp, pp, cp, mbs, ep, zero, rc, vpp in itertools.product(
            [1, 2, 4, 8] if rules.tensor_parallel else [1], [1, 2, 4, 8], [1, 2, 4], [1, 2, 4], eps, rules.zero_stages,
            ["none", "selective", "full"], [1, 2]):
        if gpus % (tp * pp * cp) or (vpp > 1 and pp == 1):
            continue
        dp = gpus // (tp * pp * cp)
        if batch % (dp * mbs):
            continue
        if framework == "fsdp" and zero == 2 and pp > 1:
            continue  # the Llama 3 paper's layout, which torchtitan cannot run: costed when pinned, never proposed
        s = Strategy(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, vpp=vpp, micro_batch_size=mbs, sequence_parallel=tp > 1 and rules.sequence_parallel,
                     recompute=rc, zero_stage=zero)
        yield s
        node_shard = 8 // (tp * cp) if 8 % (tp * cp) == 0 else 0
        if zero in rules.partial_sharding_stages and 1 < node_shard < dp and dp % node_shard == 0:
            yield replace(s, dp_shard=node_shard)  # HSDP within a node


def _samples(model, framework: str, gpus: int, batch: int, rng: random.Random, n: int):
    """All the layouts of one node; ``n`` of them, drawn without replacement, beyond."""
    layouts = list(_layouts(model, framework, gpus, batch))
    return layouts if gpus <= 8 else rng.sample(layouts, min(n, len(layouts)))


@pytest.mark.parametrize(("name", "framework", "device", "nodes", "batch", "seq"), REQUESTS,
                         ids=[f"{r[0]}-{r[1]}" for r in REQUESTS])
def test_no_sampled_layout_that_fits_beats_the_plan(name, framework, device, nodes, batch, seq):
    model = _model(name)
    training = Training(batch, seq, framework=framework)
    cluster = simple_cluster(device, nodes)
    best = plan(PlanRequest(model, training, cluster, top_k=1, spread_single_source=False), SolverSettings()).best.prediction
    rng = random.Random(f"{name}/{framework}")
    beaten, tried = [], 0
    for s in _samples(model, framework, nodes * 8, batch, rng, 250):
        try:
            e = estimate(model, training, cluster, s, spread_single_source=False)
        except PlannerError:
            continue  # a layout the framework (or the model) cannot run
        tried += 1
        safe = e.fits and not e.tight
        if safe and best.tight:
            beaten.append((s, "a safe layout exists where the plan is tight"))
        elif safe and e.step_time_s < best.step_time_s * 0.99:
            beaten.append((s, f"{e.step_time_s:.3f} s < {best.step_time_s:.3f} s"))
    assert tried >= 20, tried
    assert not beaten, beaten[:3]
