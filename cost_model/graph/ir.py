"""Operator-graph IR: any DAG of operators, validated, with FLOPs, bytes, parameters and saved
activations per operator.

JSON shape (contract v1, ``{"model": {"graph": {...}}}``)::

    {
      "name": "mlp",                                    # optional
      "dims": {"hidden": 1024},                         # optional named integer constants
      "inputs": [{"name": "x", "shape": ["batch", "hidden"], "dtype": "bf16"}],
      "ops": [
        {"name": "fc1", "type": "MatMul", "inputs": ["x"], "outputs": ["h"],
         "params": {"weight": [1024, 4096], "bias": [4096]}},
        {"name": "act", "type": "Gelu", "inputs": ["h"], "outputs": ["a"]},
        {"name": "mine", "type": "MyFusedThing", "inputs": ["a"],
         "outputs": [{"name": "y", "shape": ["batch", 10]}],
         "flops": 2.0e6, "bytes": 1.0e5}
      ],
      "outputs": ["y"]                                  # optional (default: unconsumed tensors)
    }

* Shapes hold integers and symbolic dimensions.  ``batch`` is bound to the micro-batch size and
  ``seq`` to ``training.sequence_length`` when the graph is costed; products such as
  ``"batch*seq"`` and ``"4*seq"`` are allowed (a dimension is a monomial ``c·Πsymbols``), and
  names from ``dims`` stand for integers.
* ``params`` are weights (shape, optional dtype), trained and counted as parameters.
* Output shapes may be omitted for known operator types (they are inferred) and are checked
  against the inferred shape when given.  Unknown operator types need ``outputs`` with shapes and
  explicit ``flops`` and ``bytes`` (forward, per sample: they scale with the batch), optionally
  ``backward_flops``/``backward_bytes`` (default 2× forward) and ``saved_bytes`` (activation bytes
  kept for backward, per sample).
* ``ops`` must be listed so that every tensor is defined (graph input or an earlier op's
  output) before it is consumed; this makes cycles impossible to express and they are reported
  as "consumed before it is produced".

FLOP and byte conventions (forward; backward derived per category):

* GEMM ``(m×k)·(k×n)``: ``2·m·n·k`` FLOPs; backward computes dX and dW, ``2×`` forward.
* Convolution: implicit GEMM with ``m = N·out_spatial``, ``n = C_out/g``, ``k = C_in/g·Πkernel``,
  ``g`` groups.
* Attention core (QKᵀ and PV): ``4·b·heads·s_q·s_kv·d`` as Narayanan et al. (2021) Eq. 3 count
  it; backward ``2×`` (``2.5×`` executed with FlashAttention's recompute, see graph_cost).
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
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cost_model.devices import BYTES_PER_ELEMENT
from cost_model.errors import InvalidGraph

#: Hard caps checked before any structure is built, so that absurd inputs fail fast and cheaply.
MAX_OPS = 200_000
MAX_TENSORS = 1_000_000
MAX_RANK = 8
MAX_OP_INPUTS = 4096
MAX_NAME_LENGTH = 512
MAX_DIM = 10**12

SYMBOLS = ("batch", "seq")

#: Element sizes for tensor dtypes (activations default to the training dtype).
DTYPE_BYTES: dict[str, int] = {
    **BYTES_PER_ELEMENT,
    "fp64": 8,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}
INDEX_DTYPES = ("int64", "int32", "int16", "int8", "uint8")


# --------------------------------------------------------------------------------------------
# Symbolic dimensions
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Dim:
    """``coef · Π syms``: an integer, a symbol (``batch``, ``seq``) or a product of them."""

    coef: int
    syms: tuple[str, ...] = ()

    @property
    def is_const(self) -> bool:
        return not self.syms

    def __mul__(self, other: Dim) -> Dim:
        return Dim(self.coef * other.coef, tuple(sorted(self.syms + other.syms)))

    def div(self, other: Dim) -> Dim | None:
        """Exact division, or None when ``other`` does not divide ``self``."""
        if other.coef == 0 or self.coef % other.coef:
            return None
        rest = list(self.syms)
        for s in other.syms:
            if s not in rest:
                return None
            rest.remove(s)
        return Dim(self.coef // other.coef, tuple(rest))

    def add(self, other: Dim) -> Dim | None:
        if self.syms != other.syms:
            return None
        return Dim(self.coef + other.coef, self.syms)

    def bind(self, bindings: Mapping[str, int]) -> int:
        v = self.coef
        for s in self.syms:
            v *= bindings[s]
        return v

    def __str__(self) -> str:
        if not self.syms:
            return str(self.coef)
        parts = ([str(self.coef)] if self.coef != 1 else []) + list(self.syms)
        return "*".join(parts)

    def to_json(self) -> int | str:
        return self.coef if not self.syms else str(self)


ONE = Dim(1)
Shape = tuple[Dim, ...]


def shape_str(shape: Sequence[Dim]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def numel(shape: Sequence[Dim]) -> Dim:
    out = ONE
    for d in shape:
        out = out * d
    return out


_DIM_TOKEN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$|^\d+$")


def parse_dim(value: Any, dims: Mapping[str, int], field_path: str) -> Dim:
    """An integer ≥ 1 (0 allowed only where an op defines it), a symbol, a named constant from
    ``dims`` or a product ``"a*b*4"``."""
    if isinstance(value, bool):
        raise InvalidGraph(f"a dimension must be an integer or a symbol, got {value!r}", field=field_path)
    if isinstance(value, int):
        if value < 1 or value > MAX_DIM:
            raise InvalidGraph(f"dimension must be between 1 and {MAX_DIM}, got {value}", field=field_path)
        return Dim(value)
    if isinstance(value, str) and 0 < len(value) <= 128:
        coef, syms = 1, []
        for tok in value.replace(" ", "").split("*"):
            if not _DIM_TOKEN.match(tok):
                raise InvalidGraph(f"cannot read dimension {value!r} (use integers, 'batch', 'seq', names from 'dims', joined by '*')", field=field_path)
            if tok.isdigit():
                coef *= int(tok)
            elif tok in SYMBOLS:
                syms.append(tok)
            elif tok in dims:
                coef *= dims[tok]
            else:
                raise InvalidGraph(
                    f"unknown symbolic dimension {tok!r}: only 'batch' (the micro-batch) and 'seq' (the sequence "
                    "length) are bound from training; define other names in the graph's 'dims'",
                    field=field_path,
                )
        if coef < 1 or coef > MAX_DIM:
            raise InvalidGraph(f"dimension {value!r} is out of range", field=field_path)
        return Dim(coef, tuple(sorted(syms)))
    raise InvalidGraph(f"a dimension must be an integer or a symbol, got {value!r}", field=field_path)


# --------------------------------------------------------------------------------------------
# IR dataclasses
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: Shape
    dtype: str | None = None  # None: the training dtype

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": [d.to_json() for d in self.shape], **({"dtype": self.dtype} if self.dtype else {})}


@dataclass(frozen=True)
class ParamSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str | None = None

    @property
    def count(self) -> int:
        return math.prod(self.shape) if self.shape else 1

    def to_dict(self) -> dict[str, Any]:
        return {"shape": list(self.shape), **({"dtype": self.dtype} if self.dtype else {})}


@dataclass(frozen=True)
class OpSpec:
    name: str
    type: str  # canonical type (see OP_TYPES)
    category: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    params: tuple[ParamSpec, ...] = ()
    attrs: tuple[tuple[str, Any], ...] = ()
    source_type: str = ""  # the type as given (ONNX op type or alias)
    flops: float | None = None  # explicit forward FLOPs per sample (unknown ops)
    bytes: float | None = None
    backward_flops: float | None = None
    backward_bytes: float | None = None
    saved_bytes: float | None = None

    def attr(self, key: str, default: Any = None) -> Any:
        for k, v in self.attrs:
            if k == key:
                return v
        return default

    def param(self, name: str) -> ParamSpec | None:
        for p in self.params:
            if p.name == name:
                return p
        return None

    @property
    def param_count(self) -> int:
        return sum(p.count for p in self.params)

    def to_dict(self, tensors: Mapping[str, TensorSpec]) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "type": self.source_type or self.type,
            "inputs": list(self.inputs),
            "outputs": [tensors[t].to_dict() for t in self.outputs],
        }
        if self.params:
            out["params"] = {p.name: p.to_dict() for p in self.params}
        if self.attrs:
            out["attrs"] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.attrs}
        for key in ("flops", "bytes", "backward_flops", "backward_bytes", "saved_bytes"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


@dataclass(frozen=True)
class GraphSpec:
    """A validated operator DAG.  ``ops`` are in a topological order; ``tensors`` maps every
    tensor (graph inputs and op outputs) to its symbolic shape."""

    name: str
    inputs: tuple[str, ...]
    ops: tuple[OpSpec, ...]
    tensors: Mapping[str, TensorSpec]
    outputs: tuple[str, ...]
    producer: Mapping[str, int] = field(default_factory=dict)  # tensor -> op index
    consumers: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # tensor -> op indices
    dims: Mapping[str, int] = field(default_factory=dict)

    kind = "graph"

    @property
    def num_ops(self) -> int:
        return len(self.ops)

    def total_params(self) -> int:
        return sum(op.param_count for op in self.ops)

    def active_params(self) -> int:
        """Every parameter takes part in every step (no routing in an operator graph)."""
        return self.total_params()

    def uses_symbol(self, sym: str) -> bool:
        return any(sym in d.syms for t in self.tensors.values() for d in t.shape)

    def bind(self, batch: int, seq: int) -> dict[str, tuple[int, ...]]:
        """Concrete shapes of every tensor for a micro-batch ``batch`` and sequence ``seq``."""
        b = {"batch": int(batch), "seq": int(seq)}
        return {name: tuple(d.bind(b) for d in t.shape) for name, t in self.tensors.items()}

    def op_costs(self, batch: int, seq: int, dtype: str) -> list[OpCost]:
        """Per-operator forward/backward FLOPs and bytes, parameters and saved activations for a
        micro-batch of ``batch`` samples at sequence length ``seq``."""
        shapes = self.bind(batch, seq)
        return [op_cost(op, self, shapes, dtype, batch) for op in self.ops]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "inputs": [self.tensors[t].to_dict() for t in self.inputs],
            "ops": [op.to_dict(self.tensors) for op in self.ops],
            "outputs": list(self.outputs),
        }
        if self.dims:
            out["dims"] = dict(self.dims)
        return out

    def summary(self) -> dict[str, Any]:
        cats: dict[str, int] = {}
        for op in self.ops:
            cats[op.category] = cats.get(op.category, 0) + 1
        return {"name": self.name, "num_ops": self.num_ops, "params": self.total_params(), "ops_by_category": cats}


# --------------------------------------------------------------------------------------------
# Operator catalog
# --------------------------------------------------------------------------------------------
_CATEGORY_TYPES: dict[str, tuple[str, ...]] = {
    "matmul": ("MatMul", "Gemm", "Linear", "FullyConnected", "Dense", "BatchMatMul"),
    "conv": ("Conv", "Conv1d", "Conv2d"),
    "attention": ("Attention", "MultiHeadAttention", "ScaledDotProductAttention"),
    "norm": ("LayerNorm", "LayerNormalization", "RMSNorm", "RMSNormalization", "SimplifiedLayerNormalization",
             "BatchNorm", "BatchNormalization", "GroupNorm", "GroupNormalization", "InstanceNormalization"),
    "softmax": ("Softmax", "LogSoftmax"),
    "elementwise": ("Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Where", "Equal", "Less", "Greater",
                    "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Not", "Mod", "Sqrt", "Exp", "Log", "Neg",
                    "Abs", "Reciprocal", "Cast", "Dropout", "Erf", "Clip", "Floor", "Ceil", "Round", "Sign",
                    "Sin", "Cos", "Expand", "BiasAdd", "Scale"),
    "activation": ("Relu", "Gelu", "FastGelu", "QuickGelu", "Silu", "Swish", "SiLU", "Sigmoid", "Tanh", "LeakyRelu",
                   "Elu", "Selu", "Celu", "HardSigmoid", "HardSwish", "Softplus", "Softsign", "Mish", "PRelu"),
    "embedding": ("Embedding", "EmbeddingBag"),
    "gather": ("Gather", "GatherElements", "GatherND"),
    "reduce": ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
               "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"),
    "layout": ("Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Concat", "Split", "Slice"),
    "pool": ("MaxPool", "AveragePool", "AvgPool", "GlobalAveragePool", "GlobalMaxPool", "LpPool"),
    "loss": ("CrossEntropy", "SoftmaxCrossEntropyLoss", "CrossEntropyLoss", "MSELoss", "NegativeLogLikelihoodLoss"),
}

#: alias (lower case) -> (canonical type, category)
OP_TYPES: dict[str, tuple[str, str]] = {}
for _cat, _types in _CATEGORY_TYPES.items():
    for _t in _types:
        OP_TYPES[_t.lower()] = (_t, _cat)

_CANON = {
    "gemm": "Gemm", "linear": "MatMul", "fullyconnected": "MatMul", "dense": "MatMul", "batchmatmul": "MatMul",
    "conv1d": "Conv", "conv2d": "Conv",
    "multiheadattention": "Attention", "scaleddotproductattention": "Attention",
    "layernormalization": "LayerNorm", "rmsnormalization": "RMSNorm", "simplifiedlayernormalization": "RMSNorm",
    "batchnormalization": "BatchNorm", "groupnormalization": "GroupNorm", "instancenormalization": "GroupNorm",
    "avgpool": "AveragePool", "softmaxcrossentropyloss": "CrossEntropy", "crossentropyloss": "CrossEntropy",
    "negativeloglikelihoodloss": "CrossEntropy", "swish": "Silu", "silu": "Silu",
}


def canonical_type(type_name: str) -> tuple[str, str] | None:
    """(canonical type, category) of a known operator type, or None."""
    key = type_name.lower()
    if key not in OP_TYPES:
        return None
    t, cat = OP_TYPES[key]
    return _CANON.get(key, t), cat


def supported_op_types() -> list[str]:
    return sorted({t for types in _CATEGORY_TYPES.values() for t in types})


#: Forward FLOPs per output element of memory-bound operators (they never bound time; kept for
#: the FLOP count).  LayerNorm: mean, variance, normalise, scale, shift ≈ 8; softmax: max, sub,
#: exp, sum, div ≈ 5; GELU (tanh form) ≈ 8.
_FLOPS_PER_ELEMENT = {
    "LayerNorm": 8, "RMSNorm": 5, "BatchNorm": 6, "GroupNorm": 8, "Softmax": 5, "LogSoftmax": 6,
    "Gelu": 8, "FastGelu": 8, "QuickGelu": 4, "Silu": 4, "Sigmoid": 4, "Tanh": 4, "Mish": 8, "Softplus": 4,
    "Elu": 3, "Selu": 3, "Celu": 3, "HardSwish": 3, "HardSigmoid": 2, "Softsign": 2, "CrossEntropy": 6,
}
#: Activation functions whose backward needs only a 1-bit/1-byte mask (not the input).
_MASK_ONLY = ("Relu", "LeakyRelu", "Dropout", "PRelu")
#: Elementwise ops whose backward needs their inputs (products, quotients, powers).
_SAVES_INPUTS = ("Mul", "Div", "Pow", "Max", "Min", "Where", "Sqrt", "Exp", "Log", "Reciprocal", "Erf", "Sin",
                 "Cos", "Clip")
#: Ops that produce no gradient (comparisons, casts of indices).
_NO_GRAD = ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Not", "Floor",
            "Ceil", "Round", "Sign", "Mod")


# --------------------------------------------------------------------------------------------
# Parsing and validation
# --------------------------------------------------------------------------------------------
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


def graph_from_dict(data: Any, name: str | None = None, field_path: str = "model.graph") -> GraphSpec:
    """Parse and validate the v1 graph object (see the module docstring).  Every error is an
    :class:`InvalidGraph` naming the field; sizes are checked before anything is built."""
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
    dims_in = data.get("dims") or {}
    if not isinstance(dims_in, Mapping) or len(dims_in) > 1000:
        raise _err("must be an object of name → positive integer", f"{fp}.dims")
    dims: dict[str, int] = {}
    for k, v in dims_in.items():
        if not isinstance(k, str) or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k) or k in SYMBOLS:
            raise _err(f"invalid dimension name {k!r} ('batch' and 'seq' are reserved)", f"{fp}.dims")
        if isinstance(v, bool) or not isinstance(v, int) or v < 1 or v > MAX_DIM:
            raise _err(f"must be a positive integer, got {v!r}", f"{fp}.dims.{k}")
        dims[k] = v

    tensors: dict[str, TensorSpec] = {}
    inputs: list[str] = []
    for i, t in enumerate(inputs_in):
        p = f"{fp}.inputs[{i}]"
        if not isinstance(t, Mapping):
            raise _err("must be an object {name, shape, dtype}", p)
        tname = _name(t.get("name"), f"{p}.name")
        if tname in tensors:
            raise _err(f"tensor {tname!r} is defined twice", f"{p}.name")
        if "shape" not in t:
            raise _err("is required", f"{p}.shape")
        tensors[tname] = TensorSpec(tname, _shape(t["shape"], dims, f"{p}.shape"), _dtype(t.get("dtype"), f"{p}.dtype"))
        inputs.append(tname)

    ops: list[OpSpec] = []
    op_names: set[str] = set()
    producer: dict[str, int] = {}
    consumers: dict[str, list[int]] = {}
    unsupported: list[str] = []
    for i, o in enumerate(ops_in):
        p = f"{fp}.ops[{i}]"
        if not isinstance(o, Mapping):
            raise _err("must be an operator object {name, type, inputs, outputs}", p)
        oname = _name(o.get("name", f"op{i}"), f"{p}.name")
        if oname in op_names:
            raise _err(f"duplicate operator name {oname!r}", f"{p}.name")
        op_names.add(oname)
        otype = _name(o.get("type"), f"{p}.type")
        known = canonical_type(otype)
        ins = o.get("inputs", [])
        if not isinstance(ins, (list, tuple)) or len(ins) > MAX_OP_INPUTS:
            raise _err(f"must be a list of at most {MAX_OP_INPUTS} tensor names", f"{p}.inputs")
        in_names = []
        for j, tn in enumerate(ins):
            tn = _name(tn, f"{p}.inputs[{j}]")
            if tn not in tensors:
                later = any(isinstance(q, Mapping) and _outputs_mention(q.get("outputs"), tn) for q in ops_in[i + 1:])
                if later:
                    raise _err(
                        f"operator {oname!r} consumes tensor {tn!r} before it is produced (a cycle, or ops not in "
                        "topological order)",
                        f"{p}.inputs[{j}]",
                    )
                raise _err(f"operator {oname!r} consumes tensor {tn!r}, which no graph input or operator defines (dangling)", f"{p}.inputs[{j}]")
            in_names.append(tn)
        params: list[ParamSpec] = []
        params_in = o.get("params") or {}
        if not isinstance(params_in, Mapping) or len(params_in) > 64:
            raise _err("must be an object of name → shape or {shape, dtype}", f"{p}.params")
        for pn, pv in params_in.items():
            pp = f"{p}.params.{pn}"
            if isinstance(pv, Mapping):
                params.append(ParamSpec(str(pn), _param_shape(pv.get("shape"), f"{pp}.shape"), _dtype(pv.get("dtype"), f"{pp}.dtype")))
            else:
                params.append(ParamSpec(str(pn), _param_shape(pv, pp)))
        attrs_in = o.get("attrs") or {}
        if not isinstance(attrs_in, Mapping):
            raise _err("must be an object", f"{p}.attrs")
        attrs = tuple(sorted((str(k), _freeze(v)) for k, v in attrs_in.items()))
        explicit = {}
        for key in ("flops", "bytes", "backward_flops", "backward_bytes", "saved_bytes"):
            if o.get(key) is not None:
                explicit[key] = _number(o[key], f"{p}.{key}")
        outs = o.get("outputs")
        if not isinstance(outs, (list, tuple)) or not outs or len(outs) > MAX_OP_INPUTS:
            raise _err("must be a non-empty list of tensor names or {name, shape, dtype}", f"{p}.outputs")
        out_decl: list[tuple[str, Shape | None, str | None]] = []
        for j, ov in enumerate(outs):
            op_ = f"{p}.outputs[{j}]"
            if isinstance(ov, str):
                out_decl.append((_name(ov, op_), None, None))
            elif isinstance(ov, Mapping):
                shp = _shape(ov["shape"], dims, f"{op_}.shape") if ov.get("shape") is not None else None
                out_decl.append((_name(ov.get("name"), f"{op_}.name"), shp, _dtype(ov.get("dtype"), f"{op_}.dtype")))
            else:
                raise _err("must be a tensor name or {name, shape, dtype}", op_)
        if known is None:
            if "flops" not in explicit or "bytes" not in explicit:
                unsupported.append(f"{oname} ({otype})")
                continue
            ctype, cat = otype, "custom"
        else:
            ctype, cat = known
        op = OpSpec(
            name=oname, type=ctype, category=cat, inputs=tuple(in_names), outputs=tuple(n for n, _, _ in out_decl),
            params=tuple(params), attrs=attrs, source_type=otype, **explicit,
        )
        if cat == "custom":
            shapes = []
            for j, (tn, shp, _) in enumerate(out_decl):
                if shp is None:
                    raise _err(f"operator type {otype!r} is not built in: give the output shape", f"{p}.outputs[{j}]")
                shapes.append(shp)
            out_dtypes = [dt for _, _, dt in out_decl]
        else:
            try:
                shapes, out_dtypes = infer_shapes(op, tensors, len(out_decl), dims)
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
        for j, (tn, _, dt) in enumerate(out_decl):
            if tn in tensors:
                raise _err(f"tensor {tn!r} is defined twice (every tensor has exactly one producer)", f"{p}.outputs[{j}]")
            if len(tensors) >= MAX_TENSORS:
                raise _err(f"more than {MAX_TENSORS} tensors", f"{p}.outputs")
            tensors[tn] = TensorSpec(tn, shapes[j], dt or out_dtypes[j])
            producer[tn] = len(ops)
        for tn in in_names:
            consumers.setdefault(tn, []).append(len(ops))
        ops.append(op)
    if unsupported:
        shown = ", ".join(unsupported[:20]) + (f" and {len(unsupported) - 20} more" if len(unsupported) > 20 else "")
        raise _err(
            f"{len(unsupported)} operator(s) of unsupported type without explicit 'flops' and 'bytes': {shown}. "
            f"Supported types: {', '.join(supported_op_types())}",
            f"{fp}.ops",
        )
    outs_in = data.get("outputs")
    if outs_in is None:
        outputs = tuple(t for t in producer if t not in consumers)
    else:
        if not isinstance(outs_in, (list, tuple)):
            raise _err("must be a list of tensor names", f"{fp}.outputs")
        outputs = tuple(_name(t, f"{fp}.outputs[{j}]") for j, t in enumerate(outs_in))
        for j, t in enumerate(outputs):
            if t not in tensors:
                raise _err(f"output {t!r} is not a tensor of the graph", f"{fp}.outputs[{j}]")
    if not any(op.params for op in ops):
        raise _err("the graph has no parameters (weights): nothing to train", f"{fp}.ops")
    return GraphSpec(
        name=gname,
        inputs=tuple(inputs),
        ops=tuple(ops),
        tensors=tensors,
        outputs=outputs,
        producer=producer,
        consumers={k: tuple(v) for k, v in consumers.items()},
        dims=dims,
    )


def _outputs_mention(outs: Any, tensor: str) -> bool:
    if not isinstance(outs, (list, tuple)):
        return False
    for o in outs[:MAX_OP_INPUTS]:
        if o == tensor or (isinstance(o, Mapping) and o.get("name") == tensor):
            return True
    return False


# --------------------------------------------------------------------------------------------
# Shape inference per operator type
# --------------------------------------------------------------------------------------------
def _in_shapes(op: OpSpec, tensors: Mapping[str, TensorSpec]) -> list[Shape]:
    return [tensors[t].shape for t in op.inputs]


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


def infer_shapes(op: OpSpec, tensors: Mapping[str, TensorSpec], n_outputs: int,
                 dims: Mapping[str, int] | None = None) -> tuple[list[Shape], list[str | None]]:
    """Output shapes of a known operator; raises :class:`InvalidGraph` with the mismatch."""
    ins = _in_shapes(op, tensors)
    t, cat = op.type, op.category
    dt = _out_dtype(op, tensors)

    def one(shape: Shape, dtype: str | None = dt) -> tuple[list[Shape], list[str | None]]:
        _need(n_outputs == 1, f"produces 1 output, the graph lists {n_outputs}")
        return [shape], [dtype]

    if cat == "matmul":
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

    if cat == "conv":
        _need(len(ins) == 1, f"takes 1 tensor input (the weight is a parameter), got {len(ins)}")
        x = ins[0]
        w = op.param("weight") or op.param("W")
        _need(w is not None, "needs a 'weight' parameter [C_out, C_in/groups, *kernel]")
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

    if cat == "attention":
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

    if cat == "norm":
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

    if cat == "softmax":
        _need(len(ins) == 1, f"takes 1 input, got {len(ins)}")
        _axis(op.attr("axis", -1), len(ins[0]))
        return one(ins[0])

    if cat in ("elementwise", "activation"):
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
        if t in _NO_GRAD[:9]:
            return one(shape, "bool")
        if t == "Cast":
            return one(shape, op.attr("to", dt))
        return one(shape)

    if cat == "embedding":
        table = op.param("weight") or op.param("table")
        _need(table is not None and len(table.shape) == 2, "needs a 2-D 'weight' parameter [rows, dim]")
        _need(len(ins) >= 1, "takes an indices input")
        idx = ins[0]
        if t == "EmbeddingBag":
            _need(len(idx) == 2, f"EmbeddingBag indices must be [batch, bag], got {shape_str(idx)}")
            return one((idx[0], Dim(table.shape[1])), None)
        return one(tuple(idx) + (Dim(table.shape[1]),), None)

    if cat == "gather":
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
        return one(tuple(data[:a]) + tuple(idx) + tuple(data[a + 1:]), None if op.params else tensors[op.inputs[0]].dtype)

    if cat == "reduce":
        x = ins[0]
        axes = op.attr("axes")
        keep = op.attr("keepdims", 1)
        axes = list(range(len(x))) if axes is None else [_axis(a, len(x)) for a in (axes if isinstance(axes, (list, tuple)) else [axes])]
        out = tuple((ONE if keep else None) if i in axes else d for i, d in enumerate(x))
        return one(tuple(d for d in out if d is not None))

    if cat == "pool":
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

    if cat == "loss":
        _need(len(ins) >= 1, "takes logits (and labels)")
        red = op.attr("reduction", "mean")
        if red == "none":
            return one(tuple(ins[0][:-1]) if t == "CrossEntropy" else ins[0])
        return one(())

    if cat == "layout":
        return _layout_shapes(op, ins, n_outputs, dt, tensors, dims or {})
    raise InvalidGraph(f"no shape rule for {t}")  # pragma: no cover


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


def _layout_shapes(op: OpSpec, ins: list[Shape], n_outputs: int, dt: str | None, tensors: Mapping[str, TensorSpec],
                   dims: Mapping[str, int]):
    t = op.type
    x = ins[0]
    dt = tensors[op.inputs[0]].dtype

    def one(shape: Shape):
        _need(n_outputs == 1, f"produces 1 output, the graph lists {n_outputs}")
        return [shape], [dt]

    if t == "Identity":
        return one(x)
    if t == "Reshape":
        target = op.attr("shape")
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
                out.append(parse_dim(v, dims, "shape"))
        _need(sum(d is None for d in out) <= 1, "at most one -1 in a reshape")
        total = numel(x)
        known = numel([d for d in out if d is not None])
        if None in out:
            rest = total.div(known)
            _need(rest is not None, f"cannot reshape {shape_str(x)} to {target}: {total} elements are not divisible by {known}")
            out = [rest if d is None else d for d in out]
        else:
            _need(known == total, f"cannot reshape {shape_str(x)} ({total} elements) to {shape_str(out)} ({known} elements)")
        return one(tuple(out))
    if t == "Transpose":
        perm = op.attr("perm")
        perm = list(range(len(x)))[::-1] if perm is None else list(perm)
        _need(sorted(perm) == list(range(len(x))), f"perm {perm} is not a permutation of {len(x)} axes")
        return one(tuple(x[p] for p in perm))
    if t == "Flatten":
        a = op.attr("axis", 1)
        a = a + len(x) if a < 0 else a
        _need(0 <= a <= len(x), f"axis {a} out of range")
        return one((numel(x[:a]), numel(x[a:])))
    if t == "Squeeze":
        axes = op.attr("axes")
        if axes is None:
            return one(tuple(d for d in x if d != ONE))
        axes = [_axis(a, len(x)) for a in axes]
        for a in axes:
            _need(x[a] == ONE, f"cannot squeeze axis {a} of size {x[a]}")
        return one(tuple(d for i, d in enumerate(x) if i not in axes))
    if t == "Unsqueeze":
        axes = op.attr("axes")
        _need(isinstance(axes, (list, tuple)), "Unsqueeze needs attribute axes")
        r = len(x) + len(axes)
        axes = sorted(_axis(a, r) for a in axes)
        out = list(x)
        for a in axes:
            out.insert(a, ONE)
        return one(tuple(out))
    if t == "Concat":
        a = _axis(op.attr("axis", 0), len(x))
        total = None
        for s in ins:
            _need(len(s) == len(x), f"inputs differ in rank: {', '.join(shape_str(s) for s in ins)}")
            for i in range(len(x)):
                if i != a:
                    _need(s[i] == x[i], f"inputs differ in dimension {i}: {', '.join(shape_str(s) for s in ins)}")
            total = s[a] if total is None else total.add(s[a])
            _need(total is not None, f"cannot add symbolic sizes along axis {a}")
        return one(tuple(x[:a]) + (total,) + tuple(x[a + 1:]))
    if t == "Split":
        a = _axis(op.attr("axis", 0), len(x))
        sizes = op.attr("split")
        if sizes is None:
            _need(x[a].is_const and x[a].coef % n_outputs == 0, f"dimension {x[a]} does not split evenly into {n_outputs}")
            sizes = [x[a].coef // n_outputs] * n_outputs
        sizes = list(sizes)
        _need(len(sizes) == n_outputs, f"split has {len(sizes)} sizes but {n_outputs} outputs")
        _need(x[a].is_const and sum(sizes) == x[a].coef, f"split sizes {sizes} do not sum to dimension {x[a]}")
        return [tuple(x[:a]) + (Dim(s),) + tuple(x[a + 1:]) for s in sizes], [dt] * n_outputs
    if t == "Slice":
        axes = op.attr("axes")
        starts, ends = op.attr("starts"), op.attr("ends")
        _need(isinstance(starts, (list, tuple)) and isinstance(ends, (list, tuple)) and len(starts) == len(ends), "Slice needs starts and ends")
        axes = list(range(len(starts))) if axes is None else list(axes)
        steps = list(op.attr("steps") or [1] * len(starts))
        out = list(x)
        for a, s, e, st in zip(axes, starts, ends, steps):
            a = _axis(a, len(x))
            _need(st != 0, "slice step 0")
            if not x[a].is_const:
                _need(s == 0 and e >= 2**31 and st == 1, f"cannot slice symbolic dimension {x[a]} except whole")
                continue
            n = x[a].coef
            s = max(0, min(n, s + n if s < 0 else s)) if st > 0 else max(-1, min(n - 1, s + n if s < 0 else s))
            e = max(0, min(n, e + n if e < 0 else e)) if st > 0 else max(-1, min(n - 1, e + n if e < 0 else e))
            length = max(0, -(-(e - s) // st)) if st > 0 else max(0, -(-(s - e) // -st))
            _need(length >= 1, f"slice of axis {a} is empty")
            out[a] = Dim(length)
        return one(tuple(out))
    raise InvalidGraph(f"no shape rule for {t}")  # pragma: no cover


# --------------------------------------------------------------------------------------------
# Per-operator costs (concrete shapes)
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GemmShape:
    """``batch`` independent ``(m×k)·(k×n)`` GEMMs; ``weight``: the (k×n) operand is a trained
    parameter (backward then computes dW as well as dX)."""

    m: int
    n: int
    k: int
    batch: int = 1
    weight: bool = True


@dataclass(frozen=True)
class OpCost:
    """One operator on one micro-batch (no parallelism).

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


def elt_bytes(dtype: str | None, default: str) -> int:
    return DTYPE_BYTES.get(dtype or default, DTYPE_BYTES[default])


def op_cost(op: OpSpec, graph: GraphSpec, shapes: Mapping[str, tuple[int, ...]], dtype: str, batch: int) -> OpCost:
    """FLOPs, bytes, parameters and saved activations of ``op`` with concrete ``shapes``.
    Derivations: see the module docstring."""
    e = BYTES_PER_ELEMENT[dtype]
    ins = [shapes[t] for t in op.inputs]
    outs = [shapes[t] for t in op.outputs]
    in_b = [math.prod(s) * elt_bytes(graph.tensors[t].dtype, dtype) for s, t in zip(ins, op.inputs)]
    out_b = [math.prod(s) * elt_bytes(graph.tensors[t].dtype, dtype) for s, t in zip(outs, op.outputs)]
    out_n = math.prod(outs[0]) if outs else 0
    params = op.param_count
    pbytes = sum(p.count * elt_bytes(p.dtype, dtype) for p in op.params)
    cat, t = op.category, op.type
    if cat == "custom":
        f = (op.flops or 0.0) * batch
        b = (op.bytes or 0.0) * batch
        return OpCost(
            f, (op.backward_flops if op.backward_flops is not None else 2 * (op.flops or 0.0)) * batch,
            b, (op.backward_bytes if op.backward_bytes is not None else 2 * (op.bytes or 0.0)) * batch,
            params, pbytes, (), (op.saved_bytes if op.saved_bytes is not None else sum(in_b) / max(batch, 1)) * batch,
        )
    if cat == "matmul":
        w = op.param("weight") or op.param("B")
        if w is not None:
            x = ins[0]
            trans_w = bool(op.attr("transB", op.attr("transpose_weight", 0)))
            k, n = (w.shape[1], w.shape[0]) if trans_w else w.shape
            m = math.prod(x) // k
            g = GemmShape(m, n, k, 1, True)
            fl = 2.0 * m * n * k
            by = (m * k + k * n + m * n) * e
            return OpCost(fl, 2 * fl, by, 2 * by + k * n * e, params, pbytes, (0,), 0.0, gemm=g)
        a, bsh = ins
        ta, tb = bool(op.attr("transA", 0)), bool(op.attr("transB", 0))
        m = a[-1] if ta else a[-2]
        k = a[-2] if ta else a[-1]
        n = bsh[-2] if tb else bsh[-1]
        nb = math.prod(outs[0][:-2]) if len(outs[0]) > 2 else 1
        fl = 2.0 * nb * m * n * k
        by = sum(in_b) + sum(out_b)
        return OpCost(fl, 2 * fl, by, 2 * by, params, pbytes, (0, 1), 0.0, gemm=GemmShape(m, n, k, nb, False))
    if cat == "conv":
        x, y = ins[0], outs[0]
        w = op.param("weight") or op.param("W")
        g = op.attr("group", op.attr("groups", 1))
        c_out = w.shape[0]
        kk = math.prod(w.shape[1:])  # C_in/g · Πkernel
        m = y[0] * math.prod(y[2:])
        gs = GemmShape(m, c_out // g, kk, g, True)
        fl = 2.0 * m * c_out * kk
        by = in_b[0] + out_b[0] + pbytes
        return OpCost(fl, 2 * fl, by, 2 * by, params, pbytes, (0,), 0.0, gemm=gs)
    if cat == "attention":
        q, k, v = ins[:3]
        causal = bool(op.attr("causal", op.attr("is_causal", 0)))
        if len(q) == 3:
            heads = op.attr("num_heads", op.attr("q_num_heads"))
            b_, sq, hq = q
            skv = k[1]
            d = hq // heads
            dv = v[2] // op.attr("kv_num_heads", heads)
        else:
            b_, heads, sq, d = q
            skv, dv = k[2], v[3]
        bh = b_ * heads
        fl = 2.0 * bh * sq * skv * (d + dv)
        by = sum(in_b[:3]) + out_b[0]
        # Flash keeps q, k, v, the output and fp32 log-sum-exp per row; the unfused variant also
        # keeps the softmax probabilities and the dropout mask (Korthikanti's 5·a·s²·b term) —
        # graph_cost adds those when training.attention == "unfused".
        return OpCost(fl, 2 * fl, by, 2 * by, params, pbytes, (0, 1, 2), out_b[0] + bh * sq * 4,
                      attention=(bh, sq, skv, max(d, dv), causal))
    if cat == "norm":
        x = ins[0]
        rows = math.prod(x[:-1]) if x else 1
        fpe = _FLOPS_PER_ELEMENT.get(t, 6)
        by = in_b[0] + out_b[0] + pbytes
        stats = rows * 4 * (2 if t == "LayerNorm" else 1)
        return OpCost(fpe * out_n, 2 * fpe * out_n, by, 1.5 * by + pbytes, params, pbytes, (0,), stats)
    if cat == "softmax":
        fpe = _FLOPS_PER_ELEMENT.get(t, 5)
        by = in_b[0] + out_b[0]
        # backward reads y and dy, writes dx; y (the output) is saved
        return OpCost(fpe * out_n, 2 * fpe * out_n, by, 1.5 * by, 0, 0.0, (), out_b[0])
    if cat in ("elementwise", "activation"):
        fpe = _FLOPS_PER_ELEMENT.get(t, 1)
        by = sum(in_b) + out_b[0] + pbytes
        if t in ("Cast",) or t in _NO_GRAD:
            return OpCost(out_n, 0.0, by, 0.0 if t in _NO_GRAD else by, params, pbytes, (), 0.0, has_grad=t not in _NO_GRAD)
        if t in _MASK_ONLY:
            saved, extra = (), out_n * 1.0  # 1-byte mask
        elif cat == "activation" or t in _SAVES_INPUTS:
            saved, extra = tuple(range(len(ins))), 0.0
        else:  # add/sub/expand: backward is a copy (or reduction) of dy
            saved, extra = (), 0.0
        n_grads = max(1, len(ins))
        bwd = out_b[0] + sum(in_b) + (sum(in_b[i] for i in saved)) if saved else out_b[0] * (1 + n_grads)
        return OpCost(fpe * out_n, 2 * fpe * out_n, by, float(bwd), params, pbytes, saved, extra)
    if cat == "embedding":
        table = op.param("weight") or op.param("table")
        dim = table.shape[1]
        lookups = math.prod(ins[0])
        rows_b = lookups * dim * elt_bytes(table.dtype, dtype)
        by = in_b[0] + rows_b + out_b[0]
        return OpCost(float(out_n if t == "EmbeddingBag" else 0), float(out_n), by, 2.0 * rows_b + in_b[0],
                      params, pbytes, (0,), 0.0)
    if cat == "gather":
        by = in_b[-1] + 2 * out_b[0]
        return OpCost(0.0, 0.0, by, 2 * by, params, pbytes, (len(ins) - 1,), 0.0)
    if cat == "reduce":
        by = in_b[0] + out_b[0]
        saved = (0,) if t in ("ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2", "ReduceLogSumExp") else ()
        return OpCost(float(math.prod(ins[0])), float(math.prod(ins[0])), by, by + in_b[0], 0, 0.0, saved, 0.0)
    if cat == "pool":
        x = ins[0]
        ks = op.attr("kernel_shape")
        kn = math.prod(x[2:]) // max(1, math.prod(outs[0][2:])) if ks is None else math.prod(ks)
        by = in_b[0] + out_b[0]
        saved = (0,) if t in ("MaxPool", "GlobalMaxPool", "LpPool") else ()
        return OpCost(float(out_n * kn), float(out_n * kn), by, by + in_b[0], 0, 0.0, saved, 0.0)
    if cat == "loss":
        logits = in_b[0]
        n = math.prod(ins[0])
        return OpCost(6.0 * n, 4.0 * n, logits + sum(in_b[1:]), 2.0 * logits, 0, 0.0, (), float(logits))
    if cat == "layout":
        if t in ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"):
            return OpCost(0.0, 0.0, 0.0, 0.0, 0, 0.0, (), 0.0)
        by = float(sum(out_b) * 2)
        return OpCost(0.0, 0.0, by, by, 0, 0.0, (), 0.0)
    raise InvalidGraph(f"no cost rule for {t}")  # pragma: no cover


def graph_flops_per_sample(graph: GraphSpec, seq: int, dtype: str = "bf16") -> tuple[float, float]:
    """(forward, forward+backward) model FLOPs of one sample (batch = 1)."""
    costs = graph.op_costs(1, seq, dtype)
    f = sum(c.fwd_flops for c in costs)
    return f, f + sum(c.bwd_flops for c in costs)


def iter_param_tables(graph: GraphSpec) -> Iterable[tuple[OpSpec, ParamSpec]]:
    """Embedding-like tables (for reports)."""
    for op in graph.ops:
        if op.category in ("embedding", "gather") and op.params:
            yield op, op.params[0]


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
