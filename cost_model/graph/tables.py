"""Cost tables of an operator graph on one mesh: every (operator, sharding) row and every
edge, timed and sized, so that the step time of any assignment is a sum of table entries
(:func:`cost_model.graph.evaluate.evaluate`) and the planner's CP-SAT model can read its
coefficients from the same arrays.

Cost per operator choice (per micro-batch, per GPU): GEMMs by :func:`compute.gemm_time_s` on the
sharded shape (backward as two GEMMs, dX and dW, with their own shapes), fused attention by
the transformer path's :func:`cost_model.compute.flash_attention_time_s`,
memory-bound operators by bytes over HBM bandwidth where chains of elementwise operators fuse into one kernel (intermediates stay on chip; with
``training.fused_kernels`` false — eager PyTorch — every operator is its own kernel and pass,
and unfused attention runs each of its elementwise ops separately).  The graph path places
compute on accelerators only (CPU node groups serve embedding tables), so the CPU per-element
terms of the transformer path have no counterpart here.  Memory: weights, gradients and
optimizer state per parameter as the transformer path
(:func:`cost_model.transformer.layer_cost.model_state_bytes_per_param`, ZeRO-1 shards optimizer
state over the replicas of a weight), saved activations per micro-batch (times the 1F1B
in-flight count in the evaluation).

The CPU parameter-server stage (when some embedding is placed on CPU nodes) is an extra
pipeline stage in front: its time per micro-batch is the row gather on the CPU nodes plus the
transfer of the looked-up rows (and back, their gradients) over the slower of the CPU nodes'
NICs and the GPUs' NIC share; its sparse optimizer update runs with the GPUs' optimizer step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from cost_model.comm import Links, allgather_time_s, p2p_time_s, ranks_per_node, reduce_scatter_time_s
from cost_model.compute import FLASH_BACKWARD_RATIO, flash_attention_time_s, gemm_time_s, memory_bound_time_s
from cost_model.graph.analysis import GraphAnalysis, analyse, op_classes
from cost_model.graph.ir import DTYPE_BYTES, INDEX_DTYPES, GraphSpec
from cost_model.graph.layouts import NONE, Choice, grad_target, op_choices, reshard_kinds, reshard_time_s
from cost_model.graph.mesh import GraphMesh
from cost_model.graph.op_cost import OpCost, graph_op_costs, saved_input_slots
from cost_model.training import Training
from cost_model.transformer.layer_cost import (
    eager_attention_elementwise_s,
    fsdp_reduces_each_microbatch,
    gradient_reduce_bytes,
    model_state_bytes_per_param,
    optimizer_bytes_per_param,
    optimizer_kernels,
    optimizer_state_partitioned,
    param_bytes,
    step_sync_ring_passes,
)
from cost_model.units import gbps_to_bytes_per_s

Layouts = tuple[int, ...]


def _zeros() -> np.ndarray:
    return np.zeros(0)


@dataclass(frozen=True, kw_only=True)
class CostTables:
    """Costs of every (operator, sharding) row and every edge for one :class:`GraphMesh`.

    Rows are grouped by operator: ``row_start[i] .. row_start[i+1]`` are op i's choices (op
    indices are the graph's).  Per-row arrays (seconds per micro-batch per GPU, bytes per GPU):

    * ``fwd_s``/``bwd_s``: compute of the op's shard (with memory-bound fusion);
    * ``comm_fwd_s``/``comm_bwd_s``: collectives inside the op (all-to-all of embedding rows,
      vocab-parallel loss statistics);
    * ``sync_s``: the once-per-step data-parallel sync of its weights (bandwidth term; gradient
      and weight passes by ZeRO stage and optimizer, ``layer_cost.step_sync_ring_passes``);
    * ``opt_s``: optimizer update of its weight shard (bandwidth term);
    * ``weights_bytes``/``gradients_bytes``/``optimizer_state_bytes``: model state;
      ``activation_bytes``: saved activations per micro-batch (each saved tensor counted once,
      at its producer, at its layout's size);
    * ``cpu_s``/``cpu_comm_s``/``cpu_memory_bytes``/``cpu_opt_s``: parameter-server placement;
    * ``flops``: executed FLOPs per GPU per micro-batch (forward + backward).

    Edges: ``edges[e] = (u, v, tensor, slot)`` with ``edge_fwd_s[e]``/``edge_bwd_s[e]`` matrices
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
    in_l: list[Layouts]
    in_g: list[Layouts]
    out_l: list[Layouts]
    fwd_s: np.ndarray
    bwd_s: np.ndarray
    comm_fwd_s: np.ndarray
    comm_bwd_s: np.ndarray
    sync_s: np.ndarray
    opt_s: np.ndarray
    weights_bytes: np.ndarray
    gradients_bytes: np.ndarray
    optimizer_state_bytes: np.ndarray
    activation_bytes: np.ndarray
    cpu_s: np.ndarray
    cpu_comm_s: np.ndarray
    cpu_memory_bytes: np.ndarray
    cpu_opt_s: np.ndarray
    flops: np.ndarray
    edges: list[tuple[int, int, str, int]]
    edge_fwd_s: list[np.ndarray]
    edge_bwd_s: list[np.ndarray]
    tensor_bytes: dict[str, float]
    capacity_bytes: float
    model_flops_per_microbatch: float
    params_dev: np.ndarray = field(default_factory=_zeros)
    param_tensors: np.ndarray = field(default_factory=_zeros)  # per row: tensors a for-loop optimizer visits
    sync_dpt: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    cpu_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    has_edges: bool = True

    def n_choices(self, op: int) -> int:
        return int(self.row_start[op + 1] - self.row_start[op])

    def rows(self, op: int) -> range:
        return range(int(self.row_start[op]), int(self.row_start[op + 1]))

    def choice_index(self, op: int, name: str) -> int | None:
        for k, r in enumerate(self.rows(op)):
            if self.names[r] == name:
                return k
        return None


def cpu_state_bytes_per_param(training: Training) -> float:
    """Bytes per parameter of a CPU parameter-server table: fp32 weights with their optimizer
    state (Adam: 2 moments) and no dense gradient buffer (sparse rows are applied as they
    arrive): 12 B/param (SGD 8 B)."""
    return 12.0 if training.adam else 8.0


def _activation_elt_bytes(dtype: str) -> int:
    """Bytes per element of activations in the training dtype (fp32, else 16-bit)."""
    return 4 if dtype == "fp32" else 2


def _tensor_elt_bytes(graph: GraphSpec, name: str, dtype: str) -> float:
    dt = graph.tensors[name].dtype
    if dt is None:
        return _activation_elt_bytes(dtype)
    return DTYPE_BYTES.get(dt, 2)


def _requires_grad(graph: GraphSpec, name: str) -> bool:
    dt = graph.tensors[name].dtype
    return dt not in INDEX_DTYPES and dt != "bool"


@dataclass(frozen=True, kw_only=True)
class _Rows:
    """The (operator, choice) rows: ``row_start[i] .. row_start[i+1]`` are op i's."""

    row_start: list[int]
    row_op: list[int]
    choices: list[Choice]


def _enumerate_rows(graph: GraphSpec, costs: Sequence[OpCost], shapes: dict[str, tuple[int, ...]], mesh: GraphMesh,
                    op_class: np.ndarray) -> _Rows:
    """Every op's choices; the operators of one structural class (the repeated layers of a
    model, :func:`cost_model.graph.analysis.op_classes`) share one enumeration."""
    graph_inputs = set(graph.inputs)
    row_start = [0]
    row_op: list[int] = []
    choices: list[Choice] = []
    memo: dict[int, list[Choice]] = {}
    for i, op in enumerate(graph.ops):
        key = int(op_class[i])
        found = memo.get(key)
        if found is None:
            found = memo[key] = op_choices(op, costs[i], shapes, mesh, graph_inputs)
        for c in found:
            row_op.append(i)
            choices.append(c)
        row_start.append(len(row_op))
    return _Rows(row_start=row_start, row_op=row_op, choices=choices)


def _distinct_rows(rows: _Rows, analysis: GraphAnalysis) -> tuple[_Rows, np.ndarray]:
    """The rows that differ in what they compute (same structural class and fusion: the
    repeated layers of a model share theirs), one representative operator's rows each, and the
    index of every row's representative row."""
    n_ops = len(analysis.op_class)
    keys = np.column_stack([analysis.op_class.astype(float), analysis.fused_bytes_fraction.astype(float),
                            analysis.first_kernel.astype(float)])
    _, first, uid = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    uid = uid.ravel()
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))  # number classes by first appearance
    uid = rank[uid]
    rep_ops = np.sort(first)
    row_start = np.asarray(rows.row_start, dtype=np.int64)
    n_choice = np.diff(row_start)
    rep_off = np.concatenate([[0], np.cumsum(n_choice[rep_ops])])
    row_op = np.asarray(rows.row_op, dtype=np.int64) if n_ops else np.zeros(0, dtype=np.int64)
    inverse = rep_off[uid[row_op]] + (np.arange(len(row_op)) - row_start[row_op])
    rep_row = [int(row_start[o]) + k for o in rep_ops for k in range(int(n_choice[o]))]
    return _Rows(row_start=[], row_op=[int(rows.row_op[r]) for r in rep_row], choices=[rows.choices[r] for r in rep_row]), inverse


class _RowWork:
    """What each row computes, gathered for vectorised timing: GEMMs (forward (m,n,k), backward
    dX (m,k,n) and dW (k,n,m)), attention cores, memory-bound bytes and kernels, collectives
    inside the op; and what it holds: parameters, extra saved bytes, executed FLOPs."""

    def __init__(self, n_rows: int, attn_dropout: float = 1.0) -> None:
        #: 1 when the model trains with dropout (attention probabilities included), else 0
        self.attn_dropout = attn_dropout
        self.g_rows: list[int] = []
        self.gemm: list[tuple[float, float, float, float]] = []  # (m, n, k, batch)
        self.g_backward: list[int] = []
        self.a_rows: list[int] = []
        self.attn: list[tuple[float, float, float, float, float]] = []
        self.mem_fwd_bytes = np.zeros(n_rows)
        self.mem_bwd_bytes = np.zeros(n_rows)
        self.kern = np.zeros(n_rows)
        self.params_dev = np.zeros(n_rows)
        self.sync_dpt = np.zeros(n_rows, dtype=bool)
        self.extra_act = np.zeros(n_rows)
        self.flops = np.zeros(n_rows)
        self.comm_rows: list[int] = []
        self.comm: list[tuple[int, float, int]] = []  # (kind, bytes, 0 fwd / 1 bwd)
        self.cpu_rows: list[int] = []


def _row_work(graph: GraphSpec, training: Training, analysis: GraphAnalysis, costs: Sequence[OpCost], rows: _Rows) -> _RowWork:
    act_elt_bytes = _activation_elt_bytes(training.dtype)
    unfused = training.attention == "unfused"
    eager = not training.fused_kernels
    # A graph that trains with dropout anywhere drops attention probabilities too (GPT-style
    # training; the transformer path's rule is the same by model family): the attention
    # operator's own dropout pass and mask exist only then.
    drop = 1.0 if any(op.type == "Dropout" for op in graph.ops) else 0.0
    w = _RowWork(len(rows.row_op), attn_dropout=drop)
    for r, c in enumerate(rows.choices):
        i = rows.row_op[r]
        oc = costs[i]
        w.params_dev[r] = c.params_dev
        w.sync_dpt[r] = c.sync == "dpt"
        if c.cpu:
            w.cpu_rows.append(r)
            continue
        # Eager frameworks run every operator as its own kernel (no chain fusion).
        frac = 1.0 if eager else analysis.fused_bytes_fraction[i]
        if c.gemm is not None:
            m, n, k, b = c.gemm
            for direction, (mm, nn, kk) in enumerate(((m, n, k), (m, k, n), (k, n, m))):
                w.g_rows.append(r)
                w.gemm.append((mm, nn, kk, b))
                w.g_backward.append(0 if direction == 0 else 1)
            w.flops[r] += 6.0 * m * n * k * b
        elif c.attn is not None:
            bh, sq, skv, d, _fr = c.attn
            w.a_rows.append(r)
            w.attn.append(c.attn)
            w.flops[r] += 3.0 * 4.0 * bh * sq * skv * d
            if unfused:  # the probabilities (and dropout's output and mask) — activation_bytes' rule
                per_score = (act_elt_bytes + drop * 2 * act_elt_bytes) if eager else (2 * act_elt_bytes + drop)
                w.extra_act[r] += bh * sq * skv * per_score
        else:
            w.mem_fwd_bytes[r] = oc.fwd_bytes * frac * c.mem_frac
            w.mem_bwd_bytes[r] = oc.bwd_bytes * frac * c.mem_frac
            w.kern[r] = (1 if oc.fwd_bytes > 0 else 0) if eager else analysis.first_kernel[i]
            w.flops[r] += (oc.fwd_flops + oc.bwd_flops) * c.mem_frac
            if eager and oc.eager is not None:  # one graph operator, several eager ones (an RMSNorm)
                w.mem_fwd_bytes[r] += oc.eager.fwd_bytes * c.mem_frac
                w.mem_bwd_bytes[r] += oc.eager.bwd_bytes * c.mem_frac
                w.kern[r] += oc.eager.kernels
                w.extra_act[r] += oc.eager.saved_bytes * c.extra_act_frac
        w.extra_act[r] += oc.extra_saved_bytes * c.extra_act_frac
        for comm in c.comm:
            w.comm_rows.append(r)
            w.comm.append(comm)
    return w


def _attention_times(w: _RowWork, training: Training, mesh: GraphMesh) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds of each attention row: FlashAttention, or Megatron's unfused
    core — QKᵀ and PV GEMMs plus scale-mask-softmax and dropout over the scores (9 B/score
    forward, 11 B backward), the transformer path's figures."""
    device, dt = mesh.device, training.dtype
    bh, sq, skv, d, fr = (np.array(col, dtype=float) for col in zip(*w.attn, strict=True))
    if training.attention != "unfused":
        f = flash_attention_time_s(bh, sq, skv, d, device, dt, causal_fraction=fr)
        return f, FLASH_BACKWARD_RATIO * f
    qk_s = gemm_time_s(sq, skv, d, device, dt, batch=bh)
    pv_s = gemm_time_s(sq, d, skv, device, dt, batch=bh)
    elems = bh * sq * skv
    if not training.fused_kernels:  # plain PyTorch: every op of it its own pass (the transformer path's rule)
        elem_fwd_s, elem_bwd_s = eager_attention_elementwise_s(elems, _activation_elt_bytes(dt), w.attn_dropout, device)
    else:
        elem_fwd_s = memory_bound_time_s(9 * elems, device, kernels=2)
        elem_bwd_s = memory_bound_time_s(11 * elems, device, kernels=2)
    return qk_s + pv_s + elem_fwd_s, 2 * (qk_s + pv_s) + elem_bwd_s


def _compute_times(w: _RowWork, training: Training, mesh: GraphMesh) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) compute seconds of every row per micro-batch."""
    device = mesh.device
    fwd_s = memory_bound_time_s(w.mem_fwd_bytes, device, kernels=w.kern)
    bwd_s = np.where(w.mem_bwd_bytes > 0, memory_bound_time_s(w.mem_bwd_bytes, device, kernels=w.kern), 0.0)
    fwd_s = np.where((w.mem_fwd_bytes > 0) | (w.kern > 0), fwd_s, 0.0)
    if w.g_rows:
        gm, gn, gk, gb = (np.array(col) for col in zip(*w.gemm, strict=True))
        gt = gemm_time_s(gm, gn, gk, device, training.dtype, batch=gb)
        gdir_a = np.array(w.g_backward)
        np.add.at(fwd_s, np.array(w.g_rows)[gdir_a == 0], gt[gdir_a == 0])
        np.add.at(bwd_s, np.array(w.g_rows)[gdir_a == 1], gt[gdir_a == 1])
    if w.a_rows:
        attn_fwd_s, attn_bwd_s = _attention_times(w, training, mesh)
        ar = np.array(w.a_rows)
        np.add.at(fwd_s, ar, attn_fwd_s)
        np.add.at(bwd_s, ar, attn_bwd_s)
    return fwd_s, bwd_s


def _internal_comm_times(w: _RowWork, mesh: GraphMesh) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds of the collectives inside each row's operator."""
    n_rows = len(w.mem_fwd_bytes)
    comm_fwd = np.zeros(n_rows)
    comm_bwd = np.zeros(n_rows)
    if w.comm_rows:
        kinds, sizes, dirs = zip(*w.comm, strict=True)
        ct = reshard_time_s(np.array(kinds), np.array(sizes, dtype=float), mesh)
        cd = np.array(dirs)
        cr = np.array(w.comm_rows)
        np.add.at(comm_fwd, cr[cd == 0], ct[cd == 0])
        np.add.at(comm_bwd, cr[cd == 1], ct[cd == 1])
    return comm_fwd, comm_bwd


def saved_tensors(graph: GraphSpec) -> list[tuple[str, int, int, bool]]:
    """Tensors autograd saves, each once: ``(name, op, slot, produced)`` — its producer and
    output slot, or (a graph input) its first saver and input slot."""
    saved_by: dict[str, tuple[int, int]] = {}
    for i, op in enumerate(graph.ops):
        for j in saved_input_slots(op):
            if j < len(op.inputs):
                saved_by.setdefault(op.inputs[j], (i, j))
    out = []
    for name, (v, j) in saved_by.items():
        if name in graph.producer:
            u = graph.producer[name]
            out.append((name, u, graph.ops[u].outputs.index(name), True))
        else:
            out.append((name, v, j, False))
    return out


def _saved_activation_bytes(graph: GraphSpec, rows: _Rows, extra_act: np.ndarray, tensor_bytes: dict[str, float],
                            t: int, saved: Sequence[tuple[str, int, int, bool]] | None = None) -> np.ndarray:
    """Saved activations per row per micro-batch: each saved tensor once, at its producer's
    layout (1/t of it when split), graph inputs at their first saver's; plus the operator's own
    buffers."""
    act = extra_act.copy()
    row_start = rows.row_start
    for name, op, slot, produced in (saved if saved is not None else saved_tensors(graph)):
        size = tensor_bytes[name]
        for r in range(row_start[op], row_start[op + 1]):
            lay = rows.choices[r].out_l[slot] if produced else rows.choices[r].in_l[slot]
            act[r] += size / t if lay >= 2 else size
    return act


def _edge_tables(graph: GraphSpec, row_start: Sequence[int], in_l: Sequence[Layouts], in_g: Sequence[Layouts],
                 out_l: Sequence[Layouts], tensor_bytes: dict[str, float], mesh: GraphMesh
                 ) -> tuple[list[tuple[int, int, str, int]], list[np.ndarray], list[np.ndarray]]:
    """Edges ``(u, v, tensor, slot)`` and their ``[choices of u, choices of v]`` resharding
    seconds, forward (producer layout → consumer layout) and backward (consumer's gradient
    layout → the producer's, for tensors that carry a gradient)."""
    edges: list[tuple[int, int, str, int]] = []
    edge_key: list[tuple[int, int, float]] = []
    unique: dict[tuple[int, int, float], int] = {}
    requires_grad = {name: _requires_grad(graph, name) for name in graph.tensors}
    # layouts of a producer's output / a consumer's input over its choices, interned
    out_ids: dict[tuple[int, ...], int] = {}
    in_ids: dict[tuple[tuple[int, int], ...], int] = {}
    out_layouts: dict[tuple[int, int], int] = {}
    in_layouts: dict[tuple[int, int, bool], int] = {}
    for v, op in enumerate(graph.ops):
        for j, name in enumerate(op.inputs):
            u = graph.producer.get(name)
            if u is None:
                continue
            slot = graph.ops[u].outputs.index(name)
            edges.append((u, v, name, j))
            rg = requires_grad[name]
            if (u, slot) not in out_layouts:
                lay = tuple(out_l[r][slot] for r in range(row_start[u], row_start[u + 1]))
                out_layouts[(u, slot)] = out_ids.setdefault(lay, len(out_ids))
            if (v, j, rg) not in in_layouts:
                lay_in = tuple((in_l[r][j], in_g[r][j] if rg else -1) for r in range(row_start[v], row_start[v + 1]))
                in_layouts[(v, j, rg)] = in_ids.setdefault(lay_in, len(in_ids))
            key = (out_layouts[(u, slot)], in_layouts[(v, j, rg)], tensor_bytes[name])
            edge_key.append(key)
            unique.setdefault(key, len(unique))
    # one resharding matrix per distinct (producer layouts, consumer layouts, size): repeated
    # layers share theirs
    outs_of = list(out_ids)
    ins_of = list(in_ids)
    e_src: list[tuple[int, int, int, int]] = []
    e_size: list[float] = []
    for (oi, ii, size) in unique:
        outs, ins = outs_of[oi], ins_of[ii]
        for ol in outs:
            for il, ig in ins:
                e_src.append((ol, il, grad_target(ol), ig))
                e_size.append(size)
    mats_f: list[np.ndarray] = []
    mats_b: list[np.ndarray] = []
    if unique:
        src = np.array(e_src, dtype=np.int64)
        size_a = np.array(e_size, dtype=float)
        kf = reshard_kinds(src[:, 0], src[:, 1])
        kb = np.where(src[:, 3] >= 0, reshard_kinds(src[:, 3], src[:, 2]), NONE)
        tf = reshard_time_s(kf, size_a, mesh)
        tb = reshard_time_s(kb, size_a, mesh)
        pos = 0
        for (oi, ii, _size) in unique:
            nu, nv = len(outs_of[oi]), len(ins_of[ii])
            cnt = nu * nv
            mats_f.append(tf[pos:pos + cnt].reshape(nu, nv))
            mats_b.append(tb[pos:pos + cnt].reshape(nu, nv))
            pos += cnt
    edge_fwd = [mats_f[unique[k]] for k in edge_key]
    edge_bwd = [mats_b[unique[k]] for k in edge_key]
    return edges, edge_fwd, edge_bwd


def with_edges(tables: CostTables) -> CostTables:
    """``tables`` with its edges costed (a no-op when they are)."""
    if tables.has_edges:
        return tables
    edges, edge_fwd, edge_bwd = _edge_tables(tables.graph, [int(x) for x in tables.row_start], tables.in_l, tables.in_g,
                                             tables.out_l, tables.tensor_bytes, tables.mesh)
    return replace(tables, edges=edges, edge_fwd_s=edge_fwd, edge_bwd_s=edge_bwd, has_edges=True)


def build_tables(graph: GraphSpec, training: Training, mesh: GraphMesh, analysis: GraphAnalysis | None = None,
                 op_costs: list[OpCost] | None = None, edges: bool = True,
                 shapes: dict[str, tuple[int, ...]] | None = None,
                 saved: Sequence[tuple[str, int, int, bool]] | None = None) -> CostTables:
    """Cost every operator × sharding choice and every edge for ``mesh`` (vectorised): seconds
    per micro-batch per GPU and bytes per GPU, as :class:`CostTables` lists (module docstring).
    ``edges=False`` leaves the edges out (``has_edges`` False; :func:`with_edges` adds them):
    enough for bounds that need the rows only.  ``shapes`` (the graph bound to the micro-batch)
    and ``saved`` (:func:`saved_tensors`) may be passed in when several meshes share them."""
    analysis = analysis or analyse(graph)
    dt = training.dtype
    costs = op_costs if op_costs is not None else graph_op_costs(graph, mesh.micro_batch, training.sequence_length, dt,
                                                                 analysis.op_class)
    shapes = shapes if shapes is not None else graph.bind(mesh.micro_batch, training.sequence_length)
    op_class = analysis.op_class if len(analysis.op_class) == graph.num_ops else op_classes(graph)
    rows = _enumerate_rows(graph, costs, shapes, mesh, op_class)
    n_rows = len(rows.row_op)
    distinct, inverse = _distinct_rows(rows, replace(analysis, op_class=op_class))
    work = _row_work(graph, training, analysis, costs, distinct)
    fwd_s, bwd_s = (x[inverse] for x in _compute_times(work, training, mesh))
    comm_fwd, comm_bwd = (x[inverse] for x in _internal_comm_times(work, mesh))
    is_cpu = np.zeros(len(distinct.row_op), dtype=bool)
    is_cpu[np.array(work.cpu_rows, dtype=np.int64)] = True
    tensor_bytes = {name: float(math.prod(shp)) * _tensor_elt_bytes(graph, name, dt) for name, shp in shapes.items()}
    act = _saved_activation_bytes(graph, rows, work.extra_act[inverse], tensor_bytes, mesh.t, saved)
    zeros = np.zeros(n_rows)
    model_flops = 0.0
    for oc, op in zip(costs, graph.ops, strict=True):
        if op.category in ("matmul", "conv", "attention"):
            model_flops += oc.fwd_flops + oc.bwd_flops
    params_dev = work.params_dev[inverse]
    tables = for_mesh(CostTables(
        graph=graph, mesh=mesh, training=training, analysis=analysis, op_costs=costs,
        row_start=np.array(rows.row_start, dtype=np.int64), row_op=np.array(rows.row_op, dtype=np.int64),
        names=[c.name for c in rows.choices], in_l=[c.in_l for c in rows.choices], in_g=[c.in_g for c in rows.choices],
        out_l=[c.out_l for c in rows.choices],
        fwd_s=fwd_s, bwd_s=bwd_s, comm_fwd_s=comm_fwd, comm_bwd_s=comm_bwd, sync_s=zeros, opt_s=zeros,
        weights_bytes=zeros, gradients_bytes=zeros, optimizer_state_bytes=zeros, activation_bytes=act,
        cpu_s=zeros, cpu_comm_s=zeros, cpu_memory_bytes=zeros, cpu_opt_s=zeros, flops=work.flops[inverse],
        params_dev=params_dev,
        param_tensors=np.array([len(graph.ops[i].params) for i in rows.row_op], dtype=float) * (params_dev > 0),
        sync_dpt=work.sync_dpt[inverse], cpu_rows=np.flatnonzero(is_cpu[inverse]).astype(np.int64),
        edges=[], edge_fwd_s=[], edge_bwd_s=[], tensor_bytes=tensor_bytes, has_edges=False,
        capacity_bytes=mesh.device.memory_bytes, model_flops_per_microbatch=model_flops,
    ), mesh)
    return with_edges(tables) if edges else tables


def _cpu_terms(tables: CostTables, mesh: GraphMesh) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(lookup seconds, transfer seconds, memory bytes, optimizer seconds) of the CPU
    parameter-server rows.  The table lives on the CPU nodes (fp32 + optimizer state); per
    micro-batch slot the rows of all dp replicas are gathered there and sent over the slower of
    the CPU NICs (aggregate) and each GPU's NIC share; gradients of the rows come back the same
    way; the sparse update touches only rows looked up this step."""
    training, graph, t, links = tables.training, tables.graph, mesh.t, mesh.links
    n_rows = len(tables.params_dev)
    cpu_s = np.zeros(n_rows)
    cpu_comm = np.zeros(n_rows)
    cpu_mem = np.zeros(n_rows)
    cpu_opt = np.zeros(n_rows)
    pool = mesh.cpu
    if not len(tables.cpu_rows) or pool is None:
        return cpu_s, cpu_comm, cpu_mem, cpu_opt
    act_elt_bytes = _activation_elt_bytes(training.dtype)
    shapes = graph.bind(mesh.micro_batch, training.sequence_length)
    for r in tables.cpu_rows:
        i = int(tables.row_op[r])
        op = graph.ops[i]
        table = op.params[0]
        dim = table.shape[1]
        lookups = float(math.prod(shapes[op.inputs[-1]]))  # per dp replica per micro-batch
        total = mesh.dp * lookups
        per_gpu = lookups / (t if tables.in_l[r][-1] >= 2 else 1)
        row_bytes = dim * act_elt_bytes
        net = max(total * (row_bytes + 8) / pool.nic_bytes_per_s, per_gpu * row_bytes / gbps_to_bytes_per_s(links.inter_GBps))
        gather = total * dim * 4.0 * 2 / pool.memory_bandwidth_bytes_per_s  # fp32 rows read + packed
        cpu_comm[r] = 2 * net  # rows forward, row gradients backward
        cpu_s[r] = 2 * gather + 2 * pool.device.efficiency.kernel_overhead_s
        cpu_mem[r] = table.count * cpu_state_bytes_per_param(training)
        rows_touched = min(float(table.shape[0]), total * mesh.num_microbatches)
        cpu_opt[r] = rows_touched * dim * (2 * cpu_state_bytes_per_param(training) + 4.0) / pool.memory_bandwidth_bytes_per_s
    return cpu_s, cpu_comm, cpu_mem, cpu_opt


def sync_ranks(tables: CostTables, mesh: GraphMesh) -> np.ndarray:
    """Per row: the ranks its weights are synchronised and ZeRO-sharded over — dp, or dp·t for a
    row replicated across the sharding axis (``sync_dpt``)."""
    out: np.ndarray = np.where(tables.sync_dpt, mesh.dp * mesh.t, mesh.dp).astype(float)
    return out


def for_mesh(tables: CostTables, mesh: GraphMesh) -> CostTables:
    """The tables for ``mesh``, which must share the node group, ``t`` and micro-batch size
    with ``tables.mesh`` (operator costs, choices and edges depend only on those): recomputes
    what depends on dp, pp, the number of micro-batches and ZeRO — gradient synchronisation
    (seconds), optimizer time (seconds), model-state bytes and the CPU parameter-server terms."""
    base = tables.mesh
    if (mesh.group.name, mesh.t, mesh.micro_batch) != (base.group.name, base.t, base.micro_batch):
        raise ValueError("for_mesh needs the same node group, t and micro-batch size")
    training = tables.training
    device = mesh.device
    links = mesh.links
    t = mesh.t
    params_dev = tables.params_dev
    n_rows = len(params_dev)
    sync_n = sync_ranks(tables, mesh)
    w_pp, g_pp, o_pp = (np.broadcast_to(np.asarray(x, dtype=float), (n_rows,))
                        for x in model_state_bytes_per_param(training, mesh.zero_stage, sync_n, mesh.pp))
    # Bandwidth term of the step's ring passes over sync_n ranks (their latency is paid per
    # bucket, not per operator, and is negligible next to the volume): the gradients at the
    # bytes the framework reduces them in, the updated weights at the training dtype's, as many
    # passes of each as the ZeRO stage and the optimizer make (the transformer path's rule).
    nolat = Links(links.intra_GBps, links.inter_GBps, links.gpus_per_node, 0.0)
    stride = np.where(tables.sync_dpt, 1.0, float(t))
    per_node = ranks_per_node(sync_n, stride, links.gpus_per_node)  # type: ignore[no-untyped-call, unused-ignore]
    grad_passes, weight_passes = step_sync_ring_passes(training, mesh.zero_stage, mesh.pp)

    def ring(value_bytes: float) -> np.ndarray:
        out: np.ndarray = np.where(sync_n > 1, reduce_scatter_time_s(sync_n, params_dev * value_bytes, nolat, per_node), 0.0)
        return out

    sync_s = grad_passes * ring(gradient_reduce_bytes(training)) + weight_passes * ring(param_bytes(training))
    # unsharded FSDP without a pipeline all-reduces with every micro-batch instead of once
    # (layer_cost.fsdp_reduces_each_microbatch, for which step_sync_ring_passes gives none)
    every = float(fsdp_reduces_each_microbatch(training, mesh.zero_stage, mesh.pp))
    sync_s = sync_s + every * 2.0 * mesh.num_microbatches * ring(gradient_reduce_bytes(training))
    opt_shard = np.where(optimizer_state_partitioned(training, mesh.zero_stage, mesh.pp), sync_n, 1.0)
    hbm_bytes_per_s = gbps_to_bytes_per_s(device.memory_bandwidth_GBps) * device.efficiency.memory_fraction
    opt_s = params_dev * optimizer_bytes_per_param(training) / opt_shard / hbm_bytes_per_s
    if not training.fused_kernels:  # a for-loop optimizer launches its kernels per parameter tensor
        opt_s = opt_s + optimizer_kernels(training, tables.param_tensors) * device.efficiency.kernel_overhead_s
    cpu_s, cpu_comm, cpu_mem, cpu_opt = _cpu_terms(tables, mesh)
    return replace(tables, mesh=mesh, sync_s=sync_s, opt_s=opt_s, weights_bytes=params_dev * w_pp,
                   gradients_bytes=params_dev * g_pp, optimizer_state_bytes=params_dev * o_pp, cpu_s=cpu_s,
                   cpu_comm_s=cpu_comm, cpu_memory_bytes=cpu_mem, cpu_opt_s=cpu_opt)


# ---- per-assignment aggregates -------------------------------------------------------------
def local_cost(tables: CostTables) -> np.ndarray:
    """Per row, seconds: own time per micro-batch × m plus its share of step-level terms (what
    a greedy choice minimises before edges are considered)."""
    m = tables.mesh.num_microbatches
    own: np.ndarray = (tables.fwd_s + tables.bwd_s + tables.comm_fwd_s + tables.comm_bwd_s) * m + tables.sync_s \
        + tables.opt_s + (tables.cpu_s + tables.cpu_comm_s) * m
    return own


def op_times(tables: CostTables, choice: np.ndarray) -> np.ndarray:
    """Per op, seconds per micro-batch: fwd+bwd compute, internal and incoming resharding."""
    rows = tables.row_start[:-1] + choice
    t = tables.fwd_s[rows] + tables.bwd_s[rows] + tables.comm_fwd_s[rows] + tables.comm_bwd_s[rows]
    out: np.ndarray = t.copy()
    for e, (u, v, _, _) in enumerate(tables.edges):
        out[v] += tables.edge_fwd_s[e][choice[u], choice[v]] + tables.edge_bwd_s[e][choice[u], choice[v]]
    return out


# ---- pipeline boundaries -------------------------------------------------------------------
def p2p_boundary_vector(tables: CostTables, sizes: np.ndarray, k: int) -> np.ndarray:
    """:func:`p2p_boundary_time` for an array of sizes in bytes (vectorised), seconds."""
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


def p2p_boundary_time(tables: CostTables, size_bytes: float, k: int) -> float:
    """Seconds of one crossing of boundary k|k+1 by ``size_bytes`` (whole tensors per dp
    replica): Megatron's scatter/gather (Narayanan et al. 2021, §4.1), 1/t of the bytes per
    rank over the link, then an all-gather over the t ranks."""
    return float(p2p_boundary_vector(tables, np.array([size_bytes]), k)[0])


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


def p2p_stage_times(tables: CostTables, stage_of_op: np.ndarray) -> np.ndarray:
    """Per stage, seconds per micro-batch: the time to send its outgoing activations forward and
    its incoming gradients backward (:func:`p2p_boundary_time` of each boundary it touches)."""
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


def position_crossing_bytes(tables: CostTables) -> np.ndarray:
    """crossing[p]: bytes of tensors produced before position p (of the analysis order) and
    consumed at or after it — what a stage cut at p sends."""
    an = tables.analysis
    n = tables.graph.num_ops
    if an.span_tensors is None:  # an analysis built without its spans
        an = analyse(tables.graph)
    assert an.span_tensors is not None
    size = np.array([tables.tensor_bytes[name] for name in an.span_tensors], dtype=float)
    diff = np.zeros(n + 2)
    np.add.at(diff, an.span_from, size)
    np.add.at(diff, an.span_to + 1, -size)
    out: np.ndarray = np.cumsum(diff)[: n + 1]
    return out
