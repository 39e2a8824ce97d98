"""The device mesh an operator graph runs on: the node group, the parallel sizes (``dp × t``
GPUs per stage, ``pp`` stages) and micro-batching, and the cluster's CPU nodes used as
embedding parameter servers."""

from __future__ import annotations

from dataclasses import dataclass

from cost_model.cluster import Cluster, NodeGroup
from cost_model.comm import Links
from cost_model.devices import DeviceSpec
from cost_model.errors import InvalidStrategy
from cost_model.schedule import inflight_microbatches
from cost_model.training import Training
from cost_model.transformer.layer_cost import WORKSPACE_BYTES
from cost_model.transformer.stage_cost import gradient_bucket_bytes
from cost_model.units import gbps_to_bytes_per_s


@dataclass(frozen=True, kw_only=True)
class CpuPool:
    """The cluster's CPU nodes used as parameter servers, in aggregate."""

    groups: tuple[str, ...]
    device: DeviceSpec
    nodes: int
    memory_bytes: float
    memory_bandwidth_bytes_per_s: float  # achieved, all nodes
    nic_bytes_per_s: float  # achieved, all nodes
    hostnames: tuple[str, ...] = ()

    @staticmethod
    def from_cluster(cluster: Cluster) -> CpuPool | None:
        """The available CPU node groups of ``cluster`` pooled, or None when it has none."""
        groups = [g for g in cluster.node_groups if g.device.kind == "cpu" and cluster.available_nodes(g.name)]
        if not groups:
            return None
        nodes = mem = bw = nic = 0.0
        hosts: list[str] = []
        for g in groups:
            n = len(cluster.available_nodes(g.name))
            eff = g.device.efficiency
            nodes += n
            mem += n * g.gpus_per_node * g.device.memory_bytes
            bw += gbps_to_bytes_per_s(n * g.gpus_per_node * g.device.memory_bandwidth_GBps) * eff.memory_fraction
            nic += gbps_to_bytes_per_s(n * g.inter_node_bandwidth_GBps) * eff.nic_fraction
            hosts += [h.hostname for h in cluster.available_nodes(g.name)]
        return CpuPool(groups=tuple(g.name for g in groups), device=groups[0].device, nodes=int(nodes), memory_bytes=mem,
                       memory_bandwidth_bytes_per_s=bw, nic_bytes_per_s=nic, hostnames=tuple(hosts))


@dataclass(frozen=True)
class GraphMesh:
    """One candidate layout: the node group the stages run on and the parallel sizes.

    Positional as well as keyword construction (the planner enumerates thousands of them)."""

    group: NodeGroup
    t: int
    dp: int
    pp: int
    micro_batch: int
    num_microbatches: int
    zero_stage: int = 1
    cpu: CpuPool | None = None

    @property
    def links(self) -> Links:
        return Links.for_group(self.group)

    @property
    def device(self) -> DeviceSpec:
        return self.group.device

    @property
    def devices_per_stage(self) -> int:
        return self.dp * self.t

    @property
    def num_devices(self) -> int:
        return self.dp * self.t * self.pp


def inflight(mesh: GraphMesh, k: int) -> int:
    """Micro-batches whose activations stage ``k`` holds at once under 1F1B (no interleaving):
    ``min(pp − k, m)``, :func:`cost_model.schedule.inflight_microbatches`."""
    return int(inflight_microbatches(k, mesh.pp, mesh.num_microbatches))


def gpu_groups(cluster: Cluster) -> list[NodeGroup]:
    """The node groups of ``cluster`` with accelerators available."""
    return [g for g in cluster.node_groups if g.device.kind != "cpu" and cluster.available_nodes(g.name)]


def pick_group(cluster: Cluster, devices: int, dtype: str, name: str | None = None) -> NodeGroup:
    """The node group named ``name``, or else the fastest (peak FLOP/s in ``dtype``, then memory)
    of those with ``devices`` GPUs available (of all GPU groups when none has)."""
    groups = gpu_groups(cluster)
    if name is not None:
        for g in groups:
            if g.name == name:
                return g
        raise InvalidStrategy(f"node group {name!r} has no available GPUs", field="strategy.node_group")
    if not groups:
        raise InvalidStrategy("the cluster has no available GPU node group", field="cluster.node_groups")
    fitting = [g for g in groups if cluster.available_gpus(g.name) >= devices]
    pool = fitting or groups
    return max(pool, key=lambda g: (g.device.peak_tflops(dtype) if dtype in g.device.supported_dtypes() else 0.0, g.device.memory_GB))


def mesh_for(training: Training, cluster: Cluster, dp: int, t: int, pp: int, micro_batch: int,
             zero_stage: int = 1, group: NodeGroup | None = None, use_cpu: bool = True) -> GraphMesh:
    """The mesh of ``dp × t × pp`` GPUs of ``group`` (default: :func:`pick_group`) with
    ``micro_batch`` samples per micro-batch; raises :class:`InvalidStrategy` when the global
    batch does not divide into ``dp`` replicas of whole micro-batches."""
    if training.global_batch_size % (dp * micro_batch):
        raise InvalidStrategy(
            f"global_batch_size {training.global_batch_size} is not divisible by dp·micro_batch_size = {dp}·{micro_batch}",
            field="strategy.micro_batch_size",
        )
    g = group or pick_group(cluster, dp * t * pp, training.dtype)
    m = training.global_batch_size // (dp * micro_batch)
    return GraphMesh(g, t, dp, pp, micro_batch, m, zero_stage, CpuPool.from_cluster(cluster) if use_cpu else None)


def fixed_bytes(training: Training, mesh: GraphMesh) -> float:
    """Bytes every GPU of ``mesh`` holds beside its operators' model state and activations,
    none of which fragments: the CUDA context, cuBLAS and NCCL reserve
    (:data:`cost_model.transformer.layer_cost.WORKSPACE_BYTES`) and DeepSpeed's gradient buckets
    (:func:`cost_model.transformer.stage_cost.gradient_bucket_bytes`, as for transformer
    stages).  Every memory check of the operator-graph family adds these, so the solvers and
    :func:`cost_model.graph.evaluate.evaluate` agree."""
    return WORKSPACE_BYTES + bucket_bytes(training, mesh)


def bucket_bytes(training: Training, mesh: GraphMesh) -> float:
    """DeepSpeed's gradient buckets on a GPU of ``mesh`` (0 for other frameworks)."""
    return float(gradient_bucket_bytes(training, mesh.zero_stage, mesh.pp))

