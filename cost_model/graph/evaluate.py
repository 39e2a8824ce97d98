"""Cost of an operator graph under a per-operator sharding and a pipeline split.

Parallel layout (Alpa-style, Zheng et al. 2022, with the data-parallel axis fixed):

* ``pp`` pipeline stages, each a contiguous range of operators in a topological order, run on a
  mesh of ``dp × t`` GPUs of one node group.  Along ``dp`` every operator is data parallel
  (each replica gets ``micro_batch`` samples).  Along the ``t`` axis (consecutive ranks, inside
  a node when ``t ≤ gpus_per_node``) each operator picks a *sharding*: ``replicate``,
  ``split_batch``, ``split_weight_cols`` / ``split_weight_rows`` (Megatron column / row
  parallel), ``split_conv_channels``, ``split_heads``, ``split_seq``, ``shard_embedding_rows``
  (vocab-parallel, partial-sum output), ``shard_embedding_rows_alltoall`` (DLRM/TorchRec
  row-wise with all-to-all), ``shard_embedding_cols``, ``split_vocab`` (vocab-parallel loss),
  ``split_dim{d}`` for layout operators, and ``embedding_on_cpu`` (parameter-server
  placement on the cluster's CPU nodes, the Paddle heterogeneous pipeline of Ao et al. 2021).
* Each sharding fixes the layout of every input, input gradient and output: replicated ``R``,
  partial sum ``P``, or split along dimension ``d`` (``S_d``).  An edge whose producer layout
  differs from the consumer's requirement costs a collective over the ``t`` ranks (forward, and
  its dual for the gradient in backward): ``S→R`` all-gather, ``P→R`` all-reduce, ``P→S``
  reduce-scatter, ``S_d→S_e`` all-to-all, ``R→S`` and ``→P`` free (a local slice).  Megatron's
  tensor parallelism is the special case column-parallel QKV/FC1 (input ``R``, gradient ``P``:
  all-reduce in backward) and row-parallel projection/FC2 (output ``P``: all-reduce forward).

Cost per operator choice (per micro-batch, per GPU): GEMMs by :func:`compute.gemm_time_s` on the
sharded shape (backward as two GEMMs, dX and dW, with their own shapes), fused attention by
:func:`compute.flash_attention_time_s`, memory-bound operators by bytes over HBM bandwidth
where chains of elementwise operators fuse into one kernel (intermediates stay on chip; with
``training.fused_kernels`` false — eager PyTorch — every operator is its own kernel and pass,
and unfused attention runs each of its elementwise ops separately).  The graph path places
compute on accelerators only (CPU node groups serve embedding tables), so the CPU per-element
terms of the transformer path have no counterpart here.  Memory:
weights, gradients and optimizer state per parameter as the transformer path
(:func:`transformer_cost.model_state_bytes_per_param`, ZeRO-1 shards optimizer state over the
replicas of a weight), saved activations per micro-batch times the 1F1B in-flight count.

Step time (same schedule as :func:`cost_model.transformer.stage_cost.combine_stages`, ``vpp = 1``)::

    step = m·max_k T_k + Σ_k T_k − max_k T_k + max_k exposed_dp_k + max_k optimizer_k
    T_k  = Σ_{ops in k} (fwd + bwd + internal comm + incoming resharding) + p2p sends of k
    exposed_dp_k = max(0, dp_sync_k − (w + k)·backward_compute_k)

with ``w`` = :func:`transformer_cost.dp_overlap_fraction` of the mesh's device (0.8 with
``grad_reduce_overlap``, 0 without).

The CPU parameter-server stage (when some embedding is placed on CPU nodes) is an extra
pipeline stage in front: its time per micro-batch is the row gather on the CPU nodes plus the
transfer of the looked-up rows (and back, their gradients) over the slower of the CPU nodes'
NICs and the GPUs' NIC share; its sparse optimizer update runs with the GPUs' optimizer step.

Everything the planner needs is in :class:`CostTables` (arrays over operator×choice rows and
per-edge matrices) and :func:`evaluate` is the one exact objective both the CP-SAT model and
the brute-force check reproduce.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from cost_model.cluster import Cluster, NodeGroup
from cost_model.comm import (
    Links,
    allgather_time_s,
    allreduce_time_s,
    alltoall_time_s,
    p2p_time_s,
    ranks_per_node,
    reduce_scatter_time_s,
)
from cost_model.compute import (
    FLASH_BACKWARD_RATIO,
    flash_attention_time_s,
    gemm_time_s,
    memory_bound_time_s,
)
from cost_model.devices import BYTES_PER_ELEMENT, DeviceSpec
from cost_model.errors import InvalidGraph, InvalidStrategy
from cost_model.graph.ir import GraphSpec, OpCost, OpSpec
from cost_model.result import Estimate, StageEstimate
from cost_model.training import Training

# the transformer path's constants, so both paths price the same things the same way
from cost_model.transformer.layer_cost import (
    FRAGMENTATION_FRACTION,
    WORKSPACE_BYTES,
    dp_overlap_fraction,
    eager_attention_elementwise_s,
    model_state_bytes_per_param,
    optimizer_bytes_per_param,
    optimizer_kernels,
)

# ---- layouts -------------------------------------------------------------------------------
R, P = 0, 1  # replicated, partial sum; S_d = 2 + d (split along dimension d)


def S(d: int) -> int:
    return 2 + d


def layout_name(code: int) -> str:
    return "R" if code == R else "P" if code == P else f"S{code - 2}"


# Reshard kinds
NONE, ALLGATHER, ALLREDUCE, REDUCE_SCATTER, ALLTOALL = 0, 1, 2, 3, 4


def reshard_kind(src: int, dst: int) -> int:
    if src == dst or dst == P or src == R:
        return NONE
    if src == P:
        return ALLREDUCE if dst == R else REDUCE_SCATTER
    return ALLGATHER if dst == R else ALLTOALL


def grad_target(out_layout: int) -> int:
    """Layout in which a producer needs the gradient of an output it produced in ``out_layout``:
    the same, except that the gradient of a partial sum is replicated."""
    return R if out_layout == P else out_layout


#: CPU parameter-server tables are fp32 with their optimizer state (Adam: 2 moments) and no
#: dense gradient buffer (sparse rows are applied as they arrive): 12 B/param (SGD 8 B).
def cpu_state_bytes_per_param(training: Training) -> float:
    return 12.0 if training.optimizer == "adam" else 8.0


# ---- mesh and CPU pool ---------------------------------------------------------------------
@dataclass(frozen=True)
class CpuPool:
    """The cluster's CPU nodes used as parameter servers, in aggregate."""

    groups: tuple[str, ...]
    device: DeviceSpec
    nodes: int
    memory_bytes: float
    memory_bandwidth_Bps: float  # achieved, all nodes
    nic_Bps: float  # achieved, all nodes
    hostnames: tuple[str, ...] = ()

    @staticmethod
    def from_cluster(cluster: Cluster) -> CpuPool | None:
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
            bw += n * g.gpus_per_node * g.device.memory_bandwidth_GBps * 1e9 * eff.memory_fraction
            nic += n * g.inter_node_bandwidth_GBps * 1e9 * eff.nic_fraction
            hosts += [h.hostname for h in cluster.available_nodes(g.name)]
        return CpuPool(tuple(g.name for g in groups), groups[0].device, int(nodes), mem, bw, nic, tuple(hosts))


@dataclass(frozen=True)
class GraphMesh:
    """One candidate layout: the node group the stages run on and the parallel sizes."""

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


# ---- graph analysis (independent of the mesh) ------------------------------------------------
FOLLOWER_CATEGORIES = ("elementwise", "activation", "layout")
MEMORY_BOUND = ("norm", "softmax", "elementwise", "activation", "reduce", "pool", "loss", "gather", "layout", "embedding")
MAX_CHAIN = 12


@dataclass(frozen=True)
class GraphAnalysis:
    """Topological order that keeps elementwise chains contiguous, and the chains themselves.

    ``order[p]`` is the op index at position p; ``chain_start[p]`` is True where a new chain
    (coarsening group) begins.  A chain is a head operator followed by elementwise /
    activation / layout operators each consuming a tensor produced inside the chain; chains of
    memory-bound operators fuse into one kernel."""

    order: np.ndarray
    position: np.ndarray  # op index -> position
    chain_start: np.ndarray  # [positions] bool
    chain_id: np.ndarray  # [positions] -> chain number
    fused_bytes_fraction: np.ndarray  # [ops] fraction of the op's bytes left after fusion
    first_kernel: np.ndarray  # [ops] 1 if the op launches its own kernel


def _chain_order(graph: GraphSpec) -> list[int]:
    """Kahn's algorithm with a LIFO ready list: a consumer made ready by the op just emitted is
    emitted next, so producer → elementwise chains stay adjacent."""
    n = graph.num_ops
    indeg = [0] * n
    succ: list[list[int]] = [[] for _ in range(n)]
    for i, op in enumerate(graph.ops):
        preds = {graph.producer[t] for t in op.inputs if t in graph.producer}
        indeg[i] = len(preds)
        for p in preds:
            succ[p].append(i)
    ready = [i for i in range(n - 1, -1, -1) if indeg[i] == 0]
    order: list[int] = []
    while ready:
        i = ready.pop()
        order.append(i)
        newly = []
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                newly.append(j)
        # followers last so they pop first; among the rest keep the original order
        newly.sort(key=lambda j: (graph.ops[j].category in FOLLOWER_CATEGORIES, -j))
        ready.extend(newly)
    return order


def analyse(graph: GraphSpec) -> GraphAnalysis:
    order = _chain_order(graph)
    n = len(order)
    pos = np.empty(n, dtype=np.int64)
    pos[np.array(order, dtype=np.int64)] = np.arange(n)
    chain_start = np.ones(n, dtype=bool)
    chain_id = np.zeros(n, dtype=np.int64)
    members: set[int] = set()
    cid = -1
    length = 0
    for p, i in enumerate(order):
        op = graph.ops[i]
        follows = (
            p > 0
            and op.category in FOLLOWER_CATEGORIES
            and length < MAX_CHAIN
            and any(graph.producer.get(t) in members for t in op.inputs)
        )
        if follows:
            chain_start[p] = False
            length += 1
        else:
            cid += 1
            members = set()
            length = 1
        members.add(i)
        chain_id[p] = cid
    # Fusion of memory-bound members of a chain: tensors made and used only inside the chain's
    # memory-bound run are never written to HBM (unless autograd saves them).
    saved: set[str] = set()
    for op in graph.ops:
        for j in _saved_slots(op):
            saved.add(op.inputs[j])
    outputs = set(graph.outputs)
    frac = np.ones(graph.num_ops)
    first = np.ones(graph.num_ops, dtype=np.int64)
    p = 0
    while p < n:
        q = p + 1
        while q < n and not chain_start[q]:
            q += 1
        run = [order[r] for r in range(p, q)]
        mb = [i for i in run if graph.ops[i].category in MEMORY_BOUND]
        mbset = set(mb)
        for k, i in enumerate(mb):
            op = graph.ops[i]
            if k > 0:
                first[i] = 0
            total = _op_bytes_estimate(graph, op)
            if total <= 0:
                continue
            removed = 0.0
            for t in op.inputs:
                if graph.producer.get(t) in mbset and t not in saved:
                    removed += _tensor_elems(graph, t)
            for t in op.outputs:
                cons = graph.consumers.get(t, ())
                if cons and all(c in mbset for c in cons) and t not in saved and t not in outputs:
                    removed += _tensor_elems(graph, t)
            frac[i] = max(0.0, 1.0 - removed / total)
        p = q
    return GraphAnalysis(np.array(order, dtype=np.int64), pos, chain_start, chain_id, frac, first)


def _tensor_elems(graph: GraphSpec, t: str) -> float:
    """Element count at batch = seq = 1 (ratios only)."""
    return float(math.prod(d.coef for d in graph.tensors[t].shape))


def _op_bytes_estimate(graph: GraphSpec, op: OpSpec) -> float:
    return sum(_tensor_elems(graph, t) for t in op.inputs) + sum(_tensor_elems(graph, t) for t in op.outputs)


def _saved_slots(op: OpSpec) -> tuple[int, ...]:
    cat, t = op.category, op.type
    if cat in ("matmul",):
        return (0,) if (op.param("weight") or op.param("B")) else (0, 1)
    if cat in ("conv", "norm", "embedding"):
        return (0,)
    if cat == "attention":
        return (0, 1, 2)
    if cat == "gather":
        return (len(op.inputs) - 1,)
    if cat == "loss":
        return (0,)
    if cat in ("elementwise", "activation"):
        from cost_model.graph.ir import _MASK_ONLY, _NO_GRAD, _SAVES_INPUTS

        if t in _MASK_ONLY or t in _NO_GRAD or t == "Cast":
            return ()
        if cat == "activation" or t in _SAVES_INPUTS:
            return tuple(range(len(op.inputs)))
        return ()
    if cat in ("reduce", "pool"):
        return (0,) if t in ("ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2", "ReduceLogSumExp", "MaxPool", "GlobalMaxPool", "LpPool") else ()
    return ()


# ---- choices ---------------------------------------------------------------------------------
@dataclass
class _Choice:
    name: str
    in_l: tuple[int, ...]
    in_g: tuple[int, ...]
    out_l: tuple[int, ...]
    gemm: tuple[float, float, float, float] | None = None  # sharded (m, n, k, batch)
    attn: tuple[float, float, float, float, float] | None = None  # (bh, sq, skv, d, causal_frac)
    mem_frac: float = 1.0  # fraction of the op's memory-bound bytes this GPU moves
    params_dev: float = 0.0  # parameters held per GPU
    sync: str = "dp"  # gradient replicas: "dp" or "dpt"
    comm: tuple[tuple[int, float, int], ...] = ()  # (kind, bytes, 0 fwd / 1 bwd) inside the op
    extra_act_frac: float = 1.0
    cpu: bool = False


def _split_ok(shape: Sequence[int], d: int, t: int) -> bool:
    """Dimension d can be split over t ranks: at least one element per rank, and even for the
    batch dimension (uneven feature/vocabulary splits are padded, as Megatron pads its
    vocabulary; their costs use size/t)."""
    if not 0 <= d < len(shape) or shape[d] < t:
        return False
    return d != 0 or shape[d] % t == 0


def _cand_dims(rank: int) -> list[int]:
    dims = [0]
    if rank >= 3:
        dims.append(1)
    if rank >= 2:
        dims.append(rank - 1)
    return sorted(set(d for d in dims if d < rank))


def _view_map(in_shape: Sequence[int], out_shape: Sequence[int], d: int, t: int) -> int | None:
    """Output dimension that a split of input dimension ``d`` becomes under a reshape (a view),
    or None when the split does not survive as one contiguous split."""
    if not _split_ok(in_shape, d, t):
        return None
    before = math.prod(in_shape[:d])
    acc = 1
    for e, size in enumerate(out_shape):
        if acc == before:
            if size % t == 0 and size >= t:
                # The input chunk (in[d]/t)·suffix must equal the output chunk (out[e]/t)·suffix.
                if in_shape[d] * math.prod(in_shape[d + 1:]) == size * math.prod(out_shape[e + 1:]) or size == in_shape[d]:
                    return e
            if size == 1:
                acc *= size
                continue
            return None
        acc *= size
        if acc > before:
            return None
    return None


def _op_choices(op: OpSpec, cost: OpCost, graph: GraphSpec, shapes: Mapping[str, tuple[int, ...]], mesh: GraphMesh,
                graph_inputs: set[str]) -> list[_Choice]:
    t = mesh.t
    cat, typ = op.category, op.type
    n_in, n_out = len(op.inputs), len(op.outputs)
    ins = [shapes[x] for x in op.inputs]
    outs = [shapes[x] for x in op.outputs]
    P_all = float(op.param_count)
    rep = _Choice("replicate", (R,) * n_in, (R,) * n_in, (R,) * n_out, gemm=cost.gemm and (cost.gemm.m, cost.gemm.n, cost.gemm.k, cost.gemm.batch),
                  attn=None, params_dev=P_all)
    if cost.attention is not None:
        bh, sq, skv, d, causal = cost.attention
        rep.attn = (bh, sq, skv, d, 0.5 if causal and sq == skv else 1.0)
    choices = [rep]

    is_table = (cat == "embedding") or (cat == "gather" and op.params and op.attr("axis", 0) == 0 and len(op.params[0].shape) == 2)
    if is_table and mesh.cpu is not None and op.inputs and op.inputs[-1] in graph_inputs:
        lay = S(0) if (t > 1 and _split_ok(ins[-1], 0, t)) else R
        choices.append(_Choice("embedding_on_cpu", (lay,) * n_in, (lay,) * n_in, (lay,) * n_out, mem_frac=0.0,
                               params_dev=0.0, cpu=True))
    if t == 1:
        return choices

    def batch_split() -> _Choice | None:
        if not all(_split_ok(s, 0, t) for s in ins + outs if len(s) > 0):
            return None
        if any(len(s) == 0 for s in ins + outs):
            return None
        g = cost.gemm
        gm = None
        if g is not None:
            gm = (g.m / t, g.n, g.k, g.batch) if (g.weight or g.batch == 1) else (g.m, g.n, g.k, g.batch / t)
        at = None
        if rep.attn is not None:
            bh, sq, skv, d, fr = rep.attn
            at = (bh / t, sq, skv, d, fr)
        return _Choice("split_batch", (S(0),) * n_in, (S(0),) * n_in, (S(0),) * n_out, gemm=gm, attn=at, mem_frac=1.0 / t,
                       params_dev=P_all, sync="dpt", extra_act_frac=1.0 / t)

    if cat == "matmul":
        w = op.param("weight") or op.param("B")
        g = cost.gemm
        if w is not None:
            x = ins[0]
            r = len(x)
            b = batch_split()
            if b:
                choices.append(b)
            bias = op.param("bias") or op.param("C")
            nb = float(bias.count) if bias else 0.0
            if g.n >= t:
                choices.append(_Choice("split_weight_cols", (R,), (P,), (S(len(outs[0]) - 1),), gemm=(g.m, g.n / t, g.k, 1),
                                       params_dev=P_all / t, extra_act_frac=1.0))
            if g.k >= t and r >= 1 and _split_ok(x, r - 1, t):
                choices.append(_Choice("split_weight_rows", (S(r - 1),), (S(r - 1),), (P,), gemm=(g.m, g.n, g.k / t, 1),
                                       params_dev=(P_all - nb) / t + nb))
        else:
            a, bsh = ins
            o = outs[0]
            if len(a) >= 3 and len(bsh) >= 3 and len(a) == len(bsh) and _split_ok(a, 0, t) and _split_ok(bsh, 0, t):
                choices.append(_Choice("split_batch", (S(0), S(0)), (S(0), S(0)), (S(0),), gemm=(g.m, g.n, g.k, g.batch / t),
                                       mem_frac=1.0 / t, sync="dpt", extra_act_frac=1.0 / t))
            if len(a) == 4 and len(bsh) == 4 and _split_ok(a, 1, t) and _split_ok(bsh, 1, t):
                choices.append(_Choice("split_heads", (S(1), S(1)), (S(1), S(1)), (S(1),), gemm=(g.m, g.n, g.k, g.batch / t),
                                       mem_frac=1.0 / t, sync="dpt", extra_act_frac=1.0 / t))
            if len(a) >= 2 and len(bsh) == 2 and _split_ok(bsh, 1, t):
                choices.append(_Choice("split_weight_cols", (R, S(1)), (P, S(1)), (S(len(o) - 1),), gemm=(g.m, g.n / t, g.k, g.batch),
                                       mem_frac=1.0 / t, extra_act_frac=1.0 / t))
        return choices

    if cat == "conv":
        g = cost.gemm
        b = batch_split()
        if b:
            choices.append(b)
        groups = op.attr("group", op.attr("groups", 1))
        w = op.param("weight") or op.param("W")
        if groups == 1 and w.shape[0] >= t:
            choices.append(_Choice("split_conv_channels", (R,), (P,), (S(1),), gemm=(g.m, g.n / t, g.k, g.batch),
                                   params_dev=P_all / t))
        elif groups > 1 and groups % t == 0:
            choices.append(_Choice("split_conv_channels", (S(1),), (S(1),), (S(1),), gemm=(g.m, g.n, g.k, g.batch / t),
                                   params_dev=P_all / t, extra_act_frac=1.0 / t))
        return choices

    if cat == "attention":
        b = batch_split()
        if b:
            choices.append(b)
        q = ins[0]
        bh, sq, skv, d, fr = rep.attn
        if len(q) == 3:
            heads = op.attr("num_heads", op.attr("q_num_heads"))
            kvh = op.attr("kv_num_heads", heads)
            if heads % t == 0 and kvh % t == 0:
                lay = S(2)
                choices.append(_Choice("split_heads", (lay,) * n_in, (lay,) * n_in, (lay,) * n_out, attn=(bh / t, sq, skv, d, fr),
                                       mem_frac=1.0 / t, extra_act_frac=1.0 / t))
        elif _split_ok(q, 1, t) and all(_split_ok(s, 1, t) for s in ins[:3]):
            lay = S(1)
            choices.append(_Choice("split_heads", (lay,) * n_in, (lay,) * n_in, (lay,) * n_out, attn=(bh / t, sq, skv, d, fr),
                                   mem_frac=1.0 / t, extra_act_frac=1.0 / t))
        return choices

    if cat == "norm":
        x = ins[0]
        b = batch_split()
        if b:
            choices.append(b)
        if typ in ("LayerNorm", "RMSNorm") and len(x) >= 3 and _split_ok(x, 1, t) and (op.attr("axis", -1) in (-1, len(x) - 1)):
            lay = S(1)
            choices.append(_Choice("split_seq", (lay,) * n_in, (lay,) * n_in, (lay,) + (R,) * (n_out - 1), mem_frac=1.0 / t,
                                   params_dev=P_all, sync="dpt", extra_act_frac=1.0 / t))
        if typ == "BatchNorm" and _split_ok(x, 1, t):
            lay = S(1)
            choices.append(_Choice("split_channels", (lay,) * n_in, (lay,) * n_in, (lay,) * n_out, mem_frac=1.0 / t,
                                   params_dev=P_all / t, extra_act_frac=1.0 / t))
        return choices

    if cat in ("softmax", "elementwise", "activation", "pool", "custom", "reduce", "layout", "gather", "loss") and not is_table:
        return choices + _generic_choices(op, cost, ins, outs, t, P_all)

    if is_table:
        idx = ins[-1]
        table = op.params[0]
        dim = table.shape[1]
        eb = BYTES_PER_ELEMENT.get(table.dtype or "", None) or 2
        lookups = math.prod(idx)
        b = batch_split()
        if b:
            choices.append(b)
        o = outs[0]
        if table.shape[0] >= t:
            choices.append(_Choice("shard_embedding_rows", (R,) * n_in, (R,) * n_in, (P,), mem_frac=1.0 / t, params_dev=P_all / t))
            if _split_ok(idx, 0, t) and all(_split_ok(s, 0, t) for s in outs):
                rows_b = lookups / t * dim * eb
                idx_b = lookups / t * 8
                comm = ((ALLTOALL, idx_b, 0), (ALLTOALL, rows_b, 0), (ALLTOALL, rows_b, 1))
                choices.append(_Choice("shard_embedding_rows_alltoall", (S(0),) * n_in, (S(0),) * n_in, (S(0),) * n_out,
                                       mem_frac=1.0 / t, params_dev=P_all / t, comm=comm, extra_act_frac=1.0 / t))
        if dim >= t and len(o) >= 1:
            choices.append(_Choice("shard_embedding_cols", (R,) * n_in, (R,) * n_in, (S(len(o) - 1),), mem_frac=1.0 / t,
                                   params_dev=P_all / t))
        return choices
    return choices


def _generic_choices(op: OpSpec, cost: OpCost, ins, outs, t: int, P_all: float) -> list[_Choice]:
    """Layout-following operators: a split of dimension d of the output (and of every input
    that carries that dimension; broadcast inputs stay replicated with a partial gradient)."""
    cat, typ = op.category, op.type
    out0 = outs[0] if outs else ()
    res: list[_Choice] = []
    if not out0 and cat != "loss":
        return res
    if cat == "loss":
        logits = ins[0]
        if _split_ok(logits, 0, t) and all(len(s) == 0 or _split_ok(s, 0, t) for s in ins):
            in_l = tuple(S(0) if len(s) else R for s in ins)
            res.append(_Choice("split_batch", in_l, in_l, (R,) * len(outs), mem_frac=1.0 / t, extra_act_frac=1.0 / t))
        if typ == "CrossEntropy" and len(logits) >= 1 and _split_ok(logits, len(logits) - 1, t):
            rows = math.prod(logits[:-1]) * 4.0
            in_l = (S(len(logits) - 1),) + (R,) * (len(ins) - 1)
            res.append(_Choice("split_vocab", in_l, in_l, (R,) * len(outs), mem_frac=1.0 / t, extra_act_frac=1.0 / t,
                               comm=((ALLREDUCE, rows, 0), (ALLREDUCE, rows, 0), (ALLREDUCE, rows, 0))))
        return res
    if cat == "custom":
        batchy = all(len(s) and op_in_batchy for s, op_in_batchy in zip(ins + outs, [True] * (len(ins) + len(outs))))
        if batchy and all(_split_ok(s, 0, t) for s in ins + outs):
            res.append(_Choice("split_batch", (S(0),) * len(ins), (S(0),) * len(ins), (S(0),) * len(outs), mem_frac=1.0 / t,
                               params_dev=P_all, sync="dpt", extra_act_frac=1.0 / t))
        return res
    rank = len(out0)
    seen: set[tuple] = set()
    for d in _cand_dims(max(rank, len(ins[0]) if ins else 0)):
        if cat == "layout" and typ in ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Transpose"):
            x = ins[0]
            if typ == "Transpose":
                perm = list(op.attr("perm") or list(range(len(x)))[::-1])
                if not _split_ok(x, d, t):
                    continue
                e = perm.index(d)
            else:
                e = _view_map(x, out0, d, t)
                if e is None:
                    continue
            in_l = (S(d),) + (R,) * (len(ins) - 1)
            out_l = (S(e),)
        elif cat == "layout" and typ in ("Concat", "Split", "Slice"):
            ax = op.attr("axis", 0)
            x = ins[0]
            ax = ax + len(x) if ax < 0 else ax
            if typ == "Slice":
                axes = op.attr("axes") or list(range(len(op.attr("starts") or [])))
                axes = [a + len(x) if a < 0 else a for a in axes]
                if d in axes:
                    continue
            elif d == ax and not all(s[d] % t == 0 for s in ins + outs):
                # Splitting along the concat/split axis itself works when every piece divides
                # evenly: rank r holds the r-th chunk of each piece (Megatron's interleaved
                # fused-QKV column order).
                continue
            if not all(_split_ok(s, d, t) for s in ins + outs):
                continue
            in_l = (S(d),) * len(ins)
            out_l = (S(d),) * len(outs)
        elif cat == "softmax":
            ax = op.attr("axis", -1)
            ax = ax + rank if ax < 0 else ax
            if d == ax or not _split_ok(out0, d, t):
                continue
            in_l, out_l = (S(d),), (S(d),)
        elif cat == "reduce":
            x = ins[0]
            axes = op.attr("axes")
            axes = list(range(len(x))) if axes is None else [a + len(x) if a < 0 else a for a in (axes if isinstance(axes, (list, tuple)) else [axes])]
            if d in axes or not _split_ok(x, d, t):
                continue
            e = d if op.attr("keepdims", 1) else d - sum(1 for a in axes if a < d)
            in_l, out_l = (S(d),), (S(e),)
        elif cat == "pool":
            if d > 1 or not _split_ok(ins[0], d, t):
                continue
            in_l, out_l = (S(d),), (S(d),)
        elif cat == "gather":
            data = ins[0]
            ax = op.attr("axis", 0)
            ax = ax + len(data) if ax < 0 else ax
            if d >= len(data) or d == ax or not _split_ok(data, d, t) or not _split_ok(out0, d, t):
                continue
            if d > ax:  # the dimension moves by the index rank - 1
                e = d + len(ins[1]) - 1
                if e >= rank:
                    continue
            else:
                e = d
            in_l, out_l = (S(d), R), (S(e),)
        else:  # elementwise / activation with broadcasting
            if not _split_ok(out0, d, t):
                continue
            in_l_list, in_g_list = [], []
            for s in ins:
                k = d - (rank - len(s))
                if 0 <= k < len(s) and s[k] == out0[d]:
                    in_l_list.append(S(k))
                    in_g_list.append(S(k))
                else:
                    in_l_list.append(R)
                    in_g_list.append(P)
            in_l = tuple(in_l_list)
            key = (in_l, d)
            if key in seen:
                continue
            seen.add(key)
            out_l = (S(d),) * len(outs)
            res.append(_Choice("split_batch" if d == 0 else f"split_dim{d}", in_l, tuple(in_g_list), out_l, mem_frac=1.0 / t, params_dev=P_all,
                               sync="dpt" if P_all else "dp", extra_act_frac=1.0 / t))
            continue
        key = (in_l, out_l)
        if key in seen:
            continue
        seen.add(key)
        name = "split_batch" if d == 0 else f"split_dim{d}"
        res.append(_Choice(name, in_l, in_l, out_l, mem_frac=1.0 / t, params_dev=P_all, sync="dpt" if P_all else "dp",
                           extra_act_frac=1.0 / t))
    return res


# ---- cost tables -----------------------------------------------------------------------------
@dataclass
class CostTables:
    """Costs of every (operator, sharding) row and every edge for one :class:`GraphMesh`.

    Rows are grouped by operator: ``row_start[i] .. row_start[i+1]`` are op i's choices (op
    indices are the graph's).  Per-row arrays (seconds per micro-batch per GPU, bytes per GPU):

    * ``fwd_s``/``bwd_s``: compute of the op's shard (with memory-bound fusion);
    * ``comm_fwd_s``/``comm_bwd_s``: collectives inside the op (all-to-all of embedding rows,
      vocab-parallel loss statistics);
    * ``sync_s``: data-parallel gradient synchronisation of its weights (bandwidth term);
    * ``opt_s``: optimizer update of its weight shard (bandwidth term);
    * ``weights_b``/``grads_b``/``optstate_b``: model state; ``act_b``: saved activations per
      micro-batch (each saved tensor counted once, at its producer, at its layout's size);
    * ``cpu_s``/``cpu_comm_s``/``cpu_mem_b``/``cpu_opt_s``: parameter-server placement;
    * ``flops``: executed FLOPs per GPU per micro-batch (forward + backward).

    Edges: ``edges[e] = (u, v, tensor, slot)`` with ``edge_fwd[e]``/``edge_bwd[e]`` matrices
    ``[choices of u, choices of v]`` of resharding seconds (charged to v's stage).
    """

    graph: GraphSpec
    mesh: GraphMesh
    training: Training
    analysis: GraphAnalysis
    op_costs: list[OpCost]
    row_start: np.ndarray
    row_op: np.ndarray
    names: list[str]
    in_l: list[tuple[int, ...]]
    in_g: list[tuple[int, ...]]
    out_l: list[tuple[int, ...]]
    fwd_s: np.ndarray
    bwd_s: np.ndarray
    comm_fwd_s: np.ndarray
    comm_bwd_s: np.ndarray
    sync_s: np.ndarray
    opt_s: np.ndarray
    weights_b: np.ndarray
    grads_b: np.ndarray
    optstate_b: np.ndarray
    act_b: np.ndarray
    cpu_s: np.ndarray
    cpu_comm_s: np.ndarray
    cpu_mem_b: np.ndarray
    cpu_opt_s: np.ndarray
    flops: np.ndarray
    edges: list[tuple[int, int, str, int]]
    edge_fwd: list[np.ndarray]
    edge_bwd: list[np.ndarray]
    tensor_bytes: dict[str, float]
    capacity_b: float
    model_flops_per_microbatch: float
    params_dev: np.ndarray = field(default_factory=lambda: np.zeros(0))
    param_tensors: np.ndarray = field(default_factory=lambda: np.zeros(0))  # per row: tensors a for-loop optimizer visits
    sync_dpt: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    cpu_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def n_choices(self, op: int) -> int:
        return int(self.row_start[op + 1] - self.row_start[op])

    def rows(self, op: int) -> range:
        return range(int(self.row_start[op]), int(self.row_start[op + 1]))

    def choice_index(self, op: int, name: str) -> int | None:
        for k, r in enumerate(self.rows(op)):
            if self.names[r] == name:
                return k
        return None


def _reshard_time(kind: np.ndarray, size: np.ndarray, mesh: GraphMesh) -> np.ndarray:
    """Time of collectives over the ``t`` ranks of a stage (consecutive ranks, ``min(t, gpn)``
    per node) for arrays of kinds and full-tensor sizes in bytes."""
    t = mesh.t
    links = mesh.links
    per_node = min(t, links.gpus_per_node)
    out = np.zeros(len(kind))
    if t == 1 or len(kind) == 0:
        return out
    for k, fn, scale in (
        (ALLGATHER, allgather_time_s, 1.0),
        (ALLREDUCE, allreduce_time_s, 1.0),
        (REDUCE_SCATTER, reduce_scatter_time_s, 1.0),
        (ALLTOALL, alltoall_time_s, 1.0 / t),
    ):
        sel = kind == k
        if sel.any():
            out[sel] = fn(t, size[sel] * scale, links, per_node)
    return out


def build_tables(graph: GraphSpec, training: Training, mesh: GraphMesh, analysis: GraphAnalysis | None = None,
                 op_costs: list[OpCost] | None = None) -> CostTables:
    """Cost every operator × sharding choice and every edge for ``mesh`` (vectorised)."""
    analysis = analysis or analyse(graph)
    dt = training.dtype
    eb_act = 4 if dt == "fp32" else 2
    device = mesh.device
    t = mesh.t
    costs = op_costs if op_costs is not None else graph.op_costs(mesh.micro_batch, training.sequence_length, dt)
    shapes = graph.bind(mesh.micro_batch, training.sequence_length)
    graph_inputs = set(graph.inputs)
    unfused = training.attention == "unfused"
    eager = not training.fused_kernels

    row_start = [0]
    row_op: list[int] = []
    names: list[str] = []
    in_l: list[tuple] = []
    in_g: list[tuple] = []
    out_l: list[tuple] = []
    choices_all: list[_Choice] = []
    for i, op in enumerate(graph.ops):
        ch = _op_choices(op, costs[i], graph, shapes, mesh, graph_inputs)
        for c in ch:
            row_op.append(i)
            names.append(c.name)
            in_l.append(c.in_l)
            in_g.append(c.in_g)
            out_l.append(c.out_l)
            choices_all.append(c)
        row_start.append(len(row_op))
    n_rows = len(row_op)
    row_op_a = np.array(row_op, dtype=np.int64)

    # -- GEMMs: forward (m,n,k), backward dX (m,k,n) and dW (k,n,m) ---------------------------
    g_rows, gm, gn, gk, gb, gdir = [], [], [], [], [], []
    a_rows, a_bh, a_sq, a_skv, a_d, a_fr = [], [], [], [], [], []
    mem_f = np.zeros(n_rows)
    mem_b = np.zeros(n_rows)
    kern = np.zeros(n_rows)
    params_dev = np.zeros(n_rows)
    sync_dpt = np.zeros(n_rows, dtype=bool)
    extra_act = np.zeros(n_rows)
    flops = np.zeros(n_rows)
    comm_rows, comm_kind, comm_bytes, comm_dir = [], [], [], []
    cpu_rows = []
    for r, c in enumerate(choices_all):
        i = row_op[r]
        oc = costs[i]
        op = graph.ops[i]
        params_dev[r] = c.params_dev
        sync_dpt[r] = c.sync == "dpt"
        if c.cpu:
            cpu_rows.append(r)
            continue
        # Eager frameworks run every operator as its own kernel (no chain fusion).
        frac = 1.0 if eager else analysis.fused_bytes_fraction[i]
        if c.gemm is not None:
            m, n, k, b = c.gemm
            for direction, (mm, nn, kk) in enumerate(((m, n, k), (m, k, n), (k, n, m))):
                g_rows.append(r)
                gm.append(mm)
                gn.append(nn)
                gk.append(kk)
                gb.append(b)
                gdir.append(0 if direction == 0 else 1)
            flops[r] += 6.0 * m * n * k * b
        elif c.attn is not None:
            bh, sq, skv, d, fr = c.attn
            a_rows.append(r)
            a_bh.append(bh)
            a_sq.append(sq)
            a_skv.append(skv)
            a_d.append(d)
            a_fr.append(fr)
            flops[r] += 3.0 * 4.0 * bh * sq * skv * d
            if unfused:
                extra_act[r] += bh * sq * skv * (2 * eb_act + 1)
        else:
            mem_f[r] = oc.fwd_bytes * frac * c.mem_frac
            mem_b[r] = oc.bwd_bytes * frac * c.mem_frac
            kern[r] = (1 if oc.fwd_bytes > 0 else 0) if eager else analysis.first_kernel[i]
            flops[r] += (oc.fwd_flops + oc.bwd_flops) * c.mem_frac
        extra_act[r] += oc.extra_saved_bytes * c.extra_act_frac
        for kind, size, direction in c.comm:
            comm_rows.append(r)
            comm_kind.append(kind)
            comm_bytes.append(size)
            comm_dir.append(direction)

    fwd_s = memory_bound_time_s(mem_f, device, kernels=kern)
    bwd_s = np.where(mem_b > 0, memory_bound_time_s(mem_b, device, kernels=kern), 0.0)
    fwd_s = np.where((mem_f > 0) | (kern > 0), fwd_s, 0.0)
    if g_rows:
        gt = gemm_time_s(np.array(gm), np.array(gn), np.array(gk), device, dt, batch=np.array(gb))
        gdir_a = np.array(gdir)
        np.add.at(fwd_s, np.array(g_rows)[gdir_a == 0], gt[gdir_a == 0])
        np.add.at(bwd_s, np.array(g_rows)[gdir_a == 1], gt[gdir_a == 1])
    if a_rows:
        ar = np.array(a_rows)
        bh, sq, skv, d, fr = (np.array(x, dtype=float) for x in (a_bh, a_sq, a_skv, a_d, a_fr))
        if unfused:
            # Megatron's unfused core: QKᵀ and PV GEMMs plus scale-mask-softmax and dropout over
            # the scores (9 B/score forward, 11 B backward) — the transformer path's figures.
            tq = gemm_time_s(sq, skv, d, device, dt, batch=bh)
            tp_ = gemm_time_s(sq, d, skv, device, dt, batch=bh)
            elems = bh * sq * skv
            if eager:  # plain PyTorch: every op of it its own pass (the transformer path's rule)
                ef, eb_ = eager_attention_elementwise_s(elems, eb_act, 1.0, device)
            else:
                ef = memory_bound_time_s(9 * elems, device, kernels=2)
                eb_ = memory_bound_time_s(11 * elems, device, kernels=2)
            f = tq + tp_ + ef
            b_ = 2 * (tq + tp_) + eb_
        else:
            f = flash_attention_time_s(bh, sq, skv, d, device, dt, causal_fraction=fr)
            b_ = FLASH_BACKWARD_RATIO * f
        np.add.at(fwd_s, ar, f)
        np.add.at(bwd_s, ar, b_)
    comm_fwd = np.zeros(n_rows)
    comm_bwd = np.zeros(n_rows)
    if comm_rows:
        ct = _reshard_time(np.array(comm_kind), np.array(comm_bytes, dtype=float), mesh)
        cd = np.array(comm_dir)
        cr = np.array(comm_rows)
        np.add.at(comm_fwd, cr[cd == 0], ct[cd == 0])
        np.add.at(comm_bwd, cr[cd == 1], ct[cd == 1])

    # -- saved activations: each saved tensor once, at its producer's layout -------------------
    act_b = extra_act.copy()
    tensor_bytes: dict[str, float] = {}
    for name, shp in shapes.items():
        tensor_bytes[name] = float(math.prod(shp)) * _elt(graph, name, dt)
    saved_by: dict[str, list[tuple[int, int]]] = {}
    for i, op in enumerate(graph.ops):
        for j in _saved_slots(op):
            if j < len(op.inputs):
                saved_by.setdefault(op.inputs[j], []).append((i, j))
    for name, users in saved_by.items():
        size = tensor_bytes[name]
        if name in graph.producer:
            u = graph.producer[name]
            slot = graph.ops[u].outputs.index(name)
            for r in range(row_start[u], row_start[u + 1]):
                lay = out_l[r][slot]
                act_b[r] += size / t if lay >= 2 else size
        else:
            v, j = users[0]
            for r in range(row_start[v], row_start[v + 1]):
                lay = in_l[r][j]
                act_b[r] += size / t if lay >= 2 else size

    # -- edges ----------------------------------------------------------------------------------
    edges: list[tuple[int, int, str, int]] = []
    e_src, e_dst, e_size, e_index = [], [], [], []
    shapes_list: list[tuple[int, int]] = []
    requires_grad = {name: _requires_grad(graph, name) for name in graph.tensors}
    for v, op in enumerate(graph.ops):
        for j, name in enumerate(op.inputs):
            u = graph.producer.get(name)
            if u is None:
                continue
            slot = graph.ops[u].outputs.index(name)
            e = len(edges)
            edges.append((u, v, name, j))
            nu, nv = row_start[u + 1] - row_start[u], row_start[v + 1] - row_start[v]
            shapes_list.append((nu, nv))
            size = tensor_bytes[name]
            for a in range(nu):
                ol = out_l[row_start[u] + a][slot]
                for b in range(nv):
                    rv = row_start[v] + b
                    e_index.append(e)
                    e_src.append((ol, in_l[rv][j], grad_target(ol), in_g[rv][j] if requires_grad[name] else -1))
                    e_size.append(size)
    edge_fwd: list[np.ndarray] = []
    edge_bwd: list[np.ndarray] = []
    if edges:
        src = np.array(e_src, dtype=np.int64)
        size = np.array(e_size, dtype=float)
        kf = reshard_kinds(src[:, 0], src[:, 1])
        kb = np.where(src[:, 3] >= 0, reshard_kinds(src[:, 3], src[:, 2]), NONE)
        tf = _reshard_time(kf, size, mesh)
        tb = _reshard_time(kb, size, mesh)
        pos = 0
        for e, (nu, nv) in enumerate(shapes_list):
            cnt = nu * nv
            edge_fwd.append(tf[pos:pos + cnt].reshape(nu, nv))
            edge_bwd.append(tb[pos:pos + cnt].reshape(nu, nv))
            pos += cnt

    zeros = np.zeros(n_rows)
    cap = mesh.device.memory_bytes
    model_flops = 0.0
    for oc, op in zip(costs, graph.ops):
        if op.category in ("matmul", "conv", "attention"):
            model_flops += oc.fwd_flops + oc.bwd_flops
    return for_mesh(CostTables(
        graph=graph, mesh=mesh, training=training, analysis=analysis, op_costs=costs,
        row_start=np.array(row_start, dtype=np.int64), row_op=row_op_a, names=names, in_l=in_l, in_g=in_g, out_l=out_l,
        fwd_s=fwd_s, bwd_s=bwd_s, comm_fwd_s=comm_fwd, comm_bwd_s=comm_bwd, sync_s=zeros, opt_s=zeros,
        weights_b=zeros, grads_b=zeros, optstate_b=zeros, act_b=act_b,
        cpu_s=zeros, cpu_comm_s=zeros, cpu_mem_b=zeros, cpu_opt_s=zeros, flops=flops,
        params_dev=params_dev, param_tensors=np.array([len(graph.ops[i].params) for i in row_op], dtype=float) * (params_dev > 0),
        sync_dpt=sync_dpt, cpu_rows=np.array(cpu_rows, dtype=np.int64),
        edges=edges, edge_fwd=edge_fwd, edge_bwd=edge_bwd, tensor_bytes=tensor_bytes, capacity_b=cap,
        model_flops_per_microbatch=model_flops,
    ), mesh)


def for_mesh(tables: CostTables, mesh: GraphMesh) -> CostTables:
    """The tables for ``mesh``, which must share the node group, ``t`` and micro-batch size
    with ``tables.mesh`` (operator costs, choices and edges depend only on those): recomputes
    what depends on dp, pp, the number of micro-batches and ZeRO — gradient synchronisation,
    optimizer time, model-state bytes and the CPU parameter-server terms."""
    base = tables.mesh
    if (mesh.group.name, mesh.t, mesh.micro_batch) != (base.group.name, base.t, base.micro_batch):
        raise ValueError("for_mesh needs the same node group, t and micro-batch size")
    training = tables.training
    device = mesh.device
    links = mesh.links
    t = mesh.t
    graph = tables.graph
    params_dev = tables.params_dev
    n_rows = len(params_dev)
    sync_n = np.where(tables.sync_dpt, mesh.dp * t, mesh.dp).astype(float)
    w_pp, g_pp, o_pp = model_state_bytes_per_param(training, mesh.zero_stage, sync_n)
    w_pp, g_pp, o_pp = (np.broadcast_to(np.asarray(x, dtype=float), (n_rows,)) for x in (w_pp, g_pp, o_pp))
    weights_b = params_dev * w_pp
    grads_b = params_dev * g_pp
    optstate_b = params_dev * o_pp
    gbytes = 4.0 if training.dtype == "fp32" else 2.0
    # Bandwidth term of the ring all-reduce over sync_n ranks (its latency is paid per bucket,
    # not per operator, and is negligible next to the volume).
    nolat = Links(links.intra_GBps, links.inter_GBps, links.gpus_per_node, 0.0)
    stride = np.where(tables.sync_dpt, 1.0, float(t))
    per_node = ranks_per_node(sync_n, stride, links.gpus_per_node)
    sync_s = np.where(sync_n > 1, allreduce_time_s(sync_n, params_dev * gbytes, nolat, per_node), 0.0)
    opt_shard = np.where(mesh.zero_stage >= 1, sync_n, 1.0)
    opt_s = params_dev * optimizer_bytes_per_param(training) / opt_shard / (device.memory_bandwidth_GBps * 1e9 * device.efficiency.memory_fraction)
    if not training.fused_kernels:  # a for-loop optimizer launches its kernels per parameter tensor
        opt_s = opt_s + optimizer_kernels(training, tables.param_tensors) * device.efficiency.kernel_overhead_s

    # CPU parameter-server rows: the table lives on the CPU nodes (fp32 + optimizer state);
    # per micro-batch slot the rows of all dp replicas are gathered there and sent over the
    # slower of the CPU NICs (aggregate) and each GPU's NIC share; gradients of the rows come
    # back the same way; the sparse update touches only rows looked up this step.
    cpu_s = np.zeros(n_rows)
    cpu_comm = np.zeros(n_rows)
    cpu_mem = np.zeros(n_rows)
    cpu_opt = np.zeros(n_rows)
    pool = mesh.cpu
    if len(tables.cpu_rows) and pool is not None:
        eb_act = 4 if training.dtype == "fp32" else 2
        shapes = None
        for r in tables.cpu_rows:
            i = int(tables.row_op[r])
            op = graph.ops[i]
            table = op.params[0]
            dim = table.shape[1]
            if shapes is None:
                shapes = graph.bind(mesh.micro_batch, training.sequence_length)
            lookups = float(math.prod(shapes[op.inputs[-1]]))  # per dp replica per micro-batch
            total = mesh.dp * lookups
            per_gpu = lookups / (t if tables.in_l[r][-1] >= 2 else 1)
            row_b = dim * eb_act
            net = max(total * (row_b + 8) / pool.nic_Bps, per_gpu * row_b / (links.inter_GBps * 1e9))
            gather = total * dim * 4.0 * 2 / pool.memory_bandwidth_Bps  # fp32 rows read + packed
            cpu_comm[r] = 2 * net  # rows forward, row gradients backward
            cpu_s[r] = 2 * gather + 2 * pool.device.efficiency.kernel_overhead_s
            cpu_mem[r] = table.count * cpu_state_bytes_per_param(training)
            rows_touched = min(float(table.shape[0]), total * mesh.num_microbatches)
            cpu_opt[r] = rows_touched * dim * (2 * cpu_state_bytes_per_param(training) + 4.0) / pool.memory_bandwidth_Bps
    return replace(tables, mesh=mesh, sync_s=sync_s, opt_s=opt_s, weights_b=weights_b, grads_b=grads_b,
                   optstate_b=optstate_b, cpu_s=cpu_s, cpu_comm_s=cpu_comm, cpu_mem_b=cpu_mem, cpu_opt_s=cpu_opt)


def reshard_kinds(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """:func:`reshard_kind` over arrays."""
    src = np.asarray(src)
    dst = np.asarray(dst)
    out = np.where(dst == R, ALLGATHER, ALLTOALL)
    out = np.where(src == P, np.where(dst == R, ALLREDUCE, REDUCE_SCATTER), out)
    out = np.where((src == dst) | (dst == P) | (src == R), NONE, out)
    return out.astype(np.int64)


def _elt(graph: GraphSpec, name: str, dtype: str) -> int:
    from cost_model.graph.ir import DTYPE_BYTES

    dt = graph.tensors[name].dtype
    if dt is None:
        return 4 if dtype == "fp32" else 2
    return DTYPE_BYTES.get(dt, 2)


def _requires_grad(graph: GraphSpec, name: str) -> bool:
    from cost_model.graph.ir import INDEX_DTYPES

    dt = graph.tensors[name].dtype
    return dt not in INDEX_DTYPES and dt != "bool"


# ---- evaluation ------------------------------------------------------------------------------
@dataclass(frozen=True)
class StageResult:
    index: int
    ops: tuple[int, ...]  # op indices
    forward_s: float
    backward_s: float
    compute_s: float
    bwd_compute_s: float
    tp_comm_s: float
    pp_comm_s: float
    dp_comm_s: float
    optimizer_s: float
    weights_b: float
    grads_b: float
    optstate_b: float
    act_b: float  # per micro-batch
    inflight: int
    workspace_b: float
    peak_b: float

    @property
    def time_s(self) -> float:
        return self.forward_s + self.backward_s + self.pp_comm_s


@dataclass(frozen=True)
class GraphEval:
    step_time_s: float
    pipeline_s: float
    dp_exposed_s: float
    optimizer_s: float
    stages: tuple[StageResult, ...]
    cpu_stage_s: float
    cpu_comm_s: float
    cpu_memory_b: float
    cpu_fits: bool
    fits: bool
    breakdown_s: dict[str, float]
    bottleneck: str


def p2p_stage_times(tables: CostTables, stage_of_op: np.ndarray) -> np.ndarray:
    """Per stage: the time to send its outgoing activations forward and its incoming
    gradients backward (Megatron scatter/gather: 1/t of the bytes per rank over the link, then
    an all-gather over the t ranks)."""
    mesh = tables.mesh
    pp = mesh.pp
    out = np.zeros(pp)
    if pp == 1:
        return out
    cross = boundary_bytes(tables, stage_of_op)
    for k in range(pp - 1):
        tk = p2p_boundary_time(tables, cross[k], k)
        out[k] += tk
        out[k + 1] += tk
    return out


def boundary_bytes(tables: CostTables, stage_of_op: np.ndarray) -> np.ndarray:
    """Bytes (per dp replica, whole tensors) crossing each stage boundary k | k+1."""
    g = tables.graph
    pp = tables.mesh.pp
    cross = np.zeros(max(pp - 1, 0))
    for name, u in g.producer.items():
        cons = g.consumers.get(name, ())
        if not cons:
            continue
        su = stage_of_op[u]
        last = max(stage_of_op[c] for c in cons)
        for k in range(su, last):
            cross[k] += tables.tensor_bytes[name]
    return cross


def p2p_boundary_time(tables: CostTables, size_bytes: float, k: int) -> float:
    """One crossing of boundary k|k+1 by ``size_bytes`` (whole tensors per dp replica)."""
    return float(p2p_boundary_vector(tables, np.array([size_bytes]), k)[0])


def inflight(mesh: GraphMesh, k: int) -> int:
    return int(min(mesh.pp - k, mesh.num_microbatches))


def evaluate(tables: CostTables, choice: Sequence[int], stage_of_op: Sequence[int]) -> GraphEval:
    """Exact step time and memory of one assignment: ``choice[i]`` is the index of op i's
    sharding among its choices, ``stage_of_op[i]`` its pipeline stage (contiguous in the
    analysis order).  The formula is the module docstring's."""
    mesh = tables.mesh
    training = tables.training
    pp = mesh.pp
    m = mesh.num_microbatches
    choice = np.asarray(choice, dtype=np.int64)
    stage = np.asarray(stage_of_op, dtype=np.int64)
    rows = tables.row_start[:-1] + choice
    # edge resharding charged to the consumer
    edge_f = np.zeros(tables.graph.num_ops)
    edge_b = np.zeros(tables.graph.num_ops)
    for e, (u, v, _, _) in enumerate(tables.edges):
        edge_f[v] += tables.edge_fwd[e][choice[u], choice[v]]
        edge_b[v] += tables.edge_bwd[e][choice[u], choice[v]]
    p2p = p2p_stage_times(tables, stage)

    def per_stage(arr: np.ndarray) -> np.ndarray:
        return np.bincount(stage, weights=arr, minlength=pp)

    f = per_stage(tables.fwd_s[rows])
    b = per_stage(tables.bwd_s[rows])
    cf = per_stage(tables.comm_fwd_s[rows] + edge_f)
    cb = per_stage(tables.comm_bwd_s[rows] + edge_b)
    sync = per_stage(tables.sync_s[rows])
    opt = per_stage(tables.opt_s[rows])
    wb = per_stage(tables.weights_b[rows])
    gb = per_stage(tables.grads_b[rows])
    ob = per_stage(tables.optstate_b[rows])
    ab = per_stage(tables.act_b[rows])
    cpu_t = float(tables.cpu_s[rows].sum())
    cpu_c = float(tables.cpu_comm_s[rows].sum())
    cpu_mem = float(tables.cpu_mem_b[rows].sum())
    cpu_opt = float(tables.cpu_opt_s[rows].sum())

    stages: list[StageResult] = []
    times = []
    exposed = []
    window_frac = dp_overlap_fraction(training, mesh.device)
    for k in range(pp):
        fl = inflight(mesh, k)
        state = wb[k] + gb[k] + ob[k] + fl * ab[k]
        ws = WORKSPACE_BYTES + FRACTION * state
        st = StageResult(
            index=k, ops=tuple(int(i) for i in np.nonzero(stage == k)[0]),
            forward_s=float(f[k] + cf[k]), backward_s=float(b[k] + cb[k]), compute_s=float(f[k] + b[k]),
            bwd_compute_s=float(b[k]), tp_comm_s=float(cf[k] + cb[k]), pp_comm_s=float(p2p[k]), dp_comm_s=float(sync[k]),
            optimizer_s=float(opt[k]), weights_b=float(wb[k]), grads_b=float(gb[k]), optstate_b=float(ob[k]),
            act_b=float(ab[k]), inflight=fl, workspace_b=ws, peak_b=state + ws,
        )
        stages.append(st)
        times.append(st.time_s)
        exposed.append(max(0.0, sync[k] - (window_frac + k) * b[k]))
    cpu_stage = cpu_t + cpu_c
    all_times = times + ([cpu_stage] if cpu_stage > 0 else [])
    t_max = max(all_times)
    pipeline = m * t_max + sum(all_times) - t_max
    dp_exposed = max(exposed)
    optimizer = max(max(opt), cpu_opt) + 4 * mesh.device.efficiency.kernel_overhead_s
    step = pipeline + dp_exposed + optimizer
    cap = mesh.device.memory_bytes
    fits = all(s.peak_b <= cap for s in stages)
    cpu_fits = mesh.cpu is None or cpu_mem <= mesh.cpu.memory_bytes
    # breakdown along the critical path
    if cpu_stage > 0 and cpu_stage >= max(times):
        compute, tp_c, pp_c = m * cpu_t, 0.0, m * cpu_c
    else:
        kb = int(np.argmax(times))
        s = stages[kb]
        compute, tp_c, pp_c = m * s.compute_s, m * s.tp_comm_s, m * s.pp_comm_s
    breakdown = {
        "compute": compute, "recompute": 0.0, "tp_comm": tp_c, "cp_comm": 0.0, "ep_comm": 0.0, "pp_comm": pp_c,
        "dp_comm_exposed": dp_exposed, "bubble": max(0.0, pipeline - compute - tp_c - pp_c), "optimizer": optimizer,
    }
    bottleneck = max(breakdown, key=breakdown.get)
    return GraphEval(step, pipeline, dp_exposed, optimizer, tuple(stages), cpu_stage, cpu_c, cpu_mem, cpu_fits,
                     fits and cpu_fits, breakdown, bottleneck)


FRACTION = FRAGMENTATION_FRACTION


# ---- greedy assignment and pipeline split ------------------------------------------------
def local_cost(tables: CostTables) -> np.ndarray:
    """Per row: own time per micro-batch plus its share of step-level terms (what a greedy
    choice minimises before edges are considered)."""
    m = tables.mesh.num_microbatches
    return (tables.fwd_s + tables.bwd_s + tables.comm_fwd_s + tables.comm_bwd_s) * m + tables.sync_s + tables.opt_s \
        + (tables.cpu_s + tables.cpu_comm_s) * m


def greedy_choices(tables: CostTables, memory_weight: float = 0.0, rounds: int = 3, forbid_cpu: bool = False) -> np.ndarray:
    """Iterated conditional modes: start from each op's cheapest choice, then re-pick every op
    given its neighbours' current choices (edges both ways), a few sweeps.  ``memory_weight``
    (seconds per byte) trades time for memory when the plain greedy does not fit."""
    g = tables.graph
    n = g.num_ops
    own = local_cost(tables)
    m = tables.mesh.num_microbatches
    mem = tables.weights_b + tables.grads_b + tables.optstate_b + tables.act_b * min(tables.mesh.pp, m)
    own = own + memory_weight * mem
    if forbid_cpu:
        own = np.where(np.array([nm == "embedding_on_cpu" for nm in tables.names]), np.inf, own)
    choice = np.zeros(n, dtype=np.int64)
    for i in range(n):
        r = tables.rows(i)
        choice[i] = int(np.argmin(own[r.start:r.stop]))
    return _icm_with(tables, choice, own, rounds)


def op_times(tables: CostTables, choice: np.ndarray) -> np.ndarray:
    """Per op: fwd+bwd compute, internal and incoming resharding per micro-batch."""
    rows = tables.row_start[:-1] + choice
    t = tables.fwd_s[rows] + tables.bwd_s[rows] + tables.comm_fwd_s[rows] + tables.comm_bwd_s[rows]
    t = t.copy()
    for e, (u, v, _, _) in enumerate(tables.edges):
        t[v] += tables.edge_fwd[e][choice[u], choice[v]] + tables.edge_bwd[e][choice[u], choice[v]]
    return t


def split_stages(tables: CostTables, choice: np.ndarray, cut_positions: Sequence[int] | None = None,
                 headroom_fraction: float = 0.0) -> np.ndarray | None:
    """Contiguous split of the analysis order into ``pp`` stages minimising the bottleneck stage
    time (op times + boundary p2p) under per-stage memory, by dynamic programming over the
    allowed cut positions (a cut at position p puts order[p:] after it; default: the starts of
    elementwise chains).  Returns stage_of_op, or None when no split fits."""
    mesh = tables.mesh
    pp = mesh.pp
    n = tables.graph.num_ops
    if pp == 1:
        return np.zeros(n, dtype=np.int64)
    order = tables.analysis.order
    ot = op_times(tables, choice)[order]
    rows = tables.row_start[:-1] + choice
    static = (tables.weights_b + tables.grads_b + tables.optstate_b)[rows][order]
    act = tables.act_b[rows][order]
    cum_t = np.concatenate([[0.0], np.cumsum(ot)])
    cum_s = np.concatenate([[0.0], np.cumsum(static)])
    cum_a = np.concatenate([[0.0], np.cumsum(act)])
    if cut_positions is None:
        cut_positions = np.nonzero(tables.analysis.chain_start)[0]
    cuts = sorted(set(int(c) for c in cut_positions if 0 < c < n))
    pts = np.array([0] + cuts + [n], dtype=np.int64)
    P = len(pts)
    if pp > P - 1:
        return None
    cap = mesh.device.memory_bytes * (1.0 - headroom_fraction)
    crossing = _position_crossing(tables)[pts]
    p2p = np.zeros((pp, P))  # p2p[k, j]: one crossing of boundary k|k+1 placed at pts[j]
    for k in range(pp - 1):
        p2p[k] = p2p_boundary_vector(tables, crossing, k)
    INF = np.inf
    best = np.full((pp, P), INF)
    arg = np.zeros((pp, P), dtype=np.int64)

    def seg_cost(i_idx: np.ndarray, j: int, k: int) -> np.ndarray:
        s_, e_ = pts[i_idx], pts[j]
        fl = inflight(mesh, k)
        mem = (cum_s[e_] - cum_s[s_] + fl * (cum_a[e_] - cum_a[s_])) * (1 + FRACTION) + WORKSPACE_BYTES
        tt = cum_t[e_] - cum_t[s_]
        if k > 0:
            tt = tt + p2p[k - 1][i_idx]
        if k < pp - 1:
            tt = tt + p2p[k][j]
        return np.where(mem > cap, INF, tt)

    for j in range(1, P):
        best[0][j] = seg_cost(np.array([0]), j, 0)[0]
    for k in range(1, pp):
        for j in range(k + 1, P):
            i_idx = np.arange(k, j)
            v = np.maximum(best[k - 1][i_idx], seg_cost(i_idx, j, k))
            a = int(np.argmin(v))
            best[k][j] = v[a]
            arg[k][j] = i_idx[a]
    if not np.isfinite(best[pp - 1][P - 1]):
        return None
    ends = [P - 1]
    for k in range(pp - 1, 0, -1):
        ends.append(int(arg[k][ends[-1]]))
    ends = ends[::-1]  # ends[k]: index into pts where stage k ends
    stage_pos = np.zeros(n, dtype=np.int64)
    start = 0
    for k in range(pp):
        e_ = int(pts[ends[k]])
        stage_pos[start:e_] = k
        start = e_
    stage_of_op = np.empty(n, dtype=np.int64)
    stage_of_op[order] = stage_pos
    return stage_of_op


def p2p_boundary_vector(tables: CostTables, sizes: np.ndarray, k: int) -> np.ndarray:
    """:func:`p2p_boundary_time` for an array of sizes (vectorised)."""
    mesh = tables.mesh
    t = mesh.t
    links = mesh.links
    block = mesh.devices_per_stage
    gpn = links.gpus_per_node
    cross_node = (k * block) // gpn != ((k + 2) * block - 1) // gpn
    sizes = np.asarray(sizes, dtype=float)
    out = p2p_time_s(sizes / t, links, cross_node)
    if t > 1:
        out = out + allgather_time_s(t, sizes, links, min(t, gpn))
    return np.where(sizes > 0, out, 0.0)


def _position_crossing(tables: CostTables) -> np.ndarray:
    """crossing[p]: bytes of tensors produced before position p and consumed at or after it."""
    g = tables.graph
    pos = tables.analysis.position
    n = g.num_ops
    diff = np.zeros(n + 1)
    for name, u in g.producer.items():
        cons = g.consumers.get(name, ())
        if not cons:
            continue
        a = pos[u] + 1
        b = max(pos[c] for c in cons)
        if b >= a:
            diff[a] += tables.tensor_bytes[name]
            diff[b + 1] -= tables.tensor_bytes[name]
    return np.cumsum(diff)[: n + 1]


# ---- public estimate -----------------------------------------------------------------------
def gpu_groups(cluster: Cluster) -> list[NodeGroup]:
    return [g for g in cluster.node_groups if g.device.kind != "cpu" and cluster.available_nodes(g.name)]


def pick_group(cluster: Cluster, devices: int, dtype: str, name: str | None = None) -> NodeGroup:
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


def mesh_for(graph: GraphSpec, training: Training, cluster: Cluster, dp: int, t: int, pp: int, micro_batch: int,
             zero_stage: int = 1, group: NodeGroup | None = None, use_cpu: bool = True) -> GraphMesh:
    if training.global_batch_size % (dp * micro_batch):
        raise InvalidStrategy(
            f"global_batch_size {training.global_batch_size} is not divisible by dp·micro_batch_size = {dp}·{micro_batch}",
            field="strategy.micro_batch_size",
        )
    g = group or pick_group(cluster, dp * t * pp, training.dtype)
    m = training.global_batch_size // (dp * micro_batch)
    return GraphMesh(g, t, dp, pp, micro_batch, m, zero_stage, CpuPool.from_cluster(cluster) if use_cpu else None)


def estimate_graph(
    graph: GraphSpec,
    training: Training,
    cluster: Cluster,
    strategy: Any,
    op_shardings: Mapping[str, str] | None = None,
    stages: Sequence[Sequence[str]] | None = None,
    node_group: str | None = None,
) -> Estimate:
    """Estimate one strategy on an operator graph (contract v1 ``prediction``).

    ``strategy`` supplies dp, tp (the size of the sharding axis), pp, micro_batch_size and
    zero_stage (cp, ep and vpp must be 1).  ``op_shardings`` maps op names to sharding names
    (see the module docstring); ops not named get the greedy choice given the others.
    ``stages`` lists the op names of each stage; by default the balanced contiguous split."""
    for key in ("cp", "ep", "vpp"):
        if getattr(strategy, key, 1) != 1:
            raise InvalidStrategy(f"{key} must be 1 for operator graphs (got {getattr(strategy, key)})", field=f"strategy.{key}")
    if getattr(strategy, "recompute", "none") != "none":
        raise InvalidStrategy("recompute is not modelled for operator graphs; use 'none'", field="strategy.recompute")
    dp, t, pp, mbs = strategy.dp, strategy.tp, strategy.pp, strategy.micro_batch_size
    if dp * t * pp > cluster.total_gpus:
        raise InvalidStrategy(f"dp·tp·pp = {dp * t * pp} devices but the cluster has {cluster.total_gpus} available", field="strategy.dp")
    if pp > graph.num_ops:
        raise InvalidStrategy(f"pp={pp} exceeds the {graph.num_ops} operators", field="strategy.pp")
    group = pick_group(cluster, dp * t * pp, training.dtype, node_group)
    mesh = mesh_for(graph, training, cluster, dp, t, pp, mbs, getattr(strategy, "zero_stage", 0), group,
                    use_cpu=bool(op_shardings) and "embedding_on_cpu" in set(op_shardings.values()))
    tables = build_tables(graph, training, mesh)
    choice = assignment_from_names(tables, op_shardings or {})
    if stages is not None:
        stage_of_op = stage_from_names(tables, stages)
    else:
        stage_of_op = split_stages(tables, choice)
        if stage_of_op is None:
            stage_of_op = split_stages(tables, choice, headroom_fraction=-1e9)  # best split ignoring memory
    ev = evaluate(tables, choice, stage_of_op)
    return to_estimate(tables, ev)


def assignment_from_names(tables: CostTables, op_shardings: Mapping[str, str]) -> np.ndarray:
    """Choice indices for named shardings; unnamed ops take the greedy choice given them."""
    g = tables.graph
    index = {op.name: i for i, op in enumerate(g.ops)}
    fixed: dict[int, int] = {}
    for name, sh in op_shardings.items():
        if name not in index:
            raise InvalidGraph(f"op_shardings names unknown operator {name!r}", field=f"op_shardings.{name}")
        k = tables.choice_index(index[name], sh)
        if k is None:
            avail = [tables.names[r] for r in tables.rows(index[name])]
            raise InvalidGraph(f"sharding {sh!r} is not available for {name!r} here; choose one of {', '.join(avail)}",
                               field=f"op_shardings.{name}")
        fixed[index[name]] = k
    choice = greedy_choices(tables)
    if not fixed:
        return choice
    for i, k in fixed.items():
        choice[i] = k
    # re-optimise the free ops around the fixed ones
    big = local_cost(tables).copy()
    for i, k in fixed.items():
        for j, r in enumerate(tables.rows(i)):
            if j != k:
                big[r] = np.inf
    return _icm_with(tables, choice, big)


def _icm_with(tables: CostTables, choice: np.ndarray, own: np.ndarray, rounds: int = 3) -> np.ndarray:
    n = tables.graph.num_ops
    m = tables.mesh.num_microbatches
    in_edges: list[list[int]] = [[] for _ in range(n)]
    out_edges: list[list[int]] = [[] for _ in range(n)]
    for e, (u, v, _, _) in enumerate(tables.edges):
        in_edges[v].append(e)
        out_edges[u].append(e)
    for _ in range(rounds):
        changed = False
        for i in tables.analysis.order:
            r = tables.rows(int(i))
            c = own[r.start:r.stop].copy()
            for e in in_edges[i]:
                u = tables.edges[e][0]
                c += m * (tables.edge_fwd[e][choice[u], :] + tables.edge_bwd[e][choice[u], :])
            for e in out_edges[i]:
                v = tables.edges[e][1]
                c += m * (tables.edge_fwd[e][:, choice[v]] + tables.edge_bwd[e][:, choice[v]])
            best = int(np.argmin(c))
            if best != choice[i] and c[best] < c[choice[i]] - 1e-15:
                choice[i] = best
                changed = True
        if not changed:
            break
    return choice


def stage_from_names(tables: CostTables, stages: Sequence[Sequence[str]]) -> np.ndarray:
    g = tables.graph
    index = {op.name: i for i, op in enumerate(g.ops)}
    if len(stages) != tables.mesh.pp:
        raise InvalidStrategy(f"{len(stages)} stages given for pp={tables.mesh.pp}", field="stages")
    out = np.full(g.num_ops, -1, dtype=np.int64)
    for k, names in enumerate(stages):
        for nm in names:
            if nm not in index:
                raise InvalidGraph(f"stage {k} names unknown operator {nm!r}", field=f"stages[{k}]")
            out[index[nm]] = k
    if (out < 0).any():
        missing = [g.ops[i].name for i in np.nonzero(out < 0)[0][:5]]
        raise InvalidGraph(f"operators in no stage: {', '.join(missing)}", field="stages")
    for name, u in g.producer.items():
        for c in g.consumers.get(name, ()):
            if out[c] < out[u]:
                raise InvalidGraph(f"{g.ops[c].name!r} (stage {out[c]}) consumes {name!r} from a later stage {out[u]}", field="stages")
    return out


def to_estimate(tables: CostTables, ev: GraphEval, warnings: Sequence[str] = ()) -> Estimate:
    mesh = tables.mesh
    training = tables.training
    g = tables.graph
    order_pos = tables.analysis.position
    stage_results = []
    for s in ev.stages:
        ops = sorted(s.ops, key=lambda i: order_pos[i])
        has_emb = any(g.ops[i].category in ("embedding",) or (g.ops[i].category == "gather" and g.ops[i].params) for i in ops)
        mem = {
            "weights": s.weights_b / 1e9,
            "gradients": s.grads_b / 1e9,
            "optimizer_state": s.optstate_b / 1e9,
            "activations": s.act_b * s.inflight / 1e9,
            "workspace": s.workspace_b / 1e9,
        }
        stage_results.append(StageEstimate(
            index=s.index,
            first_layer=int(order_pos[ops[0]]) if ops else 0,
            last_layer=int(order_pos[ops[-1]]) if ops else -1,
            device=mesh.device.name,
            node_group=mesh.group.name,
            has_embedding=has_emb,
            has_head=s.index == mesh.pp - 1,
            forward_s=s.forward_s + s.pp_comm_s / 2,
            backward_s=s.backward_s + s.pp_comm_s / 2,
            peak_memory_GB=s.peak_b / 1e9,
            memory_capacity_GB=mesh.device.memory_GB,
            memory_GB=mem,
        ))
    step = ev.step_time_s
    n_dev = mesh.num_devices
    model_flops = tables.model_flops_per_microbatch * mesh.dp * mesh.num_microbatches
    peak = mesh.device.peak_tflops(training.dtype)
    model_tflops = model_flops / step / n_dev / 1e12
    warn = list(warnings)
    if not ev.fits:
        worst = max(stage_results, key=lambda s: s.peak_memory_GB - s.memory_capacity_GB)
        if worst.peak_memory_GB > worst.memory_capacity_GB:
            warn.append(f"does not fit: stage {worst.index} needs {worst.peak_memory_GB:.1f} GB per GPU, "
                        f"{worst.device} has {worst.memory_capacity_GB:.0f} GB")
        if not ev.cpu_fits and mesh.cpu is not None:
            warn.append(f"does not fit: CPU parameter servers need {ev.cpu_memory_b / 1e9:.1f} GB, "
                        f"the CPU nodes have {mesh.cpu.memory_bytes / 1e9:.0f} GB")
    if ev.cpu_stage_s > 0:
        warn.append(f"embedding tables on {mesh.cpu.nodes} CPU node(s): {ev.cpu_memory_b / 1e9:.1f} GB, "
                    f"{ev.cpu_stage_s * 1e3:.2f} ms per micro-batch (lookup and row transfer)")
    return Estimate(
        step_time_s=step,
        tokens_per_s=training.tokens_per_step / step,
        samples_per_s=training.global_batch_size / step,
        model_tflops_per_gpu=model_tflops,
        hardware_tflops_per_gpu=model_tflops,
        mfu=model_tflops / peak,
        fits=ev.fits,
        peak_memory_GB=tuple(s.peak_memory_GB for s in stage_results),
        breakdown_s={k: float(v) for k, v in ev.breakdown_s.items()},
        stages=tuple(stage_results),
        num_devices=n_dev,
        num_microbatches=mesh.num_microbatches,
        bottleneck=ev.bottleneck,
        profile_ids=tuple(x for x in (mesh.device.profile_id,) if x),
        warnings=tuple(warn),
    )
