"""Preflight warnings for a plan: things that make a launch hang or crawl although the cost
model is happy.

* Mixed driver / CUDA / NCCL versions inside one communication group (TP, CP, DP, PP groups in
  Megatron order).  Mismatched NCCL or driver versions between the ranks of a collective are a
  classic cause of hangs at the first all-reduce.
* Mixed device types inside one tensor-parallel group: every TP collective then runs at the
  slower device's pace, every layer.

Nodes without a version in the cluster description are not compared.  Each warning names the
nodes and their values.

Two entries over one check:

* :func:`candidate_warnings` — the plan service, over the candidate it has just built (the
  cluster object and the candidate's ``strategy`` and ``ranks``): no plan dict is assembled
  and nothing is placed again.
* :func:`preflight_warnings` — the launch route and ``planner launch``, over a plan JSON
  (stored or from a file), validated through :func:`plan_view`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cost_model.cluster import Cluster
from cost_model.strategy import rank_of
from planner_service.exporters.plan_view import plan_view
from planner_service.storage.rank_table import RankTable

VERSION_FIELDS = (("driver_version", "driver"), ("cuda_version", "CUDA"), ("nccl_version", "NCCL"))
MAX_NAMED = 8


@dataclass(frozen=True, kw_only=True)
class _Mesh:
    """The parallel sizes the communication groups follow from."""

    dp: int
    tp: int
    pp: int
    cp: int


@dataclass(frozen=True, kw_only=True)
class _Slot:
    """What the check reads of one rank."""

    host: str | None
    device: str | None


def _groups(mesh: _Mesh) -> dict[str, list[list[int]]]:
    """Rank lists of every TP, CP, DP and PP group (Megatron order)."""
    dp, tp, pp, cp = mesh.dp, mesh.tp, mesh.pp, mesh.cp

    def rank(pp_i: int, dp_i: int, cp_i: int, tp_i: int) -> int:
        return rank_of(pp_i, dp_i, cp_i, tp_i, dp=dp, cp=cp, tp=tp)

    out: dict[str, list[list[int]]] = {"tensor-parallel": [], "context-parallel": [], "data-parallel": [], "pipeline": []}
    for p in range(pp):
        for d in range(dp):
            for c in range(cp):
                out["tensor-parallel"].append([rank(p, d, c, t) for t in range(tp)])
    for p in range(pp):
        for d in range(dp):
            for t in range(tp):
                out["context-parallel"].append([rank(p, d, c, t) for c in range(cp)])
    for p in range(pp):
        for c in range(cp):
            for t in range(tp):
                out["data-parallel"].append([rank(p, d, c, t) for d in range(dp)])
    for d in range(dp):
        for c in range(cp):
            for t in range(tp):
                out["pipeline"].append([rank(p, d, c, t) for p in range(pp)])
    return {k: [g for g in v if len(g) > 1] for k, v in out.items()}


def _name_nodes(values: Mapping[str, str]) -> str:
    by_value: dict[str, list[str]] = {}
    for host, value in values.items():
        by_value.setdefault(value, []).append(host)
    parts = []
    for value, hosts in sorted(by_value.items()):
        shown = ", ".join(hosts[:MAX_NAMED]) + (f" and {len(hosts) - MAX_NAMED} more" if len(hosts) > MAX_NAMED else "")
        parts.append(f"{value} on {shown}")
    return "; ".join(parts)


def _one_value_each(nodes: Sequence[Mapping[str, Any]]) -> bool:
    """At most one value of each version field over ``nodes``."""
    return all(len({str(n[key]) for n in nodes if n.get(key)}) < 2 for key, _ in VERSION_FIELDS)


def _nothing_can_mix(plan: Mapping[str, Any]) -> bool:
    """True when no group can mix anything: one device type over the node groups and the ranks,
    and at most one value of each version field over the nodes.  Reads the plan dict as it is
    (no placement view), so a plan on a uniform cluster costs one pass over its ranks."""
    cluster = plan.get("cluster")
    best = plan.get("best")
    if not isinstance(cluster, Mapping) or not isinstance(best, Mapping):
        return False
    devices: set[str | None] = set()
    for g in cluster.get("node_groups") or []:
        device = g.get("device") if isinstance(g, Mapping) else None
        devices.add(device.get("name") if isinstance(device, Mapping) else device if isinstance(device, str) else None)
    for r in best.get("ranks") or []:
        device = r.get("device") if isinstance(r, Mapping) else None
        if device is not None:
            devices.add(device if isinstance(device, str) else None)
    if len(devices) != 1 or None in devices:
        return False
    return _one_value_each([n for n in cluster.get("nodes") or [] if isinstance(n, Mapping)])


def _check(mesh: _Mesh, ranks: Sequence[_Slot], node_info: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The warnings for ranks ``ranks`` (indexed by rank) on nodes ``node_info`` (hostname →
    the node's version fields)."""
    groups = _groups(mesh)
    warnings: list[str] = []
    for key, label in VERSION_FIELDS:
        version_of = {h: str(n[key]) for h, n in node_info.items() if n.get(key)}
        if len(set(version_of.values())) < 2:  # one version everywhere (or none known): nothing mixes
            continue
        for kind, rank_groups in groups.items():
            mixed_hosts: dict[str, str] = {}
            count = 0
            for g in rank_groups:
                hosts = {h for r in g if (h := ranks[r].host) is not None}
                values = {version_of[h] for h in hosts if h in version_of}
                if len(values) > 1:
                    count += 1
                    for h in hosts:
                        if h in version_of:
                            mixed_hosts[h] = version_of[h]
            if count:
                warnings.append(
                    f"{count} {kind} group(s) mix {label} versions ({_name_nodes(mixed_hosts)}); "
                    f"mismatched {label} versions inside a collective are a classic cause of hangs — "
                    "align them or constrain the plan to one version"
                )
    tp_mixed: dict[str, str] = {}
    tp_count = 0
    for g in groups["tensor-parallel"]:
        devices = {ranks[r].device for r in g}
        if len(devices) > 1:
            tp_count += 1
            for r in g:
                slot = ranks[r]
                if slot.host is not None:
                    tp_mixed[slot.host] = str(slot.device)
    if tp_count:
        warnings.append(
            f"{tp_count} tensor-parallel group(s) mix device types ({_name_nodes(tp_mixed)}); "
            "each TP collective runs at the slowest device's pace"
        )
    return warnings


def preflight_warnings(plan: Mapping[str, Any]) -> list[str]:
    """Warnings for ``plan`` (the plan dict with ``cluster`` and ``best.ranks``; errors name the
    plan field that is malformed)."""
    if _nothing_can_mix(plan):
        return []
    view = plan_view(plan)
    ranks = [_Slot(host=r.host, device=r.device) for r in view.placement.ranks]
    return _check(_Mesh(dp=view.dp, tp=view.tp, pp=view.pp, cp=view.cp), ranks, view.node_info)


def candidate_warnings(cluster: Cluster, candidate: Mapping[str, Any]) -> list[str]:
    """Warnings for a candidate the planner built on ``cluster``: ``candidate`` has the plan
    contract's ``strategy`` (dp, tp, pp, cp) and ``ranks`` (rank, host, device), as the
    service stores it.  A candidate without ranks has nothing to check.  The same warnings as
    :func:`preflight_warnings` over the stored plan."""
    entries = candidate.get("ranks") or []
    if not entries:
        return []
    strategy = candidate.get("strategy") or {}
    # a rank table held as columns (storage.rank_table): its devices without building its rows
    devices = set(entries.distinct("device")) if isinstance(entries, RankTable) and "device" in entries.keys else {r.get("device") for r in entries}
    one_version_each = all(len({str(v) for n in cluster.nodes if (v := getattr(n, key))}) < 2 for key, _ in VERSION_FIELDS)
    if len(devices) == 1 and one_version_each:  # nothing can mix: no per-node table to build
        return []
    nodes = {n.hostname: {key: getattr(n, key) for key, _ in VERSION_FIELDS} for n in cluster.nodes}
    mesh = _Mesh(**{axis: int(strategy.get(axis) or 1) for axis in ("dp", "tp", "pp", "cp")})
    if mesh.dp * mesh.tp * mesh.pp * mesh.cp != len(entries):
        return []  # not a Megatron-ordered mesh of these ranks: no groups to check
    ranks: list[_Slot] = [_Slot(host=None, device=None)] * len(entries)
    for r in entries:
        ranks[r["rank"]] = _Slot(host=r.get("host"), device=r.get("device"))
    return _check(mesh, ranks, nodes)


__all__ = ["candidate_warnings", "preflight_warnings"]
