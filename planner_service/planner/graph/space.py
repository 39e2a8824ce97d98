"""The outer search space of an operator graph: layouts (meshes) and the candidates found on them.

A mesh is the GPU node group, the sharding-axis size ``t`` (powers of two), the pipeline depth
``pp``, ``dp = devices/(t·pp)``, the micro-batch size and ZeRO-1 (optimizer state sharded over
gradient replicas), within the request's pins and limits.  A mesh is dropped at once when the
model state alone cannot fit (:func:`memory_lower_bound_ok`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from cost_model.cluster import Cluster
from cost_model.devices import device_matches
from cost_model.errors import InvalidInput, InvalidStrategy, NoFeasiblePlan
from cost_model.frameworks import (
    layout_rule_violation,
    pinned_rule_violation,
    precision_aware_zero_violation,
    rules_for,
)
from cost_model.graph.evaluate import GraphEval, evaluate
from cost_model.graph.ir import GraphSpec
from cost_model.graph.mesh import CpuPool, GraphMesh, fixed_bytes, gpu_groups
from cost_model.graph.tables import CostTables
from cost_model.training import Training
from cost_model.transformer.layer_cost import model_state_bytes_per_param
from cost_model.units import bytes_to_gb
from planner_service.planner.request import Constraints, parse_constraints

Array = npt.NDArray[Any]

#: Pins an operator graph accepts (the rest must stay at their defaults).
GRAPH_PINS = ("dp", "tp", "pp", "micro_batch_size", "zero_stage")
#: The deepest pipeline the search tries.
MAX_GRAPH_PP = 32


@dataclass(frozen=True, kw_only=True)
class MeshCandidate:
    """Per-op choices and a stage split on one mesh, evaluated (``solver_status``: GREEDY for
    the screening answer, else the CP-SAT status that produced or last tried to improve it)."""

    mesh: GraphMesh
    tables: CostTables
    choice: Array
    stage_of_op: Array
    ev: GraphEval
    solver_status: str = "GREEDY"

    @property
    def key(self) -> tuple[str, int, int, int, int]:
        m = self.mesh
        return (m.group.name, m.t, m.pp, m.dp, m.micro_batch)


def evaluate_assignment(tables: CostTables, choice: Array, stage_of_op: Array) -> GraphEval:
    """:func:`cost_model.graph.evaluate.evaluate` of per-op choices and stages given as arrays."""
    return evaluate(tables, choice.tolist(), stage_of_op.tolist())


def as_constraints(constraints: Constraints | Mapping[str, Any] | None) -> Constraints:
    """Parsed constraints (a plain mapping is read as a request's ``constraints`` object)."""
    if constraints is None:
        return Constraints()
    if isinstance(constraints, Constraints):
        return constraints
    return parse_constraints(constraints)


def _pow2_upto(n: int) -> list[int]:
    out, v = [], 1
    while v <= n:
        out.append(v)
        v *= 2
    return out


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(math.isqrt(n)) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _checked_pins(cons: Constraints, framework: str, precision_aware: bool = False) -> dict[str, Any]:
    """The pins an operator graph honours; others must be left at their defaults.  A pin the
    framework cannot run is refused naming it (:func:`cost_model.frameworks.pinned_rule_violation`,
    as for transformer models); ZeRO defaults to stage 1 where the framework has it, else 0
    (FSDP: no stage 1; operator graphs cost stages 0 and 1)."""
    rule = pinned_rule_violation(framework, cons.pinned)
    if rule is not None:
        raise InvalidStrategy(rule[1], field=f"constraints.{rule[0]}")
    pins = dict(cons.pinned)
    for k in ("cp", "ep", "vpp"):
        if pins.get(k) not in (None, 1):
            raise InvalidInput(f"{k}={pins[k]} cannot be used with an operator graph (only dp, tp, pp, micro_batch_size, zero_stage)",
                               field=f"constraints.{k}")
    if pins.get("recompute") not in (None, "none"):
        raise InvalidInput("recompute is not modelled for operator graphs; use 'none'", field="constraints.recompute")
    if pins.get("dp_shard"):
        raise InvalidInput("operator graphs shard ZeRO over the whole data-parallel group (omit dp_shard)", field="constraints.dp_shard")
    zero = pins.get("zero_stage")
    pins["zero_stage"] = (1 if 1 in rules_for(framework).zero_stages else 0) if zero is None else zero
    if pins["zero_stage"] not in (0, 1):
        raise InvalidInput(f"zero_stage={pins['zero_stage']}: operator graphs support ZeRO stages 0 and 1",
                           field="constraints.zero_stage")
    why = precision_aware_zero_violation(precision_aware, pins["zero_stage"])  # the distributed optimizer only
    if why is not None:
        raise InvalidStrategy(why, field="constraints.zero_stage")
    return {k: pins.get(k) for k in GRAPH_PINS}


def _micro_batches(per_replica: int, pinned: int | None) -> list[int]:
    if pinned is not None:
        return [pinned] if per_replica % pinned == 0 else []
    return sorted(set([d for d in _pow2_upto(per_replica) if per_replica % d == 0] + [per_replica]))


def _group_meshes(grp: Any, gpus: int, training: Training, cons: Constraints, pins: dict[str, Any], limit_pp: int,
                  pool: CpuPool | None) -> tuple[list[GraphMesh], int]:
    """The meshes of one node group with ``gpus`` GPUs, and how many were pruned."""
    B = training.global_batch_size
    meshes: list[GraphMesh] = []
    pruned = 0
    for t in _pow2_upto(gpus):
        if cons.max_tp and t > cons.max_tp or pins["tp"] is not None and t != pins["tp"]:
            pruned += 1
            continue
        for pp in _divisors(gpus // t) if gpus % t == 0 else []:
            if pp > limit_pp or (cons.max_pp and pp > cons.max_pp) or (pins["pp"] is not None and pp != pins["pp"]):
                pruned += 1
                continue
            dp = gpus // (t * pp)
            if pins["dp"] is not None:
                if pins["dp"] > dp:
                    pruned += 1
                    continue
                dp = pins["dp"]
            if B % dp:
                pruned += 1
                continue
            per = B // dp
            # one rank shards nothing: stage 0 — but the precision-aware optimizer keeps the distributed one
            zero = pins["zero_stage"] if dp * t > 1 or training.precision_aware_optimizer else 0
            if layout_rule_violation(training.framework, tp=t, pp=pp, vpp=1, cp=1, ep=1, dp=dp, zero_stage=zero,
                                     sequence_parallel=False) is not None:
                pruned += 1  # a layout the framework cannot run (e.g. tp > 1 under DeepSpeed alone)
                continue
            for mbs in _micro_batches(per, pins["micro_batch_size"]):
                mc = per // mbs
                if pp > 1 and mc < pp:
                    pruned += 1
                    continue
                meshes.append(GraphMesh(grp, t, dp, pp, mbs, mc, zero, pool))
    return meshes, pruned


def enumerate_meshes(graph: GraphSpec, training: Training, cluster: Cluster,
                     constraints: Constraints | Mapping[str, Any] | None = None,
                     n_groups: int | None = None) -> tuple[list[GraphMesh], int, list[str]]:
    """Outer candidates (node group, t, pp, dp, micro-batch, ZeRO) after divisibility, pins and
    limits; returns (meshes, number pruned, notes)."""
    cons = as_constraints(constraints)
    pins = _checked_pins(cons, training.framework, training.precision_aware_optimizer)
    notes: list[str] = []
    pool = CpuPool.from_cluster(cluster)
    groups = gpu_groups(cluster)
    if cons.allowed_device_types:
        groups = [g for g in groups if device_matches(g.device.name, cons.allowed_device_types)]
    if not groups:
        raise NoFeasiblePlan("no GPU node group is available (CPU-only clusters cannot train an operator graph here)",
                             field="cluster.node_groups")
    limit_pp = min(graph.num_ops, n_groups or graph.num_ops, MAX_GRAPH_PP)
    meshes: list[GraphMesh] = []
    pruned = 0
    seen_dev: set[tuple[str, int]] = set()
    for grp in groups:
        gpus = cluster.available_gpus(grp.name)
        if cons.max_devices:
            gpus = min(gpus, cons.max_devices)
        dev_key = (grp.device.name, gpus)
        if dev_key in seen_dev:  # identical groups: plan on one of them
            continue
        seen_dev.add(dev_key)
        if training.dtype not in grp.device.supported_dtypes():
            notes.append(f"{grp.name}: {grp.device.name} has no {training.dtype} peak")
            continue
        found, dropped = _group_meshes(grp, gpus, training, cons, pins, limit_pp, pool)
        meshes += found
        pruned += dropped
    if pins["tp"] is not None and not meshes:
        notes.append(f"pinned tp={pins['tp']} leaves no layout")
    return meshes, pruned, notes


def state_bytes_lower_bound(training: Training, mesh: GraphMesh) -> float:
    """Fewest model-state bytes one parameter can cost per GPU of a stage (bytes): either
    sharded over the t ranks (weights, gradients and optimizer state /t, ZeRO-1 over the dp
    replicas) or replicated along t (ZeRO-1 over all dp·t replicas)."""

    def total(shard: int) -> float:
        w, g, o = model_state_bytes_per_param(training, mesh.zero_stage, shard, mesh.pp)
        return float(np.asarray(w)) + float(np.asarray(g)) + float(np.asarray(o))

    return min(total(mesh.dp) / mesh.t, total(mesh.dp * mesh.t))


def table_params(graph: GraphSpec) -> float:
    """Parameters of embedding tables (which may move to CPU parameter servers)."""
    return float(sum(op.param_count for op in graph.ops if op.category == "embedding" or (op.category == "gather" and op.params)))


def memory_lower_bound_ok(training: Training, mesh: GraphMesh, headroom: float, params_total: float,
                          movable_params: float) -> bool:
    """Model state per GPU cannot shrink below :func:`state_bytes_lower_bound` × parameters /
    pp (tables may leave for CPU parameter servers)."""
    movable = movable_params if mesh.cpu is not None else 0.0
    need = (params_total - movable) * state_bytes_lower_bound(training, mesh) / mesh.pp + fixed_bytes(training, mesh)
    return need <= mesh.device.memory_bytes * (1.0 - headroom)


def infeasible_message(graph: GraphSpec, training: Training, cluster: Cluster, meshes: list[GraphMesh], headroom: float,
                       screened: bool = False) -> str:
    """What is short when no mesh fits (``screened``: after trying layouts, not by the bound)."""
    groups = gpu_groups(cluster)
    if not meshes:
        return "no parallel layout satisfies the constraints (pins, max_tp, max_pp, divisibility of the global batch)"
    params = float(graph.total_params())
    best = min(meshes, key=lambda m: state_bytes_lower_bound(training, m) / m.pp)
    best_split = best.t * best.pp
    need = bytes_to_gb(params * state_bytes_lower_bound(training, best) / best.pp + fixed_bytes(training, best))
    cap = max(gr.device.memory_GB for gr in groups) * (1 - headroom)
    cpu = CpuPool.from_cluster(cluster)
    extra = ""
    if cpu is not None:
        extra = f"; the CPU nodes hold {bytes_to_gb(cpu.memory_bytes):.0f} GB for embedding tables"
    if screened:
        return (f"no layout fits: model state alone needs about {need:.1f} GB per GPU at the largest model-parallel size "
                f"({best_split}), activations come on top; devices allow {cap:.1f} GB after the {headroom:.0%} headroom{extra}")
    return (f"no strategy fits: needs at least {need:.1f} GB per GPU for weights, gradients and optimizer state at the "
            f"largest model-parallel size allowed ({best_split}); devices have {cap:.1f} GB after the {headroom:.0%} headroom{extra}")
