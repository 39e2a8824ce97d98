"""Parsing and validation of the v1 ``model.graph`` document into a :class:`GraphSpec`.

Every error is an :class:`InvalidGraph` naming the offending field; sizes are checked against
the caps of :mod:`cost_model.graph.ir` before any structure is built, so absurd inputs fail fast
and cheaply.  The JSON Schema of the document (:data:`GRAPH_JSON_SCHEMA`) describes its shape
for OpenAPI and clients; this validator is the authority (it also checks shapes per operator
type, through :func:`cost_model.graph.shapes.infer_shapes`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from cost_model.errors import InvalidGraph
from cost_model.graph.ir import (
    DTYPE_BYTES,
    MAX_DIM,
    MAX_NAME_LENGTH,
    MAX_OP_INPUTS,
    MAX_OPS,
    MAX_RANK,
    MAX_TENSORS,
    SYMBOLS,
    GraphSpec,
    OpSpec,
    ParamSpec,
    Shape,
    TensorSpec,
    canonical_type,
    parse_dim,
    shape_str,
    supported_op_types,
)
from cost_model.graph.shapes import infer_shapes


def _err(msg: str, path: str) -> InvalidGraph:
    return InvalidGraph(msg, field=path)


def _name(value: Any, path: str) -> str:
    if not isinstance(value, str) or not value:
        raise _err(f"must be a non-empty string, got {value!r}", path)
    if len(value) > MAX_NAME_LENGTH:
        raise _err(f"is longer than {MAX_NAME_LENGTH} characters", path)
    return value


def _dtype(value: Any, path: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise _err(f"must be a dtype name, got {value!r}", path)
    v = value.lower()
    alias = {"float32": "fp32", "float": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16",
             "float64": "fp64", "double": "fp64", "long": "int64", "int": "int32"}
    v = alias.get(v, v)
    if v not in DTYPE_BYTES:
        raise _err(f"unknown dtype {value!r}; one of {', '.join(DTYPE_BYTES)}", path)
    return v


def _shape(value: Any, dims: Mapping[str, int], path: str) -> Shape:
    if not isinstance(value, (list, tuple)):
        raise _err("must be a list of dimensions", path)
    if len(value) > MAX_RANK:
        raise _err(f"rank {len(value)} exceeds the maximum of {MAX_RANK}", path)
    return tuple(parse_dim(v, dims, f"{path}[{i}]") for i, v in enumerate(value))


def _param_shape(value: Any, path: str) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or len(value) > MAX_RANK:
        raise _err(f"must be a list of at most {MAX_RANK} positive integers", path)
    out = []
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1 or v > MAX_DIM:
            raise _err(f"parameter dimensions must be positive integers, got {v!r}", f"{path}[{i}]")
        out.append(v)
    return tuple(out)


def _number(value: Any, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise _err(f"must be a non-negative number, got {value!r}", path)
    return float(value)


def _freeze(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _freeze(v)) for k, v in value.items()))
    return value


def _parse_dims(value: Any, fp: str) -> dict[str, int]:
    dims_in = value or {}
    if not isinstance(dims_in, Mapping) or len(dims_in) > 1000:
        raise _err("must be an object of name → positive integer", f"{fp}.dims")
    dims: dict[str, int] = {}
    for k, v in dims_in.items():
        if not isinstance(k, str) or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k) or k in SYMBOLS:
            raise _err(f"invalid dimension name {k!r} ('batch' and 'seq' are reserved)", f"{fp}.dims")
        if isinstance(v, bool) or not isinstance(v, int) or v < 1 or v > MAX_DIM:
            raise _err(f"must be a positive integer, got {v!r}", f"{fp}.dims.{k}")
        dims[k] = v
    return dims


def _op_params(o: Mapping[str, Any], p: str) -> tuple[ParamSpec, ...]:
    params: list[ParamSpec] = []
    params_in = o.get("params") or {}
    if not isinstance(params_in, Mapping) or len(params_in) > 64:
        raise _err("must be an object of name → shape or {shape, dtype}", f"{p}.params")
    for pn, pv in params_in.items():
        pp = f"{p}.params.{pn}"
        if isinstance(pv, Mapping):
            params.append(ParamSpec(name=str(pn), shape=_param_shape(pv.get("shape"), f"{pp}.shape"), dtype=_dtype(pv.get("dtype"), f"{pp}.dtype")))
        else:
            params.append(ParamSpec(name=str(pn), shape=_param_shape(pv, pp)))
    return tuple(params)


def _op_explicit_costs(o: Mapping[str, Any], p: str) -> dict[str, float]:
    """The explicit per-sample costs an operator may carry (required for custom types)."""
    explicit: dict[str, float] = {}
    for key in ("flops", "bytes", "backward_flops", "backward_bytes", "saved_bytes"):
        if o.get(key) is not None:
            explicit[key] = _number(o[key], f"{p}.{key}")
    return explicit


#: One declared output of an operator: its name, shape (None: to be inferred) and dtype.
_OutDecl = tuple[str, Shape | None, str | None]


def _op_outputs(o: Mapping[str, Any], dims: Mapping[str, int], p: str) -> list[_OutDecl]:
    outs = o.get("outputs")
    if not isinstance(outs, (list, tuple)) or not outs or len(outs) > MAX_OP_INPUTS:
        raise _err("must be a non-empty list of tensor names or {name, shape, dtype}", f"{p}.outputs")
    out_decl: list[_OutDecl] = []
    for j, ov in enumerate(outs):
        op_ = f"{p}.outputs[{j}]"
        if isinstance(ov, str):
            out_decl.append((_name(ov, op_), None, None))
        elif isinstance(ov, Mapping):
            shp = _shape(ov["shape"], dims, f"{op_}.shape") if ov.get("shape") is not None else None
            out_decl.append((_name(ov.get("name"), f"{op_}.name"), shp, _dtype(ov.get("dtype"), f"{op_}.dtype")))
        else:
            raise _err("must be a tensor name or {name, shape, dtype}", op_)
    return out_decl


def _outputs_mention(outs: Any, tensor: str) -> bool:
    if not isinstance(outs, (list, tuple)):
        return False
    return any(o == tensor or (isinstance(o, Mapping) and o.get("name") == tensor) for o in outs[:MAX_OP_INPUTS])


class _GraphBuilder:
    """The graph while it is read: the tensors defined so far (graph inputs and outputs of the
    operators read), the operators, each tensor's producer and consumers, and the operators of
    unsupported types (reported together at the end)."""

    def __init__(self, fp: str, dims: dict[str, int], ops_in: Sequence[Any]) -> None:
        self.fp = fp
        self.dims = dims
        self.ops_in = ops_in
        self.tensors: dict[str, TensorSpec] = {}
        self.inputs: list[str] = []
        self.ops: list[OpSpec] = []
        self.op_names: set[str] = set()
        self.producer: dict[str, int] = {}
        self.consumers: dict[str, list[int]] = {}
        self.unsupported: list[str] = []

    def add_inputs(self, inputs_in: Sequence[Any]) -> None:
        for i, t in enumerate(inputs_in):
            p = f"{self.fp}.inputs[{i}]"
            if not isinstance(t, Mapping):
                raise _err("must be an object {name, shape, dtype}", p)
            tname = _name(t.get("name"), f"{p}.name")
            if tname in self.tensors:
                raise _err(f"tensor {tname!r} is defined twice", f"{p}.name")
            if "shape" not in t:
                raise _err("is required", f"{p}.shape")
            self.tensors[tname] = TensorSpec(name=tname, shape=_shape(t["shape"], self.dims, f"{p}.shape"), dtype=_dtype(t.get("dtype"), f"{p}.dtype"))
            self.inputs.append(tname)

    def _op_inputs(self, o: Mapping[str, Any], i: int, oname: str, p: str) -> list[str]:
        ins = o.get("inputs", [])
        if not isinstance(ins, (list, tuple)) or len(ins) > MAX_OP_INPUTS:
            raise _err(f"must be a list of at most {MAX_OP_INPUTS} tensor names", f"{p}.inputs")
        in_names = []
        for j, tn in enumerate(ins):
            tn = _name(tn, f"{p}.inputs[{j}]")
            if tn not in self.tensors:
                later = any(isinstance(q, Mapping) and _outputs_mention(q.get("outputs"), tn) for q in self.ops_in[i + 1:])
                if later:
                    raise _err(
                        f"operator {oname!r} consumes tensor {tn!r} before it is produced (a cycle, or ops not in "
                        "topological order)",
                        f"{p}.inputs[{j}]",
                    )
                raise _err(f"operator {oname!r} consumes tensor {tn!r}, which no graph input or operator defines (dangling)", f"{p}.inputs[{j}]")
            in_names.append(tn)
        return in_names

    def add_op(self, i: int, o: Any) -> None:
        p = f"{self.fp}.ops[{i}]"
        if not isinstance(o, Mapping):
            raise _err("must be an operator object {name, type, inputs, outputs}", p)
        oname = _name(o.get("name", f"op{i}"), f"{p}.name")
        if oname in self.op_names:
            raise _err(f"duplicate operator name {oname!r}", f"{p}.name")
        self.op_names.add(oname)
        otype = _name(o.get("type"), f"{p}.type")
        known = canonical_type(otype)
        in_names = self._op_inputs(o, i, oname, p)
        params = _op_params(o, p)
        attrs_in = o.get("attrs") or {}
        if not isinstance(attrs_in, Mapping):
            raise _err("must be an object", f"{p}.attrs")
        attrs = tuple(sorted((str(k), _freeze(v)) for k, v in attrs_in.items()))
        explicit = _op_explicit_costs(o, p)
        out_decl = _op_outputs(o, self.dims, p)
        if known is None:
            if "flops" not in explicit or "bytes" not in explicit:
                self.unsupported.append(f"{oname} ({otype})")
                return
            ctype, cat = otype, "custom"
        else:
            ctype, cat = known
        op = OpSpec(
            name=oname, type=ctype, category=cat, inputs=tuple(in_names), outputs=tuple(n for n, _, _ in out_decl),
            params=params, attrs=attrs, source_type=otype, **explicit,
        )
        shapes, out_dtypes = self._output_shapes(op, out_decl, p)
        for j, (tn, _, dt) in enumerate(out_decl):
            if tn in self.tensors:
                raise _err(f"tensor {tn!r} is defined twice (every tensor has exactly one producer)", f"{p}.outputs[{j}]")
            if len(self.tensors) >= MAX_TENSORS:
                raise _err(f"more than {MAX_TENSORS} tensors", f"{p}.outputs")
            self.tensors[tn] = TensorSpec(name=tn, shape=shapes[j], dtype=dt or out_dtypes[j])
            self.producer[tn] = len(self.ops)
        for tn in in_names:
            self.consumers.setdefault(tn, []).append(len(self.ops))
        self.ops.append(op)

    def _output_shapes(self, op: OpSpec, out_decl: list[_OutDecl], p: str) -> tuple[list[Shape], list[str | None]]:
        """Declared shapes of a custom operator; inferred (and checked against any declared
        shape) for a known one."""
        oname, otype = op.name, op.source_type
        if op.category == "custom":
            shapes = []
            for j, (_, shp, _) in enumerate(out_decl):
                if shp is None:
                    raise _err(f"operator type {otype!r} is not built in: give the output shape", f"{p}.outputs[{j}]")
                shapes.append(shp)
            return shapes, [dt for _, _, dt in out_decl]
        try:
            shapes, out_dtypes = infer_shapes(op, self.tensors, len(out_decl), self.dims)
        except InvalidGraph as exc:
            raise _err(f"operator {oname!r} ({otype}): {exc.message}", f"{p}.attrs.{exc.field}" if exc.field else p) from None
        except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError) as exc:
            raise _err(f"operator {oname!r} ({otype}): inputs or attributes do not fit the operator ({exc!s})", p) from None
        for j, (tn, shp, _) in enumerate(out_decl):
            if shp is not None and shp != shapes[j]:
                raise _err(
                    f"operator {oname!r} ({otype}) produces shape {shape_str(shapes[j])} for {tn!r} but the graph "
                    f"declares {shape_str(shp)}",
                    f"{p}.outputs[{j}].shape",
                )
        return shapes, out_dtypes

    def check_supported(self) -> None:
        if self.unsupported:
            shown = ", ".join(self.unsupported[:20]) + (f" and {len(self.unsupported) - 20} more" if len(self.unsupported) > 20 else "")
            raise _err(
                f"{len(self.unsupported)} operator(s) of unsupported type without explicit 'flops' and 'bytes': {shown}. "
                f"Supported types: {', '.join(supported_op_types())}",
                f"{self.fp}.ops",
            )

    def graph_outputs(self, outs_in: Any) -> tuple[str, ...]:
        """The declared outputs, or by default every tensor no operator consumes."""
        fp = self.fp
        if outs_in is None:
            return tuple(t for t in self.producer if t not in self.consumers)
        if not isinstance(outs_in, (list, tuple)):
            raise _err("must be a list of tensor names", f"{fp}.outputs")
        outputs = tuple(_name(t, f"{fp}.outputs[{j}]") for j, t in enumerate(outs_in))
        for j, t in enumerate(outputs):
            if t not in self.tensors:
                raise _err(f"output {t!r} is not a tensor of the graph", f"{fp}.outputs[{j}]")
        return outputs


def graph_from_dict(data: Any, name: str | None = None, field_path: str = "model.graph") -> GraphSpec:
    """Parse and validate the v1 graph object (see :mod:`cost_model.graph.ir`).  Every error is
    an :class:`InvalidGraph` naming the field; sizes are checked before anything is built."""
    fp = field_path
    if not isinstance(data, Mapping):
        raise _err("must be an object with 'inputs' and 'ops'", fp)
    ops_in = data.get("ops")
    if not isinstance(ops_in, (list, tuple)) or not ops_in:
        raise _err("must be a non-empty list of operators", f"{fp}.ops")
    if len(ops_in) > MAX_OPS:
        raise _err(f"has {len(ops_in)} operators; the limit is {MAX_OPS}", f"{fp}.ops")
    inputs_in = data.get("inputs", [])
    if not isinstance(inputs_in, (list, tuple)):
        raise _err("must be a list of {name, shape, dtype}", f"{fp}.inputs")
    if len(inputs_in) > MAX_OPS:
        raise _err(f"has {len(inputs_in)} inputs; the limit is {MAX_OPS}", f"{fp}.inputs")
    gname = name or data.get("name") or "graph"
    if not isinstance(gname, str):
        raise _err("must be a string", f"{fp}.name")
    builder = _GraphBuilder(fp, _parse_dims(data.get("dims"), fp), ops_in)
    builder.add_inputs(inputs_in)
    for i, o in enumerate(ops_in):
        builder.add_op(i, o)
    builder.check_supported()
    outputs = builder.graph_outputs(data.get("outputs"))
    if not any(op.params for op in builder.ops):
        raise _err("the graph has no parameters (weights): nothing to train", f"{fp}.ops")
    return GraphSpec(
        name=gname,
        inputs=tuple(builder.inputs),
        ops=tuple(builder.ops),
        tensors=builder.tensors,
        outputs=outputs,
        producer=builder.producer,
        consumers={k: tuple(v) for k, v in builder.consumers.items()},
        dims=builder.dims,
    )


#: JSON Schema (draft 2020-12) of the v1 ``model.graph`` object, for OpenAPI and clients.  The
#: validator above is the authority (it also checks shapes per operator type); this describes
#: the shape of the document.
_DIM_SCHEMA = {
    "oneOf": [
        {"type": "integer", "minimum": 1},
        {"type": "string", "pattern": r"^\s*([A-Za-z_][A-Za-z0-9_]*|\d+)(\s*\*\s*([A-Za-z_][A-Za-z0-9_]*|\d+))*\s*$",
         "description": "'batch' (the micro-batch), 'seq' (training.sequence_length), a name from 'dims', or a product such as 'batch*seq'"},
    ]
}
_SHAPE_SCHEMA = {"type": "array", "maxItems": MAX_RANK, "items": _DIM_SCHEMA}
_TENSOR_SCHEMA = {
    "type": "object",
    "required": ["name", "shape"],
    "properties": {"name": {"type": "string", "minLength": 1}, "shape": _SHAPE_SCHEMA,
                   "dtype": {"type": "string", "enum": sorted(DTYPE_BYTES)}},
}
GRAPH_JSON_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "Operator graph (model.graph)",
    "type": "object",
    "required": ["ops"],
    "properties": {
        "name": {"type": "string"},
        "dims": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 1}},
        "inputs": {"type": "array", "items": _TENSOR_SCHEMA},
        "outputs": {"type": "array", "items": {"type": "string"}},
        "ops": {
            "type": "array",
            "minItems": 1,
            "maxItems": MAX_OPS,
            "items": {
                "type": "object",
                "required": ["type", "outputs"],
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "type": {"type": "string", "description": "a built-in type (see supported_op_types()) or any name with flops and bytes"},
                    "inputs": {"type": "array", "items": {"type": "string"}},
                    "outputs": {"type": "array", "minItems": 1, "items": {"oneOf": [{"type": "string"}, _TENSOR_SCHEMA]}},
                    "params": {"type": "object", "additionalProperties": {"oneOf": [
                        {"type": "array", "items": {"type": "integer", "minimum": 1}},
                        {"type": "object", "required": ["shape"], "properties": {
                            "shape": {"type": "array", "items": {"type": "integer", "minimum": 1}},
                            "dtype": {"type": "string"}}},
                    ]}},
                    "attrs": {"type": "object"},
                    "flops": {"type": "number", "minimum": 0, "description": "forward FLOPs per sample (custom types)"},
                    "bytes": {"type": "number", "minimum": 0, "description": "forward bytes per sample (custom types)"},
                    "backward_flops": {"type": "number", "minimum": 0},
                    "backward_bytes": {"type": "number", "minimum": 0},
                    "saved_bytes": {"type": "number", "minimum": 0},
                },
            },
        },
    },
}

#: A small complete example (an MLP block with a custom operator) for documentation.
GRAPH_EXAMPLE: dict[str, Any] = {
    "name": "mlp-block",
    "dims": {"hidden": 1024},
    "inputs": [{"name": "x", "shape": ["batch", "seq", "hidden"]}],
    "ops": [
        {"name": "norm", "type": "LayerNorm", "inputs": ["x"], "outputs": ["n"], "params": {"scale": [1024], "bias": [1024]}},
        {"name": "fc1", "type": "MatMul", "inputs": ["n"], "outputs": ["h"], "params": {"weight": [1024, 4096], "bias": [4096]}},
        {"name": "act", "type": "Gelu", "inputs": ["h"], "outputs": ["a"]},
        {"name": "fc2", "type": "MatMul", "inputs": ["a"], "outputs": ["y"], "params": {"weight": [4096, 1024], "bias": [1024]}},
        {"name": "res", "type": "Add", "inputs": ["x", "y"], "outputs": ["out"]},
        {"name": "my_op", "type": "MyFusedThing", "inputs": ["out"], "outputs": [{"name": "z", "shape": ["batch", "seq", 1024]}],
         "flops": 2.0e6, "bytes": 4.0e6},
    ],
    "outputs": ["z"],
}
