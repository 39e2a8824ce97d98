"""Placement of every rank on a host and GPU.

Each stage runs on one pool (node group) and takes the next ``dp·cp·tp`` GPUs of that pool's
available nodes, in order.  Inside a stage's block the rank order is Megatron's (tensor
fastest, then context, then data), so a TP group is ``tp`` consecutive GPUs of one node (the
search only allows tp dividing the GPUs per node), DP groups of a stage all sit on one device
type, consecutive stages of a pool are on neighbouring nodes, and unavailable nodes are never
used (the pools hold available nodes only).

Global rank: :func:`cost_model.strategy.rank_of`.

On a cluster with a ``topology`` a single-pool plan is placed by its nesting order
(``Strategy.nesting``, Megatron's when None): rank r is the r-th GPU of the pool's available
nodes in topology order (by each node's ``domains``, else by position in the cluster's node list,
unavailable nodes counted, so a lost node leaves a hole in its leaf and pod rather than shifting
every later node), and its coordinates are the mixed-radix digits of r in the nesting order.
Domains are *packed*: where a level's domain holds a number of nodes that is not a multiple of
the unit the cost model keeps inside it (the dimensions nested within that level's domain
size), the remainder nodes become spares used last, so uneven pods and holes from unavailable
nodes do not make a group straddle a boundary the cost model priced as inside; if the spares
are needed, the plan warns.  The rank table is built with numpy (98,304 ranks in well under a
second).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from cost_model.cluster import Cluster, NodeGroup
from cost_model.result import Estimate
from cost_model.strategy import Strategy, rank_coords, rank_of
from cost_model.topology import MEGATRON_NESTING


def _gpu_lists(cluster: Cluster) -> dict[str, list[tuple[str, int]]]:
    out: dict[str, list[tuple[str, int]]] = {}
    for g in cluster.node_groups:
        out[g.name] = [(n.hostname, k) for n in cluster.available_nodes(g.name) for k in range(g.gpus_per_node)]
    return out


def _nested(cluster: Cluster, strategy: Strategy, stage_groups: tuple[str, ...]) -> bool:
    """Placed by nesting order: a topology (or a nesting) and one pool."""
    return (cluster.topology is not None or strategy.nesting is not None) and len(set(stage_groups)) == 1


def _units_nodes(strategy: Strategy, gpus_per_node: int, domain_nodes: int) -> int:
    """Nodes of the largest block of inner dimensions (in nesting order) that fits one domain
    of ``domain_nodes`` nodes and fills whole nodes (1 when none does)."""
    size = {"tp": strategy.tp, "cp": strategy.cp, "dp": strategy.dp, "pp": strategy.pp}
    block = 1
    best = 1
    for d in strategy.nesting or MEGATRON_NESTING:
        block *= size[d]
        if block > domain_nodes * gpus_per_node:
            break
        if block % gpus_per_node == 0:
            best = block // gpus_per_node
    return best


def _natural(name: str) -> tuple[Any, ...]:
    """Sort key: digit runs compare as numbers."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


def _topology_order(cluster: Cluster, group: NodeGroup) -> tuple[list[str], list[tuple[Any, ...]]]:
    """The pool's available hosts sorted by domain path (outer level first, domains in natural
    order of their names: "pod-2" before "pod-10", so a replan's reordered host names do not
    reorder the domains; nodes in cluster order inside), with each host's path.  It does not
    depend on the strategy: memoised on the (frozen) cluster, as :func:`_nested_table` is
    (every candidate a plan places on 12,288 nodes would sort them again)."""
    cache: dict[str, tuple[list[str], list[tuple[Any, ...]]]] = cluster.__dict__.setdefault("_topology_order", {})
    if group.name in cache:
        return cache[group.name]
    topo = cluster.topology
    assert topo is not None
    position = {n.hostname: k for k, n in enumerate(cluster.nodes)}
    levels = tuple(reversed(topo.levels))

    def path(n: Any) -> tuple[Any, ...]:
        if n.domains:
            return tuple(reversed(n.domains))
        k = position[n.hostname]
        return tuple(k // lv.group_size_nodes for lv in levels)

    natural: dict[str, tuple[Any, ...]] = {}  # a few dozen distinct domain names

    def key(d: Any) -> tuple[Any, ...]:
        text = str(d)
        if text not in natural:
            natural[text] = _natural(text)
        return natural[text]

    keyed = [(tuple(key(d) for d in p), position[n.hostname], n.hostname, p)
             for n in cluster.available_nodes(group.name) for p in (path(n),)]
    keyed.sort(key=lambda t: (t[0], t[1]))
    cache[group.name] = ([t[2] for t in keyed], [t[3] for t in keyed])
    return cache[group.name]


def ordered_nodes(cluster: Cluster, group: NodeGroup, strategy: Strategy) -> tuple[list[str], int]:
    """The pool's available hosts in topology order, packed (module docstring), and how many
    of them lie past the aligned part (nodes of partly filled domains, used last)."""
    topo = cluster.topology
    if topo is None:
        return [n.hostname for n in cluster.available_nodes(group.name)], 0
    names, paths = _topology_order(cluster, group)
    job_nodes = -(-strategy.num_devices // group.gpus_per_node)
    units = tuple(_units_nodes(strategy, group.gpus_per_node, lv.group_size_nodes) for lv in topo.levels)
    # it depends on the strategy only through the job's node count and the units: memoised on
    # the (frozen) cluster (a replan's candidates differ in dp and often share both)
    memo: dict[tuple[Any, ...], tuple[list[str], int]] = cluster.__dict__.setdefault("_ordered_nodes", {})
    key = (group.name, tuple(job_nodes > lv.group_size_nodes for lv in topo.levels), units)
    if key not in memo:
        memo[key] = _packed_order(topo, names, paths, job_nodes, units)
    hosts, n_tail = memo[key]
    return list(hosts), n_tail


def _packed_order(topo: Any, names: list[str], paths: list[tuple[Any, ...]], job_nodes: int, units: tuple[int, ...]) -> tuple[list[str], int]:
    """:func:`ordered_nodes` for a job of ``job_nodes`` nodes keeping ``units[j]`` nodes inside
    each level-j domain."""
    aligned: list[int] = list(range(len(names)))
    tail: list[int] = []
    for j, lv in enumerate(topo.levels):
        unit = units[j]
        spans = job_nodes > lv.group_size_nodes  # blocks larger than a domain need full domains
        depth = len(topo.levels) - j  # path prefix naming the level-j domain
        domains: list[list[int] | None] = []  # each domain's kept nodes; None: left out whole
        partial: list[int] = []
        run: list[int] = []
        for n in [*aligned, None]:
            if run and (n is None or paths[n][:depth] != paths[run[0]][:depth]):
                if spans and len(run) < lv.group_size_nodes:
                    partial.extend(run)
                    domains.append(None)
                else:
                    cut = len(run) - len(run) % unit
                    domains.append(run[:cut])
                    partial.extend(run[cut:])
                run = []
            if n is not None:
                run.append(n)
        if j == len(topo.levels) - 1:
            _fill_holes(domains)
        aligned = [n for d in domains if d is not None for n in d]
        tail = partial + tail
    return [names[n] for n in aligned + tail], len(tail)


def _fill_holes(domains: list[list[int] | None]) -> None:
    """Outermost domains left out whole (a pod that lost a node, when the job needs whole
    pods): the last kept domain takes the place of each, as :func:`service.replan.sticky_host_order`
    does for hosts, so the domains after a hole keep their place in the order — a replan after
    losing one node moves the ranks of one pod, not those of every later pod."""
    while None in domains:
        hole = domains.index(None)
        while domains and domains[-1] is None:
            domains.pop()
        if hole < len(domains):
            domains[hole] = domains.pop()


_Table = tuple[list[str], np.ndarray, dict[str, np.ndarray], int]


def _nested_table(cluster: Cluster, strategy: Strategy, name: str) -> _Table:
    """:func:`_build_nested_table`, memoised on the (frozen) cluster: a plan's ranks, stages and
    warnings read the same table; callers do not mutate it."""
    tables: dict[tuple[Strategy, str], _Table] = cluster.__dict__.setdefault("_nested_tables", {})
    key = (strategy, name)
    if key not in tables:
        if len(tables) >= 8:
            tables.pop(next(iter(tables)))
        tables[key] = _build_nested_table(cluster, strategy, name)
    return tables[key]


def _build_nested_table(cluster: Cluster, strategy: Strategy, name: str) -> _Table:
    """(hosts in order, host index of each rank, coordinates of each rank, spares used)."""
    group = cluster.group(name)
    hosts, n_spares = ordered_nodes(cluster, group, strategy)
    n = strategy.num_devices
    rank = np.arange(n)
    coord: dict[str, np.ndarray] = {}
    rest = rank
    size = {"tp": strategy.tp, "cp": strategy.cp, "dp": strategy.dp, "pp": strategy.pp}
    for d in strategy.nesting or MEGATRON_NESTING:
        coord[d] = rest % size[d]
        rest = rest // size[d]
    host_index = rank // group.gpus_per_node
    used_nodes = -(-n // group.gpus_per_node)
    spares_used = max(0, used_nodes - (len(hosts) - n_spares))
    return hosts, host_index, coord, spares_used


def stage_blocks(cluster: Cluster, strategy: Strategy, stage_groups: tuple[str, ...]) -> list[list[tuple[str, int]]]:
    """The (host, gpu) list of each stage's block, in block order."""
    if _nested(cluster, strategy, stage_groups):
        hosts, host_index, coord, _ = _nested_table(cluster, strategy, stage_groups[0])
        gpn = cluster.group(stage_groups[0]).gpus_per_node
        out_n: list[list[tuple[str, int]]] = []
        for i in range(strategy.pp):
            idx = np.nonzero(coord["pp"] == i)[0]
            out_n.append([(hosts[int(h)], int(k % gpn)) for h, k in zip(host_index[idx], idx, strict=True)])
        return out_n
    lists = _gpu_lists(cluster)
    offset = {name: 0 for name in lists}
    block = strategy.dp * strategy.cp * strategy.tp
    out = []
    for name in stage_groups:
        start = offset[name]
        out.append(lists[name][start : start + block])
        offset[name] = start + block
    return out


def placement_warnings(cluster: Cluster, strategy: Strategy, stage_groups: tuple[str, ...]) -> list[str]:
    """Warnings: packing the topology's domains left too few nodes (partly filled domains used);
    ranks numbered in a nesting order other than Megatron's default."""
    out = []
    if strategy.nesting is not None:
        order = "-".join(strategy.nesting)
        out.append(f"ranks are numbered in the nesting order {order} (inner to outer): launch with that order "
                   f"(Megatron-Core initialize_model_parallel(order=\"{order}\"), torchtitan mesh dims outer to inner); "
                   "framework defaults are tp-cp-dp-pp")
    if not _nested(cluster, strategy, stage_groups) or cluster.topology is None:
        return out
    _, _, _, spares = _nested_table(cluster, strategy, stage_groups[0])
    if spares:
        out.append(f"{spares} node(s) of partly filled topology domains are used: some groups cross a boundary the estimate prices as inside")
    return out


def _place_nested(cluster: Cluster, strategy: Strategy, name: str) -> list[dict[str, Any]]:
    hosts, host_index, coord, _ = _nested_table(cluster, strategy, name)
    group = cluster.group(name)
    gpn = group.gpus_per_node
    device = group.device.name
    cols = [coord["tp"].tolist(), coord["cp"].tolist(), coord["dp"].tolist(), coord["pp"].tolist()]
    host_of = [hosts[h] for h in host_index.tolist()]
    return [
        {"rank": r, "host": host_of[r], "gpu": r % gpn, "node_group": name, "device": device, "stage": pp_i, "dp": dp_i, "pp": pp_i, "tp": tp_i, "cp": cp_i}
        for r, (tp_i, cp_i, dp_i, pp_i) in enumerate(zip(*cols, strict=True))
    ]


#: The keys of a rank entry, in order.
RANK_KEYS = ("rank", "host", "gpu", "node_group", "device", "stage", "dp", "pp", "tp", "cp")


def rank_columns(cluster: Cluster, strategy: Strategy, stage_groups: tuple[str, ...]) -> dict[str, Any] | None:
    """The rows of :func:`place_ranks` as columns, without building them: for each of
    :data:`RANK_KEYS` an integer array, or for a string key (distinct values, index of each
    rank's value).  Placed by nesting order only (the large plans); None otherwise."""
    if not _nested(cluster, strategy, stage_groups):
        return None
    name = stage_groups[0]
    hosts, host_index, coord, _ = _nested_table(cluster, strategy, name)
    group = cluster.group(name)
    rank = np.arange(strategy.num_devices, dtype=np.int64)
    one = np.zeros(strategy.num_devices, dtype=np.int64)
    return {"rank": rank, "host": (tuple(hosts), host_index), "gpu": rank % group.gpus_per_node, "node_group": ((name,), one),
            "device": ((group.device.name,), one), "stage": coord["pp"], "dp": coord["dp"], "pp": coord["pp"], "tp": coord["tp"],
            "cp": coord["cp"]}


def place_ranks(cluster: Cluster, strategy: Strategy, stage_groups: tuple[str, ...]) -> list[dict[str, Any]]:
    if _nested(cluster, strategy, stage_groups):
        return _place_nested(cluster, strategy, stage_groups[0])
    tp, cp, dp = strategy.tp, strategy.cp, strategy.dp
    devices = {g.name: g.device.name for g in cluster.node_groups}
    ranks: list[dict[str, Any]] = []
    for i, (name, blk) in enumerate(zip(stage_groups, stage_blocks(cluster, strategy, stage_groups), strict=True)):
        for k, (host, gpu) in enumerate(blk):
            _, dp_i, cp_i, tp_i = rank_coords(k, dp=dp, cp=cp, tp=tp)
            rank = rank_of(i, dp_i, cp_i, tp_i, dp=dp, cp=cp, tp=tp)
            ranks.append(
                {
                    "rank": rank,
                    "host": host,
                    "gpu": gpu,
                    "node_group": name,
                    "device": devices[name],
                    "stage": i,
                    "dp": dp_i,
                    "pp": i,
                    "tp": tp_i,
                    "cp": cp_i,
                }
            )
    ranks.sort(key=lambda r: r["rank"])
    return ranks


def _nested_stage_hosts(cluster: Cluster, strategy: Strategy, name: str) -> list[tuple[list[str], list[list[Any]] | None, int]]:
    """Per stage of a plan placed by nesting order: its hosts in the order its ranks reach them,
    its [host, gpu] pairs when at most 64, and its GPU count — what :func:`stage_entries` reads
    of :func:`stage_blocks`, from the table's arrays (the blocks are 98,304 tuples per candidate
    on the largest clusters)."""
    hosts, host_index, coord, _ = _nested_table(cluster, strategy, name)
    gpn = cluster.group(name).gpus_per_node
    pp = coord["pp"]
    # (stage, host) pairs in the order the ranks first reach them: one sort for all stages
    key = pp * max(len(hosts), 1) + host_index
    uniq, first = np.unique(key, return_index=True)
    uniq = uniq[np.argsort(first, kind="stable")]
    stage_of, host_of = np.divmod(uniq, max(len(hosts), 1))
    counts = np.bincount(pp, minlength=strategy.pp)
    out: list[tuple[list[str], list[list[Any]] | None, int]] = []
    for i in range(strategy.pp):
        gpus = None
        if counts[i] <= 64:
            idx = np.nonzero(pp == i)[0]
            gpus = [[hosts[int(a)], int(k % gpn)] for a, k in zip(host_index[idx], idx, strict=True)]
        out.append(([hosts[int(a)] for a in host_of[stage_of == i]], gpus, int(counts[i])))
    return out


def stage_entries(cluster: Cluster, strategy: Strategy, stage_groups: tuple[str, ...], est: Estimate) -> list[dict[str, Any]]:
    """Contract ``stages``: layer range, device type, hosts and GPUs, time and memory."""
    out = []
    if _nested(cluster, strategy, stage_groups):
        for st, (hosts, gpus, n) in zip(est.stages, _nested_stage_hosts(cluster, strategy, stage_groups[0]), strict=True):
            d = st.to_dict()
            d["hosts"] = hosts
            d["gpus"] = gpus
            d["num_gpus"] = n
            out.append(d)
        return out
    for st, blk in zip(est.stages, stage_blocks(cluster, strategy, stage_groups), strict=True):
        d = st.to_dict()
        d["hosts"] = list(dict.fromkeys(h for h, _ in blk))
        d["gpus"] = [[h, g] for h, g in blk] if len(blk) <= 64 else None
        d["num_gpus"] = len(blk)
        out.append(d)
    return out
