"""Graph analysis independent of the mesh: a topological order that keeps chains of
elementwise operators contiguous, the chains themselves (the coarsening groups of the planner
and the cut positions of the pipeline split), and what kernel fusion saves inside a chain.

A chain is a head operator followed by elementwise / activation / layout operators each
consuming a tensor produced inside the chain; the memory-bound members of a chain fuse into one
kernel, so a tensor made and used only inside the chain never goes to HBM (unless autograd saves
it) — the fusion XLA and TorchInductor perform on such chains.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from cost_model.graph.ir import GraphSpec, OpSpec
from cost_model.graph.op_cost import saved_input_slots

FOLLOWER_CATEGORIES = ("elementwise", "activation", "layout")
MEMORY_BOUND = ("norm", "softmax", "elementwise", "activation", "reduce", "pool", "loss", "gather", "layout", "embedding")
MAX_CHAIN = 12


@dataclass(frozen=True, kw_only=True)
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
    #: [ops] structural class: operators of one class (same type, parameters, attributes,
    #: symbolic shapes and dtypes — the repeated layers of a model) cost the same on any mesh
    op_class: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    #: tensors live across positions: ``span_tensors[j]`` is produced before position
    #: ``span_from[j]`` and read up to position ``span_to[j]`` (inclusive, ≥ span_from[j])
    span_tensors: tuple[str, ...] | None = None
    span_from: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    span_to: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


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
    """The chain order, the chains and the per-operator fusion fractions of ``graph`` (module
    docstring)."""
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
        for j in saved_input_slots(op):
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
    names, span_from, span_to = _live_spans(graph, pos)
    return GraphAnalysis(order=np.array(order, dtype=np.int64), position=pos, chain_start=chain_start, chain_id=chain_id,
                         fused_bytes_fraction=frac, first_kernel=first, op_class=op_classes(graph),
                         span_tensors=names, span_from=span_from, span_to=span_to)


def _live_spans(graph: GraphSpec, pos: np.ndarray) -> tuple[tuple[str, ...], np.ndarray, np.ndarray]:
    """Tensors that cross some position of the order: (names, first position after the
    producer, last consumer's position)."""
    p = pos.tolist()
    names, lo, hi = [], [], []
    for name, u in graph.producer.items():
        cons = graph.consumers.get(name, ())
        if not cons:
            continue
        a, b = p[u] + 1, max(p[c] for c in cons)
        if b >= a:
            names.append(name)
            lo.append(a)
            hi.append(b)
    return tuple(names), np.array(lo, dtype=np.int64), np.array(hi, dtype=np.int64)


def op_classes(graph: GraphSpec) -> np.ndarray:
    """Structural class of every operator (numbered in order of first appearance): equal when
    type, category, parameters, attributes, explicit costs, the symbolic shapes and dtypes of
    inputs and outputs, and whether the last input is a graph input all agree."""
    inputs = set(graph.inputs)
    seen: dict[tuple[object, ...], int] = {}
    out = np.empty(graph.num_ops, dtype=np.int64)
    for i, op in enumerate(graph.ops):
        key = (op.type, op.category, op.params, repr(op.attrs), op.flops, op.bytes, op.backward_flops, op.backward_bytes,
               op.saved_bytes, tuple((graph.tensors[t].shape, graph.tensors[t].dtype) for t in op.inputs),
               tuple((graph.tensors[t].shape, graph.tensors[t].dtype) for t in op.outputs),
               bool(op.inputs) and op.inputs[-1] in inputs)
        out[i] = seen.setdefault(key, len(seen))
    return out


def _tensor_elems(graph: GraphSpec, t: str) -> float:
    """Element count at batch = seq = 1 (ratios only)."""
    return float(math.prod(d.coef for d in graph.tensors[t].shape))


def _op_bytes_estimate(graph: GraphSpec, op: OpSpec) -> float:
    return sum(_tensor_elems(graph, t) for t in op.inputs) + sum(_tensor_elems(graph, t) for t in op.outputs)
