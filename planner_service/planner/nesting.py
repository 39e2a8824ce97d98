"""The nesting order of the parallel dimensions as a search knob.

On a cluster with a ``topology`` the search costs every layout once per distinct nesting order
of its dimensions over the GPUs (``cost_model.topology.NESTINGS``: TP innermost, then every order
of CP, DP and PP), so which dimension crosses nodes, leaves and pods is decided by the cost model
— a bandwidth-hungry group moves inside a pod when the spine is oversubscribed.  Orders that
differ only in where a size-1 dimension sits are the same placement and are costed once (the
first of them in ``NESTINGS`` order, Megatron's first).  Without a topology the search keeps
Megatron's order only, the one every framework launches by default: the flat model does price
other orders (``strategy.nesting`` is estimated on any cluster), and one may be a little faster
there — pipeline sends inside a node and data parallelism across nodes, 0.03–0.3% in the plans
compared — but the order is searched only where the cluster states a topology.

Only single-pool candidates take a nesting: several pools put pipeline stages on different node
groups, so the pipeline is outermost there.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from cost_model.cluster import Cluster, NodeGroup
from cost_model.strategy import Strategy
from cost_model.topology import DIMS, NESTINGS, crossings, data_axes, expert_axes, members_in, strides
from cost_model.transformer.layer_cost import StrategyArrays
from cost_model.transformer.memory import MemoryBound


def _signature(S: StrategyArrays, code: int) -> np.ndarray:
    """The order with size-1 dimensions removed, as one integer per candidate."""
    sizes = {"tp": S.tp, "cp": S.cp, "dp": S.dp, "pp": S.pp}
    sig = np.zeros(len(S), dtype=np.int64)
    for d in NESTINGS[code]:
        used = sizes[d] > 1
        sig = np.where(used, sig * 5 + DIMS.index(d) + 1, sig)
    return sig


def _placement_signature(S: StrategyArrays, code: int, group: NodeGroup) -> np.ndarray:
    """Everything the cost model reads of a placement, per candidate ([N, F]): how many members
    of each group (context, data, expert, expert-data, pipeline; tensor parallelism is innermost
    in every order) share a node and a domain of each level, and whether neighbouring stages
    are on different nodes.  Two orders with equal signatures cost exactly the same."""
    from planner_service.planner.transformer.tables import pp_cross_node

    Sk = replace(S, nest=np.full(len(S), float(code)))
    st = strides(Sk)
    ep_axes, edp_axes = expert_axes(Sk)
    groups = [[(Sk.cp, st["cp"])], data_axes(Sk), ep_axes, edp_axes, [(Sk.pp, st["pp"])]]
    assert group.topology is not None
    domains = [group.gpus_per_node, *(lv.group_size_nodes * group.gpus_per_node for lv in group.topology.levels)]
    cols = [members_in(d, axes) for d in domains for axes in groups]
    cols.append(pp_cross_node(Sk, group.gpus_per_node).astype(float))
    return np.stack(cols, axis=1)


def expand_nestings(S: StrategyArrays, group: NodeGroup) -> StrategyArrays:
    """Every candidate once per nesting order that places it differently when the pool has a
    topology (rows of one candidate stay together, in ``NESTINGS`` order); unchanged otherwise.
    Orders that differ only where a size-1 dimension sits, or whose groups share nodes and
    domains alike (:func:`_placement_signature`), cost the same and are costed once."""
    if group.topology is None or len(S) == 0:
        return S
    sigs = np.stack([_signature(S, k) for k in range(len(NESTINGS))], axis=1)  # [N, K]
    keep = np.ones(sigs.shape, dtype=bool)
    for k in range(1, len(NESTINGS)):
        keep[:, k] = ~(sigs[:, :k] == sigs[:, k : k + 1]).any(axis=1)
    places = [_placement_signature(S, k, group) for k in range(len(NESTINGS))]
    for k in range(1, len(NESTINGS)):
        same = np.zeros(len(S), dtype=bool)
        for j in range(k):
            same |= (places[j] == places[k]).all(axis=1)
        keep[:, k] &= ~same
    rows, codes = np.nonzero(keep)
    out = S.take(rows)
    return replace(out, nest=codes.astype(float))


def with_nesting(S: StrategyArrays, i: int, strategy: Strategy) -> Strategy:
    """``strategy`` (candidate i of S) with its nesting order (None for Megatron's)."""
    if S.nest is None or int(S.nest[i]) == 0:
        return strategy
    return replace(strategy, nesting=NESTINGS[int(S.nest[i])])


def boundary_report(cluster: Cluster, strategy: Strategy, stage_groups: tuple[str, ...]) -> list[dict[str, Any]] | None:
    """Which dimension's groups cross the node and each topology level (by the domain sizes the
    cost model prices), for a single-pool plan on a cluster with a topology; None otherwise."""
    if cluster.topology is None or len(set(stage_groups)) != 1:
        return None
    group = cluster.group(stage_groups[0])
    S = StrategyArrays.from_strategies([strategy])
    levels = [(lv.name, lv.group_size_nodes * group.gpus_per_node) for lv in cluster.topology.levels]
    return crossings(S, 0, group.gpus_per_node, levels)


def nesting_comparison(
    best: Strategy, stage_groups: tuple[str, ...], cluster: Cluster, step_of: Any
) -> list[dict[str, Any]]:
    """The best layout under every other distinct nesting order: ``step_of(strategy)`` gives its
    estimate (or None when it fails).  Each item: nesting, step_time_s, breakdown_s, boundaries."""
    if cluster.topology is None or len(set(stage_groups)) != 1:
        return []
    S = StrategyArrays.from_strategies([replace(best, nesting=None)])
    sigs = [int(_signature(S, k)[0]) for k in range(len(NESTINGS))]
    out: list[dict[str, Any]] = []
    seen: set[int] = set()
    for k, sig in enumerate(sigs):
        if sig in seen:
            continue
        seen.add(sig)
        s = replace(best, nesting=None if k == 0 else NESTINGS[k])
        est = step_of(s)
        if est is None:
            continue
        out.append({"nesting": list(NESTINGS[k]), "step_time_s": est.step_time_s, "breakdown_s": dict(est.breakdown_s),
                    "boundaries": boundary_report(cluster, s, stage_groups), "chosen": (s.nesting == best.nesting)})
    return out


def _crossing_text(boundaries: list[dict[str, Any]]) -> str:
    """Per dimension the outermost boundary its groups cross: "tp inside nodes, dp across pod"."""
    outermost: dict[str, str] = {}
    for b in boundaries:
        for d in b["crossed_by"]:
            outermost[d] = b["boundary"]
    return ", ".join(f"{d} across {'nodes' if where == 'node' else where + 's'}" for d, where in outermost.items()) or "every group inside a node"


def explain_nesting(comparison: list[dict[str, Any]]) -> str | None:
    """Why this nesting order: what crosses each boundary, and what each other order would cost
    (the step change and the term that grows most)."""
    chosen = next((c for c in comparison if c["chosen"]), None)
    if chosen is None or chosen["boundaries"] is None:
        return None
    text = f"nesting {'<'.join(chosen['nesting'])} (inner to outer): {_crossing_text(chosen['boundaries'])}"
    others = []
    for c in comparison:
        if c is chosen:
            continue
        deltas = {k: c["breakdown_s"].get(k, 0.0) - chosen["breakdown_s"].get(k, 0.0) for k in chosen["breakdown_s"]}
        worst = max(deltas, key=lambda k: deltas[k])
        change = c["step_time_s"] / chosen["step_time_s"] - 1.0
        others.append(f"{'<'.join(c['nesting'])} {change * 100:+.1f}% ({worst} {deltas[worst]:+.3g} s; {_crossing_text(c['boundaries'] or [])})")
    if others:
        text += ". Other orders of the same layout: " + "; ".join(others)
    return text


def feasible_then_expand(model: Any, training: Any, pc: Any, usable_fraction: float,
                         bound: MemoryBound) -> tuple[StrategyArrays, np.ndarray | None]:
    """Nesting orders for the candidates (``pc``: their ``tables.PoolCosts``) some stage split of
    which fits memory, and the indices of those dropped for not fitting (no split of theirs
    fits under any order; None when none is tested).  Memory does not depend on where a group
    sits in the network, so the memory test runs once per layout (Megatron's order) and only the
    layouts that pass are costed under every order — the same answer as costing every order of
    every layout, at a fraction of the work.  Without a topology (or when nothing fits, so that
    the search reports the closest shortfall) the candidates are returned as they are.
    ``usable_fraction``: the share of device memory usable (1 − headroom); ``bound``: the end of
    the predicted peak's interval that must be within it (the search's ``fit_bound``)."""
    from planner_service.planner.transformer.tables import even_tables

    S, group = pc.S, pc.group
    if group.topology is None or len(S) == 0:
        return S, None
    feasible = even_tables(model, training, pc).evaluate(group.device.memory_bytes * usable_fraction, bound).feasible
    fits = np.nonzero(feasible)[0]
    if len(fits) == 0:
        return S, None
    return expand_nestings(S.take(fits), group), np.nonzero(~feasible)[0]
