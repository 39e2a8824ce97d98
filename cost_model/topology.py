"""Network hierarchy above the node, nesting orders of the parallel dimensions, and the cost of
collectives over the hierarchy.

Model (cluster JSON ``topology``):

* ``levels``: domains above the node, innermost first, e.g. ``leaf`` (a rack or scalable unit,
  ``group_size_nodes: 32``) then ``pod`` (``group_size_nodes: 384``).  Traffic that leaves a
  level-j domain crosses that level's uplinks.  Each level gives either ``bandwidth_GBps``
  (per node, one direction, across that boundary when every node sends at once) or
  ``oversubscription`` o_j (downlink : uplink ratio of its switches; 1.0 = full bisection).  The
  per-node bandwidth across level j is then ``inter_node_bandwidth_GBps / (o_1·…·o_j)``: every
  switch on the way divides the share again (a fat tree's uplinks; the Llama 3 report's 1:7
  between pods, Dubey et al. 2024 §3.3.1).  Levels are monotone: a share is never above the
  share of the level below.
* ``rail_optimized`` (default true): each GPU's NIC is wired to the leaf of its rail (NVIDIA
  DGX SuperPOD reference architecture).  Ring collectives stay rail-aligned (NCCL builds one
  ring per rail); all-to-all between GPUs of different local index goes through NVLink first
  (NCCL's PXN, 2.12+), adding an NVLink hop to the remote bytes.

No ``topology`` → the flat model: one inter-node bandwidth between any two nodes, and every cost
here is exactly zero (the surcharges below are added to the flat costs of
:mod:`cost_model.comm`).

Nesting order: which parallel dimension varies fastest across the GPUs of a pool.  TP is always
innermost (it stays inside the NVLink domain); the order of the others, ``NESTINGS[k]``, inner to
outer, decides which of them cross nodes, leaves and pods.  Code 0 is Megatron-LM's rank order
(tp, cp, dp, pp); the Llama 3 report's choice is (tp, cp, pp, dp).  A candidate's nesting is the
integer array ``StrategyArrays.nest`` (None: all code 0).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import numpy as np

from cost_model.comm import ArrayOrFloat, FloatArray, Links, ranks_per_node
from cost_model.errors import InvalidCluster, InvalidStrategy
from cost_model.units import gbps_to_bytes_per_s

if TYPE_CHECKING:
    from cost_model.cluster import NodeGroup
    from cost_model.transformer.layer_cost import StrategyArrays

#: Every nesting order searched, inner to outer; index 0 is Megatron-LM's (tp, cp, dp, pp).
NESTINGS: tuple[tuple[str, ...], ...] = tuple(("tp", *p) for p in itertools.permutations(("cp", "dp", "pp")))
MEGATRON_NESTING = NESTINGS[0]
DIMS = ("tp", "cp", "dp", "pp")


@dataclass(frozen=True, kw_only=True)
class TopologyLevel:
    """One level of switches above the node: domains of ``group_size_nodes`` nodes."""

    name: str
    group_size_nodes: int
    oversubscription: float = 1.0
    bandwidth_GBps: float | None = None  # per node across this level's boundary; overrides oversubscription

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "group_size_nodes": self.group_size_nodes, "oversubscription": self.oversubscription}
        if self.bandwidth_GBps is not None:
            out["bandwidth_GBps"] = self.bandwidth_GBps
        return out


@dataclass(frozen=True, kw_only=True)
class Topology:
    levels: tuple[TopologyLevel, ...]
    rail_optimized: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {"levels": [lv.to_dict() for lv in self.levels], "rail_optimized": self.rail_optimized}


def topology_from_dict(data: Any, field_path: str = "cluster.topology") -> Topology | None:
    """Parse and validate the cluster's ``topology`` (None or absent: flat).  Accepts a list of
    levels or ``{"levels": [...], "rail_optimized": bool}``."""
    if data is None:
        return None
    rail = True
    levels_in: Any = data
    if isinstance(data, Mapping):
        unknown = set(data) - {"levels", "rail_optimized"}
        if unknown:
            raise InvalidCluster(f"unknown topology fields: {', '.join(sorted(unknown))}", field=f"{field_path}.{sorted(unknown)[0]}")
        levels_in = data.get("levels")
        rail = data.get("rail_optimized", True)
        if not isinstance(rail, bool):
            raise InvalidCluster("must be true or false", field=f"{field_path}.rail_optimized")
        field_path = f"{field_path}.levels"
    if not isinstance(levels_in, list) or not levels_in:
        raise InvalidCluster("must be a non-empty list of levels {name, group_size_nodes, oversubscription | bandwidth_GBps}", field=field_path)
    levels: list[TopologyLevel] = []
    prev_size = 1
    names: set[str] = set()
    for i, lv in enumerate(levels_in):
        lp = f"{field_path}[{i}]"
        if not isinstance(lv, Mapping):
            raise InvalidCluster("must be an object", field=lp)
        unknown = set(lv) - {f.name for f in fields(TopologyLevel)}
        if unknown:
            raise InvalidCluster(f"unknown level fields: {', '.join(sorted(unknown))}", field=f"{lp}.{sorted(unknown)[0]}")
        name = lv.get("name", f"level{i + 1}")
        if not isinstance(name, str) or not name or name in names or name == "node":
            raise InvalidCluster(f"must be a unique non-empty name other than 'node', got {name!r}", field=f"{lp}.name")
        names.add(name)
        size = lv.get("group_size_nodes")
        if isinstance(size, bool) or not isinstance(size, int) or size < 1 or size > 10_000_000:
            raise InvalidCluster(f"must be a positive integer, got {size!r}", field=f"{lp}.group_size_nodes")
        if size % prev_size:
            raise InvalidCluster(
                f"{size} nodes is not a multiple of the {prev_size} nodes of the level below (domains nest)", field=f"{lp}.group_size_nodes"
            )
        prev_size = size
        o = lv.get("oversubscription", 1.0)
        if isinstance(o, bool) or not isinstance(o, (int, float)) or not 1.0 <= o <= 1000.0:
            raise InvalidCluster(f"must be a number ≥ 1 (downlink : uplink), got {o!r}", field=f"{lp}.oversubscription")
        bw = lv.get("bandwidth_GBps")
        if bw is not None and (isinstance(bw, bool) or not isinstance(bw, (int, float)) or bw <= 0):
            raise InvalidCluster(f"must be a positive number, got {bw!r}", field=f"{lp}.bandwidth_GBps")
        levels.append(TopologyLevel(name=name, group_size_nodes=size, oversubscription=float(o), bandwidth_GBps=None if bw is None else float(bw)))
    return Topology(levels=tuple(levels), rail_optimized=rail)


def node_domains(topology: Topology, nodes: Sequence[Any]) -> list[tuple[str, ...]]:
    """Each node's domains, inner first: its own ``domains``, else by its position in ``nodes``
    (the cluster's node list, unavailable nodes counted, so a lost node leaves a hole in its leaf
    and pod): ``"<level>-<position // group_size_nodes>"``."""
    return [
        tuple(n.domains) if n.domains else tuple(f"{lv.name}-{k // lv.group_size_nodes}" for lv in topology.levels)
        for k, n in enumerate(nodes)
    ]


# ---- links over the hierarchy --------------------------------------------------------------------


@dataclass(frozen=True)
class HierLinks(Links):
    """:class:`cost_model.comm.Links` plus the levels above the node, as one GPU sees them:
    the size of each level's domain in GPUs and this GPU's achieved share of the per-node
    bandwidth across that level's boundary (GB/s)."""

    level_names: tuple[str, ...] = ()
    level_gpus: tuple[int, ...] = ()
    level_GBps: tuple[float, ...] = ()
    rail_optimized: bool = True


def level_shares_GBps(node_GBps: float, gpus_per_node: int, levels: Sequence[TopologyLevel], achieved_fraction: float) -> tuple[float, ...]:
    """Per-GPU achieved bandwidth (GB/s) across each level's boundary: ``bandwidth_GBps / gpus
    per node × achieved_fraction`` where a level states it, else the share below divided by the
    level's oversubscription (module docstring); never above the share of the level below."""
    out: list[float] = []
    share = node_GBps
    for lv in levels:
        nxt = lv.bandwidth_GBps / gpus_per_node * achieved_fraction if lv.bandwidth_GBps is not None else share / lv.oversubscription
        share = min(share, nxt)
        out.append(share)
    return tuple(out)


def links_for_group(group: NodeGroup) -> Links:
    """:meth:`Links.for_group`, with the hierarchy when the group's cluster has a topology."""
    base = Links.for_group(group)
    topo: Topology | None = getattr(group, "topology", None)
    if topo is None:
        return base
    fraction = base.inter_GBps / group.nic_per_gpu_GBps if group.nic_per_gpu_GBps > 0 else 1.0
    return HierLinks(
        **{f.name: getattr(base, f.name) for f in fields(Links)},
        level_names=tuple(lv.name for lv in topo.levels),
        level_gpus=tuple(lv.group_size_nodes * group.gpus_per_node for lv in topo.levels),
        level_GBps=level_shares_GBps(base.inter_GBps, group.gpus_per_node, topo.levels, fraction),
        rail_optimized=topo.rail_optimized,
    )


def _levels(links: Links) -> tuple[tuple[int, ...], tuple[float, ...]]:
    if isinstance(links, HierLinks):
        return links.level_gpus, links.level_GBps
    return (), ()


# ---- strides of the parallel dimensions ------------------------------------------------------------


def nesting_code(nesting: Sequence[str] | None, field_path: str = "strategy.nesting") -> int:
    """The index in :data:`NESTINGS` of a nesting order (None: Megatron's, 0)."""
    if nesting is None:
        return 0
    t = tuple(nesting)
    if t not in NESTINGS:
        raise InvalidStrategy(
            f"must list tp, cp, dp and pp once each, inner to outer with tp first, got {list(t)!r}", field=field_path
        )
    return NESTINGS.index(t)


#: [order, dim]: the position of each dimension in each nesting order.
_POSITION = np.array([[order.index(d) for d in DIMS] for order in NESTINGS])


def strides(S: StrategyArrays) -> dict[str, FloatArray]:
    """GPU stride of each dimension's members (the product of the sizes nested inside it)."""
    if S.nest is None:  # Megatron's order
        return {"tp": np.ones(len(S)), "cp": S.tp, "dp": S.tp * S.cp, "pp": S.tp * S.cp * S.dp}
    cached: dict[str, FloatArray] | None = S.__dict__.get("_strides")
    if cached is not None:
        return cached
    sizes = [S.tp, S.cp, S.dp, S.pp]
    nest = S.nest.astype(np.int64)
    pos = [_POSITION[:, b][nest] for b in range(len(DIMS))]  # where each dim sits in the order
    out: dict[str, FloatArray] = {}
    for a, name in enumerate(DIMS):
        prod = np.ones(len(S))
        for b in range(len(DIMS)):
            if b != a:
                prod = prod * np.where(pos[b] < pos[a], sizes[b], 1.0)
        out[name] = prod
    object.__setattr__(S, "_strides", out)  # S is frozen and never changes: memoise on it
    return out


Axes = list[tuple[FloatArray, FloatArray]]  # (size, stride) per axis, inner first


def data_axes(S: StrategyArrays) -> Axes:
    """The dp·cp gradient group as axes: one combined axis when cp sits directly inside dp (as
    in Megatron's order, stride tp), else cp and dp separately."""
    if S.nest is None:
        return [(S.dp * S.cp, S.tp)]
    st = strides(S)
    adjacent = st["dp"] == st["cp"] * S.cp
    cp_axis = (np.where(adjacent, 1.0, S.cp), st["cp"])
    dp_axis = (np.where(adjacent, S.dp * S.cp, S.dp), np.where(adjacent, st["cp"], st["dp"]))
    first = np.minimum(cp_axis[1], dp_axis[1]) == cp_axis[1]
    inner = (np.where(first, cp_axis[0], dp_axis[0]), np.where(first, cp_axis[1], dp_axis[1]))
    outer = (np.where(first, dp_axis[0], cp_axis[0]), np.where(first, dp_axis[1], cp_axis[1]))
    return [inner, outer]


def zero_shard_ranks(S: StrategyArrays) -> FloatArray:
    """Ranks the ZeRO / FSDP state shards over: dp_shard·cp under a partial sharding
    (``Strategy.dp_shard``), else the whole dp·cp group."""
    if S.dp_shard is None:
        out: FloatArray = S.dp * S.cp
        return out
    partial: FloatArray = np.where(S.dp_shard > 0, S.dp_shard, S.dp) * S.cp
    return partial


def zero_replicas(S: StrategyArrays) -> FloatArray:
    """Copies of the sharded ZeRO state (dp/dp_shard; 1 under full sharding)."""
    out: FloatArray = S.dp * S.cp / zero_shard_ranks(S)
    return out


def split_axes(axes: Axes, inner: FloatArray) -> tuple[Axes, Axes]:
    """A group's axes (inner first) split into its innermost ``inner`` members (consecutive in
    the nesting) and the rest (the copies of that inner group): each axis gives the inner group
    as many of its members as the group still needs, the rest keep the remainder of it."""
    head: Axes = []
    rest: Axes = []
    remaining = np.asarray(inner, dtype=float)
    for n, s in axes:
        take = np.clip(remaining, 1.0, np.maximum(n, 1.0))
        head.append((take, s))
        rest.append((np.maximum(n / take, 1.0), s * take))
        remaining = remaining / take
    return head, rest


def expert_axes(S: StrategyArrays) -> tuple[Axes, Axes]:
    """(EP group, expert-data-parallel group) as axes.  Megatron-Core orders the expert ranks of
    a stage as it orders tp·cp·dp — ETP innermost, then EP, then EDP (MoE parallel folding, Liu
    et al. 2025; ETP = TP by default, so EP is then the innermost ``ep`` members of the data
    axes): the tensor axis and the data axes, less their innermost ETP members, split into the
    innermost ``ep`` and the rest."""
    from cost_model.transformer.moe import expert_tensor_parallel

    etp = expert_tensor_parallel(S.tp, S.cp, S.dp, S.ep, S.etp_pin)
    rest = split_axes([(S.tp, strides(S)["tp"]), *data_axes(S)], etp)[1]
    return split_axes(rest, S.ep)


def shard_axes(S: StrategyArrays) -> tuple[Axes, Axes]:
    """(ZeRO shard group, its replica group) of a partially sharded data-parallel group
    (``Strategy.dp_shard``, HSDP): the shard group is the innermost dp_shard·cp members of the
    dp·cp axes, the replicas the rest; the whole group and a single replica without it."""
    return split_axes(data_axes(S), zero_shard_ranks(S))


def members_in(domain_gpus: ArrayOrFloat, axes: Axes) -> FloatArray:
    """How many of a group's members share one domain of ``domain_gpus`` GPUs, ranks filling the
    domains in order: per axis min(size, ⌊D/stride⌋), an outer axis counting only once the domain
    holds the whole span of the axes inside it."""
    if len(axes) == 1:
        return ranks_per_node(axes[0][0], axes[0][1], domain_gpus)
    d = np.asarray(domain_gpus, dtype=float)
    m = np.ones(np.broadcast(d, axes[0][0]).shape)
    covered = np.ones(m.shape, dtype=bool)
    for size, stride in axes:
        mi = np.minimum(size, np.maximum(1.0, np.floor(d / np.maximum(stride, 1.0))))
        m = m * np.where(covered, mi, 1.0)
        covered = covered & (d >= size * stride)
    return m


def group_size(axes: Axes) -> FloatArray:
    n = np.ones_like(np.asarray(axes[0][0], dtype=float))
    for size, _ in axes:
        n = n * size
    return n


def domains_spanned(domain_gpus: ArrayOrFloat, axes: Axes) -> FloatArray:
    """Number of domains of ``domain_gpus`` GPUs a group's members occupy."""
    return np.ceil(group_size(axes) / members_in(domain_gpus, axes) - 1e-9)


# ---- costs over the hierarchy --------------------------------------------------------------------


def hierarchical_collective_extra_s(links: Links, axes: Axes, size_bytes: ArrayOrFloat, volume_factor: float) -> FloatArray:
    """Seconds a ring collective over a group pays beyond its flat cost
    (:func:`cost_model.comm.allreduce_time_s`, volume factor 2; reduce-scatter / all-gather,
    1) because the group crosses slower levels.

    Derivation: price the collective hierarchically (intra-node first, then across nodes of one
    leaf, then across leaves of one pod, …; Jia et al. 2018, "Highly scalable deep learning
    training system with mixed-precision", §3.2 hierarchical all-reduce; NCCL's tree/ring per
    level).  With r of the group's ranks per node and k_j the number of level-j domains it spans
    (k_0 nodes, k_{K+1} = 1), the stage across level-j domains moves v·(k_j − k_{j+1})/k_0 · S
    bytes per node-rank group at bus bandwidth B_j = min(NVLink, r·β_j).  Summed over the levels
    with every β_j equal to the node's β these stages telescope to the flat ring's v·(1 − 1/k_0)·S
    over the network, so the flat cost already pays them at β; the extra is
    Σ_j v·(k_j − k_{j+1})/k_0 · S · (1/B_j − 1/B_node).  Zero without a topology or when the
    group stays inside one domain of every level."""
    gpus, shares = _levels(links)
    size = np.asarray(size_bytes, dtype=float)
    if not gpus:
        return np.zeros(np.broadcast(size, axes[0][0]).shape)
    r = members_in(links.gpus_per_node, axes)
    k0 = domains_spanned(links.gpus_per_node, axes)
    b_node = gbps_to_bytes_per_s(np.minimum(links.intra_GBps, r * links.inter_GBps))
    ks = [domains_spanned(g, axes) for g in gpus] + [np.ones_like(k0)]
    extra = np.zeros(np.broadcast(size, k0).shape)
    for j, share in enumerate(shares):
        b_j = gbps_to_bytes_per_s(np.minimum(links.intra_GBps, r * share))
        extra = extra + volume_factor * (ks[j] - ks[j + 1]) / k0 * size * (1.0 / b_j - 1.0 / b_node)
    return np.maximum(extra, 0.0)


def p2p_extra_s(links: Links, axes: Axes, size_bytes: ArrayOrFloat) -> FloatArray:
    """Seconds a point-to-point send between neighbours of a group (pipeline stages, the
    context-parallel ring) pays beyond the node-level send (:func:`cost_model.comm.p2p_time_s`):
    the group's neighbours cross the outermost level it spans, and the step waits for the
    slowest pair, so S·(1/β_j − 1/β_node) for that level j."""
    gpus, shares = _levels(links)
    size = np.asarray(size_bytes, dtype=float)
    if not gpus:
        return np.zeros(np.broadcast(size, axes[0][0]).shape)
    inv = np.zeros(np.broadcast(size, axes[0][0]).shape)
    node = gbps_to_bytes_per_s(links.inter_GBps)
    for g, share in zip(gpus, shares, strict=True):
        crosses = domains_spanned(g, axes) > 1
        inv = np.where(crosses, 1.0 / gbps_to_bytes_per_s(share) - 1.0 / node, inv)
    return size * inv


def alltoall_extra_s(links: Links, axes: Axes, size_bytes: ArrayOrFloat) -> FloatArray:
    """Seconds an all-to-all (each rank sends ``size_bytes`` in total, evenly over its peers)
    pays beyond the flat :func:`cost_model.comm.alltoall_time_s`.

    Bottleneck derivation: the share of peers outside a rank's level-j domain, (n − m_j)/n with
    m_j members per domain, must cross level j's uplinks at β_j, concurrently with the other
    levels' traffic, so the time is max_j((n − m_j)/n·S/β_j) against the flat model's
    max(remote/β_node, local/NVLink).  On a rail-optimised fabric the bytes for peers of another
    rail first take an NVLink hop (NCCL PXN), so the NVLink side carries local + remote bytes.
    Zero without a topology."""
    gpus, shares = _levels(links)
    size = np.asarray(size_bytes, dtype=float)
    n = group_size(axes)
    if not gpus:
        return np.zeros(np.broadcast(size, n).shape)
    safe = np.maximum(n, 1.0)
    r = np.minimum(members_in(links.gpus_per_node, axes), n)
    remote = np.maximum(0.0, (safe - r) / safe)
    local = np.maximum(0.0, (r - 1.0) / safe)
    flat = np.maximum(remote * size / gbps_to_bytes_per_s(links.inter_GBps), local * size / gbps_to_bytes_per_s(links.intra_GBps))
    worst = flat
    rail = isinstance(links, HierLinks) and links.rail_optimized
    if rail:
        worst = np.maximum(worst, (local + remote) * size / gbps_to_bytes_per_s(links.intra_GBps))
    for g, share in zip(gpus, shares, strict=True):
        out_frac = np.maximum(0.0, (safe - np.minimum(members_in(g, axes), safe)) / safe)
        worst = np.maximum(worst, out_frac * size / gbps_to_bytes_per_s(share))
    return np.where(n > 1, worst - flat, 0.0)


# ---- what crosses which boundary -----------------------------------------------------------------


def dimension_axes(S: StrategyArrays, dim: str) -> Axes:
    """The axes of one dimension's groups: tp, cp, pp (one axis each), dp (the gradient group
    over dp·cp), ep (the expert all-to-all group)."""
    st = strides(S)
    if dim == "dp":
        return data_axes(S)
    if dim == "ep":
        return expert_axes(S)[0]
    size = {"tp": S.tp, "cp": S.cp, "pp": S.pp}[dim]
    return [(size, st[dim])]


def crossings(S: StrategyArrays, i: int, gpus_per_node: int, level_gpus: Sequence[tuple[str, int]]) -> list[dict[str, Any]]:
    """For candidate i, per boundary (the node, then each level): the dimensions whose groups
    span more than one domain of it (by the nominal domain sizes the cost model uses)."""
    Si = S.take(np.array([i]))
    st = strides(Si)
    axes = {"tp": [(Si.tp, st["tp"])], "cp": [(Si.cp, st["cp"])], "ep": expert_axes(Si)[0], "pp": [(Si.pp, st["pp"])], "dp": [(Si.dp, st["dp"])]}
    dims = [d for d in ("tp", "cp", "ep", "pp", "dp") if float(group_size(axes[d])[0]) > 1]
    out: list[dict[str, Any]] = []
    for name, g in [("node", gpus_per_node), *level_gpus]:
        crossed = [d for d in dims if float(domains_spanned(g, axes[d])[0]) > 1]
        out.append({"boundary": name, "domain_gpus": g, "crossed_by": crossed})
    return out


def pp_stride(strategy: Any) -> int:
    """GPU stride between neighbouring pipeline stages of one strategy (dp·cp·tp in Megatron's
    order: stages are outermost)."""
    nesting = strategy.nesting or MEGATRON_NESTING
    size = {"tp": strategy.tp, "cp": strategy.cp, "dp": strategy.dp, "pp": strategy.pp}
    out = 1
    for d in nesting[: nesting.index("pp")]:
        out *= size[d]
    return out


def pp_crosses_node(strategy: Any, gpus_per_node: int) -> bool:
    """Whether neighbouring stages sit on different nodes: a stride of at least a node, or a
    pipeline that does not fit in one node."""
    s = pp_stride(strategy)
    return s >= gpus_per_node or s * strategy.pp > gpus_per_node
