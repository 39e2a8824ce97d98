"""Placement of every rank on a host and GPU.

Each stage runs on one pool (node group) and takes the next ``dp·cp·tp`` GPUs of that pool's
available nodes, in order.  Inside a stage's block the rank order is Megatron's (tensor
fastest, then context, then data), so a TP group is ``tp`` consecutive GPUs of one node (the
search only allows tp dividing the GPUs per node), DP groups of a stage all sit on one device
type, consecutive stages of a pool are on neighbouring nodes, and unavailable nodes are never
used (the pools hold available nodes only).

Global rank: :func:`cost_model.strategy.rank_of`.
"""

from __future__ import annotations

from typing import Any

from cost_model.cluster import Cluster
from cost_model.result import Estimate
from cost_model.strategy import Strategy, rank_coords, rank_of


def _gpu_lists(cluster: Cluster) -> dict[str, list[tuple[str, int]]]:
    out: dict[str, list[tuple[str, int]]] = {}
    for g in cluster.node_groups:
        out[g.name] = [(n.hostname, k) for n in cluster.available_nodes(g.name) for k in range(g.gpus_per_node)]
    return out


def stage_blocks(cluster: Cluster, strategy: Strategy, stage_groups: tuple[str, ...]) -> list[list[tuple[str, int]]]:
    """The (host, gpu) list of each stage's block, in block order."""
    lists = _gpu_lists(cluster)
    offset = {name: 0 for name in lists}
    block = strategy.dp * strategy.cp * strategy.tp
    out = []
    for name in stage_groups:
        start = offset[name]
        out.append(lists[name][start : start + block])
        offset[name] = start + block
    return out


def place_ranks(cluster: Cluster, strategy: Strategy, stage_groups: tuple[str, ...]) -> list[dict[str, Any]]:
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


def stage_entries(cluster: Cluster, strategy: Strategy, stage_groups: tuple[str, ...], est: Estimate) -> list[dict[str, Any]]:
    """Contract ``stages``: layer range, device type, hosts and GPUs, time and memory."""
    out = []
    for st, blk in zip(est.stages, stage_blocks(cluster, strategy, stage_groups), strict=True):
        d = st.to_dict()
        d["hosts"] = list(dict.fromkeys(h for h, _ in blk))
        d["gpus"] = [[h, g] for h, g in blk] if len(blk) <= 64 else None
        d["num_gpus"] = len(blk)
        out.append(d)
    return out
