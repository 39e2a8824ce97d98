"""Communication primitives: alpha–beta model of ring collectives over the cluster topology.

For n ranks moving S bytes at bus bandwidth β per rank (NCCL's performance notes):

* all-reduce        2·(n−1)/n · S/β + 2·(n−1)·α
* all-gather        (n−1)/n · S/β + (n−1)·α          (S = the gathered size)
* reduce-scatter    (n−1)/n · S/β + (n−1)·α          (S = the input size)
* all-to-all        (n−1)/n · S/β + (n−1)·α          (S = bytes each rank sends in total)
* send/recv         S/β + α

Across nodes (``r`` of the group's ranks on each node) the ring runs one channel per NIC, so β
is the slower of NVLink and the r NICs the group owns on a node (NCCL's bus bandwidth on
DGX-class nodes).  β is the link figure times the device family's achieved fraction, times
the fabric's fraction relative to InfiniBand (``fabric_fraction`` of
``cost_model.transformer.calibration``: RoCE, Omni-Path).

Message size: a ring moves S/n bytes per step, and NCCL reaches its bus bandwidth only once a
step's chunk amortises the per-step protocol cost, so β(S) = β·c/(c + c½) with c = S/n and the
half-bandwidth chunk c½ of the link (:data:`HALF_CHUNK_NVLINK_BYTES`,
:data:`HALF_CHUNK_NETWORK_BYTES`; readings of nccl-tests bus-bandwidth curves, where NVLink
rings of 8 GPUs reach half their peak near 1 MB total and InfiniBand rings of 16–64 ranks near
8–32 MB).  All functions broadcast over numpy arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import numpy.typing as npt

from cost_model.units import gbps_to_bytes_per_s

if TYPE_CHECKING:
    from cost_model.cluster import NodeGroup

#: Seconds (or bytes) per candidate strategy.
FloatArray: TypeAlias = npt.NDArray[np.float64]
#: A scalar or an array of candidates (every function here broadcasts).
ArrayOrFloat: TypeAlias = float | np.floating[Any] | np.integer[Any] | npt.NDArray[Any]

HALF_CHUNK_NVLINK_BYTES = 128e3
HALF_CHUNK_NETWORK_BYTES = 512e3

#: Inter-node fabrics a node group can name (``cluster.node_groups[].fabric``).
FABRICS = ("infiniband", "roce", "omnipath")


@dataclass(frozen=True)
class Links:
    """What one GPU sees of the network: achieved per-direction bandwidths and latency."""

    intra_GBps: float  # NVLink (or PCIe) per GPU, achieved
    inter_GBps: float  # this GPU's share of the node NICs, achieved
    gpus_per_node: int
    alpha_s: float
    half_chunk_intra_bytes: float = 0.0  # 0: bandwidth independent of message size
    half_chunk_inter_bytes: float = 0.0

    @staticmethod
    def for_group(group: NodeGroup) -> Links:
        """From a :class:`cost_model.cluster.NodeGroup` (its fabric's fraction applied; the
        message-size dependence on GPUs, whose NCCL rings have it — CPU collectives are costed
        from a profile's measured figures)."""
        from cost_model.transformer.calibration import current

        eff = group.device.efficiency
        gpu = group.device.kind == "gpu"
        return Links(
            intra_GBps=group.intra_node_bandwidth_GBps * eff.nvlink_fraction,
            inter_GBps=group.nic_per_gpu_GBps * eff.nic_fraction * current().fabric_fraction(getattr(group, "fabric", "infiniband")),
            gpus_per_node=group.gpus_per_node,
            alpha_s=eff.collective_latency_s,
            half_chunk_intra_bytes=HALF_CHUNK_NVLINK_BYTES if gpu else 0.0,
            half_chunk_inter_bytes=HALF_CHUNK_NETWORK_BYTES if gpu else 0.0,
        )

    def slowest(self, other: Links) -> Links:
        return Links(
            min(self.intra_GBps, other.intra_GBps),
            min(self.inter_GBps, other.inter_GBps),
            min(self.gpus_per_node, other.gpus_per_node),
            max(self.alpha_s, other.alpha_s),
            max(self.half_chunk_intra_bytes, other.half_chunk_intra_bytes),
            max(self.half_chunk_inter_bytes, other.half_chunk_inter_bytes),
        )


def _f(x: ArrayOrFloat) -> FloatArray:
    return np.asarray(x, dtype=float)


def ranks_per_node(n: ArrayOrFloat, stride: ArrayOrFloat, gpus_per_node: ArrayOrFloat) -> FloatArray:
    """How many of a group's ``n`` ranks share a node when consecutive members are ``stride``
    global ranks apart and ranks fill nodes in order."""
    n = _f(n)
    stride = _f(stride)
    per_node = np.maximum(1.0, np.floor(gpus_per_node / np.maximum(stride, 1.0)))
    return np.minimum(n, per_node)


def _ring_beta(r: FloatArray, nodes: FloatArray, links: Links) -> FloatArray:
    """Bus bandwidth of a ring over ``nodes`` nodes with ``r`` of the group's ranks on each: on
    one node NVLink; across nodes NCCL runs one channel per NIC, so the ring moves at the
    slower of NVLink and the ``r`` NICs the group's ranks own on a node (DGX A100: 8 × 25 GB/s
    = 200 GB/s bus bandwidth for a full-node group, 25 GB/s when one rank per node)."""
    return np.where(nodes > 1, np.minimum(links.intra_GBps, r * links.inter_GBps), links.intra_GBps)


def size_factor(chunk_bytes: ArrayOrFloat, half_chunk_bytes: ArrayOrFloat) -> FloatArray:
    """β(S)/β = c/(c + c½) for a ring step of ``chunk_bytes`` (module docstring); 1 when the
    link has no size dependence (c½ = 0)."""
    c = np.maximum(_f(chunk_bytes), 1.0)
    return c / (c + half_chunk_bytes)


def _ring_time(
    n: ArrayOrFloat, size_bytes: ArrayOrFloat, links: Links, per_node: ArrayOrFloat, volume_factor: float, flat: bool = False
) -> FloatArray:
    n = _f(n)
    safe = np.maximum(n, 1.0)
    r = np.maximum(np.minimum(_f(per_node), safe), 1.0)
    nodes = np.maximum(1.0, np.ceil(safe / r))
    beta = _ring_beta(r, nodes, links)
    half = np.where(nodes > 1, links.half_chunk_inter_bytes, links.half_chunk_intra_bytes)
    beta = beta * size_factor(_f(size_bytes) / safe, half)
    steps = (safe - 1.0) if flat else (r - 1.0) + (nodes - 1.0)
    t = volume_factor * (safe - 1.0) / safe * _f(size_bytes) / gbps_to_bytes_per_s(beta) + volume_factor * steps * links.alpha_s
    return np.where(n > 1, t, 0.0)


def allreduce_time_s(n: ArrayOrFloat, size_bytes: ArrayOrFloat, links: Links, per_node: ArrayOrFloat) -> FloatArray:
    """Ring all-reduce of ``size_bytes`` over ``n`` ranks, ``per_node`` of them on each node:
    2·(n−1)/n·S/β + 2·steps·α with β from :func:`_ring_beta` and steps = (r−1) + (nodes−1)
    (NCCL's hierarchical latency)."""
    return _ring_time(n, size_bytes, links, per_node, 2.0)


def reduce_scatter_time_s(n: ArrayOrFloat, size_bytes: ArrayOrFloat, links: Links, per_node: ArrayOrFloat, flat: bool = False) -> FloatArray:
    """Ring reduce-scatter (input ``size_bytes`` per rank); all-gather costs the same.
    ``flat``: one ring over all n ranks, n−1 latency steps (NCCL runs all-gather and
    reduce-scatter only as rings, so a group spanning many nodes pays every hop); otherwise the
    hierarchical (r−1) + (nodes−1) steps."""
    return _ring_time(n, size_bytes, links, per_node, 1.0, flat)


allgather_time_s = reduce_scatter_time_s


def alltoall_time_s(n: ArrayOrFloat, size_bytes: ArrayOrFloat, links: Links, per_node: ArrayOrFloat) -> FloatArray:
    """All-to-all where each rank sends ``size_bytes`` in total, split evenly over peers.  The
    share bound for peers on other nodes crosses the NIC; the rest stays on NVLink; both run
    concurrently, so the slower side bounds the time."""
    n = _f(n)
    safe = np.maximum(n, 1.0)
    r = np.minimum(_f(per_node), n)
    remote_frac = np.maximum(0.0, (safe - r) / safe)
    local_frac = np.maximum(0.0, (r - 1.0) / safe)
    t_remote = remote_frac * _f(size_bytes) / gbps_to_bytes_per_s(links.inter_GBps)
    t_local = local_frac * _f(size_bytes) / gbps_to_bytes_per_s(links.intra_GBps)
    t = np.maximum(t_remote, t_local) + (safe - 1.0) * links.alpha_s
    return np.where(n > 1, t, 0.0)


def p2p_time_s(size_bytes: ArrayOrFloat, links: Links, cross_node: ArrayOrFloat | bool) -> FloatArray:
    """Point-to-point send of ``size_bytes`` (pipeline activations): NIC share when the
    neighbour is on another node, NVLink otherwise."""
    beta: FloatArray = np.where(cross_node, links.inter_GBps, links.intra_GBps)
    t: FloatArray = _f(size_bytes) / gbps_to_bytes_per_s(beta) + links.alpha_s
    return t
