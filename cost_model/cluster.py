"""Cluster model: node groups of one device type, concrete nodes, availability.

Bandwidth conventions (DESIGN.md): ``intra_node_bandwidth_GBps`` is per GPU, one direction
(NVLink; A100 SXM 300); ``inter_node_bandwidth_GBps`` is per node, all NICs together
(DGX A100 8×200 Gb/s = 200).  Omitted bandwidths default from the device catalog.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cost_model.comm import FABRICS
from cost_model.devices import DeviceSpec, resolve_device
from cost_model.errors import InvalidCluster
from cost_model.topology import Topology, topology_from_dict

#: A hostname every launch target can write unquoted (hostfiles, shell scripts, manifests): the
#: rule the exporters apply, checked when the cluster is given instead of at launch.
_HOSTNAME = re.compile(r"[A-Za-z0-9._-]{1,253}")


@dataclass(frozen=True)
class Node:
    hostname: str
    group: str
    available: bool = True
    driver_version: str | None = None
    cuda_version: str | None = None
    nccl_version: str | None = None
    #: The node's domain at each topology level, inner first (e.g. ("leaf-3", "pod-1")); empty:
    #: by position (consecutive nodes fill each level's domains of group_size_nodes).
    domains: tuple[str, ...] = ()


@dataclass(frozen=True)
class NodeGroup:
    name: str
    count: int
    gpus_per_node: int
    device: DeviceSpec
    intra_node_bandwidth_GBps: float
    inter_node_bandwidth_GBps: float
    hostnames: tuple[str, ...] = ()
    price_per_gpu_hour: float | None = None
    nccl_socket_ifname: str | None = None
    nccl_ib_hca: str | None = None
    fabric: str = "infiniband"  # inter-node fabric: infiniband | roce | omnipath (cost_model.comm.FABRICS)
    topology: Topology | None = None  # the cluster's levels above the node (None: flat)
    #: The product the nodes report (GPU Feature Discovery's ``nvidia.com/gpu.product``), as the
    #: importers read it: not costed (``device`` is), written into a Kubernetes launch's affinity.
    gpu_product: str | None = None

    @property
    def nic_per_gpu_GBps(self) -> float:
        """A GPU's share of the node's NICs when every GPU talks at once (the DP/PP case)."""
        return self.inter_node_bandwidth_GBps / self.gpus_per_node

    @property
    def split_nvlink_domain_note(self) -> str | None:
        """A warning when the group describes a rack-scale NVLink device (GB200/GB300 NVL72: the
        catalog's NVLink domain is the 72-GPU rack) by nodes of a compute tray or board (8 GPUs or
        fewer) and more than one of them: the cost model's node is the NVLink domain, so the traffic between these
        nodes — which NVLink carries inside a rack — is priced over the NICs.  None otherwise (an
        HGX board's 8 or fewer GPUs a node are a whole domain)."""
        domain = self.device.gpus_per_node
        if domain <= 8 or self.gpus_per_node > 8 or self.count < 2:  # whole (or most of) racks: their NVLink is priced
            return None
        return (f"{self.name}: {self.device.name}'s NVLink domain is its rack ({domain} GPUs) but the group has "
                f"{self.gpus_per_node} GPUs a node (a compute tray?): a node here is an NVLink domain, so the traffic between "
                f"its nodes is priced over the NICs; describe each rack as one node (gpus_per_node up to {domain}) to price "
                "it over NVLink")


@dataclass(frozen=True)
class Cluster:
    name: str
    node_groups: tuple[NodeGroup, ...]
    nodes: tuple[Node, ...] = field(default=())
    topology: Topology | None = None  # levels above the node (cost_model.topology); None: flat

    def group(self, name: str) -> NodeGroup:
        for g in self.node_groups:
            if g.name == name:
                return g
        raise KeyError(name)

    def available_nodes(self, group: str | None = None) -> tuple[Node, ...]:
        # memoised on the (frozen) cluster: a search asks for each group's nodes dozens of times
        # and a 12,288-node cluster took ~3 ms each
        memo: dict[str | None, tuple[Node, ...]] = self.__dict__.setdefault("_available_nodes", {})
        if group not in memo:
            memo[group] = tuple(n for n in self.nodes if n.available and (group is None or n.group == group))
        return memo[group]

    def available_gpus(self, group: str | None = None) -> int:
        total = 0
        for g in self.node_groups:
            if group is None or g.name == group:
                total += g.gpus_per_node * len(self.available_nodes(g.name))
        return total

    @property
    def total_gpus(self) -> int:
        return self.available_gpus()

    @property
    def device_types(self) -> tuple[str, ...]:
        seen: list[str] = []
        for g in self.node_groups:
            if self.available_nodes(g.name) and g.device.name not in seen:
                seen.append(g.device.name)
        return tuple(seen)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "node_groups": [
                {
                    "name": g.name,
                    "count": g.count,
                    "gpus_per_node": g.gpus_per_node,
                    "device": g.device.name if g.device.source != "inline" else g.device.to_dict(),
                    "intra_node_bandwidth_GBps": g.intra_node_bandwidth_GBps,
                    "inter_node_bandwidth_GBps": g.inter_node_bandwidth_GBps,
                    "hostnames": list(g.hostnames),
                    **({"price_per_gpu_hour": g.price_per_gpu_hour} if g.price_per_gpu_hour is not None else {}),
                    **({"nccl_socket_ifname": g.nccl_socket_ifname} if g.nccl_socket_ifname else {}),
                    **({"nccl_ib_hca": g.nccl_ib_hca} if g.nccl_ib_hca else {}),
                    **({"fabric": g.fabric} if g.fabric != "infiniband" else {}),
                    **({"gpu_product": g.gpu_product} if g.gpu_product else {}),
                }
                for g in self.node_groups
            ],
            "nodes": [_node_dict(n) for n in self.nodes],
            **({"topology": self.topology.to_dict()} if self.topology is not None else {}),
        }


def _node_dict(n: Node) -> dict[str, Any]:
    """A node's entry of :meth:`Cluster.to_dict` (version fields and domains only when set)."""
    out: dict[str, Any] = {"hostname": n.hostname, "group": n.group, "available": n.available}
    if n.driver_version:
        out["driver_version"] = n.driver_version
    if n.cuda_version:
        out["cuda_version"] = n.cuda_version
    if n.nccl_version:
        out["nccl_version"] = n.nccl_version
    if n.domains:
        out["domains"] = list(n.domains)
    return out


#: The largest NVLink domain a node group may describe: an NVL72 rack (GB200/GB300), whose
#: NVLink Switch System connects all 72 GPUs at the per-GPU NVLink 5 rate.
MAX_GPUS_PER_NODE = 72


def _positive_int(value: Any, field_path: str, maximum: int = 1_000_000) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidCluster(f"must be a positive integer, got {value!r}", field=field_path)
    if value > maximum:
        raise InvalidCluster(f"must be at most {maximum}, got {value}", field=field_path)
    return value


def _positive_float(value: Any, field_path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise InvalidCluster(f"must be a positive number, got {value!r}", field=field_path)
    return float(value)


#: The fields of a cluster, of a node group and of a node entry: any other is refused (a
#: misspelt bandwidth, say, would otherwise be planned as the device's default without a word).
CLUSTER_FIELDS = ("name", "node_groups", "nodes", "topology")
NODE_GROUP_FIELDS = ("name", "count", "gpus_per_node", "device", "intra_node_bandwidth_GBps", "inter_node_bandwidth_GBps", "hostnames",
                     "price_per_gpu_hour", "nccl_socket_ifname", "nccl_ib_hca", "fabric", "gpu_product")
NODE_FIELDS = ("hostname", "group", "available", "driver_version", "cuda_version", "nccl_version", "domains")


def _known_only(data: Mapping[str, Any], known: tuple[str, ...], field_path: str) -> None:
    if data.keys() <= _KNOWN[known]:  # one set comparison: this runs once per node of a cluster
        return
    key = next(k for k in data if k not in known)
    raise InvalidCluster(f"is not a known field; allowed: {', '.join(known)}", field=f"{field_path}.{key}")


_KNOWN: dict[tuple[str, ...], frozenset[str]] = {fields: frozenset(fields) for fields in (CLUSTER_FIELDS, NODE_GROUP_FIELDS, NODE_FIELDS)}


def cluster_from_dict(data: Mapping[str, Any], field_path: str = "cluster", strict: bool = True) -> Cluster:
    """Build and validate a :class:`Cluster` from the v1 JSON shape.  ``strict``: refuse fields
    the shape does not have (off only for clusters saved before they were refused, which stay
    plannable as they were)."""
    if not isinstance(data, Mapping):
        raise InvalidCluster("must be an object with 'name' and 'node_groups'", field=field_path)
    if strict:
        _known_only(data, CLUSTER_FIELDS, field_path)
    name = data.get("name", "cluster")
    if not isinstance(name, str) or not name:
        raise InvalidCluster("must be a non-empty string", field=f"{field_path}.name")
    groups_in = data.get("node_groups")
    if not isinstance(groups_in, list) or not groups_in:
        raise InvalidCluster("must be a non-empty list of node groups", field=f"{field_path}.node_groups")
    topology = topology_from_dict(data.get("topology"), f"{field_path}.topology")
    groups: list[NodeGroup] = []
    order: list[tuple[str, str]] = []  # (hostname, group) of every node, in group order
    seen_names: set[str] = set()
    seen_hosts: set[str] = set()
    for i, g in enumerate(groups_in):
        gp = f"{field_path}.node_groups[{i}]"
        if not isinstance(g, Mapping):
            raise InvalidCluster("must be an object", field=gp)
        if strict:
            _known_only(g, NODE_GROUP_FIELDS, gp)
        gname = g.get("name", f"group{i}")
        if not isinstance(gname, str) or not gname:
            raise InvalidCluster("must be a non-empty string", field=f"{gp}.name")
        if gname in seen_names:
            raise InvalidCluster(f"duplicate node group name {gname!r}", field=f"{gp}.name")
        seen_names.add(gname)
        count = _positive_int(g.get("count"), f"{gp}.count", 100_000)
        if "device" not in g:
            raise InvalidCluster("is required (a catalog name or an inline spec)", field=f"{gp}.device")
        device = resolve_device(g["device"], f"{gp}.device")
        # A node is an NVLink domain: up to 72 GPUs (GB200/GB300 NVL72 racks).
        gpn = _positive_int(g.get("gpus_per_node", device.gpus_per_node), f"{gp}.gpus_per_node", MAX_GPUS_PER_NODE)
        intra = g.get("intra_node_bandwidth_GBps")
        intra = device.intra_node_bandwidth_GBps if intra is None else _positive_float(intra, f"{gp}.intra_node_bandwidth_GBps")
        inter = g.get("inter_node_bandwidth_GBps")
        inter = (
            device.inter_node_bandwidth_GBps * gpn / device.gpus_per_node
            if inter is None
            else _positive_float(inter, f"{gp}.inter_node_bandwidth_GBps")
        )
        hostnames = g.get("hostnames")
        if hostnames is None:
            hostnames = [f"{gname}-{k}" for k in range(count)]
        if not isinstance(hostnames, list) or not all(isinstance(h, str) and h for h in hostnames):
            raise InvalidCluster("must be a list of non-empty strings", field=f"{gp}.hostnames")
        for k, h in enumerate(hostnames if g.get("hostnames") is not None else ()):
            if not _HOSTNAME.fullmatch(h):
                raise InvalidCluster(f"must be a hostname (1-253 letters, digits, '.', '_', '-'), got {h[:80]!r}", field=f"{gp}.hostnames[{k}]")
        if len(hostnames) != count:
            raise InvalidCluster(
                f"has {len(hostnames)} names but count is {count}", field=f"{gp}.hostnames"
            )
        for h in hostnames:
            if h in seen_hosts:
                raise InvalidCluster(f"duplicate hostname {h!r}", field=f"{gp}.hostnames")
            seen_hosts.add(h)
        price = g.get("price_per_gpu_hour")
        if price is not None:
            price = _positive_float(price, f"{gp}.price_per_gpu_hour")
        product = g.get("gpu_product")
        if product is not None and (not isinstance(product, str) or not product):
            raise InvalidCluster("must be a non-empty string", field=f"{gp}.gpu_product")
        fabric = g.get("fabric", "infiniband")
        if fabric not in FABRICS:
            raise InvalidCluster(f"must be one of {', '.join(FABRICS)}, got {fabric!r}", field=f"{gp}.fabric")
        groups.append(
            NodeGroup(
                name=gname,
                count=count,
                gpus_per_node=gpn,
                device=device,
                intra_node_bandwidth_GBps=intra,
                inter_node_bandwidth_GBps=inter,
                hostnames=tuple(hostnames),
                price_per_gpu_hour=price,
                nccl_socket_ifname=g.get("nccl_socket_ifname"),
                nccl_ib_hca=g.get("nccl_ib_hca"),
                fabric=fabric,
                topology=topology,
                gpu_product=product,
            )
        )
        order.extend((h, gname) for h in hostnames)
    explicit = data.get("nodes")
    by_host: dict[str, Node] = {}
    if explicit is not None:
        if not isinstance(explicit, list):
            raise InvalidCluster("must be a list of {hostname, group?, available}", field=f"{field_path}.nodes")
        group_of = dict(order)
        levels = len(topology.levels) if topology else 0
        for j, n in enumerate(explicit):
            # the field path is formatted only for an error: this loop runs once per node
            if not isinstance(n, Mapping) or not isinstance(n.get("hostname"), str):
                raise InvalidCluster("must be an object with a 'hostname'", field=f"{field_path}.nodes[{j}]")
            if strict:
                _known_only(n, NODE_FIELDS, f"{field_path}.nodes[{j}]")
            host = n["hostname"]
            if host not in group_of:
                raise InvalidCluster(
                    f"hostname {host!r} is in no node group (add it to a group's hostnames)", field=f"{field_path}.nodes[{j}].hostname"
                )
            if "group" in n and n["group"] != group_of[host]:
                raise InvalidCluster(
                    f"hostname {host!r} belongs to group {group_of[host]!r}, not {n['group']!r}",
                    field=f"{field_path}.nodes[{j}].group",
                )
            available = n.get("available", True)
            if available is not True and available is not False:
                raise InvalidCluster("must be true or false", field=f"{field_path}.nodes[{j}].available")
            domains = n.get("domains")
            if domains is not None and (
                not isinstance(domains, list) or len(domains) != levels or not all(isinstance(d, str) and d for d in domains)
            ):
                raise InvalidCluster(
                    f"must list the node's domain at each of the {levels} topology levels, inner first",
                    field=f"{field_path}.nodes[{j}].domains",
                )
            # one Node per host, built directly (a default Node and dataclasses.replace twice per
            # node took ~0.4 s for a 12,288-node cluster); a host listed twice: the later
            # entry's fields win
            prev = by_host.get(host)
            driver, cuda, nccl = n.get("driver_version"), n.get("cuda_version"), n.get("nccl_version")
            by_host[host] = Node(
                hostname=host,
                group=group_of[host],
                available=available,
                driver_version=str(driver) if driver is not None else prev.driver_version if prev else None,
                cuda_version=str(cuda) if cuda is not None else prev.cuda_version if prev else None,
                nccl_version=str(nccl) if nccl is not None else prev.nccl_version if prev else None,
                domains=tuple(domains) if domains is not None else prev.domains if prev else (),
            )
    nodes = [by_host.get(h) or Node(hostname=h, group=g) for h, g in order]
    cluster = Cluster(name=name, node_groups=tuple(groups), nodes=tuple(nodes), topology=topology)
    if cluster.total_gpus == 0:
        raise InvalidCluster("every node is marked unavailable: no devices left", field=f"{field_path}.nodes")
    return cluster


def simple_cluster(device: str | DeviceSpec, nodes: int, gpus_per_node: int = 8, name: str | None = None, **kw: Any) -> Cluster:
    """Convenience: one homogeneous node group."""
    dev = resolve_device(device)
    return cluster_from_dict(
        {
            "name": name or f"{nodes}x{gpus_per_node}-{dev.name}",
            "node_groups": [{"name": "g0", "count": nodes, "gpus_per_node": gpus_per_node, "device": dev, **kw}],
        }
    )
