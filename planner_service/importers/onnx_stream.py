"""Bounded-memory reading of an uploaded ONNX file: its weights are skipped on disk.

Only shapes are read from an ONNX model (``importers.onnx``), never weight values, so an upload
need not be held in memory to be understood.  :func:`strip_weights` reads the file (a spooled
temporary file, usually on disk) through the protobuf wire format, field by field, and writes a
copy in memory in which every large tensor (an initializer, a ``Constant`` node's value, a
subgraph's initializer) keeps its name, type and dims but not its data: the data fields are
skipped with ``seek`` and the tensor is marked as external data, exactly as a model saved with
``save_as_external_data`` would reference it.  The copy is as large as the graph's structure
(nodes, value infos, small constants), not its weights; :func:`load_onnx_stream` parses it.

Field numbers come from the ``onnx`` protobuf descriptors, not from literals.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any, BinaryIO

from cost_model.errors import InvalidGraph

#: A tensor whose encoded message is larger than this is stripped of its data (the importer reads
#: values only of tensors with at most 4,096 elements, at most 32 KiB).
STRIP_ABOVE_BYTES = 65_536
_FIELD = "model.onnx"
_LOCATION = "weights-not-uploaded"


def _numbers() -> dict[str, Any]:
    import onnx

    def n(msg: Any, *names: str) -> tuple[int, ...]:
        return tuple(msg.DESCRIPTOR.fields_by_name[x].number for x in names)

    return {
        "model_graph": n(onnx.ModelProto, "graph")[0],
        "graph_node": n(onnx.GraphProto, "node")[0],
        "graph_init": n(onnx.GraphProto, "initializer")[0],
        "graph_sparse": n(onnx.GraphProto, "sparse_initializer")[0],
        "node_attr": n(onnx.NodeProto, "attribute")[0],
        "attr_tensors": n(onnx.AttributeProto, "t", "tensors"),
        "attr_graphs": n(onnx.AttributeProto, "g", "graphs"),
        "attr_sparse": n(onnx.AttributeProto, "sparse_tensor", "sparse_tensors"),
        "sparse_tensors": n(onnx.SparseTensorProto, "values", "indices"),
        "tensor_data": n(onnx.TensorProto, "float_data", "int32_data", "string_data", "int64_data", "raw_data", "double_data", "uint64_data"),
        "tensor_external": n(onnx.TensorProto, "external_data")[0],
        "tensor_location": n(onnx.TensorProto, "data_location")[0],
        "entry": n(onnx.StringStringEntryProto, "key", "value"),
        "external": int(onnx.TensorProto.EXTERNAL),
    }


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _key(field: int, wire: int) -> bytes:
    return _varint_bytes(field << 3 | wire)


def _len_field(field: int, payload: bytes) -> bytes:
    return _key(field, 2) + _varint_bytes(len(payload)) + payload


class _Reader:
    """Sequential reads of a seekable binary file, with the position tracked."""

    def __init__(self, fh: BinaryIO) -> None:
        self.fh = fh
        self.pos = 0
        self.size = fh.seek(0, io.SEEK_END)
        fh.seek(0)

    def byte(self) -> int:
        b = self.fh.read(1)
        if not b:
            raise InvalidGraph("the ONNX upload is truncated or not a protobuf", field=_FIELD)
        self.pos += 1
        return b[0]

    def varint(self) -> int:
        result = shift = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7
            if shift > 63:
                raise InvalidGraph("the ONNX upload is not a valid protobuf (bad varint)", field=_FIELD)

    def read(self, n: int) -> bytes:
        data = self.fh.read(n)
        if len(data) != n:
            raise InvalidGraph("the ONNX upload is truncated or not a protobuf", field=_FIELD)
        self.pos += n
        return data

    def skip(self, n: int) -> None:
        if self.pos + n > self.size:
            raise InvalidGraph("the ONNX upload is truncated or not a protobuf", field=_FIELD)
        self.fh.seek(n, io.SEEK_CUR)
        self.pos += n


class _Stripper:
    def __init__(self, fh: BinaryIO) -> None:
        self.r = _Reader(fh)
        self.n = _numbers()
        self.size = self.r.size

    def _fields(self, end: int) -> Any:
        """Yield (field, wire, key bytes) up to ``end``; the value is the caller's to consume."""
        while self.r.pos < end:
            key = self.r.varint()
            field, wire = key >> 3, key & 7
            if field == 0 or wire in (3, 4, 6, 7):
                raise InvalidGraph(f"the ONNX upload is not a valid protobuf (field {field}, wire type {wire})", field=_FIELD)
            yield field, wire, _varint_bytes(key)
        if self.r.pos != end:
            raise InvalidGraph("the ONNX upload is not a valid protobuf (a field overruns its message)", field=_FIELD)

    def _value(self, wire: int) -> bytes:
        """The raw encoded value of a field just read (length prefix included)."""
        if wire == 0:
            return _varint_bytes(self.r.varint())
        if wire == 1:
            return self.r.read(8)
        if wire == 5:
            return self.r.read(4)
        length = self._length()
        return _varint_bytes(length) + self.r.read(length)

    def _skip_value(self, wire: int) -> None:
        if wire == 0:
            self.r.varint()
        elif wire == 1:
            self.r.skip(8)
        elif wire == 5:
            self.r.skip(4)
        else:
            self.r.skip(self._length())

    def _length(self) -> int:
        length = self.r.varint()
        if self.r.pos + length > self.size:
            raise InvalidGraph("the ONNX upload is truncated or not a protobuf (a length past its end)", field=_FIELD)
        return length

    def _message(self, field: int, wire: int, key: bytes, strip: Any) -> bytes:
        """A length-delimited sub-message: copied when small, rewritten by ``strip`` when large."""
        if wire != 2:
            return key + self._value(wire)
        length = self._length()
        if length <= STRIP_ABOVE_BYTES:
            return key + _varint_bytes(length) + self.r.read(length)
        return _len_field(field, strip(self.r.pos + length))

    def model(self) -> bytes:
        out = bytearray()
        for field, wire, key in self._fields(self.size):
            if field == self.n["model_graph"] and wire == 2:
                length = self._length()
                out += _len_field(field, self.graph(self.r.pos + length))
            else:
                out += key + self._value(wire)
        return bytes(out)

    def graph(self, end: int) -> bytes:
        out = bytearray()
        n = self.n
        for field, wire, key in self._fields(end):
            if field == n["graph_init"]:
                out += self._message(field, wire, key, self.tensor)
            elif field == n["graph_sparse"]:
                out += self._message(field, wire, key, self.sparse)
            elif field == n["graph_node"]:
                out += self._message(field, wire, key, self.node)
            else:
                out += key + self._value(wire)
        return bytes(out)

    def node(self, end: int) -> bytes:
        out = bytearray()
        for field, wire, key in self._fields(end):
            out += self._message(field, wire, key, self.attribute) if field == self.n["node_attr"] else key + self._value(wire)
        return bytes(out)

    def attribute(self, end: int) -> bytes:
        out = bytearray()
        n = self.n
        for field, wire, key in self._fields(end):
            if field in n["attr_tensors"]:
                out += self._message(field, wire, key, self.tensor)
            elif field in n["attr_graphs"]:
                out += self._message(field, wire, key, self.graph)
            elif field in n["attr_sparse"]:
                out += self._message(field, wire, key, self.sparse)
            else:
                out += key + self._value(wire)
        return bytes(out)

    def sparse(self, end: int) -> bytes:
        out = bytearray()
        for field, wire, key in self._fields(end):
            out += self._message(field, wire, key, self.tensor) if field in self.n["sparse_tensors"] else key + self._value(wire)
        return bytes(out)

    def tensor(self, end: int) -> bytes:
        """A large tensor without its data, marked as external data (never read)."""
        out = bytearray()
        n = self.n
        for field, wire, key in self._fields(end):
            if field in n["tensor_data"]:
                self._skip_value(wire)
            elif field in (n["tensor_external"], n["tensor_location"]):
                self._skip_value(wire)  # replaced below
            else:
                out += key + self._value(wire)
        k, v = n["entry"]
        entry = _len_field(k, b"location") + _len_field(v, _LOCATION.encode())
        out += _len_field(n["tensor_external"], entry)
        out += _key(n["tensor_location"], 0) + _varint_bytes(n["external"])
        return bytes(out)


def strip_weights(fh: BinaryIO) -> bytes:
    """The ONNX model in ``fh`` (seekable, read from its start) with its large tensors' data
    left out; memory is bounded by the model's structure, not its weights."""
    try:
        return _Stripper(fh).model()
    except RecursionError:
        raise InvalidGraph("the ONNX upload nests subgraphs too deeply", field=_FIELD) from None


def load_onnx_stream(fh: BinaryIO, name: str | None = None, dims: Mapping[str, int] | None = None) -> dict[str, Any]:
    """Graph JSON of the ONNX model in the file ``fh`` (an upload on disk), read with bounded
    memory (see :func:`strip_weights`)."""
    from planner_service.importers.onnx import load_onnx_bytes

    fh.seek(0, io.SEEK_END)
    if fh.tell() == 0:
        raise InvalidGraph("the ONNX upload is empty", field=_FIELD)
    return load_onnx_bytes(strip_weights(fh), name=name, dims=dims)


__all__ = ["STRIP_ABOVE_BYTES", "load_onnx_stream", "strip_weights"]
