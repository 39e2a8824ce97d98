"""Cost tables for the search, computed with the cost model's own vectorised functions.

Shapes (documented seam between cost model and solver):

* ``StageLinear`` — for one pool (node group) and one candidate, per stage index i of a
  pp-stage pipeline: every per-stage quantity the step time and memory depend on is *affine*
  in the number of layers n placed on the stage (``value(n) = a[i] + b[i]·n``).  Arrays have
  shape ``[pp]``, seconds and bytes.  The solver works on these coefficients, so its
  objective is the cost model's step time exactly (up to integer scaling).
* ``evaluate_even`` — for a pool and an array of N candidates: step time with the near-even
  layer split, a lower bound over *all* splits, and whether some split fits memory.  Arrays of
  shape ``[N]``.

Every number comes from ``cost_model.pipeline.stage_cost`` / ``combine_stages`` — the same
functions ``cost_model.estimate`` uses.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cost_model.cluster import NodeGroup
from cost_model.comm import Links
from cost_model.model import TransformerSpec
from cost_model.pipeline import combine_stages, device_costs, stage_cost
from cost_model.training import Training
from cost_model.transformer_cost import StrategyArrays


@dataclass(frozen=True)
class PoolCosts:
    group: NodeGroup
    S: StrategyArrays
    dc: object  # cost_model.pipeline.DeviceCosts


def pool_costs(model: TransformerSpec, training: Training, group: NodeGroup, S: StrategyArrays) -> PoolCosts:
    return PoolCosts(group, S, device_costs(model, training, group.device, Links.for_group(group), S))


def _take(obj, idx, n: int):
    """Index every per-candidate array field of a frozen dataclass (recursively)."""
    import dataclasses

    changes = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if isinstance(v, np.ndarray) and v.shape[:1] == (n,):
            changes[f.name] = v[idx]
        elif dataclasses.is_dataclass(v) and not isinstance(v, type) and f.name == "layer":
            changes[f.name] = _take(v, idx, n)
    return dataclasses.replace(obj, **changes)


def subset(pc: PoolCosts, idx) -> PoolCosts:
    n = len(pc.S)
    return PoolCosts(pc.group, pc.S.take(idx), _take(pc.dc, idx, n))


def _m(S: StrategyArrays, training: Training):
    return training.global_batch_size / (S.dp * S.mbs)


def _stage(model, training, pc: PoolCosts, S, n, i, first, last, cross):
    return stage_cost(model, training, pc.dc, S, n, i, first, last, _m(S, training), cross)


@dataclass(frozen=True)
class EvenEval:
    step_time_s: np.ndarray  # near-even split (inf when it does not fit)
    lower_bound_s: np.ndarray  # no split can be faster
    feasible: np.ndarray  # some split fits memory (bool)
    min_memory_shortfall_bytes: np.ndarray  # > 0: bytes missing on the tightest stage of the best split


def _stages_for_split(model, training, pcg, Sg, layers, cross):
    """Stacked StageCost ([stages, candidates]) for a fixed split ``layers``: the middle stages
    vectorised over the stage index; the first and last carry the embedding and head."""
    from cost_model.pipeline import StageCost, stack_stages

    p = len(layers)
    if p == 1:
        return stack_stages([_stage(model, training, pcg, Sg, layers[0], 0, True, True, cross)])
    first = _stage(model, training, pcg, Sg, layers[0], 0, True, False, cross)
    last = _stage(model, training, pcg, Sg, layers[-1], p - 1, False, True, cross)
    if p == 2:
        return stack_stages([first, last])
    idx = np.arange(1, p - 1, dtype=float)[:, None]
    n = np.asarray(layers[1:-1], dtype=float)[:, None]
    mid = _stage(model, training, pcg, Sg, n, idx, False, False, cross)
    import dataclasses

    shape = (p - 2, len(Sg))
    return StageCost(
        **{
            f.name: np.concatenate(
                [np.broadcast_to(getattr(first, f.name), shape[1:])[None, :], np.broadcast_to(getattr(mid, f.name), shape), np.broadcast_to(getattr(last, f.name), shape[1:])[None, :]]
            )
            for f in dataclasses.fields(StageCost)
        }
    )


def evaluate_even(model: TransformerSpec, training: Training, pc: PoolCosts, capacity_bytes: float) -> EvenEval:
    """Evaluate every candidate in ``pc.S`` with the near-even split, bound all splits, and
    decide memory feasibility exactly (stage memory is affine in its layer count, so a split
    exists iff Σ_i max_layers_i ≥ L with every max_layers_i ≥ 1)."""
    S = pc.S
    L = model.num_layers
    N = len(S)
    step = np.full(N, np.inf)
    lb = np.full(N, np.inf)
    feasible = np.zeros(N, dtype=bool)
    shortfall = np.zeros(N)
    block = S.dp * S.cp * S.tp
    cross_all = block >= pc.group.gpus_per_node
    for pp in np.unique(S.pp):
        idx = np.nonzero(S.pp == pp)[0]
        pcg = subset(pc, idx)
        Sg = pcg.S
        p = int(pp)
        cross = cross_all[idx]
        split = even_split_layers(L, p)
        stages = _stages_for_split(model, training, pcg, Sg, split, cross)
        zero = _stages_for_split(model, training, pcg, Sg, [0] * p, cross)
        one = _stages_for_split(model, training, pcg, Sg, [1] * p, cross)
        a = zero.peak_memory_bytes
        b = one.peak_memory_bytes - a
        k = np.floor((capacity_bytes - a) / np.maximum(b, 1e-9))
        cap_layers = np.clip(k, 0, L).sum(axis=0)
        min_one_ok = (k >= 1).all(axis=0)
        worst_short = (a + b - capacity_bytes).max(axis=0)
        sum_t = stages.time_s.sum(axis=0)
        fits_even = (stages.peak_memory_bytes <= capacity_bytes).all(axis=0)
        sc = combine_stages(stages, Sg, _m(Sg, training), training)
        step[idx] = np.where(fits_even, sc.step_time_s, np.inf)
        feas = min_one_ok & (cap_layers >= L)
        feasible[idx] = feas
        shortfall[idx] = np.where(feas, 0.0, np.maximum(worst_short, 1.0))
        # Lower bound: pipeline ≥ (m − 1/v)·Σt/p + Σt/v (max ≥ mean; Σt is split-independent),
        # optimizer ≥ its value for the mean parameter share of a middle stage.
        m = _m(Sg, training)
        v = Sg.vpp
        mid = _stage(model, training, pcg, Sg, L / p, 1 if p > 2 else 0, False, False, cross)
        lb[idx] = (m - 1.0 / v) * sum_t / p + sum_t / v + mid.optimizer_s
    return EvenEval(step, lb, feasible, shortfall)


def even_split_layers(num_layers: int, pp: int) -> list[int]:
    q, r = divmod(num_layers, pp)
    return [q + (1 if i < r else 0) for i in range(pp)]


@dataclass(frozen=True)
class StageLinear:
    """Affine per-stage coefficients for one candidate on one pool: value = a + b·n."""

    time_a: np.ndarray
    time_b: np.ndarray
    bwd_a: np.ndarray
    bwd_b: np.ndarray
    dp_a: np.ndarray
    dp_b: np.ndarray
    opt_a: np.ndarray
    opt_b: np.ndarray
    mem_a: np.ndarray
    mem_b: np.ndarray
    p2p_cross_extra_s: np.ndarray  # added to stage time when the next stage is on another pool


def stage_linear(model: TransformerSpec, training: Training, pc: PoolCosts, cand: int, pp: int, cross_default: bool) -> StageLinear:
    """Coefficients for candidate ``cand`` of ``pc.S`` at every stage index of a pp-stage
    pipeline (first stage carries the embedding, last the head).  Vectorised over the stage
    index: the candidate is repeated pp times and the stage index is an array."""
    rep = np.full(pp, cand)
    pcr = subset(pc, rep)
    S = pcr.S
    idx = np.arange(pp, dtype=float)

    def at(n, first: bool, last: bool, cross) -> dict[str, np.ndarray]:
        st = _stage(model, training, pcr, S, n, idx, first, last, cross)
        return {
            "time": st.time_s,
            "bwd": st.backward_s,
            "dp": st.dp_comm_s,
            "opt": st.optimizer_s,
            "mem": st.peak_memory_bytes,
        }

    def merged(n, cross):
        mid = at(n, False, False, cross)
        if pp == 1:
            only = at(n, True, True, cross)
            return {k: only[k] for k in mid}
        first = at(n, True, False, cross)
        last = at(n, False, True, cross)
        out = {}
        for k in mid:
            v = mid[k].copy()
            v[0] = first[k][0]
            v[-1] = last[k][-1]
            out[k] = v
        return out

    v0 = merged(0.0, cross_default)
    v1 = merged(1.0, cross_default)
    vx = merged(0.0, True)
    cols = {}
    for k in v0:
        cols[k + "_a"] = v0[k]
        cols[k + "_b"] = v1[k] - v0[k]
    cols["p2p_cross_extra_s"] = vx["time"] - v0["time"]
    return StageLinear(**cols)
