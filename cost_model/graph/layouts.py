"""Sharding layouts of an operator graph along the ``t`` axis of a stage, the choices each
operator has, and the collectives that change a tensor's layout.

Parallel layout (Alpa-style, Zheng et al. 2022, with the data-parallel axis fixed): along the
``t`` axis (consecutive ranks, inside a node when ``t ≤ gpus_per_node``) each operator picks a
*sharding*: ``replicate``, ``split_batch``, ``split_weight_cols`` / ``split_weight_rows``
(Megatron column / row parallel), ``split_conv_channels``, ``split_heads``, ``split_seq``,
``shard_embedding_rows`` (vocab-parallel, partial-sum output), ``shard_embedding_rows_alltoall``
(DLRM/TorchRec row-wise with all-to-all), ``shard_embedding_cols``, ``split_vocab``
(vocab-parallel loss), ``split_dim{d}`` for layout operators, and ``embedding_on_cpu``
(parameter-server placement on the cluster's CPU nodes, the Paddle heterogeneous pipeline of
Ao et al. 2021).

Each sharding fixes the layout of every input, input gradient and output: replicated ``R``,
partial sum ``P``, or split along dimension ``d`` (``S_d``).  An edge whose producer layout
differs from the consumer's requirement costs a collective over the ``t`` ranks (forward, and
its dual for the gradient in backward): ``S→R`` all-gather, ``P→R`` all-reduce, ``P→S``
reduce-scatter, ``S_d→S_e`` all-to-all, ``R→S`` and ``→P`` free (a local slice).  Megatron's
tensor parallelism is the special case column-parallel QKV/FC1 (input ``R``, gradient ``P``:
all-reduce in backward) and row-parallel projection/FC2 (output ``P``: all-reduce forward).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass

import numpy as np

from cost_model.comm import allgather_time_s, allreduce_time_s, alltoall_time_s, reduce_scatter_time_s
from cost_model.devices import BYTES_PER_ELEMENT
from cost_model.graph.ir import OpSpec
from cost_model.graph.mesh import GraphMesh
from cost_model.graph.op_cost import OpCost

# ---- layouts -------------------------------------------------------------------------------
R, P = 0, 1  # replicated, partial sum; S_d = 2 + d (split along dimension d)


def S(d: int) -> int:
    """The layout code of a split along dimension ``d``."""
    return 2 + d


def layout_name(code: int) -> str:
    """``R``, ``P`` or ``S{d}``."""
    return "R" if code == R else "P" if code == P else f"S{code - 2}"


# Reshard kinds
NONE, ALLGATHER, ALLREDUCE, REDUCE_SCATTER, ALLTOALL = 0, 1, 2, 3, 4


def reshard_kind(src: int, dst: int) -> int:
    """The collective that turns layout ``src`` into ``dst`` (module docstring)."""
    if src in (dst, R) or dst == P:
        return NONE
    if src == P:
        return ALLREDUCE if dst == R else REDUCE_SCATTER
    return ALLGATHER if dst == R else ALLTOALL


def reshard_kinds(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """:func:`reshard_kind` over arrays."""
    src = np.asarray(src)
    dst = np.asarray(dst)
    out = np.where(dst == R, ALLGATHER, ALLTOALL)
    out = np.where(src == P, np.where(dst == R, ALLREDUCE, REDUCE_SCATTER), out)
    out = np.where((src == dst) | (dst == P) | (src == R), NONE, out)
    return out.astype(np.int64)


def grad_target(out_layout: int) -> int:
    """Layout in which a producer needs the gradient of an output it produced in ``out_layout``:
    the same, except that the gradient of a partial sum is replicated."""
    return R if out_layout == P else out_layout


def reshard_time_s(kind: np.ndarray, size_bytes: np.ndarray, mesh: GraphMesh) -> np.ndarray:
    """Seconds of the collectives over the ``t`` ranks of a stage (consecutive ranks,
    ``min(t, gpn)`` per node) for arrays of kinds and full-tensor sizes in bytes, by the
    collective models of :mod:`cost_model.comm`."""
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
            out[sel] = fn(t, size_bytes[sel] * scale, links, per_node)
    return out


# ---- choices ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Choice:
    """One sharding of one operator: the layouts of its inputs, input gradients and outputs,
    and what its shard computes and holds.  ``name``, ``in_l``, ``in_g`` and ``out_l`` may be
    given positionally."""

    name: str
    in_l: tuple[int, ...]
    in_g: tuple[int, ...]
    out_l: tuple[int, ...]
    _: KW_ONLY
    gemm: tuple[float, float, float, float] | None = None  # sharded (m, n, k, batch)
    attn: tuple[float, float, float, float, float] | None = None  # (bh, sq, skv, d, causal_frac)
    mem_frac: float = 1.0  # fraction of the op's memory-bound bytes this GPU moves
    params_dev: float = 0.0  # parameters held per GPU
    sync: str = "dp"  # gradient replicas: "dp" or "dpt"
    comm: tuple[tuple[int, float, int], ...] = ()  # (kind, bytes, 0 fwd / 1 bwd) inside the op
    extra_act_frac: float = 1.0
    cpu: bool = False


Shapes = list[tuple[int, ...]]


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
            # The input chunk (in[d]/t)·suffix must equal the output chunk (out[e]/t)·suffix.
            same_chunk = in_shape[d] * math.prod(in_shape[d + 1:]) == size * math.prod(out_shape[e + 1:]) or size == in_shape[d]
            if size % t == 0 and size >= t and same_chunk:
                return e
            if size == 1:
                acc *= size
                continue
            return None
        acc *= size
        if acc > before:
            return None
    return None


@dataclass(frozen=True, kw_only=True)
class _Operator:
    """What a choice rule sees: the operator, its cost, concrete shapes, the ``t`` axis size,
    its parameter count and its replicated choice."""

    op: OpSpec
    cost: OpCost
    ins: Shapes
    outs: Shapes
    t: int
    params: float
    rep: Choice

    @property
    def n_in(self) -> int:
        return len(self.op.inputs)

    @property
    def n_out(self) -> int:
        return len(self.op.outputs)


def _is_table(op: OpSpec) -> bool:
    """An embedding-like table: looked up by row from a 2-D parameter."""
    if op.category == "embedding":
        return True
    return op.category == "gather" and bool(op.params) and op.attr("axis", 0) == 0 and len(op.params[0].shape) == 2


def _batch_split(x: _Operator) -> Choice | None:
    """Every input and output split along the batch dimension (data parallel inside ``t``)."""
    t, ins, outs = x.t, x.ins, x.outs
    if not all(_split_ok(s, 0, t) for s in ins + outs if len(s) > 0):
        return None
    if any(len(s) == 0 for s in ins + outs):
        return None
    g = x.cost.gemm
    gm = None
    if g is not None:
        gm = (g.m / t, g.n, g.k, g.batch) if (g.weight or g.batch == 1) else (g.m, g.n, g.k, g.batch / t)
    at = None
    if x.rep.attn is not None:
        bh, sq, skv, d, fr = x.rep.attn
        at = (bh / t, sq, skv, d, fr)
    return Choice("split_batch", (S(0),) * x.n_in, (S(0),) * x.n_in, (S(0),) * x.n_out, gemm=gm, attn=at, mem_frac=1.0 / t,
                  params_dev=x.params, sync="dpt", extra_act_frac=1.0 / t)


def _with_batch_split(x: _Operator) -> list[Choice]:
    b = _batch_split(x)
    return [b] if b else []


def _gemm(x: _Operator) -> tuple[float, float, float, float]:
    g = x.cost.gemm
    if g is None:  # pragma: no cover - op_cost gives GEMM-like operators their GEMM
        raise ValueError(f"{x.op.name} has no GEMM shape")
    return (g.m, g.n, g.k, g.batch)


def _matmul_choices(x: _Operator) -> list[Choice]:
    op, ins, outs, t, P_all = x.op, x.ins, x.outs, x.t, x.params
    m, n, k, batch = _gemm(x)
    choices: list[Choice] = []
    w = op.param("weight") or op.param("B")
    if w is not None:
        xs = ins[0]
        r = len(xs)
        choices += _with_batch_split(x)
        bias = op.param("bias") or op.param("C")
        nb = float(bias.count) if bias else 0.0
        if n >= t:
            choices.append(Choice("split_weight_cols", (R,), (P,), (S(len(outs[0]) - 1),), gemm=(m, n / t, k, 1),
                                  params_dev=P_all / t, extra_act_frac=1.0))
        if k >= t and r >= 1 and _split_ok(xs, r - 1, t):
            choices.append(Choice("split_weight_rows", (S(r - 1),), (S(r - 1),), (P,), gemm=(m, n, k / t, 1),
                                  params_dev=(P_all - nb) / t + nb))
        return choices
    a, bsh = ins
    o = outs[0]
    if len(a) >= 3 and len(bsh) >= 3 and len(a) == len(bsh) and _split_ok(a, 0, t) and _split_ok(bsh, 0, t):
        choices.append(Choice("split_batch", (S(0), S(0)), (S(0), S(0)), (S(0),), gemm=(m, n, k, batch / t),
                              mem_frac=1.0 / t, sync="dpt", extra_act_frac=1.0 / t))
    if len(a) == 4 and len(bsh) == 4 and _split_ok(a, 1, t) and _split_ok(bsh, 1, t):
        choices.append(Choice("split_heads", (S(1), S(1)), (S(1), S(1)), (S(1),), gemm=(m, n, k, batch / t),
                              mem_frac=1.0 / t, sync="dpt", extra_act_frac=1.0 / t))
    if len(a) >= 2 and len(bsh) == 2 and _split_ok(bsh, 1, t):
        choices.append(Choice("split_weight_cols", (R, S(1)), (P, S(1)), (S(len(o) - 1),), gemm=(m, n / t, k, batch),
                              mem_frac=1.0 / t, extra_act_frac=1.0 / t))
    return choices


def _conv_choices(x: _Operator) -> list[Choice]:
    op, t, P_all = x.op, x.t, x.params
    m, n, k, batch = _gemm(x)
    choices = _with_batch_split(x)
    groups = op.attr("group", op.attr("groups", 1))
    w = op.param("weight") or op.param("W")
    if groups == 1 and w is not None and w.shape[0] >= t:
        choices.append(Choice("split_conv_channels", (R,), (P,), (S(1),), gemm=(m, n / t, k, batch), params_dev=P_all / t))
    elif groups > 1 and groups % t == 0:
        choices.append(Choice("split_conv_channels", (S(1),), (S(1),), (S(1),), gemm=(m, n, k, batch / t),
                              params_dev=P_all / t, extra_act_frac=1.0 / t))
    return choices


def _attention_choices(x: _Operator) -> list[Choice]:
    op, ins, t = x.op, x.ins, x.t
    choices = _with_batch_split(x)
    q = ins[0]
    if x.rep.attn is None:  # pragma: no cover - op_cost gives attention its shape
        return choices
    bh, sq, skv, d, fr = x.rep.attn
    if len(q) == 3:
        heads = op.attr("num_heads", op.attr("q_num_heads"))
        kvh = op.attr("kv_num_heads", heads)
        ok, lay = heads % t == 0 and kvh % t == 0, S(2)
    else:
        ok, lay = _split_ok(q, 1, t) and all(_split_ok(s, 1, t) for s in ins[:3]), S(1)
    if ok:
        choices.append(Choice("split_heads", (lay,) * x.n_in, (lay,) * x.n_in, (lay,) * x.n_out, attn=(bh / t, sq, skv, d, fr),
                              mem_frac=1.0 / t, extra_act_frac=1.0 / t))
    return choices


def _norm_choices(x: _Operator) -> list[Choice]:
    op, t, P_all = x.op, x.t, x.params
    xs = x.ins[0]
    choices = _with_batch_split(x)
    if op.type in ("LayerNorm", "RMSNorm") and len(xs) >= 3 and _split_ok(xs, 1, t) and (op.attr("axis", -1) in (-1, len(xs) - 1)):
        lay = S(1)
        choices.append(Choice("split_seq", (lay,) * x.n_in, (lay,) * x.n_in, (lay,) + (R,) * (x.n_out - 1), mem_frac=1.0 / t,
                              params_dev=P_all, sync="dpt", extra_act_frac=1.0 / t))
    if op.type == "BatchNorm" and _split_ok(xs, 1, t):
        lay = S(1)
        choices.append(Choice("split_channels", (lay,) * x.n_in, (lay,) * x.n_in, (lay,) * x.n_out, mem_frac=1.0 / t,
                              params_dev=P_all / t, extra_act_frac=1.0 / t))
    return choices


def _table_choices(x: _Operator) -> list[Choice]:
    """Embedding tables: rows (vocab-parallel, partial-sum output, or DLRM row-wise with
    all-to-all of indices and rows) or columns over the ``t`` ranks."""
    op, t, P_all, n_in = x.op, x.t, x.params, x.n_in
    idx = x.ins[-1]
    table = op.params[0]
    dim = table.shape[1]
    row_elt_bytes = BYTES_PER_ELEMENT.get(table.dtype or "", None) or 2
    lookups = math.prod(idx)
    choices = _with_batch_split(x)
    o = x.outs[0]
    if table.shape[0] >= t:
        choices.append(Choice("shard_embedding_rows", (R,) * n_in, (R,) * n_in, (P,), mem_frac=1.0 / t, params_dev=P_all / t))
        if _split_ok(idx, 0, t) and all(_split_ok(s, 0, t) for s in x.outs):
            rows_bytes = lookups / t * dim * row_elt_bytes
            idx_bytes = lookups / t * 8
            comm = ((ALLTOALL, idx_bytes, 0), (ALLTOALL, rows_bytes, 0), (ALLTOALL, rows_bytes, 1))
            choices.append(Choice("shard_embedding_rows_alltoall", (S(0),) * n_in, (S(0),) * n_in, (S(0),) * x.n_out,
                                  mem_frac=1.0 / t, params_dev=P_all / t, comm=comm, extra_act_frac=1.0 / t))
    if dim >= t and len(o) >= 1:
        choices.append(Choice("shard_embedding_cols", (R,) * n_in, (R,) * n_in, (S(len(o) - 1),), mem_frac=1.0 / t,
                              params_dev=P_all / t))
    return choices


_CHOICE_RULES: dict[str, Callable[[_Operator], list[Choice]]] = {
    "matmul": _matmul_choices,
    "conv": _conv_choices,
    "attention": _attention_choices,
    "norm": _norm_choices,
}
_FOLLOWING = ("softmax", "elementwise", "activation", "pool", "custom", "reduce", "layout", "gather", "loss")


def op_choices(op: OpSpec, cost: OpCost, shapes: Mapping[str, tuple[int, ...]], mesh: GraphMesh,
               graph_inputs: set[str]) -> list[Choice]:
    """Every sharding of ``op`` over the mesh's ``t`` axis, the replicated one first (and the
    CPU parameter-server placement of a table looked up by graph-input indices when the
    mesh has CPU nodes)."""
    t = mesh.t
    cat = op.category
    n_in, n_out = len(op.inputs), len(op.outputs)
    ins = [shapes[x] for x in op.inputs]
    outs = [shapes[x] for x in op.outputs]
    P_all = float(op.param_count)
    attn = None
    if cost.attention is not None:
        bh, sq, skv, d, causal = cost.attention
        attn = (bh, sq, skv, d, 0.5 if causal and sq == skv else 1.0)
    g = cost.gemm
    rep = Choice("replicate", (R,) * n_in, (R,) * n_in, (R,) * n_out, gemm=None if g is None else (g.m, g.n, g.k, g.batch),
                 attn=attn, params_dev=P_all)
    choices = [rep]
    is_table = _is_table(op)
    if is_table and mesh.cpu is not None and op.inputs and op.inputs[-1] in graph_inputs:
        lay = S(0) if (t > 1 and _split_ok(ins[-1], 0, t)) else R
        choices.append(Choice("embedding_on_cpu", (lay,) * n_in, (lay,) * n_in, (lay,) * n_out, mem_frac=0.0,
                              params_dev=0.0, cpu=True))
    if t == 1:
        return choices
    x = _Operator(op=op, cost=cost, ins=ins, outs=outs, t=t, params=P_all, rep=rep)
    rule = _CHOICE_RULES.get(cat)
    if rule is not None:
        return choices + rule(x)
    if cat in _FOLLOWING and not is_table:
        return choices + _generic_choices(x)
    if is_table:
        return choices + _table_choices(x)
    return choices


def _loss_choices(x: _Operator) -> list[Choice]:
    """A loss split along the batch, or (cross-entropy) along the vocabulary, with the
    all-reduces of the row max, sum and target logit (Megatron's vocab-parallel loss)."""
    ins, outs, t = x.ins, x.outs, x.t
    res: list[Choice] = []
    logits = ins[0]
    if _split_ok(logits, 0, t) and all(len(s) == 0 or _split_ok(s, 0, t) for s in ins):
        in_l = tuple(S(0) if len(s) else R for s in ins)
        res.append(Choice("split_batch", in_l, in_l, (R,) * len(outs), mem_frac=1.0 / t, extra_act_frac=1.0 / t))
    if x.op.type == "CrossEntropy" and len(logits) >= 1 and _split_ok(logits, len(logits) - 1, t):
        rows = math.prod(logits[:-1]) * 4.0
        in_l = (S(len(logits) - 1),) + (R,) * (len(ins) - 1)
        res.append(Choice("split_vocab", in_l, in_l, (R,) * len(outs), mem_frac=1.0 / t, extra_act_frac=1.0 / t,
                          comm=((ALLREDUCE, rows, 0), (ALLREDUCE, rows, 0), (ALLREDUCE, rows, 0))))
    return res


def _custom_choices(x: _Operator) -> list[Choice]:
    """A custom operator: only a batch split, when every tensor has a splittable batch."""
    ins, outs, t = x.ins, x.outs, x.t
    if all(len(s) for s in ins + outs) and all(_split_ok(s, 0, t) for s in ins + outs):
        return [Choice("split_batch", (S(0),) * len(ins), (S(0),) * len(ins), (S(0),) * len(outs), mem_frac=1.0 / t,
                       params_dev=x.params, sync="dpt", extra_act_frac=1.0 / t)]
    return []


#: (input layouts, input-gradient layouts, output layouts) of a split, and its dedup key.
_Follow = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[object, ...]]


def _plain(in_l: tuple[int, ...], out_l: tuple[int, ...]) -> _Follow:
    return in_l, in_l, out_l, (in_l, out_l)


def _norm_axes(axes: Sequence[int], rank: int) -> list[int]:
    return [a + rank if a < 0 else a for a in axes]


def _follow_view(x: _Operator, d: int, out0: tuple[int, ...]) -> _Follow | None:
    xs = x.ins[0]
    if x.op.type == "Transpose":
        perm = list(x.op.attr("perm") or list(range(len(xs)))[::-1])
        if not _split_ok(xs, d, x.t):
            return None
        e = perm.index(d)
    else:
        view = _view_map(xs, out0, d, x.t)
        if view is None:
            return None
        e = view
    return _plain((S(d),) + (R,) * (len(x.ins) - 1), (S(e),))


def _follow_copy(x: _Operator, d: int) -> _Follow | None:
    op, ins, outs, t = x.op, x.ins, x.outs, x.t
    xs = ins[0]
    ax = op.attr("axis", 0)
    ax = ax + len(xs) if ax < 0 else ax
    if op.type == "Slice":
        if d in _norm_axes(op.attr("axes") or list(range(len(op.attr("starts") or []))), len(xs)):
            return None
    elif d == ax and not all(s[d] % t == 0 for s in ins + outs):
        # Splitting along the concat/split axis itself works when every piece divides
        # evenly: rank r holds the r-th chunk of each piece (Megatron's interleaved
        # fused-QKV column order).
        return None
    if not all(_split_ok(s, d, t) for s in ins + outs):
        return None
    return _plain((S(d),) * len(ins), (S(d),) * len(outs))


def _follow_softmax(x: _Operator, d: int, out0: tuple[int, ...]) -> _Follow | None:
    rank = len(out0)
    ax = x.op.attr("axis", -1)
    ax = ax + rank if ax < 0 else ax
    if d == ax or not _split_ok(out0, d, x.t):
        return None
    return _plain((S(d),), (S(d),))


def _follow_reduce(x: _Operator, d: int) -> _Follow | None:
    op, xs = x.op, x.ins[0]
    axes_attr = op.attr("axes")
    if axes_attr is None:
        axes = list(range(len(xs)))
    else:
        axes = _norm_axes(axes_attr if isinstance(axes_attr, (list, tuple)) else [axes_attr], len(xs))
    if d in axes or not _split_ok(xs, d, x.t):
        return None
    e = d if op.attr("keepdims", 1) else d - sum(1 for a in axes if a < d)
    return _plain((S(d),), (S(e),))


def _follow_pool(x: _Operator, d: int) -> _Follow | None:
    if d > 1 or not _split_ok(x.ins[0], d, x.t):
        return None
    return _plain((S(d),), (S(d),))


def _follow_gather(x: _Operator, d: int, out0: tuple[int, ...]) -> _Follow | None:
    data = x.ins[0]
    ax = x.op.attr("axis", 0)
    ax = ax + len(data) if ax < 0 else ax
    if d >= len(data) or d == ax or not _split_ok(data, d, x.t) or not _split_ok(out0, d, x.t):
        return None
    e = d
    if d > ax:  # the dimension moves by the index rank - 1
        e = d + len(x.ins[1]) - 1
        if e >= len(out0):
            return None
    return _plain((S(d), R), (S(e),))


def _follow_elementwise(x: _Operator, d: int, out0: tuple[int, ...]) -> _Follow | None:
    """Elementwise with broadcasting: inputs that carry dimension ``d`` split with it, broadcast
    inputs stay replicated with a partial-sum gradient."""
    if not _split_ok(out0, d, x.t):
        return None
    rank = len(out0)
    in_l_list, in_g_list = [], []
    for s in x.ins:
        k = d - (rank - len(s))
        if 0 <= k < len(s) and s[k] == out0[d]:
            in_l_list.append(S(k))
            in_g_list.append(S(k))
        else:
            in_l_list.append(R)
            in_g_list.append(P)
    in_l = tuple(in_l_list)
    return in_l, tuple(in_g_list), (S(d),) * len(x.outs), (in_l, d)


def _follow(x: _Operator, d: int, out0: tuple[int, ...]) -> _Follow | None:
    """The split of dimension ``d`` a layout-following operator supports, or None."""
    cat, typ = x.op.category, x.op.type
    if cat == "layout" and typ in ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Transpose"):
        return _follow_view(x, d, out0)
    if cat == "layout" and typ in ("Concat", "Split", "Slice"):
        return _follow_copy(x, d)
    if cat == "softmax":
        return _follow_softmax(x, d, out0)
    if cat == "reduce":
        return _follow_reduce(x, d)
    if cat == "pool":
        return _follow_pool(x, d)
    if cat == "gather":
        return _follow_gather(x, d, out0)
    return _follow_elementwise(x, d, out0)


def _generic_choices(x: _Operator) -> list[Choice]:
    """Layout-following operators: a split of dimension d of the output (and of every input
    that carries that dimension; broadcast inputs stay replicated with a partial gradient)."""
    cat = x.op.category
    out0 = x.outs[0] if x.outs else ()
    if not out0 and cat != "loss":
        return []
    if cat == "loss":
        return _loss_choices(x)
    if cat == "custom":
        return _custom_choices(x)
    res: list[Choice] = []
    seen: set[tuple[object, ...]] = set()
    for d in _cand_dims(max(len(out0), len(x.ins[0]) if x.ins else 0)):
        split = _follow(x, d, out0)
        if split is None:
            continue
        in_l, in_g, out_l, key = split
        if key in seen:
            continue
        seen.add(key)
        res.append(Choice("split_batch" if d == 0 else f"split_dim{d}", in_l, in_g, out_l, mem_frac=1.0 / x.t,
                          params_dev=x.params, sync="dpt" if x.params else "dp", extra_act_frac=1.0 / x.t))
    return res
