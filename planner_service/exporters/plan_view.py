"""A validated, read-only view of a stored plan for the exporters.

The exporters are pure functions over the plan JSON (``GET /v1/plans/{id}``).  This module
turns that dict into one internal :class:`Placement` — global rank → (host, local GPU) — and
the per-stage layer split, and every exporter derives its launcher flags from it
(docs/integration.md §7.1).

Node order.  A launcher numbers nodes; we number them in the order of the *first* (lowest)
plan rank on each host, so the host of rank 0 is node 0 and the rendezvous master.  A launcher
then gives the processes of node ``k`` the ranks ``base_k .. base_k + n_k - 1`` (torchrun's
static rendezvous, ``paddle.distributed.launch --rank``, DeepSpeed's hostfile order), where
``base_k`` is the number of processes on nodes ``0..k-1``.  When the plan's ranks on a host are
exactly that block (the usual case), local rank ``i`` gets plan rank ``base_k + i`` and the
only thing left to pin is the GPU: ``CUDA_VISIBLE_DEVICES`` lists the host's plan GPUs in
rank order.  When they are not (a planner that puts pipeline neighbours on one host gives a
host the ranks 0-3 and 8-11), :attr:`Placement.needs_remap` is true and the launch artifacts
add a per-process wrapper (``plan_rank.sh``) that sets ``RANK`` from (host, local rank).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cost_model.errors import InvalidInput, PlannerError
from cost_model.frameworks import interleaved_microbatch_group
from cost_model.strategy import even_split, rank_coords
from cost_model.training import pipeline_schedules_at
from cost_model.transformer.spec import TransformerSpec, from_hf_config, get_preset


class InvalidPlan(InvalidInput):
    """The plan dict handed to an exporter lacks what it needs (HTTP 422, CLI exit 2)."""

    code = "invalid_plan"


@dataclass(frozen=True)
class RankSlot:
    rank: int
    host: str
    gpu: int
    node_group: str
    device: str
    stage: int
    dp: int
    pp: int
    tp: int
    cp: int


@dataclass(frozen=True)
class NodeSlot:
    """One host as a launcher sees it: local rank ``i`` runs plan rank ``ranks[i]`` on GPU ``gpus[i]``."""

    node_rank: int
    host: str
    node_group: str
    device: str
    ranks: tuple[int, ...]
    gpus: tuple[int, ...]
    base_rank: int  # the launcher's first global rank on this node

    @property
    def nproc(self) -> int:
        return len(self.ranks)

    @property
    def contiguous(self) -> bool:
        return self.ranks == tuple(range(self.base_rank, self.base_rank + len(self.ranks)))

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(str(g) for g in self.gpus)


@dataclass(frozen=True)
class GroupInfo:
    """What the exporters use of a cluster node group."""

    name: str
    device: str
    gpus_per_node: int
    nccl_socket_ifname: str | None = None
    nccl_ib_hca: str | None = None
    gpu_product: str | None = None  # GFD ``nvidia.com/gpu.product`` value, when the cluster has it


@dataclass(frozen=True)
class Placement:
    ranks: tuple[RankSlot, ...]
    nodes: tuple[NodeSlot, ...]

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def needs_remap(self) -> bool:
        return not all(n.contiguous for n in self.nodes)

    @property
    def master(self) -> NodeSlot:
        return self.nodes[0]

    def node(self, host: str) -> NodeSlot:
        for n in self.nodes:
            if n.host == host:
                return n
        raise KeyError(host)


@dataclass(frozen=True)
class PlanView:
    plan_id: str
    model_name: str
    model_spec: Mapping[str, Any] | None
    training: Mapping[str, Any]
    strategy: Mapping[str, Any]
    placement: Placement
    groups: Mapping[str, GroupInfo]
    node_info: Mapping[str, Mapping[str, Any]]  # hostname → cluster.nodes entry
    stage_layers: tuple[int, ...] | None  # decoder layers per physical stage (len pp)
    virtual_layers: tuple[int, ...] | None  # decoder layers per model chunk (len pp·vpp), model order
    graph_model: bool = False  # an operator-graph / ONNX model: stages hold ops, not decoder layers
    transformer: TransformerSpec | None = None  # the model as cost_model read it (None: no shape)

    # convenience accessors ---------------------------------------------------------------
    def s(self, key: str, default: Any = None) -> Any:
        value = self.strategy.get(key, default)
        return default if value is None else value

    @property
    def dp(self) -> int:
        return int(self.s("dp", 1))

    @property
    def dp_shard(self) -> int:
        """The data-parallel ranks the ZeRO state shards over (HSDP: fewer than dp; dp itself
        under full sharding)."""
        return int(self.s("dp_shard", 0)) or self.dp

    @property
    def dp_replicas(self) -> int:
        """Copies of the sharded state (dp/dp_shard; 1 under full sharding)."""
        return self.dp // self.dp_shard

    @property
    def tp(self) -> int:
        return int(self.s("tp", 1))

    @property
    def pp(self) -> int:
        return int(self.s("pp", 1))

    @property
    def pipeline_schedules(self) -> int:
        """Pipeline schedules a step (the cost model's rule, ``training.pipeline_schedules_at``):
        ``training.pipeline_schedules_per_step`` with a pipeline, else 1."""
        return int(pipeline_schedules_at(int(self.training.get("pipeline_schedules_per_step") or 1), self.pp))

    @property
    def cp(self) -> int:
        return int(self.s("cp", 1))

    @property
    def ep(self) -> int:
        return int(self.s("ep", 1))

    @property
    def vpp(self) -> int:
        return int(self.s("vpp", 1))

    @property
    def micro_batch_size(self) -> int:
        return int(self.s("micro_batch_size", 1))

    @property
    def global_batch_size(self) -> int:
        return int(self.training.get("global_batch_size") or self.micro_batch_size * self.dp)

    @property
    def num_microbatches(self) -> int:
        return max(1, self.global_batch_size // (self.micro_batch_size * self.dp))

    @property
    def microbatch_group(self) -> int:
        """The interleaved schedule's micro-batch group per virtual stage the plan was costed with
        (:func:`cost_model.frameworks.interleaved_microbatch_group`; pp by default)."""
        return interleaved_microbatch_group(str(self.training.get("framework", "megatron-core")), num_microbatches=self.num_microbatches,
                                            pp=self.pp, group=int(self.training.get("microbatch_group_size_per_vp_stage") or 0))

    @property
    def total_layers(self) -> int | None:
        return sum(self.stage_layers) if self.stage_layers else None

    @property
    def device_types(self) -> tuple[str, ...]:
        seen: list[str] = []
        for n in self.placement.nodes:
            if n.device not in seen:
                seen.append(n.device)
        return tuple(seen)

    @property
    def mixed(self) -> bool:
        return len(self.device_types) > 1

    def require_layers(self, target: str) -> tuple[int, ...]:
        if self.graph_model:
            raise InvalidPlan(
                f"target {target} configures a transformer framework, but this plan is for an operator-graph model; "
                "use a launcher or scheduler target (torchrun, slurm, ...) or rankmap",
                field="target",
            )
        if not self.virtual_layers:
            raise InvalidPlan(
                f"target {target} needs the layer split: the plan has no best.strategy.layers_per_stage, "
                "best.stages[].num_layers or model.spec.num_hidden_layers",
                field="plan.best.strategy.layers_per_stage",
            )
        return self.virtual_layers

    def group_of(self, node: NodeSlot) -> GroupInfo:
        return self.groups.get(node.node_group) or GroupInfo(node.node_group, node.device, node.nproc)


def _int(value: Any, field_path: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidPlan(f"must be an integer >= {minimum}, got {value!r}", field=field_path)
    return value


def _mapping(value: Any, field_path: str) -> Mapping[str, Any]:
    if type(value) is dict:  # the JSON case, without the ABC check (runs once per rank)
        return value
    if not isinstance(value, Mapping):
        raise InvalidPlan("must be an object", field=field_path)
    return value


def _layers(spec: Mapping[str, Any] | None, best: Mapping[str, Any], strategy: Mapping[str, Any], pp: int, vpp: int) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
    """Decoder layers per physical stage and per model chunk (virtual stage), model order.

    ``layers_per_stage`` may list ``pp`` physical stages or ``pp·vpp`` model chunks (chunk ``k``
    runs on pipeline rank ``k mod pp``, Megatron's interleaved order).  With ``pp`` entries and
    ``vpp > 1`` a stage's layers are split evenly over its chunks.  Without it the stages'
    ``num_layers`` are used, and without those the model's layer count is split evenly.
    """
    lps = strategy.get("layers_per_stage")
    if lps is None:
        stages = best.get("stages")
        if isinstance(stages, list) and stages and all(isinstance(s, Mapping) and "num_layers" in s for s in stages):
            ordered = sorted(stages, key=lambda s: s.get("index", 0))
            lps = [s["num_layers"] for s in ordered]
    if lps is None:
        total = None
        if isinstance(spec, Mapping):
            total = spec.get("num_hidden_layers", spec.get("n_layer"))
        if not isinstance(total, int) or total < 1:
            return None, None
        chunks = even_split(total, pp * vpp)
        physical = [sum(chunks[k] for k in range(p, pp * vpp, pp)) for p in range(pp)]
        return tuple(physical), tuple(chunks)
    if not isinstance(lps, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in lps):
        raise InvalidPlan("must be a list of non-negative integers", field="plan.best.strategy.layers_per_stage")
    if len(lps) == pp * vpp and vpp > 1:
        chunks = list(lps)
        physical = [sum(chunks[k] for k in range(p, pp * vpp, pp)) for p in range(pp)]
    elif len(lps) == pp:
        physical = list(lps)
        per_stage = [even_split(n, vpp) for n in physical]
        chunks = [per_stage[k % pp][k // pp] for k in range(pp * vpp)]
    else:
        raise InvalidPlan(
            f"has {len(lps)} entries; expected pp={pp}" + (f" or pp*vpp={pp * vpp}" if vpp > 1 else ""),
            field="plan.best.strategy.layers_per_stage",
        )
    if sum(physical) < 1:
        raise InvalidPlan("must hold at least one layer", field="plan.best.strategy.layers_per_stage")
    return tuple(physical), tuple(chunks)


def _transformer(model: Mapping[str, Any]) -> TransformerSpec | None:
    """The plan's model as a :class:`TransformerSpec`: the request's ``{"transformer": ...}`` or
    ``{"preset": ...}``, or HF config keys in ``model.spec``; None for graph models or no shape."""
    spec = model.get("spec")
    if not isinstance(spec, Mapping) or "graph" in spec or "model_id" in spec:
        return None
    try:
        if isinstance(spec.get("transformer"), Mapping):
            return from_hf_config(spec["transformer"])
        if isinstance(spec.get("preset"), str):
            return get_preset(spec["preset"])
        if any(k in spec for k in ("num_hidden_layers", "n_layer")):
            return from_hf_config(spec)
    except PlannerError:
        return None
    return None


def _model_spec(model: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """HF-style keys of the plan's model.  ``model.spec`` may already hold them, or be the
    request's model (``{"transformer": {...}}`` / ``{"preset": name}``; GPT-2 names too), which
    cost_model normalises; a graph model has no layer shape."""
    spec = model.get("spec")
    if not isinstance(spec, Mapping):
        return None
    try:
        if isinstance(spec.get("transformer"), Mapping):
            return from_hf_config(spec["transformer"]).to_dict()
        if isinstance(spec.get("preset"), str):
            return get_preset(spec["preset"]).to_dict()
    except PlannerError:
        return None
    if "graph" in spec or "model_id" in spec:
        return None
    if "num_hidden_layers" not in spec and "n_layer" in spec:
        try:
            return from_hf_config(spec).to_dict()
        except PlannerError:
            return None
    return spec


def _cluster_info(plan: Mapping[str, Any]) -> tuple[dict[str, GroupInfo], dict[str, str], dict[str, Mapping[str, Any]]]:
    """The plan's node groups, the group of each host, and each node's entry, by hostname."""
    cluster = plan.get("cluster") if isinstance(plan.get("cluster"), Mapping) else {}
    groups: dict[str, GroupInfo] = {}
    host_group: dict[str, str] = {}
    for i, g in enumerate(cluster.get("node_groups") or []):
        if not isinstance(g, Mapping) or not isinstance(g.get("name"), str):
            raise InvalidPlan("must be an object with a name", field=f"plan.cluster.node_groups[{i}]")
        device = g.get("device")
        device_name = device if isinstance(device, str) else (device.get("name") if isinstance(device, Mapping) else "gpu")
        groups[g["name"]] = GroupInfo(
            name=g["name"],
            device=str(device_name),
            gpus_per_node=int(g.get("gpus_per_node") or 0),
            nccl_socket_ifname=g.get("nccl_socket_ifname") or None,
            nccl_ib_hca=g.get("nccl_ib_hca") or None,
            gpu_product=g.get("gpu_product") or None,
        )
        for h in g.get("hostnames") or []:
            host_group[h] = g["name"]
    node_info: dict[str, Mapping[str, Any]] = {}
    for n in cluster.get("nodes") or []:
        if isinstance(n, Mapping) and isinstance(n.get("hostname"), str):
            node_info[n["hostname"]] = n
            if isinstance(n.get("group"), str):
                host_group.setdefault(n["hostname"], n["group"])
    return groups, host_group, node_info


def _rank_slots(ranks_in: list[Any], world: int, dp: int, cp: int, tp: int, groups: Mapping[str, GroupInfo],
                host_group: Mapping[str, str]) -> tuple[RankSlot, ...]:
    """Every rank's slot, checked: on the world, once each, one rank per GPU, coordinates in
    Megatron order (:func:`cost_model.strategy.rank_coords`)."""
    slots: dict[int, RankSlot] = {}
    used: dict[tuple[str, int], int] = {}
    valid_hosts: set[str] = set()
    for i, r in enumerate(ranks_in):
        path = f"plan.best.ranks[{i}]"
        r = _mapping(r, path)
        rank = _int(r.get("rank"), f"{path}.rank")
        if rank >= world:
            raise InvalidPlan(f"rank {rank} is outside 0..{world - 1}", field=f"{path}.rank")
        if rank in slots:
            raise InvalidPlan(f"rank {rank} appears twice", field=f"{path}.rank")
        host = r.get("host")
        if not isinstance(host, str) or host not in valid_hosts:
            if not isinstance(host, str) or not host or not re.fullmatch(r"[A-Za-z0-9._-]+", host):
                raise InvalidPlan(f"must be a hostname (letters, digits, '.', '_', '-'), got {host!r}", field=f"{path}.host")
            valid_hosts.add(host)
        gpu = _int(r.get("gpu"), f"{path}.gpu")
        if (host, gpu) in used:
            raise InvalidPlan(f"GPU {gpu} of {host} already holds rank {used[(host, gpu)]}", field=f"{path}.gpu")
        used[(host, gpu)] = rank
        pp_i, dp_i, cp_i, tp_i = rank_coords(rank, dp=dp, cp=cp, tp=tp)
        for axis, expected in (("tp", tp_i), ("cp", cp_i), ("dp", dp_i), ("pp", pp_i)):
            given = r.get(axis)
            if given is not None and given != expected:
                raise InvalidPlan(
                    f"rank {rank} has {axis}={given!r} but Megatron order (tp fastest, then cp, dp, pp) gives {expected}",
                    field=f"{path}.{axis}",
                )
        stage = r.get("stage", pp_i)
        if stage != pp_i:
            raise InvalidPlan(f"rank {rank} is in stage {stage!r} but its pp coordinate is {pp_i}", field=f"{path}.stage")
        group = r.get("node_group") or host_group.get(host) or "default"
        device = r.get("device") or (groups[group].device if group in groups else "gpu")
        slots[rank] = RankSlot(rank, host, gpu, str(group), str(device), pp_i, dp_i, pp_i, tp_i, cp_i)
    return tuple(slots[k] for k in range(world))


def _node_slots(ranks: tuple[RankSlot, ...]) -> tuple[NodeSlot, ...]:
    """Hosts in the order of their first rank, each with its ranks and GPUs (one device type)."""
    order: list[str] = []
    by_host: dict[str, list[RankSlot]] = {}
    for s in ranks:
        if s.host not in by_host:
            order.append(s.host)
            by_host[s.host] = []
        by_host[s.host].append(s)
    nodes: list[NodeSlot] = []
    base = 0
    for k, host in enumerate(order):
        slots_h = by_host[host]
        devices = {s.device for s in slots_h}
        if len(devices) > 1:
            raise InvalidPlan(f"host {host} holds ranks on different device types {sorted(devices)}", field="plan.best.ranks")
        nodes.append(
            NodeSlot(
                node_rank=k,
                host=host,
                node_group=slots_h[0].node_group,
                device=slots_h[0].device,
                ranks=tuple(s.rank for s in slots_h),
                gpus=tuple(s.gpu for s in slots_h),
                base_rank=base,
            )
        )
        base += len(slots_h)
    return tuple(nodes)


def plan_view(plan: Mapping[str, Any]) -> PlanView:
    """Validate the parts of a plan dict the exporters use; errors name the field."""
    plan = _mapping(plan, "plan")
    best = _mapping(plan.get("best"), "plan.best")
    strategy = _mapping(best.get("strategy"), "plan.best.strategy")
    sizes = {}
    for key in ("dp", "tp", "pp", "cp", "ep", "vpp", "micro_batch_size"):
        sizes[key] = _int(strategy.get(key, 1) if strategy.get(key) is not None else 1, f"plan.best.strategy.{key}", 1)
    dp, tp, pp, cp, vpp = sizes["dp"], sizes["tp"], sizes["pp"], sizes["cp"], sizes["vpp"]
    world = dp * tp * pp * cp
    ranks_in = best.get("ranks")
    if not isinstance(ranks_in, list) or not ranks_in:
        raise InvalidPlan("must be a non-empty list of {rank, host, gpu, ...}", field="plan.best.ranks")
    if len(ranks_in) != world:
        raise InvalidPlan(
            f"has {len(ranks_in)} entries but dp*tp*pp*cp = {dp}*{tp}*{pp}*{cp} = {world}", field="plan.best.ranks"
        )

    groups, host_group, node_info = _cluster_info(plan)
    ranks = _rank_slots(ranks_in, world, dp, cp, tp, groups, host_group)
    nodes = _node_slots(ranks)

    model = plan.get("model") if isinstance(plan.get("model"), Mapping) else {}
    spec = _model_spec(model)
    physical, chunks = _layers(spec, best, strategy, pp, vpp)
    training = plan.get("training") if isinstance(plan.get("training"), Mapping) else {}
    plan_id = plan.get("id")
    return PlanView(
        plan_id=str(plan_id) if plan_id else "plan",
        model_name=str(model.get("name") or "model"),
        model_spec=spec,
        training=training,
        strategy={**strategy, **sizes},
        placement=Placement(ranks=ranks, nodes=nodes),
        groups=groups,
        node_info=node_info,
        stage_layers=physical,
        virtual_layers=chunks,
        graph_model=isinstance(model.get("spec"), Mapping) and ("graph" in model["spec"] or "model_id" in model["spec"]),
        transformer=_transformer(model),
    )
