"""ONNX → operator-graph JSON (the v1 ``{"model": {"graph": ...}}`` shape).

* Initializers are weights: float initializers consumed by MatMul/Gemm/Conv/norms/Gather and by
  elementwise ops become the consuming operator's ``params``; integer initializers are constants.
* Only shapes are needed, never weight values: models are loaded with
  ``load_external_data=False`` (tensors beyond 2 GB live in external files and are read by path;
  their bytes are never touched), and only tiny constant tensors (reshape targets, axes,
  split sizes) are read.
* Symbolic dimensions of the graph inputs are bound: the leading dimension of every input is
  ``batch`` (the micro-batch), a second dimension named like a sequence (``seq``,
  ``sequence``, ``length``, ``time``, ``tokens``) is ``seq`` (``training.sequence_length``);
  any other symbolic dimension must be given in ``dims``.  ONNX shape inference
  (``onnx.shape_inference``, with data propagation through Shape → Gather → Concat plumbing)
  then runs with three concrete bindings of (batch, seq); comparing them recovers every
  intermediate shape as a monomial ``c·batch^i·seq^j`` — so reshapes computed from the input
  shape stay symbolic.
* Shape-computation subgraphs (Shape, Constant, ConstantOfShape, arithmetic on them) are folded
  away.  Operators with no cost rule are reported together, by type, with their node names, as
  one :class:`cost_model.errors.InvalidGraph`.
* Before anything is parsed the node count is read from the protobuf wire format and checked
  against :data:`cost_model.graph.ir.MAX_OPS`, so a 10-million-node file is refused in milliseconds.
"""

from __future__ import annotations

import mmap
import os
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from cost_model.errors import InvalidGraph
from cost_model.graph.ir import MAX_OPS
from cost_model.units import bytes_to_gb, gib_to_bytes

#: Largest ONNX file accepted in one piece (protobuf's own limit); external data may be larger.
MAX_ONNX_BYTES = int(gib_to_bytes(2))

_PROBES = ((13, 31), (29, 31), (13, 37))  # (batch, seq) bindings for the three inference runs
_SEQ_NAMES = re.compile(r"seq|sequence|length|len\b|time|token", re.IGNORECASE)

#: ONNX op type → graph IR type (None: handled specially)
_DIRECT = {
    "MatMul": "MatMul", "Gemm": "Gemm", "Conv": "Conv",
    "LayerNormalization": "LayerNorm", "RMSNormalization": "RMSNorm", "SimplifiedLayerNormalization": "RMSNorm",
    "BatchNormalization": "BatchNorm", "GroupNormalization": "GroupNorm", "InstanceNormalization": "GroupNorm",
    "Softmax": "Softmax", "LogSoftmax": "LogSoftmax", "Attention": "Attention",
    "SoftmaxCrossEntropyLoss": "CrossEntropy", "NegativeLogLikelihoodLoss": "CrossEntropy",
    "MaxPool": "MaxPool", "AveragePool": "AveragePool", "GlobalAveragePool": "GlobalAveragePool",
    "GlobalMaxPool": "GlobalMaxPool", "LpPool": "LpPool",
    "Reshape": "Reshape", "Transpose": "Transpose", "Flatten": "Flatten", "Squeeze": "Squeeze",
    "Unsqueeze": "Unsqueeze", "Identity": "Identity", "Concat": "Concat", "Split": "Split", "Slice": "Slice",
    "Gather": "Gather", "GatherElements": "GatherElements", "Expand": "Expand",
    "ReduceSum": "ReduceSum", "ReduceMean": "ReduceMean", "ReduceMax": "ReduceMax", "ReduceMin": "ReduceMin",
    "ReduceProd": "ReduceProd", "ReduceL1": "ReduceL1", "ReduceL2": "ReduceL2", "ReduceSumSquare": "ReduceSumSquare",
    "ReduceLogSumExp": "ReduceLogSumExp",
}
_ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Where", "Equal", "Less", "Greater", "LessOrEqual",
                "GreaterOrEqual", "And", "Or", "Xor", "Not", "Mod", "Sqrt", "Exp", "Log", "Neg", "Abs", "Reciprocal", "Cast",
                "Dropout", "Erf", "Clip", "Floor", "Ceil", "Round", "Sign", "Sin", "Cos", "Relu", "Gelu", "FastGelu",
                "QuickGelu", "Sigmoid", "Tanh", "LeakyRelu", "Elu", "Selu", "Celu", "HardSigmoid", "HardSwish",
                "Softplus", "Softsign", "Mish", "PRelu", "BiasGelu"}
#: Ops that only compute shapes/constants: folded away when all their inputs are static.
_SHAPE_OPS = {"Shape", "Size", "Constant", "ConstantOfShape", "Range", "Gather", "Unsqueeze", "Squeeze", "Concat", "Cast",
              "Add", "Sub", "Mul", "Div", "Slice", "Reshape", "Equal", "Where", "Expand", "ReduceProd", "Identity", "Max",
              "Min", "Neg", "Floor", "Ceil", "Sqrt", "Mod", "Not", "Less", "Greater", "Abs", "Tile", "Transpose"}
#: Input slots that carry shape/axes arguments (not data) per op type.
_ARG_SLOTS = {"Reshape": (1,), "Expand": (1,), "Slice": (1, 2, 3, 4), "Split": (1,), "Squeeze": (1,), "Unsqueeze": (1,),
              "ReduceSum": (1,), "ReduceMean": (1,), "ReduceMax": (1,), "ReduceMin": (1,), "ReduceProd": (1,),
              "ReduceL1": (1,), "ReduceL2": (1,), "ReduceSumSquare": (1,), "ReduceLogSumExp": (1,), "Dropout": (1, 2),
              "Clip": (1, 2), "Attention": (3, 4, 5)}
#: Which inputs of weighted ops are parameters (by slot) and their IR names.
_PARAM_SLOTS = {
    "MatMul": {1: "weight"}, "Gemm": {1: "weight", 2: "bias"}, "Conv": {1: "weight", 2: "bias"},
    "LayerNormalization": {1: "scale", 2: "bias"}, "RMSNormalization": {1: "scale"}, "SimplifiedLayerNormalization": {1: "scale"},
    "BatchNormalization": {1: "scale", 2: "bias", 3: "mean", 4: "var"}, "GroupNormalization": {1: "scale", 2: "bias"},
    "InstanceNormalization": {1: "scale", 2: "bias"},
}
_ONNX_DTYPE = {1: "fp32", 10: "fp16", 16: "bf16", 11: "fp64", 7: "int64", 6: "int32", 5: "int16", 3: "int8", 2: "uint8", 9: "bool"}


# ---- size pre-check ------------------------------------------------------------------------------
def _varint(buf, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise InvalidGraph("the ONNX file is not a valid protobuf (bad varint)", field="model.onnx")


def _skip(buf, pos: int, wire: int) -> int:
    if wire == 0:
        return _varint(buf, pos)[1]
    if wire == 1:
        return pos + 8
    if wire == 2:
        n, pos = _varint(buf, pos)
        return pos + n
    if wire == 5:
        return pos + 4
    raise InvalidGraph(f"the ONNX file is not a valid protobuf (wire type {wire})", field="model.onnx")


def count_onnx_nodes(buf, limit: int = MAX_OPS) -> int:
    """Number of nodes of the main graph, read from the protobuf wire format without parsing
    (ModelProto.graph = field 7, GraphProto.node = field 1); stops counting past ``limit``."""
    n = len(buf)
    pos = 0
    count = 0
    try:
        while pos < n:
            key, pos = _varint(buf, pos)
            field, wire = key >> 3, key & 7
            if field == 7 and wire == 2:
                length, pos = _varint(buf, pos)
                end = pos + length
                while pos < end:
                    k2, pos = _varint(buf, pos)
                    f2, w2 = k2 >> 3, k2 & 7
                    if f2 == 1 and w2 == 2:
                        count += 1
                        if count > limit:
                            return count
                    pos = _skip(buf, pos, w2)
                return count
            pos = _skip(buf, pos, wire)
    except IndexError:
        raise InvalidGraph("the ONNX file is truncated or not a protobuf", field="model.onnx") from None
    return count


def _check_size(buf) -> None:
    nodes = count_onnx_nodes(buf, MAX_OPS)
    if nodes > MAX_OPS:
        raise InvalidGraph(f"the ONNX graph has more than {MAX_OPS} nodes; the limit is {MAX_OPS}", field="model.onnx")
    if nodes == 0:
        raise InvalidGraph("the ONNX file has no graph nodes (is it an ONNX model?)", field="model.onnx")


# ---- loading ---------------------------------------------------------------------------------------
def _load(path: str | None = None, data: bytes | None = None):
    import onnx
    from google.protobuf.message import DecodeError

    if path is not None:
        if not os.path.isfile(path):
            raise InvalidGraph(f"no such ONNX file: {path}", field="model.onnx")
        size = os.path.getsize(path)
        if size == 0:
            raise InvalidGraph("the ONNX file is empty", field="model.onnx")
        if size > MAX_ONNX_BYTES:
            raise InvalidGraph(f"the ONNX file is {bytes_to_gb(size):.1f} GB; files over 2 GB must keep their weights as external data",
                               field="model.onnx")
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            _check_size(mm)
        try:
            return onnx.load(path, load_external_data=False)
        except (DecodeError, ValueError, RuntimeError) as exc:
            raise InvalidGraph(f"cannot parse the ONNX file: {exc}", field="model.onnx") from None
    assert data is not None
    if not data:
        raise InvalidGraph("the ONNX upload is empty", field="model.onnx")
    if len(data) > MAX_ONNX_BYTES:
        raise InvalidGraph("ONNX uploads over 2 GB must keep their weights as external data", field="model.onnx")
    _check_size(memoryview(data))
    try:
        return onnx.load_model_from_string(data)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise InvalidGraph(f"cannot parse the ONNX upload: {exc}", field="model.onnx") from None


def _small_value(t, base_dir: str | None) -> np.ndarray | None:
    """Values of a small initializer/constant (≤ 4096 elements), reading external data by path."""
    from onnx import numpy_helper

    n = int(np.prod(list(t.dims))) if len(t.dims) else 1
    if n > 4096:
        return None
    try:
        if t.data_location == t.EXTERNAL:
            if base_dir is None:
                return None
            from onnx.external_data_helper import load_external_data_for_tensor

            t2 = type(t)()
            t2.CopyFrom(t)
            load_external_data_for_tensor(t2, base_dir)
            return numpy_helper.to_array(t2)
        return numpy_helper.to_array(t)
    except Exception:  # noqa: BLE001 - unreadable constant: treated as unknown value
        return None


def _dims_of(vi) -> list[Any] | None:
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):
        return None
    out = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            out.append(int(d.dim_value))
        elif d.HasField("dim_param"):
            out.append(d.dim_param)
        else:
            out.append(None)
    return out


# ---- main conversion -----------------------------------------------------------------------------------
def onnx_to_graph(model, name: str | None = None, dims: Mapping[str, int] | None = None, base_dir: str | None = None) -> dict[str, Any]:
    """Convert a loaded ``onnx.ModelProto`` (external data not loaded) to graph JSON."""
    import onnx

    g = model.graph
    dims = dict(dims or {})
    if len(g.node) > MAX_OPS:
        raise InvalidGraph(f"the ONNX graph has {len(g.node)} nodes; the limit is {MAX_OPS}", field="model.onnx")
    inits = {t.name: t for t in g.initializer}
    init_shape = {k: [int(d) for d in t.dims] for k, t in inits.items()}
    init_dtype = {k: _ONNX_DTYPE.get(t.data_type, "fp32") for k, t in inits.items()}

    # --- bind symbolic input dims -----------------------------------------------------------------
    real_inputs = [vi for vi in g.input if vi.name not in inits]
    if not real_inputs:
        raise InvalidGraph("the ONNX graph has no inputs besides its weights", field="model.onnx")
    sym_map: dict[str, str] = {}
    for vi in real_inputs:
        shape = _dims_of(vi)
        if shape is None:
            raise InvalidGraph(f"input {vi.name!r} has no shape; export with shapes (dynamic axes are fine)", field="model.onnx")
        for k, d in enumerate(shape):
            if d is None:
                raise InvalidGraph(f"input {vi.name!r} dimension {k} has neither a size nor a name", field="model.onnx")
            if isinstance(d, str) and d not in sym_map and d not in dims:
                if k == 0:
                    sym_map[d] = "batch"
                elif _SEQ_NAMES.search(d) or k == 1:
                    sym_map[d] = "seq"
                else:
                    raise InvalidGraph(
                        f"input {vi.name!r} has symbolic dimension {d!r} at position {k}: only the batch (first) and sequence "
                        "dimensions are bound from training; give its size in 'dims'",
                        field="model.onnx",
                    )

    # --- three concrete shape-inference runs --------------------------------------------------------
    runs = [_infer(model, sym_map, dims, probe, inits) for probe in _PROBES]
    shapes: dict[str, list] = {}
    for nm in runs[0]:
        sh = [r.get(nm) for r in runs]
        if any(s is None for s in sh) or len({len(s) for s in sh}) != 1:
            continue
        out = []
        for v0, v1, v2 in zip(*sh, strict=False):
            out.append(_symbolic(v0, v1, v2))
        if all(o is not None for o in out):
            shapes[nm] = out
    for vi in real_inputs:
        shapes[vi.name] = [sym_map.get(d, dims.get(d, d)) if isinstance(d, str) else d for d in _dims_of(vi)]

    # --- static (shape-computation) values ------------------------------------------------------------
    values: dict[str, np.ndarray | None] = {}
    for k, t in inits.items():
        if t.data_type in (6, 7, 5, 3, 2, 9) or int(np.prod(t.dims) if len(t.dims) else 1) <= 16:
            values[k] = _small_value(t, base_dir)
    static: set[str] = {k for k, t in inits.items() if t.data_type in (6, 7, 5, 3, 2, 9)}
    static |= {k for k, t in inits.items() if k not in static and len(t.dims) <= 1 and int(np.prod(t.dims) if len(t.dims) else 1) <= 16
               and _only_arg_uses(g, k)}
    dropped: set[int] = set()
    for idx, node in enumerate(g.node):
        if node.op_type == "Constant":
            for a in node.attribute:
                if a.name == "value":
                    values[node.output[0]] = _small_value(a.t, base_dir)
                elif a.name in ("value_ints", "value_int", "value_float", "value_floats"):
                    values[node.output[0]] = np.array(onnx.helper.get_attribute_value(a))
            static.add(node.output[0])
            dropped.add(idx)
            continue
        data_ins = [x for x in node.input if x]
        if node.op_type in ("Shape", "Size") or (node.op_type in _SHAPE_OPS and data_ins and all(x in static for x in data_ins)):
            static.update(o for o in node.output if o)
            dropped.add(idx)
            _fold(node, values, shapes)

    # --- convert nodes ---------------------------------------------------------------------------------------
    ops: list[dict[str, Any]] = []
    unsupported: dict[str, list[str]] = {}
    used_names: set[str] = set()
    const_inputs: dict[str, list] = {}
    consumed_params: set[str] = set()
    for idx, node in enumerate(g.node):
        if idx in dropped:
            continue
        opname = node.name or f"{node.op_type}_{idx}"
        base, k = opname, 1
        while opname in used_names:
            k += 1
            opname = f"{base}_{k}"
        used_names.add(opname)
        if node.domain not in ("", "ai.onnx", "com.microsoft") or (
            node.op_type not in _DIRECT and node.op_type not in _ELEMENTWISE
        ):
            unsupported.setdefault(node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}", []).append(opname)
            continue
        try:
            op = _convert(node, opname, inits, init_shape, init_dtype, static, values, shapes, const_inputs, consumed_params)
        except InvalidGraph as exc:
            raise InvalidGraph(f"node {opname!r} ({node.op_type}): {exc.message}", field="model.onnx") from None
        if op is None:
            unsupported.setdefault(node.op_type, []).append(opname)
            continue
        ops.append(op)
    if unsupported:
        total = sum(len(v) for v in unsupported.values())
        parts = [f"{t} ×{len(v)} ({', '.join(v[:3])}{', …' if len(v) > 3 else ''})" for t, v in sorted(unsupported.items())]
        raise InvalidGraph(f"{total} ONNX node(s) of unsupported operator types: {'; '.join(parts)}", field="model.onnx")
    if not ops:
        raise InvalidGraph("the ONNX graph has no operators after folding constants", field="model.onnx")

    inputs = []
    for vi in real_inputs:
        dt = _ONNX_DTYPE.get(vi.type.tensor_type.elem_type, "fp32")
        inputs.append({"name": vi.name, "shape": shapes[vi.name], **({"dtype": dt} if dt not in ("fp32", "fp16", "bf16") else {})})
    for cname, shp in const_inputs.items():
        dt = init_dtype.get(cname)
        inputs.append({"name": cname, "shape": shp, **({"dtype": dt} if dt and dt not in ("fp32", "fp16", "bf16") else {})})
    outputs = [o.name for o in g.output if o.name not in static]
    return {"name": name or g.name or "onnx-model", "inputs": inputs, "ops": ops, "outputs": outputs, **({"dims": dims} if dims else {})}


def _only_arg_uses(g, name: str) -> bool:
    for node in g.node:
        for slot, x in enumerate(node.input):
            if x == name and slot not in _ARG_SLOTS.get(node.op_type, ()):
                return False
    return True


def _symbolic(v0, v1, v2):
    """Recover ``c·batch^i·seq^j`` from three probe runs (batch 13/29, seq 31/37)."""
    if not all(isinstance(v, int) for v in (v0, v1, v2)):
        return None
    if v0 == v1 == v2:
        return v0
    (b0, s0), (b1, _), (_, s2) = _PROBES
    for i in range(3):
        for j in range(3):
            if v0 % (b0**i * s0**j):
                continue
            c = v0 // (b0**i * s0**j)
            if c * b1**i * s0**j == v1 and c * b0**i * s2**j == v2:
                parts = ([str(c)] if c != 1 else []) + ["batch"] * i + ["seq"] * j
                return "*".join(parts) if parts else 1
    return None


def _infer(model, sym_map: Mapping[str, str], dims: Mapping[str, int], probe: tuple[int, int], inits) -> dict[str, list]:
    """Concrete shapes of every value with (batch, seq) = probe, by ONNX shape inference with
    data propagation.  Large initializers are replaced by inputs of the same shape (their values
    are never needed)."""
    import onnx
    from onnx import shape_inference

    m = onnx.ModelProto()
    m.ir_version = model.ir_version
    m.opset_import.extend(model.opset_import)
    gg = m.graph
    src = model.graph
    gg.node.extend(src.node)
    b, s = probe
    for vi in src.input:
        if vi.name in inits:
            continue
        v = gg.input.add()
        v.CopyFrom(vi)
        for d in v.type.tensor_type.shape.dim:
            if d.HasField("dim_param"):
                p = d.dim_param
                val = {"batch": b, "seq": s}.get(sym_map.get(p, ""), dims.get(p))
                if val is not None:
                    d.dim_value = int(val)
    for t in src.initializer:
        n = int(np.prod(list(t.dims))) if len(t.dims) else 1
        if n <= 4096 and t.data_location != t.EXTERNAL:
            gg.initializer.append(t)
        else:
            gg.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    gg.output.extend(src.output)
    try:
        inferred = shape_inference.infer_shapes(m, strict_mode=False, data_prop=True)
    except Exception as exc:  # noqa: BLE001 - onnx raises several types
        raise InvalidGraph(f"ONNX shape inference failed: {str(exc).splitlines()[0][:300]}", field="model.onnx") from None
    out: dict[str, list] = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output) + list(inferred.graph.input):
        d = _dims_of(vi)
        if d is not None:
            out[vi.name] = d
    return out


def _fold(node, values: dict, shapes: dict) -> None:
    """Evaluate the small shape computations whose values later ops need as arguments."""
    t = node.op_type
    try:
        ins = [values.get(x) for x in node.input]
        if t == "Shape":
            shp = shapes.get(node.input[0])
            if shp is not None:
                values[node.output[0]] = np.array(shp, dtype=object)
            return
        if any(v is None for v in ins[:1]):
            return
        if t == "Gather":
            axis = _attr(node, "axis", 0)
            values[node.output[0]] = np.take(ins[0], np.asarray(ins[1], dtype=np.int64), axis=axis)
        elif t == "Concat":
            if all(v is not None for v in ins):
                values[node.output[0]] = np.concatenate([np.atleast_1d(v) for v in ins], axis=_attr(node, "axis", 0))
        elif t in ("Unsqueeze", "Squeeze", "Identity", "Cast", "Reshape"):
            v = ins[0]
            values[node.output[0]] = np.atleast_1d(v) if t == "Unsqueeze" else (np.squeeze(v) if t == "Squeeze" else v)
        elif t in ("Mul", "Add", "Sub", "Div") and all(v is not None for v in ins):
            a, b = ins
            if a.dtype != object and b.dtype != object:
                values[node.output[0]] = {"Mul": np.multiply, "Add": np.add, "Sub": np.subtract, "Div": np.floor_divide}[t](a, b)
    except Exception:  # noqa: BLE001 - folding is best effort; shapes come from inference
        return


def _attr(node, name: str, default=None):
    import onnx

    for a in node.attribute:
        if a.name == name:
            v = onnx.helper.get_attribute_value(a)
            if isinstance(v, bytes):
                v = v.decode()
            return v
    return default


def _attrs(node) -> dict[str, Any]:
    import onnx

    out = {}
    for a in node.attribute:
        v = onnx.helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode()
        if isinstance(v, (int, float, str)) or (isinstance(v, list) and all(isinstance(x, (int, float)) for x in v)):
            out[a.name] = list(v) if isinstance(v, list) else v
    return out


def _ints(v) -> list[int] | None:
    if v is None:
        return None
    arr = np.atleast_1d(v)
    if arr.dtype == object:
        return None
    return [int(x) for x in arr.tolist()]


def _convert_inputs(node: Any, inits: Any, init_shape: Mapping[str, Any], init_dtype: Mapping[str, Any], static: set[str],
                    shapes: Mapping[str, Any], const_inputs: dict[str, list[int]],
                    consumed_params: set[str]) -> tuple[dict[str, Any], list[str]] | None:
    """A node's inputs as the IR sees them: initializers become named parameters (their
    shapes and non-fp32 dtypes), static values constant inputs; None for a batched weight (no
    rule)."""
    t = node.op_type
    ins = list(node.input)
    arg_slots = _ARG_SLOTS.get(t, ())
    pslots = _PARAM_SLOTS.get(t, {})
    params: dict[str, Any] = {}
    tensor_ins: list[str] = []

    def add_const(x: str) -> None:
        if x not in const_inputs:
            shp = init_shape.get(x) if x in inits else shapes.get(x)
            if shp is None:
                raise InvalidGraph(f"cannot determine the shape of constant {x!r}")
            const_inputs[x] = list(shp) if shp else []
        tensor_ins.append(x)

    for slot, x in enumerate(ins):
        if not x:
            continue
        if slot in arg_slots:
            continue
        if x in inits and x not in static:
            shp = init_shape[x]
            if slot in pslots:
                pname = pslots[slot]
            elif t in ("MatMul",) and slot == 1 or t == "Gather" and slot == 0:
                pname = "weight"
            else:
                pname = f"p{slot}_{x}"
            if t == "MatMul" and slot == 1 and len(shp) != 2:
                return None  # batched weight tensors: no rule
            if pname in params:
                pname = f"{pname}_{slot}"
            params[pname] = {"shape": shp or [], **({"dtype": init_dtype[x]} if init_dtype.get(x) not in (None, "fp32") else {})}
            consumed_params.add(x)
            continue
        if x in static:
            add_const(x)
            continue
        tensor_ins.append(x)

    return params, tensor_ins


_SHAPE_ATTR_OPS = ("Reshape", "Expand", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Concat", "Split", "Slice")


def _shape_op_attrs(t: str, attrs: Mapping[str, Any], ins: list[str], outs: list[str], values: Mapping[str, Any],
                    shapes: Mapping[str, Any]) -> dict[str, Any]:
    """IR attributes of the shape-only ops, resolving computed targets from folded values or
    inferred shapes."""
    a: dict[str, Any] = {}
    if t == "Reshape":
        target = _ints(values.get(ins[1]))
        out_shape = shapes.get(outs[0])
        if target is not None and all(v != 0 or True for v in target):
            a = {"shape": target}
        elif out_shape is not None:
            a = {"shape": out_shape}
        else:
            raise InvalidGraph("the reshape target is computed and shape inference could not resolve it")
    elif t == "Expand":
        out_shape = shapes.get(outs[0])
        if out_shape is None:
            raise InvalidGraph("the expand shape could not be resolved")
        a = {"shape": out_shape}
    elif t == "Transpose":
        a = {"perm": attrs["perm"]} if "perm" in attrs else {}
    elif t == "Flatten":
        a = {"axis": attrs.get("axis", 1)}
    elif t in ("Squeeze", "Unsqueeze"):
        axes = attrs.get("axes")
        if axes is None and len(ins) > 1 and ins[1]:
            axes = _ints(values.get(ins[1]))
        if axes is None and t == "Unsqueeze":
            raise InvalidGraph("Unsqueeze axes are computed; cannot resolve them")
        a = {"axes": axes} if axes is not None else {}
    elif t == "Concat":
        a = {"axis": attrs.get("axis", 0)}
    elif t == "Split":
        a = {"axis": attrs.get("axis", 0)}
        sizes = attrs.get("split")
        if sizes is None and len(ins) > 1 and ins[1]:
            sizes = _ints(values.get(ins[1]))
            if sizes is None:
                ax = a["axis"]
                sizes = [shapes[o][ax] for o in outs] if all(o in shapes for o in outs) else None
        if sizes is not None:
            a["split"] = sizes
    elif t == "Slice":
        starts, ends = _ints(values.get(ins[1])), _ints(values.get(ins[2]))
        axes = _ints(values.get(ins[3])) if len(ins) > 3 and ins[3] else None
        steps = _ints(values.get(ins[4])) if len(ins) > 4 and ins[4] else None
        if starts is None or ends is None:
            src, dst = shapes.get(ins[0]), shapes.get(outs[0])
            if src is None or dst is None:
                raise InvalidGraph("slice bounds are computed and could not be resolved")
            axes = [i for i, (x, y) in enumerate(zip(src, dst, strict=False)) if x != y]
            starts = [0] * len(axes)
            ends = [int(dst[i]) for i in axes]
            steps = None
        a = {"starts": starts, "ends": [min(e, 2**62) for e in ends]}
        if axes is not None:
            a["axes"] = axes
        if steps is not None:
            a["steps"] = steps
    return a


def _op_attrs(t: str, opname: str, attrs: Mapping[str, Any], ins: list[str], outs: list[str], tensor_ins: list[str],
              params: dict[str, Any], op: dict[str, Any], values: Mapping[str, Any],
              shapes: Mapping[str, Any]) -> dict[str, Any] | list[dict[str, Any]]:
    """IR attributes of the other ops (adjusting ``op`` and ``params`` where the IR differs);
    a list of ops when one ONNX node becomes two."""
    a: dict[str, Any] = {}
    if t == "Gemm":
        a = {k: attrs[k] for k in ("transA", "transB") if k in attrs}
        if "weight" not in params:  # Gemm of two activations
            op["type"] = "MatMul"
    elif t == "MatMul":
        pass
    elif t == "Conv":
        a = {k: attrs[k] for k in ("strides", "pads", "dilations", "group", "auto_pad") if k in attrs}
    elif t in ("LayerNormalization", "RMSNormalization", "SimplifiedLayerNormalization"):
        a = {"axis": attrs.get("axis", -1)}
        op["outputs"] = outs[:1] + [o for o in outs[1:] if o]
    elif t == "BatchNormalization":
        op["outputs"] = outs[:1]
    elif t in ("Softmax", "LogSoftmax"):
        a = {"axis": attrs.get("axis", -1)}
    elif t == "Attention":
        op["inputs"] = tensor_ins[:3]
        op["outputs"] = outs[:1]
        qh = attrs.get("q_num_heads")
        kvh = attrs.get("kv_num_heads", qh)
        if qh is not None:
            a = {"num_heads": qh, "kv_num_heads": kvh}
        a["causal"] = int(attrs.get("is_causal", 0))
    elif t in ("SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss"):
        # ONNX puts classes on axis 1 ([N, C, d1...]); the IR's CrossEntropy wants them last.
        scores = shapes.get(ins[0])
        a = {"reduction": attrs.get("reduction", "mean")}
        op["outputs"] = outs[:1]
        if scores is not None and len(scores) > 2:
            perm = [0] + list(range(2, len(scores))) + [1]
            tname = f"{opname}:classes_last"
            return [{"name": f"{opname}:transpose", "type": "Transpose", "inputs": [tensor_ins[0]], "outputs": [tname],
                     "attrs": {"perm": perm}},
                    {**op, "inputs": [tname] + tensor_ins[1:], "attrs": a}]
    elif t in ("MaxPool", "AveragePool", "LpPool"):
        a = {k: attrs[k] for k in ("kernel_shape", "strides", "pads", "dilations", "ceil_mode", "auto_pad") if k in attrs}
        op["outputs"] = outs[:1]
    elif t == "Gather":
        axis = attrs.get("axis", 0)
        if "weight" in params and axis == 0 and len(params["weight"]["shape"]) == 2:
            op["type"] = "Embedding"
        else:
            a = {"axis": axis}
            if "weight" in params:
                w = params.pop("weight")
                params["data"] = w
    elif t.startswith("Reduce"):
        axes = attrs.get("axes")
        if axes is None and len(ins) > 1 and ins[1]:
            axes = _ints(values.get(ins[1]))
        a = {"keepdims": attrs.get("keepdims", 1)}
        if axes is not None:
            a["axes"] = axes
    elif t == "Cast":
        a = {"to": _ONNX_DTYPE.get(attrs.get("to", 1), "fp32")}
    elif t == "Dropout":
        op["inputs"] = tensor_ins[:1]
        op["outputs"] = outs[:1]
    return a


def _convert(node: Any, opname: str, inits: Any, init_shape: Mapping[str, Any], init_dtype: Mapping[str, Any], static: set[str],
             values: Mapping[str, Any], shapes: Mapping[str, Any], const_inputs: dict[str, list[int]],
             consumed_params: set[str]) -> dict[str, Any] | list[dict[str, Any]] | None:
    """One ONNX node as IR op(s), or None when it has no rule or no tensor input."""
    t = node.op_type
    ins = list(node.input)
    outs = [o for o in node.output if o]
    attrs = _attrs(node)
    converted = _convert_inputs(node, inits, init_shape, init_dtype, static, shapes, const_inputs, consumed_params)
    if converted is None:
        return None
    params, tensor_ins = converted
    typ = _DIRECT.get(t, t)
    op: dict[str, Any] = {"name": opname, "type": typ, "inputs": tensor_ins, "outputs": outs}
    if t in _SHAPE_ATTR_OPS:
        a = _shape_op_attrs(t, attrs, ins, outs, values, shapes)
    else:
        found = _op_attrs(t, opname, attrs, ins, outs, tensor_ins, params, op, values, shapes)
        if isinstance(found, list):
            return found
        a = found
    if a:
        op["attrs"] = a
    if params:
        op["params"] = params
    if not op["inputs"]:
        return None
    return op


def load_onnx_graph(path: str, training: Any = None, dims: Mapping[str, int] | None = None, name: str | None = None) -> dict[str, Any]:
    """Graph JSON of the ONNX file at ``path`` (external data beside it is referenced by path and
    never read).  ``training`` is accepted for symmetry with the planner; the graph keeps
    ``batch``/``seq`` symbolic, bound from training when it is planned."""
    model = _load(path=path)
    graph = onnx_to_graph(model, name=name or os.path.splitext(os.path.basename(path))[0], dims=dims,
                          base_dir=os.path.dirname(os.path.abspath(path)))
    return _flatten_ops(graph)


def load_onnx_bytes(data: bytes, name: str | None = None, dims: Mapping[str, int] | None = None) -> dict[str, Any]:
    """Graph JSON of an uploaded ONNX file (weights in external data need not be uploaded)."""
    model = _load(data=data)
    return _flatten_ops(onnx_to_graph(model, name=name, dims=dims))


def _flatten_ops(graph: dict[str, Any]) -> dict[str, Any]:
    ops: list[dict[str, Any]] = []
    for op in graph["ops"]:
        if isinstance(op, list):
            ops.extend(op)
        else:
            ops.append(op)
    graph["ops"] = ops
    return graph


__all__ = ["count_onnx_nodes", "load_onnx_bytes", "load_onnx_graph", "onnx_to_graph", "MAX_ONNX_BYTES"]
