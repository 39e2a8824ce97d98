"""Exhaustive enumeration of strategies × stage splits × stage placements, through the public
``cost_model.estimate`` — the reference the planner must match on small instances."""

from __future__ import annotations

import itertools

from cost_model import Strategy, estimate
from cost_model.errors import PlannerError
from cost_model.estimate import memory_verdict
from cost_model.frameworks import rules_for
from cost_model.strategy import block_recompute_depths
from cost_model.topology import MEGATRON_NESTING, NESTINGS


def compositions(total: int, parts: int):
    for cuts in itertools.combinations(range(1, total), parts - 1):
        bounds = (0,) + cuts + (total,)
        yield tuple(bounds[i + 1] - bounds[i] for i in range(parts))


def interleaved_counts_refused(framework: str, m: int, pp: int) -> bool:
    """Whether the framework's interleaved schedule refuses m micro-batches over pp stages, as
    the frameworks document it (the reference the space's vectorised rule must match): Megatron-Core
    groups any m ≥ pp (its micro-batch group setting); torchtitan runs max(1, m // pp) rounds that
    divide m (m ≥ pp); Paddle takes m = pp (every forward first) or m ≥ 2·pp (a first group of
    m mod pp + pp); otherwise whole multiples of pp."""
    r = rules_for(framework)
    if r.interleaved_microbatch_group:
        return m < pp
    if r.interleaved_rounds:
        return m < pp or m % (m // pp) != 0
    if r.interleaved_leading_group:
        return m != pp and m < 2 * pp
    return m % pp != 0


def brute_force(model, training, cluster, headroom=0.0, pins=None):
    """Minimum step time over every valid strategy, split and contiguous placement of stages on
    node groups (each stage on one group; one group's stages consecutive) and, on a cluster with
    a topology, every nesting order of a one-group placement, and node-local HSDP (dp_shard) where
    the framework shards over part of dp — among those whose memory is safe
    (p90 within usable memory) when any is, else among the tight ones (p10 within), as the
    planner ranks them.  ``pins``: knobs held fixed (Strategy field names), as the planner's
    constraints pin them."""
    pins = pins or {}
    groups = list(cluster.node_groups)
    gpus = {g.name: g.gpus_per_node * len(cluster.available_nodes(g.name)) for g in groups}
    L = model.num_layers
    B = training.global_batch_size
    s = training.sequence_length
    best = (float("inf"), None, None)
    best_key = (True, float("inf"))
    for tp in (1, 2, 4, 8):
        if any(g.gpus_per_node % tp for g in groups) or model.num_heads % tp:
            continue
        for cp in (1, 2, 4):
            if s % cp or (cp > 1 and s // cp < 1024):
                continue
            for dp in [d for d in range(1, B + 1) if B % d == 0]:
                block = dp * cp * tp
                if block > sum(gpus.values()):
                    continue
                for pp in range(1, L + 1):
                    for mbs in (1, 2, 4, 8):
                        if (B // dp) % mbs:
                            continue
                        m = B // dp // mbs
                        for vpp in (1, 2, 3, 4, 6, 8):
                            if vpp > 1 and (pp == 1 or L % (pp * vpp) or interleaved_counts_refused(training.framework, m, pp)):
                                continue
                            for rc in ("none", "selective", "full"):
                                if rc == "selective" and training.attention != "unfused":
                                    continue
                                for zero in (0, 1, 2, 3):
                                    if zero >= 2 and pp > 1:
                                        continue
                                    for sp in ((False, True) if tp > 1 else (False,)):
                                        splits = [None] if vpp > 1 else list(compositions(L, pp))
                                        for placement in _placements(groups, gpus, block, pp):
                                            for split in splits:
                                                knobs = dict(dp=dp, tp=tp, pp=pp, cp=cp, vpp=vpp, micro_batch_size=mbs,
                                                             sequence_parallel=sp, recompute=rc, zero_stage=zero)
                                                if any(knobs[k] != v for k, v in pins.items()):
                                                    continue
                                                nests = NESTINGS if cluster.topology is not None and len(set(placement)) == 1 else (MEGATRON_NESTING,)
                                                # block recompute depths: searched on one pool, for megatron-core
                                                depths = [0] + (block_recompute_depths(L, pp * vpp) if rc == "full" and len(set(placement)) == 1
                                                                and rules_for(training.framework).block_recompute and "recompute" not in pins else [])
                                                # HSDP: the node-local shard group beside full sharding, where the framework has it
                                                gpn = min(g.gpus_per_node for g in groups if g.name in placement)
                                                node_shard = gpn // (tp * cp) if gpn % (tp * cp) == 0 else 0
                                                shards = [0] + ([node_shard] if zero in rules_for(training.framework).partial_sharding_stages
                                                                and 0 < node_shard < dp and dp % node_shard == 0 else [])
                                                for nest, depth, shard in itertools.product(nests, depths, shards):
                                                    st = Strategy(**knobs, layers_per_stage=split, nesting=None if nest == MEGATRON_NESTING else nest,
                                                                  recompute_num_layers=depth, dp_shard=shard)
                                                    try:
                                                        est = estimate(model, training, cluster, st, stage_groups=placement)
                                                    except PlannerError:
                                                        continue
                                                    fits, tight, _ = memory_verdict(est.stages, headroom, training.framework)
                                                    if fits and (tight, est.step_time_s) < best_key:
                                                        best_key = (tight, est.step_time_s)
                                                        best = (est.step_time_s, st, placement)
    return best


def _placements(groups, gpus, block, pp):
    """Contiguous stage blocks per group, groups in any order."""
    out = []
    names = [g.name for g in groups]
    for r in range(1, len(names) + 1):
        for order in itertools.permutations(names, r):
            for counts in compositions(pp, r) if pp >= r else []:
                if all(c * block <= gpus[n] for n, c in zip(order, counts, strict=True)):
                    out.append(tuple(n for n, c in zip(order, counts, strict=True) for _ in range(c)))
    return out
