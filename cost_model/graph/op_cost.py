"""FLOPs, bytes, parameters and saved activations of each operator of a graph on one
micro-batch (no parallelism; :mod:`cost_model.graph.tables` shards and times them).

FLOP and byte conventions (forward; backward derived per category):

* GEMM ``(m×k)·(k×n)``: ``2·m·n·k`` FLOPs; backward computes dX and dW, ``2×`` forward.
* Convolution: implicit GEMM with ``m = N·out_spatial``, ``n = C_out/g``, ``k = C_in/g·Πkernel``,
  ``g`` groups.
* Attention core (QKᵀ and PV): ``4·b·heads·s_q·s_kv·d`` as Narayanan et al. (2021) Eq. 3 count
  it; backward ``2×`` (``2.5×`` executed with FlashAttention's recompute, see
  :data:`cost_model.compute.FLASH_BACKWARD_RATIO`).
* Memory-bound operators (norms, softmax, elementwise, activations, reductions, pooling,
  gathers, copies): bytes read + written; their FLOPs are a few per element and never bound time.
* Reshape / Squeeze / Unsqueeze / Flatten / Identity are views (0 FLOPs, 0 bytes); Transpose /
  Concat / Split / Slice copy (0 FLOPs, read + write bytes).

Saved activations follow what PyTorch autograd keeps (Korthikanti et al. 2022, §4.1): a GEMM
keeps its input, an activation function its input, a norm its input (and fp32 statistics),
softmax its output, dropout a 1-byte mask per element, elementwise add nothing.  A tensor is
counted once (at its producer) however many consumers save it; for a GPT layer this gives the
paper's ``34·s·b·h`` bytes plus attention's own state.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from cost_model.devices import BYTES_PER_ELEMENT
from cost_model.errors import InvalidGraph
from cost_model.graph.ir import DTYPE_BYTES, NO_GRAD_TYPES, GraphSpec, OpSpec, ParamSpec
from cost_model.transformer.layer_cost import eager_rmsnorm_traffic, eager_saved_bytes_per_element

#: Forward FLOPs per output element of memory-bound operators (they never bound time; kept for
#: the FLOP count).  LayerNorm: mean, variance, normalise, scale, shift ≈ 8; softmax: max, sub,
#: exp, sum, div ≈ 5; GELU (tanh form) ≈ 8.
FLOPS_PER_ELEMENT = {
    "LayerNorm": 8, "RMSNorm": 5, "BatchNorm": 6, "GroupNorm": 8, "Softmax": 5, "LogSoftmax": 6,
    "Gelu": 8, "FastGelu": 8, "QuickGelu": 4, "Silu": 4, "Sigmoid": 4, "Tanh": 4, "Mish": 8, "Softplus": 4,
    "Elu": 3, "Selu": 3, "Celu": 3, "HardSwish": 3, "HardSigmoid": 2, "Softsign": 2, "CrossEntropy": 6,
}
#: Activation functions whose backward needs only a 1-bit/1-byte mask (not the input).
MASK_ONLY_TYPES = ("Relu", "LeakyRelu", "Dropout", "PRelu")
#: Elementwise ops whose backward needs their inputs (products, quotients, powers).
SAVES_INPUTS_TYPES = ("Mul", "Div", "Pow", "Max", "Min", "Where", "Sqrt", "Exp", "Log", "Reciprocal", "Erf", "Sin",
                      "Cos", "Clip")
#: Reductions and poolings whose backward needs their input (the arg-max, the product, the norm).
_SAVES_INPUT_REDUCTIONS = ("ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2", "ReduceLogSumExp")
_SAVES_INPUT_POOLS = ("MaxPool", "GlobalMaxPool", "LpPool")
#: Layout operators that are views (no data moves).
VIEW_TYPES = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")


@dataclass(frozen=True, kw_only=True)
class GemmShape:
    """``batch`` independent ``(m×k)·(k×n)`` GEMMs; ``weight``: the (k×n) operand is a trained
    parameter (backward then computes dW as well as dX)."""

    m: int
    n: int
    k: int
    batch: int = 1
    weight: bool = True


@dataclass(frozen=True, kw_only=True)
class OpCost:
    """One operator on one micro-batch (no parallelism): FLOPs, bytes moved to and from HBM,
    parameters (count and bytes) and saved activations (bytes).

    ``saved_inputs`` are indices into ``op.inputs`` of tensors autograd keeps for backward
    (their bytes are attributed to the tensor, once); ``extra_saved_bytes`` are operator-private
    buffers (masks, softmax statistics, attention probabilities)."""

    fwd_flops: float
    bwd_flops: float
    fwd_bytes: float
    bwd_bytes: float
    params: int
    param_bytes: float
    saved_inputs: tuple[int, ...]
    extra_saved_bytes: float
    gemm: GemmShape | None = None
    attention: tuple[int, int, int, int, bool] | None = None  # (batch·heads, q_len, kv_len, head_dim, causal)
    has_grad: bool = True
    #: what the operator costs beyond this in eager PyTorch (``training.fused_kernels`` false), where
    #: a graph's single operator runs as several (an RMSNorm); None: nothing more
    eager: EagerExtra | None = None


@dataclass(frozen=True, kw_only=True)
class EagerExtra:
    """An operator's eager-PyTorch surplus: bytes moved forward and backward, operator launches,
    and bytes autograd keeps beyond the fused operator's saved input."""

    fwd_bytes: float
    bwd_bytes: float
    kernels: int
    saved_bytes: float


def elt_bytes(dtype: str | None, default: str) -> float:
    """Bytes per element of a tensor of ``dtype`` (None: the training dtype ``default``)."""
    return DTYPE_BYTES.get(dtype or default, DTYPE_BYTES[default])


def saved_input_slots(op: OpSpec) -> tuple[int, ...]:
    """Indices into ``op.inputs`` of the tensors autograd keeps for the operator's backward
    (Korthikanti et al. 2022, §4.1; see the module docstring).  Depends on the operator only,
    not on shapes, so the graph analysis can use it before any binding."""
    cat, t = op.category, op.type
    if cat == "matmul":
        return (0,) if (op.param("weight") or op.param("B")) else (0, 1)
    if cat in ("conv", "norm", "embedding", "loss"):
        return (0,)
    if cat == "attention":
        return (0, 1, 2)
    if cat == "gather":
        return (len(op.inputs) - 1,)
    if cat in ("elementwise", "activation"):
        if t in MASK_ONLY_TYPES or t in NO_GRAD_TYPES or t == "Cast":
            return ()
        if cat == "activation" or t in SAVES_INPUTS_TYPES:
            return tuple(range(len(op.inputs)))
        return ()
    if cat == "reduce":
        return (0,) if t in _SAVES_INPUT_REDUCTIONS else ()
    if cat == "pool":
        return (0,) if t in _SAVES_INPUT_POOLS else ()
    return ()


@dataclass(frozen=True, kw_only=True)
class _Operands:
    """What a cost rule sees: the operator, its concrete input and output shapes, their bytes,
    its parameters, the training dtype's element size and the micro-batch size."""

    op: OpSpec
    ins: list[tuple[int, ...]]
    outs: list[tuple[int, ...]]
    in_bytes: list[float]
    out_bytes: list[float]
    out_elems: int
    params: int
    param_bytes: float
    elt_bytes: float
    dtype: str
    batch: int


def _custom_cost(x: _Operands) -> OpCost:
    op, batch = x.op, x.batch
    flops = (op.flops or 0.0) * batch
    moved = (op.bytes or 0.0) * batch
    return OpCost(
        fwd_flops=flops,
        bwd_flops=(op.backward_flops if op.backward_flops is not None else 2 * (op.flops or 0.0)) * batch,
        fwd_bytes=moved,
        bwd_bytes=(op.backward_bytes if op.backward_bytes is not None else 2 * (op.bytes or 0.0)) * batch,
        params=x.params, param_bytes=x.param_bytes, saved_inputs=(),
        extra_saved_bytes=(op.saved_bytes if op.saved_bytes is not None else sum(x.in_bytes) / max(batch, 1)) * batch,
    )


def _matmul_cost(x: _Operands) -> OpCost:
    op, ins, outs, e = x.op, x.ins, x.outs, x.elt_bytes
    w = op.param("weight") or op.param("B")
    if w is not None:
        trans_w = bool(op.attr("transB", op.attr("transpose_weight", 0)))
        k, n = (w.shape[1], w.shape[0]) if trans_w else w.shape
        m = math.prod(ins[0]) // k
        fl = 2.0 * m * n * k
        moved_bytes = float((m * k + k * n + m * n) * e)
        return OpCost(fwd_flops=fl, bwd_flops=2 * fl, fwd_bytes=moved_bytes, bwd_bytes=2 * moved_bytes + k * n * e, params=x.params,
                      param_bytes=x.param_bytes, saved_inputs=(0,), extra_saved_bytes=0.0,
                      gemm=GemmShape(m=m, n=n, k=k, batch=1, weight=True))
    a, bsh = ins
    ta, tb = bool(op.attr("transA", 0)), bool(op.attr("transB", 0))
    m = a[-1] if ta else a[-2]
    k = a[-2] if ta else a[-1]
    n = bsh[-2] if tb else bsh[-1]
    nb = math.prod(outs[0][:-2]) if len(outs[0]) > 2 else 1
    fl = 2.0 * nb * m * n * k
    moved_bytes = sum(x.in_bytes) + sum(x.out_bytes)
    return OpCost(fwd_flops=fl, bwd_flops=2 * fl, fwd_bytes=moved_bytes, bwd_bytes=2 * moved_bytes, params=x.params,
                  param_bytes=x.param_bytes, saved_inputs=(0, 1), extra_saved_bytes=0.0,
                  gemm=GemmShape(m=m, n=n, k=k, batch=nb, weight=False))


def _conv_cost(x: _Operands) -> OpCost:
    op, y = x.op, x.outs[0]
    w = op.param("weight") or op.param("W")
    if w is None:  # pragma: no cover - the parser requires it
        raise InvalidGraph(f"{op.name}: a convolution needs a weight")
    g = op.attr("group", op.attr("groups", 1))
    c_out = w.shape[0]
    kk = math.prod(w.shape[1:])  # C_in/g · Πkernel
    m = y[0] * math.prod(y[2:])
    fl = 2.0 * m * c_out * kk
    moved_bytes = x.in_bytes[0] + x.out_bytes[0] + x.param_bytes
    return OpCost(fwd_flops=fl, bwd_flops=2 * fl, fwd_bytes=moved_bytes, bwd_bytes=2 * moved_bytes, params=x.params,
                  param_bytes=x.param_bytes, saved_inputs=(0,), extra_saved_bytes=0.0,
                  gemm=GemmShape(m=m, n=c_out // g, k=kk, batch=g, weight=True))


def _attention_cost(x: _Operands) -> OpCost:
    op = x.op
    q, k, v = x.ins[:3]
    causal = bool(op.attr("causal", op.attr("is_causal", 0)))
    if len(q) == 3:
        heads = op.attr("num_heads", op.attr("q_num_heads"))
        batch, sq, hq = q
        skv = k[1]
        d = hq // heads
        dv = v[2] // op.attr("kv_num_heads", heads)
    else:
        batch, heads, sq, d = q
        skv, dv = k[2], v[3]
    bh = batch * heads
    fl = 2.0 * bh * sq * skv * (d + dv)
    moved_bytes = sum(x.in_bytes[:3]) + x.out_bytes[0]
    # Flash keeps q, k, v, the output and fp32 log-sum-exp per row; the unfused variant also
    # keeps the softmax probabilities and the dropout mask (Korthikanti's 5·a·s²·b term) —
    # the cost tables add those when training.attention == "unfused".
    return OpCost(fwd_flops=fl, bwd_flops=2 * fl, fwd_bytes=moved_bytes, bwd_bytes=2 * moved_bytes, params=x.params,
                  param_bytes=x.param_bytes, saved_inputs=(0, 1, 2), extra_saved_bytes=x.out_bytes[0] + bh * sq * 4,
                  attention=(bh, sq, skv, max(d, dv), causal))


def _norm_cost(x: _Operands) -> OpCost:
    t, xs, n = x.op.type, x.ins[0], x.out_elems
    rows = math.prod(xs[:-1]) if xs else 1
    fpe = FLOPS_PER_ELEMENT.get(t, 6)
    moved_bytes = x.in_bytes[0] + x.out_bytes[0] + x.param_bytes
    stats = rows * 4 * (2 if t == "LayerNorm" else 1)
    eager = None
    if t == "RMSNorm":  # eager PyTorch runs it as Hugging Face's LlamaRMSNorm does: the transformer path's rule
        traffic = eager_rmsnorm_traffic(int(x.elt_bytes))
        norm_saved, _ = eager_saved_bytes_per_element(int(x.elt_bytes))
        eager = EagerExtra(fwd_bytes=n * traffic.fwd_bytes, bwd_bytes=n * traffic.bwd_bytes, kernels=traffic.fwd_kernels,
                           saved_bytes=n * norm_saved)
    return OpCost(fwd_flops=fpe * n, bwd_flops=2 * fpe * n, fwd_bytes=moved_bytes, bwd_bytes=1.5 * moved_bytes + x.param_bytes,
                  params=x.params, param_bytes=x.param_bytes, saved_inputs=(0,), extra_saved_bytes=stats, eager=eager)


def _softmax_cost(x: _Operands) -> OpCost:
    fpe, n = FLOPS_PER_ELEMENT.get(x.op.type, 5), x.out_elems
    moved_bytes = x.in_bytes[0] + x.out_bytes[0]
    # backward reads y and dy, writes dx; y (the output) is saved
    return OpCost(fwd_flops=fpe * n, bwd_flops=2 * fpe * n, fwd_bytes=moved_bytes, bwd_bytes=1.5 * moved_bytes, params=0,
                  param_bytes=0.0, saved_inputs=(), extra_saved_bytes=x.out_bytes[0])


def _elementwise_cost(x: _Operands) -> OpCost:
    op, t, n = x.op, x.op.type, x.out_elems
    in_bytes, out_bytes = x.in_bytes, x.out_bytes
    fpe = FLOPS_PER_ELEMENT.get(t, 1)
    moved_bytes = sum(in_bytes) + out_bytes[0] + x.param_bytes
    if t == "Cast" or t in NO_GRAD_TYPES:
        no_grad = t in NO_GRAD_TYPES
        return OpCost(fwd_flops=n, bwd_flops=0.0, fwd_bytes=moved_bytes, bwd_bytes=0.0 if no_grad else moved_bytes, params=x.params,
                      param_bytes=x.param_bytes, saved_inputs=(), extra_saved_bytes=0.0, has_grad=not no_grad)
    saved = saved_input_slots(op)
    extra = n * 1.0 if t in MASK_ONLY_TYPES else 0.0  # a 1-byte mask
    n_grads = max(1, len(x.ins))
    # backward with saved inputs reads them; add/sub/expand: backward is a copy (or reduction) of dy
    bwd = out_bytes[0] + sum(in_bytes) + (sum(in_bytes[i] for i in saved)) if saved else out_bytes[0] * (1 + n_grads)
    return OpCost(fwd_flops=fpe * n, bwd_flops=2 * fpe * n, fwd_bytes=moved_bytes, bwd_bytes=float(bwd), params=x.params,
                  param_bytes=x.param_bytes, saved_inputs=saved, extra_saved_bytes=extra)


def _table(op: OpSpec) -> ParamSpec:
    table = op.param("weight") or op.param("table")
    if table is None:  # pragma: no cover - the parser requires it
        raise InvalidGraph(f"{op.name}: an embedding needs a weight table")
    return table


def _embedding_cost(x: _Operands) -> OpCost:
    op = x.op
    table = _table(op)
    dim = table.shape[1]
    lookups = math.prod(x.ins[0])
    rows_bytes = lookups * dim * elt_bytes(table.dtype, x.dtype)
    moved_bytes = x.in_bytes[0] + rows_bytes + x.out_bytes[0]
    return OpCost(fwd_flops=float(x.out_elems if op.type == "EmbeddingBag" else 0), bwd_flops=float(x.out_elems),
                  fwd_bytes=moved_bytes, bwd_bytes=2.0 * rows_bytes + x.in_bytes[0], params=x.params, param_bytes=x.param_bytes,
                  saved_inputs=(0,), extra_saved_bytes=0.0)


def _gather_cost(x: _Operands) -> OpCost:
    moved_bytes = x.in_bytes[-1] + 2 * x.out_bytes[0]
    return OpCost(fwd_flops=0.0, bwd_flops=0.0, fwd_bytes=moved_bytes, bwd_bytes=2 * moved_bytes, params=x.params,
                  param_bytes=x.param_bytes, saved_inputs=saved_input_slots(x.op), extra_saved_bytes=0.0)


def _reduce_cost(x: _Operands) -> OpCost:
    moved_bytes = x.in_bytes[0] + x.out_bytes[0]
    n = float(math.prod(x.ins[0]))
    return OpCost(fwd_flops=n, bwd_flops=n, fwd_bytes=moved_bytes, bwd_bytes=moved_bytes + x.in_bytes[0], params=0, param_bytes=0.0,
                  saved_inputs=saved_input_slots(x.op), extra_saved_bytes=0.0)


def _pool_cost(x: _Operands) -> OpCost:
    op, xs = x.op, x.ins[0]
    ks = op.attr("kernel_shape")
    kn = math.prod(xs[2:]) // max(1, math.prod(x.outs[0][2:])) if ks is None else math.prod(ks)
    moved_bytes = x.in_bytes[0] + x.out_bytes[0]
    fl = float(x.out_elems * kn)
    return OpCost(fwd_flops=fl, bwd_flops=fl, fwd_bytes=moved_bytes, bwd_bytes=moved_bytes + x.in_bytes[0], params=0, param_bytes=0.0,
                  saved_inputs=saved_input_slots(op), extra_saved_bytes=0.0)


def _loss_cost(x: _Operands) -> OpCost:
    logits = x.in_bytes[0]
    n = math.prod(x.ins[0])
    # The logits are the loss's own buffer here; saved_input_slots (what the cost tables count)
    # lists them as a saved input as well, so the tables hold them twice.  Kept as is: removing
    # either moves the pinned predictions (a fidelity change, not a refactor).
    return OpCost(fwd_flops=6.0 * n, bwd_flops=4.0 * n, fwd_bytes=logits + sum(x.in_bytes[1:]), bwd_bytes=2.0 * logits,
                  params=0, param_bytes=0.0, saved_inputs=(), extra_saved_bytes=float(logits))


def _layout_cost(x: _Operands) -> OpCost:
    moved_bytes = 0.0 if x.op.type in VIEW_TYPES else float(sum(x.out_bytes) * 2)
    return OpCost(fwd_flops=0.0, bwd_flops=0.0, fwd_bytes=moved_bytes, bwd_bytes=moved_bytes, params=0, param_bytes=0.0,
                  saved_inputs=(), extra_saved_bytes=0.0)


_RULES: dict[str, Callable[[_Operands], OpCost]] = {
    "custom": _custom_cost,
    "matmul": _matmul_cost,
    "conv": _conv_cost,
    "attention": _attention_cost,
    "norm": _norm_cost,
    "softmax": _softmax_cost,
    "elementwise": _elementwise_cost,
    "activation": _elementwise_cost,
    "embedding": _embedding_cost,
    "gather": _gather_cost,
    "reduce": _reduce_cost,
    "pool": _pool_cost,
    "loss": _loss_cost,
    "layout": _layout_cost,
}


def op_cost(op: OpSpec, graph: GraphSpec, shapes: Mapping[str, tuple[int, ...]], dtype: str, batch: int) -> OpCost:
    """FLOPs (FLOP), bytes moved (bytes), parameters and saved activations (bytes) of ``op`` on
    one micro-batch of ``batch`` samples with concrete ``shapes``.  Derivations: see the module
    docstring."""
    rule = _RULES.get(op.category)
    if rule is None:
        raise InvalidGraph(f"no cost rule for {op.type}")  # pragma: no cover
    ins = [shapes[t] for t in op.inputs]
    outs = [shapes[t] for t in op.outputs]
    return rule(_Operands(
        op=op, ins=ins, outs=outs,
        in_bytes=[float(math.prod(s) * elt_bytes(graph.tensors[t].dtype, dtype)) for s, t in zip(ins, op.inputs, strict=True)],
        out_bytes=[float(math.prod(s) * elt_bytes(graph.tensors[t].dtype, dtype)) for s, t in zip(outs, op.outputs, strict=True)],
        out_elems=math.prod(outs[0]) if outs else 0,
        params=op.param_count,
        param_bytes=float(sum(p.count * elt_bytes(p.dtype, dtype) for p in op.params)),
        elt_bytes=BYTES_PER_ELEMENT[dtype], dtype=dtype, batch=batch,
    ))


def graph_op_costs(graph: GraphSpec, batch: int, seq: int, dtype: str, op_class: Sequence[int] | np.ndarray | None = None,
                   shapes: Mapping[str, tuple[int, ...]] | None = None) -> list[OpCost]:
    """Per-operator forward/backward FLOPs and bytes, parameters and saved activations for a
    micro-batch of ``batch`` samples at sequence length ``seq`` (units as :class:`OpCost`).
    Operators of one structural class (``op_class``, :func:`cost_model.graph.analysis.op_classes`;
    by default their bound shapes) are costed once; ``shapes`` is ``graph.bind(batch, seq)``
    when the caller has it."""
    shapes = shapes if shapes is not None else graph.bind(batch, seq)
    memo: dict[object, OpCost] = {}
    out: list[OpCost] = []
    for i, op in enumerate(graph.ops):
        key: object
        if op_class is not None:
            key = int(op_class[i])
        else:
            key = (op.type, op.category, op.params, repr(op.attrs), op.flops, op.bytes, op.backward_flops, op.backward_bytes,
                   op.saved_bytes, tuple((shapes[t], graph.tensors[t].dtype) for t in op.inputs),
                   tuple((shapes[t], graph.tensors[t].dtype) for t in op.outputs))
        found = memo.get(key)
        if found is None:
            found = memo[key] = op_cost(op, graph, shapes, dtype, batch)
        out.append(found)
    return out
