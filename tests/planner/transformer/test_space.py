"""The vectorised search-space enumeration equals the rules of planner/space.py applied one
combination at a time, rows in the same order."""

import itertools

import numpy as np
import pytest

from cost_model.frameworks import rules_for
from cost_model.transformer.layer_cost import RECOMPUTE_CODE, lean_recompute_modules, recompute_modules_mask
from cost_model.transformer.moe import expert_data_parallel
from helpers.bruteforce import interleaved_counts_refused
from planner_service.planner.request import parse_plan_request
from planner_service.planner.transformer.space import (
    CP_CHOICES,
    MBS_CHOICES,
    VPP_CHOICES,
    enumerate_space,
    pp_choices,
)


def reference_rows(model, training, max_gpus, gpn, pins):
    """(dp, tp, pp, cp, ep, vpp, mbs, sp, recompute, zero, dp_shard, recompute-modules mask) by the
    documented rules, knob by knob: every layout with full sharding (dp_shard 0), then — where the
    framework shards over part of dp at the row's stage and dp spans more than a node — its
    node-local HSDP twin."""
    L, B, s = model.num_layers, training.global_batch_size, training.sequence_length
    r = rules_for(training.framework)

    def pick(key, values):
        # A pinned value is kept whatever the dominance rules say (it was checked up front).
        return [pins[key]] if key in pins else list(values)

    tps = [pins["tp"]] if "tp" in pins else [
        t for t in (1, 2, 4, 8, 16, 32, 64)
        if gpn % t == 0 and model.num_heads % t == 0 and (model.num_kv_heads % t == 0 or t % model.num_kv_heads == 0)
        and (t == 1 or r.tensor_parallel)
    ]
    cps = pick("cp", [c for c in CP_CHOICES if s % c == 0 and (c == 1 or s // c >= 1024) and (c == 1 or r.context_parallel)])
    pps = [pins["pp"]] if "pp" in pins else (pp_choices(L) if r.pipeline_parallel else [1])
    dps = pick("dp", [d for d in range(1, B + 1) if B % d == 0])
    # selective differs from none with unfused attention, in FP8/FP4 (the fused attention's 16-bit
    # output it discards), or as torchtitan's op-level policy (dense layers)
    op_level = r.selective_recompute == "op-level"
    own = training.attention == "unfused" or training.dtype in ("fp8", "fp4") or op_level
    # Megatron-Core, a model with MoE or MLA layers: selective with the output-discarding modules too
    lean = lean_recompute_modules(model, training) if r.recompute_modules else ()
    rcs = []
    for rc in pick("recompute", ["none", "full"] + (["selective"] if own or lean else [])):
        if rc != "selective":
            rcs.append((rc, 0))
            continue
        if own or "recompute" in pins:
            rcs.append((rc, 0))
        if lean:
            rcs.append((rc, recompute_modules_mask(lean)))
    eps = pick("ep", [e for e in range(1, model.num_experts + 1) if model.num_experts % e == 0] if model.is_moe else [1])
    vpps = pick("vpp", VPP_CHOICES if r.interleaved_pipeline else (1,))
    rows = []
    for tp, cp, pp, dp, ep, mbs, vpp, (rc, mods) in itertools.product(tps, cps, pps, dps, eps, pick("micro_batch_size", MBS_CHOICES), vpps, rcs):
        ep_ranks = tp * cp * dp if r.ep_folding else dp * cp  # MoE parallel folding (megatron-core)
        if tp * cp * pp * dp > max_gpus or pp > L or ep_ranks % ep or (B // dp) % mbs:
            continue
        # context parallelism: DeepSpeed-Ulysses without TP / a pipeline; all-to-all hands out whole heads
        if cp > 1 and ((tp > 1 and not r.cp_with_tp) or (pp > 1 and not r.cp_with_pp)
                       or (training.cp_exchange == "a2a" and model.num_heads % (tp * cp))):
            continue
        # Paddle fleet's expert groups: ep consecutive ranks of sharding × mp, no segment parallelism
        if ep > 1 and r.ep_over_sharding and (cp > 1 or ep % tp or (tp * dp) % ep):
            continue
        m = B // dp // mbs
        # interleaved chunks: even, or near-even (one decoder layer each at least) at a depth with no
        # even interleaving or under a pinned vpp
        near_even_ok = (pins.get("vpp", 1) > 1 or not any(L % (pp * v) == 0 for v in vpps if v > 1)) and pp * vpp <= L
        if vpp > 1 and (pp == 1 or (L % (pp * vpp) and not near_even_ok) or interleaved_counts_refused(training.framework, m, pp)):
            continue
        if vpp > 1 and training.framework == "paddle" and pp <= 2:  # Paddle's interleaved schedule: pp > 2
            continue
        if "zero_stage" in pins:
            zeros = [pins["zero_stage"]]
        elif r.sharding_with_pipeline:
            zeros = [z for z in (1, 2, 3) if z in r.zero_stages]
            if not r.sharded_gradients_in_pipeline and pp > 1:  # torchtitan: no ZeRO-2 across a pipeline's micro-batches
                zeros = [z for z in zeros if z != 2]
        else:  # stage 0 beside 1 under DeepSpeed's engine, whose ZeRO optimizer has buffers of its own
            zeros = ([0, 1] if r.deepspeed_engine else [1]) + ([] if pp > 1 else [2, 3])
        if training.precision_aware_optimizer and "zero_stage" not in pins:  # Megatron-Core's distributed optimizer only
            zeros = [1]
        zeros = [z for z in zeros if r.sharding_with_pipeline or not (z >= 2 and pp > 1)]
        if training.framework == "paddle":  # its stage 2/3 needs a sharding group of more than one rank
            zeros = [z for z in zeros if z < 2 or dp > 1]
        if model.is_moe and training.framework == "megatron-deepspeed":  # DeepSpeed's native MoE: no ZeRO-3
            zeros = [z for z in zeros if z != 3]
        if model.is_moe and training.framework == "deepspeed" and ep > 1 and cp > 1:  # AutoEP: no ZeRO-3 beside Ulysses
            zeros = [z for z in zeros if z != 3]
        sps = [pins["sequence_parallel"]] if "sequence_parallel" in pins else [tp > 1 and r.sequence_parallel]
        for z in zeros:
            for sp in sps:
                rows.append((dp, tp, pp, cp, ep, vpp, mbs, sp, RECOMPUTE_CODE[rc], z, 0, mods))
    twins = []
    for row in rows:
        dp, tp, pp, cp, ep, z = row[0], row[1], row[2], row[3], row[4], row[9]
        shard = gpn // (tp * cp) if gpn % (tp * cp) == 0 else 0
        if "dp_shard" in pins or z not in r.partial_sharding_stages or not 0 < shard < dp or dp % shard:
            continue
        if training.framework == "paddle" and z >= 2 and shard == 1:
            continue
        if ep > 1 and r.ep_over_sharding:  # fleet's expert layout: every dp rank a sharding rank
            continue
        if model.is_moe:  # the experts' EDP replicas split into the dp/shard replica groups (Paddle's experts whole: etp 1)
            edp = round(float(expert_data_parallel(tp, cp, dp, ep, 1 if r.ep_over_sharding else 0)))
            if edp % (dp // shard):
                continue
        twins.append((*row[:10], shard, row[11]))
    return rows + twins


COLUMNS = ("dp", "tp", "pp", "cp", "ep", "vpp", "mbs", "sp", "recompute", "zero")


def _rows(S):
    shard = S.dp_shard.tolist() if S.dp_shard is not None else [0.0] * len(S)
    mods = S.recompute_modules.tolist() if S.recompute_modules is not None else [0.0] * len(S)
    return list(zip(*(getattr(S, f).tolist() for f in COLUMNS), shard, mods, strict=True))


MODELS = {
    "llama3-70b": {"global_batch_size": 1024, "sequence_length": 8192},
    "gpt3-175b": {"global_batch_size": 1536, "sequence_length": 2048, "attention": "unfused"},
    "mixtral-8x7b": {"global_batch_size": 256, "sequence_length": 4096},
    "llama3-8b": {"global_batch_size": 256, "sequence_length": 8192, "dtype": "fp8"},
}
#: Framework variants: every framework's rule table applied row by row.
FRAMEWORK_MODELS = {
    "llama3-70b": ["megatron-deepspeed", "fsdp"],
    "mixtral-8x7b": ["deepspeed", "megatron-deepspeed", "paddle"],
}
PINS = [{}, {"zero_stage": 3}, {"zero_stage": 1}, {"sequence_parallel": False}, {"sequence_parallel": True}, {"pp": 7, "vpp": 1},
        {"micro_batch_size": 3}, {"tp": 2, "dp": 8}, {"vpp": 2}, {"recompute": "selective"}]


@pytest.mark.parametrize("preset", list(MODELS))
@pytest.mark.parametrize("max_gpus", [8, 1016])
def test_enumeration_equals_the_rules_row_by_row(preset, max_gpus):
    req = parse_plan_request({"model": {"preset": preset}, "training": MODELS[preset],
                              "cluster": {"name": "c", "node_groups": [{"name": "g", "count": 1, "gpus_per_node": 8, "device": "H100-SXM5-80GB"}]}})
    for pins in PINS:
        S = enumerate_space(req.model, req.training, max_gpus, 8, pins)
        got = _rows(S)
        assert got == [tuple(float(v) if not isinstance(v, bool) else v for v in r) for r in reference_rows(req.model, req.training, max_gpus, 8, pins)], pins
        assert S.sp.dtype == np.bool_


@pytest.mark.parametrize(("preset", "framework"), [(p, f) for p, fs in FRAMEWORK_MODELS.items() for f in fs])
def test_enumeration_follows_each_frameworks_rules(preset, framework):
    req = parse_plan_request({"model": {"preset": preset}, "training": {**MODELS[preset], "framework": framework},
                              "cluster": {"name": "c", "node_groups": [{"name": "g", "count": 1, "gpus_per_node": 8, "device": "H100-SXM5-80GB"}]}})
    r = rules_for(framework)
    for pins in [{}, {"sequence_parallel": False}, {"micro_batch_size": 3}]:
        S = enumerate_space(req.model, req.training, 64, 8, pins)
        got = _rows(S)
        assert got == [tuple(float(v) if not isinstance(v, bool) else v for v in row) for row in reference_rows(req.model, req.training, 64, 8, pins)], pins
        assert len(S) > 0 or "micro_batch_size" in pins
        if not r.interleaved_pipeline:
            assert (S.vpp == 1).all()
        if not r.context_parallel:
            assert (S.cp == 1).all()
        if not r.tensor_parallel:
            assert (S.tp == 1).all()
        assert set(S.zero.tolist()) <= set(r.zero_stages)
