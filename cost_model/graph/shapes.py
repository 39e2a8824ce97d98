"""Shape inference per operator type: the output shapes (and dtypes) a known operator produces
from its input shapes, parameters and attributes, following the ONNX operator definitions
(https://onnx.ai/onnx/operators/).  Symbolic dimensions (``batch``, ``seq``) propagate through
every rule; a rule that cannot decide on a symbolic size refuses it with the reason."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cost_model.errors import InvalidGraph
from cost_model.graph.ir import (
    COMPARISON_TYPES,
    INDEX_DTYPES,
    ONE,
    Dim,
    OpSpec,
    ParamSpec,
    Shape,
    TensorSpec,
    numel,
    parse_dim,
    shape_str,
)

#: Output shapes and dtypes (None: the training dtype) of one operator.
ShapeResult = tuple[list[Shape], list[str | None]]


@dataclass(frozen=True, kw_only=True)
class _Rule:
    """What a shape rule sees: the operator, its input shapes, the dtype of its outputs (its
    first floating-point input's), every tensor so far and the graph's named dimensions."""

    op: OpSpec
    ins: list[Shape]
    n_outputs: int
    dtype: str | None
    tensors: Mapping[str, TensorSpec]
    dims: Mapping[str, int]

    def one(self, shape: Shape) -> ShapeResult:
        """The single output of an operator, in the operator's output dtype."""
        return self.one_as(shape, self.dtype)

    def one_as(self, shape: Shape, dtype: str | None) -> ShapeResult:
        """The single output of an operator, in ``dtype``."""
        _need(self.n_outputs == 1, f"produces 1 output, the graph lists {self.n_outputs}")
        return [shape], [dtype]


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise InvalidGraph(msg)


def _axis(axis: int, rank: int) -> int:
    a = axis + rank if axis < 0 else axis
    _need(0 <= a < rank, f"axis {axis} is out of range for rank {rank}")
    return a


def _broadcast(shapes: Sequence[Shape]) -> Shape:
    rank = max(len(s) for s in shapes)
    out: list[Dim] = []
    for i in range(rank):
        d = ONE
        for s in shapes:
            k = i - (rank - len(s))
            if k < 0:
                continue
            e = s[k]
            if e == ONE:
                continue
            if d == ONE:
                d = e
            elif d != e:
                raise InvalidGraph(
                    f"shapes {', '.join(shape_str(s) for s in shapes)} do not broadcast (dimension {d} vs {e})"
                )
        out.append(d)
    return tuple(out)


def _required_param(op: OpSpec, names: tuple[str, ...], msg: str) -> ParamSpec:
    """The first of the parameters ``names`` the operator has; :class:`InvalidGraph` (``msg``)
    when it has none."""
    for name in names:
        p = op.param(name)
        if p is not None:
            return p
    raise InvalidGraph(msg)


def _param_dims(p: ParamSpec) -> Shape:
    return tuple(Dim(d) for d in p.shape)


def _out_dtype(op: OpSpec, tensors: Mapping[str, TensorSpec]) -> str | None:
    for t in op.inputs:
        dt = tensors[t].dtype
        if dt not in INDEX_DTYPES and dt != "bool":
            return dt
    return None


def _spatial_out(in_d: Dim, k: int, stride: int, pad: int, dil: int, ceil: bool = False) -> Dim:
    if in_d.is_const:
        span = in_d.coef + pad - dil * (k - 1) - 1
        _need(span >= 0, f"kernel {k} (dilation {dil}) is larger than the padded input {in_d.coef + pad}")
        return Dim((span + (stride - 1 if ceil else 0)) // stride + 1)
    _need(stride == 1 and pad == dil * (k - 1), f"symbolic spatial dimension {in_d} needs stride 1 and 'same' padding")
    return in_d


def _ints(value: Any, n: int, default: int, name: str) -> list[int]:
    if value is None:
        return [default] * n
    vals = list(value) if isinstance(value, (list, tuple)) else [value] * n
    _need(all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in vals), f"attribute {name} must be non-negative integers")
    return vals



def _matmul_shapes(c: _Rule) -> ShapeResult:
    op = c.op
    ins = c.ins
    one = c.one
    w = op.param("weight") or op.param("B")
    if w is not None:
        _need(len(ins) == 1, f"with a weight parameter takes 1 tensor input, got {len(ins)}")
        x = ins[0]
        _need(len(w.shape) == 2, f"weight must be 2-D, got {list(w.shape)}")
        trans_a = bool(op.attr("transA", 0))
        trans_w = bool(op.attr("transB", op.attr("transpose_weight", 0)))
        k_w, n_w = (w.shape[1], w.shape[0]) if trans_w else w.shape
        _need(len(x) >= 1, "input must have rank ≥ 1")
        if trans_a:
            _need(len(x) == 2, "transA needs a 2-D input")
            x = (x[1], x[0])
        _need(x[-1] == Dim(k_w), f"input {shape_str(x)} has inner dimension {x[-1]} but the weight {list(w.shape)} expects {k_w}")
        bias = op.param("bias") or op.param("C")
        if bias is not None:
            _need(bias.count in (n_w, 1) or (len(bias.shape) >= 1 and bias.shape[-1] == n_w),
                  f"bias {list(bias.shape)} does not match {n_w} output features")
        return one(tuple(x[:-1]) + (Dim(n_w),))
    _need(len(ins) == 2, f"takes 2 tensor inputs (or 1 input and a 'weight' parameter), got {len(ins)}")
    a, b = ins
    _need(len(a) >= 2 and len(b) >= 2, f"inputs must have rank ≥ 2, got {shape_str(a)} and {shape_str(b)}")
    if op.attr("transA", 0):
        a = a[:-2] + (a[-1], a[-2])
    if op.attr("transB", 0):
        b = b[:-2] + (b[-1], b[-2])
    _need(a[-1] == b[-2], f"inner dimensions differ: {shape_str(a)} @ {shape_str(b)}")
    batch = _broadcast([a[:-2], b[:-2]]) if (a[:-2] or b[:-2]) else ()
    return one(tuple(batch) + (a[-2], b[-1]))


def _conv_shapes(c: _Rule) -> ShapeResult:
    op = c.op
    ins = c.ins
    one = c.one
    _need(len(ins) == 1, f"takes 1 tensor input (the weight is a parameter), got {len(ins)}")
    x = ins[0]
    w = _required_param(op, ("weight", "W"), "needs a 'weight' parameter [C_out, C_in/groups, *kernel]")
    nsp = len(x) - 2
    _need(nsp in (1, 2, 3), f"input must be [N, C, L] or [N, C, H, W], got {shape_str(x)}")
    _need(len(w.shape) == nsp + 2, f"weight {list(w.shape)} must have rank {nsp + 2} for input {shape_str(x)}")
    g = op.attr("group", op.attr("groups", 1))
    _need(isinstance(g, int) and g >= 1, "group must be a positive integer")
    c_out, c_in_g = w.shape[0], w.shape[1]
    _need(x[1] == Dim(c_in_g * g), f"input has {x[1]} channels but weight {list(w.shape)} with group={g} expects {c_in_g * g}")
    _need(c_out % g == 0, f"{c_out} output channels are not divisible by group={g}")
    ks = w.shape[2:]
    strides = _ints(op.attr("strides"), nsp, 1, "strides")
    dil = _ints(op.attr("dilations"), nsp, 1, "dilations")
    pads = _conv_pads(op, nsp, ks, dil, x[2:], strides)
    spatial = tuple(_spatial_out(x[2 + i], ks[i], max(strides[i], 1), pads[i] + pads[i + nsp], max(dil[i], 1)) for i in range(nsp))
    return one((x[0], Dim(c_out)) + spatial)


def _attention_shapes(c: _Rule) -> ShapeResult:
    op = c.op
    ins = c.ins
    one = c.one
    _need(len(ins) >= 3, f"takes q, k, v inputs, got {len(ins)}")
    q, k, v = ins[:3]
    if len(q) == 3:
        heads = op.attr("num_heads", op.attr("q_num_heads"))
        _need(isinstance(heads, int) and heads >= 1, "3-D q/k/v [batch, seq, hidden] need attribute num_heads")
        kvh = op.attr("kv_num_heads", heads)
        _need(len(k) == 3 and len(v) == 3, "q, k, v must all be 3-D or all 4-D")
        _need(q[0] == k[0] == v[0], f"batch differs: q {shape_str(q)}, k {shape_str(k)}, v {shape_str(v)}")
        _need(k[1] == v[1], f"k {shape_str(k)} and v {shape_str(v)} differ in sequence length")
        _need(q[2].is_const and q[2].coef % heads == 0, f"hidden {q[2]} is not divisible by {heads} heads")
        d = q[2].coef // heads
        _need(k[2] == Dim(kvh * d), f"k has width {k[2]} but {kvh} kv heads × head dim {d} = {kvh * d}")
        _need(isinstance(kvh, int) and heads % kvh == 0, f"{heads} heads are not a multiple of {kvh} kv heads")
        _need(v[2].is_const and v[2].coef % kvh == 0, f"v width {v[2]} is not divisible by {kvh} kv heads")
        return one((q[0], q[1], Dim(heads * (v[2].coef // kvh))))
    _need(len(q) == 4 and len(k) == 4 and len(v) == 4, "q, k, v must be [batch, seq, hidden] or [batch, heads, seq, head_dim]")
    _need(q[0] == k[0] == v[0], "batch differs between q, k, v")
    _need(q[3] == k[3], f"q head dim {q[3]} differs from k head dim {k[3]}")
    _need(k[2] == v[2] and k[1] == v[1], "k and v differ in heads or sequence length")
    _need(q[1].is_const and k[1].is_const and q[1].coef % k[1].coef == 0, f"{q[1]} query heads are not a multiple of {k[1]} kv heads")
    return one((q[0], q[1], q[2], v[3]))


def _norm_shapes(c: _Rule) -> ShapeResult:
    op = c.op
    ins = c.ins
    t = c.op.type
    dt = c.dtype
    n_outputs = c.n_outputs
    x = ins[0]
    if t in ("LayerNorm", "RMSNorm"):
        _need(len(x) >= 1, "input must have rank ≥ 1")
        axis = _axis(op.attr("axis", -1), len(x))
        norm_shape = x[axis:]
        for p in op.params:
            _need(_param_dims(p) == norm_shape or p.count == 1,
                  f"parameter {p.name} {list(p.shape)} does not match normalised shape {shape_str(norm_shape)}")
    else:
        _need(len(x) >= 2, f"input must be [N, C, ...], got {shape_str(x)}")
        for p in op.params:
            _need(p.shape == () or (len(p.shape) == 1 and Dim(p.shape[0]) == x[1]),
                  f"parameter {p.name} {list(p.shape)} does not match {x[1]} channels")
    _need(n_outputs >= 1, "must produce an output")
    return [x] + [x[:1]] * (n_outputs - 1), [dt] + ["fp32"] * (n_outputs - 1)


def _softmax_shapes(c: _Rule) -> ShapeResult:
    op = c.op
    ins = c.ins
    one = c.one
    _need(len(ins) == 1, f"takes 1 input, got {len(ins)}")
    _axis(op.attr("axis", -1), len(ins[0]))
    return one(ins[0])


def _elementwise_shapes(c: _Rule) -> ShapeResult:
    op = c.op
    ins = c.ins
    t = c.op.type
    dt = c.dtype
    n_outputs = c.n_outputs
    dims = c.dims
    one = c.one
    shapes = list(ins) + [_param_dims(p) for p in op.params]
    _need(len(shapes) >= 1, "needs at least one input")
    if t == "Expand":
        target = op.attr("shape")
        _need(target is not None, "Expand needs attribute shape")
        tgt = tuple(parse_dim(v, dims or {}, "shape") if not isinstance(v, Dim) else v for v in target)
        return one(_broadcast([ins[0], tgt]))
    if t == "Where":
        _need(len(shapes) == 3, "Where takes condition, x, y")
    if t == "Dropout":
        outs = [ins[0]] + [ins[0]] * (n_outputs - 1)
        return outs, [dt] + ["bool"] * (n_outputs - 1)
    shape = _broadcast(shapes)
    if t in COMPARISON_TYPES:
        return c.one_as(shape, "bool")
    if t == "Cast":
        return c.one_as(shape, op.attr("to", dt))
    return one(shape)


def _embedding_shapes(c: _Rule) -> ShapeResult:
    op = c.op
    ins = c.ins
    t = c.op.type
    table = _required_param(op, ("weight", "table"), "needs a 2-D 'weight' parameter [rows, dim]")
    _need(len(table.shape) == 2, "needs a 2-D 'weight' parameter [rows, dim]")
    _need(len(ins) >= 1, "takes an indices input")
    idx = ins[0]
    if t == "EmbeddingBag":
        _need(len(idx) == 2, f"EmbeddingBag indices must be [batch, bag], got {shape_str(idx)}")
        return c.one_as((idx[0], Dim(table.shape[1])), None)
    return c.one_as(tuple(idx) + (Dim(table.shape[1]),), None)


def _gather_shapes(c: _Rule) -> ShapeResult:
    op = c.op
    ins = c.ins
    t = c.op.type
    tensors = c.tensors
    one = c.one
    axis = op.attr("axis", 0)
    if op.params:
        data = _param_dims(op.params[0])
        _need(len(ins) == 1, "with a data parameter takes 1 indices input")
        idx = ins[0]
    else:
        _need(len(ins) == 2, f"takes data and indices, got {len(ins)}")
        data, idx = ins
    a = _axis(axis, len(data))
    if t == "GatherElements":
        return one(idx)
    return c.one_as(tuple(data[:a]) + tuple(idx) + tuple(data[a + 1:]), None if op.params else tensors[op.inputs[0]].dtype)


def _reduce_shapes(c: _Rule) -> ShapeResult:
    op = c.op
    ins = c.ins
    one = c.one
    x = ins[0]
    axes = op.attr("axes")
    keep = op.attr("keepdims", 1)
    axes = list(range(len(x))) if axes is None else [_axis(a, len(x)) for a in (axes if isinstance(axes, (list, tuple)) else [axes])]
    out = tuple((ONE if keep else None) if i in axes else d for i, d in enumerate(x))
    return one(tuple(d for d in out if d is not None))


def _pool_shapes(c: _Rule) -> ShapeResult:
    op = c.op
    ins = c.ins
    t = c.op.type
    one = c.one
    x = ins[0]
    _need(len(x) >= 3, f"input must be [N, C, *spatial], got {shape_str(x)}")
    nsp = len(x) - 2
    if t.startswith("Global"):
        return one(tuple(x[:2]) + (ONE,) * nsp)
    ks = op.attr("kernel_shape")
    _need(isinstance(ks, (list, tuple)) and len(ks) == nsp, f"needs kernel_shape with {nsp} entries")
    strides = _ints(op.attr("strides"), nsp, 1, "strides")
    dil = _ints(op.attr("dilations"), nsp, 1, "dilations")
    pads = _conv_pads(op, nsp, ks, dil, x[2:], strides)
    ceil = bool(op.attr("ceil_mode", 0))
    return one(tuple(x[:2]) + tuple(_spatial_out(x[2 + i], ks[i], max(strides[i], 1), pads[i] + pads[i + nsp], max(dil[i], 1), ceil) for i in range(nsp)))


def _loss_shapes(c: _Rule) -> ShapeResult:
    op = c.op
    ins = c.ins
    t = c.op.type
    one = c.one
    _need(len(ins) >= 1, "takes logits (and labels)")
    red = op.attr("reduction", "mean")
    if red == "none":
        return one(tuple(ins[0][:-1]) if t == "CrossEntropy" else ins[0])
    return one(())


def _conv_pads(op: OpSpec, nsp: int, ks: Sequence[int], dil: Sequence[int], spatial: Sequence[Dim], strides: Sequence[int]) -> list[int]:
    auto = op.attr("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pads = []
        for i in range(nsp):
            total = dil[i] * (ks[i] - 1)
            if spatial[i].is_const and strides[i] > 1:
                out = -(-spatial[i].coef // strides[i])
                total = max(0, (out - 1) * strides[i] + dil[i] * (ks[i] - 1) + 1 - spatial[i].coef)
            pads.append(total)
        return [p // 2 for p in pads] + [p - p // 2 for p in pads]
    pads = op.attr("pads")
    if pads is None:
        return [0] * (2 * nsp)
    pads = _ints(pads, 2 * nsp, 0, "pads")
    _need(len(pads) == 2 * nsp, f"pads must have {2 * nsp} entries")
    return pads


def _reshape_shape(c: _Rule, x: Shape) -> Shape:
    target = c.op.attr("shape")
    _need(isinstance(target, (list, tuple)), "Reshape needs attribute shape (a list; 0 copies, -1 infers)")
    out: list[Dim | None] = []
    for i, v in enumerate(target):
        if v == 0 and not isinstance(v, bool):
            _need(i < len(x), f"shape entry {i} is 0 (copy) but the input has rank {len(x)}")
            out.append(x[i])
        elif v == -1:
            out.append(None)
        elif isinstance(v, Dim):
            out.append(v)
        else:
            out.append(parse_dim(v, c.dims, "shape"))
    _need(sum(d is None for d in out) <= 1, "at most one -1 in a reshape")
    total = numel(x)
    given = [d for d in out if d is not None]
    known = numel(given)
    if None in out:
        rest = total.div(known)
        if rest is None:
            raise InvalidGraph(f"cannot reshape {shape_str(x)} to {target}: {total} elements are not divisible by {known}")
        return tuple(rest if d is None else d for d in out)
    _need(known == total, f"cannot reshape {shape_str(x)} ({total} elements) to {shape_str(given)} ({known} elements)")
    return tuple(given)


def _transpose_shape(c: _Rule, x: Shape) -> Shape:
    perm = c.op.attr("perm")
    perm = list(range(len(x)))[::-1] if perm is None else list(perm)
    _need(sorted(perm) == list(range(len(x))), f"perm {perm} is not a permutation of {len(x)} axes")
    return tuple(x[p] for p in perm)


def _flatten_shape(c: _Rule, x: Shape) -> Shape:
    a = c.op.attr("axis", 1)
    a = a + len(x) if a < 0 else a
    _need(0 <= a <= len(x), f"axis {a} out of range")
    return (numel(x[:a]), numel(x[a:]))


def _squeeze_shape(c: _Rule, x: Shape) -> Shape:
    axes_attr = c.op.attr("axes")
    if axes_attr is None:
        return tuple(d for d in x if d != ONE)
    axes = [_axis(a, len(x)) for a in axes_attr]
    for a in axes:
        _need(x[a] == ONE, f"cannot squeeze axis {a} of size {x[a]}")
    return tuple(d for i, d in enumerate(x) if i not in axes)


def _unsqueeze_shape(c: _Rule, x: Shape) -> Shape:
    axes_attr = c.op.attr("axes")
    _need(isinstance(axes_attr, (list, tuple)), "Unsqueeze needs attribute axes")
    r = len(x) + len(axes_attr)
    out = list(x)
    for a in sorted(_axis(a, r) for a in axes_attr):
        out.insert(a, ONE)
    return tuple(out)


def _concat_shape(c: _Rule, x: Shape) -> Shape:
    ins = c.ins
    a = _axis(c.op.attr("axis", 0), len(x))
    total: Dim | None = None
    for s in ins:
        _need(len(s) == len(x), f"inputs differ in rank: {', '.join(shape_str(s) for s in ins)}")
        for i in range(len(x)):
            if i != a:
                _need(s[i] == x[i], f"inputs differ in dimension {i}: {', '.join(shape_str(s) for s in ins)}")
        total = s[a] if total is None else total.add(s[a])
        if total is None:
            raise InvalidGraph(f"cannot add symbolic sizes along axis {a}")
    if total is None:  # pragma: no cover - an operator has at least one input
        raise InvalidGraph("Concat needs inputs")
    return tuple(x[:a]) + (total,) + tuple(x[a + 1:])


def _split_shapes(c: _Rule, x: Shape) -> ShapeResult:
    n_outputs = c.n_outputs
    a = _axis(c.op.attr("axis", 0), len(x))
    sizes = c.op.attr("split")
    if sizes is None:
        _need(x[a].is_const and x[a].coef % n_outputs == 0, f"dimension {x[a]} does not split evenly into {n_outputs}")
        sizes = [x[a].coef // n_outputs] * n_outputs
    sizes = list(sizes)
    _need(len(sizes) == n_outputs, f"split has {len(sizes)} sizes but {n_outputs} outputs")
    _need(x[a].is_const and sum(sizes) == x[a].coef, f"split sizes {sizes} do not sum to dimension {x[a]}")
    dt = c.tensors[c.op.inputs[0]].dtype
    return [tuple(x[:a]) + (Dim(s),) + tuple(x[a + 1:]) for s in sizes], [dt] * n_outputs


def _slice_length(n: int, start: int, end: int, step: int) -> int:
    """Elements of ``range(start, end, step)`` over a dimension of ``n`` (ONNX Slice clamping)."""
    if step > 0:
        s = max(0, min(n, start + n if start < 0 else start))
        e = max(0, min(n, end + n if end < 0 else end))
        return max(0, -(-(e - s) // step))
    s = max(-1, min(n - 1, start + n if start < 0 else start))
    e = max(-1, min(n - 1, end + n if end < 0 else end))
    return max(0, -(-(s - e) // -step))


def _slice_shape(c: _Rule, x: Shape) -> Shape:
    op = c.op
    axes_attr = op.attr("axes")
    starts, ends = op.attr("starts"), op.attr("ends")
    _need(isinstance(starts, (list, tuple)) and isinstance(ends, (list, tuple)) and len(starts) == len(ends), "Slice needs starts and ends")
    axes = list(range(len(starts))) if axes_attr is None else list(axes_attr)
    steps = list(op.attr("steps") or [1] * len(starts))
    out = list(x)
    for axis, s, e, st in zip(axes, starts, ends, steps, strict=False):
        a = _axis(axis, len(x))
        _need(st != 0, "slice step 0")
        if not x[a].is_const:
            _need(s == 0 and e >= 2**31 and st == 1, f"cannot slice symbolic dimension {x[a]} except whole")
            continue
        length = _slice_length(x[a].coef, s, e, st)
        _need(length >= 1, f"slice of axis {a} is empty")
        out[a] = Dim(length)
    return tuple(out)


_LAYOUT_RULES: dict[str, Callable[[_Rule, Shape], Shape]] = {
    "Identity": lambda c, x: x,
    "Reshape": _reshape_shape,
    "Transpose": _transpose_shape,
    "Flatten": _flatten_shape,
    "Squeeze": _squeeze_shape,
    "Unsqueeze": _unsqueeze_shape,
    "Concat": _concat_shape,
    "Slice": _slice_shape,
}


def _layout_shapes(c: _Rule) -> ShapeResult:
    """Views and copies; they keep their input's dtype."""
    x = c.ins[0]
    if c.op.type == "Split":
        return _split_shapes(c, x)
    rule = _LAYOUT_RULES.get(c.op.type)
    if rule is None:
        raise InvalidGraph(f"no shape rule for {c.op.type}")  # pragma: no cover
    return c.one_as(rule(c, x), c.tensors[c.op.inputs[0]].dtype)


_RULES: dict[str, Callable[[_Rule], ShapeResult]] = {
    "matmul": _matmul_shapes,
    "conv": _conv_shapes,
    "attention": _attention_shapes,
    "norm": _norm_shapes,
    "softmax": _softmax_shapes,
    "elementwise": _elementwise_shapes,
    "activation": _elementwise_shapes,
    "embedding": _embedding_shapes,
    "gather": _gather_shapes,
    "reduce": _reduce_shapes,
    "pool": _pool_shapes,
    "loss": _loss_shapes,
    "layout": _layout_shapes,
}


def infer_shapes(op: OpSpec, tensors: Mapping[str, TensorSpec], n_outputs: int,
                 dims: Mapping[str, int] | None = None) -> ShapeResult:
    """Output shapes of a known operator; raises :class:`InvalidGraph` with the mismatch."""
    rule = _RULES.get(op.category)
    if rule is None:
        raise InvalidGraph(f"no shape rule for {op.type}")  # pragma: no cover
    ins = [tensors[t].shape for t in op.inputs]
    return rule(_Rule(op=op, ins=ins, n_outputs=n_outputs, dtype=_out_dtype(op, tensors), tensors=tensors, dims=dims or {}))
