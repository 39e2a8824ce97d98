"""Operator-graph IR: the validated DAG of operators (tensors with symbolic shapes, operators
with parameters and attributes) and the operator catalog.

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
* Output shapes may be omitted for known operator types (they are inferred by
  :mod:`cost_model.graph.shapes`) and are checked against the inferred shape when given.
  Unknown operator types need ``outputs`` with shapes and explicit ``flops`` and ``bytes``
  (forward, per sample: they scale with the batch), optionally ``backward_flops``/
  ``backward_bytes`` (default 2× forward) and ``saved_bytes`` (activation bytes kept for
  backward, per sample).
* ``ops`` must be listed so that every tensor is defined (graph input or an earlier op's
  output) before it is consumed; this makes cycles impossible to express and they are reported
  as "consumed before it is produced".

Parsing and validation of the JSON document: :mod:`cost_model.graph.parse`; FLOPs, bytes and
saved activations per operator: :mod:`cost_model.graph.op_cost`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
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
DTYPE_BYTES: dict[str, float] = {
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
    """``[batch, seq, 1024]``: a shape as error messages print it."""
    return "[" + ", ".join(str(d) for d in shape) + "]"


def numel(shape: Sequence[Dim]) -> Dim:
    """Elements of a tensor of ``shape`` (a monomial when the shape is symbolic)."""
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
@dataclass(frozen=True, kw_only=True)
class TensorSpec:
    """A tensor: its name, symbolic shape and dtype (None: the training dtype)."""

    name: str
    shape: Shape
    dtype: str | None = None  # None: the training dtype

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": [d.to_json() for d in self.shape], **({"dtype": self.dtype} if self.dtype else {})}


@dataclass(frozen=True, kw_only=True)
class ParamSpec:
    """A trained parameter of an operator: name, concrete shape, dtype (None: training dtype)."""

    name: str
    shape: tuple[int, ...]
    dtype: str | None = None

    @property
    def count(self) -> int:
        return math.prod(self.shape) if self.shape else 1

    def to_dict(self) -> dict[str, Any]:
        return {"shape": list(self.shape), **({"dtype": self.dtype} if self.dtype else {})}


@dataclass(frozen=True, kw_only=True)
class OpSpec:
    """An operator: canonical type and category (see :data:`OP_TYPES`), the tensors it consumes
    and produces, its parameters and attributes, and explicit per-sample costs (custom types)."""

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


@dataclass(frozen=True, kw_only=True)
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
    """Every built-in operator type name (canonical names and aliases), sorted."""
    return sorted({t for types in _CATEGORY_TYPES.values() for t in types})


#: Comparisons and logic: boolean results, no gradient.
COMPARISON_TYPES = ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Not")
#: Ops that produce no gradient (comparisons, rounding, index arithmetic).
NO_GRAD_TYPES = (*COMPARISON_TYPES, "Floor", "Ceil", "Round", "Sign", "Mod")
