"""Cost tables for the search, computed with the cost model's own vectorised functions.

Shapes (documented seam between cost model and solver):

* ``StageLinear`` — for one pool (node group) and one candidate, per stage index i of a
  pp-stage pipeline: every per-stage quantity the step time and memory depend on is *affine*
  in the number of layers n placed on the stage (``value(n) = a[i] + b[i]·n``).  Arrays have
  shape ``[pp]``, seconds and bytes.  The solver works on these coefficients, so its
  objective is the cost model's step time exactly (up to integer scaling).
* ``even_tables`` — for a pool and an array of N candidates: step time with the near-even
  layer split, a lower bound over *all* splits, and whether some split fits memory (its
  ``EvenTables.evaluate`` at a capacity, a few array comparisons: the costing does not depend
  on the capacity).  Arrays of shape ``[N]``.  ``compute_lower_bound_s`` bounds the same
  candidates from their compute alone, before any of them is costed.

Memory is tested as an end of the predicted peak's interval
(:class:`cost_model.transformer.memory.MemoryBound`): affine in the stage's peak and its
fragmentation reserve, so affine in n as they are; the tables carry both.

Every number comes from ``cost_model.transformer.stage_cost.stage_cost`` / ``combine_stages`` — the same
functions ``cost_model.estimate`` uses.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from cost_model.cluster import NodeGroup
from cost_model.compute import ArrayOrFloat
from cost_model.strategy import even_split
from cost_model.topology import links_for_group, strides
from cost_model.training import Training
from cost_model.transformer.layer_cost import StrategyArrays
from cost_model.transformer.memory import POINT, MemoryBound
from cost_model.transformer.spec import TransformerSpec
from cost_model.transformer.stage_cost import (
    DeviceCosts,
    StageCost,
    combine_stages,
    compute_stretch,
    device_costs,
    stage_cost,
)

_STAGE_FIELDS = dataclasses.fields(StageCost)


@dataclass(frozen=True)
class PoolCosts:
    group: NodeGroup
    S: StrategyArrays
    dc: DeviceCosts


def pool_costs(model: TransformerSpec, training: Training, group: NodeGroup, S: StrategyArrays) -> PoolCosts:
    return PoolCosts(group, S, device_costs(model, training, group.device, links_for_group(group), S))


if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_D = TypeVar("_D", bound="DataclassInstance")


def _take(obj: _D, idx: np.ndarray, n: int) -> _D:
    """Index every per-candidate array field of a frozen dataclass (recursively)."""
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if isinstance(v, np.ndarray) and v.shape[:1] == (n,):
            changes[f.name] = v[idx]
        elif dataclasses.is_dataclass(v) and not isinstance(v, type) and f.name == "layer":
            changes[f.name] = _take(v, idx, n)
    return dataclasses.replace(obj, **changes)


def subset(pc: PoolCosts, idx: np.ndarray) -> PoolCosts:
    n = len(pc.S)
    return PoolCosts(pc.group, pc.S.take(idx), _take(pc.dc, idx, n))


def pp_cross_node(S: StrategyArrays, gpus_per_node: int) -> np.ndarray:
    """Whether neighbouring stages are on different nodes, per candidate: a stage block of
    whole nodes in Megatron's order (``cost_model.estimate._cross_node``); with another nesting,
    a stride of a node or a pipeline wider than a node (``cost_model.topology.pp_crosses_node``)."""
    block = S.dp * S.cp * S.tp
    if S.nest is None:
        out: np.ndarray = block >= gpus_per_node
        return out
    st = strides(S)["pp"]
    megatron = S.nest == 0
    nested: np.ndarray = np.where(megatron, block >= gpus_per_node, (st >= gpus_per_node) | (st * S.pp > gpus_per_node))
    return nested


def _m(S: StrategyArrays, training: Training) -> np.ndarray:
    m: np.ndarray = training.global_batch_size / (S.dp * S.mbs)
    return m


def _bubble_v(S: StrategyArrays, training: Training) -> np.ndarray:
    """The divisor of the pipeline bubble (``combine_stages``): v, or v/k for a step of k
    pipeline schedules (``Training.pipeline_schedules``)."""
    w: np.ndarray = S.vpp / training.pipeline_schedules(S.pp)
    return w


def _stage(
    model: TransformerSpec,
    training: Training,
    pc: PoolCosts,
    S: StrategyArrays,
    n: ArrayOrFloat,
    i: ArrayOrFloat,
    first: bool,
    last: bool,
    cross: np.ndarray | bool,
) -> StageCost:
    return stage_cost(model, training, pc.dc, S, n, i, first, last, _m(S, training), cross)


@dataclass(frozen=True)
class EvenEval:
    step_time_s: np.ndarray  # near-even split (inf when it does not fit)
    lower_bound_s: np.ndarray  # no split can be faster
    feasible: np.ndarray  # some split fits memory (bool)
    safe_step_time_s: np.ndarray | None = None  # near-even split within the safe bound (inf otherwise)


@dataclass(frozen=True)
class _SplitStages:
    """Stage costs of V splits of one pipeline depth p, as ``stage_cost`` returned them: the
    first stage, the middle stages ([V, p−2, N]) and the last.  Per-stage arrays ([p, N]) of one
    split are stacked on demand, only for the quantities asked for."""

    parts: tuple[StageCost, ...]
    middle: tuple[bool, ...]  # which part holds the middle stages
    V: int
    p: int
    N: int

    def stacked(self, k: int, value: Callable[[StageCost], np.ndarray]) -> np.ndarray:
        """``value`` of every stage of split k, [p, N]."""
        rows = []
        for part, is_middle in zip(self.parts, self.middle, strict=True):
            if is_middle:
                rows.append(np.broadcast_to(value(part), (self.V, self.p - 2, self.N))[k])
            else:
                rows.append(np.broadcast_to(value(part), (self.V, self.N))[k][None, :])
        return rows[0] if len(rows) == 1 else np.concatenate(rows)

    def stage_cost(self, k: int) -> StageCost:
        """Every field of split k ([stages, candidates] arrays, as ``combine_stages`` takes)."""
        return StageCost(**{f.name: self.stacked(k, attrgetter(f.name)) for f in _STAGE_FIELDS})


def _stages_for_splits(
    model: TransformerSpec, training: Training, pcg: PoolCosts, Sg: StrategyArrays, layers: np.ndarray, cross: np.ndarray
) -> _SplitStages:
    """Costs of the splits ``layers`` ([V, p] layer counts, one row per split) in at most three
    ``stage_cost`` calls: the first stage (it carries the embedding), the middle stages
    vectorised over the stage index, the last (it carries the head)."""
    V, p = layers.shape
    N = len(Sg)
    if p == 1:
        only = _stage(model, training, pcg, Sg, layers[:, :1], 0, True, True, cross)
        return _SplitStages((only,), (False,), V, p, N)
    first = _stage(model, training, pcg, Sg, layers[:, :1], 0, True, False, cross)
    last = _stage(model, training, pcg, Sg, layers[:, -1:], p - 1, False, True, cross)
    if p == 2:
        return _SplitStages((first, last), (False, False), V, p, N)
    idx = np.arange(1, p - 1, dtype=float)[:, None]
    mid = _stage(model, training, pcg, Sg, layers[:, 1:-1, None], idx, False, False, cross)
    return _SplitStages((first, mid, last), (False, True, False), V, p, N)


@dataclass(frozen=True)
class _EvenGroup:
    """The candidates of one pipeline depth: their indices in ``pc.S`` and, per stage i and
    candidate, the affine stage peak a_i + b_i·n and fragmentation reserve r_i + s_i·n (bytes),
    and the near-even split's costs."""

    idx: np.ndarray
    mem_a_bytes: np.ndarray  # [p, n]
    mem_b_bytes: np.ndarray  # [p, n] (NaN when the pipeline is deeper than the layer count)
    res_a_bytes: np.ndarray  # [p, n]
    res_b_bytes: np.ndarray  # [p, n]
    even_peak_bytes: np.ndarray  # [p, n]
    even_reserve_bytes: np.ndarray  # [p, n]
    even_step_s: np.ndarray  # [n]
    lower_bound_s: np.ndarray  # [n]

    def tested(self, bound: MemoryBound) -> tuple[np.ndarray, np.ndarray]:
        """The affine coefficients (a, b) of ``bound``'s numerator per stage, [p, n]."""
        return bound.numerator(self.mem_a_bytes, self.res_a_bytes), bound.numerator(self.mem_b_bytes, self.res_b_bytes)

    def even_within(self, bound: MemoryBound, usable_bytes: float) -> np.ndarray:
        """Whether the near-even split's every stage is within ``bound`` at ``usable_bytes``, [n]."""
        within: np.ndarray = (bound.numerator(self.even_peak_bytes, self.even_reserve_bytes) <= bound.capacity(usable_bytes)).all(axis=0)
        return within


@dataclass(frozen=True)
class EvenTables:
    """What the near-even costing computes that does not depend on the memory capacity (every
    ``stage_cost`` call): a search costs its candidates once and takes the verdict for each
    bound it asks about (the p10 and the p90 one) with :meth:`evaluate`."""

    num_layers: int
    N: int
    groups: tuple[_EvenGroup, ...]

    def evaluate(self, usable_bytes: float, bound: MemoryBound, safe_bound: MemoryBound | None = None) -> EvenEval:
        """The near-even step (inf where it is not within ``bound`` at ``usable_bytes``), the
        bound over all splits, whether some split is within it (stage memory is affine in its
        layer count, so a split exists iff Σ_i max_layers_i ≥ L with every max_layers_i ≥ 1) and
        ``safe_bound``: also the near-even step of the candidates whose every stage is within it
        (the p90 end of :mod:`cost_model.transformer.memory`), inf for the others."""
        L, N = self.num_layers, self.N
        step = np.full(N, np.inf)
        lb = np.full(N, np.inf)
        feasible = np.zeros(N, dtype=bool)
        safe_step = np.full(N, np.inf)
        cap = bound.capacity(usable_bytes)
        for g in self.groups:
            a, b = g.tested(bound)
            # (a NaN slope — stages of 0 layers — fails every comparison: infeasible)
            k = np.floor((cap - a) / np.maximum(b, 1e-9))
            feas = (k >= 1).all(axis=0) & (np.clip(k, 0, L).sum(axis=0) >= L)
            step[g.idx] = np.where(g.even_within(bound, usable_bytes), g.even_step_s, np.inf)
            if safe_bound is not None:
                safe_step[g.idx] = np.where(g.even_within(safe_bound, usable_bytes), g.even_step_s, np.inf)
            feasible[g.idx] = feas
            lb[g.idx] = g.lower_bound_s
        return EvenEval(step, lb, feasible, safe_step if safe_bound is not None else None)

    def least_memory(self, bound: MemoryBound) -> tuple[np.ndarray, np.ndarray]:
        """Each candidate's least-memory split, its tightest stage: (its ``bound``, its predicted
        peak), bytes, [N] (inf where the pipeline is deeper than the layer count) — asked only
        when nothing fits (what the search reports) or for the layout with the best odds.

        Every stage at the level M of the continuous relaxation (Σ (M − a_i)/b_i = L of the
        bound's numerator), one layer each at least: a lower bound of the tightest stage's over
        all splits (for pp = 1: the whole stage's); its predicted peak, the stages' at those
        layer counts."""
        L = self.num_layers
        least_bound = np.full(self.N, np.inf)
        least_peak = np.full(self.N, np.inf)
        for g in self.groups:
            a, b = g.tested(bound)
            with np.errstate(invalid="ignore", divide="ignore"):
                inv_b = 1.0 / np.maximum(b, 1e-9)
                level = np.maximum((a + b).max(axis=0), (L + (a * inv_b).sum(axis=0)) / inv_b.sum(axis=0))
                peak = (g.mem_a_bytes + g.mem_b_bytes * np.maximum((level - a) * inv_b, 1.0)).max(axis=0)
            least_bound[g.idx] = np.where(np.isnan(level), np.inf, bound.from_numerator(level))
            least_peak[g.idx] = np.where(np.isnan(peak), np.inf, peak)
        return least_bound, least_peak


def even_tables(model: TransformerSpec, training: Training, pc: PoolCosts) -> EvenTables:
    """Cost every candidate in ``pc.S`` with the near-even split and at 0 layers per stage
    (stage memory is affine in the layer count, so its slope is (memory of the split − memory
    at 0 layers) / layers), and bound the step time over all splits."""
    S = pc.S
    L = model.num_layers
    cross_all = pp_cross_node(S, pc.group.gpus_per_node)
    groups = []
    for pp in np.unique(S.pp):
        idx = np.nonzero(S.pp == pp)[0]
        pcg = subset(pc, idx)
        Sg = pcg.S
        p = int(pp)
        cross = cross_all[idx]
        split = even_split(L, p)
        layer_rows = np.array([split, [0] * p], dtype=float)
        variants = _stages_for_splits(model, training, pcg, Sg, layer_rows, cross)
        stages = variants.stage_cost(0)
        a = variants.stacked(1, attrgetter("peak_memory_bytes"))
        r = variants.stacked(1, attrgetter("fragmentation_reserve_bytes"))
        # (pp above the layer count leaves stages of 0 layers: a NaN slope)
        with np.errstate(invalid="ignore", divide="ignore"):
            per_layer = 1.0 / np.array(split, dtype=float)[:, None]
            b = (stages.peak_memory_bytes - a) * per_layer
            r_b = (stages.fragmentation_reserve_bytes - r) * per_layer
        sum_t = stages.time_s.sum(axis=0)
        m = _m(Sg, training)
        v = _bubble_v(Sg, training)
        # Lower bound: pipeline ≥ (m − 1/v)·Σt/p + Σt/v (max ≥ mean; Σt is split-independent),
        # optimizer ≥ its value for the mean parameter share of a middle stage (the first
        # middle stage; with no middle stage, a stage without embedding or head).
        mid_optimizer_s = _stage(model, training, pcg, Sg, L / p, 1 if p > 2 else 0, False, False, cross).optimizer_s
        groups.append(_EvenGroup(
            idx=idx, mem_a_bytes=a, mem_b_bytes=b, res_a_bytes=r, res_b_bytes=r_b,
            even_peak_bytes=stages.peak_memory_bytes, even_reserve_bytes=stages.fragmentation_reserve_bytes,
            even_step_s=combine_stages(stages, Sg, m, training.pipeline_schedules(Sg.pp)).step_time_s,
            lower_bound_s=(m - 1.0 / v) * sum_t / p + sum_t / v + mid_optimizer_s,
        ))
    return EvenTables(L, len(S), tuple(groups))


def compute_lower_bound_s(model: TransformerSpec, training: Training, pc: PoolCosts) -> np.ndarray:
    """A lower bound of each candidate's step time over every stage split and nesting order,
    from its per-layer compute alone ([N], seconds): no ``stage_cost`` call, so a whole space is
    ranked by it before any of it is costed.

    A stage's micro-batch time is its compute plus its recompute, collectives, p2p and exposed
    DP and offload traffic (``StageCost.time_s``), so t_i ≥ c_i; over the stages the compute is
    every decoder layer's forward and backward, the embedding and the head at least —
    Σ_i c_i ≥ (L·(f + b) + e + h)·s, with s the stage-3 hooks' stretch
    (:func:`~cost_model.transformer.stage_cost.compute_stretch`; the multi-token-prediction
    modules and DeepSpeed's gradient accumulation only add to it).  The 1F1B pipeline takes
    (m − 1/v)·max_i t_i + Σ_i t_i / v ≥ (m − 1/v)·Σ_i c_i / p + Σ_i c_i / v (the max is at least
    the mean: :func:`even_tables`' bound), and the DP sync and the optimizer step add to it.
    Compute does not depend on where the groups sit in the network, so the bound holds for
    every nesting order of a layout; nor on recompute, so it also bounds the layout's
    block-recompute variants."""
    S = pc.S
    lc = pc.dc.layer
    compute_s = (model.num_layers * (lc.forward_compute_s + lc.backward_compute_s) + pc.dc.embedding_s + pc.dc.head_s) * compute_stretch(training, S)
    m = _m(S, training)
    v = _bubble_v(S, training)
    bound: np.ndarray = ((m - 1.0 / v) / S.pp + 1.0 / v) * compute_s
    return bound


@dataclass(frozen=True)
class StageLinear:
    """Affine per-stage coefficients for one candidate on one pool: value = a + b·n."""

    time_a: np.ndarray
    time_b: np.ndarray
    bwd_a: np.ndarray
    bwd_b: np.ndarray
    dp_a: np.ndarray
    dp_b: np.ndarray
    win_a: np.ndarray  # the part of the last backward the DP sync can hide behind
    win_b: np.ndarray
    opt_a: np.ndarray
    opt_b: np.ndarray
    mem_a: np.ndarray  # the memory bound's numerator (MemoryBound.numerator), bytes
    mem_b: np.ndarray
    p2p_cross_extra_s: np.ndarray  # added to stage time when the next stage is on another pool


def stage_linear(model: TransformerSpec, training: Training, pc: PoolCosts, cand: int, pp: int, cross_default: bool,
                 bound: MemoryBound = POINT) -> StageLinear:
    """Coefficients for candidate ``cand`` of ``pc.S`` at every stage index of a pp-stage
    pipeline (first stage carries the embedding, last the head).  Vectorised over the stage
    index: the candidate is repeated pp times and the stage index is an array.  Memory: the
    numerator of ``bound`` (the predicted peak by default), to compare with its capacity."""
    rep = np.full(pp, cand)
    pcr = subset(pc, rep)
    S = pcr.S
    idx = np.arange(pp, dtype=float)
    # Three variants in one pass, arrays [3, pp]: 0 layers, 1 layer (same links), 0 layers with
    # the next stage on another node.
    n = np.array([[0.0], [1.0], [0.0]])
    cross = np.array([[cross_default], [cross_default], [True]])

    def at(first: bool, last: bool) -> dict[str, np.ndarray]:
        st = _stage(model, training, pcr, S, n, idx, first, last, cross)
        shape = (3, pp)
        return {
            "time": np.broadcast_to(st.time_s, shape),
            "bwd": np.broadcast_to(st.backward_s, shape),
            "dp": np.broadcast_to(st.dp_comm_s, shape),
            "win": np.broadcast_to(st.dp_window_s, shape),
            "opt": np.broadcast_to(st.optimizer_s, shape),
            "mem": np.broadcast_to(bound.numerator(st.peak_memory_bytes, st.fragmentation_reserve_bytes), shape),
        }

    if pp == 1:
        v = at(True, True)
    else:
        v = {k: a.copy() for k, a in at(False, False).items()}
        first, last = at(True, False), at(False, True)
        for k in v:
            v[k][:, 0] = first[k][:, 0]
            v[k][:, -1] = last[k][:, -1]
    cols = {}
    for k in v:
        cols[k + "_a"] = v[k][0]
        cols[k + "_b"] = v[k][1] - v[k][0]
    cols["p2p_cross_extra_s"] = v["time"][2] - v["time"][0]
    return StageLinear(**cols)
