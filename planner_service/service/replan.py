"""Replanning after a cluster change: cluster edits, the sticky host order that keeps ranks where
they were, the choice among near-best candidates of the one that moves the fewest ranks, and the
diff against the parent plan.  Pure functions over plan JSON; :class:`PlanService` calls them."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from cost_model.errors import InvalidInput
from planner_service.storage.rank_table import RankTable
from planner_service.storage.repository import StoredPlan

#: A replan keeps the candidate that moves the fewest ranks among those within this fraction of
#: the best candidate's throughput.
REPLAN_TOLERANCE = 0.02


#: A replan asks the planner for at least this many alternatives to choose among.
REPLAN_MIN_TOP_K = 8


def _rank_places(ranks: Any) -> dict[int, tuple[Any, Any]]:
    """rank → (host, gpu) from a plan's ``ranks`` list (a dict per GPU: 98,304 of them on the
    largest clusters, so the usual keys are looked up first, the aliases only when missing)."""
    out: dict[int, tuple[Any, Any]] = {}
    if isinstance(ranks, RankTable):
        places = ranks.places()
        if places is not None:
            rank, hosts, host_index, gpu = places
            return dict(zip(rank.tolist(), zip([hosts[h] for h in host_index.tolist()], gpu.tolist(), strict=True), strict=True))
        ranks = ranks.rows()
    if not isinstance(ranks, list):
        return out
    for i, r in enumerate(ranks):
        if not isinstance(r, Mapping):
            continue
        rank = r.get("rank", i)
        host = r["host"] if "host" in r else r.get("hostname")
        gpu = r["gpu"] if "gpu" in r else r["local_rank"] if "local_rank" in r else r.get("device_index")
        out[int(rank)] = (host, gpu)
    return out


def ranks_moved(old_ranks: Any, new_ranks: Any) -> int:
    """Ranks whose (host, gpu) changed; a rank present in only one plan counts as moved."""
    fast = _moved_tables(old_ranks, new_ranks)
    return fast if fast is not None else _moved(_rank_places(old_ranks), _rank_places(new_ranks))


def _moved(old: Mapping[int, tuple[Any, Any]], new: Mapping[int, tuple[Any, Any]]) -> int:
    return sum(1 for r in old.keys() | new.keys() if old.get(r) != new.get(r))


def _moved_tables(old: Any, new: Any) -> int | None:
    """:func:`ranks_moved` of two rank tables held as columns, over their arrays (None when
    either is not one, or a rank appears twice)."""
    if not isinstance(old, RankTable) or not isinstance(new, RankTable):
        return None
    a, b = old.places(), new.places()
    if a is None or b is None:
        return None
    ra, hosts_a, ha, ga = a
    rb, hosts_b, hb, gb = b
    ids = {h: j for j, h in enumerate(hosts_a)}
    # b's hosts in a's numbering; a host a does not have gets an id no host of a has
    remap = np.array([ids.get(h, -1 - j) for j, h in enumerate(hosts_b)], dtype=np.int64)
    hb_in_a = remap[hb] if hb.size else hb
    if _is_range(ra) and _is_range(rb):  # ranks 0..n-1 in order, as placement writes them
        m = min(ra.size, rb.size)
        ia = ib = np.arange(m)
        common_size = m
    else:
        if np.unique(ra).size != ra.size or np.unique(rb).size != rb.size:
            return None
        common, ia, ib = np.intersect1d(ra, rb, assume_unique=True, return_indices=True)
        common_size = common.size
    changed = int(np.count_nonzero((ha[ia] != hb_in_a[ib]) | (ga[ia] != gb[ib])))
    return changed + ra.size + rb.size - 2 * common_size


def _is_range(rank: np.ndarray) -> bool:
    return bool(rank.size == 0 or (rank[0] == 0 and np.array_equal(rank, np.arange(rank.size))))


def _tokens_per_s(candidate: Mapping[str, Any]) -> float:
    v = (candidate.get("prediction") or {}).get("tokens_per_s")
    return float(v) if isinstance(v, (int, float)) else 0.0


def _candidate_score(candidate: Mapping[str, Any], objective: str) -> float:
    """Higher is better.  Throughput and time-to-train: tokens/s.  Cost: tokens per GPU-second
    (a price-independent proxy; the planner already ranked by price)."""
    tps = _tokens_per_s(candidate)
    if objective == "cost":
        n = len(candidate.get("ranks") or []) or (candidate.get("prediction") or {}).get("num_devices") or 1
        return tps / n
    return tps


def choose_stable(
    result: Mapping[str, Any],
    parent_best: Mapping[str, Any],
    objective: str,
    ranks_of: Callable[[int], list] | None = None,
) -> tuple[dict, list[dict], int]:
    """Among the best candidate and its alternatives, those within :data:`REPLAN_TOLERANCE` of
    the best score; of those, the one that moves the fewest ranks relative to ``parent_best``
    (ties: higher score, then the planner's order).  Returns (chosen, the others, how many were
    within tolerance).

    A candidate may come without ``ranks`` (the planner leaves them out of alternatives a
    replan may not need): ``ranks_of(i)`` gives those of candidate i (0: the best, then the
    alternatives) and is called only for the candidates within tolerance, which get them added."""
    candidates = [result["best"], *list(result.get("alternatives") or [])]
    top = max(_candidate_score(c, objective) for c in candidates)
    near = [
        (i, c)
        for i, c in enumerate(candidates)
        if _candidate_score(c, objective) >= top * (1.0 - REPLAN_TOLERANCE)
    ]
    if ranks_of is not None:
        for i, c in near:
            if "ranks" not in c:
                c["ranks"] = ranks_of(i)
    parent_ranks = parent_best.get("ranks")
    parent_places: dict[int, tuple[Any, Any]] | None = None

    def moved(c: Mapping[str, Any]) -> int:
        nonlocal parent_places
        fast = _moved_tables(parent_ranks, c.get("ranks"))
        if fast is not None:
            return fast
        if parent_places is None:
            parent_places = _rank_places(parent_ranks)
        return _moved(parent_places, _rank_places(c.get("ranks")))

    i_best, chosen = min(near, key=lambda ic: (moved(ic[1]), -_candidate_score(ic[1], objective), ic[0]))
    others = [c for i, c in enumerate(candidates) if i != i_best]
    return chosen, others, len(near)


def plan_diff(parent: StoredPlan, chosen: Mapping[str, Any], selected_from: int, chosen_index_is_best: bool) -> dict[str, Any]:
    old_best = parent.result.get("best") or {}
    old_s = old_best.get("strategy") or {}
    new_s = chosen.get("strategy") or {}
    changes = {
        k: {"from": old_s.get(k), "to": new_s.get(k)} for k in sorted(set(old_s) | set(new_s)) if old_s.get(k) != new_s.get(k)
    }
    before = _tokens_per_s(old_best)
    after = _tokens_per_s(chosen)
    old_pred = old_best.get("prediction") or {}
    new_pred = chosen.get("prediction") or {}
    return {
        "parent_id": parent.id,
        "strategy_changed": bool(changes),
        "strategy_changes": changes,
        "ranks_moved": ranks_moved(old_best.get("ranks"), chosen.get("ranks")),
        "ranks_before": len(old_best.get("ranks") or []),
        "ranks_after": len(chosen.get("ranks") or []),
        "tokens_per_s_before": before,
        "tokens_per_s_after": after,
        "tokens_per_s_change": after - before,
        "tokens_per_s_change_fraction": (after - before) / before if before else None,
        "step_time_s_before": old_pred.get("step_time_s"),
        "step_time_s_after": new_pred.get("step_time_s"),
        "candidates_within_tolerance": selected_from,
        "tolerance_fraction": REPLAN_TOLERANCE,
        "selected": "best" if chosen_index_is_best else "fewest_ranks_moved",
    }


def _copy_cluster(cluster: Mapping[str, Any], parts: tuple[str, ...] = ("node_groups", "nodes")) -> dict[str, Any]:
    """A copy of a cluster dict deep enough for the edits here: its ``parts`` (node groups with
    their host lists, nodes) copied one level down, the rest deep-copied; a part not listed is
    shared (the caller replaces it whole).  ``copy.deepcopy`` of a 12,288-node cluster took
    ~0.3 s, three times per replan."""
    out = {k: v if k in ("node_groups", "nodes") else copy.deepcopy(v) for k, v in cluster.items()}
    for key in parts:
        items = out.get(key)
        if isinstance(items, list):
            out[key] = [_copy_entry(x) for x in items]
        elif items is not None:
            out[key] = copy.deepcopy(items)
    return out


def _copy_entry(x: Any) -> Any:
    if type(x) is not dict:
        return copy.deepcopy(x)
    return {k: list(v) if type(v) is list and all(type(e) is str for e in v) else (v if type(v) in (str, int, float, bool) or v is None else copy.deepcopy(v))
            for k, v in x.items()}


def apply_cluster_changes(base: Mapping[str, Any], unavailable: list[Any] | None, added: list[Any] | None) -> dict[str, Any]:
    """A cluster dict with ``added`` nodes appended to their groups and ``unavailable`` hosts
    marked down (a new entry for each; ``base`` is not changed).  Errors name the offending list entry."""
    cluster = _copy_cluster(base, ("node_groups",))  # node entries: copied only where changed, below
    groups = cluster.get("node_groups")
    if not isinstance(groups, list):
        raise InvalidInput("must be a non-empty list of node groups", field="cluster.node_groups")
    by_name: dict[str, dict] = {}
    hosts: dict[str, str] = {}
    for i, g in enumerate(groups):
        if not isinstance(g, dict):
            raise InvalidInput("must be an object", field=f"cluster.node_groups[{i}]")
        name = g.get("name", f"group{i}")
        g["name"] = name
        count = g.get("count")
        if not g.get("hostnames") and isinstance(count, int):
            g["hostnames"] = [f"{name}-{k}" for k in range(count)]
        by_name[name] = g
        for h in g.get("hostnames") or []:
            hosts[h] = name
    nodes = cluster.get("nodes") or [{"hostname": h, "group": grp, "available": True} for h, grp in hosts.items()]
    if not isinstance(nodes, list):
        raise InvalidInput("must be a list", field="cluster.nodes")
    nodes = list(nodes)  # the entries are shared with ``base`` until one changes
    for i, n in enumerate(added or []):
        path = f"added_nodes[{i}]"
        if not isinstance(n, Mapping):
            raise InvalidInput("must be an object {hostname, group}", field=path)
        host, group = n.get("hostname"), n.get("group")
        if not isinstance(host, str) or not host:
            raise InvalidInput("must be a non-empty string", field=f"{path}.hostname")
        if host in hosts:
            raise InvalidInput(f"host {host!r} is already in the cluster", field=f"{path}.hostname")
        if not isinstance(group, str) or group not in by_name:
            raise InvalidInput(
                f"no node group {group!r}; groups: {', '.join(sorted(by_name))}", field=f"{path}.group"
            )
        g = by_name[group]
        g["hostnames"] = [*g["hostnames"], host]
        g["count"] = len(g["hostnames"])
        hosts[host] = group
        nodes.append({"hostname": host, "group": group, "available": True})
    down = set()
    for i, h in enumerate(unavailable or []):
        if not isinstance(h, str) or h not in hosts:
            raise InvalidInput(f"host {h!r} is not in the cluster", field=f"unavailable_nodes[{i}]")
        down.add(h)
    nodes = [{**n, "available": False} if isinstance(n, dict) and n.get("hostname") in down else n for n in nodes]
    cluster["nodes"] = nodes
    return cluster


def sticky_host_order(cluster: Mapping[str, Any], parent_ranks: Any) -> dict[str, Any]:
    """Reorder each node group's hostnames so that a replan places ranks where they were.

    The planner fills a pool's available nodes in hostname order, so listing the parent's hosts
    first, in the order its ranks used them, keeps an unchanged strategy on the same GPUs; a
    host that went down has its slot taken by a spare (an available host the parent did not
    use), so only the ranks of the lost node move.  Without a spare, the parent's last host
    moves into the hole rather than every later host shifting up one slot (which would move
    every rank after the lost node): the new plan runs on fewer GPUs, and the ranks it drops
    are the tail's.
    """
    out = _copy_cluster(cluster, ("node_groups",))  # only host lists change
    order = _hosts_in_rank_order(parent_ranks)
    seen = set(order)
    down = {n.get("hostname") for n in out.get("nodes") or [] if isinstance(n, Mapping) and n.get("available") is False}
    for g in out.get("node_groups") or []:
        names = list(g.get("hostnames") or [])
        members = set(names)
        used = [h for h in order if h in members]
        spares = [h for h in names if h not in seen and h not in down]
        slots: list[str | None] = [(spares.pop(0) if spares else None) if h in down else h for h in used]
        while None in slots:
            hole = slots.index(None)
            while slots and slots[-1] is None:
                slots.pop()
            if hole < len(slots):
                slots[hole] = slots.pop()
        new = [h for h in slots if h is not None]
        placed = set(new)  # once: a set per host made this quadratic (15 s for 12,288 hosts)
        g["hostnames"] = new + [h for h in names if h not in placed]
    return out


def _hosts_in_rank_order(ranks: Any) -> list[str]:
    """The hosts of a plan's ranks in the order its ranks (by rank) first use them."""
    places = ranks.places() if isinstance(ranks, RankTable) else None
    if places is not None:
        rank, hosts, host_index, _ = places
        seq = host_index[np.argsort(rank, kind="stable")]
        uniq, first = np.unique(seq, return_index=True)
        return [hosts[int(j)] for j in uniq[np.argsort(first, kind="stable")]]
    order: list[str] = []
    seen: set[str] = set()
    for r in sorted((r for r in ranks or [] if isinstance(r, Mapping)), key=lambda r: r.get("rank", 0)):
        h = r.get("host")
        if isinstance(h, str) and h not in seen:
            seen.add(h)
            order.append(h)
    return order


def pin_topology_domains(cluster: Mapping[str, Any]) -> dict[str, Any]:
    """On a cluster with a ``topology``, every node's ``domains`` written out (a node without
    them is placed by its position in the node list): :func:`sticky_host_order` then reorders
    host names without moving any node to another leaf or pod."""
    out = _copy_cluster(cluster, ())  # node entries are written anew
    if not out.get("topology"):
        return out
    from cost_model.topology import node_domains, topology_from_dict

    topology = topology_from_dict(out["topology"], "cluster.topology")
    if topology is None:
        return out
    listed = _node_list(out, len(topology.levels))
    if listed is None:  # not the shape a parsed cluster writes: parse it (errors name the field)
        from cost_model.cluster import cluster_from_dict

        parsed = cluster_from_dict(out)
        listed = [(n.hostname, {"hostname": n.hostname}, n) for n in parsed.nodes]
        by_host = {n.get("hostname"): n for n in out.get("nodes") or [] if isinstance(n, dict)}
        listed = [(h, by_host.get(h, entry), node) for h, entry, node in listed]
    domains = node_domains(topology, [node for _, _, node in listed])
    out["nodes"] = [{**entry, "domains": list(d)} for (_, entry, _), d in zip(listed, domains, strict=True)]
    return out


class _Positioned:
    """A node as :func:`cost_model.topology.node_domains` reads it: its own domains, if any."""

    __slots__ = ("domains",)

    def __init__(self, domains: tuple[str, ...]) -> None:
        self.domains = domains


def _node_list(cluster: Mapping[str, Any], levels: int) -> list[tuple[str, dict[str, Any], Any]] | None:
    """(hostname, node entry, its domains) of every node in the order ``cluster_from_dict``
    lists them (each group's host names in turn), read from a cluster dict of the shape a
    parsed cluster writes (``Cluster.to_dict``, as stored plans hold): groups with host name
    lists, node entries with valid domains or none.  None for anything else (the caller parses
    the cluster).  Reading it costs milliseconds; parsing a 12,288-node cluster ~0.2 s."""
    groups = cluster.get("node_groups")
    nodes = cluster.get("nodes") or []
    if not isinstance(groups, list) or not isinstance(nodes, list):
        return None
    by_host: dict[str, dict[str, Any]] = {}
    for n in nodes:
        if type(n) is not dict or type(n.get("hostname")) is not str:
            return None
        d = n.get("domains")
        if d is not None and (type(d) is not list or len(d) != levels or not all(type(x) is str and x for x in d)):
            return None
        by_host[n["hostname"]] = n
    out: list[tuple[str, dict[str, Any], Any]] = []
    for g in groups:
        hosts = g.get("hostnames") if type(g) is dict else None
        if type(hosts) is not list or not all(type(h) is str for h in hosts):
            return None
        for h in hosts:
            entry = by_host.pop(h, None) or {"hostname": h}
            out.append((h, entry, _Positioned(tuple(entry.get("domains") or ()))))
    return out if not by_host else None  # a node in no group: the parser's error
