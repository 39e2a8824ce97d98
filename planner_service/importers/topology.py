"""Network topology importers: what operators have → the cluster's ``topology`` levels and each
node's ``domains`` (cost_model.topology; docs/integration.md §7).

* **Slurm ``topology.conf``** (slurm.schedmd.com/topology.conf.html):
  - tree plugin: ``SwitchName=s0 Nodes=gpu[000-031]`` for leaf switches and
    ``SwitchName=spine0 Switches=s[0-3]`` above them (``LinkSpeed`` is relative and ignored).  A
    switch's level is its height (leaf switches 1); a level with one switch holding every node
    (the root) is no boundary and is dropped.
  - block plugin: ``BlockName=b0 Nodes=gpu[000-017]`` and optionally ``BlockSizes=18,72``:
    the base blocks, then each larger size aggregates consecutive blocks (the planning sizes
    Slurm enforces).
  Slurm's file names hosts only, so it is applied to a cluster (the second file: v1 cluster
  JSON, e.g. from another importer).  Hostlist expressions ``gpu[000-031,40]`` expand as
  Slurm's parser does (zero padding kept; several bracket groups).
* **Kubernetes node labels** (``kubectl get nodes -o json``), the first family present, inner
  first: NVIDIA Topograph ``network.topology.nvidia.com/leaf``, ``/spine``, ``/core``
  (docs.nvidia.com/topograph); Amazon EKS ``topology.k8s.aws/network-node-layer-3``, ``-2``,
  ``-1`` (layer 1 is the top of the hierarchy; ``-4`` below them where present; EKS user guide,
  "Place distributed AI/ML workloads with network topology labels"); GKE
  ``cloud.google.com/gce-topology-subblock``, ``cloud.google.com/gce-topology-block`` (Compute
  Engine's physical host topology: instances in a sub-block are closer than in a block); else
  ``topology.kubernetes.io/zone`` and ``/region``.

A level's ``group_size_nodes`` is its largest domain (rounded up to a multiple of the level
below); smaller domains (uneven pods, drained nodes) are packed by the placement.  Neither
format states bandwidths, so every level gets ``oversubscription`` 1.0 and the import warns:
set each level's ``oversubscription`` or ``bandwidth_GBps`` from the fabric's design.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from cost_model.errors import InvalidCluster

_BRACKET = re.compile(r"\[([^\]]*)\]")

#: Kubernetes label families, inner level first: (level name, label).
K8S_LABEL_FAMILIES: tuple[tuple[tuple[str, str], ...], ...] = (
    (("leaf", "network.topology.nvidia.com/leaf"), ("spine", "network.topology.nvidia.com/spine"), ("core", "network.topology.nvidia.com/core")),
    (("layer-4", "topology.k8s.aws/network-node-layer-4"), ("layer-3", "topology.k8s.aws/network-node-layer-3"),
     ("layer-2", "topology.k8s.aws/network-node-layer-2"), ("layer-1", "topology.k8s.aws/network-node-layer-1")),
    (("subblock", "cloud.google.com/gce-topology-subblock"), ("block", "cloud.google.com/gce-topology-block")),
    (("zone", "topology.kubernetes.io/zone"), ("region", "topology.kubernetes.io/region")),
)

NO_BANDWIDTH_WARNING = (
    "the topology gives no bandwidths: every level is imported at oversubscription 1.0 (full bisection); "
    "set each level's oversubscription or bandwidth_GBps"
)


def expand_hostlist(expr: str, field: str = "topology.conf") -> list[str]:
    """Slurm hostlist expression → host names: ``gpu[000-002,7]`` → gpu000, gpu001, gpu002, gpu007."""
    out: list[str] = []
    for part in _split_top(expr):
        names = [""]
        pos = 0
        for m in _BRACKET.finditer(part):
            names = [n + part[pos : m.start()] for n in names]
            options: list[str] = []
            for rng in m.group(1).split(","):
                lo, _, hi = rng.partition("-")
                if not lo.isdigit() or (hi and not hi.isdigit()):
                    raise InvalidCluster(f"bad hostlist range {rng!r} in {expr!r}", field=field)
                width = len(lo)
                end = int(hi) if hi else int(lo)
                if end < int(lo) or end - int(lo) > 1_000_000:
                    raise InvalidCluster(f"bad hostlist range {rng!r} in {expr!r}", field=field)
                options.extend(str(k).zfill(width) for k in range(int(lo), end + 1))
            names = [n + o for n in names for o in options]
            pos = m.end()
        out.extend(n + part[pos:] for n in names)
    return [n for n in out if n]


def _split_top(expr: str) -> list[str]:
    """Split at commas outside brackets."""
    parts, depth, cur = [], 0, ""
    for ch in expr:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def _conf_lines(text: str) -> list[dict[str, str]]:
    rows = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        row: dict[str, str] = {}
        for tok in line.split():
            key, sep, value = tok.partition("=")
            if not sep:
                raise InvalidCluster(f"expected Key=Value, got {tok!r} in line {raw.strip()!r}", field="topology.conf")
            row[key.lower()] = value
        rows.append(row)
    return rows


def _tree_domains(rows: list[dict[str, str]]) -> tuple[list[str], dict[str, list[str]]]:
    """Slurm tree plugin → (level names, host → domain at each level, inner first)."""
    children: dict[str, list[str]] = {}
    hosts_of: dict[str, list[str]] = {}
    for r in rows:
        name = r.get("switchname")
        if not name:
            raise InvalidCluster(f"every line of the tree plugin needs SwitchName=, got {r}", field="topology.conf")
        if "nodes" in r:
            hosts_of[name] = expand_hostlist(r["nodes"])
        if "switches" in r:
            children[name] = expand_hostlist(r["switches"])
    parent: dict[str, str] = {}
    for p, kids in children.items():
        for k in kids:
            parent[k] = p
    height: dict[str, int] = {}

    def h(s: str, seen: frozenset[str] = frozenset()) -> int:
        if s in seen:
            raise InvalidCluster(f"switch {s!r} is its own ancestor", field="topology.conf")
        if s not in height:
            height[s] = 1 if s not in children else 1 + max(h(k, seen | {s}) for k in children[s])
        return height[s]

    top = max((h(s) for s in {*children, *hosts_of}), default=0)
    domains: dict[str, list[str]] = {}
    for leaf, hosts in hosts_of.items():
        chain = [leaf]
        while chain[-1] in parent:
            chain.append(parent[chain[-1]])
        path: list[str] = []
        for level in range(1, top + 1):
            at = [s for s in chain if h(s) == level]
            path.append(at[0] if at else (path[-1] if path else leaf))
        for host in hosts:
            if host in domains:
                raise InvalidCluster(f"host {host!r} is under two leaf switches", field="topology.conf")
            domains[host] = path
    return [("leaf" if k == 1 else "spine" if k == 2 else f"tier{k}") for k in range(1, top + 1)], domains


def _block_domains(rows: list[dict[str, str]]) -> tuple[list[str], dict[str, list[str]]]:
    """Slurm block plugin → (level names, host → domain per level)."""
    sizes: list[int] = []
    blocks: list[tuple[str, list[str]]] = []
    for r in rows:
        if "blocksizes" in r:
            try:
                sizes = [int(x) for x in r["blocksizes"].split(",") if x]
            except ValueError:
                raise InvalidCluster(f"BlockSizes must be integers, got {r['blocksizes']!r}", field="topology.conf") from None
        elif "blockname" in r:
            blocks.append((r["blockname"], expand_hostlist(r.get("nodes", ""))))
        else:
            raise InvalidCluster(f"the block plugin takes BlockName=/Nodes= and BlockSizes= lines, got {r}", field="topology.conf")
    base = sizes[0] if sizes else max(len(h) for _, h in blocks)
    names = ["block"] + [f"block{s}" for s in sizes[1:]]
    domains: dict[str, list[str]] = {}
    for k, (bname, hosts) in enumerate(blocks):
        path = [bname] + [f"block{s}-{k // max(s // base, 1)}" for s in sizes[1:]]
        for host in hosts:
            domains[host] = path
    return names, domains


def _levels(names: Sequence[str], domains: Mapping[str, Sequence[str]]) -> list[dict[str, Any]]:
    """Levels from per-host domains: size = the largest domain (a multiple of the level below)."""
    levels = []
    prev = 1
    for j, name in enumerate(names):
        counts = Counter(tuple(d[j:]) for d in domains.values())
        size = max(counts.values())
        size = -(-size // prev) * prev
        levels.append({"name": name, "group_size_nodes": size, "oversubscription": 1.0})
        prev = size
    return levels


def _apply(cluster: dict[str, Any], names: list[str], domains: dict[str, list[str]], source: str) -> tuple[dict[str, Any], list[str]]:
    """The cluster with ``topology`` and per-node ``domains``; drops levels that are one domain."""
    hosts = [h for g in cluster.get("node_groups", []) for h in (g.get("hostnames") or [f"{g.get('name')}-{k}" for k in range(g.get("count", 0))])]
    warnings = [NO_BANDWIDTH_WARNING]
    missing = [h for h in hosts if h not in domains]
    if missing:
        warnings.append(f"{len(missing)} host(s) not in the {source} (e.g. {missing[0]}): put in a domain of their own")
    host_set = set(hosts)
    keep = [j for j in range(len(names)) if len({tuple(d[j:]) for h, d in domains.items() if h in host_set} | ({("(none)",)} if missing else set())) > 1]
    if not keep:
        raise InvalidCluster(f"the {source} puts every host of the cluster in one domain: no boundary to model", field="topology")
    names = [names[j] for j in keep]
    per_host = {h: [d[j] for j in keep] for h, d in domains.items()}
    for h in missing:
        per_host[h] = [f"(none)-{names[j]}" for j in range(len(names))]
    out = dict(cluster)
    out["topology"] = {"levels": _levels(names, {h: per_host[h] for h in hosts}), "rail_optimized": True}
    by_host = {n["hostname"]: dict(n) for n in cluster.get("nodes") or []}
    out["nodes"] = [{**by_host.get(h, {"hostname": h}), "domains": per_host[h]} for h in hosts]
    return out, warnings


def import_slurm_topology(sources: Sequence[tuple[str, str]], name: str | None = None) -> tuple[dict[str, Any], list[str]]:
    """``topology.conf`` (tree or block plugin) applied to a v1 cluster JSON (the other file)."""
    if len(sources) != 2:
        raise InvalidCluster("format slurm-topology takes two files: topology.conf and the cluster JSON it applies to", field="files")
    conf, cluster_text = sources
    if conf[1].lstrip().startswith("{"):
        conf, cluster_text = cluster_text, conf
    try:
        cluster = json.loads(cluster_text[1])
    except json.JSONDecodeError as exc:
        raise InvalidCluster(f"{cluster_text[0]} is not JSON: {exc.msg} at line {exc.lineno}", field="files") from None
    if isinstance(cluster, Mapping) and isinstance(cluster.get("cluster"), Mapping):
        cluster = cluster["cluster"]  # an importer's {cluster, warnings}
    if not isinstance(cluster, Mapping) or not isinstance(cluster.get("node_groups"), list):
        raise InvalidCluster("the cluster file must be a v1 cluster {name, node_groups, nodes?}", field="files")
    rows = _conf_lines(conf[1])
    if not rows:
        raise InvalidCluster("is empty", field="topology.conf")
    if any("switchname" in r for r in rows):
        names, domains = _tree_domains(rows)
    else:
        names, domains = _block_domains(rows)
    out, warnings = _apply(dict(cluster), names, domains, "topology.conf")
    if name:
        out["name"] = name
    return out, warnings


def k8s_topology(items: Sequence[Mapping[str, Any]]) -> tuple[list[str], dict[str, list[str]]] | None:
    """(level names, node → domains) from the first label family any node carries; None if none."""
    for family in K8S_LABEL_FAMILIES:
        present = [(lvl, key) for lvl, key in family if any(key in ((n.get("metadata") or {}).get("labels") or {}) for n in items)]
        if not present:
            continue
        domains: dict[str, list[str]] = {}
        for n in items:
            meta = n.get("metadata") or {}
            labels = meta.get("labels") or {}
            host = meta.get("name")
            if isinstance(host, str) and all(key in labels for _, key in present):
                domains[host] = [str(labels[key]) for _, key in present]
        return [lvl for lvl, _ in present], domains
    return None


def apply_k8s_topology(cluster: dict[str, Any], items: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], list[str]]:
    """The imported cluster with the topology its nodes' labels describe (unchanged without)."""
    found = k8s_topology(items)
    if found is None:
        return cluster, []
    names, domains = found
    try:
        return _apply(cluster, names, domains, "node labels")
    except InvalidCluster:
        return cluster, ["the nodes' topology labels put every node in one domain: imported without a topology"]
