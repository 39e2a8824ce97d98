"""Import a PyTorch profiler Chrome trace (``prof.export_chrome_trace(...)``) as a profile.

What is read (the trace must be recorded with ``record_shapes=True`` for GEMM shapes and bytes):

* GPU traces: every ``kernel`` event is tied to the ATen op that launched it through
  ``args["External id"]``.  Kernels launched by ``aten::mm / addmm / bmm / baddbmm`` become
  ``gemm`` measurements (shape and dtype from the op's ``Input Dims`` / ``Input type``; the
  durations of all kernels one op launched are summed, e.g. a split-K GEMM plus its reduction);
  ``nccl*`` kernels become collectives (kind from the kernel name: AllReduce, AllGather,
  ReduceScatter, SendRecv/Send/Recv, AllToAll; size and group from the launching op's
  ``In msg nelems`` / ``Out msg nelems`` / ``Group size`` / ``dtype`` args when present);
  flash/fmha/attention kernels become ``attention``; kernels of memory-bound ops (layer norm,
  softmax, GELU, add, mul, copy and their backward ops) become memory-bound measurements.
* CPU traces (no kernel events): the ``cpu_op`` events of the same ATen ops are the
  measurements themselves (their wall duration), and ``gloo:*`` / ``c10d::*`` ops with
  communication args become collectives.

Identical (op, dtype, shape) samples are merged: ``seconds`` is their median, ``repeats`` their
count, ``spread`` min / max / IQR.  Times in the trace are microseconds.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import numpy as np

from cost_model.errors import InvalidProfile
from cost_model.profiles import (
    MAX_PROFILE_BYTES,
    SCHEMA_NAME,
    SCHEMA_VERSION,
    resolve_profile_device,
)
from cost_model.units import bytes_to_gb, bytes_to_mb, mib_to_bytes, us_to_s

MAX_TRACE_BYTES = int(mib_to_bytes(64))
MAX_EVENTS = 2_000_000

_DTYPES = {
    "float": "fp32", "c10::BFloat16": "bf16", "c10::Half": "fp16", "BFloat16": "bf16", "Half": "fp16",
    "Float": "fp32", "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8",
}
_ESIZE = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}

GEMM_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}
#: ATen op → (profile op, how the bytes are counted)
MEMORY_OPS = {
    "aten::native_layer_norm": "layernorm",
    "aten::native_layer_norm_backward": "layernorm",
    "aten::_softmax": "softmax",
    "aten::_softmax_backward_data": "softmax",
    "aten::gelu": "gelu",
    "aten::gelu_backward": "gelu",
    "aten::add": "add",
    "aten::add_": "add",
    "aten::mul": "scale",
    "aten::mul_": "scale",
    "aten::copy_": "copy",
    "aten::native_dropout": "dropout",
    "aten::native_dropout_backward": "dropout",
}
_NCCL_KINDS = (
    ("allreduce", "allreduce"), ("all_reduce", "allreduce"),
    ("allgather", "allgather"), ("all_gather", "allgather"),
    ("reducescatter", "reduce_scatter"), ("reduce_scatter", "reduce_scatter"),
    ("alltoall", "alltoall"), ("all_to_all", "alltoall"),
    ("sendrecv", "sendrecv"), ("send", "sendrecv"), ("recv", "sendrecv"),
)


def _collective_kind(name: str) -> str | None:
    low = name.lower().replace(" ", "")
    for token, kind in _NCCL_KINDS:
        if token in low:
            return kind
    return None


def _numel(dims: Any) -> int:
    if not isinstance(dims, list) or not all(isinstance(d, int) and d >= 0 for d in dims):
        return 0
    n = 1
    for d in dims:
        n *= d
    return n


def _dtype(types: Any, index: int = 0) -> str | None:
    if not isinstance(types, list) or len(types) <= index:
        return None
    return _DTYPES.get(types[index])


def _gemm_shape(name: str, dims: Any) -> dict[str, int] | None:
    """(m, n, k, batch) from an ATen GEMM op's Input Dims."""
    if not isinstance(dims, list):
        return None
    try:
        if name == "aten::mm":
            (m, k), (k2, n) = dims[0], dims[1]
            batch = 1
        elif name == "aten::addmm":
            (m, k), (k2, n) = dims[1], dims[2]
            batch = 1
        elif name == "aten::bmm":
            (batch, m, k), (_, k2, n) = dims[0], dims[1]
        elif name == "aten::baddbmm":
            (batch, m, k), (_, k2, n) = dims[1], dims[2]
        else:
            return None
    except (TypeError, ValueError, IndexError):
        return None
    vals = (m, n, k, batch)
    if k != k2 or not all(isinstance(v, int) and v > 0 for v in vals):
        return None
    return {"m": m, "n": n, "k": k, "batch": batch}


def _memory_bytes(name: str, dims: Any, types: Any) -> tuple[int, str] | None:
    """Minimum traffic of a memory-bound op: tensor inputs read once, one output the size of the
    largest input written once (``copy_``: source read, destination written)."""
    if not isinstance(dims, list) or not isinstance(types, list):
        return None
    sizes = []
    dtype = None
    for d, t in zip(dims, types, strict=False):
        dt = _DTYPES.get(t)
        if dt is None:
            continue
        n = _numel(d)
        if n:
            sizes.append(n * _ESIZE[dt])
            dtype = dtype or dt
    if not sizes or dtype is None:
        return None
    if name == "aten::copy_":
        return 2 * max(sizes), dtype
    return sum(sizes) + max(sizes), dtype


def _events(doc: Any) -> list[Mapping[str, Any]]:
    events = doc.get("traceEvents") if isinstance(doc, Mapping) else doc
    if not isinstance(events, list):
        raise InvalidProfile("is not a Chrome trace: expected an object with a 'traceEvents' list", field="trace")
    if len(events) > MAX_EVENTS:
        raise InvalidProfile(f"has {len(events)} events; the limit is {MAX_EVENTS}", field="trace.traceEvents")
    return [e for e in events if isinstance(e, Mapping) and e.get("ph") == "X" and isinstance(e.get("dur"), (int, float))]


def _comm_args(args: Mapping[str, Any]) -> tuple[int, int] | None:
    """(bytes in the cost model's convention, group size) from c10d's record_param_comms args."""
    group = args.get("Group size")
    nin = args.get("In msg nelems")
    nout = args.get("Out msg nelems")
    dt = _DTYPES.get(str(args.get("dtype")))
    if not isinstance(group, int) or group < 1:
        return None
    esize = _ESIZE.get(dt or "fp32", 4)
    n = max(v for v in (nin, nout) if isinstance(v, int)) if any(isinstance(v, int) for v in (nin, nout)) else None
    if not n:
        return None
    return n * esize, group


class _Samples:
    """Durations (s) per measurement key, with the measurement's fields and the kernel or op
    names they came from."""

    def __init__(self) -> None:
        self.samples: dict[tuple[Any, ...], list[float]] = defaultdict(list)
        self.meta: dict[tuple[Any, ...], dict[str, Any]] = {}
        self.names: dict[tuple[Any, ...], set[str]] = defaultdict(set)

    def add(self, key: tuple[Any, ...], fields: dict[str, Any], seconds: float, source: str) -> None:
        self.samples[key].append(seconds)
        self.meta.setdefault(key, fields)
        self.names[key].add(source)


def _gpu_samples(kernels: list[Mapping[str, Any]], ops_by_ext: Mapping[Any, Mapping[str, Any]], acc: _Samples) -> int:
    """GPU mode: each kernel to the op that launched it (GEMM kernels of one op summed);
    returns the number of kernels no measurement kind matched."""
    unmatched = 0
    gemm_time: dict[Any, float] = defaultdict(float)
    gemm_kernels: dict[Any, set[str]] = defaultdict(set)
    for k in kernels:
        args = k.get("args") if isinstance(k.get("args"), Mapping) else {}
        kname = str(k.get("name", ""))
        op = ops_by_ext.get(args.get("External id"))
        oname = str(op.get("name")) if op else ""
        oargs = op.get("args", {}) if op else {}
        dur_s = us_to_s(float(k["dur"]))
        if kname.lower().startswith("nccl"):
            kind = _collective_kind(kname)
            comm = _comm_args(oargs) if op else None
            if kind and comm:
                # the larger of In/Out msg: the all-reduced buffer, the gathered size, the
                # reduce-scatter input — the cost model's convention for each kind
                size, group = comm
                if kind == "sendrecv" or group >= 2:
                    fields = {"op": kind, "backend": "nccl", "group_size": max(group, 2), "scope": "intra_node",
                              "bytes": size, "dtype": _DTYPES.get(str(oargs.get("dtype")), "fp32")}
                    acc.add((kind, size, group), fields, dur_s, kname)
                    continue
            unmatched += 1
            continue
        if oname in GEMM_OPS:
            shape = _gemm_shape(oname, oargs.get("Input Dims"))
            dtype = _dtype(oargs.get("Input type"), 1 if oname in ("aten::addmm", "aten::baddbmm") else 0)
            if shape and dtype:
                ext = args.get("External id")
                gemm_time[ext] += dur_s
                gemm_kernels[ext].add(kname)
                continue
        low = kname.lower()
        if any(t in low for t in ("flash", "fmha", "attention")) and op:
            dims = oargs.get("Input Dims")
            if isinstance(dims, list) and dims and isinstance(dims[0], list) and len(dims[0]) == 4:
                b, h, s, d = dims[0]
                kv = dims[1][2] if len(dims) > 1 and isinstance(dims[1], list) and len(dims[1]) == 4 else s
                dtype = _dtype(oargs.get("Input type")) or "bf16"
                shape = {"batch_heads": b * h, "q_len": s, "kv_len": kv, "head_dim": d}
                key = ("attention", dtype, tuple(shape.values()), "backward" in low or "bwd" in low)
                acc.add(key, {"op": "attention", "backend": "torch", "dtype": dtype, "shape": shape, "impl": "trace",
                          "pass": "backward" if key[-1] else "forward"}, dur_s, kname)
                continue
        if oname in MEMORY_OPS:
            mb = _memory_bytes(oname, oargs.get("Input Dims"), oargs.get("Input type"))
            if mb:
                nbytes, dtype = mb
                pop = MEMORY_OPS[oname]
                acc.add((pop, dtype, nbytes), {"op": pop, "backend": "torch", "dtype": dtype, "bytes": nbytes, "kernels": 1,
                                           "aten": oname}, dur_s, kname)
                continue
        unmatched += 1
    for ext, secs in gemm_time.items():
        op = ops_by_ext[ext]
        oname = str(op["name"])
        oargs = op.get("args", {})
        shape = _gemm_shape(oname, oargs.get("Input Dims"))
        dtype = _dtype(oargs.get("Input type"), 1 if oname in ("aten::addmm", "aten::baddbmm") else 0)
        key = ("gemm", dtype, tuple(shape.values()))
        for kn in gemm_kernels[ext]:
            acc.names[key].add(kn)
        acc.samples[key].append(secs)
        acc.meta.setdefault(key, {"op": "gemm", "backend": "torch", "dtype": dtype, "shape": shape})
    return unmatched


def _cpu_samples(cpu_ops: list[Mapping[str, Any]], acc: _Samples) -> None:
    """CPU mode (no kernels in the trace): ATen ops and collectives by their own duration."""
    for e in cpu_ops:
        name = str(e.get("name", ""))
        args = e.get("args") if isinstance(e.get("args"), Mapping) else {}
        dur_s = us_to_s(float(e["dur"]))
        if name in GEMM_OPS:
            shape = _gemm_shape(name, args.get("Input Dims"))
            dtype = _dtype(args.get("Input type"), 1 if name in ("aten::addmm", "aten::baddbmm") else 0)
            if shape and dtype:
                acc.add(("gemm", dtype, tuple(shape.values())), {"op": "gemm", "backend": "torch", "dtype": dtype, "shape": shape}, dur_s, name)
            continue
        if name in MEMORY_OPS:
            mb = _memory_bytes(name, args.get("Input Dims"), args.get("Input type"))
            if mb:
                nbytes, dtype = mb
                pop = MEMORY_OPS[name]
                acc.add((pop, dtype, nbytes), {"op": pop, "backend": "torch", "dtype": dtype, "bytes": nbytes, "kernels": 1, "aten": name}, dur_s, name)
            continue
        low = name.lower()
        if low.startswith(("gloo:", "c10d::", "nccl:", "record_param_comms")):
            kind = _collective_kind(low.split(":")[-1]) or _collective_kind(str(args.get("Collective name", "")))
            comm = _comm_args(args)
            if kind and comm and (kind == "sendrecv" or comm[1] >= 2):
                backend = "gloo" if low.startswith("gloo") else "torch.distributed"
                acc.add((kind, comm[0], comm[1]), {"op": kind, "backend": backend, "group_size": max(comm[1], 2),
                                              "scope": "intra_node", "bytes": comm[0]}, dur_s, name)


def _merged(acc: _Samples) -> list[dict[str, Any]]:
    """One measurement per key: the median duration (s) and the spread of its samples."""
    measurements = []
    for key, secs in acc.samples.items():
        arr = np.asarray(secs)
        if not np.all(arr > 0):
            arr = arr[arr > 0]
            if arr.size == 0:
                continue
        q1, q3 = np.quantile(arr, [0.25, 0.75])
        measurements.append({
            **acc.meta[key],
            "seconds": float(np.median(arr)),
            "repeats": int(arr.size),
            "spread": {"min_s": float(arr.min()), "max_s": float(arr.max()), "iqr_s": float(q3 - q1)},
            "source_names": sorted(acc.names[key])[:8],
        })
    measurements.sort(key=lambda m: (m["op"], json.dumps(m.get("shape", m.get("bytes")), sort_keys=True)))
    return measurements


def trace_to_measurements(doc: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Measurements (merged) and a summary of what the trace contained."""
    events = _events(doc)
    ops_by_ext: dict[Any, Mapping[str, Any]] = {}
    kernels: list[Mapping[str, Any]] = []
    cpu_ops: list[Mapping[str, Any]] = []
    for e in events:
        cat = str(e.get("cat", "")).lower()
        args = e.get("args") if isinstance(e.get("args"), Mapping) else {}
        if cat == "kernel":
            kernels.append(e)
        elif cat in ("cpu_op", "operator"):
            cpu_ops.append(e)
            ext = args.get("External id")
            if ext is not None:
                # each ATen call has its own id; a kernel carries the id of the op that launched it
                ops_by_ext[ext] = e
    acc = _Samples()
    unmatched = 0
    if kernels:
        mode = "gpu"
        unmatched = _gpu_samples(kernels, ops_by_ext, acc)
    else:
        mode = "cpu"
        _cpu_samples(cpu_ops, acc)
    measurements = _merged(acc)
    summary = {"mode": mode, "events": len(events), "kernels": len(kernels), "cpu_ops": len(cpu_ops), "unmatched_kernels": unmatched}
    return measurements, summary


def _device_from_trace(doc: Any) -> str | None:
    if not isinstance(doc, Mapping):
        return None
    props = doc.get("deviceProperties")
    if isinstance(props, list) and props and isinstance(props[0], Mapping) and props[0].get("name"):
        from planner_service.profiling.fingerprint import catalog_name_for_gpu

        mem = props[0].get("totalGlobalMem")
        return catalog_name_for_gpu(str(props[0]["name"]), bytes_to_gb(float(mem)) if isinstance(mem, (int, float)) else None)
    return None


def is_trace(doc: Any) -> bool:
    """A Chrome trace (rather than a profile)?"""
    return isinstance(doc, Mapping) and "traceEvents" in doc and "schema_version" not in doc


def import_trace(doc: Any, device: str | None = None, name: str | None = None) -> dict[str, Any]:
    """Build a schema-v1 profile from a parsed Chrome trace.  ``device`` is the catalog device
    the trace was recorded on (required for CPU traces; inferred from ``deviceProperties`` for
    GPU traces when omitted)."""
    dev_name = device or _device_from_trace(doc)
    if not dev_name:
        raise InvalidProfile("say which catalog device the trace was recorded on (?device=NAME, --device-name NAME)", field="device")
    spec = resolve_profile_device(dev_name, field="device")
    measurements, summary = trace_to_measurements(doc)
    if not measurements:
        raise InvalidProfile(
            "contains no GEMM, memory-bound or collective operator with shapes; record it with "
            "torch.profiler.profile(record_shapes=True)",
            field="trace",
        )
    meta = doc if isinstance(doc, Mapping) else {}
    return {
        "schema": SCHEMA_NAME,
        "schema_version": SCHEMA_VERSION,
        "source": "trace",
        "name": name,
        "device": {
            "name": spec.name,
            "kind": spec.kind,
            "hostname": meta.get("host_name") if isinstance(meta.get("host_name"), str) else None,
            "trace_device_properties": meta.get("deviceProperties") if isinstance(meta.get("deviceProperties"), list) else None,
        },
        "trace": summary,
        "measurements": measurements,
    }


def parse_trace_bytes(raw: bytes | str, device: str | None = None, max_bytes: int = MAX_TRACE_BYTES) -> dict[str, Any]:
    size = len(raw.encode() if isinstance(raw, str) else raw)
    if size > max_bytes:
        raise InvalidProfile(f"is {bytes_to_mb(size):.1f} MB; the limit for traces is {bytes_to_mb(max_bytes):.1f} MB", field="trace")
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidProfile(f"is not valid JSON: {exc}", field="trace") from None
    return import_trace(doc, device)


def load_profile_or_trace(raw: bytes | str, device: str | None = None) -> dict[str, Any]:
    """Either kind of upload → a validated profile (traces are converted)."""
    from cost_model.profiles import validate_profile

    size = len(raw.encode() if isinstance(raw, str) else raw)
    if size > max(MAX_TRACE_BYTES, MAX_PROFILE_BYTES):
        raise InvalidProfile(f"is {bytes_to_mb(size):.1f} MB; the limit is {bytes_to_mb(max(MAX_TRACE_BYTES, MAX_PROFILE_BYTES)):.1f} MB", field="body")
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidProfile(f"is not valid JSON: {exc}", field="body") from None
    if is_trace(doc) or isinstance(doc, list):
        return validate_profile(import_trace(doc, device))
    if size > MAX_PROFILE_BYTES:
        raise InvalidProfile(f"is {bytes_to_mb(size):.1f} MB; the limit for profiles is {bytes_to_mb(MAX_PROFILE_BYTES):.1f} MB", field="body")
    if device is not None and isinstance(doc, Mapping) and isinstance(doc.get("device"), Mapping) and doc["device"].get("name") != device:
        raise InvalidProfile(f"the profile says device {doc['device'].get('name')!r} but ?device={device!r} was given", field="device")
    return validate_profile(doc)
